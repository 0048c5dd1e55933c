"""``polyconv compare``: the built-in suite of geometries (or one call given on the command
line), every available backend and dtype, against the float64 reference and its error bound."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ._cli_args import (
    SHAPE_OPTIONS,
    UsageError,
    attrs_of,
    display_name,
    flag,
    op_name,
    shape_inputs,
)
from ._compare import (
    BOUND,
    Comparison,
    _backend_names,
    _shape_str,
    compare,
    format_table,
    numpy_dtype,
    trim,
)
from ._ops import infer_shape
from ._optable import MAIN_OPS, spec
from ._peers import peer_names


@dataclass(frozen=True)
class Case:
    """One geometry of the suite, given as the shapes of the family's forward op."""

    label: str
    family: str  # "convolution" or "conv_transpose"
    src: tuple[int, ...]
    weights: tuple[int, ...]
    attrs: dict[str, Any] = field(default_factory=dict)
    ops: tuple[str, ...] = ()  # default: the family's three ops
    dst_shape: tuple[int, ...] | None = None


_CONV_OPS = tuple(s.name for s in MAIN_OPS if s.family == "convolution")
_TCONV_OPS = tuple(s.name for s in MAIN_OPS if s.family == "conv_transpose")

# Small shapes on purpose: the suite's time is JAX compilation, one per case and dtype.
# Together the cases use both data formats and all four weight formats in each family.
SUITE: tuple[Case, ...] = (
    # Convolution family; weights XIO [K.., IC/G, OC] unless said otherwise.
    Case("1d strided", "convolution", (2, 9, 3), (3, 3, 4), {"strides": 2}),
    Case("2d dilated, asymmetric pads, NCX/OIX", "convolution", (1, 3, 7, 6), (4, 3, 3, 2),
         {"dilations": (2, 1), "pads_begin": (1, 0), "pads_end": (2, 1), "data_format": "NCX",
          "weights_format": "OIX"}),
    Case("2d grouped, strided, same_upper", "convolution", (2, 7, 6, 6), (3, 3, 2, 6),
         {"groups": 3, "strides": 2, "auto_pad": "same_upper"}),
    Case("2d depthwise, same_lower", "convolution", (1, 6, 7, 4), (3, 2, 1, 4),
         {"groups": 4, "strides": 2, "auto_pad": "same_lower"}),
    Case("2d valid, IOX", "convolution", (1, 5, 6, 3), (3, 5, 2, 3),
         {"strides": (1, 2), "auto_pad": "valid", "weights_format": "IOX"}),
    Case("3d strided, padded, XOI", "convolution", (1, 4, 5, 4, 2), (2, 3, 2, 3, 2),
         {"strides": (1, 2, 1), "pads_begin": 1, "pads_end": (0, 1, 1),
          "weights_format": "XOI"}),
    Case("2d strided, output_padding", "convolution", (1, 6, 6, 3), (3, 3, 3, 4),
         {"strides": 2, "pads_begin": 1, "pads_end": 1, "output_padding": 1},
         ops=("convolution_backward_data",)),
    Case("2d same_upper, dst_shape", "convolution", (1, 7, 8, 3), (3, 3, 3, 2),
         {"strides": 2, "auto_pad": "same_upper"}, ops=("convolution_backward_data",),
         dst_shape=(7, 8)),
    # ConvTranspose family; weights XOI [K.., OC/G, IC] unless said otherwise.
    Case("1d strided, output_padding", "conv_transpose", (2, 5, 4), (3, 3, 4),
         {"strides": 2, "output_padding": 1}),
    Case("2d grouped, asymmetric pads, output_padding", "conv_transpose", (1, 4, 5, 6),
         (3, 3, 2, 6), {"groups": 3, "strides": 2, "pads_begin": (1, 0), "pads_end": (0, 1),
                        "output_padding": (1, 0)}),
    Case("2d same_upper, NCX/IOX (PyTorch layout)", "conv_transpose", (2, 4, 3, 4),
         (4, 3, 3, 3), {"strides": 2, "auto_pad": "same_upper", "data_format": "NCX",
                        "weights_format": "IOX"}),
    Case("2d dilated, same_lower, output_padding", "conv_transpose", (1, 4, 4, 3),
         (3, 3, 2, 3), {"strides": 2, "dilations": 2, "auto_pad": "same_lower",
                        "output_padding": 1}),
    Case("2d depthwise, valid, XIO", "conv_transpose", (1, 4, 4, 4), (2, 3, 4, 1),
         {"groups": 4, "strides": 2, "auto_pad": "valid", "weights_format": "XIO"}),
    Case("3d strided, padded, output_padding, OIX", "conv_transpose", (1, 3, 4, 3, 2),
         (3, 2, 2, 3, 2), {"strides": 2, "pads_begin": 1, "pads_end": (1, 0, 1),
                           "output_padding": (1, 0, 1), "weights_format": "OIX"}),
    Case("2d same_upper, dst_shape", "conv_transpose", (1, 4, 4, 3), (3, 3, 2, 3),
         {"strides": 2, "auto_pad": "same_upper"}, ops=("conv_transpose",), dst_shape=(7, 8)),
)


