"""The PyTorch backend's own features: autograd, torch.compile, precision, 16-bit paths,
devices, ranks past 3, dispatch and its place in the product.

The shared matrix (``tests/test_matrix.py`` and friends on the ``torch`` target) checks its
values against the float64 oracle; this module checks what only this backend has.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from cases import grid
from conftest import only_with_target
from oracle import MAIN_OPS, assert_within_bound, reference

only_with_target("torch")
torch = pytest.importorskip("torch")
pytest.importorskip("polyconv_torch")

import polyconv_torch  # noqa: E402
from polyconv_torch import _lowering, _numerics  # noqa: E402

import polyconv  # noqa: E402

# --------------------------------------------------------------------------------------------
# small geometries of both families, as (family, src shape, weights shape, attrs)
# --------------------------------------------------------------------------------------------

GEOMETRIES = [
    ("conv", (2, 7, 6, 4), (3, 2, 2, 6),
     dict(strides=(2, 1), pads_begin=(1, 0), pads_end=(0, 2), dilations=(1, 2), groups=2)),
    ("conv", (2, 4, 9), (6, 4, 3), dict(strides=2, auto_pad="same_lower", data_format="NCX",
                                        weights_format="OIX")),
    ("conv", (1, 5, 4, 3, 2), (2, 2, 2, 2, 3), dict(pads_begin=(1, 0, 1), pads_end=(0, 1, 0))),
    ("tconv", (2, 5, 4, 6), (3, 3, 2, 6),
     dict(strides=2, pads_begin=(1, 0), pads_end=(0, 2), output_padding=1, groups=2)),
    ("tconv", (2, 6, 5), (6, 3, 4), dict(strides=3, auto_pad="same_upper", data_format="NCX",
                                         weights_format="IOX")),
    ("tconv", (2, 5, 4), (3, 3, 4), dict(strides=2, dilations=2, pads_begin=1, pads_end=0)),
]
IDS = [f"{fam}-{len(w) - 2}d-{i}" for i, (fam, _, w, _) in enumerate(GEOMETRIES)]


def _tensor(rng, shape, dtype=torch.float64, grad=False):
    t = torch.from_numpy(rng.uniform(-1, 1, size=shape)).to(dtype)
    return t.requires_grad_(grad)


def _ops(family: str, attrs: dict):
    """The family's three ops as functions of their array inputs only."""
    if family == "conv":
        fwd = lambda x, w, b=None: polyconv.convolution(x, w, b, **attrs)  # noqa: E731
        bwd_data = lambda dy, w, like: polyconv.convolution_backward_data(  # noqa: E731
            dy, w, tuple(like.shape), **attrs)
        bwd_w = lambda x, dy, w_like: polyconv.convolution_backward_weights(  # noqa: E731
            x, dy, tuple(w_like.shape), **attrs)
    else:
        fwd = lambda x, w, b=None: polyconv.conv_transpose(x, w, b, **attrs)  # noqa: E731
        bwd_data = lambda dy, w, like: polyconv.conv_transpose_backward_data(  # noqa: E731
            dy, w, **attrs)
        bwd_w = lambda x, dy, w_like: polyconv.conv_transpose_backward_weights(  # noqa: E731
            x, dy, tuple(w_like.shape), **attrs)
    return fwd, bwd_data, bwd_w


def _bias_shape(family, w_shape, attrs, out):
    fmt = attrs.get("data_format", "NXC")
    return (out.shape[-1] if fmt == "NXC" else out.shape[1],)


# --------------------------------------------------------------------------------------------
# autograd
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=IDS)
def test_autograd_equals_the_backward_ops(geometry, dtype):
    """``torch.autograd.grad`` of Convolution / ConvTranspose is polyconv's own backward ops
    (and the bias gradient the sum of the cotangent)."""
    family, x_shape, w_shape, attrs = geometry
    fwd, bwd_data, bwd_w = _ops(family, attrs)
    rng = np.random.default_rng(0)
    x, w = _tensor(rng, x_shape, dtype, True), _tensor(rng, w_shape, dtype, True)
    out = fwd(x.detach(), w.detach())
    b = _tensor(rng, _bias_shape(family, w_shape, attrs, out), dtype, True)
    y = fwd(x, w, b)
    assert y.requires_grad and y.dtype == dtype
    g = _tensor(rng, y.shape, dtype)
    gx, gw, gb = torch.autograd.grad(y, (x, w, b), g)
    torch.testing.assert_close(gx, bwd_data(g, w.detach(), x), rtol=0, atol=0)
    torch.testing.assert_close(gw, bwd_w(x.detach(), g, w), rtol=0, atol=0)
    channel = -1 if attrs.get("data_format", "NXC") == "NXC" else 1
    torch.testing.assert_close(gb, g.movedim(channel, 0).reshape(g.shape[channel], -1).sum(1))


