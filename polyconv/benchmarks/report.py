"""Every benchmark's report, from its record: tables for the terminal and the docs, and the
plots. The docs build draws the benchmarks page from the committed records with
:func:`docs_pages` (docs/conf.py), so the page cannot drift from them.

A record is ``docs/records/<benchmark>-<kind>.json`` (one per machine kind, the newest run:
:func:`~polyconv.benchmarks.harness.machine_kind`), holding one run or several
(:func:`~polyconv.benchmarks.harness.runs`).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from .harness import runs

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


def machine_line(m: dict[str, Any]) -> str:
    """The machine a run measured, in a sentence."""
    threads = m.get("threads")
    return (f"Machine: {m['platform']}, {m['cpus']} CPUs ({m.get('processor', '')})"
            + (f", every library on {threads} thread(s)" if threads else "")
            + f", Python {m['python']}, numpy {m.get('numpy', '?')}"
            + "".join(f", {k} {m[k]}" for k in ("jax", "torch") if k in m)
            + ("" if "avx512" not in m else
               f", {'with' if m['avx512'] else 'without'} AVX-512")
            + "".join(f", {label} {m[k]}" for k, label in (
                ("blas_kernels", "numpy's BLAS kernels"),
                ("openblas_coretype", "OPENBLAS_CORETYPE"), ("xla_flags", "XLA_FLAGS"),
                ("malloc_arena_max", "MALLOC_ARENA_MAX"), ("gpu", "GPU"),
                ("batch_scale", "batch x"), ("queued_calls", "calls queued per timing"))
                if k in m)
            + ".")


def format_markdown(results: dict[str, Any]) -> str:
    """The run as a Markdown table: polyconv-jax's median time and its ratio to each peer."""
    keys = _keys(results)
    lines = [machine_line(results["machine"]), "",
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


def corpus_markdown(record: dict[str, Any]) -> str:
    """A corpus record as Markdown: its table, or for a record of several runs (a GPU's,
    lent in short sessions) one table per run under its title."""
    if "runs" not in record:
        return format_markdown(record)
    parts = [record.get("note", ""), ""]
    for run in record["runs"]:
        parts += [f"**{run['title']}**", "", format_markdown(run)]
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------
# the corpus at a glance: a plot and a summary per machine kind
# --------------------------------------------------------------------------------------------

#: the ratios the page plots and summarises, with their labels
SHOWN = {"jax/torch": "polyconv-JAX / PyTorch", "jax/lax": "polyconv-JAX / plain lax",
         "numpy/torch": "polyconv-numpy / PyTorch",
         "polyconv-torch/torch": "polyconv-torch / PyTorch"}


def latest_rows(record: dict[str, Any]) -> list[dict[str, Any]]:
    """Every (layer, mode, batch) of a record once, from the latest run that has it; a
    batch other than the corpus's named in the layer's label."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for run in runs(record):
        scale = run.get("machine", {}).get("batch_scale", 1)
        for row in run["layers"]:
            label = row["layer"] + (f" (batch x{scale})" if scale != 1 else "")
            found[(label, row["mode"])] = {**row, "label": label}
    return list(found.values())


def summary(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per ratio of :data:`SHOWN`: its geometric mean per mode and over all rows, the rows,
    and the worst rows (ratio, label, mode), worst first."""
    out: dict[str, dict[str, Any]] = {}
    for key in SHOWN:
        found = [(r[key], row["label"], row["mode"]) for row in latest_rows(record)
                 if key in (r := ratios(row))]
        if not found:
            continue
        out[key] = {"rows": len(found), "all": geomean([v for v, _, _ in found]),
                    **{mode: geomean([v for v, _, m in found if m == mode])
                       for mode in ("forward", "gradient")},
                    "worst": sorted(found, reverse=True)}
    return out


def summary_markdown(record: dict[str, Any], worst: int = 5) -> str:
    """The summary as a Markdown table: geometric means by mode, and the worst rows."""
    lines = ["| polyconv's time over the peer's | forward | gradient | all | rows | "
             "worst rows |", "|---|---|---|---|---|---|"]
    for key, s in summary(record).items():
        names = "; ".join(f"{label} {mode} {v:.2f}" for v, label, mode in s["worst"][:worst])
        lines.append(f"| {SHOWN[key]} | {s['forward']:.2f} | {s['gradient']:.2f} | "
                     f"{s['all']:.2f} | {s['rows']} | {names} |")
    return "\n".join(lines) + "\n"


def ratio_plot(record: dict[str, Any], path: Path, title: str = "") -> None:
    """Time ratio per layer, forward and gradient side by side, one marker per ratio of
    :data:`SHOWN` (log scale; left of 1 polyconv is faster)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = latest_rows(record)
    labels = list(dict.fromkeys(row["label"] for row in rows))
    keys = [k for k in SHOWN if any(k in ratios(row) for row in rows)]
    fig, axes = plt.subplots(1, 2, sharey=True, figsize=(11, 0.16 * len(labels) + 2.0))
    markers = dict(zip(SHOWN, "os^D"))
    for ax, mode in zip(axes, ("forward", "gradient")):
        for key in keys:
            points = [(min(max(r[key], 0.01), 100), labels.index(row["label"]))
                      for row in rows if row["mode"] == mode and key in (r := ratios(row))]
            if points:
                ax.scatter(*zip(*points), s=14, marker=markers[key], label=SHOWN[key])
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_xlim(0.01, 100)
        ax.set_title(mode, fontsize=9)
        ax.set_xlabel("time ratio (below 1: polyconv faster)", fontsize=8)
        ax.grid(axis="x", which="major", lw=0.3)
    axes[0].set_yticks(range(len(labels)))
    axes[0].set_yticklabels(labels, fontsize=6)
    axes[0].set_ylim(len(labels) - 0.5, -0.5)
    handles = {h.get_label(): h for ax in axes for h in ax.collections}
    fig.legend(list(handles.values()), list(handles), fontsize=7, loc="lower center",
               ncol=len(handles), frameon=False)
    fig.suptitle(title + " (ratios clipped to 0.01-100)", fontsize=10)
    fig.tight_layout(rect=(0, 0.035, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# the suite
# --------------------------------------------------------------------------------------------

#: the suite's ratios are speeds relative to this competitor
BASELINE = "polyconv-numpy"


def _names(results: dict[str, Any]) -> list[str]:
    """The competitors of a suite run, in their order (timed or skipped)."""
    return list(dict.fromkeys(n for r in results["cases"]
                              for n in (*r["median_s"], *r["skipped"])))


def suite_table(results: dict[str, Any]) -> str:
    """A suite run for the terminal: times and speeds relative to polyconv-numpy."""
    names = [n for n in _names(results) if any(n in r["median_s"] for r in results["cases"])]
    rate, m = results["matmul_gflops"], results["machine"]
    threads = f", every library on {m['threads']} thread(s)" if m.get("threads") else ""
    lines = [f"machine: {m['platform']}, {m['cpus']} CPUs{threads}; "
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


def suite_markdown(results: dict[str, Any]) -> str:
    """A suite run as a Markdown table (medians in ms, and speed relative to
    polyconv-numpy)."""
    names = _names(results)
    lines = [machine_line(results["machine"])[:-1]
             + f"; numpy float32 matmul rate {results['matmul_gflops']:.0f} GFLOP/s.", "",
             "| case | " + " | ".join(names) + " | numpy GFLOP/s (% of matmul) "
             "| numpy peak extra memory |",
             "|---|" + "---|" * (len(names) + 2)]
    for r in results["cases"]:
        cells = [f"{r['median_s'][n] * 1e3:.2f} ms (x{r['speed_vs_numpy'][n]:.2f})"
                 if n in r["median_s"] and r["speed_vs_numpy"].get(n) is not None
                 else f"{r['median_s'][n] * 1e3:.2f} ms" if n in r["median_s"] else "skipped"
                 for n in names]
        g = r["gflops"].get(BASELINE, 0.0)
        mem = r["numpy_peak_extra_memory_ratio"]
        lines.append(f"| {r['case']} | " + " | ".join(cells)
                     + f" | {g:.1f} ({g / results['matmul_gflops'] * 100:.0f}%) | "
                     + (f"{mem:.2f}x |" if mem is not None else "n/a |"))
    lines += ["", "x*N*: speed relative to polyconv-numpy in the same run (above 1 is faster). "
              "Peak extra memory: the largest numpy allocation during a call, over the bytes "
              "of its inputs and output."]
    return "\n".join(lines) + "\n"


def suite_plot(results: dict[str, Any], path: Path) -> None:
    """Bar chart of GFLOP/s per case and competitor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names, cases = _names(results), results["cases"]
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(cases) + 1.5))
    height = 0.8 / len(names)
    for i, n in enumerate(names):
        ys = [j + i * height for j in range(len(cases))]
        ax.barh(ys, [r["gflops"].get(n, 0.0) for r in cases], height=height, label=n)
    ax.axvline(results["matmul_gflops"], color="k", ls="--", lw=1, label="numpy f32 matmul")
    ax.set_yticks([j + 0.4 - height / 2 for j in range(len(cases))])
    ax.set_yticklabels([r["case"] for r in cases], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("GFLOP/s (higher is better)")
    ax.set_title(f"polyconv benchmarks, {results['machine']['cpus']} CPUs")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# first calls
# --------------------------------------------------------------------------------------------

def first_calls_markdown(record: dict[str, Any], worst: int = 10) -> str:
    """A first-calls record (``polyconv bench --first-calls``) as Markdown: the side-by-side
    models, the numpy plans over their target, and the worst plans against ``lax``."""
    targets = record.get("targets", {})
    lines = [machine_line(record["machine"]), ""]
    if record.get("note"):
        lines += [record["note"], ""]
    if record.get("side_by_side"):
        lines += ["| first jitted forward + first `value_and_grad` | polyconv | `lax` | ratio |",
                  "|---|---|---|---|"]
        for r in record["side_by_side"]:
            p, q = r["polyconv"], r["lax"]
            cells = [f"{x['forward_s']:.2f} + {x['gradient_s']:.2f} s" if "first_s" in x
                     else x.get("error", "-")[:60] for x in (p, q)]
            lines.append(f"| {r['model']} | {cells[0]} | {cells[1]} | "
                         + (f"{r['ratio']:.2f}" if "ratio" in r else "-") + " |")
        lines.append("")
    numpy_rows = [r for r in record.get("numpy", []) if "ratio" in r]
    if numpy_rows:
        over = [r for r in numpy_rows if r["ratio"] > targets.get("numpy", 1.5)]
        lines += [f"numpy, a plan's first call against a later call plus its resolution: "
                  f"{len(numpy_rows) - len(over)} of {len(numpy_rows)} within "
                  f"{targets.get('numpy', 1.5)}x" + ("; over it: " + "; ".join(
                      f"{r['model']} {r['primitive']} {r['ratio']:.1f}x"
                      for r in sorted(over, key=lambda r: -r["ratio"])) if over else "") + ".",
                  ""]
    plans = sorted((r for r in record.get("plans", []) if "ratio" in r),
                   key=lambda r: -r["ratio"])
    if plans:
        limit = targets.get("plans", 3.0)
        lines += [f"Plans, polyconv's first jitted call against `lax`'s: "
                  f"{sum(r['ratio'] > limit for r in plans)} of {len(plans)} over {limit}x "
                  f"(median ratio {statistics.median(r['ratio'] for r in plans):.2f}); "
                  f"the worst:", "",
                  "| plan | primitive | lowering | polyconv | `lax` | ratio |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {r['label']} | {r['primitive']} | {r['lowering']} | "
                  f"{r['polyconv_first_s']:.2f} s | {r['lax_first_s']:.2f} s | "
                  f"{r['ratio']:.1f} |" for r in plans[:worst]]
    return "\n".join(lines) + "\n"


def implementations_markdown(record: dict[str, Any]) -> str:
    """An implementations record (``polyconv bench --implementations``) as Markdown: per
    backend, the default pick against the fastest, and the rows each implementation wins."""
    lines = [machine_line(record["machine"]), ""]
    for backend, s in record.get("summary", {}).items():
        g = s.get("default_vs_fastest_geomean")
        lines += [f"**{backend}**: the default pick takes "
                  + (f"{g:.3f}x the fastest implementation's time" if g else "no row")
                  + " (geometric mean); the worst rows: "
                  + "; ".join(s.get("worst", [])[:3]) + ".", "",
                  "| implementation | rows it applies to | rows it wins by 10% |",
                  "|---|---|---|"]
        lines += [f"| {name} | {s['rows_applicable'].get(name, 0)} | {len(won)} |"
                  for name, won in s.get("wins", {}).items()]
        lines.append("")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# the docs page, from the records
# --------------------------------------------------------------------------------------------

#: the machine kinds' names on the page
KINDS = {"avx512": "CPU with AVX-512", "avx2": "CPU with AVX2 (no AVX-512)",
         "h100": "NVIDIA H100", "h200": "NVIDIA H200"}


def records(directory: Path) -> dict[str, dict[str, Path]]:
    """The records in ``directory`` by benchmark and machine kind (file names
    ``<benchmark>-<kind>.json``; the benchmark's own name may hold dashes)."""
    out: dict[str, dict[str, Path]] = {}
    for path in sorted(directory.glob("*.json")):
        benchmark, _, kind = path.stem.rpartition("-")
        out.setdefault(benchmark, {})[kind] = path
    return out


def _kind_order(kind: str) -> tuple[int, str]:
    return (list(KINDS).index(kind) if kind in KINDS else len(KINDS), kind)


def overhead_markdown(record: dict[str, Any]) -> str:
    """Per run (thread count, device), each case's call under polyconv beside the framework's
    own, in microseconds."""
    lines = []
    for run in runs(record):
        lines += [f"Threads: {run['threads']}, device: {run['device']}.", "",
                  "| case | framework | call | framework's own (us) | polyconv (us) | ratio |",
                  "|---|---|---|---|---|---|"]
        for r in run["rows"]:
            ref = r.get("reference")
            own = f"{r[ref + '_us']:.1f} ({ref})" if ref else ""
            ratio = f"{r['ratio']:.2f}" if ref else ""
            lines.append(f"| {r['case']} | {r['framework']} | {r['what']} | {own} | "
                         f"{r['polyconv_us']:.1f} | {ratio} |")
        lines.append("")
    return "\n".join(lines)


def spatial_markdown(record: dict[str, Any]) -> str:
    """Per level, device count and mode, polyconv's sharded ops beside XLA's partitioning of
    the plain calls: time, memory and bytes received per device, and the collectives."""
    size = "x".join(map(str, record.get("size", [])))
    lines = [machine_line(record["machine"]), "",
             f"A level on a {size} volume of {record.get('channels')} channels, split along D.",
             "", "| level | devices | call | side | ms | MiB per device | MiB received | "
             "collectives |", "|---|---|---|---|---|---|---|---|"]
    for r in record["rows"]:
        mem = "" if r["memory_bytes"] is None else f"{r['memory_bytes'] / 2**20:.2f}"
        lines.append(f"| {r['upsampling']} | {r['devices']} | {r['mode']} | {r['side']} | "
                     f"{r['seconds'] * 1e3:.2f} | {mem} | {r['received_bytes'] / 2**20:.3f} | "
                     f"{', '.join(r['collectives']) or '-'} |")
    return "\n".join(lines) + "\n"


def docs_pages(directory: Path, out: Path) -> None:
    """The benchmarks page's generated parts (``out/benchmarks-<benchmark>.md`` and their
    plots), one section per machine kind that has a record, drawn from its record."""
    found = records(directory)
    for benchmark in ("corpus", "suite", "first-calls", "implementations", "overhead",
                      "spatial"):
        parts = []
        for kind in sorted(found.get(benchmark, {}), key=_kind_order):
            record = json.loads(found[benchmark][kind].read_text())
            name = KINDS.get(kind, kind)
            heading = {"corpus": name, "suite": f"The suite on a {name}",
                       "first-calls": f"First calls on a {name}",
                       "implementations": f"Every implementation on a {name}",
                       "overhead": f"Per-call overhead on a {name}",
                       "spatial": f"Spatial sharding on a {name}"}[benchmark]
            parts += [f"### {heading}", "",
                      f"Record: `docs/records/{found[benchmark][kind].name}`.", ""]
            if benchmark == "corpus":
                ratio_plot(record, out / f"corpus-{kind}.png", name)
                parts += [f"![Time ratio per layer on a {name}](corpus-{kind}.png)", "",
                          summary_markdown(record), "", corpus_markdown(record)]
            elif benchmark == "suite":
                suite_plot(record, out / f"suite-{kind}.png")
                parts += [suite_markdown(record), "",
                          f"![GFLOP/s per case and competitor](suite-{kind}.png)", ""]
            elif benchmark == "first-calls":
                parts.append(first_calls_markdown(record))
            elif benchmark == "overhead":
                parts.append(overhead_markdown(record))
            elif benchmark == "spatial":
                parts.append(spatial_markdown(record))
            else:
                parts.append(implementations_markdown(record))
        text = "\n".join(parts) or ("No record yet: `nox -s bench` measures this machine "
                                     "(docs/benchmarks.md).\n")
        (out / f"benchmarks-{benchmark}.md").write_text(text)
