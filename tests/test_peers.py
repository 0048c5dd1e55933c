"""The peers of ``polyconv compare --peers`` (other frameworks' own operators) checked where
each peer is known right: ONNX's published node tests of Conv and ConvTranspose (expected
outputs computed by ONNX, not polyconv) through each peer's translation, the grid in float32
against the float64 reference, the ONNX reference's known failures reported as findings, and
the exported ONNX cases run by onnxruntime."""

from __future__ import annotations

import functools
import json
import warnings

import numpy as np
import pytest
from conftest import only_with_target

import polyconv
from polyconv._cli import main
from polyconv._cli_cases import export_cases
from polyconv._cli_compare import _make_inputs, _suite_jobs
from polyconv._peers import PEER_OPS, PEERS, CannotExpress, peer_operands
from polyconv.dialects import jax as jax_dialect
from polyconv.dialects import keras as keras_dialect
from polyconv.dialects import onnx as dialect
from polyconv.dialects import tensorflow as dialect_tf

only_with_target("frameworks")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("torch")
pytest.importorskip("jax")
from onnx import numpy_helper  # noqa: E402

BY_NAME = {p.name: p for p in PEERS}


@functools.cache
def _node_cases() -> list:
    """ONNX's own node tests of the two operators (one node, float32), as built by the code
    that writes onnx's ``backend/test/data/node`` directories."""
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = node.collect_testcases(None)
    return [c for c in cases if c.model is not None and len(c.model.graph.node) == 1
            and c.model.graph.node[0].op_type in dialect.OP_TYPES]


def _node_call(case):
    """The node test as a polyconv plan, its operands by role, and ONNX's expected output."""
    graph = case.model.graph
    values = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    inputs, (want,) = case.data_sets[0]
    values.update(zip([i.name for i in graph.input if i.name not in values], inputs))
    node = graph.node[0]
    op_type, attrs = dialect.node_attributes(node)
    arrays = dict(zip(("src", "weights", "bias"),
                      (np.asarray(values[n]) for n in node.input if n)))
    kw = dialect.keywords(op_type, arrays["src"].shape, arrays["weights"].shape, **attrs)
    fn = "convolution" if op_type == "Conv" else "conv_transpose"
    plan = polyconv.infer_shape(fn, arrays["src"].shape, arrays["weights"].shape, **kw)
    return plan.with_(dtype="float32"), arrays, np.asarray(want)


#: What ONNX's node tests hold that a peer's own operator cannot say (counted, not hidden).
_CANNOT = {"torch": {"test_conv_with_autopad_same", "test_convtranspose_autopad_same",
                     "test_convtranspose_pads", "test_convtranspose_output_shape",
                     "test_convtranspose_kernel_shape"},
           "lax": {"test_convtranspose_group_2", "test_convtranspose_group_2_image_3"},
           "tensorflow": {"test_convtranspose_dilations", "test_convtranspose_group_2",
                          "test_convtranspose_group_2_image_3"},
           "keras": {"test_conv_with_strides_and_asymmetric_padding", "test_convtranspose_pads",
                     "test_convtranspose_group_2", "test_convtranspose_group_2_image_3",
                     "test_convtranspose_dilations"},   # the last on its TensorFlow backend
           "flax": {"test_convtranspose_group_2", "test_convtranspose_group_2_image_3"}}


@pytest.mark.parametrize("peer", ["torch", "onnxruntime", "onnx-reference", "lax", "openvino",
                                  "tensorflow", "keras", "flax"])
def test_each_peer_matches_onnx_published_node_tests(peer):
    if not BY_NAME[peer].available:
        pytest.skip(f"{peer} is not installed ({BY_NAME[peer].install})")
    ran, cannot = [], set()
    for case in _node_cases():
        plan, arrays, want = _node_call(case)
        try:
            got = BY_NAME[peer].run(plan, *peer_operands(plan, arrays))
        except CannotExpress:
            cannot.add(case.name)
            continue
        got = np.asarray(got)
        assert got.shape == want.shape, case.name
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=case.name)
        ran.append(case.name)
    assert cannot <= _CANNOT.get(peer, set()), sorted(cannot)
    assert len(ran) >= 12, ran


