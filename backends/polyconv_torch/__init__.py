"""polyconv's PyTorch backend: the three primitives as PyTorch's native convolution ops.

On CPU these run oneDNN (the library whose op definitions polyconv's semantics follow), on
CUDA cuDNN; results are torch tensors on the input's device. Picked automatically for
``torch.Tensor`` inputs (``backend="array_api"`` still selects the generic backend).

* forward: ``torch.nn.functional.conv{1,2,3}d``; backward_data:
  ``torch.nn.functional.conv_transpose{1,2,3}d``; backward_weights:
  ``torch.ops.aten.convolution_backward`` (weights only). torch takes symmetric padding, so the
  smaller pad of each axis goes to torch and the rest is an explicit ``F.pad`` of the input
  (forward, backward_weights) or a crop of the output (backward_data). ``NXC`` data is passed
  as channels-last views, weights as permuted views: no layout copies of the data.
* Spatial ranks 1-3 run natively; other ranks run on the generic array-API backend (also on
  torch tensors, also differentiable).
* Numerics: float32 and float64 accumulate in their own dtype, with no TF32 on CUDA unless
  the caller passes ``precision="high"`` (``"default"`` keeps torch's global setting);
  float16/bfloat16 accumulate in float32 with one rounding (natively where cuDNN does that,
  else, and always on CPU, computed in float32 and rounded once).
* Autograd: a call is torch's own ops, so autograd records ATen's own nodes, whose
  convolution backward is the adjoint primitives (``torch.autograd.grad`` of a polyconv op
  equals polyconv's backward ops, double backward included); where a float32 call runs
  under another setting than the user's (TF32 off on CUDA), a
  :class:`torch.autograd.Function` whose gradients are polyconv's own primitives, run under
  that setting. ``torch.func`` transforms either, ``torch.compile`` traces either.
* Overhead: what depends on the plan alone is decided once per plan
  (:meth:`TorchBackend.specialize`), so a repeated call permutes views, checks the float32
  setting and calls torch.

See :mod:`polyconv_torch._lowering` for the lowering and :mod:`polyconv_torch._autograd` for
the gradients.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import torch

from polyconv import ConvPlan, Samples
from polyconv._limits import IndexLimits

from . import _autograd, _numerics

__all__ = ["BACKEND", "TorchBackend"]

_NATIVE_RANKS = (1, 2, 3)


def _generic():
    from polyconv_array_api import BACKEND as GENERIC

    return GENERIC


class TorchBackend:
    """The three primitives of the canonical convolution on torch tensors (see
    :class:`polyconv.Backend` and :class:`polyconv.BackendHooks`)."""

    name = "torch"
    libraries = ("torch",)
    # torch's convolutions read strides, pads and dilations as 32-bit ints (a stride of 2**31
    # reaches oneDNN as -2**31); sizes and offsets are 64-bit
    limits = IndexLimits(attributes=2**31 - 1,
                         reason="torch: 64-bit sizes, 32-bit strides, pads and dilations")

    def __repr__(self) -> str:
        return "<polyconv backend 'torch'>"

    def forward(self, plan: ConvPlan, a: Any, w: Any, bias: Any = None) -> Any:
        if plan.ndim not in _NATIVE_RANKS:
            return _generic().forward(plan, a, w, bias)
        return _autograd.apply("forward", plan, a, w, bias)

    def backward_data(self, plan: ConvPlan, b: Any, w: Any, bias: Any = None) -> Any:
        if plan.ndim not in _NATIVE_RANKS:
            return _generic().backward_data(plan, b, w, bias)
        return _autograd.apply("backward_data", plan, b, w, bias)

    def backward_weights(self, plan: ConvPlan, a: Any, b: Any) -> Any:
        if plan.ndim not in _NATIVE_RANKS:
            return _generic().backward_weights(plan, a, b)
        return _autograd.apply("backward_weights", plan, a, b)

    def specialize(self, plan: ConvPlan) -> Any:
        """The plan's primitive as a function of its tensors, decided once per plan
        (:func:`polyconv_torch._autograd.specialize`)."""
        if plan.ndim not in _NATIVE_RANKS:
            return functools.partial(getattr(_generic(), plan.primitive), plan)
        return _autograd.specialize(plan)

    # --- facts (polyconv.BackendHooks) -------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """torch's version and devices: the CPU with its oneDNN version, each CUDA device with
        cuDNN's."""
        devices = [f"cpu ({engine('cpu')})"]
        if torch.cuda.is_available():
            devices += [f"cuda:{i} {torch.cuda.get_device_name(i)} ({engine('cuda')})"
                        for i in range(torch.cuda.device_count())]
        return {"versions": {"torch": torch.__version__}, "devices": ", ".join(devices)}

    def samples(self, dtype: str) -> Samples:
        """torch tensors for :func:`polyconv.compare`: on the first CUDA device when there is
        one, else on the CPU; labelled with the engine that runs them."""
        device = "cuda" if torch.cuda.is_available() else "cpu"
        how = engine(device)
        if device == "cpu" and dtype == "float64":
            how = "ATen; oneDNN has no float64"
        elif dtype in ("float16", "bfloat16") and not _numerics._native_16bit(
                device, getattr(torch, dtype), False):
            how += ", computed in float32"
        return Samples(f"torch {device} ({how})", lambda x: to_tensor(x, device),
                       to_numpy=to_numpy)


def engine(device: str) -> str:
    """The convolution engine torch uses on ``device``: oneDNN on CPU, cuDNN on CUDA."""
    if device == "cuda":
        v = torch.backends.cudnn.version()
        if not v:
            return "CUDA, no cuDNN"
        major, rest = divmod(v, 10000 if v >= 10000 else 1000)  # 90100 is 9.1.0, 8902 8.9.2
        return f"cuDNN {major}.{rest // 100}.{rest % 100}"
    if torch.backends.mkldnn.is_available():
        return _onednn()
    return "native, no oneDNN"


@functools.cache
def _onednn() -> str:
    """``oneDNN v3.12.0``, read from torch's build configuration."""
    found = re.search(r"(?:oneDNN\)|MKL-DNN)\s*(v[\d.]+)", torch.__config__.show())
    return f"oneDNN {found.group(1)}" if found else "oneDNN"


def to_tensor(x: Any, device: str = "cpu") -> torch.Tensor:
    """A numpy array (``ml_dtypes.bfloat16`` included) as a torch tensor on ``device``."""
    import numpy as np

    x = np.asarray(x)
    if x.dtype.name == "bfloat16":
        return torch.from_numpy(x.astype(np.float32)).to(device=device, dtype=torch.bfloat16)
    return torch.from_numpy(np.array(x, copy=True)).to(device)


def to_numpy(y: torch.Tensor):
    """A torch tensor as a float64 numpy array."""
    return y.detach().to(device="cpu", dtype=torch.float64).numpy()


BACKEND = TorchBackend()