@pytest.mark.parametrize("op", ["forward", "backward_data", "backward_weights"])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=IDS)
def test_gradcheck_every_op(geometry, op):
    """First and second derivatives of all six ops against finite differences (float64)."""
    family, x_shape, w_shape, attrs = geometry
    fwd, bwd_data, bwd_w = _ops(family, attrs)
    rng = np.random.default_rng(1)
    x, w = _tensor(rng, x_shape, grad=True), _tensor(rng, w_shape, grad=True)
    dy_shape = tuple(fwd(x.detach(), w.detach()).shape)
    if op == "forward":
        b = _tensor(rng, _bias_shape(family, w_shape, attrs, fwd(x.detach(), w.detach())),
                    grad=True)
        fn, inputs = fwd, (x, w, b)
    elif op == "backward_data":
        fn, inputs = (lambda dy, w: bwd_data(dy, w, x)), (_tensor(rng, dy_shape, grad=True), w)
    else:
        fn, inputs = (lambda x, dy: bwd_w(x, dy, w)), (x, _tensor(rng, dy_shape, grad=True))
    assert torch.autograd.gradcheck(fn, inputs)
    assert torch.autograd.gradgradcheck(fn, inputs)


GRAD_GRID = [c for i, fn in enumerate(MAIN_OPS) for c in grid(fn, full=True, seed=11 + i)]


