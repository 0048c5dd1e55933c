"""The ONNX dialect against ONNX itself: every published node test of Conv and ConvTranspose
(the ``onnx`` package's own cases, and its PyTorch-converted models), and a grid of attributes
run by onnxruntime and by ``onnx.reference.ReferenceEvaluator``, with the two runtimes'
documented disagreements checked to be what the docs say (docs/frameworks.md#onnx)."""

from __future__ import annotations

import functools
import itertools
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import only_with_target

from polyconv.dialects import onnx as dialect

only_with_target("frameworks")
onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

# --------------------------------------------------------------------------------------------
# the published node tests
# --------------------------------------------------------------------------------------------

@functools.cache
def _node_cases() -> list:
    """Every node test case of the two operators (``collect_testcases`` builds them, with
    their data, from the same code that writes onnx's ``data/node`` directories)."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)   # its op_type filter is not reliable
    return [pytest.param(c.model, c.data_sets[0], id=c.name) for c in cases
            if c.model is not None and len(c.model.graph.node) == 1
            and c.model.graph.node[0].op_type in dialect.OP_TYPES]


def _file_cases() -> list:
    """The models converted from PyTorch's tests that ship with ``onnx``, with their data."""
    root = Path(onnx.__file__).parent / "backend" / "test" / "data"
    out = []
    for path in sorted([*root.glob("pytorch-converted/test_Conv*"),
                        *root.glob("pytorch-operator/test_operator_conv*")]):
        model = onnx.load(str(path / "model.onnx"))
        tensors = []
        for kind in ("input", "output"):
            files = sorted((path / "test_data_set_0").glob(f"{kind}_*.pb"),
                           key=lambda p: int(p.stem.split("_")[1]))
            tensors.append([numpy_helper.to_array(onnx.load_tensor(str(f))) for f in files])
        out.append(pytest.param(model, tuple(tensors), id=path.name))
    return out


def _run_graph(model, inputs: list[np.ndarray]) -> np.ndarray:
    """The model's one Conv/ConvTranspose node through the dialect, initializers included."""
    graph = model.graph
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    feeds = [i.name for i in graph.input if i.name not in values]
    values.update(zip(feeds, inputs))
    (node,) = [n for n in graph.node if n.op_type in dialect.OP_TYPES]
    assert len(graph.node) == 1, [n.op_type for n in graph.node]
    return dialect.run_node(node, *(values[name] for name in node.input if name))


@pytest.mark.parametrize(("model", "data"), [*_node_cases(), *_file_cases()])
def test_published_node_tests(model, data):
    inputs, (want,) = data
    got = _run_graph(model, [np.asarray(x) for x in inputs])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_every_published_test_of_the_two_operators_is_run():
    names = {p.id for p in [*_node_cases(), *_file_cases()]}
    assert len(names) >= 17 + 30, sorted(names)
    assert {"test_convtranspose_output_shape", "test_convtranspose_autopad_same",
            "test_conv_with_autopad_same", "test_convtranspose_group_2_image_3"} <= names


# --------------------------------------------------------------------------------------------
# a grid of attributes against onnxruntime and the ONNX reference
# --------------------------------------------------------------------------------------------

def _model(op_type, x_shape, w_shape, attrs):
    node = helper.make_node(op_type, ["x", "w", "b"], ["y"], **attrs)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
              for n, s in (("x", x_shape), ("w", w_shape),
                           ("b", [w_shape[0] if op_type == "Conv" else
                                  w_shape[1] * attrs.get("group", 1)]))]
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    return helper.make_model(helper.make_graph([node], "g", inputs, out),
                             opset_imports=[helper.make_opsetid("", 17)])


def _runtimes(model, feeds) -> dict[str, object]:
    """Each runtime's output, or the exception it raised."""
    from onnx.reference import ReferenceEvaluator

    ort = pytest.importorskip("onnxruntime")
    ort.set_default_logger_severity(4)
    out = {}
    for name, run in (
            ("onnxruntime", lambda: ort.InferenceSession(
                model.SerializeToString(),
                providers=["CPUExecutionProvider"]).run(None, feeds)[0]),
            ("reference", lambda: ReferenceEvaluator(model).run(None, feeds)[0])):
        try:
            out[name] = run()
        except Exception as e:  # the runtime refuses the node
            out[name] = e
    return out


