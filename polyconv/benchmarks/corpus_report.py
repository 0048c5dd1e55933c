"""The corpus run's report: each row's ratios to its peers, and the run as a table."""

from __future__ import annotations

import math
from typing import Any

#: the ratios a run can report, in the tables' order: polyconv's time over the peer's
RATIO_KEYS = ("jax/lax", "jax/torch", "jax/own ops", "numpy/torch", "jax/torch tf32",
              "polyconv-torch/torch", "cupy/torch")
#: PyTorch's full-float32 configurations; its best is the peer (CUDA: both memory formats)
_TORCH = ("torch", "torch NCX")
#: polyconv-jax's other peers: the ratio's label (``jax/<label>``) and the competitor's name
_JAX_PEERS = {"lax": "lax", "own ops": "polyconv-jax backward ops", "torch tf32": "torch tf32"}


def ratios(row: dict[str, Any]) -> dict[str, float]:
    """polyconv's time over each peer's (below 1: polyconv is faster): the JAX backend's
    over plain lax, PyTorch (its best full-float32 configuration) and its own backward ops;
    the numpy, torch and CuPy (array-API) backends' over PyTorch."""
    t = row["median_s"]
    out = {}
    best_torch = min((t[k] for k in _TORCH if k in t), default=None)
    peers = {"torch": best_torch, **{label: t.get(name) for label, name in _JAX_PEERS.items()}}
    if "polyconv-jax" in t:
        for peer, time_ in peers.items():
            if time_:
                out[f"jax/{peer}"] = t["polyconv-jax"] / time_
    if best_torch:
        # each backend's ratio stands on its own (a run without JAX reports it too)
        for name, key in (("polyconv-numpy", "numpy/torch"),
                          ("polyconv-torch", "polyconv-torch/torch"),
                          ("polyconv-cupy", "cupy/torch")):
            if name in t:
                out[key] = t[name] / best_torch
    return out


def _cell(row: dict[str, Any], key: str, value: float) -> str:
    """A ratio, marked ``=`` where polyconv-jax and the peer ran one compiled program (the
    ratio is then 1 by construction, and its distance from 1 is the host's noise)."""
    peer = _JAX_PEERS.get(key.removeprefix("jax/")) if key.startswith("jax/") else None
    same = any("polyconv-jax" in group and peer in group
               for group in row.get("same_program", ()))
    return f"{value:.2f}" + ("=" if same else "")


def _keys(results: dict[str, Any]) -> tuple[str, ...]:
    present = {k for row in results["layers"] for k in ratios(row)}
    return tuple(k for k in RATIO_KEYS if k in present)


def geomean(values) -> float:
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def _cells(results: dict[str, Any], keys: tuple[str, ...]):
    """Each row with its times (polyconv-jax's, polyconv-numpy's, in ms or ``None``) and its
    ratio cells in ``keys`` order; and each key's ratios over the run."""
    per_key: dict[str, list[float]] = {k: [] for k in keys}
    rows = []
    for row in results["layers"]:
        r = ratios(row)
        for k in keys:
            if k in r:
                per_key[k].append(r[k])
        t, tn = (row["median_s"].get(n) for n in ("polyconv-jax", "polyconv-numpy"))
        rows.append((row, r, t and t * 1e3, tn and tn * 1e3,
                     [_cell(row, k, r[k]) if k in r else "-" for k in keys]))
    return rows, per_key


def format_table(results: dict[str, Any]) -> str:
    keys = _keys(results)
    lines = [f"{'layer':58s} {'mode':9s} {'jax ms':>8s} {'numpy ms':>8s} "
             + " ".join(f"{k:>11s}" for k in keys)]
    rows, per_key = _cells(results, keys)
    per_mode: dict[str, list[float]] = {}
    for row, r, t, tn, cells in rows:
        if "numpy/torch" in r:
            per_mode.setdefault(row["mode"], []).append(r["numpy/torch"])
        lines.append(f"{row['layer'][:58]:58s} {row['mode']:9s} "
                     f"{t or float('nan'):8.2f} {tn or float('nan'):8.2f} "
                     + " ".join(f"{c:>11s}" for c in cells))
    lines.append(f"{'geometric mean':58s} {'':9s} {'':8s} {'':8s} "
                 + " ".join(f"{geomean(per_key[k]):11.2f}" for k in keys))
    for mode, values in per_mode.items():
        lines.append(f"{'numpy/torch geometric mean, ' + mode:58s} {'':9s} {'':8s} {'':8s} "
                     + " " * 12 * (len(keys) - 1) + f"{geomean(values):11.2f}"
                     + f"   (worst {max(values):.2f})")
    lines.append("ratios: polyconv's median time over the peer's in the same run "
                 "(below 1: polyconv is faster); =: the same compiled program as the peer's")
    return "\n".join(lines)


def format_markdown(results: dict[str, Any]) -> str:
    """The run as a Markdown table: polyconv-jax's median time and its ratio to each peer."""
    keys = _keys(results)
    m = results["machine"]
    lines = [f"Machine: {m['platform']}, {m['cpus']} CPUs ({m.get('processor', '')}), Python "
             f"{m['python']}" + "".join(f", {k} {m[k]}" for k in ("jax", "torch") if k in m)
             + ("" if "avx512" not in m else
                f", {'with' if m['avx512'] else 'without'} AVX-512")
             + "".join(f", {label} {m[k]}" for k, label in (
                 ("blas_kernels", "numpy's BLAS kernels"),
                 ("openblas_coretype", "OPENBLAS_CORETYPE"), ("xla_flags", "XLA_FLAGS"),
                 ("malloc_arena_max", "MALLOC_ARENA_MAX"), ("gpu", "GPU"),
                 ("batch_scale", "batch x"), ("queued_calls", "calls queued per timing"))
                 if k in m)
             + ".", "",
             "| layer | mode | polyconv-jax | lowering | polyconv-numpy | "
             + " | ".join(keys) + " |",
             "|---|---|---|---|---|" + "---|" * len(keys)]
    rows, per_key = _cells(results, keys)
    for row, _, t, tn, cells in rows:
        lines.append(f"| {row['layer']} | {row['mode']} | "
                     + (f"{t:.2f} ms" if t else "-") + f" | {row.get('lowering', '')} | "
                     + (f"{tn:.2f} ms" if tn else "-") + " | " + " | ".join(cells) + " |")
    lines.append("| **geometric mean** | | | | | "
                 + " | ".join(f"**{geomean(per_key[k]):.2f}**" for k in keys) + " |")
    lines += ["", "Ratios: polyconv's median time over the peer's, same run (below 1: polyconv "
              "is faster). *own ops*: polyconv's two backward ops for the layer, the cost the "
              "gradient should match. *=*: XLA compiled the same program for both (instructions "
              "compared, names and metadata aside), so the ratio is 1 by construction and its "
              "distance from 1 is the host's noise. *lowering*: what the JAX backend measured "
              "and chose, per primitive (F forward, D backward_data, W backward_weights)."]
    return "\n".join(lines) + "\n"


def format_gpu_markdown(record: dict[str, Any]) -> str:
    """A GPU record (``docs/benchmarks-gpu.json``: several corpus runs) as Markdown, one
    table per run under its title."""
    parts = [record.get("note", ""), ""]
    for run in record["runs"]:
        parts += [f"**{run['title']}**", "", format_markdown(run)]
    return "\n".join(parts)
