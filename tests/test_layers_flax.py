"""polyconv.layers.flax against flax.nnx's own Conv and ConvTranspose: the same parameters
from the same ``rngs``, the same outputs and gradients within the error bound on a grid of
what Flax supports; what Flax lacks (groups and output_padding on ConvTranspose) against
Flax's layers composed (one per group; padding pairs); jit, vmap, training, save and load."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import only_with_target
from layer_checks import assert_doctests_pass, assert_within_bound, terms

only_with_target("frameworks")
jax = pytest.importorskip("jax")
nnx = pytest.importorskip("flax.nnx")
optax = pytest.importorskip("optax")
jnp = jax.numpy

from polyconv.layers import flax as pflax  # noqa: E402

F32 = jnp.float32


def _normal(seed: int, shape) -> jax.Array:
    """Random data made by numpy: no JAX program to compile."""
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, np.float32))


def _run(layer, x, g):
    """The output, and the gradients of ``sum(layer(x) * g)`` with respect to ``x`` and
    every parameter (one compiled program)."""
    y, gx, grads = _jitted(layer, x, g)
    return y, gx, {k: v[...] for k, v in nnx.to_flat_state(grads)}


@nnx.jit
def _jitted(layer, x, g):
    def loss(layer, x):
        y = layer(x)
        return jnp.sum(y * g), y

    (_, y), (grads, gx) = nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True)(layer, x)
    return y, gx, grads


def _absolute(layer):
    """A copy of ``layer`` with the absolute values of its parameters."""
    graph, state = nnx.split(layer)
    return nnx.merge(graph, jax.tree.map(jnp.abs, state))


def check_same(ours, theirs, x) -> None:
    """Outputs and gradients of ``ours`` and ``theirs`` (the framework's layer) agree within
    the bound; the magnitudes come from ``theirs`` on absolute values."""
    shape = jax.eval_shape(lambda x: theirs(x), x).shape
    g = _normal(7, shape)
    mine, ref = _run(ours, x, g), _run(theirs, x, g)
    y = ref[0]
    mag = _run(_absolute(theirs), jnp.abs(x), jnp.abs(g))
    n = terms(x, y, *ref[2].values())
    assert_within_bound(mine[0], ref[0], mag[0], n, what="output")
    assert_within_bound(mine[1], ref[1], mag[1], n, what="input gradient")
    assert mine[2].keys() == ref[2].keys()
    for key in ref[2]:
        assert_within_bound(mine[2][key], ref[2][key], mag[2][key], n, what=f"{key} gradient")


def _same_params(ours, theirs) -> None:
    a, b = dict(nnx.to_flat_state(nnx.state(ours, nnx.Param))), dict(
        nnx.to_flat_state(nnx.state(theirs, nnx.Param)))
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key][...], b[key][...])


CONV_CASES = [
    ((3,), {}, (2, 9, 4)),
    ((3,), {"padding": "CAUSAL", "kernel_dilation": 2}, (2, 9, 4)),
    ((3, 3), {"padding": "VALID", "strides": 2}, (2, 9, 8, 4)),
    ((3, 2), {"padding": ((1, 2), (0, 1)), "strides": (2, 1), "kernel_dilation": (1, 2)},
     (2, 9, 8, 4)),
    ((3, 3), {"padding": "SAME_LOWER", "strides": 2, "feature_group_count": 2},
     (2, 8, 8, 4)),
    ((3, 3), {"padding": 1, "use_bias": False, "feature_group_count": 4}, (1, 7, 7, 4)),
    ((3, 3), {"padding": "CIRCULAR"}, (2, 6, 6, 4)),
    ((2, 3), {"padding": "REFLECT", "strides": 2}, (2, 7, 6, 4)),
    ((2, 2, 2), {"padding": "SAME", "strides": (1, 2, 1)}, (1, 4, 5, 3, 4)),
    ((3, 3), {}, (7, 6, 4)),                          # no batch axis
    ((3, 3), {"strides": 2}, (2, 3, 7, 6, 4)),        # two batch axes
]


@pytest.mark.parametrize(("kernel", "kw", "shape"), CONV_CASES)
def test_conv_equals_flax(kernel, kw, shape):
    ours = pflax.Conv(4, 6 if kw.get("feature_group_count", 1) < 4 else 8, kernel,
                      rngs=nnx.Rngs(0), **kw)
    theirs = nnx.Conv(4, ours.out_features, kernel, rngs=nnx.Rngs(0), **kw)
    _same_params(ours, theirs)
    check_same(ours, theirs, _normal(1, shape))


def test_conv_mask_equals_flax():
    mask = jnp.tril(jnp.ones((3, 4, 6)))
    ours = pflax.Conv(4, 6, 3, mask=mask, padding="VALID", rngs=nnx.Rngs(0))
    theirs = nnx.Conv(4, 6, 3, mask=mask, padding="VALID", rngs=nnx.Rngs(0))
    check_same(ours, theirs, _normal(1, (2, 9, 4)))


TRANSPOSE_CASES = [
    ((3,), {}, (2, 5, 4)),
    ((3,), {"strides": 2, "padding": "VALID"}, (2, 5, 4)),
    ((4, 4), {"strides": 2}, (2, 5, 4, 4)),
    ((2, 2), {"strides": 3, "padding": "SAME"}, (2, 4, 3, 4)),       # kernel < stride
    ((3, 2), {"strides": (2, 3), "padding": ((1, 2), (0, 3)), "kernel_dilation": 2},
     (2, 4, 5, 4)),
    ((3, 3), {"strides": 2, "padding": ((2, -1), (0, 0))}, (2, 4, 4, 4)),
    ((3, 3), {"strides": 2, "transpose_kernel": True}, (2, 4, 5, 4)),
    ((3, 3), {"strides": (1, 2), "padding": "VALID", "transpose_kernel": True,
              "use_bias": False}, (2, 4, 5, 4)),
    ((2, 3, 2), {"strides": 2, "kernel_dilation": (1, 2, 1)}, (1, 3, 4, 3, 4)),
    ((3, 3), {"strides": 2}, (5, 4, 4)),                         # no batch axis
]


@pytest.mark.parametrize(("kernel", "kw", "shape"), TRANSPOSE_CASES)
def test_conv_transpose_equals_flax(kernel, kw, shape):
    ours = pflax.ConvTranspose(4, 6, kernel, rngs=nnx.Rngs(0), **kw)
    theirs = nnx.ConvTranspose(4, 6, kernel, rngs=nnx.Rngs(0), **kw)
    _same_params(ours, theirs)
    check_same(ours, theirs, _normal(1, shape))


@pytest.mark.parametrize("transpose_kernel", [False, True])
def test_grouped_conv_transpose_equals_flax_per_group(transpose_kernel):
    """Flax has no grouped ConvTranspose: each group is Flax's layer on its channels, with
    its slice of the kernel and bias."""
    groups, kw = 2, {"strides": 2, "kernel_dilation": 2, "padding": ((1, 3), (2, 2))}
    ours = pflax.ConvTranspose(4, 6, (3, 2), feature_group_count=groups,
                               transpose_kernel=transpose_kernel, rngs=nnx.Rngs(0), **kw)
    x = _normal(1, (2, 4, 5, 4))
    parts, mags = [], []
    for g in range(groups):
        one = nnx.ConvTranspose(2, 3, (3, 2), transpose_kernel=transpose_kernel,
                                rngs=nnx.Rngs(0), **kw)
        cut = slice(2 * g, 2 * g + 2)
        one.kernel[...] = (ours.kernel[..., cut] if transpose_kernel
                           else ours.kernel[..., cut, :])
        one.bias[...] = ours.bias[3 * g:3 * g + 3]
        parts.append(one(x[..., cut]))
        mags.append(_absolute(one)(jnp.abs(x[..., cut])))
    y = ours(x)
    assert_within_bound(y, jnp.concatenate(parts, axis=-1), jnp.concatenate(mags, axis=-1),
                        terms(x, y, ours.kernel[...]))


def test_output_padding_equals_flax_end_padding():
    """``output_padding`` extends the end: Flax's pairs with ``high + output_padding``."""
    kw = {"strides": (2, 3), "kernel_dilation": (2, 1)}
    ours = pflax.ConvTranspose(4, 6, (3, 3), padding=((1, 1), (2, 0)), output_padding=(1, 2),
                               rngs=nnx.Rngs(0), **kw)
    theirs = nnx.ConvTranspose(4, 6, (3, 3), padding=((1, 2), (2, 2)), rngs=nnx.Rngs(0), **kw)
    check_same(ours, theirs, _normal(1, (2, 4, 5, 4)))


def test_auto_pad_same_upper_equals_flax_same():
    ours = pflax.ConvTranspose(4, 6, (4, 3), strides=2, auto_pad="same_upper",
                               rngs=nnx.Rngs(0))
    theirs = nnx.ConvTranspose(4, 6, (4, 3), strides=2, padding="SAME", rngs=nnx.Rngs(0))
    check_same(ours, theirs, _normal(1, (2, 4, 5, 4)))
    lower = pflax.ConvTranspose(4, 6, (4, 3), strides=2, auto_pad="same_lower",
                                output_padding=1, rngs=nnx.Rngs(0))
    assert lower(_normal(1, (2, 4, 5, 4))).shape == (2, 9, 11, 6)


@pytest.mark.parametrize("cls", ["Conv", "ConvTranspose"])
def test_channels_first_equals_flax_on_transposed_data(cls):
    ours = getattr(pflax, cls)(4, 6, (3, 3), strides=2, data_format="NCX", rngs=nnx.Rngs(0))
    theirs = getattr(nnx, cls)(4, 6, (3, 3), strides=2, rngs=nnx.Rngs(0))
    x = _normal(1, (2, 4, 7, 6))
    y = ours(x)
    ref = jnp.moveaxis(theirs(jnp.moveaxis(x, 1, -1)), -1, 1)
    mag = jnp.moveaxis(_absolute(theirs)(jnp.moveaxis(jnp.abs(x), 1, -1)), -1, 1)
    assert_within_bound(y, ref, mag, terms(x, y, ours.kernel[...]))


def test_jit_vmap_and_polyconv_gradients():
    layer = pflax.ConvTranspose(3, 2, 3, strides=2, feature_group_count=1, rngs=nnx.Rngs(0))
    x = _normal(1, (4, 5, 3))
    eager = layer(x)
    np.testing.assert_allclose(nnx.jit(lambda m, x: m(x))(layer, x), eager, rtol=1e-6)
    one_by_one = jax.vmap(lambda xi: layer(xi[None])[0])(x)
    np.testing.assert_allclose(one_by_one, eager, rtol=1e-5, atol=1e-6)
    graph, params = nnx.split(layer)
    jaxpr = str(jax.make_jaxpr(jax.grad(
        lambda p: jnp.sum(nnx.merge(graph, p)(x) ** 2)))(params))
    assert "polyconv_backward_weights" in jaxpr and "conv_general_dilated" not in jaxpr


def test_trains_with_optax():
    """A few Adam steps on a ConvTranspose + Conv autoencoder lower the loss."""
    rngs = nnx.Rngs(0)

    class Net(nnx.Module):
        def __init__(self):
            self.down = pflax.Conv(2, 4, 3, strides=2, rngs=rngs)
            self.up = pflax.ConvTranspose(4, 2, 3, strides=2, feature_group_count=2,
                                          output_padding=1, padding="VALID", rngs=rngs)

        def __call__(self, x):
            return self.up(jax.nn.relu(self.down(x)))[:, :8]

    model = Net()
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    x = _normal(3, (4, 8, 2))

    @nnx.jit
    def step(model, optimizer):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - x) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    losses = [float(step(model, optimizer)) for _ in range(15)]
    assert losses[-1] < 0.8 * losses[0], losses


