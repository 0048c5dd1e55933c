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

from typing import Any

import numpy as np

from polyconv._geometry import ConvPlan

from ._common import (
    add_bias,
    canonical_weights,
    dtypes,
    moveaxis,
    split_products,
    to_user_layout,
    weights_matrix,
)
from ._costs import (
    CALL_S,
    COPY_S,
    FILL_S,
    TRANSPOSE_S,
    Sizes,
    copy,
    gemm,
    gemm_long,
    sizes,
    strategy,
)
from ._depthwise import groups, tap_sum, tap_weights
from ._grid import Grid
from ._window import as_forward

_BLOCK_BYTES = 1 << 20   # target size of one gathered block of rows
_GROUPED_BLOCK_BYTES = 1 << 21
#: blocks grow up to this size, and to a 32nd of everything gathered (:func:`_blocks`)
_LARGE_BLOCK_BYTES = 1 << 23
_CHANNELS_FIRST_MAX = 8  # channels per group up to which backward_data runs channels-first
#: ... and up to which it does for channels-first data without a stride (one phase)
_CHANNELS_FIRST_STRIDE_ONE = 64
_CHANNELS_FIRST_DATA = True  # forward, backward_weights: NCX data channels-first at any width


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
        block_bytes = _budget(of, row_bytes, block_bytes) * (hi - lo) // of
    step = _step(row_bytes, block_bytes)
    for j0 in range(lo, hi, step):
        yield j0, min(hi, j0 + step)


