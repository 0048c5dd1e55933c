"""The numpy backend's strategies, each forced, over the whole grid.

The backend's records (``polyconv_numpy.STRATEGIES``) are chosen per plan by the core chooser:
the cheapest by the cost model, unless one is forced (:func:`polyconv.implementation`); non-finite
inputs take the exact path (in-range windows only) unless the choice is exact on them. The
shared matrix exercises the default choice; here every strategy of every primitive runs the
same grid against the oracle, and NaN/Inf must come out of the exact and overlap strategies
alike.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from oracle import assert_within_bound, numpy_dtype, reference
from test_matrix import GRID, check_case

import polyconv
from polyconv.benchmarks.suite import CASES

polyconv_numpy = pytest.importorskip("polyconv_numpy")


def _forcing(spec: str | None = None, **per_primitive: str):
    """:func:`polyconv.implementation` for numpy strategies: ``spec`` items and
    ``primitive=name`` keywords, each for the numpy backend only."""
    items = [f"numpy:{item.strip()}" for item in (spec or "").split(",") if item.strip()]
    items += [f"numpy:{p}={n}" for p, n in per_primitive.items()]
    return polyconv.implementation(",".join(items))


def _choose(primitive: str, plan) -> str:
    """The strategy a call of ``primitive`` on ``plan`` takes (measuring aside)."""
    return polyconv_numpy.CHOOSER.choose(primitive, plan)


#: every strategy of every primitive appears in one of these
FORCED = {
    "exact": "exact",
    "gather": "gather",
    "matmul_overlap_add": "backward_data=matmul_overlap_add",
    # depthwise channels-last plans; elsewhere the default pick (as for each below)
    "window": "window",
    # strided backward_data whose phases fill one window (k2 s2, k4 s2)
    "subpixel": "subpixel",
    # depthwise channels-first plans
    "planes": "planes",
    # windows that do not overlap (kernel = stride, no dilation or padding before)
    "patches": "patches",
    # blocks of s positions as rows (forward and backward_weights, ungrouped and undilated)
    "space_to_depth": "space_to_depth",
    # columns per image (forward and backward_weights, channels-first data, not depthwise)
    "im2col": "im2col",
    # the whole im2col one gather through a per-plan index (small plans: every grid case)
    "indexed": "indexed",
}
#: each strategy's internal layouts: the default choice by channel count, or channels-last
#: throughout (the grid's channel counts are small, which the default runs channels-first);
#: and the default with every loop that can be split over threads split over three, however
#: few its rows (the grid's are too few to be split by default)
LAYOUTS = ("default", "channels-last", "threads")


@pytest.fixture(params=[(f, lay) for f in sorted(FORCED) for lay in LAYOUTS
                        if f not in ("exact", "window", "planes", "im2col")
                        or lay != "channels-last"],
                ids=lambda p: "-".join(p))
def forced(request, monkeypatch):
    name, layout = request.param
    if layout == "channels-last":
        from polyconv_numpy import _fast, _overlap

        monkeypatch.setattr(_fast, "_CHANNELS_FIRST_MAX", 0)
        monkeypatch.setattr(_fast, "_CHANNELS_FIRST_DATA", False)
        monkeypatch.setattr(_overlap, "CHANNELS_FIRST_BELOW", 0)
    if layout == "threads":
        _split_everything(monkeypatch)
    with _forcing(FORCED[name]):
        yield name


def _split_everything(monkeypatch, threads: int = 3) -> None:
    from polyconv_numpy import _common

    monkeypatch.setattr(_common, "threads", lambda: threads)
    monkeypatch.setattr(_common, "_MIN_ROWS_PER_THREAD", 1)
    monkeypatch.setattr(_common, "_MIN_BLAS_ROWS_PER_THREAD", 1)
    monkeypatch.setattr(_common.BLAS, "threads", lambda: threads)
    monkeypatch.setattr(_common, "SPLIT_MIN_ROW", 1)
    from polyconv_numpy import _depthwise, _im2col, _planes, _subpixel, _window

    monkeypatch.setattr(_depthwise, "SPLIT_MIN_VALUES", 0)
    monkeypatch.setattr(_planes, "SPLIT_MIN_VALUES", 0)
    monkeypatch.setattr(_planes, "_BLOCK_BYTES", 1)         # a block per plane
    monkeypatch.setattr(_window, "_BLOCK_BYTES", 1)         # a block per output line
    monkeypatch.setattr(_window, "_TAP_BLOCK_BYTES", 1)
    monkeypatch.setattr(_window, "_TAP_SPLIT_MIN_VALUES", 0)
    monkeypatch.setattr(_subpixel, "_BLOCK_BYTES", 1)       # a block per line
    monkeypatch.setattr(_subpixel, "_SPLIT_BYTES", 1)
    monkeypatch.setattr(_im2col, "_BLOCK_BYTES", 1)         # a block per output line
    monkeypatch.setattr(_im2col, "_MIN_POSITIONS", 1)
    # the changes of layout by tiles of one row and 2 columns, every tile a thread's
    monkeypatch.setattr(_common, "_TILE_COLUMNS", 2)
    monkeypatch.setattr(_common, "_TILE_VALUES", 1)
    monkeypatch.setattr(_common, "_TILE_MIN_ROWS", 1)
    monkeypatch.setattr(_common, "_TRANSPOSE_SPLIT_BYTES", 1)


@pytest.mark.parametrize("shape", [(3, 200, 300), (1, 31, 5), (2, 64, 256), (2, 40, 1000),
                                   (0, 4, 4)])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("split", [False, True])
def test_transpose_by_tiles_is_the_transpose(shape, dtype, split, monkeypatch):
    """The tiled change of layout (tiles cut inside rows and columns, on threads or not),
    cast to the destination's dtype: numpy's own transpose and cast, exactly."""
    from polyconv_numpy import _common

    if split:
        _split_everything(monkeypatch)
    src = np.random.default_rng(5).standard_normal(shape).astype(np.float32)
    dst = np.full((shape[0], shape[2], shape[1]), np.nan, dtype=numpy_dtype(dtype))
    _common.transpose(dst, src)
    np.testing.assert_array_equal(dst, np.swapaxes(src, 1, 2).astype(dst.dtype))


@pytest.fixture
def numpy_target():
    from conftest import TARGETS

    return next(t for t in TARGETS if t.name == "numpy")


@pytest.mark.parametrize("case", GRID, ids=lambda c: c.label)
def test_forced_strategy_grid(forced, numpy_target, case):
    check_case(numpy_target, case)


def test_exact_path_by_attribute(monkeypatch, numpy_target):
    monkeypatch.setattr(polyconv_numpy.BACKEND, "fast", False)
    for case in GRID[:40]:
        check_case(numpy_target, case)


# --------------------------------------------------------------------------------------------
# the forcing knob
# --------------------------------------------------------------------------------------------

PLAN = polyconv.infer_shape("conv_transpose", (2, 8, 8, 16), (4, 4, 3, 16), strides=2,
                            pads_begin=1, pads_end=1)


def test_strategy_context_and_environment(monkeypatch):
    choose = _choose
    default = {p: choose(p, PLAN) for p in ("forward", "backward_data", "backward_weights")}
    with _forcing("matmul_overlap_add"):    # a name forces each primitive that has it
        assert choose("backward_data", PLAN) == "matmul_overlap_add"
        assert choose("forward", PLAN) == default["forward"]
        assert choose("backward_weights", PLAN) == default["backward_weights"]
        with _forcing(backward_weights="exact", forward="exact"):
            assert choose("backward_weights", PLAN) == choose("forward", PLAN) == "exact"
            assert choose("backward_data", PLAN) == "matmul_overlap_add"
        assert choose("forward", PLAN) == default["forward"]
    assert {p: choose(p, PLAN) for p in default} == default
    # the last item that names a primitive wins
    monkeypatch.setenv("POLYCONV_IMPLEMENTATION", "numpy:exact, numpy:backward_data=gather")
    assert choose("backward_data", PLAN) == "gather"
    assert choose("forward", PLAN) == choose("backward_weights", PLAN) == "exact"
    with _forcing(backward_data="matmul_overlap_add"):       # the context replaces the environment
        assert choose("backward_data", PLAN) == "matmul_overlap_add"
        assert choose("forward", PLAN) == default["forward"]


def test_a_forced_strategy_that_does_not_apply_leaves_the_default_pick():
    # windows need one channel per group on channels-last data: PLAN is dense
    assert not polyconv_numpy.CHOOSER.get("forward", "window").applies(PLAN)
    with _forcing("window"):
        assert _choose("forward", PLAN) == polyconv_numpy.CHOOSER.default("forward", PLAN)


@pytest.mark.parametrize("spec,kw,match", [
    ("col2im", {}, "no implementation 'numpy:col2im'"),
    (None, {"forward": "subpixel"}, "no implementation 'numpy:forward=subpixel'"),
    (None, {"sideways": "gather"}, "unknown primitive 'sideways'")])
def test_unknown_strategy_is_refused(spec, kw, match):
    with pytest.raises(ValueError, match=match), _forcing(spec, **kw):
        pass


def test_an_unknown_strategy_in_the_environment_names_the_variable(monkeypatch):
    # on every call (another thread may set it meanwhile), naming the variable and the names
    monkeypatch.setenv("POLYCONV_IMPLEMENTATION", "numpy:col2im")
    x, w = np.ones((1, 6, 6, 2), np.float32), np.ones((3, 3, 2, 2), np.float32)
    for _ in range(2):
        with pytest.raises(ValueError, match=r"POLYCONV_IMPLEMENTATION: .*'numpy:col2im'.*"
                                             r"numpy forward: gather, exact"):
            polyconv.convolution(x, w, weights_format="XIO")


def test_cost_model_prefers_overlap_for_a_narrow_written_side():
    # the case: DCGAN's last layer, 64 -> 3 channels (its crossover is measured on
    # docs/benchmarks.md); and the plain wide layer keeps gathering
    narrow = polyconv.infer_shape("conv_transpose", (16, 32, 32, 64), (4, 4, 3, 64), strides=2,
                                  pads_begin=1, pads_end=1).with_(dtype="float32")
    wide = polyconv.infer_shape("conv_transpose", (8, 16, 16, 16), (3, 3, 128, 16),
                                strides=2).with_(dtype="float32")
    assert _choose("backward_data", narrow) == "matmul_overlap_add"
    assert _choose("backward_data", wide) == "gather"
    # what the model offers: the grid everywhere; the exact path's per-tap products where
    # both sides have 16 channels or more (the wide layer's 128 and 16, not the narrow one's
    # 3) and, for forward and backward_data, it reads the data in place (channels-last
    # float32); backward_data's product-then-add, and the sub-pixel product where its phases fill
    # one window (k4 s2); the blocks of s positions for forward and the weight gradient where
    # a block holds 64 values or more (the wide layer's 2x2x128, not the narrow one's 2x2x3)
    offered = {
        (narrow, "forward"): {"gather"},
        (narrow, "backward_data"): {"gather", "matmul_overlap_add", "subpixel"},
        (narrow, "backward_weights"): {"gather"},
        (wide, "forward"): {"gather", "exact", "space_to_depth"},
        (wide, "backward_data"): {"gather", "matmul_overlap_add", "exact"},
        (wide, "backward_weights"): {"gather", "exact", "space_to_depth"},
    }
    for (plan, prim), names in offered.items():
        costs = polyconv_numpy.costs(prim, plan)
        assert set(costs) == names, (prim, plan.a_channels)
        assert all(c > 0 for c in costs.values())


@pytest.mark.parametrize("multiplier", [1, 2])
def test_cost_model_prices_a_strided_depthwise_backward_data_as_tap_sums(multiplier):
    # CenterNet's DLA-34 up-sampling (a depthwise k4 s2 ConvTranspose), channels-last: tap
    # sums per phase, by windows (1.6x faster than the grid's: lines of 64x64 values) or, with
    # a channel multiplier (the ConvTranspose's input has the multiplied channels: no
    # windows), on the grid; 3x faster than the sub-pixel product of one channel per group,
    # which is not offered. The benchmark suite's 8x32x32x64 depthwise ConvTranspose (lines
    # of 2048 values, where the windows' taps ran 1.5x slower) keeps the grid
    plan = polyconv.infer_shape("conv_transpose", (8, 64, 64, 64 * multiplier),
                                (4, 4, 1, 64 * multiplier), strides=2, pads_begin=1,
                                pads_end=1, groups=64, weights_format="XOI")
    costs = polyconv_numpy.costs("backward_data", plan)
    assert "subpixel" not in costs
    assert _choose("backward_data", plan) == (
        "window" if multiplier == 1 else "gather")
    suite = polyconv.infer_shape("conv_transpose", (8, 32, 32, 64), (3, 3, 1, 64), strides=2,
                                 pads_begin=1, pads_end=1, output_padding=1, groups=64,
                                 weights_format="XOI")
    assert "window" not in polyconv_numpy.costs("backward_data", suite)


def test_cost_model_takes_the_exact_weight_gradient_for_small_images_of_wide_channels():
    # DCGAN's 512->256 layer on 4x4 images: the grid's phase cells add 56% rows to a product
    # of 4096 columns, the exact path's per-tap products are as long as the data; on 8x8
    # images (256->128) the same, less so (docs/records/implementations-avx512.json: 7.0
    # against 13.3 ms and 5.8 against 8.2); a 3x3 ResNet layer, whose phase grid adds no
    # rows, keeps the grid (7.0 against 11.8 ms)
    def plan(src, wts, **attrs):
        return polyconv.infer_shape("conv_transpose", src, wts, **attrs).with_(dtype="float32")

    small = plan((16, 4, 4, 512), (4, 4, 256, 512), strides=2, pads_begin=1, pads_end=1)
    larger = plan((16, 8, 8, 256), (4, 4, 128, 256), strides=2, pads_begin=1, pads_end=1)
    resnet = polyconv.infer_shape("convolution", (4, 56, 56, 64), (3, 3, 64, 64), pads_begin=1,
                                  pads_end=1).with_(dtype="float32")
    assert _choose("backward_weights", small) == _choose("backward_weights", larger) == "exact"
    assert _choose("backward_weights", resnet) != "exact"


def test_cost_model_takes_the_exact_path_where_blas_splits_its_products():
    # the exact path's weight gradient is one [Cb, Ca] product a tap over every position:
    # BLAS splits its output between the cores, so ResNet-50's 1x1 s2 256->512 downsample
    # (512x256 outputs) and DeepLabV3's ASPP backward_data (2048-wide products) run it at
    # full speed, the fastest by 1.7-2.5x in each of three runs of
    # docs/records/implementations-avx512.json's benchmark; ResNet-50's 3x3 64->64 weight
    # gradient (64x64 outputs, on one core) keeps the grid, 1.1-2.0x faster
    def plan(op, src, wts, **attrs):
        return polyconv.infer_shape(op, src, wts, **attrs).with_(dtype="float32")

    downsample = plan("convolution", (4, 56, 56, 256), (1, 1, 256, 512), strides=2)
    aspp = plan("convolution", (1, 33, 33, 2048), (3, 3, 2048, 256), pads_begin=12,
                pads_end=12, dilations=12)
    resnet = plan("convolution", (4, 56, 56, 64), (3, 3, 64, 64), pads_begin=1, pads_end=1)
    assert _choose("backward_weights", downsample) == "exact"
    assert _choose("backward_data", aspp) == "exact"
    assert _choose("backward_weights", resnet) != "exact"


def test_cost_model_prices_the_grids_depthwise_sums_on_channels_first_data():
    # the Conformer's depthwise k31 on channels-first data: the grid's depthwise sums, not
    # its dense gathers (docs/records/implementations-avx512.json: 3.8 ms against 14.0 by
    # planes; the dense formula had priced the grid at 25)
    from polyconv.benchmarks.corpus_layers import LAYERS

    (layer,) = [ly for ly in LAYERS if ly.title.startswith("Conformer: depthwise")]
    plan = layer.plan.with_(primitive="forward", dtype="float32")
    assert not plan.channels_last and plan.groups == plan.a_channels
    assert _choose("forward", plan) == "gather"


def test_cost_model_prices_the_grids_channels_first_backward_data_gathers_as_runs_of_rows():
    # ResNeXt-50's grouped 3x3 (4 channels a group, channels-last): the grid accumulates
    # channels-first, gathering runs of rows and changing the layout both ways
    # (docs/records/implementations-avx512.json: 16.5 ms against 19.4 by
    # matmul_overlap_add; priced as runs of 4 channels without the changes of layout, the grid
    # had been estimated at 26)
    from polyconv.benchmarks.corpus_layers import LAYERS

    (layer,) = [ly for ly in LAYERS if ly.title.startswith("ResNeXt-50: grouped")]
    plan = layer.plan.with_(primitive="backward_data", dtype="float32")
    assert plan.channels_last and plan.a_channels // plan.groups == 4
    assert _choose("backward_data", plan) == "gather"


def test_cost_model_counts_the_grids_numpy_calls_by_its_own_blocks():
    # nnU-Net's 3x3x3 32->32 on 32x64x64, channels-first: the grid's blocks grow to 8 MiB
    # (62 of them), where its calls had been counted in 1 MiB blocks (about 490: 41 ms of
    # calls, the grid priced above matmul_overlap_add, which took 1.7x the grid's 76-80 ms;
    # docs/records/implementations-avx512.json)
    from polyconv.benchmarks.corpus_layers import LAYERS

    (layer,) = [ly for ly in LAYERS if ly.title.startswith("nnU-Net 3-D: Conv3d 32->32")]
    plan = layer.plan.with_(primitive="backward_data", dtype="float32")
    assert _choose("backward_data", plan) == "gather"


@pytest.mark.parametrize("layout", ["NXC", "NCX"])
def test_depthwise_choice_and_memory(layout):
    # one channel per group: no product left. forward sums the taps' blocks of grid rows
    # (contiguous, in cache); backward_weights reads the exact path's per-tap windows in place
    # where it can (channels-last, the accumulation dtype: temporaries within the memory
    # bound), skipping the grid's phase split
    import dataclasses

    src = (8, 56, 56, 32) if layout == "NXC" else (8, 32, 56, 56)
    plan = dataclasses.replace(
        polyconv.infer_shape("convolution", src, (3, 3, 1, 32) if layout == "NXC" else
                             (32, 1, 3, 3), groups=32, pads_begin=1, pads_end=1,
                             data_format=layout, weights_format="XIO" if layout == "NXC"
                             else "OIX"), dtype="float32")
    # a strided 3x3 kernel on wide channels, where the grid's phase split costs the most, and
    # a 7x7 kernel (49 taps amortize it)
    wide = dataclasses.replace(polyconv.infer_shape(
        "convolution", (8, 112, 112, 96), (3, 3, 1, 96), strides=2, groups=96, pads_begin=1,
        pads_end=1, weights_format="XIO"), dtype="float32")
    big = dataclasses.replace(polyconv.infer_shape(
        "convolution", (8, 56, 56, 96), (7, 7, 1, 96), groups=96, pads_begin=3, pads_end=3,
        weights_format="XIO"), dtype="float32")
    # blocks of output lines over padded copies of what they read (no phase split at all):
    # the strided 3x3 forward 2.4x faster than the grid and 4x than the exact path, its
    # weight gradient 1.7x; the 7x7 forward 1.4x, but its weight gradient keeps the grid
    assert _choose("forward", wide) == "window"
    assert _choose("backward_weights", wide) == "window"
    assert _choose("forward", big) == "window"
    assert _choose("backward_weights", big) == "gather"
    if layout == "NCX":       # by planes, in place: no change of layout (1.0-1.3x the grid's)
        assert _choose("forward", plan) == "planes"
    import tracemalloc

    rng = np.random.default_rng(0)
    x = rng.standard_normal(plan.a_shape).astype(np.float32)
    w = rng.standard_normal(plan.weights_shape).astype(np.float32)
    tracemalloc.start()
    try:
        y = polyconv.convolution(x, w, groups=32, pads_begin=1, pads_end=1, data_format=layout,
                                 weights_format="XIO" if layout == "NXC" else "OIX")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 2 * (x.nbytes + w.nbytes + y.nbytes)


# --------------------------------------------------------------------------------------------
# NaN and Inf
# --------------------------------------------------------------------------------------------

def _poisoned(rng, shape, where, value):
    x = rng.standard_normal(shape).astype(np.float32)
    x[tuple(min(i, n - 1) for i, n in zip(where, shape))] = value
    return x


NONFINITE = [  # (op, src shape, weights shape, attrs, which input is poisoned)
    ("conv_transpose", (2, 5, 6, 4), (4, 4, 3, 4), dict(strides=2, pads_begin=1, pads_end=2,
                                                        output_padding=1), "weights"),
    ("conv_transpose", (2, 5, 6, 4), (3, 3, 2, 4), dict(strides=(2, 3), pads_begin=(1, 0),
                                                        pads_end=(0, 2)), "src"),
    ("convolution", (2, 9, 8, 4), (3, 3, 4, 5), dict(strides=2, pads_begin=1, pads_end=1),
     "weights"),
    ("convolution", (2, 9, 8, 4), (3, 3, 4, 5), dict(strides=(2, 1), pads_begin=(1, 2),
                                                     pads_end=0), "src"),
    ("conv_transpose", (1, 6, 3, 2), (2, 2, 3, 2), dict(strides=2, data_format="NXC"),
     "weights"),
    # depthwise (the windows' plans, every primitive)
    ("convolution", (2, 9, 8, 4), (3, 3, 1, 4), dict(strides=2, pads_begin=1, pads_end=1,
                                                     groups=4), "weights"),
    ("convolution", (2, 9, 8, 4), (3, 3, 1, 4), dict(pads_begin=1, pads_end=1, groups=4),
     "src"),
    ("conv_transpose", (2, 5, 6, 4), (3, 3, 1, 4), dict(pads_begin=1, pads_end=0, groups=4),
     "weights"),
]


@pytest.mark.parametrize("value", [np.inf, np.nan])
@pytest.mark.parametrize("op,src,wts,attrs,poison", NONFINITE)
@pytest.mark.parametrize("name", ["default", "gather", "matmul_overlap_add", "window", "subpixel",
                                  "planes", "patches", "space_to_depth", "im2col"])
def test_nonfinite_inputs_propagate_exactly(name, op, src, wts, attrs, poison, value):
    # the exact path's result is the reference: padded positions add no term, so an inf in
    # the weights poisons only the outputs whose in-range sum meets it (the grid would give
    # 0 * inf = nan at padded ones). A gather strategy hands such calls to the exact path;
    # overlap adds in-range products only and computes them itself. (Non-finite data meets
    # only finite weights on the grid, its padding zeros too: forward and backward_data keep
    # the grid then.)
    rng = np.random.default_rng(3)
    x = rng.standard_normal(src).astype(np.float32)
    w = rng.standard_normal(wts).astype(np.float32)
    if poison == "weights":
        w = _poisoned(rng, wts, (1, 2, 0, 1), value)
        w[(0, 0, 1, 0) if wts[2] > 1 else (0, 1, 0, 2)] = -value
    else:
        x = _poisoned(rng, src, (1, 2, 3, 1), value)
    fn = getattr(polyconv, op)
    with _forcing("exact"):
        ref = fn(x, w, **attrs)
    if name == "default":
        y = fn(x, w, **attrs)
    else:
        with _forcing(name):
            y = fn(x, w, **attrs)
    assert not np.isfinite(ref).all() and np.isfinite(ref).any()
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    np.testing.assert_array_equal(np.isposinf(y), np.isposinf(ref))
    np.testing.assert_array_equal(np.isneginf(y), np.isneginf(ref))
    finite = np.isfinite(ref)
    np.testing.assert_allclose(y[finite], ref[finite], rtol=1e-5, atol=1e-5)
    if name == "gather" and poison == "weights":    # routed to the exact path: the same
        np.testing.assert_array_equal(y, ref)                            # numbers


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_finiteness_check_finds_any_nonfinite_value(dtype, value):
    from polyconv_numpy._measuring import finite as _finite

    x = np.random.default_rng(8).standard_normal((3, 7, 5)).astype(numpy_dtype(dtype))
    assert _finite(x, x[:0])
    for where in ((0, 0, 0), (1, 3, 2), (2, 6, 4)):
        y = x.copy()
        y[where] = value
        assert not _finite(x, y) and not _finite(y)


@pytest.mark.parametrize("op", ["convolution", "conv_transpose"])
def test_nonfinite_input_takes_the_exact_path(op):
    # an inf in the data (not in the weights): the fast path is exact here too, and both
    # must give inf exactly where the poisoned element is read and finite values elsewhere
    x = np.ones((1, 6, 2), np.float32)
    x[0, 2, 0] = np.inf
    w = np.ones((3, 2, 2), np.float32)
    fn = getattr(polyconv, op)
    y = fn(x, w, strides=2, pads_begin=1, pads_end=1)
    polyconv_numpy.BACKEND.fast = False
    try:
        y_exact = fn(x, w, strides=2, pads_begin=1, pads_end=1)
    finally:
        polyconv_numpy.BACKEND.fast = True
    np.testing.assert_array_equal(y, y_exact)
    assert np.isinf(y).any() and np.isfinite(y).any()


@pytest.mark.parametrize("strategy", ["default", "measured", "gather", "matmul_overlap_add",
                                      "window", "subpixel", "planes", "patches", "space_to_depth",
                                      "im2col"])
@pytest.mark.parametrize("case", [c for c in CASES if "1D" not in c.name],
                         ids=lambda c: c.name)
def test_peak_memory_at_most_twice_inputs_and_output(monkeypatch, case, strategy):
    # issue 6's bound on the benchmark cases, for the default choice, a first call that
    # measures its candidates (each result dropped before the next runs), and each strategy
    # forced: no im2col of the whole input, no full-size float32 copies of 2-byte tensors
    # (tracemalloc sees every numpy buffer: a count, not a timing)
    import tracemalloc

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(numpy_dtype(case.dtype)) for s in case.shapes]
    fn = getattr(polyconv, case.op)
    spec = None if strategy in ("default", "measured") else FORCED[strategy]
    polyconv_numpy.CHOOSER.forget()
    with _forcing(spec), polyconv.autotune(strategy == "measured"):
        tracemalloc.start()
        try:
            y = fn(*arrays, *case.extra, **case.attrs)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak <= 2 * (sum(a.nbytes for a in arrays) + y.nbytes)


@pytest.mark.parametrize("multiplier", [1, 2, 3])
@pytest.mark.parametrize("op", ["convolution", "conv_transpose"])
@pytest.mark.parametrize(("channels", "spatial", "strides"), [
    (96, (30, 29), 1), (5, (29, 31), 1), (7, (23, 26), 2), (96, (17, 9), (2, 1))])
def test_depthwise_tap_sums_match_the_oracle(op, channels, spatial, strides, multiplier):
    # one channel per group on the grid: blocks of rows whose count is not a multiple of the
    # tiled weights' rows, so both loops of the tap sum run (tiled and the remainder); with a
    # channel multiplier, one tap sum per output of a group (forward), or their sum (the
    # ConvTranspose's backward_data, whose input has the multiplied channels)
    rng = np.random.default_rng(5)
    cin = channels * multiplier if op == "conv_transpose" else channels
    x = rng.standard_normal((2, *spatial, cin)).astype(np.float32)
    w = rng.standard_normal((3, 3, 1, channels * multiplier)).astype(np.float32)
    attrs = dict(strides=strides, pads_begin=(1, 0), pads_end=(0, 1), groups=channels)
    if op == "conv_transpose":
        attrs["weights_format"] = "XOI"
    with _forcing(forward="gather", backward_data="gather"):
        y = getattr(polyconv, op)(x, w, **attrs)
    ref = reference(op, x, w, **attrs)
    assert y.shape == ref.shape
    assert_within_bound(y, ref.y, ref.abs_sum, ref.n, "float32")


@pytest.mark.parametrize(("offsets", "views"), [
    ((10, 9, 4, 3), 1),     # a 2x2 grid of offsets (steps -6 and -1): one strided view
    ((10, 9, 4, 2), 4),     # not a grid: one view per tap
])
def test_depthwise_taps_of_one_array_are_read_as_one_view_when_regular(offsets, views):
    from polyconv_numpy import _depthwise

    rng = np.random.default_rng(7)
    src = rng.standard_normal((40, 5)).astype(np.float32)
    w = rng.standard_normal((4, 5)).astype(np.float32)
    b = rng.standard_normal((20, 5)).astype(np.float32)
    taps = _depthwise.groups([(src, o) for o in offsets], [(0, 0), (0, 1), (1, 0), (1, 1)], w)
    assert len(taps) == views
    out = np.empty((20, 5), np.float32)
    _depthwise.tap_sum(out, taps)
    windows = np.stack([src[o: o + 20] for o in offsets]).astype(np.float64)   # [T, 20, 5]
    np.testing.assert_allclose(out, np.einsum("tjc,tc->jc", windows, w), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_depthwise.tap_weights(b, taps),
                               np.einsum("tjc,jc->tc", windows, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("multiplier", [1, 2, 3])
def test_depthwise_weight_sums_split_over_threads_match_the_oracle(monkeypatch, threads,
                                                                   multiplier):
    """The depthwise weight gradient sums ranges of rows in parallel (one per thread, at any
    split) and still meets the accuracy bound against the float64 oracle."""
    from polyconv_numpy import _common

    monkeypatch.setattr(_common, "threads", lambda: threads)
    monkeypatch.setattr(_common, "_MIN_ROWS_PER_THREAD", 1)
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 13, 11, 6)).astype(np.float32)
    dy = rng.standard_normal((2, 13, 11, 6 * multiplier)).astype(np.float32)
    attrs = dict(pads_begin=1, pads_end=1, groups=6)
    with _forcing(backward_weights="gather"):
        dw = polyconv.convolution_backward_weights(x, dy, (3, 3, 1, 6 * multiplier), **attrs)
    ref = reference("convolution_backward_weights", x, dy, weights_shape=(3, 3, 1, 6 * multiplier),
                    **attrs)
    assert_within_bound(dw, ref.y, ref.abs_sum, ref.n, "float32")


def test_split_rows_covers_every_row_once(monkeypatch):
    from polyconv_numpy import _common

    monkeypatch.setattr(_common, "threads", lambda: 3)
    monkeypatch.setattr(_common, "_MIN_ROWS_PER_THREAD", 1)
    ranges = _common.split_rows(10, lambda lo, hi: (lo, hi))
    assert ranges == [(0, 3), (3, 6), (6, 10)]
    monkeypatch.setattr(_common, "_MIN_ROWS_PER_THREAD", 8)
    assert _common.split_rows(10, lambda lo, hi: (lo, hi)) == [(0, 10)]


def test_split_rows_holds_blas_at_one_thread_and_restores_it(monkeypatch):
    """A loop of matrix products split over threads runs with the BLAS at one thread, and
    the BLAS's own limit comes back afterwards, also when calls overlap."""
    import threading

    from polyconv_numpy import _common

    before = _common.BLAS.threads()
    if before is None:
        pytest.skip("no BLAS library that threadpoolctl can control")
    monkeypatch.setattr(_common, "threads", lambda: 2)
    monkeypatch.setattr(_common, "_MIN_BLAS_ROWS_PER_THREAD", 1)
    monkeypatch.setattr(_common.BLAS, "threads", lambda: 2)

    def real():         # the BLAS's current limit (threads() gives the configured one)
        return min(c.num_threads for c in _common.BLAS._controllers)

    inside = []
    barrier = threading.Barrier(2)

    def work(lo, hi):
        barrier.wait(timeout=10)        # both ranges inside at once
        inside.append(real())
        return hi - lo

    assert _common.split_rows(10, work, blas=True) == [5, 5]
    assert inside == [1, 1]
    assert real() == before
    # nested: an outer holder keeps the limit until it leaves
    with _common.BLAS.one_thread():
        barrier.reset()
        _common.split_rows(10, work, blas=True)
        assert real() == 1
    assert real() == before