@pytest.mark.parametrize("case", GRAD_GRID, ids=lambda c: c.label)
def test_autograd_over_the_shared_grid(case):
    """Every op of the shared grid is bilinear in its two array inputs, so its gradient in
    each is checked against the op itself: ``<g, op(dp, q)> == <grad_p, dp>`` (float64)."""
    rng = np.random.default_rng(9)
    arrays = [None if a is None else torch.from_numpy(a.astype(np.float64))
              for a in case.arrays()]
    p, q = (arrays[0].requires_grad_(True), arrays[1].requires_grad_(True))
    fn = getattr(polyconv, case.fn)

    def op(p, q):
        return fn(p, q, *case.positional, **case.attrs)

    y = op(p, q)
    g = _tensor(rng, y.shape)
    gp, gq = torch.autograd.grad(y, (p, q), g)
    dp, dq = _tensor(rng, p.shape), _tensor(rng, q.shape)
    with torch.no_grad():
        lhs = [(g * op(dp, q)).sum(), (g * op(p, dq)).sum()]
    rhs = [(gp * dp).sum(), (gq * dq).sum()]
    for a, b in zip(lhs, rhs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_differentiable_calls_skip_the_per_call_signature_binding(monkeypatch):
    """Outside ``torch.func`` and ``torch.compile``, a differentiable call does not go through
    ``Function.apply``'s ``inspect.signature`` binding (most of its Python cost on a small
    layer), and its values and gradients are those of the backward ops."""
    import inspect

    from polyconv_torch._autograd import Primitive

    signature = inspect.signature

    def refuse(fn, *args, **kwargs):
        if fn is Primitive.forward:
            raise AssertionError("a differentiable call bound its arguments by signature")
        return signature(fn, *args, **kwargs)

    rng = np.random.default_rng(5)
    x, w = _tensor(rng, (2, 6, 5, 3), grad=True), _tensor(rng, (3, 2, 3, 4), grad=True)
    attrs = {"strides": (2, 1), "pads_begin": 1, "pads_end": (0, 1)}
    monkeypatch.setattr(inspect, "signature", refuse)
    y = polyconv.convolution(x, w, **attrs)
    g = _tensor(rng, y.shape)
    gx, gw = torch.autograd.grad(y, (x, w), g)
    monkeypatch.undo()
    torch.testing.assert_close(y, polyconv.convolution(x.detach(), w.detach(), **attrs),
                               rtol=0, atol=0)
    torch.testing.assert_close(gx, polyconv.convolution_backward_data(
        g, w.detach(), x.shape, **attrs), rtol=0, atol=0)
    torch.testing.assert_close(gw, polyconv.convolution_backward_weights(
        x.detach(), g, w.shape, **attrs), rtol=0, atol=0)


def test_torch_func_grad_and_vmap():
    """``torch.func.grad`` equals ``torch.autograd.grad``; ``torch.func.vmap`` over a batch of
    weights equals a loop, also through a gradient."""
    rng = np.random.default_rng(10)
    x, w = _tensor(rng, (2, 9, 9, 4)), _tensor(rng, (3, 3, 4, 6))
    attrs = dict(strides=2, pads_begin=(1, 0), pads_end=(2, 1))

    def loss(x, w):
        return polyconv.convolution(x, w, **attrs).square().sum()

    got = torch.func.grad(loss, argnums=(0, 1))(x, w)
    xr, wr = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    torch.testing.assert_close(got, torch.autograd.grad(loss(xr, wr), (xr, wr)))
    ws = _tensor(rng, (3, 3, 3, 4, 6))
    ys = torch.func.vmap(lambda w: polyconv.convolution(x, w, **attrs))(ws)
    torch.testing.assert_close(ys, torch.stack([polyconv.convolution(x, w, **attrs)
                                                for w in ws]))
    gs = torch.func.vmap(torch.func.grad(loss, argnums=1), in_dims=(None, 0))(x, ws)
    torch.testing.assert_close(gs, torch.stack([torch.func.grad(loss, argnums=1)(x, w)
                                                for w in ws]))


def test_grad_of_16bit_inputs_keeps_their_dtype():
    rng = np.random.default_rng(2)
    x = _tensor(rng, (2, 6, 6, 4), torch.bfloat16, True)
    w = _tensor(rng, (3, 3, 4, 5), torch.bfloat16, True)
    gx, gw = torch.autograd.grad(polyconv.convolution(x, w, pads_begin=1).sum(), (x, w))
    assert gx.dtype == gw.dtype == torch.bfloat16
    assert gx.shape == x.shape and gw.shape == w.shape


def test_no_autograd_when_nothing_needs_a_gradient():
    x, w = torch.ones(1, 5, 5, 2), torch.ones(3, 3, 2, 4)
    assert polyconv.convolution(x, w).grad_fn is None
    x.requires_grad_(True)
    assert polyconv.convolution(x, w).grad_fn is not None
    with torch.no_grad():
        assert polyconv.convolution(x, w).grad_fn is None


def _graph_nodes(y) -> list[str]:
    """The class names of every node of ``y``'s autograd graph."""
    seen, stack, names = set(), [y.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        stack.extend(n for n, _ in node.next_functions)
    return names


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=IDS)
def test_differentiable_calls_record_atens_own_nodes(geometry, dtype):
    """Under the user's own float32 setting (the CPU default), a differentiable call records
    ATen's nodes, those of the hand-written torch call (the convolution's own backward,
    both gradients in one call), and no Python autograd function."""
    if torch.backends.mkldnn.conv.fp32_precision not in ("ieee", "none"):
        pytest.skip("a reduced float32 precision is set process-wide")
    family, x_shape, w_shape, attrs = geometry
    fwd, _, _ = _ops(family, attrs)
    rng = np.random.default_rng(7)
    x, w = _tensor(rng, x_shape, dtype, True), _tensor(rng, w_shape, dtype, True)
    nodes = _graph_nodes(fwd(x, w))
    assert "ConvolutionBackward0" in nodes
    assert not [n for n in nodes if n.endswith("BackwardCFunction") or "Primitive" in n]


def _forget_kernels() -> None:
    """Drop the torch lowerings and kernels made so far, and the calls that hold them."""
    from polyconv import _dispatch

    _lowering._lower_cached.cache_clear()
    _lowering._kernel_cached.cache_clear()
    _dispatch._DISPATCH.clear()


def test_gradients_under_an_overridden_setting_keep_the_calls_precision(monkeypatch):
    """Under a reduced process-wide oneDNN setting, which polyconv's float32 calls override,
    the gradient runs under the call's setting too (through polyconv's own autograd
    function, whose input gradient is a transposed convolution seen here): full float32
    precision, the user's setting untouched."""
    knob = torch.backends.mkldnn.conv
    seen = []
    real = _lowering._CONV_T[2]

    def probe(*args, **kwargs):
        seen.append(knob.fp32_precision)
        return real(*args, **kwargs)

    rng = np.random.default_rng(8)
    x = _tensor(rng, (2, 12, 12, 64), torch.float32, True)
    w = _tensor(rng, (3, 3, 64, 64), torch.float32, True)
    attrs = {"pads_begin": 1, "pads_end": 1}
    before = knob.fp32_precision
    try:
        knob.fp32_precision = "bf16"
    except Exception as exc:  # pragma: no cover - a torch without the setting
        pytest.skip(f"this torch cannot set oneDNN's float32 precision: {exc}")
    monkeypatch.setitem(_lowering._CONV_T, 2, probe)
    _forget_kernels()
    try:
        y = polyconv.convolution(x, w, **attrs)
        g = _tensor(rng, y.shape, torch.float32)
        gx, gw = torch.autograd.grad(y, (x, w), g)
        assert knob.fp32_precision == "bf16"
    finally:
        knob.fp32_precision = before
        monkeypatch.undo()
        _forget_kernels()
    assert seen == ["ieee"]
    _bound_check(gx, "convolution_backward_data", (g, w), "float32", dst_shape=x.shape,
                 **attrs)
    _bound_check(gw, "convolution_backward_weights", (x, g), "float32",
                 weights_shape=w.shape, **attrs)


# --------------------------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------------------------


def test_torch_compile_full_graph():
    """A function calling polyconv compiles into one graph (``fullgraph=True``) once the
    backend has been loaded, and its values and gradients equal eager mode."""
    polyconv.get_backend("torch")  # the one import a traced call cannot make (docs)
    rng = np.random.default_rng(3)
    x = _tensor(rng, (2, 9, 9, 4), torch.float32, True)
    w = _tensor(rng, (3, 3, 4, 6), torch.float32, True)

    def f(x, w):
        y = polyconv.convolution(x, w, strides=2, pads_begin=(1, 0), pads_end=(2, 1))
        return polyconv.conv_transpose(y, w, strides=2, output_padding=1).square().sum()

    torch._dynamo.reset()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    eager = f(x, w)
    got = compiled(x, w)
    torch.testing.assert_close(got, eager)
    torch.testing.assert_close(torch.autograd.grad(got, (x, w)),
                               torch.autograd.grad(eager, (x, w)))


def test_torch_compile_full_graph_on_a_first_call():
    """A call whose arguments polyconv meets for the first time inside the trace (its checks
    and plan traced, not remembered from an eager call) compiles into one graph too."""
    polyconv.get_backend("torch")
    rng = np.random.default_rng(13)
    x = _tensor(rng, (3, 11, 10, 5), torch.float32, True)   # shapes no other test uses
    w = _tensor(rng, (5, 2, 3, 3), torch.float32, True)

    def f(x, w):
        y = polyconv.conv_transpose(x, w, strides=(2, 3), pads_begin=(1, 0), pads_end=1,
                                    data_format="NXC", weights_format="IOX")
        return y.square().sum()

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, w)
    grads = torch.autograd.grad(got, (x, w))
    eager = f(x, w)
    torch.testing.assert_close(got, eager)
    torch.testing.assert_close(grads, torch.autograd.grad(eager, (x, w)))


