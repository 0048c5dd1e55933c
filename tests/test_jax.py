"""JAX-only tests of the jax backend: jit, grad, vmap, precision, x64 and sharding.

Agreement with the oracle (and so with every other backend) is the shared matrix's job; here
the backend is checked against JAX itself: ``jax.grad`` of ``convolution`` and
``conv_transpose`` must equal polyconv's backward ops for every attribute combination.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import only_with_target

only_with_target("jax")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from jax_grid import (  # noqa: E402
    _CONV_VARIANTS,
    _KERNEL,
    _LARGE,
    _SMALL,
    _TRANSPOSE_VARIANTS,
    _attrs,
    _bias_grad,
    _cases,
    _channels,
    _close,
    _data,
    _hlo,
    _weights,
)
from oracle import EPS, assert_within_bound, reference  # noqa: E402
from polyconv_jax import _primitives, canonical_precision  # noqa: E402

import polyconv  # noqa: E402
from polyconv._choice import settings as choice_settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("jax_x64")   # the comparisons here are in float64


def _run_worker(name: str, **env: str) -> subprocess.CompletedProcess:
    """A script of tests/workers in a fresh interpreter (JAX on CPU, extra environment)."""
    pythonpath = os.pathsep.join([str(ROOT), str(ROOT / "backends"),
                                  os.environ.get("PYTHONPATH", "")])
    full_env = {**os.environ, "PYTHONPATH": pythonpath, "JAX_PLATFORMS": "cpu", **env}
    return subprocess.run([sys.executable, str(ROOT / "tests" / "workers" / name)],
                          env=full_env, capture_output=True, text=True, timeout=600,
                          check=False)


# --------------------------------------------------------------------------------------------
# grad of the ops over the attribute grid
# --------------------------------------------------------------------------------------------


def _convolution_inputs(rng, nd, fmt, wfmt, variant):
    """Attributes, src and weights (float64) of one Convolution case."""
    ic, oc, groups = _channels(variant)
    attrs = {**_attrs(variant, nd, fmt, wfmt), "groups": groups}
    x = jnp.asarray(_data(rng, 2, ic, _LARGE[nd], fmt))
    w = jnp.asarray(_weights(rng, oc, ic // groups, _KERNEL[nd], wfmt, "convolution"))
    return attrs, x, w


@pytest.mark.parametrize(("nd", "fmt", "wfmt", "variant"), _cases(_CONV_VARIANTS))
def test_jvp_of_convolution_is_linear_in_each_input(nd, fmt, wfmt, variant):
    # strided and grouped convolutions take their tangent from the transposes of polyconv's
    # backward lowerings; it must equal the convolution applied to the tangents (an
    # independent check of the adjoint relation against XLA's own convolution)
    rng = np.random.default_rng(1)
    attrs, x, w = _convolution_inputs(rng, nd, fmt, wfmt, variant)
    dx, dw = jnp.asarray(rng.standard_normal(x.shape)), jnp.asarray(rng.standard_normal(w.shape))

    def f(x, w):
        return polyconv.convolution(x, w, **attrs)

    y, t = jax.jit(lambda x, w, dx, dw: jax.jvp(f, (x, w), (dx, dw)))(x, w, dx, dw)
    _close(y, f(x, w))
    _close(t, f(dx, w) + f(x, dw))
    (t_x,) = jax.jvp(lambda x: f(x, w), (x,), (dx,))[1:]
    _close(t_x, f(dx, w))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_grad_of_a_strided_convolution_has_no_lhs_dilation(dtype):
    # jax's own transpose rule would emit an lhs-dilated convolution (XLA CPU's slow path);
    # the gradient goes through the backward_data lowering instead
    x, w = jnp.ones((2, 9, 8, 3), dtype), jnp.ones((3, 2, 3, 4), dtype)

    def loss(x, w):
        y = polyconv.convolution(x, w, strides=2, pads_begin=1, pads_end=1)
        return y.astype(jnp.float32).sum()

    text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(x, w).as_text()
    dilations = re.findall(r"lhs_dilate = \[([0-9, ]*)\]", text)
    assert all(set(d.replace(" ", "").split(",")) == {"1"} for d in dilations), dilations


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("groups", [1, 2])
def test_low_precision_grad_and_jvp_of_a_strided_convolution(dtype, groups):
    """The derivative rules cover float16/bfloat16 too: reverse mode yields the backward ops
    (checked against the float64 oracle within the error bound for the cotangent rounded to
    the inputs' dtype), forward mode the convolution of the tangents."""
    from oracle import random_array

    rng = np.random.default_rng(14)
    attrs = {"strides": (2, 3), "pads_begin": (1, 0), "pads_end": (2, 1), "groups": groups}
    x = random_array(rng, (2, 9, 10, 4), dtype)                  # NXC
    w = random_array(rng, (3, 2, 4 // groups, 6), dtype)          # XIO
    y_shape = polyconv.infer_shape("Convolution", x.shape, w.shape, **attrs).shape
    cot = random_array(rng, y_shape, dtype)

    def loss(x, w):
        y = polyconv.convolution(x, w, **attrs)
        return jnp.vdot(y.astype(jnp.float32), jnp.asarray(cot, jnp.float32))

    gx, gw = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.asarray(x), jnp.asarray(w))
    assert gx.dtype == gw.dtype == np.dtype(x.dtype)
    ref = reference("convolution_backward_data", cot, w, dst_shape=x.shape, **attrs)
    assert_within_bound(np.asarray(gx.astype(jnp.float64)), ref.y, ref.abs_sum, ref.n, dtype)
    ref = reference("convolution_backward_weights", x, cot, weights_shape=w.shape, **attrs)
    assert_within_bound(np.asarray(gw.astype(jnp.float64)), ref.y, ref.abs_sum, ref.n, dtype)

    # forward mode: the tangent in (x, w) is conv(dx, w) + conv(x, dw), exact in float64;
    # it is rounded twice (the transposed lowering's result, then the output)
    dx, dw = random_array(rng, x.shape, dtype), random_array(rng, w.shape, dtype)
    t = jax.jit(lambda *v: jax.jvp(lambda x, w: polyconv.convolution(x, w, **attrs),
                                   v[:2], v[2:])[1])(*map(jnp.asarray, (x, w, dx, dw)))
    r1 = reference("convolution", dx, w, **attrs)
    r2 = reference("convolution", x, dw, **attrs)
    exact, magnitude = r1.y + r2.y, r1.abs_sum + r2.abs_sum
    err = np.abs(np.asarray(t.astype(jnp.float64)) - exact)
    bound = EPS[dtype] * (np.abs(exact) + magnitude) + (r1.n + r2.n) * EPS["float32"] * magnitude
    assert np.all(err <= bound), float(np.max(err / bound))


@pytest.mark.parametrize(("nd", "fmt", "wfmt", "variant"), _cases(_CONV_VARIANTS))
def test_grad_of_convolution_is_the_backward_ops(nd, fmt, wfmt, variant):
    rng = np.random.default_rng(0)
    attrs, x, w = _convolution_inputs(rng, nd, fmt, wfmt, variant)
    bias = jnp.asarray(rng.standard_normal(_channels(variant)[1]))
    y_shape = polyconv.infer_shape("Convolution", x.shape, w.shape, **attrs).shape
    cot = jnp.asarray(rng.standard_normal(y_shape))

    @jax.jit  # one compilation for the whole comparison
    def grads_and_ops(x, w, bias, cot):
        def loss(x, w, bias):
            return jnp.vdot(polyconv.convolution(x, w, bias, **attrs), cot)

        return (jax.grad(loss, argnums=(0, 1, 2))(x, w, bias),
                (polyconv.convolution_backward_data(cot, w, x.shape, **attrs),
                 polyconv.convolution_backward_weights(x, cot, w.shape, **attrs),
                 _bias_grad(cot, fmt)))

    for grad, op in zip(*grads_and_ops(x, w, bias, cot)):
        _close(grad, op)


@pytest.mark.parametrize(("nd", "fmt", "wfmt", "variant"), _cases(_TRANSPOSE_VARIANTS))
def test_grad_of_conv_transpose_is_the_backward_ops(nd, fmt, wfmt, variant):
    rng = np.random.default_rng(1)
    ic, oc, groups = _channels(variant)
    attrs = {**_attrs(variant, nd, fmt, wfmt), "groups": groups}
    x = jnp.asarray(_data(rng, 2, ic, _SMALL[nd], fmt))
    w = jnp.asarray(_weights(rng, ic, oc // groups, _KERNEL[nd], wfmt, "conv_transpose"))
    bias = jnp.asarray(rng.standard_normal(oc))
    extra = {}
    if variant.get("dst_shape") == "+1":  # one row more than the attributes give
        plan = polyconv.infer_shape("ConvTranspose", x.shape, w.shape, **attrs)
        extra["dst_shape"] = tuple(a + 1 for a in plan.a_spatial)
    y_shape = polyconv.infer_shape("ConvTranspose", x.shape, w.shape, **attrs, **extra).shape
    cot = jnp.asarray(rng.standard_normal(y_shape))

    @jax.jit
    def grads_and_ops(x, w, bias, cot):
        def loss(x, w, bias):
            return jnp.vdot(polyconv.conv_transpose(x, w, bias, **attrs, **extra), cot)

        return (jax.grad(loss, argnums=(0, 1, 2))(x, w, bias),
                (polyconv.conv_transpose_backward_data(cot, w, **attrs),
                 polyconv.conv_transpose_backward_weights(x, cot, w.shape, **attrs),
                 _bias_grad(cot, fmt)))

    for grad, op in zip(*grads_and_ops(x, w, bias, cot)):
        _close(grad, op)


@pytest.mark.parametrize("fmt", ["NXC", "NCX"])
def test_grad_of_the_backward_data_ops(fmt):
    """Second order: the backward-data ops are differentiable too (and linear in each input)."""
    rng = np.random.default_rng(2)
    attrs = {"strides": 2, "pads_begin": 1, "pads_end": 0, "groups": 2, "data_format": fmt}
    w = jnp.asarray(rng.standard_normal((3, 3, 2, 6)))           # XIO: [K, K, IC/G, OC]
    dy = jnp.asarray(_data(rng, 2, 6, (4, 4), fmt))
    dx = polyconv.convolution_backward_data(dy, w, **attrs)
    cot = jnp.asarray(rng.standard_normal(dx.shape))
    g = jax.grad(lambda dy: jnp.vdot(polyconv.convolution_backward_data(dy, w, **attrs), cot))
    # d<bwd_data(dy), cot>/d dy = forward(cot), given the same large shape
    _close(g(dy), polyconv.convolution(cot, w, **attrs))


# --------------------------------------------------------------------------------------------
# jit, no retracing, vmap
# --------------------------------------------------------------------------------------------


def _six_op_inputs(rng, fmt="NXC", n=2):
    """Inputs for each of the six ops (a strided, grouped, padded geometry)."""
    attrs = {"strides": 2, "pads_begin": 1, "pads_end": 1, "groups": 2, "data_format": fmt}
    t_attrs = {**attrs, "output_padding": 1}
    x = _data(rng, n, 4, (7, 6), fmt)
    wc = rng.standard_normal((3, 3, 2, 6))   # convolution XIO [K, K, IC/G, OC]
    wt = rng.standard_normal((3, 3, 3, 4))   # conv_transpose XOI [K, K, OC/G, IC]
    y_shape = polyconv.infer_shape("Convolution", x.shape, wc.shape, **attrs).shape
    t_shape = polyconv.infer_shape("ConvTranspose", x.shape, wt.shape, **t_attrs).shape
    dy = rng.standard_normal(y_shape)
    dt = rng.standard_normal(t_shape)
    bc, bt = rng.standard_normal(6), rng.standard_normal(6)
    return {
        "convolution": (polyconv.convolution, (x, wc, bc), attrs),
        "convolution_backward_data": (
            lambda dy, w: polyconv.convolution_backward_data(dy, w, x.shape, **attrs),
            (dy, wc), {}),
        "convolution_backward_weights": (
            lambda x, dy: polyconv.convolution_backward_weights(x, dy, wc.shape, **attrs),
            (x, dy), {}),
        "conv_transpose": (polyconv.conv_transpose, (x, wt, bt), t_attrs),
        "conv_transpose_backward_data": (polyconv.conv_transpose_backward_data, (dt, wt),
                                         t_attrs),
        "conv_transpose_backward_weights": (
            lambda x, dt: polyconv.conv_transpose_backward_weights(x, dt, wt.shape, **t_attrs),
            (x, dt), {}),
    }


SIX = ("convolution", "convolution_backward_data", "convolution_backward_weights",
       "conv_transpose", "conv_transpose_backward_data", "conv_transpose_backward_weights")


@pytest.mark.parametrize("name", SIX)
def test_jit_matches_eager_and_does_not_retrace(name):
    rng = np.random.default_rng(3)
    fn, args, attrs = _six_op_inputs(rng)[name]
    traces = []

    @jax.jit
    def jitted(*args):
        traces.append(1)
        return fn(*args, **attrs)

    args = [jnp.asarray(a) for a in args]
    eager = fn(*args, **attrs)
    _close(jitted(*args), eager)
    other = [a + 1.0 for a in args]
    _close(jitted(*other), fn(*other, **attrs))
    assert len(traces) == 1  # same shapes: one trace, one compilation


def test_eager_calls_compile_once_per_plan():
    """An eager call is one dispatch of its plan's jitted entry (plan, precision and choice
    settings bound, no static arguments): repeated eager calls, and calls spelling the same
    plan another way, reuse its executable."""

    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal((2, 5, 5, 3)))
    w = jnp.asarray(rng.standard_normal((3, 3, 3, 4)))
    polyconv.convolution(x, w, strides=2, auto_pad="same_upper")
    entries = _primitives._entry.cache_info().currsize
    plan = polyconv.infer_shape("Convolution", x.shape, w.shape, strides=2,
                                auto_pad="same_upper").with_(dtype="float64", op="forward")
    jitted = _primitives.entry(plan, canonical_precision("convolution", None),
                               choice_settings())
    assert jitted._cache_size() == 1       # the calls' entry: compiled by the first one
    for _ in range(3):
        polyconv.convolution(x + 1.0, w, strides=2, auto_pad="same_upper")
    polyconv.convolution(x, w, strides=(2, 2), auto_pad="SAME_UPPER")
    assert _primitives._entry.cache_info().currsize == entries
    assert jitted._cache_size() == 1
    assert hash(plan) == hash(polyconv.infer_shape("Convolution", x.shape, w.shape, strides=2,
                                                   auto_pad="same_upper").with_(
        dtype="float64", op="forward"))


# --------------------------------------------------------------------------------------------
# the compiled program of a call on the plain lowering is the hand-written lax call's
# --------------------------------------------------------------------------------------------

def _opcodes(fn, *args) -> list[str]:
    """The instructions of ``fn``'s compiled XLA program, by opcode, sorted (fusions opened;
    parameters, tuples and the ROOT marker dropped)."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    ops = re.findall(r"^\s*(?:ROOT )?%\S+ = \S+ ([a-z][\w-]*)\(", text, flags=re.M)
    return sorted(op for op in ops if op not in ("parameter", "tuple", "fusion"))


_HI = jax.lax.Precision.HIGHEST
PLAIN_CALLS = [
    # (name, polyconv op and attributes, the hand-written lax call, src, weights)
    ("forward NXC", lambda x, w: polyconv.convolution(x, w, strides=2, pads_begin=1,
                                                      pads_end=2, dilations=(1, 2)),
     lambda x, w: jax.lax.conv_general_dilated(
         x, w, (2, 2), [(1, 2), (1, 2)], rhs_dilation=(1, 2),
         dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=_HI),
     (2, 9, 8, 4), (3, 3, 4, 6)),
    ("forward NCX grouped", lambda x, w: polyconv.convolution(
        x, w, strides=2, pads_begin=(0, 1), pads_end=1, groups=2, data_format="NCX",
        weights_format="OIX"),
     lambda x, w: jax.lax.conv_general_dilated(
         x, w, (2, 2), [(0, 1), (1, 1)], dimension_numbers=("NCHW", "OIHW", "NCHW"),
         feature_group_count=2, precision=_HI),
     (2, 4, 9, 8), (6, 2, 3, 3)),
    ("backward_data (ConvTranspose)", lambda x, w: polyconv.conv_transpose(
        x, w, strides=2, pads_begin=1, pads_end=1, output_padding=1),
     lambda x, w: jax.lax.conv_transpose(    # the kernel spec names the forward's I and O
         x, w, (2, 2), [(1, 2), (1, 2)], dimension_numbers=("NHWC", "HWIO", "NHWC"),
         transpose_kernel=True, precision=_HI),
     (2, 5, 4, 6), (3, 3, 4, 6)),
    ("backward_weights", lambda x, dy: polyconv.convolution_backward_weights(
        x, dy, (3, 3), strides=2, pads_begin=1, pads_end=1),
     lambda x, dy: jax.vjp(lambda w: jax.lax.conv_general_dilated(
         x, w, (2, 2), [(1, 1), (1, 1)], dimension_numbers=("NHWC", "HWIO", "NHWC"),
         precision=_HI), jnp.zeros((3, 3, 4, 6), x.dtype))[1](dy)[0],
     (2, 9, 8, 4), (2, 5, 4, 6)),
]


@pytest.mark.parametrize(("name", "ours", "lax_call", "src", "weights"), PLAIN_CALLS,
                         ids=[c[0] for c in PLAIN_CALLS])
def test_the_plain_lowering_compiles_to_the_lax_calls_program(name, ours, lax_call, src,
                                                              weights):
    """Where the plain lowering (``direct``) runs, the compiled XLA program of a jitted
    polyconv call holds the instructions of the hand-written ``lax`` call's and no others
    (no pads, slices, transposes or copies of polyconv's own), and computes the same."""
    rng = np.random.default_rng(12)
    x = jnp.asarray(rng.standard_normal(src), jnp.float32)
    w = jnp.asarray(rng.standard_normal(weights), jnp.float32)
    with polyconv.implementation("jax:direct"):
        got = _opcodes(ours, x, w)
        np.testing.assert_allclose(jax.jit(ours)(x, w), jax.jit(lax_call)(x, w), rtol=1e-5,
                                   atol=1e-5)
    assert "convolution" in got
    assert got == _opcodes(lax_call, x, w)


def test_a_plain_nxc_convolution_compiles_to_the_convolution_alone():
    """Channels-last data and ``XIO`` weights are XLA's own layouts on the CPU: the compiled
    program of a polyconv call the default policy gives the plain lowering holds the
    convolution and nothing else."""
    from polyconv_jax import _choice as jax_choice

    x = jnp.ones((2, 9, 8, 4), jnp.float32)
    w = jnp.ones((3, 3, 4, 6), jnp.float32)
    plan = polyconv.infer_shape("convolution", x.shape, w.shape, strides=2,
                                pads_begin=1).with_(dtype="float32")
    assert jax_choice.choose("forward", plan, None) == "direct"
    assert _opcodes(lambda x, w: polyconv.convolution(x, w, strides=2, pads_begin=1),
                    x, w) == ["convolution"]


@pytest.mark.parametrize(("shapes", "weights_format"), [
    (((2, 6, 5, 3), (3, 3, 3, 1)), "XOI"),           # depthwise: [K.., O, 1]
    (((2, 2, 3, 2, 3), (2, 2, 2, 6, 1)), "XOI"),     # 3-D, three groups of one to two
])
def test_weights_off_xlas_order_by_unit_axes_compile_without_a_layout_change(
        shapes, weights_format):
    """Weights whose axes stand out of XLA's kernel order (spatial, in, out) only by axes of
    size one are reshaped into it, which moves no data: the compiled program of the plain
    lowering holds what the lax call given that order holds (no copy of the kernel), with
    the same values."""
    src, weights = shapes
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal(src), jnp.float32)
    w = jnp.asarray(rng.standard_normal(weights), jnp.float32)
    nd = len(src) - 2
    attrs = dict(groups=3, pads_begin=1, pads_end=0, weights_format=weights_format)
    plan = polyconv.infer_shape("convolution", x.shape, w.shape, **attrs)
    spatial = "DHW"[3 - nd:]

    def lax_call(x, w):
        w = jnp.reshape(w, (*w.shape[:nd], plan.a_channels // 3, plan.b_channels))
        return jax.lax.conv_general_dilated(
            x, w, (1,) * nd, [(1, 0)] * nd, feature_group_count=3, precision=_HI,
            dimension_numbers=(f"N{spatial}C", f"{spatial}IO", f"N{spatial}C"))

    def ours(x, w):
        return polyconv.convolution(x, w, **attrs)

    with polyconv.implementation("jax:direct"):
        got = _opcodes(ours, x, w)
        np.testing.assert_allclose(jax.jit(ours)(x, w), jax.jit(lax_call)(x, w), rtol=1e-5,
                                   atol=1e-5)
    assert got == _opcodes(lax_call, x, w)


@pytest.mark.parametrize(("attr", "value"), [("strides", jnp.array([2, 1])),
                                             ("pads_begin", jnp.array(1)),
                                             ("groups", jnp.array(1)),
                                             ("dst_shape", jnp.array([7, 6]))])
def test_traced_attributes_are_a_clear_type_error(attr, value):
    """Geometry is resolved when the call is traced: a traced attribute cannot be used, and
    the error names it (instead of a tracer error from deep inside)."""
    x, w = jnp.ones((2, 5, 4, 6)), jnp.ones((3, 3, 4, 6))   # diff_dst NXC, weights XIO

    def f(x, w, v):
        return polyconv.convolution_backward_data(x, w, **{attr: v})

    with pytest.raises(TypeError, match=rf"^convolution_backward_data: {attr} must be "
                                        r"concrete.*jax\.jit"):
        jax.jit(f)(x, w, value)
    if attr != "dst_shape":  # concrete arrays are fine outside jit
        f(x, w, value)


def test_jit_of_grad():
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((2, 6, 6, 4)))
    w = jnp.asarray(rng.standard_normal((3, 3, 2, 4)))   # XOI, groups 2: OC = 4
    attrs = {"strides": 2, "auto_pad": "same_upper", "groups": 2, "output_padding": 1}

    def loss(x, w):
        return jnp.sum(jnp.sin(polyconv.conv_transpose(x, w, **attrs)))

    eager = jax.grad(loss, argnums=(0, 1))(x, w)
    jitted = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    for a, b in zip(jitted, eager):
        _close(a, b)


@pytest.mark.parametrize("fmt", ["NXC", "NCX"])
@pytest.mark.parametrize("name", SIX)
def test_vmap_over_a_leading_axis_equals_a_loop(name, fmt):
    rng = np.random.default_rng(6)
    fn, args, attrs = _six_op_inputs(rng, fmt)[name]
    stacked = [jnp.asarray(np.stack([a, 2.0 * a - 1.0, -a])) for a in args]
    got = jax.vmap(lambda *xs: fn(*xs, **attrs))(*stacked)
    for i in range(3):
        _close(got[i], fn(*[s[i] for s in stacked], **attrs))


def test_vmap_over_the_weights_only():
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.standard_normal((2, 6, 5)))            # NXC, rank 1
    ws = jnp.asarray(rng.standard_normal((4, 3, 5, 2)))        # 4 XIO kernels
    got = jax.vmap(lambda w: polyconv.convolution(x, w, strides=2), in_axes=0)(ws)
    for i in range(4):
        _close(got[i], polyconv.convolution(x, ws[i], strides=2))


# --------------------------------------------------------------------------------------------
# inputs, dtypes, precision
# --------------------------------------------------------------------------------------------


def test_numpy_inputs_with_backend_jax_come_back_as_numpy():
    import ml_dtypes

    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 5, 5, 2))
    w = rng.standard_normal((3, 3, 2, 4))
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16, np.float64):
        y = polyconv.convolution(x.astype(dtype), w.astype(dtype), backend="jax")
        assert isinstance(y, np.ndarray)
        assert y.dtype == np.dtype(dtype)
        y_jax = polyconv.convolution(jnp.asarray(x.astype(dtype)), jnp.asarray(w.astype(dtype)))
        assert isinstance(y_jax, jax.Array)
        assert y_jax.dtype == np.dtype(dtype)
        _close(np.asarray(y, np.float64), np.asarray(y_jax, np.float64))


