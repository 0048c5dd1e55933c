"""Non-overlapping windows (kernel = stride, no dilation, no padding before): one product.

A patch embedding (ViT's 16x16 stride 16), a ConvNeXt or Swin stem, a U-Net's 2x2 stride-2
up-convolution: every position of ``a`` belongs to at most one window, so ``a``'s windows are
a reshape of ``a`` itself, ``[N, B.., K.., C]`` up to an order of axes, and each primitive is
one matrix product with them. One copy puts the windows in the order the product reads
(channels-last: ``[N*B, K*Ca]`` against the weights ``[K*Ca, Cb]``; channels-first: per image
``[Ca*K, B]``, so that ``W [Cb, Ca*K]`` times it is ``b`` in its own layout), where the phase
grid splits ``a`` into ``prod(s)`` phases and gathers each window tap by tap.

* ``forward``: ``b = windows @ W``;
* ``backward_data``: ``windows = b @ W^T``, copied back into the windows' positions of ``a``
  (positions past the last window, where ``B*s < A``, receive no product: zero, or the bias);
* ``backward_weights``: ``dW = windows^T @ b``.

Every product pairs a value of the data with one it meets in the definition, and no padding
enters it, so NaN and Inf propagate exactly as the definition's sums do: non-finite inputs keep
this strategy. Accumulation is in float32 (float64 for float64 inputs), the bias added before
the one rounding to the output dtype.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from polyconv._geometry import ConvPlan

from ._common import canonical_weights, dtypes
from ._costs import FILL_S, TRANSPOSE_S, Sizes, copy, gemm, gemm_long, strategy


def applies(plan: ConvPlan, primitive: str | None = None) -> bool:
    """Ungrouped, kernel = stride and dilation 1 on every axis, no padding before, and the
    windows within ``a`` (``B*s <= A``)."""
    del primitive       # every primitive
    return (plan.groups == 1 and tuple(plan.kernel) == tuple(plan.strides)
            and all(d == 1 for d in plan.dilations) and all(p == 0 for p in plan.pads_begin)
            and all(b * s <= a for a, b, s in zip(plan.a_spatial, plan.b_spatial, plan.strides)))


def _split_axes(plan: ConvPlan) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Axes of ``a``'s covered region reshaped to ``[N, C, B0, K0, B1, K1, ..]``
    (channels-first) or ``[N, B0, K0, .., C]`` (channels-last): the shape, and the positions
    of the ``B`` and the ``K`` axes in it."""
    nd = plan.ndim
    pairs = [d for b, k in zip(plan.b_spatial, plan.kernel) for d in (b, k)]
    if plan.channels_last:
        shape = (plan.batch, *pairs, plan.a_channels)
        first = 1
    else:
        shape = (plan.batch, plan.a_channels, *pairs)
        first = 2
    return shape, tuple(first + 2 * i for i in range(nd)), tuple(first + 2 * i + 1
                                                                   for i in range(nd))


def _covered(x: np.ndarray, plan: ConvPlan) -> np.ndarray:
    """The part of ``a`` (user layout) that the windows cover: a view."""
    crop = tuple(slice(0, b * s) for b, s in zip(plan.b_spatial, plan.strides))
    return x[(slice(None), *crop, slice(None))] if plan.channels_last else x[
        (slice(None), slice(None), *crop)]


def _order(plan: ConvPlan) -> tuple[int, ...]:
    """The permutation of the split axes that the products read: ``[N, B.., K.., C]``
    (channels-last) or ``[N, C, K.., B..]`` (channels-first)."""
    shape, b_axes, k_axes = _split_axes(plan)
    if plan.channels_last:
        return (0, *b_axes, *k_axes, len(shape) - 1)
    return (0, 1, *k_axes, *b_axes)


def _windows(a: Any, plan: ConvPlan, acc: np.dtype) -> np.ndarray:
    """``a``'s windows, in one copy: ``[N*B, K*Ca]`` channels-last, ``[N, Ca*K, B]``
    channels-first."""
    shape, _, _ = _split_axes(plan)
    split = _covered(np.asarray(a), plan).reshape(shape)
    rows, cols = plan.batch * math.prod(plan.b_spatial), plan.a_channels * math.prod(plan.kernel)
    # a copy only where the order changes (none for a 1x1 kernel on contiguous data)
    out = np.ascontiguousarray(split.transpose(_order(plan)), dtype=acc)
    return out.reshape((rows, cols) if plan.channels_last else
                       (plan.batch, cols, math.prod(plan.b_spatial)))


def _weights(plan: ConvPlan, w: Any, acc: np.dtype) -> np.ndarray:
    """``W`` as the products read it: ``[K*Ca, Cb]`` channels-last (rows in the windows'
    ``K.., C`` order), ``[Cb, Ca*K]`` channels-first (the canonical order)."""
    wc = canonical_weights(w, plan, acc)                      # [Cb, Ca, K..]
    if plan.channels_last:
        nd = plan.ndim
        return wc.transpose(*range(2, 2 + nd), 1, 0).reshape(-1, plan.b_channels)
    return wc.reshape(plan.b_channels, -1)


