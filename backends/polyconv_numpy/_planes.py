"""Depthwise convolutions on channels-first data, plane by plane: no change of layout.

With one input and one output channel per group, each ``(n, c)`` plane of a channels-first
tensor is convolved with its channel's kernel alone. The planes are read in place (a
``[N*C, X..]`` view of the user's array) and written in place, where every other strategy
moves the channels last and back: two passes over each tensor that, on CenterNet's
depthwise up-sampling (4x64x64x64 into 4x64x128x128), cost more than the sums themselves.

Per block of planes (:data:`_BLOCK_BYTES`, on threads), everything is a contiguous run:

* a strided axis is split into its phases (:mod:`polyconv._phases`): each phase a
  zero-padded buffer on which every tap of that phase reads a shifted copy of the output's
  positions. Laid out with the buffer's extents on every axis but the first, a tap's window
  is one contiguous run of the flattened buffer (``length`` values from its offset), so each
  tap is one multiply by the plane's weight and one add over the whole block, long runs that
  numpy vectorizes, instead of a loop of short lines; the positions past the output's extent
  on the inner axes are computed and dropped when the block is cropped into place.
* ``forward``: the sum over the taps of their runs of ``a``'s phases, cropped into ``b``;
  ``backward_data``: per phase of ``a``, the sum over the phase's taps of runs of one padded
  copy of ``b`` (cell ``q`` of the phase receives ``b[q - shift]``), or whole lines of ``a``
  at once where its last axis is strided 3 or more (:func:`_backward_data_periodic`);
  ``backward_weights``: per tap, the dot product of its run with ``b`` laid out on the same
  extents (zeros where positions are dropped), per plane, then summed over the batch.

Padding is zeros in the buffers, so a non-finite weight would meet them (``0 * inf``): the
backend hands non-finite inputs to its exact path. Accumulation is in float32 (float64 for
float64 inputs), with the bias added before the one rounding to the output dtype.

Against the grid on CenterNet's NCX depthwise ConvTranspose k4 s2 (2-CPU x86-64, float32):
its forward 27.6 -> 10.8 ms, its two backward ops 37.0 -> 8.8 and 38.4 -> 11.8 ms
(docs/design_notes.md, numpy strategies). The grid's einsums over channels-last copies stay
ahead with many taps on small planes (a Conformer's 1-D k31): the cost model and the first
call's measurement choose.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from polyconv._geometry import ConvPlan
from polyconv._phases import phases

from ._common import canonical_weights, dtypes, row_strides, split_rows
from ._costs import Sizes, strategy

#: bytes of one block's buffers (phases or padded ``b``, sums, scratch). Large: numpy's calls
#: release the GIL for one call's loop only, and two threads on calls of a few tens of
#: thousands of values contend for it (CenterNet's k4 s2 on 2 CPUs: 36 ms in 256 KB blocks,
#: 20 in 512 KB, 7.3 in 2 MB, 6.0 in 4 MB; 10.7 on one thread)
_BLOCK_BYTES = 1 << 22
#: values per inner loop of a multiply by a line of weights (backward_data's periodic form),
#: whose tables of weights hold at most a quarter of the output's values
TILE_VALUES = 2048
#: values (planes x taps x positions) from which a call is split over threads
SPLIT_MIN_VALUES = 1 << 20
#: backward_data with a last axis strided this much or more sums whole lines of it, with
#: periodic weights, rather than interleave its phases (2-CPU x86-64, float32, 4x64 planes:
#: CenterNet's k8 s4 12.6-13.6 ms against 20.5-21.8, k4 s4 5.5-6.1 against 9.3-10.1, k6 s3
#: 10.8-12.3 against 17.8-18.3; k3 s3 ties; with a stride of 2 the phases win: k4 s2 7.7
#: against 10.1-10.8, MobileNetV2's k3 s2 12-13 against 20-21)
PERIODIC_MIN_STRIDE = 3


def applies(plan: ConvPlan, primitive: str | None = None) -> bool:
    """One input and one output channel per group (depthwise), channels-first data."""
    del primitive       # every primitive
    return (plan.groups > 1 and plan.a_channels == plan.groups == plan.b_channels
            and not plan.channels_last)


def _planes(x: Any, spatial: tuple[int, ...]) -> np.ndarray:
    """``[N, C, X..]`` as ``[N*C, X..]``: a view where the array is C-contiguous."""
    return np.ascontiguousarray(x).reshape(-1, *spatial)


def _sum_of_products(out: np.ndarray, tmp: np.ndarray, terms) -> None:
    """``out = sum(run * weight for run, weight in terms)``, each product written into
    ``out`` (the first) or the scratch ``tmp`` and added (numpy has no fused multiply-add);
    the weights broadcast against the runs."""
    for i, (run, weight) in enumerate(terms):
        np.multiply(run, weight, out=tmp if i else out)
        if i:
            out += tmp


class _Runs:
    """Sums over the taps of runs of one buffer of extent ``extent`` per plane, onto output
    positions ``counts`` laid out with that buffer's strides (``[counts[0], *extent[1:]]``):
    tap ``t`` reads the run from ``offsets[t]``, ``length`` values."""

    def __init__(self, counts: tuple[int, ...], extent: tuple[int, ...]):
        self.counts, self.extent, self.strides = counts, extent, row_strides(extent)
        self.layout = (counts[0], *extent[1:])
        self.size = math.prod(self.layout)
        self.length = sum((c - 1) * s for c, s in zip(counts, self.strides)) + 1

    def offset(self, start: tuple[int, ...]) -> int:
        return sum(i * s for i, s in zip(start, self.strides))

    def crop(self, flat: np.ndarray) -> np.ndarray:
        """``[n, size]`` laid out on the buffer's extents -> the ``[n, *counts]`` positions."""
        view = flat.reshape(flat.shape[0], *self.layout)
        return view[(slice(None), *(slice(0, c) for c in self.counts))]

    def sums(self, sources: list[np.ndarray], offsets: list[int], weights: np.ndarray,
             out: np.ndarray, tmp: np.ndarray) -> None:
        """``out[:, :length] = sum_t sources[t][:, offsets[t]:][:, :length] * weights[t][:, None]``
        (``sources``: flattened ``[n, ...]`` buffers; ``weights``: ``[T, n]``)."""
        _sum_of_products(out[:, : self.length], tmp[:, : self.length],
                         ((src[:, off: off + self.length], wt[:, None])
                          for src, off, wt in zip(sources, offsets, weights)))


