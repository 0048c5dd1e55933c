"""The one chooser (polyconv/_choice.py) on a backend of its own: forcing and its grammar,
the default pick without timing, opt-in measuring once per plan, the cache file, the log."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time

import pytest

import polyconv
from polyconv import _cache_file, _choice
from polyconv._choice import Chooser, Implementation, Measurement

PLAN = polyconv.infer_shape("Convolution", (2, 8, 8, 4), (3, 3, 4, 6), weights_format="XIO",
                            strides=2)
#: costs in seconds: "cheap" is the default pick, "fast" what a measurement finds fastest
COSTS = {"plain": 3.0, "cheap": 1.0, "fast": 2.0, "narrow": 0.5}
TIMES = {"plain": 3.0, "cheap": 2.0, "fast": 1.0, "narrow": 0.1}


def _record(name: str, applies=lambda plan: True) -> Implementation:
    return Implementation(name, "forward", run=lambda: name, applies=applies,
                          cost=lambda plan: COSTS[name])


@pytest.fixture
def chooser(monkeypatch):
    """A backend ``fake`` with four forward implementations; ``narrow`` never applies."""
    for var in (_choice.FORCE_ENV, _choice.AUTOTUNE_ENV, _cache_file.CACHE_ENV):
        monkeypatch.delenv(var, raising=False)
    c = Chooser("fake", [_record("plain"), _record("cheap"), _record("fast"),
                         _record("narrow", applies=lambda plan: False)])
    c.timed = []                  # every time() call the chooser made, with its names

    def measure(default: str) -> Measurement:
        def time_them(names):
            c.timed.append(tuple(names))
            time.sleep(0.05)      # long enough for concurrent first calls to overlap
            return {n: TIMES[n] for n in names}
        return Measurement(c.applicable("forward", PLAN), time_them)

    c.measure = measure
    yield c
    _choice._CHOOSERS.pop("fake", None)


def test_the_default_pick_is_the_cheapest_applicable_and_nothing_is_timed(chooser):
    assert not _choice.autotune_enabled()
    assert chooser.choose("forward", PLAN, measure=chooser.measure) == "cheap"
    assert chooser.timed == []


def test_autotune_measures_once_and_keeps_the_fastest(chooser):
    with polyconv.autotune():
        assert chooser.choose("forward", PLAN, measure=chooser.measure) == "fast"
        assert chooser.choose("forward", PLAN, measure=chooser.measure) == "fast"
    assert chooser.timed == [("plain", "cheap", "fast")]
    assert list(chooser.chosen().values()) == ["fast"]


def test_autotune_from_the_environment(chooser, monkeypatch):
    monkeypatch.setenv(_choice.AUTOTUNE_ENV, "1")
    assert chooser.choose("forward", PLAN, measure=chooser.measure) == "fast"
    with polyconv.autotune(False):
        assert chooser.choose("forward", PLAN.with_(batch=3), measure=chooser.measure) == "cheap"


def test_the_default_pick_is_kept_within_its_tie(chooser):
    chooser.ties = ((None, 1.5),)       # cheap's 2.0 is within 2.5x of fast's 1.0
    with polyconv.autotune():
        assert chooser.choose("forward", PLAN, measure=chooser.measure) == "cheap"


def test_concurrent_first_calls_measure_once(chooser):
    results = []

    def first_call():
        with polyconv.autotune():       # the switch is per thread
            results.append(chooser.choose("forward", PLAN, measure=chooser.measure))
    threads = [threading.Thread(target=first_call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["fast"] * 6
    assert len(chooser.timed) == 1


@pytest.mark.parametrize(("spec", "expected"), [
    ("fake:forward=plain", "plain"), ("fast", "fast"), ("forward=fast", "fast"),
    ("fake:plain", "plain"), ("plain, fake:forward=fast", "fast"),
    ("narrow", "cheap"),                 # forced where it does not apply: the default pick
])
def test_forcing(chooser, spec, expected):
    with polyconv.implementation(spec):
        assert chooser.choose("forward", PLAN) == expected
    assert chooser.choose("forward", PLAN) == "cheap"


def test_forcing_by_keyword_and_nested(chooser):
    with polyconv.implementation(forward="plain"):
        assert chooser.choose("forward", PLAN) == "plain"
        with polyconv.implementation("fake:fast"):
            assert chooser.choose("forward", PLAN) == "fast"
        assert chooser.choose("forward", PLAN) == "plain"


def test_forcing_from_the_environment(chooser, monkeypatch):
    monkeypatch.setenv(_choice.FORCE_ENV, "fake:forward=plain")
    assert chooser.choose("forward", PLAN) == "plain"
    with polyconv.implementation("fast"):     # the block replaces the environment
        assert chooser.choose("forward", PLAN) == "fast"


@pytest.mark.parametrize(("spec", "words"), [
    ("nosuch", ["no implementation 'nosuch'", "fake forward: plain, cheap, fast, narrow"]),
    ("fake:backward_data=plain", ["no implementation 'fake:backward_data=plain'"]),
    ("fake:sideways=plain", ["unknown primitive 'sideways'", "forward, backward_data"]),
    ("nobackend:plain", ["unknown backend 'nobackend'", "numpy"]),
])
def test_unknown_names_raise_naming_what_is_known(chooser, monkeypatch, spec, words):
    with pytest.raises(ValueError, match=r"^implementation: ") as info, \
            polyconv.implementation(spec):
        pass
    for word in words:
        assert word in str(info.value)
    monkeypatch.setenv(_choice.FORCE_ENV, spec)
    with pytest.raises(ValueError, match=rf"^{_choice.FORCE_ENV}: "):
        chooser.choose("forward", PLAN)


def test_settings_follow_the_switches(chooser):
    plain = _choice.settings()
    with polyconv.implementation("fast"):
        assert _choice.settings() != plain
    with polyconv.autotune():
        assert _choice.settings() != plain
    assert _choice.settings() == plain
    hash(plain)


def test_the_log_says_what_each_plan_got_and_when_measuring_runs(chooser, caplog):
    caplog.set_level(logging.DEBUG, logger="polyconv")
    chooser.choose("forward", PLAN, measure=chooser.measure)
    with polyconv.autotune():
        chooser.choose("forward", PLAN, measure=chooser.measure)
    text = [r.getMessage() for r in caplog.records]
    assert any("fake forward" in t and "-> cheap (default)" in t for t in text)
    notices = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(notices) == 1 and "measuring 3 fake implementations" in notices[0].getMessage()


# --- the cache file ----------------------------------------------------------------------

def _fresh(chooser: Chooser) -> Chooser:
    """A new process's chooser for the same backend (same records, nothing remembered)."""
    fresh = Chooser("fake", chooser.implementations)
    fresh.timed, fresh.measure = chooser.timed, chooser.measure
    return fresh


