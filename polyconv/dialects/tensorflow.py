"""TensorFlow's ``tf.nn.convolution`` / ``conv1d`` / ``conv2d`` / ``conv3d``,
``conv{1,2,3}d_transpose`` and ``depthwise_conv2d``, argument for argument
(docs/frameworks.md#tensorflow-and-keras).

Filters are ``[K.., IC/groups, OC]`` (polyconv ``XIO``), transposed ``[K.., OC, IC]``
(``XOI``), depthwise ``[KH, KW, IC, multiplier]``. ``strides`` and ``dilations`` are an int,
one per spatial axis, or TensorFlow's ``N + 2`` form with 1 at the batch and channel axes;
``padding`` is ``"SAME"``, ``"VALID"`` or explicit ``[[0, 0], [lo, hi].., [0, 0]]`` in the
data's axis order. A transposed convolution is TensorFlow's gradient of the forward one:
``output_shape`` is that convolution's input, and ``"SAME"`` pads as that forward
convolution does on it (polyconv's ``same_upper`` with ``dst_shape``, rule F), so the
``output_shape`` must be one the forward convolution maps to the input's size. Nothing here
imports tensorflow.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from ._common import namespace, per_axis

__all__ = ["conv1d", "conv1d_transpose", "conv2d", "conv2d_transpose", "conv3d",
           "conv3d_transpose", "convolution", "depthwise_conv2d", "keywords"]


def _channels_last(who: str, data_format: str | None, ndim: int) -> bool:
    if data_format is None or data_format in ("NWC", "NHWC", "NDHWC"):
        return True
    if data_format in ("NCW", "NCHW", "NCDHW"):
        return False
    msg = (f"{who}: data_format must be 'NWC'/'NHWC'/'NDHWC' or 'NCW'/'NCHW'/'NCDHW'; got "
           f"data_format={data_format!r}")
    raise ValueError(msg)


def _spatial_values(who: str, name: str, value: Any, ndim: int, last: bool) -> tuple[int, ...]:
    """An int, ``ndim`` ints, or TensorFlow's ``ndim + 2`` form with 1 at N and C."""
    if value is None or hasattr(value, "__index__"):
        return per_axis(who, name, value, ndim, 1)
    items = [operator.index(v) for v in value]
    if len(items) == ndim + 2:
        outer = (items[0], items[-1]) if last else tuple(items[:2])
        if outer != (1, 1):
            msg = (f"{who}: {name}={items} must be 1 at the batch and channel axes "
                   f"(TensorFlow's rule)")
            raise ValueError(msg)
        items = items[1:-1] if last else items[2:]
    return per_axis(who, name, items, ndim, 1)


def _padding(who: str, padding: Any, ndim: int, last: bool) -> dict[str, Any]:
    if isinstance(padding, (str, bytes)):
        mode = (padding.decode() if isinstance(padding, bytes) else padding).upper()
        if mode not in ("SAME", "VALID"):
            msg = f"{who}: padding must be 'SAME', 'VALID' or explicit pairs; got {padding!r}"
            raise ValueError(msg)
        return {"auto_pad": "same_upper" if mode == "SAME" else "valid"}
    pairs = [tuple(int(v) for v in p) for p in padding]
    outer = (pairs[0], pairs[-1]) if last else tuple(pairs[:2])
    if len(pairs) != ndim + 2 or any(len(p) != 2 for p in pairs) or outer != ((0, 0),) * 2:
        msg = (f"{who}: explicit padding must be {ndim + 2} [before, after] pairs in the data's "
               f"axis order, [0, 0] at the batch and channel axes; got padding={padding!r}")
        raise ValueError(msg)
    inner = pairs[1:-1] if last else pairs[2:]
    return {"pads_begin": tuple(p[0] for p in inner), "pads_end": tuple(p[1] for p in inner)}


