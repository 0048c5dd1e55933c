"""The house rules that keep the library readable, checked so that they stay true
(docs/architecture.md): no module of the library over 500 lines, no function over 60 lines of
code (its docstring aside), no import cycle among the modules of a package (function-level
imports included); ruff's McCabe limit of 15 is checked by the lint session."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted([*ROOT.glob("polyconv/*.py"), *ROOT.glob("polyconv/dialects/*.py"),
                  *ROOT.glob("backends/*/*.py")])
MAX_MODULE_LINES = 550    # "about 500": the op module's six signatures and docstrings
MAX_FUNCTION_LINES = 60


def _id(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", SOURCES, ids=_id)
def test_module_size(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, f"{_id(path)} has {lines} lines: split it by concern"


@pytest.mark.parametrize("path", SOURCES, ids=_id)
def test_function_size(path):
    long = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0]
            docstring = (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                         and isinstance(first.value.value, str))
            start = first.end_lineno + 1 if docstring and len(node.body) > 1 else first.lineno
            if node.end_lineno - start + 1 > MAX_FUNCTION_LINES:
                long.append(f"{node.name} (line {node.lineno}: {node.end_lineno - start + 1})")
    assert not long, f"{_id(path)}: functions over {MAX_FUNCTION_LINES} lines: {long}"


# --------------------------------------------------------------------------------------------
# no import cycle inside a package
# --------------------------------------------------------------------------------------------

PACKAGES = sorted([ROOT / "polyconv", ROOT / "polyconv" / "benchmarks",
                   *(p for p in ROOT.glob("backends/*") if p.is_dir())])


def _imports(package: Path, path: Path) -> set[str]:
    """The modules of ``package`` that ``path`` imports anywhere in it, function bodies
    included (an import deferred to call time still ties the two modules together)."""
    name = package.name
    here = path.relative_to(package).with_suffix("").parts
    modules = {p.stem for p in package.glob("*.py")}
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == name and len(parts) > 1:
                    out.add(parts[1])
        elif isinstance(node, ast.ImportFrom):
            if node.level > len(here) or (node.level == 0 and node.module
                                          and node.module.split(".")[0] != name):
                continue
            parts = (node.module or "").split(".")
            rest = parts[1:] if node.level == 0 else parts if node.module else []
            if rest and rest[0] in modules:
                out.add(rest[0])
            elif not rest:          # ``from . import x``: x a module, or a name of __init__
                out |= {a.name if a.name in modules else "__init__" for a in node.names}
            else:
                out.add("__init__")
    out.discard(path.stem)
    return out


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[m, .., m]``, or ``None``."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    return next((c for n in sorted(graph) if n not in state and (c := visit(n))), None)


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_no_import_cycle(package):
    """The modules of one package import each other in layers (the JAX backend: ``_xla`` at
    the bottom, its families above, the chooser on top); a module that needs one above it
    takes it as a parameter instead."""
    graph = {p.stem: _imports(package, p) for p in package.glob("*.py")}
    cycle = _cycle(graph)
    assert cycle is None, f"{package.name}: import cycle {' -> '.join(cycle)}"


# --------------------------------------------------------------------------------------------
# the benchmarks ask through public names only
# --------------------------------------------------------------------------------------------

BENCHMARKS = sorted((ROOT / "polyconv" / "benchmarks").glob("*.py"))


def _private_uses(tree: ast.AST) -> list[str]:
    """Private names of polyconv or a backend that ``tree`` imports, reads as attributes or
    names in a string (``sys.modules["polyconv._x"]``)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0].startswith("polyconv") and (
                    any(p.startswith("_") for p in parts)
                    or any(a.name.startswith("_") for a in node.names)):
                found.append(f"line {node.lineno}: from {node.module} import "
                             + ", ".join(a.name for a in node.names))
        elif isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names
                      if a.name.startswith("polyconv")
                      and any(p.startswith("_") for p in a.name.split("."))]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id.startswith("polyconv") and node.attr.startswith("_")
              and not node.attr.endswith("__")):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and any(word.split(".")[0].startswith("polyconv") and "._" in word
                      for word in node.value.split())):
            found.append(f"line {node.lineno}: {node.value!r}")
    return found


@pytest.mark.parametrize("path", BENCHMARKS, ids=_id)
def test_benchmarks_use_public_names_only(path):
    """Benchmark code (docs/architecture.md: why ``polyconv bench`` is in the wheel) asks the
    library and its backends through public, documented interfaces only: what it needs of the
    choice among implementations is ``polyconv.implementations``,
    ``polyconv.default_implementation``, ``polyconv.chosen`` and ``polyconv.measured``."""
    private = _private_uses(ast.parse(path.read_text(encoding="utf-8")))
    assert not private, f"{_id(path)} uses private names: {private}"


def test_the_private_names_check_sees_every_form():
    code = ("from polyconv._choice import _CHOOSERS\nfrom polyconv_jax import _policy\n"
            "import polyconv._compare\nx = polyconv._malloc\n"
            "m = sys.modules.get('polyconv._malloc')\n"
            "from polyconv import infer_shape\nimport polyconv.benchmarks\n")
    assert len(_private_uses(ast.parse(code))) == 5
