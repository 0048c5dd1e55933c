"""Flax ``nnx`` modules: :class:`Conv` and :class:`ConvTranspose` computed by polyconv.

They take ``flax.nnx.Conv``'s and ``flax.nnx.ConvTranspose``'s arguments with Flax's
meaning and store the same ``nnx.Param`` s (``kernel``, ``bias``) in Flax's layout, so a state
saved from one loads into the other; they add what Flax lacks: ``feature_group_count`` and
``output_padding`` on ConvTranspose, polyconv's ``auto_pad``, and ``data_format="NCX"``.
Every computation is a polyconv op on JAX arrays: ``jax.jit``, ``jax.grad`` and ``jax.vmap``
work, and the gradients are polyconv's own backward ops.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import jax.numpy as jnp
from flax import nnx
from flax.nnx.nn import dtypes

from .. import _ops
from .._weights import convert_weights
from . import _padding

__all__ = ["Conv", "ConvTranspose"]

default_kernel_init = nnx.initializers.lecun_normal()
default_bias_init = nnx.initializers.zeros_init()


def _kernel_size(kernel_size: int | Sequence[int]) -> tuple[int, ...]:
    return (kernel_size,) if isinstance(kernel_size, int) else tuple(kernel_size)


def _params(module: nnx.Module, kernel_shape: tuple[int, ...], out_features: int,
            use_bias: bool, init: dict[str, Any], rngs: nnx.Rngs) -> None:
    """``kernel`` and ``bias`` as Flax creates them (same keys in the same order)."""
    module.kernel = nnx.Param(init["kernel_init"](rngs.params(), kernel_shape,
                                                  init["param_dtype"]),
                              **init["kernel_metadata"])
    module.bias = (nnx.Param(init["bias_init"](rngs.params(), (out_features,),
                                               init["param_dtype"]),
                             **init["bias_metadata"])
                   if use_bias else nnx.data(None))


def _flat_batch(inputs, rank: int):
    """Flax's batch handling: every leading batch axis folded into one (one added when there
    is none); returns the folded inputs and how to restore the output."""
    batch = inputs.ndim - (rank + 1)
    if batch == 1:
        return inputs, lambda y: y
    shape = inputs.shape[:batch]
    return (jnp.reshape(inputs, (-1, *inputs.shape[batch:])),
            lambda y: jnp.reshape(y, (*shape, *y.shape[1:])))


class _Base(nnx.Module):
    """What both modules share: parameters, dtype promotion, masking, the polyconv call."""

    def _arrays(self, inputs):
        kernel = self.kernel[...]
        if self.mask is not None:
            if self.mask.shape != self.kernel_shape:
                msg = (f"mask has shape {self.mask.shape} but the kernel has "
                       f"{self.kernel_shape}; pass a mask of the kernel's shape")
                raise ValueError(msg)
            kernel = kernel * self.mask
        bias = self.bias[...] if self.bias is not None else None
        return self.promote_dtype((inputs, kernel, bias), dtype=self.dtype)


class Conv(_Base):
    """``flax.nnx.Conv`` computed by :func:`polyconv.convolution`.

    Same arguments, parameters (``kernel`` ``[K.., in_features // feature_group_count,
    out_features]``, ``bias`` ``[out_features]``), initialisers and batch handling as
    ``flax.nnx.Conv``; ``padding`` means what it means there (``"SAME"``, ``"SAME_LOWER"``,
    ``"VALID"``, ``"CAUSAL"``, ``"CIRCULAR"``, ``"REFLECT"``, an int, ints or
    ``(low, high)`` pairs).

    Parameters
    ----------
    in_features, out_features : int
    kernel_size : int or sequence of int
    strides : int or sequence of int, default 1
    padding : str, int or sequence, default "SAME"
    kernel_dilation : int or sequence of int, default 1
    feature_group_count : int, default 1
    use_bias : bool, default True
    mask : array, optional
        Multiplies the kernel, as in Flax.
    auto_pad : {"same_upper", "same_lower", "valid"}, optional
        polyconv's ``auto_pad``; replaces ``padding`` when given.
    data_format : {"NXC", "NCX"}, default "NXC"
        ``"NCX"`` takes and returns channels-first data (the kernel layout is unchanged).
    dtype, param_dtype, precision, kernel_init, bias_init, promote_dtype, rngs, \
