"""Checks specific to the generic array-API backend (``backends/polyconv_array_api``).

The shared matrix already runs this backend on every ``array_api-*`` target; this file checks
what only this backend promises: the result keeps the input's namespace, device and dtype (also
on array-api-strict's extra devices, where mixing devices is an error), it works on immutable
arrays inside ``jax.jit``, dispatch picks it for array libraries with no dedicated backend and
refuses unknown or mixed array types, and its values agree with the numpy backend within the
error bound (docs/numerics.md#error-bound).
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
import subprocess
import sys
from collections.abc import Iterator

import numpy as np
import pytest
from conftest import TARGETS, Target, backend_targets, use_target
from oracle import numpy_dtype

import polyconv
from polyconv._backends import infer_backend

array_api_compat = pytest.importorskip("array_api_compat")

EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}


# --------------------------------------------------------------------------------------------
# array libraries: the shared matrix's array_api-* targets (tests/conftest.py)
# --------------------------------------------------------------------------------------------


@pytest.fixture(params=backend_targets("array_api"), ids=lambda t: getattr(t, "name", None))
def lib(request) -> Iterator[Target]:
    """The generic backend's targets selected in this run: array-api-strict, numpy,
    jax.numpy and torch arrays."""
    with use_target(request.param) as t:
        yield t


def _target(name: str) -> Target:
    return next(t for t in TARGETS if t.name == name)


# --------------------------------------------------------------------------------------------
# representative cases: (id, function, input shapes, attributes); one or two per op
# --------------------------------------------------------------------------------------------

_C2 = dict(strides=(2, 1), dilations=(1, 2), pads_begin=(1, 0), pads_end=(0, 2), groups=2)
_T2 = dict(strides=2, pads_begin=1, pads_end=1, output_padding=(1, 0), groups=2)

CASES = [
    # Convolution 2-D NXC/XIO, grouped, strided, dilated, asymmetric pads, bias
    ("conv-2d", polyconv.convolution, [(2, 7, 6, 4), (3, 2, 2, 6), (6,)], _C2),
    # Convolution 1-D NCX/OIX, same_upper with stride 3
    ("conv-1d", polyconv.convolution, [(2, 3, 10), (4, 3, 3), (4,)],
     dict(strides=3, auto_pad="same_upper", data_format="NCX", weights_format="OIX")),
    ("conv_bwd_data-dst_shape", polyconv.convolution_backward_data,
     [(2, 3, 6, 6), (3, 2, 2, 6)], dict(_C2, dst_shape=(7, 6))),
    ("conv_bwd_data-opad", polyconv.convolution_backward_data, [(2, 4, 5), (4, 2, 3)],
     dict(strides=2, pads_begin=1, output_padding=1, data_format="NCX",
          weights_format="OIX")),
    ("conv_bwd_weights", polyconv.convolution_backward_weights, [(2, 7, 6, 4), (2, 3, 6, 6)],
     dict(_C2, weights_shape=(3, 2))),
    ("conv_bwd_weights-oix", polyconv.convolution_backward_weights, [(2, 3, 10), (2, 4, 4)],
     dict(strides=3, auto_pad="same_lower", data_format="NCX", weights_format="OIX",
          weights_shape=(4, 3, 3))),
    ("convT-2d", polyconv.conv_transpose, [(2, 4, 3, 4), (3, 3, 3, 4), (6,)], _T2),
    # ConvTranspose 3-D NCX/IOX (PyTorch's layout), same_lower
    ("convT-3d", polyconv.conv_transpose, [(1, 2, 2, 3, 2), (2, 3, 2, 2, 2), (3,)],
     dict(strides=(1, 2, 2), auto_pad="same_lower", data_format="NCX", weights_format="IOX")),
    ("convT_bwd_data", polyconv.conv_transpose_backward_data, [(2, 8, 5, 6), (3, 3, 3, 4)],
     _T2),
    ("convT_bwd_weights", polyconv.conv_transpose_backward_weights,
     [(2, 4, 3, 4), (2, 8, 5, 6)], dict(_T2, weights_shape=(3, 3))),
]
CASE_IDS = [c[0] for c in CASES]


def _inputs(shapes, dtype: str, seed: int = 0) -> list[np.ndarray]:
    """Random inputs rounded to ``dtype`` (as numpy arrays)."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(numpy_dtype(dtype)) for s in shapes]


def _numpy_backend_or_skip():
    try:
        return polyconv.get_backend("numpy")
    except (ImportError, AttributeError) as exc:
        pytest.skip(f"numpy backend not available for comparison: {exc}")


