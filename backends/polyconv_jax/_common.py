"""What the lowerings share: the rows of the input each kernel tap reads (padding, in-place
slices), the channels of one elementwise term, sums by kernel row, and the phases of a strided
axis (their outputs interleaved and cropped). Every family module builds on these and
:mod:`._xla`; nothing here knows a lowering."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from polyconv import ConvPlan
from polyconv._phases import AxisPhases
from polyconv._phases import phases as plan_phases

from ._xla import _merge, add_all, rearranged_once


def read_pads(plan: ConvPlan) -> list[tuple[int, int]]:
    """Per spatial axis, the zeros before and after ``a`` that make it the rows the taps read,
    ``(B-1)*s + ek``: ``(pb, (B-1)*s + ek - A - pb)`` (the second negative where the last
    rows of ``a`` are read by no tap)."""
    return [(pb, (bs - 1) * s + ek - sz - pb) for sz, bs, s, ek, pb in zip(
        plan.a_spatial, plan.b_spatial, plan.strides, plan.effective_kernel, plan.pads_begin)]


def pad_large(plan: ConvPlan, a):
    """``a`` padded (or cropped) to the rows the taps read: ``(B-1)*s + ek`` per axis."""
    config = [(0, 0, 0)] * a.ndim
    for ax, pads in zip(plan.spatial_axes, read_pads(plan)):
        config[ax] = (*pads, 0)
    return lax.pad(a, jnp.zeros((), a.dtype), config)


def tap_window(plan: ConvPlan, x, tap, axes=None):
    """The rows of padded ``x`` (:func:`pad_large`) that tap ``tap`` reads for every output
    row: start ``k*d``, stride ``s``, ``B`` rows, on ``axes`` (default: the spatial axes)."""
    start, limit, strides = [0] * x.ndim, list(x.shape), [1] * x.ndim
    for ax, t, d, s, bs in zip(axes or plan.spatial_axes, tap, plan.dilations, plan.strides,
                               plan.b_spatial):
        start[ax], limit[ax], strides[ax] = t * d, t * d + (bs - 1) * s + 1, s
    return lax.slice(x, start, limit, strides)


def reads_past_end(plan: ConvPlan) -> bool:
    """Whether the last window of some tap reaches past the end of ``a`` (into ``pads_end``
    on some axis): ``(B-1)*s + ek - pb > A``."""
    return any(after > 0 for _, after in read_pads(plan))


def windows(plan: ConvPlan, a) -> Callable[[tuple[int, ...]], Any]:
    """``tap -> `` the rows of ``a`` that tap reads for every output row, zeros where they
    fall in the padding: :func:`tap_window` of :func:`pad_large`'s copy of ``a``.

    Where no tap reads past the end of ``a`` (:func:`reads_past_end`; padding at the start
    only, or none), each window is a strided slice of ``a`` itself with its leading zeros
    padded on, which XLA CPU computes inside the loop that reads it; the padded copy is a pass
    of its own over the whole tensor. MobileNetV2's strided 3x3 depthwise forward (8x112x112,
    96 channels, 2 CPUs): 2.1-2.4 ms against 5.4-6.1. Zeros padded at the end inside the loop
    ran 2-4x slower than the copy (3x3 and 7x7 kernels, strides 1 and 2), so that case keeps
    the copy. Measured on CPU only: other platforms keep the copy, and their programs stay the
    ones measured there (the platform is ``jax.default_backend()``'s when the call is traced,
    as for the lowering choice)."""
    if reads_past_end(plan) or jax.default_backend() != "cpu":
        x = pad_large(plan, a)
        return partial(tap_window, plan, x)
    return partial(_window_in_place, plan, a)


def _window_in_place(plan: ConvPlan, a, tap):
    """:func:`windows` where no tap reads past the end: a strided slice of ``a`` from the
    first output row whose read is inside ``a``, zeros padded before it."""
    start, limit, strides = [0] * a.ndim, list(a.shape), [1] * a.ndim
    low = [(0, 0, 0)] * a.ndim
    for ax, t, d, s, bs, pb in zip(plan.spatial_axes, tap, plan.dilations, plan.strides,
                                   plan.b_spatial, plan.pads_begin):
        first = max(0, -((t * d - pb) // s))     # rows before it read the padding
        if first >= bs:                          # every row reads the padding
            shape = list(a.shape)
            for ax2, bs2 in zip(plan.spatial_axes, plan.b_spatial):
                shape[ax2] = bs2
            return jnp.zeros(shape, a.dtype)
        start[ax] = first * s + t * d - pb
        limit[ax], strides[ax] = start[ax] + (bs - first - 1) * s + 1, s
        low[ax] = (first, 0, 0)
    return lax.pad(lax.slice(a, start, limit, strides), jnp.zeros((), a.dtype), low)


def group_channels(plan: ConvPlan, x, i: int, per_group: int, repeat: int):
    """Channel ``i`` of every group of ``x`` (groups of ``per_group`` channels), each repeated
    ``repeat`` times in place: the operand of one elementwise term, with as many channels as
    its result. (A strided slice, not a split into ``(G, per_group)`` axes: such a split
    leaves a unit minor axis for channels-last data, and XLA CPU's fused loop then runs
    unvectorized, 3x slower.)"""
    c = plan.channel_axis
    if per_group > 1:
        x = lax.slice_in_dim(x, i, x.shape[c], per_group, axis=c)
    return jnp.repeat(x, repeat, axis=c) if repeat > 1 else x


def channel_vector(plan: ConvPlan, v):
    """A vector over channels shaped to broadcast along the data's channel axis."""
    return v if plan.channels_last else v.reshape((-1,) + (1,) * plan.ndim)


