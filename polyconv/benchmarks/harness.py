"""The one harness every benchmark runs on: competitors, the timing loop, the machine a record
names, the records themselves, and the threads a run uses.

A benchmark is a list of workloads (a suite case, a corpus layer) and competitors; for each
workload and mode it asks every competitor for a zero-argument call (:class:`Competitor`),
times them all in one process with :func:`time_calls`, and writes its rows with the machine
(:func:`machine`) into a record (:func:`write_record`). Only ratios within one run mean
anything: the machines are shared and noisy.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np

import polyconv

# --------------------------------------------------------------------------------------------
# competitors
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Competitor:
    """One way of computing a workload: ``make(workload, mode, arrays)`` gives a zero-argument
    call that runs (and waits for) it, or ``None`` where it cannot express the workload.

    ``requires`` names the package it needs (skipped, and said so, where it is missing);
    ``mode`` is the mode it stands for when not the row's own (polyconv's two backward ops in
    a gradient row)."""

    name: str
    requires: str | None
    make: Callable[[Any, str, Sequence[Any]], Callable[[], Any] | None]
    mode: str | None = None


def make_calls(workload: Any, mode: str, arrays: Sequence[Any],
               competitors: Sequence[Competitor]) -> tuple[dict[str, Callable[[], Any]],
                                                           dict[str, str]]:
    """Each competitor's call of ``workload`` in ``mode``, and why the others are skipped."""
    calls: dict[str, Callable[[], Any]] = {}
    skipped: dict[str, str] = {}
    for comp in competitors:
        if comp.mode and mode != "gradient":
            continue
        if comp.requires and find_spec(comp.requires) is None:
            skipped[comp.name] = f"{comp.requires} not installed"
            continue
        try:
            call = comp.make(workload, comp.mode or mode, arrays)
        except Exception as exc:  # a peer that cannot express the workload
            skipped[comp.name] = f"{type(exc).__name__}: {exc}"
            continue
        if call is None:
            skipped[comp.name] = "cannot express this case"
            continue
        calls[comp.name] = call
    return calls, skipped


def select_competitors(parser, text: str, competitors: Sequence[Competitor]):
    """The competitors named in ``--competitors`` (comma-separated; empty: all of them), in
    their table order; an unknown name is a usage error."""
    if not text:
        return tuple(competitors)
    wanted = [n.strip() for n in text.split(",") if n.strip()]
    unknown = sorted(set(wanted) - {c.name for c in competitors})
    if unknown:
        parser.error(f"--competitors: unknown {', '.join(unknown)}; the competitors are "
                     + ", ".join(c.name for c in competitors))
    return tuple(c for c in competitors if c.name in wanted)


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a dtype name (``bfloat16``: ml_dtypes')."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def random_arrays(shapes: Sequence[tuple[int, ...]], dtype: str, seed: int = 0):
    """Standard normal float32 values of ``shapes``, rounded to ``dtype``."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s, dtype=np.float32).astype(numpy_dtype(dtype))
            for s in shapes]


def torch_dtype(dtype: str):
    """The torch dtype of a dtype name; PyTorch's threads set as ``--threads`` asks."""
    import torch

    if os.environ.get(THREADS_ENV):
        torch.set_num_threads(int(os.environ[THREADS_ENV]))
    return {"float32": torch.float32, "bfloat16": torch.bfloat16,
            "float16": torch.float16, "float64": torch.float64}[dtype]


def torch_tensor(a: np.ndarray, dtype: Any):
    """``a`` as a contiguous torch tensor in torch's own memory, as a PyTorch user's tensors
    are: memory that numpy allocated may be only 16-byte aligned, which slows oneDNN's kernels
    (a 0.2 ms depthwise layer by 1.3x), so no competitor gets it. (``torch.tensor`` keeps a
    strided array's strides, hence the contiguous copy first.)"""
    import torch

    return torch.tensor(np.ascontiguousarray(a, np.float32), dtype=dtype)


@dataclass(frozen=True)
class Jitted:
    """A jitted JAX call on fixed arguments: calling it runs (and waits for) one call."""

    fn: Any
    args: tuple

    def __call__(self) -> Any:
        import jax

        return jax.block_until_ready(self.fn(*self.args))

    def queued(self, calls: int) -> Any:
        """``calls`` calls issued back to back, waited for once (JAX dispatches
        asynchronously: on an accelerator they queue on the device)."""
        import jax

        for _ in range(calls - 1):
            self.fn(*self.args)
        return jax.block_until_ready(self.fn(*self.args))

    def program(self) -> list[str]:
        """What XLA compiled for it (:func:`compiled_instructions`)."""
        return compiled_instructions(self.fn, self.args)


@dataclass(frozen=True)
class Waited:
    """A call on an asynchronous device and the wait for it: calling it runs (and waits for)
    one call; :meth:`queued` issues several and waits once."""

    call: Callable[[], Any]
    wait: Callable[[], Any]

    def __call__(self) -> Any:
        out = self.call()
        self.wait()
        return out

    def queued(self, calls: int) -> Any:
        for _ in range(calls - 1):
            self.call()
        return self()


def on_cuda(call: Callable[[], Any], tf32: bool = False) -> Waited:
    """``call`` with cuDNN's benchmark mode on (its fastest algorithm per shape) and TF32 as
    asked, timed until the GPU is done."""
    import torch

    def flagged():
        with torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=False,
                                        allow_tf32=tf32):
            return call()

    return Waited(flagged, torch.cuda.synchronize)


