"""polyconv's JAX backend against the hand-written ``lax.conv_general_dilated`` call.

Each case times a jitted polyconv op and the equivalent jitted ``lax`` call on the same inputs,
interleaved (the order alternates every repetition), after a warm-up, and reports the median
time of each and their ratio (polyconv / lax; the target is <= 1.05). On a busy machine the
ratio is noisy, so the report also says whether XLA compiled the same convolution instructions
for both sides (the weights-only work around them is negligible). The ``lax`` side gets its
weights already in the layout its call wants (flipped and regrouped where needed), so the
ratio also prices polyconv's in-graph weight handling.

Run::

    python -m polyconv.benchmarks.jax_vs_lax [--reps 21] [--warmup 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Case:
    name: str
    description: str
    polyconv_fn: Callable[..., Any]
    lax_fn: Callable[..., Any]
    polyconv_args: tuple
    lax_args: tuple


def _cases(jax, jnp, lax, polyconv, np) -> list[Case]:
    rng = np.random.default_rng(0)
    hi = lax.Precision.HIGHEST

    def arr(*shape):
        return jnp.asarray(rng.standard_normal(shape), jnp.float32)

    cases = []

    # ConvTranspose, NXC 8x32x32x64, k3 s2 p1/1 output_padding 1, groups 8 -> 64 channels.
    x = arr(8, 32, 32, 64)
    w = arr(3, 3, 8, 64)  # XOI: [K, K, OC/G, IC]
    attrs = {"strides": 2, "pads_begin": 1, "pads_end": 1, "output_padding": 1, "groups": 8}
    # hand-written: the transposed conv with a flipped kernel whose group factor sits in O
    w_lax = jnp.flip(w, (0, 1)).reshape(3, 3, 8, 8, 8).transpose(0, 1, 3, 2, 4)
    w_lax = w_lax.reshape(3, 3, 64, 8)  # HWOI: [K, K, OC, IC/G]
    cases.append(Case(
        "conv_transpose", "ConvTranspose NXC 8x32x32x64 k3 s2 p1/1 op1 g8 -> 8x64x64x64",
        jax.jit(lambda x, w: polyconv.conv_transpose(x, w, **attrs)),
        jax.jit(lambda x, w: lax.conv_general_dilated(
            x, w, (1, 1), [(1, 2), (1, 2)], lhs_dilation=(2, 2),
            dimension_numbers=("NHWC", "HWOI", "NHWC"), feature_group_count=8,
            precision=hi)),
        (x, w), (x, w_lax)))

    # Convolution, NXC 8x56x56x64 -> 64, k3 s1 p1.
    x = arr(8, 56, 56, 64)
    w = arr(3, 3, 64, 64)  # XIO = HWIO
    cases.append(Case(
        "convolution", "Convolution NXC 8x56x56x64 -> 64 k3 s1 p1",
        jax.jit(lambda x, w: polyconv.convolution(x, w, pads_begin=1, pads_end=1)),
        jax.jit(lambda x, w: lax.conv_general_dilated(
            x, w, (1, 1), [(1, 1), (1, 1)], dimension_numbers=("NHWC", "HWIO", "NHWC"),
            precision=hi)),
        (x, w), (x, w)))

    # Its weights gradient, against jax's own transpose rule (what jax.grad runs).
    dy = arr(8, 56, 56, 64)

    def lax_dw(x, dy):
        def conv(w):
            return lax.conv_general_dilated(x, w, (1, 1), [(1, 1), (1, 1)],
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                            precision=hi)
        return jax.vjp(conv, jnp.zeros((3, 3, 64, 64), jnp.float32))[1](dy)[0]

    cases.append(Case(
        "convolution_backward_weights",
        "ConvolutionBackwardWeights NXC 8x56x56x64 -> 3x3x64x64 (vs jax.vjp of the lax conv)",
        jax.jit(lambda x, dy: polyconv.convolution_backward_weights(
            x, dy, (3, 3, 64, 64), pads_begin=1, pads_end=1)),
        jax.jit(lax_dw), (x, dy), (x, dy)))
    return cases


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


def _time(fn, args) -> float:
    t0 = time.perf_counter()
    fn(*args).block_until_ready()
    return time.perf_counter() - t0


def run(reps: int = 21, warmup: int = 3, only: list[str] | None = None) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    import polyconv

    results = []
    for case in _cases(jax, jnp, lax, polyconv, np):
        if only and case.name not in only:
            continue
        mine = case.polyconv_fn(*case.polyconv_args)
        ref = case.lax_fn(*case.lax_args)
        scale = float(jnp.max(jnp.abs(ref)))
        err = float(jnp.max(jnp.abs(mine - ref))) / scale
        if err > 1e-5:
            msg = f"{case.name}: polyconv and lax disagree (max relative error {err:.2e})"
            raise AssertionError(msg)
        for _ in range(warmup):
            _time(case.polyconv_fn, case.polyconv_args)
            _time(case.lax_fn, case.lax_args)
        t_mine, t_lax, paired = [], [], []
        for rep in range(reps):
            if rep % 2:
                b = _time(case.lax_fn, case.lax_args)
                a = _time(case.polyconv_fn, case.polyconv_args)
            else:
                a = _time(case.polyconv_fn, case.polyconv_args)
                b = _time(case.lax_fn, case.lax_args)
            t_mine.append(a)
            t_lax.append(b)
            paired.append(a / b)
        med_mine, med_lax = statistics.median(t_mine), statistics.median(t_lax)
        same = (compiled_instructions(case.polyconv_fn, case.polyconv_args, "convolution")
                == compiled_instructions(case.lax_fn, case.lax_args, "convolution"))
        results.append({
            "case": case.name, "description": case.description, "same_convolution_hlo": same,
            "polyconv_median_s": med_mine, "lax_median_s": med_lax,
            "ratio": med_mine / med_lax, "paired_ratio_median": statistics.median(paired),
            "reps": reps,
        })
    return {"jax": jax.__version__, "backend": jax.default_backend(),
            "devices": [str(d) for d in jax.devices()], "python": platform.python_version(),
            "results": results}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m polyconv.benchmarks.jax_vs_lax",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=21, help="timed repetitions per side")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per side")
    parser.add_argument("--case", action="append", help="run only this case (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    report = run(reps=args.reps, warmup=args.warmup, only=args.case)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"jax {report['jax']} on {report['backend']} ({len(report['devices'])} device(s)); "
          f"median of {args.reps} interleaved repetitions, after {args.warmup} warm-up calls")
    print(f"{'case':<30} {'polyconv ms':>12} {'lax ms':>10} {'ratio':>7} {'paired':>7} "
          f"{'same conv HLO':>14}")
    for r in report["results"]:
        same = "yes" if r["same_convolution_hlo"] else "no"
        print(f"{r['case']:<30} {1e3 * r['polyconv_median_s']:>12.2f} "
              f"{1e3 * r['lax_median_s']:>10.2f} {r['ratio']:>7.3f} "
              f"{r['paired_ratio_median']:>7.3f} {same:>14}")
    print("ratio = median(polyconv) / median(lax); paired = median of per-repetition ratios; "
          "same conv HLO = XLA compiled the same convolution instructions for both")
    return 0


if __name__ == "__main__":
    sys.exit(main())
