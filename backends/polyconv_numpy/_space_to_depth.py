"""Space to depth: a strided convolution as a stride-1 one over blocks of ``s`` positions.

Cut the zero-padded ``a`` into blocks of ``s`` positions per axis (the stride) and stack each
block's ``s^nd * Ca`` values as one row: the space-to-depth tensor ``S``, one copy of ``a``.
Window ``y`` of the convolution is then the ``m = ceil(K/s)`` blocks ``y + q`` per axis, so

    ``b[y] = sum_q S[y + q] @ W_q``        (``W_q``: the taps ``q*s .. q*s + s-1`` of each axis,
                                            zero past the kernel; ``[s^nd * Ca, Cb]``)

``m^nd`` products with a deep contraction, each over a *contiguous* range of ``S``'s rows: laid
out with the blocks' extent ``E = B + m - 1`` on every axis (and the images one after another),
the rows ``y + q`` are the rows ``y`` shifted by one offset, and the positions past ``B`` on
the inner axes are computed and dropped. Nothing is gathered tap by tap, where the phase grid
copies ``T*Ca`` values per output row: FCN-8s's 16x16 stride-8 kernel on 21 channels (5376
values a row) is four products with a contraction of 1344.

``forward`` sums the products into ``b``; ``backward_weights`` is ``dW_q = S[shifted]^T @ b``
with ``b`` laid out on the same rows (zeros at the dropped ones). Channels-first data keeps its
layout: ``S`` is ``[Ca*s^nd, E..]`` per image and the products ``W_q^T @ S_n`` are ``b``
channels-first. The zero taps past the kernel and the zero padding meet the data and the
weights, so the backend hands non-finite inputs to its exact path.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from polyconv._geometry import ConvPlan

from ._common import canonical_weights, dtypes, in_range, row_strides
from ._costs import FILL_S, Sizes, add, copy, gemm, gemm_long, strategy


def applies(plan: ConvPlan, primitive: str | None = None) -> bool:
    """Ungrouped, undilated; forward and backward_weights."""
    return (primitive in (None, "forward", "backward_weights") and plan.groups == 1
            and all(d == 1 for d in plan.dilations))


class Blocks:
    """The blocks' geometry of one plan: per axis ``m = ceil(K/s)`` blocks per window and the
    extent ``E = B + m - 1``; the row offset of each block of a window, and the run of rows
    (per image, or across the images channels-last) that holds every output position."""

    def __init__(self, plan: ConvPlan):
        self.plan = plan
        s = self.s = tuple(plan.strides)
        self.m = tuple(-(-k // si) for k, si in zip(plan.kernel, s))
        self.extent = tuple(b + m - 1 for b, m in zip(plan.b_spatial, self.m))
        strides = row_strides(self.extent)
        self.offsets = [sum(q * st for q, st in zip(qs, strides))
                        for qs in itertools.product(*(range(m) for m in self.m))]
        self.per_image = math.prod(self.extent)
        self.run = sum((b - 1) * st for b, st in zip(plan.b_spatial, strides)) + 1
        self.depth = plan.a_channels * math.prod(s)
        self.crop = tuple(slice(0, b) for b in plan.b_spatial)

    def tensor(self, a: Any, acc: np.dtype) -> np.ndarray:
        """``S``: ``[N*E.., s..*Ca]`` channels-last, ``[N, Ca*s.., E..]`` channels-first."""
        plan, nd = self.plan, self.plan.ndim
        a = np.asarray(a)
        padded_shape = tuple(e * s for e, s in zip(self.extent, self.s))
        # the positions of a that the blocks hold (a tail that no window reads is left out)
        parts = [in_range(-pb, size, p)
                 for size, p, pb in zip(plan.a_spatial, padded_shape, plan.pads_begin)]
        dst, src = tuple(d for d, _ in parts), tuple(r for _, r in parts)
        pairs = [d for e, s in zip(self.extent, self.s) for d in (e, s)]
        if plan.channels_last:
            padded = np.zeros((plan.batch, *padded_shape, plan.a_channels), dtype=acc)
            padded[(slice(None), *dst)] = a[(slice(None), *src)]
            split = padded.reshape(plan.batch, *pairs, plan.a_channels)
            order = (0, *range(1, 2 * nd, 2), *range(2, 2 * nd + 1, 2), 2 * nd + 1)
            return np.ascontiguousarray(split.transpose(order)).reshape(-1, self.depth)
        padded = np.zeros((plan.batch, plan.a_channels, *padded_shape), dtype=acc)
        padded[(slice(None), slice(None), *dst)] = a[(slice(None), slice(None), *src)]
        split = padded.reshape(plan.batch, plan.a_channels, *pairs)
        order = (0, 1, *range(3, 2 * nd + 2, 2), *range(2, 2 * nd + 2, 2))
        return np.ascontiguousarray(split.transpose(order)).reshape(
            plan.batch, self.depth, -1)

    def weights(self, w: Any, acc: np.dtype) -> np.ndarray:
        """``W_q`` for each block offset: ``[m^nd, s..*Ca, Cb]`` channels-last,
        ``[m^nd, Cb, Ca*s..]`` channels-first (zeros for the taps past the kernel)."""
        plan, nd = self.plan, self.plan.ndim
        wc = canonical_weights(w, plan, acc)                            # [Cb, Ca, K..]
        full = np.zeros((plan.b_channels, plan.a_channels,
                         *(m * s for m, s in zip(self.m, self.s))), dtype=acc)
        full[(slice(None), slice(None), *(slice(0, k) for k in plan.kernel))] = wc
        pairs = [d for m, s in zip(self.m, self.s) for d in (m, s)]
        split = full.reshape(plan.b_channels, plan.a_channels, *pairs)
        qs = tuple(range(2, 2 * nd + 2, 2))
        rs = tuple(range(3, 2 * nd + 3, 2))
        if plan.channels_last:
            return np.ascontiguousarray(split.transpose(*qs, *rs, 1, 0)).reshape(
                len(self.offsets), self.depth, plan.b_channels)
        return np.ascontiguousarray(split.transpose(*qs, 0, 1, *rs)).reshape(
            len(self.offsets), plan.b_channels, self.depth)

    def length(self) -> int:
        """Rows of each product: across the images channels-last, one image's otherwise."""
        if self.plan.channels_last:
            return (self.plan.batch - 1) * self.per_image + self.run
        return self.run


