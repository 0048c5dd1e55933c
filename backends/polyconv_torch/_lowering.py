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

Numerics: float32/float64 accumulate in their own dtype (no TF32 on CUDA unless the caller
asks through ``precision``, see :func:`_fp32_precision`). float16/bfloat16 run natively where
the engine accumulates in float32 and adds the bias before its one rounding and is trusted to
(cuDNN without bias, grouped weight gradients excepted; not oneDNN, see
:data:`CPU_NATIVE_16BIT`); elsewhere the inputs are cast to float32, computed there and
rounded once (:func:`_upcast`).
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import torch
import torch.nn.functional as F

from polyconv._geometry import PRECISION_NAMES, ConvPlan

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
# numerics: 16-bit accumulation and float32 precision
# --------------------------------------------------------------------------------------------

_HALF = (torch.float16, torch.bfloat16)


def _onednn_16bit() -> dict[torch.dtype, bool]:
    if not torch.backends.mkldnn.is_available():
        return {torch.bfloat16: False, torch.float16: False}
    mkldnn = torch.ops.mkldnn
    return {torch.bfloat16: bool(mkldnn._is_mkldnn_bf16_supported()),
            torch.float16: bool(mkldnn._is_mkldnn_fp16_supported())}


#: whether oneDNN runs each 16-bit dtype natively on this CPU (then torch always takes it)
ONEDNN_16BIT = _onednn_16bit()
#: whether polyconv lets oneDNN's native 16-bit convolutions compute on a CPU that has them.
#: It does not: with PyTorch 2.13's oneDNN 3.12 on a Xeon with AVX512-BF16, AVX512-FP16 and
#: AMX, bfloat16 convolutions whose last output axis has one position and a stride above one
#: returned garbage (errors up to 1e38, 17 of 1500 random small plans, 2-D and 3-D), and a
#: float16 1-D convolution of a one-sample input with padding, stride 2 and dilation 2
#: crashed the process. Computing in float32 and rounding once meets the same bound.
CPU_NATIVE_16BIT = False


def _native_16bit(device_type: str, dtype: torch.dtype, bias: bool,
                  grouped_weights: bool = False) -> bool:
    """Whether torch's own 16-bit convolution accumulates in float32 and rounds once.

    CPU: oneDNN does (bias inside the accumulator) where the CPU has native support for the
    dtype, and torch then always takes oneDNN; elsewhere torch's fallback may round partial
    sums. polyconv takes neither on CPU (:data:`CPU_NATIVE_16BIT`: oneDNN's native 16-bit
    kernels gave wrong results and a crash on some plans). CUDA: cuDNN's convolutions
    accumulate in float32, but torch adds the bias afterwards, in 16 bits; and its grouped
    weight gradients (``grouped_weights``) may round partial sums of the reduction over
    batch and positions to 16 bits (seen on depthwise plans, cuDNN 9.19 on an H100: errors
    2-6x the one-rounding bound; the ungrouped ones of the same test grid were within it).
    """
    if device_type == "cpu":
        return CPU_NATIVE_16BIT and ONEDNN_16BIT[dtype]
    return device_type == "cuda" and not bias and not grouped_weights


def _upcast(dtype: torch.dtype, device: torch.device, bias: bool,
            grouped_weights: bool) -> bool:
    return dtype in _HALF and not _native_16bit(device.type, dtype, bias, grouped_weights)


def _level(precision: Any) -> str:
    """``plan.precision`` as one of ``DEFAULT``, ``HIGH``, ``HIGHEST`` (``None``: HIGHEST)."""
    if isinstance(precision, (tuple, list)):
        precision = precision[0]
    if precision is None:
        return "HIGHEST"
    if not isinstance(precision, str):
        return getattr(precision, "name", "HIGHEST")  # a jax.lax.Precision
    return PRECISION_NAMES[precision.lower()]


_NO_CHANGE = contextlib.nullcontext()


class _Knob:
    """A process-wide float32 precision setting for convolutions, as ``read()`` and
    ``write(value)`` of torch's values (``"ieee"``, ``"tf32"``, ``"bf16"``, ``"none"``)."""

    __slots__ = ("read", "write")

    def __init__(self, read: Callable[[], str], write: Callable[[str], None]):
        self.read, self.write = read, write