# --------------------------------------------------------------------------------------------
# numerics: float32 precision, the 16-bit paths
# --------------------------------------------------------------------------------------------


def _bound_check(y, fn, arrays, dtype, **attrs):
    ref = reference(fn, *[a.detach().double().numpy() for a in arrays], **attrs)
    assert_within_bound(y.detach().double().numpy(), ref.y, ref.abs_sum, ref.n, dtype)


def test_float32_is_full_precision_despite_a_reduced_global_setting():
    """A process-wide reduced-precision oneDNN setting does not reach polyconv's float32
    calls unless the caller opts in with ``precision="default"``; the setting is restored."""
    knob = torch.backends.mkldnn.conv
    rng = np.random.default_rng(4)
    x, w = _tensor(rng, (2, 16, 16, 64), torch.float32), _tensor(rng, (3, 3, 64, 64),
                                                                 torch.float32)
    before = knob.fp32_precision
    try:
        knob.fp32_precision = "bf16"
    except Exception as exc:  # pragma: no cover - a torch without the setting
        pytest.skip(f"this torch cannot set oneDNN's float32 precision: {exc}")
    try:
        y = polyconv.convolution(x, w, pads_begin=1, pads_end=1)
        assert knob.fp32_precision == "bf16"
        _bound_check(y, "convolution", (x, w), "float32", pads_begin=1, pads_end=1)
        polyconv.convolution(x, w, pads_begin=1, pads_end=1, precision="default")  # runs
    finally:
        knob.fp32_precision = before


