"""polyconv's JAX backend: each primitive is one ``jax.lax.conv_general_dilated`` call.

The user's data layout (``NXC`` or ``NCX``, any spatial rank) and weights layout reach XLA as
dimension numbers, so no data tensor is ever transposed; see :mod:`polyconv_jax._lowering` for
the padding formulas. Each primitive is a ``jax.jit`` function with the plan as a static
argument: eager calls compile once per plan, and inside a user's ``jax.jit``, ``jax.grad``,
``jax.vmap`` or ``shard_map`` it is inlined like any jax function. Sharded inputs keep their
sharding (XLA propagates it; the batch axis stays sharded, weight gradients come back
replicated).

Numerics (SPEC §5): f16/bf16/f32 accumulate in float32 (``preferred_element_type``) with one
final cast, f64 in float64 (needs ``jax_enable_x64``); f32 runs at ``Precision.HIGHEST`` unless
the caller passes ``precision=`` (``"default"``, ``"high"``, a :class:`jax.lax.Precision`, or a
pair of these).
"""

from __future__ import annotations

from typing import Any

from polyconv import ConvPlan

from . import _lowering
from ._lowering import canonical_precision

__all__ = ["BACKEND", "JaxBackend", "canonical_precision"]


class JaxBackend:
    """The three primitives of SPEC §3 on JAX (see :class:`polyconv.Backend`)."""

    name = "jax"

    @staticmethod
    def _static(plan: ConvPlan):
        precision = canonical_precision(plan.op, plan.precision)
        # the precision travels as its own static argument, in canonical (hashable) form
        return plan.with_(precision=None), precision

    def forward(self, plan: ConvPlan, a: Any, w: Any, bias: Any = None) -> Any:
        plan, precision = self._static(plan)
        a, w, bias = _lowering.prepare(plan, a, w, bias)
        return _lowering.forward(plan, precision, a, w, bias)

    def backward_data(self, plan: ConvPlan, b: Any, w: Any, bias: Any = None) -> Any:
        plan, precision = self._static(plan)
        b, w, bias = _lowering.prepare(plan, b, w, bias)
        return _lowering.backward_data(plan, precision, b, w, bias)

    def backward_weights(self, plan: ConvPlan, a: Any, b: Any) -> Any:
        plan, precision = self._static(plan)
        a, b = _lowering.prepare(plan, a, b)
        return _lowering.backward_weights(plan, precision, a, b)


BACKEND = JaxBackend()
