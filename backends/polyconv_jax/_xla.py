"""XLA building blocks shared by every lowering: precision, dimension numbers, the CPU-aware
``conv_general_dilated`` call and sharding-safe reshapes."""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from polyconv import ConvPlan
from polyconv._geometry import PRECISION_NAMES, check_precision

# --------------------------------------------------------------------------------------------
# the platform a lowering is chosen for
# --------------------------------------------------------------------------------------------

_ANSWERING_FOR: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "polyconv_jax_platform", default=None)


def platform() -> str:
    """The platform whose rules say which lowerings apply and which is the default:
    ``jax.default_backend()``'s, unless :func:`answering_for` names another."""
    return _ANSWERING_FOR.get() or jax.default_backend()


@contextlib.contextmanager
def answering_for(name: str) -> Iterator[None]:
    """Applicability and the policy as on platform ``name`` (``polyconv.default_implementation``
    for another machine's records); what is traced still compiles for this process's."""
    token = _ANSWERING_FOR.set(name)
    try:
        yield
    finally:
        _ANSWERING_FOR.reset(token)


# --------------------------------------------------------------------------------------------
# precision (docs/numerics.md#accumulation: full precision unless the caller opts in)
# --------------------------------------------------------------------------------------------

_FULL = (lax.Precision.HIGHEST, lax.Precision.HIGHEST)


def _one_precision(value: Any) -> lax.Precision:
    return value if isinstance(value, lax.Precision) else lax.Precision[
        PRECISION_NAMES[value.lower()]]


def canonical_precision(op: str, precision: Any) -> tuple[lax.Precision, lax.Precision]:
    """``plan.precision`` as a pair of :class:`jax.lax.Precision` (``None`` -> HIGHEST)."""
    check_precision(op, precision)
    if precision is None:
        return _FULL
    if isinstance(precision, (tuple, list)):
        return (_one_precision(precision[0]), _one_precision(precision[1]))
    p = _one_precision(precision)
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


#: A 2-D ungrouped convolution with no padding at all, at least this many multiply-adds,
#: gets one row of padding on CPU (:func:`_conv_general`).
PAD_FAST_PATH_MACS = 100_000_000


def _conv_general(lhs, rhs, *, dimension_numbers: lax.ConvDimensionNumbers, padding,
                  window_strides, lhs_dilation=None, rhs_dilation=None,
                  weights: bool = False, **kwargs):
    """``lax.conv_general_dilated``, except that on CPU ``weights`` in a layout off XLA's by
    unit axes only are reshaped into it (:func:`_natural_kernel`), and a 2-D ungrouped
    convolution with no padding gets one row of zeros past the end of one spatial axis (and
    the extra output row, if one appears, is sliced off).

    XLA CPU (jaxlib 0.10.2) runs 2-D convolutions through YNNPACK, whose path for a
    convolution without any padding and with overlapping windows (kernel extent > stride)
    is 1.3-6.7x slower than the same convolution with one padded row (dense 2-D, 10^8
    multiply-adds and up, every dtype and layout; the weight gradients' convolutions
    1.4-1.9x). Grouped ones and 1-D/3-D ones, which take other paths, gain nothing;
    non-overlapping windows (k2 s2, 1x1) are fast already; below about 10^8 multiply-adds
    the pad and the slice cost 5-10%.

    Zeros past the end change no existing output, whose window reads the same cells as
    before, so the result is identical, NaN and infinity included. The axis padded is one
    whose output does not grow where there is one (a stride that skips the new row), so
    there is nothing to slice. Other platforms get the plain call. The platform is
    ``jax.default_backend()``'s, decided when the call is traced, like the lowering choice
    (a ``lax.platform_dependent`` switch would survive differentiation as a conditional,
    across which XLA cannot choose the convolution's memory layout: 10x slower).
    """
    if weights and jax.default_backend() == "cpu":
        rhs, dimension_numbers = _natural_kernel(rhs, dimension_numbers)

    def conv(lhs, rhs, padding=padding):
        return lax.conv_general_dilated(
            lhs, rhs, window_strides=window_strides, padding=padding,
            lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
            dimension_numbers=dimension_numbers, **kwargs)

    lhs_spec, rhs_spec, out_spec = dimension_numbers
    nd = len(lhs_spec) - 2
    if (jax.default_backend() != "cpu" or nd != 2
            or kwargs.get("feature_group_count", 1) != 1
            or kwargs.get("batch_group_count", 1) != 1
            or any(tuple(p) != (0, 0) for p in padding)):
        return conv(lhs, rhs)
    sizes = [(lhs.shape[lhs_spec[2 + i]] - 1) * (lhs_dilation or (1,) * nd)[i] + 1
             for i in range(nd)]
    extents = [(rhs.shape[rhs_spec[2 + i]] - 1) * (rhs_dilation or (1,) * nd)[i] + 1
               for i in range(nd)]
    out = jax.eval_shape(conv, lhs, rhs).shape
    macs = math.prod(out) * lhs.shape[lhs_spec[1]] * math.prod(
        rhs.shape[i] for i in rhs_spec[2:])
    if macs < PAD_FAST_PATH_MACS or all(e <= s for e, s in zip(extents, window_strides)):
        return conv(lhs, rhs)
    # would one more input row add an output row on axis i?
    grows = [(x - e) % s == s - 1 for x, e, s in zip(sizes, extents, window_strides)]
    axis = grows.index(False) if False in grows else 0
    padded = [(0, 1) if i == axis else (0, 0) for i in range(nd)]

    def one_padded_row(lhs, rhs):
        dim = out_spec[2 + axis]
        return lax.slice_in_dim(conv(lhs, rhs, padded), 0, out[dim], axis=dim)

    return one_padded_row(lhs, rhs)