def test_precision_default_is_highest_and_can_be_lowered():
    rng = np.random.default_rng(9)
    # (16 channels: with fewer, the policy takes the elementwise loops, which have no product)
    x = jnp.asarray(rng.standard_normal((1, 5, 5, 16)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((3, 3, 16, 24)), jnp.float32)
    text = _hlo(lambda x, w: polyconv.convolution(x, w), x, w)
    assert "precision HIGHEST" in text
    for precision, want in (("default", "DEFAULT"), ("HIGH", "HIGH"),
                            (jax.lax.Precision.DEFAULT, "DEFAULT"),
                            (("highest", jax.lax.Precision.HIGH), "HIGH")):
        text = _hlo(lambda x, w, p=precision: polyconv.conv_transpose(x, w, precision=p),
                    x, jnp.transpose(w, (0, 1, 3, 2)))
        assert f"precision {want}>" in text
        y = polyconv.convolution(x, w, precision=precision)   # same values on CPU
        _close(y, polyconv.convolution(x, w))
    # an explicit setting wins over the global default
    with jax.default_matmul_precision("bfloat16"):
        assert "precision HIGHEST" in _hlo(lambda x, w: polyconv.convolution(x, w), x, w)


@pytest.mark.parametrize("bad", ["fast", 3, ("high",), ("high", "highest", "default"),
                                 jax.lax.DotAlgorithmPreset.DEFAULT])
def test_precision_is_validated(bad):
    x = jnp.ones((1, 5, 5, 2), jnp.float32)
    w = jnp.ones((3, 3, 2, 4), jnp.float32)
    with pytest.raises(ValueError, match=r"convolution: precision must be .* got precision="):
        polyconv.convolution(x, w, precision=bad)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_accumulates_in_float32_with_one_final_cast(dtype):
    rng = np.random.default_rng(10)
    x = jnp.asarray(rng.standard_normal((1, 6, 6, 8)), dtype)
    w = jnp.asarray(rng.standard_normal((3, 3, 8, 4)), dtype)
    b = jnp.asarray(rng.standard_normal(4), dtype)
    text = _hlo(lambda x, w, b: polyconv.convolution(x, w, b), x, w, b)
    conv_line = next(line for line in text.splitlines() if "stablehlo.convolution" in line)
    assert conv_line.rstrip().endswith("xf32>")   # accumulated and returned in float32
    assert text.count("stablehlo.convert") == 2   # the bias up, the result down: nothing else
    x64, w64, b64 = (np.asarray(v, np.float64) for v in (x, w, b))
    exact = polyconv.convolution(x64, w64, b64, backend="jax")
    magnitude = polyconv.convolution(np.abs(x64), np.abs(w64), backend="jax")
    y = polyconv.convolution(x, w, b)
    assert y.dtype == x.dtype
    # one rounding to the output dtype plus float32 accumulation error (72 products)
    bound = (float(jnp.finfo(dtype).eps) * np.abs(exact)
             + 73 * float(np.finfo(np.float32).eps) * (magnitude + np.abs(b64)))
    assert np.all(np.abs(np.asarray(y, np.float64) - exact) <= bound)


def test_float64_without_x64_is_an_error():
    result = _run_worker("float64_without_x64.py", JAX_ENABLE_X64="0")
    assert result.returncode == 0, result.stderr
    assert "convolution: float64 inputs need 64-bit mode in JAX" in result.stdout
    assert "jax_enable_x64" in result.stdout