def _tf_calls():
    """TensorFlow's own calls (``tf.nn`` function, input shape, filter shape, keywords) in
    each of its padding modes, including the transposed SAME rule and depthwise filters."""
    return [
        ("conv1d", (2, 9, 3), (3, 3, 4), {"stride": 2, "padding": "SAME"}),
        ("conv2d", (1, 7, 6, 2), (3, 2, 2, 4), {"strides": [1, 2, 1, 1], "padding": "SAME",
                                                "dilations": [1, 1, 2, 1]}),
        ("conv2d", (1, 7, 6, 2), (3, 3, 2, 3), {"strides": 1,
                                                "padding": [[0, 0], [2, 0], [1, 1], [0, 0]]}),
        ("conv3d", (1, 5, 4, 5, 2), (2, 3, 2, 2, 3), {"strides": [1, 2, 1, 2, 1],
                                                      "padding": "SAME"}),
        ("depthwise_conv2d", (1, 7, 7, 3), (3, 3, 3, 2), {"strides": [1, 2, 2, 1],
                                                          "padding": "SAME"}),
        ("conv2d_transpose", (1, 4, 4, 3), (3, 3, 2, 3), {"strides": 2, "padding": "SAME",
                                                          "output_shape": [1, 8, 7, 2]}),
        ("conv1d_transpose", (2, 5, 4), (3, 3, 4), {"strides": 2, "padding": "VALID",
                                                    "output_shape": [2, 12, 3]}),
    ]


def _plan_of_tf_call(fn, x, f, kw):
    tf_kw = dict(kw)
    if fn == "conv1d":
        tf_kw["strides"] = tf_kw.pop("stride")
    op = ("conv_transpose" if "transpose" in fn else
          "depthwise_conv2d" if fn == "depthwise_conv2d" else "conv")
    attrs = dialect_tf.keywords(op, x.shape, f.shape, **tf_kw)
    if op == "depthwise_conv2d":
        f = f.reshape(*f.shape[:2], 1, -1)
    name = "conv_transpose" if op == "conv_transpose" else "convolution"
    return polyconv.infer_shape(name, x.shape, f.shape, **attrs).with_(dtype="float32"), f


def test_the_tensorflow_peer_reproduces_tensorflow_own_calls():
    """Each TensorFlow call, read by the TensorFlow dialect into a plan, then run by the peer
    (which must find TensorFlow arguments meaning that plan), equals the call itself."""
    tf = pytest.importorskip("tensorflow")
    rng = np.random.default_rng(5)
    for fn, x_shape, f_shape, kw in _tf_calls():
        x, f = (rng.uniform(-1, 1, s).astype(np.float32) for s in (x_shape, f_shape))
        want = np.asarray(getattr(tf.nn, fn)(x, f, **kw))
        plan, f_poly = _plan_of_tf_call(fn, x, f, kw)
        got = BY_NAME["tensorflow"].run(plan, *peer_operands(plan, {"src": x,
                                                                      "weights": f_poly}))
        np.testing.assert_allclose(np.moveaxis(np.asarray(got), 1, -1), want, rtol=1e-5,
                                   atol=1e-5, err_msg=f"{fn} {kw}")


def _keras_calls():
    """``keras.ops`` calls whose padding rules differ: Keras's own transposed "same" with a
    kernel smaller than the stride, with and without ``output_padding``."""
    return [
        ("conv", (1, 7, 6, 4), (3, 3, 2, 6), {"strides": 2, "padding": "same"}),
        ("conv", (1, 7, 6, 2), (3, 2, 2, 3), {"padding": "valid", "dilation_rate": (2, 1)}),
        ("conv_transpose", (1, 4, 4, 3), (1, 1, 2, 3), {"strides": 3, "padding": "same"}),
        ("conv_transpose", (1, 4, 5, 3), (3, 3, 2, 3), {"strides": 2, "padding": "same",
                                                        "output_padding": 1}),
        ("conv_transpose", (2, 5, 4), (4, 3, 4), {"strides": 3, "padding": "valid",
                                                  "output_padding": 2}),
    ]


