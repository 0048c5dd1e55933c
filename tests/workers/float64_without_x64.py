"""Worker of tests/test_jax.py: with JAX's 64-bit mode off, float64 numpy inputs with
backend="jax" are a clear TypeError (printed), and float32 inputs still run."""

import jax
import jax.numpy as jnp
import numpy as np

import polyconv

assert not jax.config.jax_enable_x64
x = np.ones((1, 5, 5, 2))
w = np.ones((3, 3, 2, 4))
try:
    polyconv.convolution(x, w, backend="jax")
except TypeError as e:
    print("TypeError:", e)
else:
    raise SystemExit("no error")
y = polyconv.convolution(x.astype(np.float32), w.astype(np.float32), backend="jax")
assert y.dtype == np.float32
y = polyconv.convolution(jnp.asarray(x), jnp.asarray(w))   # jax makes these float32
assert y.dtype == jnp.float32
