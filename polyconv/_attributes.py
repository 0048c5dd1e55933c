"""Attribute parsing: the user's keyword values as checked tuples of ints and canonical
strings, each refusal naming the op, the attribute, the rule and the value
(docs/semantics.md#validation)."""

from __future__ import annotations

import operator
from collections.abc import Sequence

AUTO_PADS = ("none", "same_upper", "same_lower", "valid")
_AUTO_PAD_ALIASES = {"none": "none", "explicit": "none", "notset": "none",
                     "same_upper": "same_upper", "same_lower": "same_lower", "valid": "valid"}
DATA_FORMATS = ("NXC", "NCX")
WEIGHTS_FORMATS = ("XIO", "OIX", "IOX", "XOI")
#: Layouts spelt with their spatial axes named, as PyTorch, TensorFlow and ONNX write them
#: (``NCHW``, ``NDHWC``, ``OIHW``, ``HWIO``, ...): each is the polyconv value with ``W``,
#: ``HW`` or ``DHW`` for its ``X``, and implies that many spatial axes
#: (docs/semantics.md#layout-spellings). Spelling -> (polyconv value, spatial axes).
LAYOUT_SPELLINGS = {fmt.replace("X", axes): (fmt, len(axes))
                    for fmt in (*DATA_FORMATS, *WEIGHTS_FORMATS) for axes in ("W", "HW", "DHW")}


def parse_int(op: str, name: str, value) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        msg = f"{op}: {name} must be an integer; got {name}={value!r} ({type(value).__name__})"
        raise TypeError(msg)
    return concrete(op, name, value, lambda: operator.index(value))


def concrete(op: str, name: str, value, convert):
    """``convert()``, with a clear error where ``value`` is traced (a JAX array under jit):
    geometry is resolved when the call is made, so it must be known then."""
    try:
        return convert()
    except TypeError as e:
        from ._backends import concretization_errors  # the backends name their errors

        if not isinstance(e, concretization_errors()):
            raise
        msg = (f"{op}: {name} must be concrete (known when the call is traced: under jax.jit, "
               f"a static argument or a Python value); got a traced value")
        raise TypeError(msg) from None


def parse_ints(op: str, name: str, value, ndim: int) -> tuple[int, ...]:
    """An int (broadcast) or a sequence of ``ndim`` ints."""
    if isinstance(value, (str, bytes)) or value is None:
        msg = (f"{op}: {name} must be an integer or a sequence of {ndim} integers; "
               f"got {name}={value!r}")
        raise TypeError(msg)
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple)):
        value = concrete(op, name, value, value.tolist)  # numpy/JAX/torch ints
        if not isinstance(value, list):
            value = [value] * ndim
    elif hasattr(value, "__index__") and not isinstance(value, bool):
        return (concrete(op, name, value, lambda: operator.index(value)),) * ndim
    if not isinstance(value, Sequence):
        msg = (f"{op}: {name} must be an integer or a sequence of {ndim} integers; "
               f"got {name}={value!r} ({type(value).__name__})")
        raise TypeError(msg)
    items = tuple(value)
    for item in items:
        if isinstance(item, bool) or not hasattr(item, "__index__"):
            msg = (f"{op}: {name} must contain integers only; got {name}={items!r}")
            raise TypeError(msg)
    items = concrete(op, name, value, lambda: tuple(operator.index(i) for i in items))
    if len(items) != ndim:
        msg = (f"{op}: {name} must have one entry per spatial axis ({ndim}, from the data "
               f"rank); got {name}={items!r} with {len(items)} entries")
        raise ValueError(msg)
    return items


def _is_empty(value) -> bool:
    if isinstance(value, (list, tuple)):
        return not value
    return not isinstance(value, (str, bytes)) and getattr(value, "shape", None) == (0,)


def parse_pads(op: str, name: str, value, ndim: int, auto_pad: str) -> tuple[int, ...]:
    """``pads_begin``/``pads_end``: as :func:`parse_ints`, and empty where ``auto_pad``
    computes the pads (oneDNN's own calls pass ``[]`` with ``auto_pad="SAME_UPPER"``)."""
    if _is_empty(value):
        if auto_pad != "none":
            return (0,) * ndim
        msg = (f"{op}: {name} must have one entry per spatial axis ({ndim}, from the data "
               f"rank); got {name}=() with 0 entries (empty pads are accepted only where "
               f"auto_pad computes them: 'same_upper', 'same_lower' or 'valid')")
        raise ValueError(msg)
    return parse_ints(op, name, value, ndim)