def _forward_attrs(name: str, attrs: dict[str, Any], family: str) -> dict[str, Any]:
    """The attributes of the family's forward op that produce an op's inputs."""
    out = {k: v for k, v in attrs.items() if k != "dst_shape"}
    out["weights_format"] = attrs.get("weights_format") or spec(name).weights_format
    if family == "convolution":
        out.pop("output_padding", None)
    return out


def derive_inputs(name: str, attrs: dict[str, Any], given: dict[str, Any], *,
                  with_bias: bool = True
                  ) -> tuple[dict[str, tuple[int, ...] | None], dict[str, Any]]:
    """The positional input shapes and the attributes of op ``name``, filling in what is left out.

    ``given`` holds the shapes the user gave (``src``, ``weights``, ``diff_dst``...). For the
    backward ops ``diff_dst`` may come from the family's forward op on ``src`` and ``weights``,
    and ``weights_shape`` from ``weights``; ``bias`` comes from the output channels. The result
    is validated by :func:`~polyconv.infer_shape` (the op's own errors).
    """
    kind, family = spec(name).kind, spec(name).family
    given = dict(given)

    def need(role: str, how: str = ""):
        if given.get(role) is None:
            msg = f"{display_name(name)} needs {flag(role)}{how}"
            raise UsageError(msg)
        return given[role]

    if kind.endswith("backward_weights"):
        if given.get("weights_shape") is None and given.get("weights") is not None:
            given["weights_shape"] = given.pop("weights")
        full = given.pop("weights", None) or need("weights_shape", " (or --weights)")
        if given.get("diff_dst") is None:
            if len(full) != len(need("src")):
                need("diff_dst", " (or the full --weights to derive it from)")
            given["diff_dst"] = infer_shape(family, given["src"], full,
                                            **_forward_attrs(name, attrs, family)).shape
    elif kind in ("convolution", "conv_transpose"):
        need("src")
        need("weights")
    elif kind.endswith("backward_data") and given.get("diff_dst") is None:
        src = given.pop("src", None)
        if src is None:
            need("diff_dst", " (or --src to derive it from)")
        given["diff_dst"] = infer_shape(family, src, need("weights"),
                                        **_forward_attrs(name, attrs, family)).shape
    elif kind.endswith("backward_data"):
        given.pop("src", None)
    shapes, attrs = shape_inputs(name, given, attrs)
    plan = infer_shape(name, *trim(list(shapes.values())), **attrs)
    if "bias" in shapes and shapes["bias"] is None and with_bias:
        shapes["bias"] = (plan.bias_channels,)
    return shapes, attrs


@dataclass(frozen=True)
class Job:
    """One op on one set of input shapes; run once per dtype."""

    label: str
    name: str
    shapes: dict[str, tuple[int, ...] | None]
    attrs: dict[str, Any]


def _suite_jobs(ops: Sequence[str] | None, bias: bool) -> list[Job]:
    jobs = []
    for case in SUITE:
        family_ops = case.ops or (_CONV_OPS if case.family == "convolution" else _TCONV_OPS)
        for name in family_ops:
            if ops is not None and name not in ops:
                continue
            given = {"src": case.src, "weights": case.weights, "dst_shape": case.dst_shape}
            shapes, attrs = derive_inputs(name, case.attrs,
                                          {k: v for k, v in given.items() if v is not None},
                                          with_bias=bias)
            jobs.append(Job(case.label, name, shapes, attrs))
    return jobs