def taps_first(plan: ConvPlan, w, per_b_channel: bool = False):
    """The weights in the accumulation dtype as ``[K.., Ca/G, Cb]`` (one tap's weights for
    one ``a`` channel of each group, a run over ``Cb``: what forward's terms multiply), or
    with ``per_b_channel`` as ``[K.., Cb/G, Ca]`` (one ``b`` channel of each group, a run
    over ``Ca``: backward_data's). Either way the run one elementwise term reads is
    contiguous and :func:`rearranged_once`, which keeps the term's fused loop vectorized."""
    k = tuple(range(2, plan.ndim + 2))
    g = plan.groups

    def rearrange(v):
        v = v.transpose(plan.weights_perm)                              # [Cb, Ca/G, K..]
        if not per_b_channel:
            return v.transpose((*k, 1, 0))
        v = v.reshape((g, plan.b_channels // g, *v.shape[1:]))         # [G, Cb/G, Ca/G, K..]
        v = v.transpose((*(a + 1 for a in k), 1, 0, 2))                # [K.., Cb/G, G, Ca/G]
        return v.reshape((*plan.kernel, plan.b_channels // g, plan.a_channels))

    return rearranged_once(w, rearrange).astype(plan.acc_dtype)


def sum_by_first_tap(terms):
    """The sum of ``(tap, term)`` pairs, each run of equal first tap index summed first (a
    kernel row at a time: fewer rounding steps in long sums, and faster fused loops)."""
    return add_all(add_all(term for _, term in run)
                   for _, run in itertools.groupby(terms, key=lambda pair: pair[0][0]))


def _phases(plan: ConvPlan) -> tuple[AxisPhases, ...]:
    """Per spatial axis, the phase geometry of the plan (polyconv._phases, cached there).

    In padded coordinates ``X = x + pb`` the product of ``b[y]`` and tap ``k`` lands at
    ``X = y*s + k*d``. Write ``X = q*s + r``: row ``q`` of phase ``r`` receives exactly the
    taps of phase ``r``, each from ``y = q - shift_k``. Rows ``q`` in ``[q_lo, q_lo + rows)``
    of every phase, interleaved, cover the padded range ``[q_lo*s, (q_lo + rows)*s)``, which
    contains the output ``[pb, pb + A)``; the output starts ``crop`` rows in.
    """
    return plan_phases(plan).axes


def _interleave(plan: ConvPlan, axes: tuple[AxisPhases, ...], parts: dict,
                group_major: bool = False):
    """Interleave the phase outputs (``parts[r]``, rows ``q_lo..``) and crop to ``A``.

    ``parts[r]`` is in the user's data layout, or ``[G, N, R.., Ca/G]`` with
    ``group_major``. All phases are stacked once and one transpose puts phase ``r_i`` right
    after spatial axis ``i`` (row ``q*s + r``), so XLA copies the output once (stack and
    transpose fuse), then the padded range is cropped to the output rows.
    """
    nd = plan.ndim
    steps = tuple(p.stride for p in axes)
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


def _crop(plan: ConvPlan, axes: tuple[AxisPhases, ...], y):
    start, limit = [0] * y.ndim, list(y.shape)
    for ax, p in zip(plan.spatial_axes, axes):
        start[ax], limit[ax] = p.crop, p.crop + p.size
    if tuple(start) == (0,) * y.ndim and tuple(limit) == y.shape:
        return y
    return lax.slice(y, start, limit)


def _phase_shape(plan: ConvPlan, axes: tuple[AxisPhases, ...]) -> tuple[int, ...]:
    rows = tuple(p.rows for p in axes)
    if plan.channels_last:
        return (plan.batch, *rows, plan.a_channels)
    return (plan.batch, plan.a_channels, *rows)