def test_the_keras_peer_reproduces_keras_own_calls():
    """As for TensorFlow: Keras's call, through the Keras dialect and back by the peer."""
    keras = pytest.importorskip("keras")
    rng = np.random.default_rng(6)
    for op, x_shape, k_shape, kw in _keras_calls():
        x, k = (rng.uniform(-1, 1, s).astype(np.float32) for s in (x_shape, k_shape))
        want = keras.ops.convert_to_numpy(getattr(keras.ops, op)(x, k, **kw))
        attrs = keras_dialect.keywords(op, x.shape, k.shape, **kw)
        name = "conv_transpose" if op == "conv_transpose" else "convolution"
        plan = polyconv.infer_shape(name, x.shape, k.shape, **attrs).with_(dtype="float32")
        got = BY_NAME["keras"].run(plan, *peer_operands(plan, {"src": x, "weights": k}))
        np.testing.assert_allclose(np.moveaxis(np.asarray(got), 1, -1), want, rtol=1e-5,
                                   atol=1e-5, err_msg=f"{op} {kw}")


def test_the_flax_peer_reproduces_flax_own_layers():
    """Flax's layers with lax's string paddings (its own SAME rules, read by the JAX dialect
    into a plan) equal the peer, which passes explicit pairs."""
    pytest.importorskip("flax")
    import jax
    from flax import linen

    rng = np.random.default_rng(7)
    for cls, x_shape, k, feats, kw in [
            (linen.Conv, (1, 7, 6, 4), (3, 3), 6, {"strides": 2, "padding": "SAME",
                                                   "feature_group_count": 2}),
            (linen.ConvTranspose, (1, 4, 5, 3), (3, 3), 2, {"strides": 2, "padding": "SAME",
                                                            "transpose_kernel": True}),
            (linen.ConvTranspose, (2, 5, 4), (4,), 3, {"strides": 3, "padding": "VALID",
                                                       "kernel_dilation": 2,
                                                       "transpose_kernel": True})]:
        layer = cls(feats, k, precision=jax.lax.Precision.HIGHEST, **kw)
        x = rng.uniform(-1, 1, x_shape).astype(np.float32)
        params = layer.init(jax.random.key(0), x)
        want = np.asarray(layer.apply(params, x))
        w, b = (np.asarray(params["params"][n]) for n in ("kernel", "bias"))
        if cls is linen.Conv:
            plan = polyconv.infer_shape(
                "convolution", x.shape, w.shape, strides=kw["strides"], auto_pad="same_upper",
                groups=kw["feature_group_count"], data_format="NXC", weights_format="XIO")
        else:
            nd = len(k)
            attrs = jax_dialect.transpose_pads(
                "flax", kw["padding"], (kw["strides"],) * nd,
                [(kk - 1) * kw.get("kernel_dilation", 1) + 1 for kk in k])
            plan = polyconv.infer_shape(
                "conv_transpose", x.shape, w.shape, strides=kw["strides"],
                dilations=kw.get("kernel_dilation", 1), data_format="NXC",
                weights_format="XOI", **attrs)
        plan = plan.with_(dtype="float32")
        got = BY_NAME["flax"].run(plan, *peer_operands(plan, {"src": x, "weights": w,
                                                              "bias": b}))
        np.testing.assert_allclose(np.moveaxis(np.asarray(got), 1, -1), want, rtol=1e-5,
                                   atol=1e-5, err_msg=f"{cls.__name__} {kw}")


@functools.cache
def _grid(dtype: str = "float32"):
    return list(_grid_run(dtype))


def _grid_run(dtype: str):
    for j, job in enumerate(_suite_jobs(PEER_OPS, bias=True)):
        inputs = _make_inputs(job, dtype, np.random.default_rng([0, j]))
        yield job, polyconv.compare(job.name, *inputs, backends=["numpy"], label=job.label,
                                    peers="all", **job.attrs)


#: The float32 grid's findings: each peer's wrong answers, found by the tool (not typed in
#: from elsewhere), with the reason read from its output.
KNOWN_FINDINGS = {
    # onnx 1.23's reference regroups ConvTranspose weights as if each group had one output
    # channel: it raises for more (issue 56's report)
    ("onnx-reference", "conv_transpose", "2d grouped, asymmetric pads, output_padding"):
        "raises",
    # and on grouped ConvTranspose with bias it adds B[0] to every output channel (output
    # minus reference is B[0] - B[c] in channel c; right without bias)
    ("onnx-reference", "conv_transpose", "2d depthwise, valid, XIO"): "disagrees",
}


def test_the_grid_in_float32_agrees_except_the_known_findings():
    seen = {}
    for job, c in _grid():
        assert c.ok
        for r in c.peers:
            if r.status not in ("agrees", "cannot express"):
                seen[(r.peer, job.name, job.label)] = r.status
    assert seen == KNOWN_FINDINGS


