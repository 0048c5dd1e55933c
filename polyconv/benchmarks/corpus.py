"""Layers of real public models, timed forward and gradient against PyTorch and plain ``lax``.

Each layer is one convolution of a published model definition (the source is named with it),
at a batch small enough for a 2-core CPU. Every layer is timed, in one process and
interleaved round by round, as:

- ``forward``: the op itself;
- ``gradient``: the cotangents of the input and the weights for a given output cotangent
  (``jax.vjp``; for PyTorch ``aten.convolution_backward``, its autograd kernel);
- ``backward ops`` (polyconv only): polyconv's own two backward ops for the same layer in one
  jitted call, the cost the gradient should match.

Competitors: ``polyconv-jax`` (jitted), ``lax`` (the hand-written ``conv_general_dilated``
call in the layer's layout, lhs-dilated for the transposed layers, as ``lax.conv_transpose``
and Flax emit it, and ``jax.vjp`` of it), ``torch`` (``torch.nn.functional`` in its fastest
CPU configuration: channels-last memory format, whatever the layer's layout), and
``polyconv-numpy`` (forward, and the two backward ops for the gradient).

Run with ``polyconv bench --corpus`` (or ``python -m polyconv.benchmarks.corpus``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np

import polyconv
from polyconv._compare import numpy_dtype

from .corpus_layers import LAYERS, Layer
from .corpus_report import format_table
from .jax_vs_lax import compiled_instructions
from .suite import (
    _THREADS_ENV,
    _lead_in,
    _pin,
    _rerun_with_threads,
    machine,
    select_competitors,
    torch_dtype,
    torch_tensor,
)

MODES = ("forward", "gradient")
#: a competitor whose warm-up call takes longer than this is timed in SLOW_REPEATS rounds
#: only, without lead-in calls (its time is not in doubt, and it would hold the run up)
SLOW_CALL_S = 1.0
SLOW_REPEATS = 3


# --------------------------------------------------------------------------------------------
# competitors: each returns a zero-argument callable that runs (and waits for) one call
# --------------------------------------------------------------------------------------------

def _inputs(layer: Layer, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """src, weights and an output cotangent, float32 values rounded to the layer's dtype."""
    rng = np.random.default_rng(seed)
    dt = numpy_dtype(layer.dtype)
    arrays = [rng.standard_normal(s, dtype=np.float32).astype(dt)
              for s in (layer.src, layer.weights, layer.plan.shape)]
    return arrays[0], arrays[1], arrays[2]


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
        """What XLA compiled for it (:func:`~polyconv.benchmarks.jax_vs_lax.
        compiled_instructions`)."""
        return compiled_instructions(self.fn, self.args)