kernel_metadata, bias_metadata
        As in ``flax.nnx.Conv``; ``precision`` is passed to polyconv (``None``: full
        precision).

    Examples
    --------
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from polyconv.layers.flax import Conv
    >>> layer = Conv(3, 8, (3, 3), strides=2, padding=((0, 1), (1, 1)), rngs=nnx.Rngs(0))
    >>> layer.kernel.shape, layer(jnp.ones((2, 9, 9, 3))).shape
    ((3, 3, 3, 8), (2, 4, 5, 8))
    """

    def __init__(self, in_features: int, out_features: int,
                 kernel_size: int | Sequence[int], strides: int | Sequence[int] | None = 1,
                 *, padding: Any = "SAME", input_dilation: int | Sequence[int] | None = 1,
                 kernel_dilation: int | Sequence[int] | None = 1,
                 feature_group_count: int = 1, use_bias: bool = True, mask: Any = None,
                 auto_pad: str | None = None, data_format: str = "NXC", dtype: Any = None,
                 param_dtype: Any = jnp.float32, precision: Any = None,
                 kernel_init: Any = default_kernel_init, bias_init: Any = default_bias_init,
                 promote_dtype: Any = dtypes.promote_dtype, rngs: nnx.Rngs,
                 kernel_metadata: Mapping[str, Any] = MappingProxyType({}),
                 bias_metadata: Mapping[str, Any] = MappingProxyType({})):
        kernel_size = _kernel_size(kernel_size)
        rank = len(kernel_size)
        if _padding.as_tuple(input_dilation, rank, "input_dilation") != (1,) * rank:
            msg = (f"input_dilation={input_dilation!r}: a convolution with input dilation is "
                   "a transposed convolution; use polyconv.layers.flax.ConvTranspose with "
                   "strides=input_dilation")
            raise ValueError(msg)
        self.kernel_shape = (*kernel_size, in_features // feature_group_count, out_features)
        _params(self, self.kernel_shape, out_features, use_bias, {
            "kernel_init": kernel_init, "bias_init": bias_init, "param_dtype": param_dtype,
            "kernel_metadata": kernel_metadata, "bias_metadata": bias_metadata}, rngs)
        self.in_features, self.out_features = in_features, out_features
        self.kernel_size, self.strides, self.padding = kernel_size, strides, padding
        self.input_dilation, self.kernel_dilation = input_dilation, kernel_dilation
        self.feature_group_count, self.use_bias, self.mask = feature_group_count, use_bias, mask
        self.auto_pad, self.data_format = auto_pad, data_format
        self.dtype, self.param_dtype, self.precision = dtype, param_dtype, precision
        self.promote_dtype = promote_dtype
        dilation = _padding.as_tuple(kernel_dilation, rank, "kernel_dilation")
        self._periodic = (isinstance(padding, str) and auto_pad is None
                          and padding.upper() in ("CIRCULAR", "REFLECT"))
        self._periodic_pads = tuple(((e - 1) // 2, e // 2)
                                    for e in _padding.extents(kernel_size, dilation))
        self._attrs = {
            "strides": _padding.as_tuple(strides, rank, "strides"), "dilations": dilation,
            "groups": feature_group_count, "data_format": data_format,
            **(_padding.conv_padding("VALID" if self._periodic else padding, kernel_size,
                                     dilation, auto_pad))}

    def __call__(self, inputs):
        """The convolution of ``inputs`` (``[*batch, X.., in_features]`` for NXC)."""
        inputs, restore = _flat_batch(inputs, len(self.kernel_size))
        inputs, kernel, bias = self._arrays(inputs)
        if self._periodic:
            mode = {"CIRCULAR": "wrap", "REFLECT": "reflect"}[self.padding.upper()]
            spatial = list(self._periodic_pads)
            widths = ([(0, 0), *spatial, (0, 0)] if self.data_format == "NXC"
                      else [(0, 0), (0, 0), *spatial])
            inputs = jnp.pad(inputs, widths, mode=mode)
        y = _ops.convolution(inputs, kernel, bias, weights_format="XIO", backend="jax",
                             precision=self.precision, **self._attrs)
        return restore(y)


class ConvTranspose(_Base):
    """``flax.nnx.ConvTranspose`` computed by :func:`polyconv.conv_transpose`.

    Same arguments, parameters and initialisers as ``flax.nnx.ConvTranspose``: the kernel is
    ``[K.., in_features, out_features // feature_group_count]`` used as Flax uses it (not
    flipped), or ``[K.., out_features // feature_group_count, in_features]`` with
    ``transpose_kernel=True``; ``padding`` is that of ``lax.conv_transpose`` (``"SAME"``:
    output ``in * strides``; ``"VALID"``; an int, ints or ``(low, high)`` pairs of zeros
    around the stride-dilated input).

    Parameters
    ----------
    in_features, out_features : int
    kernel_size : int or sequence of int
    strides : int or sequence of int, optional
    padding : str, int or sequence, default "SAME"
    kernel_dilation : int or sequence of int, optional
    feature_group_count : int, default 1
        Groups, which Flax's ConvTranspose does not have.
    output_padding : int or sequence of int, default 0
        Positions added at the end of each spatial axis (as in PyTorch), which Flax's
        ConvTranspose does not have.
    auto_pad : {"same_upper", "same_lower", "valid"}, optional
        polyconv's ``auto_pad`` (output ``in * strides + output_padding`` when the dilated
        kernel is at least the stride); replaces ``padding`` when given.
    data_format : {"NXC", "NCX"}, default "NXC"
    transpose_kernel : bool, default False
    use_bias, mask, dtype, param_dtype, precision, kernel_init, bias_init, promote_dtype, \