def forward(plan: ConvPlan, a: Any, w: Any, bias: Any = None) -> np.ndarray:
    out_dtype, acc = dtypes(a, plan)
    win, wm = _windows(a, plan, acc), _weights(plan, w, acc)
    if plan.channels_last:
        b = win @ wm                                          # [N*B, Cb]
        shape = (plan.batch, *plan.b_spatial, plan.b_channels)
        if bias is not None:
            b += np.asarray(bias).astype(acc, copy=False)
    else:
        b = np.matmul(wm, win)                                # [N, Cb, B]
        shape = (plan.batch, plan.b_channels, *plan.b_spatial)
        if bias is not None:
            b += np.asarray(bias).astype(acc, copy=False)[:, None]
    return b.reshape(shape).astype(out_dtype, copy=False)


def backward_data(plan: ConvPlan, b: Any, w: Any, bias: Any = None) -> np.ndarray:
    out_dtype, acc = dtypes(b, plan)
    wm, b = _weights(plan, w, acc), np.asarray(b)
    if plan.channels_last:
        win = b.reshape(-1, plan.b_channels).astype(acc, copy=False) @ wm.T   # [N*B, K*Ca]
    else:
        bm = b.reshape(plan.batch, plan.b_channels, -1).astype(acc, copy=False)
        win = np.matmul(wm.T, bm)                                            # [N, Ca*K, B]
    shape, _, _ = _split_axes(plan)
    order = _order(plan)
    bias_acc = None if bias is None else np.asarray(bias).astype(acc, copy=False)
    taps = math.prod(plan.kernel)
    if bias_acc is not None:      # the windows' columns are (K.., Ca); their rows (Ca, K..)
        win += np.tile(bias_acc, taps) if plan.channels_last else np.repeat(bias_acc, taps)[:, None]
    a = np.empty((plan.batch, *plan.a_spatial, plan.a_channels) if plan.channels_last
                 else (plan.batch, plan.a_channels, *plan.a_spatial), dtype=out_dtype)
    windows = win.reshape([shape[i] for i in order]).transpose(np.argsort(order))
    if windows.flags.c_contiguous and math.prod(shape) == a.size:
        return windows.reshape(a.shape).astype(out_dtype, copy=False)      # a 1x1 kernel
    covered = _covered(a, plan)
    if covered.shape != a.shape:      # positions past the last window: no product
        a[...] = 0 if bias_acc is None else (
            bias_acc if plan.channels_last else bias_acc.reshape(-1, *(1,) * plan.ndim))
    covered.reshape(shape)[...] = windows
    return a


def backward_weights(plan: ConvPlan, a: Any, b: Any) -> np.ndarray:
    out_dtype, acc = dtypes(a, plan)
    win, b = _windows(a, plan, acc), np.asarray(b)
    k = tuple(plan.kernel)
    if plan.channels_last:
        bm = b.reshape(-1, plan.b_channels).astype(acc, copy=False)
        dw = (win.T @ bm).reshape(*k, plan.a_channels, plan.b_channels)      # [K.., Ca, Cb]
        canon = dw.transpose(plan.ndim + 1, plan.ndim, *range(plan.ndim))     # [Cb, Ca, K..]
    else:
        bm = b.reshape(plan.batch, plan.b_channels, -1).astype(acc, copy=False)
        dw = np.matmul(bm, win.transpose(0, 2, 1)).sum(axis=0)               # [Cb, Ca*K]
        canon = dw.reshape(plan.b_channels, plan.a_channels, *k)
    return np.ascontiguousarray(np.transpose(canon, plan.weights_inverse_perm),
                                dtype=out_dtype)


# --- the records: one copy of the windows and one product ------------------------------------

def _price(primitive: str, plan: ConvPlan, z: Sizes) -> float:
    """``B*T*Ca`` values copied (channels-last in runs of a window's line) and one product
    ``[N*B, T*Ca] x [T*Ca, Cb]`` (its transpose for backward_data, its long-contraction form
    for the weight gradient)."""
    values = z.mb * z.t * z.ca
    # channels-first, the copy reads (or, for backward_data, writes) one side with a stride
    # of s values throughout: a strided read is a strided copy, a strided write a change of
    # layout
    if plan.channels_last:
        per_value = copy(values, plan.kernel[-1] * z.ca)
    elif primitive == "backward_data":
        per_value = values * TRANSPOSE_S
    else:
        per_value = copy(values, 1)
    moved = z.item * (per_value + z.mb * z.cb * FILL_S)
    if primitive == "backward_weights":
        return moved + gemm_long(z.t * z.ca, z.mb, z.cb)
    if primitive == "backward_data":
        return moved + gemm(z.mb, z.cb, z.t * z.ca)
    return moved + gemm(z.mb, z.t * z.ca, z.cb)


STRATEGIES = tuple(strategy("patches", p, run, _price, applies, exact_on_nonfinite=True)
                   for p, run in (("forward", forward), ("backward_data", backward_data),
                                  ("backward_weights", backward_weights)))
