"""The porting guide's claims about other libraries, checked against those libraries.

Each test runs the other library's op and polyconv's translation of it (docs/porting.md) on
the same inputs. Libraries that are not installed are visible skips.
"""

from __future__ import annotations

import numpy as np
import pytest

import polyconv

RNG = np.random.default_rng(0)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _close(a, b):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def lax():
    pytest.importorskip("jax")
    from jax import lax

    return lax


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize(("k", "s"), [(1, 2), (2, 2), (3, 2), (4, 2), (5, 3), (3, 1)])
def test_lax_conv_transpose_same_and_valid(lax, k, s):
    x, w = _rand(2, 5, 4), _rand(k, 3, 4)  # w: HIO spec = [K, OC, IC] with transpose_kernel
    dn = ("NHC", "HIO", "NHC")
    extra = max(s - k, 0)
    for pad, auto in (("SAME", "same_upper"), ("VALID", "valid")):
        ref = lax.conv_transpose(x, w, (s,), pad, dimension_numbers=dn, transpose_kernel=True)
        got = polyconv.conv_transpose(x, w, strides=s, auto_pad=auto, output_padding=extra)
        _close(got, ref)


def test_lax_conv_transpose_explicit_padding_and_unflipped_kernel(lax):
    x, w = _rand(1, 5, 6, 4), _rand(3, 3, 2, 4)  # XOI
    ek, pb, pe, op = 3, 1, 1, 1
    padding = [(ek - 1 - pb, ek - 1 - (pe - op))] * 2
    ref = polyconv.conv_transpose(x, w, strides=2, pads_begin=pb, pads_end=pe, output_padding=op)
    dn = ("NHWC", "HWIO", "NHWC")
    _close(lax.conv_transpose(x, w, (2, 2), padding, dimension_numbers=dn,
                              transpose_kernel=True), ref)
    # transpose_kernel=False: no flip, no channel swap = ConvTranspose XIO, spatially reversed
    w_lax = np.ascontiguousarray(w[::-1, ::-1].transpose(0, 1, 3, 2))  # [K, K, IC, OC]
    _close(lax.conv_transpose(x, w_lax, (2, 2), padding, dimension_numbers=dn), ref)
    _close(polyconv.conv_transpose(x, np.ascontiguousarray(w_lax[::-1, ::-1]), strides=2,
                                   pads_begin=pb, pads_end=pe, output_padding=op,
                                   weights_format="XIO"), ref)


@pytest.mark.parametrize(("pad", "auto"), [("SAME", "same_upper"), ("SAME_LOWER", "same_lower"),
                                           ("VALID", "valid")])
def test_lax_conv_padding_names(lax, pad, auto):
    x, w = _rand(1, 7, 6, 4), _rand(4, 3, 2, 6)  # XIO, groups 2
    ref = lax.conv_general_dilated(x, w, (2, 2), pad, dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                   feature_group_count=2)
    _close(polyconv.convolution(x, w, strides=2, auto_pad=auto, groups=2), ref)


def test_torch_conv_transpose_is_iox_with_symmetric_crop(torch):
    x, w, b = _rand(2, 8, 5, 6), _rand(8, 3, 3, 3), _rand(6)  # w: [IC, OC/g, K, K]
    ref = torch.nn.functional.conv_transpose2d(
        torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), stride=2, padding=1,
        output_padding=1, groups=2, dilation=1).numpy()
    _close(polyconv.conv_transpose(x, w, b, strides=2, pads_begin=1, pads_end=1,
                                   output_padding=1, groups=2, data_format="NCX",
                                   weights_format="IOX"), ref)


def test_torch_output_padding_beyond_stride_moves_into_pads_end(torch):
    # PyTorch allows output_padding < max(stride, dilation); polyconv needs < stride.
    x, w = _rand(1, 2, 6), _rand(2, 3, 3)
    ref = torch.nn.functional.conv_transpose1d(torch.from_numpy(x), torch.from_numpy(w),
                                               stride=1, padding=2, output_padding=1,
                                               dilation=2).numpy()
    _close(polyconv.conv_transpose(x, w, strides=1, dilations=2, pads_begin=2, pads_end=1,
                                   data_format="NCX", weights_format="IOX"), ref)


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("k", [3, 4])
def test_torch_padding_same_is_same_upper(torch, k):
    x, w = _rand(1, 3, 9), _rand(5, 3, k)  # OIX
    ref = torch.nn.functional.conv1d(torch.from_numpy(x), torch.from_numpy(w),
                                     padding="same").numpy()
    _close(polyconv.convolution(x, w, auto_pad="same_upper", data_format="NCX",
                                weights_format="OIX"), ref)