# --------------------------------------------------------------------------------------------
# the timing loop
# --------------------------------------------------------------------------------------------

#: the least time of one timed sample (several calls of a fast competitor)
SAMPLE_SECONDS = 0.005
#: the least time of a competitor's untimed calls before each timed sample: longer than
#: OpenBLAS's workers spin after a call (about 0.1 s of a CPU, measured on numpy's OpenBLAS)
LEAD_IN_SECONDS = 0.15
#: a competitor whose warm-up call takes longer than this is timed in SLOW_REPEATS rounds
#: only, one call each and no lead-in (its time is not in doubt, and it would hold the run up)
SLOW_CALL_S = 1.0
SLOW_REPEATS = 3


def lead_in(fn: Callable[[], Any], calls: int) -> None:
    """Untimed calls before a timed sample: at least ``calls``, and for at least
    :data:`LEAD_IN_SECONDS`. They wake this competitor's thread pool (on a VM a parked worker
    can take milliseconds to wake) while the previous competitor's workers, which spin for a
    while after their last call, go idle, and bring back the caches and memory state the
    previous competitor displaced (docs/benchmarks.md says what each costs)."""
    end = time.perf_counter() + LEAD_IN_SECONDS
    for _ in range(calls):
        fn()
    while time.perf_counter() < end:
        fn()


def timed_call(fn: Callable[[], Any], calls: int = 1, queued: bool = False) -> float:
    """Seconds per call of ``fn`` over ``calls`` calls, each waited for, or with ``queued``
    issued back to back and waited for once (where ``fn`` can queue: a jitted JAX call, a
    CUDA call). On a GPU one blocked call of 0.05-0.3 ms is mostly the host's dispatch and
    wait; queued calls time the device's work in a stream, as in a training step."""
    t0 = time.perf_counter()
    if queued and calls > 1 and hasattr(fn, "queued"):
        fn.queued(calls)
    else:
        for _ in range(calls):
            fn()
    return (time.perf_counter() - t0) / calls


def time_calls(calls: dict[str, Callable[[], Any]], repeats: int, warmup: int,
               log: Callable[[str], None], label: str, lead_in_calls: int = 1,
               queued: int = 1) -> dict[str, list[float]]:
    """Every competitor's seconds per call, one sample per round: all in one process,
    interleaved (the order reversed every other round), after ``warmup`` untimed calls each.

    A sample is :func:`lead_in` then as many calls as take about :data:`SAMPLE_SECONDS`
    (``queued`` > 1: that many calls issued back to back, waited for once); a competitor
    slower than :data:`SLOW_CALL_S` is timed once a round for :data:`SLOW_REPEATS` rounds."""
    slow = set()
    for _ in range(warmup):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            fn()
            if time.perf_counter() - t0 > SLOW_CALL_S:
                slow.add(name)
    number = {}
    for name, fn in calls.items():
        if queued > 1 or name in slow:
            number[name] = 1 if name in slow else queued
            continue
        t0 = time.perf_counter()
        fn()
        number[name] = max(1, min(100, int(SAMPLE_SECONDS
                                           / max(time.perf_counter() - t0, 1e-9))))
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(repeats):
        order = [(n, f) for n, f in calls.items() if n not in slow or r < SLOW_REPEATS]
        if r % 2:
            order.reverse()
        for name, fn in order:
            if name not in slow:
                lead_in(fn, lead_in_calls)
            times[name].append(timed_call(fn, number[name], queued > 1))
        log(f"\r  {label}: round {r + 1}/{repeats}")
    log("\n")
    return times


def medians(times: dict[str, list[float]]) -> dict[str, float]:
    return {name: statistics.median(ts) for name, ts in times.items() if ts}


