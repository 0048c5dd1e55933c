"""polyconv.spatially_sharded on 8 host CPU devices (worker
``tests/workers/spatial_sharding.py``, one process per section since the device count is
fixed when JAX starts): the six ops split along spatial axes equal the unsharded call and the
float64 oracle, forward and ``jax.grad``; the compiled programs exchange halos with
collective-permutes only (no all-gather); the refusals name the rule and the fix. A training
step over 2 ``jax.distributed`` processes is the U-Net example's, run by test_examples.py."""

from __future__ import annotations

import pytest
from conftest import only_with_target
from layer_checks import assert_doctests_pass
from test_jax_scale_out import _worker

only_with_target("jax")
pytest.importorskip("jax")


@pytest.mark.parametrize("section", ["values", "grads", "errors"])
def test_spatially_sharded_over_8_devices(section):
    result = _worker("spatial_sharding.py", section)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{section} ok" in result.stdout


def test_docstring_example():
    import polyconv._sharding

    assert_doctests_pass(polyconv._sharding)


def test_received_bytes_counts_collective_results():
    from polyconv.benchmarks.spatial import received_bytes

    text = "\n".join([
        "  %cp = f32[1,2,4,4,8]{4,3,2,1,0} collective-permute(%x), source_target_pairs={{0,1}}",
        "  %s = (f32[2,2]{1,0}, f32[2,2]{1,0}) collective-permute-start(%y)",
        "  %d = f32[2,2]{1,0} collective-permute-done(%s)",
        "  %ag = bf16[8,3]{1,0} all-gather(%z), dimensions={0}",
        "  %c = f32[9]{0} convolution(%a, %b)",
    ])
    assert received_bytes(text) == (1024 + 16 + 48, ["all-gather", "collective-permute"])


def test_bench_spatial_smoke(tmp_path):
    """``polyconv bench --spatial`` runs end to end on 2 devices: both sides, both modes, both
    levels; polyconv's forward program moves data with collective-permutes only."""
    import json
    import subprocess
    import sys

    from test_jax_scale_out import ROOT, TIMEOUT, _env

    from polyconv.benchmarks.spatial import CHILD

    record = tmp_path / "spatial.json"
    result = subprocess.run(
        [sys.executable, "-m", "polyconv", "bench", "--spatial", "--devices", "2", "--size",
         "4", "4", "4", "--channels", "4", "--repeats", "1", "--json", str(record)],
        env={**_env(2), CHILD: "1"}, cwd=ROOT, capture_output=True, text=True,
        timeout=TIMEOUT, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads(record.read_text())["rows"]
    assert {(r["upsampling"], r["mode"], r["side"]) for r in rows} == {
        (u, m, s) for u in ("k2 s2", "k3 s2 op1") for m in ("forward", "gradient")
        for s in ("polyconv", "xla")}
    for r in rows:
        assert r["seconds"] > 0 and r["received_bytes"] > 0, r
        if r["side"] == "polyconv":
            assert "all-gather" not in r["collectives"], r
            if r["mode"] == "forward":
                assert r["collectives"] == ["collective-permute"], r


def test_an_eager_call_follows_the_settings_in_force(caplog):
    # forcing after a first eager call of the same plan reaches the sharded program, as it
    # reaches a plain call (the lowerings are chosen when the program is traced)
    import logging

    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    import polyconv

    mesh = jax.make_mesh((1,), ("x",))
    x = jax.device_put(jnp.ones((1, 8, 8, 4), jnp.float32),
                       NamedSharding(mesh, PartitionSpec(None, "x")))
    w = jnp.ones((3, 3, 4, 4), jnp.float32)

    def call():
        return polyconv.spatially_sharded("convolution", x, w, mesh=mesh, spatial=("x",),
                                          pads_begin=1, pads_end=1)

    call()
    caplog.set_level(logging.DEBUG, logger="polyconv")
    with polyconv.implementation("jax:forward=taps"):
        call()
    assert any("-> taps (forced)" in r.getMessage() for r in caplog.records)
