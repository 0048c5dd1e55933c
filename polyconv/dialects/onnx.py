"""ONNX's ``Conv`` and ``ConvTranspose``, attribute for attribute (docs/frameworks.md#onnx).

ONNX data is ``NCX``; ``Conv``'s ``W`` is ``[M, C/group, K..]`` (polyconv ``OIX``) and
``ConvTranspose``'s ``[C, M/group, K..]`` (polyconv ``IOX``): the weights are used as they
are. Every attribute of the two operators is read: ``auto_pad`` (``NOTSET``, ``SAME_UPPER``,
``SAME_LOWER``, ``VALID``), ``pads``, ``strides``, ``dilations``, ``group``, ``kernel_shape``
and, for ``ConvTranspose``, ``output_padding`` and ``output_shape``. ONNX's ConvTranspose
rules for ``SAME_*`` and ``output_shape`` are not polyconv's (``same_*`` there is rule T,
docs/semantics.md#auto-pad); this module computes ONNX's pads by ONNX's formula and passes
them explicitly, so the result is ONNX's. The attributes may be given as Python values, as
ONNX's protobuf gives them (``bytes`` strings), or read from a ``NodeProto``
(:func:`node_attributes`, which needs the ``onnx`` package; nothing else here does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._common import crops, extents, per_axis, text

__all__ = ["conv", "conv_transpose", "keywords", "node_attributes", "run_node"]

OP_TYPES = ("Conv", "ConvTranspose")
AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
_ATTRIBUTES = {
    "Conv": ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"),
    "ConvTranspose": ("auto_pad", "dilations", "group", "kernel_shape", "output_padding",
                      "output_shape", "pads", "strides"),
}


def _check(op_type: str, x_shape, w_shape, attributes: dict) -> str:
    if op_type not in OP_TYPES:
        msg = f"onnx: op_type must be one of {OP_TYPES}; got {op_type!r}"
        raise ValueError(msg)
    unknown = sorted(set(attributes) - set(_ATTRIBUTES[op_type]))
    if unknown:
        msg = (f"onnx {op_type}: unknown attribute(s) {unknown}; the operator's are "
               f"{list(_ATTRIBUTES[op_type])}")
        raise TypeError(msg)
    auto_pad = text(attributes.get("auto_pad", "NOTSET")).upper()
    if auto_pad not in AUTO_PADS:
        msg = f"onnx {op_type}: auto_pad must be one of {AUTO_PADS}; got {auto_pad!r}"
        raise ValueError(msg)
    kernel = attributes.get("kernel_shape")
    if kernel is not None and tuple(kernel) != tuple(w_shape[2:]):
        msg = (f"onnx {op_type}: kernel_shape={list(kernel)} must be the spatial shape of "
               f"W, {list(w_shape[2:])} (W.shape={tuple(w_shape)}); fix the attribute or "
               f"the initializer")
        raise ValueError(msg)
    return auto_pad


def _pads(who: str, pads: Any, ndim: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """ONNX's ``pads``: all the begins, then all the ends."""
    values = tuple(int(p) for p in pads) if pads is not None else (0,) * 2 * ndim
    if len(values) != 2 * ndim:
        msg = (f"{who}: pads must list {2 * ndim} values (the {ndim} begins, then the "
               f"{ndim} ends); got pads={list(values)}")
        raise ValueError(msg)
    return values[:ndim], values[ndim:]


def _half(total: int) -> int:
    """``total / 2`` in ONNX's formula, rounded down as the ONNX reference implementation
    rounds it (the two differ only on a negative total, where onnxruntime clamps the total
    to 0 instead: docs/frameworks.md#onnx)."""
    return total // 2


def _transpose_crops(who: str, auto_pad: str, x_spatial, strides, eks, attributes):
    """ONNX's ConvTranspose pads (docs/frameworks.md#onnx), as crops of the full output."""
    ndim = len(strides)
    opad = per_axis(who, "output_padding", attributes.get("output_padding"), ndim, 0)
    if any(not 0 <= o < s for o, s in zip(opad, strides)):
        msg = (f"{who}: output_padding must be in [0, strides) per axis, as onnxruntime and "
               f"the ONNX reference require; got output_padding={list(opad)}, "
               f"strides={list(strides)}")
        raise ValueError(msg)
    out = attributes.get("output_shape")
    if out is not None:
        out = tuple(int(o) for o in out)
        out = out[2:] if len(out) == ndim + 2 else out
        out = per_axis(who, "output_shape", out, ndim, 0)
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = tuple(x * s for x, s in zip(x_spatial, strides))
    if out is None:
        begin, end = ((0,) * ndim,) * 2 if auto_pad == "VALID" else _pads(
            who, attributes.get("pads"), ndim)
        why = f"pads={[*begin, *end]} with output_padding={list(opad)}"
    else:
        begin, end = [], []
        for x, s, ek, o, a in zip(x_spatial, strides, eks, opad, out):
            total = s * (x - 1) + o + ek - a
            small, large = _half(total), total - _half(total)
            if auto_pad == "SAME_UPPER":
                begin.append(small)
                end.append(large)
            elif total < 0 and auto_pad != "SAME_LOWER":
                begin.append(0)         # both runtimes: every added position at the end
                end.append(total)
            else:
                begin.append(large)
                end.append(small)
        why = (f"output_shape={list(out)} (auto_pad={auto_pad}, output_padding="
               f"{list(opad)})")
    return crops(who, begin, [e - o for e, o in zip(end, opad)], strides, why)