def log(msg: str) -> None:
    """Progress on stderr (the table goes to stdout)."""
    sys.stderr.write(msg)
    sys.stderr.flush()


# --------------------------------------------------------------------------------------------
# compiled programs (two competitors that run one program have a ratio of 1 by construction)
# --------------------------------------------------------------------------------------------

def compiled_instructions(fn, args, opcode: str | None = None) -> list[str]:
    """The instructions XLA compiled for jitted ``fn`` on ``args`` (only those of ``opcode``,
    e.g. ``"convolution"``, if given), sorted, with instruction names and metadata stripped:
    two calls with equal lists run the same program, whatever their source looked like."""
    text = fn.lower(*args).compile().as_text()
    lines = [line for line in text.splitlines()
             if re.match(r"\s*(ROOT )?%\S+ = ", line)
             and (opcode is None or f" {opcode}(" in line)]
    return sorted(_outputs_unordered(
        re.sub(r"%[\w.\-]+", "%_", re.sub(r", metadata=\{.*?\}", "", line)).strip())
        for line in lines)


_ARRAY_TYPE = re.compile(r"\w+\[[\d,]*\](?:\{[^}]*\})?")


def _outputs_unordered(line: str) -> str:
    """An instruction with its outputs' order forgotten: a tuple result's array types sorted,
    ``get-tuple-element``'s index dropped. XLA GPU may order one multi-output fusion's outputs
    either way in two programs that compute the same (seen on an H200: a gradient against
    its backward ops called by hand, one fusion with its two outputs swapped)."""
    line = re.sub(r"(get-tuple-element\(%_\)), index=\d+", r"\1", line)
    found = re.match(r"((?:ROOT )?%_ = )\(([^()]*)\)", line)
    if found and ", ".join(types := _ARRAY_TYPE.findall(found[2])) == found[2]:
        line = f"{found[1]}({', '.join(sorted(types))}){line[found.end():]}"
    return line


def same_programs(calls: dict[str, Any]) -> list[list[str]]:
    """The competitors that run one and the same compiled program (groups of two or more):
    between them the ratio is 1 by construction, whatever their timings say."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, fn in calls.items():
        if isinstance(fn, Jitted):
            groups.setdefault(tuple(fn.program()), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


# --------------------------------------------------------------------------------------------
# the machine a record names, and its kind
# --------------------------------------------------------------------------------------------

def _cpu_model() -> str:
    """The CPU's model name (``platform.processor()`` is empty on Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _vector_units() -> dict[str, Any]:
    """Whether the CPU has AVX-512 (Linux) and which kernels numpy's BLAS runs: hosts of one
    kind differ here, and PyTorch's oneDNN and numpy's OpenBLAS run about half as fast
    without it."""
    info: dict[str, Any] = {}
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "")
        flags = f" {flags.split(':', 1)[-1].strip()} "
        info["avx512"] = " avx512f " in flags
        info["avx2"] = " avx2 " in flags
    except OSError:
        pass
    try:
        from threadpoolctl import threadpool_info
        kernels = {i.get("architecture") for i in threadpool_info()
                   if i.get("user_api") == "blas" and i.get("architecture")}
        if kernels:
            info["blas_kernels"] = ",".join(sorted(kernels))
    except ImportError:
        pass
    return info


#: environment variables a record names when set (variable -> key in ``machine``): settings
#: that change which kernels run or where buffers live (OpenBLAS's kernels by CPU, XLA's CPU
#: options, glibc's arena count)
ENVIRONMENT = {"OPENBLAS_CORETYPE": "openblas_coretype", "XLA_FLAGS": "xla_flags",
               "MALLOC_ARENA_MAX": "malloc_arena_max"}


def _version(mod: str) -> str:
    """An installed library's version, without importing it where it is not imported yet
    (a record is written after every row: importing PyTorch there would start its thread
    pools between the timings of the rows that follow)."""
    if mod in sys.modules:
        return sys.modules[mod].__version__
    try:
        return importlib.metadata.version(mod)
    except importlib.metadata.PackageNotFoundError:    # on the path, not installed
        return __import__(mod).__version__


def machine() -> dict[str, Any]:
    """The machine and libraries a run measured (written into every record)."""
    info = {"platform": platform.platform(), "processor": _cpu_model(),
            "python": platform.python_version(), "cpus": os.cpu_count(),
            "threads": int(os.environ[THREADS_ENV]) if os.environ.get(THREADS_ENV) else None,
            "numpy": np.__version__, "polyconv": polyconv.__version__}
    for mod in ("jax", "torch"):
        if find_spec(mod) is not None:
            info[mod] = _version(mod)
    for var, key in ENVIRONMENT.items():
        if os.environ.get(var):
            info[key] = os.environ[var]
    info.update(_vector_units())
    return info


