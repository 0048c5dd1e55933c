"""Every implementation of every backend, forced in turn, on every corpus layer.

For each layer of the corpus (:mod:`polyconv.benchmarks.corpus_layers`) and each of its three
primitives (the layer's op, and the two its gradient runs), each implementation that applies
(:func:`polyconv.implementations`) is forced (:func:`polyconv.implementation`) and timed:
the fastest of a few calls after the first (JAX: jitted; the first call, compilation
included, is recorded too), taken in rounds over the implementations. The record answers two
questions of the choice among implementations:

- **does the default pick hold up?** the default's time against the fastest implementation's,
  per row, with the geometric mean and the worst rows;
- **does every implementation earn its place?** the rows where it is the fastest by more than
  10% over the next one; an implementation that wins nowhere is a candidate for removal.

Each (layer, backend) runs in a process of its own, so that a lowering XLA cannot compile
cannot take the run down with it. Run with ``polyconv bench --implementations``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import polyconv

from .corpus import matching_layers
from .corpus_layers import LAYERS
from .harness import machine, random_arrays, time_calls, write_record

PRIMITIVES = ("forward", "backward_data", "backward_weights")
#: a win: the fastest implementation takes less than the next one by this factor
WIN = 1.10
#: rounds of timing after the first call; an implementation whose first call took longer
#: than SLOW_S (compilation included) is not timed again (it cannot win, and it would hold the
#: run up): its first call stands for it
CALLS = 5
SLOW_S = 1.0


def _operands(plan: polyconv.ConvPlan, primitive: str, dtype: str, backend: str):
    arrays = random_arrays(plan.operand_shapes(primitive), dtype)
    if backend == "jax":
        import jax.numpy as jnp

        arrays = [jnp.asarray(x) for x in arrays]
    return arrays


def _runner(backend: str, primitive: str, plan: polyconv.ConvPlan, arrays):
    """A zero-argument call of the backend's primitive that waits for its result; for JAX
    jitted (the choice is read when it is traced, inside the forcing block)."""
    impl = getattr(polyconv.get_backend(backend), primitive)
    if backend != "jax":
        return lambda: impl(plan, *arrays)
    import jax

    fn = jax.jit(lambda x, y: impl(plan, x, y))
    return lambda: jax.block_until_ready(fn(*arrays))


def _rounds(calls: dict[str, Any], force) -> dict[str, float]:
    """The fastest sample of each call (seconds a call) over :data:`CALLS` rounds of the
    harness's interleaved timing (:func:`~polyconv.benchmarks.harness.time_calls`: the order
    reversed every other round, so a burst of other work on the machine slows one round of
    every implementation, not every call of one), each call inside its forcing."""
    def forced(name: str, call: Any):
        def run() -> Any:
            with force(name):
                return call()
        return run

    times = time_calls({name: forced(name, call) for name, call in calls.items()}, CALLS, 0,
                       lambda _: None, "implementations")
    return {name: min(ts) for name, ts in times.items()}


def measure_layer(index: int, backend: str) -> list[dict[str, Any]]:
    """One layer's rows on one backend: per primitive, every applicable implementation."""
    layer = LAYERS[index]
    rows = []
    for primitive in PRIMITIVES:
        plan = layer.plan.with_(primitive=primitive, dtype=layer.dtype)
        arrays = _operands(plan, primitive, layer.dtype, backend)
        calls, first = {}, {}

        def force(name: str, primitive: str = primitive):
            return polyconv.implementation(f"{backend}:{primitive}={name}")

        for name in polyconv.implementations(backend, primitive, plan):
            try:
                call = _runner(backend, primitive, plan, arrays)
                with force(name):
                    t0 = time.perf_counter()
                    call()      # JAX: traced and compiled here
                    first[name] = time.perf_counter() - t0
                calls[name] = call
            except Exception as exc:     # a lowering that cannot run here never wins
                first[name] = math.inf
                sys.stderr.write(f"{layer.title} {primitive} {name}: {exc!r:.200}\n")
        best = {**first, **_rounds({n: c for n, c in calls.items() if first[n] <= SLOW_S},
                                   force)}
        rows.append({"layer": layer.title, "backend": backend, "primitive": primitive,
                     "dtype": layer.dtype,
                     "default": polyconv.default_implementation(backend, primitive, plan),
                     "seconds": best, "first_call_s": first})
    return rows


