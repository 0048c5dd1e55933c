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

from . import _primitives
from ._choice import LOWERINGS, autotune, force_lowering, measured_choices
from ._primitives import prepare
from ._xla import canonical_precision

__all__ = ["BACKEND", "LOWERINGS", "JaxBackend", "autotune", "canonical_precision",
           "force_lowering", "measured_choices"]


class JaxBackend:
    """The three primitives of the canonical convolution on JAX (see
    :class:`polyconv.Backend`)."""

    name = "jax"

    @staticmethod
    def _static(plan: ConvPlan, *arrays):
        """The arrays as JAX arrays, and the static arguments: the plan keyed on geometry
        (one jit cache entry for an op and its aliases), the precision in canonical
        (hashable) form, and the lowering-choice settings in force."""
        arrays = prepare(plan, *arrays)
        precision = canonical_precision(plan.op, plan.precision)
        static = (plan.with_(precision=None, op=plan.primitive), precision,
                  _primitives._choice.settings())
        return static, arrays

    def forward(self, plan: ConvPlan, a: Any, w: Any, bias: Any = None) -> Any:
        static, args = self._static(plan, a, w, bias)
        return _primitives.forward(*static, *args)

    def backward_data(self, plan: ConvPlan, b: Any, w: Any, bias: Any = None) -> Any:
        static, args = self._static(plan, b, w, bias)
        return _primitives.backward_data(*static, *args)

    def backward_weights(self, plan: ConvPlan, a: Any, b: Any) -> Any:
        static, args = self._static(plan, a, b)
        return _primitives.backward_weights(*static, *args)


BACKEND = JaxBackend()
