"""How the JAX backend chooses a lowering through the core chooser: forced, measured (opt-in
autotuning), or its policy."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
from functools import partial
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
from conftest import only_with_target

only_with_target("jax")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from jax_grid import (  # noqa: E402
    _CONV_VARIANTS,
    _KERNEL,
    _LARGE,
    _LAYOUTS,
    _SMALL,
    _TRANSPOSE_VARIANTS,
    _attrs,
)
from oracle import assert_within_bound, reference  # noqa: E402
from polyconv_jax import _choice, _grouped, _subpixel  # noqa: E402
from polyconv_jax import _policy as rules  # noqa: E402

import polyconv  # noqa: E402
from polyconv import _cache_file  # noqa: E402
from polyconv import _choice as core  # noqa: E402

CHOOSER = _choice.CHOOSER

ATTRS = {"strides": 2, "pads_begin": 1, "pads_end": 1, "output_padding": 1}


def _plan(dtype="float32", channels=(8, 4), **attrs):
    ic, oc = channels
    return polyconv.infer_shape("ConvTranspose", (2, 6, 5, ic), (3, 3, oc, ic),
                                **{**ATTRS, **attrs}).with_(dtype=dtype)


@contextlib.contextmanager
def _on(platform: str):
    """As if JAX computed on ``platform`` (the records' rules and the policy ask JAX)."""
    with mock.patch.object(jax, "default_backend", lambda: platform):
        yield


def _candidates(primitive, plan, platform="cpu"):
    with _on(platform):
        return _choice.candidates(primitive, plan)


def _policy(primitive, plan, platform="cpu"):
    with _on(platform):
        return CHOOSER.default(primitive, plan)


def _applicable(primitive, plan, name, platform="cpu"):
    with _on(platform):
        return CHOOSER.get(primitive, name).applies(plan)


@pytest.fixture(autouse=True)
def rules_at_any_size(monkeypatch):
    """The plans here are small: the CPU rules are checked as they apply to larger ones
    (test_small_plans_take_the_plain_lowering checks the small-plan rule)."""
    monkeypatch.setattr(rules, "SMALL_MACS", 0)


@pytest.fixture
def measuring(monkeypatch, tmp_path):
    """Autotuning on for every plan, with an empty in-process cache and no cache file."""
    monkeypatch.setattr(_choice, "MEASURE_MIN_MACS", 0)
    monkeypatch.delenv(_cache_file.CACHE_ENV, raising=False)
    CHOOSER.forget()
    jax.clear_caches()
    with polyconv.autotune(True):
        yield tmp_path
    CHOOSER.forget()
    jax.clear_caches()


def _fake_measure(times, calls):
    def measure(primitive, plan, precision, names, *args, **kwargs):
        calls.append((primitive, tuple(names)))
        return {n: times.get(n, 1.0) for n in names}
    return measure


def test_the_fastest_candidate_is_chosen_and_kept(measuring, monkeypatch):
    calls = []
    monkeypatch.setattr(_choice, "measure", _fake_measure({"phases_matmul": 0.1}, calls))
    plan = _plan()
    assert _choice.choose("backward_data", plan, None) == "phases_matmul"
    assert _choice.choose("backward_data", plan, None) == "phases_matmul"
    assert len(calls) == 1                       # measured once per plan
    # the op name and bias are not part of the key: the oneDNN alias reuses the measurement
    assert _choice.choose("backward_data", plan.with_(op="ConvTranspose", has_bias=True),
                          None) == "phases_matmul"
    assert len(calls) == 1


def test_the_plain_lowering_is_always_measured(measuring, monkeypatch):
    """So the choice never loses to the plain lowering (beyond the measurement's noise)."""
    calls = []
    monkeypatch.setattr(_choice, "measure", _fake_measure({"direct": 0.01}, calls))
    assert _choice.choose("backward_data", _plan(), None) == "direct"
    for primitive in ("forward", "backward_weights"):
        plan = _plan().with_(primitive=primitive)
        assert _candidates(primitive, plan)[0] == _policy(primitive, plan)
        assert "direct" in _candidates(primitive, plan)


@pytest.mark.parametrize(("plain", "chosen"), [(1.09, "direct"), (1.11, "phases_matmul")])
def test_the_plain_lowering_wins_a_close_call(measuring, monkeypatch, plain, chosen):
    """Another lowering must beat the plain one (a hand-written lax call's) by more than the
    plain tie, 10%, to be chosen."""
    monkeypatch.setattr(_choice, "measure",
                        _fake_measure({"phases_matmul": 0.5, "direct": 0.5 * plain}, []))
    assert _policy("backward_data", _plan()) != "direct"
    assert _choice.choose("backward_data", _plan(), None) == chosen


def test_inexact_lowerings_are_never_candidates():
    """k3 s2: the sub-pixel window holds zero taps, so measuring never considers the
    lowerings that form it; k4 s2: it does not, and they are measured."""
    windowed = {"subpixel", "subpixel_matmul", "upsampled"}
    assert not windowed & set(_candidates("backward_data", _plan()))
    k4 = polyconv.infer_shape("ConvTranspose", (2, 6, 5, 8), (4, 4, 4, 8), **ATTRS)
    assert {"subpixel", "subpixel_matmul"} <= set(
        _candidates("backward_data", k4.with_(dtype="float32")))
    dw = polyconv.infer_shape("ConvTranspose", (2, 6, 5, 8), (4, 4, 1, 8), groups=8, **ATTRS)
    assert "upsampled" in _candidates("backward_data", dw.with_(dtype="float32"))


@pytest.mark.parametrize("groups", [2, 32, 33, 144])
@pytest.mark.parametrize("per_group", [1, 2])
def test_per_group_lowerings_are_candidates_up_to_their_bound(groups, per_group):
    """``grouped`` holds one problem per group, and XLA's compile time grows with their count
    (144 groups: minutes), so it is neither measured nor chosen past its bound; every other
    candidate still is. The weight gradient of groups of at least 2 channels on both sides
    takes them in blocks there, at most that many (:func:`group_block`)."""
    group_block, GROUPED_MAX_GROUPS = _grouped.group_block, _grouped.GROUPED_MAX_GROUPS
    channels = per_group * groups
    plan = polyconv.infer_shape("Convolution", (2, 9, 9, channels),
                                (3, 3, per_group, channels), strides=2, pads_begin=1,
                                pads_end=1, groups=groups)
    for primitive in ("forward", "backward_data", "backward_weights"):
        names = _candidates(primitive, plan, "cpu")
        blocks = primitive == "backward_weights" and per_group == 2
        assert ("grouped" in names) == (groups <= GROUPED_MAX_GROUPS or blocks), (
            primitive, names)
        assert _policy(primitive, plan, "cpu") in names
    block = group_block(plan)
    assert groups % block == 0 and groups // block <= GROUPED_MAX_GROUPS
    assert block == (1 if groups <= GROUPED_MAX_GROUPS else 3 if groups == 33 else 6)


@pytest.mark.parametrize(("spatial", "strides", "measured"), [
    ((9, 9), 1, set()),                                              # 2-D: never
    ((6, 9, 9), 1, {"forward", "backward_data", "backward_weights"}),
    ((6, 9, 9), (2, 1, 1), {"forward", "backward_data", "backward_weights"}),
    ((6, 9, 9), 2, {"forward", "backward_weights"}),    # lhs-dilated inner problems
])
def test_sliced_lowerings_are_measured_for_3d_plans(spatial, strides, measured):
    """The ``sliced`` lowerings (one convolution of rank ``nd - 1`` per tap of the first
    axis) compute every plan, and are measured where they stand in for XLA CPU's 3-D
    convolution: 3-D plans, for backward_data only without a stride past the first axis;
    the CPU policy takes them without a stride, and for strided forwards whose patches
    would be many wide overlapping windows (16 channels, 27 taps)."""
    kernel = (3,) * len(spatial)
    # (16 channels: with fewer, the policy takes the elementwise loops)
    plan = polyconv.infer_shape("Convolution", (2, *spatial, 16), (*kernel, 16, 16),
                                strides=strides, pads_begin=1, pads_end=1)
    for primitive in ("forward", "backward_data", "backward_weights"):
        assert _applicable(primitive, plan, "sliced")
        names = _candidates(primitive, plan, "cpu")
        assert ("sliced" in names) == (primitive in measured), (primitive, names)
        # the CPU policy takes them for ungrouped 3-D plans without a stride, and forwards
        chosen = _policy(primitive, plan, "cpu")
        assert (chosen == "sliced") == (
            len(spatial) == 3 and (strides == 1 or primitive == "forward")), chosen
        assert _policy(primitive, plan, "gpu") != "sliced"


@pytest.mark.parametrize(("channels", "kernel", "dilations", "groups", "measured"), [
    ((256, 128), (3, 3), 12, 1, {"forward", "backward_data", "backward_weights"}),
    ((256, 64), (1, 1), 1, 1, {"forward"}),             # a weight gradient's 64 columns
    ((64, 256), (3, 3), 1, 1, {"backward_data"}),
    ((256, 256), (7, 7), 1, 1, set()),                  # 49 taps
    ((256, 256), (7, 7), 5, 1, {"forward", "backward_data", "backward_weights"}),  # 25 read a
    ((256, 256), (3, 3), 1, 2, set()),                  # ungrouped only
])
def test_taps_lowerings_are_measured_for_wide_products(channels, kernel, dilations, groups,
                                                       measured):
    """The ``taps`` lowerings (one product per tap over the rows it reads) compute every
    ungrouped plan, and are measured from 128 contracted channels (both sides for a weight
    gradient) and up to 27 taps that read the input (taps that read only padding do no
    work)."""
    ca, cb = channels
    plan = polyconv.infer_shape("Convolution", (2, 12, 12, ca), (*kernel, ca // groups, cb),
                                dilations=dilations, pads_begin=dilations * (kernel[0] // 2),
                                pads_end=dilations * (kernel[0] // 2), groups=groups)
    for primitive in ("forward", "backward_data", "backward_weights"):
        assert _applicable(primitive, plan, "taps") == (groups == 1)
        names = _candidates(primitive, plan, "cpu")
        assert ("taps" in names) == (primitive in measured), (primitive, names)


def test_small_and_float64_plans_take_the_policy(measuring, monkeypatch):
    calls = []
    monkeypatch.setattr(_choice, "measure", _fake_measure({}, calls))
    monkeypatch.setattr(_choice, "MEASURE_MIN_MACS", 10**12)
    assert _choice.choose("backward_data", _plan(), None) == _policy(
        "backward_data", _plan())
    monkeypatch.setattr(_choice, "MEASURE_MIN_MACS", 0)
    assert _choice.choose("backward_data", _plan("float64"), None) == _policy(
        "backward_data", _plan("float64"))
    assert calls == []


def test_a_per_group_problem_is_measured_when_all_the_groups_together_are_large(
        measuring, monkeypatch):
    """A per-group lowering's inner problem is repeated once per group: it is measured when
    the copies together reach the threshold, though one alone would not."""
    calls = []
    monkeypatch.setattr(_choice, "measure", _fake_measure({"phases_matmul": 0.1}, calls))
    plan = _plan()
    monkeypatch.setattr(_choice, "MEASURE_MIN_MACS", 8 * plan.macs)
    assert _choice.choose("backward_data", plan, None, repeats=4) == _policy(
        "backward_data", plan)
    assert calls == []
    assert _choice.choose("backward_data", plan, None, repeats=8) == "phases_matmul"
    assert len(calls) == 1


@pytest.mark.parametrize("primitive", ["backward_data", "backward_weights"])
def test_a_grouped_candidate_measures_its_inner_problem_while_it_is_compiled(measuring,
                                                                             primitive):
    """Measuring the ``grouped`` candidate compiles it, which traces its inner problem's
    choice, which measures again: that nested measurement runs (every candidate timed, none
    failed for being called inside a trace), and the op stays exact."""
    rng = np.random.default_rng(1)
    attrs = {"strides": 1, "pads_begin": 1, "pads_end": 1, "groups": 4}
    x = rng.uniform(-1, 1, (2, 12, 12, 16)).astype(np.float32)
    w = rng.uniform(-1, 1, (3, 3, 4, 8)).astype(np.float32)
    g = rng.uniform(-1, 1, (2, 12, 12, 8)).astype(np.float32)
    if primitive == "backward_data":
        got = jax.jit(lambda g, w: polyconv.convolution_backward_data(
            g, w, dst_shape=x.shape, **attrs))(g, w)
        ref = reference("convolution_backward_data", g.astype(np.float64),
                        w.astype(np.float64), dst_shape=x.shape, **attrs)
    else:
        got = jax.jit(lambda x, g: polyconv.convolution_backward_weights(
            x, g, w.shape, **attrs))(x, g)
        ref = reference("convolution_backward_weights", x.astype(np.float64),
                        g.astype(np.float64), weights_shape=w.shape, **attrs)
    assert_within_bound(np.asarray(got), ref.y, ref.abs_sum, ref.n, "float32")
    inner = {key: times for key, times in CHOOSER.measured().items()
             if key.split("|")[2] == primitive and "groups=1," in key}
    assert inner, (f"the inner problem of {primitive} was not measured", CHOOSER.measured())
    for times in inner.values():
        assert set(times) <= set(_choice.LOWERINGS[primitive])
        assert all(math.isfinite(t) for t in times.values()), times


def test_autotune_off_and_forcing_take_precedence(measuring, monkeypatch):
    calls = []
    monkeypatch.setattr(_choice, "measure", _fake_measure({"phases_matmul": 0.1}, calls))
    with polyconv.autotune(False):
        assert _choice.choose("backward_data", _plan(), None) == _policy(
            "backward_data", _plan())
    monkeypatch.setenv(core.AUTOTUNE_ENV, "0")
    with polyconv.implementation("jax:backward_data=subpixel"):
        assert _choice.choose("backward_data", _plan(), None) == "subpixel"
    assert calls == []
    # the settings are part of each primitive's jit cache key
    with polyconv.autotune(False):
        off = core.settings()
    with polyconv.autotune(True):
        assert core.settings() != off


def test_the_cache_file(measuring, monkeypatch):
    path = measuring / "choices.json"
    monkeypatch.setenv(_cache_file.CACHE_ENV, str(path))
    calls = []
    monkeypatch.setattr(_choice, "measure", _fake_measure({"phases_matmul": 0.1}, calls))
    assert _choice.choose("backward_data", _plan(), None) == "phases_matmul"
    stored = json.loads(path.read_text())
    assert list(stored["choices"].values()) == ["phases_matmul"]
    # a new process (an empty in-process cache) reads it instead of measuring
    CHOOSER.forget()
    assert _choice.choose("backward_data", _plan(), None) == "phases_matmul"
    assert len(calls) == 1
    # an unreadable file is ignored with a warning and only costs a measurement
    path.write_text("not json")
    CHOOSER.forget()
    with pytest.warns(UserWarning, match="not a polyconv autotune cache"):
        assert _choice.choose("backward_data", _plan(), None) == "phases_matmul"
    assert len(calls) == 2


def test_a_multi_process_run_only_reads_the_cache_file(measuring, monkeypatch):
    """Every process must compile the same program: nothing is timed, a choice comes from the
    cache file, else the policy."""
    path = measuring / "choices.json"
    monkeypatch.setenv(_cache_file.CACHE_ENV, str(path))
    calls = []
    monkeypatch.setattr(_choice, "measure", _fake_measure({"phases_matmul": 0.1}, calls))
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    plan = _plan()
    assert _choice.choose("backward_data", plan, None) == _policy("backward_data", plan)
    assert calls == []
    monkeypatch.setattr(jax, "process_count", lambda: 1)
    assert _choice.choose("backward_data", plan, None) == "phases_matmul"    # measured, stored
    CHOOSER.forget()
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    assert _choice.choose("backward_data", plan, None) == "phases_matmul"
    assert len(calls) == 1


def test_measurements_are_kept_per_xla_options(measuring, monkeypatch):
    """XLA's options change what every candidate compiles to: a choice measured (or stored
    in the cache file) under one ``XLA_FLAGS`` is not reused under another."""
    calls = []
    monkeypatch.setattr(_choice, "measure", _fake_measure({"phases_matmul": 0.1}, calls))
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    plan = _plan()
    _choice.choose("backward_data", plan, None)
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_min_max=false")
    _choice.choose("backward_data", plan, None)
    assert len(calls) == 2
    # the same options, spaced differently, are the same key
    monkeypatch.setenv("XLA_FLAGS", "  --xla_cpu_enable_fast_min_max=false ")
    _choice.choose("backward_data", plan, None)
    monkeypatch.setenv("XLA_FLAGS", "")
    _choice.choose("backward_data", plan, None)
    assert len(calls) == 2
    assert len(CHOOSER.chosen()) == 2


def test_measure_times_every_candidate_and_drops_slow_ones():
    """The real measurement on a small plan: every candidate compiles and runs; one whose
    first call is far slower than the best is timed once only."""
    plan = _plan()
    names = _candidates("backward_data", plan)
    calls = []

    def timer(fn, args):
        jax.block_until_ready(fn(*args))
        calls.append(fn)
        return 10.0 if len(calls) == len(names) else 1.0   # the last first call is slow

    times = _choice.measure("backward_data", plan, None, names, rounds=3, timer=timer)
    assert times[names[-1]] == 10.0
    assert all(times[n] == 1.0 for n in names[:-1])
    assert len(calls) == len(names) + 3 * (len(names) - 1)


def test_a_gradient_and_its_backward_ops_share_one_measurement(measuring, monkeypatch):
    """A strided Convolution whose size rule leaves an input row past its last product (7x7,
    stride 2, pads 3 on 12 rows: 6 outputs reach 17 of 18 padded rows): its backward_data
    called by hand carries that row as output_padding, its gradient's plan has none. One
    geometry: the backward ops measure nothing the gradient has not measured."""
    calls = []
    monkeypatch.setattr(_choice, "measure", _fake_measure({}, calls))
    rng = np.random.default_rng(0)
    x, w = (jnp.asarray(rng.standard_normal(s, dtype=np.float32))
            for s in ((2, 12, 12, 3), (7, 7, 3, 8)))
    attrs = dict(strides=2, pads_begin=3, pads_end=3, data_format="NXC", weights_format="XIO")
    g = jnp.ones((2, 6, 6, 8), jnp.float32)
    jax.jit(lambda x, w, g: jax.vjp(partial(polyconv.convolution, **attrs), x, w)[1](g))(
        x, w, g)
    measured = list(calls)
    assert {p for p, _ in measured} >= {"backward_data", "backward_weights"}
    jax.jit(lambda x, w, g: (
        polyconv.convolution_backward_data(g, w, dst_shape=x.shape, **attrs),
        polyconv.convolution_backward_weights(x, g, w.shape, **attrs)))(x, w, g)
    assert calls == measured


def test_a_timed_call_queues_its_calls_and_waits_once(monkeypatch):
    """``_time`` issues its calls back to back, waits for the last one only, and returns the
    seconds per call (a fake clock: each call takes 0.5 s)."""
    clock, log = [0.0], []

    class Result:
        def block_until_ready(self):
            log.append("wait")
            return self

    def fn():
        clock[0] += 0.5
        log.append("call")
        return Result()

    monkeypatch.setattr(_choice, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    assert _choice._time(fn, (), calls=4) == 0.5
    assert log == ["call"] * 4 + ["wait"]


@pytest.mark.parametrize("platform", ["cpu", "gpu", "tpu"])
def test_off_the_cpu_each_timed_call_is_several_queued_calls(monkeypatch, platform):
    """On an accelerator a small plan's single call is mostly dispatch: the measurement
    times queued calls there, one call at a time on the CPU."""
    plan = _plan()
    names = _candidates("backward_data", plan, "cpu")
    queued = set()

    def fake_time(fn, args, calls=1):
        queued.add(calls)
        return 1.0

    monkeypatch.setattr(_choice, "_time", fake_time)
    monkeypatch.setattr(_choice.jax, "default_backend", lambda: platform)
    _choice.measure("backward_data", plan, None, names, rounds=1)
    assert queued == {1 if platform == "cpu" else _choice.MEASURE_QUEUED_CALLS}
    # results too large to hold ten at once: fewer queued calls
    monkeypatch.setattr(_choice, "MEASURE_QUEUED_BYTES", 3 * 4 * math.prod(plan.a_shape))
    queued.clear()
    _choice.measure("backward_data", plan, None, names, rounds=1)
    assert queued == {1 if platform == "cpu" else 3}


def test_every_candidate_runs_once_before_its_first_timed_call(monkeypatch):
    """A fresh executable's first run pays one-time costs: the measurement runs each
    candidate once, untimed, so that those costs never fall on a timed call (they used to
    fall on the first candidate, the policy's)."""
    plan = _plan()
    names = _candidates("backward_data", plan)
    runs: dict[str, int] = {}
    real = _choice._runnable

    class Counting:
        def __init__(self, name, compiled):
            self.name, self.compiled = name, compiled

        def __call__(self, *args):
            runs[self.name] = runs.get(self.name, 0) + 1
            return self.compiled(*args)

    class Lowered:
        def __init__(self, name, fn):
            self.name, self.fn = name, fn

        def lower(self, *args):
            self.lowered = self.fn.lower(*args)
            return self

        def compile(self):
            return Counting(self.name, self.lowered.compile())

    monkeypatch.setattr(_choice, "_runnable", lambda primitive, plan, precision, name:
                        Lowered(name, real(primitive, plan, precision, name)))
    seen_before_timing = {}

    def timer(fn, args):
        seen_before_timing.setdefault(fn.name, runs.get(fn.name, 0))
        return _choice._time(fn, args)

    _choice.measure("backward_data", plan, None, names, rounds=1, timer=timer)
    assert seen_before_timing == dict.fromkeys(names, 1)


def test_measured_choice_under_jit_grad_and_vmap_matches_the_oracle(measuring):
    """Measuring runs while the caller is traced (jit, grad, vmap), and whatever it picks is
    exact."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (2, 6, 5, 8)).astype(np.float32)
    w = rng.uniform(-1, 1, (3, 3, 4, 8)).astype(np.float32)
    y = jax.jit(lambda x, w: polyconv.conv_transpose(x, w, **ATTRS))(x, w)
    ref = reference("conv_transpose", x.astype(np.float64), w.astype(np.float64), **ATTRS)
    assert_within_bound(np.asarray(y), ref.y, ref.abs_sum, ref.n, "float32")
    g = jax.jit(jax.vmap(jax.grad(lambda w, x: jnp.sum(
        polyconv.conv_transpose(x[None], w, **ATTRS))), in_axes=(None, 0)))(w, x)
    assert g.shape == (2, *w.shape)
    chosen = CHOOSER.chosen()
    assert chosen, "nothing was measured"
    assert all(name in _choice.LOWERINGS[key.split("|")[2]] for key, name in chosen.items())


def _conv_plan(kernel, strides, groups=1, src=(2, 9, 9, 8), oc=8):
    return polyconv.infer_shape("Convolution", src, (*kernel, src[-1] // groups, oc),
                                strides=strides, groups=groups, pads_begin=1, pads_end=1,
                                weights_format="XIO")


@pytest.mark.parametrize(("plan", "expected"), [
    # ungrouped 2-D 3x3 stride 2: patches for forward and weights, overlap-add for data
    (_conv_plan((3, 3), 2), ("im2col", "matmul_overlap_add", "im2col")),
    # stride 1: the data gradient stays the plain (cuDNN) convolution
    (_conv_plan((3, 3), 1), ("im2col", "direct", "im2col")),
    # 5x5 = 25 taps: the forward does not gather
    (_conv_plan((5, 5), 2), ("direct", "matmul_overlap_add", "im2col")),
    # groups of 2-4 channels (ResNeXt's): elementwise, the weight gradient per group
    (_conv_plan((3, 3), 2, groups=4), ("elementwise", "elementwise", "grouped")),
    # 4 channels in and 8 out per group: not narrow on both sides
    (_conv_plan((3, 3), 1, groups=2, oc=16), ("direct", "direct", "direct")),
    # other grouped plans take the plain lowering throughout: depthwise, wider groups
    (_conv_plan((3, 3), 2, groups=8), ("direct", "direct", "direct")),
    (_conv_plan((3, 3), 1, groups=2, src=(2, 9, 9, 16), oc=16), ("direct", "direct", "direct")),
    # one tap with a stride: XLA GPU may abort compiling its im2col, so never patches
    (_conv_plan((1, 1), 2), ("direct", "matmul_overlap_add", "direct")),
    # ... without one: the data gradient is one matrix product
    (_conv_plan((1, 1), 1), ("im2col", "phases_matmul", "im2col")),
    # one tap per phase (k2 s2): the sub-pixel convolution, its overlap-add being a reshape
    (_conv_plan((2, 2), 2), ("im2col", "subpixel_matmul", "im2col")),
    # 6x6 = 36 taps: the weight gradient does not gather either
    (_conv_plan((6, 6), 2), ("direct", "matmul_overlap_add", "direct")),
    # a few wide groups (StyleGAN2's 4 x 512): one convolution per group
    (_conv_plan((3, 3), 1, groups=2, src=(2, 9, 9, 128), oc=128),
     ("grouped", "grouped", "direct")),
])
def test_the_gpu_policy(plan, expected):
    """Without measuring, a GPU takes the rules measured on an H100 and an H200; every other
    platform but the CPU takes the plain lowering."""
    primitives = ("forward", "backward_data", "backward_weights")
    assert tuple(_policy(p, plan, "gpu") for p in primitives) == expected
    assert all(_policy(p, plan, "tpu") == "direct" for p in primitives)
    # the public question, asked from this CPU process for another platform
    assert tuple(polyconv.default_implementation("jax", p, plan, platform="gpu")
                 for p in primitives) == expected
    assert all(polyconv.default_implementation("jax", p, plan, platform="tpu") == "direct"
               for p in primitives)


def test_no_candidate_that_xla_gpu_may_abort_compiling():
    """A one-tap strided plan's im2col lowerings (XLA GPU's Triton fusion of the strided
    slice fails a check and aborts the process) are measured on CPU, never on GPU."""
    plan = _conv_plan((1, 1), 3)
    for primitive in ("forward", "backward_weights"):
        assert "im2col" in _candidates(primitive, plan, "cpu")
        on_gpu = _candidates(primitive, plan, "gpu")
        assert "im2col" not in on_gpu and "direct" in on_gpu
        # nor is it applicable there, which a forced lowering needs too
        assert not _applicable(primitive, plan, "im2col", "gpu")
        assert _applicable(primitive, plan, "im2col", "cpu")
    assert "im2col" in _candidates("forward", _conv_plan((1, 1), 1), "gpu")


def test_folded_is_measured_for_ungrouped_plans_only_on_cpu():
    """The folded lowerings' grouped convolutions are XLA CPU's grouped slow path (seconds
    for a depthwise weight gradient), so grouped plans do not measure them there; ungrouped
    ones do, and a forced one still computes a grouped plan (the lowering grid)."""
    for primitive in ("forward", "backward_weights"):
        assert "folded" in _candidates(primitive, _conv_plan((3, 3), 1), "cpu")
        grouped = _conv_plan((3, 3), 1, groups=4)
        assert "folded" not in _candidates(primitive, grouped, "cpu")
        assert _applicable(primitive, grouped, "folded", "cpu")
        assert "folded" in _candidates(primitive, grouped, "gpu")


def test_grouped_weight_gradients_measure_no_batch_grouped_convolution_on_cpu():
    """A grouped weight gradient computed by XLA CPU's batch-grouped convolution (``direct``,
    ``bands``, ``phases``) takes 10-600x the time of ``depthwise`` or ``grouped`` (seconds a
    call): where either applies, only they are measured on CPU. Where neither does, and on
    GPU, the plain lowering is measured."""
    for groups in (4, 8):                       # 2 channels per group on both sides, and 1
        plan = _conv_plan((3, 3), 1, groups=groups)
        names = _candidates("backward_weights", plan, "cpu")
        assert names and set(names) <= {"depthwise", "grouped"}
        assert "direct" in _candidates("backward_weights", plan, "gpu")
        assert "direct" in _candidates("forward", plan, "cpu")
    # 40 groups (past grouped's 32) of 16 channels (past depthwise's 8): grouped in blocks
    wide = _conv_plan((3, 3), 1, groups=40, src=(2, 9, 9, 640), oc=640)
    assert set(_candidates("backward_weights", wide, "cpu")) == {"grouped"}
    # ... of 1 input and 16 output channels (a multiplier past depthwise's 8, and too few
    # channels for blocks): the plain lowering
    narrow = _conv_plan((3, 3), 1, groups=40, src=(2, 9, 9, 40), oc=640)
    assert "direct" in _candidates("backward_weights", narrow, "cpu")
    assert "direct" in _candidates("backward_weights", _conv_plan((3, 3), 1), "cpu")


@pytest.mark.parametrize("nd", [1, 2, 3])
def test_folded_forward_is_measured_on_channels_first_data_with_three_axes_only_on_cpu(nd):
    """On CPU the folded forward of channels-first data runs within 10% of the plain
    convolution for one and two spatial axes (measuring it picks by noise), and halves the
    3-D one: only the latter measures it. Channels-last data, the weight gradient and other
    platforms measure it at every rank."""
    def plan(fmt):
        src = (2, 4, *(6,) * nd) if fmt == "NCX" else (2, *(6,) * nd, 4)
        return polyconv.infer_shape("Convolution", src, (*(3,) * nd, 4, 8), pads_begin=1,
                                    pads_end=1, data_format=fmt, weights_format="XIO")

    cf, cl = plan("NCX"), plan("NXC")
    assert ("folded" in _candidates("forward", cf, "cpu")) == (nd == 3)
    assert "folded" in _candidates("forward", cl, "cpu")
    assert "folded" in _candidates("backward_weights", cf, "cpu")
    assert "folded" in _candidates("forward", cf, "gpu")


@pytest.mark.parametrize("strides", [1, 2])
def test_small_plans_take_the_plain_lowering(monkeypatch, strides):
    """Compile time is part of a choice's cost: under 10^6 multiply-adds the CPU default is the
    plain lowering (issue 51's grouped 3-D ConvTranspose: 0.1 s to compile against 1.3-2 s for
    the elementwise loop, 34 s for the per-group one), a strided backward_data aside
    (never left to XLA CPU's lhs-dilated convolution)."""
    monkeypatch.setattr(rules, "SMALL_MACS", 1_000_000)
    plan = polyconv.infer_shape("ConvTranspose", (1, 5, 5, 5, 20), (3, 3, 3, 4, 20),
                                strides=strides, groups=4, weights_format="XOI")
    assert plan.macs < rules.SMALL_MACS
    for primitive in ("forward", "backward_data", "backward_weights"):
        chosen = _policy(primitive, plan.with_(primitive=primitive))
        strided = primitive == "backward_data" and strides > 1
        assert (chosen == "direct") != strided, (primitive, chosen)
        assert _policy(primitive, plan, "gpu") == rules.gpu_policy(
            primitive, plan, _choice.CHOOSER.applicable(primitive, plan))
    large = plan.with_(batch=8)
    assert large.macs >= rules.SMALL_MACS
    assert _policy("forward", large) == "elementwise"


def test_tiny_strided_backward_data_takes_the_plain_lowering(monkeypatch):
    """A strided backward_data counts the zeros its lhs-dilated convolution multiplies: the
    test grid's tiny ones (a few thousand multiply-adds, a fraction of a millisecond as the
    plain call) take it, where ``elementwise`` compiled for 5-20x the plain call's first call;
    issue 51's stride-2 plan is no longer tiny once its zeros count."""
    monkeypatch.setattr(rules, "SMALL_MACS", 1_000_000)
    tiny = polyconv.infer_shape("ConvTranspose", (2, 4, 4, 6), (3, 3, 3, 6), strides=2,
                                groups=1, weights_format="XOI").with_(primitive="backward_data")
    assert tiny.macs * 4 < rules.SMALL_MACS
    assert _policy("backward_data", tiny) == "direct"
    issue = polyconv.infer_shape("ConvTranspose", (1, 5, 5, 5, 20), (3, 3, 3, 4, 20),
                                 strides=2, groups=4, weights_format="XOI")
    assert issue.macs < rules.SMALL_MACS <= issue.macs * 8
    assert _policy("backward_data", issue.with_(primitive="backward_data")) != "direct"


@pytest.mark.parametrize("spatial", [(5, 5), (5, 5, 5)])
@pytest.mark.parametrize("strides", [1, 2])
def test_no_default_compiles_an_elementwise_loop_per_group(spatial, strides):
    """Compile time is part of a choice's cost: where each group's own problem would go
    elementwise, the CPU default is one elementwise program, not ``grouped`` with one per group
    (issue 51's 3-D ConvTranspose of 4 groups of 5 -> 4 channels: 34 s to compile against
    0.2 for ``direct``), and a 3-D or small plan is not split into regions (one more copy of
    the loop each)."""
    from polyconv_jax import _elementwise

    nd = len(spatial)
    plan = polyconv.infer_shape("ConvTranspose", (1, *spatial, 20), (*(3,) * nd, 4, 20),
                                strides=strides, groups=4, weights_format="XOI")
    for primitive in ("forward", "backward_data"):
        p = plan.with_(primitive=primitive)
        chosen = _policy(primitive, p)
        assert chosen == "elementwise", (primitive, chosen)
        assert not _elementwise.splits_by_regions(p)
    big = polyconv.infer_shape("Convolution", (8, 64, 64, 16), (3, 3, 1, 16), groups=16,
                               pads_begin=1, pads_end=1)
    with _on("cpu"):
        assert _elementwise.splits_by_regions(big)
        assert not _elementwise.splits_by_regions(big.with_(
            a_spatial=(32, 32, 32), b_spatial=(32, 32, 32), kernel=(3, 3, 3), strides=(1,) * 3,
            dilations=(1,) * 3, pads_begin=(1,) * 3, pads_end=(1,) * 3,
            output_padding=(0,) * 3))


def _grid_plans():
    """The JAX attribute grid's plans (tests/jax_grid.py), as given and with their channels
    and batch scaled past the small-plan bound, so that the CPU rules decide."""
    for op, variants, spatial in (("Convolution", _CONV_VARIANTS, _LARGE),
                                  ("ConvTranspose", _TRANSPOSE_VARIANTS, _SMALL)):
        for (nd, fmt, wfmt), variant in itertools.product(_LAYOUTS, variants):
            attrs = _attrs(variant, nd, fmt, wfmt)
            for scale in (1, 16):
                ic, oc = 4 * scale, 8 * scale
                groups = ic if variant.get("groups") == "dw" else variant.get("groups", 1)
                o, i = (oc, ic // groups) if op == "Convolution" else (oc // groups, ic)
                sizes = {"O": (o,), "I": (i,), "X": _KERNEL[nd]}
                w = tuple(itertools.chain.from_iterable(sizes[c] for c in wfmt))
                x = (8 * scale, *spatial[nd], ic) if fmt == "NXC" else (
                    8 * scale, ic, *spatial[nd])
                yield polyconv.infer_shape(op, x, w, groups=groups, **attrs).with_(
                    dtype="float32")


def test_every_rule_picks_an_applicable_exact_lowering():
    """The CPU rules and the GPU policy name a lowering that applies to the plan (the chooser
    would otherwise fall back silently to the plain one), and for backward_data one exact on
    non-finite inputs, over the attribute grid of the JAX tests."""
    plans = list(_grid_plans())
    assert any(p.macs >= rules.SMALL_MACS for p in plans)
    for plan, primitive, platform in itertools.product(
            plans, ("forward", "backward_data", "backward_weights"), ("cpu", "gpu")):
        p = plan.with_(primitive=primitive)
        with _on(platform):     # what applies depends on the platform
            names = CHOOSER.applicable(primitive, p)
            name = (rules.CPU_RULES[primitive](p) if platform == "cpu"
                    else rules.gpu_policy(primitive, p, names))
        assert name in names, (platform, primitive, name, p)
        assert (CHOOSER.get(primitive, name).exact_on_nonfinite
                or _subpixel.subpixel_is_exact(p)), (platform, primitive, name, p)


def _cl_plan(src, kernel, oc, strides=1, dilations=1, groups=1, pad=None):
    """A channels-last convolution, padded to keep its size (strides aside) unless given."""
    pad = [(k - 1) * dilations // 2 for k in kernel] if pad is None else pad
    return polyconv.infer_shape("Convolution", src, (*kernel, src[-1] // groups, oc),
                                strides=strides, dilations=dilations, groups=groups,
                                pads_begin=pad, pads_end=pad, weights_format="XIO")


@pytest.mark.parametrize(("plan", "expected"), [
    # a 1x1 kernel is one matrix product (ResNet-50's bottleneck 256->64)
    (_cl_plan((4, 28, 28, 256), (1, 1), 64),
     ("im2col", "phases_matmul", "im2col")),
    # stride 1, 2-D channels-last: the first axis's taps folded into channels (the input
    # gradient stays plain: folding it gained within noise for a longer compile)
    (_cl_plan((4, 28, 28, 64), (3, 3), 64), ("folded", "direct", "folded")),
    # k2 s2 (U-Net's up-convolution): space-to-depth, overlap-add as a reshape, im2col
    (_cl_plan((4, 32, 32, 64), (2, 2), 128, strides=2),
     ("space_to_depth", "matmul_overlap_add", "im2col")),
    # a stem (3 channels in, k7 s2): plain (folded gained nothing both records agree on, for
    # ~6x the plain call's compile), multiply-then-overlap-add, bands
    (_cl_plan((2, 112, 112, 3), (7, 7), 64, strides=2),
     ("direct", "matmul_overlap_add", "bands")),
    # a patch embedding (ViT's k16 s16): space-to-depth, the sub-pixel convolution as one
    # product (one piece for 256 phases), the weight gradient folded
    (_cl_plan((2, 64, 64, 3), (16, 16), 64, strides=16, pad=0),
     ("space_to_depth", "subpixel_matmul", "folded")),
    # a dilated kernel over wide channels (DeepLabV3's ASPP): one product per tap
    (_cl_plan((1, 33, 33, 512), (3, 3), 128, dilations=6), ("taps", "taps", "taps")),
    # strided 3-D: 2-D problems for the forward (27 wide windows would compile slowly as
    # patches; narrow ones or windows apart are gathered), multiply then overlap-add, im2col
    (_cl_plan((2, 16, 16, 16, 32), (3, 3, 3), 64, strides=2),
     ("sliced", "matmul_overlap_add", "im2col")),
    # ResNeXt's groups of 4: elementwise, the weight gradient per group
    (_cl_plan((4, 28, 28, 128), (3, 3), 128, groups=32),
     ("elementwise", "elementwise", "grouped")),
])
def test_the_cpu_policy(plan, expected):
    """The CPU rules by the plan's geometry (docs/design_notes.md has the records)."""
    primitives = ("forward", "backward_data", "backward_weights")
    assert plan.macs >= rules.SMALL_MACS
    assert tuple(_policy(p, plan.with_(primitive=p), "cpu") for p in primitives) == expected
    assert tuple(polyconv.default_implementation("jax", p, plan.with_(primitive=p),
                                                 platform="cpu")
                 for p in primitives) == expected


def test_the_public_listing_is_the_backends_table_and_what_a_call_runs(caplog):
    """``polyconv.implementations`` lists the lowerings of docs/architecture.md's glossary
    (:data:`polyconv_jax.LOWERINGS`), those that apply to a plan being what forcing honours;
    ``polyconv.default_implementation`` on this process's platform is what a jitted call of
    the op gets with nothing forced or measured (the chooser's log says)."""
    import logging

    from polyconv_jax import LOWERINGS

    plan = _plan()
    x = jnp.ones(plan.b_shape, jnp.float32)
    w = jnp.ones(plan.weights_shape, jnp.float32)
    for primitive in ("forward", "backward_data", "backward_weights"):
        assert polyconv.implementations("jax", primitive) == LOWERINGS[primitive]
    applicable = polyconv.implementations("jax", "backward_data", plan)
    assert set(applicable) < set(LOWERINGS["backward_data"]) and applicable[0] == "direct"
    caplog.set_level(logging.DEBUG, logger="polyconv")
    for name in LOWERINGS["backward_data"]:
        caplog.clear()
        with polyconv.implementation(f"jax:backward_data={name}"):
            jax.jit(partial(polyconv.conv_transpose, **ATTRS)).lower(x, w)
        honoured = any(f"-> {name} (forced)" in r.getMessage() for r in caplog.records)
        assert honoured == (name in applicable), name
    caplog.clear()
    jax.jit(partial(polyconv.conv_transpose, **ATTRS)).lower(x, w)
    pick = polyconv.default_implementation("jax", "backward_data", plan)
    assert any(f"-> {pick} (default)" in r.getMessage() for r in caplog.records)


def test_strided_channels_first_forward_of_narrow_patches_takes_one_product():
    """A strided channels-first forward whose patches make a narrow matrix (wav2vec 2.0's
    1->512 k10 s5 feature encoder) is one product over them, which reads channels-first data
    as it lies (6.6x faster than space-to-depth on a 2-CPU Xeon); channels-last, or with wide
    patches (a U-Net's k2 s2 over 256 channels), it stays space-to-depth."""
    wav2vec = polyconv.infer_shape("Convolution", (2, 1, 16000), (512, 1, 10), strides=5,
                                   data_format="NCX", weights_format="OIX")
    assert _policy("forward", wav2vec) == "im2col"
    last = polyconv.infer_shape("Convolution", (2, 16000, 1), (10, 1, 512), strides=5)
    assert _policy("forward", last) == "space_to_depth"
    wide = polyconv.infer_shape("Convolution", (4, 256, 64, 64), (128, 256, 2, 2), strides=2,
                                data_format="NCX", weights_format="OIX")
    assert _policy("forward", wide) == "space_to_depth"


#: the Xeon records
XEON_RECORDS = ("implementations-avx512.json", "corpus-avx512.json")
#: rows of the Xeon records that rules were read off (layer, primitive, the records on which
#: the pick is the fastest), where a narrow output, a lone input channel, more than 8 phases,
#: a few-channel input of many products, a wide 1-D channels-first input gradient or narrow
#: channels-last patches decide (docs/design_notes.md, 2026-11-29); DCGAN's weight gradient
#: is as fast on one of the two only (the other has im2col 1.27x faster), and taken for its
#: first call (im2col's is 3.8x the plain call's)
RECORD_ROWS = (("MNIST CNN: Conv 1->32 k3 28x28 NCX", "backward_data", XEON_RECORDS),
               ("MNIST CNN: Conv 1->32 k3 28x28 NCX", "backward_weights", XEON_RECORDS),
               ("wav2vec 2.0: Conv1d 1->512 k10 s5 NCX", "backward_weights", XEON_RECORDS),
               ("ViT-B/16: patch embedding 3->768 k16 s16 224x224", "backward_data",
                XEON_RECORDS),
               ("FCN-8s: ConvT 21->21 k16 s8 64x64 NCX", "backward_data", XEON_RECORDS),
               ("DCGAN G: ConvT 64->3 k4 s2 32x32", "forward", XEON_RECORDS),
               ("wav2vec 2.0: Conv1d 512->512 k3 s2 NCX", "backward_data", XEON_RECORDS),
               ("DCGAN G: ConvT 64->3 k4 s2 32x32", "backward_weights", XEON_RECORDS[:1]))
#: a pick within this of the fastest recorded is as fast (rows move more between runs)
RECORD_NOISE = 1.05


def test_the_cpu_policy_against_the_records():
    """On the rows the CPU rules were read off, the pick is as fast as the fastest lowering
    recorded on the Xeon records named for the row, and its first call (compile included) is
    within 3x the plain call's on the record that keeps first calls."""
    from pathlib import Path

    from polyconv.benchmarks import policy_check

    records = Path(__file__).resolve().parents[1] / "docs" / "records"
    entries = policy_check.check([records / name for name in XEON_RECORDS], "jax")
    for layer, primitive, names in RECORD_ROWS:
        rows = [e for e in entries if (e["layer"], e["primitive"]) == (layer, primitive)
                and e["record"] in names]
        assert rows, (layer, primitive)
        for e in rows:
            assert e["ratio"] is not None and e["ratio"] <= RECORD_NOISE, e
    first = {(r["layer"], r["primitive"]): r["first_call_s"] for r in json.loads(
        (records / XEON_RECORDS[0]).read_text())["rows"] if r["backend"] == "jax"}
    for layer, primitive, _ in RECORD_ROWS:
        pick = next(e["pick"] for e in entries if e["record"] == XEON_RECORDS[0]
                    and (e["layer"], e["primitive"]) == (layer, primitive))
        seconds = first[layer, primitive]
        assert seconds[pick] <= 3 * seconds["direct"], (layer, primitive, pick)
