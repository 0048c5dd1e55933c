"""The three primitives of SPEC §3, each one ``lax.conv_general_dilated`` call.

Notation (per spatial axis): ``A`` large size, ``B`` small size, ``K`` kernel, ``s`` stride,
``d`` dilation, ``ek = (K-1)*d + 1``, ``pb``/``pe`` the resolved pads of the large tensor.

* forward ``a, W -> b``: the convolution itself, padding ``(pb, pe)``, ``window_strides=s``,
  ``rhs_dilation=d``, ``feature_group_count=G``; XLA's size ``floor((A+pb+pe-ek)/s) + 1`` is
  ``B``.
* backward_data ``b, W -> a``: the adjoint, i.e. a stride-1 convolution of ``b`` dilated by
  ``s`` (``lhs_dilation=s``) with the spatially flipped kernel, ``rhs_dilation=d``, padding
  ``(ek-1-pb, A + pb - 1 - (B-1)*s)``, the high side computed so that the output has exactly
  ``A`` rows (``= ek-1-pe+output_padding``); either side may be negative, which crops. The
  weights' roles swap (in <-> out); with groups the group axis is moved from ``Cb`` into
  ``Ca`` by a reshape of the weights only (as jax's own ``_conv_general_dilated_transpose_lhs``
  does).
* backward_weights ``a, b -> W``: a convolution of ``a`` with ``b`` as the kernel, batch and
  feature roles swapped (``N`` is contracted), ``window_strides=d``, ``rhs_dilation=s``,
  padding ``(pb, (B-1)*s + ek - A - pb)``, ``batch_group_count=G`` (jax's
  ``_conv_general_dilated_transpose_rhs``). Its output dimension numbers are the user's weights
  layout, so the result needs no transpose.

The user's data layout and weights layout reach XLA as dimension numbers
(:class:`jax.lax.ConvDimensionNumbers` with integer axis tuples, so any spatial rank works):
data tensors are never transposed; the weights are only flipped (backward_data) and, with
groups, regrouped. Accumulation is in ``plan.acc_dtype`` (``preferred_element_type``), the bias
is added in that dtype, and there is a single cast to ``plan.dtype`` at the end.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from polyconv import ConvPlan

# --------------------------------------------------------------------------------------------
# precision (SPEC §5: full precision unless the caller opts in)
# --------------------------------------------------------------------------------------------

_PRECISION_NAMES = {
    "default": lax.Precision.DEFAULT, "fastest": lax.Precision.DEFAULT,
    "bfloat16": lax.Precision.DEFAULT,
    "high": lax.Precision.HIGH, "tensorfloat32": lax.Precision.HIGH,
    "bfloat16_3x": lax.Precision.HIGH,
    "highest": lax.Precision.HIGHEST, "float32": lax.Precision.HIGHEST,
}
_FULL = (lax.Precision.HIGHEST, lax.Precision.HIGHEST)


def _one_precision(op: str, value: Any, whole: Any) -> lax.Precision:
    if isinstance(value, lax.Precision):
        return value
    if isinstance(value, str) and value.lower() in _PRECISION_NAMES:
        return _PRECISION_NAMES[value.lower()]
    msg = (f"{op}: precision must be None (full precision), a jax.lax.Precision, one of "
           f"{', '.join(map(repr, _PRECISION_NAMES))} (case-insensitive), or a pair of "
           f"these for (input, weights); got precision={whole!r}")
    raise ValueError(msg)


def canonical_precision(op: str, precision: Any) -> tuple[lax.Precision, lax.Precision]:
    """``plan.precision`` as a pair of :class:`jax.lax.Precision` (``None`` -> HIGHEST)."""
    if precision is None:
        return _FULL
    if isinstance(precision, (tuple, list)) and not isinstance(precision, str):
        if len(precision) != 2:
            _one_precision(op, object(), precision)  # raises
        return (_one_precision(op, precision[0], precision),
                _one_precision(op, precision[1], precision))
    p = _one_precision(op, precision, precision)
    return (p, p)


# --------------------------------------------------------------------------------------------
# dimension numbers
# --------------------------------------------------------------------------------------------


def _data_spec(plan: ConvPlan) -> tuple[int, ...]:
    """(batch, feature, spatial..) axes of a data tensor in the user's layout."""
    if plan.channels_last:
        return (0, plan.ndim + 1, *range(1, plan.ndim + 1))
    return (0, 1, *range(2, plan.ndim + 2))


