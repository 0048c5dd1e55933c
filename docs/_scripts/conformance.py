"""The conformance page's tables, drawn from a recorded ``polyconv compare --peers ... --json``
run (``docs/conformance/peers.json``): peers x attribute families, and for each kind of wrong
answer the smallest case of the record that shows it, with the command that reproduces it.

Nothing here is typed in: every verdict, error and case comes from the record.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from polyconv._cli_args import display_name

#: attribute family -> whether a comparison of the record exercises it (the attribute
#: families count the forward ops; the gradient ops have their own column)
FAMILIES = {
    "strides": lambda c: _any_above(c["attrs"].get("strides"), 1),
    "asymmetric pads": lambda c: c["pads_begin"] != c["pads_end"],
    "dilation": lambda c: _any_above(c["attrs"].get("dilations"), 1),
    "groups": lambda c: c["attrs"].get("groups", 1) > 1,
    "output_padding": lambda c: _any_above(c["attrs"].get("output_padding"), 0),
    "auto_pad": lambda c: "auto_pad" in c["attrs"],
    "layouts": lambda c: "data_format" in c["attrs"] or "weights_format" in c["attrs"],
    "16-bit": lambda c: c["dtype"] in ("float16", "bfloat16"),
    "gradients": lambda c: "backward" in c["op"],
}

def _any_above(value, floor: int) -> bool:
    if value is None:
        return False
    return any(v > floor for v in (value if isinstance(value, list) else [value]))


def _forward(c: dict) -> bool:
    return "backward" not in c["op"]


def _cell(statuses: list[str]) -> str:
    if not statuses:
        return "-"
    wrong = sum(s in ("disagrees", "raises") for s in statuses)
    cannot = statuses.count("cannot express")
    if not wrong and not cannot:
        return f"agrees ({len(statuses)})"
    parts = [f"**{wrong} wrong**" if wrong else "", f"{cannot} cannot express" if cannot else "",
             f"{statuses.count('agrees')} agree" if statuses.count("agrees") else ""]
    return ", ".join(p for p in parts if p)


def _size(c: dict) -> int:
    total = 0
    for shape in c["input_shapes"].values():
        n = 1
        for d in shape or ():
            n *= d
        total += n
    return total


def _command(c: dict, peer: str) -> str:
    """The ``polyconv compare`` call that reruns the case on one peer."""
    words = ["polyconv compare", f"--op {display_name(c['op'])}"]
    words += [f"--{role.replace('_', '-')} {'x'.join(map(str, shape))}"
              for role, shape in c["input_shapes"].items() if role != "bias" and shape]
    for key, value in c["attrs"].items():
        text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        words.append(f"--{key.replace('_', '-')} {text}")
    words += [f"--peers {peer}", f"--dtypes {c['dtype']}", "--backends numpy"]
    return " ".join(words)


def _kind(c: dict, result: dict, float32_status: dict) -> str:
    """What kind of wrong answer: raising, wrong in float32, or wrong only in 16 bits (where
    the same case agrees in float32: the peer's accumulator, not its geometry)."""
    if result["status"] == "raises":
        return f"raises {result['detail'].split(':')[0]}"
    key = (result["peer"], c["op"], c["label"])
    if c["dtype"] != "float32" and float32_status.get(key) == "agrees":
        return f"beyond the bound in {c['dtype']} only"
    return "wrong values"


def page(record: dict) -> str:
    """The generated part of docs/conformance.md."""
    comparisons = [c for c in record["comparisons"] if c.get("peers")]
    peers = record["peers"]
    versions = record.get("peer_versions", {})
    lines = ["Recorded run: `polyconv compare --peers all --backends numpy --json` on the "
             f"built-in suite's {len(comparisons)} comparisons (all six ops; "
             f"{', '.join(record['dtypes'])}), with "
             + ", ".join(f"{p} {versions.get(p) or ''}".strip() for p in peers)
             + f"; it took {record['seconds']:.0f} s on a 2-CPU machine.", ""]
    lines += ["| peer | " + " | ".join(FAMILIES) + " |",
              "|---|" + "---|" * len(FAMILIES)]
    for peer in peers:
        cells = []
        for name, test in FAMILIES.items():
            cells.append(_cell([r["status"] for c in comparisons
                                if test(c) and (name == "gradients" or _forward(c))
                                for r in c["peers"] if r["peer"] == peer]))
        lines.append(f"| {peer} | " + " | ".join(cells) + " |")

    float32_status = {(r["peer"], c["op"], c["label"]): r["status"] for c in comparisons
                      if c["dtype"] == "float32" for r in c["peers"]}
    smallest: dict[tuple[str, str], tuple[dict, dict, int]] = {}
    for c in comparisons:
        for r in c["peers"]:
            if r["status"] not in ("disagrees", "raises"):
                continue
            key = (r["peer"], _kind(c, r, float32_status))
            count = smallest.get(key, (None, None, 0))[2] + 1
            if key not in smallest or _size(c) < _size(smallest[key][0]):
                smallest[key] = (c, r, count)
            else:
                smallest[key] = (*smallest[key][:2], count)
    notes: dict[tuple[str, str], list[dict]] = {}
    for c in comparisons:
        for r in c["peers"]:
            if r["status"] == "agrees" and r["detail"]:
                notes.setdefault((r["peer"], r["detail"]), []).append(c)
    if notes:
        lines += ["", "## Documented differences of convention", "",
                  "Cases a peer agrees on once given in its own convention:", ""]
        for (peer, note), cs in notes.items():
            note = re.sub(r"\(docs/frameworks\.md#([\w-]+)\)", r"({ref}`\1`)", note)
            lines.append(f"- **{peer}**, {display_name(cs[0]['op'])} *{cs[0]['label']}* "
                         f"({len(cs)} in the record): {note}.")
    lines += ["", "## Wrong answers, smallest case of each", ""]
    if not smallest:
        lines.append("None: every peer agrees wherever it can express the case.")
    for (peer, kind), (c, r, count) in sorted(smallest.items()):
        what = (r["detail"] if r["status"] == "raises" else
                f"max abs error {r['max_abs_error']:.3g}, err/bound {r['max_ratio']:.3g} "
                f"at output index {tuple(r['where'] or ())}")
        lines += [f"### {peer}: {kind} ({count} in the record)", "",
                  f"{display_name(c['op'])}, *{c['label']}*, {c['dtype']}: {what}.", "",
                  "```bash", _command(c, peer), "```", ""]
    return "\n".join(lines) + "\n"


def write(record_path: Path, out: Path) -> None:
    """Write ``out`` from the record (only when its text changes)."""
    text = page(json.loads(Path(record_path).read_text()))
    if not out.exists() or out.read_text() != text:
        out.write_text(text)


if __name__ == "__main__":
    write(Path(sys.argv[1]), Path(sys.argv[2]))