def _block(plane_values: int, itemsize: int) -> int:
    """Planes per block: :data:`_BLOCK_BYTES` of buffers, at least one plane."""
    return max(1, _BLOCK_BYTES // max(plane_values * itemsize, 1))


def _split(planes: int, block: int, values: int, work) -> list:
    """``work(lo, hi)`` over ranges of planes, on threads where the call is large enough."""
    per_plane = max(1, values // max(planes, 1))
    return split_rows(planes, work, min_rows=max(block, -(-SPLIT_MIN_VALUES // per_plane)))


class _Phases:
    """The phases of ``a`` that the taps read, as zero-padded buffers of extent
    ``B + max_shift`` per axis: cell ``u`` of phase ``r`` holds ``a[u*s + r - pb]``."""

    def __init__(self, plan: ConvPlan):
        ph = phases(plan)
        self.extent = tuple(ax.small + ax.max_shift for ax in ph.axes)
        self.runs = _Runs(plan.b_spatial, self.extent)
        self.used = sorted({tap.phase for tap in ph.taps})
        # per tap: its phase's buffer and the offset of its run
        self.tap_phase = [self.used.index(tap.phase) for tap in ph.taps]
        self.tap_offset = [self.runs.offset(tap.shift) for tap in ph.taps]
        self.fills = [ph.phase_window(r, self.extent) for r in self.used]
        self.values = len(self.used) * math.prod(self.extent)

    def buffers(self, block: int, acc: np.dtype) -> list[np.ndarray]:
        """One thread's buffers (zeros: a block writes only in-range cells, the rest stays)."""
        return [np.zeros((block, *self.extent), dtype=acc) for _ in self.used]

    def fill(self, bufs: list[np.ndarray], a: np.ndarray, p0: int, n: int) -> list[np.ndarray]:
        """Copy planes ``p0 .. p0+n`` of ``a`` into their phases; the flattened buffers."""
        for buf, fill in zip(bufs, self.fills):
            if fill is not None:
                cells, positions = fill
                buf[(slice(0, n), *cells)] = a[(slice(p0, p0 + n), *positions)]
        return [buf[:n].reshape(n, -1) for buf in bufs]


def _plane_weights(plan: ConvPlan, w: Any, acc: np.dtype) -> np.ndarray:
    """``[T, N*C]``: each tap's weight per plane (the channel's weight, repeated per image)."""
    wc = canonical_weights(w, plan, acc).reshape(plan.b_channels, -1)       # [C, T]
    return np.ascontiguousarray(np.tile(wc.T, (1, plan.batch)))


def _bias(plan: ConvPlan, bias: Any, acc: np.dtype) -> np.ndarray | None:
    if bias is None:
        return None
    return np.tile(np.asarray(bias).astype(acc, copy=False), plan.batch)


def forward(plan: ConvPlan, a: Any, w: Any, bias: Any = None) -> np.ndarray:
    out_dtype, acc = dtypes(a, plan)
    src = _planes(a, plan.a_spatial)
    planes = src.shape[0]
    ph = _Phases(plan)
    runs = ph.runs
    wp, bp = _plane_weights(plan, w, acc), _bias(plan, bias, acc)
    b = np.empty((plan.batch, plan.b_channels, *plan.b_spatial), dtype=out_dtype)
    dst = b.reshape(planes, *plan.b_spatial)
    block = _block(ph.values + 2 * runs.size, acc.itemsize)

    def work(lo: int, hi: int) -> None:
        bufs = ph.buffers(min(block, hi - lo), acc)
        out = np.empty((len(bufs[0]), runs.size), dtype=acc)
        tmp = np.empty_like(out)
        for p0 in range(lo, hi, block):
            n = min(block, hi - p0)
            flat = ph.fill(bufs, src, p0, n)
            o = out[:n]
            runs.sums([flat[i] for i in ph.tap_phase], ph.tap_offset, wp[:, p0: p0 + n], o,
                      tmp[:n])
            if bp is not None:
                o[:, : runs.length] += bp[p0: p0 + n, None]
            dst[p0: p0 + n] = runs.crop(o)

    _split(planes, block, len(ph.tap_phase) * runs.size * planes, work)
    return b


def backward_data(plan: ConvPlan, b: Any, w: Any, bias: Any = None) -> np.ndarray:
    """Phase by phase of ``a`` (:func:`_backward_data_phases`), or on every axis but the last
    where that one's stride is :data:`PERIODIC_MIN_STRIDE` or more
    (:func:`_backward_data_periodic`)."""
    if phases(plan).axes[-1].stride >= PERIODIC_MIN_STRIDE:
        return _backward_data_periodic(plan, b, w, bias)
    return _backward_data_phases(plan, b, w, bias)


class _Periodic:
    """The geometry of :func:`_backward_data_periodic`: the buffer (``b`` zero-padded, its
    last axis repeated ``s`` times, laid out in lines), and per phase of ``a`` on the outer
    axes its positions, lines and terms (a run's offset and its weights along a line)."""

    def __init__(self, plan: ConvPlan, w: Any, acc: np.dtype):
        ph = phases(plan)
        *self.outer, self.last = ph.axes
        s, channels = self.last.stride, plan.a_channels
        self.lo = tuple(ax.max_shift for ax in ph.axes)
        self.padded = tuple(m + max(ax.small, ax.cells) for m, ax in zip(self.lo, ph.axes))
        self.extent = (*self.padded[:-1], s * self.padded[-1])    # the last axis repeated
        self.line = line = self.extent[-1]
        self.line_strides = row_strides(self.extent[:-1])        # outer axes, in lines
        # the weights are tiled over ``tile`` lines, so that each multiply's inner loop runs
        # over about TILE_VALUES values rather than one line (numpy's loop over a line costs
        # as much as its arithmetic; CenterNet's k4 s2: 132-value lines), within a bound
        terms = math.prod(ax.kernel for ax in self.outer) * (self.last.max_shift + 1)
        table = math.prod(plan.a_spatial) * plan.batch * channels // 4
        self.tile = 1 if s == 1 else max(1, min(-(-TILE_VALUES // line),
                                                table // max(terms * channels * line, 1)))
        # spare lines: the dropped positions of a plane's last lines read past it
        self.plane = math.prod(self.extent) + self.tile * line
        self.inside = tuple(slice(m, m + ax.small) for m, ax in zip(self.lo[:-1], self.outer))
        self.by_shift: list[list[int | None]] = [[None] * s
                                                 for _ in range(self.last.max_shift + 1)]
        for k in range(self.last.kernel):
            self.by_shift[self.last.shift[k]][self.last.phase[k]] = k
        wc = canonical_weights(w, plan, acc)[:, 0]                # [C, K..]
        self.jobs = []
        for r in itertools.product(*(range(ax.stride) for ax in self.outer)):
            wins = [ax.phase_window(ri) for ax, ri in zip(self.outer, r)]
            if any(win is None for win in wins):
                continue
            counts = tuple(win.count for win in wins)
            lines = sum((c - 1) * st for c, st in zip(counts, self.line_strides)) + 1
            # the sums are laid out as the buffer's lines (counts[0] on the first axis); a
            # job computes the first ``lines`` of them, which hold its positions
            layout = (counts[0], *self.extent[1:-1]) if self.outer else ()
            self.jobs.append((tuple(win.positions for win in wins),
                              -(-lines // self.tile) * self.tile, layout,
                              tuple(slice(0, c) for c in counts), self._terms(wins, r, wc)))
        self.size = max(max(math.prod(lay), n) for _, n, lay, _, _ in self.jobs) * line

    def _terms(self, wins, r, wc: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """Per outer tap of phase ``r`` and shift along the last axis: the run's offset in the
        buffer and, per channel, the weight at each position of ``tile`` lines."""
        last, s, line = self.last, self.last.stride, self.line
        phase_x = (np.arange(line if s > 1 else 1) + last.pad) % s
        zero = np.zeros(wc.shape[0], wc.dtype)
        terms = []
        for ko in itertools.product(*(ax.taps[ri] for ax, ri in zip(self.outer, r))):
            first = sum((win.start - ax.shift[k] + m) * st for win, ax, k, m, st
                        in zip(wins, self.outer, ko, self.lo, self.line_strides))
            for m, taps in enumerate(self.by_shift):
                if all(k is None for k in taps):
                    continue
                row = np.stack([zero if k is None else wc[(slice(None), *ko, k)]
                                for k in taps], axis=-1)[:, phase_x]
                terms.append((first * line + last.pad + (self.lo[-1] - m) * s,
                              np.tile(row, (1, self.tile))))
        return terms


def _backward_data_periodic(plan: ConvPlan, b: Any, w: Any, bias: Any = None) -> np.ndarray:
    """Phase by phase of ``a`` on every axis but the last; along the last, every position at
    once from ``b`` repeated ``s`` times, with weights periodic along it.

    Cell ``q`` of phase ``r`` receives ``b[q - shift_k] * W[k]`` from each tap ``k`` of the
    phase. Along the last axis ``a[x]`` reads ``b[(x + pb) // s - m]`` once per shift ``m``
    (``0 .. max_shift``), through the tap whose phase is ``(x + pb) % s`` and whose shift is
    ``m`` (none: a zero weight): one run of the repeated copy of ``b`` per shift, times a
    row of weights that repeats every ``s`` positions. So a phase's positions are whole lines
    of ``a``, written in place; splitting the last axis into phases as well would interleave
    them with a stride of ``s`` values, which costs more than the sums (CenterNet's k8 s4)."""
    out_dtype, acc = dtypes(b, plan)
    src = _planes(b, plan.b_spatial)
    planes, channels = src.shape[0], plan.a_channels
    geo = _Periodic(plan, w, acc)
    s, line, tile, extent = geo.last.stride, geo.line, geo.tile, geo.extent
    bx = slice(geo.lo[-1], geo.lo[-1] + geo.last.small)
    bp = _bias(plan, bias, acc)
    a = np.empty((plan.batch, plan.a_channels, *plan.a_spatial), dtype=out_dtype)
    dst = a.reshape(planes, *plan.a_spatial)
    block = _block(geo.plane + 2 * geo.size, acc.itemsize)

    def work(lo: int, hi: int) -> None:
        n0 = min(block, hi - lo)
        buf = np.zeros((n0, geo.plane), dtype=acc)
        repeated = buf[:, : math.prod(extent)].reshape(n0, *extent[:-1], geo.padded[-1], s)
        out, tmp = np.empty((n0, geo.size), dtype=acc), np.empty((n0, geo.size), dtype=acc)
        p0 = lo
        while p0 < hi:
            # a block within one image: its planes are channels c0 .. c0+n
            c0 = p0 % channels
            n = min(block, hi - p0, channels - c0)
            for copy in range(s):
                repeated[(slice(0, n), *geo.inside, bx, copy)] = src[p0: p0 + n]
            for positions, lines, layout, crop, terms in geo.jobs:
                o = out[:n, : lines * line].reshape(n, -1, tile * line)
                t = tmp[:n, : lines * line].reshape(n, -1, tile * line)
                if not terms:
                    o[...] = 0
                _sum_of_products(o, t, (
                    (buf[:n, off: off + lines * line].reshape(n, -1, tile * line),
                     row[c0: c0 + n, None, :]) for off, row in terms))
                if bp is not None:
                    o += bp[p0: p0 + n, None, None]
                laid = out[:n, : math.prod(layout) * line].reshape(n, *layout, line)
                dst[(slice(p0, p0 + n), *positions, slice(None))] = laid[
                    (slice(None), *crop, slice(0, geo.last.size))]
            p0 += n

    values = sum(max(len(terms), 1) * lines * line for _, lines, _, _, terms in geo.jobs)
    _split(planes, block, values * planes, work)
    return a


def _backward_data_phases(plan: ConvPlan, b: Any, w: Any, bias: Any = None) -> np.ndarray:
    """Per phase of ``a``: its cell ``q`` receives ``b[q - shift_k] * W[k]`` from each tap
    ``k`` of the phase; ``b`` is copied once per block with ``max_shift`` zeros before it
    (and after it, up to the phases' cells), and each tap reads one run of that copy. With
    several phases a block's planes of ``a`` are assembled in a buffer, then copied out
    whole: interleaved straight into ``a``, each phase writes into every cache line of the
    output (CenterNet's k4 s2: 2 ns a value against 0.8)."""
    out_dtype, acc = dtypes(b, plan)
    src = _planes(b, plan.b_spatial)
    planes = src.shape[0]
    ph = phases(plan)
    lo_pad = tuple(ax.max_shift for ax in ph.axes)
    extent = tuple(m + max(ax.small, ax.cells) for m, ax in zip(lo_pad, ph.axes))
    inside = tuple(slice(m, m + ax.small) for m, ax in zip(lo_pad, ph.axes))
    wp, bp = _plane_weights(plan, w, acc), _bias(plan, bias, acc)
    jobs = []      # per phase of a that holds positions: positions, runs, taps, offsets
    for r in itertools.product(*(range(ax.stride) for ax in ph.axes)):
        wins = [ax.phase_window(ri) for ax, ri in zip(ph.axes, r)]
        if any(win is None for win in wins):
            continue
        runs = _Runs(tuple(win.count for win in wins), extent)
        taps = [t for t, tap in enumerate(ph.taps) if tap.phase == r]
        offsets = [runs.offset(tuple(win.start - q + m for win, q, m
                                     in zip(wins, ph.taps[t].shift, lo_pad)))
                   for t in taps]
        jobs.append((tuple(win.positions for win in wins), runs, taps, offsets))
    a = np.empty((plan.batch, plan.a_channels, *plan.a_spatial), dtype=out_dtype)
    dst = a.reshape(planes, *plan.a_spatial)
    size = max(runs.size for _, runs, _, _ in jobs)
    staged = len(jobs) > 1
    block = _block(math.prod(extent) + 2 * size + staged * math.prod(plan.a_spatial),
                   acc.itemsize)

    def work(lo: int, hi: int) -> None:
        n0 = min(block, hi - lo)
        buf = np.zeros((n0, *extent), dtype=acc)
        out, tmp = np.empty((n0, size), dtype=acc), np.empty((n0, size), dtype=acc)
        stage = np.empty((n0, *plan.a_spatial), dtype=out_dtype) if staged else None
        for p0 in range(lo, hi, block):
            n = min(block, hi - p0)
            buf[(slice(0, n), *inside)] = src[p0: p0 + n]
            flat = buf[:n].reshape(n, -1)
            target = stage[:n] if staged else dst[p0: p0 + n]
            for positions, runs, taps, offsets in jobs:
                o = out[:n, : runs.size]
                if taps:
                    runs.sums([flat] * len(taps), offsets, wp[taps, p0: p0 + n], o, tmp[:n])
                else:
                    o[:, : runs.length] = 0
                if bp is not None:
                    o[:, : runs.length] += bp[p0: p0 + n, None]
                target[(slice(None), *positions)] = runs.crop(o)
            if staged:
                dst[p0: p0 + n] = target

    taps_values = sum(max(len(taps), 1) * runs.size for _, runs, taps, _ in jobs)
    _split(planes, block, taps_values * planes, work)
    return a


def backward_weights(plan: ConvPlan, a: Any, b: Any) -> np.ndarray:
    """Per plane and tap, the dot product of the tap's run of ``a``'s phase with ``b`` laid
    out on the phases' extents (zeros at the dropped positions); summed over the batch."""
    out_dtype, acc = dtypes(a, plan)
    src, grad = _planes(a, plan.a_spatial), _planes(b, plan.b_spatial)
    planes = src.shape[0]
    ph = _Phases(plan)
    runs = ph.runs
    taps = len(ph.tap_phase)
    per_plane = np.empty((taps, planes), dtype=acc)
    block = _block(ph.values + runs.size, acc.itemsize)

    def work(lo: int, hi: int) -> None:
        bufs = ph.buffers(min(block, hi - lo), acc)
        laid = np.zeros((len(bufs[0]), runs.size), dtype=acc)
        for p0 in range(lo, hi, block):
            n = min(block, hi - p0)
            flat = ph.fill(bufs, src, p0, n)
            runs.crop(laid[:n])[...] = grad[p0: p0 + n]
            rows = laid[:n, : runs.length]
            for t, (i, off) in enumerate(zip(ph.tap_phase, ph.tap_offset)):
                np.einsum("pj,pj->p", flat[i][:, off: off + runs.length], rows,
                          out=per_plane[t, p0: p0 + n])

    _split(planes, block, taps * runs.size * planes, work)
    dw = per_plane.reshape(taps, plan.batch, plan.b_channels).sum(axis=1)   # [T, C]
    canon = dw.T.reshape(plan.b_channels, 1, *plan.kernel)                  # [Cb, 1, K..]
    return np.ascontiguousarray(np.transpose(canon, plan.weights_inverse_perm),
                                dtype=out_dtype)


# --- the records: a multiply-add per tap and value of ``b``, a move per value of ``a`` -------

#: per element: each tap's multiply-add (or the weight gradient's dot) per value of ``b``, on
#: all CPUs; the phase split or interleave per value of ``a``
PLANES_TAP_S = 0.35e-9
PLANES_MOVE_S = 0.4e-9


def _price(primitive: str, plan: ConvPlan, z: Sizes) -> float:
    return z.item * (z.mb * z.t * z.cb * PLANES_TAP_S + z.ma * z.ca * PLANES_MOVE_S)


STRATEGIES = tuple(strategy("planes", p, run, _price, applies)
                   for p, run in (("forward", forward), ("backward_data", backward_data),
                                  ("backward_weights", backward_weights)))