def test_thread_count_from_the_environment(monkeypatch):
    from polyconv_numpy import _common

    _common.threads.cache_clear()
    try:
        monkeypatch.setenv("POLYCONV_NUMPY_THREADS", "3")
        assert _common.threads() == 3
        _common.threads.cache_clear()
        monkeypatch.setenv("POLYCONV_NUMPY_THREADS", "many")
        with pytest.raises(ValueError, match="POLYCONV_NUMPY_THREADS='many'"):
            _common.threads()
    finally:
        _common.threads.cache_clear()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", ["NCX", "NXC"])
@pytest.mark.parametrize("ic,oc,groups", [(6, 40, 1), (40, 6, 2)])
@pytest.mark.parametrize("geometry", [
    dict(strides=2),                                                       # every cell: one term
    dict(strides=3, pads_begin=1, pads_end=0, output_padding=2),           # gaps between taps
    dict(strides=(2, 3), pads_begin=(0, 1), pads_end=(1, 0), output_padding=(1, 0))])
def test_overlap_with_one_term_per_cell_matches_the_oracle(geometry, ic, oc, groups, layout,
                                                           dtype):
    """A kernel no larger than the stride gives each output cell at most one tap's product:
    ``matmul_overlap_add`` then copies each product (and the bias) into place instead of
    summing, and fills the cells no tap reaches with the bias; both internal layouts (the
    written side's channels decide), with and without gaps."""
    rng = np.random.default_rng(8)
    dt = numpy_dtype(dtype)
    src = (2, ic, 7, 5) if layout == "NCX" else (2, 7, 5, ic)
    x = rng.standard_normal(src).astype(dt)
    w = rng.standard_normal((ic, oc // groups, 2, 2)).astype(dt)
    bias = rng.standard_normal(oc).astype(dt)
    attrs = dict(geometry, groups=groups, data_format=layout, weights_format="IOX")
    with _forcing(backward_data="matmul_overlap_add"):
        y = polyconv.conv_transpose(x, w, bias, **attrs)
    ref = reference("conv_transpose", x, w, bias, **attrs)
    assert y.shape == ref.shape and y.dtype == dt
    assert_within_bound(y, ref.y, ref.abs_sum, ref.n, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize(("spatial", "kernel", "attrs"), [
    ((37, 29), (3, 3), dict(strides=2, pads_begin=1, pads_end=1)),
    ((30, 17), (7, 7), dict(strides=1, pads_begin=3, pads_end=3)),
    ((21, 18), (3, 3), dict(strides=1, pads_begin=(2, 0), pads_end=(1, 3), dilations=(2, 1))),
    ((6, 9, 11), (3, 2, 3), dict(strides=1, pads_begin=(1, 0, 2), pads_end=(0, 1, 1))),
    ((19, 23), (3, 2), dict(strides=(2, 3), pads_begin=(2, 0), pads_end=(0, 2), dilations=(2, 1))),
    ((41,), (5,), dict(strides=3, pads_begin=4, pads_end=0)),
    ((6, 9, 11), (3, 3, 3), dict(strides=(1, 2, 2), pads_begin=(1, 0, 1), pads_end=(1, 1, 0))),
    # a stride and a dilation on the last axis
    ((9, 31), (2, 3), dict(strides=(1, 2), pads_begin=(0, 4), pads_end=(1, 2),
                           dilations=(1, 3))),
])
@pytest.mark.parametrize(("block_bytes", "tile_values"), [(1, 1024), (4096, 12), (1 << 18, 1024)])
def test_depthwise_windows_match_the_oracle(dtype, spatial, kernel, attrs, block_bytes,
                                            tile_values, monkeypatch):
    # every primitive: the window strategy's blocks of output lines (one line, several, a
    # whole image), each over a zero-padded copy of the input lines it reads: first and last
    # blocks meet the padding, inner ones do not; split over threads; the last axis's
    # positions merged with the channels into runs of one or several tiles; a strided
    # backward_data phase by phase, each phase's taps summed one by one in the same blocks
    from polyconv_numpy import _window

    _split_everything(monkeypatch)
    monkeypatch.setattr(_window, "_BLOCK_BYTES", block_bytes)
    monkeypatch.setattr(_window, "_TAP_BLOCK_BYTES", block_bytes)
    # with 12 values a run, an unstrided last axis of 18 is cut into 6 tiles of 2 positions
    monkeypatch.setattr(_window, "_TILE_VALUES", tile_values)
    channels = 6
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, *spatial, channels)).astype(numpy_dtype(dtype))
    w = rng.standard_normal((*kernel, 1, channels)).astype(numpy_dtype(dtype))
    bias = rng.standard_normal(channels).astype(numpy_dtype(dtype))
    attrs = dict(attrs, groups=channels, data_format="NXC", weights_format="XIO")
    plan = polyconv.infer_shape("Convolution", x.shape, w.shape, **attrs).with_(dtype=dtype)
    assert _window.applies(plan, "forward")
    g = rng.standard_normal(plan.b_shape).astype(numpy_dtype(dtype))
    with _forcing("window"):
        y = polyconv.convolution(x, w, bias, **attrs)
        dw = polyconv.convolution_backward_weights(x, g, w.shape, **attrs)
        dx = polyconv.convolution_backward_data(g, w, x.shape, **attrs)
    checks = [(y, reference("convolution", x, w, bias, **attrs)),     # backward_data: per phase
              (dw, reference("convolution_backward_weights", x, g, weights_shape=w.shape,
                             **attrs))]
    checks.append((dx, reference("convolution_backward_data", g, w, dst_shape=x.shape,
                                 **attrs)))
    for got, ref in checks:
        assert got.shape == ref.y.shape and got.dtype == x.dtype
        assert_within_bound(got, ref.y, ref.abs_sum, ref.n, dtype)


def test_depthwise_windows_with_more_channels_than_a_tile(monkeypatch):
    # oneDNN's xception:conv4_1 (1536 channels > the 1024 values of a run) broke the choice
    # of the run; with 4 values a run, 6 channels are past it: runs of one position each
    from polyconv_numpy import _window

    monkeypatch.setattr(_window, "_TILE_VALUES", 4)
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((1, 5, 6, 6)), rng.standard_normal((3, 3, 1, 6))
    attrs = dict(groups=6, pads_begin=1, pads_end=1, data_format="NXC", weights_format="XIO")
    g = rng.standard_normal((1, 5, 6, 6))
    with _forcing("window"):
        got = [polyconv.convolution(x, w, **attrs),
               polyconv.convolution_backward_data(g, w, x.shape, **attrs),
               polyconv.convolution_backward_weights(x, g, w.shape, **attrs)]
    refs = [reference("convolution", x, w, **attrs),
            reference("convolution_backward_data", g, w, dst_shape=x.shape, **attrs),
            reference("convolution_backward_weights", x, g, weights_shape=w.shape, **attrs)]
    for y, ref in zip(got, refs):
        assert_within_bound(y, ref.y, ref.abs_sum, ref.n, "float64")


@pytest.mark.parametrize("op", ["convolution", "convolution_backward_weights"])
@pytest.mark.parametrize(("spatial", "kernel", "attrs"), [
    ((13, 11), (3, 3), dict(strides=1, pads_begin=1, pads_end=1)),
    ((15, 12), (3, 2), dict(strides=(2, 1), pads_begin=(1, 0), pads_end=(0, 1),
                            dilations=(1, 2))),
    ((37,), (5,), dict(strides=2, pads_begin=2, pads_end=1)),
    ((5, 7, 6), (3, 3, 3), dict(strides=(1, 2, 1), pads_begin=1, pads_end=(1, 0, 1))),
])
@pytest.mark.parametrize("block_bytes", [1, 1 << 15])
def test_channels_first_gather_by_blocks_matches_the_oracle(monkeypatch, op, spatial, kernel,
                                                            attrs, block_bytes):
    """Channels-last data with 4 channels per group (ResNeXt's layout) is gathered
    channels-first, its 64 channels transposed by blocks of lines (one line per block, and
    several): forward and backward_weights, which read it so, against the float64 oracle."""
    monkeypatch.setattr(polyconv_numpy._common, "_TRANSPOSE_BLOCK_BYTES", block_bytes)
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, *spatial, 64)).astype(np.float32)
    w = rng.standard_normal((*kernel, 4, 64)).astype(np.float32)
    attrs = dict(attrs, groups=16)
    with _forcing(forward="gather", backward_weights="gather"):
        if op == "convolution":
            y = polyconv.convolution(x, w, **attrs)
            ref = reference(op, x, w, **attrs)
        else:
            g = rng.standard_normal(polyconv.infer_shape("convolution", x.shape, w.shape,
                                                         **attrs).shape).astype(np.float32)
            y = polyconv.convolution_backward_weights(x, g, w.shape, **attrs)
            ref = reference(op, x, g, weights_shape=w.shape, **attrs)
    assert y.shape == ref.shape
    assert_within_bound(y, ref.y, ref.abs_sum, ref.n, "float32")


