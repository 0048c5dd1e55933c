"""The dot-product identities of the canonical convolution, on the polyconv ops themselves
(float64, every target).

For a forward op ``F`` and its two backward ops under the same attributes::

    <F(x, W), dy> == <x, backward_data(dy, W)> == <W, backward_weights(x, dy)>

which holds only if each backward op is the exact adjoint of its forward op: same pads
(including the same_* rules F and T), same groups, same layouts, same output_padding. The
tolerance is relative to ``sum |x * w * dy|`` over every product (from the oracle's bound
terms), so cancellation cannot hide a wrong term and rounding cannot fail a right one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import oracle
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import polyconv

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
RTOL = 1e-11


@dataclass(frozen=True)
class Problem:
    """Shapes and attributes of one forward call (``src``, ``weights``)."""

    family: str
    src_shape: tuple[int, ...]
    weights_shape: tuple[int, ...]
    attrs: dict
    geometry: oracle.Geometry
    seed: int

    def arrays(self):
        rng = np.random.default_rng(self.seed)
        return rng, rng.standard_normal(self.src_shape), rng.standard_normal(self.weights_shape)


def _per_axis(draw, rank, lo, hi):
    return tuple(draw(st.lists(st.integers(lo, hi), min_size=rank, max_size=rank)))


@st.composite
def problems(draw, family: str, auto_pads=("none", "valid", "same_upper", "same_lower")):
    rank = draw(st.integers(1, 3))
    small = rank == 3
    kernel = _per_axis(draw, rank, 1, 2 if small else 3)
    strides = _per_axis(draw, rank, 1, 3)
    groups = draw(st.integers(1, 3))
    ca = groups * draw(st.integers(1, 2))
    cb = groups * draw(st.integers(1, 2))
    fmt = draw(st.sampled_from(["XIO", "OIX", "IOX", "XOI"]))
    data_format = draw(st.sampled_from(["NXC", "NCX"]))
    attrs = {"strides": strides, "dilations": _per_axis(draw, rank, 1, 2),
             "pads_begin": _per_axis(draw, rank, 0, 2), "pads_end": _per_axis(draw, rank, 0, 2),
             "auto_pad": draw(st.sampled_from(auto_pads)), "groups": groups,
             "data_format": data_format, "weights_format": fmt}
    batch = draw(st.integers(1, 2))
    w_shape = oracle.weights_user_shape((cb, ca // groups, *kernel), fmt, family)
    if family == "convolution":
        spatial = _per_axis(draw, rank, 1, 4 if small else 7)
        channels = ca
    else:
        spatial = _per_axis(draw, rank, 1, 3 if small else 4)
        channels = cb
        opad = tuple(draw(st.integers(0, s - 1)) for s in strides)
        if any(opad):
            attrs["output_padding"] = opad
    src_shape = oracle.data_shape(batch, channels, spatial, data_format == "NXC")
    op = "convolution" if family == "convolution" else "conv_transpose"
    try:
        geo = oracle.geometry(op, src_shape, w_shape, **attrs)
    except oracle.InvalidGeometry:
        assume(False)
    return Problem(family, src_shape, w_shape, attrs, geo, draw(st.integers(0, 2**32 - 1)))


def assert_adjoint(lhs: float, rhs: float, scale: float, what: str) -> None:
    assert abs(lhs - rhs) <= RTOL * scale, (
        f"{what}: <forward, dy> = {lhs!r} but the backward op gives {rhs!r} "
        f"(difference {abs(lhs - rhs):.3g}, allowed {RTOL * scale:.3g})")


def _spatial(shape, data_format):
    return tuple(shape[1:-1]) if data_format == "NXC" else tuple(shape[2:])


@SETTINGS
@given(p=problems("convolution"), full=st.booleans())
def test_convolution_adjoints(target, p: Problem, full: bool):
    """Convolution, ConvolutionBackwardData (with dst_shape), ConvolutionBackwardWeights."""
    rng, x, w = p.arrays()
    attrs, fmt = p.attrs, p.attrs["data_format"]
    y = target.to_numpy(target.call(polyconv.convolution, x, w, **attrs))
    assert y.shape == p.geometry.b_shape
    dy = rng.standard_normal(y.shape)
    scale = np.vdot(oracle.reference("convolution", x, w, **attrs).abs_sum, np.abs(dy))
    lhs = np.vdot(y, dy)

    dst = x.shape if full else _spatial(x.shape, fmt)
    dx = target.to_numpy(target.call(polyconv.convolution_backward_data, dy, w,
                                     dst_shape=dst, **attrs))
    assert dx.shape == x.shape
    assert_adjoint(lhs, np.vdot(x, dx), scale, "convolution_backward_data(dst_shape)")

    wshape = w.shape if full else p.geometry.kernel
    dw = target.to_numpy(target.call(polyconv.convolution_backward_weights, x, dy,
                                     weights_shape=wshape, **attrs))
    assert dw.shape == w.shape
    assert_adjoint(lhs, np.vdot(w, dw), scale, "convolution_backward_weights")

    if attrs["auto_pad"] in ("none", "valid"):
        # Without dst_shape the size comes from output_padding (rule T pads are not rule F
        # pads, so this form is the adjoint only with explicit or valid pads).
        geo = p.geometry
        implied = tuple(a - (s * (b - 1) + (k - 1) * d + 1 - p0 - p1)
                        for a, b, s, k, d, p0, p1 in zip(geo.a_spatial, geo.b_spatial,
                                                         geo.strides, geo.kernel,
                                                         geo.dilations, geo.pads_begin,
                                                         geo.pads_end))
        dx2 = target.to_numpy(target.call(polyconv.convolution_backward_data, dy, w,
                                          output_padding=implied, **attrs))
        assert dx2.shape == x.shape
        assert_adjoint(lhs, np.vdot(x, dx2), scale, "convolution_backward_data(output_padding)")


@SETTINGS
@given(p=problems("conv_transpose"), full=st.booleans())
def test_conv_transpose_adjoints(target, p: Problem, full: bool):
    """ConvTranspose, ConvTransposeBackwardData, ConvTransposeBackwardWeights: same attributes
    (same_* by rule T, output_padding) make exact adjoints."""
    rng, x, w = p.arrays()
    attrs = p.attrs
    y = target.to_numpy(target.call(polyconv.conv_transpose, x, w, **attrs))
    assert y.shape == p.geometry.a_shape
    dy = rng.standard_normal(y.shape)
    scale = np.vdot(oracle.reference("conv_transpose", x, w, **attrs).abs_sum, np.abs(dy))
    lhs = np.vdot(y, dy)

    dx = target.to_numpy(target.call(polyconv.conv_transpose_backward_data, dy, w, **attrs))
    assert dx.shape == x.shape
    assert_adjoint(lhs, np.vdot(x, dx), scale, "conv_transpose_backward_data")

    wshape = w.shape if full else p.geometry.kernel
    dw = target.to_numpy(target.call(polyconv.conv_transpose_backward_weights, x, dy,
                                     weights_shape=wshape, **attrs))
    assert dw.shape == w.shape
    assert_adjoint(lhs, np.vdot(w, dw), scale, "conv_transpose_backward_weights")


SWAP_OI = str.maketrans("OI", "IO")


@SETTINGS
@given(p=problems("conv_transpose"), data=st.data())
def test_conv_transpose_with_dst_shape_is_adjoint_of_convolution(target, p: Problem, data):
    """ConvTranspose with dst_shape resolves same_* by rule F on dst_shape, exactly as the
    Convolution it transposes: its adjoint is that Convolution, with the same weights array
    read in the Convolution family (O and I swapped in the format string; see
    docs/semantics.md#layouts)."""
    rng, x, w = p.arrays()
    attrs = {k: v for k, v in p.attrs.items() if k != "output_padding"}
    geo = p.geometry
    same = attrs["auto_pad"].startswith("same")
    sizes = []
    for b, s, k, d, p0, p1 in zip(geo.b_spatial, geo.strides, geo.kernel, geo.dilations,
                                  geo.pads_begin, geo.pads_end):
        # the reachable range of docs/semantics.md#geometry: s sizes starting at lo
        lo = s * (b - 1) + 1 if same else s * (b - 1) + (k - 1) * d + 1 - p0 - p1
        assume(lo >= 1)
        sizes.append(data.draw(st.integers(lo, lo + s - 1)))
    y = target.to_numpy(target.call(polyconv.conv_transpose, x, w, dst_shape=tuple(sizes),
                                    **attrs))
    ca = geo.a_channels
    assert y.shape == oracle.data_shape(geo.batch, ca, sizes, geo.channels_last)
    dy = rng.standard_normal(y.shape)
    ref = oracle.reference("conv_transpose", x, w, dst_shape=tuple(sizes), **attrs)
    scale = np.vdot(ref.abs_sum, np.abs(dy))
    lhs = np.vdot(y, dy)
    conv_attrs = {**attrs, "weights_format": attrs["weights_format"].translate(SWAP_OI)}
    dx = target.to_numpy(target.call(polyconv.convolution, dy, w, **conv_attrs))
    assert dx.shape == x.shape
    assert_adjoint(lhs, np.vdot(x, dx), scale, "convolution as adjoint of conv_transpose")
    dw = target.to_numpy(target.call(polyconv.convolution_backward_weights, dy, x,
                                     weights_shape=w.shape, **conv_attrs))
    assert_adjoint(lhs, np.vdot(w, dw), scale,
                   "convolution_backward_weights as adjoint of conv_transpose")


@pytest.mark.parametrize("auto_pad", ["same_upper", "same_lower"])
def test_same_padded_pair_with_odd_total(target, auto_pad):
    """A fixed case where the same_* total is odd on both rules (so upper and lower differ)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 7, 2))            # NXC, A=7
    w = rng.standard_normal((4, 2, 3))            # XIO: k=4, ek=4; s=2: F total 3, T total 2
    attrs = {"strides": 2, "auto_pad": auto_pad}
    y = target.to_numpy(target.call(polyconv.convolution, x, w, **attrs))
    dy = rng.standard_normal(y.shape)
    scale = np.vdot(oracle.reference("convolution", x, w, **attrs).abs_sum, np.abs(dy))
    dx = target.to_numpy(target.call(polyconv.convolution_backward_data, dy, w,
                                     dst_shape=x.shape, **attrs))
    assert_adjoint(np.vdot(y, dy), np.vdot(x, dx), scale, "convolution_backward_data")
