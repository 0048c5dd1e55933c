"""Every script in ``examples/`` runs to completion (each one asserts its own claims)."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
NEEDS_JAX = {"port_pytorch_conv_transpose.py", "train_decoder.py", "sharded_batch.py",
             "onnx_attributes_on_jax.py", "unet3d_spatially_sharded.py"}
#: the layers' examples -> the modules each needs (a visible skip where one is missing)
NEEDS_MODULES = {"dcgan_flax_nnx.py": ("flax", "optax"),
                 "equinox_grouped_conv_transpose.py": ("equinox", "optax"),
                 "keras_model.py": ("keras", "jax")}


def test_every_example_is_listed():
    names = {p.name for p in EXAMPLES}
    assert {"quickstart.py", *NEEDS_JAX, *NEEDS_MODULES} <= names


def _run(path: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    # A raw checkout works too: the package and the backends' source root on the path.
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "backends"), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, str(path), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    if check:
        assert proc.returncode == 0, f"{path.name} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path):
    if path.name in NEEDS_JAX and importlib.util.find_spec("jax") is None:
        pytest.skip(f"{path.name} needs jax, which is not installed")
    missing = [m for m in NEEDS_MODULES.get(path.name, ()) if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{path.name} needs {', '.join(missing)}, not installed")
    _run(path)


def test_pytorch_port_meets_pytorch():
    """With torch installed, the porting example checks its JAX layer against PyTorch itself,
    not against its fallback (polyconv's own numpy backend)."""
    missing = [m for m in ("jax", "torch") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs jax and torch together; {' and '.join(missing)} not installed")
    out = _run(ROOT / "examples" / "port_pytorch_conv_transpose.py").stdout
    assert "reference: torch.nn.functional.conv_transpose2d" in out, out
    assert "the ported layer matches" in out


UNET3D = ROOT / "examples" / "unet3d_spatially_sharded.py"


def test_unet3d_over_2_processes_with_jax_distributed():
    """The U-Net example as 2 ``jax.distributed`` processes of 4 devices each: every process
    checks its devices' parts of the step against the unsharded step, and the launcher fails
    unless both exit cleanly."""
    if importlib.util.find_spec("jax") is None:
        pytest.skip("the U-Net example needs jax, which is not installed")
    out = _run(UNET3D, "--processes", "2").stdout
    assert "loss sharded" in out and "sharded step == unsharded step" in out, out
    assert out.count("sharded step == unsharded step") == 1, out   # printed by process 0 only


def test_unet3d_names_a_port_it_cannot_bind():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        proc = _run(UNET3D, "--processes", "2", "--port", port, check=False)
    assert proc.returncode != 0
    assert f"cannot bind 127.0.0.1:{port} for the coordinator" in proc.stderr, proc.stderr
    assert "pass a free --port" in proc.stderr, proc.stderr
