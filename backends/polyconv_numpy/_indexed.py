"""Small plans by one gather: every tap's window read through an index kept per plan, then one
matrix product.

On a small layer a call's time is the numpy calls it issues, not the values they move: the
other strategies issue one or more per kernel tap (a slice and an add or a copy). Here the
whole im2col is one ``np.take``: per plan, the flat offset in the user's own tensor of every
value each output position reads, tap by tap (the padding and, for backward_data, the stride's
holes pointing at one zero appended to a flat copy of the input), so that

* ``forward``: ``b = W [G, Og, Cg*T] @ take(a, index) [N, G, Cg*T, L]``;
* ``backward_data``: ``a = W [G, Cg, Og*T] @ take(b, index) [N, G, Og*T, A]`` (the adjoint's
  gather: output position ``x`` reads ``b[y]`` where ``y*s + k*d - pb = x``);
* ``backward_weights``: ``dW = take(b) [G, Og, N*L] @ take(a, index) [G, N*L, Cg*T]``,

each product written in the user's layout (channels-last data: the transposed product), the
weights read by an index too (any weights format). The index holds 8 bytes per gathered value
and is kept per plan, so the strategy is offered on small plans only (:data:`MAX_VALUES`); the
cost model prices its one gather per value and its one call, and leaves it where those cost
more than the other strategies' calls per tap.

The padding's zeros meet the weights (forward, backward_data) and ``b`` (the weight gradient)
as on the phase grid: non-finite inputs take the exact path. Sums are accumulated in float32
(float64 for float64 inputs), the bias added before the one rounding to the output dtype.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from polyconv._geometry import ConvPlan

from ._costs import CALL_S, Sizes, gemm, gemm_long, strategy

#: gathered values at most: the index takes 8 bytes a value (128 KiB), kept per plan
MAX_VALUES = 1 << 14
#: seconds per value gathered by ``np.take`` (a scattered read per value, 15x a copy's)
TAKE_S = 1.1e-9


def applies(plan: ConvPlan, primitive: str) -> bool:
    """Plans whose gathers hold at most :data:`MAX_VALUES` values."""
    return _gathered(plan, primitive) <= MAX_VALUES


def _gathered(plan: ConvPlan, primitive: str) -> int:
    """Values the call gathers: the columns, plus ``b`` for the weight gradient."""
    t, cg = math.prod(plan.kernel), plan.a_channels // plan.groups
    mb = plan.batch * math.prod(plan.b_spatial)
    if primitive == "backward_data":
        return plan.batch * math.prod(plan.a_spatial) * t * plan.b_channels
    return mb * t * cg * plan.groups + (mb * plan.b_channels
                                        if primitive == "backward_weights" else 0)


def _reads(plan: ConvPlan, primitive: str) -> tuple[np.ndarray, np.ndarray]:
    """``(offset, valid)``, ``[P, T]``: for each position of the side written (``b``; ``a`` for
    backward_data) and tap, the spatial offset (row-major) in the side read and whether it
    lies there."""
    nd, axes = plan.ndim, []
    for d in range(nd):
        k = np.arange(plan.kernel[d])[None, :] * plan.dilations[d]
        s, pb = plan.strides[d], plan.pads_begin[d]
        if primitive == "backward_data":       # x = y*s + k*d - pb, solved for y
            q = np.arange(plan.a_spatial[d])[:, None] + pb - k
            p, size = q // s, plan.b_spatial[d]
            ok = (q % s == 0) & (p >= 0) & (p < size)
        else:
            p, size = np.arange(plan.b_spatial[d])[:, None] * s + k - pb, plan.a_spatial[d]
            ok = (p >= 0) & (p < size)
        axes.append((p, ok, size))
    offset, valid, step = np.zeros((), np.intp), np.ones((), bool), 1
    for d in reversed(range(nd)):
        p, ok, size = axes[d]
        shape = [1] * (2 * nd)
        shape[d], shape[nd + d] = p.shape
        offset = offset + (p * step).reshape(shape)
        valid = valid & ok.reshape(shape)
        step *= size
    positions = math.prod(offset.shape[:nd])
    return offset.reshape(positions, -1), valid.reshape(positions, -1)


def _data(plan: ConvPlan, channels: int, spatial: tuple[int, ...], n: np.ndarray,
          c: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """Flat offsets of ``[n, c, offset]`` in a tensor of ``channels`` and ``spatial`` in the
    user's layout."""
    size = math.prod(spatial)
    if plan.channels_last:
        return (n * size + offset) * channels + c
    return (n * channels + c) * size + offset


