"""polyconv's JAX backend: the three primitives as ``jax.lax`` convolutions and products.

Unstrided primitives, and the forward primitive always, are one
``jax.lax.conv_general_dilated`` call each: the user's data layout (``NXC`` or ``NCX``, any
spatial rank) and weights layout reach XLA as dimension numbers, so no data tensor is
transposed. A strided backward_data (ConvTranspose, ConvolutionBackwardData) is not left to
XLA's lhs-dilated convolution, a slow path on CPU: it is split into its output phases
(sub-pixel decomposition), each a stride-1 convolution, matrix product or elementwise sum,
chosen per geometry; grouped and 3-D weight gradients are split likewise. See
:mod:`polyconv_jax._lowering` for the formulas, the choice and the measurements behind it;
:func:`force_lowering` (or ``POLYCONV_JAX_LOWERING``) picks a lowering by name, for tests and
benchmarks.

Each primitive is a ``jax.jit`` function with the plan (and lowering) as static arguments:
eager calls compile once per plan, and inside a user's ``jax.jit``, ``jax.grad``,
``jax.vmap`` or ``shard_map`` it is inlined like any jax function. Sharded inputs keep their
sharding (XLA propagates it; the batch axis stays sharded, weight gradients come back
replicated).

Numerics (SPEC §5): f16/bf16/f32 accumulate in float32 (``preferred_element_type``, or
elementwise arithmetic in float32) with one final cast, f64 in float64 (needs
``jax_enable_x64``); f32 runs at ``Precision.HIGHEST`` unless the caller passes
``precision=`` (``"default"``, ``"high"``, a :class:`jax.lax.Precision`, or a pair of these).
Every default lowering forms exactly the products of the definition, so a NaN or infinity
reaches exactly the outputs that read it.
"""

from __future__ import annotations

from typing import Any

from polyconv import ConvPlan

from . import _lowering
from ._lowering import canonical_precision, force_lowering

__all__ = ["BACKEND", "JaxBackend", "canonical_precision", "force_lowering"]


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
        return _lowering.backward_data(plan, precision, b, w, bias,
                                       lowering=_lowering.requested("backward_data"))

    def backward_weights(self, plan: ConvPlan, a: Any, b: Any) -> Any:
        plan, precision = self._static(plan)
        a, b = _lowering.prepare(plan, a, b)
        return _lowering.backward_weights(plan, precision, a, b,
                                          lowering=_lowering.requested("backward_weights"))


BACKEND = JaxBackend()
