"""``import polyconv`` stays light: no jax until a JAX array or backend is used (DESIGN)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import json, sys
import numpy as np
import polyconv

report = {"after_import": sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib"))}
plan = polyconv.infer_shape("Convolution", (1, 5, 5, 2), (3, 3, 2, 4), strides=2,
                            auto_pad="same_upper")
y = polyconv.convolution(np.ones((1, 5, 5, 2), np.float32), np.ones((3, 3, 2, 4), np.float32),
                         strides=2, auto_pad="same_upper")
report["shape"] = list(plan.shape)
report["y"] = [list(y.shape), str(y.dtype), type(y).__module__, float(y[0, 1, 1, 0])]
report["available"] = list(polyconv.available_backends())
report["registered"] = list(polyconv.registered_backends())
report["after_call"] = sorted(m for m in sys.modules if m.split(".")[0] in ("jax", "jaxlib"))
print(json.dumps(report))
"""


def _run_fresh(script: str) -> dict:
    """Run ``script`` in a fresh interpreter with the repository's import paths."""
    paths = [str(ROOT), str(ROOT / "backends")]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def report() -> dict:
    return _run_fresh(SCRIPT)


def test_import_and_numpy_use_do_not_import_jax(report):
    assert report["after_import"] == []
    assert report["after_call"] == []
    assert report["shape"] == [1, 3, 3, 4]
    # a 3x3 all-ones window over two all-ones channels, fully inside the image: 18
    assert report["y"] == [[1, 3, 3, 4], "float32", "numpy", 18.0]


def test_numpy_backend_is_available(report):
    assert "numpy" in report["available"]
    assert set(report["available"]) <= set(report["registered"])
    assert {"numpy", "jax", "array_api"} <= set(report["registered"])


def test_import_and_a_call_work_without_docstrings():
    """``python -OO`` strips docstrings: nothing at import time may depend on them."""
    paths = [str(ROOT), str(ROOT / "backends")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    script = ("import numpy as np, polyconv; "
              "print(polyconv.conv_transpose(np.ones((1, 2, 2, 1), np.float32), "
              "np.ones((2, 2, 1, 1), np.float32), strides=2).shape)")
    done = subprocess.run([sys.executable, "-OO", "-c", script], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "(1, 4, 4, 1)"


def test_converting_weights_imports_no_framework():
    """``polyconv.convert_weights`` on numpy weights loads only what numpy needs: no jax,
    torch, onnx, keras or flax (each framework is imported by the user, never by polyconv)."""
    script = """
import json, sys
import numpy as np
import polyconv
w = polyconv.convert_weights(np.ones((4, 2, 3, 3)), "torch", "flax", family="conv_transpose")
heavy = ("jax", "jaxlib", "torch", "onnx", "onnxruntime", "keras", "flax", "openvino")
print(json.dumps({"shape": list(w.shape),
                  "loaded": sorted(m for m in sys.modules if m.split(".")[0] in heavy)}))
"""
    report = _run_fresh(script)
    assert report == {"shape": [3, 3, 4, 2], "loaded": []}


def test_the_dialects_import_no_framework():
    """Every dialect module, and an ONNX ConvTranspose run from its attributes on numpy,
    load no framework: the torch dialect is not torch, the ONNX one needs no onnx."""
    script = """
import json, sys
import numpy as np
from polyconv.dialects import jax, keras, onednn, onnx, openvino, tensorflow, torch
y = onnx.conv_transpose(np.ones((1, 2, 3, 3), np.float32), np.ones((2, 1, 3, 3), np.float32),
                        auto_pad="SAME_UPPER", strides=[2, 2], output_padding=[1, 1])
onednn.parse_descriptor("g2mb1ic4ih6oc8kh3ph1").call("BWD_W")
tensorflow.conv2d_transpose(np.ones((1, 2, 2, 1)), np.ones((3, 3, 1, 1)), [1, 4, 4, 1], 2)
heavy = ("jax", "jaxlib", "torch", "onnx", "onnxruntime", "keras", "flax", "openvino",
         "tensorflow")
print(json.dumps({"shape": list(y.shape),
                  "loaded": sorted(m for m in sys.modules if m.split(".")[0] in heavy)}))
"""
    assert _run_fresh(script) == {"shape": [1, 1, 6, 6], "loaded": []}


def test_the_library_imports_no_benchmark_code():
    """``import polyconv``, a call, the command's parser and ``polyconv shape`` load nothing of
    ``polyconv.benchmarks`` (docs/architecture.md: the benchmarks stay in the wheel because
    they cost the library nothing)."""
    script = """
import contextlib, io, json, sys
import numpy as np
import polyconv
from polyconv._cli import build_parser, main
polyconv.conv_transpose(np.ones((1, 3, 3, 2), np.float32), np.ones((3, 3, 2, 2), np.float32))
build_parser()
with contextlib.redirect_stdout(io.StringIO()):
    main(["shape", "ConvTranspose", "1,3,3,2", "3,3,2,2"])
print(json.dumps(sorted(m for m in sys.modules if m.startswith("polyconv.benchmarks"))))
"""
    assert _run_fresh(script) == []