def _custom_jobs(args: argparse.Namespace, ops: Sequence[str] | None) -> tuple[list[Job], list]:
    attrs = attrs_of(args)
    given = {r: getattr(args, r) for r in SHAPE_OPTIONS if getattr(args, r, None) is not None}
    jobs, skipped = [], []
    for name in ops or (*_CONV_OPS, *_TCONV_OPS):
        try:
            shapes, op_attrs = derive_inputs(name, attrs, given, with_bias=not args.no_bias)
        except (UsageError, ValueError, TypeError) as exc:
            if ops is not None:
                raise
            skipped.append((name, exc))
            continue
        jobs.append(Job("", name, shapes, op_attrs))
    return jobs, skipped


def _make_inputs(job: Job, dtype: str, rng) -> list[Any]:
    out = []
    for role, value in job.shapes.items():
        if value is None or role in ("dst_shape", "weights_shape"):
            out.append(value)
        else:
            out.append(rng.uniform(-1.0, 1.0, size=value).astype(numpy_dtype(dtype)))
    return trim(out)


class _Progress:
    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled and total > 1
        self.tty = sys.stderr.isatty()
        self.step = max(1, total // 5)
        self.width = 0

    def show(self, i: int, text: str) -> None:
        if not self.enabled:
            return
        line = f"polyconv compare: [{i:>{len(str(self.total))}}/{self.total}] {text}"
        if self.tty:
            pad = max(0, self.width - len(line))
            sys.stderr.write("\r" + line + " " * pad)
            sys.stderr.flush()
            self.width = len(line)
        elif i == 1 or i % self.step == 0:
            print(line, file=sys.stderr, flush=True)

    def done(self) -> None:
        if self.enabled and self.tty and self.width:
            sys.stderr.write("\r" + " " * self.width + "\r")
            sys.stderr.flush()


def _ratio(r) -> str:
    """One result's err/bound as a table entry: two decimals, ``FAIL`` beyond the bound."""
    if r.error:
        return "ERROR"
    text = f"{r.max_ratio:.2f}" if r.max_ratio < float("inf") else "inf"
    return text if r.ok else f"FAIL:{text}"


def _cell(results, dtypes: Sequence[str]) -> str:
    """One backend's err/bound in each dtype, in ``dtypes`` order (``-`` where it did not
    run): 16-bit rounding no longer hides how close float32 comes."""
    by_dtype: dict[str, list] = {}
    for r in results:
        by_dtype.setdefault(r.dtype, []).append(r)
    return " ".join(_ratio(max(by_dtype[d], key=lambda r: (not r.ok, r.max_ratio)))
                    if d in by_dtype else "-" for d in dtypes)


def _suite_report(comparisons: list[Comparison], backends: list[str],
                  dtypes: Sequence[str]) -> list[str]:
    rows: dict[tuple[str, str], dict[str, Any]] = {}  # (op, geometry) -> row, in run order
    for c in comparisons:
        row = rows.setdefault((c.op, c.label), {"shape": c.shape, "results": {}})
        for r in c.results:
            row["results"].setdefault(r.backend, []).append(r)
    table = []
    for (op, label), row in rows.items():
        cells = [_cell(row["results"].get(b, []), dtypes) for b in backends]
        table.append((display_name(op), label, _shape_str(row["shape"]), *cells))
    lines = [f"err/bound in {' '.join(dtypes)}, in that order (<= 1: within the bound):"]
    lines += format_table(("op", "geometry", "output", *backends), table)
    per_dtype = []
    for dtype in dtypes:
        rs = {b: [r for c in comparisons if c.dtype == dtype for r in c.results
                  if r.backend == b] for b in backends}
        per_dtype.append((dtype, *(_cell(rs[b], [dtype]) for b in backends)))
    lines.append("")
    lines += format_table(("worst by dtype", *backends), per_dtype)
    return lines


def not_run(backends: Sequence[str]) -> list[str]:
    """A line for each registered backend that did not run for want of its library: why,
    and how to add it."""
    from ._backends import get_backend, registered_backends

    lines = []
    for name in registered_backends():
        if name in backends:
            continue
        try:
            get_backend(name, "compare")
        except ImportError as exc:
            why = str(exc).removeprefix(f"compare: polyconv backend {name!r} is ")
            lines.append(f"not run: {name}, {why.split(' (the distribution')[0]}")
        except Exception as exc:   # a third party's backend that fails to load
            lines.append(f"not run: {name}, which fails to load ({type(exc).__name__}: {exc})")
    return lines


def _summary(comparisons: list[Comparison], backends: list[str], dtypes: Sequence[str],
             seconds: float) -> tuple[list[str], bool]:
    """What ran and the worst result, then the verdict, a short last line."""
    results = [(c, r) for c in comparisons for r in c.results]
    bad = [(c, r) for c, r in results if not r.ok]
    ok = bool(results) and not bad
    ran = (f"ran {_plural(len(comparisons), 'comparison')} on "
           f"{_plural(len(backends), 'backend')} ({', '.join(backends)}) in "
           f"{', '.join(dtypes)}, {seconds:.1f} s")
    if not results:
        return [ran, "polyconv compare: nothing ran"], False
    c, r = max(results, key=lambda cr: (not cr[1].ok, cr[1].max_ratio))
    where = f"{r.backend}, {' '.join(filter(None, (display_name(c.op), c.label)))}, {c.dtype}"
    worst = f"{r.max_ratio:.2f}" if r.max_ratio < float("inf") else "inf"
    detail = f"worst err/bound {worst}: {where}"
    if ok:
        verdict = f"polyconv compare: OK, all {_plural(len(results), 'result')} within {BOUND}"
    else:
        verdict = (f"polyconv compare: {len(bad)} of {len(results)} results FAILED {BOUND} "
                   f"(see above)")
    return [ran, detail, verdict], ok


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _reason(name: str, exc: BaseException) -> str:
    """Why op ``name`` was skipped, without saying its name twice: ``needs --weights`` for a
    missing input, else the op's own message (which names its function)."""
    text = str(exc)
    prefix = f"{display_name(name)} "
    return text.removeprefix(prefix) if isinstance(exc, UsageError) else text


def _why_not(skipped: list[tuple[str, BaseException]]) -> str:
    """The skipped ops grouped by reason: ``Convolution and ConvTranspose need --weights``."""
    groups: dict[str, list[str]] = {}
    for name, exc in skipped:
        groups.setdefault(_reason(name, exc), []).append(display_name(name))
    parts = []
    for reason, names in groups.items():
        if not reason.startswith("needs "):
            parts.append(reason)
            continue
        who = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
        verb = "needs" if len(names) == 1 else "need"
        parts.append(f"{who} {verb} {reason.removeprefix('needs ')}")
    return "; ".join(parts)


def cmd_compare(args: argparse.Namespace) -> int:
    import numpy as np

    from ._backends import available_backends

    ops = None if args.op is None else [op_name(o) for o in args.op]
    backends = _backend_names(args.backends if args.backends else available_backends())
    custom = any(getattr(args, r, None) is not None for r in SHAPE_OPTIONS)
    if not custom and attrs_of(args):
        msg = ("attribute options (--strides, --auto-pad...) need input shapes (--src, "
               "--weights...); without shapes 'polyconv compare' runs its built-in suite")
        raise UsageError(msg)
    if custom:
        jobs, skipped = _custom_jobs(args, ops)
        if not jobs:
            msg = f"no op accepts these shapes and attributes: {_why_not(skipped)}"
            raise UsageError(msg)
        for name, exc in skipped:
            print(f"polyconv compare: skipping {display_name(name)}: {_reason(name, exc)}",
                  file=sys.stderr)
    else:
        jobs = _suite_jobs(ops, bias=not args.no_bias)

    peers, absent_peers = peer_names(args.peers)
    args.peer_versions = {p.name: p.version for p in peers}
    peers = [p.name for p in peers]
    total = len(jobs) * len(args.dtypes)
    progress = _Progress(total, enabled=not args.quiet)
    comparisons: list[Comparison] = []
    t0 = time.perf_counter()
    try:
        for j, job in enumerate(jobs):
            for dtype in args.dtypes:
                progress.show(len(comparisons) + 1,
                              f"{display_name(job.name)} {job.label} {dtype}")
                rng = np.random.default_rng([args.seed, j])
                inputs = _make_inputs(job, dtype, rng)
                comparisons.append(compare(job.name, *inputs, backends=backends,
                                           label=job.label, peers=peers, **job.attrs))
    finally:
        progress.done()
    return _report(args, comparisons, backends, custom, time.perf_counter() - t0,
                   (peers, absent_peers))


def _peer_cell(results, dtypes: Sequence[str]) -> str:
    """One peer's verdict in each dtype: ``ok``, ``DIFF:ratio``, ``n/a`` (cannot express)
    or ``RAISES``; ``-`` where it did not run."""
    short = {"agrees": "ok", "cannot express": "n/a", "raises": "RAISES"}
    by_dtype = {}
    for dtype, r in results:
        by_dtype[dtype] = r
    out = []
    for d in dtypes:
        r = by_dtype.get(d)
        if r is None:
            out.append("-")
        elif r.status == "disagrees":
            out.append(f"DIFF:{r.max_ratio:.3g}")
        else:
            out.append(short[r.status])
    return " ".join(out)


def _peer_report(comparisons: list[Comparison], peers: Sequence[str],
                 absent: Sequence[Any], dtypes: Sequence[str]) -> list[str]:
    """The peers' table (one row per case), each finding once, and the absent peers."""
    lines = []
    ran = [c for c in comparisons if c.peers]
    if peers and ran:
        rows: dict[tuple[str, str], dict[str, list]] = {}
        for c in ran:
            row = rows.setdefault((c.op, c.label), {})
            for r in c.peers:
                row.setdefault(r.peer, []).append((c.dtype, r))
        table = [(display_name(op), label, *(_peer_cell(row.get(p, []), dtypes)
                                             for p in peers))
                 for (op, label), row in rows.items()]
        lines.append(f"peers, in {' '.join(dtypes)} (ok: within the bound; DIFF:err/bound "
                     f"beyond it; n/a: the peer cannot express the case; RAISES: it raised):")
        lines += format_table(("op", "geometry", *peers), table)
        findings, cannot, notes = [], {}, {}
        for c in ran:
            for r in c.peers:
                if r.status == "agrees" and r.detail:   # one line per peer and note
                    notes.setdefault((r.peer, r.detail), []).append(c)
                elif r.status == "cannot express":   # one line per peer and attribute
                    cannot.setdefault((r.peer, r.detail.split(":")[0]), []).append(r.detail)
                elif r.status != "agrees":
                    case = " ".join(filter(None, (display_name(c.op), c.label, c.dtype)))
                    findings.append(f"  {r.peer}, {case}: {r}")
        findings += [f"  {peer} cannot express {attribute} ({len(details)} cases), e.g. "
                     f"{details[0].split(': ', 1)[1]}"
                     for (peer, attribute), details in cannot.items()]
        if findings:
            lines += ["", "peer findings (about the peers, not polyconv):", *findings]
        if notes:
            lines += ["", "documented differences (the peer agrees, given the call in its own "
                          "convention):"]
            lines += [f"  {peer} ({len(cs)} cases), e.g. {display_name(cs[0].op)} "
                      f"{cs[0].label}: {note}" for (peer, note), cs in notes.items()]
        counts = []
        for p in peers:
            statuses = [r.status for c in ran for r in c.peers if r.peer == p]
            parts = [f"{statuses.count(s)} {s}" for s in
                     ("agrees", "disagrees", "raises", "cannot express") if s in statuses]
            counts.append(f"{p}: {', '.join(parts)}")
        lines += ["", "peers: " + "; ".join(counts)]
    elif peers:
        lines.append("peers: no Convolution or ConvTranspose ran, so no peer ran")
    lines += [f"peer not installed: {p.name} ({p.install})" for p in absent]
    return lines


def _report(args: argparse.Namespace, comparisons: list[Comparison], backends: list[str],
            custom: bool, seconds: float, peers: tuple[list[str], list] = ([], [])) -> int:
    """Print the comparisons (as JSON with ``--json``) and the verdict; the exit status
    (the backends' alone: a peer's disagreement is a finding about the peer)."""
    summary, ok = _summary(comparisons, backends, args.dtypes, seconds)
    absent = [] if args.backends else not_run(backends)
    if args.json:
        print(json.dumps({"ok": ok, "summary": summary[-1], "details": summary[:-1],
                          "not_run": absent, "seconds": seconds, "peers": peers[0],
                          "peer_versions": getattr(args, "peer_versions", {}),
                          "peers_not_installed": [{"peer": p.name, "install": p.install}
                                                  for p in peers[1]],
                          "backends": backends, "dtypes": list(args.dtypes),
                          "comparisons": [c.to_dict() for c in comparisons]}))
        return 0 if ok else 1
    peer_lines = _peer_report(comparisons, peers[0], peers[1], args.dtypes)
    if custom:
        for c in comparisons:
            print(c)
            print()
    else:
        print("\n".join(_suite_report(comparisons, backends, args.dtypes)))
        failed = [c for c in comparisons if not c.ok]
        if failed:
            print("\nfailures:")
            for c in failed:
                print(c)
                print()
        print()
    if peer_lines:
        print("\n".join(peer_lines))
        print()
    print("\n".join([*absent, *summary]))
    return 0 if ok else 1
