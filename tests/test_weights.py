"""polyconv.convert_weights, checked against each framework's own layer or op: a framework's
weights, converted, make polyconv compute that framework's output. Frameworks not installed
skip visibly; the ``frameworks`` nox session installs them all."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
from conftest import only_with_target

import polyconv
from polyconv._weights import FRAMEWORK_LAYOUTS

only_with_target("frameworks")

FORMATS = ("OIX", "XIO", "IOX", "XOI")
FAMILIES = ("convolution", "conv_transpose")
RNG = np.random.default_rng(0)


def _rand(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _names(family: str) -> list[str]:
    return [*FORMATS, *(n for n, fams in FRAMEWORK_LAYOUTS.items() if family in fams)]


def _close(got, want) -> None:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * max(1, np.abs(want).max()))


def _nchw(y) -> np.ndarray:
    return np.moveaxis(np.asarray(y), -1, 1)


# --------------------------------------------------------------------------------------------
# between layouts: every pair, both ways, and as polyconv reads its own formats
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
def test_every_pair_round_trips_and_no_path_matters(family):
    w = _rand(6, 4, 3, 2)                       # canonical [Cb, Ca/G, K..] with 3 groups
    for src, dst in itertools.product(_names(family), repeat=2):
        a = polyconv.convert_weights(w, "OIX" if family == "convolution" else "IOX", src,
                                     family=family, groups=3)
        b = polyconv.convert_weights(a, src, dst, family=family, groups=3)
        direct = polyconv.convert_weights(w, "OIX" if family == "convolution" else "IOX",
                                          dst, family=family, groups=3)
        np.testing.assert_array_equal(b, direct, err_msg=f"{src} -> {dst}")
        back = polyconv.convert_weights(b, dst, src, family=family, groups=3)
        np.testing.assert_array_equal(back, a, err_msg=f"{dst} -> {src}")


@pytest.mark.parametrize(("family", "src", "dst"),
                         [(f, s, d) for f in FAMILIES for s in FORMATS for d in FORMATS])
def test_polyconv_formats_as_polyconv_reads_them(family, src, dst):
    """A weight converted between two polyconv formats gives the op the same output."""
    op = polyconv.convolution if family == "convolution" else polyconv.conv_transpose
    x = _rand(1, 5, 6, 4)
    canon = _rand(6, 2, 3, 2) if family == "convolution" else _rand(4, 3, 3, 2)
    fmt0 = "OIX" if family == "convolution" else "IOX"
    w = polyconv.convert_weights(canon, fmt0, src, family=family)
    attrs = {"strides": 2, "groups": 2, "dilations": (1, 2)}
    want = op(x, w, weights_format=src, **attrs)
    got = op(x, polyconv.convert_weights(w, src, dst, family=family), weights_format=dst,
             **attrs)
    _close(got, want)


def test_a_jax_array_wrapper_is_read_as_its_array():
    jnp = pytest.importorskip("jax.numpy")

    class Param:
        def __init__(self, value):
            self.value = value

        def __jax_array__(self):
            return self.value

    w = jnp.asarray(_rand(3, 2, 2, 2))
    got = polyconv.convert_weights(Param(w), "torch", "keras", family="conv_transpose")
    np.testing.assert_array_equal(got, np.transpose(np.asarray(w), (2, 3, 1, 0)))


@pytest.mark.parametrize(("kwargs", "match", "shape"), [
    ({"src": "torch", "dst": "XIO", "family": "conv3d"}, "family must be one of", (6, 2, 3)),
    ({"src": "caffe", "dst": "XIO", "family": "conv"}, "unknown src='caffe'", (6, 2, 3)),
    ({"src": "torch", "dst": "flax-transpose-kernel", "family": "conv"},
     "has no convolution weights", (6, 2, 3)),
    ({"src": "OIHW", "dst": "XIO", "family": "conv"}, "names 2 spatial axes", (6, 2, 3)),
    ({"src": "torch", "dst": "openvino-group", "family": "conv", "groups": 5},
     "groups=5 must divide 6", (6, 2, 3)),
    ({"src": "openvino-group", "dst": "XIO", "family": "conv", "groups": 3},
     "group axis has 6 groups but groups=3", (6, 2, 3, 3)),
])
def test_refusals_name_the_rule(kwargs, match, shape):
    with pytest.raises(ValueError, match=match):
        polyconv.convert_weights(_rand(*shape), **kwargs)


# --------------------------------------------------------------------------------------------
# against the frameworks' own layers and ops
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dst", FORMATS)
def test_torch_conv_and_conv_transpose(dst):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    x = _rand(2, 4, 7, 6)
    conv = torch.nn.Conv2d(4, 6, (3, 2), stride=2, dilation=(1, 2), groups=2, bias=False)
    convt = torch.nn.ConvTranspose2d(4, 6, (3, 2), stride=2, dilation=(2, 1), groups=2,
                                     bias=False)
    for layer, op, family in ((conv, polyconv.convolution, "convolution"),
                              (convt, polyconv.conv_transpose, "conv_transpose")):
        want = layer(torch.from_numpy(x)).detach().numpy()
        w = polyconv.convert_weights(layer.weight.detach(), "torch", dst, family=family)
        assert isinstance(w, torch.Tensor)
        got = op(x, w.numpy(), strides=2, dilations=layer.dilation, groups=2,
                 data_format="NCX", weights_format=dst)
        _close(got, want)


@pytest.fixture(scope="module")
def nnx():
    return pytest.importorskip("flax.nnx")


@pytest.mark.parametrize("transpose_kernel", [False, True])
@pytest.mark.parametrize("dst", FORMATS)
def test_flax_conv_transpose_kernel(nnx, dst, transpose_kernel):
    """Flax's ConvTranspose kernel, with and without ``transpose_kernel``, converted."""
    layer = nnx.ConvTranspose(3, 5, (3, 2), strides=(2, 2), kernel_dilation=(1, 2),
                              padding="VALID", use_bias=False, transpose_kernel=transpose_kernel,
                              rngs=nnx.Rngs(0))
    x = _rand(2, 4, 5, 3)
    want = layer(x)
    src = "flax-transpose-kernel" if transpose_kernel else "flax"
    w = polyconv.convert_weights(layer.kernel, src, dst, family="conv_transpose")
    got = polyconv.conv_transpose(x, np.asarray(w), strides=2, dilations=(1, 2),
                                  weights_format=dst)
    _close(got, want)


