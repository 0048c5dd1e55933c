"""The Keras dialect against Keras 3 itself, on its JAX backend (TensorFlow is not
installed: Keras on JAX stands for it), on a grid of arguments
(docs/frameworks.md#tensorflow-and-keras)."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
from conftest import only_with_target

from polyconv.dialects import keras as dialect

only_with_target("frameworks")
os.environ.setdefault("KERAS_BACKEND", "jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip(f"Keras runs on {keras.backend.backend()!r} here; these tests use its JAX "
                f"backend", allow_module_level=True)

RNG = np.random.default_rng(0)


def _close(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=str(what))


def test_conv_grid():
    checked = 0
    for k, s, d, g, padding, fmt in itertools.product(
            (1, 2, 3), (1, 2), (1, 2), (1, 2), ("same", "valid"),
            ("channels_last", "channels_first")):
        if s > 1 and d > 1:
            continue                    # Keras refuses strides and dilation together
        shape = (2, 7, 6, 2 * g) if fmt == "channels_last" else (2, 2 * g, 7, 6)
        x = RNG.standard_normal(shape).astype(np.float32)
        kernel = RNG.standard_normal((k, 2, 2, 3 * g)).astype(np.float32)
        kw = {"strides": (s, 1), "padding": padding, "data_format": fmt,
              "dilation_rate": (d, 1)}
        _close(dialect.conv(x, kernel, **kw), keras.ops.conv(x, kernel, **kw), kw)
        checked += 1
    assert checked == 72


def test_conv_transpose_grid():
    """Every output_padding Keras accepts (below the stride), and None."""
    checked = 0
    for k, s, d, padding, opad in itertools.product(
            (1, 2, 3, 4), (1, 2, 3), (1, 2), ("same", "valid"), (None, 0, 1, 2)):
        if (opad is not None and opad >= s) or (s > 1 and d > 1):
            continue
        x = RNG.standard_normal((2, 4, 3, 3)).astype(np.float32)
        kernel = RNG.standard_normal((k, 2, 2, 3)).astype(np.float32)   # [K.., OC, IC]
        kw = {"strides": (s, 2), "padding": padding, "dilation_rate": (d, 1),
              "output_padding": None if opad is None else (opad, 1)}
        want = keras.ops.conv_transpose(x, kernel, **kw)
        _close(dialect.conv_transpose(x, kernel, **kw), want, kw)
        checked += 1
    assert checked > 60, checked


def test_the_layers_with_their_bias():
    """Conv2DTranspose with output_padding and Conv2D with groups, bias included."""
    x = RNG.standard_normal((2, 5, 4, 4)).astype(np.float32)
    layer = keras.layers.Conv2DTranspose(3, (3, 2), strides=(2, 3), padding="same",
                                         output_padding=(1, 2), bias_initializer="ones")
    want = layer(x)
    got = dialect.conv_transpose(x, np.asarray(layer.kernel), np.asarray(layer.bias),
                                 strides=(2, 3), padding="same", output_padding=(1, 2))
    _close(got, want, "Conv2DTranspose")
    layer = keras.layers.Conv2D(6, 3, groups=2, padding="same", bias_initializer="ones")
    want = layer(x)
    _close(dialect.conv(x, np.asarray(layer.kernel), np.asarray(layer.bias), padding="same"),
           want, "Conv2D")


@pytest.mark.parametrize(("op", "kwargs", "match"), [
    ("conv", {"padding": "full"}, "padding must be 'valid' or 'same'"),
    ("conv", {"data_format": "NHWC"}, "data_format must be"),
    ("conv_transpose", {"padding": "causal"}, "padding must be 'valid' or 'same'"),
])
def test_refusals_say_why(op, kwargs, match):
    with pytest.raises(ValueError, match=match):
        dialect.keywords(op, (1, 6, 6, 2), (3, 3, 2, 2), **kwargs)
