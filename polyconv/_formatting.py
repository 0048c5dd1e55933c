"""Text and JSON formatting shared by :func:`polyconv.compare`, its peers and the command
line."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any


def format_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """Left-aligned columns, two spaces apart, with a rule under the header."""
    rows = [tuple(map(str, r)) for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(header)]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip()
    out = [line, "  ".join("-" * w for w in widths)]
    out.extend("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
    return out


def _num(x: float) -> str:
    if math.isnan(x):
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}"


def _shape_str(shape) -> str:
    return "-" if shape is None else "x".join(map(str, shape)) if shape else "()"


def _attr_str(v: Any) -> str:
    return _shape_str(v) if isinstance(v, tuple) else repr(v) if isinstance(v, str) else str(v)


def _sort_key(x: float) -> float:
    return math.inf if math.isnan(x) else x


def _json_float(x: float) -> float | str:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def _jsonable(v: Any) -> Any:
    if isinstance(v, (tuple, list)):
        return [_jsonable(i) for i in v]
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if hasattr(v, "tolist"):
        return v.tolist()
    return repr(v)