@pytest.mark.parametrize("dst", FORMATS)
def test_flax_conv_kernel_with_groups(nnx, dst):
    layer = nnx.Conv(4, 6, (3, 2), strides=(2, 1), kernel_dilation=(2, 1), padding="VALID",
                     feature_group_count=2, use_bias=False, rngs=nnx.Rngs(0))
    x = _rand(2, 9, 5, 4)
    w = polyconv.convert_weights(layer.kernel, "flax", dst, family="convolution")
    got = polyconv.convolution(x, np.asarray(w), strides=(2, 1), dilations=(2, 1), groups=2,
                               weights_format=dst)
    _close(got, layer(x))


@pytest.fixture(scope="module")
def keras():
    os.environ.setdefault("KERAS_BACKEND", "jax")
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "jax":
        pytest.skip(f"Keras runs on {keras.backend.backend()!r} here; these tests use JAX")
    return keras


@pytest.mark.parametrize("dst", FORMATS)
def test_keras_conv2d_groups_and_conv2d_transpose(keras, dst):
    x = _rand(2, 7, 6, 4)
    conv = keras.layers.Conv2D(6, (3, 2), strides=(2, 1), groups=2, use_bias=False)
    convt = keras.layers.Conv2DTranspose(5, (3, 2), strides=(2, 2), dilation_rate=1,
                                         padding="valid", use_bias=False)
    want = conv(x)
    w = polyconv.convert_weights(conv.kernel, "keras", dst, family="convolution")
    _close(polyconv.convolution(x, np.asarray(w), strides=(2, 1), groups=2,
                                weights_format=dst), want)
    want = convt(x)
    w = polyconv.convert_weights(convt.kernel, "keras", dst, family="conv_transpose")
    _close(polyconv.conv_transpose(x, np.asarray(w), strides=2, weights_format=dst), want)


@pytest.mark.parametrize("dst", FORMATS)
def test_lax_conv_transpose_both_kernel_conventions(dst):
    lax = pytest.importorskip("jax.lax")
    x = _rand(1, 5, 4, 3)
    # HWIO rhs: [K.., IC, OC] as it is, [K.., OC, IC] with transpose_kernel (which swaps)
    for flag, src, k in ((False, "lax", _rand(3, 2, 3, 4)),
                         (True, "lax-transpose-kernel", _rand(3, 2, 4, 3))):
        want = lax.conv_transpose(x, k, (2, 2), "VALID", rhs_dilation=(2, 1),
                                  dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                  transpose_kernel=flag)
        w = polyconv.convert_weights(k, src, dst, family="conv_transpose")
        got = polyconv.conv_transpose(x, np.asarray(w), strides=2, dilations=(2, 1),
                                      weights_format=dst)
        _close(got, want)


