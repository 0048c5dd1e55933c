"""``polyconv compare`` as a person reads it: each dtype's error relative to the bound, why a
backend did not run and how to add it, and a short verdict at the end."""

from __future__ import annotations

import re

from polyconv import _backends
from polyconv._cli import main


def _run(capsys, *argv: str) -> tuple[int, str]:
    code = main(["compare", *argv])
    return code, capsys.readouterr().out


def test_each_dtype_has_its_own_error_relative_to_the_bound(capsys):
    code, out = _run(capsys, "--op", "Convolution", "--backends", "numpy", "--dtypes",
                     "float32,float16", "-q")
    assert code == 0, out
    assert "err/bound in float32 float16, in that order (<= 1: within the bound)" in out
    rows = [line for line in out.splitlines() if line.startswith("Convolution ")]
    assert rows
    pairs = [re.findall(r"(\d\.\d\d) (\d\.\d\d)\s*$", row) for row in rows]
    assert all(p for p in pairs), rows
    # float32 is not float16's rounding: its own, smaller, number shows
    assert all(float(f32) < float(f16) for (f32, f16), in pairs), rows


def test_a_backend_that_did_not_run_says_why_and_how_to_add_it(capsys, monkeypatch):
    entry = _backends._BUILTIN["torch"]
    missing = type(entry)(entry.name, entry.module, ("no_such_module_for_this_test",),
                          entry.description, entry.libraries)
    monkeypatch.setitem(_backends._BUILTIN, "torch", missing)
    monkeypatch.delitem(_backends._LOADED, "torch", raising=False)
    monkeypatch.setattr(_backends, "available_backends", lambda: ("numpy",))
    code, out = _run(capsys, "--op", "Convolution", "--dtypes", "float32", "-q")
    assert code == 0, out
    line = next(line for line in out.splitlines() if line.startswith("not run: torch"))
    assert "not installed here (missing: no_such_module_for_this_test)" in line, line
    assert "pip install 'polyconv-ops[torch]'" in line, line


def test_the_verdict_is_short_and_last(capsys):
    code, out = _run(capsys, "--op", "ConvTranspose", "--backends", "numpy", "--dtypes",
                     "bfloat16", "-q")
    lines = out.strip().splitlines()
    assert code == 0
    assert lines[-1].startswith("polyconv compare: OK, all ")
    assert len(lines[-1]) <= 110, lines[-1]
    assert lines[-2].startswith("worst err/bound "), lines[-2]
    assert lines[-3].startswith("ran "), lines[-3]
