"""First calls: what a plan costs the first time it runs, against the plain ``lax`` call's.

Measuring is off (polyconv's default; ``--measuring`` turns it on). Parts (``--parts``):
``generator`` and ``layers``, issue 51's DCGAN generator and a few corpus layers as functions
of their weights, each side (polyconv, the hand-written ``lax.conv_general_dilated`` call) in a
fresh process: the first jitted forward plus the first ``jax.value_and_grad`` (target 1.5x);
``numpy``, the same models' plans on the numpy backend, a fresh process each: the first call
against later calls plus the plan's resolution (``infer_shape``; target 1.5x); ``grid`` and
``corpus``, every plan of the test matrix's grid (``tests/cases.py`` of a source checkout) and
the three primitives of every corpus layer: polyconv's first jitted call against ``lax``'s, in
one warmed process, ``jax.clear_caches()`` before each side, which side goes first alternating
(a process per plan would add the same imports to both sides, for minutes; target 3x).
docs/benchmarks.md says more. Run with ``polyconv bench --first-calls``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

import polyconv

from .corpus import matching_layers
from .corpus_layers import LAYERS, Layer
from .harness import log, machine, numpy_dtype, random_arrays, write_record
from .peers import lax_function, lax_inputs

PARTS = ("generator", "layers", "numpy", "grid", "corpus")
PRIMITIVES = ("forward", "backward_data", "backward_weights")
TARGETS = {"generator": 1.5, "layers": 1.5, "numpy": 1.5, "plans": 3.0}
#: measuring's switches, the new one and the per-backend ones it replaces: set alike in
#: every process, so the benchmark means the same before and after the switch to one chooser
AUTOTUNE_VARIABLES = ("POLYCONV_AUTOTUNE", "POLYCONV_JAX_AUTOTUNE", "POLYCONV_NUMPY_AUTOTUNE")
#: forcing and cache files would time something other than the default's first call
UNSET_VARIABLES = ("POLYCONV_IMPLEMENTATION", "POLYCONV_JAX_LOWERING",
                   "POLYCONV_NUMPY_STRATEGY", "POLYCONV_AUTOTUNE_CACHE",
                   "POLYCONV_JAX_AUTOTUNE_CACHE", "POLYCONV_NUMPY_AUTOTUNE_CACHE")

GENERATOR = "DCGAN generator (5 layers)"
#: pytorch/examples dcgan/main.py's Generator (nz=100, ngf=64, nc=3), batch 16, NHWC: each
#: k4 ConvTranspose's (input size, in channels, out channels, stride, pad)
GENERATOR_LAYERS = tuple(
    Layer("DCGAN G", f"ConvT {ic}->{oc} k4 s{s} {n}x{n}", "conv_transpose", (16, n, n, ic),
          (4, 4, oc, ic), dict(strides=s, pads_begin=p, pads_end=p, weights_format="XOI"))
    for n, ic, oc, s, p in ((1, 100, 512, 1, 0), (4, 512, 256, 2, 1), (8, 256, 128, 2, 1),
                            (16, 128, 64, 2, 1), (32, 64, 3, 2, 1)))
#: varied corpus layers for the side-by-side parts: 1-D NCX strided transposed, 3-D
#: transposed, a strided depthwise, a dense 3x3 and a depthwise transposed NCX
SIDE_BY_SIDE = ("HiFi-GAN: ConvT1d 512->256 k16 s8 NCX", "MONAI UNet: ConvT3d 64->32 k3 s2 16^3",
                "MobileNetV2: depthwise 96 k3 s2 112x112", "ResNet-50: Conv 64->64 k3 s1 56x56",
                "CenterNet DLA-34: depthwise ConvT 64 k4 s2 64x64 NCX")
#: the tiny layer issue 51 saw compile for 13 s under the CPU policy (grouped lowering)
ISSUE_LAYER = Layer("issue 51", "grouped ConvT3d 20->16 k3 s1 g4 5^3", "conv_transpose",
                    (1, 5, 5, 5, 20), (3, 3, 3, 4, 20),
                    dict(pads_begin=1, pads_end=1, groups=4, weights_format="XOI"))


def models(text: str = "") -> dict[str, tuple[Layer, ...]]:
    """The side-by-side parts' models by title: the generator and one model per corpus layer
    whose title contains ``text`` or one of its ``|``-separated parts (default: the generator
    and :data:`SIDE_BY_SIDE`)."""
    wanted = [t.strip().lower() for t in text.split("|") if t.strip()]
    out = {GENERATOR: GENERATOR_LAYERS} if not wanted or any(
        t in GENERATOR.lower() for t in wanted) else {}
    for layer in LAYERS:
        if (any(t in layer.title.lower() for t in wanted) if wanted
                else layer.title in SIDE_BY_SIDE):
            out[layer.title] = (layer,)
    return out



@dataclass(frozen=True)
class Call:
    """One polyconv op on arrays of given shapes (shape arguments in ``static``/``attrs``)."""

    label: str
    op: str
    shapes: tuple[tuple[int, ...], ...]
    static: tuple = ()
    attrs: dict[str, Any] = field(default_factory=dict)
    dtype: str = "float32"
    source: str = "corpus"

    @property
    def plan(self) -> polyconv.ConvPlan:
        return polyconv.infer_shape(self.op, *self.shapes, *self.static,
                                    **self.attrs).with_(dtype=self.dtype)

    def arrays(self) -> list[np.ndarray]:
        return random_arrays(self.shapes, self.dtype)

    def run(self, *arrays, **options):
        return getattr(polyconv, self.op)(*arrays, *self.static, **self.attrs, **options)


def layer_calls(layer: Layer) -> list[Call]:
    """The layer's op and its two backward ops: the three primitives of its geometry."""
    out, attrs = layer.plan.shape, layer.attrs
    extra = {"dst_shape": layer.src} if layer.op == "convolution" else {}
    return [Call(layer.title, layer.op, (layer.src, layer.weights), (), attrs, layer.dtype),
            Call(layer.title, f"{layer.op}_backward_data", (out, layer.weights), (),
                 {**attrs, **extra}, layer.dtype),
            Call(layer.title, f"{layer.op}_backward_weights", (layer.src, out),
                 (layer.weights,), attrs, layer.dtype)]


