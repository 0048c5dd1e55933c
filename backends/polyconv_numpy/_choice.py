"""Which strategy computes a primitive: the caller's forcing, a measurement on the plan's
first call among the strategies a cost model (:mod:`._costs`) puts near its pick, or that
model's pick.

Strategies, per primitive (see :mod:`._fast`, :mod:`._overlap`, :mod:`._exact`):

==================  ===========================================  ==============================
primitive           ``gather`` (implicit GEMM on a phase grid)   the other one
==================  ===========================================  ==============================
forward             gather ``a``'s taps, one product per block   ``overlap``: ``a @ W_all``,
                                                                 shifted add into ``b``
backward_data       per phase, gather ``b``'s taps               ``overlap``: ``b @ W_all``,
                                                                 overlap-add into ``a`` (col2im)
backward_weights    gather ``a``'s taps against ``b``            ``gather_b``: per phase,
                                                                 gather ``b``'s taps against it
==================  ===========================================  ==============================

``subpixel`` (:mod:`._subpixel`) computes a strided backward_data whose phases fill one
window as one product into every phase, then depth to space; forced on another plan it takes
``gather``. ``window`` (:mod:`._window`) computes the depthwise forward on channels-last
data by blocks of output lines over zero-padded copies of the input lines they read; forced
on another plan it takes ``gather``. ``patches`` (:mod:`._patches`) computes every primitive
of a plan whose windows do not overlap (kernel = stride, no dilation, no padding before) as one
copy and one product, and ``planes`` (:mod:`._planes`) every primitive of a depthwise plan on
channels-first data plane by plane, in place; forced on another plan either takes
``gather``; so does ``im2col`` (:mod:`._im2col`: per image, the taps' columns and one product
written in the data's own layout), forced on a plan whose data is channels-last or depthwise.
``exact`` (per tap, in-range windows only) computes
every primitive too; non-finite inputs take it unless the chosen strategy is ``overlap`` or
``patches``, which add in-range products only and so propagate NaN and Inf exactly as well. The cost
model also offers it for one channel per group (depthwise) in forward and backward_weights,
where it reads the data in place: there is no product to speak of, and it skips the grid's
copy of ``a`` into phases. The grid's per-tap sums over contiguous blocks usually win (up to
3.2x forward and 4.5x backward_weights for 7x7 kernels); the exact path wins the weight
gradient of strided 3x3 kernels on wide channels (:func:`_depthwise`), ``window`` their
forward.

Forcing (tests, benchmarks): the :func:`strategy` context manager, or the environment variable
``POLYCONV_NUMPY_STRATEGY`` read at each call, e.g. ``overlap`` (every primitive that has it;
the others keep their choice) or ``forward=gather,backward_data=overlap``.

Measuring (on by default; ``POLYCONV_NUMPY_AUTOTUNE=0`` or :func:`autotune` ``(False)`` turns
it off for deterministic choices, as the test suite does): on the first call of a plan whose
cost the model puts between 1 ms and 0.25 s, each candidate (:func:`candidates`) computes the
call twice, back to back, and the fastest is kept for the process (the model's pick unless
another is more than 25% faster: two calls on a shared 2-CPU host scatter by +-30%); that
first call then returns the winner's result.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import threading
from collections.abc import Callable, Iterator

from polyconv._geometry import ConvPlan
from polyconv._measure import Switch, geometry, pick, time_candidates

from ._costs import _costs, _exact, _Sizes

ENV = "POLYCONV_NUMPY_STRATEGY"

STRATEGIES: dict[str, tuple[str, ...]] = {
    "forward": ("gather", "overlap", "exact", "window", "planes", "patches", "space_to_depth",
                "im2col"),
    "backward_data": ("gather", "overlap", "exact", "window", "subpixel", "planes", "patches"),
    "backward_weights": ("gather", "gather_b", "exact", "window", "planes", "patches",
                         "space_to_depth", "im2col"),
}

_FORCED: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar(
    "polyconv_numpy_strategy", default=())


def _parse(spec: str | None = None, **per_primitive: str) -> dict[str, str]:
    out: dict[str, str] = {}
    if spec:
        for part in spec.split(","):
            part = part.strip()
            if not part:
                continue
            if "=" in part:
                prim, name = (x.strip() for x in part.split("=", 1))
                per_primitive.setdefault(prim, name)
                continue
            known = [p for p, names in STRATEGIES.items() if part in names]
            if not known:
                msg = (f"polyconv_numpy: unknown strategy {part!r}; known: "
                       f"{sorted({n for names in STRATEGIES.values() for n in names})}")
                raise ValueError(msg)
            for prim in known:
                out.setdefault(prim, part)
    for prim, name in per_primitive.items():
        if prim not in STRATEGIES or name not in STRATEGIES[prim]:
            msg = (f"polyconv_numpy: unknown strategy {prim}={name!r}; known: "
                   + "; ".join(f"{p}: {', '.join(n)}" for p, n in STRATEGIES.items()))
            raise ValueError(msg)
        out[prim] = name
    return out


@contextlib.contextmanager
def strategy(spec: str | None = None, **per_primitive: str) -> Iterator[None]:
    """Force strategies inside a ``with`` block (this thread or task only).

    ``strategy("overlap")`` forces it on every primitive that has it;
    ``strategy(backward_weights="gather_b")`` one primitive. Unknown names raise
    ``ValueError``.

    Examples
    --------
    >>> import numpy as np, polyconv, polyconv_numpy
    >>> x, w = np.ones((1, 4, 4, 8), np.float32), np.ones((3, 3, 3, 8), np.float32)
    >>> with polyconv_numpy.strategy(backward_data="overlap"):
    ...     y = polyconv.conv_transpose(x, w, strides=2)
    >>> y.shape
    (1, 9, 9, 3)
    """
    token = _FORCED.set(tuple({**dict(_FORCED.get()), **_parse(spec, **per_primitive)}.items()))
    try:
        yield
    finally:
        _FORCED.reset(token)


def forced(primitive: str) -> str | None:
    """The strategy forced for a primitive (context manager first, then the environment)."""
    context = _FORCED.get()
    name = dict(context).get(primitive) if context else None
    if name is None and os.environ.get(ENV):
        name = _parse(os.environ[ENV]).get(primitive)
    return name


def choose(primitive: str, plan: ConvPlan) -> str:
    """The strategy for one call: the forced one, else the measured one (:func:`measure`),
    else the cheapest by :func:`costs`."""
    return plan_choice(primitive, plan)[0]


def plan_choice(primitive: str, plan: ConvPlan) -> tuple[str, tuple[str, ...]]:
    """``(strategy, candidates)`` for one call: :func:`choose`'s strategy, and the
    strategies to measure on this call instead (:func:`candidates`; the model's pick first),
    or none. One pass over the switches, for the per-call path."""
    name = forced(primitive)
    if name is not None:
        return name, ()
    if _AUTOTUNE.enabled():
        names = _measurable(primitive, plan, plan.dtype)
        if names:
            with _lock:
                known = _measurements.get(_key(primitive, plan, plan.dtype))
            return (known, ()) if known is not None else (names[0], names)
    c = _costs(primitive, plan)
    return min(c, key=c.__getitem__), ()


# --------------------------------------------------------------------------------------------
# Measuring: the cost model's constants come from one host, and the order of two strategies
# within 1.5x of each other moves from host to host (OpenBLAS's kernels, how the hypervisor
# shares the cores). On the first call of a plan, the strategies the model puts near its pick
# are timed on the call's own inputs (polyconv._measure), and the fastest is kept for the
# process, as cuDNN's benchmark mode does.
# --------------------------------------------------------------------------------------------

AUTOTUNE_ENV = "POLYCONV_NUMPY_AUTOTUNE"
_AUTOTUNE = Switch(AUTOTUNE_ENV)
_lock = threading.Lock()
_measurements: dict[str, str] = {}

#: calls the model puts under this many seconds take its pick (too little to win), and so do
#: calls over the maximum (measuring runs each candidate twice)
MEASURE_MIN_S = 1e-3
MEASURE_MAX_S = 0.25
#: strategies the model puts within this factor of its pick are candidates
MEASURE_WITHIN = 2.5
#: the model's pick is kept unless another is faster by more than this fraction: the two
#: calls of a candidate scatter by up to 30% on a shared 2-CPU host (a ResNet-50 3x3 layer's
#: grid measured 13-22 ms on first calls in three processes, 13-18 ms in a loop), so a 5% tie
#: swapped the grid for a strategy 1.3x slower in a loop; the wins that measuring exists for
#: are 1.4-1.7x
MEASURE_TIE = 0.25


def autotune(enabled: bool = True):
    """Within the block, measure (``True``) or take the cost model's pick (``False``) on a
    plan's first call; overrides ``POLYCONV_NUMPY_AUTOTUNE`` (on unless set to ``0``)."""
    return _AUTOTUNE(enabled)


@functools.lru_cache(maxsize=1024)
def _key(primitive: str, plan: ConvPlan, dtype: str | None) -> str:
    """The record's key (``dtype`` apart: a plan hashes on its geometry alone)."""
    return f"{primitive}|{geometry(plan)}"


def measured_choices() -> dict[str, str]:
    """The strategies measured so far in this process, by primitive and geometry."""
    with _lock:
        return dict(_measurements)


def candidates(primitive: str, plan: ConvPlan) -> list[str]:
    """The strategies to measure for a call, the model's pick first; empty where nothing is
    to be measured: a forced strategy, measuring off, a plan measured already, or one the
    model puts outside :data:`MEASURE_MIN_S` .. :data:`MEASURE_MAX_S`. Ungrouped forward and
    backward_data calls may measure ``exact`` too (one product per tap over its in-range
    window), whose estimate (:func:`_exact`) the model's own pick does not weigh."""
    return list(plan_choice(primitive, plan)[1])


@functools.lru_cache(maxsize=1024)
def _measurable(primitive: str, plan: ConvPlan, dtype: str | None) -> tuple[str, ...]:
    """:func:`candidates` of a plan not measured yet."""
    c = dict(_costs(primitive, plan))
    best = min(c, key=c.__getitem__)
    if not MEASURE_MIN_S <= c[best] <= MEASURE_MAX_S:
        return ()
    if plan.groups == 1 and "exact" not in c:
        c["exact"] = _exact(primitive, plan, _Sizes(plan))
    # the model's pick first, whatever the exact path's estimate: it is the one kept on a tie
    near = sorted((n for n in c if n != best and c[n] <= MEASURE_WITHIN * c[best]),
                  key=c.__getitem__)
    return (best, *near) if near else ()


def measure(primitive: str, plan: ConvPlan, calls: dict[str, Callable[[], float]]) -> str:
    """Time ``calls`` (:func:`polyconv._measure.time_candidates`; the first is the model's
    pick), keep the fastest for the plan, and return it.

    Each candidate's calls run back to back, the faster counting: a call right after
    another strategy's shares the CPUs with that strategy's BLAS workers, which spin for
    about 0.1 s after their last product (interleaved, the grid's threaded gathers measured
    1.45x slower than they run in a loop on a ResNet-50-sized 3x3 layer, and lost to the
    per-tap products)."""
    def twice(call: Callable[[], float]) -> Callable[[], float]:
        return lambda: min(call(), call())

    times = time_candidates({n: twice(c) for n, c in calls.items()})
    choice = pick(times, ((next(iter(calls)), MEASURE_TIE),))
    with _lock:
        _measurements[_key(primitive, plan, plan.dtype)] = choice
    return choice
