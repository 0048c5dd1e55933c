"""The JAX backend is closed under differentiation: every op's derivatives, of every order and
in both modes, are polyconv's own primitives.

Independent checks: ``jax.test_util.check_grads`` compares every JVP and VJP (to second
order) with finite differences in float64, so no polyconv code judges polyconv's derivative
rules; the reverse-mode programs are checked to contain none of XLA's slow paths (an
lhs-dilated convolution or a ``batch_group_count`` one) where polyconv's own primitives
avoid them.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import only_with_target

only_with_target("jax")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from jax.test_util import check_grads  # noqa: E402

import polyconv  # noqa: E402

ATTRS = {"strides": (2, 3), "pads_begin": (1, 0), "pads_end": (0, 2), "dilations": (1, 2),
         "groups": 2}
T_ATTRS = {**ATTRS, "output_padding": (1, 2)}
pytestmark = pytest.mark.usefixtures("jax_x64")   # finite differences in float64


def _ops(rng, fmt):
    """Each of the six ops as a function of its two array inputs, with inputs (float64)."""
    def data(channels, spatial):
        shape = (2, *spatial, channels) if fmt == "NXC" else (2, channels, *spatial)
        return jnp.asarray(rng.uniform(-1, 1, shape))

    c = {"data_format": fmt, "weights_format": "OIX"}
    x = data(4, (7, 9))
    w = jnp.asarray(rng.uniform(-1, 1, (6, 2, 3, 2)))                # OIX [OC, IC/G, K..]
    y_shape = polyconv.infer_shape("Convolution", x.shape, w.shape, **ATTRS, **c).shape
    dy = jnp.asarray(rng.uniform(-1, 1, y_shape))
    s = data(6, (3, 2))                                               # ConvTranspose src
    wt = jnp.asarray(rng.uniform(-1, 1, (2, 6, 3, 2)))                # OIX [OC/G, IC, K..]
    t_shape = polyconv.infer_shape("ConvTranspose", s.shape, wt.shape, **T_ATTRS, **c).shape
    dt = jnp.asarray(rng.uniform(-1, 1, t_shape))
    return {
        "convolution": (lambda x, w: polyconv.convolution(x, w, **ATTRS, **c), (x, w)),
        "convolution_backward_data": (
            lambda dy, w: polyconv.convolution_backward_data(dy, w, x.shape, **ATTRS, **c),
            (dy, w)),
        "convolution_backward_weights": (
            lambda x, dy: polyconv.convolution_backward_weights(x, dy, w.shape, **ATTRS, **c),
            (x, dy)),
        "conv_transpose": (lambda s, w: polyconv.conv_transpose(s, w, **T_ATTRS, **c),
                           (s, wt)),
        "conv_transpose_backward_data": (
            lambda dt, w: polyconv.conv_transpose_backward_data(dt, w, **T_ATTRS, **c),
            (dt, wt)),
        "conv_transpose_backward_weights": (
            lambda s, dt: polyconv.conv_transpose_backward_weights(s, dt, wt.shape, **T_ATTRS,
                                                                   **c),
            (s, dt)),
    }


OPS = ("convolution", "convolution_backward_data", "convolution_backward_weights",
       "conv_transpose", "conv_transpose_backward_data", "conv_transpose_backward_weights")


@pytest.mark.parametrize("fmt", ["NXC", "NCX"])
@pytest.mark.parametrize("op", OPS)
def test_derivatives_match_finite_differences(op, fmt):
    """Forward and reverse mode, first and second order, against finite differences."""
    fn, args = _ops(np.random.default_rng(1), fmt)[op]
    check_grads(fn, args, order=2, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("op", OPS)
def test_gradients_are_the_adjoint_primitives(op):
    """Reverse mode of each op equals the adjoint identities' primitives, written with
    polyconv's public ops: <op(u, v), g> differentiated in u and in v."""
    rng = np.random.default_rng(2)
    fns = _ops(rng, "NXC")
    fn, (u, v) = fns[op]
    g = jnp.asarray(rng.uniform(-1, 1, fn(u, v).shape))
    du, dv = jax.grad(lambda u, v: jnp.vdot(fn(u, v), g), argnums=(0, 1))(u, v)
    # the adjoint identity <op(u, v), g> = <u, du> = <v, dv> for a bilinear op
    value = float(jnp.vdot(fn(u, v), g))
    np.testing.assert_allclose(float(jnp.vdot(u, du)), value, rtol=1e-10)
    np.testing.assert_allclose(float(jnp.vdot(v, dv)), value, rtol=1e-10)