def _natural_kernel(rhs, dimension_numbers: lax.ConvDimensionNumbers):
    """Weights reshaped to XLA's own kernel order (spatial axes, then in, then out features)
    where only axes of size one stand out of it, with the dimension numbers to match.

    XLA CPU (jaxlib 0.10.2) compiles the layout change of such a kernel as a copy of its
    own, though it moves no data (a grouped 3-D convolution's ``[K.., O, 1]`` kernel: 35 ms
    of compile against 8 for the same convolution given ``[K.., 1, O]``); a reshape is free.
    Other kernels are left to XLA, which changes their layout as fast either way. Weights
    only: data passed as the kernel (weight gradients) compiled and ran 10-20% apart either
    way with it."""
    lhs_spec, rhs_spec, out_spec = dimension_numbers
    natural = (*rhs_spec[2:], rhs_spec[1], rhs_spec[0])
    moved = [a for a in natural if rhs.shape[a] != 1]
    if natural == tuple(range(rhs.ndim)) or moved != sorted(moved):
        return rhs, dimension_numbers
    nd = rhs.ndim - 2
    rhs = rhs.reshape([rhs.shape[a] for a in natural])
    return rhs, _dnums(lhs_spec, (nd + 1, nd, *range(nd)), out_spec)


def rearranged_once(x, rearrange):
    """``rearrange(x)`` (transposes and reshapes only, written with array methods), computed
    as one gather by its own XLA loop instead of fused into the loops that read it. XLA CPU
    fuses a transpose into its consumers, and a loop that reads weights through a transposed
    index runs unvectorized: an elementwise depthwise lowering whose ``[K.., C]`` weights
    are a transpose of PyTorch's ``[C, 1, K..]`` ran 3.7-4.9x slower than with those weights
    computed first (MobileNetV2's and ConvNeXt-T's depthwise layers, 2 CPUs).
    ``lax.optimization_barrier`` does not keep them apart (XLA CPU drops it before fusing);
    a gather does. The indices are ``rearrange`` applied to numpy's ``arange``: the values
    are moved, never computed on (signed zeros, NaN payloads and subnormals intact)."""
    order = rearrange(np.arange(x.size).reshape(x.shape))
    flat = x.reshape(-1).at[np.ravel(order)].get(mode="promise_in_bounds", unique_indices=True)
    return flat.reshape(order.shape)


def _merge(y, shape):
    """``y.reshape(shape)`` where ``shape`` only merges runs of adjacent axes, done one run
    per reshape: JAX's explicit sharding (``jax.make_mesh`` meshes) accepts a reshape of a
    sharded array only when it merges or splits a single run of axes. Any other ``shape``
    (a unit axis inserted, a split) is one plain reshape."""
    shape = tuple(shape)
    i = 0
    while tuple(y.shape) != shape:
        if i >= len(shape):             # only unit axes are left over
            return y.reshape(shape)
        if y.shape[i] == shape[i]:
            i += 1
            continue
        j = i + 1
        while j < y.ndim and math.prod(y.shape[i:j + 1]) < shape[i]:
            j += 1
        if j >= y.ndim or math.prod(y.shape[i:j + 1]) != shape[i]:
            return y.reshape(shape)     # not a merge of adjacent axes
        y = y.reshape((*y.shape[:i], shape[i], *y.shape[j + 1:]))
        i += 1
    return y


def add_all(parts):
    """The sum of ``parts`` (arrays of one shape) in order; ``None`` for none."""
    total = None
    for part in parts:
        total = part if total is None else total + part
    return total