def gpu_machine() -> dict[str, Any]:
    """The GPU and the libraries' view of it (for ``--device gpu`` records)."""
    info: dict[str, Any] = {}
    try:
        import jax

        device = jax.devices()[0]
        info["jax_device"] = f"{device.platform}: {device.device_kind}"
    except ImportError:
        pass
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["cuda"] = torch.version.cuda
            info["cudnn"] = torch.backends.cudnn.version()
    except ImportError:
        pass
    try:
        import cupy

        info["cupy"] = cupy.__version__
    except ImportError:
        pass
    return info


#: the GPU models a record's kind names by their model number
_GPU_MODEL = re.compile(r"\b([A-Z]{1,2}\d{1,4})\b")


def machine_kind(m: dict[str, Any]) -> str:
    """The kind of machine a record was measured on, the one record per kind kept in the
    docs: a GPU by its model (``h100``, ``h200``), a CPU by its vector units (``avx512``,
    ``avx2``, else its architecture), which decide what its BLAS and oneDNN run at."""
    if m.get("gpu"):
        found = _GPU_MODEL.search(m["gpu"])
        return (found[1] if found else re.sub(r"\W+", "-", m["gpu"]).strip("-")).lower()
    arch = re.search(r"x86_64|aarch64|arm64|ppc64le|s390x", m.get("platform", ""))
    if m.get("avx512"):
        return "avx512"
    if m.get("avx2") or (m.get("avx512") is False and arch and arch[0] == "x86_64"):
        return "avx2"
    return arch[0] if arch else "cpu"


# --------------------------------------------------------------------------------------------
# records
# --------------------------------------------------------------------------------------------

def write_record(path: Path | None, record: dict[str, Any]) -> dict[str, Any]:
    """``record`` written to ``path`` (if given) as the benchmarks' JSON: a run is
    ``{"machine": ..., <rows>: [...]}``; a record of several runs on one machine kind is
    ``{"note": ..., "runs": [{"title": ..., "machine": ..., <rows>}, ...]}``."""
    if path is not None:
        path.write_text(json.dumps(record, indent=1, default=str))
    return record


def runs(record: dict[str, Any]) -> list[dict[str, Any]]:
    """A record's runs: its ``runs``, or the record itself for a single run."""
    return record.get("runs", [record])


# --------------------------------------------------------------------------------------------
# threads
# --------------------------------------------------------------------------------------------

THREADS_ENV = "POLYCONV_BENCH_THREADS"


def rerun_with_threads(threads: int, argv: list[str]) -> int:
    """Run ``polyconv bench argv`` in a fresh process whose libraries all use ``threads``
    threads.

    Thread counts are read when numpy's BLAS, XLA and PyTorch start, hence the new process:
    the BLAS/OpenMP variables are set, the process is pinned to ``threads`` CPUs (XLA sizes its
    pool from that), and PyTorch is told the count.
    """
    return subprocess.call([sys.executable, "-m", "polyconv.benchmarks", *argv],
                           env=thread_environment(threads))


def thread_environment(threads: int) -> dict[str, str]:
    """This process's environment for a fresh one whose libraries all use ``threads``
    threads (0: as many as they would take): the BLAS/OpenMP variables, XLA's flags for one
    thread, and :data:`THREADS_ENV`, which PyTorch's peers and the machine record read."""
    env = dict(os.environ)
    env.pop(THREADS_ENV, None)
    if not threads:
        return env
    n = str(threads)
    env.update({THREADS_ENV: n, "OPENBLAS_NUM_THREADS": n, "OMP_NUM_THREADS": n,
                "MKL_NUM_THREADS": n})
    if threads == 1:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
                            " intra_op_parallelism_threads=1").strip()
    return env


def pin(threads: int) -> None:
    """Pin this process to its first ``threads`` allowed CPUs (where the OS allows it)."""
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))[:threads]
        os.sched_setaffinity(0, cpus)


def threaded(parser, threads: int | None, argv: list[str]) -> int | None:
    """For ``--threads``: the exit status of the run redone in a process on that many threads,
    or ``None`` where this process is that one (pinned) or no count was asked for."""
    if threads is None:
        return None
    if threads < 1:
        parser.error(f"--threads must be at least 1, got {threads}")
    if os.environ.get(THREADS_ENV) != str(threads):
        return rerun_with_threads(threads, argv)
    pin(threads)
    return None
