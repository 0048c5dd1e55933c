"""polyconv's numpy backend: direct loops over kernel taps, matrix products over channels.

Each of the three primitives of the canonical convolution
(docs/semantics.md#canonical-convolution) has several strategies, each a record
(:class:`._costs.Strategy`) declared beside its kernel and priced from the counts its kernel
moves; the core chooser (:mod:`polyconv._choice`) picks the cheapest, or the one forced with
:func:`polyconv.implementation` (``POLYCONV_IMPLEMENTATION="numpy:forward=gather"``), or,
when :func:`polyconv.autotune` is on, the fastest of those the model puts near its pick, timed
on a plan's first call (:mod:`._measuring`). The strategies:

* ``gather`` (:mod:`._fast`): implicit GEMM on a phase grid. Each block of output rows is one
  matrix product of the taps' shifted row blocks, gathered into a cache-sized buffer. It
  copies ``T`` values per channel of the side it reads, and its product is as wide as the side
  it writes: good when the written side is wide.
* ``matmul_overlap_add`` (:mod:`._overlap`, backward_data): one matrix product of ``b``
  with all taps' weights side by side, then each tap's slice added into the strided window of
  ``a`` it lands on (GEMM + col2im). It adds ``T`` values per channel of ``a``, and its product
  is ``T`` times as wide: good when ``a`` is narrow.
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
  keep it, as they keep ``matmul_overlap_add``.
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
* ``indexed`` (:mod:`._indexed`, small plans, every primitive): the whole im2col one
  ``np.take`` through an index kept per plan, then one product in the user's layout: a few
  numpy calls whatever the kernel, where the others issue some per tap (a tiny layer's time).
* ``exact`` (:mod:`._exact`): per tap, one matrix product over the in-range window only.
  Padded positions contribute no term at all, which matters only when an input holds NaN or
  Inf (the grid would add ``0 * inf`` terms); such calls take this path, or
  ``matmul_overlap_add``, which adds in-range products only as well. Depthwise forward and
  backward_weights take it too where it reads the data in place and the cost model finds it
  faster; ungrouped plans where it measures faster (its per-tap products, one per kernel tap,
  sometimes beat the grid's gathers on 3-D and strided layers).

All work channels-last in float32 (float64 for float64 inputs), add the bias before the one
rounding to the output dtype (docs/numerics.md#error-bound), and only read their inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from polyconv._choice import Chooser
from polyconv._geometry import ConvPlan

from . import (
    _common,
    _exact,
    _fast,
    _im2col,
    _indexed,
    _overlap,
    _patches,
    _planes,
    _space_to_depth,
    _subpixel,
    _window,
)
from ._measuring import MEASURE_TIE, Call, candidates, context

__all__ = ["BACKEND", "CHOOSER", "STRATEGIES", "NumpyBackend", "costs"]

#: every strategy of every primitive, each primitive's plain one (the phase grid) first: a new
#: strategy is its module and one line here
STRATEGIES = (
    *_fast.STRATEGIES,
    *_overlap.STRATEGIES,
    *_exact.STRATEGIES,
    *_window.STRATEGIES,
    *_subpixel.STRATEGIES,
    *_planes.STRATEGIES,
    *_patches.STRATEGIES,
    *_space_to_depth.STRATEGIES,
    *_im2col.STRATEGIES,
    *_indexed.STRATEGIES,
)

#: the numpy backend's chooser: the cheapest strategy by default; measured, the model's pick
#: is kept unless another is faster by more than :data:`._measuring.MEASURE_TIE`
CHOOSER = Chooser("numpy", STRATEGIES, ties=((None, MEASURE_TIE),), context=context)


def costs(primitive: str, plan: ConvPlan) -> dict[str, float]:
    """The cost model's estimate, in seconds, of each strategy it offers for a primitive on a
    plan (a strategy it does not offer there still runs when forced)."""
    return {n: c for n, c in CHOOSER.costs(primitive, plan).items() if c < float("inf")}


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

    def _call(self, primitive: str, plan: ConvPlan, args: tuple, checked: tuple,
              measurable: bool = True) -> np.ndarray:
        """One call of a primitive on the strategy :data:`CHOOSER` gives, except that an empty
        batch (no rows to lay on a grid) and non-finite ``checked`` inputs on a strategy not
        exact on them take the exact path. The first call starts the backend
        (:func:`._common.start`). ``measurable``: whether measuring, when on, may time
        candidates for the plan (:func:`._measuring.candidates`).

        NaN/Inf propagate by design (docs/numerics.md#nan-and-inf): numpy's "invalid value"
        warnings are silenced. The forward and backward_data check only ``w``: the grid adds
        only ``0 * w`` terms (padding, cropped rows), which a finite ``w`` keeps exact; the
        weight gradient checks both, where zero rows of ``b`` meet values of ``a`` and padding
        zeros meet values of ``b``; a forward strategy whose zero taps meet the data checks
        ``a`` too."""
        _common.start()
        with np.errstate(invalid="ignore"):
            if not self.fast or not plan.batch:
                return CHOOSER.get(primitive, "exact").run(plan, *args)
            call = Call(CHOOSER, primitive, plan, args, checked)
            impl = CHOOSER.get(primitive, CHOOSER.choose(
                primitive, plan, measure=call.measurement if measurable else None))
            if not impl.exact_on_nonfinite and not call.finite(impl.zero_taps_meet_data):
                impl = CHOOSER.get(primitive, "exact")
            return impl.run(plan, *args)

    def forward(self, plan: ConvPlan, a: Any, w: Any, bias: Any = None) -> np.ndarray:
        return self._call("forward", plan, (a, w, bias), (w,))

    def backward_data(self, plan: ConvPlan, b: Any, w: Any, bias: Any = None) -> np.ndarray:
        return self._call("backward_data", plan, (b, w, bias), (w,))

    def backward_weights(self, plan: ConvPlan, a: Any, b: Any) -> np.ndarray:
        return self._call("backward_weights", plan, (a, b), (a, b))

    def specialize(self, plan: ConvPlan) -> Callable[..., np.ndarray]:
        """``plan``'s primitive as a function of its arrays (see
        :class:`polyconv.BackendHooks`), told once whether measuring could time anything for
        the plan: a small plan's call then skips the measuring setting's read."""
        call, primitive = self._call, plan.primitive
        measurable = _measurable(primitive, plan)
        if primitive == "backward_weights":
            return lambda a, b: call(primitive, plan, (a, b), (a, b), measurable)
        return lambda x, w, bias=None: call(primitive, plan, (x, w, bias), (w,), measurable)


def _measurable(primitive: str, plan: ConvPlan) -> bool:
    """Whether measuring could time candidates for ``plan`` (:func:`._measuring.candidates`
    of the model's pick); ``True`` where the model prices nothing there."""
    if not plan.batch:
        return False
    try:
        return bool(candidates(CHOOSER, primitive, plan, CHOOSER.default(primitive, plan)))
    except ValueError:          # no strategy priced: the chooser decides per call
        return True


BACKEND = NumpyBackend()
