"""A Keras 3 model with polyconv's layers: a grouped ConvTranspose, which Keras lacks
(keras#19871), trained with ``fit``, saved and loaded.

``polyconv.layers.keras.Conv`` and ``ConvTranspose`` are Keras's own convolution layers
(``kernel``/``bias`` weights, initialisers, ``get_config``) computed by polyconv. They run on
the JAX, PyTorch and NumPy Keras backends (this script picks JAX unless ``KERAS_BACKEND`` is
set); on TensorFlow they raise ``NotImplementedError``.

Run it with ``python examples/keras_model.py`` (needs ``polyconv-ops[keras,jax]``).
"""

import os
import sys
import tempfile

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "jax")        # before keras is imported
try:
    import keras
except ImportError:
    sys.exit("this example needs Keras 3: pip install 'polyconv-ops[keras,jax]'")

from polyconv.layers.keras import Conv, ConvTranspose


def build() -> keras.Model:
    """[N, 16, 16, 2] -> encoder -> [N, 8, 8, 8] -> grouped ConvTranspose -> [N, 16, 16, 2]."""
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((16, 16, 2)),
        # asymmetric pads, which Keras's Conv2D has no argument for
        Conv(2, 8, 3, strides=2, padding=((0, 1), (0, 1)), activation="relu"),
        # 2 groups, dilation with a stride: neither exists in Keras's Conv2DTranspose
        ConvTranspose(2, 8, 3, strides=2, padding="same", groups=2, dilation_rate=1),
        ConvTranspose(2, 2, 3, strides=1, padding="same", dilation_rate=2),
    ])


def main() -> None:
    rng = np.random.default_rng(0)
    grid = np.linspace(-1, 1, 16, dtype=np.float32)
    x = np.stack([np.sin(3 * grid[:, None] + rng.uniform(0, 3, (64, 1, 1)))
                  * np.cos(2 * grid[None, :])] * 2, axis=-1).astype(np.float32)

    model = build()
    model.compile(optimizer=keras.optimizers.Adam(3e-3), loss="mse")
    history = model.fit(x, x, epochs=20, batch_size=32, verbose=0).history["loss"]
    print(f"{keras.backend.backend()} backend, loss {history[0]:.4f} -> {history[-1]:.4f}")
    assert history[-1] < 0.5 * history[0], history

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.keras")
        model.save(path)
        loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    print("saved and loaded:", [type(layer).__name__ for layer in loaded.layers],
          "groups:", loaded.layers[1].groups)


if __name__ == "__main__":
    main()
