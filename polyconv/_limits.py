"""What a call may ask for: every number it implies must be one that backends can index
(docs/semantics.md#validation).

Each stride, dilation, pad and size, each extent they imply per axis and each tensor they imply
is checked here, once per call and before any work that grows with the values, against the
limits of the backend that runs it (:class:`IndexLimits`, a backend's ``limits`` hook; see
:class:`polyconv.BackendHooks`). Pure integer arithmetic on a resolved plan: a typo such as
``strides=2**31`` is a ``ValueError`` in microseconds, not a hang or a crash in a library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ._plan import ConvPlan

#: bytes counted per element of every implied tensor: the widest dtype a lowering may hold a
#: tensor in (a float64 input, or a float32 accumulation of a 16-bit one, fits in it)
ELEMENT_BYTES = 8

#: a stride above the padded extent of its axis (one window on that axis) is accepted up to
#: this value: lowerings work through the phases of a stride (polyconv/_phases.py)
PHASE_LIMIT = 2**16


@dataclass(frozen=True)
class IndexLimits:
    """The largest numbers a backend can index (its ``limits`` hook).

    Attributes
    ----------
    bytes : int
        The largest extent, element count or byte size of any tensor a call implies. By
        default ``2**57``: the largest virtual address space of a 64-bit processor (x86-64
        with five-level paging), so that no tensor is refused that could exist in memory.
    attributes : int
        The largest stride, dilation, pad or output padding (by default the largest int64).
    reason : str
        Why, for messages: the indexing that sets these limits.
    """

    bytes: int = 2**57
    attributes: int = 2**63 - 1
    reason: str = ("64-bit indexes, and no 64-bit processor addresses more than 2**57 bytes; "
                   "XLA aborts the process on larger buffers")


#: the limits of a backend that declares none
INDEX_LIMITS = IndexLimits()

_FIX = ("a value this large is most likely a typo: strides, dilations and pads are at most "
        "a few times the data's spatial size")


def check_limits(plan: ConvPlan, large: str, small: str, limits: IndexLimits) -> None:
    """Refuse a plan whose numbers exceed ``limits``: the attributes, then the sizes and the
    extents per axis, then the tensors, then a stride too far past its axis. ``large`` and
    ``small`` name the plan's two data tensors in the op's own terms."""
    op = plan.op
    attributes = (("strides", plan.strides), ("dilations", plan.dilations),
                  ("pads_begin", plan.pads_begin), ("pads_end", plan.pads_end),
                  ("output_padding", plan.output_padding))
    for name, values in attributes:
        if max(values) > min(limits.attributes, limits.bytes):
            limit = min(limits.attributes, limits.bytes)
            msg = (f"{op}: {name}={values} is too large: every stride, dilation, pad and "
                   f"output_padding must be at most {limit} ({limits.reason}); {_FIX}")
            raise ValueError(msg)
    for what, extent, formula in _extents(plan, large, small):
        if extent > limits.bytes:
            msg = (f"{op}: {what} would be {extent}, more than {limits.bytes} ({limits.reason})"
                   f": {formula}; {_FIX}")
            raise ValueError(msg)
    for what, shape in _tensors(plan, large, small):
        size = math.prod(shape) * ELEMENT_BYTES
        if size > limits.bytes:
            msg = (f"{op}: {what} would have shape {shape}: {size} bytes at {ELEMENT_BYTES} "
                   f"bytes an element, more than {limits.bytes} ({limits.reason}); check "
                   f"pads_begin={plan.pads_begin}, pads_end={plan.pads_end}, "
                   f"strides={plan.strides}, dilations={plan.dilations} and the shapes; "
                   f"{_FIX}")
            raise ValueError(msg)
    _check_phases(plan, large)


def _extents(plan: ConvPlan, large: str, small: str):
    """``(what, extent, formula)`` per implied extent of each spatial axis."""
    for i, (a, b, s, ek, p0, p1, o) in enumerate(zip(
            plan.a_spatial, plan.b_spatial, plan.strides, plan.effective_kernel,
            plan.pads_begin, plan.pads_end, plan.output_padding)):
        k, d = plan.kernel[i], plan.dilations[i]
        yield f"{large} size on spatial axis {i}", a, (
            f"strides[{i}]={s} * ({small} size {b} - 1) + effective kernel {ek} ((kernel {k} "
            f"- 1) * dilations[{i}]={d} + 1) - pads_begin[{i}]={p0} - pads_end[{i}]={p1} + "
            f"output_padding[{i}]={o}" if plan.primitive == "backward_data" else "its shape")
        yield f"{small} size on spatial axis {i}", b, "its shape"
        yield (f"the effective kernel extent of spatial axis {i}", ek,
               f"(kernel {k} - 1) * dilations[{i}]={d} + 1")
        yield (f"the padded {large} extent of spatial axis {i}", a + p0 + p1,
               f"{large} size {a} + pads_begin[{i}]={p0} + pads_end[{i}]={p1}")
        yield (f"the zero-interleaved {small} extent of spatial axis {i}",
               s * (b - 1) + 2 * ek - 1 + o,
               f"strides[{i}]={s} * ({small} size {b} - 1) + 2 * effective kernel {ek} - 1 "
               f"+ output_padding[{i}]={o}, what a transposed lowering builds")


def _tensors(plan: ConvPlan, large: str, small: str):
    """``(what, shape)`` of each tensor the plan implies (its two data tensors and weights,
    the padded large one and the zero-interleaved small one), channels first."""
    padded = tuple(a + p0 + p1 for a, p0, p1 in
                   zip(plan.a_spatial, plan.pads_begin, plan.pads_end))
    spread = tuple(s * (b - 1) + 2 * ek - 1 + o for b, s, ek, o in
                   zip(plan.b_spatial, plan.strides, plan.effective_kernel,
                       plan.output_padding))
    n, ca, cb = plan.batch, plan.a_channels, plan.b_channels
    yield large, (n, ca, *plan.a_spatial)
    yield small, (n, cb, *plan.b_spatial)
    yield "the weights", plan.w_shape
    yield f"the padded {large}", (n, ca, *padded)
    yield f"the zero-interleaved {small}", (n, cb, *spread)


def _check_phases(plan: ConvPlan, large: str) -> None:
    """A stride above both the padded extent of its axis and :data:`PHASE_LIMIT`: the output
    has one position on that axis, which the padded extent as stride gives too."""
    for i, (a, s, p0, p1) in enumerate(zip(plan.a_spatial, plan.strides, plan.pads_begin,
                                           plan.pads_end)):
        padded = a + p0 + p1
        if s > max(padded, PHASE_LIMIT):
            msg = (f"{plan.op}: strides={plan.strides} is larger than both {PHASE_LIMIT} and "
                   f"the padded extent of spatial axis {i} ({large} size {a} + pads_begin "
                   f"{p0} + pads_end {p1} = {padded}): such a stride places one window on "
                   f"that axis, and lowerings work through every phase of a stride; pass "
                   f"strides[{i}]={padded} for the same result")
            raise ValueError(msg)