def _transpose_grid(full: bool):
    """Kernel, stride, dilation, size, auto_pad, output_padding and output_shape (below,
    at and above ``X * strides``, and the full transposed size); a smaller grid when not
    ``full``."""
    for k, s, d, x, auto_pad, opad, out in itertools.product(
            (1, 2, 3), (1, 2, 3), (1, 2) if full else (1,), (3, 4) if full else (3,),
            dialect.AUTO_PADS, (0, 1, 2), (None, -1, 0, 1, "full")):
        if opad >= s:
            continue
        attrs = {"strides": [s], "dilations": [d], "auto_pad": auto_pad}
        if opad:
            attrs["output_padding"] = [opad]
        if auto_pad == "NOTSET" and out is None:
            attrs["pads"] = [1, 0] if (k - 1) * d >= 1 else [0, 0]
        ek = (k - 1) * d + 1
        if out == "full":
            attrs["output_shape"] = [s * (x - 1) + ek + opad]
        elif out is not None:
            attrs["output_shape"] = [x * s + out]
        yield x, k, attrs


def _deviation(name, x, k, attrs, per_group) -> str | None:
    """Where a runtime is documented to differ from ONNX's rule (docs/frameworks.md#onnx)."""
    s, d = attrs["strides"][0], attrs["dilations"][0]
    full = s * (x - 1) + (k - 1) * d + 1 + attrs.get("output_padding", [0])[0]
    same = attrs["auto_pad"].startswith("SAME")
    if name == "onnxruntime" and same and full < x * s and "output_shape" not in attrs:
        return "onnxruntime clamps a negative SAME total pad to 0: output below X * strides"
    if name == "reference" and attrs.get("group", 1) > 1:
        return ("the reference's grouped ConvTranspose raises unless depthwise and adds "
                "bias[c % (M/group)] to channel c")
    if name == "reference" and not same and full > attrs.get("output_shape", [full])[0]:
        return "the reference ignores output_shape's pads under NOTSET/VALID"
    return None


@pytest.mark.parametrize(("group", "per_group"), [(1, 2), (2, 1), (3, 2)])
def test_conv_transpose_grid_against_both_runtimes(group, per_group):
    rng = np.random.default_rng(group)
    counts = {"onnxruntime": 0, "reference": 0, "refused": 0, "deviations": 0}
    for x_size, k, attrs in _transpose_grid(full=group == 1):
        if group > 1:
            attrs = {**attrs, "group": group}
        X = rng.standard_normal((2, per_group * group, x_size)).astype(np.float32)
        W = rng.standard_normal((per_group * group, per_group, k)).astype(np.float32)
        B = rng.standard_normal(per_group * group).astype(np.float32)
        runs = _runtimes(_model("ConvTranspose", X.shape, W.shape, attrs),
                         {"x": X, "w": W, "b": B})
        try:
            got = np.asarray(dialect.conv_transpose(X, W, B, **attrs))
        except ValueError as e:
            # only where polyconv has no equivalent: a bias-only position before the first
            # product, or more added positions than the stride allows
            assert "negative begin crop" in str(e) or "below the stride" in str(e), e
            # and never where the two runtimes agree on an answer
            ort, ref = runs["onnxruntime"], runs["reference"]
            assert (isinstance(ort, Exception) or isinstance(ref, Exception)
                    or ort.shape != ref.shape or not np.allclose(ort, ref, atol=1e-4)), attrs
            counts["refused"] += 1
            continue
        for name, want in runs.items():
            why = _deviation(name, x_size, k, attrs, per_group)
            if why is not None:
                assert (isinstance(want, Exception) or want.shape != got.shape
                        or not np.allclose(want, got, rtol=1e-4, atol=1e-4)), (why, attrs)
                counts["deviations"] += 1
                continue
            assert not isinstance(want, Exception), (name, attrs, want)
            assert want.shape == got.shape, (name, attrs)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4,
                                       err_msg=f"{name}: {attrs}")
            counts[name] += 1
    assert counts["onnxruntime"] > (300 if group == 1 else 100), counts
    assert counts["reference"] > (300 if group == 1 else -1), counts
    assert counts["deviations"] > 0 and counts["refused"] > 0, counts


