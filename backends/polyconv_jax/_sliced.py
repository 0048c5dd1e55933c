"""The ``sliced`` lowerings: the first spatial axis's taps as problems of rank ``nd - 1``.

Tap ``k0`` of the first spatial axis reads rows ``k0*d0 + s0*j`` (``j < B0``) of ``a``;
merged with the batch, those rows are a problem of rank ``nd - 1`` over the other axes with
the tap's slice of the kernel, which the primitive's plain lowering computes (channels last).
forward adds the taps' convolutions, backward_data lays each tap's transposed problem on the
rows it writes, backward_weights stacks the taps' weight gradients (each in pieces). The
partial sums are added in the accumulation dtype.

They stand in for XLA CPU's 3-D convolutions (jaxlib 0.10.2 runs 2-D ones through YNNPACK
and 3-D ones on a much slower path, and each weight-gradient convolution on one thread), so
they are measured for 3-D plans and the CPU policy takes them for ungrouped 3-D plans without
a stride (:func:`slices`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
from jax import lax

from polyconv import ConvPlan
from polyconv._choice import Implementation

from ._common import read_pads
from ._plain import _conv, _direct, _weights_direct
from ._xla import add_all


def slices(plan: ConvPlan) -> bool:
    """Whether the CPU policies take the ``sliced`` lowerings: ungrouped plans of 3-D and up
    without a stride (the conv blocks of a 3-D U-Net)."""
    return plan.ndim >= 3 and plan.groups == 1 and set(plan.strides) == {1}


def slice_plan(plan: ConvPlan, batch: int) -> ConvPlan:
    """The convolution of rank ``nd - 1`` that one tap of the first spatial axis computes on
    ``batch`` rows of it merged with the batch (:func:`first_axis_rows`): channels last,
    canonical weights ``[Cb, Ca/G, K_rest..]``; for one spatial axis, a unit axis (a matrix
    product as a convolution)."""
    def rest(values, unit):
        return tuple(values[1:]) or (unit,)

    return plan.with_(
        batch=batch, a_spatial=rest(plan.a_spatial, 1), b_spatial=rest(plan.b_spatial, 1),
        kernel=rest(plan.kernel, 1), strides=rest(plan.strides, 1),
        dilations=rest(plan.dilations, 1), pads_begin=rest(plan.pads_begin, 0),
        pads_end=rest(plan.pads_end, 0), output_padding=rest(plan.output_padding, 0),
        channels_last=True, weights_perm=tuple(range(max(plan.ndim, 2) + 1)))


def merge_first_axis(plan: ConvPlan, x):
    """``x`` (``[N, A0, .., C]`` in the user's layout) channels last with its first spatial
    axis merged with the batch: ``[N*A0, A.., C]`` (``[N*A0, 1, C]`` for one spatial axis)."""
    x = x if plan.channels_last else jnp.moveaxis(x, 1, -1)
    return x.reshape((x.shape[0] * x.shape[1], *(x.shape[2:-1] or (1,)), x.shape[-1]))


def split_first_axis(plan: ConvPlan, z, batch: int):
    """:func:`merge_first_axis` undone: ``[N*R, ..., C]`` -> ``[N, R, ..]`` in the user's
    layout."""
    z = z.reshape((batch, z.shape[0] // batch, *(z.shape[1:-1] if plan.ndim > 1 else ()),
                   z.shape[-1]))
    return z if plan.channels_last else jnp.moveaxis(z, -1, 1)


def tap_kernel(plan: ConvPlan, wc, k0: int):
    """Tap ``k0`` of the first spatial axis of canonical weights ``[Cb, Ca/G, K..]``:
    :func:`slice_plan`'s weights."""
    return lax.slice_in_dim(wc, k0, k0 + 1, axis=2).reshape(
        (*wc.shape[:2], *(plan.kernel[1:] or (1,))))


def first_axis_rows(plan: ConvPlan, a) -> Callable[[int], Any]:
    """``k0 ->`` the rows of ``a`` that the first spatial axis's tap ``k0`` reads, ``k0*d0 +
    s0*j`` for ``j < B0`` (zeros in the padding), merged with the batch
    (:func:`merge_first_axis`; channels-first data is moved once, for all taps)."""
    x = a if plan.channels_last else jnp.moveaxis(a, 1, -1)    # [N, A0, A.., C]
    config = [(0, 0, 0)] * a.ndim
    config[1] = (*read_pads(plan)[0], 0)
    x = lax.pad(x, jnp.zeros((), a.dtype), config)
    b0, s0, d0 = plan.b_spatial[0], plan.strides[0], plan.dilations[0]
    last = plan.with_(channels_last=True)

    def rows(k0: int):
        return merge_first_axis(last, lax.slice_in_dim(
            x, k0 * d0, k0 * d0 + (b0 - 1) * s0 + 1, s0, axis=1))

    return rows


def forward(plan: ConvPlan, precision, a, w):
    """The first spatial axis's taps as ``K0`` convolutions of rank ``nd - 1``, summed.

    Tap ``k0``'s rows of ``a`` merged with the batch (:func:`first_axis_rows`) are convolved
    over the other axes with the tap's slice of the kernel, channels last (for channels-first
    data 25-40% faster than convolving it channels first), and the partial sums added in the
    accumulation dtype. Measured for 3-D and up: XLA CPU (jaxlib 0.10.2) runs 2-D
    convolutions through YNNPACK and 3-D ones on a much slower path. nnU-Net's 3x3x3 32->32
    forward on 32x64x64 (2 CPUs): 68-95 ms against 270-350 for ``direct`` and 100-140 for
    ``folded``."""
    rows, n = first_axis_rows(plan, a), a.shape[0]
    sub = slice_plan(plan, n * plan.b_spatial[0])
    wc = jnp.transpose(w, plan.weights_perm)                    # [Cb, Ca/G, K..]
    z = add_all(_conv(sub, precision, rows(k), tap_kernel(plan, wc, k))
                for k in range(plan.kernel[0]))
    return split_first_axis(plan, z, n)


def backward_data(plan: ConvPlan, precision, b, w):
    """The first spatial axis's taps as ``K0`` backward_data problems of rank ``nd - 1``
    (the plain lowering's), each laid on the output rows its tap writes, summed.

    ``b`` merged with the batch (:func:`merge_first_axis`) times tap
    ``k0``'s slice of the kernel gives the rows ``j*s0 + k0*d0 - pb0`` (``j < B0``) of the
    output; one pad (``s0 - 1`` zeros between rows, the rest before and after) puts them in
    place, and the taps' parts are added in the accumulation dtype. Measured for 3-D and up
    without a stride past the first axis: XLA CPU (jaxlib 0.10.2) runs 2-D convolutions
    through YNNPACK and 3-D ones on a much slower path. nnU-Net's 3x3x3 32->32 input
    gradient on 32x64x64 (2 CPUs): 66-95 ms against 220-250 for ``direct`` and ``phases``
    and 95-130 for ``phases_folded``."""
    n, b0, s0, d0 = plan.batch, plan.b_spatial[0], plan.strides[0], plan.dilations[0]
    sub = slice_plan(plan, n * b0)
    bm = merge_first_axis(plan, b)
    wc = jnp.transpose(w, plan.weights_perm)                    # [Cb, Ca/G, K..]
    config = [(0, 0, 0)] * b.ndim
    parts = []
    for k in range(plan.kernel[0]):
        part = split_first_axis(plan.with_(channels_last=True),
                                _direct(sub, precision, bm, tap_kernel(plan, wc, k)), n)
        low = k * d0 - plan.pads_begin[0]
        config[1] = (low, plan.a_spatial[0] - low - (b0 - 1) * s0 - 1, s0 - 1)
        parts.append(lax.pad(part, jnp.zeros((), part.dtype), config))
    z = add_all(parts)
    return z if plan.channels_last else jnp.moveaxis(z, -1, 1)


#: ``sliced`` cuts the merged batch into pieces of at most this many output positions (of
#: at least one image each) ...
SLICE_PIECE_POSITIONS = 8192
#: ... and into larger ones where that would make more than this many pieces in all (each is
#: one more convolution to compile: 48 took 1 s)
SLICE_MAX_PIECES = 64


def slice_chunk(plan: ConvPlan) -> int:
    """Images of the merged batch (``N*B0``) per piece of ``sliced``."""
    images = plan.batch * plan.b_spatial[0]
    chunk = max(1, SLICE_PIECE_POSITIONS // math.prod(plan.b_spatial[1:]))
    per_tap = max(1, SLICE_MAX_PIECES // plan.kernel[0])
    return max(chunk, -(-images // per_tap))


def backward_weights(plan: ConvPlan, precision, a, b):
    """Per tap ``k0`` of the first spatial axis, the weight gradient of rank ``nd - 1`` of
    its rows of ``a`` and ``b``, both merged with the batch (channels last: the forward
    ``sliced``'s convolutions), in pieces of at most :data:`SLICE_PIECE_POSITIONS` output
    positions (:func:`slice_chunk`), summed in the accumulation dtype; the taps' kernels
    stacked.

    Measured for 3-D and up. XLA CPU (jaxlib 0.10.2) computes each weight-gradient
    convolution on one thread and slows down with its contraction: nnU-Net's 3x3x3 32->32 on
    32x64x64 (2 CPUs) took 290-305 ms in 3 pieces (one per tap), 183 ms in 24 and 81-99 ms
    in 48 (two 64x64 images each), against 300 ms for ``folded`` and 425 for ``bands``."""
    rows, n, b0 = first_axis_rows(plan, a), plan.batch, plan.b_spatial[0]
    bm = merge_first_axis(plan, b)                              # [N*B0, B.., Cb]
    chunk = slice_chunk(plan)
    pieces = [(i, min(i + chunk, n * b0)) for i in range(0, n * b0, chunk)]
    taps = []
    for k in range(plan.kernel[0]):
        x = rows(k)
        total = add_all(_weights_direct(slice_plan(plan, j - i), precision, x[i:j], bm[i:j])
                        for i, j in pieces)
        taps.append(total.reshape((*total.shape[:2], *plan.kernel[1:])))
    return jnp.transpose(jnp.stack(taps, axis=2), plan.weights_inverse_perm)


FORWARD = Implementation("sliced", "forward", forward)
BACKWARD_DATA = Implementation("sliced", "backward_data", backward_data)
BACKWARD_WEIGHTS = Implementation("sliced", "backward_weights", backward_weights)