def test_float32_calls_read_the_cpu_setting_without_the_knobs_getattr(monkeypatch):
    """The common float32 CPU call reads oneDNN's precision setting through torch's C getter,
    not the knob object's ``__getattr__`` (which answers only after a failed attribute lookup,
    a few microseconds of every small call); the result is still full precision."""
    knob_type = type(torch.backends.mkldnn.conv)
    if (getattr(torch._C, "_get_fp32_precision_getter", None) is None
            or not hasattr(knob_type, "__getattr__")):
        pytest.skip("this torch has no C getter for oneDNN's float32 precision")
    if torch.backends.mkldnn.conv.fp32_precision not in ("ieee", "none"):
        pytest.skip("a reduced float32 precision is set process-wide")

    def refuse(self, name):
        raise AssertionError(f"the knob's __getattr__ was asked for {name!r}")

    rng = np.random.default_rng(6)
    x, w = _tensor(rng, (2, 9, 7, 5), torch.float32), _tensor(rng, (3, 2, 5, 4), torch.float32)
    attrs = {"strides": (2, 1), "pads_begin": (1, 0), "pads_end": 1}
    monkeypatch.setattr(knob_type, "__getattr__", refuse)
    y = polyconv.convolution(x, w, **attrs)
    monkeypatch.undo()
    _bound_check(y, "convolution", (x, w), "float32", **attrs)


def test_float32_precision_settings_of_a_torch_before_2_9(monkeypatch):
    """A torch before 2.9 has no ``fp32_precision`` knobs: cuDNN's TF32 is its
    ``allow_tf32`` flag (set off inside a call, restored after) and oneDNN has no reduced
    float32 setting, so CPU calls run as they are (they raised AttributeError before)."""
    from types import SimpleNamespace

    cudnn = SimpleNamespace(allow_tf32=True)
    monkeypatch.setattr(torch.backends, "cudnn", cudnn)
    monkeypatch.setattr(torch.backends, "mkldnn", SimpleNamespace())
    assert _numerics._knob("mkldnn") is None
    knob = _numerics._knob("cudnn")
    assert knob.read() == "tf32"
    monkeypatch.setitem(_numerics._KNOBS, "cuda", knob)
    monkeypatch.setitem(_numerics._KNOBS, "cpu", None)
    plan = polyconv.infer_shape("convolution", (1, 4, 4, 2), (3, 3, 2, 2)).with_(
        dtype="float32")
    with _numerics._fp32_precision(plan, torch.device("cuda")):
        assert cudnn.allow_tf32 is False
    assert cudnn.allow_tf32 is True
    with _numerics._fp32_precision(plan.with_(precision="high"), torch.device("cuda")):
        assert cudnn.allow_tf32 is True
    rng = np.random.default_rng(7)
    x, w = _tensor(rng, (2, 6, 5, 3), torch.float32), _tensor(rng, (3, 2, 3, 4), torch.float32)
    y = polyconv.convolution(x, w, pads_begin=1, pads_end=1)
    _bound_check(y, "convolution", (x, w), "float32", pads_begin=1, pads_end=1)


def test_precision_levels():
    assert _numerics._level(None) == "HIGHEST"
    assert _numerics._level("tensorfloat32") == "HIGH"
    assert _numerics._level(("default", "highest")) == "DEFAULT"
    with pytest.raises(ValueError, match="precision"):
        polyconv.convolution(torch.ones(1, 3, 1), torch.ones(1, 1, 1), precision="fast")


HALF_CASES = [c for fn in MAIN_OPS for c in grid(fn, full=True, seed=71)
              if c.dtype in ("float16", "bfloat16")][:40]


@pytest.mark.parametrize("case", HALF_CASES, ids=lambda c: c.label)
def test_16bit_paths_meet_the_bound(case):
    """float16/bfloat16 on CPU (computed in float32 with one rounding) meet the error bound
    of docs/numerics.md."""
    tdt = getattr(torch, case.dtype)
    arrays = case.arrays()
    ref = case.expected(arrays)
    tensors = [None if a is None else polyconv_torch.to_tensor(a) for a in arrays]
    y = getattr(polyconv, case.fn)(*tensors, *case.positional, **case.attrs)
    assert y.dtype == tdt
    assert_within_bound(polyconv_torch.to_numpy(y), ref.y, ref.abs_sum, ref.n, case.dtype)


