"""polyconv's benchmark suite: polyconv side by side with the tools users would otherwise pick.

Run with ``polyconv bench`` (or ``python -m polyconv.benchmarks.suite``). Each case runs all
its competitors in one process, interleaved (per round, one untimed and one timed call of
each, after warm-up), and reports the median time, GFLOP/s, the fraction of this machine's
float32 matmul rate, and the ratio of every competitor to polyconv's numpy backend. Peers are
optional: a peer whose package is missing is listed as skipped. Nothing here is a test:
timings are only compared within one run, as ratios.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np

import polyconv
from polyconv._compare import numpy_dtype
from polyconv._optable import spec


@dataclass(frozen=True)
class Case:
    """One benchmark: a polyconv op on NXC inputs of given shapes."""

    name: str
    op: str                        # polyconv function name
    shapes: tuple[tuple[int, ...], ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    extra: tuple[Any, ...] = ()    # trailing positional args (weights_shape)

    @property
    def plan(self) -> polyconv.ConvPlan:
        return polyconv.infer_shape(self.op, *self.shapes, *self.extra, **self.attrs)

    @property
    def flops(self) -> float:
        """2 x multiply-adds of the canonical convolution (padding included)."""
        return 2.0 * self.plan.macs


def _ct(name, n, spatial, ic, oc, k, s, p, op, groups=1, dtype="float32"):
    d = len(spatial)
    return Case(name, "conv_transpose", ((n, *spatial, ic), (*(k,) * d, oc // groups, ic)),
                dict(strides=s, pads_begin=p, pads_end=p, output_padding=op, groups=groups),
                dtype)


CASES: tuple[Case, ...] = (
    _ct("ConvTranspose 2D 8x32x32x64->64 k3 s2 p1 op1", 8, (32, 32), 64, 64, 3, 2, 1, 1),
    _ct("ConvTranspose 2D grouped g8", 8, (32, 32), 64, 64, 3, 2, 1, 1, groups=8),
    _ct("ConvTranspose 2D depthwise g64", 8, (32, 32), 64, 64, 3, 2, 1, 1, groups=64),
    _ct("ConvTranspose 1D 4x4000x256->128 k16 s8 p4", 4, (4000,), 256, 128, 16, 8, 4, 0),
    _ct("ConvTranspose 3D 2x16^3x32->32 k3 s2 p1 op1", 2, (16, 16, 16), 32, 32, 3, 2, 1, 1),
    Case("Convolution 2D 8x56x56x64->64 k3 s1 p1", "convolution",
         ((8, 56, 56, 64), (3, 3, 64, 64)), dict(pads_begin=1, pads_end=1)),
    Case("Convolution 2D 8x58x58x64->64 k3 s1 valid", "convolution",
         ((8, 58, 58, 64), (3, 3, 64, 64))),
    Case("ConvolutionBackwardWeights 2D 8x56x56x64 k3 p1", "convolution_backward_weights",
         ((8, 56, 56, 64), (8, 56, 56, 64)), dict(pads_begin=1, pads_end=1),
         extra=((3, 3, 64, 64),)),
    Case("ConvTransposeBackwardWeights 2D 8x32x32x64 k3 s2", "conv_transpose_backward_weights",
         ((8, 32, 32, 64), (8, 64, 64, 64)),
         dict(strides=2, pads_begin=1, pads_end=1, output_padding=1),
         extra=((3, 3, 64, 64),)),
    _ct("ConvTranspose 2D bf16", 8, (32, 32), 64, 64, 3, 2, 1, 1, dtype="bfloat16"),
    Case("ConvolutionBackwardData 2D 8x56x56x64 k3 s2 p1", "convolution_backward_data",
         ((8, 28, 28, 64), (3, 3, 64, 64)), dict(strides=2, pads_begin=1, pads_end=1),
         extra=((56, 56),)),
    Case("Convolution 2D 8x56x56x64->64 k4 s2 same_upper (asymmetric)", "convolution",
         ((8, 56, 56, 64), (4, 4, 64, 64)), dict(strides=2, auto_pad="same_upper")),
)


# --------------------------------------------------------------------------------------------
# competitors
# --------------------------------------------------------------------------------------------

def _inputs(case: Case, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s, dtype=np.float32).astype(numpy_dtype(case.dtype))
            for s in case.shapes]


def _polyconv_numpy(case: Case, arrays):
    fn = getattr(polyconv, case.op)
    return lambda: fn(*arrays, *case.extra, backend="numpy", **case.attrs)


def _polyconv_jax(case: Case, arrays):
    import jax
    import jax.numpy as jnp

    fn = jax.jit(partial(getattr(polyconv, case.op), **case.attrs),
                 static_argnums=tuple(range(len(arrays), len(arrays) + len(case.extra))))
    xs = [jnp.asarray(a) for a in arrays]
    return lambda: fn(*xs, *case.extra).block_until_ready()


def torch_dtype(case: Any):
    """The torch dtype of a case or corpus layer (its ``dtype`` name); PyTorch's threads set
    as ``--threads`` asks (see main)."""
    import torch

    if os.environ.get(_THREADS_ENV):
        torch.set_num_threads(int(os.environ[_THREADS_ENV]))
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[case.dtype]


def torch_tensor(a: np.ndarray, dtype: Any):
    """``a`` as a contiguous torch tensor in torch's own memory, as a PyTorch user's tensors
    are: memory that numpy allocated may be only 16-byte aligned, which slows oneDNN's kernels
    (a 0.2 ms depthwise layer by 1.3x), so no competitor gets it. (``torch.tensor`` keeps a
    strided array's strides, hence the contiguous copy first.)"""
    import torch

    return torch.tensor(np.ascontiguousarray(a, np.float32), dtype=dtype)


def _polyconv_array_api_torch(case: Case, arrays):
    """polyconv's generic array-API backend on PyTorch tensors (the user's NXC layout)."""

    tdt = torch_dtype(case)
    fn = getattr(polyconv, case.op)
    xs = [torch_tensor(a, tdt) for a in arrays]
    return lambda: fn(*xs, *case.extra, backend="array_api", **case.attrs)


#: channels-last weights formats -> torch's own layout of the same weights
_TORCH_WEIGHTS = {"XOI": "IOX", "XIO": "OIX"}


def _polyconv_torch(case: Case, arrays):
    """polyconv's PyTorch backend on PyTorch tensors: NXC data (torch's channels-last memory
    format, as the torch peer has it) and the weights in torch's own layout, as a PyTorch user
    passes them (``weights_format="IOX"`` for ConvTranspose, ``"OIX"`` for Convolution)."""

    tdt = torch_dtype(case)
    fn = getattr(polyconv, case.op)
    attrs = dict(case.attrs)
    arrays = list(arrays)
    wfmt = attrs.get("weights_format") or spec(case.op).weights_format
    if "weights" in spec(case.op).positional and wfmt in _TORCH_WEIGHTS:
        arrays[1] = _torch_weights_iox(arrays[1])
        attrs["weights_format"] = _TORCH_WEIGHTS[wfmt]
    xs = [torch_tensor(a, tdt) for a in arrays]
    return lambda: fn(*xs, *case.extra, **attrs)


def _torch_weights_iox(w: np.ndarray):
    """XOI [K.., OC/G, IC] or XIO [K.., IC/G, OC] -> channels-first [.., .., K..]."""
    return np.ascontiguousarray(np.moveaxis(w, (-1, -2), (0, 1)))


def _torch(case: Case, arrays):
    import torch
    import torch.nn.functional as F

    p = case.plan
    d = p.ndim
    memfmt = {2: torch.channels_last, 3: torch.channels_last_3d}.get(d)
    tdt = torch_dtype(case)

    def data(x):
        t = torch_tensor(np.moveaxis(x, -1, 1), tdt)
        return t.contiguous(memory_format=memfmt) if memfmt else t

    pad = list(p.pads_begin)
    if any(b != e for b, e in zip(p.pads_begin, p.pads_end)):
        if case.op != "convolution":
            return None
        # torch has no asymmetric pads: a user pads the input first (TF/Keras "SAME" ports)
        extra = [q for b, e in reversed(list(zip(p.pads_begin, p.pads_end))) for q in (b, e)]
        x, w = arrays
        xt = data(x)
        wt = torch_tensor(_torch_weights_iox(w), tdt)
        f = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[d]
        return lambda: f(F.pad(xt, extra), wt, stride=p.strides, dilation=p.dilations,
                         groups=p.groups)
    if case.op == "conv_transpose":
        x, w = arrays
        xt, wt = data(x), torch_tensor(_torch_weights_iox(w), tdt)
        f = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[d]
        kw = dict(stride=p.strides, padding=pad, output_padding=p.output_padding,
                  groups=p.groups, dilation=p.dilations)
        return lambda: f(xt, wt, **kw)
    if case.op == "convolution":
        x, w = arrays
        xt, wt = data(x), torch_tensor(_torch_weights_iox(w), tdt)
        f = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[d]
        return lambda: f(xt, wt, stride=p.strides, padding=pad, dilation=p.dilations,
                         groups=p.groups)
    if case.op == "convolution_backward_data":
        diff_dst, w = arrays
        dy = data(diff_dst)
        wt = torch_tensor(_torch_weights_iox(w), tdt)
        size = (p.batch, p.a_channels, *p.a_spatial)
        f = getattr(torch.nn.grad, f"conv{d}d_input")
        return lambda: f(size, wt, dy, stride=p.strides, padding=pad, dilation=p.dilations,
                         groups=p.groups)
    transposed = case.op == "conv_transpose_backward_weights"
    src, diff_dst = (data(a) for a in arrays)
    w = torch.zeros(_torch_weights_shape(case), dtype=tdt)
    if transposed:
        args = (diff_dst, src, w, None, p.strides, pad, p.dilations, True,
                p.output_padding, p.groups, (False, True, False))
    else:
        args = (diff_dst, src, w, None, p.strides, pad, p.dilations, False,
                (0,) * d, p.groups, (False, True, False))
    return lambda: torch.ops.aten.convolution_backward(*args)


def _torch_weights_shape(case: Case):
    shape = case.extra[0]
    return (shape[-1], shape[-2], *shape[:-2])


def _lax(case: Case, arrays):
    """The equivalent hand-written ``lax.conv_general_dilated`` call, jitted."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    p = case.plan
    d = p.ndim
    sp = "".join(chr(ord("0") + i) for i in range(d)) if d > 3 else "DHW"[-d:]
    dn = (f"N{sp}C", f"{sp}IO", f"N{sp}C")
    hi = lax.Precision.HIGHEST
    acc = jnp.float32
    pads = list(zip(p.pads_begin, p.pads_end))

    def conv(x, w, **kwargs):
        """The case's forward convolution (of the transposed ops: the one they transpose)."""
        return lax.conv_general_dilated(x, w, p.strides, pads, rhs_dilation=p.dilations,
                                        dimension_numbers=dn, feature_group_count=p.groups,
                                        precision=hi, **kwargs)

    if case.op == "conv_transpose":
        x, w = (jnp.asarray(a) for a in arrays)
        g, k = p.groups, p.kernel
        # XOI [K.., OC/G, IC] -> flipped, regrouped XIO [K.., IC/G, OC]
        wr = w.reshape(*k, p.a_channels // g, g, p.b_channels // g)
        wr = jnp.moveaxis(wr, -2, -3).reshape(*k, p.a_channels, p.b_channels // g)
        wr = jnp.swapaxes(wr, -1, -2)[tuple(slice(None, None, -1) for _ in range(d))]
        eks = p.effective_kernel
        t_pads = [(ek - 1 - b, ek - 1 - e + o)
                  for ek, b, e, o in zip(eks, p.pads_begin, p.pads_end, p.output_padding)]
        fn = jax.jit(lambda x, w: lax.conv_general_dilated(
            x, w, (1,) * d, t_pads, lhs_dilation=p.strides, rhs_dilation=p.dilations,
            dimension_numbers=dn, feature_group_count=g, precision=hi,
            preferred_element_type=acc).astype(x.dtype))
        wr = jnp.asarray(wr)
        return lambda: fn(x, wr).block_until_ready()
    if case.op == "convolution":
        x, w = (jnp.asarray(a) for a in arrays)
        fn = jax.jit(lambda x, w: conv(x, w, preferred_element_type=acc).astype(x.dtype))
        return lambda: fn(x, w).block_until_ready()
    if case.op == "convolution_backward_data":
        # jax's own transpose rule of the forward conv (vjp in the input), as users write it
        diff_dst, w = (jnp.asarray(a) for a in arrays)
        x0 = jnp.zeros(p.a_shape, diff_dst.dtype)
        fn = jax.jit(lambda w, dy: jax.vjp(lambda x: conv(x, w), x0)[1](dy)[0])
        return lambda: fn(w, diff_dst).block_until_ready()
    if case.op not in ("convolution_backward_weights", "conv_transpose_backward_weights"):
        return None
    # weight gradients: jax's own transpose rule of the forward conv (vjp), as users write it
    src, diff_dst = (jnp.asarray(a) for a in arrays)
    if case.op == "convolution_backward_weights":
        w0 = jnp.zeros(case.extra[0], src.dtype)
        # src is an argument, not a closed-over constant XLA could transform at compile time
        fn = jax.jit(lambda x, dy: jax.vjp(partial(conv, x), w0)[1](dy)[0])
        return lambda: fn(src, diff_dst).block_until_ready()
    # ConvTransposeBackwardWeights: vjp of lax.conv_transpose (groups 1 only)
    if p.groups != 1:
        return None
    w0 = jnp.zeros(case.extra[0], src.dtype)   # XOI
    t_pads = [(ek - 1 - b, ek - 1 - e + o) for ek, b, e, o in
              zip(p.effective_kernel, p.pads_begin, p.pads_end, p.output_padding)]

    def fwd_t(x, w):
        return lax.conv_transpose(x, w, p.strides, t_pads, rhs_dilation=p.dilations,
                                  dimension_numbers=(f"N{sp}C", f"{sp}IO", f"N{sp}C"),
                                  transpose_kernel=True, precision=hi)

    fn = jax.jit(lambda x, dy: jax.vjp(partial(fwd_t, x), w0)[1](dy)[0])
    return lambda: fn(src, diff_dst).block_until_ready()


@dataclass(frozen=True)
class Competitor:
    name: str
    requires: str | None
    make: Callable[[Case, list[np.ndarray]], Callable[[], Any] | None]


COMPETITORS: tuple[Competitor, ...] = (
    Competitor("polyconv-numpy", None, _polyconv_numpy),
    Competitor("polyconv-jax", "jax", _polyconv_jax),
    Competitor("polyconv-array-api", "torch", _polyconv_array_api_torch),
    Competitor("polyconv-torch", "torch", _polyconv_torch),
    Competitor("torch", "torch", _torch),
    Competitor("lax", "jax", _lax),
)
BASELINE = "polyconv-numpy"


# --------------------------------------------------------------------------------------------
# measurement
# --------------------------------------------------------------------------------------------

def matmul_rate(n: int = 2048, repeats: int = 5) -> float:
    """This machine's float32 matmul rate (GFLOP/s) with numpy: the practical CPU limit."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times) / 1e9


def peak_extra_memory(fn: Callable[[], Any]) -> int:
    """Peak bytes allocated by numpy during one call (tracemalloc sees numpy's buffers)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


#: the least time of one timed sample (several calls of a fast competitor)
SAMPLE_SECONDS = 0.005


#: the least time of a competitor's untimed calls before each timed sample: longer than
#: OpenBLAS's workers spin after a call (about 0.1 s of a CPU, measured on numpy's OpenBLAS)
LEAD_IN_SECONDS = 0.15


def _lead_in(fn: Callable[[], Any], calls: int) -> None:
    """Untimed calls before a timed sample: at least ``calls``, and for at least
    :data:`LEAD_IN_SECONDS`. They wake this competitor's thread pool (on a VM a parked worker
    can take milliseconds to wake) while the previous competitor's workers, which spin for a
    while after their last call (OpenBLAS's for about 0.1 s), go idle: with 3 ms of lead-in, a
    3 ms XLA convolution timed after the numpy backend ran at half speed, sharing the CPUs with
    OpenBLAS's spinning workers. They also bring back the caches and memory state the
    previous competitor displaced (a 0.2 ms call runs 2-4x slower for its first ten calls after
    a heavy one). The timed calls then measure back-to-back use, as in a real loop."""
    end = time.perf_counter() + LEAD_IN_SECONDS
    for _ in range(calls):
        fn()
    while time.perf_counter() < end:
        fn()


def run_case(case: Case, competitors, repeats: int, warmup: int, log,
             lead_in: int = 1) -> dict[str, Any]:
    arrays = _inputs(case)
    fns: dict[str, Callable[[], Any]] = {}
    skipped: dict[str, str] = {}
    for comp in competitors:
        if comp.requires and find_spec(comp.requires) is None:
            skipped[comp.name] = f"{comp.requires} not installed"
            continue
        try:
            fn = comp.make(case, arrays)
        except Exception as exc:  # a peer that cannot express the case
            skipped[comp.name] = f"{type(exc).__name__}: {exc}"
            continue
        if fn is None:
            skipped[comp.name] = "cannot express this case"
            continue
        fns[comp.name] = fn
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    # calls per timed sample: enough for about SAMPLE_SECONDS (as timeit's autorange), so
    # that a sub-millisecond call is not measured against the host's scheduling jitter
    number = {}
    for name, fn in fns.items():
        t0 = time.perf_counter()
        fn()
        number[name] = max(1, min(100, int(SAMPLE_SECONDS / max(time.perf_counter() - t0,
                                                                   1e-9))))
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(repeats):
        order = list(fns.items())
        if r % 2:
            order.reverse()          # interleaved, alternating order
        for name, fn in order:
            _lead_in(fn, lead_in)
            t0 = time.perf_counter()
            for _ in range(number[name]):
                fn()
            times[name].append((time.perf_counter() - t0) / number[name])
        log(f"\r  {case.name}: round {r + 1}/{repeats}")
    log("\n")
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    io_bytes = sum(a.nbytes for a in arrays) + math.prod(case.plan.shape) * arrays[0].itemsize
    peak = peak_extra_memory(fns[BASELINE]) if BASELINE in fns else None
    base = medians.get(BASELINE)
    return {
        "case": case.name,
        "op": case.op,
        "dtype": case.dtype,
        "gflop": case.flops / 1e9,
        "median_s": medians,
        "gflops": {n: case.flops / t / 1e9 for n, t in medians.items()},
        "speed_vs_numpy": {n: (base / t if base else None) for n, t in medians.items()},
        "numpy_peak_extra_memory_ratio": (peak / io_bytes if peak is not None else None),
        "skipped": skipped,
    }


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
        info["avx512"] = " avx512f " in f" {flags.split(':', 1)[-1].strip()} "
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


#: environment variables a benchmark record names when set (variable -> key in ``machine``):
#: settings that change which kernels run or where buffers live. numpy's OpenBLAS picks its
#: kernels by CPU unless ``OPENBLAS_CORETYPE`` says otherwise (AVX2 "Haswell" kernels run
#: float32 products at half the AVX-512 rate); XLA's CPU options change its kernels (2-D
#: convolutions through YNNPACK ran 1.6-2.9x faster on an AVX-512 host); glibc's arena count
#: decides where threads' scratch buffers live (page faults per call)
_ENVIRONMENT = {"OPENBLAS_CORETYPE": "openblas_coretype", "XLA_FLAGS": "xla_flags",
                "MALLOC_ARENA_MAX": "malloc_arena_max"}


def _version(mod: str) -> str:
    """An installed library's version, without importing it where it is not imported yet
    (the corpus writes its record after every row: importing PyTorch there would load its
    thread pools between the timings of the rows that follow)."""
    if mod in sys.modules:
        return sys.modules[mod].__version__
    try:
        return importlib.metadata.version(mod)
    except importlib.metadata.PackageNotFoundError:    # on the path, not installed
        return __import__(mod).__version__


def machine() -> dict[str, Any]:
    info = {"platform": platform.platform(), "processor": _cpu_model(),
            "python": platform.python_version(), "cpus": os.cpu_count(),
            "threads": int(os.environ[_THREADS_ENV]) if os.environ.get(_THREADS_ENV) else None,
            "numpy": np.__version__, "polyconv": polyconv.__version__}
    for mod in ("jax", "torch"):
        if find_spec(mod) is not None:
            info[mod] = _version(mod)
    for var, key in _ENVIRONMENT.items():
        if os.environ.get(var):
            info[key] = os.environ[var]
    info.update(_vector_units())
    # whether a backend raised glibc's malloc thresholds (every library in the process
    # allocates under them)
    malloc = sys.modules.get("polyconv._malloc")
    if malloc is not None and malloc.applied():
        info["malloc"] = "thresholds raised by polyconv"
    return info


def _cpus(m: dict[str, Any]) -> str:
    threads = m.get("threads")
    return f"{m['cpus']} CPUs" + (f", every library on {threads} thread(s)" if threads else "")


def format_table(results: dict[str, Any]) -> str:
    names = [c.name for c in COMPETITORS
             if any(c.name in r["median_s"] for r in results["cases"])]
    rate = results["matmul_gflops"]
    lines = [f"machine: {results['machine']['platform']}, {_cpus(results['machine'])}; "
             f"numpy f32 matmul {rate:.1f} GFLOP/s",
             f"{'case':48s} " + " ".join(f"{n:>16s}" for n in names)
             + "  numpy mem  numpy %peak"]
    for r in results["cases"]:
        cells = []
        for n in names:
            speed = r["speed_vs_numpy"].get(n)
            if n not in r["median_s"]:
                cells.append(f"{'skipped':>16s}")
            else:      # without polyconv-numpy in the run (--competitors), times only
                cells.append(f"{r['median_s'][n] * 1e3:8.2f}ms"
                             + (f" x{speed:5.2f}" if speed is not None else ""))
        mem = r["numpy_peak_extra_memory_ratio"]
        frac = r["gflops"].get(BASELINE, 0) / rate * 100
        lines.append(f"{r['case']:48s} " + " ".join(f"{c:>16s}" for c in cells)
                     + (f"  {mem:8.2f}x  {frac:9.1f}%" if mem is not None else ""))
    lines.append("xN = speed relative to polyconv-numpy (>1 is faster than polyconv-numpy); "
                 "mem = peak extra memory / (inputs + output)")
    return "\n".join(lines)


def format_markdown(results: dict[str, Any]) -> str:
    """The results as a Markdown table (medians in ms, and speed relative to polyconv-numpy)."""
    names = [c.name for c in COMPETITORS]
    m = results["machine"]
    cpu = f" ({m['processor']})" if m.get("processor") else ""
    lines = [f"Machine: {m['platform']}, {_cpus(m)}{cpu}, Python {m['python']}, numpy "
             f"{m['numpy']}" + "".join(f", {k} {m[k]}" for k in ("jax", "torch") if k in m)
             + f"; numpy float32 matmul rate {results['matmul_gflops']:.0f} GFLOP/s.", "",
             "| case | " + " | ".join(names) + " | numpy GFLOP/s (% of matmul) "
             "| numpy peak extra memory |",
             "|---|" + "---|" * (len(names) + 2)]
    for r in results["cases"]:
        cells = []
        for n in names:
            if n in r["median_s"]:
                cells.append(f"{r['median_s'][n] * 1e3:.2f} ms (x{r['speed_vs_numpy'][n]:.2f})")
            else:
                cells.append("skipped")
        g = r["gflops"].get(BASELINE, 0.0)
        mem = r["numpy_peak_extra_memory_ratio"]
        lines.append(f"| {r['case']} | " + " | ".join(cells)
                     + f" | {g:.1f} ({g / results['matmul_gflops'] * 100:.0f}%) | "
                     + (f"{mem:.2f}x |" if mem is not None else "n/a |"))
    lines += ["", "x*N*: speed relative to polyconv-numpy in the same run (above 1 is faster). "
              "Peak extra memory: the largest numpy allocation during a call, over the bytes "
              "of its inputs and output."]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    """Bar chart of GFLOP/s per case and competitor (matplotlib, generated from the JSON)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [c.name for c in COMPETITORS]
    cases = results["cases"]
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(cases) + 1.5))
    height = 0.8 / len(names)
    for i, n in enumerate(names):
        ys = [j + i * height for j in range(len(cases))]
        vals = [r["gflops"].get(n, 0.0) for r in cases]
        ax.barh(ys, vals, height=height, label=n)
    ax.axvline(results["matmul_gflops"], color="k", ls="--", lw=1, label="numpy f32 matmul")
    ax.set_yticks([j + 0.4 - height / 2 for j in range(len(cases))])
    ax.set_yticklabels([r["case"] for r in cases], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("GFLOP/s (higher is better)")
    ax.set_title(f"polyconv benchmarks, {_cpus(results['machine'])}")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


_THREADS_ENV = "POLYCONV_BENCH_THREADS"


def _rerun_with_threads(threads: int, argv: list[str]) -> int:
    """Run the suite in a fresh process whose libraries all use ``threads`` threads.

    Thread counts are read when numpy's BLAS, XLA and PyTorch start, hence the new process:
    the BLAS/OpenMP variables are set, the process is pinned to ``threads`` CPUs (XLA sizes its
    pool from that), and PyTorch is told the count.
    """
    n = str(threads)
    env = dict(os.environ, **{_THREADS_ENV: n, "OPENBLAS_NUM_THREADS": n,
                              "OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n})
    if threads == 1:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false"
                            " intra_op_parallelism_threads=1").strip()
    return subprocess.call([sys.executable, "-m", "polyconv.benchmarks.suite", *argv], env=env)


def _pin(threads: int) -> None:
    """Pin this process to its first ``threads`` allowed CPUs (where the OS allows it)."""
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))[:threads]
        os.sched_setaffinity(0, cpus)


def select_competitors(parser: argparse.ArgumentParser, text: str, competitors):
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


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``polyconv bench``."""
    parser = argparse.ArgumentParser(prog="polyconv bench", description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7,
                        help="timed rounds per case; each round times every competitor once "
                             "(default 7)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed calls of each competitor before the rounds (default 2)")
    parser.add_argument("--cases", default="", help="substring filter on case names")
    parser.add_argument("--lead-in", type=int, default=1,
                        help="untimed calls of a competitor before each timed one, for at "
                             "least 3 ms (default 1)")
    parser.add_argument("--competitors", default="",
                        help="comma-separated competitor names to run (default: all of "
                             + ", ".join(c.name for c in COMPETITORS) + ")")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--plot", type=Path, help="write a PNG bar chart here")
    parser.add_argument("--threads", type=int,
                        help="run numpy's BLAS, XLA and PyTorch on this many threads, pinned to "
                             "as many CPUs (default: each library's own choice)")
    parser.epilog = ("'polyconv bench --corpus [options]' runs the layers of real public models "
                     "instead, forward and gradient ('polyconv bench --corpus --help'); "
                     "'polyconv bench --implementations' forces every implementation of every "
                     "backend on them, for the choice among implementations.")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--corpus"]:          # the real-model layers: their own options
        from .corpus import main as corpus_main

        return corpus_main(argv[1:])
    if argv[:1] == ["--implementations"]:  # every implementation forced on the corpus
        from .implementations import main as implementations_main

        return implementations_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    selected = [c for c in CASES if args.cases.lower() in c.name.lower()]
    if not selected:
        names = "; ".join(c.name for c in CASES)
        parser.error(f"--cases {args.cases!r} matches no case name; the cases are: {names}")
    competitors = select_competitors(parser, args.competitors, COMPETITORS)
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be at least 1, got {args.threads}")
        if os.environ.get(_THREADS_ENV) != str(args.threads):
            return _rerun_with_threads(args.threads, argv)
        _pin(args.threads)

    def log(msg: str) -> None:
        sys.stderr.write(msg)
        sys.stderr.flush()

    rate = matmul_rate()
    cases = [run_case(case, competitors, args.repeats, args.warmup, log, args.lead_in)
             for case in selected]
    # the machine after the runs: what they ran under
    results = {"machine": machine(), "matmul_gflops": rate, "cases": cases}
    print(format_table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
