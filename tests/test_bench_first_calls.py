"""``polyconv bench --first-calls`` runs on a tiny configuration and reports every plan it
times, in its JSON and its table; no speed is asserted (the figures are the benchmark's)."""

from __future__ import annotations

import json

import pytest

from polyconv._cli import main
from polyconv.benchmarks.first_call import AUTOTUNE_VARIABLES, UNSET_VARIABLES

MNIST = "MNIST CNN: Conv 1->32 k3 28x28 NCX"


@pytest.fixture
def first_calls(tmp_path, capsys, monkeypatch):
    """Run the command; its JSON and stdout. The variables it sets for its own plans are put
    back after the test."""
    for name in AUTOTUNE_VARIABLES:
        monkeypatch.setenv(name, "0")
    for name in UNSET_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def run(*argv: str) -> tuple[dict, str]:
        path = tmp_path / "first-calls.json"
        assert main(["bench", "--first-calls", *argv, "--warm", "1", "--json", str(path)]) == 0
        return json.loads(path.read_text()), capsys.readouterr().out

    return run


def test_numpy_part_times_each_primitive_of_a_layer(first_calls):
    results, out = first_calls("--parts", "numpy", "--models", "MNIST")
    assert results["measuring"] is False
    assert results["side_by_side"] == [] and results["plans"] == []
    rows = results["numpy"]
    assert [r["primitive"] for r in rows] == ["forward", "backward_data", "backward_weights"]
    for r in rows:
        assert r["model"] == MNIST
        assert all(r[k] > 0 for k in ("first_s", "later_s", "resolution_s", "ratio"))
    assert "numpy: first call of a plan" in out and MNIST[:40] in out
    assert "error" not in out


def test_jax_plans_name_their_lowering_and_ratio(first_calls):
    pytest.importorskip("jax")
    results, out = first_calls("--parts", "grid,corpus", "--layers", "MNIST",
                               "--grid-every", "90")
    corpus = [r for r in results["plans"] if r["source"] == "corpus"]
    assert [r["primitive"] for r in corpus] == ["forward", "backward_data", "backward_weights"]
    assert len(results["plans"]) == len(corpus) + 2        # 179 grid plans, every 90th
    for r in results["plans"]:
        assert r["lowering"] and r["lowering"] != "?", r
        assert r["polyconv_first_s"] > 0 and r["lax_first_s"] > 0 and r["ratio"] > 0
    assert results["worst"] == sorted((r for r in results["plans"] if r["ratio"] > 3),
                                      key=lambda r: -r["ratio"])
    assert "5 plans" in out


def test_the_lax_peer_computes_what_polyconv_computes_on_the_same_arrays():
    """The plain ``lax`` call the first calls are held against takes the arrays polyconv's
    call takes (weights in the plan's layout) and computes the same: checked on every 3rd
    plan of the test grid (every layout, group count and primitive appear) on the numpy
    backend, itself checked against the float64 oracle elsewhere."""
    pytest.importorskip("jax")
    import jax
    import numpy as np

    import polyconv
    from polyconv.benchmarks.first_call import grid_calls
    from polyconv.benchmarks.peers import lax_function, lax_inputs

    calls = [c for c in grid_calls()[::3] if c.dtype == "float32"]
    assert {c.plan.primitive for c in calls} == {"forward", "backward_data",
                                                 "backward_weights"}
    for c in calls:
        plan = c.plan
        arrays = lax_inputs(plan, plan.primitive, c.dtype, user_weights=True)
        got = np.asarray(jax.jit(lax_function(plan, plan.primitive, user_weights=True))(*arrays))
        numpy_backend = getattr(polyconv.get_backend("numpy"), plan.primitive)
        want = numpy_backend(plan, *(np.asarray(x) for x in arrays))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=c.label)