# --------------------------------------------------------------------------------------------
# namespace, device, dtype
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_keeps_namespace_device_dtype(lib, case):
    """Result in the input's namespace, on its device, in its dtype; inputs untouched; and in
    float64 the same values as on numpy arrays (the code path is namespace-independent)."""
    _, fn, shapes, attrs = case
    expect = polyconv.infer_shape(fn, *shapes, **attrs).shape
    for device in lib.devices(lib.xp):
        on_meta = str(device) == "meta"  # torch's shape-only device: no values to read
        for dtype in lib.smoke_dtypes:
            if dtype == "float64" and "float64" in str(device):
                continue
            raw = _inputs(shapes, dtype)
            args = [lib.asarray(x, device) for x in raw]
            out = fn(*args, backend="array_api", **attrs)
            first = args[0]
            assert array_api_compat.array_namespace(out) is array_api_compat.array_namespace(
                first)
            assert type(out) is type(first)
            assert array_api_compat.device(out) == array_api_compat.device(first)
            assert out.dtype == first.dtype
            assert tuple(out.shape) == expect
            if on_meta:
                continue
            for x, a in zip(raw, args):
                np.testing.assert_array_equal(lib.to_numpy(a), x.astype(np.float64))
            if dtype == "float64":
                ref = fn(*raw, backend="array_api", **attrs)
                np.testing.assert_allclose(lib.to_numpy(out), ref, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------------------------
# correctness on its own: brute force forward, dot-product identities, any rank
# --------------------------------------------------------------------------------------------


def _brute_forward(a, w, strides, dilations, pads_begin, groups):
    """The canonical convolution by loops over output positions; a NCX, w OIX."""
    n, ca = a.shape[:2]
    cb, k = w.shape[0], w.shape[2:]
    nd = len(k)
    b_sp = tuple((a.shape[2 + j] + pads_begin[j] + pads_begin[j] - ((k[j] - 1) * dilations[j]
                  + 1)) // strides[j] + 1 for j in range(nd))
    out = np.zeros((n, cb, *b_sp))
    cg, cbg = ca // groups, cb // groups
    for y in itertools.product(*map(range, b_sp)):
        for o in range(cb):
            g = o // cbg
            total = np.zeros(n)
            for kk in itertools.product(*map(range, k)):
                x = [y[j] * strides[j] + kk[j] * dilations[j] - pads_begin[j] for j in range(nd)]
                if all(0 <= x[j] < a.shape[2 + j] for j in range(nd)):
                    total += a[(slice(None), slice(g * cg, (g + 1) * cg), *x)] @ w[(o, slice(None),
                                                                                   *kk)]
            out[(slice(None), o, *y)] = total
    return out


@pytest.mark.parametrize("ndim", [1, 2, 3, 4])
def test_any_rank_forward_and_identities(ndim):
    """Rank 1..4: forward against loops, the two backward primitives by the
    adjoint identities (docs/semantics.md#canonical-convolution)."""
    rng = np.random.default_rng(ndim)
    strides = (2, 1, 3, 1)[:ndim]
    dilations = (1, 2, 1, 1)[:ndim]
    pads = (1, 0, 2, 1)[:ndim]
    a = rng.standard_normal((2, 4, *(5, 6, 4, 3)[:ndim]))
    w = rng.standard_normal((6, 2, *(3, 2, 2, 2)[:ndim]))
    attrs = dict(strides=strides, dilations=dilations, pads_begin=pads, pads_end=pads,
                 groups=2, data_format="NCX", weights_format="OIX", backend="array_api")
    b = polyconv.convolution(a, w, **attrs)
    np.testing.assert_allclose(b, _brute_forward(a, w, strides, dilations, pads, 2),
                               rtol=1e-12, atol=1e-12)
    g = rng.standard_normal(b.shape)
    da = polyconv.convolution_backward_data(g, w, a.shape, **attrs)
    dw = polyconv.convolution_backward_weights(a, g, w.shape, **attrs)
    inner = np.vdot(b, g)
    np.testing.assert_allclose(np.vdot(a, da), inner, rtol=1e-11)
    np.testing.assert_allclose(np.vdot(w, dw), inner, rtol=1e-11)


def test_bias_only_rows_and_stride_larger_than_kernel():
    """Phases no tap reaches (s > (K-1)*d + 1) and output_padding rows hold bias only."""
    x = np.ones((1, 3, 1), np.float32)
    w = np.ones((2, 1, 1), np.float32)       # XOI, K=2
    bias = np.full((1,), 0.5, np.float32)
    y = polyconv.conv_transpose(x, w, bias, strides=3, output_padding=2, backend="array_api")
    assert y.shape == (1, 3 * 2 + 2 + 2, 1)
    np.testing.assert_array_equal(y[0, :, 0], [1.5, 1.5, 0.5, 1.5, 1.5, 0.5, 1.5, 1.5, 0.5,
                                               0.5])


# --------------------------------------------------------------------------------------------
# agreement with the numpy backend within the error bound (docs/numerics.md#error-bound)
# --------------------------------------------------------------------------------------------


def _bound(fn, raw, attrs):
    """``(y_exact, eps-free bound terms)`` from float64 evaluations on the numpy backend."""
    f64 = [x.astype(np.float64) for x in raw]
    exact = fn(*f64, backend="numpy", **attrs)
    abs_sum = fn(*(np.abs(x) for x in f64), backend="numpy", **attrs)
    n_terms = fn(*(np.ones_like(x) for x in f64), backend="numpy", **attrs)
    return exact, abs_sum, n_terms


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_agrees_with_numpy_backend(lib, case):
    """Every dtype the library has (JAX: float32 and bfloat16 only, as eager JAX compiles each
    op per shape; the shared matrix's array_api-jax target covers the rest)."""
    _numpy_backend_or_skip()
    _, fn, shapes, attrs = case
    dtypes = ("float32", "bfloat16") if lib.expensive else lib.dtypes
    for dtype in dtypes:
        raw = _inputs(shapes, dtype, seed=7)
        exact, abs_sum, n_terms = _bound(fn, raw, attrs)
        acc = "float64" if dtype == "float64" else "float32"
        tol = EPS[dtype] * np.abs(exact) + n_terms * EPS[acc] * abs_sum
        if dtype == "float64":
            tol = 2 * tol  # the float64 "exact" value carries a bound of its own
        ours = lib.to_numpy(fn(*(lib.asarray(x) for x in raw), backend="array_api", **attrs))
        theirs = fn(*raw, backend="numpy", **attrs).astype(np.float64)
        for name, y in (("array_api", ours), ("numpy", theirs)):
            err = np.abs(y - exact)
            worst = np.unravel_index(np.argmax(err - tol), err.shape)
            assert np.all(err <= tol), (f"{dtype}: {name} backend outside the error bound at "
                                        f"{worst}: |{y[worst]} - {exact[worst]}| > "
                                        f"{tol[worst]}")
        assert np.all(np.abs(ours - theirs) <= 2 * tol), dtype


# --------------------------------------------------------------------------------------------
# JAX: immutable arrays, jit, grad
# --------------------------------------------------------------------------------------------


@pytest.fixture
def jax():
    jax = pytest.importorskip("jax", reason="jax is not installed: jit checks skipped")
    jax.config.update("jax_enable_x64", True)
    return jax


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_jax_jit(jax, case, dtype):
    """Immutable arrays inside jit: no item assignment anywhere in the generic backend."""
    import jax.numpy as jnp

    _, fn, shapes, attrs = case
    raw = _inputs(shapes, dtype)
    args = [jnp.asarray(x) for x in raw]
    jitted = jax.jit(lambda *xs: fn(*xs, backend="array_api", **attrs))(*args)
    ref = fn(*raw, backend="array_api", **attrs)   # same backend on numpy arrays
    assert isinstance(jitted, jax.Array)
    assert jitted.dtype == args[0].dtype and jitted.shape == ref.shape
    np.testing.assert_allclose(np.asarray(jitted, np.float64), ref.astype(np.float64),
                               rtol=1e-5 if dtype == "float32" else 1e-2, atol=1e-5)


def test_jax_grad_equals_backward_ops(jax):
    import jax.numpy as jnp

    rng = np.random.default_rng(3)
    attrs = dict(strides=2, pads_begin=1, pads_end=0, dilations=(1, 2), groups=2,
                 backend="array_api")
    x = jnp.asarray(rng.standard_normal((2, 7, 8, 4)))
    w = jnp.asarray(rng.standard_normal((3, 2, 2, 6)))
    g = jnp.asarray(rng.standard_normal(polyconv.convolution(x, w, **attrs).shape))

    def loss(x, w):
        return jnp.sum(polyconv.convolution(x, w, **attrs) * g)

    dx, dw = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    np.testing.assert_allclose(dx, polyconv.convolution_backward_data(g, w, x.shape, **attrs),
                               rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dw, polyconv.convolution_backward_weights(x, g, w.shape,
                                                                         **attrs),
                               rtol=1e-10, atol=1e-10)


def test_jax_matmuls_run_at_highest_precision(jax):
    """No TF32/bf16 passes behind the user's back (JAX's default on GPU/TPU); see
    docs/numerics.md#accumulation."""
    import jax.numpy as jnp

    x = jnp.ones((1, 5, 2), jnp.float32)
    w = jnp.ones((3, 2, 4), jnp.float32)
    dy = jnp.ones((1, 3, 4), jnp.float32)
    calls = {
        "forward": lambda x, w, dy: polyconv.convolution(x, w, backend="array_api"),
        "backward_data": lambda x, w, dy: polyconv.convolution_backward_data(
            dy, w, backend="array_api"),
        "backward_weights": lambda x, w, dy: polyconv.convolution_backward_weights(
            x, dy, (3,), backend="array_api"),
    }
    for name, call in calls.items():
        jaxpr = str(jax.make_jaxpr(call)(x, w, dy))
        assert "dot_general" in jaxpr, name
        assert "DEFAULT" not in jaxpr and "Precision.HIGHEST" in jaxpr, (name, jaxpr)


# --------------------------------------------------------------------------------------------
# dispatch
# --------------------------------------------------------------------------------------------


class _NotAnArray:
    """Looks like an array (shape, float dtype) but no array library knows it."""

    dtype = np.dtype("float32")

    def __init__(self, shape):
        self.shape = shape


def test_dispatch_by_library(lib):
    """numpy, JAX and torch arrays go to their own backends, every other array-API library
    to array_api, also with no ``backend=`` given."""
    x = lib.asarray(np.zeros((1, 4, 2), np.float32))
    expected = lib.array_library if lib.dedicated else "array_api"
    assert infer_backend("convolution", {"src": x}) == expected
    if lib.dedicated:
        return
    for _, fn, shapes, attrs in CASES:
        args = [lib.asarray(x) for x in _inputs(shapes, "float32")]
        out = fn(*args, **attrs)
        assert array_api_compat.array_namespace(out) is array_api_compat.array_namespace(
            args[0])
        ref = fn(*args, backend="array_api", **attrs)
        np.testing.assert_array_equal(lib.to_numpy(out), lib.to_numpy(ref))


def test_forced_dedicated_backend_returns_the_input_type(lib):
    """``backend="numpy"`` on other arrays: the result comes back in the input's library,
    on its device."""
    if lib.dedicated:
        pytest.skip(f"{lib.name} has its own backend")
    _numpy_backend_or_skip()
    _, fn, shapes, attrs = CASES[0]
    raw = _inputs(shapes, "float32")
    args = [lib.asarray(x) for x in raw]
    out = fn(*args, backend="numpy", **attrs)
    assert type(out) is type(args[0])
    assert array_api_compat.device(out) == array_api_compat.device(args[0])
    assert out.dtype == args[0].dtype
    np.testing.assert_array_equal(lib.to_numpy(out), fn(*raw, backend="numpy", **attrs))


def test_unknown_array_type_is_a_type_error():
    with pytest.raises(TypeError, match=r"unsupported array type .*_NotAnArray"):
        polyconv.convolution(_NotAnArray((1, 4, 2)), _NotAnArray((1, 2, 3)))


@pytest.mark.parametrize("forced", [None, "array_api"])
def test_mixed_libraries_are_a_type_error(lib, forced):
    if lib.array_library == "numpy":
        other = _target("array_api-strict")
        if importlib.util.find_spec("array_api_strict") is None:
            pytest.skip("array_api_strict is not installed")
    else:
        other = _target("numpy")
    src = lib.asarray(np.ones((1, 5, 2), np.float32))
    w = other.asarray(np.ones((3, 2, 4), np.float32))
    names = [type(src).__qualname__, type(w).__qualname__]
    with pytest.raises(TypeError) as info:
        polyconv.convolution(src, w, backend=forced)
    message = str(info.value)
    assert all(name in message for name in names), message


def test_dtype_rules_name_the_dtypes(lib):
    if "float64" not in lib.dtypes:
        pytest.skip(f"{lib.name} has no float64")
    src = lib.asarray(np.ones((1, 5, 2), np.float32))
    w = lib.asarray(np.ones((3, 2, 4), np.float64))
    with pytest.raises(TypeError, match=r"src\.dtype=float32, weights\.dtype=float64"):
        polyconv.convolution(src, w, backend="array_api")
    ints = lib.asarray(np.ones((1, 5, 2), np.int32))
    with pytest.raises(TypeError, match=r"src\.dtype=int32"):
        polyconv.convolution(ints, lib.asarray(np.ones((3, 2, 4), np.float32)),
                             backend="array_api")


def test_a_session_without_array_api_targets_says_why():
    """A session that selects no array-API target skips these tests with a reason that says
    so, not pytest's "got empty parameter set"."""
    env = {**os.environ, "POLYCONV_TEST_BACKENDS": "numpy"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         f"{__file__}::test_keeps_namespace_device_dtype"],
        capture_output=True, text=True, env=env, cwd=os.path.dirname(os.path.dirname(__file__)),
        timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "empty parameter set" not in out, out
    assert "POLYCONV_TEST_BACKENDS='numpy' names no target of the array_api backend" in out, out
    assert "array_api-strict" in out and "the sessions that select them" in out