def check_min(op: str, name: str, values: tuple[int, ...], lo: int) -> None:
    if any(v < lo for v in values):
        rule = "positive" if lo == 1 else "non-negative"
        msg = f"{op}: {name} must be {rule} (>= {lo}) per axis; got {name}={values!r}"
        raise ValueError(msg)


#: ``precision`` names (case-insensitive) -> the ``jax.lax.Precision`` member each means
PRECISION_NAMES = {
    "default": "DEFAULT", "fastest": "DEFAULT", "bfloat16": "DEFAULT",
    "high": "HIGH", "tensorfloat32": "HIGH", "bfloat16_3x": "HIGH",
    "highest": "HIGHEST", "float32": "HIGHEST",
}


def check_precision(op: str, precision) -> None:
    """``precision`` is None, a name of :data:`PRECISION_NAMES`, a ``jax.lax.Precision``, or a
    pair of these for (input, weights). Checked for every backend
    (docs/semantics.md#validation), though only
    backends with precision modes (JAX) use it: the others always compute at full precision.
    """
    def one(value) -> bool:
        if isinstance(value, str):
            return value.lower() in PRECISION_NAMES
        kind = type(value)
        return kind.__name__ == "Precision" and kind.__module__.startswith("jax")

    if precision is None:
        return
    pair = isinstance(precision, (tuple, list))
    if (all(one(p) for p in precision) and len(precision) == 2) if pair else one(precision):
        return
    msg = (f"{op}: precision must be None (full precision), a jax.lax.Precision, one of "
           f"{', '.join(map(repr, PRECISION_NAMES))} (case-insensitive), or a pair of "
           f"these for (input, weights); got precision={precision!r}")
    raise ValueError(msg)


def parse_choice(op: str, name: str, value, accepted: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        msg = (f"{op}: {name} must be a string, one of {', '.join(map(repr, accepted))}; "
               f"got {name}={value!r} ({type(value).__name__})")
        raise TypeError(msg)
    canon = value.upper()
    spelled = LAYOUT_SPELLINGS.get(canon)
    if spelled is not None and spelled[0] in accepted:
        return spelled[0]
    if canon not in accepted:
        named = [s for s, (fmt, _) in LAYOUT_SPELLINGS.items() if fmt in accepted]
        also = (f", or one of these with its spatial axes named: {', '.join(named)}"
                if named else "")
        msg = (f"{op}: unknown {name} {value!r}; accepted values are "
               f"{', '.join(map(repr, accepted))} (case-insensitive; X stands for the spatial "
               f"axes, any number of them){also}")
        raise ValueError(msg)
    return canon


def parse_auto_pad(op: str, value) -> str:
    if value is None:
        return "none"
    if not isinstance(value, str):
        msg = (f"{op}: auto_pad must be a string, one of {', '.join(map(repr, AUTO_PADS))}; "
               f"got auto_pad={value!r} ({type(value).__name__})")
        raise TypeError(msg)
    canon = _AUTO_PAD_ALIASES.get(value.lower())
    if canon is None:
        msg = (f"{op}: unknown auto_pad {value!r}; accepted values are "
               f"{', '.join(map(repr, AUTO_PADS))} (case-insensitive; 'explicit' = 'none')")
        raise ValueError(msg)
    return canon


def parse_shape(op: str, name: str, shape) -> tuple[int, ...]:
    try:
        dims = tuple(shape)
    except TypeError:
        msg = f"{op}: {name} must be a shape (a sequence of integers); got {shape!r}"
        raise TypeError(msg) from None
    for dim in dims:
        if isinstance(dim, bool) or not hasattr(dim, "__index__"):
            msg = f"{op}: {name} must be a shape (a sequence of integers); got {shape!r}"
            raise TypeError(msg)
    return concrete(op, name, shape, lambda: tuple(operator.index(d) for d in dims))
