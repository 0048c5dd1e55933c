"""Which strategy computes a primitive: a cost model per plan, or the caller's forcing.

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

``exact`` (per tap, in-range windows only) computes every primitive too; non-finite inputs take
it unless the chosen strategy is ``overlap``, which adds in-range products only and so
propagates NaN and Inf exactly as well.

Forcing (tests, benchmarks): the :func:`strategy` context manager, or the environment variable
``POLYCONV_NUMPY_STRATEGY`` read at each call, e.g. ``overlap`` (every primitive that has it;
the others keep their choice) or ``forward=gather,backward_data=overlap``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os
from collections.abc import Iterator

from polyconv._geometry import ConvPlan
from polyconv._phases import phases

ENV = "POLYCONV_NUMPY_STRATEGY"

STRATEGIES: dict[str, tuple[str, ...]] = {
    "forward": ("gather", "overlap", "exact"),
    "backward_data": ("gather", "overlap", "exact"),
    "backward_weights": ("gather", "gather_b", "exact"),
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
    name = dict(_FORCED.get()).get(primitive)
    if name is None and os.environ.get(ENV):
        name = _parse(os.environ[ENV]).get(primitive)
    return name


# --------------------------------------------------------------------------------------------
# the cost model: seconds, from a roofline of each matrix product and a per-element price of
# each copy or add (constants measured on a 2-core x86 CPU with OpenBLAS; see
# docs/benchmarks.md#numpy-strategies for the grid that checks the crossover)
# --------------------------------------------------------------------------------------------

GEMM_FLOPS = 150e9       # float32 multiply-add pairs x 2 per second, large products
GEMM_BYTES = 10e9        # bytes per second a narrow (memory-bound) product streams
GATHER_S = 0.6e-9        # per element copied into a gathered block
ADD_S = 0.8e-9           # per element of a strided add (read, add, write)
COPY_S = 0.3e-9          # per element of a contiguous copy, fill or layout change
CALL_S = 3e-6            # per numpy call (matmul, add, copy) issued in a Python loop


def _gemm(m: float, k: float, n: float, itemsize: int) -> float:
    return max(2 * m * k * n / GEMM_FLOPS, (m * k + m * n) * itemsize / GEMM_BYTES)


@functools.lru_cache(maxsize=1024)
def _costs(primitive: str, plan: ConvPlan) -> dict[str, float]:
    ph = phases(plan)
    item = 8 if plan.acc_dtype == "float64" else 4
    t = len(ph.taps)
    g = plan.groups
    ca, cb = plan.a_channels, plan.b_channels
    cg, og = ca // g, cb // g
    grid = [max(ax.cells, ax.small + ax.max_shift) for ax in ph.axes]
    rows = plan.batch * math.prod(grid)                    # phase-grid rows
    ma = plan.batch * math.prod(plan.a_spatial)            # rows of a
    mb = plan.batch * math.prod(plan.b_spatial)            # rows of b
    nph = len(ph.by_phase)
    in_range = sum(math.prod(sl.stop - sl.start for sl in b_idx)
                   for _, b_idx, _ in ph.tap_windows) * plan.batch    # rows x taps added
    blocks = max(1, rows * t * max(ca, cb) * item // (1 << 20))
    if primitive == "forward":
        gather = (nph * rows * ca * COPY_S + rows * t * ca * GATHER_S
                  + g * _gemm(rows, t * cg, og, item) + blocks * (t + 1) * CALL_S)
        overlap = (ma * ca * COPY_S + g * _gemm(ma, cg, t * og, item)
                   + in_range * cb * ADD_S + mb * cb * COPY_S + t * CALL_S)
        return {"gather": gather, "overlap": overlap}
    if primitive == "backward_data":
        gather = (rows * cb * COPY_S + rows * t * cb * GATHER_S
                  + sum(g * _gemm(rows, len(ts) * og, cg, item) for _, ts in ph.by_phase)
                  + nph * rows * ca * COPY_S + blocks * (t + nph) * CALL_S)
        overlap = (mb * cb * COPY_S + g * _gemm(mb, og, t * cg, item)
                   + in_range * ca * ADD_S + 2 * ma * ca * COPY_S + t * CALL_S)
        return {"gather": gather, "overlap": overlap}
    # backward_weights: gather a's taps (T*Ca per row) or b's (T*Cb per row, per phase)
    gather = (nph * rows * ca * COPY_S + rows * cb * COPY_S + rows * t * ca * GATHER_S
              + g * _gemm(rows, og, t * cg, item) + blocks * (t + 1) * CALL_S)
    gather_b = (nph * rows * ca * COPY_S + rows * cb * COPY_S + rows * t * cb * GATHER_S
                + sum(g * _gemm(rows, len(ts) * og, cg, item) for _, ts in ph.by_phase)
                + blocks * (t + nph) * CALL_S)
    return {"gather": gather, "gather_b": gather_b}


def costs(primitive: str, plan: ConvPlan) -> dict[str, float]:
    """The cost model's estimate, in seconds, of each strategy of a primitive on a plan."""
    return dict(_costs(primitive, plan))


def choose(primitive: str, plan: ConvPlan) -> str:
    """The strategy for one call: the forced one, else the cheapest by :func:`costs`."""
    name = forced(primitive)
    if name is not None:
        return name
    c = _costs(primitive, plan)
    return min(c, key=c.__getitem__)