def _knob(name: str) -> _Knob | None:
    """``torch.backends.<name>.conv.fp32_precision`` (torch 2.9 on), through torch's C getter
    and setter: the knob object answers through ``__getattr__``, after a failed attribute
    lookup, 2-5 us a read on every float32 call. Before torch 2.9: cuDNN's ``allow_tf32``
    flag, read as ``"tf32"`` or ``"ieee"``; oneDNN then had no reduced float32 setting."""
    module = getattr(torch.backends, name)
    knob = getattr(module, "conv", None)
    getter = getattr(torch._C, "_get_fp32_precision_getter", None)
    setter = getattr(torch._C, "_set_fp32_precision_setter", None)
    if hasattr(knob, "fp32_precision"):
        if getter is not None and setter is not None and hasattr(knob, "backend"):
            return _Knob(partial(getter, knob.backend, knob.op),
                         partial(setter, knob.backend, knob.op))
        return _Knob(lambda: knob.fp32_precision,  # pragma: no cover - no C getter
                     lambda value: setattr(knob, "fp32_precision", value))
    if name == "cudnn" and hasattr(module, "allow_tf32"):  # torch < 2.9
        return _Knob(lambda: "tf32" if module.allow_tf32 else "ieee",
                     lambda value: setattr(module, "allow_tf32", value == "tf32"))
    return None  # torch < 2.9 on the CPU


_KNOBS = {"cpu": _knob("mkldnn"), "cuda": _knob("cudnn")}


class _Shared:
    """One knob's setting while polyconv calls run, shared by every thread.

    torch's float32 precision is process-wide (``at::Context``; no per-thread or per-call form
    for convolutions), so one call's override is every running call's. Calls that need the
    same value run together: the first sets it, the last restores the user's value; a call
    that needs another value waits until they are done. A call never sees another call's
    setting, nor has its own undone while it runs."""

    __slots__ = ("cond", "count", "knob", "saved", "value")

    def __init__(self, knob: _Knob):
        self.knob, self.cond = knob, threading.Condition(threading.Lock())
        self.count, self.value, self.saved = 0, None, None

    def user(self) -> str:
        """The user's own setting (under :attr:`cond`): saved while calls run."""
        return self.saved if self.count else self.knob.read()


class _Setting:
    """A float32 call's knob value, decided from the user's own setting under the lock and
    held for the whole block (a class: cheaper per call than a generator context manager)."""

    __slots__ = ("cpu", "level", "shared")

    def __init__(self, shared: _Shared, level: str, cpu: bool):
        self.shared, self.level, self.cpu = shared, level, cpu

    def __enter__(self) -> None:
        shared = self.shared
        with shared.cond:
            while True:
                user = shared.user()
                want = _wanted(user, self.level, self.cpu)
                if shared.count == 0:
                    if want != user:
                        shared.knob.write(want)
                    shared.saved, shared.value = user, want
                    break
                if shared.value == want:
                    break
                shared.cond.wait()
            shared.count += 1

    def __exit__(self, *exc: Any) -> None:
        shared = self.shared
        with shared.cond:
            shared.count -= 1
            if shared.count == 0:
                if shared.value != shared.saved:
                    shared.knob.write(shared.saved)
                shared.cond.notify_all()


def _wanted(user: str, level: str, cpu: bool) -> str:
    """The knob value a float32 call at ``level`` runs under, given the user's ``user``."""
    # oneDNN's float32 is IEEE unless reduced process-wide (and there is no TF32 to allow)
    if cpu and user in ("ieee", "none"):
        return user
    want = "ieee" if level == "HIGHEST" else "tf32"
    if level == "DEFAULT" or (cpu and want == "tf32"):
        return user
    return want


_SHARED: dict[_Knob, _Shared] = {}
_SHARED_LOCK = threading.Lock()


def _shared(knob: _Knob) -> _Shared:
    """The one :class:`_Shared` of ``knob``."""
    shared = _SHARED.get(knob)
    if shared is None:
        with _SHARED_LOCK:
            shared = _SHARED.setdefault(knob, _Shared(knob))
    return shared