def grid_calls(tests: Path | None = None) -> list[Call]:
    """The test matrix's grid (tests/test_matrix.py's GRID: each main op's pairwise covering),
    bias left out and float64 run as float32 (JAX's default has no float64)."""
    tests = tests or Path(__file__).resolve().parents[2] / "tests"
    if not (tests / "cases.py").exists():
        msg = f"the grid part reads tests/cases.py of a source checkout; not found in {tests}"
        raise FileNotFoundError(msg)
    sys.path.insert(0, str(tests))
    try:
        import cases
        from oracle import MAIN_OPS
    finally:
        sys.path.remove(str(tests))
    found = [c for i, fn in enumerate(MAIN_OPS) for c in cases.grid(fn, full=True, seed=11 + i)]
    return [Call(c.label, c.fn, tuple(c.shapes[:2]), tuple(c.positional), dict(c.attrs),
                 "float32" if c.dtype == "float64" else c.dtype, "grid") for c in found]


_CHOICE = re.compile(r"polyconv: (\S+) (forward|backward_data|backward_weights) .* -> (.+?) "
                     r"\((.*)\)$")


@contextmanager
def choices_logged():
    """The chooser's records under the ``polyconv`` logger while the block runs, as
    ``(backend, primitive, implementation, why)``."""
    seen: list[tuple[str, ...]] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            found = _CHOICE.match(record.getMessage())
            if found:
                seen.append(found.groups())

    logger, handler = logging.getLogger("polyconv"), Collect(logging.DEBUG)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        yield seen
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def lowering(plan: polyconv.ConvPlan, primitive: str, seen=()) -> tuple[str, str]:
    """The JAX lowering ``plan``'s ``primitive`` got, and why: the first record of the
    chooser's log (an outer choice is logged before a per-group lowering's inner ones), else
    the default pick (:func:`polyconv.default_implementation`: a call compiled before, whose
    choice was not logged again)."""
    for backend, prim, name, why in seen:
        if backend == "jax" and prim == primitive:
            return name, why
    return polyconv.default_implementation("jax", primitive, plan), "default (not logged)"



def _timed(fn, *args, **kwargs) -> float:
    """Seconds of one call of ``fn`` until its result is ready (JAX's calls return first)."""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    if "jax" in sys.modules:
        sys.modules["jax"].block_until_ready(out)
    return time.perf_counter() - t0


