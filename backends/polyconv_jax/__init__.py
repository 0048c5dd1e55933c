"""polyconv's JAX backend: the three primitives as ``jax.lax`` convolutions and products.

Each primitive (forward ``a, W -> b``, backward_data ``b, W -> a``, backward_weights
``a, b -> W``) has several exact lowerings: the plain ``jax.lax.conv_general_dilated`` call,
with the user's data and weights layouts as dimension numbers, and decompositions that avoid
XLA's slow paths (the phases of a strided transposed convolution, im2col products,
GEMM + overlap-add, elementwise forms for few channels per group). Which one runs is the
platform's default policy, measured per plan and device when :func:`polyconv.autotune` is on,
or forced by name with :func:`polyconv.implementation` (``"jax:backward_data=phases_matmul"``); the
core chooser (:mod:`polyconv._choice`) does all three over this backend's records.

The modules, in layers (none imports one above it): :mod:`._xla` (precision, dimension
numbers, the CPU-aware convolution call); :mod:`._common` (the windows each tap reads, the
phases of a stride); one module per family of lowerings, each declaring its records
(:mod:`._plain`, :mod:`._elementwise`, :mod:`._patches`, :mod:`._folded`,
:mod:`._subpixel`, :mod:`._taps`, :mod:`._sliced`, :mod:`._grouped`,
:mod:`._space_to_depth`); :mod:`._policy` (the default per platform); :mod:`._choice` (the
list of records and the chooser, measuring); :mod:`._primitives` (the three JAX primitives,
their derivative and batching rules: every cotangent is computed by polyconv's own
primitives, and the jitted entry points). The docs page "JAX lowerings" has the formulas and
the measurements.

Each primitive is entered through a ``jax.jit`` function of its arrays alone, one per plan,
precision and choice settings (:func:`._primitives.entry`, picked once per plan by
:meth:`JaxBackend.specialize` and per call by the settings in force): an eager call compiles
once per plan and is then one dispatch of a cached jitted function, and inside a user's
``jax.jit``, ``jax.grad``, ``jax.vmap`` or ``shard_map`` it composes like JAX's own
convolution. Sharded inputs keep their sharding (XLA propagates it; the batch axis stays
sharded, weight gradients come back replicated).

Numerics: f16/bf16/f32 accumulate in float32 (``preferred_element_type``, or elementwise
arithmetic in float32) with one final cast, f64 in float64 (needs ``jax_enable_x64``); f32
runs at ``Precision.HIGHEST`` unless the caller passes ``precision=`` (``"default"``,
``"high"``, a :class:`jax.lax.Precision`, or a pair of these). Every lowering that the choice
can take forms exactly the products of the definition, so a NaN or infinity reaches exactly
the outputs that read it.
"""

from __future__ import annotations

import functools
from typing import Any

from polyconv import ConvPlan, Samples, _malloc
from polyconv._choice import settings as choice_settings

from . import _primitives
from ._choice import LOWERINGS
from ._primitives import prepare
from ._xla import canonical_precision

__all__ = ["BACKEND", "LOWERINGS", "JaxBackend", "canonical_precision"]


@functools.cache
def _tune_malloc_on_cpu() -> None:
    """Raise glibc's malloc thresholds (:mod:`polyconv._malloc`) if JAX computes on the CPU;
    the platform is asked once."""
    import jax

    if jax.default_backend() == "cpu":
        _malloc.tune()


#: concrete types whose instances are JAX arrays (``jax.Array``, tracers included), as met
_JAX_TYPES: set[type] = set()


def _all_jax(arrays: tuple) -> bool:
    """Whether every one of ``arrays`` is a JAX array or ``None``: nothing for
    :func:`~._primitives.prepare` to convert (a type check, not ``isinstance`` against the
    abstract ``jax.Array``, on every eager call)."""
    for x in arrays:
        if x is not None and type(x) not in _JAX_TYPES:
            import jax

            if not isinstance(x, jax.Array):
                return False
            _JAX_TYPES.add(type(x))
    return True


class JaxBackend:
    """The three primitives of the canonical convolution on JAX (see
    :class:`polyconv.Backend`)."""

    name = "jax"
    libraries = ("jax",)

    @property
    def concretization_errors(self) -> tuple[type[BaseException], ...]:
        import jax

        return (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError)

    def describe(self) -> dict[str, Any]:
        """Facts for ``polyconv backends`` (see :class:`polyconv.BackendHooks`)."""
        from importlib.metadata import version

        import jax

        return {"versions": {"jaxlib": version("jaxlib")},
                "devices": ", ".join(str(d) for d in jax.devices())}

    def samples(self, dtype: str) -> Samples:
        """JAX arrays for :func:`polyconv.compare`, in 64-bit mode for float64."""
        import contextlib

        import jax
        import jax.numpy as jnp

        context = contextlib.nullcontext
        if dtype == "float64" and not jax.config.jax_enable_x64:
            def context():
                return jax.enable_x64(True)
        return Samples("jax.numpy", jnp.asarray, context)

    @staticmethod
    def _static(plan: ConvPlan, *arrays):
        """The arrays as JAX arrays, and the static arguments: the plan keyed on geometry
        (one jit cache entry for an op and its aliases), the precision in canonical
        (hashable) form, and the lowering-choice settings in force. The first call on the CPU
        raises glibc's malloc thresholds for XLA's per-call scratch buffer
        (:mod:`polyconv._malloc`)."""
        _tune_malloc_on_cpu()
        arrays = prepare(plan, *arrays)
        precision = canonical_precision(plan.op, plan.precision)
        static = (plan.with_(precision=None, op=plan.primitive), precision,
                  choice_settings())
        return static, arrays

    def specialize(self, plan: ConvPlan) -> Any:
        """The plan's primitive as a function of its arrays (see
        :class:`polyconv.BackendHooks`): the plan and precision made static once, and per
        call the choice settings in force picking its jitted entry
        (:func:`polyconv_jax._primitives.entry`)."""
        _tune_malloc_on_cpu()
        static = plan.with_(precision=None, op=plan.primitive)
        precision = canonical_precision(plan.op, plan.precision)
        entries: dict[tuple, Any] = {}
        f64 = plan.dtype == "float64"       # checked against JAX's 64-bit mode per call

        def run(*arrays):
            settings = choice_settings()
            fn = entries.get(settings)
            if fn is None:
                fn = entries[settings] = _primitives.entry(static, precision, settings)
            if f64 or not _all_jax(arrays):
                arrays = prepare(plan, *arrays)
            return fn(*arrays)

        return run

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