class Index:
    """One plan's gathers: ``data`` into the flat read side (its last slot a zero), ``weights``
    into the user's flat weights, ``b`` (backward_weights) into the flat ``b``."""

    def __init__(self, plan: ConvPlan, primitive: str):
        g, n = plan.groups, plan.batch
        cg, og = plan.a_channels // g, plan.b_channels // g
        offset, valid = _reads(plan, primitive)             # [P, T]
        p, t = offset.shape
        gi = np.arange(g)[:, None, None, None]
        if primitive == "backward_data":                    # read b: [N, G, Og, P, T]
            read, channels, spatial, per = plan.b_channels, plan.b_channels, plan.b_spatial, og
        else:                                               # read a: [N, G, Cg, P, T]
            read, channels, spatial, per = plan.a_channels, plan.a_channels, plan.a_spatial, cg
        zero = plan.batch * read * math.prod(spatial)
        ni = np.arange(n)[:, None, None, None, None]
        ci = (gi * per + np.arange(per)[:, None, None])[None]
        flat = np.where(valid, _data(plan, channels, spatial, ni, ci, offset), zero)
        # [N, G, C, P, T]: the contraction (C, T) channels-major, as the canonical weights
        if primitive == "backward_weights":                 # [G, N*P, Cg*T]
            self.data = flat.transpose(1, 0, 3, 2, 4).reshape(g, n * p, per * t)
            o = (gi * og + np.arange(og)[:, None, None])[None]          # [1, G, Og, 1, 1]
            bflat = _data(plan, plan.b_channels, plan.b_spatial, ni[..., 0],
                          o[..., 0], np.arange(p))                       # [N, G, Og, P]
            self.b = np.ascontiguousarray(bflat.transpose(1, 2, 0, 3).reshape(g, og, n * p))
        elif plan.channels_last:                            # [N, G, P, C*T]
            self.data = flat.transpose(0, 1, 3, 2, 4).reshape(n, g, p, per * t)
        else:                                               # [N, G, C*T, P]
            self.data = flat.transpose(0, 1, 2, 4, 3).reshape(n, g, per * t, p)
        self.data = np.ascontiguousarray(self.data)
        # the canonical weights [Cb, Cg, K..] as [G, Og, Cg, T] of offsets in the user's ones
        wi = np.arange(math.prod(plan.weights_shape)).reshape(plan.weights_shape)
        w4 = wi.transpose(plan.weights_perm).reshape(g, og, cg, t)
        # forward: [G, Og, Cg*T] (channels-last: [G, Cg*T, Og]); backward_data: [G, Cg, Og*T]
        # ([G, Og*T, Cg]); the weight gradient writes them and reads none
        if primitive != "backward_weights":
            order = {("forward", False): (0, 1, 2, 3), ("forward", True): (0, 2, 3, 1),
                     ("backward_data", False): (0, 2, 1, 3),
                     ("backward_data", True): (0, 1, 3, 2)}[(primitive, plan.channels_last)]
            m = w4.transpose(order)
            rows = m.shape[1] * m.shape[2] if plan.channels_last else m.shape[1]
            self.weights = np.ascontiguousarray(m.reshape(g, rows, -1))


@functools.lru_cache(maxsize=64)
def index(plan: ConvPlan, primitive: str) -> Index:
    """The plan's :class:`Index`, kept for the process (64 plans)."""
    return Index(plan, primitive)


def _padded(x: Any, acc: np.dtype) -> np.ndarray:
    """``x`` flattened in its own layout, in ``acc``, with one zero appended."""
    flat = np.asarray(x).reshape(-1)
    return np.concatenate((flat, np.zeros(1, acc)), dtype=acc, casting="unsafe")


def _product(plan: ConvPlan, primitive: str, x: Any, w: Any, bias: Any) -> np.ndarray:
    x = np.asarray(x)
    out_dtype, acc = x.dtype, np.dtype(plan.acc_dtype)
    ix = index(plan, primitive)
    cols = _padded(x, acc)[ix.data]
    wm = np.asarray(w).reshape(-1)[ix.weights].astype(acc, copy=False)
    g = plan.groups
    if primitive == "forward":
        shape, written = plan.b_shape, plan.b_channels
    else:
        shape, written = plan.a_shape, plan.a_channels
    out = np.empty(shape, out_dtype)
    n = plan.batch
    if plan.channels_last:                  # [N, G, P, C] = columns @ weights, into [N, P, C]
        view = out.reshape(n, -1, g, written // g).transpose(0, 2, 1, 3)
        left, right, per_channel = cols, wm, (g, 1, written // g)
    else:                                   # [N, G, C, P] = weights @ columns
        view = out.reshape(n, g, written // g, -1)
        left, right, per_channel = wm, cols, (g, written // g, 1)
    y = np.matmul(left, right, out=view if out_dtype == acc else None)
    if bias is not None:
        y += np.asarray(bias).astype(acc, copy=False).reshape(per_channel)
    if y is not view:
        view[...] = y                       # the one rounding to the output dtype
    return out


def forward(plan: ConvPlan, a: Any, w: Any, bias: Any = None) -> np.ndarray:
    return _product(plan, "forward", a, w, bias)


def backward_data(plan: ConvPlan, b: Any, w: Any, bias: Any = None) -> np.ndarray:
    return _product(plan, "backward_data", b, w, bias)


def backward_weights(plan: ConvPlan, a: Any, b: Any) -> np.ndarray:
    a = np.asarray(a)
    out_dtype, acc = a.dtype, np.dtype(plan.acc_dtype)
    ix = index(plan, "backward_weights")
    dw = np.matmul(np.asarray(b).reshape(-1)[ix.b].astype(acc, copy=False),
                   _padded(a, acc)[ix.data])                # [G, Og, Cg*T]
    out = np.empty(plan.weights_shape, out_dtype)
    out.transpose(plan.weights_perm)[...] = dw.reshape(plan.w_shape)
    return out


# --- the records: one gather per value and one call --------------------------------------------

def _price(primitive: str, plan: ConvPlan, z: Sizes) -> float:
    """One ``np.take`` of the gathered values, a :data:`~._costs.CALL_S` for it (the calls
    every strategy makes, the output, the weights' copy and the product's, are in no
    strategy's price), and the product (per group)."""
    take = _gathered(plan, primitive) * TAKE_S * z.item + CALL_S
    if primitive == "backward_weights":
        return take + z.g * gemm_long(z.og, z.mb, z.t * z.cg)
    if primitive == "backward_data":
        return take + z.g * gemm(z.ma, z.t * z.og, z.cg)
    return take + z.g * gemm(z.mb, z.t * z.cg, z.og)


STRATEGIES = tuple(strategy("indexed", p, run, _price, applies)
                   for p, run in (("forward", forward), ("backward_data", backward_data),
                                  ("backward_weights", backward_weights)))