def _fp32_precision(plan: ConvPlan, device: torch.device) -> contextlib.AbstractContextManager:
    """Full-precision float32 (IEEE) unless the caller opted in: on CUDA, cuDNN's default
    for convolutions is TF32; ``precision="high"`` allows TF32, ``"default"`` leaves torch's
    own setting. On CPU, a process-wide reduced-precision oneDNN setting is overridden too.
    Concurrent calls share the override (:class:`_Shared`)."""
    if plan.dtype != "float32" or torch.compiler.is_compiling():
        # a compiled graph runs under the process-wide setting (torch.compile cannot trace
        # the change of a global flag; docs/backends.md says so)
        return _NO_CHANGE
    knob = _KNOBS.get(device.type)
    if knob is None:
        return _NO_CHANGE
    return _Setting(_shared(knob), _level(plan.precision), device.type == "cpu")


# --------------------------------------------------------------------------------------------
# the primitives (no autograd)
# --------------------------------------------------------------------------------------------


def _ncx(x: torch.Tensor, low: Lowering) -> torch.Tensor:
    """User-layout data as torch's ``NCX`` (a view)."""
    if low.lift:
        x = x.unsqueeze(1)
    return x if low.to_ncx is None else x.permute(low.to_ncx)


def _user(y: torch.Tensor, perm: tuple[int, ...] | None, dtype: torch.dtype,
          lift_axis: int | None = None) -> torch.Tensor:
    """torch's result in the user's layout and dtype, contiguous (one copy at most)."""
    y = y if perm is None else y.permute(perm)
    if lift_axis is not None:
        y = y.squeeze(lift_axis)
    return (y if y.dtype == dtype else y.to(dtype)).contiguous()


def _data_out(y: torch.Tensor, low: Lowering, dtype: torch.dtype) -> torch.Tensor:
    return _user(y, low.from_ncx, dtype, 1 if low.lift else None)


def _canonical_weights(w: torch.Tensor, low: Lowering) -> torch.Tensor:
    """User-layout weights as ``[Cb, Ca/G, K..]`` (a view)."""
    w = w if low.w_canonical is None else w.permute(low.w_canonical)
    return w.unsqueeze(2) if low.lift else w


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


def forward(plan: ConvPlan, a: torch.Tensor, w: torch.Tensor, bias: Any = None) -> torch.Tensor:
    """``a`` ``[N, Ca, A..]``, weights -> ``b`` ``[N, Cb, B..]`` (+ bias over Cb)."""
    low = lowering(plan)
    dtype = a.dtype
    wide = _cast(plan, a, w, bias, bias=bias is not None)
    if wide is not None:
        a, w, bias = wide
    with _fp32_precision(plan, a.device):
        y = low.conv(_pad(_ncx(a, low), low), _canonical_weights(w, low), bias, low.stride,
                     low.padding, low.dilation, low.groups)
    return _data_out(y, low, dtype)


def backward_data(plan: ConvPlan, b: torch.Tensor, w: torch.Tensor,
                  bias: Any = None) -> torch.Tensor:
    """``b`` ``[N, Cb, B..]``, weights -> ``a`` ``[N, Ca, A..]`` (+ bias over Ca)."""
    low = lowering(plan)
    dtype = b.dtype
    wide = _cast(plan, b, w, bias, bias=bias is not None)
    if wide is not None:
        b, w, bias = wide
    with _fp32_precision(plan, b.device):
        y = low.conv_t(_ncx(b, low), _canonical_weights(w, low), bias, low.stride,
                       low.padding, low.output_padding, low.groups, low.dilation)
    for axis, start, length in low.crop:
        y = y.narrow(axis, start, length)
    return _data_out(y, low, dtype)


def backward_weights(plan: ConvPlan, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a``, ``b`` -> weights in the user's ``weights_format``."""
    low = lowering(plan)
    dtype = a.dtype
    if plan.batch == 0 or math.prod(plan.b_spatial) == 0:
        return a.new_zeros(plan.weights_shape)
    wide = _cast(plan, a, b, bias=False, weights=True)
    if wide is not None:
        a, b = wide
    shape = plan.w_shape
    if low.lift:
        shape = (*shape[:2], 1, *shape[2:])
    with _fp32_precision(plan, a.device):
        g = torch.ops.aten.convolution_backward(
            _ncx(b, low), _pad(_ncx(a, low), low), b.new_empty(1).expand(shape), None,
            low.stride, low.padding, low.dilation, False, (0,) * len(low.stride), low.groups,
            (False, True, False))[1]
    if low.lift:
        g = g.squeeze(2)
    return _user(g, low.w_user, dtype)