def same_programs(fns: dict[str, Any]) -> list[list[str]]:
    """The competitors that run one and the same compiled program (groups of two or more):
    between them the ratio is 1 by construction, whatever their timings say."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, fn in fns.items():
        if isinstance(fn, Jitted):
            groups.setdefault(tuple(fn.program()), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def _backward_ops(layer: Layer):
    """polyconv's two backward ops of the layer's op: (data op, weights op)."""
    if layer.op == "conv_transpose":
        return polyconv.conv_transpose_backward_data, polyconv.conv_transpose_backward_weights
    return polyconv.convolution_backward_data, polyconv.convolution_backward_weights


def _polyconv_jax(layer: Layer, mode: str, arrays):
    import jax
    import jax.numpy as jnp

    x, w, g = (jnp.asarray(a) for a in arrays)
    op = partial(getattr(polyconv, layer.op), **layer.attrs)
    if mode == "forward":
        return Jitted(jax.jit(op), (x, w))
    if mode == "gradient":
        fn = jax.jit(lambda x, w, g: jax.vjp(op, x, w)[1](g))
    else:  # the backward ops
        data_op, weights_op = _backward_ops(layer)
        extra = {"dst_shape": layer.src} if layer.op == "convolution" else {}
        fn = jax.jit(lambda x, w, g: (data_op(g, w, **extra, **layer.attrs),
                                      weights_op(x, g, w.shape, **layer.attrs)))
    return Jitted(fn, (x, w, g))


def polyconv_eager(layer: Layer, mode: str, arrays, backend: str | None = "numpy"):
    """An eager backend's call on ``arrays`` (the forward op, else the two backward ops);
    ``backend=None`` lets polyconv pick it from the arrays."""
    x, w, g = arrays
    if mode == "forward":
        op = getattr(polyconv, layer.op)
        return lambda: op(x, w, backend=backend, **layer.attrs)
    data_op, weights_op = _backward_ops(layer)
    extra = {"dst_shape": layer.src} if layer.op == "convolution" else {}

    def both():
        return (data_op(g, w, backend=backend, **extra, **layer.attrs),
                weights_op(x, g, w.shape, backend=backend, **layer.attrs))

    return both


def _torch(layer: Layer, mode: str, arrays, device: str = "cpu", memory: str = "channels_last",
           tf32: bool = False):
    """``torch.nn.functional`` on ``device`` with data in ``memory`` format (channels-last:
    PyTorch CPU's fastest; on CUDA cuDNN's benchmark mode picks the algorithm, and TF32 is
    off unless ``tf32``, so the arithmetic is the full float32 of polyconv's default)."""
    import torch
    import torch.nn.functional as F

    p = layer.plan
    d = p.ndim
    tdt = torch_dtype(layer)
    memfmt = ({2: torch.channels_last, 3: torch.channels_last_3d}.get(d)
              if memory == "channels_last" else None)

    def tensor(a):
        t = torch_tensor(a, tdt).to(device)
        return t.contiguous(memory_format=memfmt) if memfmt else t

    def data(a):      # the layer's layout -> logical NCX
        a = np.asarray(a, np.float32)
        return tensor(np.moveaxis(a, -1, 1) if p.channels_last else a)

    x, w, g = arrays
    # torch's weights are canonical: [IC, OC/G, K..] for ConvTranspose, [OC, IC/G, K..] for Conv
    wt = tensor(np.transpose(np.asarray(w, np.float32), p.weights_perm))
    transposed = layer.op == "conv_transpose"
    xt, gt = data(x), data(g)
    pad = list(p.pads_begin)
    opad = list(p.output_padding) if transposed else [0] * d
    if mode == "forward":
        if transposed:
            f = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[d]
            kw = dict(stride=p.strides, padding=pad, output_padding=opad, groups=p.groups,
                      dilation=p.dilations)
        else:
            f = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[d]
            kw = dict(stride=p.strides, padding=pad, dilation=p.dilations, groups=p.groups)
        call = partial(f, xt, wt, **kw)
    else:
        call = partial(torch.ops.aten.convolution_backward, gt, xt, wt, None, p.strides, pad,
                       p.dilations, transposed, opad, p.groups, (True, True, False))
    return call if device == "cpu" else on_cuda(call, tf32)


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


def timed_call(fn: Callable[[], Any], queued: int = 1) -> float:
    """Seconds per call of ``fn``: one call waited for, or with ``queued`` > 1 that many
    issued back to back and waited for once (where ``fn`` can queue: a jitted JAX call, a
    CUDA call; a synchronous one is simply called that many times). On a GPU one blocked call
    of 0.05-0.3 ms is mostly the host's dispatch and wait; queued calls time the device's
    work in a stream, as in a training step and as the JAX backend's measurement does."""
    t0 = time.perf_counter()
    if queued > 1 and hasattr(fn, "queued"):
        fn.queued(queued)
    else:
        for _ in range(queued):
            fn()
    return (time.perf_counter() - t0) / queued


def _lax(layer: Layer, mode: str, arrays):
    """The hand-written ``lax.conv_general_dilated`` call (weights prepared outside)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    p = layer.plan
    d = p.ndim
    sp = "DHW"[-d:] if d <= 3 else "".join(str(i) for i in range(d))
    data = f"N{sp}C" if p.channels_last else f"NC{sp}"
    hi = lax.Precision.HIGHEST
    x, w, g = arrays
    wc = np.transpose(np.asarray(w, np.float32), p.weights_perm)     # [Cb, Ca/G, K..]
    if layer.op == "conv_transpose":
        # the transposed convolution: b dilated by s, kernel flipped, in/out swapped with the
        # group factor moved from Cb to Ca: [Ca, Cb/G, K..] ("OI" + spatial)
        G = p.groups
        wl = wc.reshape(G, p.b_channels // G, p.a_channels // G, *p.kernel)
        wl = np.swapaxes(wl, 1, 2).reshape(p.a_channels, p.b_channels // G, *p.kernel)
        wl = np.flip(wl, tuple(range(2, 2 + d)))
        pads = [(ek - 1 - b, ek - 1 - e + o) for ek, b, e, o in
                zip(p.effective_kernel, p.pads_begin, p.pads_end, p.output_padding)]
        dn = (data, f"OI{sp}", data)

        def f(x, w):
            return lax.conv_general_dilated(
                x, w, (1,) * d, pads, lhs_dilation=p.strides, rhs_dilation=p.dilations,
                dimension_numbers=dn, feature_group_count=G, precision=hi,
                preferred_element_type=jnp.float32).astype(x.dtype)
    else:
        wl = wc
        dn = (data, f"OI{sp}", data)
        pads = list(zip(p.pads_begin, p.pads_end))

        def f(x, w):
            return lax.conv_general_dilated(
                x, w, p.strides, pads, rhs_dilation=p.dilations, dimension_numbers=dn,
                feature_group_count=p.groups, precision=hi,
                preferred_element_type=jnp.float32).astype(x.dtype)

    dt = numpy_dtype(layer.dtype)
    xj, wj, gj = (jnp.asarray(np.ascontiguousarray(a).astype(dt)) for a in (x, wl, g))
    if mode == "forward":
        return Jitted(jax.jit(f), (xj, wj))
    return Jitted(jax.jit(lambda x, w, g: jax.vjp(f, x, w)[1](g)), (xj, wj, gj))


@dataclass(frozen=True)
class Autotuned:
    """A competitor's call with measuring on (:func:`polyconv.autotune`): each plan's first
    call (a JAX op's first trace) times its candidates and keeps the fastest, against which
    the default pick's warm speed is checked in the same run."""

    inner: Callable[[], Any]

    def __call__(self) -> Any:
        with polyconv.autotune():
            return self.inner()

    def queued(self, calls: int) -> Any:
        with polyconv.autotune():
            return timed_call(self.inner, calls)


def _autotuned(make: Callable[..., Any]) -> Callable[..., Any]:
    return lambda layer, mode, arrays: Autotuned(make(layer, mode, arrays))


@dataclass(frozen=True)
class Competitor:
    name: str
    requires: str | None
    make: Callable[[Layer, str, Any], Callable[[], Any] | None]
    mode: str | None = None        # the timed mode it stands for, if not the row's own


COMPETITORS: tuple[Competitor, ...] = (
    Competitor("polyconv-jax", "jax", _polyconv_jax),
    Competitor("polyconv-jax backward ops", "jax", _polyconv_jax, mode="backward_ops"),
    Competitor("lax", "jax", _lax),
    Competitor("torch", "torch", _torch),
    Competitor("polyconv-numpy", None, polyconv_eager),
    Competitor("polyconv-jax autotuned", "jax", _autotuned(_polyconv_jax)),
    Competitor("polyconv-numpy autotuned", None, _autotuned(polyconv_eager)),
)


def run_layer(layer: Layer, mode: str, competitors, repeats: int, warmup: int,
              log, queued: int = 1) -> dict[str, Any]:
    arrays = _inputs(layer)
    fns: dict[str, Callable[[], Any]] = {}
    skipped: dict[str, str] = {}
    for comp in competitors:
        if comp.mode and mode != "gradient":
            continue
        if comp.requires and find_spec(comp.requires) is None:
            skipped[comp.name] = f"{comp.requires} not installed"
            continue
        try:
            fn = comp.make(layer, comp.mode or mode, arrays)
        except Exception as exc:  # a peer that cannot express the layer
            skipped[comp.name] = f"{type(exc).__name__}: {exc}"
            continue
        fns[comp.name] = fn
    slow = set()        # a competitor taking seconds per call (lax's 3-D lhs-dilated path)
    for _ in range(warmup):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if time.perf_counter() - t0 > SLOW_CALL_S:
                slow.add(name)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(repeats):
        order = [(n, f) for n, f in fns.items() if n not in slow or r < SLOW_REPEATS]
        if r % 2:
            order.reverse()
        for name, fn in order:
            if name not in slow:
                _lead_in(fn, 1)     # see polyconv.benchmarks.suite._lead_in
            times[name].append(timed_call(fn, 1 if name in slow else queued))
        log(f"\r  {layer.title} {mode}: round {r + 1}/{repeats}")
    log("\n")
    return {"layer": layer.title, "model": layer.model, "source": layer.source,
            "mode": mode, "dtype": layer.dtype, "gflop": layer.flops / 1e9,
            "median_s": {n: statistics.median(ts) for n, ts in times.items()},
            "same_program": same_programs(fns), "skipped": skipped}


def _chosen(layer: Layer) -> tuple[str, dict[str, dict[str, float]]]:
    """What the measuring competitors chose for the layer's plan (F, D, W per backend), and
    each candidate's measured seconds, by backend and primitive."""
    from polyconv._choice import _CHOOSERS

    plan = layer.plan.with_(dtype=layer.dtype)
    letters = {"forward": "F", "backward_data": "D", "backward_weights": "W"}
    text, times = [], {}
    for backend, chooser in sorted(_CHOOSERS.items()):
        chosen, measured = chooser.chosen(), chooser.measured()
        for primitive, letter in letters.items():
            tail = f"|{primitive}|{plan.with_(primitive=primitive).key}"
            for key in (k for k in chosen if tail in k):
                text.append(f"{backend} {letter}:{chosen[key]}")
            for key in (k for k in measured if tail in k):
                times.setdefault(backend, {})[primitive] = {
                    name: (t if math.isfinite(t) else None)
                    for name, t in measured[key].items()}
    return " ".join(text), times


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="polyconv bench --corpus",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--layers", default="",
                        help="substring filter on layer titles (several: separated by '|')")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--competitors", default="",
                        help="comma-separated competitor names (default: all)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu",
                        help="gpu: JAX, PyTorch and CuPy on the first CUDA device (JAX on its "
                             "default device), PyTorch in both memory formats and with TF32")
    parser.add_argument("--batch-scale", type=int, default=1,
                        help="multiply every layer's batch (GPU training batches are larger)")
    parser.add_argument("--queued", type=int, default=1, metavar="N",
                        help="time N calls issued back to back and waited for once, per call "
                             "(on a GPU: the device's time in a stream rather than one "
                             "blocked call's dispatch and wait)")
    parser.add_argument("--time-limit", type=float, metavar="SECONDS",
                        help="start no row after this many seconds (the rows left are listed "
                             "as not run); with --json the file is written after every row")
    return parser


