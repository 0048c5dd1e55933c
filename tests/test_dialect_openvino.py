"""The OpenVINO dialect against OpenVINO's CPU runtime, on a grid of attributes for the four
ops (docs/frameworks.md#openvino)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import only_with_target

from polyconv.dialects import openvino as dialect

only_with_target("frameworks")
ov = pytest.importorskip("openvino")
import openvino.opset15 as ops  # noqa: E402

RNG = np.random.default_rng(0)


def _runtime(op: str, x: np.ndarray, w: np.ndarray, output_shape, attrs) -> np.ndarray:
    param = ops.parameter(list(x.shape), np.float32)
    kw = dict(attrs)
    if output_shape is not None:
        kw["output_shape"] = ops.constant(np.array(output_shape, np.int64))
    node = getattr(ops, op)(param, w, **kw)
    compiled = ov.compile_model(ov.Model([node], [param]), "CPU",
                                {"INFERENCE_PRECISION_HINT": "f32"})   # not bfloat16
    return compiled(x)[0]


def _grid(backprop: bool, small: bool = False):
    kernels = ((2, 1), (3, 2)) if small else ((1, 1), (2, 1), (2, 2), (3, 1), (3, 2))
    for (k, d), s, auto_pad, pads in itertools.product(
            kernels, (1, 2, 3), dialect.AUTO_PADS, ((1, 0), (2, 1))):
        if auto_pad != "explicit" and pads != (1, 0):
            continue                         # the pads are ignored (or refused) there
        opads = sorted({0, s - 1}) if backprop else (None,)
        for opad, out in itertools.product(opads, ("none", "x*s", "x*s+1", "full-1")
                                           if backprop else ("none",)):
            yield k, s, d, auto_pad, pads, opad, out


@pytest.mark.parametrize("grouped", [False, True])
def test_backprop_data_grid(grouped):
    checked = refused = 0
    op = "group_convolution_backprop_data" if grouped else "convolution_backprop_data"
    for k, s, d, auto_pad, pads, opad, out in _grid(backprop=True, small=grouped):
        x = RNG.standard_normal((1, 4, 4, 3)).astype(np.float32)
        w = RNG.standard_normal((2, 2, 3, k, 2) if grouped else (4, 3, k, 2)).astype(np.float32)
        ek = (k - 1) * d + 1
        full = [s * 3 + ek + opad, 2 * 2 + 2]
        output_shape = {"none": None, "x*s": [4 * s, 6], "x*s+1": [4 * s + 1, 6],
                        "full-1": [full[0] - 1, 6]}[out]
        attrs = {"strides": [s, 2], "pads_begin": [pads[0], 0], "pads_end": [pads[1], 0],
                 "dilations": [d, 1], "auto_pad": auto_pad, "output_padding": [opad, 0]}
        try:
            want = _runtime(op, x, w, output_shape, attrs)
        except RuntimeError:
            continue
        try:
            got = getattr(dialect, op)(x, w, output_shape, **attrs)
        except ValueError as e:
            assert ("negative begin crop" in str(e) or "below the stride" in str(e)
                    or "explicit pads with output_shape" in str(e)), e
            refused += 1
            continue
        assert got.shape == want.shape, (attrs, output_shape)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4,
                                   err_msg=f"{attrs} {output_shape}")
        checked += 1
    assert checked > (60 if grouped else 200), (checked, refused)


@pytest.mark.parametrize("grouped", [False, True])
def test_convolution_grid(grouped):
    checked = 0
    op = "group_convolution" if grouped else "convolution"
    for k, s, d, auto_pad, pads, _, _ in _grid(backprop=False):
        x = RNG.standard_normal((1, 4, 7, 5)).astype(np.float32)
        w = RNG.standard_normal((2, 3, 2, k, 2) if grouped else (6, 4, k, 2)).astype(np.float32)
        attrs = {"strides": [s, 1], "pads_begin": [pads[0], 0], "pads_end": [pads[1], 1],
                 "dilations": [d, 1], "auto_pad": auto_pad}
        try:
            want = _runtime(op, x, w, None, attrs)
        except RuntimeError:
            continue
        got = getattr(dialect, op)(x, w, **attrs)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(attrs))
        checked += 1
    assert checked > 40, checked