def _jax_model(layers: tuple[Layer, ...], side: str):
    """``(f, params, x)``: the model as a function of its weights and input on one side."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    ops, params = [], []
    for layer in layers:
        plan, dt = layer.plan, numpy_dtype(layer.dtype)
        if side == "polyconv":
            ops.append(Call(layer.title, layer.op, (), (), layer.attrs).run)
            w = rng.standard_normal(layer.weights, dtype=np.float32)
        else:
            ops.append(lax_function(plan, plan.primitive, user_weights=True))
            w = rng.standard_normal(plan.weights_shape, dtype=np.float32)
        params.append(jnp.asarray(w.astype(dt)))
    x = jnp.asarray(rng.standard_normal(layers[0].src, dtype=np.float32).astype(dt))
    chained = len(ops) > 1

    def f(params, x):
        for i, (op, w) in enumerate(zip(ops, params)):
            x = op(x, w)
            if chained:
                x = jnp.tanh(x) if i == len(ops) - 1 else jax.nn.relu(x)
        return x

    return f, params, x


def jax_child(model: str, side: str, warm: int) -> dict[str, Any]:
    """One model's first forward and first gradient on one side, then warm calls (median)."""
    t0 = time.perf_counter()
    import jax
    import jax.numpy as jnp

    imported = time.perf_counter() - t0
    layers = models(model)[model]
    f, params, x = _jax_model(layers, side)
    forward = jax.jit(f)
    grad = jax.jit(jax.value_and_grad(
        lambda p, x: jnp.sum(jnp.square(f(p, x).astype(jnp.float32)))))
    with choices_logged() as seen:
        first = {"forward_s": _timed(forward, params, x), "gradient_s": _timed(grad, params, x)}
    result = {"import_s": imported, **first, "first_s": sum(first.values()),
              **{f"warm_{name}_s": statistics.median(_timed(fn, params, x) for _ in range(warm))
                 for name, fn in (("forward", forward), ("gradient", grad))}}
    if side == "polyconv":
        result["lowerings"] = {
            layer.name: {p: lowering(layer.plan.with_(dtype=layer.dtype), p, seen)[0]
                         for p in PRIMITIVES} for layer in layers}
    return result


def numpy_child(model: str, warm: int) -> dict[str, Any]:
    """Each plan's first call, later calls (median) and resolution (median of
    :func:`polyconv.infer_shape`), after one unrelated call that starts the backend."""
    layers = models(model)[model]
    calls = ([Call(ly.title, ly.op, (ly.src, ly.weights), (), ly.attrs, ly.dtype)
              for ly in layers] if len(layers) > 1 else layer_calls(layers[0]))
    warmup = Call("warm-up", "convolution", ((1, 24, 24, 16), (3, 3, 16, 16)))
    warmup.run(*warmup.arrays(), backend="numpy")
    arrays = [c.arrays() for c in calls]
    rows = [{"op": c.op, "first_s": _timed(c.run, *a, backend="numpy")}
            for c, a in zip(calls, arrays)]
    for row, c, a in zip(rows, calls, arrays):
        row["later_s"] = statistics.median(_timed(c.run, *a, backend="numpy")
                                           for _ in range(warm))
        row["resolution_s"] = statistics.median(
            _timed(polyconv.infer_shape, c.op, *c.shapes, *c.static, **c.attrs)
            for _ in range(3))
        row["primitive"] = c.plan.primitive
    return {"calls": rows}


def child_environment(measuring: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in UNSET_VARIABLES}
    env.update(dict.fromkeys(AUTOTUNE_VARIABLES, "1" if measuring else "0"))
    return env


