"""Benchmarks (not tests): ``polyconv bench [FLAG] [options]``, one harness for all of them.

Each benchmark is a module with a ``main(argv)``, run by its flag (:data:`BENCHMARKS`; no
flag: the suite). They share :mod:`~polyconv.benchmarks.harness` (competitors, the timing
loop, the machine, the records), :mod:`~polyconv.benchmarks.peers` (PyTorch and the
hand-written ``lax`` call, defined once) and :mod:`~polyconv.benchmarks.report` (tables and
plots, also drawn by the docs build from the records). They use polyconv's public interface
only, and nothing here is imported by ``import polyconv``.
"""

from __future__ import annotations

import importlib
import sys

#: ``polyconv bench FLAG``: the module that runs it, and what it measures
BENCHMARKS: dict[str, tuple[str, str]] = {
    "--suite": ("suite", "synthetic cases of every op, every backend beside its peers "
                "(the default)"),
    "--corpus": ("corpus", "layers of real public models, forward and gradient, against "
                 "PyTorch and plain lax (--device gpu on a CUDA GPU)"),
    "--first-calls": ("first_call", "what a plan costs the first time it runs, against lax"),
    "--implementations": ("implementations", "every implementation of every backend forced "
                          "on the corpus's layers"),
    "--policy-check": ("policy_check", "each backend's default pick against recorded "
                       "measurements (no timing)"),
    "--overhead": ("overhead", "what polyconv adds around one call, beside each framework's "
                   "own call (tiny layers and a few corpus layers)"),
    "--spatial": ("spatial", "polyconv.spatially_sharded against XLA's own partitioning: a "
                  "3-D decoder level split over 2, 4 and 8 host devices"),
}


def machine_kind_here() -> str:
    """This machine's kind, as its records are named (a CUDA GPU if PyTorch sees one)."""
    from .harness import gpu_machine, machine, machine_kind

    m = machine()
    try:
        import torch

        if torch.cuda.is_available():
            m.update(gpu_machine())
    except ImportError:
        pass
    return machine_kind(m)


def main(argv: list[str] | None = None) -> int:
    """``polyconv bench``: the benchmark its first argument names (:data:`BENCHMARKS`), with
    the rest as its options; ``--machine-kind`` prints the kind this machine's records have."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--machine-kind"]:
        print(machine_kind_here())
        return 0
    module, rest = ((BENCHMARKS[argv[0]][0], argv[1:]) if argv and argv[0] in BENCHMARKS
                    else ("suite", argv))
    return importlib.import_module(f".{module}", __name__).main(rest)