# 16-bit plans that PyTorch 2.13's oneDNN computed wrongly (bfloat16: the last output axis
# has one position and a stride above one) or crashed on (float16, 1-D, one sample, padded)
# on a Xeon with AVX512-BF16/FP16 and AMX: (op, dtype, src NCX, weights OIX, attrs)
_ONEDNN_16BIT_FAILURES = [
    ("bfloat16", (2, 3, 5, 4, 4), (4, 3, 3, 1, 2),
     {"strides": (2, 1, 3), "dilations": (1, 2, 1), "auto_pad": "valid"}),
    ("bfloat16", (2, 8, 7, 2), (5, 8, 2, 2), {"strides": (1, 3)}),
    ("bfloat16", (2, 4, 6, 5, 5), (5, 4, 1, 1, 2),
     {"strides": (3, 1, 3), "dilations": (2, 2, 2)}),
    ("float16", (2, 2, 1), (5, 2, 1),
     {"strides": 2, "dilations": 2, "pads_begin": 1, "pads_end": 1}),
]


@pytest.mark.parametrize(("dtype", "src", "wts", "attrs"), _ONEDNN_16BIT_FAILURES)
def test_16bit_plans_onednn_got_wrong_meet_the_bound(dtype, src, wts, attrs):
    """polyconv's PyTorch backend computes these in float32 on CPU, whatever oneDNN offers:
    forward and both backward ops within the one-rounding bound of the float64 oracle."""
    from oracle import random_array

    rng = np.random.default_rng(29)
    attrs = {**attrs, "data_format": "NCX", "weights_format": "OIX"}
    x, w = random_array(rng, src, dtype), random_array(rng, wts, dtype)
    b = random_array(rng, (wts[0],), dtype)
    plan = polyconv.infer_shape("convolution", x.shape, w.shape, **attrs)
    dy = random_array(rng, plan.shape, dtype)
    calls = [("convolution", (x, w, b), {}),
             ("convolution_backward_data", (dy, w), {"dst_shape": x.shape}),
             ("convolution_backward_weights", (x, dy), {"weights_shape": w.shape})]
    for op, inputs, extra in calls:
        y = getattr(polyconv, op)(*(polyconv_torch.to_tensor(a) for a in inputs), **extra,
                                  **attrs)
        assert y.dtype == getattr(torch, dtype)
        ref = reference(op, *inputs, **extra, **attrs)
        assert_within_bound(polyconv_torch.to_numpy(y), ref.y, ref.abs_sum, ref.n, dtype)


def test_nan_and_inf_propagate():
    x = torch.ones(1, 6, 6, 2)
    x[0, 2, 2, 0] = float("nan")
    x[0, 4, 1, 1] = float("inf")
    y = polyconv.convolution(x, torch.ones(3, 3, 2, 1), pads_begin=1, pads_end=1)
    expected = polyconv.convolution(x.numpy(), np.ones((3, 3, 2, 1), np.float32),
                                    pads_begin=1, pads_end=1)
    np.testing.assert_array_equal(y.numpy(), expected)


# --------------------------------------------------------------------------------------------
# inputs, devices, ranks
# --------------------------------------------------------------------------------------------


def test_inputs_are_not_modified_and_views_work():
    rng = np.random.default_rng(5)
    base = _tensor(rng, (2, 8, 12, 6), torch.float32)
    x = base[:, :, ::2, :5]                      # a strided, non-contiguous view
    w = _tensor(rng, (4, 3, 3, 5), torch.float32).permute(1, 2, 3, 0)  # XIO, permuted
    copies = base.clone(), w.clone()
    y = polyconv.convolution(x, w, strides=2, pads_begin=(0, 1), pads_end=(2, 0))
    assert y.is_contiguous()
    torch.testing.assert_close(base, copies[0], rtol=0, atol=0)
    torch.testing.assert_close(w, copies[1], rtol=0, atol=0)
    expected = polyconv.convolution(x.numpy(), w.numpy(), strides=2, pads_begin=(0, 1),
                                    pads_end=(2, 0), backend="numpy")
    np.testing.assert_allclose(y.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_result_on_the_input_device():
    """Shapes only, on torch's ``meta`` device (no values)."""
    x = torch.empty(2, 9, 9, 4, device="meta")
    w = torch.empty(3, 3, 4, 6, device="meta")
    y = polyconv.conv_transpose(x, torch.empty(3, 3, 5, 4, device="meta"), strides=2,
                                pads_begin=(1, 0), pads_end=(0, 1), output_padding=1)
    assert y.device.type == "meta"
    assert tuple(y.shape) == polyconv.infer_shape(
        "conv_transpose", (2, 9, 9, 4), (3, 3, 5, 4), strides=2, pads_begin=(1, 0),
        pads_end=(0, 1), output_padding=1).shape
    assert polyconv.convolution(x, w).device.type == "meta"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=IDS)
