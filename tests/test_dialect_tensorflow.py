"""The TensorFlow dialect, and the Keras dialect, against TensorFlow itself: ``tf.nn``'s
convolutions, transposed convolutions (``SAME``, ``VALID`` and explicit pads, with
``output_shape`` below, at and above ``input * strides``) and ``depthwise_conv2d``, and
``keras.ops.conv`` / ``conv_transpose`` on Keras's TensorFlow backend
(docs/frameworks.md#tensorflow-and-keras). Skipped where TensorFlow is not installed."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import only_with_target

from polyconv.dialects import keras as keras_dialect
from polyconv.dialects import tensorflow as dialect

only_with_target("frameworks")
tf = pytest.importorskip("tensorflow")

RNG = np.random.default_rng(0)
CONV = {1: tf.nn.conv1d, 2: tf.nn.conv2d, 3: tf.nn.conv3d}
TRANSPOSE = {1: tf.nn.conv1d_transpose, 2: tf.nn.conv2d_transpose, 3: tf.nn.conv3d_transpose}


def _close(got, want, what):
    want = np.asarray(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9, err_msg=str(what))


def _tf(fn, *args, **kw):
    """TensorFlow's answer, or None where TensorFlow refuses the call."""
    try:
        return fn(*args, **kw).numpy()
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError, ValueError,
            TypeError):
        return None


def _paddings(ndim, last):
    yield "SAME"
    yield "VALID"
    pairs = [[1, 0], [0, 2], [2, 1]][:ndim]
    yield [[0, 0], *pairs, [0, 0]] if last else [[0, 0], [0, 0], *pairs]


def test_conv_grid():
    checked = 0
    for ndim, k, s, d, last in itertools.product((1, 2, 3), (1, 2, 3), (1, 2), (1, 2),
                                                  (True,)):
        if s > 1 and d > 1:
            continue                      # TensorFlow refuses strides and dilations together
        spatial = (7, 6, 5)[:ndim]
        x = RNG.standard_normal((2, *spatial, 3))
        f = RNG.standard_normal((*(k,) * ndim, 3, 4))
        for padding in _paddings(ndim, last):
            kw = {"strides": s, "padding": padding, "dilations": d}
            want = _tf(CONV[ndim], x, f, **({"stride": s, "padding": padding, "dilations": d}
                                            if ndim == 1 else kw))
            if want is None:
                continue
            _close(dialect.convolution(x, f, **kw), want, (ndim, k, kw))
            checked += 1
    assert checked == 45, checked


def test_conv_transpose_grid():
    """The first spatial axis strided, dilated, padded; every ``output_shape`` TensorFlow
    accepts among ``s*(x-1) + ek - 2 .. + 2`` and ``x*s - 1 .. x*s + 1`` there."""
    checked = 0
    for ndim, k, s, d in itertools.product((1, 2, 3), (1, 2, 3, 4), (1, 2, 3), (1, 2)):
        if s > 1 and d > 1:
            continue
        spatial = (4, 3, 2)[:ndim]
        x = RNG.standard_normal((2, *spatial, 3))
        f = RNG.standard_normal((k, *(1,) * (ndim - 1), 2, 3))
        ek = (k - 1) * d + 1
        sizes = sorted({s * (spatial[0] - 1) + ek + delta for delta in (-2, -1, 0, 1, 2)} |
                       {spatial[0] * s + delta for delta in (-1, 0, 1)})
        strides, dilations = ([1, v, *(1,) * (ndim - 1), 1] for v in (s, d))
        paddings = ["SAME", "VALID", *([[0, 0], list(p), *[[0, 0]] * ndim]
                                       for p in ((1, 0), (0, 2), (2, 1)))]
        for padding, size in itertools.product(paddings, sizes):
            out = [2, size, *spatial[1:], 2]
            want = _tf(TRANSPOSE[ndim], x, f, out, strides, padding=padding,
                       dilations=dilations)
            if want is None:
                continue
            got = dialect.conv_transpose(x, f, out, strides, padding=padding,
                                         dilations=dilations)
            _close(got, want, (ndim, k, s, d, padding, out))
            checked += 1
    assert checked > 200, checked


def test_depthwise_conv2d_grid():
    checked = 0
    for k, s, d, m, padding in itertools.product((1, 3), (1, 2), (1, 2), (1, 2),
                                                 list(_paddings(2, True))):
        if s > 1 and d > 1:
            continue
        x = RNG.standard_normal((2, 7, 6, 3))
        f = RNG.standard_normal((k, k, 3, m))
        kw = {"strides": [1, s, s, 1], "padding": padding, "dilations": [d, d]}
        want = _tf(tf.nn.depthwise_conv2d, x, f, **kw)
        if want is None:
            continue
        _close(dialect.depthwise_conv2d(x, f, **kw), want, kw)
        checked += 1
    assert checked >= 30, checked


def test_keras_dialect_on_keras_tensorflow_backend():
    """The Keras dialect's rule (read from Keras's JAX backend) is also what
    ``keras.ops.conv_transpose`` computes on TensorFlow."""
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "tensorflow":
        pytest.skip(f"Keras runs on {keras.backend.backend()!r} here (KERAS_BACKEND); this "
                    f"test needs its TensorFlow backend")
    checked = refused = 0
    for k, s, padding, opad in itertools.product((1, 2, 3, 4), (1, 2, 3), ("same", "valid"),
                                                 (None, 0, 1, 2)):
        if opad is not None and opad >= s:
            continue
        x = RNG.standard_normal((2, 4, 3, 3))
        kernel = RNG.standard_normal((k, 2, 2, 3))
        kw = {"strides": (s, 2), "padding": padding,
              "output_padding": None if opad is None else (opad, 1)}
        want = _tf(keras.ops.conv_transpose, x, kernel, **kw)
        if want is None:        # Keras's TensorFlow backend refuses some "same" cases
            refused += 1
            continue
        _close(keras_dialect.conv_transpose(x, kernel, **kw), want, kw)
        checked += 1
    for k, s, padding in itertools.product((1, 2, 3), (1, 2), ("same", "valid")):
        x = RNG.standard_normal((2, 7, 6, 4))
        kernel = RNG.standard_normal((k, 2, 4, 6))
        kw = {"strides": s, "padding": padding}
        _close(keras_dialect.conv(x, kernel, **kw), keras.ops.conv(x, kernel, **kw), kw)
        checked += 1
    print(f"keras on tensorflow: {checked} checked, {refused} refused by Keras")
    assert checked > 50, (checked, refused)
