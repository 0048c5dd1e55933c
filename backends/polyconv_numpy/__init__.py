"""polyconv's numpy backend: direct loops over kernel taps, matrix products over channels.

Two paths compute the same three primitives of the canonical convolution
(docs/semantics.md#canonical-convolution):

* :mod:`._fast` (the default): implicit GEMM on a phase grid. Each block of output rows is one
  matrix product of the taps' shifted row blocks, gathered into a cache-sized buffer.
* :mod:`._exact`: per tap, one matrix product over the in-range window only. Padded positions
  contribute no term at all, which matters only when an input holds NaN or Inf (the fast path
  would add ``0 * inf`` terms); such calls take this path.

Both work channels-last in float32 (float64 for float64 inputs), add the bias before the one
rounding to the output dtype, and only read their inputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from polyconv._geometry import ConvPlan

from . import _exact, _fast

__all__ = ["BACKEND", "NumpyBackend"]


def _finite(*arrays: Any) -> bool:
    """Whether every value is finite: one summation pass, no temporary array.

    A sum that overflows reports ``False`` too; that only sends a call to the exact path.
    """
    with np.errstate(all="ignore"):
        return all(np.isfinite(np.add.reduce(np.asarray(x).ravel(), dtype=np.float64))
                   for x in arrays)


class NumpyBackend:
    """The three primitives (docs/semantics.md#canonical-convolution) on numpy arrays (see
    :class:`polyconv.Backend`)."""

    name = "numpy"
    libraries = ("numpy",)

    def describe(self) -> dict[str, Any]:
        """Facts for ``polyconv backends`` (see :class:`polyconv.BackendHooks`)."""
        return {"devices": "cpu (host memory)"}

    #: set to False to route every call through the exact path (tests compare the two)
    fast = True

    def _path(self, plan: ConvPlan, *arrays: Any):
        # an empty batch has no rows to lay on the phase grid: the exact path returns zeros
        return _fast if self.fast and plan.batch and _finite(*arrays) else _exact

    # NaN/Inf propagate by design (docs/numerics.md#nan-and-inf): numpy's "invalid value"
    # warnings are silenced.
    def forward(self, plan: ConvPlan, a: Any, w: Any, bias: Any = None) -> np.ndarray:
        # only 0 * w terms (padding, cropped rows) are added: a finite w keeps them exact
        with np.errstate(invalid="ignore"):
            return self._path(plan, w).forward(plan, a, w, bias)

    def backward_data(self, plan: ConvPlan, b: Any, w: Any, bias: Any = None) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return self._path(plan, w).backward_data(plan, b, w, bias)

    def backward_weights(self, plan: ConvPlan, a: Any, b: Any) -> np.ndarray:
        # here zero rows of b meet values of a, and padding zeros meet values of b
        with np.errstate(invalid="ignore"):
            return self._path(plan, a, b).backward_weights(plan, a, b)


BACKEND = NumpyBackend()
