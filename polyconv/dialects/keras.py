"""Keras 3's ``keras.ops.conv`` / ``conv_transpose`` and the ``Conv*D`` /
``Conv*DTranspose`` layers' arguments (docs/frameworks.md#tensorflow-and-keras).

Kernels are ``[K.., IC/groups, OC]`` (polyconv ``XIO``) and, transposed, ``[K.., OC, IC]``
(``XOI``), whatever ``data_format``. ``padding`` is ``"valid"`` or ``"same"``: on a
convolution, TensorFlow's SAME (polyconv ``same_upper``); on a transposed convolution with
or without ``output_padding``, Keras's own rule, which is neither ONNX mode when the kernel
is smaller than the stride. The rule here is the one Keras applies on its JAX backend
(``compute_conv_transpose_padding_args_for_jax``), where these are checked; the TensorFlow
backend computes its output shape with the same formula
(``compute_conv_transpose_output_shape``). Keras's transposed convolution has no groups.
Nothing here imports keras.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._common import extents, per_axis
from .jax import transpose_pads

__all__ = ["conv", "conv_transpose", "keywords"]

_FORMATS = {"channels_last": "NXC", "channels_first": "NCX", None: "NXC"}


def _data_format(who: str, data_format: Any) -> str:
    if data_format not in _FORMATS:
        msg = (f"{who}: data_format must be 'channels_last' or 'channels_first'; got "
               f"data_format={data_format!r}")
        raise ValueError(msg)
    return _FORMATS[data_format]


def transpose_pairs(kernel, strides, dilations, padding: str, output_padding):
    """Keras's dilated-input pads for its JAX backend, per axis (``output_padding``: an int or
    ``None`` per axis); the Keras layers read them too."""
    pairs = []
    for k, s, d, o in zip(kernel, strides, dilations, output_padding):
        ek = (k - 1) * d + 1
        if padding == "valid":
            o = max(ek, s) - ek if o is None else o
            pairs.append((ek - 1, ek - 1 + o))
            continue
        total = s + ek - 2 if o is None else ek + ek % 2 - 2 + o
        lo = min(total // 2 + total % 2, ek - 1)
        pairs.append((lo, total - lo))
    return pairs


def keywords(op: str, x_shape: Sequence[int], kernel_shape: Sequence[int], *,
             strides: Any = 1, padding: str = "valid", output_padding: Any = None,
             data_format: str | None = None, dilation_rate: Any = 1) -> dict[str, Any]:
    """polyconv's keywords for ``keras.ops.conv`` (``op="conv"``) or
    ``keras.ops.conv_transpose`` (``op="conv_transpose"``).

    Examples
    --------
    Keras's "same" ConvTranspose with a kernel smaller than the stride adds the missing
    positions at the end:

    >>> from polyconv.dialects import keras
    >>> kw = keras.keywords("conv_transpose", (1, 4, 4, 3), (1, 1, 2, 3), strides=3,
    ...                     padding="same")
    >>> kw["pads_begin"], kw["pads_end"], kw["output_padding"]
    ((0, 0), (0, 0), (2, 2))
    """
    who = f"keras {op}"
    fmt = _data_format(who, data_format)
    ndim = len(x_shape) - 2
    mode = padding.lower() if isinstance(padding, str) else padding
    if mode not in ("valid", "same"):
        msg = f"{who}: padding must be 'valid' or 'same'; got padding={padding!r}"
        raise ValueError(msg)
    strides = per_axis(who, "strides", strides, ndim, 1)
    dilations = per_axis(who, "dilation_rate", dilation_rate, ndim, 1)
    kernel = tuple(kernel_shape[:ndim])
    channels = x_shape[-1] if fmt == "NXC" else x_shape[1]
    out = {"strides": strides, "dilations": dilations, "data_format": fmt}
    if op == "conv":
        return {**out, "auto_pad": "same_upper" if mode == "same" else "valid",
                "groups": channels // kernel_shape[-2], "weights_format": "XIO"}
    if op != "conv_transpose":
        msg = f"keras: op must be 'conv' or 'conv_transpose'; got op={op!r}"
        raise ValueError(msg)
    opad = ((None,) * ndim if output_padding is None else
            per_axis(who, "output_padding", output_padding, ndim, 0))
    pairs = transpose_pairs(kernel, strides, dilations, mode, opad)
    pads = transpose_pads(who, pairs, strides, extents(kernel, dilations))
    return {**out, **pads, "weights_format": "XOI"}


def conv(inputs: Any, kernel: Any, bias: Any = None, strides: Any = 1,
         padding: str = "valid", data_format: str | None = None,
         dilation_rate: Any = 1) -> Any:
    """``keras.ops.conv`` (plus the layer's ``bias``) on polyconv; the groups follow from the
    kernel's input channels, as in Keras.

    Examples
    --------
    >>> import numpy as np
    >>> from polyconv.dialects import keras
    >>> x, k = np.ones((1, 5, 5, 4), np.float32), np.ones((3, 3, 2, 6), np.float32)
    >>> keras.conv(x, k, strides=2, padding="same").shape    # 2 groups
    (1, 3, 3, 6)
    """
    import polyconv

    kw = keywords("conv", tuple(inputs.shape), tuple(kernel.shape), strides=strides,
                  padding=padding, data_format=data_format, dilation_rate=dilation_rate)
    return polyconv.convolution(inputs, kernel, bias, **kw)


def conv_transpose(inputs: Any, kernel: Any, bias: Any = None, strides: Any = 1,
                   padding: str = "valid", output_padding: Any = None,
                   data_format: str | None = None, dilation_rate: Any = 1) -> Any:
    """``keras.ops.conv_transpose`` (plus the layer's ``bias``) on polyconv.

    Examples
    --------
    >>> import numpy as np
    >>> from polyconv.dialects import keras
    >>> x, k = np.ones((1, 4, 4, 3), np.float32), np.ones((3, 3, 2, 3), np.float32)
    >>> keras.conv_transpose(x, k, strides=2, padding="same", output_padding=1).shape
    (1, 8, 8, 2)
    """
    import polyconv

    kw = keywords("conv_transpose", tuple(inputs.shape), tuple(kernel.shape),
                  strides=strides, padding=padding, output_padding=output_padding,
                  data_format=data_format, dilation_rate=dilation_rate)
    return polyconv.conv_transpose(inputs, kernel, bias, **kw)