@pytest.mark.parametrize("groups", [1, 2, 3])
def test_lax_lhs_dilation_regroups_a_grouped_conv_transpose(groups):
    """A grouped ConvTranspose as ``lax.conv_general_dilated`` with ``lhs_dilation``: the
    regrouping that a plain reshape gets wrong (torchax's aten.convolution)."""
    lax = pytest.importorskip("jax.lax")
    x, w = _rand(2, 4, 5, 6), _rand(6, 2, 3, 2)         # IOX: [IC, OC/G, K..]
    rhs = polyconv.convert_weights(w, "torch", "lax-lhs-dilation", family="conv_transpose",
                                   groups=groups)
    eks = (3, 2)
    want = lax.conv_general_dilated(x, rhs, (1, 1), [(e - 1, e - 1) for e in eks],
                                    lhs_dilation=(2, 2), feature_group_count=groups,
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"))
    got = polyconv.conv_transpose(x, w, strides=2, groups=groups, weights_format="IOX")
    _close(got, want)


def _onnx_run(op_type, x, w, **attrs):
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper

    node = helper.make_node(op_type, ["x", "w"], ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
                      helper.make_tensor_value_info("w", TensorProto.FLOAT, w.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [f"d{i}" for i in range(x.ndim)])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x, "w": w})[0]


@pytest.mark.parametrize("dst", FORMATS)
def test_onnxruntime_grouped_conv_and_conv_transpose(dst):
    x = _rand(1, 4, 6, 5)
    for op_type, op, family, w in (("Conv", polyconv.convolution, "convolution",
                                    _rand(6, 2, 3, 2)),
                                   ("ConvTranspose", polyconv.conv_transpose, "conv_transpose",
                                    _rand(4, 3, 3, 2))):
        want = _onnx_run(op_type, x, w, group=2, strides=[2, 1], dilations=[1, 2])
        wc = polyconv.convert_weights(w, "onnx", dst, family=family)
        got = op(x, wc, strides=(2, 1), dilations=(1, 2), groups=2, data_format="NCX",
                 weights_format=dst)
        _close(got, want)


def _openvino_run(build, x):
    ov = pytest.importorskip("openvino")
    import openvino.opset15 as ops

    param = ops.parameter(list(x.shape), np.float32)
    model = ov.Model([build(ops, param)], [param])
    # full float32: the CPU plugin may otherwise infer in bfloat16 where the CPU has it
    config = {"INFERENCE_PRECISION_HINT": "f32"}
    return ov.compile_model(model, "CPU", config)(x)[0]


@pytest.mark.parametrize("dst", FORMATS)
def test_openvino_group_and_plain_filters(dst):
    x = _rand(1, 4, 6, 5)
    g_conv, g_back = _rand(2, 3, 2, 3, 2), _rand(2, 2, 3, 3, 2)  # [G, O/G, I/G..], [G, I/G, O/G..]
    conv, back = _rand(6, 4, 3, 2), _rand(4, 5, 3, 2)            # [O, I, ..], [I, O, ..]
    geometry = {"strides": [2, 1], "pads_begin": [0, 0], "pads_end": [0, 0],
                "dilations": [1, 2]}
    cases = [
        ("openvino-group", "convolution", g_conv, "group_convolution"),
        ("openvino-group", "conv_transpose", g_back, "group_convolution_backprop_data"),
        ("openvino", "convolution", conv, "convolution"),
        ("openvino", "conv_transpose", back, "convolution_backprop_data"),
    ]
    for src, family, w, name in cases:
        def build(ops, p, w, name=name):
            return getattr(ops, name)(p, w, **geometry)

        want = _openvino_run(lambda ops, p, build=build, w=w: build(ops, p, w), x)
        op = polyconv.convolution if family == "convolution" else polyconv.conv_transpose
        groups = w.shape[0] if src == "openvino-group" else 1
        wc = polyconv.convert_weights(w, src, dst, family=family)
        got = op(x, wc, strides=(2, 1), dilations=(1, 2), groups=groups, data_format="NCX",
                 weights_format=dst)
        _close(got, want)
        # and back: polyconv's weights written in OpenVINO's layout make OpenVINO agree
        again = polyconv.convert_weights(wc, dst, src, family=family, groups=groups)
        _close(_openvino_run(lambda ops, p, build=build, w=again: build(ops, p, w), x), want)