def _dnums(lhs, rhs, out) -> lax.ConvDimensionNumbers:
    return lax.ConvDimensionNumbers(lhs_spec=tuple(lhs), rhs_spec=tuple(rhs),
                                    out_spec=tuple(out))


def _regroup(w, src: int, dst: int, groups: int):
    """Move the (outer) group factor of axis ``src`` into axis ``dst`` (as its outer factor).

    Axis positions are kept: ``src`` shrinks by ``groups``, ``dst`` grows by ``groups``. Used on
    the weights only (jax's ``_reshape_axis_out_of`` + ``_reshape_axis_into``).
    """
    shape = w.shape
    w = w.reshape((*shape[:src], groups, shape[src] // groups, *shape[src + 1:]))
    w = jnp.moveaxis(w, src, dst)  # the group axis now sits right before the dst axis
    new = w.shape
    return w.reshape((*new[:dst], new[dst] * new[dst + 1], *new[dst + 2:]))


# --------------------------------------------------------------------------------------------
# the three lowerings (plan and precision are static)
# --------------------------------------------------------------------------------------------


def _finish(plan: ConvPlan, y, bias, channel_axis: int):
    """Bias in the accumulation dtype, then the one rounding to ``plan.dtype``."""
    if bias is not None:
        shape = [1] * y.ndim
        shape[channel_axis] = bias.shape[0]
        y = y + bias.astype(y.dtype).reshape(shape)
    return y.astype(plan.dtype)


@functools.partial(jax.jit, static_argnums=(0, 1))
def forward(plan: ConvPlan, precision, a, w, bias=None):
    data = _data_spec(plan)
    perm = plan.weights_perm
    # XLA's output size floor((A + pb + pe - ek)/s) + 1 is plan.b_spatial by construction
    # (also for conv_transpose_backward_data, where A carries output_padding < s).
    padding = list(zip(plan.pads_begin, plan.pads_end))
    y = lax.conv_general_dilated(
        a, w, window_strides=plan.strides, padding=padding, rhs_dilation=plan.dilations,
        dimension_numbers=_dnums(data, perm, data), feature_group_count=plan.groups,
        precision=precision, preferred_element_type=plan.acc_dtype)
    return _finish(plan, y, bias, plan.channel_axis)


@functools.partial(jax.jit, static_argnums=(0, 1))
def backward_data(plan: ConvPlan, precision, b, w, bias=None):
    data = _data_spec(plan)
    perm = plan.weights_perm
    eks = plan.effective_kernel
    w = lax.rev(w, perm[2:])
    if plan.groups > 1:
        w = _regroup(w, perm[0], perm[1], plan.groups)
    padding = [(ek - 1 - pb, x + pb - 1 - (y - 1) * s)
               for x, y, s, ek, pb in zip(plan.a_spatial, plan.b_spatial, plan.strides, eks,
                                          plan.pads_begin)]
    # The transposed kernel: out-feature = the Ca axis, in-feature = the Cb axis.
    x = lax.conv_general_dilated(
        b, w, window_strides=(1,) * plan.ndim, padding=padding, lhs_dilation=plan.strides,
        rhs_dilation=plan.dilations,
        dimension_numbers=_dnums(data, (perm[1], perm[0], *perm[2:]), data),
        feature_group_count=plan.groups, precision=precision,
        preferred_element_type=plan.acc_dtype)
    return _finish(plan, x, bias, plan.channel_axis)


@functools.partial(jax.jit, static_argnums=(0, 1))
def backward_weights(plan: ConvPlan, precision, a, b):
    data = _data_spec(plan)
    perm = plan.weights_perm
    eks = plan.effective_kernel
    if plan.batch == 0:  # nothing to contract: XLA would form a degenerate convolution
        return jnp.zeros(plan.weights_shape, plan.dtype)
    swapped = (data[1], data[0], *data[2:])  # batch <-> feature: N is contracted
    padding = [(pb, (y - 1) * s + ek - x - pb)
               for x, y, s, ek, pb in zip(plan.a_spatial, plan.b_spatial, plan.strides, eks,
                                          plan.pads_begin)]
    w = lax.conv_general_dilated(
        a, b, window_strides=plan.dilations, padding=padding, rhs_dilation=plan.strides,
        # output "batch" = Ca/G (the weights' in axis), "feature" = Cb: the user's layout
        dimension_numbers=_dnums(swapped, swapped, (perm[1], perm[0], *perm[2:])),
        batch_group_count=plan.groups, precision=precision,
        preferred_element_type=plan.acc_dtype)
    return w.astype(plan.dtype)


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
            out.append(jnp.asarray(x))
    return out