def _budget(of: int, row_bytes: int, block_bytes: int) -> int:
    """The bytes of one block of :func:`_blocks` over all ``of`` rows."""
    return max(block_bytes, min(_LARGE_BLOCK_BYTES, of * row_bytes // 32))


def _step(row_bytes: int, block_bytes: int) -> int:
    """The rows of one block of ``block_bytes``: 256 at least."""
    return max(256, block_bytes // max(row_bytes, 1))


def _block_count(rows: int, row_bytes: int, block_bytes: int) -> int:
    """How many blocks :func:`_blocks` cuts ``rows`` rows into."""
    return -(-rows // _step(row_bytes, _budget(rows, row_bytes, block_bytes)))


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
    grid, ch = Grid(plan), _Channels(plan)
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


def _forward_channels_first(plan: ConvPlan, grid: Grid, ch: _Channels, w4: np.ndarray, a: Any,
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
    out[...] = moveaxis(crop, 0, 1)
    return out


def _backward_data_channels_first(ch: _Channels, plan: ConvPlan) -> bool:
    """Whether backward_data accumulates channels-first: few channels per group of ``a``;
    without a stride, channels-first data of up to :data:`_CHANNELS_FIRST_STRIDE_ONE`, which
    then skips the two changes of layout (not for wider channels, nor strided: measured slower
    there; docs/design_notes.md, the numpy backend's strategies)."""
    limit = (_CHANNELS_FIRST_STRIDE_ONE if not plan.channels_last and set(plan.strides) == {1}
             else _CHANNELS_FIRST_MAX)
    return 1 < ch.cg <= limit


def backward_data(plan: ConvPlan, b: Any, w: Any, bias: Any = None) -> np.ndarray:
    out_dtype, acc = dtypes(b, plan)
    grid, ch = Grid(plan), _Channels(plan)
    w4 = ch.weights4(canonical_weights(w, plan, acc))            # [G, Og, Cg, T]
    out, out_cl = grid.output(plan.a_channels, out_dtype, bias)
    # one phase at a time, each written out before the next: little memory beyond the output
    channels_first = _backward_data_channels_first(ch, plan)
    phases = (_phases_channels_first if channels_first else
              _phases_depthwise if ch.depthwise else _phases)(plan, grid, ch, w4, b, acc)
    for phase, rows in phases:
        grid.put(out_cl, phase, rows, bias, channels_first)
    return out


def _phases(plan: ConvPlan, grid: Grid, ch: _Channels, w4: np.ndarray, b: Any, acc: np.dtype):
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


def _phases_depthwise(plan: ConvPlan, grid: Grid, ch: _Channels, w4: np.ndarray, b: Any,
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


def _phases_channels_first(plan: ConvPlan, grid: Grid, ch: _Channels, w4: np.ndarray, b: Any,
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
    grid, ch = Grid(plan), _Channels(plan)
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


def _backward_weights_channels_first(plan: ConvPlan, grid: Grid, ch: _Channels, a: Any, b: Any,
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


# --- the records: the grid's price, from the counts its kernels move --------------------------

#: one channel of ``a`` per group: the phase split (per value of ``a``) and the strided-view
#: einsum sums (per grid row, tap and channel, on all CPUs) of :mod:`._depthwise`
DW_SPLIT_S = 0.82e-9
DW_GRID_TAP_S = 0.062e-9


#: the grid's dense estimates against its times (its gathers and threads run slower than the
#: pricing primitives say; docs/design_notes.md, numpy cost model)
GATHER_FACTOR = 1.75


def _price(primitive: str, plan: ConvPlan, z: Sizes) -> float:
    if primitive == "backward_data" and (adjoint := as_forward(plan)) is not None:
        return _price("forward", adjoint, sizes(adjoint))
    depthwise = z.item * (z.ma * z.ca * DW_SPLIT_S + z.rows * z.t * z.cb * DW_GRID_TAP_S)
    if z.cg == 1 and z.g > 1:       # the depthwise sums, and a change of layout
        return depthwise + z.item * (z.ma * z.ca + z.mb * z.cb) * z.layout
    return GATHER_FACTOR * _dense(primitive, plan, z)


def _calls(z: Sizes, taps: list[int], channels: int, channels_first: bool) -> float:
    """The numpy calls of the blocks of rows (a copy per tap gathered and one product), per
    group of ``taps`` gathered together, each tap's row ``channels`` values wide."""
    block_bytes = _GROUPED_BLOCK_BYTES if channels_first else _BLOCK_BYTES
    return CALL_S * sum(_block_count(z.rows, n * channels * 4 * z.item, block_bytes) * (n + 1)
                        for n in taps)


def _dense(primitive: str, plan: ConvPlan, z: Sizes) -> float:
    if primitive == "backward_data":
        # accumulated channels-first: runs of rows gathered, and a change of layout either
        # way for channels-last data (none for channels-first data)
        cf = _backward_data_channels_first(_Channels(plan), plan)
        layout = TRANSPOSE_S - z.layout if cf else z.layout
        gathered = z.rows * z.t * z.cb * COPY_S if cf else copy(z.rows * z.t * z.cb, z.og)
        return (z.item * (z.rows * z.cb * FILL_S + z.mb * z.cb * layout
                          + gathered + copy(z.ma * z.ca, z.run_a)
                          + z.ma * z.ca * layout)
                + sum(z.g * gemm(z.rows, ts * z.og, z.cg) for ts in z.phases)
                + _calls(z, z.phases, z.cb, cf))
    cf = _channels_first(_Channels(plan), plan)     # runs of rows, no change of layout
    gathered = z.rows * z.t * z.ca * COPY_S if cf else copy(z.rows * z.t * z.ca, z.cg)
    grid_layout = 0.0 if cf else z.layout
    calls = _calls(z, [z.t], z.ca, cf)
    if primitive == "forward":
        return (z.item * (z.split - z.ma * z.ca * (z.layout - grid_layout) + gathered
                          + z.mb * z.cb * (2 * FILL_S + grid_layout))
                + z.g * gemm(z.rows, z.t * z.cg, z.og) + calls)
    return (z.item * (z.split + z.rows * z.cb * FILL_S + z.mb * z.cb * z.layout
                      - (z.ma * z.ca + z.mb * z.cb) * (z.layout - grid_layout) + gathered)
            + z.g * gemm_long(z.og, z.rows, z.t * z.cg) + calls)


STRATEGIES = (
    strategy("gather", "forward", forward, _price),
    strategy("gather", "backward_data", backward_data, _price),
    strategy("gather", "backward_weights", backward_weights, _price),
)
