"""Cross-backend comparison: one op, every backend, one float64 reference, one error bound.

The bound is the numerical contract's (docs/numerics.md#error-bound).

:func:`compare` runs one op on several backends with the same (numpy) inputs and checks every
output element against a float64 evaluation of the same op on the same input values::

    |y - y_exact| <= eps(out_dtype) * |y_exact| + n * eps(acc_dtype) * sum|a*w|

``y_exact`` is the numpy backend in float64 on float64 copies of the inputs (whose own error is
about ``n * 2**-53 * sum|a*w|``, far below the bound of any dtype under test). ``sum|a*w|`` is
the same op in float64 on ``|inputs|`` (bias as ``|bias|``), and ``n`` the same op on all-ones
inputs: for each output element, the number of terms of its sum (products, plus one for bias),
an upper bound of the number of roundings the accumulation may make.

The module imports no array library other than numpy; a backend's library is imported only
when that backend runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ._backends import backend_samples, check_arrays, dtype_name, get_backend
from ._formatting import (
    _attr_str,
    _json_float,
    _jsonable,
    _num,
    _shape_str,
    _sort_key,
    format_table,
)
from ._ops import infer_shape
from ._optable import lookup
from ._peers import PEER_OPS, CannotExpress, Peer, PeerResult, peer_names, peer_output

__all__ = ["BackendResult", "Comparison", "compare"]

#: Where a verdict sends the reader for the bound: the documentation page that states it.
BOUND = 'the error bound of the docs page "The numerical contract"'

_SHAPE_ROLES = frozenset({"dst_shape", "weights_shape"})


# --------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BackendResult:
    """How one backend did on one :func:`compare` call.

    Attributes
    ----------
    backend : str
        The polyconv backend name.
    library : str
        The array library its inputs were given in (``"numpy"``, ``"jax.numpy"``,
        ``"array_api_strict"``...).
    shape : tuple of int or None
        Shape of its output (``None`` if it raised).
    dtype : str or None
        dtype name of its output.
    max_abs_error : float
        ``max |y - y_exact|`` over the output (``nan`` if it raised).
    max_ratio : float
        ``max |y - y_exact| / bound`` over the output: at most 1 means within the
        error bound (:ref:`error-bound`).
        ``inf`` where an element differs but its bound is 0, or where NaN/Inf disagree.
    ok : bool
        Right shape, right dtype and ``max_ratio <= 1``.
    seconds : float
        Wall time of a warm call: the second call with the same inputs, after one untimed
        first call, including the transfer of the result to numpy (so that asynchronous
        backends have finished). Compilation (JAX) is not in it; its output is the one checked.
    error : str or None
        ``"ExceptionType: message"`` if the backend raised.
    note : str or None
        What was wrong besides the values (a wrong output shape or dtype).
    first_seconds : float
        Wall time of the first call, which for JAX includes tracing and compiling the shape.
    """

    backend: str
    library: str
    shape: tuple[int, ...] | None
    dtype: str | None
    max_abs_error: float
    max_ratio: float
    ok: bool
    seconds: float
    error: str | None = None
    note: str | None = None
    first_seconds: float = 0.0

    @property
    def status(self) -> str:
        """``"ok"``, ``"FAIL"`` (outside the bound, wrong shape or dtype) or ``"ERROR"``."""
        if self.error is not None:
            return "ERROR"
        return "ok" if self.ok else "FAIL"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (non-finite floats become strings)."""
        out = asdict(self)
        out["shape"] = None if self.shape is None else list(self.shape)
        out["status"] = self.status
        for key in ("max_abs_error", "max_ratio"):
            out[key] = _json_float(out[key])
        return out