def in_fresh_process(job: dict[str, Any], measuring: bool) -> dict[str, Any]:
    """Run ``job`` (:func:`child_main`) in a new Python process; its JSON result."""
    done = subprocess.run([sys.executable, "-m", "polyconv.benchmarks.first_call", "--child",
                           json.dumps(job)], env=child_environment(measuring),
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def child_main(job: dict[str, Any]) -> int:
    print(json.dumps((jax_child if job.pop("kind") == "jax" else numpy_child)(**job)))
    return 0


def side_by_side(titles, warm: int, measuring: bool, log) -> list[dict[str, Any]]:
    """Each model's first forward plus first gradient under polyconv and under ``lax``, each
    side in its own fresh process."""
    rows = []
    for title in titles:
        row: dict[str, Any] = {"model": title}
        for side in ("polyconv", "lax"):
            log(f"  {title}: {side} in a fresh process\n")
            row[side] = in_fresh_process({"kind": "jax", "model": title, "side": side,
                                          "warm": warm}, measuring)
        if "first_s" in row["polyconv"] and "first_s" in row["lax"]:
            row["ratio"] = row["polyconv"]["first_s"] / row["lax"]["first_s"]
        rows.append(row)
    return rows


def numpy_first_calls(titles, warm: int, measuring: bool, log) -> list[dict[str, Any]]:
    """Each model's plans on the numpy backend, a fresh process per model: the generator's
    five forward calls, each corpus layer's three primitives."""
    rows = []
    for title in titles:
        log(f"  {title}: numpy in a fresh process\n")
        found = in_fresh_process({"kind": "numpy", "model": title, "warm": warm}, measuring)
        if "error" in found:
            rows.append({"model": title, **found})
            continue
        calls, keys = found["calls"], ("first_s", "later_s", "resolution_s")
        if title == GENERATOR:          # its five forward calls together, as a user meets them
            calls.append({"primitive": "5 forward calls",
                          **{k: sum(c[k] for c in calls) for k in keys}})
        rows += [{"model": title, **c, "ratio": c[keys[0]] / (c[keys[1]] + c[keys[2]])}
                 for c in calls]
    return rows


def _describe(plan: polyconv.ConvPlan) -> str:
    def x(t):
        return "x".join(map(str, t))
    return (f"a={x(plan.a_shape)} b={x(plan.b_shape)} k={x(plan.kernel)} s={x(plan.strides)} "
            f"d={x(plan.dilations)} p={x(plan.pads_begin)}/{x(plan.pads_end)} g={plan.groups} "
            f"{plan.data_format}/{plan.weights_format} {plan.dtype}")


def compare_plan(call: Call, lax_first: bool) -> dict[str, Any]:
    """One plan's first jitted call under polyconv and the plain ``lax`` call's, each after
    ``jax.clear_caches()``."""
    import jax
    import jax.numpy as jnp

    plan = call.plan
    sides = [("polyconv", jax.jit(call.run), [jnp.asarray(a) for a in call.arrays()]),
             ("lax", jax.jit(lax_function(plan, plan.primitive, user_weights=True)),
              lax_inputs(plan, plan.primitive, call.dtype, user_weights=True))]
    times, seen = {}, []
    for name, fn, args in (sides[::-1] if lax_first else sides):
        jax.clear_caches()
        with choices_logged() as records:
            times[name] = (_timed(fn, *args), _timed(fn, *args))  # compiled, then warm
        if name == "polyconv":
            seen = records
    name, why = lowering(plan, plan.primitive, seen)
    return {"source": call.source, "label": call.label, "op": call.op,
            "primitive": plan.primitive, "geometry": _describe(plan), "lowering": name,
            "why": why, **{f"{side}_{n}_s": t for side, ts in times.items()
                           for n, t in zip(("first", "second"), ts)},
            "ratio": times["polyconv"][0] / times["lax"][0]}


def compare_plans(calls: list[Call], deadline: float, log) -> tuple[list, list[str]]:
    """:func:`compare_plan` for every call until ``deadline`` (``time.perf_counter()``), the
    side that goes first alternating; the rows and the labels of the calls not run."""
    warm = Call("warm-up", "convolution", ((1, 9, 9, 4), (3, 3, 4, 4)))
    for c in layer_calls(Layer("warm-up", "warm-up", warm.op, *warm.shapes)):
        compare_plan(c, False)
    rows, not_run = [], []
    for i, call in enumerate(calls):
        if time.perf_counter() > deadline:
            not_run.append(f"{call.label} {call.op}")
            continue
        try:
            rows.append(compare_plan(call, bool(i % 2)))
        except Exception as exc:     # a geometry one side cannot compile: listed, not fatal
            rows.append({"source": call.source, "label": call.label, "op": call.op,
                         "error": f"{type(exc).__name__}: {exc}"[:300]})
        log(f"\r  plans: {i + 1}/{len(calls)}")
    log("\n")
    return rows, not_run



def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f}"


_SHORT = {"forward": "forward", "backward_data": "bwd data", "backward_weights": "bwd wts",
          "5 forward calls": "all 5"}


def _row(label: str, *cells: Any) -> str:
    return f"{label[:52]:52}" + "".join(
        f" {c:>9.2f}" if isinstance(c, float) else f" {c or '-':>9}" for c in cells)