def _child(index: int, backend: str, timeout: float) -> list[dict[str, Any]]:
    cmd = [sys.executable, "-m", "polyconv.benchmarks", "--implementations", "--one",
           str(index), "--backends", backend]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [{"layer": LAYERS[index].title, "backend": backend, "error": "timed out"}]
    if done.returncode != 0:
        return [{"layer": LAYERS[index].title, "backend": backend,
                 "error": f"exit {done.returncode}: {done.stderr[-300:]}"}]
    return json.loads(done.stdout)


# --------------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------------

def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per backend: the default's ratio to the fastest (geometric mean, worst rows), and
    per implementation the rows it wins by more than :data:`WIN`."""
    out: dict[str, Any] = {}
    by_backend = defaultdict(list)
    for r in rows:
        if r.get("seconds"):
            by_backend[r["backend"]].append(r)
    for backend, rs in by_backend.items():
        ratios, wins, applies = [], defaultdict(list), defaultdict(int)
        for r in rs:
            t = {n: s for n, s in r["seconds"].items() if math.isfinite(s)}
            for n in r["seconds"]:
                applies[f"{r['primitive']}={n}"] += 1
            if not t:
                continue
            fastest = min(t, key=t.__getitem__)
            ratio = r["seconds"].get(r["default"], math.inf) / t[fastest]
            ratios.append((ratio, f"{r['layer']} {r['primitive']}: {r['default']} against "
                                  f"{fastest}"))
            others = sorted(s for n, s in t.items() if n != fastest)
            if others and others[0] > WIN * t[fastest]:
                wins[f"{r['primitive']}={fastest}"].append(
                    f"{r['layer']} ({others[0] / t[fastest]:.2f}x)")
        finite = [x for x, _ in ratios if math.isfinite(x)]
        out[backend] = {
            "default_vs_fastest_geomean": statistics.geometric_mean(finite) if finite else None,
            "worst": [f"{x:.2f}x {what}" for x, what in sorted(ratios, reverse=True)[:10]],
            "wins": {name: wins.get(name, []) for name in sorted(applies)},
            "rows_applicable": dict(sorted(applies.items())),
        }
    return out


def format_summary(summary: dict[str, Any]) -> str:
    lines = []
    for backend, s in summary.items():
        g = s["default_vs_fastest_geomean"]
        lines.append(f"== {backend}: default pick / fastest, geometric mean "
                     f"{g:.3f}" if g else f"== {backend}: no rows")
        lines += [f"   worst: {w}" for w in s["worst"][:5]]
        for name, won in s["wins"].items():
            where = "; ".join(won[:4]) + (" ..." if len(won) > 4 else "")
            lines.append(f"   {name:34s} applies {s['rows_applicable'][name]:3d}, "
                         f"wins {len(won):3d}  {where}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="polyconv bench --implementations",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--layers", default="",
                        help="substring filter on layer titles (several: separated by '|')")
    parser.add_argument("--backends", default="numpy,jax")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds one layer may take on one backend")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    if args.one is not None:             # the child: one layer, JSON rows on stdout
        print(json.dumps([r for b in backends for r in measure_layer(args.one, b)]))
        return 0
    titles = {ly.title for ly in matching_layers(args.layers)}
    rows = []
    for index, layer in enumerate(LAYERS):
        if layer.title not in titles:
            continue
        for backend in backends:
            sys.stderr.write(f"{layer.title} on {backend}\n")
            rows += _child(index, backend, args.timeout)
            write_record(args.json, {"machine": machine(), "rows": rows,
                                     "summary": summarize(rows)})
    print(format_summary(summarize(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
