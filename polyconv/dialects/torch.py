"""PyTorch's ``torch.nn.functional.conv{1,2,3}d`` and ``conv_transpose{1,2,3}d``, argument
for argument (docs/frameworks.md#pytorch).

Data ``NCX``; weights ``[OC, IC/groups, K..]`` (polyconv ``OIX``) and, transposed,
``[IC, OC/groups, K..]`` (``IOX``), used as they are. ``padding`` is an int, one int per
axis, ``"same"`` or ``"valid"``; ``padding="same"`` is PyTorch's split (the odd element at the
end, stride 1 only, as PyTorch requires). A ConvTranspose's ``padding`` crops both ends of the
full output and ``output_padding`` adds at the end; PyTorch allows ``output_padding`` below
``max(stride, dilation)``, polyconv below the stride, so the part at or above the stride is
taken off the end crop where there is one. Nothing here imports torch: the arrays may be
torch tensors (run by polyconv's torch backend) or any other array.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._common import crops, per_axis

__all__ = ["conv", "conv_transpose", "keywords"]

OPS = ("conv", "conv_transpose")


def _padding(who: str, padding: Any, strides, dilations, kernel) -> dict[str, Any]:
    ndim = len(strides)
    if isinstance(padding, str):
        mode = padding.lower()
        if mode == "valid":
            return {"pads_begin": (0,) * ndim, "pads_end": (0,) * ndim}
        if mode != "same":
            msg = (f"{who}: padding must be an int, {ndim} ints, 'same' or 'valid'; got "
                   f"padding={padding!r}")
            raise ValueError(msg)
        if any(s != 1 for s in strides):
            msg = (f"{who}: padding='same' takes stride 1 (PyTorch refuses it for strided "
                   f"convolutions); got stride={list(strides)}; pass the pads, or "
                   f"polyconv.convolution(..., auto_pad='same_upper') for TensorFlow's rule")
            raise ValueError(msg)
        totals = [d * (k - 1) for d, k in zip(dilations, kernel)]
        return {"pads_begin": tuple(t // 2 for t in totals),
                "pads_end": tuple(t - t // 2 for t in totals)}
    pads = per_axis(who, "padding", padding, ndim, 0)
    return {"pads_begin": pads, "pads_end": pads}


def keywords(op: str, x_shape: Sequence[int], w_shape: Sequence[int], *, stride: Any = 1,
             padding: Any = 0, output_padding: Any = 0, dilation: Any = 1, groups: int = 1,
             padding_mode: str = "zeros") -> dict[str, Any]:
    """polyconv's keywords for a PyTorch call: ``polyconv.convolution`` (``op="conv"``) or
    ``polyconv.conv_transpose`` (``op="conv_transpose"``) with them gives PyTorch's output.

    Examples
    --------
    ``padding=1`` crops one position at each end and ``output_padding=1`` adds one back at
    the end: only ``pads_end - output_padding`` changes the values.

    >>> from polyconv.dialects import torch
    >>> kw = torch.keywords("conv_transpose", (1, 4, 5, 5), (4, 2, 3, 3), stride=2,
    ...                     padding=1, output_padding=1)
    >>> kw["pads_begin"], kw["pads_end"], kw["output_padding"]
    ((1, 1), (0, 0), (0, 0))
    """
    who = f"torch {op}"
    if op not in OPS:
        msg = f"torch: op must be one of {OPS}; got op={op!r}"
        raise ValueError(msg)
    if padding_mode != "zeros":
        msg = (f"{who}: padding_mode={padding_mode!r} has no polyconv equivalent: polyconv "
               f"pads with zeros only; pad the input yourself (torch.nn.functional.pad) and "
               f"pass padding=0")
        raise ValueError(msg)
    ndim = len(x_shape) - 2
    strides = per_axis(who, "stride", stride, ndim, 1)
    dilations = per_axis(who, "dilation", dilation, ndim, 1)
    kernel = tuple(w_shape[2:])
    out = {"strides": strides, "dilations": dilations, "groups": int(groups),
           "data_format": "NCX", "weights_format": "OIX" if op == "conv" else "IOX"}
    pads = _padding(who, padding, strides, dilations, kernel)
    if op == "conv":
        if output_padding not in (0, None):
            msg = f"{who}: output_padding belongs to conv_transpose; got {output_padding!r}"
            raise TypeError(msg)
        return {**out, **pads}
    opad = per_axis(who, "output_padding", output_padding, ndim, 0)
    for o, s, d in zip(opad, strides, dilations):
        if not 0 <= o < max(s, d):
            msg = (f"{who}: output_padding must be below max(stride, dilation), as PyTorch "
                   f"requires; got output_padding={list(opad)}, stride={list(strides)}, "
                   f"dilation={list(dilations)}")
            raise ValueError(msg)
    end = [e - o for e, o in zip(pads["pads_end"], opad)]
    why = f"padding={padding!r} with output_padding={list(opad)}"
    return {**out, **crops(who, pads["pads_begin"], end, strides, why)}


def conv(input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
         dilation: Any = 1, groups: int = 1, *, padding_mode: str = "zeros") -> Any:
    """``torch.nn.functional.conv{1,2,3}d`` (and ``Conv*d``'s ``padding_mode``) on polyconv.

    Examples
    --------
    >>> import numpy as np
    >>> from polyconv.dialects import torch
    >>> x, w = np.ones((1, 2, 5, 5), np.float32), np.ones((4, 2, 2, 2), np.float32)
    >>> torch.conv(x, w, padding="same").shape
    (1, 4, 5, 5)
    """
    import polyconv

    kw = keywords("conv", tuple(input.shape), tuple(weight.shape), stride=stride,
                  padding=padding, dilation=dilation, groups=groups, padding_mode=padding_mode)
    return polyconv.convolution(input, weight, bias, **kw)


def conv_transpose(input: Any, weight: Any, bias: Any = None, stride: Any = 1,
                   padding: Any = 0, output_padding: Any = 0, groups: int = 1,
                   dilation: Any = 1) -> Any:
    """``torch.nn.functional.conv_transpose{1,2,3}d`` on polyconv (same argument order).

    Examples
    --------
    >>> import numpy as np
    >>> from polyconv.dialects import torch
    >>> x, w = np.ones((1, 4, 5, 5), np.float32), np.ones((4, 2, 3, 3), np.float32)
    >>> torch.conv_transpose(x, w, stride=2, padding=1, output_padding=1).shape
    (1, 2, 10, 10)
    """
    import polyconv

    kw = keywords("conv_transpose", tuple(input.shape), tuple(weight.shape), stride=stride,
                  padding=padding, output_padding=output_padding, dilation=dilation,
                  groups=groups)
    return polyconv.conv_transpose(input, weight, bias, **kw)
