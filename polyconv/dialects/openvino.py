"""OpenVINO's ``Convolution``, ``GroupConvolution``, ``ConvolutionBackpropData`` and
``GroupConvolutionBackpropData`` (opset 1 and later), attribute for attribute
(docs/frameworks.md#openvino).

Data ``NCX``. Filters ``[C_OUT, C_IN, K..]`` (``OIX``), ``[G, C_OUT/G, C_IN/G, K..]``,
``[C_IN, C_OUT, K..]`` (``IOX``) and ``[G, C_IN/G, C_OUT/G, K..]``; the group forms are
read with :func:`polyconv.convert_weights` (``"openvino-group"``). ``auto_pad`` is
``explicit``, ``same_upper``, ``same_lower`` or ``valid``. The backprop-data ops follow the
rules OpenVINO's CPU runtime applies (checked against it): without ``output_shape`` an
``auto_pad`` other than ``explicit`` zeroes the pads (the full ``s*(X-1) + ek +
output_padding``); with ``output_shape`` the total ``s*(X-1) + ek + output_padding -
output_shape`` is split with the odd element at the *beginning* for ``same_upper`` (the
opposite of ONNX's and polyconv's ``same_upper``, as the spec's pseudo-code says), a negative
total adds every position at the end and ``valid`` crops nothing at the beginning;
``explicit`` pads with ``output_shape`` crop ``pads_begin`` at the beginning and take
``output_shape`` as the size, ignoring ``pads_end`` and ``output_padding`` (except a 1x1,
stride-1 op whose ``output_shape`` is the data's size: the runtime crops nothing there).
Nothing here imports openvino.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._common import crops, extents, per_axis, text

__all__ = ["convolution", "convolution_backprop_data", "group_convolution",
           "group_convolution_backprop_data", "keywords"]

AUTO_PADS = ("explicit", "same_upper", "same_lower", "valid")


def _auto_pad(who: str, value: Any) -> str:
    mode = "explicit" if value is None else text(value).lower()
    mode = "explicit" if mode in ("notset", "none") else mode
    if mode not in AUTO_PADS:
        msg = f"{who}: auto_pad must be one of {AUTO_PADS}; got auto_pad={value!r}"
        raise ValueError(msg)
    return mode


def _backprop_crops(who, mode, x_spatial, strides, eks, pads_begin, pads_end, opad, out):
    """Per axis, OpenVINO's crops of the full transposed output."""
    full = [s * (x - 1) + ek for x, s, ek in zip(x_spatial, strides, eks)]
    if out is None:
        if mode == "explicit":
            return pads_begin, [e - o for e, o in zip(pads_end, opad)]
        return [0] * len(full), [-o for o in opad]
    if mode == "explicit":
        one_by_one = (all(ek == 1 for ek in eks) and all(st == 1 for st in strides)
                      and list(out) == list(x_spatial))
        # The CPU runtime keeps pads_begin (as OpenVINO's shape inference does) except in a
        # 1x1, stride-1 op whose output_shape is the data's size (checked against it).
        begin = [0] * len(full) if one_by_one else list(pads_begin)
        return begin, [f - b - a for f, b, a in zip(full, begin, out)]
    begin = []
    for f, o, a in zip(full, opad, out):
        total = f + o - a
        if mode == "valid" or total <= 0:
            begin.append(0)
        else:
            begin.append(total - total // 2 if mode == "same_upper" else total // 2)
    return begin, [f - a - b for f, a, b in zip(full, out, begin)]


def keywords(op: str, x_shape: Sequence[int], w_shape: Sequence[int], *, strides: Any = 1,
             pads_begin: Any = None, pads_end: Any = None, dilations: Any = 1,
             auto_pad: Any = "explicit", output_padding: Any = None,
             output_shape: Any = None) -> dict[str, Any]:
    """polyconv's keywords for an OpenVINO op, with its weights read as polyconv's ``OIX``
    (``Convolution``, ``GroupConvolution``) or ``IOX`` (the backprop-data ops) after
    ``convert_weights(w, "openvino-group", ...)`` for the group forms.

    Examples
    --------
    >>> from polyconv.dialects import openvino
    >>> kw = openvino.keywords("ConvolutionBackpropData", (1, 1, 4), (1, 1, 3), strides=2,
    ...                        auto_pad="same_upper", output_shape=[8])
    >>> kw["pads_begin"], kw["pads_end"], kw["output_padding"]
    ((1,), (0,), (0,))
    """
    who = f"openvino {op}"
    grouped = op.startswith("Group")
    ndim = len(x_shape) - 2
    kernel = tuple(w_shape[-ndim:])
    mode = _auto_pad(who, auto_pad)
    strides = per_axis(who, "strides", strides, ndim, 1)
    dilations = per_axis(who, "dilations", dilations, ndim, 1)
    begin = per_axis(who, "pads_begin", pads_begin, ndim, 0)
    end = per_axis(who, "pads_end", pads_end, ndim, 0)
    out = {"strides": strides, "dilations": dilations, "data_format": "NCX",
           "groups": int(w_shape[0]) if grouped else 1}
    if op in ("Convolution", "GroupConvolution"):
        return {**out, "weights_format": "OIX", "pads_begin": begin, "pads_end": end,
                "auto_pad": "none" if mode == "explicit" else mode}
    if op not in ("ConvolutionBackpropData", "GroupConvolutionBackpropData"):
        msg = (f"openvino: op must be Convolution, GroupConvolution, ConvolutionBackpropData "
               f"or GroupConvolutionBackpropData; got {op!r}")
        raise ValueError(msg)
    opad = per_axis(who, "output_padding", output_padding, ndim, 0)
    if output_shape is not None:
        output_shape = per_axis(who, "output_shape", [int(v) for v in output_shape], ndim, 0)
    b, e = _backprop_crops(who, mode, x_shape[2:], strides, extents(kernel, dilations),
                           begin, end, opad, output_shape)
    why = (f"auto_pad={mode!r}, pads_begin={list(begin)}, pads_end={list(end)}, "
           f"output_padding={list(opad)}, output_shape={output_shape}")
    if mode == "explicit" and output_shape is not None:
        why += (" (OpenVINO ignores pads_end and output_padding with output_shape; a smaller "
                "output_shape fits)")
    return {**out, "weights_format": "IOX", **crops(who, b, e, strides, why)}


def _run(op: str, data: Any, filters: Any, attrs: dict[str, Any]) -> Any:
    import polyconv

    kw = keywords(op, tuple(data.shape), tuple(filters.shape), **attrs)
    if op.startswith("Group"):
        family = "convolution" if op == "GroupConvolution" else "conv_transpose"
        filters = polyconv.convert_weights(filters, "openvino-group", kw["weights_format"],
                                           family=family)
    fn = polyconv.convolution if op.endswith("Convolution") else polyconv.conv_transpose
    return fn(data, filters, **kw)


def convolution(data: Any, filters: Any, **attrs: Any) -> Any:
    """``Convolution``: filters ``[C_OUT, C_IN, K..]``.

    Examples
    --------
    >>> import numpy as np
    >>> from polyconv.dialects import openvino
    >>> x, f = np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32)
    >>> openvino.convolution(x, f, strides=[2, 2], auto_pad="same_upper").shape
    (1, 3, 3, 3)
    """
    return _run("Convolution", data, filters, attrs)


def group_convolution(data: Any, filters: Any, **attrs: Any) -> Any:
    """``GroupConvolution``: filters ``[G, C_OUT/G, C_IN/G, K..]``."""
    return _run("GroupConvolution", data, filters, attrs)


def convolution_backprop_data(data: Any, filters: Any, output_shape: Any = None,
                              **attrs: Any) -> Any:
    """``ConvolutionBackpropData``: filters ``[C_IN, C_OUT, K..]``, ``output_shape`` the
    optional third input (spatial sizes).

    Examples
    --------
    >>> import numpy as np
    >>> from polyconv.dialects import openvino
    >>> x, f = np.ones((1, 2, 4, 4), np.float32), np.ones((2, 3, 3, 3), np.float32)
    >>> openvino.convolution_backprop_data(x, f, strides=[2, 2], auto_pad="same_upper").shape
    (1, 3, 9, 9)
    """
    return _run("ConvolutionBackpropData", data, filters,
                {**attrs, "output_shape": output_shape})


def group_convolution_backprop_data(data: Any, filters: Any, output_shape: Any = None,
                                    **attrs: Any) -> Any:
    """``GroupConvolutionBackpropData``: filters ``[G, C_IN/G, C_OUT/G, K..]``."""
    return _run("GroupConvolutionBackpropData", data, filters,
                {**attrs, "output_shape": output_shape})
