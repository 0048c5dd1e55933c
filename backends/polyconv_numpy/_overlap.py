"""Multiply-then-overlap-add for backward_data: one matrix product for all taps, then a
shifted add per tap.

Where :mod:`._fast` gathers every tap's rows and multiplies once (good when the side it gathers
is narrow relative to the side it writes), this path multiplies ``b`` once by all taps' weights
side by side and adds each tap's slice of the product into the strided window of ``a`` it lands
on (GEMM + col2im, what PyTorch's CPU fallback does for the transposed direction)::

    Y = b @ [W_t for t]      [rows of b, Cb] x [Cb, T*Ca]
    a[y*s + k_t*d - pb] += Y[y, t]          (in-range windows only)

The product is as wide as all taps of ``a``'s channels (``T*Ca``), so it stays an efficient
matrix product when ``a`` is narrow, and nothing is gathered: per tap only ``rows x Ca``
values are added instead of ``rows x Cb`` copied. The windows are the in-range ones of
:mod:`polyconv._phases` (docs/semantics.md#canonical-convolution): no padded position
contributes a term, so NaN and Inf propagate exactly as on :mod:`._exact`
(docs/numerics.md#nan-and-inf). Sums are accumulated in float32 (float64 for float64) and
rounded to the output dtype once, after the bias (docs/numerics.md#error-bound). The same
algorithm for the forward direction won no layer of the corpus and was removed
(docs/design_notes.md).

Where the kernel is no larger than the stride, each output position receives at most one
tap's product: backward_data then copies each product into place (with the bias) instead of
adding it into zeroed accumulators, and fills only the cells no tap reaches (U-Net's 2x2
stride-2 up-convolutions: 9.7 -> 6.1 ms at 128->64 on 128x128, nnU-Net's 3-D one 6.1 -> 4.7).

Memory: the product is computed per block of the read side (a few batch elements, or a slab of
the first spatial axis, about :data:`BLOCK_BYTES`, more for a large product) into one reused
buffer. backward_data with few channels per group (or channels-first data) accumulates per
phase of the output, channels-first, one block of batch elements at a time
(:class:`_PhaseSums`); otherwise the accumulator is the output itself when it is channels-last
in the accumulation dtype, else one block of batch elements.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from polyconv._geometry import ConvPlan
from polyconv._phases import phases

from ._common import (
    add_bias,
    canonical_weights,
    channels_last_view,
    dtypes,
    moveaxis,
    weights_matrix,
)
from ._costs import CALL_S, FILL_S, TRANSPOSE_S, Sizes, add, copy, gemm, strategy

#: target size of one block of the product (``rows x T*C``); one buffer of it is reused by
#: every block (a fresh multi-megabyte array pays a page fault per 4 KiB on first touch)
BLOCK_BYTES = 2 << 20
#: ... growing to a 16th of the whole product, up to this: each block issues a numpy call per
#: tap, and many taps on few channels made blocks of one row (FCN-8s's 16x16 stride-8
#: up-sampling of 21 channels: 64 blocks of 256 adds, 158 ms; 16 blocks, 65-74)
LARGE_BLOCK_BYTES = 8 << 20


def _budget(batch: int, rows0: int, row_bytes: int) -> int:
    return max(BLOCK_BYTES, min(LARGE_BLOCK_BYTES, batch * rows0 * row_bytes // 16))


def _output(plan: ConvPlan, channels: int, spatial: tuple[int, ...], dtype: np.dtype):
    """The result in the user's layout and dtype, and its channels-last view."""
    if plan.channels_last:
        out = np.empty((plan.batch, *spatial, channels), dtype=dtype)
        return out, out
    out = np.empty((plan.batch, channels, *spatial), dtype=dtype)
    return out, moveaxis(out, 1, -1)


class _Scratch:
    """One reusable flat buffer per role, grown when a block needs more."""

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype
        self.bufs: dict[str, np.ndarray] = {}

    def get(self, role: str, shape: tuple[int, ...]) -> np.ndarray:
        size = math.prod(shape)
        buf = self.bufs.get(role)
        if buf is None or buf.size < size:
            buf = self.bufs[role] = np.empty(size, dtype=self.dtype)
        return buf[:size].reshape(shape)


