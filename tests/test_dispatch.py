"""Dispatch remembers a call's checks and plan per op, array types, dtypes, shapes and plain
arguments (polyconv/_dispatch.py). A repeated call must behave exactly like a first one: every
argument that changes the outcome changes the key, values that compare equal but validate
differently (``True`` and ``1``) do not share one, and the memory stays bounded.
"""

from __future__ import annotations

import numpy as np
import pytest
from oracle import assert_within_bound, reference

import polyconv
from polyconv import _dispatch

# [N, 4, 7, 4]: read as NXC (7 wide, 4 channels) or as NCX (4 channels, 7 high) alike
X = np.arange(2 * 4 * 7 * 4, dtype=np.float32).reshape(2, 4, 7, 4) / 50
W = np.linspace(-1, 1, 3 * 3 * 4 * 4, dtype=np.float32).reshape(3, 3, 4, 4)


def _conv(x=X, w=W, **attrs):
    return polyconv.convolution(x, w, **attrs)


@pytest.mark.parametrize(("attrs", "exc", "match"), [
    ({"groups": True}, TypeError, r"groups must be an integer; got groups=True"),
    ({"strides": (True, 1)}, TypeError, r"strides must contain integers only"),
    ({"strides": (1.0, 1)}, TypeError, r"strides must contain integers only"),
    ({"precision": "bogus"}, ValueError, r"precision must be None"),
    ({"pads_begin": (1, -1)}, ValueError, r"pads_begin"),
], ids=["bool-groups", "bool-stride", "float-stride", "precision", "negative-pad"])
def test_a_valid_call_does_not_let_its_look_alike_through(attrs, exc, match):
    """The valid call first (its outcome remembered), then one whose arguments compare equal
    to it or differ in one value: still refused, with the first call's message."""
    valid = {"groups": 1, "strides": (1, 1), "precision": "highest", "pads_begin": (1, 1)}
    key = next(iter(attrs))
    _conv(**{key: valid[key]})
    for _ in range(2):
        with pytest.raises(exc, match=match):
            _conv(**attrs)


def test_dtype_and_array_type_are_part_of_the_key():
    _conv()
    with pytest.raises(TypeError, match="share one floating dtype"):
        _conv(w=W.astype(np.float64))
    with pytest.raises(TypeError, match="must be floating point"):
        _conv(x=X.astype(np.int32), w=W.astype(np.int32))
    # the same shapes in float64 run, in float64
    assert _conv(x=X.astype(np.float64), w=W.astype(np.float64)).dtype == np.float64


def test_layout_and_attributes_change_the_result():
    """Calls with equal array shapes but another layout, stride or pad are not served the
    first one's plan: each equals the float64 oracle."""
    calls = [{}, {"strides": 2}, {"pads_begin": 1, "pads_end": 1},
             {"data_format": "NCX"}, {"strides": [2, 1]}, {"dilations": (1, 2)}]
    for attrs in calls + calls:            # each twice: the second is served from memory
        y = _conv(**attrs)
        ref = reference("convolution", X, W, **attrs)
        assert y.shape == ref.shape, attrs
        assert_within_bound(y, ref.y, ref.abs_sum, ref.n, "float32")


def test_result_type_follows_the_inputs_library():
    jnp = pytest.importorskip("jax.numpy")
    first = _conv()
    assert isinstance(first, np.ndarray)
    y = _conv(x=jnp.asarray(X), w=jnp.asarray(W))
    assert not isinstance(y, np.ndarray)
    np.testing.assert_allclose(np.asarray(y), first, rtol=1e-5, atol=1e-6)


def test_the_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(_dispatch, "_DISPATCH", {})
    monkeypatch.setattr(_dispatch, "_DISPATCH_SIZE", 4)
    for n in range(1, 11):
        _conv(x=np.zeros((n, 4, 7, 4), np.float32))
        assert 1 <= len(_dispatch._DISPATCH) <= 4


def _check(y, fn, *arrays, **attrs):
    ref = reference(fn, *arrays, **attrs)
    assert y.shape == ref.shape
    assert_within_bound(y, ref.y, ref.abs_sum, ref.n, "float32")


def test_arrays_in_any_position_reach_their_primitive():
    """A repeated call takes its arrays from the caller's own arguments: positional, by
    keyword, after a shape argument, or in another order than its primitive's (the
    ConvTranspose weight gradient takes ``src, diff_dst``, its primitive ``b, a``)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 6, 4)).astype(np.float32)
    w = rng.standard_normal((3, 3, 3, 4)).astype(np.float32)      # XOI: OC/G = 3, IC = 4
    b = rng.standard_normal(3).astype(np.float32)
    attrs = {"strides": 2, "pads_begin": 1, "pads_end": (0, 1)}
    y = polyconv.conv_transpose(x, w, **attrs)
    dy = rng.standard_normal(y.shape).astype(np.float32)
    for _ in range(2):                  # the second call of each is served from memory
        _check(polyconv.conv_transpose(x, w, b, **attrs), "conv_transpose", x, w, b, **attrs)
        _check(polyconv.conv_transpose(x, w, bias=b, **attrs), "conv_transpose", x, w, b,
               **attrs)
        _check(polyconv.conv_transpose(src=x, weights=w, **attrs), "conv_transpose", x, w,
               **attrs)
        _check(polyconv.conv_transpose_backward_weights(x, dy, (3, 3), **attrs),
               "conv_transpose_backward_weights", x, dy, weights_shape=(3, 3), **attrs)
        _check(polyconv.conv_transpose_backward_weights(x, dy, weights_shape=(3, 3), **attrs),
               "conv_transpose_backward_weights", x, dy, weights_shape=(3, 3), **attrs)
        _check(polyconv.convolution_backward_data(x, w, y.shape, **attrs),   # w as XIO
               "convolution_backward_data", x, w, dst_shape=y.shape, **attrs)


def test_a_forced_backend_answers_in_the_inputs_library():
    """With ``backend=`` naming another library's backend, every call (not only the first)
    returns an array of the inputs' library."""
    pytest.importorskip("jax")
    for _ in range(2):
        y = _conv(backend="jax")
        assert type(y) is np.ndarray
        _check(y, "convolution", X, W)


def test_a_wrong_call_gets_pythons_own_message_every_time():
    _conv()
    for _ in range(2):
        with pytest.raises(TypeError, match=r"convolution\(\) takes from 2 to 3 positional "
                                            r"arguments but 4 were given"):
            polyconv.convolution(X, W, None, 2)
        with pytest.raises(TypeError, match=r"missing 1 required positional argument: "
                                            r"'weights'"):
            polyconv.convolution(X)
