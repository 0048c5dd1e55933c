"""``torch.nn`` modules: :class:`Conv` and :class:`ConvTranspose` computed by polyconv's
torch backend (PyTorch's own convolutions, autograd through polyconv's backward ops,
``torch.compile``).

Same arguments, parameters (``weight`` and ``bias``, in torch's layout) and initialisation as
``torch.nn.Conv{1,2,3}d`` and ``torch.nn.ConvTranspose{1,2,3}d``, so ``state_dict`` s
interchange; they add what torch lacks: asymmetric pads (``(begin, end)`` pairs),
``padding="same"`` on ConvTranspose (pytorch#80301) and polyconv's ``auto_pad`` (``same_upper``
/ ``same_lower``: output ``in * stride + output_padding`` when the dilated kernel is at least
the stride), and ``data_format="NXC"`` (channels-last data, no transposes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from .. import _ops
from . import _padding

__all__ = ["Conv", "ConvTranspose"]


class _Base(nn.Module):
    def __init__(self, rank: int, weight_shape: tuple[int, ...], out_channels: int,
                 bias: bool, device: Any, dtype: Any):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(weight_shape, **factory))
        self.bias = nn.Parameter(torch.empty(out_channels, **factory)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """torch's ``_ConvNd.reset_parameters``: Kaiming-uniform weight, uniform bias in
        ``±1/sqrt(fan_in)``."""
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = nn.init._calculate_fan_in_and_fan_out(self.weight)
            if fan_in:
                bound = 1 / math.sqrt(fan_in)
                nn.init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v!r}" for k, v in self._attrs.items())


class Conv(_Base):
    """``torch.nn.Conv{rank}d`` computed by :func:`polyconv.convolution`.

    Parameters
    ----------
    rank : int
        The number of spatial axes (``Conv2d`` is ``rank=2``).
    in_channels, out_channels, kernel_size, stride, dilation, groups, bias, device, dtype
        As in ``torch.nn.Conv2d``; ``weight`` is ``[out, in // groups, K..]``.
    padding : int, ints, (begin, end) pairs, "same" or "valid", default 0
        torch's padding, plus asymmetric pairs; ``"same"`` works with any stride here
        (the odd pad at the end).
    padding_mode : {"zeros"}, default "zeros"
    auto_pad : {"same_upper", "same_lower", "valid"}, optional
        polyconv's ``auto_pad``; replaces ``padding`` when given.
    data_format : {"NCX", "NXC"}, default "NCX"

    Examples
    --------
    >>> import torch
    >>> from polyconv.layers.torch import Conv
    >>> conv = Conv(2, 4, 8, 3, stride=2, padding=((0, 1), (1, 1)), groups=2)
    >>> conv.weight.shape, conv(torch.ones(1, 4, 9, 9)).shape
    (torch.Size([8, 2, 3, 3]), torch.Size([1, 8, 4, 5]))
    """

    def __init__(self, rank: int, in_channels: int, out_channels: int,
                 kernel_size: int | Sequence[int], stride: int | Sequence[int] = 1,
                 padding: Any = 0, dilation: int | Sequence[int] = 1, groups: int = 1,
                 bias: bool = True, padding_mode: str = "zeros", device: Any = None,
                 dtype: Any = None, *, auto_pad: str | None = None, data_format: str = "NCX"):
        if padding_mode != "zeros":
            msg = (f"padding_mode={padding_mode!r}: polyconv pads with zeros only; use "
                   "padding_mode='zeros' or torch.nn.Conv*d")
            raise ValueError(msg)
        kernel = _padding.as_tuple(kernel_size, rank, "kernel_size")
        dilation = _padding.as_tuple(dilation, rank, "dilation")
        self._attrs = {"strides": _padding.as_tuple(stride, rank, "stride"),
                       "dilations": dilation, "groups": groups, "data_format": data_format,
                       **_padding.conv_padding(padding, kernel, dilation, auto_pad)}
        super().__init__(rank, (out_channels, in_channels // groups, *kernel), out_channels,
                         bias, device, dtype)
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, \
            kernel
        self.stride, self.padding, self.dilation, self.groups = self._attrs["strides"], \
            padding, dilation, groups

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """The convolution of a batch ``[N, C, X..]`` (or ``[N, X.., C]`` for NXC)."""
        return _ops.convolution(input, self.weight, self.bias, weights_format="OIX",
                                **self._attrs)


class ConvTranspose(_Base):
    """``torch.nn.ConvTranspose{rank}d`` computed by :func:`polyconv.conv_transpose`.

    Parameters
    ----------
    rank : int
        The number of spatial axes (``ConvTranspose2d`` is ``rank=2``).
    in_channels, out_channels, kernel_size, stride, output_padding, groups, bias, \
dilation, device, dtype
        As in ``torch.nn.ConvTranspose2d``; ``weight`` is ``[in, out // groups, K..]``;
        ``output_padding < stride``.
    padding : int, ints, (begin, end) pairs, "same" or "valid", default 0
        The crop of torch's ``padding`` (the pads of the equivalent convolution), plus
        asymmetric pairs; ``"same"`` is polyconv's ``same_upper`` (output ``in * stride +
        output_padding`` when the dilated kernel is at least the stride), ``"valid"`` crops
        nothing.
    padding_mode : {"zeros"}, default "zeros"
    auto_pad : {"same_upper", "same_lower", "valid"}, optional
        polyconv's ``auto_pad``; replaces ``padding`` when given.
    data_format : {"NCX", "NXC"}, default "NCX"

    Examples
    --------
    ``padding="same"`` on a transposed convolution:

    >>> import torch
    >>> from polyconv.layers.torch import ConvTranspose
    >>> up = ConvTranspose(2, 4, 6, 4, stride=2, padding="same", groups=2)
    >>> up.weight.shape, up(torch.ones(1, 4, 5, 5)).shape
    (torch.Size([4, 3, 4, 4]), torch.Size([1, 6, 10, 10]))
    """

    def __init__(self, rank: int, in_channels: int, out_channels: int,
                 kernel_size: int | Sequence[int], stride: int | Sequence[int] = 1,
                 padding: Any = 0, output_padding: int | Sequence[int] = 0, groups: int = 1,
                 bias: bool = True, dilation: int | Sequence[int] = 1,
                 padding_mode: str = "zeros", device: Any = None, dtype: Any = None, *,
                 auto_pad: str | None = None, data_format: str = "NCX"):
        if padding_mode != "zeros":
            msg = (f"padding_mode={padding_mode!r}: ConvTranspose pads with zeros only, as "
                   "in torch; use padding_mode='zeros'")
            raise ValueError(msg)
        kernel = _padding.as_tuple(kernel_size, rank, "kernel_size")
        strides = _padding.as_tuple(stride, rank, "stride")
        dilation = _padding.as_tuple(dilation, rank, "dilation")
        extra = _padding.as_tuple(output_padding, rank, "output_padding", 0)
        if (chosen := _padding.check_auto_pad(auto_pad)) is not None:
            pads = {"auto_pad": chosen, "output_padding": extra}
        else:
            pads = _padding.crop_transpose_padding(padding, kernel, strides, dilation, extra,
                                                   same_rule="polyconv")
        self._attrs = {"strides": strides, "dilations": dilation, "groups": groups,
                       "data_format": data_format, **pads}
        super().__init__(rank, (in_channels, out_channels // groups, *kernel), out_channels,
                         bias, device, dtype)
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, \
            kernel
        self.stride, self.padding, self.output_padding = strides, padding, extra
        self.dilation, self.groups = dilation, groups

    def forward(self, input: torch.Tensor,
                output_size: Sequence[int] | None = None) -> torch.Tensor:
        """The transposed convolution of a batch; ``output_size`` (torch's: the full shape
        or the spatial sizes) picks the output size among those the stride allows."""
        dst = None if output_size is None else tuple(output_size)[-len(self.kernel_size):]
        attrs = self._attrs if dst is None else {**self._attrs, "output_padding": 0}
        return _ops.conv_transpose(input, self.weight, self.bias, weights_format="IOX",
                                   dst_shape=dst, **attrs)