def _slow_paths(text: str) -> list[str]:
    """lhs-dilated and batch-grouped convolutions in StableHLO text."""
    found = [m for m in re.findall(r"lhs_dilate = \[([^\]]*)\]", text)
             if set(m.split(", ")) != {"1"}]
    found += [m for m in re.findall(r"batch_group_count = (\d+)", text) if m != "1"]
    return found


@pytest.mark.parametrize("op", OPS)
def test_gradients_take_no_slow_path(op):
    """The gradient of every op of a strided, grouped plan contains no lhs-dilated and no
    ``batch_group_count`` convolution (what differentiating through a lowering with JAX's own
    rules produces), only polyconv's lowerings of the adjoint primitives. The primitives'
    lowerings are forced to ones without such convolutions (a platform's policy may take the
    plain lowering, which is one), so any found came from differentiating a lowering."""
    fn, args = _ops(np.random.default_rng(3), "NXC")[op]
    g = jnp.ones(fn(*args).shape)
    with polyconv.implementation(
            "jax:forward=direct,jax:backward_data=phases_matmul,jax:backward_weights=grouped"):
        text = jax.jit(lambda *a: jax.vjp(fn, *a)[1](g)).lower(*args).as_text()
    assert not _slow_paths(text), _slow_paths(text)


def _backward_ops(op, fmt, rng):
    """A forward op's gradient (``jax.vjp`` for an output cotangent) and its two backward ops
    called by hand, as functions of (input, weights, cotangent), with those arrays."""
    fns = _ops(rng, fmt)
    fn, (u, v) = fns[op]
    g = jnp.asarray(rng.uniform(-1, 1, fn(u, v).shape))
    data_fn = fns[f"{op}_backward_data"][0]          # (cotangent, weights)
    weights_fn = fns[f"{op}_backward_weights"][0]    # (input, cotangent)
    return ((lambda u, v, g: jax.vjp(fn, u, v)[1](g)),
            (lambda u, v, g: (data_fn(g, v), weights_fn(u, g))), (u, v, g))


@pytest.mark.parametrize("lowerings", [{}, {"backward_data": "matmul_overlap_add",
                                            "backward_weights": "im2col"},
                                       {"backward_data": "phases_folded",
                                        "backward_weights": "folded"}],
                         ids=["policy", "matmul", "folded"])
@pytest.mark.parametrize("fmt", ["NXC", "NCX"])
@pytest.mark.parametrize("op", ["convolution", "conv_transpose"])
def test_gradient_compiles_to_the_backward_ops_program(op, fmt, lowerings):
    """The gradient of Convolution and ConvTranspose is, instruction for instruction, the
    program of their two backward ops called by hand (the forward pass, unused, is dropped):
    the gradient costs what the backward ops cost, by construction rather than by timing."""
    from polyconv.benchmarks.harness import compiled_instructions

    grad, ops, args = _backward_ops(op, fmt, np.random.default_rng(6))
    with polyconv.implementation(",".join(f"jax:{p}={n}" for p, n in lowerings.items())):
        mine = compiled_instructions(jax.jit(grad), args)
        by_hand = compiled_instructions(jax.jit(ops), args)
    # the products: XLA's convolutions and dots (on GPU, cuDNN's and cuBLAS's custom calls)
    assert any(re.search(r" (convolution|dot|custom-call)\(", line) for line in mine)
    assert mine == by_hand


def test_programs_are_compared_up_to_the_order_of_a_fusions_outputs():
    """On an H200, XLA compiled the folded Convolution gradient and its backward ops with one
    multi-output fusion's two outputs in swapped order (these lines, trimmed), every other
    instruction equal: one program for the comparison above. A changed type is still two."""
    from polyconv.benchmarks.harness import compiled_instructions

    class Compiled:     # what compiled_instructions reads of a jitted function
        def __init__(self, text):
            self.as_text = lambda: text
            self.lower = self.compile = lambda *args: self

    def program(x, w, swapped):
        first, second = (w, x) if swapped else (x, w)
        return compiled_instructions(Compiled(f"""
          %loop_fusion.{3 + swapped} = ({first}, {second}) fusion(%p0), kind=kLoop, calls=%f
          %gte.{7 - swapped} = {x} get-tuple-element(%loop_fusion.1), index={int(swapped)}
          %gte.{5 + swapped} = {w} get-tuple-element(%loop_fusion.1), index={int(not swapped)}
          ROOT %tuple.{swapped} = ({first}, {second}) tuple(%gte.5, %gte.6)"""), ())

    x, w = "f32[2,4,3,2,3]{4,3,2,1,0}", "f32[6,3,4,2]{3,2,1,0}"
    assert program(x, w, swapped=True) == program(x, w, swapped=False)
    assert program(x, w, swapped=True) != program(x.replace("[2,", "[3,"), w, swapped=False)