def test_the_cache_file_carries_a_choice_to_another_process(chooser, tmp_path, monkeypatch):
    path = tmp_path / "sub" / "choices.json"
    monkeypatch.setenv(_cache_file.CACHE_ENV, str(path))
    with polyconv.autotune():
        chooser.choose("forward", PLAN, measure=chooser.measure)
        stored = json.loads(path.read_text())
        assert stored["format"] == _cache_file.CACHE_FORMAT
        assert stored["version"] == _cache_file.CACHE_VERSION
        assert list(stored["choices"].values()) == ["fast"]
        assert _fresh(chooser).choose("forward", PLAN, measure=chooser.measure) == "fast"
    assert len(chooser.timed) == 1
    assert sorted(p.name for p in path.parent.iterdir()) == ["choices.json"]


@pytest.mark.parametrize("text", [
    "{not json", "[]", json.dumps({"format": "other", "version": 1, "choices": {}}),
    json.dumps({"format": _cache_file.CACHE_FORMAT, "version": 99, "choices": {}}),
])
def test_a_corrupt_or_foreign_cache_file_is_ignored_with_a_warning(chooser, tmp_path,
                                                                   monkeypatch, text):
    path = tmp_path / "choices.json"
    path.write_text(text)
    monkeypatch.setenv(_cache_file.CACHE_ENV, str(path))
    with polyconv.autotune(), pytest.warns(UserWarning, match="is not a polyconv autotune"):
        assert chooser.choose("forward", PLAN, measure=chooser.measure) == "fast"
    assert len(chooser.timed) == 1
    assert json.loads(path.read_text())["version"] == _cache_file.CACHE_VERSION