rngs, kernel_metadata, bias_metadata
        As in ``flax.nnx.ConvTranspose``.

    Examples
    --------
    A grouped, dilated ConvTranspose with ``output_padding``:

    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> from polyconv.layers.flax import ConvTranspose
    >>> layer = ConvTranspose(4, 6, (3, 3), strides=2, kernel_dilation=2,
    ...                       feature_group_count=2, output_padding=1, padding="VALID",
    ...                       rngs=nnx.Rngs(0))
    >>> layer.kernel.shape, layer(jnp.ones((1, 5, 5, 4))).shape
    ((3, 3, 4, 3), (1, 14, 14, 6))
    """

    def __init__(self, in_features: int, out_features: int,
                 kernel_size: int | Sequence[int], strides: int | Sequence[int] | None = None,
                 *, padding: Any = "SAME", kernel_dilation: int | Sequence[int] | None = None,
                 feature_group_count: int = 1, output_padding: int | Sequence[int] = 0,
                 auto_pad: str | None = None, data_format: str = "NXC", use_bias: bool = True,
                 mask: Any = None, dtype: Any = None, param_dtype: Any = jnp.float32,
                 precision: Any = None, kernel_init: Any = default_kernel_init,
                 bias_init: Any = default_bias_init, transpose_kernel: bool = False,
                 promote_dtype: Any = dtypes.promote_dtype, rngs: nnx.Rngs,
                 kernel_metadata: Mapping[str, Any] = MappingProxyType({}),
                 bias_metadata: Mapping[str, Any] = MappingProxyType({})):
        kernel_size = _kernel_size(kernel_size)
        rank = len(kernel_size)
        per_group = out_features // feature_group_count
        self.kernel_shape = (*kernel_size, *((per_group, in_features) if transpose_kernel
                                             else (in_features, per_group)))
        _params(self, self.kernel_shape, out_features, use_bias, {
            "kernel_init": kernel_init, "bias_init": bias_init, "param_dtype": param_dtype,
            "kernel_metadata": kernel_metadata, "bias_metadata": bias_metadata}, rngs)
        self.in_features, self.out_features = in_features, out_features
        self.kernel_size, self.strides, self.padding = kernel_size, strides, padding
        self.kernel_dilation, self.feature_group_count = kernel_dilation, feature_group_count
        self.output_padding, self.auto_pad = output_padding, auto_pad
        self.data_format = data_format
        self.use_bias, self.mask, self.transpose_kernel = use_bias, mask, transpose_kernel
        self.dtype, self.param_dtype, self.precision = dtype, param_dtype, precision
        self.promote_dtype = promote_dtype
        self._attrs = self._resolve(rank)

    def _resolve(self, rank: int) -> dict[str, Any]:
        strides = _padding.as_tuple(self.strides, rank, "strides")
        dilation = _padding.as_tuple(self.kernel_dilation, rank, "kernel_dilation")
        extra = _padding.as_tuple(self.output_padding, rank, "output_padding", default=0)
        auto_pad = _padding.check_auto_pad(self.auto_pad)
        if auto_pad is not None:
            pads = {"auto_pad": auto_pad, "output_padding": extra}
        else:
            lo_hi = _padding.lax_transpose_pairs(self.padding, self.kernel_size, strides,
                                                 dilation, extra)
            pads = _padding.from_dilated_input_pads(lo_hi, self.kernel_size, strides,
                                                    dilation, "padding", self.padding)
        return {"strides": strides, "dilations": dilation, "groups": self.feature_group_count,
                "data_format": self.data_format, **pads}

    def __call__(self, inputs):
        """The transposed convolution of ``inputs`` (``[*batch, X.., in_features]`` for
        NXC)."""
        inputs, restore = _flat_batch(inputs, len(self.kernel_size))
        inputs, kernel, bias = self._arrays(inputs)
        if self.transpose_kernel:
            fmt = "XOI"
        else:
            kernel = convert_weights(kernel, "flax", "XIO", family="conv_transpose")
            fmt = "XIO"
        y = _ops.conv_transpose(inputs, kernel, bias, weights_format=fmt, backend="jax",
                                precision=self.precision, **self._attrs)
        return restore(y)
