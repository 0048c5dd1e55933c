"""The benchmark records the docs are drawn from: one per benchmark and machine kind
(``docs/records/<benchmark>-<kind>.json``), each what its name says, each readable by the
report code that draws the benchmarks page. No speed is asserted: the records are data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from polyconv.benchmarks import harness, report

ROOT = Path(__file__).resolve().parent.parent
RECORDS = sorted((ROOT / "docs" / "records").glob("*.json"))
#: the benchmarks whose records the docs page draws
DRAWN = ("corpus", "suite", "first-calls", "implementations", "overhead", "spatial")


def _kind(m: dict) -> str:
    return m.get("kind") or harness.machine_kind(m)


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name)
def test_each_record_is_of_the_machine_kind_its_name_says(path):
    benchmark, _, kind = path.stem.rpartition("-")
    record = json.loads(path.read_text())
    assert benchmark in DRAWN, f"{path.name}: no report draws a {benchmark!r} record"
    assert {_kind(run["machine"]) for run in harness.runs(record)} == {kind}


def test_one_record_per_benchmark_and_kind():
    found = report.records(ROOT / "docs" / "records")
    assert set(found) <= set(DRAWN)
    assert {"avx512", "avx2", "h100", "h200"} <= set(found["corpus"])
    # no record of the old flat layout is left beside them
    assert not list((ROOT / "docs").glob("benchmarks*.json"))


@pytest.mark.parametrize(("machine", "kind"), [
    ({"gpu": "NVIDIA H100 80GB HBM3", "avx512": True}, "h100"),
    ({"gpu": "NVIDIA H200"}, "h200"),
    ({"gpu": "Tesla T4"}, "t4"),
    ({"avx512": True, "avx2": True, "platform": "Linux-6.1-x86_64-with-glibc2.36"}, "avx512"),
    ({"avx512": False, "avx2": True, "platform": "Linux-6.1-x86_64-with-glibc2.36"}, "avx2"),
    ({"avx512": False, "platform": "Linux-6.1-x86_64-with-glibc2.36"}, "avx2"),
    ({"avx512": False, "avx2": False, "platform": "Linux-6.1-aarch64-with-glibc2.36"},
     "aarch64"),
    ({"platform": "macOS-14.4-arm64-arm-64bit"}, "arm64"),
])
def test_machine_kinds(machine, kind):
    assert harness.machine_kind(machine) == kind


def test_the_page_has_a_section_per_kind_with_a_record(tmp_path):
    # two corpus records and one suite record: the generated parts have those sections and
    # plots, and the benchmark without a record says how to make one
    records = tmp_path / "records"
    records.mkdir()
    for name in ("corpus-avx2.json", "corpus-h100.json", "suite-avx512.json"):
        shutil.copy(ROOT / "docs" / "records" / name, records / name)
    out = tmp_path / "out"
    out.mkdir()
    report.docs_pages(records, out)
    corpus = (out / "benchmarks-corpus.md").read_text()
    assert [line for line in corpus.splitlines() if line.startswith("### ")] == [
        "### CPU with AVX2 (no AVX-512)", "### NVIDIA H100"]
    assert (out / "corpus-avx2.png").stat().st_size and (out / "corpus-h100.png").stat().st_size
    assert "### The suite on a CPU with AVX-512" in (out / "benchmarks-suite.md").read_text()
    assert "nox -s bench" in (out / "benchmarks-first-calls.md").read_text()


def test_an_implementations_record_is_drawn(tmp_path):
    # the record `polyconv bench --implementations --json` writes, on a tiny run's rows
    from polyconv.benchmarks.implementations import summarize

    rows = [{"layer": "L", "backend": "numpy", "primitive": "forward", "dtype": "float32",
             "default": "gather", "seconds": {"gather": 2.0, "overlap": 1.0},
             "first_call_s": {"gather": 2.0, "overlap": 1.0}}]
    records = tmp_path / "records"
    records.mkdir()
    machine = {**harness.machine(), "kind": "avx2"}
    (records / "implementations-avx2.json").write_text(json.dumps(
        {"machine": machine, "rows": rows, "summary": summarize(rows)}))
    report.docs_pages(records, tmp_path)
    text = (tmp_path / "benchmarks-implementations.md").read_text()
    assert "### Every implementation on a CPU with AVX2 (no AVX-512)" in text
    assert "takes 2.000x the fastest" in text and "| forward=overlap | 1 | 1 |" in text


def test_a_spatial_record_is_drawn(tmp_path):
    # the record `polyconv bench --spatial --json` writes: one row per level, devices, mode
    # and side
    rows = [{"upsampling": "k2 s2", "devices": 2, "mode": "gradient", "side": side,
             "seconds": s, "memory_bytes": m, "received_bytes": r, "collectives": c}
            for side, s, m, r, c in (("polyconv", 0.002, 3 * 2**20, 2**19,
                                      ["collective-permute", "all-reduce"]),
                                     ("xla", 0.004, None, 2**21, ["all-gather"]))]
    records = tmp_path / "records"
    records.mkdir()
    (records / "spatial-avx2.json").write_text(json.dumps(
        {"machine": {**harness.machine(), "kind": "avx2"}, "size": [8, 4, 4], "channels": 4,
         "rows": rows}))
    report.docs_pages(records, tmp_path)
    text = (tmp_path / "benchmarks-spatial.md").read_text()
    assert "### Spatial sharding on a CPU with AVX2 (no AVX-512)" in text
    assert "8x4x4 volume of 4 channels" in text
    assert ("| k2 s2 | 2 | gradient | polyconv | 2.00 | 3.00 | 0.500 | collective-permute, "
            "all-reduce |") in text
    assert "| k2 s2 | 2 | gradient | xla | 4.00 |  | 2.000 | all-gather |" in text


def test_the_summary_takes_each_rows_latest_run_and_the_ratios_arithmetic():
    row = {"layer": "L", "mode": "forward", "median_s": {"polyconv-jax": 2.0, "torch": 1.0,
                                                          "lax": 4.0}}
    later = {**row, "median_s": {"polyconv-jax": 3.0, "torch": 1.0, "lax": 6.0}}
    other = {**row, "mode": "gradient", "median_s": {"polyconv-jax": 1.0, "torch": 4.0}}
    record = {"runs": [{"machine": {}, "layers": [row, other]},
                       {"machine": {}, "layers": [later]},
                       {"machine": {"batch_scale": 8}, "layers": [row]}]}
    rows = report.latest_rows(record)
    assert [(r["label"], r["mode"], r["median_s"]["polyconv-jax"]) for r in rows] == [
        ("L", "forward", 3.0), ("L", "gradient", 1.0), ("L (batch x8)", "forward", 2.0)]
    s = report.summary(record)
    assert s["jax/torch"]["forward"] == pytest.approx((3.0 * 2.0) ** 0.5)
    assert s["jax/torch"]["gradient"] == pytest.approx(0.25)
    assert s["jax/torch"]["worst"][0] == (3.0, "L", "forward")
    assert s["jax/lax"]["rows"] == 2 and s["jax/lax"]["all"] == pytest.approx(0.5)


def test_an_overhead_record_is_written_and_drawn(tmp_path):
    # a tiny run of `polyconv bench --overhead` on the numpy backend alone: its record has a
    # row per call with a positive time, and the page draws it per thread count
    from polyconv._cli import main

    records = tmp_path / "records"
    records.mkdir()
    path = records / "overhead-avx2.json"
    assert main(["bench", "--overhead", "--tiny", "--frameworks", "numpy", "--threads", "1",
                 "--rounds", "1", "--budget", "0.001", "--json", str(path)]) == 0
    record = json.loads(path.read_text())
    (run,) = harness.runs(record)
    assert run["threads"] == 1 and run["rows"]
    assert all(r["framework"] == "numpy" and r["polyconv_us"] > 0 for r in run["rows"])
    report.docs_pages(records, tmp_path)
    text = (tmp_path / "benchmarks-overhead.md").read_text()
    assert "### Per-call overhead on a CPU with AVX2 (no AVX-512)" in text
    assert text.count("| numpy |") == len(run["rows"])


def test_an_implementations_run_times_every_applicable_implementation(tmp_path):
    # one small corpus layer on the numpy backend: a row per primitive, a time for each
    # implementation that applies, the default pick among them
    import polyconv
    from polyconv._cli import main
    from polyconv.benchmarks.corpus_layers import LAYERS

    path = tmp_path / "implementations-avx2.json"
    assert main(["bench", "--implementations", "--backends", "numpy", "--layers", "MNIST",
                 "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["rows"]
    (layer,) = [ly for ly in LAYERS if "MNIST" in ly.title]
    assert [r["primitive"] for r in rows] == ["forward", "backward_data", "backward_weights"]
    for r in rows:
        plan = layer.plan.with_(primitive=r["primitive"], dtype=layer.dtype)
        names = polyconv.implementations("numpy", r["primitive"], plan)
        assert set(r["seconds"]) == set(names) and r["default"] in names
        assert set(r["first_call_s"]) == set(names)
        assert all(s > 0 and r["first_call_s"][n] > 0 for n, s in r["seconds"].items())
