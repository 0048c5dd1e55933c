"""The exact path: per tap, only the in-range window of the data is read.

For every kernel tap ``k`` (a multi-index into the kernel) the canonical convolution pairs
``b[y]`` with ``a[y*s + k*d - pb]``; only the in-range part of that window is read, so padded
positions contribute no term at all (not even ``0 * w``). This path is used when an input holds
NaN or Inf, where ``0 * inf`` terms would change the result; it is also the reference the fast
path is tested against.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from polyconv._geometry import ConvPlan
from polyconv._phases import phases

from ._common import add_bias, canonical_weights, channels_last, dtypes, to_user_layout
from ._costs import CALL_S, Sizes, add, copy, gemm, gemm_long, sizes, strategy
from ._window import as_forward


def _taps(plan: ConvPlan):
    """``(k, b_index, a_index)`` for every kernel tap that touches the data (the in-range
    windows of :mod:`polyconv._phases`)."""
    ph = phases(plan)
    full = slice(None)
    for t, b_index, a_index in ph.tap_windows:
        yield ph.taps[t].k, (full, *b_index, full), (full, *a_index, full)


class _Contraction:
    """The per-tap channel contraction for one plan, with groups handled once.

    ``w`` is the canonical ``[Cb, Ca/G, K..]`` weights. Three shapes of the same einsum
    ``b[m, g, o] = sum_i a[m, g, i] * W[g, o, i]``: dense (G == 1, one GEMM), depthwise-like
    (Ca/G == 1, a broadcast multiply) and grouped (one batched matmul over G).
    """

    def __init__(self, plan: ConvPlan, w: np.ndarray | None):
        self.groups = plan.groups
        self.ca, self.cb = plan.a_channels, plan.b_channels
        self.cg = self.ca // self.groups          # Ca/G
        self.og = self.cb // self.groups          # Cb/G
        self.depthwise = self.cg == 1 and self.groups > 1
        if w is not None:
            g, og, cg = self.groups, self.og, self.cg
            # [K.., G, Cb/G, Ca/G], contiguous per tap
            self.w = np.ascontiguousarray(
                np.moveaxis(w.reshape(g, og, cg, *plan.kernel), (0, 1, 2),
                            (-3, -2, -1)))

    # forward: [..., Ca] -> [..., Cb]
    def forward(self, x: np.ndarray, k: tuple[int, ...]) -> np.ndarray:
        wk = self.w[k]                                   # [G, Og, Cg]
        lead = x.shape[:-1]
        if self.groups == 1:
            return (x.reshape(-1, self.ca) @ wk[0].T).reshape(*lead, self.cb)
        if self.depthwise:
            return (x[..., :, None] * wk[:, :, 0]).reshape(*lead, self.cb)
        xg = x.reshape(-1, self.groups, self.cg).transpose(1, 0, 2)    # [G, M, Cg]
        y = np.matmul(xg, wk.transpose(0, 2, 1))                        # [G, M, Og]
        return y.transpose(1, 0, 2).reshape(*lead, self.cb)

    # backward_data: [..., Cb] -> [..., Ca]
    def backward(self, y: np.ndarray, k: tuple[int, ...]) -> np.ndarray:
        wk = self.w[k]
        lead = y.shape[:-1]
        if self.groups == 1:
            return (y.reshape(-1, self.cb) @ wk[0]).reshape(*lead, self.ca)
        yg = y.reshape(*lead, self.groups, self.og)
        if self.depthwise:
            if self.og == 1:
                return yg[..., 0] * wk[:, 0, 0]
            return np.einsum("...go,go->...g", yg, wk[:, :, 0])
        yg = yg.reshape(-1, self.groups, self.og).transpose(1, 0, 2)   # [G, M, Og]
        x = np.matmul(yg, wk)                                           # [G, M, Cg]
        return x.transpose(1, 0, 2).reshape(*lead, self.ca)

    # backward_weights: [..., Ca], [..., Cb] -> [G, Og, Cg]
    def weights(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        if self.groups == 1:
            return (y.reshape(-1, self.cb).T @ x.reshape(-1, self.ca))[None]
        xg = x.reshape(-1, self.groups, self.cg)
        yg = y.reshape(-1, self.groups, self.og)
        if self.depthwise:
            return np.einsum("mgo,mg->go", yg, xg[:, :, 0])[:, :, None]
        return np.matmul(yg.transpose(1, 2, 0), xg.transpose(1, 0, 2))  # [G, Og, Cg]


def forward(plan: ConvPlan, a: Any, w: Any, bias: Any = None) -> np.ndarray:
    out_dtype, acc = dtypes(a, plan)
    a_cl = channels_last(a, plan, acc)
    con = _Contraction(plan, canonical_weights(w, plan, acc))
    b = np.zeros((plan.batch, *plan.b_spatial, plan.b_channels), dtype=acc)
    for k, b_index, a_index in _taps(plan):
        view = b[b_index]
        view += con.forward(a_cl[a_index], k)
    add_bias(b, bias)
    return to_user_layout(b, plan, out_dtype)

def backward_data(plan: ConvPlan, b: Any, w: Any, bias: Any = None) -> np.ndarray:
    out_dtype, acc = dtypes(b, plan)
    b_cl = channels_last(b, plan, acc)
    con = _Contraction(plan, canonical_weights(w, plan, acc))
    a = np.zeros((plan.batch, *plan.a_spatial, plan.a_channels), dtype=acc)
    for k, b_index, a_index in _taps(plan):
        view = a[a_index]
        view += con.backward(b_cl[b_index], k)
    add_bias(a, bias)
    return to_user_layout(a, plan, out_dtype)

def backward_weights(plan: ConvPlan, a: Any, b: Any) -> np.ndarray:
    out_dtype, acc = dtypes(a, plan)
    a_cl = channels_last(a, plan, acc)
    b_cl = channels_last(b, plan, acc)
    con = _Contraction(plan, None)
    # [K.., G, Og, Cg]: zero for taps that never touch the data
    dw = np.zeros((*plan.kernel, plan.groups, con.og, con.cg), dtype=acc)
    for k, b_index, a_index in _taps(plan):
        dw[k] = con.weights(a_cl[a_index], b_cl[b_index])
    # -> canonical [Cb, Ca/G, K..] -> the user's weights format
    nk = plan.ndim
    canon = np.moveaxis(dw, (nk, nk + 1, nk + 2), (0, 1, 2)).reshape(plan.w_shape)
    return np.ascontiguousarray(np.transpose(canon, plan.weights_inverse_perm),
                                dtype=out_dtype)


# --- the records: per tap, a copy of its window, one product and an add ----------------------

#: the per-tap products against the table's rates (fitted on the corpus's dense layers; other
#: hosts favour them more, where measuring decides)
EXACT_FACTOR = 1.7
#: per-tap products over fewer channels a group run far below the table's rates (ResNet-50's
#: stem, 3 channels: 8.9x the grid's weight gradient), so the model leaves them to the others
EXACT_MIN_CHANNELS = 16
#: one channel per group, per element: each tap's window product (per row of ``b``, tap and
#: channel) plus a loop per row of a strided window (per row of ``b`` and tap)
DW_EXACT_TAP_S = 0.30e-9
DW_EXACT_RUN_S = 2.87e-9


def reads_in_place(plan: ConvPlan) -> bool:
    """Whether :func:`channels_last` hands the data over without a copy (channels-last data in
    the accumulation dtype): then the temporaries stay within the memory bound."""
    return plan.channels_last and plan.dtype == plan.acc_dtype


def estimate(primitive: str, plan: ConvPlan, z: Sizes | None = None) -> float:
    """Ungrouped: per tap that meets the data, its windows copied channels-last and one
    product over their ``m`` rows (forward: ``[m, Ca] x [Ca, Cb]`` added into ``b``;
    backward_data: ``[m, Cb] x [Cb, Ca]`` added into ``a``; backward_weights:
    ``[Cb, m] x [m, Ca]``)."""
    z = sizes(plan) if z is None else z
    cost = (z.ma * z.ca + z.mb * z.cb) * z.layout * z.item
    for _, b_index, _ in phases(plan).tap_windows:
        m = plan.batch * math.prod(s.stop - s.start for s in b_index)
        if primitive == "backward_weights":
            cost += (z.item * (copy(m * z.ca, z.ca) + copy(m * z.cb, z.cb))
                     + z.g * gemm_long(z.og, m, z.cg))
        else:
            cin, cout = (z.ca, z.cb) if primitive == "forward" else (z.cb, z.ca)
            cost += (z.item * (copy(m * cin, cin) + add(m * cout, cout))
                     + z.g * gemm(m, cin // z.g, cout // z.g))
        cost += CALL_S
    return EXACT_FACTOR * cost


def _price(primitive: str, plan: ConvPlan, z: Sizes) -> float:
    if primitive == "backward_data" and (adjoint := as_forward(plan)) is not None:
        return _price("forward", adjoint, sizes(adjoint))
    if z.cg == 1 and z.g > 1 and primitive != "backward_data" and reads_in_place(plan):
        return z.item * (z.mb * z.t * z.cb * DW_EXACT_TAP_S + z.mb * z.t * DW_EXACT_RUN_S)
    if min(z.cg, z.og) < EXACT_MIN_CHANNELS:
        return math.inf
    if primitive != "backward_weights" and not reads_in_place(plan):
        return math.inf     # a copy of the data and a float32 accumulator: past the bound
    return estimate(primitive, plan, z)


STRATEGIES = tuple(strategy("exact", p, run, _price, exact_on_nonfinite=True)
                   for p, run in (("forward", forward), ("backward_data", backward_data),
                                  ("backward_weights", backward_weights)))
