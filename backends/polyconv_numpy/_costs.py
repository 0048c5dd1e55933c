"""The numpy backend's pricing primitives and its strategy record.

A strategy's estimated time for one plan is the sum of each matrix product's time (its shape's
measured rate) and a per-element price of each copy and add. Each strategy's module prices its
own kernel with these (:func:`strategy` makes its :class:`Strategy` record); the core chooser
(:mod:`polyconv._choice`) picks the cheapest. The measurements behind the constants are on
docs/design_notes.md (numpy cost model).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from polyconv._choice import Implementation
from polyconv._geometry import ConvPlan
from polyconv._phases import phases

# A copy's or an add's price depends on the length of the contiguous runs it moves (a numpy copy
# or add pays a few ns per run besides its per-element cost); the constants come from one host
# (docs/design_notes.md, numpy cost model), checked against the grid on docs/design_notes.md.

#: float32 matrix-product rate in GFLOP/s on one thread, [M = 8192, K] x [K, N], by K (rows)
#: and N (columns) in powers of 4 from 1 to 4096
_GEMM_K = (1, 4, 16, 64, 256, 1024, 4096)
_GEMM_N = (1, 4, 16, 64, 256, 1024, 4096)
_GEMM_GFLOPS = (
    (1.1, 2.0, 2.1, 2.1, 2.1, 1.7, 1.8),
    (6.8, 21.7, 51.7, 58.2, 63.6, 20.9, 15.0),
    (24.8, 41.2, 91.1, 104.7, 103.7, 58.9, 46.7),
    (37.1, 43.5, 104.0, 121.4, 125.7, 94.2, 90.8),
    (41.9, 42.5, 104.9, 116.7, 120.2, 119.6, 123.5),
    (20.4, 19.7, 58.6, 99.6, 117.7, 121.6, 125.0),
    (18.6, 16.2, 51.8, 94.5, 111.9, 121.7, 125.2),
)
THREADS_SPEEDUP = 1.6     # products on the machine's two cores, where BLAS splits the output
#: a product's output elements up to which BLAS computes it on one thread, and from which it
#: has THREADS_SPEEDUP (log-linear between): OpenBLAS splits the output, not the contraction
#: ([n, M] x [M, n], M = 12544-50176: two threads 1.0x one at n = 16 and 32, 1.3x at 64, 1.6x
#: at 128)
ONE_THREAD_OUTPUT, SPLIT_OUTPUT = 32 * 32, 128 * 128
COPY_S = 0.07e-9          # per element of a copy, plus COPY_RUN_S per contiguous run
COPY_RUN_S = 2.9e-9
COPY_STRIDED_S = 0.4e-9   # per element of a copy whose innermost axis is strided
ADD_S = 0.5e-9            # per element of an in-place add, plus ADD_RUN_S per run
ADD_RUN_S = 9e-9          # (half that where the destination's positions are contiguous)
ADD_STRIDED_S = 1.4e-9    # per element of an add whose innermost axis is strided
FILL_S = 0.13e-9          # per element of a contiguous fill or copy
TRANSPOSE_S = 1.5e-9      # per element of a layout change (channels-first <-> last)
CALL_S = 3e-6             # per numpy call issued in a Python loop


def rate(k: float, n: float) -> float:
    """Interpolated product rate on one thread (FLOP/s) for ``K = k``, ``N = n`` (log-log,
    clamped)."""
    def pos(v, grid):
        x = min(max(math.log(max(v, 1), 4), 0), len(grid) - 1)
        i = min(int(x), len(grid) - 2)
        return i, x - i
    i, fi = pos(k, _GEMM_K)
    j, fj = pos(n, _GEMM_N)
    r = _GEMM_GFLOPS
    v = ((1 - fi) * (1 - fj) * r[i][j] + fi * (1 - fj) * r[i + 1][j]
         + (1 - fi) * fj * r[i][j + 1] + fi * fj * r[i + 1][j + 1])
    return v * 1e9


def threads_speedup(outputs: float) -> float:
    """The two cores' speedup of a product with ``outputs`` output elements."""
    split = math.log(max(outputs, 1) / ONE_THREAD_OUTPUT) / math.log(
        SPLIT_OUTPUT / ONE_THREAD_OUTPUT)
    return 1 + (THREADS_SPEEDUP - 1) * min(max(split, 0.0), 1.0)


