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
from openvino.utils.node_factory import NodeFactory  # noqa: E402

RNG = np.random.default_rng(0)


def _runtime(op: str, x: np.ndarray, w: np.ndarray, output_shape, attrs) -> np.ndarray:
    param = ops.parameter(list(x.shape), np.float32)
    if output_shape is None:
        node = getattr(ops, op)(param, w, **attrs)
    else:
        # opset's group_convolution_backprop_data drops the pads when given output_shape; the
        # node factory builds the op with the attributes as given (as an IR or ONNX model has)
        kw = {"pads_begin": [0] * (x.ndim - 2), "pads_end": [0] * (x.ndim - 2),
              "auto_pad": "explicit", **attrs}
        kw["auto_pad"] = kw["auto_pad"].upper()
        name = "".join(part.title() for part in op.split("_"))
        node = NodeFactory("opset1").create(
            name, [param, ops.constant(w), ops.constant(np.array(output_shape, np.int64))], kw)
        if kw["auto_pad"] == "EXPLICIT":
            assert node.get_attributes()["pads_begin"] == kw["pads_begin"], kw
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
            assert "negative begin crop" in str(e) or "below the stride" in str(e), e
            refused += 1
            continue
        assert got.shape == want.shape, (attrs, output_shape)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4,
                                   err_msg=f"{attrs} {output_shape}")
        checked += 1
    assert checked > (60 if grouped else 200), (checked, refused)


def _explicit_output_shape_grid(every: int):
    """Explicit pads with an ``output_shape`` around the natural size on axis 0 (every
    ``every``-th case), plus output_shape == the data's size for the 1x1, stride-1 case."""
    cases = itertools.product((1, 2, 3), (1, 2, 3, 4), (1, 2), ((1, 0), (0, 2), (2, 1)),
                              (0, 1, 2), (-2, -1, 1))
    kept = [c for c in cases if c[4] < c[0] and (c[1] > 1 or c[2] == 1)]
    yield from kept[::every]
    for pb, pe in ((0, 0), (1, 0), (2, 1)):
        yield 1, 1, 1, (pb, pe), 0, "x"


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("grouped", [False, True])
def test_backprop_data_explicit_pads_with_output_shape(grouped, ndim):
    checked = refused = 0
    op = "group_convolution_backprop_data" if grouped else "convolution_backprop_data"
    x_size = 4
    for s, k, d, (pb, pe), o_pad, delta in _explicit_output_shape_grid(
            1 if (ndim, grouped) == (1, False) else 3):
        x = RNG.standard_normal((1, 4, x_size) + (3,) * (ndim - 1)).astype(np.float32)
        kernel = (k,) + (2,) * (ndim - 1)
        w = RNG.standard_normal((2, 2, 3, *kernel) if grouped else (4, 3, *kernel))
        w = w.astype(np.float32)
        natural = s * (x_size - 1) + (k - 1) * d + 1 - pb - pe + o_pad
        size = x_size if delta == "x" else natural + delta
        if size < 1:
            continue
        # axis 1: data 3, kernel 2, stride 2, full 6, pads (1, 2): natural 4, size 6
        output_shape = [size] + [6] * (ndim - 1)
        attrs = {"strides": [s] + [2] * (ndim - 1), "pads_begin": [pb] + [1] * (ndim - 1),
                 "pads_end": [pe] + [2] * (ndim - 1), "dilations": [d] + [1] * (ndim - 1),
                 "output_padding": [o_pad] + [1] * (ndim - 1)}
        want = _runtime(op, x, w, output_shape, attrs)
        try:
            got = getattr(dialect, op)(x, w, output_shape, **attrs)
        except ValueError as e:
            assert "below the stride" in str(e), e
            # only where OpenVINO's output ends in `s` positions no product reaches
            assert not want[:, :, -s:].any(), (attrs, output_shape)
            refused += 1
            continue
        assert got.shape == want.shape, (attrs, output_shape)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5,
                                   err_msg=f"{attrs} {output_shape}")
        checked += 1
    assert checked > 3 * refused, (checked, refused)


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