def _view(x: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``x`` reshaped without a copy, or ``None`` where that needs one."""
    v = x.reshape(shape)
    return v if np.may_share_memory(v, x) else None


def _blocks(batch: int, rows0: int, row_bytes: int):
    """``(n0, n1, y0, y1)``: batch elements ``n0:n1`` and rows ``y0:y1`` of the first spatial
    axis of the read side, about :data:`BLOCK_BYTES` of product each (``row_bytes`` per row of
    that axis; more for a large product: :data:`LARGE_BLOCK_BYTES`)."""
    sample, budget = rows0 * row_bytes, _budget(batch, rows0, row_bytes)
    if sample <= budget:
        nb = max(1, budget // max(sample, 1))
        for n0 in range(0, batch, nb):
            yield n0, min(batch, n0 + nb), 0, rows0
        return
    step = max(1, budget // max(row_bytes, 1))
    for n in range(batch):
        for y0 in range(0, rows0, step):
            yield n, n + 1, y0, min(rows0, y0 + step)


def block_count(batch: int, rows0: int, row_bytes: int) -> int:
    """How many blocks :func:`_blocks` cuts (each block issues a numpy call per tap), counted
    without walking them: a huge output must reach its allocation's MemoryError at once."""
    sample, budget = rows0 * row_bytes, _budget(batch, rows0, row_bytes)
    if sample <= budget:
        return -(-batch // max(1, budget // max(sample, 1)))
    return batch * -(-rows0 // max(1, budget // max(row_bytes, 1)))


def plan_blocks(plan: ConvPlan, itemsize: int) -> int:
    """How many blocks the product of ``plan``'s backward_data is cut into."""
    return block_count(plan.batch, plan.b_spatial[0], product_row_bytes(plan, itemsize))


def product_row_bytes(plan: ConvPlan, itemsize: int) -> int:
    """Bytes of the product per row of ``b``'s first spatial axis, the axis :func:`_blocks`
    cuts: ``T*Ca`` per position of ``b``."""
    return math.prod(plan.b_spatial[1:]) * math.prod(plan.kernel) * plan.a_channels * itemsize


def _clip(win, lo: int, hi: int):
    """A tap's window on the first axis (``Window``: ``b`` rows and the ``a`` rows they pair
    with) clipped to ``b`` rows ``lo:hi``: ``(b rows, a rows)`` as plain ranges, or None."""
    y0, y1 = max(win.start, lo), min(win.stop, hi)
    if y1 <= y0:
        return None
    x0 = win.first + (y0 - win.start) * win.step
    return (y0, y1), (x0, x0 + (y1 - y0 - 1) * win.step + 1)


def _windows(plan: ConvPlan, lo: int, hi: int):
    """Per tap meeting ``b`` rows ``lo:hi`` of the first axis: ``(t, b_index, a_index,
    (x0, x1))`` with ``b_index`` relative to ``lo`` and ``(x0, x1)`` the span of ``a`` rows of
    the first axis it reads."""
    ph = phases(plan)
    ax0 = ph.axes[0]
    wins0 = [ax0.tap_window(k) for k in range(ax0.kernel)]
    out = []
    for t, b_index, a_index in ph.tap_windows:
        clipped = _clip(wins0[ph.taps[t].k[0]], lo, hi)
        if clipped is None:
            continue
        (y0, y1), (x0, x1) = clipped
        out.append((t, (slice(y0 - lo, y1 - lo), *b_index[1:]),
                    (slice(x0, x1, plan.strides[0]), *a_index[1:]), (x0, x1)))
    return out


class _Weights:
    """All taps' weights side by side, per group, for backward_data (read ``b``, write
    ``a``): ``[G, Og, T*Cg]``."""

    def __init__(self, plan: ConvPlan, w: Any, acc: np.dtype):
        g = plan.groups
        self.g, self.t = g, math.prod(plan.kernel)
        self.cg, self.og = plan.a_channels // g, plan.b_channels // g
        w4 = canonical_weights(w, plan, acc).reshape(g, self.og, self.cg, self.t)
        self.read, self.written = self.og, self.cg
        self.w = weights_matrix(w4, (1,), (3, 2))

    def product(self, x: np.ndarray, scratch: _Scratch) -> np.ndarray:
        """``[M, G*read]`` -> ``[M, G, T, written]``, in a reused buffer."""
        m, g = x.shape[0], self.g
        y = scratch.get("y", (m, g, self.t, self.written))
        if g == 1:
            np.matmul(x, self.w.reshape(self.read, -1), out=y.reshape(m, -1))
        elif self.read == 1:        # one channel read per group: a broadcast multiply
            np.multiply(x[:, :, None, None], self.w[:, 0].reshape(g, self.t, self.written),
                        out=y)
        else:
            np.matmul(x.reshape(m, g, self.read).transpose(1, 0, 2),
                      self.w.reshape(g, self.read, -1),
                      out=y.reshape(m, g, -1).transpose(1, 0, 2))
        return y


#: channels per group of the written side below which backward_data accumulates
#: channels-first (runs of the last spatial axis are then the longer ones)
CHANNELS_FIRST_BELOW = 32


def _channels_first(plan: ConvPlan) -> bool:
    """Whether backward_data accumulates channels-first."""
    return not plan.channels_last or plan.a_channels // plan.groups < CHANNELS_FIRST_BELOW


def backward_data(plan: ConvPlan, b: Any, w: Any, bias: Any = None) -> np.ndarray:
    if _channels_first(plan):
        return backward_data_channels_first(plan, b, w, bias)
    return backward_data_channels_last(plan, b, w, bias)


class _PhaseSums:
    """Per-phase accumulators ``[S, nb, G, Cg, P..]`` of one block of batch elements.

    Tap ``t`` (phase ``r``, shift ``q``) adds its ``[nb, G, Cg, rows..]`` product into cells
    ``y + q`` of phase ``r``; :meth:`flush` writes each phase's in-range cells to the output.
    """

    def __init__(self, plan: ConvPlan, acc: np.dtype):
        self.plan, self.acc, self.ph = plan, acc, phases(plan)
        self.cells = tuple(max(ax.cells, ax.small + ax.max_shift) for ax in self.ph.axes)
        self.index = {r: i for i, r in
                      enumerate(itertools.product(*(range(s) for s in plan.strides)))}
        self.buf: np.ndarray | None = None
        self.block: tuple[int, int] | None = None

    def start(self, n0: int, n1: int) -> None:
        g = self.plan.groups
        shape = (len(self.index), n1 - n0, g, self.plan.a_channels // g, *self.cells)
        if self.buf is None or self.buf.shape != shape:
            self.buf = np.empty(shape, dtype=self.acc)
        self.buf[...] = 0
        self.block = (n0, n1)

    def add(self, y: np.ndarray, y0: int, y1: int) -> None:
        """``y`` ``[nb, G, T, Cg, y1 - y0, B..]``: the product for rows ``y0:y1`` of ``b``."""
        full, rest = slice(None), self.plan.b_spatial[1:]
        for t, tap in enumerate(self.ph.taps):
            dst = (self.index[tap.phase], full, full, full,
                   slice(y0 + tap.shift[0], y1 + tap.shift[0]),
                   *(slice(q, q + sz) for q, sz in zip(tap.shift[1:], rest)))
            view = self.buf[dst]
            view += y[:, :, t]

    def flush(self, out_cf: np.ndarray, bias: Any) -> None:
        """Bias, then each phase's in-range cells into ``out_cf`` ``[N, G, Cg, A..]`` (the
        rounding)."""
        if self.block is None:
            return
        n0, n1 = self.block
        full, plan = slice(None), self.plan
        add_bias(moveaxis(self.buf.reshape(len(self.index), n1 - n0, plan.a_channels,
                                              *self.cells), 2, -1), bias)
        for r, i in self.index.items():
            win = self.ph.phase_window(r, self.cells)
            if win is not None:
                out_cf[(slice(n0, n1), full, full, *win[1])] = self.buf[(i, full, full, full,
                                                                         *win[0])]
        self.block = None


def backward_data_channels_first(plan: ConvPlan, b: Any, w: Any,
                                 bias: Any = None) -> np.ndarray:
    """col2im into per-phase accumulators, channels-first.

    Per block of batch elements (or slab of the first axis of ``b``):
    ``Y[n, g, t, i, y] = sum_o W[g, o, i, t] b[n, g, o, y]`` (one product, ``[T*Cg, Og] x [Og,
    rows]``), then tap ``t`` (phase ``r``, shift ``q``) adds ``Y[:, :, t]`` into cells ``y + q``
    of phase ``r``'s accumulator ``[N, G, Cg, P..]``: unit-stride runs along the last spatial
    axis, whatever the channel count. Each phase's in-range cells are then written to the
    output once (the rounding). The accumulator's extra cells only ever receive products
    whose position lies outside ``a``: they are dropped, so NaN and Inf propagate exactly.
    """
    out_dtype, acc = dtypes(b, plan)
    g, t_n, n = plan.groups, math.prod(plan.kernel), plan.batch
    cg, og = plan.a_channels // g, plan.b_channels // g
    w4 = canonical_weights(w, plan, acc).reshape(g, og, cg, t_n)
    # the product's rows in the weights' own order where taps are inner there (OIX, IOX) and
    # the weights outweigh one image's product: they are then read in place, not copied on
    # every call, and the product's taps are read at a stride (slower where it is the larger)
    taps_inner = (abs(w4.strides[3]) < abs(w4.strides[2])
                  and og > math.prod(plan.b_spatial))
    wcf = weights_matrix(w4, (2, 3) if taps_inner else (3, 2), (1,))  # [G, T*Cg, Og]
    bsp, rest = plan.b_spatial, math.prod(plan.b_spatial[1:])
    b_arr = np.asarray(b)
    if plan.channels_last:          # [N, G, Og, B0, rest] views
        bv = b_arr.reshape(n, bsp[0], rest, g, og).transpose(0, 3, 4, 1, 2)
    else:
        bv = b_arr.reshape(n, g, og, bsp[0], rest)
    out, out_cl = _output(plan, plan.a_channels, plan.a_spatial, out_dtype)
    out_cf = moveaxis(out_cl, -1, 1).reshape(n, g, cg, *plan.a_spatial)
    sums, scratch = _PhaseSums(plan, acc), _Scratch(acc)
    single = phases(plan).one_tap_per_phase
    if single and not phases(plan).windows_cover:       # cells no tap reaches: the bias alone
        out_cl[...] = 0 if bias is None else np.asarray(bias).astype(acc)
    per_row = product_row_bytes(plan, acc.itemsize)
    for n0, n1, y0, y1 in _blocks(n, bsp[0], per_row):
        nb = n1 - n0
        if not single and (n0, n1) != sums.block:
            sums.flush(out_cf, bias)
            sums.start(n0, n1)
        src = bv[n0:n1, :, :, y0:y1]
        in_place = src.dtype == acc and not (g > 1 and plan.channels_last)
        x = _view(src, (nb, g, og, -1)) if in_place else None
        if x is None:
            # the product reads a transposed view in place for one group (BLAS transposes
            # an operand for free); a grouped channels-last or 16-bit b is copied per block
            x = scratch.get("x", src.shape)
            x[...] = src
            x = x.reshape(nb, g, og, -1)
        # [nb, G, T*Cg, rows]; one channel per group read: a broadcast multiply
        y = scratch.get("y", (nb, g, t_n * cg, x.shape[-1]))
        (np.multiply if og == 1 else np.matmul)(wcf[None], x, out=y)
        if taps_inner:
            y = y.reshape(nb, g, cg, t_n, y1 - y0, *bsp[1:]).swapaxes(2, 3)
        else:
            y = y.reshape(nb, g, t_n, cg, y1 - y0, *bsp[1:])
        if single:
            _scatter(out_cf[n0:n1], y, bias, plan, y0, y1)
        else:
            sums.add(y, y0, y1)
    if not single:
        sums.flush(out_cf, bias)
    return out


def _scatter(out_cf: np.ndarray, y: np.ndarray, bias: Any, plan: ConvPlan, y0: int,
             y1: int) -> None:
    """One term per cell: each tap's product for ``b`` rows ``y0:y1`` (``y``: ``[nb, G, T, Cg,
    rows..]``), plus the bias, copied into its in-range window of ``out_cf`` (``[nb, G, Cg,
    A..]``): the one rounding."""
    full = slice(None)
    if bias is not None:
        g, cg = y.shape[1], y.shape[3]
        y += np.asarray(bias).astype(y.dtype).reshape(g, 1, cg, *(1,) * plan.ndim)
    for t, b_index, a_index, _ in _windows(plan, y0, y1):
        out_cf[(full, full, full, *a_index)] = y[(full, full, t, full, *b_index)]


def backward_data_channels_last(plan: ConvPlan, b: Any, w: Any,
                                bias: Any = None) -> np.ndarray:
    """col2im channels-last: each tap's ``[rows, Ca]`` slice of ``b @ W_all`` is added into
    the in-range window of the output (or of a block accumulator), runs of ``Ca``."""
    out_dtype, acc = dtypes(b, plan)
    wt = _Weights(plan, w, acc)
    b_cl = channels_last_view(b, plan)
    out, out_cl = _output(plan, plan.a_channels, plan.a_spatial, out_dtype)
    direct = plan.channels_last and out_dtype == acc
    g, cg = plan.groups, wt.cg
    b_rest = plan.b_spatial[1:]
    scratch = _Scratch(acc)
    # one term per cell (e.g. kernel = stride): copies, into an accumulator zeroed only where
    # some cells receive no term
    single = phases(plan).one_tap_per_phase
    for n0, n1, y0, y1, buf in _accumulated(plan, out_cl, bias, direct,
                                            product_row_bytes(plan, acc.itemsize),
                                            (*plan.a_spatial, plan.a_channels), acc,
                                            zero=not (single and phases(plan).windows_cover)):
        nb = n1 - n0
        x = np.ascontiguousarray(b_cl[n0:n1, y0:y1], dtype=acc)
        y = wt.product(x.reshape(-1, plan.b_channels), scratch)
        y = y.reshape(nb, y1 - y0, *b_rest, g, wt.t, cg)
        acc_v = buf.reshape(nb, *plan.a_spatial, g, cg)
        for t, b_index, a_index, _ in _windows(plan, y0, y1):
            src = y[(slice(None), *b_index, slice(None), t)]
            if single:
                acc_v[(slice(None), *a_index)] = src
            else:
                view = acc_v[(slice(None), *a_index)]
                view += src
    return out


def _accumulated(plan: ConvPlan, out_cl: np.ndarray, bias: Any, direct: bool, per_row: int,
                 shape: tuple[int, ...], acc, zero: bool = True):
    """The blocks ``(n0, n1, y0, y1)`` of :func:`_blocks`, each with the accumulator of its
    batch block ``n0:n1``, zeroed unless not ``zero`` (``shape`` is one batch element's
    ``(spatial.., channels)``).
    ``direct`` accumulates in ``out_cl`` itself; otherwise each batch block's accumulator is
    rounded into ``out_cl``, with the bias, once its last block has been added."""
    buf, prev = None, None
    for n0, n1, y0, y1 in _blocks(plan.batch, plan.b_spatial[0], per_row):
        if (n0, n1) != prev:            # a new batch block: a fresh accumulator
            if prev is not None and not direct:
                _finish(out_cl, prev, buf, bias)
            if direct:
                buf = out_cl[n0:n1]
            elif buf is None or buf.shape[0] != n1 - n0:
                buf = np.empty((n1 - n0, *shape), dtype=acc)
            if zero:
                buf[...] = 0
            prev = (n0, n1)
        yield n0, n1, y0, y1, buf
    if direct:
        add_bias(out_cl, bias)
    elif prev is not None:
        _finish(out_cl, prev, buf, bias)


def _finish(out_cl: np.ndarray, block: tuple[int, int], buf: np.ndarray, bias: Any) -> None:
    """Bias, then the one rounding (and layout change) of a block of batch elements."""
    add_bias(buf, bias)
    out_cl[block[0]:block[1]] = buf


# --- the records: one product, then an add per tap and block ---------------------------------

def _price(primitive: str, plan: ConvPlan, z: Sizes) -> float:
    calls = z.t * CALL_S * plan_blocks(plan, z.item * 4)
    if not _channels_first(plan):
        moves = (z.mb * z.cb * FILL_S + add(z.mb * z.t * z.ca, z.ca)
                 + 2 * z.ma * z.ca * FILL_S)
        return z.item * moves + z.g * gemm(z.mb, z.og, z.t * z.cg) + calls
    last_b = plan.b_spatial[-1]
    read = z.mb * z.cb * TRANSPOSE_S if plan.channels_last and z.g > 1 else 0.0
    moves = (read + add(z.mb * z.t * z.ca, last_b)
             + math.prod(plan.strides) * z.rows * z.ca * FILL_S
             + copy(z.ma * z.ca, 1 if plan.strides[-1] > 1 else last_b)
             + (z.ma * z.ca * TRANSPOSE_S if plan.channels_last else 0))
    # one [T*Cg, Og] x [Og, columns] product per batch element (or block) and group
    products = max(plan.batch, plan_blocks(plan, 4 * z.item))
    return (z.item * moves + products * z.g * gemm(z.t * z.cg, z.og, z.mb / products)
            + calls)


STRATEGIES = (
    strategy("matmul_overlap_add", "backward_data", backward_data, _price, exact_on_nonfinite=True),
)