@dataclass(frozen=True)
class Comparison:
    """The result of :func:`compare`: one op, one input set, one row per backend.

    ``str(comparison)`` is a table; ``comparison.ok`` is ``True`` when every backend met the
    bound; ``comparison.to_dict()`` is the same data for JSON.

    Attributes
    ----------
    op : str
        The polyconv function name (``"conv_transpose"``...).
    dtype : str
        The inputs' dtype.
    shape : tuple of int
        The output shape every backend must produce (from :func:`~polyconv.infer_shape`).
    pads_begin, pads_end : tuple of int
        The resolved pads.
    input_shapes : dict
        Shape of each positional input, by argument name.
    attrs : dict
        The keyword attributes of the call.
    results : tuple of BackendResult
    label : str
        A free-form name of the case (used by the ``polyconv compare`` suite).
    """

    op: str
    dtype: str
    shape: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    input_shapes: dict[str, tuple[int, ...] | None]
    attrs: dict[str, Any]
    results: tuple[BackendResult, ...]
    label: str = ""
    reference_seconds: float = field(default=0.0, compare=False)
    peers: tuple[PeerResult, ...] = ()

    @property
    def ok(self) -> bool:
        """``True`` when at least one backend ran and every backend met the bound."""
        return bool(self.results) and all(r.ok for r in self.results)

    @property
    def worst(self) -> BackendResult | None:
        """The result with the largest error/bound ratio (errors first)."""
        if not self.results:
            return None
        return max(self.results, key=lambda r: (not r.ok, _sort_key(r.max_ratio)))

    def describe(self) -> str:
        """One line: op, inputs, attributes and the output shape."""
        shapes = ", ".join(f"{k}={_shape_str(v)}" for k, v in self.input_shapes.items()
                           if v is not None)
        attrs = ", ".join(f"{k}={_attr_str(v)}" for k, v in self.attrs.items())
        head = f"{self.label}: " if self.label else ""
        return (f"{head}{self.op}({shapes}{', ' if attrs else ''}{attrs}) {self.dtype} -> "
                f"{_shape_str(self.shape)}, pads_begin={_shape_str(self.pads_begin)}, "
                f"pads_end={_shape_str(self.pads_end)}")

    def __str__(self) -> str:
        header = ("backend", "arrays", "shape", "dtype", "max abs err", "err/bound",
                  "first call", "run (warm)", "status")
        rows = []
        for r in self.results:
            ratio = "-" if r.error else _num(r.max_ratio)
            first = f"{r.first_seconds * 1e3:.1f} ms" if r.first_seconds else "-"
            warm = "-" if r.error else f"{r.seconds * 1e3:.1f} ms"
            rows.append((r.backend, r.library, _shape_str(r.shape), r.dtype or "-",
                         _num(r.max_abs_error), ratio, first, warm, r.status))
        lines = [self.describe(), *format_table(header, rows)]
        lines.extend(f"  {r.backend}: {r.error or r.note}" for r in self.results
                     if r.error or r.note)
        if self.results:
            lines.append("first call: includes compilation (JAX); run (warm): the same call "
                         "again, the output checked")
        lines.extend(f"  peer {p.peer}: {p}" for p in self.peers)
        verdict = (f"all backends within {BOUND}" if self.ok
                   else "FAILED: " + ", ".join(r.backend for r in self.results if not r.ok)
                   if self.results else "no backend ran")
        lines.append(verdict)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return {
            "label": self.label,
            "op": self.op,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "pads_begin": list(self.pads_begin),
            "pads_end": list(self.pads_end),
            "input_shapes": {k: None if v is None else list(v)
                             for k, v in self.input_shapes.items()},
            "attrs": {k: _jsonable(v) for k, v in self.attrs.items()},
            "ok": self.ok,
            "results": [r.to_dict() for r in self.results],
            "peers": [p.to_dict() for p in self.peers],
        }


# --------------------------------------------------------------------------------------------
# compare
# --------------------------------------------------------------------------------------------


def _function(name: str) -> Callable[..., Any]:
    from . import _ops

    return getattr(_ops, name)


