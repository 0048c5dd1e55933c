"""``import polyconv.layers`` imports no framework: each framework's module is imported only
by a user who names it (polyconv.layers.flax, .equinox, .keras, .torch)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = ("jax", "flax", "equinox", "keras", "torch", "optax")

SCRIPT = f"""
import json, sys
import polyconv, polyconv.layers, polyconv.layers._padding
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {FRAMEWORKS!r})))
"""


def test_layers_package_imports_no_framework():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
