"""Flax ``linen`` modules: :class:`Conv` and :class:`ConvTranspose` computed by polyconv.

The ``linen`` counterparts of :mod:`polyconv.layers.flax`: ``flax.linen.Conv``'s and
``flax.linen.ConvTranspose``'s fields with Flax's meaning, the same ``kernel`` and ``bias``
params (shape inferred from the first input, as in linen), plus ``feature_group_count`` and
``output_padding`` on ConvTranspose, polyconv's ``auto_pad`` and ``data_format``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
from flax import linen as nn
from flax.linen.dtypes import promote_dtype

from .. import _ops
from .._weights import convert_weights
from . import _padding
from .flax import _flat_batch, _kernel_size

__all__ = ["Conv", "ConvTranspose"]

default_kernel_init = nn.initializers.lecun_normal()


def _params(module: nn.Module, kernel_shape: tuple[int, ...], inputs):
    kernel = module.param("kernel", module.kernel_init, kernel_shape, module.param_dtype)
    if module.mask is not None:
        kernel = kernel * module.mask
    bias = (module.param("bias", module.bias_init, (module.features,), module.param_dtype)
            if module.use_bias else None)
    return promote_dtype(inputs, kernel, bias, dtype=module.dtype)


class Conv(nn.Module):
    """``flax.linen.Conv`` computed by :func:`polyconv.convolution` (fields as there, plus
    ``auto_pad`` and ``data_format``; ``input_dilation`` must be 1).

    Examples
    --------
    >>> import jax, jax.numpy as jnp
    >>> from polyconv.layers.linen import Conv
    >>> layer = Conv(8, (3, 3), strides=2, padding=((0, 1), (1, 1)))
    >>> params = layer.init(jax.random.key(0), jnp.ones((1, 9, 9, 3)))
    >>> layer.apply(params, jnp.ones((2, 9, 9, 3))).shape
    (2, 4, 5, 8)
    """

    features: int
    kernel_size: int | Sequence[int]
    strides: int | Sequence[int] | None = 1
    padding: Any = "SAME"
    input_dilation: int | Sequence[int] | None = 1
    kernel_dilation: int | Sequence[int] | None = 1
    feature_group_count: int = 1
    use_bias: bool = True
    mask: Any = None
    dtype: Any = None
    param_dtype: Any = jnp.float32
    precision: Any = None
    kernel_init: Any = default_kernel_init
    bias_init: Any = nn.initializers.zeros_init()
    auto_pad: str | None = None
    data_format: str = "NXC"

    @nn.compact
    def __call__(self, inputs):
        kernel_size = _kernel_size(self.kernel_size)
        rank = len(kernel_size)
        if _padding.as_tuple(self.input_dilation, rank, "input_dilation") != (1,) * rank:
            msg = (f"input_dilation={self.input_dilation!r}: a convolution with input "
                   "dilation is a transposed convolution; use ConvTranspose with "
                   "strides=input_dilation")
            raise ValueError(msg)
        dilation = _padding.as_tuple(self.kernel_dilation, rank, "kernel_dilation")
        periodic = (isinstance(self.padding, str) and self.auto_pad is None
                    and self.padding.upper() in ("CIRCULAR", "REFLECT"))
        inputs, restore = _flat_batch(inputs, rank)
        channels = inputs.shape[-1 if self.data_format == "NXC" else 1]
        kernel_shape = (*kernel_size, channels // self.feature_group_count, self.features)
        inputs, kernel, bias = _params(self, kernel_shape, inputs)
        if periodic:
            spatial = [((e - 1) // 2, e // 2) for e in _padding.extents(kernel_size, dilation)]
            widths = ([(0, 0), *spatial, (0, 0)] if self.data_format == "NXC"
                      else [(0, 0), (0, 0), *spatial])
            mode = {"CIRCULAR": "wrap", "REFLECT": "reflect"}[self.padding.upper()]
            inputs = jnp.pad(inputs, widths, mode=mode)
        pads = _padding.conv_padding("VALID" if periodic else self.padding, kernel_size,
                                     dilation, self.auto_pad)
        y = _ops.convolution(inputs, kernel, bias, weights_format="XIO", backend="jax",
                             strides=_padding.as_tuple(self.strides, rank, "strides"),
                             dilations=dilation, groups=self.feature_group_count,
                             data_format=self.data_format, precision=self.precision, **pads)
        return restore(y)


class ConvTranspose(nn.Module):
    """``flax.linen.ConvTranspose`` computed by :func:`polyconv.conv_transpose` (fields as
    there, plus ``feature_group_count``, ``output_padding``, ``auto_pad`` and
    ``data_format``; the kernel is ``[K.., in, features / groups]``, not flipped, or
    ``[K.., features / groups, in]`` with ``transpose_kernel=True``).

    Examples
    --------
    >>> import jax, jax.numpy as jnp
    >>> from polyconv.layers.linen import ConvTranspose
    >>> layer = ConvTranspose(6, (3, 3), strides=2, feature_group_count=2, output_padding=1,
    ...                       padding="VALID")
    >>> params = layer.init(jax.random.key(0), jnp.ones((1, 5, 5, 4)))
    >>> params["params"]["kernel"].shape, layer.apply(params, jnp.ones((1, 5, 5, 4))).shape
    ((3, 3, 4, 3), (1, 12, 12, 6))
    """

    features: int
    kernel_size: int | Sequence[int]
    strides: Sequence[int] | None = None
    padding: Any = "SAME"
    kernel_dilation: Sequence[int] | None = None
    feature_group_count: int = 1
    output_padding: int | Sequence[int] = 0
    use_bias: bool = True
    mask: Any = None
    dtype: Any = None
    param_dtype: Any = jnp.float32
    precision: Any = None
    kernel_init: Any = default_kernel_init
    bias_init: Any = nn.initializers.zeros_init()
    transpose_kernel: bool = False
    auto_pad: str | None = None
    data_format: str = "NXC"

    def _attrs(self, kernel_size: tuple[int, ...]) -> dict[str, Any]:
        rank = len(kernel_size)
        strides = _padding.as_tuple(self.strides, rank, "strides")
        dilation = _padding.as_tuple(self.kernel_dilation, rank, "kernel_dilation")
        extra = _padding.as_tuple(self.output_padding, rank, "output_padding", default=0)
        if (auto_pad := _padding.check_auto_pad(self.auto_pad)) is not None:
            pads = {"auto_pad": auto_pad, "output_padding": extra}
        else:
            lo_hi = _padding.lax_transpose_pairs(self.padding, kernel_size, strides, dilation,
                                                 extra)
            pads = _padding.from_dilated_input_pads(lo_hi, kernel_size, strides, dilation,
                                                    "padding", self.padding)
        return {"strides": strides, "dilations": dilation, "groups": self.feature_group_count,
                "data_format": self.data_format, **pads}

    @nn.compact
    def __call__(self, inputs):
        kernel_size = _kernel_size(self.kernel_size)
        attrs = self._attrs(kernel_size)
        inputs, restore = _flat_batch(inputs, len(kernel_size))
        channels = inputs.shape[-1 if self.data_format == "NXC" else 1]
        per_group = self.features // self.feature_group_count
        kernel_shape = (*kernel_size, *((per_group, channels) if self.transpose_kernel
                                        else (channels, per_group)))
        inputs, kernel, bias = _params(self, kernel_shape, inputs)
        fmt = "XOI" if self.transpose_kernel else "XIO"
        if not self.transpose_kernel:
            kernel = convert_weights(kernel, "flax", "XIO", family="conv_transpose")
        y = _ops.conv_transpose(inputs, kernel, bias, weights_format=fmt, backend="jax",
                                precision=self.precision, **attrs)
        return restore(y)
