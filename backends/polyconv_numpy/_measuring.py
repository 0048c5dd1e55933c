"""Measuring the numpy strategies when asked (:func:`polyconv.autotune`): on a plan's first
call, the strategies the cost model puts near its pick are timed on the call's own inputs, and
the core chooser (:mod:`polyconv._choice`) keeps the fastest for the plan.

The model's constants come from one host, and the order of two strategies within 1.5x of each
other moves from host to host (OpenBLAS's kernels, how a hypervisor shares the cores): that is
what measuring is for. The figures behind the rules are on docs/design_notes.md (numpy cost
model).
"""

from __future__ import annotations

import functools
import math
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from polyconv._choice import Chooser, Measurement, time_candidates
from polyconv._geometry import ConvPlan

#: calls the model puts under this many seconds keep its pick (too little to win), and so do
#: calls over the maximum (measuring runs each candidate twice)
MEASURE_MIN_S = 1e-3
MEASURE_MAX_S = 0.25
#: strategies the model puts within this factor of its pick are candidates
MEASURE_WITHIN = 2.5
#: the model's pick is kept unless another is faster by more than this fraction: two calls of
#: one strategy scatter by up to 30% on a shared 2-CPU host, and the wins measuring exists for
#: are 1.4-1.7x
MEASURE_TIE = 0.25


@functools.cache
def context() -> str:
    """What a measurement holds for: the machine kind and numpy's version (its BLAS)."""
    return f"{platform.machine()} numpy-{np.__version__}"


def candidates(chooser: Chooser, primitive: str, plan: ConvPlan,
               default: str | None = None) -> tuple[str, ...]:
    """The strategies to measure for a plan, the model's pick (``default``) first; empty
    where the model puts its pick outside :data:`MEASURE_MIN_S` .. :data:`MEASURE_MAX_S` or
    nothing near it."""
    return _candidates(chooser, primitive, plan, plan.dtype, default)


@functools.lru_cache(maxsize=1024)
def _candidates(chooser: Chooser, primitive: str, plan: ConvPlan, dtype: str | None,
                default: str | None) -> tuple[str, ...]:
    c = {n: t for n, t in chooser.costs(primitive, plan).items() if t < math.inf}
    best = default if default in c else min(c, key=c.__getitem__)
    if not MEASURE_MIN_S <= c[best] <= MEASURE_MAX_S:
        return ()
    # the model's pick first, whatever the others' estimates: it is the one kept on a tie
    near = sorted((n for n in c if n != best and c[n] <= MEASURE_WITHIN * c[best]),
                  key=c.__getitem__)
    return (best, *near) if near else ()


class Call:
    """One call of a primitive: its inputs' finiteness, checked at most once, and the
    measurement the chooser runs on them when measuring is on.

    ``checked`` are the inputs whose non-finite values would meet the grid's zeros (the
    weights; both data tensors for the weight gradient); a forward strategy whose zero taps
    meet the data (:attr:`._costs.Strategy.zero_taps_meet_data`) checks ``a`` as well.
    """

    def __init__(self, chooser: Chooser, primitive: str, plan: ConvPlan, args: tuple,
                 checked: Sequence[Any]):
        self.chooser, self.primitive, self.plan = chooser, primitive, plan
        self.args, self.checked = args, tuple(checked)
        self._finite: dict[bool, bool] = {}

    def finite(self, data: bool = False) -> bool:
        """Whether the checked inputs (and, with ``data``, the forward's ``a``) are finite."""
        data = data and self.primitive == "forward"
        if data not in self._finite:
            ok = self.finite(False) if data else True
            arrays = (self.args[0],) if data else self.checked
            self._finite[data] = ok and finite(*arrays)
        return self._finite[data]

    def measurement(self, default: str) -> Measurement | None:
        """The chooser's ``measure`` callback: the candidates and their timer, or ``None``
        (nothing to measure, or non-finite inputs, which take the exact path untimed)."""
        names = candidates(self.chooser, self.primitive, self.plan, default)
        data = any(self.chooser.get(self.primitive, n).zero_taps_meet_data for n in names)
        if not names or not self.finite(data):
            return None
        return Measurement(names, self.time)

    def time(self, names: Sequence[str]) -> Mapping[str, float]:
        """Seconds per call of each strategy on this call's inputs. Each one's two calls run
        back to back, the faster counting: a call right after another strategy's shares the
        CPUs with that strategy's BLAS workers, which spin for a while after their last
        product."""
        def twice(name: str) -> Callable[[], float]:
            run = self.chooser.get(self.primitive, name).run
            return lambda: min(_timed(run, self.plan, self.args),
                               _timed(run, self.plan, self.args))

        return time_candidates({n: twice(n) for n in names})


def _timed(fn: Callable[..., Any], plan: ConvPlan, args: tuple) -> float:
    """Seconds one call of ``fn`` takes (its result is dropped: measuring holds no extra
    output)."""
    t0 = time.perf_counter()
    fn(plan, *args)
    return time.perf_counter() - t0


def finite(*arrays: Any) -> bool:
    """Whether every value is finite: one pass per array, no temporary array.

    float32: the minimum and the maximum (NaN propagates through both, an infinity is one of
    them; 3x faster than a float64 sum). Other dtypes: a float64 sum (numpy's min and max of
    16-bit floats are 5-40x slower); a sum that overflows reports ``False`` too, which only
    sends a call to the exact path.
    """
    for x in arrays:
        x = np.asarray(x).ravel()
        if x.dtype == np.float32:       # no warning: min and max only propagate NaN
            if x.size and not (np.isfinite(np.minimum.reduce(x))
                               and np.isfinite(np.maximum.reduce(x))):
                return False
        else:
            with np.errstate(all="ignore"):
                if not np.isfinite(np.add.reduce(x, dtype=np.float64)):
                    return False
    return True
