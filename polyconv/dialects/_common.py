"""What every dialect shares: per-axis attribute lists, and a transposed convolution's pads
written as polyconv's ``pads_begin``, ``pads_end`` and ``output_padding``.

A framework's ConvTranspose rule always comes down, per spatial axis, to a crop of the full
transposed output ``s*(B-1) + ek`` at the beginning (``pb``) and at the end (``pe``), where a
negative crop would add positions. polyconv crops with ``pads_begin``/``pads_end >= 0`` and adds
at the end with ``output_padding`` in ``[0, stride)`` (docs/semantics.md#sizes); only
``pads_end - output_padding`` changes the values, so :func:`crops` picks the polyconv triple
that gives the framework's output, or says why none does.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any


def per_axis(who: str, name: str, value: Any, ndim: int, default: int) -> tuple[int, ...]:
    """``None`` (the default), an int (broadcast) or ``ndim`` ints."""
    if value is None:
        return (default,) * ndim
    if isinstance(value, (str, bytes, bool)):
        msg = f"{who}: {name} must be an int or {ndim} ints; got {name}={value!r}"
        raise TypeError(msg)
    if hasattr(value, "__index__"):
        return (operator.index(value),) * ndim
    items = tuple(operator.index(v) for v in value)
    if len(items) != ndim:
        msg = (f"{who}: {name} must have one entry per spatial axis ({ndim}); got "
               f"{name}={list(items)}")
        raise ValueError(msg)
    return items


def text(value: Any) -> str:
    """An attribute string as ONNX protobufs and OpenVINO give it (``bytes`` or ``str``)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def spatial(shape: Sequence[int], channels_last: bool) -> tuple[int, ...]:
    shape = tuple(shape)
    return shape[1:-1] if channels_last else shape[2:]


def crops(who: str, begin: Sequence[int], end: Sequence[int], strides: Sequence[int],
          why: str) -> dict[str, tuple[int, ...]]:
    """polyconv's ``pads_begin``, ``pads_end``, ``output_padding`` for a transposed
    convolution that crops ``begin[i]`` and ``end[i]`` positions (negative: adds them) from
    the full transposed output. ``why`` says where the crops came from, for the error."""
    pads_begin, pads_end, output_padding = [], [], []
    for i, (b, e, s) in enumerate(zip(begin, end, strides)):
        if b < 0:
            msg = (f"{who}: {why} gives axis {i} a negative begin crop ({b}): the output would "
                   f"start with {-b} position(s) that receive no product, which polyconv "
                   f"cannot express (its pads_begin is >= 0); pass pads that crop the "
                   f"beginning by 0 or more")
            raise ValueError(msg)
        if e <= -s:
            msg = (f"{who}: {why} gives axis {i} an end crop of {e}: {-e} added position(s) "
                   f"with no product, but polyconv's output_padding (oneDNN's) is below the "
                   f"stride {s}; pads that add at most {s - 1} fit")
            raise ValueError(msg)
        pads_begin.append(b)
        pads_end.append(max(e, 0))
        output_padding.append(max(-e, 0))
    return {"pads_begin": tuple(pads_begin), "pads_end": tuple(pads_end),
            "output_padding": tuple(output_padding)}


def extents(kernel: Sequence[int], dilations: Sequence[int]) -> tuple[int, ...]:
    return tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations))


def dilated_input_crops(who: str, pairs: Sequence[tuple[int, int]], eks: Sequence[int],
                        strides: Sequence[int], why: str) -> dict[str, tuple[int, ...]]:
    """:func:`crops` for the ``lax.conv_transpose`` convention: ``(lo, hi)`` zeros around the
    stride-dilated input of a stride-1 convolution crop ``ek - 1 - lo`` and ``ek - 1 - hi``."""
    return crops(who, [ek - 1 - lo for (lo, _), ek in zip(pairs, eks)],
                 [ek - 1 - hi for (_, hi), ek in zip(pairs, eks)], strides, why)


def namespace(x: Any):
    """The array-API namespace of ``x`` (array-api-compat), for the weights' flips."""
    from array_api_compat import array_namespace

    return array_namespace(x)
