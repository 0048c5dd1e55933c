"""The peers polyconv is timed against, defined once for every benchmark: the hand-written
``lax.conv_general_dilated`` call a JAX user would write, and PyTorch's own convolutions.

Each computes a plan's primitive (:class:`polyconv.ConvPlan`) on its operands, given as
polyconv takes them (the user's data layout, weights in the plan's ``weights_format``), or,
for a layer, the gradient of its op (the cotangents of its input and weights). Anything a
peer needs in another layout (its weights flipped, regrouped or channels-first) is prepared
once, outside the timed call, as its users keep their weights; the first-call benchmark's
``lax`` call changes the weights inside instead (its compile is what is timed there).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

import polyconv

from .harness import Jitted, numpy_dtype, on_cuda, torch_dtype, torch_tensor

# --------------------------------------------------------------------------------------------
# lax
# --------------------------------------------------------------------------------------------


def canonical(plan: polyconv.ConvPlan, w) -> np.ndarray:
    """The user's weights as the canonical ``[Cb, Ca/G, K..]`` (float32 values)."""
    return np.transpose(np.asarray(w, np.float32), plan.weights_perm)


def lax_weights(plan: polyconv.ConvPlan, primitive: str, wc, xp=np):
    """Canonical weights as the lax call of ``primitive`` takes them: ``[K.., I, O]`` beside
    channels-last data (Flax's), ``[O, I, K..]`` otherwise; for backward_data flipped, with
    the group factor moved to the other side (as ``lax.conv_transpose`` would). ``xp=jnp``
    does it inside a jitted call."""
    if primitive == "backward_data":
        g, d = plan.groups, plan.ndim
        w = wc.reshape(g, plan.b_channels // g, plan.a_channels // g, *plan.kernel)
        w = xp.swapaxes(w, 1, 2).reshape(plan.a_channels, plan.b_channels // g, *plan.kernel)
        wc = xp.flip(w, tuple(range(2, 2 + d)))
    moved = xp.moveaxis(wc, (0, 1), (-1, -2)) if plan.channels_last else wc
    return np.ascontiguousarray(moved) if xp is np else moved


def lax_function(plan: polyconv.ConvPlan, primitive: str, user_weights: bool = False):
    """The hand-written ``lax.conv_general_dilated`` call of ``primitive``: ``f(a, w)`` for
    forward, ``f(b, w)`` (lhs-dilated, as ``lax.conv_transpose`` emits it) for backward_data,
    ``f(a, b)`` (``jax.vjp`` of the forward, as ``jax.grad`` runs it) for backward_weights;
    weights as :func:`lax_weights` gives them, full float32 precision. ``user_weights``: the
    weights (and a weight gradient) in the plan's layout instead, changed inside the call, as
    a user holding them so writes it (the first-call benchmark: XLA then compiles the same
    change of layout that polyconv's program holds)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    sp = "DHW"[-plan.ndim:] if plan.ndim <= 3 else "".join(str(i) for i in range(plan.ndim))
    data, wspec = (f"N{sp}C", f"{sp}IO") if plan.channels_last else (f"NC{sp}", f"OI{sp}")
    kw = dict(rhs_dilation=plan.dilations, dimension_numbers=(data, wspec, data),
              feature_group_count=plan.groups, precision=lax.Precision.HIGHEST,
              preferred_element_type=jnp.float32)
    pads = list(zip(plan.pads_begin, plan.pads_end))

    def weights(w, primitive):
        if not user_weights:
            return w
        return lax_weights(plan, primitive, jnp.transpose(w, plan.weights_perm), jnp)

    def forward(a, w):
        w = weights(w, "forward")
        return lax.conv_general_dilated(a, w, plan.strides, pads, **kw).astype(a.dtype)

    if primitive == "forward":
        return forward
    if primitive == "backward_data":
        t_pads = [(ek - 1 - b, ek - 1 - e + o) for ek, b, e, o in zip(
            plan.effective_kernel, plan.pads_begin, plan.pads_end, plan.output_padding)]

        def backward_data(b, w):
            w = weights(w, "backward_data")
            return lax.conv_general_dilated(b, w, (1,) * plan.ndim, t_pads,
                                            lhs_dilation=plan.strides, **kw).astype(b.dtype)
        return backward_data
    w_shape = (plan.weights_shape if user_weights
               else lax_weights(plan, "forward", np.zeros(plan.w_shape, np.float32)).shape)

    def backward_weights(a, b):
        return jax.vjp(lambda w: forward(a, w), jnp.zeros(w_shape, a.dtype))[1](b)[0]
    return backward_weights


def lax_inputs(plan: polyconv.ConvPlan, primitive: str, dtype: str,
               user_weights: bool = False) -> tuple:
    """Random inputs of the lax call of ``primitive`` (see :func:`lax_function`)."""
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    a, b, w = (rng.standard_normal(s, dtype=np.float32)
               for s in (plan.a_shape, plan.b_shape,
                         plan.weights_shape if user_weights else plan.w_shape))
    if not user_weights:
        w = lax_weights(plan, primitive, w)
    xs = {"forward": (a, w), "backward_data": (b, w), "backward_weights": (a, b)}[primitive]
    return tuple(jnp.asarray(x.astype(numpy_dtype(dtype))) for x in xs)


def lax(plan: polyconv.ConvPlan, mode: str, operands, dtype: str) -> Jitted:
    """The ``lax`` peer, jitted: ``forward`` mode the plan's primitive on its two operands,
    ``gradient`` mode ``jax.vjp`` of the layer's op for the cotangent ``operands[2]``."""
    import jax
    import jax.numpy as jnp

    f = lax_function(plan, plan.primitive)
    x, y = operands[:2]
    if plan.primitive != "backward_weights":          # y: the weights
        y = lax_weights(plan, plan.primitive, canonical(plan, y))
    dt = numpy_dtype(dtype)
    args = tuple(jnp.asarray(np.ascontiguousarray(a).astype(dt)) for a in (x, y))
    if mode == "forward":
        return Jitted(jax.jit(f), args)
    g = jnp.asarray(np.asarray(operands[2]).astype(dt))
    return Jitted(jax.jit(lambda x, w, g: jax.vjp(f, x, w)[1](g)), (*args, g))


# --------------------------------------------------------------------------------------------
# PyTorch
# --------------------------------------------------------------------------------------------

def torch(plan: polyconv.ConvPlan, mode: str, operands, dtype: str, device: str = "cpu",
          memory: str = "channels_last", tf32: bool = False) -> Any:
    """The PyTorch peer on ``device``, data in ``memory`` format (channels-last: PyTorch CPU's
    fastest, whatever the layer's layout), weights in PyTorch's own layout (the canonical
    one): ``forward`` mode the plan's primitive (``F.convNd``, ``F.conv_transposeNd``,
    ``aten.convolution_backward`` for the weight gradient), ``gradient`` mode
    ``aten.convolution_backward`` of the layer's op (its autograd kernel). On CUDA cuDNN's
    benchmark mode picks the algorithm, and TF32 is off unless ``tf32`` (the full float32
    of polyconv's default). PyTorch has no asymmetric pads: a forward pads its input first in
    the call, as a user ports TF/Keras "SAME"; other primitives cannot express them."""
    import torch as pt
    import torch.nn.functional as F

    d, p = plan.ndim, plan
    tdt = torch_dtype(dtype)
    memfmt = ({2: pt.channels_last, 3: pt.channels_last_3d}.get(d)
              if memory == "channels_last" else None)

    def tensor(a):
        t = torch_tensor(a, tdt).to(device)
        return t.contiguous(memory_format=memfmt) if memfmt else t

    def data(a):      # the user's layout -> logical NCX
        a = np.asarray(a, np.float32)
        return tensor(np.moveaxis(a, -1, 1) if p.channels_last else a)

    pad = list(p.pads_begin)
    asymmetric = p.pads_begin != p.pads_end
    if asymmetric and not (mode == "forward" and p.primitive == "forward"):
        return None
    transposed = p.primitive == "backward_data"
    if mode == "gradient":
        x, w, g = operands
        opad = list(p.output_padding) if transposed else [0] * d
        call = partial(pt.ops.aten.convolution_backward, data(g), data(x),
                       tensor(canonical(p, w)), None, p.strides, pad, p.dilations, transposed,
                       opad, p.groups, (True, True, False))
    elif p.primitive == "forward":
        f = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[d]
        a, w = data(operands[0]), tensor(canonical(p, operands[1]))
        if asymmetric:
            extra = [q for b, e in reversed(list(zip(p.pads_begin, p.pads_end))) for q in (b, e)]
            return _on(device, tf32, lambda: f(F.pad(a, extra), w, stride=p.strides,
                                               dilation=p.dilations, groups=p.groups))
        call = partial(f, a, w, stride=p.strides, padding=pad, dilation=p.dilations,
                       groups=p.groups)
    elif transposed:
        f = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[d]
        call = partial(f, data(operands[0]), tensor(canonical(p, operands[1])),
                       stride=p.strides, padding=pad, output_padding=list(p.output_padding),
                       groups=p.groups, dilation=p.dilations)
    else:                                     # backward_weights, from a and b
        w0 = pt.zeros(p.w_shape, dtype=tdt, device=device)
        call = partial(pt.ops.aten.convolution_backward, data(operands[1]), data(operands[0]),
                       w0, None, p.strides, pad, p.dilations, False, [0] * d, p.groups,
                       (False, True, False))
    return _on(device, tf32, call)


def _on(device: str, tf32: bool, call):
    return call if device == "cpu" else on_cuda(call, tf32)