def compare(op: str | Callable[..., Any], *inputs: Any,
            backends: str | Sequence[str] | None = None, label: str = "",
            peers: str | Sequence[str | Peer] | None = None, **attrs: Any) -> Comparison:
    """Run one op on several backends and check each against a float64 reference.

    Parameters
    ----------
    op : str or callable
        A name from :data:`~polyconv.OPS` (``"ConvTranspose"``...), a polyconv function name
        (``"conv_transpose"``) or the function itself.
    *inputs : numpy array, shape or None
        The op's positional inputs, as for the op itself: numpy arrays of one floating dtype
        (``float32``, ``float16``, ``ml_dtypes.bfloat16``, ``float64``), ``None`` for an absent
        bias, and a tuple for ``dst_shape`` / ``weights_shape``. Each backend gets them in its
        own array library: ``jax.numpy`` for ``"jax"``; ``array_api_strict`` (when installed,
        for float32/float64) or numpy for ``"array_api"``; numpy for the others.
    backends : str or sequence of str, optional
        Backend names (a comma-separated string is accepted). Default: every available backend.
    label : str, optional
        A name for this case, shown in the report.
    peers : str or sequence of str, optional
        Other frameworks' own operators to check against the same reference and bound
        (``"torch"``, ``"onnxruntime"``, ``"onnx-reference"``, ``"lax"``, ``"openvino"``,
        ``"tensorflow"``, ``"keras"``, ``"flax"``, or ``"all"``), for Convolution and
        ConvTranspose; the outcome is in ``.peers`` and never changes
        ``.ok`` (a peer's disagreement is a finding about the peer). Peers not installed are
        left out.
    **attrs
        The op's keyword attributes (``strides``, ``auto_pad``, ``precision``...).

    Returns
    -------
    Comparison
        Prints as a table; ``.ok`` is ``True`` when every backend met the error bound
        (:ref:`error-bound`);
        ``.to_dict()`` for JSON.

    Raises
    ------
    ValueError, TypeError
        For an invalid call (the op's own messages), an unknown backend, or a requested
        backend that is not installed. A backend that raises *while running* does not raise
        here: it is reported as an ``ERROR`` row.

    Examples
    --------
    >>> import numpy as np, polyconv
    >>> rng = np.random.default_rng(0)
    >>> x = rng.standard_normal((1, 5, 5, 4)).astype(np.float32)
    >>> w = rng.standard_normal((3, 3, 2, 4)).astype(np.float32)   # XOI: [K, K, OC/G, IC]
    >>> report = polyconv.compare("ConvTranspose", x, w, strides=2, auto_pad="same_upper",
    ...                           backends=["numpy"])
    >>> report.ok, report.shape
    (True, (1, 10, 10, 2))
    """
    op_spec = lookup(op)
    name, positional = op_spec.name, op_spec.positional
    fn = _function(name)
    if "backend" in attrs:
        msg = "compare: pass backends=[...], not backend="
        raise TypeError(msg)
    if len(inputs) > len(positional):
        msg = (f"{name}() takes at most {len(positional)} positional inputs "
               f"({', '.join(positional)}); got {len(inputs)}")
        raise TypeError(msg)
    names = _backend_names(backends)

    # ---- inputs: numpy arrays by role; shapes and None pass through ------------------------
    given = dict(zip(positional, inputs))
    arrays: dict[str, np.ndarray] = {}
    for role, x in given.items():
        if role in _SHAPE_ROLES or x is None:
            continue
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            msg = f"{name}: {role} must be an array; got {type(x).__name__}"
            raise TypeError(msg)
        arrays[role] = np.asarray(x)
    if not arrays:
        msg = f"{name}: no input arrays given (expected {', '.join(positional)})"
        raise TypeError(msg)
    dtype = check_arrays(name, arrays)

    def call_args(convert: Callable[[np.ndarray], Any]) -> list[Any]:
        """The op's positional arguments with every array passed through ``convert``."""
        return trim([convert(arrays[r]) if r in arrays else given.get(r) for r in positional])

    plan = infer_shape(fn, *call_args(lambda a: a.shape), **attrs)  # the op's own errors

    # ---- the float64 reference and the bound -----------------------------------------------
    ref_attrs = {k: v for k, v in attrs.items() if k != "precision"}
    t0 = time.perf_counter()
    y_exact = _numpy_f64(reference(fn, *call_args(lambda a: a), **ref_attrs))
    magnitude = _numpy_f64(fn(*call_args(lambda a: np.abs(a.astype(np.float64))),
                              backend="numpy", **ref_attrs))
    terms = _numpy_f64(fn(*call_args(lambda a: np.ones(a.shape, np.float64)),
                          backend="numpy", **ref_attrs))
    acc_dtype = plan.with_(dtype=dtype).acc_dtype
    bound = _eps(dtype) * np.abs(y_exact) + terms * _eps(acc_dtype) * magnitude
    ref_seconds = time.perf_counter() - t0

    # ---- every backend ---------------------------------------------------------------------
    results = []
    for backend in names:
        results.append(_run_backend(fn, backend, dtype, plan.shape, call_args, attrs,
                                    y_exact, bound))
    peer_results = tuple(run_peer(p, plan.with_(dtype=dtype), arrays, y_exact, bound, attrs)
                         for p in (peer_names(peers)[0] if name in PEER_OPS else ()))
    return Comparison(op=name, dtype=dtype, shape=plan.shape, pads_begin=plan.pads_begin,
                      pads_end=plan.pads_end,
                      input_shapes={r: tuple(arrays[r].shape) if r in arrays
                                    else None if v is None else tuple(v)
                                    for r, v in given.items()},
                      attrs=dict(attrs), results=tuple(results), label=label,
                      reference_seconds=ref_seconds, peers=peer_results)


def reference(op: str | Callable[..., Any], *inputs: Any, **attrs: Any) -> np.ndarray:
    """The float64 reference of one call: the numpy backend on float64 copies of the inputs
    (``precision`` is dropped: the reference has one)."""
    fn = _function(lookup(op).name)
    args = [x.astype(np.float64) if isinstance(x, np.ndarray) else x for x in inputs]
    attrs = {k: v for k, v in attrs.items() if k != "precision"}
    return fn(*args, backend="numpy", **attrs)


def trim(values: list[Any]) -> list[Any]:
    """Drop trailing ``None`` (absent optional inputs) from positional arguments."""
    while values and values[-1] is None:
        values.pop()
    return values


def _backend_names(backends: str | Sequence[str] | None) -> list[str]:
    from ._backends import available_backends

    if backends is None:
        return list(available_backends())
    if isinstance(backends, str):
        backends = [b.strip() for b in backends.split(",") if b.strip()]
    names = list(dict.fromkeys(backends))
    if not names:
        msg = "compare: backends must name at least one backend"
        raise ValueError(msg)
    for name in names:
        try:
            get_backend(name)
        except ImportError as exc:
            raise ValueError(str(exc)) from None
    return names


