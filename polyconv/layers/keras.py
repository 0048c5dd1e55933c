"""Keras 3 layers: :class:`Conv` and :class:`ConvTranspose` computed by polyconv.

They are Keras's own convolution layers (``keras.layers.Conv2D`` and friends share their base
class, which these extend) with the computation replaced by :func:`polyconv.convolution` and
:func:`polyconv.conv_transpose`: the same arguments, ``kernel`` and ``bias`` weights made by
``add_weight`` in Keras's layout and with Keras's initialisers, regularisers, constraints and
activation, ``get_config`` for ``model.save`` / ``keras.models.load_model``. They add
``groups`` on ConvTranspose (which Keras lacks, keras#19871), dilation together with strides,
asymmetric pads (``(begin, end)`` pairs) and polyconv's ``auto_pad``.

Backends: on the JAX Keras backend the layers compute on JAX arrays (``jit`` and training
work; gradients are polyconv's own backward ops), on the PyTorch backend on torch tensors
(autograd), on the NumPy backend on numpy arrays (inference: that backend does not train).
On the TensorFlow backend they raise ``NotImplementedError``: polyconv has no backend for
TensorFlow tensors.
"""

from __future__ import annotations

from typing import Any

import keras
from keras.src.layers.convolutional.base_conv import BaseConv
from keras.src.layers.convolutional.base_conv_transpose import BaseConvTranspose

from .. import _ops
from . import _padding

__all__ = ["Conv", "ConvTranspose"]

#: the Keras backends polyconv computes on (its backend of the same array library)
SUPPORTED_BACKENDS = ("jax", "torch", "numpy")


def _check_backend() -> None:
    name = keras.backend.backend()
    if name not in SUPPORTED_BACKENDS:
        msg = (f"polyconv's Keras layers compute on the {', '.join(SUPPORTED_BACKENDS)} Keras "
               f"backends; this one is {name!r}, whose tensors polyconv cannot compute on: "
               "set KERAS_BACKEND=jax (or torch, numpy) before importing keras, or use "
               "keras.layers.Conv*D there")
        raise NotImplementedError(msg)


def _padding_value(padding: Any) -> Any:
    """A string lower-cased (Keras's spelling), numbers as tuples (JSON gives lists back)."""
    if isinstance(padding, str):
        return padding.lower()
    return padding if isinstance(padding, int) else tuple(
        p if isinstance(p, int) else tuple(p) for p in padding)


def _output_shape(op: str, input_shape, kernel_shape, attrs: dict[str, Any]) -> tuple:
    """The output shape from polyconv's shape inference (an unknown batch stays ``None``)."""
    shape = list(input_shape)
    batch = shape[0]
    shape[0] = 1 if batch is None else batch
    if any(s is None for s in shape):
        msg = f"{op}: spatial sizes must be known to infer the output shape; got {input_shape}"
        raise ValueError(msg)
    out = _ops.infer_shape(op, tuple(shape), tuple(kernel_shape), **attrs).shape
    return (batch, *out[1:])


@keras.saving.register_keras_serializable(package="polyconv")
class Conv(BaseConv):
    """Keras's ``Conv{1,2,3}D`` of any rank, computed by :func:`polyconv.convolution`.

    Parameters
    ----------
    rank : int
        The number of spatial axes (``Conv2D`` is ``rank=2``).
    filters, kernel_size, strides, dilation_rate, groups, data_format, activation, \
use_bias, kernel_initializer, bias_initializer, kernel_regularizer, bias_regularizer, \
activity_regularizer, kernel_constraint, bias_constraint
        As in ``keras.layers.Conv2D``; ``kernel`` is ``[K.., in // groups, filters]``.
    padding : {"valid", "same", "causal"}, int, ints or (begin, end) pairs
        Keras's strings (``"same"`` puts the odd pad at the end), or explicit zero pads.
    auto_pad : {"same_upper", "same_lower", "valid"}, optional
        polyconv's ``auto_pad``; replaces ``padding`` when given.

    Examples
    --------
    >>> import numpy as np
    >>> from polyconv.layers.keras import Conv
    >>> layer = Conv(2, 8, 3, strides=2, padding=((0, 1), (1, 1)), groups=2)
    >>> layer(np.ones((1, 9, 9, 4), "float32")).shape
    (1, 4, 5, 8)
    """

    def __init__(self, rank: int, filters: int, kernel_size: Any, strides: Any = 1,
                 padding: Any = "valid", data_format: str | None = None,
                 dilation_rate: Any = 1, groups: int = 1, auto_pad: str | None = None,
                 **kwargs: Any):
        super().__init__(rank, filters, kernel_size, strides=strides, padding="valid",
                         data_format=data_format, dilation_rate=1, groups=groups, **kwargs)
        self.padding = _padding_value(padding)
        self.dilation_rate = _padding.as_tuple(dilation_rate, rank, "dilation_rate")
        self.auto_pad = _padding.check_auto_pad(auto_pad)
        self._attrs()

    def _attrs(self) -> dict[str, Any]:
        pads = _padding.conv_padding(self.padding, self.kernel_size, self.dilation_rate,
                                     self.auto_pad)
        return {"strides": self.strides, "dilations": self.dilation_rate,
                "groups": self.groups, "weights_format": "XIO",
                "data_format": "NXC" if self.data_format == "channels_last" else "NCX", **pads}

    def convolution_op(self, inputs, kernel):
        _check_backend()
        kernel = keras.ops.convert_to_tensor(kernel)
        return _ops.convolution(inputs, kernel, **self._attrs())

    def compute_output_shape(self, input_shape):
        channels = input_shape[-1 if self.data_format == "channels_last" else 1]
        kernel = (*self.kernel_size, channels // self.groups, self.filters)
        return _output_shape("convolution", input_shape, kernel, self._attrs())

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "rank": self.rank, "auto_pad": self.auto_pad}


