"""Autograd for the three primitives: every gradient is computed by polyconv's own primitives.

Each primitive is bilinear, and the adjoint identities of the canonical convolution
(``<F(a, W), b> = <a, D(b, W)> = <W, Wt(a, b)>``) say which primitive computes the gradient of
each input from the output's gradient ``g``:

==================  =====================  =====================
primitive           gradient of 1st input  gradient of 2nd input
==================  =====================  =====================
forward F(a, W)     D(g, W)                Wt(a, g)
backward_data D     F(g, W)                Wt(g, b)
backward_weights    D(b, g)                F(a, g)
==================  =====================  =====================

and the bias gradient is ``g`` summed over every axis but channels (in float32 for 16-bit
inputs, rounded once). One :class:`torch.autograd.Function` carries the table; its backward
calls the primitives through :func:`apply`, so the backward is itself differentiable (double
backward, Hessian-vector products) by the same rule. Calls where no input requires a gradient
(or under ``torch.no_grad``) skip autograd entirely.
"""

from __future__ import annotations

from typing import Any

import torch

from polyconv._geometry import ConvPlan
from polyconv._optable import ADJOINTS

from . import _lowering

# torch.autograd.Function.apply's own steps, for Primitive.apply (absent in some torch
# versions: then Primitive takes torch's apply as it is)
_TRANSFORMS_ACTIVE = getattr(torch._C, "_are_functorch_transforms_active", None)
try:
    from torch._functorch.utils import unwrap_dead_wrappers as _unwrap_dead
except ImportError:  # pragma: no cover - older torch
    _unwrap_dead = None

RAW = {"forward": _lowering.forward, "backward_data": _lowering.backward_data,
       "backward_weights": _lowering.backward_weights}


def _needs_grad(*tensors: Any) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def apply(primitive: str, plan: ConvPlan, x: torch.Tensor, y: torch.Tensor,
          bias: Any = None) -> torch.Tensor:
    """The primitive on torch tensors, through autograd when an input needs a gradient."""
    if _needs_grad(x, y, bias):
        return Primitive.apply(primitive, plan, x, y, bias)
    if primitive == "backward_weights":
        return RAW[primitive](plan, x, y)
    return RAW[primitive](plan, x, y, bias)


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
