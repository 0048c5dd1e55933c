"""Worker of tests/test_jax_scale_out.py: ``jax.grad`` of polyconv ops inside a user's own
``jax.shard_map`` (check_vma on, the default) over 2 CPU devices, the data split along the
batch and the weights and bias replicated (``P()``). The gradients equal those of the same
program written with ``lax`` (where JAX sums the replicated weights' cotangents over the
devices), the unsharded gradient and the float64 oracle's backward ops; both for the
gradient of each device's own loss and for that of the loss ``psum``'d by the user. Also the
other way round: the data replicated and the weights split along their output channels.
Prints "user shard_map ok"."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

import polyconv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the tests' oracle
from oracle import assert_within_bound, reference

jax.config.update("jax_enable_x64", True)
assert jax.device_count() == 2, jax.devices()
mesh = Mesh(np.array(jax.devices()), ("x",))
rng = np.random.default_rng(0)
N = 4
DN = ("NCHW", "OIHW", "NCHW")
HIGHEST = lax.Precision.HIGHEST
ATTRS = dict(strides=2, pads_begin=1, pads_end=1, data_format="NCX")
# lax pads the stride-dilated input of a transposed convolution by the complement of the
# forward pads within the kernel (3 - 1 - 1), plus the output padding at the end
T_PADS = [(1, 1 + 1)] * 2


def bias_of(y, b):
    return y + b.reshape(1, -1, 1, 1)


def convolution(x, w, b):
    return polyconv.convolution(x, w, b, weights_format="OIX", **ATTRS)


def lax_convolution(x, w, b):
    return bias_of(lax.conv_general_dilated(x, w, (2, 2), [(1, 1), (1, 1)],
                                            dimension_numbers=DN, precision=HIGHEST), b)


def convolution_grads(x, w, b, ct):
    return [("convolution_backward_data", (ct, w), dict(dst_shape=x.shape)),
            ("convolution_backward_weights", (x, ct), dict(weights_shape=w.shape))]


BATCH = (P("x"), P(), P(), P("x"))   # data split along the batch, weights and bias replicated
# name: (polyconv's function, the same with lax, array shapes, the oracle's gradients as
# (op, operands, keywords) per differentiated input, the specs of the arrays and of the
# output's cotangent); the arrays are (data, weights[, bias])
CASES = {
    "convolution": (convolution, lax_convolution, [(N, 3, 6, 5), (2, 3, 3, 3), (2,)],
                    convolution_grads, BATCH),
    # data replicated, weights, bias and output split along the output channels
    "convolution, weights split": (
        convolution, lax_convolution, [(N, 3, 6, 5), (4, 3, 3, 3), (4,)], convolution_grads,
        (P(), P("x"), P("x"), P(None, "x"))),
    "conv_transpose": (
        lambda x, w, b: polyconv.conv_transpose(x, w, b, weights_format="IOX",
                                                output_padding=1, **ATTRS),
        lambda x, w, b: bias_of(lax.conv_transpose(
            x, w, (2, 2), T_PADS, dimension_numbers=DN, transpose_kernel=True,
            precision=HIGHEST), b),
        [(N, 3, 5, 4), (3, 2, 3, 3), (2,)],
        lambda x, w, b, ct: [
            ("conv_transpose_backward_data", (ct, w), dict(output_padding=1)),
            ("conv_transpose_backward_weights", (x, ct),
             dict(weights_shape=w.shape, output_padding=1))], BATCH),
    "convolution_backward_data": (
        lambda dy, w: polyconv.convolution_backward_data(
            dy, w, (dy.shape[0], 3, 10, 8), weights_format="OIX", **ATTRS),
        lambda dy, w: lax.conv_transpose(dy, w, (2, 2), T_PADS, dimension_numbers=DN,
                                         transpose_kernel=True, precision=HIGHEST),
        [(N, 2, 5, 4), (2, 3, 3, 3)],
        lambda dy, w, ct: [
            ("convolution", (ct, w), {}),
            ("convolution_backward_weights", (ct, dy), dict(weights_shape=w.shape))],
        BATCH[:2] + BATCH[3:]),
}


def gradients(fn, arrays, ct, summed, specs):
    """The gradients of ``sum(fn(arrays) * ct)`` w.r.t. every array, inside a shard_map with
    the arrays and ``ct`` split by ``specs``; ``summed``: the user psums each device's loss
    first."""
    k = len(arrays)

    def body(*args):
        *arrays, ct = args

        def loss(*arrays):
            local = jnp.sum(fn(*arrays) * ct)
            return lax.psum(local, "x") if summed else local
        return jax.grad(loss, argnums=tuple(range(k)))(*arrays)

    mapped = jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=specs[:k])
    return jax.jit(mapped)(*arrays, ct)


for name, (fn, lax_fn, shapes, oracle, specs) in CASES.items():
    arrays = [jnp.asarray(rng.standard_normal(s)) for s in shapes]
    y = fn(*arrays)
    ct = jnp.asarray(rng.standard_normal(y.shape))
    plain = jax.grad(lambda *a, fn=fn, ct=ct: jnp.sum(fn(*a) * ct),
                     argnums=tuple(range(len(arrays))))(*arrays)
    kw = dict(weights_format="IOX" if name == "conv_transpose" else "OIX", **ATTRS)
    expected = [reference(op, *map(np.asarray, operands), **kw, **extra)
                for op, operands, extra in oracle(*arrays, ct)]
    for summed in (False, True):
        got = gradients(fn, arrays, ct, summed, specs)
        with_lax = gradients(lax_fn, arrays, ct, summed, specs)
        for i, (g, gl, p) in enumerate(zip(got, with_lax, plain)):
            what = f"{name} summed={summed} gradient {i}"
            np.testing.assert_allclose(g, gl, rtol=1e-10, atol=1e-10, err_msg=what)
            np.testing.assert_allclose(g, p, rtol=1e-10, atol=1e-10, err_msg=what)
        for g, ref in zip(got, expected):
            assert_within_bound(np.asarray(g), ref.y, ref.abs_sum, ref.n, "float64")
        if len(got) == 3:   # the bias gradient: the sum of ct over all but its channels
            np.testing.assert_allclose(got[2], np.asarray(ct).sum(axis=(0, 2, 3)),
                                       rtol=1e-10, atol=1e-10)
print("user shard_map ok")