def format_table(results: dict[str, Any], worst: int = 25) -> str:
    lines = [f"measuring {'on' if results['measuring'] else 'off'}; times in ms; targets: "
             "side by side and numpy ratios <= 1.5, plans <= 3"]
    if results["side_by_side"]:
        lines.append(_row("first forward + first value_and_grad", "polyconv", "lax", "ratio"))
        lines += [_row(r["model"], _ms(r["polyconv"].get("first_s")),
                       _ms(r["lax"].get("first_s")), r.get("ratio"))
                  for r in results["side_by_side"]]
    if results["numpy"]:
        lines.append(_row("numpy: first call of a plan", "primitive", "first", "later",
                          "resolve", "ratio"))
        lines += [_row(r["model"], _SHORT.get(r.get("primitive"), "-"), _ms(r.get("first_s")),
                       _ms(r.get("later_s")), _ms(r.get("resolution_s")), r.get("ratio"))
                  for r in results["numpy"]]
    plans = sorted((r for r in results["plans"] if "ratio" in r), key=lambda r: -r["ratio"])
    if plans:
        over = sum(r["ratio"] > TARGETS["plans"] for r in plans)
        lines.append(f"{len(plans)} plans, {over} over 3x; the worst by first-call ratio:")
        lines.append(f"{'plan':44} {'primitive':16} {'lowering':18} {'polyconv':>8} "
                     f"{'lax':>7} {'ratio':>6}")
        lines += [f"{r['label'][:44]:44} {r['primitive']:16} {r['lowering'][:18]:18} "
                  f"{_ms(r['polyconv_first_s']):>8} {_ms(r['lax_first_s']):>7} "
                  f"{r['ratio']:6.2f}" for r in plans[:worst]]
    errors = [r for r in results["side_by_side"] + results["numpy"] + results["plans"]
              if "error" in {**r, **r.get("polyconv", {}), **r.get("lax", {})}]
    return "\n".join(lines + [f"error: {json.dumps(r)[:300]}" for r in errors])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="polyconv bench --first-calls",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated, of {', '.join(PARTS)} (default: all)")
    parser.add_argument("--models", default="", help="the side-by-side and numpy parts' "
                        "models: substrings of the generator's or corpus layers' titles, "
                        "'|'-separated (default: the generator and five varied layers)")
    parser.add_argument("--layers", default="", help="the corpus part's layers, as in "
                        "'polyconv bench --corpus --layers' (default: every layer)")
    parser.add_argument("--grid-every", type=int, default=1, metavar="K",
                        help="every K-th plan of the test matrix's grid (default 1: all)")
    parser.add_argument("--warm", type=int, default=3, help="calls timed once warm")
    parser.add_argument("--measuring", action="store_true",
                        help="turn measuring on (default off, as polyconv's default)")
    parser.add_argument("--time-limit", type=float, metavar="SECONDS",
                        help="start no grid or corpus plan after this many seconds")
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser


def _plans(args, parts, log) -> tuple[list, list[str]]:
    calls = grid_calls()[::args.grid_every] if "grid" in parts else []
    if "corpus" in parts:
        wanted = [t.strip().lower() for t in args.layers.split("|") if t.strip()] or [""]
        issue = [ISSUE_LAYER] if any(t in ISSUE_LAYER.title.lower() for t in wanted) else []
        layers = matching_layers(args.layers) + issue
        calls += [replace(c, source="corpus") for ly in layers for c in layer_calls(ly)]
    limit = float("inf") if args.time_limit is None else args.time_limit
    return compare_plans(calls, time.perf_counter() + limit, log) if calls else ([], [])


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.child:
        return child_main(json.loads(args.child))
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if set(parts) - set(PARTS):
        parser.error(f"--parts: unknown {', '.join(sorted(set(parts) - set(PARTS)))}")
    titles = list(models(args.models))
    if not titles:
        parser.error(f"--models {args.models!r} matches no model")
    for name in UNSET_VARIABLES:       # this process's plans run as the children's do
        os.environ.pop(name, None)
    os.environ.update(child_environment(args.measuring))

    jax_titles = [t for t in titles if ("generator" in parts and t == GENERATOR)
                  or ("layers" in parts and t != GENERATOR)]
    results: dict[str, Any] = {"measuring": args.measuring, "targets": TARGETS,
                               "side_by_side": side_by_side(jax_titles, args.warm,
                                                            args.measuring, log),
                               "numpy": (numpy_first_calls(titles, args.warm, args.measuring,
                                                           log) if "numpy" in parts else [])}
    results["plans"], results["not_run"] = _plans(args, parts, log)
    results["worst"] = sorted((r for r in results["plans"] if r.get("ratio", 0)
                               > TARGETS["plans"]), key=lambda r: -r["ratio"])
    results["machine"] = machine()
    write_record(args.json, results)
    print(format_table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