def test_a_cached_name_that_is_not_a_candidate_is_not_trusted(chooser, tmp_path, monkeypatch):
    path = tmp_path / "choices.json"
    monkeypatch.setenv(_cache_file.CACHE_ENV, str(path))
    key = chooser._key("forward", PLAN, "")
    path.write_text(json.dumps({"format": _cache_file.CACHE_FORMAT,
                                "version": _cache_file.CACHE_VERSION, "choices": {key: "narrow"}}))
    with polyconv.autotune():
        assert chooser.choose("forward", PLAN, measure=chooser.measure) == "fast"
    assert len(chooser.timed) == 1


def test_the_cache_is_written_through_a_private_temporary(chooser, tmp_path, monkeypatch):
    path = tmp_path / "choices.json"
    victim = tmp_path / "victim"
    victim.write_text("keep")
    for name in (f"choices.json.{os.getpid()}.tmp", ".choices.json.tmp"):
        (tmp_path / name).symlink_to(victim)      # links planted at predictable names
    monkeypatch.setenv(_cache_file.CACHE_ENV, str(path))
    with polyconv.autotune():
        chooser.choose("forward", PLAN, measure=chooser.measure)
    assert victim.read_text() == "keep"
    assert json.loads(path.read_text())["choices"]
    assert not path.is_symlink()


def test_a_cache_path_that_cannot_be_written_warns_and_leaves_nothing(chooser, tmp_path,
                                                                     monkeypatch):
    path = tmp_path / "a-folder"
    path.mkdir()
    monkeypatch.setenv(_cache_file.CACHE_ENV, str(path))
    with polyconv.autotune(), pytest.warns(UserWarning, match="cannot"):
        assert chooser.choose("forward", PLAN, measure=chooser.measure) == "fast"
    assert list(tmp_path.iterdir()) == [path]
    assert list(path.iterdir()) == []


# --- the plan as a key --------------------------------------------------------------------

def test_a_plan_and_its_alias_and_its_gradient_share_one_key():
    conv = polyconv.infer_shape("Convolution", (1, 10, 10, 2), (3, 3, 2, 4), weights_format="XIO",
                                strides=2)
    data = polyconv.infer_shape("ConvolutionBackwardData", (1, 4, 4, 4), (3, 3, 2, 4),
                                weights_format="XIO", strides=2, dst_shape=(1, 10, 10, 2))
    assert conv.output_padding != data.output_padding      # the rows the size rule leaves
    assert conv.with_(primitive="backward_data") == data
    assert conv.with_(primitive="backward_data").key == data.key
    assert conv.with_(dtype="float16").key != conv.key


def test_the_environment_changing_in_another_thread_never_breaks_a_call(chooser, monkeypatch):
    """Another thread setting and unsetting ``POLYCONV_IMPLEMENTATION`` meanwhile: each call
    reads the variable once, so it sees either value, never an error."""
    monkeypatch.delenv(_choice.FORCE_ENV, raising=False)
    stop, seen, errors = threading.Event(), set(), []

    def toggle():
        while not stop.is_set():
            os.environ[_choice.FORCE_ENV] = "fake:forward=plain"
            os.environ.pop(_choice.FORCE_ENV, None)

    other = threading.Thread(target=toggle)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)             # switch threads as often as the interpreter can
    other.start()
    try:
        for _ in range(200_000):
            try:
                seen.add(chooser.choose("forward", PLAN))
            except Exception as exc:        # the failure this test exists for
                errors.append(exc)
                break
    finally:
        stop.set()
        other.join()
        sys.setswitchinterval(interval)
        os.environ.pop(_choice.FORCE_ENV, None)
    assert not errors and seen <= {"plain", "cheap"}
