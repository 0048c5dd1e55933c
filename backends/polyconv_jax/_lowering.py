"""The three primitives of SPEC §3 as XLA operations: one convolution each, or a decomposition.

Notation (per spatial axis): ``A`` large size, ``B`` small size, ``K`` kernel, ``s`` stride,
``d`` dilation, ``ek = (K-1)*d + 1``, ``pb``/``pe`` the resolved pads of the large tensor.

The one-convolution ("direct") lowerings:

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
(:class:`jax.lax.ConvDimensionNumbers` with integer axis tuples, so any spatial rank works).
Accumulation is in ``plan.acc_dtype`` (``preferred_element_type``, or elementwise arithmetic
in that dtype), the bias is added in that dtype, and there is a single cast to ``plan.dtype``
at the end.

Differentiation: JAX differentiates the lowerings like any jax code, except that the
forward convolution of a strided or grouped plan (any dtype) carries a custom JVP
(:func:`_conv_adjoint_ad`) whose tangent is the transpose of the backward lowerings, so
``jax.grad`` runs the backward_data and backward_weights lowerings below instead of JAX's
own transposes (an lhs-dilated and a ``batch_group_count`` convolution).

Strided backward_data without ``lhs_dilation``
-----------------------------------------------
XLA CPU's lhs-dilated convolution is a slow path (it multiplies the inserted zeros): 1.5-3x
PyTorch for a dense 2-D ConvTranspose, 10-100x with groups, 100-250x in 3-D. So a strided
backward_data is split into its *phases* (the sub-pixel decomposition, :class:`_Phases`):
in padded coordinates the product of ``b[y]`` and tap ``k`` lands at ``X = y*s + k*d``, so
output rows ``X = q*s + r`` of phase ``r`` receive exactly the taps with ``k*d = r (mod s)``,
from ``b[q - m_k]``, ``m_k = (k*d - r) // s``: a stride-1 correlation of ``b`` with that
phase's sub-kernel. Per axis ``s`` phases (``prod(s)`` in all), interleaved back by one stack
and one transpose, cropped to ``A``; a phase no tap reaches is zeros (then the bias). The
lowerings (:data:`BACKWARD_DATA`):

``direct``           one lhs-dilated convolution (above).
``phases``           one stride-1 convolution per phase with exactly its taps (dilated by
                     ``d/gcd(d, s)``).
``phases_matmul``    the same phases as matrix products: patches of the phase's shifted
                     windows of ``b`` (``T_r`` times ``b``'s memory) times ``[T_r*Cb/G, Ca/G]``.
``phases_folded``    the phases again, with the first axis's taps stacked along channels
                     (patches of that axis only, ``T0`` times ``b``) and the other axes'
                     taps as one stride-1 convolution per phase over the first two axes
                     merged into one (rows whose window straddles two rows are computed
                     and cropped): 3-D becomes 2-D convolutions, 2-D becomes 1-D ones.
``subpixel``         one stride-1 convolution into ``prod(s)*Ca`` channels with the union
                     window of all phases (missing taps are zeros), then depth-to-space.
``subpixel_matmul``  the same as one matrix product per group.
``elementwise``      few input channels per group (``Cb/G <= 8``; 1 is depthwise): no
                     matrix product, shift-and-multiply-add per phase in the accumulation
                     dtype (one fused XLA loop each).
``grouped``          one ungrouped problem per group (XLA CPU's ``feature_group_count`` costs
                     about as much as the ungrouped convolution), joined along channels.

The ``subpixel*`` lowerings multiply ``b`` with their zero taps unless every phase fills the
window (:func:`subpixel_is_exact`: k4 s2, k16 s8, not k3 s2); then a NaN or infinity in ``b``
would reach outputs that do not read it, so :func:`choose_backward_data` uses them only where
they are exact. All lowerings are pure ``lax``/``jnp`` on static shapes (jit, grad, vmap,
sharding), and every reshape merges or splits one run of axes and never the batch axis
(explicit sharding).

Measured (how the rules of :func:`choose_backward_data` were set): sweeps of
``polyconv.benchmarks.suite``-style ConvTranspose cases, every lowering forced in turn,
interleaved, 3 rounds x 7 calls, median of the round medians; 2-core AMD EPYC (AVX-512),
jax 0.10.2 CPU, torch 2.13 (2 threads); NXC float32, batch 8 (2 in 3-D, 4 in 1-D), 32x32
input (16^3 in 3-D), 64 channels, k3 s2 p1 op1 unless stated. Milliseconds; ``lax`` is the
hand-written lhs-dilated call (what ``direct`` emits), torch is PyTorch's
``conv_transpose*d``; ``*`` marks the default's choice, ``~`` a lowering with zero taps
(not exact, never chosen)::

    case                      torch     lax  phases  ph_mm  subpx  sp_mm  elemw  grouped
    2D                         2.57    8.40   4.16*   5.62   5.09~  6.42~     -        -
    2D bfloat16                1.46    5.50   3.31    2.49*  4.22~  2.98~     -        -
    2D 16 channels             0.82    1.09   1.27    0.78*  0.70~  0.68~     -        -
    2D 128 channels            7.67   16.86   8.97*  12.09  13.64~ 15.13~     -        -
    2D k2 s2 (one tap/phase)   1.52    3.12   2.80    1.85*  3.19   1.86      -        -
    2D groups 8                1.58   21.10      -    4.92      -   2.75~ 11.33     3.41*
    2D groups 16               1.51   44.32      -    4.96      -   3.09~  2.77*    4.55
    2D groups 32               2.32   62.31      -    7.83      -   3.61~  1.68*    5.64
    2D depthwise (groups 64)   1.10   83.23      -    3.89      -   3.39~  0.73*    5.37
    1D 4000 256->128 k16 s8  147.43  177.67  96.33  104.97  80.94* 113.38     -        -
    1D 2048 256 channels      69.38   78.37  46.57*  70.45  44.57~ 84.69~     -        -
    3D 32 channels             2.79  372.62  13.57    5.11*  8.53~  6.38~     -        -
    3D 64 channels             6.32  769.12  30.29   28.74* 23.95~ 35.28~     -        -
    3D groups 16               4.61 1221.38      -   31.00      -  19.00~ 14.29*   28.62

(Timings on this shared machine move by 10-30% between runs, PyTorch's by up to 10x when
the other core is busy; the rules follow the larger, repeated differences.) The 3-D rows above
predate ``phases_folded``; they were re-measured below.

Single-thread, core-pinned re-measurement (the rules for 3-D and ``phases_folded``): the same
machine, every process on one core (``taskset -c 1``, ``torch.set_num_threads(1)``, XLA_FLAGS
``--xla_cpu_multi_thread_eigen=false``) while another job ran on the other core; competitors
interleaved in one process, 5 rounds x 7 calls, median of the round medians; ratios to
PyTorch (``conv_transpose*d``, channels_last), three processes where three numbers are given
(one process shows an occasional 2-3x slow outlier for one executable: ``(5.3)`` below)::

    suite case (NXC)     default: lowering, ratios       lax  ph_mm      ph_fold    before
    2D 8x32x32x64 k3 s2  phases    1.39 1.43 1.47  1.45-1.65  1.57-1.90  1.50-1.77  same
    2D groups 8          grouped   1.82 2.10 (5.3) 11.8-12.7  2.79-3.15  5.5-8.0    same
    2D depthwise         elemw     0.63 0.65 0.67  132-135    4.7-11.6   67-71      same
    1D 4000 k16 s8       subpixel  0.62 0.63 0.64  0.84-0.85  0.76-0.77  0.70       same
    3D 2x16^3x32         ph_fold   1.38 1.61 1.51  153-164    1.97 2.17 2.07  (dflt)  ph_mm
    2D bfloat16          ph_mm     1.35 2.00 1.44  3.05-3.39  (dflt)     2.34-2.99  same

    3-D sweep, 2x16^3, k3 s2 p1 op1 unless stated (one process)
                            torch ms  ph_mm  ph_fold  subpx_mm
    3D 16 channels            2.17     1.08    1.08    1.03
    3D 32 channels            3.91     2.04    1.49    2.57~
    3D 64 channels           13.26     3.66    1.48    3.90~
    3D 32 channels k4 s2      6.90     1.17    1.38    1.52
    3D 32 channels bfloat16   2.51     3.53    2.61    2.83~

``phases_folded`` wins in 3-D from 32 channels up (its 2-D convolutions read ``b`` in place;
``phases_matmul`` writes and reads patches of all 27 taps, which cost as much as its
products); in 2-D it loses to ``phases`` (f32) and ``phases_matmul`` (16-bit). Tried for
the grouped and bfloat16 2-D cases without a repeatable gain (1.7-2.1x for groups 8 and
1.3-2.0x for bfloat16 stay): a dot_general batched over the groups (``phases_matmul`` with
a group batch axis, or patches in the user layout ``[N, R.., T, G, Cb/G]`` contracted over
``(T, Cb/G)``: 2.2-2.3x), per-group patches from one group-major copy of ``b`` with one
interleave for all groups (2.1x), per-group ``phases_folded`` or ``phases`` (3.4-3.6x),
the output-side split (the first axis's taps as extra product columns, summed after the
product: 2.1-2.9x for groups 8, 1.5-1.9x for bfloat16, 1.7-2.4x in 3-D), the products of all
taps at once followed by shifted sums (col2im: 8-11x), per-tap products summed (3-4x),
bfloat16 patches gathered as uint16 bits (no change: XLA CPU already gathers the patches in
bfloat16 and its YNNPACK products take bfloat16 operands with float32 results), and
interleaving by padding or by nested stacks instead of one stack and transpose (no change).

backward_weights
----------------
:data:`BACKWARD_WEIGHTS`: ``direct`` (above); ``phases`` (one convolution per phase of the
large tensor, undilated kernel ``b``); ``depthwise`` (elementwise products and sums per tap);
``grouped`` (one ungrouped problem per group). XLA CPU's ``batch_group_count`` is the slow
path here. ConvTransposeBackwardWeights, 2-D 8x32x32x64 k3 s2 p1 op1 unless stated, same
machine, ms (``lax`` = ``jax.vjp`` of ``lax.conv_transpose``, groups 1 only)::

    case              torch     lax   direct  default
    2D                 4.29  194.35     8.48     8.16 (direct)
    2D groups 8        3.44       -   358.35     5.52 (grouped)
    2D depthwise       0.87       -     8.69     4.81 (depthwise)
    1D 4000 k16 s8    75.04       -    90.92    92.62 (direct)
    3D 2x16^3x32       2.77  136.55    63.65    20.63 (phases)

Known XLA issue: jaxlib 0.10.2's CPU compiler aborts the process on some lhs-dilated
convolutions (one axis with window = stride and no padding next to one without, e.g. the
input gradient of a stride-2 convolution with kernel (3, 2) and pads 1, which ``jax.grad``
itself produces). The default lowerings no longer emit lhs-dilated convolutions; a forced
``direct`` still can.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import itertools
import math
import os
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.custom_derivatives import SymbolicZero

from polyconv import ConvPlan
from polyconv._geometry import PRECISION_NAMES, check_precision

# --------------------------------------------------------------------------------------------
# precision (SPEC §5: full precision unless the caller opts in)
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
                  window_strides, lhs_dilation=None, rhs_dilation=None, **kwargs):
    """``lax.conv_general_dilated``, except that on CPU a 2-D ungrouped convolution with no
    padding gets one row of zeros past the end of one spatial axis (and the extra output
    row, if one appears, is sliced off).

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
    there is nothing to slice. Other platforms get the plain call
    (:func:`jax.lax.platform_dependent`, resolved when the computation is lowered).
    """
    def conv(lhs, rhs, padding=padding):
        return lax.conv_general_dilated(
            lhs, rhs, window_strides=window_strides, padding=padding,
            lhs_dilation=lhs_dilation, rhs_dilation=rhs_dilation,
            dimension_numbers=dimension_numbers, **kwargs)

    lhs_spec, rhs_spec, out_spec = dimension_numbers
    nd = len(lhs_spec) - 2
    if (nd != 2 or kwargs.get("feature_group_count", 1) != 1
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

    return lax.platform_dependent(lhs, rhs, cpu=one_padded_row, default=conv)


def _merge(y, shape):
    """``y.reshape(shape)`` where ``shape`` only merges runs of adjacent axes, done one run
    per reshape: JAX's explicit sharding (``jax.make_mesh`` meshes) accepts a reshape of a
    sharded array only when it merges or splits a single run of axes."""
    shape = tuple(shape)
    i = 0
    while tuple(y.shape) != shape:
        if i >= len(shape):             # only unit axes are left over
            return y.reshape(shape)
        if y.shape[i] == shape[i]:
            i += 1
            continue
        j = i + 1
        while math.prod(y.shape[i:j + 1]) != shape[i]:
            j += 1
        y = y.reshape((*y.shape[:i], shape[i], *y.shape[j + 1:]))
        i += 1
    return y


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
    conv = _conv_adjoint_ad if _adjoint_ad(plan) else _conv
    return _finish(plan, conv(plan, precision, a, w), bias, plan.channel_axis)


def _conv(plan: ConvPlan, precision, a, w):
    """The forward convolution, in the accumulation dtype."""
    data = _data_spec(plan)
    perm = plan.weights_perm
    # XLA's output size floor((A + pb + pe - ek)/s) + 1 is plan.b_spatial by construction
    # (also for conv_transpose_backward_data, where A carries output_padding < s).
    padding = list(zip(plan.pads_begin, plan.pads_end))
    return _conv_general(
        a, w, window_strides=plan.strides, padding=padding, rhs_dilation=plan.dilations,
        dimension_numbers=_dnums(data, perm, data), feature_group_count=plan.groups,
        precision=precision, preferred_element_type=plan.acc_dtype)


def _adjoint_ad(plan: ConvPlan) -> bool:
    """Whether the forward primitive differentiates through polyconv's own adjoints.

    JAX's transpose of a strided convolution is an lhs-dilated one (XLA CPU's slow path, and
    on some geometries a compiler abort), of a grouped one a ``batch_group_count`` one (slow
    too). These plans get :func:`_conv_adjoint_ad` instead.
    """
    return plan.batch > 0 and (
        any(s > 1 for s in plan.strides) or plan.groups > 1)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1))
def _conv_adjoint_ad(plan: ConvPlan, precision, a, w):
    """:func:`_conv`, whose tangent is built so that reverse mode runs polyconv's backward
    lowerings.

    The tangent ``conv(da, w) + conv(a, dw)`` is computed as the *transposes* of the
    backward_data lowering (``b -> a``, linear in ``b``) and of the backward_weights lowering
    (``b -> W``, linear in ``b``): SPEC §3 makes them the adjoints of the forward convolution,
    so their transposes are the forward convolution in ``a`` and in ``w``. Reverse mode
    transposes the tangent once more and so runs those backward lowerings (phases, no
    lhs-dilated or ``batch_group_count`` convolution); forward mode, vmap and higher orders
    see ordinary JAX operations.
    """
    return _conv(plan, precision, a, w)


def _conv_tangent(plan: ConvPlan, precision, primals, tangents):
    a, w = primals
    da, dw = tangents
    y = _conv_adjoint_ad(plan, precision, a, w)             # in the accumulation dtype
    # The lowerings take operands of the plan's dtype and return the accumulation dtype, so
    # their transposes map an accumulation-dtype tangent to one of the plan's dtype: for
    # float16/bfloat16 the tangent is rounded once more in forward mode, while reverse mode
    # (whose cotangents come in the plan's dtype) loses nothing.
    b_struct = jax.ShapeDtypeStruct(plan.b_shape, a.dtype)
    t = jnp.zeros_like(y)
    if not isinstance(da, SymbolicZero):
        lowering = BACKWARD_DATA[choose_backward_data(plan)]
        (t_a,) = jax.linear_transpose(lambda b: lowering(plan, precision, b, w), b_struct)(
            da.astype(y.dtype))
        t = t + t_a.astype(y.dtype)
    if not isinstance(dw, SymbolicZero):
        lowering = BACKWARD_WEIGHTS[choose_backward_weights(plan)]
        (t_w,) = jax.linear_transpose(lambda b: lowering(plan, precision, a, b), b_struct)(
            dw.astype(y.dtype))
        t = t + t_w.astype(y.dtype)
    return y, t


_conv_adjoint_ad.defjvp(_conv_tangent, symbolic_zeros=True)


# --------------------------------------------------------------------------------------------
# backward_data: the direct lowering and the phase (sub-pixel) decompositions
# --------------------------------------------------------------------------------------------


def _direct(plan: ConvPlan, precision, b, w):
    """One stride-1 convolution of ``b`` dilated by ``s`` (``lhs_dilation``)."""
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
    return _conv_general(
        b, w, window_strides=(1,) * plan.ndim, padding=padding, lhs_dilation=plan.strides,
        rhs_dilation=plan.dilations,
        dimension_numbers=_dnums(data, (perm[1], perm[0], *perm[2:]), data),
        feature_group_count=plan.groups, precision=precision,
        preferred_element_type=plan.acc_dtype)


@dataclass(frozen=True)
class _Phases:
    """One spatial axis of backward_data, split into its ``s`` output phases.

    In padded coordinates ``X = x + pb`` the product of ``b[y]`` and tap ``k`` lands at
    ``X = y*s + k*d``. Write ``X = q*s + r``: row ``q`` of phase ``r`` receives exactly the
    taps with ``k*d = r (mod s)``, each from ``y = q - m_k``, ``m_k = (k*d - r) // s``; the
    taps of one phase are ``step = s/gcd(d, s)`` apart and their shifts ``m_k`` are
    ``dd = d/gcd(d, s)`` apart. Rows ``q`` in ``[q_lo, q_lo + rows)`` of every phase,
    interleaved, cover the padded range ``[q_lo*s, (q_lo + rows)*s)``, which contains the
    output ``[pb, pb + A)``; the output starts ``crop = pb - q_lo*s`` rows in.
    """

    s: int
    size: int                             # A: the output rows
    small: int                            # B: the input rows
    q_lo: int
    rows: int
    crop: int
    taps: tuple[tuple[int, ...], ...]     # per phase: its taps k, ascending
    shifts: tuple[tuple[int, ...], ...]   # per phase: m_k of those taps
    step: int
    dd: int

    @property
    def top(self) -> int:
        """The largest shift of any tap: the first row of the fused (sub-pixel) kernel."""
        return max(m for ms in self.shifts for m in ms)

    @property
    def bottom(self) -> int:
        return min(m for ms in self.shifts for m in ms)

    def padding(self, top: int, window: int) -> tuple[int, int]:
        """Pads of ``b`` for a stride-1 window of ``window`` rows whose first row reads
        ``b[q - top]`` for output row ``q``: the output rows are ``q_lo .. q_lo+rows-1``."""
        lo = top - self.q_lo
        return lo, self.rows + window - 1 - self.small - lo


@functools.lru_cache(maxsize=256)
def _phases(plan: ConvPlan) -> tuple[_Phases, ...]:
    out = []
    for a, bsz, k, s, d, pb in zip(plan.a_spatial, plan.b_spatial, plan.kernel, plan.strides,
                                   plan.dilations, plan.pads_begin):
        q_lo = pb // s
        rows = -(-(pb + a) // s) - q_lo
        taps = tuple(tuple(t for t in range(k) if (t * d) % s == r) for r in range(s))
        shifts = tuple(tuple((t * d - r) // s for t in ts) for r, ts in enumerate(taps))
        g = math.gcd(d, s)
        out.append(_Phases(s, a, bsz, q_lo, rows, pb - q_lo * s, taps, shifts, s // g,
                           d // g))
    return tuple(out)


def _interleave(plan: ConvPlan, axes: tuple[_Phases, ...], parts: dict,
                group_major: bool = False):
    """Interleave the phase outputs (``parts[r]``, rows ``q_lo..``) and crop to ``A``.

    ``parts[r]`` is in the user's data layout, or ``[G, N, R.., Ca/G]`` with
    ``group_major``. All phases are stacked once and one transpose puts phase ``r_i`` right
    after spatial axis ``i`` (row ``q*s + r``), so XLA copies the output once (stack and
    transpose fuse), then the padded range is cropped to the output rows.
    """
    nd = plan.ndim
    steps = tuple(p.s for p in axes)
    y = jnp.stack([parts[r] for r in itertools.product(*(range(s) for s in steps))])
    y = y.reshape((*steps, *y.shape[1:]))
    phase = range(nd)
    if group_major:            # parts [G, N, R.., o]: G at nd, N at nd+1, R_i at nd+2+i
        rows = [nd + 2 + i for i in range(nd)]
        lead, tail = ([nd + 1], [nd, 2 * nd + 2]) if plan.channels_last else (
            [nd + 1, nd, 2 * nd + 2], [])
    elif plan.channels_last:   # parts [N, R.., C]
        rows = [nd + 1 + i for i in range(nd)]
        lead, tail = [nd], [2 * nd + 1]
    else:                      # parts [N, C, R..]
        rows = [nd + 2 + i for i in range(nd)]
        lead, tail = [nd, nd + 1], []
    order = (*lead, *itertools.chain.from_iterable(zip(rows, phase)), *tail)
    y = jnp.transpose(y, order)
    sizes = tuple(y.shape[len(lead) + 2 * i] * s for i, s in enumerate(steps))
    if plan.channels_last:
        y = _merge(y, (plan.batch, *sizes, plan.a_channels))
    else:
        y = _merge(y, (plan.batch, plan.a_channels, *sizes))
    return _crop(plan, axes, y)


def _crop(plan: ConvPlan, axes: tuple[_Phases, ...], y):
    start, limit = [0] * y.ndim, list(y.shape)
    for ax, p in zip(plan.spatial_axes, axes):
        start[ax], limit[ax] = p.crop, p.crop + p.size
    if tuple(start) == (0,) * y.ndim and tuple(limit) == y.shape:
        return y
    return lax.slice(y, start, limit)


def _phase_shape(plan: ConvPlan, axes: tuple[_Phases, ...]) -> tuple[int, ...]:
    rows = tuple(p.rows for p in axes)
    if plan.channels_last:
        return (plan.batch, *rows, plan.a_channels)
    return (plan.batch, plan.a_channels, *rows)


def _by_phase(plan: ConvPlan, precision, b, w):
    """``prod(s)`` stride-1 convolutions, one per phase, with exactly that phase's taps.

    Phase ``r``'s kernel is the taps ``k = r' + j*step`` (every ``step``-th tap, reversed: a
    correlation), dilated by ``dd``; a phase that no tap reaches is zeros. No multiply-add is
    wasted, but XLA runs ``prod(s)`` convolutions and the interleave copies the output once.
    """
    axes = _phases(plan)
    data = _data_spec(plan)
    perm = plan.weights_perm
    dnums = _dnums(data, (perm[1], perm[0], *perm[2:]), data)
    parts = {}
    for r in itertools.product(*(range(p.s) for p in axes)):
        taps = [p.taps[ri] for p, ri in zip(axes, r)]
        if not all(taps):
            parts[r] = jnp.zeros(_phase_shape(plan, axes), plan.acc_dtype)
            continue
        sub = w
        for i, (p, t) in enumerate(zip(axes, taps)):
            sub = lax.slice_in_dim(sub, t[0], t[-1] + 1, p.step, perm[2 + i])
        sub = lax.rev(sub, perm[2:])
        if plan.groups > 1:
            sub = _regroup(sub, perm[0], perm[1], plan.groups)
        padding = [p.padding(p.shifts[ri][-1], (len(t) - 1) * p.dd + 1)
                   for p, ri, t in zip(axes, r, taps)]
        parts[r] = _conv_general(
            b, sub, window_strides=(1,) * plan.ndim, padding=padding,
            rhs_dilation=tuple(p.dd for p in axes), dimension_numbers=dnums,
            feature_group_count=plan.groups, precision=precision,
            preferred_element_type=plan.acc_dtype)
    return _interleave(plan, axes, parts)


def _fused_kernel(plan: ConvPlan, w):
    """The sub-pixel kernel ``[Cb, Ca/G, L1, s1, .., Ld, sd]`` (canonical channel order).

    Row ``j`` of axis ``i``, phase ``r``, holds the tap ``k`` with shift ``m_k = top - j`` in
    phase ``r``, or zero where that phase has no such tap (a gather from the kernel with one
    zero tap appended: exact, and differentiable).
    """
    w = jnp.transpose(w, plan.weights_perm)       # [Cb, Ca/G, K..]
    zero = jnp.zeros((), w.dtype)
    for i, (p, k) in enumerate(zip(_phases(plan), plan.kernel)):
        axis = 2 + 2 * i                           # earlier axes already split in (L, s)
        top, length = p.top, p.top - p.bottom + 1
        index = np.full((length, p.s), k)          # k: the appended zero tap
        for r, (ks, ms) in enumerate(zip(p.taps, p.shifts)):
            for t, m in zip(ks, ms):
                index[top - m, r] = t
        config = [(0, 0, 0)] * w.ndim
        config[axis] = (0, 1, 0)
        w = jnp.take(lax.pad(w, zero, config), index.reshape(-1), axis=axis)
        w = w.reshape((*w.shape[:axis], length, p.s, *w.shape[axis + 1:]))
    return w


def _subpixel(plan: ConvPlan, precision, b, w):
    """One stride-1 convolution into ``prod(s)`` times the channels, then depth-to-space.

    All phases share one window of ``L = top - bottom + 1`` rows per axis (the union of the
    phases' shifts); a phase's missing taps are zeros, so this does ``prod(L*s)/prod(K)``
    times the multiply-adds of the exact sum (1.78x for k3 s2 in 2-D, 1 for k16 s8) but is a
    single, dense, stride-1 XLA convolution. Output channels are ordered
    ``[G, s1..sd, Ca/G]`` (feature groups must be outermost).
    """
    axes = _phases(plan)
    nd, g = plan.ndim, plan.groups
    ca_g = plan.a_channels // g
    fused = _fused_kernel(plan, w)                 # [Cb, Ca/G, L1, s1, ..]
    lengths = fused.shape[2::2]
    fused = fused.reshape((g, plan.b_channels // g, *fused.shape[1:]))
    # -> [Cb/G, G, s1..sd, Ca/G, L1..Ld]
    order = (1, 0, *(4 + 2 * i for i in range(nd)), 2, *(3 + 2 * i for i in range(nd)))
    fused = jnp.transpose(fused, order)
    phases = math.prod(p.s for p in axes)
    fused = fused.reshape((plan.b_channels // g, g * phases * ca_g, *lengths))
    padding = [p.padding(p.top, n) for p, n in zip(axes, lengths)]
    data = _data_spec(plan)
    y = _conv_general(
        b, fused, window_strides=(1,) * nd, padding=padding,
        dimension_numbers=_dnums(data, (1, 0, *range(2, nd + 2)), data),
        feature_group_count=g, precision=precision, preferred_element_type=plan.acc_dtype)
    rows = y.shape[plan.spatial_axes[0]:plan.spatial_axes[0] + nd]
    steps = tuple(p.s for p in axes)
    if plan.channels_last:   # [N, R.., G, s.., Ca/G] -> [N, R1, s1, .., Rd, sd, G, Ca/G]
        y = y.reshape((plan.batch, *rows, g, *steps, ca_g))
        order = (0, *itertools.chain.from_iterable((1 + i, nd + 2 + i) for i in range(nd)),
                 nd + 1, 2 * nd + 2)
        y = _merge(jnp.transpose(y, order),
                   (plan.batch, *(n * s for n, s in zip(rows, steps)), plan.a_channels))
    else:                    # [N, G, s.., Ca/G, R..] -> [N, G, Ca/G, R1, s1, .., Rd, sd]
        y = y.reshape((plan.batch, g, *steps, ca_g, *rows))
        order = (0, 1, nd + 2,
                 *itertools.chain.from_iterable((nd + 3 + i, 2 + i) for i in range(nd)))
        y = _merge(jnp.transpose(y, order),
                   (plan.batch, plan.a_channels, *(n * s for n, s in zip(rows, steps))))
    return _crop(plan, axes, y)


def _group_major(plan: ConvPlan, x, channels: int):
    """A data tensor in the user's layout as ``[G, N, X.., C/G]`` (outer group split)."""
    nd, g = plan.ndim, plan.groups
    if plan.channels_last:
        return jnp.moveaxis(x.reshape((*x.shape[:-1], g, channels // g)), nd + 1, 0)
    x = x.reshape((plan.batch, g, channels // g, *x.shape[2:]))
    return jnp.transpose(x, (1, 0, *range(3, nd + 3), 2))


def _windows(plan: ConvPlan, b):
    """``b`` group-major and padded for every phase's window: ``[G, N, B'.., Cb/G]``.

    Padded so that output row ``q_lo`` of every phase reads its tap with shift ``m`` at
    index ``top - m`` (``top``: the largest shift on that axis).
    """
    x = _group_major(plan, b, plan.b_channels)
    config = [(0, 0, 0)] * x.ndim
    for i, p in enumerate(_phases(plan)):
        config[2 + i] = (*p.padding(p.top, p.top - p.bottom + 1), 0)
    return lax.pad(x, jnp.zeros((), x.dtype), config)


def _product(plan: ConvPlan, precision, x, offsets, kernel, unroll: int = 8):
    """``sum_t x[.., offset_t + rows.., :] @ kernel[:, t]``, one matrix product per group.

    ``x`` from :func:`_windows`; ``offsets``: per tap a tuple of start rows; ``kernel``:
    ``[G, T*Cb/G, cols]``. The shifted windows are stacked into patches
    ``[G, N, R.., T*Cb/G]`` (``T`` times the input's memory; batch and rows stay separate
    axes, for sharding). Up to ``unroll`` groups get a product each; more groups, one
    ``dot_general`` batched over them. Returns ``[G, N, R.., cols]`` in the accumulation
    dtype.
    """
    g, n = x.shape[0], x.shape[1]
    rows = tuple(p.rows for p in _phases(plan))
    windows = [lax.slice(x, (0, 0, *offset, 0),
                         (g, n, *(o + r for o, r in zip(offset, rows)), x.shape[-1]))
               for offset in offsets]
    patches = jnp.stack(windows, axis=-2)
    patches = patches.reshape((*patches.shape[:-2], len(offsets) * x.shape[-1]))
    last = patches.ndim - 1
    if g <= unroll:
        return jnp.stack([lax.dot_general(patches[i], kernel[i], (((last - 1,), (0,)), ((), ())),
                                          precision=precision,
                                          preferred_element_type=plan.acc_dtype)
                          for i in range(g)])
    return lax.dot_general(patches, kernel, (((last,), (1,)), ((0,), (0,))),
                           precision=precision, preferred_element_type=plan.acc_dtype)


def _subpixel_matmul(plan: ConvPlan, precision, b, w):
    """The sub-pixel product of :func:`_subpixel` as explicit matrix products.

    Patches of all ``T = prod(L)`` window rows (see :func:`_product`) times the sub-pixel
    kernel ``[G, T*Cb/G, prod(s)*Ca/G]``, then depth-to-space. No convolution: XLA's CPU
    matrix products beat its small-window and grouped convolutions, and the wide right-hand
    side (``prod(s)*Ca/G`` columns) keeps them efficient for narrow channels.
    """
    axes = _phases(plan)
    nd, g = plan.ndim, plan.groups
    cb_g, ca_g = plan.b_channels // g, plan.a_channels // g
    fused = _fused_kernel(plan, w)                 # [Cb, Ca/G, L1, s1, ..]
    lengths = fused.shape[2::2]
    steps = tuple(p.s for p in axes)
    fused = fused.reshape((g, cb_g, ca_g, *fused.shape[2:]))
    # -> [G, L1..Ld, Cb/G, s1..sd, Ca/G]
    order = (0, *(3 + 2 * i for i in range(nd)), 1, *(4 + 2 * i for i in range(nd)), 2)
    fused = jnp.transpose(fused, order).reshape(
        (g, math.prod(lengths) * cb_g, math.prod(steps) * ca_g))
    offsets = list(itertools.product(*(range(n) for n in lengths)))
    y = _product(plan, precision, _windows(plan, b), offsets, fused)
    rows = y.shape[2:2 + nd]
    y = y.reshape((g, plan.batch, *rows, *steps, ca_g))
    interleaved = tuple(itertools.chain.from_iterable((2 + i, 2 + nd + i) for i in range(nd)))
    sizes = tuple(r * s for r, s in zip(rows, steps))
    if plan.channels_last:   # -> [N, R1, s1, .., Rd, sd, G, Ca/G]
        y = jnp.transpose(y, (1, *interleaved, 0, 2 + 2 * nd))
        y = _merge(y, (plan.batch, *sizes, plan.a_channels))
    else:                    # -> [N, G, Ca/G, R1, s1, .., Rd, sd]
        y = jnp.transpose(y, (1, 0, 2 + 2 * nd, *interleaved))
        y = _merge(y, (plan.batch, plan.a_channels, *sizes))
    return _crop(plan, axes, y)


def _phases_matmul(plan: ConvPlan, precision, b, w):
    """The phases of :func:`_by_phase` as explicit matrix products: exact multiply-adds.

    Per phase, patches of its ``T_r`` taps (see :func:`_product`) times the kernel
    ``[G, T_r*Cb/G, Ca/G]`` of those taps; then the phases are interleaved.
    """
    axes = _phases(plan)
    g = plan.groups
    cb_g, ca_g = plan.b_channels // g, plan.a_channels // g
    wc = jnp.transpose(w, plan.weights_perm)                    # [Cb, Ca/G, K..]
    wc = wc.reshape((g, cb_g, ca_g, *plan.kernel))
    x = _windows(plan, b)
    parts = {}
    for r in itertools.product(*(range(p.s) for p in axes)):
        taps = list(itertools.product(*(zip(p.taps[ri], p.shifts[ri])
                                        for p, ri in zip(axes, r))))
        if not taps:
            parts[r] = jnp.zeros((g, plan.batch, *(p.rows for p in axes), ca_g),
                                 plan.acc_dtype)
            continue
        kernel = jnp.stack([wc[(slice(None),) * 3 + tuple(k for k, _ in tap)]
                            for tap in taps], axis=1)           # [G, T, Cb/G, Ca/G]
        kernel = kernel.reshape((g, len(taps) * cb_g, ca_g))
        offsets = [tuple(p.top - m for p, (_, m) in zip(axes, tap)) for tap in taps]
        parts[r] = _product(plan, precision, x, offsets, kernel)
    return _interleave(plan, axes, parts, group_major=True)


def _elementwise(plan: ConvPlan, precision, b, w):
    """Shift-and-multiply-add, for few input channels per group (``Cb/G``; 1 is depthwise,
    with any channel multiplier ``Ca/G``).

    Each phase is a sum, over its taps and the ``Cb/G`` input channels of a group, of a
    shifted window of one channel of ``b`` times that tap's ``[G, Ca/G]`` weights, in the
    accumulation dtype: one fused XLA loop per phase, ``Cb/G`` times the taps' multiply-adds
    per output, no matrix product (with ``Cb/G`` that small there is little to contract).
    Then the phases are interleaved. ``precision`` has no effect: products of the
    accumulation dtype are exact per element.
    """
    del precision
    axes = _phases(plan)
    nd, g = plan.ndim, plan.groups
    cb_g, ca_g = plan.b_channels // g, plan.a_channels // g
    acc = plan.acc_dtype
    wc = jnp.transpose(w, plan.weights_perm).astype(acc)   # [Cb, Ca/G, K..]
    wc = wc.reshape((g, cb_g, ca_g, *plan.kernel))
    tops = tuple(p.top for p in axes)
    lengths = tuple(p.top - p.bottom + 1 for p in axes)
    config = [(0, 0, 0)] * b.ndim
    for ax, p, n in zip(plan.spatial_axes, axes, lengths):
        config[ax] = (*p.padding(p.top, n), 0)
    bp = lax.pad(b.astype(acc), jnp.zeros((), acc), config)
    # channels split into (G, Cb/G); one input channel of each group is sliced out per term,
    # its unit axis broadcasts against the Ca/G outputs
    c = plan.channel_axis
    bp = bp.reshape((*bp.shape[:c], g, cb_g, *bp.shape[c + 1:]))
    spatial = tuple(ax + (ax > c) for ax in plan.spatial_axes)
    wshape = (g, ca_g) + (() if plan.channels_last else (1,) * nd)
    parts = {}
    for r in itertools.product(*(range(p.s) for p in axes)):
        total = None
        for tap in itertools.product(*(zip(p.taps[ri], p.shifts[ri])
                                       for p, ri in zip(axes, r))):
            start = [0] * bp.ndim
            limit = list(bp.shape)
            for ax, p, top, (_, m) in zip(spatial, axes, tops, tap):
                start[ax] = top - m
                limit[ax] = top - m + p.rows
            ks = tuple(k for k, _ in tap)
            for i in range(cb_g):
                start[c + 1], limit[c + 1] = i, i + 1
                term = lax.slice(bp, start, limit) * wc[(slice(None), i, slice(None), *ks)
                                                        ].reshape(wshape)
                total = term if total is None else total + term
        if total is None:
            parts[r] = jnp.zeros(_phase_shape(plan, axes), acc)
        else:
            parts[r] = _merge(total, _phase_shape(plan, axes))
    return _interleave(plan, axes, parts)


def _folded(plan: ConvPlan, precision, b, w):
    """The phases with the first spatial axis's taps stacked along channels, the other axes
    by one stride-1 convolution per phase over a tensor whose first two spatial axes are
    folded (merged) into one.

    Per phase ``r0`` of the first axis its ``T0`` shifted windows of ``b`` are stacked along
    channels (``T0`` times ``b``'s memory, ``[G, T0, Cb/G]`` channel order); the first two
    spatial axes, rows ``R0`` and the padded ``B1'``, are merged, and each phase of the other
    axes is one convolution with exactly its taps (channels ``T0*Cb/G`` -> ``Ca/G`` per
    group), the second axis's taps running along the merged axis. Merged rows whose window
    runs past the end of a ``B1'`` row (into the next) are computed and cropped; no output
    reads them. So a 3-D problem is 2-D convolutions (which XLA CPU runs well, unlike its 3-D
    ones), no product is wasted on zero taps, and only one axis's taps are materialised.
    """
    axes = _phases(plan)
    nd, g = plan.ndim, plan.groups
    first, rest = axes[0], axes[1:]
    cb_g, ca_g = plan.b_channels // g, plan.a_channels // g
    sa = plan.spatial_axes
    config = [(0, 0, 0)] * b.ndim
    for ax, p in zip(sa, axes):
        config[ax] = (*p.padding(p.top, p.top - p.bottom + 1), 0)
    x = lax.pad(b, jnp.zeros((), b.dtype), config)             # user layout, padded
    c = plan.channel_axis
    x = x.reshape((*x.shape[:c], g, cb_g, *x.shape[c + 1:]))    # channels split (G, Cb/G)
    folded = nd > 1
    b1 = x.shape[sa[1] + (c < sa[1])] if folded else 1
    # the convolution's operands: rank nd+1 (nd-1 spatial axes; 1 in 1-D, of window 1)
    cn = max(nd - 1, 1)
    data = (0, cn + 1, *range(1, cn + 1)) if plan.channels_last else (0, 1, *range(2, cn + 2))
    dnums = _dnums(data, (1, 0, *range(2, cn + 2)), data)      # kernel [in, out, window..]
    wc = jnp.transpose(w, plan.weights_perm)                     # [Cb, Ca/G, K..]
    wc = wc.reshape((g, cb_g, ca_g, *plan.kernel))
    phase_shape = _phase_shape(plan, axes)
    parts = {}
    for r0 in range(first.s):
        taps0 = list(zip(first.taps[r0], first.shifts[r0]))
        if not taps0:
            for rr in itertools.product(*(range(p.s) for p in rest)):
                parts[(r0, *rr)] = jnp.zeros(phase_shape, plan.acc_dtype)
            continue
        ax0 = sa[0] + (c < sa[0])                                # after the channel split
        windows = [lax.slice_in_dim(x, first.top - m, first.top - m + first.rows, axis=ax0)
                   for _, m in taps0]
        xd = jnp.stack(windows, axis=c + 1)                      # channels [G, T0, Cb/G]
        xd = _merge(xd, (*xd.shape[:c], g * len(taps0) * cb_g, *xd.shape[c + 3:]))
        if folded:                                               # merge R0 and B1'
            xd = xd.reshape((*xd.shape[:sa[0]], first.rows * b1, *xd.shape[sa[0] + 2:]))
        # kernel [T0*Cb/G, G*Ca/G, K_rest..]
        k0 = jnp.stack([wc[:, :, :, k] for k, _ in taps0], axis=1)   # [G, T0, Cb/G, Ca/G, ..]
        k0 = jnp.moveaxis(k0, 0, 2)                                  # [T0, Cb/G, G, Ca/G, ..]
        k0 = k0.reshape((len(taps0) * cb_g, g * ca_g, *k0.shape[4:]))
        for rr in itertools.product(*(range(p.s) for p in rest)):
            taps = [p.taps[ri] for p, ri in zip(rest, rr)]
            if not all(taps):
                parts[(r0, *rr)] = jnp.zeros(phase_shape, plan.acc_dtype)
                continue
            sub = k0
            for i, (p, t) in enumerate(zip(rest, taps)):
                sub = lax.slice_in_dim(sub, t[0], t[-1] + 1, p.step, 2 + i)
            sub = lax.rev(sub, tuple(range(2, 1 + nd)))          # a correlation
            # the window's first row is the phase's last tap: offset top - m (x is padded for
            # every tap's offset top - m); the merged axis keeps R0*B1' rows, the others rows
            padding = []
            for i, (p, ri, t) in enumerate(zip(rest, rr, taps)):
                extent = (len(t) - 1) * p.dd + 1
                lo = p.shifts[ri][-1] - p.top
                hi = extent - 1 - lo if i == 0 else p.bottom - p.top + extent - 1 - lo
                padding.append((lo, hi))
            if not folded:
                sub = sub[..., None]
                padding = [(0, 0)]
            z = _conv_general(
                xd, sub, window_strides=(1,) * cn, padding=padding,
                rhs_dilation=tuple(p.dd for p in rest) or (1,), dimension_numbers=dnums,
                feature_group_count=g, precision=precision,
                preferred_element_type=plan.acc_dtype)
            if folded:                                           # split, crop to rows
                z = z.reshape((*z.shape[:sa[0]], first.rows, b1, *z.shape[sa[0] + 1:]))
                z = lax.slice_in_dim(z, 0, rest[0].rows, axis=sa[0] + 1)
            parts[(r0, *rr)] = z
    return _interleave(plan, axes, parts)


def _grouped(plan: ConvPlan, precision, b, w):
    """One ungrouped backward_data per group (each by :func:`choose_backward_data`), joined
    along the channel axis: group ``g`` reads channels ``[g*Cb/G, (g+1)*Cb/G)`` of ``b`` and
    rows ``[g*Cb/G, ..)`` of ``W`` and writes channels ``[g*Ca/G, ..)``. XLA's CPU grouped
    convolutions (``feature_group_count``) cost about as much as ungrouped ones; G separate
    products cost ``1/G`` each.
    """
    g = plan.groups
    cb_g, ca_g = plan.b_channels // g, plan.a_channels // g
    sub = plan.with_(groups=1, b_channels=cb_g, a_channels=ca_g)
    inner = BACKWARD_DATA[choose_backward_data(sub)]
    parts = [inner(sub, precision,
                   lax.slice_in_dim(b, i * cb_g, (i + 1) * cb_g, axis=plan.channel_axis),
                   lax.slice_in_dim(w, i * cb_g, (i + 1) * cb_g, axis=plan.weights_perm[0]))
             for i in range(g)]
    return jnp.concatenate(parts, axis=plan.channel_axis)


#: ``elementwise`` computes at most this many input channels per group (its cost grows with
#: them; a matrix product does not)
ELEMENTWISE_MAX_CHANNELS = 8

#: the backward_data lowerings, by name (see :func:`choose_backward_data`)
BACKWARD_DATA = {"direct": _direct, "phases": _by_phase, "phases_matmul": _phases_matmul,
                 "subpixel": _subpixel, "subpixel_matmul": _subpixel_matmul,
                 "phases_folded": _folded, "elementwise": _elementwise,
                 "grouped": _grouped}


def applicable(plan: ConvPlan, lowering: str) -> bool:
    """Whether ``lowering`` can compute ``plan``'s backward_data."""
    if lowering == "elementwise":
        return plan.b_channels // plan.groups <= ELEMENTWISE_MAX_CHANNELS
    if lowering == "grouped":
        return plan.groups > 1
    return lowering in BACKWARD_DATA


def subpixel_is_exact(plan: ConvPlan) -> bool:
    """Whether the sub-pixel window holds only real taps (every phase of every axis has a tap
    at every window row: k4 s2, k16 s8, k2 s2, ..., not k3 s2).

    Only then do ``subpixel`` and ``subpixel_matmul`` form exactly the products of the
    definition; otherwise their zero taps meet ``b`` too, and a NaN or infinity in ``b``
    reaches outputs that do not read it (``0 * inf = nan``). The default choice never makes
    such products.
    """
    for p in _phases(plan):
        window = tuple(range(p.bottom, p.top + 1))
        if any(ms != window for ms in p.shifts):
            return False
    return True


def choose_backward_data(plan: ConvPlan) -> str:
    """The backward_data lowering for a plan (measured on XLA CPU: see the module docstring).

    Only lowerings that form exactly the products of SPEC §3 are chosen (NaN and infinity in
    ``b`` reach exactly the outputs that read them): ``subpixel*`` only where
    :func:`subpixel_is_exact`.

    1. No stride: ``direct`` (nothing to decompose; one stride-1 convolution).
    2. Groups with at most 4 input channels each (depthwise: 1, any channel multiplier):
       ``elementwise``.
    3. Other groups: ``grouped`` (one ungrouped problem per group, each chosen by rules 4-8)
       up to 32 groups, else ``phases_matmul`` (products batched over the groups).
    4. At most one tap per phase (k2 s2, k1 s2, ...): ``phases_matmul`` (each phase is one
       plain matrix product).
    5. Narrow channels (``min(Cb, Ca) <= 16``): ``subpixel_matmul`` where exact, else
       ``phases_matmul``.
    6. 2-D: ``phases``; for float16/bfloat16 ``phases_matmul`` (XLA CPU's 16-bit matrix
       products are faster than its 16-bit convolutions).
    7. 1-D: ``subpixel`` where exact (k16 s8), else ``phases``.
    8. 3-D: ``phases_folded`` (2-D convolutions; XLA CPU's small-window 3-D convolutions are
       slow, and ``phases_matmul``'s patches of all taps cost more than its products).
    9. 4-D and up: ``phases_matmul``.
    """
    if all(s == 1 for s in plan.strides):
        return "direct"
    g = plan.groups
    if g > 1:
        if plan.b_channels // g <= 4:
            return "elementwise"
        return "grouped" if g <= 32 else "phases_matmul"
    axes = _phases(plan)
    if all(len(taps) <= 1 for p in axes for taps in p.taps):
        return "phases_matmul"
    exact = subpixel_is_exact(plan)
    if min(plan.b_channels, plan.a_channels) <= 16:
        return "subpixel_matmul" if exact else "phases_matmul"
    if plan.ndim == 2:
        return "phases_matmul" if plan.dtype in ("float16", "bfloat16") else "phases"
    if plan.ndim == 1:
        return "subpixel" if exact else "phases"
    return "phases_folded" if plan.ndim == 3 else "phases_matmul"


@functools.partial(jax.jit, static_argnums=(0, 1), static_argnames=("lowering",))
def backward_data(plan: ConvPlan, precision, b, w, bias=None, *, lowering=None):
    if lowering is None or not applicable(plan, lowering):
        lowering = choose_backward_data(plan)
    x = BACKWARD_DATA[lowering](plan, precision, b, w)
    return _finish(plan, x, bias, plan.channel_axis)


def _weights_direct(plan: ConvPlan, precision, a, b):
    data = _data_spec(plan)
    perm = plan.weights_perm
    eks = plan.effective_kernel
    swapped = (data[1], data[0], *data[2:])  # batch <-> feature: N is contracted
    padding = [(pb, (y - 1) * s + ek - x - pb)
               for x, y, s, ek, pb in zip(plan.a_spatial, plan.b_spatial, plan.strides, eks,
                                          plan.pads_begin)]
    w = _conv_general(
        a, b, window_strides=plan.dilations, padding=padding, rhs_dilation=plan.strides,
        # output "batch" = Ca/G (the weights' in axis), "feature" = Cb: the user's layout
        dimension_numbers=_dnums(swapped, swapped, (perm[1], perm[0], *perm[2:])),
        batch_group_count=plan.groups, precision=precision,
        preferred_element_type=plan.acc_dtype)
    return w


def _pad_large(plan: ConvPlan, a):
    """``a`` padded (or cropped) to the rows the taps read: ``(B-1)*s + ek`` per axis."""
    config = [(0, 0, 0)] * a.ndim
    for ax, sz, bs, s, ek, pb in zip(plan.spatial_axes, plan.a_spatial, plan.b_spatial,
                                     plan.strides, plan.effective_kernel, plan.pads_begin):
        config[ax] = (pb, (bs - 1) * s + ek - sz - pb, 0)
    return lax.pad(a, jnp.zeros((), a.dtype), config)


def _taps_to_layout(plan: ConvPlan, taps: dict):
    """Per-tap weights ``taps[k]`` (the user's layout, spatial sizes 1) -> the full kernel."""
    perm = plan.weights_perm
    order = list(itertools.product(*(range(k) for k in plan.kernel)))
    y = jnp.stack([taps[k] for k in order])
    y = y.reshape((*plan.kernel, *y.shape[1:]))      # [K.., user layout with unit spatial]
    nd = plan.ndim
    # the user's axis p comes from K axis i where perm[2 + i] == p, else from itself
    source = {perm[2 + i]: i for i in range(nd)}
    y = jnp.transpose(y, [source.get(p, nd + p) for p in range(nd + 2)] +
                      [nd + perm[2 + i] for i in range(nd)])
    return y.reshape(plan.weights_shape)


def _weights_phases(plan: ConvPlan, precision, a, b):
    """One convolution per phase of the large tensor, none with a dilated kernel.

    Tap ``k`` reads ``a`` at ``y*s + k*d`` (padded coordinates): all taps of phase
    ``r = k*d mod s`` read the sub-image ``a[r::s]`` at shifts ``m_k`` that are ``dd`` apart,
    so their weights are one stride-``dd`` correlation of that sub-image with ``b``
    (``direct``'s convolution with ``s = 1``). The phase results are then put in tap order.
    """
    data = _data_spec(plan)
    perm = plan.weights_perm
    swapped = (data[1], data[0], *data[2:])
    x = _pad_large(plan, a)
    axes = _phases(plan)
    taps = {}
    for r in itertools.product(*(range(p.s) for p in axes)):
        ks = [p.taps[ri] for p, ri in zip(axes, r)]
        if not all(ks):
            continue
        start, limit, strides = [0] * x.ndim, list(x.shape), [1] * x.ndim
        for ax, p, t, d, bs in zip(plan.spatial_axes, axes, ks, plan.dilations,
                                   plan.b_spatial):
            start[ax] = t[0] * d
            limit[ax] = start[ax] + (bs - 1 + (len(t) - 1) * p.dd) * p.s + 1
            strides[ax] = p.s
        sub = lax.slice(x, start, limit, strides)
        w = _conv_general(
            sub, b, window_strides=tuple(p.dd for p in axes), padding=[(0, 0)] * plan.ndim,
            dimension_numbers=_dnums(swapped, swapped, (perm[1], perm[0], *perm[2:])),
            batch_group_count=plan.groups, precision=precision,
            preferred_element_type=plan.acc_dtype)
        for js in itertools.product(*(range(len(t)) for t in ks)):
            s0, s1 = [0] * w.ndim, list(w.shape)
            for ax, j in zip(perm[2:], js):
                s0[ax], s1[ax] = j, j + 1
            taps[tuple(t[j] for t, j in zip(ks, js))] = lax.slice(w, s0, s1)
    return _taps_to_layout(plan, taps)


def _weights_depthwise(plan: ConvPlan, precision, a, b):
    """One channel of ``b`` per group: ``dW[g, i, k] = sum_{n,y} a_k[n, y, g, i] b[n, y, g]``
    per tap, an elementwise product and a sum over batch and rows (no contraction over
    channels to make a matrix product of), in the user's data layout."""
    del precision
    g, acc = plan.groups, plan.acc_dtype
    ca_g = plan.a_channels // g
    x = _pad_large(plan, a.astype(acc))
    c = plan.channel_axis
    y = b.astype(acc)
    split = (*y.shape[:c], g, ca_g, *y.shape[c + 1:])
    y = y.reshape((*y.shape[:c], g, 1, *y.shape[c + 1:]))
    keep = (c, c + 1)
    reduce = tuple(i for i in range(plan.ndim + 3) if i not in keep)
    taps = {}
    for k in itertools.product(*(range(k) for k in plan.kernel)):
        start, limit, strides = [0] * x.ndim, list(x.shape), [1] * x.ndim
        for ax, t, d, s, bs in zip(plan.spatial_axes, k, plan.dilations, plan.strides,
                                   plan.b_spatial):
            start[ax], limit[ax], strides[ax] = t * d, t * d + (bs - 1) * s + 1, s
        window = lax.slice(x, start, limit, strides).reshape(split)
        taps[k] = jnp.sum(window * y, axis=reduce)               # [G, Ca/G]
    order = list(itertools.product(*(range(k) for k in plan.kernel)))
    w = jnp.stack([taps[k] for k in order]).reshape((*plan.kernel, g, ca_g))
    w = jnp.moveaxis(w, (plan.ndim, plan.ndim + 1), (0, 1))     # canonical [Cb, Ca/G, K..]
    return jnp.transpose(w, plan.weights_inverse_perm)


def _weights_grouped(plan: ConvPlan, precision, a, b):
    """One ungrouped backward_weights per group (each by :func:`choose_backward_weights`),
    joined along the weights' ``Cb`` axis (XLA's ``batch_group_count`` is slow on CPU)."""
    g = plan.groups
    ca_g, cb_g = plan.a_channels // g, plan.b_channels // g
    sub = plan.with_(groups=1, a_channels=ca_g, b_channels=cb_g)
    inner = BACKWARD_WEIGHTS[choose_backward_weights(sub)]
    c = plan.channel_axis
    parts = [inner(sub, precision, lax.slice_in_dim(a, i * ca_g, (i + 1) * ca_g, axis=c),
                   lax.slice_in_dim(b, i * cb_g, (i + 1) * cb_g, axis=c)) for i in range(g)]
    return jnp.concatenate(parts, axis=plan.weights_perm[0])


BACKWARD_WEIGHTS = {"direct": _weights_direct, "phases": _weights_phases,
                    "depthwise": _weights_depthwise, "grouped": _weights_grouped}


def weights_applicable(plan: ConvPlan, lowering: str) -> bool:
    """Whether ``lowering`` can compute ``plan``'s backward_weights."""
    if lowering == "depthwise":
        return plan.b_channels == plan.groups
    if lowering == "grouped":
        return plan.groups > 1
    return lowering in BACKWARD_WEIGHTS


def choose_backward_weights(plan: ConvPlan) -> str:
    """The backward_weights lowering for a plan (measured on XLA CPU: module docstring).

    XLA CPU's ``batch_group_count`` convolution is a slow path (100x torch for 8 groups), so
    grouped plans are split per group (``grouped``), depthwise ones go elementwise
    (``depthwise``); strided 3-D plans use ``phases`` (XLA's 3-D weight gradient with a
    dilated kernel is 3x slower); everything else stays ``direct``, which XLA handles well in
    1-D and 2-D.
    """
    if plan.groups > 1:
        if plan.b_channels == plan.groups:
            return "depthwise"
        return "grouped" if plan.groups <= 32 else "direct"
    if plan.ndim >= 3 and any(s > 1 for s in plan.strides):
        return "phases"
    return "direct"


@functools.partial(jax.jit, static_argnums=(0, 1), static_argnames=("lowering",))
def backward_weights(plan: ConvPlan, precision, a, b, *, lowering=None):
    if plan.batch == 0:  # nothing to contract: XLA would form a degenerate convolution
        return jnp.zeros(plan.weights_shape, plan.dtype)
    if lowering is None or not weights_applicable(plan, lowering):
        lowering = choose_backward_weights(plan)
    return BACKWARD_WEIGHTS[lowering](plan, precision, a, b).astype(plan.dtype)


# --------------------------------------------------------------------------------------------
# forcing a lowering (tests, benchmarks)
# --------------------------------------------------------------------------------------------

#: every lowering per primitive; the first is the plain one-convolution lowering
LOWERINGS = {"forward": ("direct",), "backward_data": tuple(BACKWARD_DATA),
             "backward_weights": tuple(BACKWARD_WEIGHTS)}
ENV_VAR = "POLYCONV_JAX_LOWERING"
_FORCED: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "polyconv_jax_forced_lowering", default=None)


def _check_forced(where: str, forced: dict[str, str]) -> dict[str, str]:
    for primitive, name in forced.items():
        if primitive not in LOWERINGS or name not in LOWERINGS[primitive]:
            choices = "; ".join(f"{p}: {', '.join(names)}" for p, names in LOWERINGS.items())
            msg = f"{where}: unknown lowering {primitive}={name!r}; the lowerings are {choices}"
            raise ValueError(msg)
    return forced


@contextlib.contextmanager
def force_lowering(**by_primitive: str | None):
    """Within the block, trace the JAX backend's primitives with the named lowerings.

    For tests and benchmarks, e.g. ``force_lowering(backward_data="phases")``; the names are
    in :data:`LOWERINGS`. A lowering that cannot compute a plan (``elementwise`` with more than
    8 input channels per group, ``grouped`` or the weights' ``depthwise`` on other plans) falls
    back to the default choice. The setting is read when a polyconv op is *traced*: a function
    that was already jitted keeps the lowering it was compiled with. It overrides the
    environment variable ``POLYCONV_JAX_LOWERING`` (same names, e.g.
    ``backward_data=phases,backward_weights=direct``), which is read per call.
    """
    forced = _check_forced("force_lowering",
                           {k: v for k, v in by_primitive.items() if v is not None})
    token = _FORCED.set(forced)
    try:
        yield
    finally:
        _FORCED.reset(token)


def requested(primitive: str) -> str | None:
    """The lowering forced for ``primitive`` (context, then environment), or ``None``."""
    forced = _FORCED.get()
    if forced is None:
        text = os.environ.get(ENV_VAR, "").strip()
        forced = {}
        for item in filter(None, (t.strip() for t in text.split(","))):
            key, _, name = item.partition("=")
            forced[key.strip()] = name.strip()
        forced = _check_forced(ENV_VAR, forced)
    return forced.get(primitive)


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
