"""The numpy backend's cost model: each strategy's estimated time for one plan.

Seconds, as the sum of each matrix product's time (its shape's measured rate) and a
per-element price of each copy and add; :mod:`._choice` picks the cheapest, or measures the
strategies it puts near its pick.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from polyconv._geometry import ConvPlan
from polyconv._phases import adjoint_phases, phases

from ._im2col import Columns
from ._im2col import applies as im2col_applies
from ._overlap import plan_blocks
from ._patches import applies as patches_applies
from ._planes import applies as planes_applies
from ._space_to_depth import Blocks
from ._space_to_depth import applies as space_to_depth_applies
from ._subpixel import applies as subpixel_applies
from ._window import applies as window_applies

# --------------------------------------------------------------------------------------------
# The cost model: seconds, as the sum of each matrix product's time (its shape's measured rate)
# and a per-element price of each copy and add, which depends on the length of the contiguous
# runs it moves (a numpy copy or add pays about 3-9 ns per run besides its per-element cost).
# Constants measured on a 2-core x86-64 CPU with OpenBLAS (float32, one thread; products on
# two threads run about 1.6x faster, copies and adds are single-threaded); the grid that
# checks the crossover is on docs/benchmarks.md (numpy strategies).
# --------------------------------------------------------------------------------------------

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
THREADS_SPEEDUP = 1.6     # products on the machine's two cores
COPY_S = 0.07e-9          # per element of a copy, plus COPY_RUN_S per contiguous run
COPY_RUN_S = 2.9e-9
COPY_STRIDED_S = 0.4e-9   # per element of a copy whose innermost axis is strided
ADD_S = 0.5e-9            # per element of an in-place add, plus ADD_RUN_S per run
ADD_RUN_S = 9e-9          # (half that where the destination's positions are contiguous)
ADD_STRIDED_S = 1.4e-9    # per element of an add whose innermost axis is strided
FILL_S = 0.13e-9          # per element of a contiguous fill or copy
TRANSPOSE_S = 1.5e-9      # per element of a layout change (channels-first <-> last)
CALL_S = 3e-6             # per numpy call issued in a Python loop


def _rate(k: float, n: float) -> float:
    """Interpolated product rate (FLOP/s) for ``K = k``, ``N = n`` (log-log, clamped)."""
    def pos(v, grid):
        x = min(max(math.log(max(v, 1), 4), 0), len(grid) - 1)
        i = min(int(x), len(grid) - 2)
        return i, x - i
    i, fi = pos(k, _GEMM_K)
    j, fj = pos(n, _GEMM_N)
    r = _GEMM_GFLOPS
    v = ((1 - fi) * (1 - fj) * r[i][j] + fi * (1 - fj) * r[i + 1][j]
         + (1 - fi) * fj * r[i][j + 1] + fi * fj * r[i + 1][j + 1])
    return v * 1e9 * THREADS_SPEEDUP


def _gemm(m: float, k: float, n: float) -> float:
    return 2 * m * k * n / _rate(k, n)


def _gemm_long(m: float, k: float, n: float) -> float:
    """A product with a long contraction (backward_weights sums over every row): its rate
    is that of the narrower output side."""
    return _gemm(max(m, n), k, min(m, n))


def _copy(elements: float, run: float) -> float:
    """A copy moving contiguous runs of ``run`` elements (1: a strided innermost axis)."""
    return elements * (COPY_STRIDED_S if run <= 1 else COPY_S + COPY_RUN_S / run)


def _add(elements: float, run: float, contiguous: bool = False) -> float:
    if run <= 1:
        return elements * ADD_STRIDED_S
    return elements * (ADD_S + ADD_RUN_S / run / (2 if contiguous else 1))


class _Sizes:
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
        blocks = max(1, self.rows * self.t * max(self.ca, self.cb) * 4 // (1 << 20))
        self.calls = blocks * (self.t + len(self.phases)) * CALL_S
        # phase split / put: copies between the user's tensor and the grid, runs of the
        # channels (of a whole row where the last axis has stride 1)
        self.run_a = self.ca * (plan.a_spatial[-1] if plan.strides[-1] == 1 else 1)
        self.split = (len(self.phases) * self.rows * self.ca * FILL_S
                      + _copy(self.ma * self.ca, self.run_a) + self.ma * self.ca * self.layout)


def _costs(primitive: str, plan: ConvPlan) -> dict[str, float]:
    return _costs_of(primitive, plan, plan.dtype)


@functools.lru_cache(maxsize=1024)
def _costs_of(primitive: str, plan: ConvPlan, dtype: str | None) -> dict[str, float]:
    """:func:`_costs`, cached (``dtype`` apart: a plan hashes on its geometry alone)."""
    if (primitive == "backward_data" and window_applies(plan, primitive)
            and all(s == 1 for s in plan.strides)):
        # unstrided depthwise: one forward convolution of b (adjoint_phases), whichever
        # strategy computes it (the grid's and the windows' loops are the forward's). With a
        # stride the windows sum each phase's few taps one by one (WINDOW_BD_TAP_S, below)
        return _costs("forward", adjoint_phases(plan)[0].plan)
    z = _Sizes(plan)
    out = _costs_dense(primitive, plan, z)
    if z.cg == 1 and z.g > 1:      # one channel of a per group: tap sums, no product
        dw = _depthwise(z)
        if primitive == "backward_data":
            # one the windows above do not take (strided, or channels-first data): the grid's
            # tap sums per phase are the forward's loops (priced as products, they came out
            # above the sub-pixel product, which per group is a [rows, L] x [L, S] product:
            # CenterNet's DLA-34 up-sampling, a depthwise k4 s2 ConvTranspose of 64 channels
            # from 8x64x64, 77 ms against 24 for the grid); sub-pixel is not offered
            # (plus, for channels-first data, the grid's change of layout of a and b)
            out["gather"] = dw["gather"] + z.item * (z.ma * z.ca + z.mb * z.cb) * z.layout
            out.pop("subpixel", None)
        elif _in_place(plan):
            out.update({k: dw["gather"] for k in out if k != "overlap"}, exact=dw["exact"])
    if window_applies(plan, primitive):
        if primitive == "backward_data":    # strided (above: unstrided), tap by tap
            if plan.b_spatial[-1] * z.cb >= WINDOW_BD_MIN_RUN:
                out["window"] = z.item * (z.mb * z.t * z.cb * WINDOW_BD_TAP_S
                                          + z.ma * z.ca * FILL_S)
        else:
            tap = WINDOW_TAP_S if primitive == "forward" else WINDOW_GRAD_TAP_S
            out["window"] = z.item * (z.mb * z.t * z.cb * tap + z.ma * z.ca * WINDOW_COPY_S)
    if planes_applies(plan):
        out["planes"] = z.item * (z.mb * z.t * z.cb * PLANES_TAP_S + z.ma * z.ca * PLANES_MOVE_S)
    if patches_applies(plan):
        out["patches"] = _patches(primitive, plan, z)
    if (space_to_depth_applies(plan, primitive)
            and z.ca * math.prod(plan.strides) >= SPACE_TO_DEPTH_MIN_DEPTH):
        out["space_to_depth"] = _space_to_depth(primitive, plan, z)
    if im2col_applies(plan, primitive):
        out["im2col"] = _im2col(primitive, plan, z)
    return out


def _im2col(primitive: str, plan: ConvPlan, z: _Sizes) -> float:
    """Columns per block of images or lines (:mod:`._im2col`): a zero-padded copy of the
    lines a block reads, each tap's window of it copied into the columns (runs of ``b``'s
    last axis, strided where that axis is), and the products ``[Og, Cg*T] x [Cg*T, L]`` per
    group, written into ``b`` in place (the weight gradient: their long-contraction form)."""
    cols = Columns(plan, np.dtype(plan.acc_dtype))
    run = plan.b_spatial[-1] if plan.strides[-1] == 1 else 1
    copies = z.item * (z.ma * z.ca * 2 * FILL_S + _copy(z.mb * z.t * z.ca, run))
    calls = len(cols.blocks) * (z.t + 3) * CALL_S
    if primitive == "backward_weights":
        product = z.g * _gemm_long(z.og, z.mb, z.t * z.cg)
        return IM2COL_GRAD_FACTOR * (copies + product + calls)
    product = z.g * _gemm(z.mb, z.t * z.cg, z.og) + z.item * z.mb * z.cb * FILL_S
    return IM2COL_FACTOR * (copies + product + calls)


#: the columns' estimates against their times on the corpus's 23 channels-first layers
#: (2-CPU AMD EPYC, the same runs as the grid's): forward 1.6-3.7x its estimate (median 2.1;
#: the grid 1.2-3.7x, median 2.5), the weight gradient 1.6-6x (median 2.2), further off
#: where the columns are much deeper than ``b`` is wide (``T*Ca`` 8-9x ``Cb``: HiFi-GAN's
#: 512->256, the U-Net's 3x3 64->64, StyleGAN2's grouped 3x3, where the grid won by
#: 1.1-1.6x). Weighed so that the model leaves those to the grid and to the measurement
IM2COL_FACTOR = 1.1
IM2COL_GRAD_FACTOR = 1.4


def _space_to_depth(primitive: str, plan: ConvPlan, z: _Sizes) -> float:
    """Blocks of ``s`` positions as rows (:mod:`._space_to_depth`): ``a`` zero-padded and
    copied into blocks (channels-last in runs of a block's line, channels-first with a
    strided side), then ``ceil(K/s)^nd`` products ``[rows, s^nd*Ca] x [s^nd*Ca, Cb]`` over
    the blocks' rows, each added into ``b`` (the weight gradient: their long-contraction
    form)."""
    geo = Blocks(plan)
    rows, depth, products = plan.batch * geo.per_image, geo.depth, len(geo.offsets)
    values = rows * depth
    run = plan.strides[-1] * z.ca if plan.channels_last else 1
    cost = z.item * (values * FILL_S + _copy(values, run) + rows * z.cb * FILL_S)
    if primitive == "backward_weights":
        return SPACE_TO_DEPTH_FACTOR * (cost + products * _gemm_long(depth, rows, z.cb))
    return SPACE_TO_DEPTH_FACTOR * (
        cost + products * (_gemm(rows, depth, z.cb) + z.item * _add(rows * z.cb, z.cb)))


#: the space-to-depth estimate against its time on the corpus's 14 layers where it was within
#: 2.5x of the pick (2-CPU AMD EPYC): it ran 1.2-3.6x its estimate (median 2.3; its products'
#: few output columns run below the table's rates), so it is weighed at 2.5x and left to the
#: measurement where near. It wins FCN-8s's k16 s8 (forward 38 ms against 43-70, weight
#: gradient 39 against 74) and HiFi-GAN's 256->128 k16 s8 (12 against 20-23)
SPACE_TO_DEPTH_FACTOR = 2.5
#: and it is offered only where a block holds this many values (``s^nd * Ca``): on the
#: corpus's layers of 1-3 input channels (the stems, DCGAN's and pix2pix's last layers, the
#: 3-D decoder's 64->1, 5-12 values a block) it ran 1.3-2.1x slower than the grid
SPACE_TO_DEPTH_MIN_DEPTH = 64


def _patches(primitive: str, plan: ConvPlan, z: _Sizes) -> float:
    """Non-overlapping windows (:mod:`._patches`): one copy of the windows (``B*T*Ca``
    values; channels-last in runs of a window's line, channels-first with a strided side)
    and one product, ``[N*B, T*Ca] x [T*Ca, Cb]`` (its transpose for backward_data, its
    long-contraction form for the weight gradient)."""
    values = z.mb * z.t * z.ca
    # channels-first, the copy reads (or, for backward_data, writes) one side with a stride
    # of s values throughout: priced as a change of layout (the U-Net's 2x2 stride-2 layer on
    # 64x256x256: 15 ms measured for the strided side against 2 priced as a strided copy)
    per_value = (_copy(values, plan.kernel[-1] * z.ca) if plan.channels_last
                 else values * TRANSPOSE_S)
    copy = z.item * (per_value + z.mb * z.cb * FILL_S)
    if primitive == "backward_weights":
        return copy + _gemm_long(z.t * z.ca, z.mb, z.cb)
    if primitive == "backward_data":
        return copy + _gemm(z.mb, z.cb, z.t * z.ca)
    return copy + _gemm(z.mb, z.t * z.ca, z.cb)


def _costs_dense(primitive: str, plan: ConvPlan, z: _Sizes) -> dict[str, float]:
    item, t, g, ca, cb, cg, og = z.item, z.t, z.g, z.ca, z.cb, z.cg, z.og
    rows, ma, mb, layout, calls, split = z.rows, z.ma, z.mb, z.layout, z.calls, z.split
    run_a, last_b, sp = z.run_a, plan.b_spatial[-1], math.prod(plan.strides)
    per_phase = z.phases
    # the grid gathers channels-first (runs of rows, no change of layout) for channels-first
    # data and for few channels per group (see _fast._channels_first)
    cf = not (cg == 1 and g > 1) and (cg <= 8 or not plan.channels_last)
    gathered = rows * t * ca * COPY_S if cf else _copy(rows * t * ca, cg)
    grid_layout = 0.0 if cf else layout
    if primitive == "forward":
        gather = (item * (split - ma * ca * (layout - grid_layout) + gathered
                          + mb * cb * (2 * FILL_S + grid_layout))
                  + g * _gemm(rows, t * cg, og) + calls)
        # a numpy call per tap and block of the product
        blocks = plan_blocks(plan, primitive, 4 * item)
        overlap = (item * (ma * ca * (FILL_S + layout) + _add(mb * t * cb, og, True)
                           + mb * cb * (FILL_S + layout))
                   + g * _gemm(ma, cg, t * og) + t * CALL_S * blocks)
        return {"gather": gather, "overlap": overlap}
    if primitive == "backward_data":
        gather = (item * (rows * cb * FILL_S + mb * cb * layout
                          + _copy(rows * t * cb, og) + _copy(ma * ca, run_a) + ma * ca * layout)
                  + sum(g * _gemm(rows, ts * og, cg) for ts in per_phase) + calls)
        # a numpy call per tap and block of the product
        blocks = plan_blocks(plan, primitive, 4 * item)
        if not plan.channels_last or cg < 32:      # channels-first accumulators
            read = mb * cb * TRANSPOSE_S if plan.channels_last and g > 1 else 0.0
            moves = (read + _add(mb * t * ca, last_b) + sp * rows * ca * FILL_S
                     + _copy(ma * ca, 1 if plan.strides[-1] > 1 else last_b)
                     + (ma * ca * TRANSPOSE_S if plan.channels_last else 0))
            # one [T*Cg, Og] x [Og, columns] product per batch element (or block) and group
            products = max(plan.batch, blocks)
            product = products * g * _gemm(t * cg, og, mb / products)
        else:
            moves = mb * cb * FILL_S + _add(mb * t * ca, ca) + 2 * ma * ca * FILL_S
            product = g * _gemm(mb, og, t * cg)
        overlap = item * moves + product + t * CALL_S * blocks
        out = {"gather": gather, "overlap": overlap}
        if subpixel_applies(plan):     # window taps' patches, one product, depth to space
            window = t // sp
            out["subpixel"] = SUBPIXEL_FACTOR * (
                item * (_copy(rows * window * cb, og) + _copy(rows * sp * ca, cg)
                        + ma * ca * (FILL_S + layout) + mb * cb * layout)
                + g * _gemm(rows, window * og, sp * cg) + (window + 8) * CALL_S)
        return out
    # backward_weights: gather a's taps (T*Ca per row) or b's (T*Cb per row, per phase)
    common = item * (split + rows * cb * FILL_S + mb * cb * layout)
    gather = (common - item * (ma * ca + mb * cb) * (layout - grid_layout) + item * gathered
              + g * _gemm_long(og, rows, t * cg) + calls)
    gather_b = (common + item * _copy(rows * t * cb, og)
                + sum(g * _gemm_long(ts * og, rows, cg) for ts in per_phase)
                + calls)
    out = {"gather": gather, "gather_b": gather_b}
    if g == 1:
        out["exact"] = _exact(primitive, plan, z)
    return out


#: the sub-pixel strategy's estimate (its patches, product and interleave, priced as the two
#: whole copies it first made) doubled: so weighed, the model picks it for FCN-8s's k16 s8
#: up-sampling (2.1-2.9x faster than the other strategies) and leaves it to the measurement
#: where it is near (DCGAN's 128->64 and HiFi-GAN's k16 s8 layers, nnU-Net's 3-D k2 s2:
#: 1.2-2.8x faster there), while undoubled it was the pick on DCGAN's 64->3 layer, where it
#: ran 1.3x slower than ``overlap`` (the corpus's 14 strided ConvTranspose layers it applies
#: to, 2 CPUs). Re-checked on those layers after its interleave went by blocks (one pass):
#: the estimate still puts it above its time there, the picks stand, and undoubled it would
#: still take DCGAN's 64->3 (5.6 ms against 2.6 for ``overlap``)
SUBPIXEL_FACTOR = 2.0


#: the exact path's per-tap products (a copy of each tap's strided window, one product, and
#: for forward and backward_data an add of its result into the window it lands on) against
#: the table's rates: fitted on the corpus's 16 dense float32 layers (2-CPU AMD EPYC), where
#: the exact weight gradient wins only DCGAN's 512->256 layer (4x4 images of 512 channels,
#: 2.5x faster than the grid, whose phase cells add 56% rows there) and ties on three. On
#: other hosts it wins more (a strided ResNet-50 layer and the 3-D U-Nets' up-convolutions,
#: 1.4-1.6x on a host without AVX-512): measuring decides where the estimates are close
EXACT_FACTOR = 2.0


def _exact(primitive: str, plan: ConvPlan, z: _Sizes) -> float:
    """Ungrouped, on the exact path: per tap that meets the data, its windows copied
    channels-last and one product over their ``m`` rows (forward: ``[m, Ca] x [Ca, Cb]``
    added into ``b``; backward_data: ``[m, Cb] x [Cb, Ca]`` added into ``a``;
    backward_weights: ``[Cb, m] x [m, Ca]``)."""
    cost = (z.ma * z.ca + z.mb * z.cb) * z.layout * z.item
    for _, b_index, _ in phases(plan).tap_windows:
        m = plan.batch * math.prod(s.stop - s.start for s in b_index)
        if primitive == "backward_weights":
            cost += (z.item * (_copy(m * z.ca, z.ca) + _copy(m * z.cb, z.cb))
                     + _gemm_long(z.cb, m, z.ca))
        else:
            cin, cout = (z.ca, z.cb) if primitive == "forward" else (z.cb, z.ca)
            cost += z.item * (_copy(m * cin, cin) + _add(m * cout, cout)) + _gemm(m, cin, cout)
        cost += CALL_S
    return EXACT_FACTOR * cost


def _in_place(plan: ConvPlan) -> bool:
    """Whether the exact path reads the data in place (channels-last, accumulation dtype):
    then its temporaries stay within the memory bound."""
    return plan.channels_last and plan.dtype in ("float32", "float64")


#: depthwise forward and backward_weights, per element: the grid's phase split (per value of
#: ``a``) and its strided-view einsum sums (per grid row, tap and channel, on all CPUs); the
#: exact path's per-tap window products (per row of ``b``, tap and channel, plus per run of
#: channels: a strided window is a loop per row). Fitted to both primitives on 24 NXC layers
#: (16-384 channels, 3x3 and 7x7, strides 1 and 2, batches 1 and 8; 2-CPU AMD EPYC): right on
#: all 24 forward, and on 23 backward_weights (within 4% on the other).
DW_SPLIT_S = 0.82e-9
DW_GRID_TAP_S = 0.062e-9
DW_EXACT_TAP_S = 0.30e-9
DW_EXACT_RUN_S = 2.87e-9


#: depthwise forward and backward_weights by windows (:mod:`._window`), per element: the
#: einsum (per output value and tap, on all CPUs) and the padded copy of the input (per input
#: value). Fitted on MobileNetV2's 3x3 layers (stride 2 on 96 channels, stride 1 on 144) and
#: ConvNeXt-T's 7x7, batch 8, as ratios to the grid on the same host (2-CPU AMD EPYC, OpenBLAS
#: on its AVX-512 kernels: grid/window 2.4, 0.92, 1.39 forward; 1.68, 1.20, 0.87 for the
#: weights) applied to the grid's estimates, whose constants came from a host running AVX2
#: kernels: the choice follows the measured order on 5 of the 6.
WINDOW_TAP_S = 0.06e-9
WINDOW_GRAD_TAP_S = 0.1e-9
WINDOW_COPY_S = 0.34e-9
#: a strided depthwise backward_data by windows, phase by phase and tap by tap (per value of
#: ``b`` and tap: a multiply and an add of runs of a line's positions and channels), fitted
#: the same way on MobileNetV2's 3x3 stride-2 layer (96 channels, 8x112x112) and
#: EfficientNet-B0's 5x5 stride-2 (144 channels, 8x56x56), 2-CPU AMD EPYC, AVX2 kernels: the
#: grid took 1.4-2.2x the windows' time there (28-35 against 16-18 ms, 14-21 against 14)
WINDOW_BD_TAP_S = 0.15e-9
#: ... offered where a line of ``b`` (positions and channels, the run each tap multiplies)
#: holds this many values: on the benchmark suite's depthwise ConvTranspose (8x32x32x64 to
#: 64x64, 2048 values a line) the taps' sums ran 1.5-1.7x slower than the grid
WINDOW_BD_MIN_RUN = 4096


#: depthwise on channels-first data by planes (:mod:`._planes`), per element: each tap's
#: multiply-add (or the weight gradient's dot) per value of ``b``, on all CPUs; and the phase
#: split or interleave per value of ``a``. Fitted on CenterNet's k4 s2 and k8 s4 layers and a
#: Conformer's 1-D k31 (every primitive; 2-CPU AMD EPYC): within 1.5x of their 6-25 ms. The
#: grid's estimate is further off on channels-first depthwise layers (its einsums over
#: channels-last copies: 2x faster than estimated on the Conformer's k31, 1.8x slower on
#: CenterNet's), so the two are left to the measurement wherever they are near
PLANES_TAP_S = 0.55e-9
PLANES_MOVE_S = 0.4e-9


def _depthwise(z: _Sizes) -> dict[str, float]:
    """One channel per group, forward and backward_weights: the grid (phase split, then one
    einsum per phase over a strided view of its taps) against the exact path (per tap, a
    product with the window of ``a`` read in place): the grid wins with many taps or few
    channels, the exact path with a strided 3x3 kernel on wide channels, where the split is
    the larger part."""
    gather = z.item * (z.ma * z.ca * DW_SPLIT_S + z.rows * z.t * z.cb * DW_GRID_TAP_S)
    exact = z.item * (z.mb * z.t * z.cb * DW_EXACT_TAP_S + z.mb * z.t * DW_EXACT_RUN_S)
    return {"gather": gather, "exact": exact}


def costs(primitive: str, plan: ConvPlan) -> dict[str, float]:
    """The cost model's estimate, in seconds, of each strategy of a primitive on a plan."""
    return dict(_costs(primitive, plan))
