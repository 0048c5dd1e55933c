"""Depthwise convolutions by windows: blocks of output lines over a padded copy of what they
read.

``b[n, y.., c] = sum_k a[n, y*s + k*d - pb, c] * W[c, k]`` with one input and one output
channel per group. The output is cut into blocks of lines along its first spatial axis (a few
hundred KB each). For each block the input lines its taps read are copied, zero-padded on
every spatial axis and in the accumulation dtype, into a buffer that stays in cache; the taps'
windows of that buffer are one strided view ``[lines, B.., K.., C]``, and one ``np.einsum``
multiplies and sums them into the block. Nothing the size of the input is ever padded, split
into phases or gathered, so the data crosses memory once; the blocks run on threads (einsum
releases the GIL). The weight gradient sums the same views against the block's lines of ``b``
(per thread, added up at the end); backward_data runs phase by phase of ``a``, each phase a
forward convolution of ``b`` with its taps (:func:`polyconv._phases.adjoint_phases`) written
into its strided positions of ``a``: with a stride, each phase's few taps are summed one by
one (a multiply by the tap's weights tiled along a line, and an add), in blocks of a whole
image, into a contiguous buffer copied into place.

Against the phase grid on MobileNetV2's strided 3x3 layer (8x112x112x96, 2-CPU x86-64,
float32): forward 2.1x faster, weight gradient 1.8x, backward_data 1.8-2.2x (by einsum over
each phase's 1-4 taps it ran 1.1-1.3x slower than the grid); on its stride-1 layer and
ConvNeXt-T's 7x7 one 1.1-1.8x for all three primitives.
"""

from __future__ import annotations

import math
import string
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from polyconv._geometry import ConvPlan
from polyconv._phases import adjoint_phases

from . import _depthwise
from ._common import (
    add_bias,
    canonical_weights,
    dtypes,
    in_range,
    moveaxis,
    split_rows,
    to_user_layout,
)
from ._costs import FILL_S, Sizes, sizes, strategy

_BLOCK_BYTES = 1 << 18      # output values of one block (with its buffer, stays in cache)
#: ... of one block of a strided backward_data's phase, summed tap by tap (:func:`_tap_sums`:
#: two numpy calls per tap and block, so blocks of a whole image or more)
_TAP_BLOCK_BYTES = 1 << 21
_TAP_SPLIT_MIN_VALUES = 1 << 20     # values of taps from which its blocks run on threads
_TILE_VALUES = 1024         # values per einsum inner loop, at most (:meth:`_Windows.tile`)