def forward(plan: ConvPlan, a: Any, w: Any, bias: Any = None) -> np.ndarray:
    out_dtype, acc = dtypes(a, plan)
    geo = Blocks(plan)
    s_t, wq, n = geo.tensor(a, acc), geo.weights(w, acc), geo.length()
    cb = plan.b_channels
    if plan.channels_last:
        out = np.zeros((plan.batch * geo.per_image, cb), dtype=acc)
        for off, wi in zip(geo.offsets, wq):
            out[:n] += s_t[off: off + n] @ wi
        laid = out.reshape(plan.batch, *geo.extent, cb)[(slice(None), *geo.crop)]
        if bias is not None:
            laid += np.asarray(bias).astype(acc, copy=False)
        return laid.astype(out_dtype)
    out = np.zeros((plan.batch, cb, geo.per_image), dtype=acc)
    for off, wi in zip(geo.offsets, wq):
        out[:, :, :n] += np.matmul(wi, s_t[:, :, off: off + n])
    laid = out.reshape(plan.batch, cb, *geo.extent)[(slice(None), slice(None), *geo.crop)]
    if bias is not None:
        laid += np.asarray(bias).astype(acc, copy=False).reshape(-1, *(1,) * plan.ndim)
    return laid.astype(out_dtype)


def backward_weights(plan: ConvPlan, a: Any, b: Any) -> np.ndarray:
    out_dtype, acc = dtypes(a, plan)
    geo = Blocks(plan)
    s_t, n, b = geo.tensor(a, acc), geo.length(), np.asarray(b)
    cb, ca, nd, m, s = plan.b_channels, plan.a_channels, plan.ndim, geo.m, geo.s
    # dW_q per block offset, split as [m.., s.., Ca, Cb] or [m.., Cb, Ca, s..]; ``lead``: the
    # Cb and Ca axes, ``r_axes``: the s axes (the blocks' taps back in kernel order below)
    if plan.channels_last:
        laid = np.zeros((plan.batch, *geo.extent, cb), dtype=acc)
        laid[(slice(None), *geo.crop)] = b
        rows = laid.reshape(-1, cb)[:n]
        split = np.stack([s_t[off: off + n].T @ rows for off in geo.offsets]).reshape(
            *m, *s, ca, cb)
        lead, r_axes = (2 * nd + 1, 2 * nd), range(nd, 2 * nd)
    else:
        laid = np.zeros((plan.batch, cb, *geo.extent), dtype=acc)
        laid[(slice(None), slice(None), *geo.crop)] = b
        rows = laid.reshape(plan.batch, cb, -1)[:, :, :n]
        split = np.stack([np.matmul(rows, s_t[:, :, off: off + n].transpose(0, 2, 1)).sum(0)
                          for off in geo.offsets]).reshape(*m, cb, ca, *s)
        lead, r_axes = (nd, nd + 1), range(nd + 2, 2 * nd + 2)
    inter = [ax for pair in zip(range(nd), r_axes) for ax in pair]
    full = split.transpose(*lead, *inter).reshape(cb, ca, *(mi * si for mi, si in zip(m, s)))
    canon = full[(slice(None), slice(None), *(slice(0, k) for k in plan.kernel))]
    return np.ascontiguousarray(np.transpose(canon, plan.weights_inverse_perm),
                                dtype=out_dtype)


# --- the records: the blocks' copy and ``ceil(K/s)^nd`` products ------------------------------

#: its estimate against its time: its products' few output columns run below the table's
#: rates, so it is weighed up and left to measuring where near
SPACE_TO_DEPTH_FACTOR = 2.5
#: offered only where a block holds this many values (``s^nd * Ca``): shallower blocks lost to
#: the grid
SPACE_TO_DEPTH_MIN_DEPTH = 64


def _price(primitive: str, plan: ConvPlan, z: Sizes) -> float:
    """``a`` zero-padded and copied into blocks (channels-last in runs of a block's line,
    channels-first with a strided side), then the products ``[rows, s^nd*Ca] x
    [s^nd*Ca, Cb]`` over the blocks' rows, each added into ``b`` (the weight gradient: their
    long-contraction form)."""
    geo = Blocks(plan)
    if geo.depth < SPACE_TO_DEPTH_MIN_DEPTH:
        return math.inf
    rows, depth, products = plan.batch * geo.per_image, geo.depth, len(geo.offsets)
    values = rows * depth
    run = plan.strides[-1] * z.ca if plan.channels_last else 1
    cost = z.item * (values * FILL_S + copy(values, run) + rows * z.cb * FILL_S)
    if primitive == "backward_weights":
        return SPACE_TO_DEPTH_FACTOR * (cost + products * gemm_long(depth, rows, z.cb))
    return SPACE_TO_DEPTH_FACTOR * (
        cost + products * (gemm(rows, depth, z.cb) + z.item * add(rows * z.cb, z.cb)))


#: its forward's zero taps past the kernel meet the data
STRATEGIES = (
    strategy("space_to_depth", "forward", forward, _price, applies, zero_taps_meet_data=True),
    strategy("space_to_depth", "backward_weights", backward_weights, _price, applies),
)
