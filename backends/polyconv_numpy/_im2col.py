"""Channels-first data by columns (im2col): each image's taps copied into one matrix, one
product per image written in ``b``'s own layout.

For a block of output positions of one or more images (whole images where they fit a
cache-sized budget, else lines of the first spatial axis), the input lines the block reads are
copied, zero-padded, into a small buffer, and each tap's strided window of it into the rows of
a *columns* matrix ``[Ca*T, L]`` (channels-major, taps minor: the canonical weights' own
order, so ``W`` reshaped to ``[G, Og, Cg*T]`` reads in place). Then

* ``forward``: ``b[n][:, block] = W @ columns`` (per group), a product whose output is ``b``'s
  channels-first layout already: no phase grid, no crop of the grid's rows, no change of
  layout of ``b``;
* ``backward_weights``: ``dW += b[n][:, block] @ columns^T``.

Against the phase grid, which gathers runs of rows channels-first on a grid of all the images
and so ends in a transposing, cropping copy of ``b`` (``[Cb, N, P..]`` to ``[N, Cb, B..]``),
this copies ``T*Ca`` values per output position instead of ``Cb``: it wins where the written
side is wider than the gathered one (MNIST's 1->32 first layer, wav2vec 2.0's 1->512 feature
extractor, the gradients of ConvTransposes to few channels: pix2pix's 128->3, a 3-D decoder's
64->1) and on 1-D layers. The zero padding meets ``W`` (forward) and ``b`` (the weight
gradient), as on the grid: non-finite inputs take the exact path.

Memory: each thread fills one buffer with its blocks' columns, a block holding at most a
fraction of what ``a``, ``b`` and the weights hold (at least one line), and a 16-bit output is
rounded block by block from a float32 buffer of the same size: peak extra memory within
twice the inputs and output.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from polyconv._geometry import ConvPlan

from ._common import canonical_weights, dtypes, in_range, split_products, threads
from ._costs import CALL_S, FILL_S, Sizes, copy, gemm, gemm_long, strategy

#: bytes of one block's columns (with its padded buffer, it stays in cache) ...
_BLOCK_BYTES = 1 << 21
#: ... unless that leaves fewer output positions than this in a block (deep columns: the
#: products then get too few columns to run at their rate), up to :data:`_MAX_BLOCK_BYTES`
_MIN_POSITIONS = 1024
_MAX_BLOCK_BYTES = 1 << 23
#: ... and, per thread, at most what ``a``, ``b`` and the weights hold (in the accumulation
#: dtype) over this; a block is at least one line of the first spatial axis
_DATA_SHARE = 2


def applies(plan: ConvPlan, primitive: str | None = None) -> bool:
    """Channels-first data, not depthwise; forward and backward_weights."""
    return (primitive in (None, "forward", "backward_weights") and not plan.channels_last
            and not (plan.a_channels == plan.groups > 1))


class Columns:
    """One plan's blocks and the taps' windows on each block's padded buffer."""

    def __init__(self, plan: ConvPlan, acc: np.dtype, rounded: bool = False):
        self.plan, self.acc = plan, acc
        self.taps = list(np.ndindex(*plan.kernel))
        self.depth = plan.a_channels * len(self.taps)          # rows of the columns
        b = plan.b_spatial
        self.per_line = math.prod(b[1:])
        self.positions = math.prod(b)
        #: the extent of ``a`` (padded) that the windows of ``b`` read, per axis
        self.extent = [(n - 1) * s + ek for n, s, ek in
                       zip(b, plan.strides, plan.effective_kernel)]
        # a position's bytes in a block: its column, and its sums where they are rounded to
        # a 16-bit output block by block (``rounded``)
        column = (self.depth + (plan.b_channels if rounded else 0)) * acc.itemsize
        budget = max(_BLOCK_BYTES, min(_MAX_BLOCK_BYTES, column * _MIN_POSITIONS))
        if _DATA_SHARE:     # the threads' blocks within the memory bound on small layers
            data = (plan.batch * (plan.a_channels * math.prod(plan.a_spatial)
                                  + plan.b_channels * self.positions)
                    + plan.b_channels * self.depth // plan.groups)
            budget = min(budget, data * acc.itemsize // (_DATA_SHARE * threads()))
        self.images = max(1, min(plan.batch, budget // max(column * self.positions, 1)))
        self.lines = b[0] if self.images > 1 else max(1, min(
            b[0], budget // max(column * self.per_line, 1)))
        #: (first image, end image, first line, end line) of each block
        self.blocks = [(n, min(plan.batch, n + self.images), y, min(b[0], y + self.lines))
                       for n in range(0, plan.batch, self.images)
                       for y in range(0, b[0], self.lines)]

    def _padded(self, a: np.ndarray, n0: int, n1: int, y0: int, y1: int) -> np.ndarray:
        """The lines of images ``n0:n1`` that output lines ``y0:y1`` read, zero-padded:
        ``[n, Ca, lines, E..]``."""
        plan = self.plan
        first = y0 * plan.strides[0] - plan.pads_begin[0]      # in a's coordinates
        extent = [(y1 - y0 - 1) * plan.strides[0] + plan.effective_kernel[0], *self.extent[1:]]
        buf = np.zeros((n1 - n0, plan.a_channels, *extent), dtype=self.acc)
        parts = [in_range(start, size, e) for start, size, e in
                 zip([first, *(-p for p in plan.pads_begin[1:])], plan.a_spatial, extent)]
        buf[(slice(None), slice(None), *(d for d, _ in parts))] = a[
            (slice(n0, n1), slice(None), *(s for _, s in parts))]
        return buf

    def buffer(self, rows: int | None = None) -> np.ndarray:
        """One thread's buffer for the columns of any of the blocks (:meth:`columns`), or for
        ``rows`` values per position."""
        rows = self.depth if rows is None else rows
        return np.empty(rows * self.images * self.lines * self.per_line, dtype=self.acc)

    def columns(self, a: np.ndarray, block: tuple[int, int, int, int],
                buf: np.ndarray) -> np.ndarray:
        """``[n, Ca*T, L]``: the taps' windows of one block, channels-major, in ``buf``."""
        n0, n1, y0, y1 = block
        plan, padded = self.plan, self._padded(a, n0, n1, y0, y1)
        sizes = (y1 - y0, *plan.b_spatial[1:])
        shape = (n1 - n0, plan.a_channels, len(self.taps), *sizes)
        cols = buf[: math.prod(shape)].reshape(shape)
        for t, k in enumerate(self.taps):
            window = tuple(slice(kk * d, kk * d + (n - 1) * s + 1, s) for kk, d, n, s in
                           zip(k, plan.dilations, sizes, plan.strides))
            cols[:, :, t] = padded[(slice(None), slice(None), *window)]
        return cols.reshape(n1 - n0, self.depth, -1)

    def split(self, work) -> list:
        """``work(blocks)`` over the blocks, on threads where each column is long enough for
        the products to be split rather than threaded by BLAS (:func:`split_products`)."""
        return split_products(len(self.blocks), self.depth,
                              lambda lo, hi: work(self.blocks[lo:hi]), min_rows=1)


def _weights(plan: ConvPlan, w: Any, acc: np.dtype) -> np.ndarray:
    """``[G, Og, Cg*T]``: the canonical weights, channels-major (no copy of their order)."""
    g = plan.groups
    return canonical_weights(w, plan, acc).reshape(g, plan.b_channels // g, -1)


def forward(plan: ConvPlan, a: Any, w: Any, bias: Any = None) -> np.ndarray:
    out_dtype, acc = dtypes(a, plan)
    a, wm, g = np.asarray(a), _weights(plan, w, acc), plan.groups
    cols = Columns(plan, acc, rounded=out_dtype != acc)
    b = np.empty((plan.batch, plan.b_channels, cols.positions), dtype=out_dtype)
    bias_acc = None if bias is None else np.asarray(bias).astype(acc)[:, None]

    def work(blocks) -> None:
        buf = cols.buffer()
        rounded = None if out_dtype == acc else cols.buffer(plan.b_channels)
        for block in blocks:
            n0, n1, y0, y1 = block
            c = cols.columns(a, block, buf)
            out = b[n0:n1, :, y0 * cols.per_line: y1 * cols.per_line]
            sums = out if rounded is None else rounded[: out.size].reshape(out.shape)
            np.matmul(wm, c.reshape(n1 - n0, g, -1, c.shape[-1]),
                      out=sums.reshape(n1 - n0, g, -1, c.shape[-1]))
            if bias_acc is not None:
                sums += bias_acc
            if sums is not out:
                out[...] = sums                 # the one rounding to a 16-bit output

    cols.split(work)
    return b.reshape(plan.b_shape)


def backward_weights(plan: ConvPlan, a: Any, b: Any) -> np.ndarray:
    out_dtype, acc = dtypes(a, plan)
    a, g, og = np.asarray(a), plan.groups, plan.b_channels // plan.groups
    cols = Columns(plan, acc)
    bm = np.asarray(b).reshape(plan.batch, g, og, cols.positions)

    def work(blocks) -> np.ndarray:
        dw, buf = np.zeros((g, og, cols.depth // g), dtype=acc), cols.buffer()
        for block in blocks:
            n0, n1, y0, y1 = block
            c = cols.columns(a, block, buf)
            c = c.reshape(n1 - n0, g, -1, c.shape[-1]).transpose(0, 1, 3, 2)
            rows = bm[n0:n1, :, :, y0 * cols.per_line: y1 * cols.per_line]
            for i in range(n1 - n0):
                dw += np.matmul(rows[i].astype(acc, copy=False), c[i])
        return dw

    dw = sum(cols.split(work))
    canon = dw.reshape(plan.b_channels, plan.a_channels // g, *plan.kernel)
    return np.ascontiguousarray(np.transpose(canon, plan.weights_inverse_perm),
                                dtype=out_dtype)


# --- the records: the columns per block and one product per group -----------------------------

#: its estimates weighed against its times: up, so that the model leaves the layers whose
#: columns are much deeper than ``b`` is wide to the grid and to measuring
IM2COL_FACTOR = 1.1
IM2COL_GRAD_FACTOR = 1.4


def _price(primitive: str, plan: ConvPlan, z: Sizes) -> float:
    """A zero-padded copy of the lines a block reads, each tap's window of it copied into the
    columns (runs of ``b``'s last axis, strided where that axis is), and the products
    ``[Og, Cg*T] x [Cg*T, L]`` per group, written into ``b`` in place (the weight gradient:
    their long-contraction form)."""
    cols = Columns(plan, np.dtype(plan.acc_dtype))
    run = plan.b_spatial[-1] if plan.strides[-1] == 1 else 1
    copies = z.item * (z.ma * z.ca * 2 * FILL_S + copy(z.mb * z.t * z.ca, run))
    calls = len(cols.blocks) * (z.t + 3) * CALL_S
    if primitive == "backward_weights":
        product = z.g * gemm_long(z.og, z.mb, z.t * z.cg)
        return IM2COL_GRAD_FACTOR * (copies + product + calls)
    product = z.g * gemm(z.mb, z.t * z.cg, z.og) + z.item * z.mb * z.cb * FILL_S
    return IM2COL_FACTOR * (copies + product + calls)


STRATEGIES = (strategy("im2col", "forward", forward, _price, applies),
              strategy("im2col", "backward_weights", backward_weights, _price, applies))
