"""The default pick held against recorded measurements: no timing, only the records.

A corpus record (``polyconv bench --corpus``, whose rows keep each measured candidate's
seconds per primitive, or ``polyconv bench --implementations``) says how fast each
implementation ran on each layer of the corpus on one machine. This report asks the backend's
chooser what its default pick is for each of those plans, on the record's platform, and prints
the pick's recorded time against the fastest recorded: the geometric mean over the rows, and
the worst rows. It validates the cost model or policy on every machine kind a record exists
for, without that machine (:func:`polyconv.default_implementation` answers for the record's
platform).

Run with ``polyconv bench --policy-check docs/records/corpus-*.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polyconv

from .corpus_layers import LAYERS

#: a row whose pick takes more than this times the fastest is listed as a loss
LOSS = 1.15
#: names records made before the glossary of implementations (docs/architecture.md) used
RENAMED = {("forward", "patches_matmul"): "im2col",
           ("backward_weights", "patches_matmul"): "im2col",
           ("forward", "subpixel"): "space_to_depth",
           ("forward", "overlap"): "matmul_overlap_add",
           ("backward_data", "overlap"): "matmul_overlap_add"}


def _records(data: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """``(platform, machine, row)`` of a corpus record, a GPU record's runs, or an
    implementations record."""
    if "runs" in data:                                  # GPU: several runs, one machine each
        for run in data["runs"]:
            for row in run["layers"]:
                yield "gpu", run.get("machine", {}), row
        return
    platform = "gpu" if data.get("machine", {}).get("gpu") else "cpu"
    for row in data.get("layers", data.get("rows", [])):
        yield platform, data.get("machine", {}), row


def _times(row: dict[str, Any], backend: str) -> dict[str, dict[str, float]]:
    """Seconds per candidate, by primitive, for ``backend``."""
    if "seconds" in row:                                # polyconv bench --implementations
        if row.get("backend") != backend:
            return {}
        return {row["primitive"]: row["seconds"]}
    recorded = row.get("lowering_s") or {}
    if backend in recorded:                             # by backend, then primitive
        recorded = recorded[backend]
    elif backend != "jax":                              # older records hold JAX's only
        return {}
    return {p: {RENAMED.get((p, n), n): t for n, t in ts.items()
                if t is not None and math.isfinite(t)}
            for p, ts in recorded.items() if isinstance(ts, dict)}


def check(paths: list[Path], backend: str) -> list[dict[str, Any]]:
    """One entry per (record row, primitive): the default pick, its time against the
    fastest recorded."""
    layers = {ly.title: ly for ly in LAYERS}
    out, seen = [], set()
    for path in paths:
        data = json.loads(path.read_text())
        for platform, _machine, row in _records(data):
            layer = layers.get(row["layer"])
            if layer is None:
                continue
            for primitive, times in _times(row, backend).items():
                key = (str(path), platform, row["layer"], row.get("dtype"), primitive)
                if key in seen or len(times) < 2:
                    continue
                seen.add(key)
                plan = layer.plan.with_(primitive=primitive, dtype=row.get("dtype", "float32"))
                pick = polyconv.default_implementation(backend, primitive, plan,
                                                       platform=platform)
                fastest = min(times, key=times.__getitem__)
                ratio = times[pick] / times[fastest] if pick in times else None
                out.append({"record": path.name, "platform": platform, "layer": row["layer"],
                            "primitive": primitive, "pick": pick, "fastest": fastest,
                            "ratio": ratio})
    return out


def report(entries: list[dict[str, Any]]) -> str:
    lines = []
    for record in sorted({e["record"] for e in entries}):
        for platform in sorted({e["platform"] for e in entries if e["record"] == record}):
            rows = [e for e in entries if e["record"] == record and e["platform"] == platform]
            known = [e for e in rows if e["ratio"] is not None]
            if not known:
                continue
            geo = statistics.geometric_mean([e["ratio"] for e in known])
            losses = sorted((e for e in known if e["ratio"] > LOSS),
                            key=lambda e: -e["ratio"])
            lines.append(f"{record} ({platform}): {len(known)} rows, pick/fastest geometric "
                         f"mean {geo:.3f}, {len(losses)} above {LOSS}x, "
                         f"{len(rows) - len(known)} picks not recorded")
            lines += [f"  {e['ratio']:6.2f}x {e['layer']} {e['primitive']}: {e['pick']} "
                      f"against {e['fastest']}" for e in losses]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="polyconv bench --policy-check",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("records", nargs="+", type=Path)
    parser.add_argument("--backend", default="jax")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    entries = check(args.records, args.backend)
    if args.json:
        args.json.write_text(json.dumps(entries, indent=1))
    print(report(entries))
    return 0


if __name__ == "__main__":
    sys.exit(main())
