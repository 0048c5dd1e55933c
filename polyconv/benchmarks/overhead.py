"""What polyconv adds around one call: its time beside each framework's own call.

At tiny sizes (the device work about nothing, so the time is the host's) and on a few
layers of the real-model corpus, forward and gradient: PyTorch (a hand-written
``torch.nn.functional`` call, and ``torch.autograd.grad`` of it, against the same through
polyconv), JAX (a jitted ``lax`` call against a jitted polyconv call, and against an eager
one) and numpy (polyconv's time alone: numpy has no convolution of its own). Each pair is
timed side by side, interleaved, best of several rounds; each row gives both times and their
ratio.

``polyconv bench --overhead`` runs one thread and all threads, each in a fresh process (the
libraries read their thread counts when they start), and writes the record with ``--out``
(``docs/records/overhead-<kind>.json``). ``--device cuda`` times PyTorch tensors on the GPU
(JAX runs on its default device in every mode).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.util import find_spec
from typing import Any

import numpy as np

import polyconv

from .harness import THREADS_ENV, pin, random_arrays, thread_environment, time_calls
from .peers import lax_function


@dataclass(frozen=True)
class Case:
    """One layer: a polyconv op, its inputs' shapes, attributes and where it comes from."""

    name: str
    op: str
    src: tuple[int, ...]
    weights: tuple[int, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    tiny: bool = False
    source: str = ""

    @property
    def plan(self) -> polyconv.ConvPlan:
        return polyconv.infer_shape(self.op, self.src, self.weights, **self.attrs)


CASES = (
    Case("tiny ConvTranspose 1x4x4x4 k3 s2 p1 NCX", "conv_transpose", (1, 4, 4, 4),
         (4, 4, 3, 3), dict(strides=2, pads_begin=1, pads_end=1, data_format="NCX",
                            weights_format="IOX"), tiny=True),
    Case("tiny Convolution 1x8x8x4 k3 p1 NXC", "convolution", (1, 8, 8, 4), (3, 3, 4, 4),
         dict(pads_begin=1, pads_end=1), tiny=True),
    Case("tiny Conv1d 1x4x16 k3 s2 p1 NCX", "convolution", (1, 4, 16), (4, 4, 3),
         dict(strides=2, pads_begin=1, pads_end=1, data_format="NCX", weights_format="OIX"),
         tiny=True),
    Case("DCGAN G: ConvT 512->256 k4 s2 4x4", "conv_transpose", (16, 4, 4, 512),
         (4, 4, 256, 512), dict(strides=2, pads_begin=1, pads_end=1, weights_format="XOI"),
         source="https://github.com/pytorch/examples/blob/main/dcgan/main.py"),
    Case("HiFi-GAN: ConvT1d 512->256 k16 s8 NCX", "conv_transpose", (4, 512, 32),
         (512, 256, 16), dict(strides=8, pads_begin=4, pads_end=4, data_format="NCX",
                              weights_format="IOX"),
         source="https://github.com/jik876/hifi-gan/blob/master/models.py"),
    Case("MobileNetV2: depthwise 144 k3 s1 28x28", "convolution", (8, 28, 28, 144),
         (3, 3, 1, 144), dict(pads_begin=1, pads_end=1, groups=144),
         source="https://github.com/pytorch/vision/blob/main/torchvision/models/"
                "mobilenetv2.py (a 56x56 block's layer at half the size)"),
)


# --------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------

def _calls_for(fn: Callable[[], Any], sync: Callable[[Any], Any], budget: float) -> int:
    """How many calls of ``fn`` take about ``budget`` seconds (at least 3)."""
    sync(fn())
    t = time.perf_counter()
    sync(fn())
    once = max(time.perf_counter() - t, 1e-7)
    return max(3, min(20000, int(budget / once)))


class _Waited:
    """``fn`` as the harness times it: a call waited for, or ``n`` calls issued back to back
    and the last waited for (:func:`~polyconv.benchmarks.harness.timed_call`'s queued calls:
    what an eager JAX or CUDA call costs the host)."""

    def __init__(self, fn: Callable[[], Any], sync: Callable[[Any], Any]) -> None:
        self.fn, self.sync = fn, sync

    def __call__(self) -> Any:
        return self.sync(self.fn())

    def queued(self, n: int) -> None:
        for _ in range(n):
            out = self.fn()
        self.sync(out)


def side_by_side(fns: dict[str, Callable[[], Any]], sync: Callable[[Any], Any],
                 rounds: int, budget: float) -> dict[str, float]:
    """Microseconds a call of each function, timed interleaved by the harness
    (:func:`~polyconv.benchmarks.harness.time_calls`): ``rounds`` rounds of about ``budget``
    seconds of calls a function, the best round of each. On a shared machine other work only
    ever adds time."""
    n = min(_calls_for(fn, sync, budget) for fn in fns.values())
    times = time_calls({name: _Waited(fn, sync) for name, fn in fns.items()}, rounds, 1,
                       lambda _: None, "overhead", queued=n)
    return {name: min(ts) * 1e6 for name, ts in times.items()}


def _row(case: Case, framework: str, what: str, times: dict[str, float],
         reference: str | None, note: str = "") -> dict[str, Any]:
    row = {"case": case.name, "tiny": case.tiny, "framework": framework, "what": what,
           "polyconv_us": round(times["polyconv"], 2)}
    if reference is not None:
        row[f"{reference}_us"] = round(times[reference], 2)
        row["reference"] = reference
        row["ratio"] = round(times["polyconv"] / times[reference], 3)
    if note:
        row["note"] = note
    return row


# --------------------------------------------------------------------------------------------
# the frameworks
# --------------------------------------------------------------------------------------------

def _torch_call(case: Case):
    """The hand-written torch call of ``case`` on torch's layouts (``NCX`` data, NXC as a
    channels-last tensor, weights ``[Cb, Ca/G, K..]``): ``(x, w) -> y``."""
    import torch.nn.functional as F

    plan = case.plan
    d = plan.ndim
    transposed = plan.primitive == "backward_data"
    fn = {(1, False): F.conv1d, (2, False): F.conv2d, (3, False): F.conv3d,
          (1, True): F.conv_transpose1d, (2, True): F.conv_transpose2d,
          (3, True): F.conv_transpose3d}[(d, transposed)]
    if plan.pads_begin != plan.pads_end:
        msg = f"{case.name}: the torch reference takes symmetric pads only"
        raise ValueError(msg)
    kwargs = dict(stride=plan.strides, padding=plan.pads_begin, dilation=plan.dilations,
                  groups=plan.groups)
    if transposed:
        kwargs["output_padding"] = plan.output_padding

    def call(x, w):
        return fn(x, w, None, **kwargs)

    return call


def bench_torch(case: Case, device: str, rounds: int, budget: float) -> list[dict[str, Any]]:
    import torch

    if os.environ.get(THREADS_ENV):
        torch.set_num_threads(int(os.environ[THREADS_ENV]))
    polyconv.get_backend("torch")
    x_np, w_np = random_arrays((case.src, case.weights), "float32")
    plan = case.plan
    x = torch.from_numpy(x_np).to(device)
    w = torch.from_numpy(w_np).to(device)
    # the hand-written call on the same memory polyconv computes on: NCX views (NXC data is
    # channels-last memory), the weights viewed as torch's [Cb, Ca/G, K..]
    to_ncx = (0, plan.ndim + 1, *range(1, plan.ndim + 1)) if plan.channels_last else None
    x_t = x if to_ncx is None else x.permute(to_ncx)
    w_t = w.permute(plan.weights_perm)
    ref = _torch_call(case)
    attrs = case.attrs
    op = getattr(polyconv, case.op)
    sync = ((lambda _: torch.cuda.synchronize()) if device.startswith("cuda")
            else (lambda _: None))
    rows = []
    times = side_by_side({"torch": lambda: ref(x_t, w_t),
                          "polyconv": lambda: op(x, w, **attrs)}, sync, rounds, budget)
    rows.append(_row(case, f"torch {device}", "forward", times, "torch"))
    xg, wg = x.clone().requires_grad_(True), w.clone().requires_grad_(True)

    def torch_grad():
        y = ref(xg if to_ncx is None else xg.permute(to_ncx), wg.permute(plan.weights_perm))
        return torch.autograd.grad(y, (xg, wg), torch.ones_like(y))

    def polyconv_grad():
        y = op(xg, wg, **attrs)
        return torch.autograd.grad(y, (xg, wg), torch.ones_like(y))

    times = side_by_side({"torch": torch_grad, "polyconv": polyconv_grad}, sync, rounds,
                         budget)
    rows.append(_row(case, f"torch {device}", "forward + grad of input and weights", times,
                     "torch"))
    return rows


def bench_jax(case: Case, rounds: int, budget: float) -> list[dict[str, Any]]:
    import jax
    import jax.numpy as jnp

    x_np, w_np = random_arrays((case.src, case.weights), "float32")
    x, w = jnp.asarray(x_np), jnp.asarray(w_np)
    attrs = case.attrs
    op = getattr(polyconv, case.op)
    ref = lax_function(case.plan, case.plan.primitive, user_weights=True)
    lowering = polyconv.default_implementation("jax", case.plan.primitive,
                                               case.plan.with_(dtype="float32"))
    note = f"polyconv's lowering: {lowering}" + (" (plain)" if lowering == "direct" else "")
    lax_jit = jax.jit(ref)
    poly_jit = jax.jit(lambda x, w: op(x, w, **attrs))
    if not np.allclose(np.asarray(lax_jit(x, w)), np.asarray(poly_jit(x, w)), rtol=1e-4,
                       atol=1e-3):
        msg = f"{case.name}: the lax reference does not compute polyconv's op"
        raise AssertionError(msg)
    sync = jax.block_until_ready
    rows = []
    times = side_by_side({"lax_jit": lambda: lax_jit(x, w),
                          "polyconv": lambda: poly_jit(x, w)}, sync, rounds, budget)
    rows.append(_row(case, "jax", "forward, jitted", times, "lax_jit", note))
    times = side_by_side({"lax_jit": lambda: lax_jit(x, w),
                          "polyconv": lambda: op(x, w, **attrs)}, sync, rounds, budget)
    rows.append(_row(case, "jax", "forward, eager polyconv call", times, "lax_jit", note))
    g = jnp.ones_like(lax_jit(x, w))
    lax_grad = jax.jit(jax.grad(lambda x, w: jnp.vdot(ref(x, w), g), argnums=(0, 1)))
    poly_grad = jax.jit(jax.grad(lambda x, w: jnp.vdot(op(x, w, **attrs), g),
                                 argnums=(0, 1)))
    times = side_by_side({"lax_jit": lambda: lax_grad(x, w),
                          "polyconv": lambda: poly_grad(x, w)}, sync, rounds, budget)
    rows.append(_row(case, "jax", "grad of input and weights, jitted", times, "lax_jit"))
    return rows


def bench_numpy(case: Case, rounds: int, budget: float) -> list[dict[str, Any]]:
    x, w = random_arrays((case.src, case.weights), "float32")
    attrs = case.attrs
    op = getattr(polyconv, case.op)
    y = op(x, w, **attrs)
    g = np.ones_like(y)
    grads = {"convolution": (polyconv.convolution_backward_data,
                             polyconv.convolution_backward_weights),
             "conv_transpose": (polyconv.conv_transpose_backward_data,
                                polyconv.conv_transpose_backward_weights)}[case.op]
    data_attrs = dict(attrs)
    shape_arg = (x.shape,) if case.op == "convolution" else ()

    def gradient():
        return (grads[0](g, w, *shape_arg, **data_attrs),
                grads[1](x, g, w.shape, **attrs))

    times = side_by_side({"polyconv": lambda: op(x, w, **attrs)}, lambda _: None, rounds,
                         budget)
    rows = [_row(case, "numpy", "forward", times, None)]
    times = side_by_side({"polyconv": gradient}, lambda _: None, rounds, budget)
    rows.append(_row(case, "numpy", "grad of input and weights (the two backward ops)",
                     times, None))
    return rows


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------

def run(frameworks: list[str], device: str, rounds: int, budget: float,
        tiny_only: bool) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for case in CASES:
        if tiny_only and not case.tiny:
            continue
        if "torch" in frameworks:
            rows += bench_torch(case, device, rounds, budget)
        if "jax" in frameworks:
            rows += bench_jax(case, rounds, budget)
        if "numpy" in frameworks and device == "cpu":
            rows += bench_numpy(case, rounds, budget)
        print(f"  {case.name}: done", file=sys.stderr, flush=True)
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = []
    for r in rows:
        ref = r.get("reference")
        refs = f"{r[ref + '_us']:>9.1f} {ref:<8}" if ref else f"{'':>9} {'':<8}"
        ratio = f"{r['ratio']:5.2f}x" if ref else "      "
        lines.append(f"{r['case'][:42]:<42} {r['framework']:<9} {r['what'][:36]:<36} "
                     f"{refs} {r['polyconv_us']:>9.1f} {ratio} {r.get('note', '')}")
    return "\n".join(lines)


def _worker(args: argparse.Namespace) -> int:
    from .harness import machine

    if args.threads:
        pin(args.threads)
    frameworks = [f for f in args.frameworks.split(",") if f]
    available = [f for f in frameworks if f == "numpy" or find_spec(f) is not None]
    rows = run(available, args.device, args.rounds, args.budget, args.tiny)
    json.dump({"machine": machine(), "threads": args.threads or "all", "device": args.device,
               "rows": rows}, sys.stdout)
    return 0


def _in_fresh_process(threads: int, argv: list[str]) -> dict[str, Any]:
    """The worker's record, run with every library on ``threads`` threads (0: all)."""
    env = thread_environment(threads)
    out = subprocess.run([sys.executable, "-m", "polyconv.benchmarks.overhead", "--worker",
                          "--threads", str(threads), *argv], env=env, check=True,
                         stdout=subprocess.PIPE, text=True)
    return json.loads(out.stdout)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="polyconv bench --overhead",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--threads", default="1,0", help="thread counts to run, 0 = all "
                        "(default: 1,0)")
    parser.add_argument("--frameworks", default="torch,jax,numpy")
    parser.add_argument("--device", default="cpu", help="torch's device: cpu or cuda")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--budget", type=float, default=0.02,
                        help="seconds of calls per round and function")
    parser.add_argument("--tiny", action="store_true", help="the tiny cases only")
    parser.add_argument("--json", "--out", dest="out",
                        help="write the record here (JSON), as the other benchmarks' --json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.worker:
        args.threads = int(args.threads)
        return _worker(args)
    passed = _without_values(argv, ("--json", "--out", "--threads"))
    runs = []
    for threads in (int(t) for t in args.threads.split(",") if t.strip()):
        record = _in_fresh_process(threads, passed)
        runs.append(record)
        print(f"threads: {record['threads']}, device: {record['device']}")
        print(format_rows(record["rows"]))
    if args.out:
        result = {"date": time.strftime("%Y-%m-%d"), "what": __doc__.split("\n")[0],
                  "runs": runs}
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


def _without_values(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """``argv`` without ``options`` and their values (``--out F`` or ``--out=F``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif not a.startswith(tuple(o + "=" for o in options)):
            out.append(a)
    return out


if __name__ == "__main__":
    sys.exit(main())
