"""The fast path: implicit GEMM on a phase grid, in cache-sized chunks of rows.

The canonical convolution (docs/semantics.md#canonical-convolution) pairs ``b[y]`` with
``a[y*s + k*d - pb]`` for each kernel tap ``k``. Split the zero-padded large tensor into its
``s`` *phases* per axis (:mod:`polyconv._phases`; ``phase_r[i] = a_pad[i*s + r]``): tap
``k`` reads phase ``r = (k*d) % s`` at offset ``q = (k*d) // s``, with unit stride. Lay the
phases and the small tensor on one grid ``[N, P.., C]`` (``P >= B + max q``) and flatten
``[N, P..]`` into rows: every tap becomes a fixed *row offset*, and a block of output rows is
one matrix product of the taps' shifted row blocks, concatenated along channels, with the
taps' weights stacked to match::

    forward           b[j]    = [a_r(t)[j + off_t] for t] @ W_fwd           (all taps)
    backward_data     a_r[j]  = [b[j - off_t] for t in taps of phase r] @ W_bwd_r
    backward_weights  W      += b[j]^T @ [a_r(t)[j + off_t] for t]

Each block of rows is gathered into one small buffer (a few MB, so it stays in cache) and
multiplied once: no Python loop over output elements, no im2col of the whole input, one write of
each output row. Grid cells outside the data are zeros or are cropped, which is exact for
finite inputs; ``0 * inf`` would not be, so the backend routes non-finite inputs to
:mod:`polyconv_numpy._exact`. Groups are a batched matmul over ``G``; one input channel per
group (depthwise) is a sum of each phase's taps read as one strided view (:mod:`._depthwise`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from polyconv._geometry import ConvPlan
from polyconv._phases import phases

from ._common import (
    add_bias,
    canonical_weights,
    channels_last_view,
    copy_channels_first,
    dtypes,
    row_strides,
    split_products,
    to_user_layout,
    weights_matrix,
)
from ._depthwise import groups, tap_sum, tap_weights

_BLOCK_BYTES = 1 << 20   # target size of one gathered block of rows
_GROUPED_BLOCK_BYTES = 1 << 21
#: blocks grow up to this size, and to a 32nd of everything gathered (:func:`_blocks`)
_LARGE_BLOCK_BYTES = 1 << 23
_CHANNELS_FIRST_MAX = 8  # channels per group up to which backward_data runs channels-first
#: ... and up to which it does for channels-first data without a stride (one phase)
_CHANNELS_FIRST_STRIDE_ONE = 64
_CHANNELS_FIRST_DATA = True  # forward, backward_weights: NCX data channels-first at any width


class _Grid:
    """Phase-grid geometry: grid sizes, and each tap's phase and row offset.

    The phase numbers (each tap's phase and shift, each phase's in-range cells) are those of
    :mod:`polyconv._phases`; the grid adds the flattening: ``P = max(cells, B + max shift)``
    cells per axis, so that every tap's window of every row lies on the grid.
    """

    def __init__(self, plan: ConvPlan):
        self.plan = plan
        self.ph = ph = phases(plan)
        self.p = tuple(max(ax.cells, ax.small + ax.max_shift) for ax in ph.axes)
        self.rows = plan.batch * math.prod(self.p)
        strides = row_strides(self.p)
        #: (phase, row offset) per tap, taps in kernel row-major order
        self.taps: list[tuple[tuple[int, ...], int]] = [
            (tap.phase, sum(q * st for q, st in zip(tap.shift, strides)))
            for tap in ph.taps]
        self.ks = [tap.k for tap in ph.taps]     #: each tap's kernel index
        self.margin = max(off for _, off in self.taps)
        #: the phases some tap reaches, each with its taps' indices
        self.phases: dict[tuple[int, ...], list[int]] = {r: list(ts) for r, ts in ph.by_phase}
        #: the taps of the phase with the fewest. A loop over phases splits every phase over
        #: threads or none, by this one: a phase left to BLAS's own threads leaves its workers
        #: spinning into the next phase's threads (a 3x3 stride-2 layer's four phases gather
        #: 1-4 taps: with only the 4-tap phase split, 1.55x slower than on one thread; its
        #: grouped version 1.12x)
        self.fewest_taps = min(len(ts) for _, ts in ph.by_phase)

    def _window(self, phase: tuple[int, ...]):
        """``(grid index, large-tensor index)`` of a phase's in-range cells, or ``None``."""
        win = self.ph.phase_window(phase, self.p)
        if win is None:
            return None
        full = slice(None)
        return (full, *win[0], full), (full, *win[1], full)

    def split(self, a: Any, acc: np.dtype) -> dict[tuple[int, ...], np.ndarray]:
        """Phases of the padded large tensor: ``[rows + margin, Ca]`` each (zero tail)."""
        return {phase: self.phase_rows(a, phase, acc) for phase in self.phases}

    def phase_rows(self, a: Any, phase: tuple[int, ...], acc: np.dtype) -> np.ndarray:
        """One phase of the padded large tensor: ``[rows + margin, Ca]`` (zero tail)."""
        a_cl = channels_last_view(a, self.plan)
        rows = np.zeros((self.rows + self.margin, a_cl.shape[-1]), dtype=acc)
        win = self._window(phase)
        if win is not None:
            grid = rows[: self.rows].reshape(self.plan.batch, *self.p, -1)
            grid[win[0]] = a_cl[win[1]]
        return rows

    def phase_rows_channels_first(self, a: Any, phase: tuple[int, ...],
                                  acc: np.dtype) -> np.ndarray:
        """:meth:`phase_rows`, transposed: ``[Ca, rows + margin]``."""
        a_cl = channels_last_view(a, self.plan)
        rows = np.zeros((a_cl.shape[-1], self.rows + self.margin), dtype=acc)
        win = self.ph.phase_window(phase, self.p)
        if win is not None:
            grid = rows[:, : self.rows].reshape(-1, self.plan.batch, *self.p)
            copy_channels_first(grid[(slice(None), slice(None), *win[0])],
                                a_cl[(slice(None), *win[1])])
        return rows

    def output(self, channels: int, dtype: np.dtype, bias: Any) -> tuple[np.ndarray, np.ndarray]:
        """The large tensor in the user's layout and dtype, and its channels-last view.

        Every cell belongs to one phase and is written once by :meth:`put`; only when some
        phase has no tap are the cells filled first, with the bias (or zeros).
        """
        plan = self.plan
        a_cl = (plan.batch, *plan.a_spatial, channels)
        if plan.channels_last:
            out = np.empty(a_cl, dtype=dtype)
            out_cl = out
        else:
            out = np.empty((plan.batch, channels, *plan.a_spatial), dtype=dtype)
            out_cl = np.moveaxis(out, 1, -1)
        if len(self.phases) < math.prod(plan.strides):
            out_cl[...] = 0 if bias is None else np.asarray(bias).astype(plan.acc_dtype)
        return out, out_cl

    def put(self, out_cl: np.ndarray, phase: tuple[int, ...], rows: np.ndarray, bias: Any,
            channels_first: bool = False) -> None:
        """Write one phase's rows (``[rows, C]``, or ``[C, rows]``), plus the bias, into the
        output: the one rounding to the output dtype."""
        plan, channels = self.plan, out_cl.shape[-1]
        if channels_first:
            grid = np.moveaxis(rows.reshape(channels, plan.batch, *self.p), 0, -1)
        else:
            grid = rows[: self.rows].reshape(plan.batch, *self.p, channels)
        add_bias(grid, bias)
        win = self._window(phase)
        if win is not None:
            out_cl[win[1]] = grid[win[0]]

    def embed(self, b: Any, lead: int, acc: np.dtype) -> np.ndarray:
        """The small tensor on the grid after ``lead`` zero rows: ``[lead + rows, Cb]``."""
        b_cl = channels_last_view(b, self.plan)
        rows = np.zeros((lead + self.rows, b_cl.shape[-1]), dtype=acc)
        grid = rows[lead:].reshape(self.plan.batch, *self.p, -1)
        grid[self.small_index] = b_cl
        return rows

    def embed_channels_first(self, b: Any, lead: int, acc: np.dtype) -> np.ndarray:
        """:meth:`embed`, transposed: ``[Cb, lead + rows]``."""
        b_cl = channels_last_view(b, self.plan)
        rows = np.zeros((b_cl.shape[-1], lead + self.rows), dtype=acc)
        grid = rows[:, lead:].reshape(-1, self.plan.batch, *self.p)
        grid[(slice(None), *self.small_index[:-1])] = np.moveaxis(b_cl, -1, 0)
        return rows

    def crop(self, b_rows: np.ndarray) -> np.ndarray:
        """The ``[N, B.., Cb]`` part of small-tensor rows on the grid."""
        return b_rows.reshape(self.plan.batch, *self.p, -1)[self.small_index]

    @property
    def small_index(self):
        return (slice(None), *(slice(0, b) for b in self.plan.b_spatial), slice(None))


