"""backward_data by one sub-pixel product (``subpixel``): multiply into all phases at once,
then depth to space.

Without zero taps in the phases' common window (every phase of every axis has a tap at each
of its ``L = max_shift + 1`` shifts: k2 s2, k4 s2, k16 s8, ...; :func:`applies`), cell ``q``
of phase ``r`` receives ``sum_m b[q - m] W[k(m, r)]``. So the ``L^nd`` shifted windows of
``b`` stacked along channels (``[rows, T*Og]``, ``T = prod(L)``) times the kernel arranged as
``[T*Og, S*Cg]`` (``S = prod(s)``) give every phase's cells in one matrix product, whose
``S*Cg`` columns stay wide where the gather strategy multiplies each phase into ``Cg``
columns; the product's rows are then interleaved into ``a``, block by block of lines (a
cache-sized interleaved copy of the block, its crop, bias and change of layout and dtype
written into ``a``: one pass over memory, split over threads). FCN-8s's 16x16 stride-8
up-sampling of 21 channels: 64 phases of 4 taps, one ``[4225, 84] x [84, 1344]`` product.
Every product is a real tap's, and cells outside ``a`` are dropped, so NaN and Inf in ``b``
propagate exactly.

The blocks replaced a whole interleaving copy followed by a whole change of layout (2-CPU
x86-64, float32): FCN-8s 26 -> 13.5 ms, the U-Net's 128->64 k2 s2 up-convolution (NCX) 36
-> 19, Mask R-CNN's 256->256 k2 s2 38 -> 34; the layers with few rows per line (DCGAN's,
HiFi-GAN's, nnU-Net's) as before.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from polyconv._geometry import ConvPlan
from polyconv._phases import phases

from ._common import canonical_weights, channels_last_view, dtypes, moveaxis, split_rows
from ._costs import CALL_S, FILL_S, Sizes, copy, gemm, strategy

#: bytes of the product one block interleaves (it and its copy stay in cache)
_BLOCK_BYTES = 1 << 19
#: bytes of the product from which the interleave is split over threads (per thread)
_SPLIT_BYTES = 1 << 21


def applies(plan: ConvPlan) -> bool:
    """A stride, and every phase of every axis with a tap at each shift of the window."""
    return any(s > 1 for s in plan.strides) and phases(plan).fills_window


def _kernel(plan: ConvPlan, w: Any, acc: np.dtype) -> np.ndarray:
    """``[G, T*Og, S*Cg]``: row ``(j.., o)`` (window row ``j = max_shift - m``), column
    ``(r.., i)``: the tap of shift ``m`` in phase ``r``."""
    g, nd = plan.groups, plan.ndim
    wk = canonical_weights(w, plan, acc)                          # [Cb, Cg, K..]
    for i, p in enumerate(phases(plan).axes):
        index = np.array(p.window_taps, dtype=np.intp)   # no zero taps (:func:`applies`)
        axis = 2 + 2 * i                     # earlier axes already split in (L, s)
        wk = np.take(wk, index.reshape(-1), axis=axis)
        wk = wk.reshape((*wk.shape[:axis], *index.shape, *wk.shape[axis + 1:]))
    lengths = wk.shape[2::2]
    wk = wk.reshape((g, plan.b_channels // g, *wk.shape[1:]))    # [G, Og, Cg, L1, s1, ..]
    order = (0, *(3 + 2 * i for i in range(nd)), 1, *(4 + 2 * i for i in range(nd)), 2)
    return np.ascontiguousarray(wk.transpose(order)).reshape(
        (g, math.prod(lengths) * plan.b_channels // g, -1))


def _patches(plan: ConvPlan, b: Any, acc: np.dtype) -> np.ndarray:
    """``[G, N*rows.., T*Og]``: window row ``j`` of output cell ``q`` reads ``b[q - L + 1 + j]``
    (zero outside ``b``)."""
    axes = phases(plan).axes
    g = plan.groups
    x = channels_last_view(b, plan)                               # [N, B.., Cb]
    pads, cut = [(0, 0)], [slice(None)]
    for p in axes:        # zeros around b, or rows of b no cell reads (large pads) cut off
        lo, hi = p.window_pads
        pads.append((max(lo, 0), max(hi, 0)))
        cut.append(slice(max(-lo, 0), p.small - max(-hi, 0)))
    x = np.pad(x[tuple(cut)].astype(acc, copy=False), [*pads, (0, 0)])
    rows = tuple(p.rows for p in axes)
    out = np.empty((plan.batch, *rows, math.prod(p.max_shift + 1 for p in axes),
                    g, plan.b_channels // g), dtype=acc)
    for t, offset in enumerate(itertools.product(*(range(p.max_shift + 1) for p in axes))):
        window = tuple(slice(o, o + n) for o, n in zip(offset, rows))
        out[(slice(None), *(slice(None),) * len(rows), t)] = x[(slice(None), *window)].reshape(
            (plan.batch, *rows, g, plan.b_channels // g))
    out = moveaxis(out, -2, 0)                                 # [G, N, rows.., T, Og]
    return out.reshape((g, -1, out.shape[-2] * out.shape[-1]))


def backward_data(plan: ConvPlan, b: Any, w: Any, bias: Any = None) -> np.ndarray:
    """One product per group into every phase's cells, then depth to space (module doc), by
    blocks of lines (the first spatial axis of the phase grid) on threads."""
    out_dtype, acc = dtypes(b, plan)
    axes = phases(plan).axes
    g, nd = plan.groups, plan.ndim
    y = np.matmul(_patches(plan, b, acc), _kernel(plan, w, acc))  # [G, N*rows.., S*Cg]
    lines, per_line = axes[0].rows, math.prod(p.rows for p in axes[1:])
    out = np.empty(plan.a_shape, dtype=out_dtype)
    dst = channels_last_view(out, plan)                               # [N, X.., C]
    bias = None if bias is None else np.asarray(bias).astype(acc, copy=False)
    line_bytes = per_line * y.shape[-1] * g * acc.itemsize
    step = max(1, _BLOCK_BYTES // max(line_bytes, 1))
    # the interleave, as a view of a block's product: [lines, s1, R2, s2, .., G, Cg]
    order = (1, 1 + nd, *itertools.chain.from_iterable((1 + i, 1 + nd + i)
                                                        for i in range(1, nd)), 0, 1 + 2 * nd)
    first, rest = axes[0], tuple(slice(p.crop, p.crop + p.size) for p in axes[1:])

    def work(j: int, hi: int) -> None:
        while j < hi:
            n, r0 = divmod(j, lines)
            r1 = min(r0 + step, lines, r0 + hi - j)
            j += r1 - r0
            # the block's cells of a along the first axis: u = r*s + phase in [crop, crop + size)
            u0 = max(r0 * first.stride, first.crop)
            u1 = min(r1 * first.stride, first.crop + first.size)
            if u1 <= u0:
                continue
            block = y[:, (n * lines + r0) * per_line: (n * lines + r1) * per_line]
            block = block.reshape((g, r1 - r0, *(p.rows for p in axes[1:]),
                                   *(p.stride for p in axes), -1)).transpose(order)
            block = block.reshape(((r1 - r0) * first.stride,
                                   *(p.rows * p.stride for p in axes[1:]), plan.a_channels))
            cells = block[(slice(u0 - r0 * first.stride, u1 - r0 * first.stride), *rest)]
            if bias is not None:
                cells += bias
            dst[n, u0 - first.crop: u1 - first.crop] = cells

    split_rows(plan.batch * lines, work, min_rows=_SPLIT_BYTES // max(line_bytes, 1))
    return out


# --- the record: the window taps' patches, one product, depth to space -----------------------

#: its estimate (priced as the two whole copies it first made) doubled: so weighed, the model
#: picks it where it wins by 2x and leaves it to measuring where it is near
SUBPIXEL_FACTOR = 2.0


def _price(primitive: str, plan: ConvPlan, z: Sizes) -> float:
    if z.cg == 1 and z.g > 1:
        # one channel per group: the grid's tap sums are no product, which its product here
        # (per group [rows, L] x [L, S]) does not beat
        return math.inf
    sp = math.prod(plan.strides)
    window = z.t // sp
    return SUBPIXEL_FACTOR * (
        z.item * (copy(z.rows * window * z.cb, z.og) + copy(z.rows * sp * z.ca, z.cg)
                  + z.ma * z.ca * (FILL_S + z.layout) + z.mb * z.cb * z.layout)
        + z.g * gemm(z.rows, window * z.og, sp * z.cg) + (window + 8) * CALL_S)


STRATEGIES = (strategy("subpixel", "backward_data", backward_data, _price,
                       lambda plan, primitive: applies(plan)),)