def test_conv_grid_against_both_runtimes():
    rng = np.random.default_rng(0)
    checked = 0
    for k, s, d, x, auto_pad, group, pads in itertools.product(
            (1, 2, 3), (1, 2, 3), (1, 2), (5, 6), dialect.AUTO_PADS, (1, 2),
            ([0, 0, 0, 0], [1, 0, 2, 1])):
        attrs = {"strides": [s, 1], "dilations": [d, 1], "auto_pad": auto_pad,
                 "group": group, "kernel_shape": [k, 2]}
        if auto_pad == "NOTSET":
            attrs["pads"] = pads
        elif pads[0]:
            continue
        X = rng.standard_normal((1, 2 * group, x, 4)).astype(np.float32)
        W = rng.standard_normal((3 * group, 2, k, 2)).astype(np.float32)
        B = rng.standard_normal(3 * group).astype(np.float32)
        runs = _runtimes(_model("Conv", X.shape, W.shape, attrs), {"x": X, "w": W, "b": B})
        try:
            got = np.asarray(dialect.conv(X, W, B, **attrs))
        except ValueError as e:
            assert "would be empty" in str(e)
            assert all(isinstance(r, Exception) or 0 in r.shape for r in runs.values())
            continue
        for name, want in runs.items():
            if name == "onnxruntime" and d > 1 and auto_pad.startswith("SAME"):
                # onnxruntime refuses it ("Dilation not supported for AutoPadType::SAME_*")
                assert isinstance(want, Exception), attrs
                continue
            assert not isinstance(want, Exception), (name, attrs, want)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(attrs))
            checked += 1
    assert checked > 400, checked


def test_same_upper_with_output_padding_is_onnx_shape_not_rule_t():
    """The issue's case: ONNX gives ``X * strides`` under SAME_UPPER whatever output_padding,
    where polyconv's own ``same_upper`` (rule T) gives ``X * strides + output_padding``."""
    X = np.ones((1, 3, 5, 5), np.float32)
    W = np.ones((3, 6, 3, 3), np.float32)
    attrs = {"strides": [2, 2], "auto_pad": "SAME_UPPER", "output_padding": [1, 1]}
    runs = _runtimes(_model("ConvTranspose", X.shape, W.shape, attrs),
                     {"x": X, "w": W, "b": np.zeros(6, np.float32)})
    got = dialect.conv_transpose(X, W, **attrs)
    assert got.shape == (1, 6, 10, 10)
    for want in runs.values():
        np.testing.assert_allclose(got, want)
    # onnx's own shape inference disagrees with both runtimes (and with the operator's text):
    # it adds output_padding to X * strides
    inferred = onnx.shape_inference.infer_shapes(
        _model("ConvTranspose", X.shape, W.shape, attrs)).graph.output[0]
    assert [d.dim_value for d in inferred.type.tensor_type.shape.dim] == [1, 6, 11, 11]


@pytest.mark.parametrize(("op_type", "attrs", "error", "match"), [
    ("Conv", {"padding": [1]}, TypeError, "unknown attribute"),
    ("Conv", {"auto_pad": "SAME"}, ValueError, "auto_pad must be one of"),
    ("Conv", {"kernel_shape": [2, 2]}, ValueError, "kernel_shape=.* must be the spatial"),
    ("Conv", {"pads": [1, 1]}, ValueError, "pads must list 4 values"),
    ("ConvTranspose", {"output_padding": [2, 0], "strides": [2, 2]}, ValueError,
     r"output_padding must be in \[0, strides\)"),
    ("ConvTranspose", {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, ValueError,
     "negative begin crop"),
])
def test_refusals_say_why(op_type, attrs, error, match):
    w_shape = (2, 2, 1, 1) if op_type == "ConvTranspose" else (2, 2, 3, 3)
    with pytest.raises(error, match=match):
        dialect.keywords(op_type, (1, 2, 4, 4), w_shape, **attrs)
