"""Dispatch of one call: its arrays checked, its plan resolved, its backend picked.

A call's outcome depends only on its op, its arrays' types, dtypes and shapes and its other
arguments, so the first call with given values does the work (:func:`_dispatch`) and later
ones with equal values look it up (:func:`_call`): the checks and the plan cost more than a
small convolution on a fast backend.
"""

from __future__ import annotations

import dataclasses
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


#: a call's dispatch key (see :func:`_dispatch_key`) -> its backend's name, plan and the input
#: whose array type the result takes; filled by calls that passed every check. The backend is
#: looked up by name at each call, so that registering another under the name takes effect.
_DISPATCH: dict[tuple, tuple[str, ConvPlan, str]] = {}
_DISPATCH_SIZE = 4096


def _dispatch_key(spec: OpSpec, arguments: dict[str, Any]) -> tuple | None:
    """What dispatch depends on: the op, each array input's type, dtype, shape and (torch)
    layout, and the other arguments, where those are all plain values (:func:`_plain`); else
    ``None`` (the call is checked and resolved in full). Equal keys pass the same checks and
    get the same plan, so a repeated call skips them (they cost more than a small convolution
    on a fast backend)."""
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


def _call(spec: OpSpec, arguments: dict[str, Any]) -> Any:
    """Run op ``spec`` on its bound arguments: check the arrays, resolve the plan, pick the
    backend (once per dispatch key), run its primitive."""
    arguments = _jax_arrays(arguments)
    key = _dispatch_key(spec, arguments)
    try:
        found = None if key is None else _DISPATCH.get(key)
    except TypeError:            # an array type whose dtype or shape does not hash
        key = found = None
    if found is None:
        found = _dispatch(spec, arguments)
        if key is not None:
            if len(_DISPATCH) >= _DISPATCH_SIZE:
                _DISPATCH.clear()
            _DISPATCH[key] = found
    backend, plan, like = found
    primitive = getattr(get_backend(backend, spec.name), plan.primitive)
    out = primitive(plan, *(arguments[name] for name in spec.arrays))
    return restore_type(out, arguments[like])
