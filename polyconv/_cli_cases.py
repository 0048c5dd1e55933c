"""``polyconv cases export``: the built-in grid's Convolution and ConvTranspose cases written
for other runtimes' test harnesses, with expected outputs from the float64 reference (never
from a framework).

``--format onnx`` writes ONNX backend-test directories (``model.onnx`` and
``test_data_set_0/input_*.pb``, ``output_0.pb``: data ``NCX``, weights as ONNX's ``W``);
``--format npz`` writes one ``.npz`` per case with the inputs in polyconv's own layouts, the
attributes as JSON and the float64 reference.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from ._cli_args import UsageError, display_name, dtypes_arg
from ._cli_compare import _make_inputs, _suite_jobs
from ._compare import _jsonable, numpy_dtype, reference
from ._ops import infer_shape
from ._peers import FORWARD_OPS, CannotExpress, onnx_model, peer_operands

FORMATS = ("onnx", "npz")


def case_name(op: str, label: str, dtype: str) -> str:
    """A directory or file name of one case: ``test_polyconv_conv_transpose_1d_strided_...``."""
    slug = re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")
    return f"test_polyconv_{op}_{slug}_{dtype}"


def export_cases(directory: str | Path, fmt: str = "onnx",
                 dtypes: tuple[str, ...] = ("float32",), seed: int = 0
                 ) -> tuple[list[Path], list[tuple[str, str]]]:
    """Write the grid's forward cases under ``directory``; returns the paths written and the
    ``(case, why)`` left out (what the format cannot express)."""
    import numpy as np

    if fmt not in FORMATS:
        msg = f"cases export: --format must be one of {', '.join(FORMATS)}; got {fmt!r}"
        raise UsageError(msg)
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    written, skipped = [], []
    for j, job in enumerate(_suite_jobs(FORWARD_OPS, bias=True)):
        for dtype in dtypes:
            name = case_name(job.name, job.label, dtype)
            rng = np.random.default_rng([seed, j])   # the inputs 'polyconv compare' draws
            inputs = _make_inputs(job, dtype, rng)
            arrays = dict(zip(("src", "weights", "bias"), inputs))
            y64 = np.asarray(reference(job.name, *inputs, **job.attrs), np.float64)
            if fmt == "npz":
                path = root / f"{name}.npz"
                attrs = {"op": job.name, "label": job.label, "dtype": dtype,
                         **{k: _jsonable(v) for k, v in job.attrs.items()}}
                np.savez(path, **{k: np.asarray(v, np.float64) if dtype == "bfloat16" else v
                                  for k, v in arrays.items()},
                         reference=y64, attributes=np.array(json.dumps(attrs)))
                written.append(path)
                continue
            plan = infer_shape(job.name, *(a.shape for a in inputs),
                               **job.attrs).with_(dtype=dtype)
            try:
                model = onnx_model(plan, dtype, with_bias=True)
            except CannotExpress as exc:
                skipped.append((name, str(exc)))
                continue
            y = np.moveaxis(y64, -1, 1) if plan.channels_last else y64
            written.append(_write_onnx_case(root / name, model, peer_operands(plan, arrays),
                                            y.astype(numpy_dtype(dtype))))
    return written, skipped


def _write_onnx_case(path: Path, model: Any, inputs, output) -> Path:
    import onnx
    from onnx import numpy_helper

    data = path / "test_data_set_0"
    data.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path / "model.onnx"))
    names = [i.name for i in model.graph.input]
    for i, (name, array) in enumerate(zip(names, inputs)):
        (data / f"input_{i}.pb").write_bytes(
            numpy_helper.from_array(array, name).SerializeToString())
    (data / "output_0.pb").write_bytes(
        numpy_helper.from_array(output, model.graph.output[0].name).SerializeToString())
    return path


def add_cases_parser(sub: Any) -> None:
    """``polyconv cases export`` on the command's subparsers."""
    cs = sub.add_parser("cases", help="export the built-in cases for other runtimes' test "
                                      "harnesses ('polyconv cases export --help')",
                        description="The built-in Convolution and ConvTranspose cases, with "
                                    "expected outputs from the float64 reference.")
    cases_sub = cs.add_subparsers(dest="action", metavar="ACTION")
    cases_sub.required = True
    ex = cases_sub.add_parser(
        "export", help="write the cases as ONNX backend-test directories or .npz files",
        description="--format onnx: one ONNX backend-test directory per case (model.onnx, "
                    "test_data_set_0/input_*.pb, output_0.pb); --format npz: one .npz per "
                    "case (inputs, attributes as JSON, the float64 reference).")
    ex.add_argument("directory", metavar="DIR", help="where to write (created if absent)")
    ex.add_argument("--format", choices=("onnx", "npz"), default="onnx",
                    help="onnx (default) or npz")
    ex.add_argument("--dtypes", type=dtypes_arg, metavar="DTYPES", default=("float32",),
                    help="comma-separated (default: float32; ONNX has no bfloat16 Conv)")
    ex.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    ex.set_defaults(func=cmd_cases)


def cmd_cases(args: argparse.Namespace) -> int:
    """``polyconv cases export``."""
    written, skipped = export_cases(args.directory, args.format, args.dtypes, args.seed)
    for name, why in skipped:
        print(f"polyconv cases: not exported: {name}: {why}", file=sys.stderr)
    ops = " and ".join(display_name(o) for o in FORWARD_OPS)
    print(f"polyconv cases: wrote {len(written)} {ops} cases ({args.format}) to "
          f"{args.directory}")
    return 0
