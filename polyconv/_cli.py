"""The ``polyconv`` command: ``compare``, ``shape``, ``backends`` and ``cases``.

``polyconv compare`` with no arguments is the main job: every op of the family, over a suite of
representative geometries, on every available backend and dtype, checked against a float64
reference within the error bound of the numerical contract (:ref:`error-bound`; see
:func:`polyconv.compare`). It exits with status 1 if any
backend breaks the bound, 0 otherwise. Bad arguments give one ``polyconv: error: ...`` line on
stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from ._cli_args import (
    DEFAULT_DTYPES,
    SHAPE_OPTIONS,
    Parser,
    UsageError,
    add_attr_options,
    add_shape_options,
    as_flags,
    attrs_of,
    display_name,
    dtypes_arg,
    list_arg,
    op_name,
    shape_inputs,
)
from ._cli_cases import add_cases_parser
from ._cli_compare import cmd_compare
from ._compare import (
    format_table,
    trim,
)
from ._ops import infer_shape
from ._optable import spec


def _add_compare_parser(sub) -> None:
    """``polyconv compare``: its options."""
    c = sub.add_parser(
        "compare", help="check every backend against a float64 reference, within the "
                        "error bound of the docs page 'The numerical contract'",
        description="Run ops on every available backend and check each output element against "
                    "a float64 reference within |y - y_exact| <= eps(out)*|y_exact| + "
                    "n*eps(acc)*sum|a*w|. With no shapes: the built-in suite of geometries. "
                    "Exit status 1 if any backend breaks the bound.")
    c.add_argument("--op", type=list_arg, metavar="OPS",
                   help="op name(s), comma-separated (default: all six)")
    c.add_argument("--backends", type=list_arg, metavar="NAMES",
                   help="comma-separated backend names (default: every available one)")
    c.add_argument("--peers", type=list_arg, metavar="NAMES",
                   help="also run other frameworks' own operators (torch, onnxruntime, "
                        "onnx-reference, lax, openvino, tensorflow, keras, flax, all); their "
                        "findings keep exit status 0")
    c.add_argument("--dtypes", type=dtypes_arg, metavar="DTYPES",
                   default=DEFAULT_DTYPES, help="comma-separated (default: float32,float16,"
                                                "bfloat16; float64 is accepted too)")
    c.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    c.add_argument("--no-bias", action="store_true",
                   help="no bias for Convolution / ConvTranspose (default: with bias)")
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    add_shape_options(c, bias_shape=False)
    add_attr_options(c)
    c.set_defaults(func=cmd_compare)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="polyconv",
        description="The convolution family with one exact meaning on every array library.",
        epilog="Run 'polyconv compare' with no arguments for the built-in agreement suite.")
    from . import __version__

    parser.add_argument("--version", action="version", version=f"polyconv {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    _add_compare_parser(sub)

    s = sub.add_parser("shape", help="output shape and resolved pads of one op (no arrays)",
                       description="Shape inference (polyconv.infer_shape): the output shape "
                                   "and the resolved pads of one call, with the op's errors.")
    s.add_argument("op", metavar="OP", help="e.g. ConvTranspose, conv_transpose")
    s.add_argument("--json", action="store_true", help="print as JSON")
    add_shape_options(s, bias_shape=True)
    add_attr_options(s)
    s.set_defaults(func=cmd_shape)

    add_cases_parser(sub)

    b = sub.add_parser("backends", help="list the backends, their versions and devices",
                       description="Every registered backend: installed or not, versions of "
                                   "the libraries it needs, and devices (JAX).")
    b.add_argument("--json", action="store_true", help="print as JSON")
    b.set_defaults(func=cmd_backends)

    bench = sub.add_parser("bench", add_help=False,
                           help="benchmark polyconv side by side with PyTorch and lax "
                                "('polyconv bench --help' for options and the other "
                                "benchmarks: --corpus, --first-calls, ...)")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(func=cmd_bench)
    return parser


def cmd_bench(args: argparse.Namespace) -> int:
    """``polyconv bench [FLAG] ...``: the benchmark that ``polyconv.benchmarks.BENCHMARKS``
    names for its flag (the suite without one)."""
    from .benchmarks import main as bench_main

    return bench_main(args.bench_args)


# --------------------------------------------------------------------------------------------
# polyconv shape
# --------------------------------------------------------------------------------------------

def cmd_shape(args: argparse.Namespace) -> int:
    name = op_name(args.op)
    given = {r: getattr(args, r) for r in SHAPE_OPTIONS if getattr(args, r) is not None}
    shapes, attrs = shape_inputs(name, given, attrs_of(args))
    plan = infer_shape(name, *trim(list(shapes.values())), **attrs)
    info = {
        "op": display_name(name),
        "function": name,
        "output": spec(name).output,
        "shape": list(plan.shape),
        "pads_begin": list(plan.pads_begin),
        "pads_end": list(plan.pads_end),
        "output_padding": list(plan.output_padding),
        "strides": list(plan.strides),
        "dilations": list(plan.dilations),
        "groups": plan.groups,
        "kernel": list(plan.kernel),
        "data_format": plan.data_format,
        "weights_format": plan.weights_format,
        "weights_shape": list(plan.weights_shape),
        "primitive": plan.primitive,
    }
    if args.json:
        print(json.dumps(info))
        return 0
    print(f"{info['op']} ({name}): {info['output']} shape {plan.shape}")
    rows = [("pads_begin", plan.pads_begin), ("pads_end", plan.pads_end),
            ("output_padding", plan.output_padding), ("strides", plan.strides),
            ("dilations", plan.dilations), ("kernel", plan.kernel), ("groups", plan.groups),
            ("data_format", plan.data_format),
            ("weights", f"{plan.weights_shape} ({plan.weights_format})"),
            ("primitive", plan.primitive)]
    for key, value in rows:
        print(f"  {key:<15} {value}")
    return 0


# --------------------------------------------------------------------------------------------
# polyconv backends
# --------------------------------------------------------------------------------------------


def backend_info() -> list[dict[str, Any]]:
    """One dict per registered backend: name, available, module, description, versions,
    devices (each backend describes itself: :class:`polyconv.BackendHooks`)."""
    from ._backends import describe_backend, registered_backends

    return [describe_backend(name) for name in registered_backends()]


def cmd_backends(args: argparse.Namespace) -> int:
    info = backend_info()
    if args.json:
        print(json.dumps(info))
        return 0
    rows = [(b["name"], "yes" if b["available"] else "no", b["module"],
             ", ".join(f"{k} {v}" for k, v in b["versions"].items()) or "-",
             b["devices"] or "-") for b in info]
    for line in format_table(("backend", "available", "module", "versions", "devices"), rows):
        print(line)
    return 0


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return as_flags(text.removeprefix("polyconv: "))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``polyconv`` command; returns the exit status."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv[:1] == ["bench"]:  # its own parsers: every option goes to the benchmark
            return cmd_bench(argparse.Namespace(bench_args=argv[1:]))
        args = parser.parse_args(argv)
        return args.func(args)
    except (UsageError, ValueError, TypeError) as exc:
        print(f"polyconv: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("polyconv: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`polyconv compare | head`): stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
