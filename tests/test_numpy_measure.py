"""The numpy backend's measured choice: on a plan's first call the strategies the cost model
puts near its pick are timed, the fastest is kept, and the call returns its result.

The timing itself is made deterministic by slowing all strategies but one (a sleep far
longer than the call), so each test knows which strategy must win.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import polyconv_numpy
import pytest
from oracle import assert_within_bound, reference
from polyconv_numpy import _choice

import polyconv
from polyconv._measure import pick, time_candidates

# a dense 3x3 layer the model puts at a few milliseconds, with several candidates
SRC, WTS = (8, 32, 32, 64), (3, 3, 64, 64)
ATTRS = {"strides": 2, "pads_begin": 1, "pads_end": 1}
PLAN = dataclasses.replace(polyconv.infer_shape("convolution", SRC, WTS, **ATTRS),
                           dtype="float32")
PRIMITIVE = "forward"


@pytest.fixture
def measuring(monkeypatch):
    """Measuring on, with an empty record of measurements; each strategy's calls counted."""
    monkeypatch.setattr(_choice, "_measurements", {})
    calls: list[str] = []
    table = polyconv_numpy._IMPLEMENTATIONS[PRIMITIVE]
    for name, fn in list(table.items()):
        def counted(*args, _name=name, _fn=fn):
            calls.append(_name)
            return _fn(*args)
        monkeypatch.setitem(table, name, counted)
    with polyconv_numpy.autotune(True):
        yield calls


def _slow_all_but(monkeypatch, fast: str) -> None:
    table = polyconv_numpy._IMPLEMENTATIONS[PRIMITIVE]
    for name, fn in list(table.items()):
        if name != fast:
            def slow(*args, _fn=fn):
                time.sleep(0.2)
                return _fn(*args)
            monkeypatch.setitem(table, name, slow)


def _inputs():
    rng = np.random.default_rng(0)
    return (rng.standard_normal(SRC, dtype=np.float32),
            rng.standard_normal(WTS, dtype=np.float32))


with polyconv_numpy.autotune(True):
    CANDIDATES = _choice.candidates(PRIMITIVE, PLAN)


def test_the_plan_has_several_candidates_the_models_pick_first():
    assert len(CANDIDATES) >= 2
    with polyconv_numpy.autotune(False):
        assert CANDIDATES[0] == polyconv_numpy.choose(PRIMITIVE, PLAN)


def test_the_models_pick_comes_first_even_where_the_exact_estimate_is_lower(monkeypatch):
    """The model's pick is the one a tie keeps, so it leads the candidates even where the
    exact path (priced for measuring only) is estimated cheaper."""
    monkeypatch.setattr(_choice, "_exact", lambda primitive, plan, z: 1e-9)
    _choice._measurable.cache_clear()
    try:
        with polyconv_numpy.autotune(False):
            pick_ = polyconv_numpy.choose(PRIMITIVE, PLAN)
        with polyconv_numpy.autotune(True):
            names = _choice.candidates(PRIMITIVE, PLAN)
    finally:
        _choice._measurable.cache_clear()
    assert pick_ != "exact" and names[0] == pick_ and "exact" in names


@pytest.mark.parametrize("winner", range(len(CANDIDATES)))
def test_the_fastest_candidate_is_kept_and_computes_the_first_call(measuring, monkeypatch,
                                                                   winner):
    names = CANDIDATES
    _slow_all_but(monkeypatch, names[winner])
    x, w = _inputs()
    y = polyconv.convolution(x, w, **ATTRS)
    ref = reference("convolution", x, w, **ATTRS)
    assert_within_bound(y, ref.y, ref.abs_sum, ref.n, "float32")
    assert list(polyconv_numpy.measured_choices().values()) == [names[winner]]
    # every candidate ran, at least once each; the result came from the winner's last call
    assert set(measuring) == set(names) and measuring[-1] == names[winner]
    measuring.clear()
    polyconv.convolution(x, w, **ATTRS)        # later calls: the winner only, no measuring
    assert measuring == [names[winner]]
    assert polyconv_numpy.choose(PRIMITIVE, PLAN) == names[winner]


@pytest.mark.parametrize("how", ["autotune off", "forced", "non-finite", "small"])
def test_nothing_is_measured(measuring, monkeypatch, how):
    """With measuring off, a forced strategy, non-finite weights (the exact path), or a call
    the model puts under a millisecond, each call runs one strategy and nothing is kept."""
    x, w = _inputs()
    if how == "autotune off":
        monkeypatch.setenv(_choice.AUTOTUNE_ENV, "0")
        with polyconv_numpy.autotune(False):
            polyconv.convolution(x, w, **ATTRS)
        assert measuring == [polyconv_numpy.choose(PRIMITIVE, PLAN)]
    elif how == "forced":
        with polyconv_numpy.strategy(forward="overlap"):
            polyconv.convolution(x, w, **ATTRS)
        assert measuring == ["overlap"]
    elif how == "non-finite":
        w[1, 1, 5, 7] = np.inf     # in the weights: the grid would add 0 * inf terms
        y = polyconv.convolution(x, w, **ATTRS)
        assert measuring == ["exact"]
        assert np.isinf(y).any() and np.isfinite(y).any()
    else:
        polyconv.convolution(x[:1, :8, :8], w, **ATTRS)
        assert len(measuring) == 1
    assert polyconv_numpy.measured_choices() == {}


def test_time_candidates_drops_slow_ones_and_takes_each_ones_fastest_call():
    script = {"a": [3.0, 1.0, 2.0], "b": [2.5, 2.0, 0.5], "slow": [9.0], "broken": []}
    calls = {name: (lambda s=seq: s.pop(0)) for name, seq in script.items()}
    times = time_candidates(calls, rounds=2, drop_factor=3.0)
    # 'broken' raises (empty script): inf; 'slow' took more than 3x the best: one call
    assert times == {"a": 1.0, "b": 0.5, "slow": 9.0, "broken": math.inf}
    assert all(not seq for name, seq in script.items())


def test_pick_keeps_a_preferred_candidate_within_its_tie():
    times = {"model": 1.03, "other": 1.0, "third": 0.99}
    assert pick(times) == "third"
    assert pick(times, (("model", 0.05),)) == "model"
    assert pick(times, (("model", 0.03), ("other", 0.03))) == "other"
    assert pick({"model": 1.2, "other": 1.0}, (("model", 0.05),)) == "other"
