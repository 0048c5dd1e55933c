"""Worker of tests/test_jax_scale_out.py: the six ops, eager and jitted, on inputs
batch-sharded over 8 CPU devices, equal the unsharded results and keep the batch split (weight
gradients come back replicated). Prints "sharding ok"."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import polyconv

jax.config.update("jax_enable_x64", True)
assert jax.device_count() == 8, jax.devices()
mesh = Mesh(np.array(jax.devices()), ("data",))
batch = NamedSharding(mesh, P("data"))
rng = np.random.default_rng(0)
N = 16


def check(fmt):
    """Every op in one data layout."""
    attrs = dict(strides=2, pads_begin=1, pads_end=1, groups=2, data_format=fmt)
    t_attrs = dict(attrs, output_padding=1)
    def data(c, sp):
        return rng.standard_normal((N, *sp, c) if fmt == "NXC" else (N, c, *sp))
    x = data(4, (9, 8))
    wc = rng.standard_normal((3, 3, 2, 6))    # XIO
    wt = rng.standard_normal((3, 3, 3, 4))    # XOI
    bias = rng.standard_normal(6)
    dy = data(6, (5, 4))
    dt = data(6, (18, 16))
    ops = {
        "convolution": (lambda x, w, b: polyconv.convolution(x, w, b, **attrs),
                        (x, wc, bias), "batch"),
        "convolution_backward_data": (
            lambda dy, w: polyconv.convolution_backward_data(dy, w, x.shape, **attrs),
            (dy, wc), "batch"),
        "convolution_backward_weights": (
            lambda x, dy: polyconv.convolution_backward_weights(x, dy, wc.shape, **attrs),
            (x, dy), "replicated"),
        "conv_transpose": (lambda x, w, b: polyconv.conv_transpose(x, w, b, **t_attrs),
                           (x, wt, bias), "batch"),
        "conv_transpose_backward_data": (
            lambda dt, w: polyconv.conv_transpose_backward_data(dt, w, **t_attrs),
            (dt, wt), "batch"),
        "conv_transpose_backward_weights": (
            lambda x, dt: polyconv.conv_transpose_backward_weights(x, dt, wt.shape,
                                                                   **t_attrs),
            (x, dt), "replicated"),
    }
    for name, (fn, args, want) in ops.items():
        plain = [jnp.asarray(a) for a in args]
        # batch-sized inputs are sharded over the mesh, weights and bias replicated
        sharded = [jax.device_put(a, batch) if a.shape[0] == N else
                   jax.device_put(a, NamedSharding(mesh, P())) for a in plain]
        expected = np.asarray(fn(*plain))
        for how, f in (("eager", fn), ("jit", jax.jit(fn))):
            got = f(*sharded)
            np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-12, atol=1e-12,
                                       err_msg=f"{fmt} {name} {how}")
            if want == "batch":
                ok = got.sharding.is_equivalent_to(batch, got.ndim)
            else:
                ok = got.sharding.is_fully_replicated
            assert ok, (fmt, name, how, want, got.sharding)
    # the weights gradient of a loss over a batch-sharded input comes back replicated
    def loss(x, w, b):
        return jnp.sum(polyconv.convolution(x, w, b, **attrs) ** 2)
    xs = jax.device_put(jnp.asarray(x), batch)
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(xs, jnp.asarray(wc),
                                                       jnp.asarray(bias))
    plain = jax.grad(loss, argnums=(0, 1, 2))(jnp.asarray(x), jnp.asarray(wc),
                                             jnp.asarray(bias))
    for g, p in zip(grads, plain):
        np.testing.assert_allclose(np.asarray(g), np.asarray(p), rtol=1e-12, atol=1e-12)
    assert grads[0].sharding.is_equivalent_to(batch, grads[0].ndim), grads[0].sharding
    assert grads[1].sharding.is_fully_replicated, grads[1].sharding
    assert grads[2].sharding.is_fully_replicated, grads[2].sharding


for layout in ("NXC", "NCX"):
    check(layout)
print("sharding ok")
