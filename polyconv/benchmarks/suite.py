"""polyconv's benchmark suite: polyconv side by side with the tools users would otherwise pick.

Run with ``polyconv bench`` (or ``polyconv bench --suite``). Each case runs all its
competitors in one process, interleaved (the harness's timing loop,
:func:`~polyconv.benchmarks.harness.time_calls`), and reports the median time, GFLOP/s, the
fraction of this machine's float32 matmul rate, and the ratio of every competitor to
polyconv's numpy backend. Peers are optional: a peer whose package is missing is listed as
skipped. Nothing here is a test: timings are only compared within one run, as ratios.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

import polyconv

from . import peers, report
from .harness import (
    Competitor,
    log,
    machine,
    make_calls,
    medians,
    random_arrays,
    select_competitors,
    threaded,
    time_calls,
    torch_dtype,
    torch_tensor,
    write_record,
)


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
# competitors: polyconv's backends here, the peers from peers.py
# --------------------------------------------------------------------------------------------

def operands(case: Case, arrays):
    """The case's arrays as its primitive's operands, ``(a, w)``, ``(b, w)`` or ``(a, b)``:
    as the op takes them, except that a ConvTranspose's ``src`` is the small tensor."""
    if case.plan.primitive == "backward_weights" and case.op.startswith("conv_transpose"):
        return list(arrays[::-1])
    return list(arrays)


def _polyconv_numpy(case: Case, mode: str, arrays):
    return partial(getattr(polyconv, case.op), *arrays, *case.extra, backend="numpy",
                   **case.attrs)


def _polyconv_jax(case: Case, mode: str, arrays):
    import jax
    import jax.numpy as jnp

    fn = jax.jit(partial(getattr(polyconv, case.op), **case.attrs),
                 static_argnums=tuple(range(len(arrays), len(arrays) + len(case.extra))))
    xs = [jnp.asarray(a) for a in arrays]
    return lambda: fn(*xs, *case.extra).block_until_ready()


def _polyconv_array_api_torch(case: Case, mode: str, arrays):
    """polyconv's generic array-API backend on PyTorch tensors (the user's NXC layout)."""
    tdt = torch_dtype(case.dtype)
    xs = [torch_tensor(a, tdt) for a in arrays]
    return partial(getattr(polyconv, case.op), *xs, *case.extra, backend="array_api",
                   **case.attrs)


def _polyconv_torch(case: Case, mode: str, arrays):
    """polyconv's PyTorch backend on PyTorch tensors: NXC data (torch's channels-last memory
    format, as the torch peer has it) and the weights in torch's own layout, as a PyTorch user
    passes them (``weights_format="IOX"`` for the ConvTranspose ops, ``"OIX"`` else)."""
    plan, attrs, arrays = case.plan, dict(case.attrs), list(arrays)
    if plan.primitive != "backward_weights":        # the second input: the weights
        arrays[1] = peers.canonical(plan, arrays[1])
        attrs["weights_format"] = "IOX" if case.op.startswith("conv_transpose") else "OIX"
    tdt = torch_dtype(case.dtype)
    xs = [torch_tensor(a, tdt) for a in arrays]
    return partial(getattr(polyconv, case.op), *xs, *case.extra, **attrs)


COMPETITORS: tuple[Competitor, ...] = (
    Competitor("polyconv-numpy", None, _polyconv_numpy),
    Competitor("polyconv-jax", "jax", _polyconv_jax),
    Competitor("polyconv-array-api", "torch", _polyconv_array_api_torch),
    Competitor("polyconv-torch", "torch", _polyconv_torch),
    Competitor("torch", "torch", lambda case, mode, arrays: peers.torch(
        case.plan, mode, operands(case, arrays), case.dtype)),
    Competitor("lax", "jax", lambda case, mode, arrays: peers.lax(
        case.plan, mode, operands(case, arrays), case.dtype)),
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


def run_case(case: Case, competitors, repeats: int, warmup: int, log=log,
             lead_in: int = 1) -> dict[str, Any]:
    """One case's row: every competitor's median time, GFLOP/s and speed against polyconv's
    numpy backend, and that backend's peak extra memory."""
    arrays = random_arrays(case.shapes, case.dtype)
    calls, skipped = make_calls(case, "forward", arrays, competitors)
    times = medians(time_calls(calls, repeats, warmup, log, case.name, lead_in))
    io_bytes = sum(a.nbytes for a in arrays) + math.prod(case.plan.shape) * arrays[0].itemsize
    peak = peak_extra_memory(calls[BASELINE]) if BASELINE in calls else None
    base = times.get(BASELINE)
    return {
        "case": case.name,
        "op": case.op,
        "dtype": case.dtype,
        "gflop": case.flops / 1e9,
        "median_s": times,
        "gflops": {n: case.flops / t / 1e9 for n, t in times.items()},
        "speed_vs_numpy": {n: (base / t if base else None) for n, t in times.items()},
        "numpy_peak_extra_memory_ratio": (peak / io_bytes if peak is not None else None),
        "skipped": skipped,
    }


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
                             "least 0.15 s (default 1)")
    parser.add_argument("--competitors", default="",
                        help="comma-separated competitor names to run (default: all of "
                             + ", ".join(c.name for c in COMPETITORS) + ")")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--plot", type=Path, help="write a PNG bar chart here")
    parser.add_argument("--threads", type=int,
                        help="run numpy's BLAS, XLA and PyTorch on this many threads, pinned to "
                             "as many CPUs (default: each library's own choice)")
    from . import BENCHMARKS

    parser.epilog = ("Other benchmarks, each with its own options ('polyconv bench FLAG "
                     "--help'): " + "; ".join(f"{flag}: {what}" for flag, (_, what)
                                               in BENCHMARKS.items()) + ".")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    selected = [c for c in CASES if args.cases.lower() in c.name.lower()]
    if not selected:
        names = "; ".join(c.name for c in CASES)
        parser.error(f"--cases {args.cases!r} matches no case name; the cases are: {names}")
    competitors = select_competitors(parser, args.competitors, COMPETITORS)
    rerun = threaded(parser, args.threads, ["--suite", *argv])
    if rerun is not None:
        return rerun
    rate = matmul_rate()
    cases = [run_case(case, competitors, args.repeats, args.warmup, log, args.lead_in)
             for case in selected]
    # the machine after the runs: what they ran under
    results = write_record(args.json, {"machine": machine(), "matmul_gflops": rate,
                                       "cases": cases})
    print(report.suite_table(results))
    if args.plot:
        report.suite_plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
