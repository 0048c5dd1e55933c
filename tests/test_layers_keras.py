"""polyconv.layers.keras against Keras 3's own Conv*D and Conv*DTranspose on its JAX backend:
the same weights from the same seed, the same outputs and gradients within the error bound on
a grid of what Keras supports; groups on ConvTranspose against Keras's layer per group;
training with ``fit``; ``model.save`` / ``load_model``. The Keras backend is the process's
(``KERAS_BACKEND``; the frameworks session sets ``jax``)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import only_with_target
from layer_checks import assert_doctests_pass, assert_within_bound, terms

only_with_target("frameworks")
os.environ.setdefault("KERAS_BACKEND", "jax")
keras = pytest.importorskip("keras")
if keras.backend.backend() != "jax":
    pytest.skip(f"these tests compare on Keras's JAX backend; KERAS_BACKEND is "
                f"{keras.backend.backend()!r}", allow_module_level=True)
jax = pytest.importorskip("jax")
jnp = jax.numpy

from polyconv.layers import keras as pkeras  # noqa: E402


def _normal(seed: int, shape) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _build(cls, *args, seed: int = 0, **kw):
    keras.utils.set_random_seed(seed)
    return cls(*args, **kw)


def _run(layer, x, g, absolute: bool = False):
    """Output and gradients of ``sum(layer(x) * g)`` w.r.t. ``x`` and the weights, through
    Keras's stateless call (as its JAX trainer does)."""
    values = [jnp.abs(v.value) if absolute else v.value for v in layer.trainable_variables]

    def loss(values, x):
        y, _ = layer.stateless_call(values, [], x)
        return jnp.sum(y * g), y

    (_, y), (gw, gx) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(
        values, x)
    return y, gx, gw


def check_same(ours, theirs, x) -> None:
    ours(x), theirs(x)                                     # build
    for a, b in zip(ours.weights, theirs.weights, strict=True):
        assert a.path.split("/")[-1] == b.path.split("/")[-1]
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    g = _normal(7, theirs.compute_output_shape(x.shape))
    mine, ref = _run(ours, x, g), _run(theirs, x, g)
    mag = _run(theirs, np.abs(x), np.abs(g), absolute=True)
    n = terms(x, ref[0], theirs.kernel.numpy())
    assert ours.compute_output_shape((None, *x.shape[1:])) == (None, *ref[0].shape[1:])
    assert_within_bound(mine[0], ref[0], mag[0], n, what="output")
    assert_within_bound(mine[1], ref[1], mag[1], n, what="input gradient")
    for a, b, m, v in zip(mine[2], ref[2], mag[2], theirs.trainable_variables):
        assert_within_bound(a, b, m, n, what=f"{v.path} gradient")


CONV_CASES = [
    (1, {"padding": "causal", "dilation_rate": 2}, (2, 9, 4)),
    (2, {}, (2, 9, 8, 4)),
    (2, {"padding": "same", "strides": 2}, (2, 9, 8, 4)),
    (2, {"padding": "same", "dilation_rate": 2, "groups": 2}, (2, 9, 8, 4)),
    (2, {"strides": (2, 1), "data_format": "channels_first", "use_bias": False}, (2, 4, 9, 8)),
    (3, {"padding": "same", "strides": (1, 2, 1)}, (1, 4, 5, 3, 4)),
]
KERAS_CONV = {1: "Conv1D", 2: "Conv2D", 3: "Conv3D"}


@pytest.mark.parametrize(("rank", "kw", "shape"), CONV_CASES)
def test_conv_equals_keras(rank, kw, shape):
    check_same(_build(pkeras.Conv, rank, 6, 3, **kw),
               _build(getattr(keras.layers, KERAS_CONV[rank]), 6, 3, **kw), _normal(1, shape))


TRANSPOSE_CASES = [
    (1, 3, {"strides": 2}, (2, 5, 4)),
    (2, 3, {"padding": "same", "strides": 2}, (2, 5, 4, 4)),
    (2, 3, {"padding": "same", "strides": 3, "output_padding": 1}, (2, 5, 4, 4)),
    (2, 3, {"padding": "valid", "strides": 2, "output_padding": 1}, (2, 5, 4, 4)),
    (2, 2, {"padding": "same", "strides": 3}, (2, 4, 3, 4)),              # kernel < stride
    (2, 3, {"padding": "same", "dilation_rate": 2}, (2, 5, 4, 4)),
    (2, (2, 5), {"padding": "same", "strides": (3, 2), "output_padding": (2, 0),
                 "data_format": "channels_first"}, (2, 4, 4, 5)),
    (3, 2, {"padding": "valid", "strides": 2, "use_bias": False}, (1, 3, 2, 3, 4)),
]
KERAS_TRANSPOSE = {1: "Conv1DTranspose", 2: "Conv2DTranspose", 3: "Conv3DTranspose"}