def keywords(op: str, input_shape: Sequence[int], filters_shape: Sequence[int], *,
             strides: Any = 1, padding: Any = "VALID", data_format: str | None = None,
             dilations: Any = None, output_shape: Sequence[int] | None = None
             ) -> dict[str, Any]:
    """polyconv's keywords for ``op`` ``"conv"`` (``polyconv.convolution``),
    ``"conv_transpose"`` (``polyconv.conv_transpose``, with ``dst_shape``) or
    ``"depthwise_conv2d"`` (``polyconv.convolution`` after reshaping the filter to
    ``[KH, KW, 1, IC * multiplier]``).

    Examples
    --------
    >>> from polyconv.dialects import tensorflow
    >>> kw = tensorflow.keywords("conv_transpose", (1, 4, 4, 3), (3, 3, 2, 3),
    ...                          strides=[1, 2, 2, 1], padding="SAME",
    ...                          output_shape=[1, 7, 7, 2])
    >>> kw["auto_pad"], kw["dst_shape"]
    ('same_upper', (7, 7))
    """
    who = f"tf.nn {op}"
    ndim = len(input_shape) - 2
    last = _channels_last(who, data_format, ndim)
    out: dict[str, Any] = {
        "strides": _spatial_values(who, "strides", strides, ndim, last),
        "dilations": _spatial_values(who, "dilations", dilations, ndim, last),
        "data_format": "NXC" if last else "NCX", **_padding(who, padding, ndim, last)}
    channels = input_shape[-1] if last else input_shape[1]
    if op == "conv":
        return {**out, "weights_format": "XIO", "groups": channels // filters_shape[-2]}
    if op == "depthwise_conv2d":
        return {**out, "weights_format": "XIO", "groups": channels}
    if op != "conv_transpose":
        msg = f"tf.nn: op must be 'conv', 'conv_transpose' or 'depthwise_conv2d'; got {op!r}"
        raise ValueError(msg)
    if output_shape is None:
        msg = f"{who}: output_shape is required, as TensorFlow requires it"
        raise TypeError(msg)
    shape = tuple(int(v) for v in output_shape)
    if len(shape) != ndim + 2:
        msg = f"{who}: output_shape must be the full {ndim + 2}-D shape; got {list(shape)}"
        raise ValueError(msg)
    return {**out, "weights_format": "XOI", "dst_shape": shape[1:-1] if last else shape[2:]}


def convolution(input: Any, filters: Any, strides: Any = None, padding: Any = "VALID",
                data_format: str | None = None, dilations: Any = None, name: Any = None
                ) -> Any:
    """``tf.nn.convolution`` (and ``conv1d``, ``conv2d``, ``conv3d``) on polyconv; groups
    follow from the filter's input channels, as in TensorFlow.

    Examples
    --------
    >>> import numpy as np
    >>> from polyconv.dialects import tensorflow
    >>> x, f = np.ones((1, 5, 5, 2), np.float32), np.ones((3, 3, 2, 4), np.float32)
    >>> tensorflow.conv2d(x, f, strides=[1, 2, 2, 1], padding="SAME").shape
    (1, 3, 3, 4)
    """
    import polyconv

    kw = keywords("conv", tuple(input.shape), tuple(filters.shape), strides=strides,
                  padding=padding, data_format=data_format, dilations=dilations)
    return polyconv.convolution(input, filters, **kw)


conv1d = conv2d = conv3d = convolution


def conv_transpose(input: Any, filters: Any, output_shape: Sequence[int], strides: Any,
                   padding: Any = "SAME", data_format: str | None = None,
                   dilations: Any = None, name: Any = None) -> Any:
    """``tf.nn.conv{1,2,3}d_transpose`` on polyconv: filters ``[K.., OC, IC]``.

    Examples
    --------
    >>> import numpy as np
    >>> from polyconv.dialects import tensorflow
    >>> x, f = np.ones((1, 4, 4, 3), np.float32), np.ones((3, 3, 2, 3), np.float32)
    >>> tensorflow.conv2d_transpose(x, f, [1, 8, 8, 2], 2).shape
    (1, 8, 8, 2)
    """
    import polyconv

    kw = keywords("conv_transpose", tuple(input.shape), tuple(filters.shape),
                  strides=strides, padding=padding, data_format=data_format,
                  dilations=dilations, output_shape=output_shape)
    return polyconv.conv_transpose(input, filters, **kw)


conv1d_transpose = conv2d_transpose = conv3d_transpose = conv_transpose


def depthwise_conv2d(input: Any, filter: Any, strides: Any, padding: Any,
                     data_format: str | None = None, dilations: Any = None,
                     name: Any = None) -> Any:
    """``tf.nn.depthwise_conv2d``: filter ``[KH, KW, IC, multiplier]``, output channel
    ``c * multiplier + m`` (polyconv's groups own the outer split, the same order)."""
    import polyconv

    kw = keywords("depthwise_conv2d", tuple(input.shape), tuple(filter.shape),
                  strides=strides, padding=padding, data_format=data_format,
                  dilations=dilations)
    *kernel, channels, multiplier = filter.shape
    kernel = namespace(filter).reshape(filter, (*kernel, 1, channels * multiplier))
    return polyconv.convolution(input, kernel, **kw)
