"""The numpy backend's measured choice (opt-in: :func:`polyconv.autotune`): on a plan's first
call the strategies the cost model puts near its pick are timed, the fastest is kept, and the
call returns its result; with measuring off (the default) nothing is timed.

The timing itself is made deterministic by slowing all strategies but one (a sleep far
longer than the call), so each test knows which strategy must win.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time

import numpy as np
import polyconv_numpy
import pytest
from oracle import assert_within_bound, reference
from polyconv_numpy import CHOOSER, _measuring

import polyconv
from polyconv import _cache_file, _choice
from polyconv._choice import pick, time_candidates

# a dense 3x3 layer the model puts at a few milliseconds, with several candidates
SRC, WTS = (8, 32, 32, 64), (3, 3, 64, 64)
ATTRS = {"strides": 2, "pads_begin": 1, "pads_end": 1}
PLAN = dataclasses.replace(polyconv.infer_shape("convolution", SRC, WTS, **ATTRS),
                           dtype="float32")
PRIMITIVE = "forward"
CANDIDATES = _measuring.candidates(CHOOSER, PRIMITIVE, PLAN)


def _wrap(monkeypatch, wrapper) -> None:
    """Each forward strategy's kernel replaced by ``wrapper(name, kernel)``."""
    for name in CHOOSER.names(PRIMITIVE):
        record = CHOOSER.get(PRIMITIVE, name)
        monkeypatch.setitem(CHOOSER._by_name, (PRIMITIVE, name),
                            dataclasses.replace(record, run=wrapper(name, record.run)))


@pytest.fixture
def fresh(monkeypatch):
    """No measurement yet in this process, no cache file, no switch in the environment."""
    for var in (_choice.FORCE_ENV, _choice.AUTOTUNE_ENV, _cache_file.CACHE_ENV):
        monkeypatch.delenv(var, raising=False)
    CHOOSER.forget()
    yield
    CHOOSER.forget()


@pytest.fixture
def calls(fresh, monkeypatch):
    """Each strategy's calls, by name, in order."""
    seen: list[str] = []

    def counted(name, fn):
        return lambda *args: seen.append(name) or fn(*args)

    _wrap(monkeypatch, counted)
    return seen


@pytest.fixture
def measuring(calls):
    with polyconv.autotune():
        yield calls


def _slow_all_but(monkeypatch, fast: str) -> None:
    def slowed(name, fn):
        # half a second: well past the 25% tie, even for a winner slowed by a loaded machine
        return fn if name == fast else lambda *args: time.sleep(0.5) or fn(*args)

    _wrap(monkeypatch, slowed)


def _inputs():
    rng = np.random.default_rng(0)
    return (rng.standard_normal(SRC, dtype=np.float32),
            rng.standard_normal(WTS, dtype=np.float32))


def test_the_plan_has_several_candidates_the_models_pick_first():
    assert len(CANDIDATES) >= 2
    assert CANDIDATES[0] == CHOOSER.default(PRIMITIVE, PLAN)


def test_the_pick_handed_in_comes_first_even_where_another_estimate_is_lower():
    """The pick handed in (the chooser's, which a cached or forced one replaces) is the one a
    tie keeps, so it leads the candidates even where another is estimated cheaper."""
    costs = polyconv_numpy.costs(PRIMITIVE, PLAN)
    cheapest, second = sorted(costs, key=costs.__getitem__)[:2]
    names = _measuring.candidates(CHOOSER, PRIMITIVE, PLAN, second)
    assert names[0] == second and cheapest in names


@pytest.mark.parametrize("winner", range(len(CANDIDATES)))
def test_the_fastest_candidate_is_kept_and_computes_the_first_call(measuring, monkeypatch,
                                                                   winner):
    names = CANDIDATES
    _slow_all_but(monkeypatch, names[winner])
    x, w = _inputs()
    y = polyconv.convolution(x, w, **ATTRS)
    ref = reference("convolution", x, w, **ATTRS)
    assert_within_bound(y, ref.y, ref.abs_sum, ref.n, "float32")
    assert list(CHOOSER.chosen().values()) == [names[winner]]
    # every candidate ran, at least once each; the result came from the winner's last call
    assert set(measuring) == set(names) and measuring[-1] == names[winner]
    measuring.clear()
    polyconv.convolution(x, w, **ATTRS)        # later calls: the winner only, no measuring
    assert measuring == [names[winner]]
    assert CHOOSER.cached(PRIMITIVE, PLAN, names) == names[winner]


