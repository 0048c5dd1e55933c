"""polyconv's numpy backend: direct loops over kernel taps, matrix products over channels.

Each of the three primitives of the canonical convolution
(docs/semantics.md#canonical-convolution) has several fast strategies, chosen per plan by a cost
model and, on a plan's first call, by timing the ones it puts near its pick (:mod:`._choice`;
:func:`autotune` ``(False)`` or ``POLYCONV_NUMPY_AUTOTUNE=0`` keeps the model's pick; force
one with :func:`strategy` or ``POLYCONV_NUMPY_STRATEGY``):

* ``gather`` (:mod:`._fast`): implicit GEMM on a phase grid. Each block of output rows is one
  matrix product of the taps' shifted row blocks, gathered into a cache-sized buffer. It
  copies ``T`` values per channel of the side it reads, and its product is as wide as the side
  it writes: good when the written side is wide.
* ``overlap`` (:mod:`._overlap`, forward and backward_data): one matrix product of the read
  tensor with all taps' weights side by side, then each tap's slice added into the strided
  window it lands on (GEMM + col2im). It adds ``T`` values per channel of the side it
  writes, and its product is ``T`` times as wide: good when the written side is narrow.
* ``gather_b`` (:mod:`._fast`, backward_weights): gathers the small tensor's taps instead of
  the large tensor's; good when the small tensor has the fewer channels.
* ``window`` (:mod:`._window`, depthwise on channels-last data, every primitive; backward_data
  phase by phase of ``a``): blocks of output lines, each one einsum over the tap windows
  of a cache-sized, zero-padded copy of the input lines it reads (no phase split, no padded
  copy of the whole input): good for 3x3 depthwise layers.
* ``planes`` (:mod:`._planes`, depthwise on channels-first data, every primitive): each
  ``(n, c)`` plane convolved in place, tap by tap, one multiply and one add per tap over
  contiguous runs of a block of planes: no change of layout, which on channels-first
  depthwise layers costs the other strategies more than their sums.
* ``patches`` (:mod:`._patches`, kernel = stride with no dilation and no padding before, every
  primitive): the windows do not overlap, so they are a reshape of ``a``; one copy puts them
  in the product's order and one matrix product computes the primitive (a ViT patch
  embedding, a U-Net's 2x2 stride-2 up-convolution). No padding enters it: non-finite inputs
  keep it, as they keep ``overlap``.
* ``space_to_depth`` (:mod:`._space_to_depth`, ungrouped and undilated; forward and
  backward_weights): ``a`` cut into blocks of ``s`` positions per axis, each block one row of
  ``s^nd * Ca`` values, and the convolution a sum of ``ceil(K/s)^nd`` products over shifted,
  contiguous ranges of those rows: deep contractions and no tap-by-tap gather (FCN-8s's 16x16
  stride-8 kernel).
* ``im2col`` (:mod:`._im2col`, channels-first data, not depthwise; forward and
  backward_weights): per image (or block of its output lines), the taps' windows copied into
  one ``[Ca*T, L]`` matrix and one product ``W @ columns`` written into ``b`` in its own
  layout: no phase grid, no crop and no change of layout of ``b``. Good when ``b`` is wider
  than the columns are deep (MNIST's 1->32, wav2vec 2.0's 1->512, the gradients of
  ConvTransposes to few channels) and on 1-D layers.
* ``exact`` (:mod:`._exact`): per tap, one matrix product over the in-range window only.
  Padded positions contribute no term at all, which matters only when an input holds NaN or
  Inf (the grid would add ``0 * inf`` terms); such calls take this path, or ``overlap``, which
  adds in-range products only as well. Depthwise forward and backward_weights take it too
  where it reads the data in place and the cost model finds it faster; ungrouped plans
  where it measures faster (its per-tap products, one per kernel tap, sometimes beat the
  grid's gathers on 3-D and strided layers).

All work channels-last in float32 (float64 for float64 inputs), add the bias before the one
rounding to the output dtype (docs/numerics.md#error-bound), and only read their inputs.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from polyconv import _malloc
from polyconv._geometry import ConvPlan

from . import (
    _choice,
    _exact,
    _fast,
    _im2col,
    _overlap,
    _patches,
    _planes,
    _space_to_depth,
    _subpixel,
    _window,
)
from ._choice import autotune, choose, measured_choices, strategy
from ._costs import costs

__all__ = ["BACKEND", "NumpyBackend", "autotune", "choose", "costs", "measured_choices",
           "strategy"]


def _finite(*arrays: Any) -> bool:
    """Whether every value is finite: one pass per array, no temporary array.

    float32: the minimum and the maximum (NaN propagates through both, an infinity is one of
    them; 3x faster than a float64 sum). Other dtypes: a float64 sum (numpy's min and max of
    16-bit floats are 5-40x slower); a sum that overflows reports ``False`` too, which only
    sends a call to the exact path.
    """
    with np.errstate(all="ignore"):
        for x in arrays:
            x = np.asarray(x).ravel()
            if x.dtype == np.float32:
                ends = (np.minimum.reduce(x), np.maximum.reduce(x)) if x.size else ()
            else:
                ends = (np.add.reduce(x, dtype=np.float64),)
            if not all(np.isfinite(v) for v in ends):
                return False
    return True


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

    def _call(self, primitive: str, plan: ConvPlan, args: tuple, *checked: Any) -> np.ndarray:
        """One call of a primitive on the strategy :func:`choose` gives, measured first on a
        plan's first call (:func:`._choice.candidates`), except that an empty batch (no rows
        to lay on a grid) and non-finite ``checked`` inputs on a grid strategy take the exact
        path. The first call raises glibc's malloc thresholds (:mod:`polyconv._malloc`).

        NaN/Inf propagate by design (docs/numerics.md#nan-and-inf): numpy's "invalid value"
        warnings are silenced. The forward and backward_data check only ``w``: the grid adds
        only ``0 * w`` terms (padding, cropped rows), which a finite ``w`` keeps exact; the
        weight gradient checks both, where zero rows of ``b`` meet values of ``a`` and padding
        zeros meet values of ``b``; a forward that may run ``space_to_depth`` checks ``a``
        too, whose taps past the kernel are zeros that meet the data."""
        _malloc.tune()
        impls = _IMPLEMENTATIONS[primitive]
        with np.errstate(invalid="ignore"):
            if not self.fast or not plan.batch:
                return impls["exact"](plan, *args)
            name, names = _choice.plan_choice(primitive, plan)
            name = _applicable(name, primitive, plan)
            if primitive == "forward" and not _ZERO_TAPS_MEET_DATA.isdisjoint((name, *names)):
                checked = (*checked, args[0])
            if (names or name not in _EXACT_ON_NONFINITE) and not _finite(*checked):
                return impls["exact"](plan, *args)
            if names:
                name = _choice.measure(primitive, plan, {
                    n: functools.partial(_timed, impls[_applicable(n, primitive, plan)],
                                         plan, args) for n in names})
                name = _applicable(name, primitive, plan)
            return impls[name](plan, *args)

    def forward(self, plan: ConvPlan, a: Any, w: Any, bias: Any = None) -> np.ndarray:
        return self._call("forward", plan, (a, w, bias), w)

    def backward_data(self, plan: ConvPlan, b: Any, w: Any, bias: Any = None) -> np.ndarray:
        return self._call("backward_data", plan, (b, w, bias), w)

    def backward_weights(self, plan: ConvPlan, a: Any, b: Any) -> np.ndarray:
        return self._call("backward_weights", plan, (a, b), a, b)


_IMPLEMENTATIONS: dict[str, dict[str, Callable[..., np.ndarray]]] = {
    "forward": {"gather": _fast.forward, "overlap": _overlap.forward,
                "exact": _exact.forward, "window": _window.forward, "planes": _planes.forward,
                "patches": _patches.forward, "space_to_depth": _space_to_depth.forward,
                "im2col": _im2col.forward},
    "backward_data": {"gather": _fast.backward_data, "overlap": _overlap.backward_data,
                      "exact": _exact.backward_data, "window": _window.backward_data,
                      "subpixel": _subpixel.backward_data, "planes": _planes.backward_data,
                      "patches": _patches.backward_data},
    "backward_weights": {"gather": _fast.backward_weights,
                         "gather_b": _fast.backward_weights_gather_b,
                         "exact": _exact.backward_weights,
                         "window": _window.backward_weights,
                         "planes": _planes.backward_weights,
                         "patches": _patches.backward_weights,
                         "space_to_depth": _space_to_depth.backward_weights,
                         "im2col": _im2col.backward_weights},
}


#: strategies whose sums hold only the definition's terms (no padding zeros meet a weight), so
#: NaN and Inf propagate through them as through the exact path: non-finite inputs keep them
_EXACT_ON_NONFINITE = ("exact", "overlap", "patches")
#: strategies whose zero taps past the kernel meet the data in forward: a forward that may run
#: one checks the data's finiteness as well as the weights'
_ZERO_TAPS_MEET_DATA = frozenset({"space_to_depth"})

#: the strategies that apply to some plans only (``applies(plan, primitive)``)
_APPLIES: dict[str, Callable[[ConvPlan, str], bool]] = {
    "window": _window.applies, "planes": _planes.applies, "patches": _patches.applies,
    "space_to_depth": _space_to_depth.applies, "im2col": _im2col.applies,
    "subpixel": lambda plan, primitive: _subpixel.applies(plan)}


def _applicable(name: str, primitive: str, plan: ConvPlan) -> str:
    """A strategy of :data:`_APPLIES` forced where it does not apply computes with
    ``gather``."""
    applies = _APPLIES.get(name)
    return "gather" if applies is not None and not applies(plan, primitive) else name


def _timed(fn: Callable[..., Any], plan: ConvPlan, args: tuple) -> float:
    """Seconds one call of ``fn`` takes (its result is dropped: measuring holds no extra
    output)."""
    t0 = time.perf_counter()
    fn(plan, *args)
    return time.perf_counter() - t0


BACKEND = NumpyBackend()
