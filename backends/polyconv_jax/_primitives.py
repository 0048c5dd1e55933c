"""The three primitives as jitted functions, closed under differentiation.

Each primitive (``forward`` ``a, W -> b``, ``backward_data`` ``b, W -> a``,
``backward_weights`` ``a, b -> W``) is bilinear, and the adjoint identities of the canonical
convolution say which primitive computes each of its cotangents (``<F(a, W), b> =
<a, D(b, W)> = <W, Wt(a, b)>``):

==================  =========================  =========================
primitive           cotangent of 1st input     cotangent of 2nd input
==================  =========================  =========================
forward F(a, W)     D(g, W)                    Wt(a, g)
backward_data D     F(g, W)                    Wt(g, b)
backward_weights    D(b, g)                    F(a, g)
==================  =========================  =========================

So each primitive carries a custom JVP whose tangent is written as the *transpose* of those
primitives (``jax.linear_transpose``): reverse mode transposes the tangent back and runs the
primitives themselves, each with its own chosen lowering, instead of differentiating through
a lowering (which lands on XLA's slow weight-gradient and lhs-dilated paths). ``jax.jvp``,
``vmap`` and higher orders see ordinary JAX operations; a second derivative again runs
through these rules. The bias is added outside, so its gradient is JAX's reduction.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from polyconv import ConvPlan

from . import _choice


def _core(primitive: str, plan: ConvPlan, precision, x, y):
    """The primitive by its chosen lowering, in the accumulation dtype."""
    name = _choice.choose(primitive, plan, precision)
    return _choice.IMPLEMENTATIONS[primitive][name](plan, precision, x, y)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def forward_ad(plan: ConvPlan, precision, a, w):
    return _core("forward", plan, precision, a, w)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def backward_data_ad(plan: ConvPlan, precision, b, w):
    return _core("backward_data", plan, precision, b, w)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def backward_weights_ad(plan: ConvPlan, precision, a, b):
    if plan.batch == 0:  # nothing to contract: XLA would form a degenerate convolution
        return jnp.zeros(plan.weights_shape, plan.acc_dtype)
    return _core("backward_weights", plan, precision, a, b)


#: per primitive: its output's role, and for the cotangent of each input the primitive that
#: computes it and that primitive's input slot the cotangent goes in (the table above); its
#: other input is the primitive's other operand
_ADJOINTS = {
    "forward": ("b", (("backward_data", 0), ("backward_weights", 1))),
    "backward_data": ("a", (("forward", 0), ("backward_weights", 0))),
    "backward_weights": ("w", (("backward_data", 1), ("forward", 1))),
}
_AD = {"forward": forward_ad, "backward_data": backward_data_ad,
       "backward_weights": backward_weights_ad}


def _jvp(primitive: str, plan: ConvPlan, precision, primals, tangents):
    """``P(x, y)``'s tangent ``sum_i L_i^T(t_i)``, ``L_i`` the adjoint primitive of input ``i``
    as a function of the cotangent: reverse mode transposes it back and runs ``L_i``.

    ``L_i`` maps operands of the plan's dtype to the accumulation dtype, so its transpose
    takes the tangent in the accumulation dtype and returns the plan's dtype: forward mode
    rounds a 16-bit tangent once more; reverse mode, whose cotangents come in the plan's
    dtype, loses nothing. ``L_i``'s lowering is chosen for the form reverse mode runs
    (:func:`polyconv_jax._choice.as_adjoint`).
    """
    out = _AD[primitive](plan, precision, *primals)
    role, adjoints = _ADJOINTS[primitive]
    shape = {"a": plan.a_shape, "b": plan.b_shape, "w": plan.weights_shape}[role]
    struct = jax.ShapeDtypeStruct(shape, primals[0].dtype)
    t = jnp.zeros_like(out)
    for i, (tangent, (adjoint, slot)) in enumerate(zip(tangents, adjoints)):
        if isinstance(tangent, SymbolicZero):
            continue
        other = primals[1 - i]
        if (primitive, i) == ("backward_data", 0) and _choice.forward_transpose_aborts(
                plan, precision):
            # the transpose of the forward convolution would be an lhs-dilated convolution
            # that XLA CPU aborts on: this term is backward_data itself (reverse mode
            # transposes it)
            t = t + backward_data_ad(plan, precision, tangent, other).astype(out.dtype)
            continue

        def linear(g, adjoint=adjoint, slot=slot, other=other):
            return _AD[adjoint](plan, precision, *((g, other) if slot == 0 else (other, g)))

        with _choice.as_adjoint(slot):
            transposed = jax.linear_transpose(linear, struct)
        (term,) = transposed(tangent.astype(out.dtype))
        t = t + term.astype(out.dtype)
    return out, t


for _name, _fn in _AD.items():
    _fn.defjvp(functools.partial(_jvp, _name), symbolic_zeros=True)


# --------------------------------------------------------------------------------------------
# the jitted entry points (plan, precision and the choice settings are static)
# --------------------------------------------------------------------------------------------


def _finish(plan: ConvPlan, y, bias, channel_axis: int):
    """Bias in the accumulation dtype, then the one rounding to ``plan.dtype``."""
    if bias is not None:
        shape = [1] * y.ndim
        shape[channel_axis] = bias.shape[0]
        y = y + bias.astype(y.dtype).reshape(shape)
    return y.astype(plan.dtype)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def forward(plan: ConvPlan, precision, settings, a, w, bias=None):
    del settings  # part of the cache key only: the choice reads the settings in force
    return _finish(plan, forward_ad(plan, precision, a, w), bias, plan.channel_axis)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def backward_data(plan: ConvPlan, precision, settings, b, w, bias=None):
    del settings
    return _finish(plan, backward_data_ad(plan, precision, b, w), bias, plan.channel_axis)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def backward_weights(plan: ConvPlan, precision, settings, a, b):
    del settings
    return backward_weights_ad(plan, precision, a, b).astype(plan.dtype)


# --------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------


def x64_enabled() -> bool:
    """Whether JAX keeps float64 (``jax_enable_x64``, including context overrides)."""
    return jax.dtypes.canonicalize_dtype(np.float64) == np.dtype(np.float64)


def prepare(plan: ConvPlan, *arrays):
    """Check the dtype against JAX's x64 mode; numpy (or other) inputs become JAX arrays."""
    if plan.dtype == "float64" and not x64_enabled():
        msg = (f"{plan.op}: float64 inputs need 64-bit mode in JAX, which is off (JAX would "
               f"silently compute in float32). Enable it with "
               f"jax.config.update('jax_enable_x64', True) or JAX_ENABLE_X64=1, or pass "
               f"float32 inputs")
        raise TypeError(msg)
    out = []
    for x in arrays:
        if x is None or isinstance(x, jax.Array):  # jax.Array covers tracers too
            out.append(x)
        else:
            dtype = getattr(x, "dtype", None)
            if isinstance(dtype, np.dtype) and not dtype.isnative:
                x = np.asarray(x, dtype.newbyteorder("="))  # JAX takes native byte order only
            out.append(jnp.asarray(x))
    return out