def test_cuda(geometry, dtype):  # pragma: no cover - needs a GPU
    """On CUDA (cuDNN): results on the device, within the bound, TF32 off by default."""
    family, x_shape, w_shape, attrs = geometry
    fn = "convolution" if family == "conv" else "conv_transpose"
    rng = np.random.default_rng(6)
    tdt = getattr(torch, dtype)
    x, w = _tensor(rng, x_shape, tdt), _tensor(rng, w_shape, tdt)
    y = getattr(polyconv, fn)(x.cuda(), w.cuda(), **attrs)
    assert y.device.type == "cuda" and y.dtype == tdt
    _bound_check(y.cpu(), fn, (x, w), dtype, **attrs)


def test_rank_4_runs_on_the_generic_backend():
    rng = np.random.default_rng(7)
    x = _tensor(rng, (1, 4, 3, 4, 3, 2), torch.float64, True)
    w = _tensor(rng, (2, 2, 2, 2, 2, 3), torch.float64, True)
    y = polyconv.convolution(x, w, pads_begin=1)
    expected = polyconv.convolution(x.detach().numpy(), w.detach().numpy(), pads_begin=1)
    np.testing.assert_allclose(y.detach().numpy(), expected, rtol=1e-12)
    gx, = torch.autograd.grad(y.sum(), x)
    assert gx.shape == x.shape


def test_lowering_is_decided_once_per_plan():
    plan = polyconv.infer_shape("conv_transpose", (2, 9, 4), (3, 5, 4), strides=2,
                                pads_begin=1, pads_end=0)
    low = _lowering.lowering(plan)
    assert _lowering.lowering(plan) is low
    assert low.lift and low.padding == (0, 0) and low.crop == ((3, 1, plan.a_spatial[0]),)


# --------------------------------------------------------------------------------------------
# in the product: dispatch, polyconv backends, compare
# --------------------------------------------------------------------------------------------


def test_dispatch_picks_torch_and_array_api_stays_reachable():
    x, w = torch.ones(1, 5, 5, 2), torch.ones(3, 3, 2, 4)
    from polyconv._backends import infer_backend

    assert infer_backend("convolution", {"src": x, "weights": w}) == "torch"
    generic = polyconv.convolution(x, w, backend="array_api")
    torch.testing.assert_close(polyconv.convolution(x, w), generic)


def test_backends_lists_torch_with_version_and_devices(capsys):
    from polyconv._cli import main

    assert main(["backends", "--json"]) == 0
    info = {b["name"]: b for b in json.loads(capsys.readouterr().out)}["torch"]
    assert info["available"] is True
    assert info["versions"]["torch"] == torch.__version__
    assert info["devices"].startswith("cpu (oneDNN")


def test_compare_includes_torch_labelled_with_its_engine():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 8, 8, 3)).astype(np.float32)
    w = rng.standard_normal((3, 3, 3, 5)).astype(np.float32)
    result = polyconv.compare("convolution", x, w, pads_begin=1, pads_end=1)
    rows = {r.backend: r for r in result.results}
    assert rows["torch"].ok, result
    assert rows["torch"].library.startswith("torch cpu (oneDNN") or "cuDNN" in rows[
        "torch"].library


def test_the_plan_cache_never_skips_validation():
    """Calls resolve their plan once per shapes, attributes and dtype; values that compare
    equal but fail validation (``True == 1``, ``1.0 == 1``) still raise."""
    x, w = torch.ones(1, 5, 5, 2), torch.ones(3, 3, 2, 4)
    polyconv.convolution(x, w, strides=1, groups=1)
    for bad in (dict(strides=True), dict(strides=1.0), dict(groups=True)):
        with pytest.raises(TypeError, match="integer"):
            polyconv.convolution(x, w, **bad)
    assert polyconv.convolution(x, w, strides=[1, 1]).shape == (1, 3, 3, 4)  # uncached