def gemm(m: float, k: float, n: float) -> float:
    return 2 * m * k * n / (rate(k, n) * threads_speedup(m * n))


def gemm_long(m: float, k: float, n: float) -> float:
    """A product with a long contraction (backward_weights sums over every row): its rate
    is that of the narrower output side."""
    return gemm(max(m, n), k, min(m, n))


def copy(elements: float, run: float) -> float:
    """A copy moving contiguous runs of ``run`` elements (1: a strided innermost axis)."""
    return elements * (COPY_STRIDED_S if run <= 1 else COPY_S + COPY_RUN_S / run)


def add(elements: float, run: float, contiguous: bool = False) -> float:
    if run <= 1:
        return elements * ADD_STRIDED_S
    return elements * (ADD_S + ADD_RUN_S / run / (2 if contiguous else 1))


class Sizes:
    """The counts a plan's costs are made of."""

    def __init__(self, plan: ConvPlan):
        ph = phases(plan)
        self.item = 2 if plan.acc_dtype == "float64" else 1   # float64 moves twice the bytes
        self.t, self.g = len(ph.taps), plan.groups
        self.ca, self.cb = plan.a_channels, plan.b_channels
        self.cg, self.og = self.ca // self.g, self.cb // self.g
        cells = [max(ax.cells, ax.small + ax.max_shift) for ax in ph.axes]
        self.rows = plan.batch * math.prod(cells)                  # phase-grid rows
        self.ma = plan.batch * math.prod(plan.a_spatial)           # rows of a
        self.mb = plan.batch * math.prod(plan.b_spatial)           # rows of b
        self.phases = [len(ts) for _, ts in ph.by_phase]           # taps per phase reached
        self.layout = 0.0 if plan.channels_last else TRANSPOSE_S   # per element across layouts
        # phase split / put: copies between the user's tensor and the grid, runs of the
        # channels (of a whole row where the last axis has stride 1)
        self.run_a = self.ca * (plan.a_spatial[-1] if plan.strides[-1] == 1 else 1)
        self.split = (len(self.phases) * self.rows * self.ca * FILL_S
                      + copy(self.ma * self.ca, self.run_a) + self.ma * self.ca * self.layout)


@functools.lru_cache(maxsize=1024)
def _sizes(plan: ConvPlan, dtype: str | None) -> Sizes:
    return Sizes(plan)


def sizes(plan: ConvPlan) -> Sizes:
    """:class:`Sizes`, cached per plan and dtype (a plan hashes on its geometry alone)."""
    return _sizes(plan, plan.dtype)


#: ``price(primitive, plan, sizes) -> seconds``; ``math.inf`` where the model does not offer
#: the strategy (it is still run when forced)
Price = Callable[[str, ConvPlan, Sizes], float]


@dataclass(frozen=True)
class Strategy(Implementation):
    """A numpy strategy: :class:`polyconv.Implementation` with one flag of its own.

    Attributes
    ----------
    zero_taps_meet_data : bool
        Whether, in forward, zero taps past the kernel meet the data (``0 * inf`` terms): a
        forward that may run it checks the data's finiteness as well as the weights'.
    """

    zero_taps_meet_data: bool = False


def strategy(name: str, primitive: str, run: Callable[..., Any], price: Price,
             applies: Callable[[ConvPlan, str], bool] | None = None, *,
             exact_on_nonfinite: bool = False, zero_taps_meet_data: bool = False) -> Strategy:
    """The record of one strategy of one primitive: ``applies(plan, primitive)`` (default:
    every plan), its cost ``price(primitive, plan, sizes(plan))``, cached per plan and dtype."""
    @functools.lru_cache(maxsize=1024)
    def cost_of(plan: ConvPlan, dtype: str | None) -> float:
        return price(primitive, plan, sizes(plan))

    return Strategy(
        name, primitive, run,  # type: ignore[arg-type]
        applies=(lambda plan: True) if applies is None else (
            lambda plan: applies(plan, primitive)),
        exact_on_nonfinite=exact_on_nonfinite,
        cost=lambda plan: cost_of(plan, plan.dtype),
        zero_taps_meet_data=zero_taps_meet_data)
