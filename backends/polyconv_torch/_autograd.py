"""Autograd for the three primitives.

A primitive's torch ops (views, ``F.pad``, torch's convolution, a crop) are differentiable
as they are, and ATen's derivative of its convolution is its own ``convolution_backward``,
which computes both gradients in one call: the adjoint primitives of the canonical
convolution, the ones polyconv's backward ops run. So a call records ATen's own autograd
nodes, the graph a hand-written torch call records, and costs no more
(:func:`specialize`); ``torch.func`` transforms, ``torch.compile`` and CUDA graphs take it
as they take torch's own convolution.

Except where the call's float32 setting is not the user's (TF32 off on CUDA by default, or a
reduced process-wide oneDNN setting overridden, see :func:`polyconv_torch._numerics._precision`):
ATen's backward would run under the user's setting, so there each primitive is a
:class:`torch.autograd.Function` whose gradients are polyconv's own primitives, run under
the call's setting. Each primitive is bilinear, and the adjoint identities
(``<F(a, W), b> = <a, D(b, W)> = <W, Wt(a, b)>``) say which primitive computes the
gradient of each input from the output's gradient ``g``:

==================  =====================  =====================
primitive           gradient of 1st input  gradient of 2nd input
==================  =====================  =====================
forward F(a, W)     D(g, W)                Wt(a, g)
backward_data D     F(g, W)                Wt(g, b)
backward_weights    D(b, g)                F(a, g)
==================  =====================  =====================

and the bias gradient is ``g`` summed over every axis but channels (in float32 for 16-bit
inputs, rounded once). The backward calls the primitives through :func:`apply`, so it is
itself differentiable (double backward, Hessian-vector products) by the same rule.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from polyconv._geometry import ConvPlan
from polyconv._optable import ADJOINTS

from . import _lowering, _numerics

# torch.autograd.Function.apply's own steps, for Primitive.apply (absent in some torch
# versions: then Primitive takes torch's apply as it is)
_TRANSFORMS_ACTIVE = getattr(torch._C, "_are_functorch_transforms_active", None)
try:
    from torch._functorch.utils import unwrap_dead_wrappers as _unwrap_dead
except ImportError:  # pragma: no cover - older torch
    _unwrap_dead = None

RAW = {"forward": _lowering.forward, "backward_data": _lowering.backward_data,
       "backward_weights": _lowering.backward_weights}


def _overridden(plan: ConvPlan, x: torch.Tensor) -> bool:
    return plan.dtype == "float32" and _numerics.overridden(
        _numerics._level(plan.precision), _lowering._device_type(x))


def apply(primitive: str, plan: ConvPlan, x: torch.Tensor, y: torch.Tensor,
          bias: Any = None) -> torch.Tensor:
    """The primitive on torch tensors, through :class:`Primitive` when an input needs a
    gradient that must run under the call's own float32 setting."""
    if _lowering.grad_needed(x, y, bias) and _overridden(plan, x):
        return Primitive.apply(primitive, plan, x, y, bias)
    if primitive == "backward_weights":
        return RAW[primitive](plan, x, y)
    return RAW[primitive](plan, x, y, bias)


def specialize(plan: ConvPlan) -> Callable[..., torch.Tensor]:
    """The plan's primitive as a function of its tensors, decided once per plan: ATen's ops
    and autograd (:func:`polyconv_torch._lowering.kernel`), or :class:`Primitive` for a
    differentiable float32 call under an overridden setting."""
    return _lowering.kernel(plan, differentiable=functools.partial(
        Primitive.apply, plan.primitive, plan))


class Primitive(torch.autograd.Function):
    """One primitive, its gradients by :data:`ADJOINTS`. Written in the ``setup_context``
    form, with a generated vmap rule, so that ``torch.func`` (``grad``, ``vjp``, ``vmap``)
    transforms it too."""

    generate_vmap_rule = True

    @classmethod
    def apply(cls, *args):
        """``torch.autograd.Function.apply`` without the ``inspect.signature`` binding of
        default arguments that it does on every call of a ``setup_context``-style function:
        80 µs of the 200 µs a small differentiable call took, and every call here passes all
        five arguments, positionally. Under a ``torch.func`` transform or ``torch.compile``,
        or where torch lacks the steps taken here, torch's own ``apply``."""
        if (_TRANSFORMS_ACTIVE is None or _unwrap_dead is None or _TRANSFORMS_ACTIVE()
                or torch.compiler.is_compiling()):
            return super().apply(*args)
        # what Function.apply does next without transforms (torch 2.4 to 2.13 alike): dead
        # functorch wrappers unwrapped, then the C++ apply of the class above Function
        return super(torch.autograd.Function, cls).apply(*_unwrap_dead(args))

    @staticmethod
    def forward(primitive: str, plan: ConvPlan, x, y, bias):
        if primitive == "backward_weights":
            return RAW[primitive](plan, x, y)
        return RAW[primitive](plan, x, y, bias)

    @staticmethod
    def setup_context(ctx, inputs, output):
        primitive, plan, x, y, _ = inputs
        ctx.primitive, ctx.plan = primitive, plan
        ctx.save_for_backward(x, y)

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        plan = ctx.plan
        grads = []
        for i, (adjoint, slot) in enumerate(ADJOINTS[ctx.primitive]):
            if not ctx.needs_input_grad[2 + i]:
                grads.append(None)
                continue
            other = y if i == 0 else x
            args = (g, other) if slot == 0 else (other, g)
            grads.append(apply(adjoint, plan, *args))
        grad_bias = None
        if ctx.needs_input_grad[4]:
            axis = plan.ndim + 1 if plan.channels_last else 1
            dims = [k for k in range(g.dim()) if k != axis]
            acc = torch.float64 if g.dtype == torch.float64 else torch.float32
            grad_bias = g.sum(dim=dims, dtype=acc).to(g.dtype)
        return None, None, *grads, grad_bias