def test_grad_and_jvp_under_vmap_and_jit():
    """Per-example gradients (vmap of grad) and jvp under jit agree with a loop."""
    fn, (s, wt) = _ops(np.random.default_rng(4), "NCX")["conv_transpose"]
    gs = jax.jit(jax.vmap(jax.grad(lambda w, s: jnp.sum(fn(s[None], w) ** 2)),
                          in_axes=(None, 0)))(wt, s)
    one = jax.grad(lambda w, s: jnp.sum(fn(s, w) ** 2))
    loop = [one(wt, s[i:i + 1]) for i in range(s.shape[0])]
    np.testing.assert_allclose(np.asarray(gs), np.stack(loop), rtol=1e-10, atol=1e-10)
    tangent = jax.jit(lambda s, w: jax.jvp(fn, (s, w), (s, jnp.zeros_like(w)))[1])(s, wt)
    np.testing.assert_allclose(np.asarray(tangent), np.asarray(fn(s, wt)), rtol=1e-10,
                               atol=1e-10)   # linear in its first input


def test_bias_gradient_is_the_reduction():
    rng = np.random.default_rng(5)
    fn, (s, wt) = _ops(rng, "NXC")["conv_transpose"]
    y_shape = fn(s, wt).shape
    bias = jnp.asarray(rng.uniform(-1, 1, y_shape[-1]))
    g = jnp.asarray(rng.uniform(-1, 1, y_shape))
    db = jax.grad(lambda b: jnp.vdot(polyconv.conv_transpose(s, wt, b, **T_ATTRS,
                                                             weights_format="OIX"), g))(bias)
    np.testing.assert_allclose(np.asarray(db), np.asarray(g).sum(axis=(0, 1, 2)), rtol=1e-12)


@pytest.mark.parametrize("fmt", ["NXC", "NCX"])
@pytest.mark.parametrize("mapped", [(True, False), (False, True), (True, True)],
                         ids=["first", "second", "both"])
@pytest.mark.parametrize("op", OPS)
def test_vmap_of_every_op_and_its_gradient_equal_a_loop(op, mapped, fmt):
    """``vmap`` (the mapped axis folded into the batch, or into the groups) equals a loop
    over the mapped axis, taken from the middle of each operand; so do its forward and
    reverse derivatives (the adjoint primitives then run batched)."""
    rng = np.random.default_rng(6)
    fn, args = _ops(rng, fmt)[op]
    size = 3
    axes = [1 if m else None for m in mapped]
    ops = [jnp.asarray(rng.uniform(-1, 1, (a.shape[0], size, *a.shape[1:]))) if m else a
           for a, m in zip(args, mapped)]

    def loop(*ops):
        return jnp.stack([fn(*(jnp.take(o, i, axis=1) if ax else o for o, ax in zip(ops, axes)))
                          for i in range(size)])

    mapped_fn = jax.vmap(fn, in_axes=axes)
    np.testing.assert_allclose(mapped_fn(*ops), loop(*ops), rtol=1e-12, atol=1e-12)
    g = jnp.asarray(rng.uniform(-1, 1, loop(*ops).shape))
    got = jax.grad(lambda *o: jnp.vdot(mapped_fn(*o), g), argnums=(0, 1))(*ops)
    want = jax.grad(lambda *o: jnp.vdot(loop(*o), g), argnums=(0, 1))(*ops)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
    tangents = [jnp.asarray(rng.uniform(-1, 1, o.shape)) for o in ops]
    np.testing.assert_allclose(jax.jvp(mapped_fn, ops, tangents)[1],
                               jax.jvp(loop, ops, tangents)[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("op", OPS)
def test_vmap_over_an_empty_axis(op):
    """A mapped axis of size 0, on either input, gives an empty result with the op's
    unmapped output shape behind it."""
    fn, args = _ops(np.random.default_rng(7), "NXC")[op]
    want = fn(*args).shape
    for i in range(2):
        ops = [jnp.zeros((0, *a.shape)) if j == i else a for j, a in enumerate(args)]
        out = jax.vmap(fn, in_axes=[0 if j == i else None for j in range(2)])(*ops)
        assert out.shape == (0, *want)
