"""The README's Python example runs, and the results its comments show are the real ones."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np

import polyconv

ROOT = Path(__file__).resolve().parent.parent


def _readme_block() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.search(r"```python\n(.*?)```", text, re.S).group(1)


def test_readme_example_shows_its_results():
    source = _readme_block()
    lines = source.splitlines()
    namespace: dict = {}
    shown = []
    for stmt in ast.parse(source).body:
        code = ast.get_source_segment(source, stmt)
        last = lines[stmt.end_lineno - 1]
        after = lines[stmt.end_lineno] if stmt.end_lineno < len(lines) else ""
        if isinstance(stmt, ast.Expr):
            value = eval(compile(ast.Expression(stmt.value), "README", "eval"), namespace)
            # the result is shown on the comment line right after the expression
            assert after.startswith("# "), f"the README shows no result for:\n{code}"
            expected = after.removeprefix("# ")
            assert expected.endswith(", ...)")
            assert repr(value).startswith(expected.removesuffix("...)")), (repr(value), expected)
            shown.append(value)
            continue
        exec(compile(ast.Module([stmt], []), "README", "exec"), namespace)
        comment = re.search(r"#\s*(\([\d, ]+\))\s*$", last)
        if isinstance(stmt, ast.Assign) and comment:
            name = stmt.targets[0].id
            assert tuple(namespace[name].shape) == ast.literal_eval(comment.group(1)), name
    assert shown, "the README example shows an infer_shape result"
    # The infer_shape line describes the conv_transpose call above it.
    y, plan = namespace["y"], shown[-1]
    assert isinstance(plan, polyconv.ConvPlan)
    assert plan.shape == y.shape
    assert isinstance(y, np.ndarray)