def test_cannot_express_names_the_attribute():
    reasons = {(r.peer, r.detail.split(":")[0]) for _, c in _grid() for r in c.peers
               if r.status == "cannot express"}
    pads = {"pads_begin/pads_end", "pads_begin/pads_end/output_padding"}
    want = {("torch", a) for a in pads} | {("lax", "groups"), ("flax", "groups")}
    want |= {(p, "op") for p in ("onnxruntime", "onnx-reference", "openvino")
             if BY_NAME[p].available}   # no gradients
    if BY_NAME["tensorflow"].available:
        want |= {("tensorflow", a) for a in (*pads, "groups", "dilations")}
    if BY_NAME["keras"].available:
        want |= {("keras", a) for a in (*pads, "groups")}
        if "tensorflow backend" in BY_NAME["keras"].version:
            want.add(("keras", "dilations"))
    assert reasons == want


def test_onnx_peers_note_the_documented_difference_of_transposed_same():
    """ONNX's ConvTranspose SAME_* alone puts output_padding into the pads: the ONNX peers
    get the suite's same_lower-with-output_padding case with output_shape, agree, and the
    result says why it was given so."""
    (c,) = [c for job, c in _grid() if job.name == "conv_transpose"
            and job.label == "2d dilated, same_lower, output_padding"]
    for r in c.peers:
        if r.peer in ("onnxruntime", "onnx-reference"):
            assert r.status == "agrees", r
            assert "given as auto_pad=SAME_LOWER with output_shape=[9, 9]" in r.detail, r
            assert "documented difference" in r.detail and "frameworks.md#onnx" in r.detail
        else:
            assert not r.detail or r.status != "agrees", r


def test_exported_onnx_cases_check_load_and_run_under_onnxruntime(tmp_path):
    import onnxruntime as ort

    written, skipped = export_cases(tmp_path, "onnx", ("float32", "float16", "bfloat16"))
    assert len(written) == 26 and len(skipped) == 13
    assert all("bfloat16" in name for name, _ in skipped)
    for path in written:
        model = onnx.load(str(path / "model.onnx"))
        onnx.checker.check_model(model, full_check=True)
        data = path / "test_data_set_0"
        feeds = {i.name: numpy_helper.to_array(onnx.load_tensor(str(data / f"input_{k}.pb")))
                 for k, i in enumerate(model.graph.input)}
        want = numpy_helper.to_array(onnx.load_tensor(str(data / "output_0.pb")))
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        got = session.run(None, feeds)[0]
        assert got.shape == want.shape and got.dtype == want.dtype, path.name
        tol = 1e-5 if want.dtype == np.float32 else 2e-2
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=path.name)


def test_exported_outputs_are_the_float64_reference(tmp_path):
    """The stored output is the independent oracle's value, rounded once to the dtype."""
    from oracle import reference

    written, _ = export_cases(tmp_path, "npz")
    assert len(written) == 13
    for path in written:
        with np.load(path) as f:
            attrs = json.loads(str(f["attributes"]))
            op = attrs.pop("op")
            for key in ("label", "dtype"):
                attrs.pop(key)
            attrs = {k: tuple(v) if isinstance(v, list) else v for k, v in attrs.items()}
            want = reference(op, f["src"], f["weights"], f["bias"], **attrs).y
            np.testing.assert_allclose(f["reference"], want, rtol=1e-12, atol=1e-12,
                                       err_msg=path.name)


def test_cli_peers_report_findings_with_exit_status_0(capsys):
    status = main(["compare", "--peers", "all", "--backends", "numpy", "--dtypes", "float32",
                   "--op", "ConvTranspose", "-q"])
    out = capsys.readouterr().out
    assert status == 0
    assert "onnx-reference, ConvTranspose 2d grouped, asymmetric pads, output_padding " \
           "float32: raises: ValueError" in out
    assert "lax cannot express groups" in out


def test_cli_cases_export_writes_every_case(tmp_path, capsys):
    assert main(["cases", "export", "--format", "npz", "--dtypes", "float32,bfloat16",
                 str(tmp_path)]) == 0
    assert len(list(tmp_path.glob("test_polyconv_*.npz"))) == 26
    with np.load(next(tmp_path.glob("*_bfloat16.npz"))) as f:   # exact values, in float64
        assert f["src"].dtype == np.float64
    assert "wrote 26 Convolution and ConvTranspose cases (npz)" in capsys.readouterr().out
