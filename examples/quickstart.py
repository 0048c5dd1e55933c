"""Quickstart: the six ops of the convolution family, on numpy and (if installed) on JAX.

Run it with ``python examples/quickstart.py``.
"""

import numpy as np

import polyconv

rng = np.random.default_rng(0)

# Data is NXC by default: [N, H, W, C].
x = rng.standard_normal((2, 8, 8, 4)).astype(np.float32)

# --- Convolution and its two gradients --------------------------------------------------------
# Convolution weights are XIO by default: [KH, KW, IC/groups, OC].
w = rng.standard_normal((3, 3, 4, 6)).astype(np.float32)
bias = rng.standard_normal(6).astype(np.float32)
conv = {"strides": 2, "auto_pad": "same_upper"}  # output size = ceil(8 / 2) = 4

y = polyconv.convolution(x, w, bias, **conv)
print("convolution                     ", x.shape, "->", y.shape)

dy = rng.standard_normal(y.shape).astype(np.float32)
dx = polyconv.convolution_backward_data(dy, w, x.shape, **conv)  # dst_shape = x.shape
dw = polyconv.convolution_backward_weights(x, dy, w.shape, **conv)
print("convolution_backward_data       ", dy.shape, "->", dx.shape)
print("convolution_backward_weights    ", dy.shape, "->", dw.shape)

# backward_data is the exact adjoint of the convolution: <conv(x), dy> == <x, conv_bwd_data(dy)>
y0 = polyconv.convolution(x, w, **conv)  # no bias
assert np.isclose(np.vdot(y0, dy), np.vdot(x, dx), rtol=1e-4)
assert np.isclose(np.vdot(y0, dy), np.vdot(w, dw), rtol=1e-4)

# --- ConvTranspose and its two gradients ------------------------------------------------------
# ConvTranspose weights are XOI by default: [KH, KW, OC/groups, IC].
wt = rng.standard_normal((3, 3, 3, 4)).astype(np.float32)
tconv = {"strides": 2, "pads_begin": 1, "pads_end": 1, "output_padding": 1}

z = polyconv.conv_transpose(x, wt, **tconv)  # 2*(8-1) + 3 - 1 - 1 + 1 = 16
print("conv_transpose                  ", x.shape, "->", z.shape)

dz = rng.standard_normal(z.shape).astype(np.float32)
dxt = polyconv.conv_transpose_backward_data(dz, wt, **tconv)
dwt = polyconv.conv_transpose_backward_weights(x, dz, wt.shape, **tconv)
print("conv_transpose_backward_data    ", dz.shape, "->", dxt.shape)
print("conv_transpose_backward_weights ", dz.shape, "->", dwt.shape)
assert np.isclose(np.vdot(z, dz), np.vdot(x, dxt), rtol=1e-4)
assert np.isclose(np.vdot(z, dz), np.vdot(wt, dwt), rtol=1e-4)

# --- shapes without arrays --------------------------------------------------------------------
plan = polyconv.infer_shape("ConvTranspose", x.shape, wt.shape, strides=2,
                            auto_pad="same_upper")
print("infer_shape: ConvTranspose same_upper ->", plan.shape,
      "pads_begin", plan.pads_begin, "pads_end", plan.pads_end)

# --- the same calls on JAX --------------------------------------------------------------------
try:
    import jax
    import jax.numpy as jnp
except ImportError:
    print("jax is not installed: skipping the JAX part (pip install 'polyconv-ops[jax]')")
else:
    yj = polyconv.convolution(jnp.asarray(x), jnp.asarray(w), jnp.asarray(bias), **conv)
    print("on JAX:", type(yj).__name__, yj.shape, yj.dtype)
    np.testing.assert_allclose(np.asarray(yj), y, rtol=1e-5, atol=1e-5)

    # jax.grad of the forward op is the backward op, under jax.jit too
    def loss(x, w):
        return jnp.vdot(polyconv.conv_transpose(x, w, **tconv), jnp.asarray(dz))

    gx, gw = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.asarray(x), jnp.asarray(wt))
    np.testing.assert_allclose(np.asarray(gx), dxt, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(gw), dwt, rtol=1e-4, atol=1e-4)
    print("jax.grad(conv_transpose) == conv_transpose_backward_data / _weights")

# --- every available backend against a float64 reference (docs/numerics.md#error-bound) ---------
report = polyconv.compare("ConvTranspose", x, wt, **tconv)
print(report)
assert report.ok
