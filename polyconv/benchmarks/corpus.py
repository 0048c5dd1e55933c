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

With ``--device gpu`` (a CUDA GPU), every call is timed until its results are ready, and the
competitors are ``polyconv-jax``, its backward ops and ``lax`` on JAX's default device;
``torch`` and ``torch NCX`` (channels-last and contiguous memory, cuDNN's benchmark mode on,
TF32 off: the full float32 of polyconv's default; ratios take the faster), ``torch tf32``
(PyTorch's own default for cuDNN convolutions: not the same arithmetic), ``polyconv-torch``
(the PyTorch backend on CUDA tensors; the gradient row times its autograd backward pass
alone, as ``torch`` times its own) and ``polyconv-cupy`` (the array-API backend on CuPy).

Run with ``polyconv bench --corpus``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

import polyconv

from . import peers, report
from .corpus_layers import LAYERS, Layer
from .harness import (
    Competitor,
    Jitted,
    Waited,
    gpu_machine,
    log,
    machine,
    make_calls,
    medians,
    on_cuda,
    random_arrays,
    same_programs,
    select_competitors,
    threaded,
    time_calls,
    timed_call,
    torch_dtype,
    torch_tensor,
    write_record,
)

MODES = ("forward", "gradient")


# --------------------------------------------------------------------------------------------
# competitors: each returns a zero-argument callable that runs (and waits for) one call
# --------------------------------------------------------------------------------------------

def _inputs(layer: Layer) -> list[np.ndarray]:
    """src, weights and an output cotangent, float32 values rounded to the layer's dtype."""
    return random_arrays((layer.src, layer.weights, layer.plan.shape), layer.dtype)


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


def _polyconv_torch_cuda(layer: Layer, mode: str, arrays):
    """polyconv's PyTorch backend on CUDA tensors in the layer's own layout; the gradient: the
    autograd backward pass alone, as the peers time theirs (the graph built once, outside)."""
    tdt = torch_dtype(layer.dtype)
    x, w, g = (torch_tensor(np.asarray(a, np.float32), tdt).to("cuda") for a in arrays)
    op = partial(getattr(polyconv, layer.op), **layer.attrs)
    if mode == "forward":
        return on_cuda(lambda: op(x, w))
    import torch

    x.requires_grad_(True)
    w.requires_grad_(True)
    y = op(x, w)
    return on_cuda(lambda: torch.autograd.grad(y, (x, w), g, retain_graph=True))


def _polyconv_cupy(layer: Layer, mode: str, arrays):
    import cupy

    if layer.dtype not in ("float32", "float16", "float64"):
        raise TypeError(f"CuPy has no {layer.dtype}")
    call = polyconv_eager(layer, mode, [cupy.asarray(a) for a in arrays], backend=None)
    return Waited(call, cupy.cuda.Device().synchronize)


def _torch(**options):
    return lambda layer, mode, arrays: peers.torch(layer.plan, mode, arrays, layer.dtype,
                                                   **options)


def _lax(layer: Layer, mode: str, arrays):
    return peers.lax(layer.plan, mode, arrays, layer.dtype)


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
            return timed_call(self.inner, calls, queued=True)


def _autotuned(make: Callable[..., Any]) -> Callable[..., Any]:
    return lambda layer, mode, arrays: Autotuned(make(layer, mode, arrays))


COMPETITORS: tuple[Competitor, ...] = (
    Competitor("polyconv-jax", "jax", _polyconv_jax),
    Competitor("polyconv-jax backward ops", "jax", _polyconv_jax, mode="backward_ops"),
    Competitor("lax", "jax", _lax),
    Competitor("torch", "torch", _torch()),
    Competitor("polyconv-numpy", None, polyconv_eager),
    Competitor("polyconv-jax autotuned", "jax", _autotuned(_polyconv_jax)),
    Competitor("polyconv-numpy autotuned", None, _autotuned(polyconv_eager)),
)
GPU_COMPETITORS: tuple[Competitor, ...] = (
    Competitor("polyconv-jax", "jax", _polyconv_jax),
    Competitor("polyconv-jax backward ops", "jax", _polyconv_jax, mode="backward_ops"),
    Competitor("lax", "jax", _lax),
    Competitor("torch", "torch", _torch(device="cuda")),
    Competitor("torch NCX", "torch", _torch(device="cuda", memory="contiguous")),
    Competitor("torch tf32", "torch", _torch(device="cuda", tf32=True)),
    Competitor("polyconv-torch", "torch", _polyconv_torch_cuda),
    Competitor("polyconv-cupy", "cupy", _polyconv_cupy),
)


def run_layer(layer: Layer, mode: str, competitors, repeats: int, warmup: int,
              log=log, queued: int = 1) -> dict[str, Any]:
    """One row: every competitor's median time on the layer in ``mode``."""
    calls, skipped = make_calls(layer, mode, _inputs(layer), competitors)
    times = time_calls(calls, repeats, warmup, log, f"{layer.title} {mode}", 1, queued)
    return {"layer": layer.title, "model": layer.model, "source": layer.source,
            "mode": mode, "dtype": layer.dtype, "gflop": layer.flops / 1e9,
            "median_s": medians(times), "same_program": same_programs(calls),
            "skipped": skipped}


LETTERS = {"forward": "F", "backward_data": "D", "backward_weights": "W"}


def chosen(layer: Layer) -> tuple[str, dict[str, dict[str, dict[str, float | None]]]]:
    """What the measuring competitors chose for the layer's plan (F, D, W per backend), and
    each candidate's measured seconds, by backend and primitive (:func:`polyconv.chosen`,
    :func:`polyconv.measured`, keyed ``backend|...|primitive|plan``)."""
    plan = layer.plan.with_(dtype=layer.dtype)
    picks, measured = polyconv.chosen(), polyconv.measured()
    text, times = [], {}
    for primitive, letter in LETTERS.items():
        tail = f"|{primitive}|{plan.with_(primitive=primitive).key}"
        for key in sorted(k for k in picks if tail in k):
            text.append(f"{key.split('|', 1)[0]} {letter}:{picks[key]}")
        for key in (k for k in measured if tail in k):
            times.setdefault(key.split("|", 1)[0], {})[primitive] = {
                name: (t if math.isfinite(t) else None) for name, t in measured[key].items()}
    return " ".join(sorted(text)), times


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
        results["machine"].update(gpu_machine(), batch_scale=args.batch_scale)
    if args.queued > 1:
        results["machine"]["queued_calls"] = args.queued
    if not_run:
        results["not_run"] = not_run
    return write_record(args.json, results)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.queued < 1:
        parser.error(f"--queued {args.queued}: expected at least 1 call per timing")
    layers = matching_layers(args.layers, args.batch_scale)
    if not layers:
        parser.error(f"--layers {args.layers!r} matches no layer")
    modes = [m for m in args.modes.split(",") if m]
    comps = select_competitors(parser, args.competitors,
                               GPU_COMPETITORS if args.device == "gpu" else COMPETITORS)
    rerun = threaded(parser, args.threads, ["--corpus", *argv])
    if rerun is not None:
        return rerun
    start, rows, not_run = time.perf_counter(), [], []
    for layer in layers:
        for mode in modes:
            if args.time_limit is not None and time.perf_counter() - start > args.time_limit:
                not_run.append(f"{layer.title} {mode}")
                continue
            row = run_layer(layer, mode, comps, args.repeats, args.warmup, log, args.queued)
            row["lowering"], row["lowering_s"] = chosen(layer)
            rows.append(row)
            _record(args, rows, not_run)
    results = _record(args, rows, not_run)
    print(report.format_table(results))
    if not_run:
        print(f"not run (--time-limit {args.time_limit:g} s): " + "; ".join(not_run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
