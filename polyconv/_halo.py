"""Spatial shards of a canonical convolution: pure integers, one split of one axis at a time.

Split one spatial axis of a primitive's *output* into consecutive shards, and its *input* the
same way (each shard held by one device). The canonical convolution
(docs/semantics.md#canonical-convolution) pairs ``b[y]`` with ``a[y*s + k*d - pb]`` per tap
``k``, so each output shard reads a contiguous hull of input rows; the rows of that hull that
its own input shard does not hold are its *halo*, fetched from its neighbours:

=================  =================  ===========================================
primitive          output split       input read
=================  =================  ===========================================
forward            ``b`` (small)      ``a``: ``a[y*s + k*d - pb]``
backward_data      ``a`` (large)      ``b``: every ``y`` with ``y*s + k*d - pb`` in the shard
backward_weights   ``b`` (the work)   ``a``, as forward; each shard sums its part of ``W``
=================  =================  ===========================================

Everything is a tuple of ints, cached per geometry; the JAX backend's spatially sharded ops
size their exchanges from here (docs/spatial_sharding.md)::

    >>> from polyconv._halo import axis_halo, even_split
    >>> h = axis_halo("forward", 16, 8, 3, 2, 1, 1, even_split(8, 2), even_split(16, 2))
    >>> h.shards[1].reads, h.shards[1].own, h.left, h.right   # b[4:8] reads a[7:16]
    ((7, 16), (8, 16), 1, 0)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from ._phases import in_range

__all__ = ["AxisHalo", "ShardHalo", "axis_halo", "even_split", "plan_axis_halo"]


def even_split(size: int, shards: int) -> tuple[int, ...]:
    """Boundaries ``0 = c0 <= c1 <= .. <= cn = size`` of ``size`` rows in ``shards`` parts,
    the first ``size % shards`` one row longer (``numpy.array_split``'s rule).

    >>> even_split(10, 4)
    (0, 3, 6, 8, 10)
    """
    q, r = divmod(size, shards)
    return tuple(i * q + min(i, r) for i in range(shards + 1))


@dataclass(frozen=True)
class ShardHalo:
    """One shard: row ranges as half-open ``(start, stop)`` pairs along the split axis.

    Attributes
    ----------
    out : tuple of int
        The output rows it computes.
    own : tuple of int
        The input rows it holds.
    reads : tuple of int
        The hull of the input rows its outputs read (``(start, start)`` when none: every
        product falls on padding).
    window : tuple of int
        The same hull counting padding positions as rows (may start below 0 or end past the
        input): the input window a local computation with zero pads on this axis takes.
    touches : tuple of int
        The hull of the output rows that read any row it holds (the reverse question).
    left, right : int
        Rows of ``reads`` below and above ``own``: the halo it needs from lower and higher
        shards.
    """

    out: tuple[int, int]
    own: tuple[int, int]
    reads: tuple[int, int]
    window: tuple[int, int]
    touches: tuple[int, int]
    left: int
    right: int


@dataclass(frozen=True)
class AxisHalo:
    """Every shard of one split axis (:func:`axis_halo`).

    Attributes
    ----------
    primitive : str
    in_size, out_size : int
        Rows of the input and of the output (or, for backward_weights, of ``b``) on the axis.
    shards : tuple of ShardHalo
    """

    primitive: str
    in_size: int
    out_size: int
    shards: tuple[ShardHalo, ...]

    @property
    def left(self) -> int:
        """The largest halo any shard needs from below."""
        return max(sh.left for sh in self.shards)

    @property
    def right(self) -> int:
        """The largest halo any shard needs from above."""
        return max(sh.right for sh in self.shards)

    @property
    def neighbours_suffice(self) -> bool:
        """Whether every shard's halo lies in its immediate neighbours (one exchange each
        way): its reads start no lower than the shard below's first row and end no higher
        than the shard above's last."""
        n = len(self.shards)
        for j, sh in enumerate(self.shards):
            if sh.reads[0] == sh.reads[1]:
                continue
            lo = self.shards[j - 1].own[0] if j > 0 else sh.own[0]
            hi = self.shards[j + 1].own[1] if j + 1 < n else sh.own[1]
            if sh.reads[0] < lo or sh.reads[1] > hi:
                return False
        return True


def _hull(spans) -> tuple[int, int] | None:
    spans = [s for s in spans if s is not None]
    if not spans:
        return None
    return min(s[0] for s in spans), max(s[1] for s in spans)


