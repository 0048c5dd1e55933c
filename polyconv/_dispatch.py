"""Dispatch of one call: its arrays checked, its plan resolved, its backend picked.

A call's outcome depends only on its op, its arrays' types, dtypes and shapes and its other
arguments, so the first call with given values does the work (:func:`_dispatch`) and later
ones with equal values look it up (:func:`_call`): the checks and the plan cost more than a
small convolution on a fast backend.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Callable
from typing import Any

from ._backends import (
    array_layout,
    backend_limits,
    check_arrays,
    check_one_library,
    get_backend,
    infer_backend,
    restore_type,
)
from ._geometry import Attrs, ConvPlan, check_precision, resolve
from ._layouts import check_spelled_ranks
from ._optable import OpSpec


def _alias(op: str, name: str, value, alias: str, alias_value):
    if alias_value is None:
        return value
    if value is not None:
        msg = f"{op}: pass either {name} or its alias {alias}, not both"
        raise TypeError(msg)
    return alias_value


#: the parameters that are arrays (the others are attributes, shapes and options)
_ARRAY_PARAMETERS = ("src", "diff_dst", "weights", "bias")
_ALIASES = (("dst_shape", "output_shape"), ("weights_shape", "filter_shape"),
            ("weights_format", "filter_format"))
_ATTRIBUTES = tuple(f.name for f in dataclasses.fields(Attrs))


def _prepare(spec: OpSpec, arguments: dict[str, Any]):
    """A call's bound arguments (arrays, or shapes for :func:`infer_shape`) as the inputs by
    name, the attributes and the two shape arguments, older-spec aliases merged."""
    args = dict(arguments)
    for name, alias in _ALIASES:
        args[name] = _alias(spec.name, name, args.get(name), alias, args.pop(alias, None))
    if args["weights_format"] is None:
        args["weights_format"] = spec.weights_format
    check_spelled_ranks(spec.name, args)
    inputs = {name: args.get(name) for name in _ARRAY_PARAMETERS}
    attrs = Attrs(**{key: args[key] for key in _ATTRIBUTES if key in args})
    return inputs, attrs, args["dst_shape"], args["weights_shape"]


def _plain(values: tuple) -> bool:
    """Every value an int, str or None, or a tuple of ints: values that hash and compare by
    value and type alike (``True == 1`` and ``1.0 == 1``, which validation tells apart, are
    not plain), so they may key :data:`_DISPATCH`. Flat loops: this runs on every call."""
    for value in values:
        kind = type(value)
        if kind is tuple:
            for item in value:
                if type(item) is not int:
                    return False
        elif kind is not int and kind is not str and value is not None:
            return False
    return True


#: a call's key (:func:`call_key` for a public op's own arguments, :func:`_dispatch_key` for
#: bound ones) -> ``(run, pick)``: the backend's primitive for the call's plan, specialised
#: (:func:`_runner`), and which of the caller's positional arguments are its arrays
#: (``None``: all of them, in order). Filled by calls that passed every check, cleared when
#: full.
_DISPATCH: dict[tuple, tuple[Callable[..., Any], Callable[[tuple], tuple] | None]] = {}
_DISPATCH_SIZE = 4096


def _remember(key: tuple | None, entry: tuple) -> None:
    if key is not None:
        if len(_DISPATCH) >= _DISPATCH_SIZE:
            _DISPATCH.clear()
        _DISPATCH[key] = entry


#: per array type: 0 plain, 1 a torch tensor (its ``layout`` is part of the key), 2 a type
#: whose instances may stand for a JAX array (``__jax_array__``: asked of each instance)
_KINDS: dict[type, int] = {}
_SCALARS = frozenset((int, str, type(None)))
_INTS = frozenset((int,))


def _kind(kind: type, x: Any) -> int:
    found = 2 if hasattr(kind, "__jax_array__") else int(array_layout(x) is not None)
    _KINDS[kind] = found
    return found


def _plain_value(value: Any) -> bool:
    kind = type(value)
    return kind in _SCALARS or (kind is tuple and _INTS.issuperset(map(type, value)))


def call_key(name: str, arrays: int, args: tuple, kwargs: dict[str, Any]) -> tuple | None:
    """The key of a public op's call from its own arguments (no binding to the signature):
    the op, each array's type, dtype, shape and (torch) layout, the other arguments by
    position and name, where those are plain values (as :func:`_plain`); else ``None``, and
    the call is checked in full: an array passed by keyword, or one that stands for a JAX
    array (``__jax_array__``, unwrapped first). ``arrays``: how many leading positional
    parameters are arrays. Flat code: this runs on every call."""
    values = kwargs.values()
    if not _SCALARS.issuperset(map(type, values)):     # tuples, or an array by keyword
        for value in values:
            if not _plain_value(value):
                return None
    key = [name]
    append = key.append
    try:
        for i, value in enumerate(args):
            if i >= arrays or value is None:
                if not _plain_value(value):
                    return None
                append(value)
                continue
            kind = type(value)
            found = _KINDS.get(kind)
            if found is None:
                found = _kind(kind, value)
            if found == 1:
                append((kind, value.dtype, value.shape, value.layout))
            elif found == 0 or value.__jax_array__ is None:  # 2: a tracer of its own value
                append((kind, value.dtype, value.shape))
            else:
                return None
    except AttributeError:                              # not an array: checked in full
        return None
    append(tuple(kwargs.items()))
    return tuple(key)


def _dispatch_key(spec: OpSpec, arguments: dict[str, Any]) -> tuple | None:
    """What dispatch depends on, for a call's bound arguments (the older-spec aliases, and
    public calls that pass an array by keyword): the op, each array input's type, dtype,
    shape and (torch) layout, and the other arguments, where those are all plain values
    (:func:`_plain`); else ``None`` (the call is checked and resolved in full)."""
    arrays, others = [], []
    for name, value in arguments.items():
        if name in _ARRAY_PARAMETERS:
            arrays.append(None if value is None else (
                type(value), getattr(value, "dtype", None), getattr(value, "shape", None),
                array_layout(value)))                      # torch's sparse tensors
        else:
            others.append(value)
    return (spec.name, *arrays, *others) if _plain(others) else None


def _dispatch(spec: OpSpec, arguments: dict[str, Any]) -> tuple[str, ConvPlan, str]:
    """Check the arrays, resolve the plan, pick the backend: ``(backend name, plan, name of
    the input whose array type the result takes)``."""
    op = spec.name
    inputs, attrs, dst_shape, weights_shape = _prepare(spec, arguments)
    present = {name: x for name, x in inputs.items() if x is not None}
    dtype = check_arrays(op, present)
    backend = arguments["backend"]
    if backend is None:
        backend = infer_backend(op, present)     # one array library, and its backend
    else:
        check_one_library(op, present)
    limits = backend_limits(get_backend(backend, op))   # known and installed
    shapes = {name: tuple(x.shape) for name, x in present.items()}
    precision = arguments["precision"]
    plan = resolve(spec, shapes, attrs, dst_shape=dst_shape, weights_shape=weights_shape,
                   limits=limits).with_(dtype=dtype)
    if precision is not None:
        plan = plan.with_(precision=precision)
    check_precision(op, precision)
    return backend, plan, next(iter(present))


def _jax_arrays(arguments: dict[str, Any]) -> dict[str, Any]:
    """Inputs that stand for a JAX array (``__jax_array__``: a Flax ``nnx.Param``, another
    framework's wrapper) as that array: they are accepted wherever a JAX array is."""
    unwrapped = {}
    for name in _ARRAY_PARAMETERS:
        # a JAX tracer's __jax_array__ is None unless its value stands for another's
        convert = getattr(arguments.get(name), "__jax_array__", None)
        if convert is not None:
            unwrapped[name] = convert()
    return {**arguments, **unwrapped} if unwrapped else arguments


def _runner(spec: OpSpec, arguments: dict[str, Any]) -> Callable[..., Any]:
    """The call of a checked op as a function of its arrays (``spec.arrays``, a trailing
    absent bias left out): the backend's primitive for the plan, specialised once (its
    ``specialize`` hook, see :class:`~polyconv.BackendHooks`)."""
    backend_name, plan, like = _dispatch(spec, arguments)
    backend = get_backend(backend_name, spec.name)
    specialize = getattr(backend, "specialize", None)
    run = (specialize(plan) if specialize is not None
           else functools.partial(getattr(backend, plan.primitive), plan))
    if arguments["backend"] is None:
        return run    # the backend of the inputs' library returns arrays of that library
    slot = spec.arrays.index(like)

    def forced(*arrays):
        return restore_type(run(*arrays), arrays[slot])

    return forced


def _call(spec: OpSpec, arguments: dict[str, Any]) -> Any:
    """Run op ``spec`` on its bound arguments (the older-spec aliases, and public calls with
    an array passed by keyword): checked and resolved once per dispatch key."""
    arguments = _jax_arrays(arguments)
    key = _dispatch_key(spec, arguments)
    try:
        entry = None if key is None else _DISPATCH.get(key)
    except TypeError:            # an array type whose dtype or shape does not hash
        key = entry = None
    if entry is None:
        entry = (_runner(spec, arguments), None)
        _remember(key, entry)
    return entry[0](*(arguments[name] for name in spec.arrays))


def call_fast(spec: OpSpec, key: tuple | None, args: tuple, arguments: dict[str, Any]) -> Any:
    """Run a public op called with positional ``args`` (bound with its keywords:
    ``arguments``), whose :func:`call_key` is ``key``: later calls with this key take the
    arrays from their own positional arguments, unbound (``_ops``)."""
    if key is None:
        return _call(spec, arguments)
    positions = {name: i for i, name in enumerate(arguments) if i < len(args)}
    where = [positions.get(name) for name in spec.arrays]
    while where[-1] is None:         # an absent bias: the primitive's default
        where.pop()
    run = _runner(spec, arguments)
    pick = None if where == list(range(len(args))) else operator.itemgetter(*where)
    _remember(key, (run, pick))
    return run(*args) if pick is None else run(*pick(args))