@pytest.mark.parametrize("cls", ["Conv", "ConvTranspose"])
def test_state_round_trips_and_interchanges_with_flax(cls, tmp_path):
    """A state saved (msgpack of the pure dict, Flax's own serialisation) from polyconv's
    layer loads into Flax's and back; both compute the same."""
    from flax import serialization

    ours = getattr(pflax, cls)(4, 6, (3, 3), strides=2, rngs=nnx.Rngs(1))
    path = tmp_path / "state.msgpack"
    path.write_bytes(serialization.msgpack_serialize(nnx.to_pure_dict(nnx.state(ours))))
    restored = serialization.msgpack_restore(path.read_bytes())
    for target in (getattr(nnx, cls)(4, 6, (3, 3), strides=2, rngs=nnx.Rngs(2)),
                   getattr(pflax, cls)(4, 6, (3, 3), strides=2, rngs=nnx.Rngs(3))):
        state = nnx.state(target)
        nnx.replace_by_pure_dict(state, restored)
        nnx.update(target, state)
        _same_params(ours, target)
        x = _normal(1, (2, 5, 5, 4))
        np.testing.assert_allclose(target(x), ours(x), rtol=1e-5, atol=1e-5)


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="input_dilation"):
        pflax.Conv(2, 2, 3, input_dilation=2, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="CIRCULAR"):
        pflax.ConvTranspose(2, 2, 3, padding="CIRCULAR", rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="negative pad"):
        pflax.Conv(2, 2, 3, padding=-1, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="auto_pad"):
        pflax.ConvTranspose(2, 2, 3, auto_pad="same", rngs=nnx.Rngs(0))


def test_docstring_examples():
    assert_doctests_pass(pflax)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("cls", ["Conv", "ConvTranspose"])
def test_16_bit_within_the_bound_of_flax_in_float32(cls, dtype):
    """``dtype=bfloat16`` / ``float16`` computes in that dtype (accumulating in float32,
    one rounding): within the 16-bit bound of Flax's layer run in float32 on the same
    16-bit values."""
    kw = {"strides": 2, "kernel_dilation": 2}
    ours = getattr(pflax, cls)(4, 6, (3, 3), dtype=getattr(jnp, dtype), rngs=nnx.Rngs(0), **kw)
    theirs = getattr(nnx, cls)(4, 6, (3, 3), rngs=nnx.Rngs(0), **kw)
    graph, state = nnx.split(theirs)
    theirs = nnx.merge(graph, jax.tree.map(lambda a: a.astype(dtype).astype(F32), state))
    x16 = _normal(1, (2, 9, 8, 4)).astype(dtype)
    y = ours(x16)
    assert y.dtype == jnp.dtype(dtype)
    x = x16.astype(F32)
    assert_within_bound(y, theirs(x), _absolute(theirs)(jnp.abs(x)),
                        terms(x, y, ours.kernel[...]), dtype=dtype)