def _run_backend(fn, backend: str, dtype: str, shape: tuple[int, ...], call_args,
                 attrs: dict[str, Any], y_exact: np.ndarray, bound: np.ndarray) -> BackendResult:
    samples = backend_samples(backend, dtype)
    library, to_backend, context = samples.label, samples.asarray, samples.context
    to_numpy = samples.to_numpy or _numpy_f64

    def timed_call(args):
        t0 = time.perf_counter()
        y = fn(*args, backend=backend, **attrs)
        if hasattr(y, "block_until_ready"):
            y.block_until_ready()
        y_np = to_numpy(y)
        return y, y_np, time.perf_counter() - t0

    first = 0.0
    try:
        with context():
            args = call_args(to_backend)
            _, _, first = timed_call(args)  # JAX traces and compiles here
            y, y_np, seconds = timed_call(args)
            out_dtype = dtype_name(y)
    except Exception as exc:  # a backend failing is a result, not a crash
        return BackendResult(backend, library, None, None, math.nan, math.inf, False, 0.0,
                             f"{type(exc).__name__}: {exc}", first_seconds=first)
    out_shape = tuple(int(d) for d in y.shape)
    if out_shape != shape:
        return BackendResult(backend, library, out_shape, out_dtype, math.nan, math.inf, False,
                             seconds, note=f"wrong shape: expected {shape}, got {out_shape}",
                             first_seconds=first)
    err, ratio = _errors(y_np, y_exact, bound)
    ok = out_dtype == dtype and ratio <= 1.0
    note = None if out_dtype == dtype else f"wrong dtype: expected {dtype}, got {out_dtype}"
    return BackendResult(backend, library, out_shape, out_dtype, err, ratio, ok, seconds,
                         note=note, first_seconds=first)


def run_peer(peer: Peer, plan, arrays: dict[str, np.ndarray], y_exact: np.ndarray,
             bound: np.ndarray, attrs: dict[str, Any] | None = None) -> PeerResult:
    """``peer`` on one call (``arrays``: the op's inputs by role, in the call's layouts),
    checked against the call's float64 reference and bound."""
    try:
        y = peer_output(peer, plan, arrays)
    except CannotExpress as exc:
        return PeerResult(peer.name, "cannot express", detail=str(exc))
    except Exception as exc:  # the peer's own failure is a finding about the peer
        text = " ".join(str(exc).split())
        return PeerResult(peer.name, "raises", detail=f"{type(exc).__name__}: {text[:300]}")
    if y.shape != y_exact.shape:
        return PeerResult(peer.name, "disagrees", math.inf, math.inf,
                          detail=f"shape {y.shape}, expected {y_exact.shape}")
    err, ratio = _errors(y, y_exact, bound)
    if ratio <= 1.0:
        note = peer.convention(plan, attrs or {}) if peer.convention else ""
        return PeerResult(peer.name, "agrees", err, ratio, detail=note)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(y == y_exact, 0.0, np.abs(y - y_exact) / bound)
    r = np.where(np.isnan(r), np.inf, r)
    where = tuple(int(i) for i in np.unravel_index(int(np.argmax(r)), r.shape))
    return PeerResult(peer.name, "disagrees", err, ratio, where)


def _errors(y: np.ndarray, y_exact: np.ndarray, bound: np.ndarray) -> tuple[float, float]:
    """Max abs error and max error/bound; NaN and Inf must match the reference's exactly."""
    finite = np.isfinite(y_exact)
    special_ok = np.all((y[~finite] == y_exact[~finite])
                        | (np.isnan(y[~finite]) & np.isnan(y_exact[~finite])))
    diff = np.abs(y[finite] - y_exact[finite])
    if diff.size and not np.all(np.isfinite(diff)):
        return math.inf, math.inf
    if not special_ok:
        return (float(diff.max()) if diff.size else 0.0), math.inf
    if not diff.size:
        return 0.0, 0.0
    b = bound[finite]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(diff == 0, 0.0, diff / b)
    return float(diff.max()), float(ratio.max())


def _numpy_f64(y: Any) -> np.ndarray:
    """Any backend's array as a float64 numpy array."""
    if isinstance(y, np.ndarray):
        return y.astype(np.float64)
    return np.asarray(y).astype(np.float64)


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a dtype name (``bfloat16`` is ``ml_dtypes.bfloat16``)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _eps(dtype: str) -> float:
    if dtype == "bfloat16":
        import ml_dtypes

        return float(ml_dtypes.finfo(ml_dtypes.bfloat16).eps)
    return float(np.finfo(np.dtype(dtype)).eps)