def matching_layers(titles: str, batch_scale: int = 1) -> list[Layer]:
    """The corpus's layers whose titles contain ``titles`` or, separated by ``|``, one of its
    parts (case aside; every layer for an empty text), in the corpus's order, each batch
    multiplied by ``batch_scale``."""
    wanted = [part.strip().lower() for part in titles.split("|") if part.strip()] or [""]
    return [replace(ly, src=(ly.src[0] * batch_scale, *ly.src[1:])) for ly in LAYERS
            if any(part in ly.title.lower() for part in wanted)]


def _record(args: argparse.Namespace, rows: list[dict[str, Any]],
            not_run: list[str]) -> dict[str, Any]:
    """The run so far (written to ``--json``, if given): its rows, the machine as it is
    now (what they ran under) and the rows ``--time-limit`` left out."""
    results = {"machine": machine(), "layers": rows}
    if args.device == "gpu":
        from .corpus_gpu import gpu_machine
        results["machine"].update(gpu_machine(), batch_scale=args.batch_scale)
    if args.queued > 1:
        results["machine"]["queued_calls"] = args.queued
    if not_run:
        results["not_run"] = not_run
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.queued < 1:
        parser.error(f"--queued {args.queued}: expected at least 1 call per timing")
    layers = matching_layers(args.layers, args.batch_scale)
    if not layers:
        parser.error(f"--layers {args.layers!r} matches no layer")
    modes = [m for m in args.modes.split(",") if m]
    if args.device == "gpu":
        from .corpus_gpu import GPU_COMPETITORS
        comps = select_competitors(parser, args.competitors, GPU_COMPETITORS)
    else:
        comps = select_competitors(parser, args.competitors, COMPETITORS)
    if args.threads is not None:
        if os.environ.get(_THREADS_ENV) != str(args.threads):
            return _rerun_with_threads(args.threads, ["--corpus", *(
                sys.argv[1:] if argv is None else argv)])
        _pin(args.threads)

    def log(msg: str) -> None:
        sys.stderr.write(msg)
        sys.stderr.flush()

    start, rows, not_run = time.perf_counter(), [], []
    for layer in layers:
        for mode in modes:
            if args.time_limit is not None and time.perf_counter() - start > args.time_limit:
                not_run.append(f"{layer.title} {mode}")
                continue
            row = run_layer(layer, mode, comps, args.repeats, args.warmup, log, args.queued)
            row["lowering"], row["lowering_s"] = _chosen(layer)
            rows.append(row)
            _record(args, rows, not_run)
    results = _record(args, rows, not_run)
    print(format_table(results))
    if not_run:
        print(f"not run (--time-limit {args.time_limit:g} s): " + "; ".join(not_run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