@pytest.mark.parametrize("how", ["autotune off", "forced", "non-finite", "small"])
def test_nothing_is_measured(measuring, monkeypatch, how):
    """With measuring off, a forced strategy, non-finite weights (the exact path), or a call
    the model puts under a millisecond, each call runs one strategy and nothing is kept."""
    x, w = _inputs()
    if how == "autotune off":
        monkeypatch.setenv(_choice.AUTOTUNE_ENV, "0")
        with polyconv.autotune(False):
            polyconv.convolution(x, w, **ATTRS)
        assert measuring == [CHOOSER.default(PRIMITIVE, PLAN)]
    elif how == "forced":
        with polyconv.implementation("numpy:forward=space_to_depth"):
            polyconv.convolution(x, w, **ATTRS)
        assert measuring == ["space_to_depth"]
    elif how == "non-finite":
        w[1, 1, 5, 7] = np.inf     # in the weights: the grid would add 0 * inf terms
        y = polyconv.convolution(x, w, **ATTRS)
        assert measuring == ["exact"]
        assert np.isinf(y).any() and np.isfinite(y).any()
    else:
        polyconv.convolution(x[:1, :8, :8], w, **ATTRS)
        assert len(measuring) == 1
    assert CHOOSER.chosen() == {} and CHOOSER.measured() == {}


def test_measuring_is_off_by_default(calls, monkeypatch):
    """No switch set: a plan's first call asks for no measurement and times nothing (it
    costs what any call costs); the model's pick computes it."""
    asked = []
    real = _measuring.Call.measurement
    monkeypatch.setattr(_measuring.Call, "measurement",
                        lambda self, default: asked.append(default) or real(self, default))
    x, w = _inputs()
    polyconv.convolution(x, w, **ATTRS)
    assert asked == [] and calls == [CHOOSER.default(PRIMITIVE, PLAN)]
    assert CHOOSER.measured() == {}


def test_concurrent_first_calls_measure_once(measuring, monkeypatch):
    """Six threads make a plan's first call at once under autotune: one of them measures,
    the others wait for its choice and run it (issue 53: each thread measured)."""
    winner = CANDIDATES[-1]
    _slow_all_but(monkeypatch, winner)
    timings = []
    real = _measuring.Call.time
    monkeypatch.setattr(_measuring.Call, "time",
                        lambda self, names: timings.append(names) or real(self, names))
    x, w = _inputs()
    barrier, results, errors = threading.Barrier(6), [], []

    def first_call():
        try:
            with polyconv.autotune():
                barrier.wait()
                results.append(polyconv.convolution(x, w, **ATTRS))
        except Exception as exc:         # reported below, with the thread's traceback lost
            errors.append(exc)

    threads = [threading.Thread(target=first_call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(results) == 6
    assert len(timings) == 1 and list(CHOOSER.chosen().values()) == [winner]
    ref = reference("convolution", x, w, **ATTRS)
    for y in results:
        assert_within_bound(y, ref.y, ref.abs_sum, ref.n, "float32")


def test_time_candidates_drops_slow_ones_and_takes_each_ones_fastest_call():
    script = {"a": [3.0, 1.0, 2.0], "b": [2.5, 2.0, 0.5], "slow": [9.0], "broken": []}
    timers = {name: (lambda s=seq: s.pop(0)) for name, seq in script.items()}
    times = time_candidates(timers, rounds=2, drop_factor=3.0)
    # 'broken' raises (empty script): inf; 'slow' took more than 3x the best: one call
    assert times == {"a": 1.0, "b": 0.5, "slow": 9.0, "broken": math.inf}
    assert all(not seq for name, seq in script.items())


def test_pick_keeps_a_preferred_candidate_within_its_tie():
    times = {"model": 1.03, "other": 1.0, "third": 0.99}
    assert pick(times) == "third"
    assert pick(times, (("model", 0.05),)) == "model"
    assert pick(times, (("model", 0.03), ("other", 0.03))) == "other"
    assert pick({"model": 1.2, "other": 1.0}, (("model", 0.05),)) == "other"


def test_the_backend_keeps_the_models_pick_within_a_quarter():
    assert CHOOSER.ties == ((None, _measuring.MEASURE_TIE),) and _measuring.MEASURE_TIE == 0.25
    assert CHOOSER.implementations == polyconv_numpy.STRATEGIES
