"""Hostile sizes (docs/semantics.md#validation): a stride, dilation or pad far past anything an
array can hold is a ``ValueError`` within a second on every target, naming the attribute, never
a hang, a crash or another library's error.

Each target's calls run in a subprocess with a memory cap and a timeout, so that a regression
(a loop over a stride's value, an allocation of exabytes, an abort in XLA) fails its tests
instead of hanging or killing the suite.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import polyconv

#: ``(id, op, attributes, pattern the message must match)``: the data are ``x`` ``(1, 8, 8,
#: 2)`` and weights ``(3, 3, 2, 2)`` (``NXC``, the op's default weights format)
HOSTILE = (
    ("stride-2**31", "convolution", {"strides": 2**31}, r"strides=\(2147483648, 2147483648\)"),
    ("stride-10**7", "convolution", {"strides": 10**7}, r"strides=\(10000000, 10000000\)"),
    ("stride-2**31-one-axis", "convolution", {"strides": (2**31, 1)}, r"strides=\(2147483648, 1\)"),
    ("stride-2**31-1", "convolution", {"strides": (2**31 - 1, 1)}, r"strides=\(2147483647, 1\)"),
    ("pad-2**62", "convolution", {"pads_begin": 2**62}, r"pads_begin"),
    ("pad-2**58", "convolution", {"pads_begin": (2**58, 0)}, r"pads_begin"),
    ("pad-2**55", "convolution", {"pads_begin": (2**55, 0)}, r"pads_begin"),  # XLA aborts
    ("transposed-stride-2**31", "conv_transpose", {"strides": 2**31}, r"strides="),
    ("transposed-stride-2**63", "conv_transpose",
     {"strides": 2**63, "output_padding": 2**63 - 1}, r"strides="),
    ("transposed-dilation-2**62", "conv_transpose", {"dilations": (2**62, 1)}, r"dilations\b"),
    ("transposed-pad-2**62", "conv_transpose", {"pads_end": (0, 2**62)}, r"pads_end="),
)
#: the cases that the torch backend's own limit (32-bit attributes) refuses first
TORCH_INT32 = {"stride-2**31", "stride-2**31-one-axis", "pad-2**62", "pad-2**58", "pad-2**55",
               "transposed-stride-2**31", "transposed-stride-2**63", "transposed-dilation-2**62"}

#: within the limits but out of memory: the array library's own error, at once (the numpy
#: backend's cost model once walked the 2**40 rows of this output in Python for 28 s)
OUT_OF_MEMORY = ("pad-2**40-out-of-memory", "convolution", {"pads_begin": (2**40, 0)})

#: the subprocess: every hostile call of one target, timed; one JSON line per call
_SCRIPT = r"""
import json, resource, sys, time
config = json.loads(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (config["cap"], config["cap"]))
sys.path.insert(0, config["tests"])
import numpy as np
import polyconv
from conftest import TARGETS

target = next(t for t in TARGETS if t.name == config["target"])
x = target.asarray(np.ones((1, 8, 8, 2), "float32"))
w = target.asarray(np.ones((3, 3, 2, 2), "float32"))
for fn in ("convolution", "conv_transpose"):                 # imports and first calls
    getattr(polyconv, fn)(x, w, backend=target.backend, strides=2)
for case, fn, attrs in config["cases"]:
    start = time.perf_counter()
    try:
        getattr(polyconv, fn)(x, w, backend=target.backend, **attrs)
        kind, message = None, ""
    except Exception as exc:
        kind, message = type(exc).__name__, str(exc)
    seconds = time.perf_counter() - start
    print(json.dumps({"case": case, "kind": kind, "message": message, "seconds": seconds}),
          flush=True)
"""

#: address space of the subprocess (JAX and torch reserve a few GiB of it on import)
MEMORY_CAP = 16 * 2**30
TIMEOUT = 60
_RESULTS: dict[str, dict[str, dict]] = {}


def _run(target) -> dict[str, dict]:
    """Every hostile call on ``target``, in one capped subprocess (cached per target)."""
    if target.name not in _RESULTS:
        config = json.dumps({"cap": MEMORY_CAP, "tests": str(Path(__file__).parent),
                             "target": target.name,
                             "cases": [*((case, fn, attrs) for case, fn, attrs, _ in HOSTILE),
                                       OUT_OF_MEMORY]})
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        try:
            done = subprocess.run([sys.executable, "-c", _SCRIPT, config], capture_output=True,
                                  text=True, timeout=TIMEOUT, env=env)
            out, err = done.stdout, done.stderr
        except subprocess.TimeoutExpired as exc:
            out, err = exc.stdout or "", f"timed out after {TIMEOUT} s"
            out = out.decode() if isinstance(out, bytes) else out
        results = {r["case"]: r for r in map(json.loads, out.splitlines())}
        for case, *_ in (*HOSTILE, OUT_OF_MEMORY):
            results.setdefault(case, {"kind": "no answer", "message": err[-2000:],
                                      "seconds": None})
        _RESULTS[target.name] = results
    return _RESULTS[target.name]


@pytest.mark.parametrize(("case", "fn", "attrs", "match"), HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_size_is_a_quick_value_error(target, case, fn, attrs, match):
    got = _run(target)[case]
    assert got["kind"] == "ValueError", f"{got['kind']}: {got['message']}"
    assert got["seconds"] < 1, f"took {got['seconds']:.1f} s: {got['message']}"
    message = got["message"]
    assert message.startswith(f"{fn}: ") and re.search(match, message), message
    if target.backend == "torch" and case in TORCH_INT32:
        assert "at most 2147483647 (torch" in message, message
    if target.backend != "torch":      # torch declares 32-bit attributes, the others none
        with pytest.raises(ValueError) as info:
            polyconv.infer_shape(fn, (1, 8, 8, 2), (3, 3, 2, 2), **attrs)
        assert message == str(info.value), "the message differs from the core's"


def test_out_of_memory_is_quick(target):
    if target.array_library == "jax":
        pytest.skip("JAX dispatches asynchronously: its out-of-memory error comes with the "
                    "result")
    got = _run(target)[OUT_OF_MEMORY[0]]
    assert got["seconds"] is not None and got["seconds"] < 1, got
    assert got["kind"] in ("ValueError", "MemoryError", "RuntimeError"), got
    assert got["kind"] != "RuntimeError" or "allocate" in got["message"], got


@pytest.mark.parametrize("auto_pad", ["same_upper", "same_lower"])
def test_same_pads_are_exact_at_any_size(auto_pad):
    """``same_*`` pads in integers: ``B = ceil(A / s)`` exactly where a float is off by one."""
    a = 2**54 - 999         # ceil(a / 3) in floats is one too many (and a fits 2**57 bytes)
    plan = polyconv.infer_shape("Convolution", (1, a, 1), (3, 1, 1), strides=3, auto_pad=auto_pad)
    b = -(-a // 3)
    assert plan.shape == (1, b, 1)
    assert plan.pads_begin[0] + plan.pads_end[0] == (b - 1) * 3 + 3 - a
    back = polyconv.infer_shape("convolution_backward_data", (1, b, 1), (3, 1, 1),
                                dst_shape=(a,), strides=3, auto_pad=auto_pad)
    assert back.shape == (1, a, 1)       # dst_shape is reachable: the same integer rule
    with pytest.raises(ValueError, match=r"src size on spatial axis 0 would be 10{400}"):
        polyconv.infer_shape("Convolution", (1, 10**400, 1), (1, 1, 1), strides=3,
                             auto_pad=auto_pad)
