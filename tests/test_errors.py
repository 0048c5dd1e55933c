"""The validation rules (docs/semantics.md#validation): every refused call raises the right type
with a message naming the op, the argument and the offending values, identically on every target
(validation runs before any backend); inputs are never modified; NaN and Inf are values, not errors.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from bad_calls import BAD_CALLS, BadCall
from cases import build_case
from conftest import require_dtype
from oracle import MAIN_OPS, assert_within_bound, reference

import polyconv

# A valid, moderately busy call of each op (see cases.build_case).
ROW = {"rank": 2, "kernel": 3, "strides": "mixed", "dilations": 1, "pads": "asym",
       "auto_pad": "none", "groups": "some", "data_format": "NXC", "weights_format": "default",
       "dtype": "float32", "spelling": "keyword", "bias": True, "output_padding": "max",
       "dst": None, "wshape": "full"}


def _dtype_name(x) -> str | None:
    return str(x.dtype) if isinstance(x, np.ndarray) else None


def _reference_message(bad: BadCall) -> str:
    """The message of the call on plain numpy arrays with no backend chosen."""
    with pytest.raises(bad.exc) as info:
        getattr(polyconv, bad.fn)(*bad.inputs, *bad.positional, **bad.attrs)
    return str(info.value)


@pytest.mark.parametrize("bad", BAD_CALLS, ids=lambda b: b.id)
def test_refused_identically_on_every_target(target, bad: BadCall):
    for x in bad.inputs:
        if _dtype_name(x) in ("float16", "bfloat16"):
            require_dtype(target, _dtype_name(x))
    inputs = [target.asarray(x) if isinstance(x, np.ndarray) else x for x in bad.inputs]
    fn = getattr(polyconv, bad.fn)
    with pytest.raises(bad.exc) as info:
        fn(*inputs, *bad.positional, backend=target.backend, **bad.attrs)
    message = str(info.value)
    assert type(info.value) is bad.exc, f"{type(info.value).__name__}: {message}"
    assert re.search(bad.match, message, re.S), (
        f"message does not say what the validation rules ask for:\n  {message}\n"
        f"  pattern: {bad.match}")
    assert message == _reference_message(bad), "the message differs from the numpy one"


@pytest.mark.parametrize("fn", MAIN_OPS)
def test_unknown_backend(fn):
    call = build_case(fn, ROW, seed=1)
    arrays = call.arrays()
    with pytest.raises(ValueError, match=r"unknown backend 'no_such_backend'.*'numpy'"):
        getattr(polyconv, fn)(*arrays, *call.positional, backend="no_such_backend",
                              **call.attrs)


def _other_library(target):
    """Arrays of a library different from the target's: numpy, or jax for numpy targets."""
    if target.library != "numpy":
        return np.asarray
    jnp = pytest.importorskip("jax.numpy")
    return jnp.asarray


@pytest.mark.parametrize("fn", MAIN_OPS)
@pytest.mark.parametrize("forced", [False, True], ids=["inferred", "forced"])
def test_mixed_array_libraries(target, fn, forced):
    """Inputs from two array libraries: TypeError naming both types, even with backend=."""
    convert = _other_library(target)
    call = build_case(fn, ROW, seed=2)
    arrays = call.arrays()
    mine = target.asarray(arrays[0])
    other = convert(arrays[1])
    backend = {"backend": target.backend} if forced else {}
    with pytest.raises(TypeError) as info:
        getattr(polyconv, fn)(mine, other, *call.positional, **call.attrs, **backend)
    message = str(info.value)
    assert message.startswith(f"{fn}: ")
    for x in (mine, other):
        assert type(x).__qualname__ in message, message
        assert type(x).__module__.split(".")[0] in message, message


# --------------------------------------------------------------------------------------------
# inputs are never modified; NaN and Inf propagate
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn", MAIN_OPS)
def test_inputs_are_not_modified(target, fn):
    call = build_case(fn, ROW, seed=3)
    arrays = call.arrays()
    before = [a.copy() for a in arrays]
    inputs = [target.asarray(a) for a in arrays]
    if target.library == "numpy":
        for x in inputs:
            x.setflags(write=False)     # writing into an input would raise
    y = getattr(polyconv, fn)(*inputs, *call.positional, backend=target.backend, **call.attrs)
    for x, original in zip(inputs, before):
        np.testing.assert_array_equal(target.to_numpy(x), original.astype(np.float64))
    ref = call.expected(arrays)
    assert_within_bound(target.to_numpy(y), ref.y, ref.abs_sum, ref.n, call.dtype)


def _dependents(call, arrays, which: int, index) -> np.ndarray:
    """Output elements that depend on ``arrays[which][index]``: the oracle on an indicator
    in that input and all-positive other inputs (no cancellation), nonzero where it matters."""
    probe = [np.abs(a) + 1 for a in arrays]
    probe[which] = np.zeros_like(arrays[which])
    probe[which][index] = 1
    if len(probe) == 3 and which != 2:
        probe[2] = np.zeros_like(arrays[2])          # the bias depends on nothing
    return call.expected(probe).y != 0


# Which input to poison: the large tensor ``a`` wherever it is an input, and the small tensor
# ``b`` of the backward_data ops (where it only ever meets weights).
POISONED = [("convolution", 0), ("convolution_backward_data", 0),
            ("convolution_backward_weights", 0), ("conv_transpose", 0),
            ("conv_transpose_backward_data", 0), ("conv_transpose_backward_weights", 1)]


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize(("fn", "which"), POISONED)
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_propagate(target, fn, which, value):
    """One poisoned element of a data input: the outputs that read it are NaN (or not finite,
    for an infinity), every other output is exactly what it was.

    Weights, and ``b`` in the backward_weights ops, are not poisoned: they also meet the
    implicit zeros of the padding, and whether that is a product ``0 * inf = nan``
    (the canonical convolution's
    "out-of-range a reads as 0", taken literally) or no product at all, the contract leaves
    open (docs/numerics.md#nan-and-inf).
    """
    call = build_case(fn, {**ROW, "dtype": "float64" if np.isnan(value) else "float32"},
                      seed=4)
    arrays = call.arrays()
    index = tuple(s // 2 for s in arrays[which].shape)
    poisoned = [a.copy() for a in arrays]
    poisoned[which][index] = value
    hit = _dependents(call, arrays, which, index)
    assert hit.any() and not hit.all(), "choose a position that some outputs do not read"
    y = target.to_numpy(getattr(polyconv, fn)(*[target.asarray(a) for a in poisoned],
                                              *call.positional, backend=target.backend,
                                              **call.attrs))
    if np.isnan(value):
        np.testing.assert_array_equal(np.isnan(y), hit)
    else:
        np.testing.assert_array_equal(~np.isfinite(y), hit)
    # Outputs that do not read the poisoned element are exact as ever.
    clean = [a.copy() for a in arrays]
    clean[which][index] = 0
    ref = reference(call.fn, *clean, **call.oracle_attrs)
    assert_within_bound(np.where(hit, ref.y, y), ref.y, ref.abs_sum, ref.n, call.dtype)
