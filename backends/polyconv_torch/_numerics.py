"""Numerics of the torch backend: which 16-bit calls torch computes natively, and the
float32 precision setting a call runs under.

float16/bfloat16 run natively where the engine accumulates in float32 and adds the bias
before its one rounding and is trusted to (cuDNN without bias, grouped weight gradients
excepted; not oneDNN, see :data:`CPU_NATIVE_16BIT`); elsewhere the inputs are cast to
float32, computed there and rounded once. float32 accumulates in its own dtype, with no TF32
on CUDA (nor a reduced process-wide oneDNN setting on CPU) unless the caller asks through
``precision`` (:func:`_fp32_precision`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from polyconv._geometry import PRECISION_NAMES, ConvPlan

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
    if cpu and user in _CPU_FULL:
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
    if plan.dtype != "float32":
        return _NO_CHANGE
    return _precision(_level(plan.precision), device.type) or _NO_CHANGE


def _precision(level: str, device_type: str) -> _Setting | None:
    """:func:`_fp32_precision` of a float32 call at ``level`` on ``device_type``, ``None``
    where it has nothing to set (a compiled graph cannot trace a comparison of two context
    managers); the CPU case first: it runs on every small call."""
    if torch.compiler.is_compiling():
        # a compiled graph runs under the process-wide setting (torch.compile cannot trace
        # the change of a global flag; docs/backends.md says so)
        return None
    if device_type == "cpu":
        shared = _CPU_SHARED
        if shared is None:
            return None
        # oneDNN's float32 is IEEE unless reduced process-wide, and then no call of any
        # level writes the knob: a call with none in flight has nothing to set or wait for
        if shared.count == 0 and _CPU_READ() in _CPU_FULL:
            return None
        return _Setting(shared, level, True)
    knob = _KNOBS.get(device_type)
    if knob is None:
        return None
    return _Setting(_shared(knob), level, False)


_CPU_FULL = ("ieee", "none")
_CPU_SHARED = None if _KNOBS["cpu"] is None else _shared(_KNOBS["cpu"])
_CPU_READ = None if _KNOBS["cpu"] is None else _KNOBS["cpu"].read


def overridden(level: str, device_type: str) -> bool:
    """Whether a float32 call at ``level`` on ``device_type`` runs under another setting than
    the user's own (then its gradient must too, see :mod:`polyconv_torch._autograd`)."""
    if torch.compiler.is_compiling():
        return False
    knob = _KNOBS.get(device_type)
    if knob is None:
        return False
    user = _shared(knob).user()
    return _wanted(user, level, device_type == "cpu") != user