def keywords(op_type: str, x_shape: Sequence[int], w_shape: Sequence[int],
             **attributes: Any) -> dict[str, Any]:
    """polyconv's keywords for an ONNX node: ``polyconv.convolution`` (``Conv``) or
    ``polyconv.conv_transpose`` (``ConvTranspose``) with them gives ONNX's output.

    Parameters
    ----------
    op_type : {"Conv", "ConvTranspose"}
    x_shape, w_shape : sequence of int
        The shapes of the node's inputs ``X`` (``NCX``) and ``W``.
    **attributes
        The node's attributes by their ONNX names; absent ones take ONNX's defaults.

    Returns
    -------
    dict
        ``strides``, ``dilations``, ``groups``, the pads (``auto_pad`` or explicit
        ``pads_begin``/``pads_end``, and ``output_padding`` for ConvTranspose),
        ``data_format="NCX"`` and the weights format of ONNX's ``W``.

    Examples
    --------
    ONNX's ``SAME_UPPER`` ConvTranspose makes ``X * strides`` whatever ``output_padding``
    is, by putting ``output_padding`` into the pads (here ONNX's pads are 1 and 1, and
    ``output_padding`` 1 re-admits the position the end pad crops):

    >>> from polyconv.dialects import onnx
    >>> kw = onnx.keywords("ConvTranspose", (1, 1, 3, 3), (1, 2, 3, 3), strides=[2, 2],
    ...                    auto_pad="SAME_UPPER", output_padding=[1, 1])
    >>> kw["pads_begin"], kw["pads_end"], kw["output_padding"]
    ((1, 1), (0, 0), (0, 0))
    """
    who = f"onnx {op_type}"
    auto_pad = _check(op_type, x_shape, w_shape, attributes)
    ndim = len(x_shape) - 2
    strides = per_axis(who, "strides", attributes.get("strides"), ndim, 1)
    dilations = per_axis(who, "dilations", attributes.get("dilations"), ndim, 1)
    out = {"strides": strides, "dilations": dilations,
           "groups": int(attributes.get("group", 1)), "data_format": "NCX"}
    if op_type == "Conv":
        out["weights_format"] = "OIX"
        if auto_pad == "NOTSET":
            out["pads_begin"], out["pads_end"] = _pads(who, attributes.get("pads"), ndim)
        else:
            out["auto_pad"] = auto_pad.lower()
        return out
    eks = extents(w_shape[2:], dilations)
    out["weights_format"] = "IOX"
    out.update(_transpose_crops(who, auto_pad, tuple(x_shape[2:]), strides, eks, attributes))
    return out


def conv(X: Any, W: Any, B: Any = None, **attributes: Any) -> Any:
    """ONNX ``Conv`` on polyconv: ``X`` ``NCX``, ``W`` ``[M, C/group, K..]``, ``B`` ``[M]``.

    Examples
    --------
    >>> import numpy as np
    >>> from polyconv.dialects import onnx
    >>> x, w = np.ones((1, 1, 5, 5), np.float32), np.ones((1, 1, 3, 3), np.float32)
    >>> onnx.conv(x, w, auto_pad="SAME_LOWER", strides=[2, 2])[0, 0]
    array([[4., 6., 4.],
           [6., 9., 6.],
           [4., 6., 4.]], dtype=float32)
    """
    import polyconv

    kw = keywords("Conv", tuple(X.shape), tuple(W.shape), **attributes)
    return polyconv.convolution(X, W, B, **kw)


def conv_transpose(X: Any, W: Any, B: Any = None, **attributes: Any) -> Any:
    """ONNX ``ConvTranspose`` on polyconv: ``X`` ``NCX``, ``W`` ``[C, M/group, K..]``.

    Examples
    --------
    >>> import numpy as np
    >>> from polyconv.dialects import onnx
    >>> x, w = np.ones((1, 1, 3, 3), np.float32), np.ones((1, 2, 3, 3), np.float32)
    >>> onnx.conv_transpose(x, w, strides=[3, 2], output_shape=[10, 8]).shape
    (1, 2, 10, 8)
    """
    import polyconv

    kw = keywords("ConvTranspose", tuple(X.shape), tuple(W.shape), **attributes)
    return polyconv.conv_transpose(X, W, B, **kw)


def node_attributes(node: Any) -> tuple[str, dict[str, Any]]:
    """An ONNX ``NodeProto``'s op type and attributes as Python values (needs ``onnx``)."""
    from onnx import helper

    return node.op_type, {a.name: helper.get_attribute_value(a) for a in node.attribute}


def run_node(node: Any, *inputs: Any) -> Any:
    """Run a ``Conv`` or ``ConvTranspose`` ``NodeProto`` on ``inputs`` (``X, W[, B]``)."""
    op_type, attributes = node_attributes(node)
    fn = conv if op_type == "Conv" else conv_transpose
    if op_type not in OP_TYPES:
        msg = f"onnx: run_node runs {OP_TYPES} nodes; got a {op_type!r} node"
        raise ValueError(msg)
    return fn(*inputs, **attributes)
