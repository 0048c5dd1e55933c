"""polyconv.spatially_sharded on 8 host CPU devices (worker
``tests/workers/spatial_sharding.py``, one process per section since the device count is
fixed when JAX starts): the six ops split along spatial axes equal the unsharded call and the
float64 oracle, forward and ``jax.grad``; the compiled programs exchange halos with
collective-permutes only (no all-gather); the refusals name the rule and the fix."""

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