@pytest.mark.parametrize(("rank", "kernel", "kw", "shape"), TRANSPOSE_CASES)
def test_conv_transpose_equals_keras(rank, kernel, kw, shape):
    check_same(_build(pkeras.ConvTranspose, rank, 6, kernel, **kw),
               _build(getattr(keras.layers, KERAS_TRANSPOSE[rank]), 6, kernel, **kw),
               _normal(1, shape))


@pytest.mark.parametrize("padding", ["same", "valid"])
def test_grouped_conv_transpose_equals_keras_per_group(padding):
    """Keras has no grouped ConvTranspose (keras#19871): each group is Keras's layer on its
    channels, with its slice of the kernel and bias."""
    kw = {"strides": 2, "padding": padding, "output_padding": 1}
    ours = pkeras.ConvTranspose(2, 6, 3, groups=2, **kw)
    x = _normal(1, (2, 5, 4, 4))
    y = np.asarray(ours(x))
    kernel, bias = ours.kernel.numpy(), ours.bias.numpy()
    parts, mags = [], []
    for g in range(2):
        one = keras.layers.Conv2DTranspose(3, 3, **kw)
        part = x[..., 2 * g:2 * g + 2]
        one(part)
        one.set_weights([kernel[..., 2 * g:2 * g + 2], bias[3 * g:3 * g + 3]])
        parts.append(np.asarray(one(part)))
        one.set_weights([np.abs(w) for w in one.get_weights()])
        mags.append(np.asarray(one(np.abs(part))))
    assert_within_bound(y, np.concatenate(parts, -1), np.concatenate(mags, -1),
                        terms(x, y, kernel))


def test_fit_lowers_the_loss_and_save_load_round_trips(tmp_path):
    x = _normal(3, (16, 8, 8, 2))
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((8, 8, 2)),
        pkeras.Conv(2, 8, 3, strides=2, padding=((0, 1), (0, 1)), activation="relu"),
        pkeras.ConvTranspose(2, 2, 3, strides=2, padding="same", groups=2),
    ])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    history = model.fit(x, x, epochs=12, batch_size=16, verbose=0).history["loss"]
    assert history[-1] < 0.8 * history[0], history
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert [type(layer) for layer in loaded.layers] == [pkeras.Conv, pkeras.ConvTranspose]
    assert loaded.layers[1].groups == 2 and loaded.layers[0].padding == ((0, 1), (0, 1))
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


def test_weights_interchange_with_keras_layers():
    """``get_weights`` of Keras's own layer ``set_weights`` into polyconv's (same shapes,
    same order) and the two compute the same (a ``.keras`` or ``.weights.h5`` file keys the
    weights by the layer's class, so a file saved from one class loads into that class)."""
    theirs = keras.layers.Conv2DTranspose(4, 3, strides=2, padding="same", output_padding=1)
    ours = pkeras.ConvTranspose(2, 4, 3, strides=2, padding="same", output_padding=1)
    x = _normal(1, (2, 5, 5, 3))
    theirs(x), ours(x)
    ours.set_weights(theirs.get_weights())
    np.testing.assert_allclose(ours(x), theirs(x), rtol=1e-5, atol=1e-5)


def test_tensorflow_backend_is_refused(monkeypatch):
    monkeypatch.setattr(keras.backend, "backend", lambda: "tensorflow")
    with pytest.raises(NotImplementedError, match="KERAS_BACKEND=jax"):
        pkeras.Conv(2, 2, 3)(_normal(1, (1, 5, 5, 2)))


OTHER_BACKEND = """
import json, numpy as np, keras
from polyconv.layers.keras import Conv, ConvTranspose
x = np.random.default_rng(0).standard_normal((2, 9, 8, 4)).astype("float32")
out = {}
for name, ours, theirs in [
        ("conv", lambda: Conv(2, 6, 3, strides=2, padding="same", groups=2),
         lambda: keras.layers.Conv2D(6, 3, strides=2, padding="same", groups=2)),
        ("transpose", lambda: ConvTranspose(2, 6, 3, strides=2, output_padding=1),
         lambda: keras.layers.Conv2DTranspose(6, 3, strides=2, output_padding=1))]:
    keras.utils.set_random_seed(0)
    a = keras.ops.convert_to_numpy(theirs()(x))
    keras.utils.set_random_seed(0)
    b = ours()(x)
    out[name] = [type(b).__module__.split(".")[0],
                 float(np.abs(keras.ops.convert_to_numpy(b) - a).max())]
print(json.dumps(out))
"""


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_other_keras_backends_equal_keras(backend):
    """On the PyTorch and NumPy Keras backends the layers compute on that backend's arrays
    (polyconv's torch and numpy backends) and equal Keras's layers there."""
    import json
    import subprocess
    import sys

    if backend == "torch":
        pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-c", OTHER_BACKEND], capture_output=True,
                          text=True, timeout=300, check=False,
                          env={**os.environ, "KERAS_BACKEND": backend})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    for name, (library, error) in result.items():
        assert library == backend, name
        assert error < 1e-5, (name, error)


def test_docstring_examples():
    assert_doctests_pass(pkeras)
