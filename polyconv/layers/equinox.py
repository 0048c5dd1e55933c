"""Equinox modules: :class:`Conv` and :class:`ConvTranspose` computed by polyconv.

They take ``equinox.nn.Conv``'s and ``equinox.nn.ConvTranspose``'s arguments with Equinox's
meaning (unbatched ``[C, X..]`` inputs, ``padding`` of the equivalent convolution) and hold
the same fields (``weight`` and ``bias`` in Equinox's layout, drawn as Equinox draws them from
the same ``key``), so ``eqx.tree_serialise_leaves`` files interchange with Equinox's layers.
They add polyconv's ``auto_pad`` and ``data_format="NXC"``; every computation is a polyconv
op on JAX arrays, and the gradients are polyconv's own backward ops (a ConvTranspose's weight
gradient is one strided convolution, not XLA's lhs-dilated form).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.random as jrandom

from .. import _ops
from .._weights import convert_weights
from . import _padding

__all__ = ["Conv", "ConvTranspose"]

_MODES = {"ZEROS": None, "REFLECT": "reflect", "REPLICATE": "edge", "CIRCULAR": "wrap"}


def _init(key, out_channels: int, grouped_in: int, kernel_size: tuple[int, ...],
          use_bias: bool, dtype: Any):
    """Equinox's initialisation: uniform in ``±1/sqrt(fan_in)``, weight and bias from the two
    halves of ``key``; the bias has shape ``[out_channels, 1, ..]``."""
    dtype = jax.dtypes.canonicalize_dtype(jnp.float64) if dtype is None else dtype
    wkey, bkey = jrandom.split(key, 2)
    lim = 1 / math.sqrt(grouped_in * math.prod(kernel_size))
    weight = jrandom.uniform(wkey, (out_channels, grouped_in, *kernel_size), dtype, -lim, lim)
    bias = (jrandom.uniform(bkey, (out_channels,) + (1,) * len(kernel_size), dtype, -lim, lim)
            if use_bias else None)
    return weight, bias


def _mode(padding_mode: str, allowed: Sequence[str]) -> str:
    mode = str(padding_mode).upper()
    if mode not in allowed:
        msg = (f"padding_mode={padding_mode!r} is not one of {tuple(allowed)} here; polyconv "
               "pads with zeros ('ZEROS'); for another mode use the Equinox layer")
        raise ValueError(msg)
    return mode


def _batched(x, rank: int, who: str):
    if x.ndim != rank + 1:
        msg = (f"{who} takes one unbatched input of rank {rank + 1} ([C, X..] or [X.., C]), "
               f"as Equinox's layers do; got shape {x.shape}: use jax.vmap over a batch")
        raise ValueError(msg)
    return x[None]


class Conv(eqx.Module):
    """``equinox.nn.Conv`` computed by :func:`polyconv.convolution`.

    Same signature, fields and initialisation as ``equinox.nn.Conv``: ``weight``
    ``[out_channels, in_channels // groups, K..]``, ``bias`` ``[out_channels, 1, ..]``;
    ``padding`` is an int, ints, ``(begin, end)`` pairs, ``"SAME"``, ``"SAME_LOWER"`` or
    ``"VALID"``; ``padding_mode`` ``"ZEROS"``, ``"REFLECT"``, ``"REPLICATE"`` or
    ``"CIRCULAR"``. Plus ``auto_pad`` (polyconv's names, replacing ``padding``) and
    ``data_format`` (``"NCX"``, Equinox's, or ``"NXC"``).

    Examples
    --------
    >>> import jax, jax.numpy as jnp
    >>> from polyconv.layers.equinox import Conv
    >>> conv = Conv(2, 4, 8, 3, stride=2, padding=((0, 1), (1, 1)), groups=2,
    ...             key=jax.random.key(0))
    >>> conv.weight.shape, conv(jnp.ones((4, 9, 9))).shape
    ((8, 2, 3, 3), (8, 4, 5))
    """

    num_spatial_dims: int = eqx.field(static=True)
    weight: jax.Array
    bias: jax.Array | None
    in_channels: int = eqx.field(static=True)
    out_channels: int = eqx.field(static=True)
    kernel_size: tuple[int, ...] = eqx.field(static=True)
    stride: tuple[int, ...] = eqx.field(static=True)
    padding: Any = eqx.field(static=True)
    dilation: tuple[int, ...] = eqx.field(static=True)
    groups: int = eqx.field(static=True)
    use_bias: bool = eqx.field(static=True)
    padding_mode: str = eqx.field(static=True)
    auto_pad: str | None = eqx.field(static=True)
    data_format: str = eqx.field(static=True)

    def __init__(self, num_spatial_dims: int, in_channels: int, out_channels: int,
                 kernel_size: int | Sequence[int], stride: int | Sequence[int] = 1,
                 padding: Any = 0, dilation: int | Sequence[int] = 1, groups: int = 1,
                 use_bias: bool = True, padding_mode: str = "ZEROS", dtype: Any = None, *,
                 auto_pad: str | None = None, data_format: str = "NCX", key: Any):
        rank = num_spatial_dims
        self.kernel_size = _padding.as_tuple(kernel_size, rank, "kernel_size")
        if in_channels % groups:
            msg = (f"in_channels={in_channels} must be divisible by groups={groups}; pass "
                   "a groups that divides it")
            raise ValueError(msg)
        self.weight, self.bias = _init(key, out_channels, in_channels // groups,
                                       self.kernel_size, use_bias, dtype)
        self.num_spatial_dims, self.in_channels, self.out_channels = rank, in_channels, \
            out_channels
        self.stride = _padding.as_tuple(stride, rank, "stride")
        self.dilation = _padding.as_tuple(dilation, rank, "dilation")
        self.padding = (padding.upper() if isinstance(padding, str)
                        else _padding.pairs(padding, rank))
        self.groups, self.use_bias = groups, use_bias
        self.padding_mode = _mode(padding_mode, tuple(_MODES))
        self.auto_pad = _padding.check_auto_pad(auto_pad)
        self.data_format = data_format
        _padding.conv_padding(self.padding, self.kernel_size, self.dilation, self.auto_pad)

    def _attrs(self) -> dict[str, Any]:
        return {"strides": self.stride, "dilations": self.dilation, "groups": self.groups,
                "data_format": self.data_format, "weights_format": "OIX",
                **_padding.conv_padding(self.padding, self.kernel_size, self.dilation,
                                        self.auto_pad)}

    def __call__(self, x, *, key: Any = None):
        """The convolution of one unbatched input; ``key`` is ignored (Equinox's API)."""
        del key
        x = _batched(x, self.num_spatial_dims, "Conv")
        attrs = self._attrs()
        if (mode := _MODES[self.padding_mode]) is not None:
            plan = _ops.infer_shape("convolution", x.shape, self.weight.shape, **attrs)
            spatial = list(zip(plan.pads_begin, plan.pads_end))
            widths = ([(0, 0), (0, 0), *spatial] if self.data_format == "NCX"
                      else [(0, 0), *spatial, (0, 0)])
            x = jnp.pad(x, widths, mode=mode)
            attrs = {**attrs, "auto_pad": "valid"}
        bias = None if self.bias is None else jnp.reshape(self.bias, (-1,))
        return _ops.convolution(x, self.weight, bias, backend="jax", **attrs)[0]


class ConvTranspose(eqx.Module):
    """``equinox.nn.ConvTranspose`` computed by :func:`polyconv.conv_transpose`.

    Same signature, fields and initialisation as ``equinox.nn.ConvTranspose``: ``weight``
    ``[out_channels, in_channels // groups, K..]`` as Equinox uses it (the kernel of the
    stride-dilated forward convolution, converted by :func:`polyconv.convert_weights` at each
    call), ``bias`` ``[out_channels, 1, ..]``; ``padding`` is that of the equivalent
    convolution (``"SAME"`` / ``"SAME_LOWER"`` make the output ``in * stride -
    output_padding``, as in Equinox). Only ``padding_mode="ZEROS"``. Plus ``auto_pad``
    (polyconv's: output ``in * stride + output_padding`` when the dilated kernel is at least
    the stride) and ``data_format``.

    Examples
    --------
    A grouped, dilated ConvTranspose with ``output_padding``:

    >>> import jax, jax.numpy as jnp
    >>> from polyconv.layers.equinox import ConvTranspose
    >>> up = ConvTranspose(2, 4, 6, 3, stride=2, output_padding=1, dilation=2, groups=2,
    ...                    key=jax.random.key(0))
    >>> up.weight.shape, up(jnp.ones((4, 5, 5))).shape
    ((6, 2, 3, 3), (6, 14, 14))
    """

    num_spatial_dims: int = eqx.field(static=True)
    weight: jax.Array
    bias: jax.Array | None
    in_channels: int = eqx.field(static=True)
    out_channels: int = eqx.field(static=True)
    kernel_size: tuple[int, ...] = eqx.field(static=True)
    stride: tuple[int, ...] = eqx.field(static=True)
    padding: Any = eqx.field(static=True)
    output_padding: tuple[int, ...] = eqx.field(static=True)
    dilation: tuple[int, ...] = eqx.field(static=True)
    groups: int = eqx.field(static=True)
    use_bias: bool = eqx.field(static=True)
    padding_mode: str = eqx.field(static=True)
    auto_pad: str | None = eqx.field(static=True)
    data_format: str = eqx.field(static=True)

    def __init__(self, num_spatial_dims: int, in_channels: int, out_channels: int,
                 kernel_size: int | Sequence[int], stride: int | Sequence[int] = 1,
                 padding: Any = 0, output_padding: int | Sequence[int] = 0,
                 dilation: int | Sequence[int] = 1, groups: int = 1, use_bias: bool = True,
                 padding_mode: str = "ZEROS", dtype: Any = None, *,
                 auto_pad: str | None = None, data_format: str = "NCX", key: Any):
        rank = num_spatial_dims
        self.kernel_size = _padding.as_tuple(kernel_size, rank, "kernel_size")
        self.weight, self.bias = _init(key, out_channels, in_channels // groups,
                                       self.kernel_size, use_bias, dtype)
        self.num_spatial_dims, self.in_channels, self.out_channels = rank, in_channels, \
            out_channels
        self.stride = _padding.as_tuple(stride, rank, "stride")
        self.output_padding = _padding.as_tuple(output_padding, rank, "output_padding", 0)
        self.dilation = _padding.as_tuple(dilation, rank, "dilation")
        self.padding = (padding.upper() if isinstance(padding, str)
                        else _padding.pairs(padding, rank))
        self.groups, self.use_bias = groups, use_bias
        self.padding_mode = _mode(padding_mode, ("ZEROS",))
        self.auto_pad = _padding.check_auto_pad(auto_pad)
        self.data_format = data_format
        self._attrs()

    def _attrs(self) -> dict[str, Any]:
        if self.auto_pad is not None:
            pads = {"auto_pad": self.auto_pad, "output_padding": self.output_padding}
        else:
            pads = _padding.crop_transpose_padding(self.padding, self.kernel_size, self.stride,
                                                   self.dilation, self.output_padding,
                                                   same_rule="equinox")
        return {"strides": self.stride, "dilations": self.dilation, "groups": self.groups,
                "data_format": self.data_format, "weights_format": "IOX", **pads}

    def __call__(self, x, *, key: Any = None):
        """The transposed convolution of one unbatched input; ``key`` is ignored."""
        del key
        x = _batched(x, self.num_spatial_dims, "ConvTranspose")
        forward = convert_weights(self.weight, "OIX", "XIO", family="convolution")
        weights = convert_weights(forward, "lax-lhs-dilation", "IOX", family="conv_transpose",
                                  groups=self.groups)
        bias = None if self.bias is None else jnp.reshape(self.bias, (-1,))
        return _ops.conv_transpose(x, weights, bias, backend="jax", **self._attrs())[0]