@pytest.mark.parametrize(("of", "row_bytes", "budget"), [
    (1000, 3456, 1 << 21),             # small: the base budget
    (131072, 3456, 1 << 23),           # nnU-Net's 3x3x3 32->32: up to the large budget
    (40000, 3456, 40000 * 3456 // 32),  # in between: a 32nd of everything gathered
])
@pytest.mark.parametrize("threads", [1, 2])
def test_gather_blocks_grow_with_the_problem_within_the_bound(of, row_bytes, budget, threads):
    """The gathered blocks cover their rows once, in order, and the threads' blocks together
    hold at most the budget: the base one, or a 32nd of the whole gather up to the large
    one (within the memory bound up to 64 taps)."""
    from polyconv_numpy import _fast

    share = of // threads
    for t in range(threads):
        lo, hi = t * share, (t + 1) * share if t < threads - 1 else of
        blocks = list(_fast._blocks(lo, hi, row_bytes, _fast._GROUPED_BLOCK_BYTES, of))
        assert blocks[0][0] == lo and blocks[-1][1] == hi
        assert all(a[1] == b[0] for a, b in itertools.pairwise(blocks))
        step = blocks[0][1] - blocks[0][0]
        assert step == max(256, budget * (hi - lo) // of // row_bytes)


@pytest.mark.parametrize(("batch", "rows", "row_bytes", "budget"), [
    (4, 16, 20_000, 1 << 21),            # small: the base budget, several images a block
    (1, 256, 1 << 20, 1 << 23),          # large: the large budget
    # FCN-8s's k16 s8 21->21 (a row of b: 64 positions x 256 taps x 21 channels): a 16th of
    # the whole product
    (1, 64, 64 * 256 * 21 * 4, 64 * 64 * 256 * 21 * 4 // 16),
])
def test_overlap_blocks_grow_with_the_product_within_the_bound(batch, rows, row_bytes,
                                                               budget):
    """The overlap path's product blocks cover every image's rows once, in order, each at
    most the budget (a block of one row at least): the base one, or a 16th of the whole
    product up to the large one; the cost model counts them as they are cut."""
    from polyconv_numpy import _overlap

    blocks = list(_overlap._blocks(batch, rows, row_bytes))
    covered = [(n, y) for n0, n1, y0, y1 in blocks for n in range(n0, n1) for y in range(y0, y1)]
    assert covered == [(n, y) for n in range(batch) for y in range(rows)]
    sizes = [(n1 - n0) * (y1 - y0) * row_bytes for n0, n1, y0, y1 in blocks]
    assert max(sizes) <= max(budget, row_bytes)
    if len(blocks) > 1:     # a block takes all the budget holds
        assert max(sizes) + min(row_bytes, rows * row_bytes) > budget
    assert _overlap.block_count(batch, rows, row_bytes) == len(blocks)


@pytest.mark.parametrize("layout", ["NCX", "NXC"])
def test_overlap_in_blocks_of_several_rows_matches_the_oracle(layout, monkeypatch):
    """A kernel twice the stride on few channels (FCN-8s's up-sampling, small): the product
    in blocks of several rows of ``b``, accumulated per phase (channels-first) or into the
    output, against the oracle."""
    from polyconv_numpy import _overlap

    monkeypatch.setattr(_overlap, "BLOCK_BYTES", 3 * 9 * 64 * 5 * 4)    # 3 rows of b
    rng = np.random.default_rng(12)
    src = (2, 5, 9, 9) if layout == "NCX" else (2, 9, 9, 5)
    x = rng.standard_normal(src).astype(np.float32)
    w = rng.standard_normal((5, 5, 8, 8)).astype(np.float32)
    attrs = dict(strides=4, pads_begin=2, pads_end=2, data_format=layout, weights_format="IOX")
    assert _overlap.block_count(2, 9, 9 * 64 * 5 * 4) == 6
    # a row of b: 9 positions x 64 taps x 5 channels written, float32
    plan = polyconv.infer_shape("conv_transpose", x.shape, w.shape, **attrs)
    assert _overlap.product_row_bytes(plan, 4) == 9 * 64 * 5 * 4
    assert _overlap.plan_blocks(plan, 4) == 6
    with _forcing(backward_data="matmul_overlap_add"):
        y = polyconv.conv_transpose(x, w, **attrs)
    ref = reference("conv_transpose", x, w, **attrs)
    assert_within_bound(y, ref.y, ref.abs_sum, ref.n, "float32")


@pytest.mark.parametrize(("wfmt", "groups", "src", "in_place"), [
    ("IOX", 1, (2, 40, 3, 4), True),       # 40 channels read > 12 positions: HiFi-GAN's case
    ("OIX", 2, (1, 48, 5), False),         # [Ca/G, Cb, K]: taps inner, Cb not outer: copied
    ("XOI", 1, (2, 40, 3, 4), True),       # taps outer: the tap-major product reads it
    ("IOX", 1, (2, 8, 6, 7), False),       # the product outweighs the weights
])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_channels_first_overlap_reads_the_weights_in_place(wfmt, groups, src, in_place,
                                                           dtype, monkeypatch):
    """Channels-first col2im takes IOX (and XOI) weights in place, as a read-only view,
    where they outweigh one image's product (IOX's taps then read at a stride in the
    product): the oracle's values either way, the user's weights neither copied then nor
    written."""
    from polyconv_numpy import _overlap

    seen = []
    real = _overlap.weights_matrix
    monkeypatch.setattr(_overlap, "weights_matrix",
                        lambda *args: seen.append(real(*args)) or seen[-1])
    rng = np.random.default_rng(5)
    nd, ci = len(src) - 2, src[1]
    kernel = (3,) * nd
    co_g = 6
    shape = {"IOX": (ci, co_g, *kernel), "OIX": (co_g, ci, *kernel),
             "XOI": (*kernel, co_g, ci)}[wfmt]
    x = rng.standard_normal(src).astype(dtype)
    w = rng.standard_normal(shape).astype(dtype)
    w.flags.writeable = False
    kept = w.copy()
    attrs = dict(strides=2, pads_begin=1, pads_end=0, output_padding=1, groups=groups,
                 data_format="NCX", weights_format=wfmt)
    with _forcing(backward_data="matmul_overlap_add"):
        y = polyconv.conv_transpose(x, w, **attrs)
    ref = reference("conv_transpose", x, w, **attrs)
    assert_within_bound(y, ref.y, ref.abs_sum, ref.n, dtype)
    np.testing.assert_array_equal(w, kept)
    assert len(seen) == 1
    assert np.shares_memory(seen[0], w) == (in_place and dtype == "float32")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_canonical_weights_never_hand_out_the_users_array_writable(dtype):
    """The kernels' weights: a read-only view of the user's array where no cast or copy is
    needed (nothing a kernel does can change them), else a copy of its own."""
    from polyconv_numpy._common import canonical_weights

    w = np.arange(4 * 6 * 3, dtype=dtype).reshape(4, 6, 3)
    plan = polyconv.infer_shape("conv_transpose", (1, 4, 5), w.shape, data_format="NCX",
                                weights_format="IOX")
    wc = canonical_weights(w, plan, np.dtype(np.float32))
    np.testing.assert_array_equal(wc, w.astype(np.float32))
    assert np.shares_memory(wc, w) == (dtype == "float32")
    assert wc.flags.writeable == (dtype != "float32")
    assert w.flags.writeable


@pytest.mark.parametrize(("op", "spatial", "kernel", "channels", "groups", "expect"), [
    ("convolution_backward_data", (9, 7), (3, 3), (24, 16), 1, True),     # 24 > 8 channels
    ("conv_transpose", (5, 4, 6), (3, 2, 3), (16, 64), 1, True),          # 64: the bound
    ("convolution_backward_data", (11,), (5,), (12, 40), 2, True),        # 20 per group
    ("convolution_backward_data", (9, 7), (3, 3), (24, 72), 1, False),    # 72 > 64
])
def test_stride_one_channels_first_backward_data_matches_the_oracle(op, spatial, kernel,
                                                                    channels, groups, expect,
                                                                    monkeypatch):
    """backward_data of channels-first data without a stride stays channels-first up to 64
    output channels per group (past the 8 of strided or channels-last plans): the oracle's
    values, the path taken where it applies."""
    from polyconv_numpy import _fast

    taken = []
    real = _fast._phases_channels_first
    monkeypatch.setattr(_fast, "_phases_channels_first",
                        lambda *args: taken.append(1) or real(*args))
    rng = np.random.default_rng(31)
    cb, ca = channels        # b's channels (the op's data input), a's (its output)
    nd = len(spatial)
    attrs = {"pads_begin": (1,) * nd, "pads_end": (0,) * nd, "dilations": (2,) + (1,) * (nd - 1),
             "groups": groups, "data_format": "NCX", "weights_format": "OIX"}
    if op == "conv_transpose":     # OIX: [OC/G = Ca/G, IC = Cb, K..]
        w = rng.standard_normal((ca // groups, cb, *kernel)).astype(np.float32)
        x = rng.standard_normal((2, cb, *spatial)).astype(np.float32)
        args, keywords = (x, w), {}
    else:                          # OIX: [OC = Cb, IC/G = Ca/G, K..]
        w = rng.standard_normal((cb, ca // groups, *kernel)).astype(np.float32)
        fwd = polyconv.infer_shape("convolution", (2, ca, *spatial), w.shape, **attrs)
        x = rng.standard_normal(fwd.shape).astype(np.float32)
        args, keywords = (x, w), {"dst_shape": (2, ca, *spatial)}
    with _forcing(backward_data="gather"):
        y = getattr(polyconv, op)(*args, **keywords, **attrs)
    ref = reference(op, *args, **keywords, **attrs)
    assert y.shape == ref.shape
    assert_within_bound(y, ref.y, ref.abs_sum, ref.n, "float32")
    assert bool(taken) == expect


@pytest.mark.parametrize(("src", "kernel", "attrs"), [
    ((3, 5, 4, 6), (4, 4), dict(strides=2, pads_begin=1, pads_end=1, output_padding=1)),
    ((2, 6, 6), (16,), dict(strides=8, pads_begin=4, pads_end=4)),          # FCN-8s's k16 s8
    ((2, 4, 5, 4), (4, 2), dict(strides=2, pads_begin=(5, 0), pads_end=(0, 1))),  # pads > k
    ((2, 3, 2, 3, 4), (2, 2, 2), dict(strides=2, groups=2)),
])
@pytest.mark.parametrize("fmt", ["NXC", "NCX"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("blocks", ["default", "one line on three ranges"])
def test_subpixel_backward_data_matches_the_oracle(src, kernel, attrs, fmt, dtype, blocks,
                                                   monkeypatch):
    """The sub-pixel strategy (one product into every phase, then depth to space) where it
    applies: a ConvTranspose with its bias, pads past the kernel (rows of ``src`` no cell
    reads), 1-D to 3-D, groups, both layouts, 16-bit data: the oracle's values, and the
    strategy taken. Its interleave by blocks of lines also with blocks of one line over three
    uneven ranges of lines (as threads would take them, across an image's end)."""
    from polyconv_numpy import _subpixel

    def three_ranges(rows, work, blas=False, min_rows=None):
        bounds = [0, rows // 3 + 1, 2 * rows // 3 + 1, rows]
        return [work(lo, max(lo, hi)) for lo, hi in itertools.pairwise(bounds)]

    if blocks != "default":
        monkeypatch.setattr(_subpixel, "_BLOCK_BYTES", 1)
        monkeypatch.setattr(_subpixel, "split_rows", three_ranges)
    taken = []
    record = polyconv_numpy.CHOOSER.get("backward_data", "subpixel")
    monkeypatch.setitem(polyconv_numpy.CHOOSER._by_name, ("backward_data", "subpixel"),
                        dataclasses.replace(record, run=lambda *args: taken.append(1)
                                            or _subpixel.backward_data(*args)))
    rng = np.random.default_rng(37)
    groups, nd = attrs.get("groups", 1), len(kernel)
    shape = src if fmt == "NXC" else (src[0], src[-1], *src[1:-1])
    x = rng.standard_normal(shape).astype(numpy_dtype(dtype))
    w = rng.standard_normal((src[-1], 6 // groups, *kernel)).astype(numpy_dtype(dtype))  # IOX
    bias = rng.standard_normal(6).astype(numpy_dtype(dtype))
    attrs = {**attrs, "data_format": fmt, "weights_format": "IOX"}
    plan = polyconv.infer_shape("conv_transpose", x.shape, w.shape, **attrs)
    assert _subpixel.applies(plan) and nd == plan.ndim
    with _forcing(backward_data="subpixel"):
        y = polyconv.conv_transpose(x, w, bias, **attrs)
    ref = reference("conv_transpose", x, w, bias, **attrs)
    assert y.shape == ref.shape and y.dtype == x.dtype
    assert_within_bound(y, ref.y, ref.abs_sum, ref.n, dtype)
    assert taken


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize(("spatial", "kernel", "attrs"), [
    # a last axis strided 2 (its phases interleaved) or 3 and more (whole lines, periodic
    # weights), unstrided, dilated; asymmetric pads, output_padding; 1-D, 2-D, 3-D
    ((9, 11), (4, 4), dict(strides=2, pads_begin=1, pads_end=1)),
    ((7, 6), (8, 8), dict(strides=4, pads_begin=2, pads_end=(2, 3))),
    ((8, 7), (3, 5), dict(strides=(2, 3), pads_begin=(0, 2), pads_end=(1, 0),
                          dilations=(2, 1))),
    ((13,), (31,), dict(strides=1, pads_begin=15, pads_end=15)),
    ((10,), (3,), dict(strides=3, pads_begin=0, pads_end=2, dilations=2)),
    ((5, 6, 7), (3, 2, 3), dict(strides=(1, 2, 1), pads_begin=(1, 0, 2), pads_end=(0, 1, 1))),
    ((4, 5, 6), (2, 3, 4), dict(strides=(2, 1, 3), pads_begin=(0, 1, 1), pads_end=(1, 0, 2))),
    ((9, 8), (3, 3), dict(strides=1, pads_begin=(2, 0), pads_end=(0, 3), dilations=(1, 2))),
])
@pytest.mark.parametrize("split", [False, True])
def test_depthwise_planes_match_the_oracle(dtype, spatial, kernel, attrs, split, monkeypatch):
    # every primitive of the planes strategy, from both ends: a ConvTranspose (backward_data
    # as its forward), its two backward ops, and the convolution of the same geometry with its
    # two backward ops; with a bias. Split: a block per plane on three threads, and tables of
    # weights of one line (backward_data's periodic form); else whole images per block
    from polyconv_numpy import _planes

    if split:
        _split_everything(monkeypatch)
        monkeypatch.setattr(_planes, "TILE_VALUES", 1)
    channels, batch = 5, 2
    rng = np.random.default_rng(11)
    x = rng.standard_normal((batch, channels, *spatial)).astype(numpy_dtype(dtype))
    w = rng.standard_normal((channels, 1, *kernel)).astype(numpy_dtype(dtype))
    bias = rng.standard_normal(channels).astype(numpy_dtype(dtype))
    attrs = dict(attrs, groups=channels, data_format="NCX", weights_format="OIX")
    plan = polyconv.infer_shape("Convolution", x.shape, w.shape, **attrs).with_(dtype=dtype)
    assert _planes.applies(plan)
    g = rng.standard_normal(plan.b_shape).astype(numpy_dtype(dtype))
    transposed = dict(attrs, weights_format="IOX")     # the same [C, 1, K..] numbers
    _six_ops_within_bound("planes", dtype, x, w, g, bias, attrs, bias,
                          (dict(transposed, output_shape=x.shape), transposed, transposed))


def _six_ops_within_bound(spec, dtype, x, w, g, bias, attrs, t_bias, t_attrs):
    """Under the forced strategies ``spec``: the convolution of ``x`` (``attrs``) and its two
    backward ops, and the ConvTranspose of ``g`` with the same weights back to ``x``'s shape
    and its two backward ops (``t_attrs``: its keywords for itself, its weight gradient and
    its input gradient), each against the float64 oracle."""
    t_op, t_weights, t_data = t_attrs
    with _forcing(spec):
        got = [polyconv.convolution(x, w, bias, **attrs),
               polyconv.convolution_backward_data(g, w, x.shape, **attrs),
               polyconv.convolution_backward_weights(x, g, w.shape, **attrs),
               polyconv.conv_transpose(g, w, t_bias, **t_op),
               polyconv.conv_transpose_backward_data(x, w, **t_data),
               polyconv.conv_transpose_backward_weights(g, x, w.shape, **t_weights)]
    refs = [reference("convolution", x, w, bias, **attrs),
            reference("convolution_backward_data", g, w, dst_shape=x.shape, **attrs),
            reference("convolution_backward_weights", x, g, weights_shape=w.shape, **attrs),
            reference("conv_transpose", g, w, t_bias, **t_op),
            reference("conv_transpose_backward_data", x, w, **t_data),
            reference("conv_transpose_backward_weights", g, x, weights_shape=w.shape,
                      **t_weights)]
    for y, ref in zip(got, refs):
        assert y.shape == ref.y.shape and y.dtype == x.dtype
        assert_within_bound(y, ref.y, ref.abs_sum, ref.n, dtype)


def test_depthwise_planes_choice():
    # CenterNet's depthwise up-sampling, channels-first: the planes for every primitive (the
    # grid changes the layout of both tensors there); channels-last data, a dense layer and
    # a depthwise multiplier never take them
    ct = polyconv.infer_shape("conv_transpose", (4, 64, 64, 64), (64, 1, 4, 4), strides=2,
                              pads_begin=1, pads_end=1, groups=64, data_format="NCX",
                              weights_format="IOX")
    with polyconv.autotune(False):
        for primitive in ("forward", "backward_data", "backward_weights"):
            assert _choose(primitive, ct) == "planes"
    from polyconv_numpy import _planes

    last = polyconv.infer_shape("conv_transpose", (4, 64, 64, 64), (4, 4, 1, 64), strides=2,
                                groups=64, data_format="NXC", weights_format="XOI")
    dense = polyconv.infer_shape("convolution", (2, 8, 9, 9), (8, 8, 3, 3), data_format="NCX",
                                 weights_format="OIX")
    multiplier = polyconv.infer_shape("convolution", (2, 4, 9, 9), (8, 1, 3, 3), groups=4,
                                      data_format="NCX", weights_format="OIX")
    assert _planes.applies(ct)
    for plan in (last, dense, multiplier):
        assert not _planes.applies(plan)
        assert "planes" not in polyconv_numpy.costs("forward", plan)


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("layout", ["NCX", "NXC"])
@pytest.mark.parametrize(("spatial", "kernel"), [
    ((12, 8), (4, 2)),          # windows tile a exactly
    ((13, 9), (4, 2)),          # the last positions of each axis in no window
    ((10,), (5,)),
    ((4, 6, 7), (2, 3, 2)),
    ((5, 7), (1, 1)),           # a 1x1 kernel: the windows are a itself, no copy
])
@pytest.mark.parametrize("weights_format", ["OIX", "XIO"])
def test_patches_match_the_oracle(dtype, layout, spatial, kernel, weights_format):
    # every primitive of the non-overlapping windows, from both ends: a patch embedding and its
    # two backward ops, and a ConvTranspose of the same geometry (its backward_data the
    # forward primitive) with its two; with a bias, which also reaches the positions in no
    # window of the ConvTranspose's output (output_padding)
    ic, oc, batch = 3, 4, 2
    rng = np.random.default_rng(12)
    x = rng.standard_normal((batch, ic, *spatial) if layout == "NCX"
                            else (batch, *spatial, ic)).astype(numpy_dtype(dtype))
    w = rng.standard_normal((oc, ic, *kernel) if weights_format == "OIX"
                            else (*kernel, ic, oc)).astype(numpy_dtype(dtype))
    bias = rng.standard_normal(oc).astype(numpy_dtype(dtype))
    attrs = dict(strides=kernel, data_format=layout, weights_format=weights_format)
    plan = polyconv.infer_shape("Convolution", x.shape, w.shape, **attrs)
    from polyconv_numpy import _patches

    assert _patches.applies(plan)
    g = rng.standard_normal(plan.b_shape).astype(numpy_dtype(dtype))
    # the ConvTranspose from b back to a's shape: its weights are the same numbers read
    # [IC, OC/G, K..] (IOX) or [K.., OC, IC] (XOI), and its bias is per channel of a
    t_attrs = dict(attrs, weights_format="IOX" if weights_format == "OIX" else "XOI")
    t_bias = rng.standard_normal(ic).astype(numpy_dtype(dtype))
    pad = tuple(a - b * k for a, b, k in zip(spatial, plan.b_spatial, kernel))
    t_attrs_op = dict(t_attrs, output_padding=pad)
    _six_ops_within_bound("patches", dtype, x, w, g, bias, attrs, t_bias,
                          (t_attrs_op, t_attrs_op, t_attrs))


def test_patches_choice():
    # ViT-B/16's patch embedding and nnU-Net's 3-D 2x2x2 stride-2 up-convolution: every
    # primitive by the windows' one product (the grid splits a into 256 phases for the
    # embedding); padding before, a dilation or an overlap (kernel > stride) never takes it
    vit = polyconv.infer_shape("convolution", (4, 224, 224, 3), (16, 16, 3, 768), strides=16,
                               weights_format="XIO")
    unet = polyconv.infer_shape("conv_transpose", (1, 16, 20, 24, 128), (2, 2, 2, 64, 128),
                                strides=2, weights_format="XOI")
    with polyconv.autotune(False):
        for plan in (vit, unet):
            for primitive in ("forward", "backward_data", "backward_weights"):
                assert _choose(primitive, plan) == "patches"
    from polyconv_numpy import _patches

    for attrs in (dict(strides=2, pads_begin=1), dict(strides=2, dilations=2),
                  dict(strides=1)):
        plan = polyconv.infer_shape("convolution", (1, 9, 9, 3), (2, 2, 3, 4),
                                    weights_format="XIO", **attrs)
        assert not _patches.applies(plan)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize("layout", ["NCX", "NXC"])
@pytest.mark.parametrize(("spatial", "kernel", "attrs"), [
    ((33, 20), (16, 8), dict(strides=(8, 4), pads_begin=(4, 2), pads_end=(4, 2))),
    ((17, 15), (3, 3), dict(strides=2, pads_begin=1, pads_end=0)),     # k not a multiple of s
    ((12, 11), (3, 3), dict(strides=1, pads_begin=(2, 0), pads_end=(0, 2))),
    ((23,), (10,), dict(strides=5, pads_begin=3, pads_end=0)),          # a tail no window reads
    ((7, 8, 9), (3, 2, 4), dict(strides=(2, 1, 3), pads_begin=(1, 0, 2), pads_end=1)),
    ((9, 9), (2, 2), dict(strides=3)),                                  # kernel < stride
])
def test_space_to_depth_matches_the_oracle(dtype, layout, spatial, kernel, attrs):
    # forward and weight gradient from blocks of s positions: windows of ceil(K/s) blocks per
    # axis, zero taps past the kernel, pads on either side, images one after another on the
    # blocks' rows; with a bias, both layouts, 16-bit accumulated in float32
    ic, oc, batch = 3, 5, 2
    rng = np.random.default_rng(13)
    x = rng.standard_normal((batch, ic, *spatial) if layout == "NCX"
                            else (batch, *spatial, ic)).astype(numpy_dtype(dtype))
    w = rng.standard_normal((oc, ic, *kernel)).astype(numpy_dtype(dtype))
    bias = rng.standard_normal(oc).astype(numpy_dtype(dtype))
    attrs = dict(attrs, data_format=layout, weights_format="OIX")
    plan = polyconv.infer_shape("Convolution", x.shape, w.shape, **attrs)
    _forward_and_weight_gradient_within_bound("space_to_depth", rng, dtype, x, w, bias, attrs,
                                              plan)


def test_space_to_depth_choice():
    # FCN-8s's 16x16 stride-8 up-sampling: its gradient's forward and weight gradient as four
    # products over blocks of 8x8x21 values; a stem's blocks of 2x2x3 values never
    fcn = polyconv.infer_shape("conv_transpose", (1, 21, 64, 64), (21, 21, 16, 16), strides=8,
                               pads_begin=4, pads_end=4, data_format="NCX",
                               weights_format="IOX")
    stem = polyconv.infer_shape("convolution", (4, 224, 224, 3), (7, 7, 3, 64), strides=2,
                                pads_begin=3, pads_end=3, weights_format="XIO")
    with polyconv.autotune(False):
        for primitive in ("forward", "backward_weights"):
            assert _choose(primitive, fcn) == "space_to_depth"
            assert "space_to_depth" not in polyconv_numpy.costs(primitive, stem)
    assert "space_to_depth" not in polyconv_numpy.costs("backward_data", fcn)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
@pytest.mark.parametrize(("spatial", "kernel", "attrs"), [
    ((28, 28), (3, 3), dict()),                                          # MNIST's first layer
    ((17, 15), (3, 3), dict(strides=2, pads_begin=1, pads_end=0, groups=3)),
    ((12, 11), (3, 2), dict(strides=(1, 2), pads_begin=(2, 0), pads_end=(0, 3),
                            dilations=(2, 1))),
    ((40,), (10,), dict(strides=5, pads_begin=3, pads_end=0)),           # a tail no window reads
    ((7, 8, 9), (3, 2, 4), dict(strides=(2, 1, 3), pads_begin=(1, 0, 2), pads_end=1)),
    ((9, 9), (2, 2), dict(strides=3)),                                   # kernel < stride
    ((5, 4), (2, 2), dict(pads_end=(4, 0))),    # the last lines read nothing but padding
])
@pytest.mark.parametrize("block", ["images", "image", "lines"])
def test_im2col_matches_the_oracle(dtype, spatial, kernel, attrs, block, monkeypatch):
    # forward and weight gradient from each image's columns, channels-first: blocks of several
    # images, of one, or of one output line (the padded lines a block reads start inside the
    # padding, inside a, or past its end); groups, dilation, asymmetric pads; with a bias,
    # 16-bit accumulated in float32
    from polyconv_numpy import _im2col

    groups = attrs.get("groups", 1)
    ic, oc, batch = 3 * groups, 2 * groups, 3
    rng = np.random.default_rng(14)
    x = rng.standard_normal((batch, ic, *spatial)).astype(numpy_dtype(dtype))
    w = rng.standard_normal((oc, ic // groups, *kernel)).astype(numpy_dtype(dtype))
    bias = rng.standard_normal(oc).astype(numpy_dtype(dtype))
    attrs = dict(attrs, data_format="NCX", weights_format="OIX")
    plan = polyconv.infer_shape("Convolution", x.shape, w.shape, **attrs)
    acc = np.dtype(plan.acc_dtype)
    image = (ic * math.prod(kernel) + oc) * math.prod(plan.b_spatial) * acc.itemsize
    monkeypatch.setattr(_im2col, "_MIN_POSITIONS", 1)
    monkeypatch.setattr(_im2col, "_DATA_SHARE", None)
    monkeypatch.setattr(_im2col, "_BLOCK_BYTES", {"images": 1 << 21, "image": image,
                                                  "lines": 1}[block])
    cols = _im2col.Columns(plan, acc)
    assert len(cols.blocks) == {"images": 1, "image": batch,
                                "lines": batch * plan.b_spatial[0]}[block]
    _forward_and_weight_gradient_within_bound("im2col", rng, dtype, x, w, bias, attrs, plan)


def _forward_and_weight_gradient_within_bound(name, rng, dtype, x, w, bias, attrs, plan):
    """A convolution's forward and weight gradient with strategy ``name`` forced, against
    the oracle."""
    g = rng.standard_normal(plan.b_shape).astype(numpy_dtype(dtype))
    with _forcing(name):
        got = [polyconv.convolution(x, w, bias, **attrs),
               polyconv.convolution_backward_weights(x, g, w.shape, **attrs)]
    refs = [reference("convolution", x, w, bias, **attrs),
            reference("convolution_backward_weights", x, g, weights_shape=w.shape, **attrs)]
    for y, ref in zip(got, refs):
        assert y.shape == ref.y.shape and y.dtype == x.dtype
        assert_within_bound(y, ref.y, ref.abs_sum, ref.n, dtype)


def test_im2col_choice():
    # MNIST's 1->32 first layer and wav2vec 2.0's 1->512 feature extractor on channels-first
    # data: the columns (9-10 values a position) against the grid's crop and change of layout
    # of 32-512 channels; never on channels-last data, depthwise layers or backward_data
    mnist = polyconv.infer_shape("convolution", (64, 1, 28, 28), (32, 1, 3, 3),
                                 data_format="NCX", weights_format="OIX")
    wav2vec = polyconv.infer_shape("convolution", (2, 1, 16000), (512, 1, 10), strides=5,
                                   data_format="NCX", weights_format="OIX")
    last = polyconv.infer_shape("convolution", (64, 28, 28, 1), (3, 3, 1, 32),
                                weights_format="XIO")
    depthwise = polyconv.infer_shape("convolution", (2, 8, 28, 28), (8, 1, 3, 3), groups=8,
                                     data_format="NCX", weights_format="OIX")
    with polyconv.autotune(False):
        for plan in (mnist, wav2vec):
            for primitive in ("forward", "backward_weights"):
                assert _choose(primitive, plan) == "im2col"
            assert "im2col" not in polyconv_numpy.costs("backward_data", plan)
        for plan in (last, depthwise):
            for primitive in ("forward", "backward_data", "backward_weights"):
                assert "im2col" not in polyconv_numpy.costs(primitive, plan)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("src", "weights", "attrs"), [
    ((2, 64, 64, 64), (1, 64, 3, 3), dict(pads_begin=1, pads_end=1)),   # columns 576x b
    ((8, 1, 128, 128), (64, 1, 5, 5), dict(strides=2)),                 # b 64x the columns' depth
    ((1, 8, 32, 64, 64), (8, 8, 3, 3, 3), dict(pads_begin=1, pads_end=1)),
])
def test_im2col_memory_at_most_twice_inputs_and_output(dtype, src, weights, attrs):
    # the columns go by blocks of an eighth of the data (at least a line of the first axis),
    # each thread's in one buffer, and a 16-bit output is rounded block by block: peak extra
    # memory within twice the inputs and output however deep the columns (tracemalloc: a
    # count, not a time)
    import tracemalloc

    rng = np.random.default_rng(15)
    x = rng.standard_normal(src).astype(numpy_dtype(dtype))
    w = rng.standard_normal(weights).astype(numpy_dtype(dtype))
    attrs = dict(attrs, data_format="NCX", weights_format="OIX")
    plan = polyconv.infer_shape("Convolution", x.shape, w.shape, **attrs)
    g = rng.standard_normal(plan.b_shape).astype(numpy_dtype(dtype))
    with _forcing("im2col"):
        for call, inputs in ((lambda: polyconv.convolution(x, w, **attrs), (x, w)),
                             (lambda: polyconv.convolution_backward_weights(
                                 x, g, w.shape, **attrs), (x, g))):
            tracemalloc.start()
            try:
                y = call()
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
            assert peak <= 2 * (sum(a.nbytes for a in inputs) + y.nbytes)


def test_a_result_does_not_depend_on_another_threads_blas_section(monkeypatch):
    # the weight gradient sums its ranges' partial products: two ranges or one add in another
    # order. Another call's loop holds the BLAS at one thread meanwhile (BLAS.one_thread, as
    # in that call's thread); the result must be the serial one, bit for bit
    from polyconv_numpy import _common
    from threadpoolctl import threadpool_limits

    monkeypatch.setattr(_common, "threads", lambda: 2)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 72, 48, 48), dtype=np.float32)
    attrs = dict(data_format="NCX", weights_format="OIX", pads_begin=1, pads_end=1)
    with threadpool_limits(2, user_api="blas"), _forcing(backward_weights="gather"):
        serial = polyconv.convolution_backward_weights(x, x, (72, 72, 3, 3), **attrs)
        with _common.BLAS.one_thread():
            during = polyconv.convolution_backward_weights(x, x, (72, 72, 3, 3), **attrs)
    np.testing.assert_array_equal(during, serial)


def test_the_first_computation_starts_the_backend_once_for_every_plan():
    """Process-wide start-up (glibc's thresholds, the search for the BLAS library held at one
    thread) belongs to the backend's first computation, whatever its plan, not to the first
    plan that happens to split products over threads: that plan's first call then costs what
    its later calls do. A fresh process: importing polyconv starts nothing; one tiny call,
    whose products never split, starts everything."""
    import subprocess
    import sys

    code = """if True:
        import sys
        import numpy as np
        import polyconv
        assert "threadpoolctl" not in sys.modules
        polyconv.convolution(np.ones((1, 3, 3, 1), np.float32),
                             np.ones((1, 1, 1, 1), np.float32), backend="numpy")
        from polyconv_numpy._common import BLAS
        assert "threadpoolctl" in sys.modules and "_controllers" in vars(BLAS)
    """
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