class _Windows:
    """One call's blocks of lines of ``b``, each over a zero-padded buffer of the lines of
    ``a`` that its taps read; where ``a``'s in-range rows lie on that buffer along every axis
    but the first (the rest stays zero)."""

    def __init__(self, plan: ConvPlan, a: np.ndarray, acc: np.dtype,
                 block_bytes: int = _BLOCK_BYTES):
        self.plan, self.a, self.acc, c, nd = plan, a, acc, plan.a_channels, plan.ndim
        self.lines, self.per_line = plan.b_spatial[0], math.prod(plan.b_spatial[1:])
        self.per_block = max(1, min(self.lines,
                                    block_bytes // max(self.per_line * c * acc.itemsize, 1)))
        # every axis's extent on the buffer: the rows its taps read, (B-1)*s + ek
        extent = [(bs - 1) * s + ek for bs, s, ek in
                  zip(plan.b_spatial, plan.strides, plan.effective_kernel)]
        self.buffer_shape = ((self.per_block - 1) * plan.strides[0] + plan.effective_kernel[0],
                             *extent[1:], c)
        inner = [in_range(-plan.pads_begin[ax], plan.a_spatial[ax], extent[ax])
                 for ax in range(1, nd)]
        self.inner, self.source = [d for d, _ in inner], [s for _, s in inner]
        letters = string.ascii_lowercase[: 2 * nd]
        self.spec = f"{letters}z,{letters[nd:]}z->{letters[:nd]}z"      # taps x weights
        self.grad_spec = f"{letters}z,{letters[:nd]}z->{letters[nd:]}z"  # taps x b

    def tile(self) -> int:
        """Positions of the last axis of ``b`` merged with the channels into one run of the
        views (:meth:`windows`): the largest divisor of that axis with at most
        :data:`_TILE_VALUES` values, where its stride is 1 (the run is then contiguous in the
        buffer); else 1. einsum's inner loops then run over hundreds of values instead of
        ``C``: 1.7-1.9x faster on 96-144 channels, 4x on 32."""
        plan, last = self.plan, self.plan.b_spatial[-1]
        if plan.ndim < 2 or plan.strides[-1] != 1:
            return 1
        return max((r for r in range(1, max(last, 1) + 1)
                    if last % r == 0 and r * plan.a_channels <= _TILE_VALUES), default=1)

    def windows(self, buf: np.ndarray, n: int, y0: int, y1: int, r: int = 1) -> np.ndarray:
        """The taps' windows for lines ``y0:y1`` of image ``n`` of ``b``: ``[lines, B.., K..,
        C]``, a view of ``buf`` filled with the lines of ``a`` they read; with ``r`` > 1
        (:meth:`tile`), ``[lines, B.., B_last/r, K.., r*C]``."""
        plan = self.plan
        r0 = y0 * plan.strides[0] - plan.pads_begin[0]          # first line of a read
        rows = (y1 - y0 - 1) * plan.strides[0] + plan.effective_kernel[0]
        dst, src = in_range(r0, plan.a_spatial[0], rows)
        part = buf[:rows]
        part[: dst.start] = 0
        part[dst.stop:] = 0
        part[(dst, *self.inner)] = self.a[(n, src, *self.source)]
        st, steps = part.strides, list(plan.strides)
        steps[-1] *= r
        return as_strided(part, (y1 - y0, *plan.b_spatial[1:-1], plan.b_spatial[-1] // r,
                                 *plan.kernel, r * plan.a_channels)
                          if plan.ndim > 1 else (y1 - y0, *plan.kernel, plan.a_channels),
                          (*(s * st[i] for i, s in enumerate(steps)),
                           *(d * st[i] for i, d in enumerate(plan.dilations)), st[-1]),
                          writeable=False)

    def blocks(self, lo: int, hi: int):
        """``(image, first line, end line)`` of the blocks that cover positions ``lo:hi`` of
        ``b`` (as the whole lines they begin), and one buffer for them all."""
        buf = np.zeros(self.buffer_shape, dtype=self.acc)
        j, last = lo // self.per_line, hi // self.per_line
        while j < last:
            n, y0 = divmod(j, self.lines)
            y1 = min(self.lines, y0 + self.per_block, y0 + last - j)
            yield buf, n, y0, y1
            j += y1 - y0

    def split(self, work, min_values: int | None = None) -> list:
        """``work(lo, hi)`` over the positions of ``b``, on threads as for the grid's sums
        (from ``min_values`` values of taps, by default the grid's)."""
        positions = self.plan.batch * math.prod(self.plan.b_spatial)
        values = positions * math.prod(self.plan.kernel) * self.plan.a_channels
        if values >= (_depthwise.SPLIT_MIN_VALUES if min_values is None else min_values):
            return split_rows(positions, work,
                              min_rows=None if min_values is None else self.per_line)
        return [work(0, positions)] if values else []


def applies(plan: ConvPlan, primitive: str) -> bool:
    """One input and one output channel per group (depthwise), channels-last data."""
    del primitive       # every primitive
    return (plan.groups > 1 and plan.a_channels == plan.groups == plan.b_channels
            and plan.channels_last)


def as_forward(plan: ConvPlan) -> ConvPlan | None:
    """The forward plan an unstrided depthwise backward_data on channels-last data is: one
    forward convolution of ``b`` (:func:`backward_data`), whichever strategy computes it, so
    every strategy prices it as that forward; ``None`` for any other plan."""
    if applies(plan, "backward_data") and all(s == 1 for s in plan.strides):
        return adjoint_phases(plan)[0].plan
    return None


def _taps_by_channel(plan: ConvPlan, w: Any, acc: np.dtype) -> np.ndarray:
    """The depthwise weights as ``[K.., C]``: tap-major, channel-minor."""
    return np.ascontiguousarray(moveaxis(canonical_weights(w, plan, acc)[:, 0], 0, -1))


def _sums(plan: ConvPlan, a: np.ndarray, wk: np.ndarray, out: np.ndarray) -> None:
    """``out`` (``b`` of ``plan``, channels-last) = the forward sums of ``a`` with the weights
    ``wk`` ``[K.., C]``. A strided ``out`` (a phase of backward_data's ``a``) gets each block
    summed into a contiguous, cache-sized buffer first and copied into place: einsum then runs
    its merged runs (:meth:`_Windows.tile`) instead of ``C`` values at a time."""
    win = _Windows(plan, a, out.dtype)
    r = win.tile()
    wt = np.ascontiguousarray(np.broadcast_to(wk[..., None, :], (*wk.shape[:-1], r, wk.shape[-1]))
                              ).reshape(*wk.shape[:-1], r * wk.shape[-1])   # [K.., r*C]
    direct = out.flags.c_contiguous

    def work(lo: int, hi: int) -> None:
        tmp = None if direct else np.empty((win.per_block, *out.shape[2:]), dtype=out.dtype)
        for buf, n, y0, y1 in win.blocks(lo, hi):
            o = out[n, y0:y1] if direct else tmp[: y1 - y0]
            tiled = o.reshape(*o.shape[:-2], -1, r * o.shape[-1]) if r > 1 else o
            np.einsum(win.spec, win.windows(buf, n, y0, y1, r), wt, out=tiled)
            if not direct:
                out[n, y0:y1] = o

    win.split(work)


def _tap_sums(plan: ConvPlan, a: np.ndarray, wk: np.ndarray, out: np.ndarray) -> None:
    """:func:`_sums` tap by tap: per block, each tap's window (a run of the last axis's
    positions and the channels, contiguous in the buffer) times the tap's weights tiled along
    that run, added up in a contiguous buffer copied into ``out`` (a strided phase of ``a``).
    One multiply and one add per tap: for the few taps of a strided backward_data's phases,
    where einsum's loops over 1-4 taps cost more than the sums (MobileNetV2's 3x3 stride-2
    layer, 2 CPUs: 14 ms against 34 by einsum and 27-37 on the grid)."""
    win = _Windows(plan, a, out.dtype, _TAP_BLOCK_BYTES)
    taps, run = list(np.ndindex(*plan.kernel)), plan.b_spatial[-1] if plan.ndim > 1 else 1
    tables = [np.tile(wk[k], run) for k in taps]                  # [run * C] per tap
    inner = (*plan.b_spatial[1:-1], run * plan.a_channels)        # a block's line, merged
    full = (slice(None),) * plan.ndim

    def work(lo: int, hi: int) -> None:
        sums = np.empty((win.per_block, *inner), dtype=out.dtype)
        scratch = np.empty_like(sums)
        for buf, n, y0, y1 in win.blocks(lo, hi):
            views, o, tmp = win.windows(buf, n, y0, y1), sums[: y1 - y0], scratch[: y1 - y0]
            for t, k in enumerate(taps):
                view = views[(*full, *k)].reshape(o.shape)
                if t == 0:
                    np.multiply(view, tables[t], out=o)
                else:
                    np.multiply(view, tables[t], out=tmp)
                    o += tmp
            out[n, y0:y1] = o.reshape(out[n, y0:y1].shape)

    win.split(work, _TAP_SPLIT_MIN_VALUES)


def forward(plan: ConvPlan, a: Any, w: Any, bias: Any = None) -> np.ndarray:
    out_dtype, acc = dtypes(a, plan)
    b = np.empty((plan.batch, *plan.b_spatial, plan.b_channels), dtype=acc)
    _sums(plan, np.asarray(a), _taps_by_channel(plan, w, acc), b)
    add_bias(b, bias)
    return to_user_layout(b, plan, out_dtype)


def backward_data(plan: ConvPlan, b: Any, w: Any, bias: Any = None) -> np.ndarray:
    """Phase by phase of ``a``, each a forward convolution of ``b`` with the phase's taps
    (:func:`polyconv._phases.adjoint_phases`), written into its strided positions of ``a``
    (one phase with strides of 1: the flipped kernel, by einsum; with a stride, the phases'
    few taps one by one, :func:`_tap_sums`)."""
    out_dtype, acc = dtypes(b, plan)
    wk, b = _taps_by_channel(plan, w, acc), np.asarray(b)
    a = np.empty((plan.batch, *plan.a_spatial, plan.a_channels), dtype=acc)
    sums = _tap_sums if any(s > 1 for s in plan.strides) else _sums
    for phase in adjoint_phases(plan):
        cells = a[(slice(None), *phase.a_index)]
        if phase.plan is None:
            cells[...] = 0          # no tap reaches these positions
        else:
            sums(phase.plan, b, wk[np.ix_(*phase.taps)], cells)
    add_bias(a, bias)
    return to_user_layout(a, plan, out_dtype)


def backward_weights(plan: ConvPlan, a: Any, b: Any) -> np.ndarray:
    out_dtype, acc = dtypes(a, plan)
    win = _Windows(plan, np.asarray(a), acc)
    b = np.asarray(b)

    def work(lo: int, hi: int) -> np.ndarray:
        dw = np.zeros((*plan.kernel, plan.b_channels), dtype=acc)
        for buf, n, y0, y1 in win.blocks(lo, hi):
            rows = b[n, y0:y1].astype(acc, copy=False)
            dw += np.einsum(win.grad_spec, win.windows(buf, n, y0, y1), rows)
        return dw

    dw = sum(win.split(work), np.zeros((*plan.kernel, plan.b_channels), dtype=acc))
    canon = moveaxis(dw, -1, 0)[:, None]                  # [Cb, 1, K..]
    return np.ascontiguousarray(np.transpose(canon, plan.weights_inverse_perm),
                                dtype=out_dtype)


# --- the records: the windows' einsums per output value and tap, the padded copy -------------

#: forward and backward_weights, per element: the einsum per output value and tap (on all
#: CPUs), and the padded copy per input value
WINDOW_TAP_S = 0.06e-9
WINDOW_GRAD_TAP_S = 0.1e-9
WINDOW_COPY_S = 0.34e-9
#: a strided backward_data, phase by phase and tap by tap: a multiply and an add of runs of a
#: line's positions and channels, per value of ``b`` and tap ...
WINDOW_BD_TAP_S = 0.15e-9
#: ... offered where a line of ``b`` holds this many values (shorter runs lose to the grid)
WINDOW_BD_MIN_RUN = 4096


def _price(primitive: str, plan: ConvPlan, z: Sizes) -> float:
    if primitive == "backward_data" and (adjoint := as_forward(plan)) is not None:
        return _price("forward", adjoint, sizes(adjoint))
    if primitive == "backward_data":
        if plan.b_spatial[-1] * z.cb < WINDOW_BD_MIN_RUN:
            return math.inf
        return z.item * (z.mb * z.t * z.cb * WINDOW_BD_TAP_S + z.ma * z.ca * FILL_S)
    tap = WINDOW_TAP_S if primitive == "forward" else WINDOW_GRAD_TAP_S
    return z.item * (z.mb * z.t * z.cb * tap + z.ma * z.ca * WINDOW_COPY_S)


STRATEGIES = tuple(strategy("window", p, run, _price, applies)
                   for p, run in (("forward", forward), ("backward_data", backward_data),
                                  ("backward_weights", backward_weights)))