@keras.saving.register_keras_serializable(package="polyconv")
class ConvTranspose(BaseConvTranspose):
    """Keras's ``Conv{1,2,3}DTranspose`` of any rank, with groups, computed by
    :func:`polyconv.conv_transpose`.

    Parameters
    ----------
    rank : int
        The number of spatial axes (``Conv2DTranspose`` is ``rank=2``).
    filters, kernel_size, strides, output_padding, dilation_rate, data_format, activation, \
use_bias, kernel_initializer, bias_initializer, kernel_regularizer, bias_regularizer, \
activity_regularizer, kernel_constraint, bias_constraint
        As in ``keras.layers.Conv2DTranspose`` (on the JAX backend); dilation may go with
        strides here. ``kernel`` is ``[K.., filters // groups, in]``.
    padding : {"valid", "same"}, int, ints or (begin, end) pairs
        Keras's strings, with Keras's meaning on its JAX backend (``"same"`` makes
        ``in * strides`` without ``output_padding``), or the crop pads of the equivalent
        convolution (PyTorch's ``padding``).
    groups : int, default 1
        Grouped transposed convolution (Keras has none).
    auto_pad : {"same_upper", "same_lower", "valid"}, optional
        polyconv's ``auto_pad``; replaces ``padding`` when given.

    Examples
    --------
    >>> import numpy as np
    >>> from polyconv.layers.keras import ConvTranspose
    >>> layer = ConvTranspose(2, 6, 3, strides=2, padding="same", groups=2)
    >>> layer(np.ones((1, 5, 5, 4), "float32")).shape
    (1, 10, 10, 6)
    """

    def __init__(self, rank: int, filters: int, kernel_size: Any, strides: Any = 1,
                 padding: Any = "valid", output_padding: Any = None,
                 data_format: str | None = None, dilation_rate: Any = 1, groups: int = 1,
                 auto_pad: str | None = None, **kwargs: Any):
        super().__init__(rank, filters, kernel_size, strides=strides, padding="valid",
                         output_padding=output_padding, data_format=data_format,
                         dilation_rate=1, **kwargs)
        self.padding = _padding_value(padding)
        self.dilation_rate = _padding.as_tuple(dilation_rate, rank, "dilation_rate")
        self.groups = groups
        self.auto_pad = _padding.check_auto_pad(auto_pad)
        if filters % groups:
            msg = (f"filters={filters} must be divisible by groups={groups}; pass a groups "
                   "that divides it")
            raise ValueError(msg)
        self._attrs()

    def _attrs(self) -> dict[str, Any]:
        extra = self.output_padding
        if self.auto_pad is not None:
            pads = {"auto_pad": self.auto_pad, "output_padding": extra or 0}
        elif isinstance(self.padding, str):
            lo_hi = _padding.keras_transpose_pairs(self.padding, self.kernel_size,
                                                   self.strides, self.dilation_rate, extra)
            pads = _padding.from_dilated_input_pads(lo_hi, self.kernel_size, self.strides,
                                                    self.dilation_rate, "padding", self.padding)
        else:
            pads = _padding.crop_transpose_padding(self.padding, self.kernel_size,
                                                   self.strides, self.dilation_rate,
                                                   extra or (0,) * self.rank, "polyconv")
        return {"strides": self.strides, "dilations": self.dilation_rate,
                "groups": self.groups, "weights_format": "XOI",
                "data_format": "NXC" if self.data_format == "channels_last" else "NCX", **pads}

    def build(self, input_shape):
        channels = input_shape[-1 if self.data_format == "channels_last" else 1]
        if channels % self.groups:
            msg = (f"the input has {channels} channels, which groups={self.groups} does not "
                   "divide; pass a groups that divides both channel counts")
            raise ValueError(msg)
        # Keras's build makes the kernel [K.., filters, in]: per group, [K.., filters/G, in];
        # the bias, of all the filters, is made here after it (the same order of weights)
        filters, use_bias = self.filters, self.use_bias
        self.filters, self.use_bias = filters // self.groups, False
        try:
            super().build(input_shape)
        finally:
            self.filters, self.use_bias = filters, use_bias
        if use_bias:
            self.bias = self.add_weight(
                name="bias", shape=(filters,), initializer=self.bias_initializer,
                regularizer=self.bias_regularizer, constraint=self.bias_constraint,
                trainable=True, dtype=self.dtype)

    def call(self, inputs):
        _check_backend()
        kernel = keras.ops.convert_to_tensor(self.kernel)
        bias = None if self.bias is None else keras.ops.convert_to_tensor(self.bias)
        outputs = _ops.conv_transpose(inputs, kernel, bias, **self._attrs())
        return outputs if self.activation is None else self.activation(outputs)

    def compute_output_shape(self, input_shape):
        channels = input_shape[-1 if self.data_format == "channels_last" else 1]
        kernel = (*self.kernel_size, self.filters // self.groups, channels)
        return _output_shape("conv_transpose", input_shape, kernel, self._attrs())

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "rank": self.rank, "groups": self.groups,
                "auto_pad": self.auto_pad}