def _forward_reads(y0, y1, large, kernel, stride, dilation, pad):
    """Hull of the ``a`` rows that ``b[y0:y1]`` reads: per tap, an affine run of ``a``."""
    spans = []
    for k in range(kernel):
        w = in_range(y0 * stride + k * dilation - pad, stride, y1 - y0, large)
        if w is not None:
            spans.append((w.first, w.first + (w.count - 1) * stride + 1))
    return _hull(spans)


def _data_reads(x0, x1, small, kernel, stride, dilation, pad, clip=True):
    """Hull of the ``b`` rows whose products land in ``a[x0:x1]``: per tap ``k``, the ``y``
    with ``x0 <= y*s + k*d - pb < x1`` (``0 <= y < small`` when clipped)."""
    spans = []
    for k in range(kernel):
        lo = -((pad - k * dilation + x0) // -stride)        # ceil((x0 + pb - k*d) / s)
        hi = (x1 - 1 + pad - k * dilation) // stride + 1
        if clip:
            lo, hi = max(lo, 0), min(hi, small)
        if lo < hi:
            spans.append((lo, hi))
    return _hull(spans)


@functools.lru_cache(maxsize=1024)
def axis_halo(primitive: str, large: int, small: int, kernel: int, stride: int,
              dilation: int, pad: int, out_bounds: tuple[int, ...],
              in_bounds: tuple[int, ...]) -> AxisHalo:
    """The shards of one axis of the canonical convolution with ``large`` rows of ``a``,
    ``small`` of ``b``, one kernel, stride, dilation and begin pad ``pad`` (the end pad and
    output_padding are implied by the sizes).

    ``out_bounds`` are the boundaries (:func:`even_split`, or any non-decreasing tuple from 0
    to the size) of the output split: ``b`` for forward and backward_weights, ``a`` for
    backward_data; ``in_bounds`` those of the input split, with as many shards.
    """
    if len(out_bounds) != len(in_bounds):
        msg = f"{len(out_bounds) - 1} output shards but {len(in_bounds) - 1} input shards"
        raise ValueError(msg)
    data = primitive == "backward_data"
    in_size, out_size = (small, large) if data else (large, small)
    if out_bounds[0] != 0 or out_bounds[-1] != out_size or in_bounds[0] != 0 \
            or in_bounds[-1] != in_size:
        msg = (f"shard boundaries must run from 0 to the sizes {out_size} (output) and "
               f"{in_size} (input); got {out_bounds} and {in_bounds}")
        raise ValueError(msg)
    ek = (kernel - 1) * dilation + 1
    shards = []
    for j in range(len(out_bounds) - 1):
        o0, o1 = out_bounds[j], out_bounds[j + 1]
        i0, i1 = in_bounds[j], in_bounds[j + 1]
        if o0 == o1:
            reads = window = None
        elif data:
            reads = _data_reads(o0, o1, small, kernel, stride, dilation, pad)
            window = _data_reads(o0, o1, small, kernel, stride, dilation, pad, clip=False)
        else:
            reads = _forward_reads(o0, o1, large, kernel, stride, dilation, pad)
            window = (o0 * stride - pad, (o1 - 1) * stride + ek - pad)
        if i0 == i1:
            touches = None
        elif data:   # the a rows that b[i0:i1] writes: the forward hull, roles swapped
            touches = _forward_reads(i0, i1, large, kernel, stride, dilation, pad)
        else:
            touches = _data_reads(i0, i1, small, kernel, stride, dilation, pad)
        reads = reads or (i0, i0)
        window = window or (i0, i0)
        left = max(0, i0 - reads[0]) if reads[0] < reads[1] else 0
        right = max(0, reads[1] - i1) if reads[0] < reads[1] else 0
        shards.append(ShardHalo((o0, o1), (i0, i1), reads, window, touches or (o0, o0),
                                left, right))
    return AxisHalo(primitive, in_size, out_size, tuple(shards))


def plan_axis_halo(plan: Any, axis: int, out_bounds: tuple[int, ...],
                   in_bounds: tuple[int, ...]) -> AxisHalo:
    """:func:`axis_halo` for spatial axis ``axis`` of a :class:`~polyconv.ConvPlan`."""
    return axis_halo(plan.primitive, plan.a_spatial[axis], plan.b_spatial[axis],
                     plan.kernel[axis], plan.strides[axis], plan.dilations[axis],
                     plan.pads_begin[axis], tuple(out_bounds), tuple(in_bounds))