def _blocks(lo: int, hi: int, row_bytes: int, block_bytes: int = _BLOCK_BYTES,
            of: int | None = None):
    """Rows ``lo:hi`` in blocks of about ``block_bytes`` (``row_bytes`` per row). A range of
    ``of`` rows split over threads takes its share of the budget, so that the threads' buffers
    together stay within it.

    The budget grows with the problem, to a 32nd of the ``of`` rows' gathered bytes and at
    most :data:`_LARGE_BLOCK_BYTES` (within the memory bound up to 64 taps): OpenBLAS's
    products of few output channels run faster on more rows. 2 CPUs, nnU-Net's 3x3x3 32->32
    conv block: forward 130-134 ms -> 99-104, gradient 358-375 -> 305-335; U-Net's 3x3 64->64
    at 128x128 19 -> 16; the rest within noise."""
    if of:
        block_bytes = max(block_bytes, min(_LARGE_BLOCK_BYTES, of * row_bytes // 32))
        block_bytes = block_bytes * (hi - lo) // of
    step = max(256, block_bytes // max(row_bytes, 1))
    for j0 in range(lo, hi, step):
        yield j0, min(hi, j0 + step)


class _Channels:
    """Channel bookkeeping of one plan: ``G`` groups of ``Cg`` (a side) and ``Og`` (b side)."""

    def __init__(self, plan: ConvPlan):
        self.g = plan.groups
        self.cg = plan.a_channels // self.g
        self.og = plan.b_channels // self.g
        self.depthwise = self.cg == 1 and self.g > 1
        self._buf: np.ndarray | None = None

    def weights4(self, w: np.ndarray) -> np.ndarray:
        """Canonical ``[Cb, Cg, K..]`` -> ``[G, Og, Cg, T]`` (taps in row-major order)."""
        return w.reshape(self.g, self.og, self.cg, -1)

    def gather(self, sources, j0: int, j1: int, dtype) -> np.ndarray:
        """``[G, n, len(sources) * C/G]``: the row blocks ``src[j0 + o : j1 + o]`` side by side.

        A view of one ``[n, G, len(sources), C/G]`` buffer: each copy keeps a source row's
        channels together, and each group's ``[n, len(sources) * C/G]`` matrix has a unit
        inner stride, so matrix products read it in place.
        """
        n = j1 - j0
        c = sources[0][0].shape[-1] // self.g
        size = n * self.g * len(sources) * c
        # one buffer for every block of a call: a fresh one would pay its page faults again
        if self._buf is None or self._buf.size < size or self._buf.dtype != dtype:
            self._buf = np.empty(size, dtype=dtype)
        buf = self._buf[:size].reshape(n, self.g, len(sources), c)
        for i, (src, off) in enumerate(sources):
            buf[:, :, i, :] = src[j0 + off: j1 + off].reshape(n, self.g, c)
        return buf.reshape(n, self.g, -1).transpose(1, 0, 2)

    def grouped(self, rows: np.ndarray) -> np.ndarray:
        """``[n, G*c]`` rows as the ``[G, n, c]`` view a grouped matrix product writes into."""
        return rows.reshape(rows.shape[0], self.g, -1).transpose(1, 0, 2)


def _channels_first(ch: _Channels, plan: ConvPlan) -> bool:
    """Whether to gather channels-first: few channels per group on the gathered side make
    runs of rows the longer contiguous copies (and the product's output the wide side); and
    channels-first data is then read and written without a change of layout."""
    return not ch.depthwise and (ch.cg <= _CHANNELS_FIRST_MAX
                                 or (_CHANNELS_FIRST_DATA and not plan.channels_last))


def forward(plan: ConvPlan, a: Any, w: Any, bias: Any = None) -> np.ndarray:
    out_dtype, acc = dtypes(a, plan)
    grid, ch = _Grid(plan), _Channels(plan)
    w4 = ch.weights4(canonical_weights(w, plan, acc))            # [G, Og, Cg, T]
    if _channels_first(ch, plan):
        return _forward_channels_first(plan, grid, ch, w4, a, bias, out_dtype, acc)
    phases = grid.split(a, acc)
    sources = [(phases[phase], off) for phase, off in grid.taps]
    b = np.empty((grid.rows, plan.b_channels), dtype=acc)
    if ch.depthwise:        # a depthwise sum per output of a group (a channel multiplier)
        part = b if ch.og == 1 else np.empty((grid.rows, ch.g), dtype=acc)
        for o in range(ch.og):
            tap_sum(part, groups(sources, grid.ks, np.ascontiguousarray(w4[:, o, 0, :].T)))
            if ch.og > 1:
                b.reshape(grid.rows, ch.g, ch.og)[:, :, o] = part
    else:
        # [G, T*Cg, Og]: taps stacked along the contraction, matching gather()
        wcat = weights_matrix(w4, (3, 2), (1,))
        row_bytes = len(sources) * plan.a_channels * acc.itemsize

        def work(lo: int, hi: int) -> None:
            own = _Channels(plan)       # this thread's gather buffer
            for j0, j1 in _blocks(lo, hi, row_bytes, of=grid.rows):
                np.matmul(own.gather(sources, j0, j1, acc), wcat, out=own.grouped(b[j0:j1]))

        split_products(grid.rows, row_bytes // acc.itemsize, work)
    b = grid.crop(b)
    add_bias(b, bias)
    return to_user_layout(b, plan, out_dtype)


def _gathered_blocks(lo: int, hi: int, row_bytes: int, acc: np.dtype, of: int):
    """The blocks of rows ``lo:hi`` (of ``of``) for channels-first gathers, and one flat
    buffer for the largest (:func:`_gather_channels_first`)."""
    blocks = list(_blocks(lo, hi, row_bytes, _GROUPED_BLOCK_BYTES, of))
    step = max(j1 - j0 for j0, j1 in blocks)
    return blocks, np.empty(step * row_bytes // acc.itemsize, dtype=acc)


def _gather_channels_first(sources, j0: int, j1: int, ch: _Channels, buf: np.ndarray):
    """``[G, len(sources)*Cg, n]``: the columns ``src[:, j0 + o : j1 + o]`` stacked per group,
    each a copy of contiguous runs of ``n`` rows."""
    n = j1 - j0
    out = buf[: ch.g * len(sources) * ch.cg * n].reshape(ch.g, len(sources), ch.cg, n)
    for i, (src, off) in enumerate(sources):
        out[:, i] = src[:, j0 + off: j1 + off].reshape(ch.g, ch.cg, n)
    return out.reshape(ch.g, -1, n)


def _forward_channels_first(plan: ConvPlan, grid: _Grid, ch: _Channels, w4: np.ndarray, a: Any,
                            bias: Any, out_dtype: np.dtype, acc: np.dtype) -> np.ndarray:
    """forward for few channels per group of ``a``: ``b[Cb, rows] = W[G, Og, T*Cg] @ [a_r(t)[Cg,
    rows + off_t] for t]``, per block of rows; the result is channels-first already."""
    phases = {phase: grid.phase_rows_channels_first(a, phase, acc) for phase in grid.phases}
    sources = [(phases[phase], off) for phase, off in grid.taps]
    wcat = weights_matrix(w4, (1,), (3, 2))                      # [G, Og, T*Cg]
    row_bytes = len(sources) * plan.a_channels * acc.itemsize
    if plan.channels_last:      # rows x channels, as the user's layout: b^T = gathered^T W^T
        b = np.empty((grid.rows, plan.b_channels), dtype=acc)

        def work(lo: int, hi: int) -> None:
            blocks, buf = _gathered_blocks(lo, hi, row_bytes, acc, grid.rows)
            for j0, j1 in blocks:
                gathered = _gather_channels_first(sources, j0, j1, ch, buf)
                np.matmul(gathered.transpose(0, 2, 1), wcat.transpose(0, 2, 1),
                          out=ch.grouped(b[j0:j1]))

        split_products(grid.rows, row_bytes // acc.itemsize, work)
        b = grid.crop(b)
        add_bias(b, bias)
        return to_user_layout(b, plan, out_dtype)
    b = np.empty((plan.b_channels, grid.rows), dtype=acc)
    bg = b.reshape(ch.g, ch.og, grid.rows)

    def work_cf(lo: int, hi: int) -> None:
        blocks, buf = _gathered_blocks(lo, hi, row_bytes, acc, grid.rows)
        for j0, j1 in blocks:
            np.matmul(wcat, _gather_channels_first(sources, j0, j1, ch, buf),
                      out=bg[:, :, j0:j1])

    split_products(grid.rows, row_bytes // acc.itemsize, work_cf)
    # [Cb, N, P..] -> [Cb, N, B..] -> [N, Cb, B..], bias before the one rounding
    crop = b.reshape(plan.b_channels, plan.batch, *grid.p)[
        (slice(None), slice(None), *(slice(0, n) for n in plan.b_spatial))]
    if bias is not None:
        crop += np.asarray(bias).astype(acc).reshape(-1, *(1,) * (plan.ndim + 1))
    out = np.empty(plan.b_shape, dtype=out_dtype)
    out[...] = np.moveaxis(crop, 0, 1)
    return out


def backward_data(plan: ConvPlan, b: Any, w: Any, bias: Any = None) -> np.ndarray:
    out_dtype, acc = dtypes(b, plan)
    grid, ch = _Grid(plan), _Channels(plan)
    w4 = ch.weights4(canonical_weights(w, plan, acc))            # [G, Og, Cg, T]
    out, out_cl = grid.output(plan.a_channels, out_dtype, bias)
    # one phase at a time, each written out before the next: little memory beyond the output
    # (not for wide channels of channels-first data here: measured slower, e.g. HiFi-GAN's
    # 512 -> 256 upsampler 9.4 ms against 7.1; but without a stride, channels-first data of
    # up to 64 channels per group gains the two transposes: 2 CPUs, U-Net's 3x3 64->64 at
    # 128x128 20-25 ms -> 15-18, nnU-Net's 3x3x3 32->32 155-158 -> 110-112; a strided
    # channels-last 64->64 ConvTranspose ran 1.2x slower channels-first)
    limit = (_CHANNELS_FIRST_STRIDE_ONE if not plan.channels_last and set(plan.strides) == {1}
             else _CHANNELS_FIRST_MAX)
    channels_first = 1 < ch.cg <= limit
    phases = (_phases_channels_first if channels_first else
              _phases_depthwise if ch.depthwise else _phases)(plan, grid, ch, w4, b, acc)
    for phase, rows in phases:
        grid.put(out_cl, phase, rows, bias, channels_first)
    return out


def _phases(plan: ConvPlan, grid: _Grid, ch: _Channels, w4: np.ndarray, b: Any, acc: np.dtype):
    """backward_data per phase, channels-last: ``(phase, [rows, Ca])``."""
    lead = grid.margin
    b_rows = grid.embed(b, lead, acc)
    rows = np.empty((grid.rows, plan.a_channels), dtype=acc)
    for phase, taps in grid.phases.items():
        sources = [(b_rows, lead - grid.taps[t][1]) for t in taps]
        n = len(taps)
        # [G, n*Og, Cg]: this phase's taps stacked along the contraction
        wcat = np.ascontiguousarray(w4[..., taps].transpose(0, 3, 1, 2)).reshape(
            ch.g, n * ch.og, ch.cg)
        row_bytes = n * plan.b_channels * acc.itemsize

        def work(lo: int, hi: int, sources=sources, wcat=wcat, row_bytes=row_bytes) -> None:
            own = _Channels(plan)
            for j0, j1 in _blocks(lo, hi, row_bytes, of=grid.rows):
                np.matmul(own.gather(sources, j0, j1, acc), wcat,
                          out=own.grouped(rows[j0:j1]))

        split_products(grid.rows, grid.fewest_taps * plan.b_channels, work)
        yield phase, rows


def _phases_depthwise(plan: ConvPlan, grid: _Grid, ch: _Channels, w4: np.ndarray, b: Any,
                      acc: np.dtype):
    """backward_data per phase for one channel of ``a`` per group (depthwise, any channel
    multiplier): ``(phase, [rows, G])``, one tap sum over every output of a group and tap of
    the phase (:func:`~._depthwise.tap_sum`, by cache-sized blocks). Each output of a group
    is read as a ``[rows, G]`` array of its own (``b``'s embedded rows themselves for one)."""
    lead = grid.margin
    b_rows = grid.embed(b, lead, acc)
    outputs = [np.ascontiguousarray(b_rows[:, o::ch.og]) for o in range(ch.og)]
    del b_rows                  # (with a multiplier, the copies stand in for it)
    rows = np.empty((grid.rows, plan.a_channels), dtype=acc)
    for phase, taps in grid.phases.items():
        w_t = w4[:, :, 0, taps].transpose(1, 2, 0).reshape(-1, ch.g)       # [(Og, n), G]
        tap_sum(rows, groups([(b_o, lead - grid.taps[t][1]) for b_o in outputs for t in taps],
                             [grid.ks[t] for _ in outputs for t in taps],
                             np.ascontiguousarray(w_t)))
        yield phase, rows


def _phases_channels_first(plan: ConvPlan, grid: _Grid, ch: _Channels, w4: np.ndarray, b: Any,
                           acc: np.dtype):
    """backward_data per phase, channels-first, for few channels per group: ``(phase,
    [Ca, rows])``, per group and block of rows ``a_r[Cg, rows] = W_r[Cg, n*Og] @ [b[Og,
    rows - off_t] for t]``.

    Gathering a tap is then a copy of contiguous runs of rows instead of runs of ``Og`` (e.g.
    8) channels; that outweighs the two transpositions (of ``b`` and of the result) when
    ``Cg`` is small (measured: 1.3-2x faster at 4 and 8 channels per group, slower at 16).
    """
    lead = grid.margin
    b_cf = grid.embed_channels_first(b, lead, acc)                   # [Cb, lead + rows]
    rows = np.empty((ch.g, ch.cg, grid.rows), dtype=acc)
    for phase, taps in grid.phases.items():
        n = len(taps)
        # [G, Cg, n*Og]: this phase's taps stacked along the contraction, matching buf
        w_t = np.ascontiguousarray(w4[..., taps].transpose(0, 2, 3, 1)).reshape(
            ch.g, ch.cg, n * ch.og)
        row_bytes = n * plan.b_channels * acc.itemsize

        def work(lo: int, hi: int, taps=taps, w_t=w_t, row_bytes=row_bytes) -> None:
            n = len(taps)
            blocks, flat = _gathered_blocks(lo, hi, row_bytes, acc, grid.rows)
            for j0, j1 in blocks:
                buf = flat[: n * plan.b_channels * (j1 - j0)].reshape(ch.g, n, ch.og, j1 - j0)
                for i, t in enumerate(taps):
                    off = lead - grid.taps[t][1]
                    buf[:, i] = b_cf[:, j0 + off: j1 + off].reshape(ch.g, ch.og, j1 - j0)
                np.matmul(w_t, buf.reshape(ch.g, n * ch.og, j1 - j0), out=rows[:, :, j0:j1])

        split_products(grid.rows, grid.fewest_taps * plan.b_channels, work)
        yield phase, rows.reshape(plan.a_channels, grid.rows)


def backward_weights(plan: ConvPlan, a: Any, b: Any) -> np.ndarray:
    out_dtype, acc = dtypes(a, plan)
    grid, ch = _Grid(plan), _Channels(plan)
    if _channels_first(ch, plan):
        return _backward_weights_channels_first(plan, grid, ch, a, b, out_dtype, acc)
    phases = grid.split(a, acc)
    b_rows = grid.embed(b, 0, acc)
    sources = [(phases[phase], off) for phase, off in grid.taps]
    t = len(sources)
    if ch.depthwise:        # per output of a group (a channel multiplier): its tap sums
        taps = groups(sources, grid.ks)     # (b_rows itself, uncopied, for one output)
        dw = np.stack([tap_weights(np.ascontiguousarray(b_rows[:, o::ch.og]), taps)
                       for o in range(ch.og)], axis=-1)              # [T, G, Og]
        w4 = dw.transpose(1, 2, 0)[:, :, None, :]                    # [G, Og, 1, T]
    else:
        def work_dense(lo: int, hi: int) -> np.ndarray:     # this range's sum
            own = _Channels(plan)
            dwcat = np.zeros((ch.g, ch.og, t * ch.cg), dtype=acc)
            for j0, j1 in _blocks(lo, hi, t * plan.a_channels * acc.itemsize, of=grid.rows):
                blk = own.grouped(b_rows[j0:j1]).transpose(0, 2, 1)         # [G, Og, n]
                dwcat += np.matmul(blk, own.gather(sources, j0, j1, acc))
            return dwcat

        dwcat = sum(split_products(grid.rows, t * plan.a_channels, work_dense))
        w4 = dwcat.reshape(ch.g, ch.og, t, ch.cg).transpose(0, 1, 3, 2)  # [G, Og, Cg, T]
    canon = w4.reshape(plan.w_shape)
    return np.ascontiguousarray(np.transpose(canon, plan.weights_inverse_perm),
                                dtype=out_dtype)


def backward_weights_gather_b(plan: ConvPlan, a: Any, b: Any) -> np.ndarray:
    """backward_weights gathering the small tensor's shifted rows instead of the large one's.

    Per phase ``r`` of the large tensor and block of its rows: ``dW_r[n*Og, Cg] += [b[j -
    off_t] for t in taps of r]^T @ a_r[j]`` (the data flow of :func:`backward_data`). It
    gathers ``T*Cb`` values per row instead of ``T*Ca``: the better order when ``Cb`` is the
    narrow side. One phase of ``a`` is laid out at a time.
    """
    out_dtype, acc = dtypes(a, plan)
    grid, ch = _Grid(plan), _Channels(plan)
    if ch.depthwise:        # one input channel per group: the same per-tap products
        return backward_weights(plan, a, b)
    lead = grid.margin
    b_rows = grid.embed(b, lead, acc)
    t = len(grid.taps)
    w4 = np.zeros((ch.g, ch.og, ch.cg, t), dtype=acc)
    for phase, taps in grid.phases.items():
        a_r = grid.phase_rows(a, phase, acc)
        sources = [(b_rows, lead - grid.taps[i][1]) for i in taps]
        n = len(taps)
        def work(lo: int, hi: int, a_r=a_r, sources=sources, n=n) -> np.ndarray:
            own = _Channels(plan)
            dw = np.zeros((ch.g, n * ch.og, ch.cg), dtype=acc)
            for j0, j1 in _blocks(lo, hi, n * plan.b_channels * acc.itemsize, of=grid.rows):
                blk = own.gather(sources, j0, j1, acc).transpose(0, 2, 1)    # [G, n*Og, rows]
                dw += np.matmul(blk, own.grouped(a_r[j0:j1]))
            return dw

        dw = sum(split_products(grid.rows, grid.fewest_taps * plan.b_channels, work))
        # [G, n, Og, Cg] -> the taps' columns of [G, Og, Cg, T]
        w4[..., taps] = dw.reshape(ch.g, n, ch.og, ch.cg).transpose(0, 2, 3, 1)
    canon = w4.reshape(plan.w_shape)
    return np.ascontiguousarray(np.transpose(canon, plan.weights_inverse_perm),
                                dtype=out_dtype)


def _backward_weights_channels_first(plan: ConvPlan, grid: _Grid, ch: _Channels, a: Any, b: Any,
                                     out_dtype: np.dtype, acc: np.dtype) -> np.ndarray:
    """backward_weights for few channels per group of ``a``: ``dW[G, Og, T*Cg] += b[G, Og,
    rows] @ [a_r(t)[Cg, rows + off_t] for t]^T`` per block of rows."""
    phases = {phase: grid.phase_rows_channels_first(a, phase, acc) for phase in grid.phases}
    sources = [(phases[phase], off) for phase, off in grid.taps]
    t = len(sources)
    if plan.channels_last:      # b's rows as they are, read transposed: [G, Og, rows] views
        b_rows = grid.embed(b, 0, acc)
        b_cf = b_rows.reshape(grid.rows, ch.g, ch.og).transpose(1, 2, 0)
    else:
        b_cf = grid.embed_channels_first(b, 0, acc).reshape(ch.g, ch.og, grid.rows)
    row_bytes = t * plan.a_channels * acc.itemsize

    def work(lo: int, hi: int) -> np.ndarray:
        dwcat = np.zeros((ch.g, ch.og, t * ch.cg), dtype=acc)
        blocks, buf = _gathered_blocks(lo, hi, row_bytes, acc, grid.rows)
        for j0, j1 in blocks:
            gathered = _gather_channels_first(sources, j0, j1, ch, buf)     # [G, T*Cg, n]
            dwcat += np.matmul(b_cf[:, :, j0:j1], gathered.transpose(0, 2, 1))
        return dwcat

    dwcat = sum(split_products(grid.rows, row_bytes // acc.itemsize, work))
    w4 = dwcat.reshape(ch.g, ch.og, t, ch.cg).transpose(0, 1, 3, 2)    # [G, Og, Cg, T]
    canon = w4.reshape(plan.w_shape)
    return np.ascontiguousarray(np.transpose(canon, plan.weights_inverse_perm),
                                dtype=out_dtype)
