"""The three primitives as PyTorch's own convolution calls, without autograd.

Every decision that depends only on the plan's geometry (permutations, the symmetric padding
torch takes, the explicit padding or cropping of an asymmetric pad) is made once per plan
(:func:`lowering`, cached); a call then only permutes views, calls torch and, where needed,
pads its input or crops its output.

forward (a, W -> b)
    ``conv{d}d(a, W, bias, stride, padding=m, dilation, groups)`` with ``m = min(pb, pe)``
    per axis; the rest of an asymmetric pad (``pb - m`` or ``pe - m``) is one ``F.pad`` of
    ``a``.

backward_data (b, W -> a)
    ``conv_transpose{d}d(b, W, bias, stride, padding=m, output_padding, groups, dilation)``:
    torch's transposed convolution *is* the adjoint of its convolution, and ``W``
    ``[Cb, Ca/G, K..]`` is already its weight layout (``[in, out/G, K..]``). With ``m =
    min(pb, pe)`` its output starts ``pb - m`` rows early and is ``pe - m`` rows too long;
    those rows are cropped (a view).

backward_weights (a, b -> W)
    ``aten.convolution_backward`` of ``conv{d}d(a, ., stride, m, dilation, groups)`` with only
    the weight gradient asked for (what ``torch.nn.grad.conv*_weight`` calls), ``a`` padded
    as in forward.

Layouts: ``NXC`` data is permuted to ``NCX`` as a view, which is channels-last memory format,
the fast format of oneDNN and cuDNN, so torch computes in it and its result permutes back to
a contiguous ``NXC`` tensor; the weights are permuted to ``[Cb, Ca/G, K..]`` as a view. Every
result is a contiguous tensor in the user's layout.

Numerics (:mod:`polyconv_torch._numerics`): 16-bit inputs computed in float32 where torch's
own 16-bit convolution would not accumulate in float32 with one rounding; float32 at full
precision unless the caller asks otherwise through ``precision``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F

from polyconv._geometry import ConvPlan

from ._numerics import _NO_CHANGE, _level, _precision, _upcast, overridden

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _perm_or_none(perm: tuple[int, ...]) -> tuple[int, ...] | None:
    return None if perm == tuple(range(len(perm))) else perm


@dataclass(frozen=True)
class Lowering:
    """What a call of one plan does, decided once per plan."""

    lift: bool                            # 1-D NXC computed as 2-D [N, C, 1, L], see _lower
    conv: Any                             # torch.nn.functional.conv{d}d
    conv_t: Any                           # torch.nn.functional.conv_transpose{d}d
    to_ncx: tuple[int, ...] | None        # user data layout -> NCX (None: already NCX)
    from_ncx: tuple[int, ...] | None      # NCX -> user data layout
    w_canonical: tuple[int, ...] | None   # user weights -> [Cb, Ca/G, K..]
    w_user: tuple[int, ...] | None        # [Cb, Ca/G, K..] -> user weights
    padding: tuple[int, ...]              # the symmetric padding torch applies
    extra_pad: tuple[int, ...] | None     # F.pad of `a` for an asymmetric pad (None: none)
    crop: tuple[tuple[int, int, int], ...]  # backward_data: (NCX axis, start, length) views
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    output_padding: tuple[int, ...]
    groups: int


def _lower(plan: ConvPlan) -> Lowering:
    """The lowering of one plan.

    1-D ``NXC`` data is lifted to 2-D with a unit axis in front (``[N, L, C]`` ->
    ``[N, C, 1, L]`` as a view, which is channels-last): torch has no channels-last format for
    3-D tensors and would copy the data to ``NCL`` and back, which costs more than the
    convolution's own gain; lifted, oneDNN runs it in its channels-last kernels (about 2x
    faster than the hand-written ``NCL`` call, measured on the 1-D benchmark case).
    """
    lift = plan.ndim == 1 and plan.channels_last
    lead = (0,) if lift else ()                      # the unit axis's attribute values
    d = plan.ndim + lift
    padding = lead + tuple(min(b, e) for b, e in zip(plan.pads_begin, plan.pads_end))
    begins, ends = lead + plan.pads_begin, lead + plan.pads_end
    extra = []
    for b, e, m in reversed(list(zip(begins, ends, padding))):
        extra += [b - m, e - m]                      # F.pad lists the last axis first
    crop = tuple((2 + j, b - m, a) for j, (b, e, m, a) in
                 enumerate(zip(begins, ends, padding, (1,) * lift + plan.a_spatial))
                 if b != e)
    to_ncx = (0, d + 1, *range(1, d + 1)) if plan.channels_last else None
    from_ncx = (0, *range(2, d + 2), 1) if plan.channels_last else None
    return Lowering(
        lift=lift, conv=_CONV[d], conv_t=_CONV_T[d], to_ncx=to_ncx, from_ncx=from_ncx,
        w_canonical=_perm_or_none(plan.weights_perm),
        w_user=_perm_or_none(plan.weights_inverse_perm),
        padding=padding, extra_pad=tuple(extra) if any(extra) else None, crop=crop,
        stride=(1,) * lift + plan.strides, dilation=(1,) * lift + plan.dilations,
        output_padding=lead + _rows_past_last_product(plan), groups=plan.groups)


def _rows_past_last_product(plan: ConvPlan) -> tuple[int, ...]:
    """Per axis, the rows of ``a`` (padded) past the last one a product reaches:
    ``A + pb + pe - (s*(B-1) + ek)``, in ``[0, s)``. This is ``plan.output_padding`` for the
    transposed-direction ops; a forward-direction plan (whose backward_data is its gradient)
    has ``output_padding=0`` but may leave rows that the floor of its size rule dropped."""
    return tuple(a + pb + pe - (s * (b - 1) + ek) for a, b, s, ek, pb, pe in zip(
        plan.a_spatial, plan.b_spatial, plan.strides, plan.effective_kernel, plan.pads_begin,
        plan.pads_end))


@lru_cache(maxsize=4096)
def _lower_cached(plan: ConvPlan) -> Lowering:
    return _lower(plan)


def lowering(plan: ConvPlan) -> Lowering:
    """:func:`_lower`, cached per plan. Under ``torch.compile`` it is traced instead (pure
    Python on the plan's integers: it runs once, when the graph is built)."""
    if torch.compiler.is_compiling():
        return _lower(plan)
    return _lower_cached(plan)


# --------------------------------------------------------------------------------------------
# the primitives (no autograd)
# --------------------------------------------------------------------------------------------


def _ncx(x: torch.Tensor, low: Lowering) -> torch.Tensor:
    """User-layout data as torch's ``NCX`` (a view)."""
    if low.lift:
        x = x.unsqueeze(1)
    return x if low.to_ncx is None else x.permute(*low.to_ncx)


def _user(y: torch.Tensor, perm: tuple[int, ...] | None, dtype: torch.dtype | None,
          lift_axis: int | None = None) -> torch.Tensor:
    """torch's result in the user's layout and dtype (``None``: its own), contiguous (one
    copy at most)."""
    y = y if perm is None else y.permute(*perm)
    if lift_axis is not None:
        y = y.squeeze(lift_axis)
    return (y if dtype is None or y.dtype == dtype else y.to(dtype)).contiguous()


def _pad(x: torch.Tensor, low: Lowering) -> torch.Tensor:
    return x if low.extra_pad is None else F.pad(x, low.extra_pad)


def _cast(plan: ConvPlan, *tensors: Any, bias: bool,
          weights: bool = False) -> tuple[Any, ...] | None:
    """The tensors in float32 where 16-bit inputs must be computed there (``weights``: for a
    weight gradient), else ``None``."""
    x = tensors[0]
    if not _upcast(x.dtype, x.device, bias, weights and plan.groups > 1):
        return None
    return tuple(None if t is None else t.float() for t in tensors)


def kernel(plan: ConvPlan, primitive: str | None = None,
           differentiable: Callable[..., torch.Tensor] | None = None,
           ) -> Callable[..., torch.Tensor]:
    """The primitive (default: the plan's own) as a function of its tensors (``a, w,
    bias=None``, ``b, w, bias=None`` or ``a, b``), everything that depends on the plan alone
    decided here, once: a call then permutes views, checks the float32 setting, calls torch
    and, where needed, pads its input or crops its output. Its torch ops are differentiable
    as they are (ATen's own derivatives), except that a float32 call whose setting is not
    the user's and that needs a gradient is handed to ``differentiable`` when given (see
    :mod:`polyconv_torch._autograd`)."""
    return _KERNELS[primitive or plan.primitive](plan, lowering(plan), differentiable)


@lru_cache(maxsize=4096)
def _kernel_cached(plan: ConvPlan, primitive: str, dtype: str | None,
                   level: str) -> Callable[..., torch.Tensor]:
    return kernel(plan, primitive)


def kernel_cached(plan: ConvPlan, primitive: str) -> Callable[..., torch.Tensor]:
    """:func:`kernel` of ``primitive`` on ``plan`` without a ``differentiable`` hand-over,
    cached per plan, dtype and precision (a plan compares on its geometry alone), built
    afresh while ``torch.compile`` traces."""
    if torch.compiler.is_compiling():
        return kernel(plan, primitive)
    return _kernel_cached(plan, primitive, plan.dtype, _level(plan.precision))


def _device_type(x: torch.Tensor) -> str:
    return "cpu" if x.is_cpu else x.device.type


def _short(*values: tuple[int, ...], defaults: tuple[int, ...]) -> tuple:
    """torch convolution arguments after the tensors: each one an int where every axis has
    the same value (torch broadcasts it), trailing defaults left out. torch parses a tuple
    argument in about 0.25 us, a tenth of a small call's whole Python cost."""
    out = [v[0] if isinstance(v, tuple) and v and len(set(v)) == 1 else v for v in values]
    while out and out[-1] == defaults[len(out) - 1]:
        out.pop()
    return tuple(out)


def grad_needed(*tensors: Any) -> bool:
    """Whether autograd records a call on these tensors."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _forward(plan: ConvPlan, low: Lowering, differentiable) -> Callable[..., torch.Tensor]:
    """``a`` ``[N, Ca, A..]``, weights -> ``b`` ``[N, Cb, B..]`` (+ bias over Cb)."""
    args = _short(low.stride, low.padding, low.dilation, low.groups, defaults=(1, 0, 1, 1))
    return _data_kernel(plan, low, differentiable, low.conv, args, pad=low.extra_pad, crop=())


def _backward_data(plan: ConvPlan, low: Lowering,
                   differentiable) -> Callable[..., torch.Tensor]:
    """``b`` ``[N, Cb, B..]``, weights -> ``a`` ``[N, Ca, A..]`` (+ bias over Ca)."""
    args = _short(low.stride, low.padding, low.output_padding, low.groups, low.dilation,
                  defaults=(1, 0, 0, 1, 1))
    return _data_kernel(plan, low, differentiable, low.conv_t, args, pad=None, crop=low.crop)


def _data_kernel(plan: ConvPlan, low: Lowering, differentiable, conv, args: tuple,
                 pad: Any, crop: Any) -> Callable[..., torch.Tensor]:
    """The per-plan kernel of a primitive whose inputs are data and weights: the data into
    PyTorch's layout (and padded by ``pad``), the weights into its order, ``conv`` with
    ``args``, the result cropped (``(axis, start, length)`` each) and put back."""
    f32, half, level = plan.dtype == "float32", plan.dtype in _HALF_NAMES, _level(
        plan.precision)
    to_ncx, w_perm, out_perm = low.to_ncx, low.w_canonical, low.from_ncx
    lift = 1 if low.lift else None
    plain_out = out_perm is None and lift is None and not half   # one copy at most

    def kernel(x: torch.Tensor, w: torch.Tensor, bias: Any = None) -> torch.Tensor:
        # torch's result has its inputs' dtype unless 16-bit inputs were computed wider
        dtype, setting = None, None
        if f32:
            setting = _precision(level, "cpu" if x.is_cpu else x.device.type)
            if (setting is not None and differentiable is not None
                    and grad_needed(x, w, bias) and overridden(level, _device_type(x))):
                return differentiable(x, w, bias)
        elif half:
            dtype = x.dtype
            wide = _cast(plan, x, w, bias, bias=bias is not None)
            if wide is not None:
                x, w, bias = wide
        if lift is not None:
            x = x.unsqueeze(1)
        if to_ncx is not None:
            x = x.permute(*to_ncx)
        if pad is not None:
            x = F.pad(x, pad)
        if w_perm is not None:
            w = w.permute(*w_perm)
        if lift is not None:
            w = w.unsqueeze(2)
        if setting is None:
            y = conv(x, w, bias, *args)
        else:
            with setting:
                y = conv(x, w, bias, *args)
        for axis, start, length in crop:
            y = y.narrow(axis, start, length)
        return y.contiguous() if plain_out else _user(y, out_perm, dtype, lift)

    return kernel


def _backward_weights(plan: ConvPlan, low: Lowering,
                      differentiable) -> Callable[..., torch.Tensor]:
    """``a``, ``b`` -> weights in the user's ``weights_format``."""
    f32, half, level = plan.dtype == "float32", plan.dtype in _HALF_NAMES, _level(
        plan.precision)
    empty = plan.batch == 0 or math.prod(plan.b_spatial) == 0
    shape = plan.w_shape
    if low.lift:
        shape = (*shape[:2], 1, *shape[2:])
    zeros = (0,) * len(low.stride)

    def backward_weights(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        dtype, setting = a.dtype, None
        if empty:
            return a.new_zeros(plan.weights_shape)
        if f32:
            setting = _precision(level, "cpu" if a.is_cpu else a.device.type)
            if (setting is not None and differentiable is not None
                    and grad_needed(a, b) and overridden(level, _device_type(a))):
                return differentiable(a, b, None)
        elif half:
            wide = _cast(plan, a, b, bias=False, weights=True)
            if wide is not None:
                a, b = wide
        with setting or _NO_CHANGE:
            g = torch.ops.aten.convolution_backward(
                _ncx(b, low), _pad(_ncx(a, low), low), b.new_empty(1).expand(shape), None,
                low.stride, low.padding, low.dilation, False, zeros, low.groups,
                (False, True, False))[1]
        if low.lift:
            g = g.squeeze(2)
        return _user(g, low.w_user, dtype)

    return backward_weights


_KERNELS = {"forward": _forward, "backward_data": _backward_data,
            "backward_weights": _backward_weights}
_HALF_NAMES = ("float16", "bfloat16")


def forward(plan: ConvPlan, a: torch.Tensor, w: torch.Tensor, bias: Any = None) -> torch.Tensor:
    """The forward primitive of ``plan`` (:func:`kernel`)."""
    return kernel_cached(plan, "forward")(a, w, bias)


def backward_data(plan: ConvPlan, b: torch.Tensor, w: torch.Tensor,
                  bias: Any = None) -> torch.Tensor:
    """The backward_data primitive of ``plan`` (:func:`kernel`)."""
    return kernel_cached(plan, "backward_data")(b, w, bias)


def backward_weights(plan: ConvPlan, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The backward_weights primitive of ``plan`` (:func:`kernel`)."""
    return kernel_cached(plan, "backward_weights")(a, b)
