"""polyconv.layers.equinox against equinox.nn's own Conv and ConvTranspose: the same fields
from the same ``key``, the same outputs and gradients within the error bound on a grid of
what Equinox supports; jit, vmap, training, tree_serialise_leaves both ways."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import only_with_target
from layer_checks import assert_doctests_pass, assert_within_bound, terms

only_with_target("frameworks")
jax = pytest.importorskip("jax")
eqx = pytest.importorskip("equinox")
optax = pytest.importorskip("optax")
jnp = jax.numpy

from polyconv.layers import equinox as peqx  # noqa: E402


def _normal(seed: int, shape) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, np.float32))


@eqx.filter_jit
def _run(model, x, g):
    """The output and the gradients of ``sum(model(x) * g)`` with respect to ``x`` and the
    model's arrays (one compiled program)."""
    def loss(model, x):
        y = model(x)
        return jnp.sum(y * g), y

    (_, y), (gm, gx) = eqx.filter_value_and_grad(
        lambda mx: loss(*mx), has_aux=True)((model, x))
    return y, gx, {"weight": gm.weight, "bias": gm.bias}


def _absolute(model):
    return jax.tree.map(lambda a: jnp.abs(a) if eqx.is_array(a) else a, model)


def check_same(ours, theirs, x) -> None:
    np.testing.assert_array_equal(ours.weight, theirs.weight)
    np.testing.assert_array_equal(ours.bias, theirs.bias)
    shape = jax.eval_shape(theirs, x).shape
    g = _normal(7, shape)
    mine, ref = _run(ours, x, g), _run(theirs, x, g)
    mag = _run(_absolute(theirs), jnp.abs(x), jnp.abs(g))
    n = terms(x, ref[0], theirs.weight)
    for i, what in enumerate(("output", "input gradient")):
        assert_within_bound(mine[i], ref[i], mag[i], n, what=what)
    for key in ("weight", "bias"):
        assert_within_bound(mine[2][key], ref[2][key], mag[2][key], n, what=f"{key} gradient")


CONV_CASES = [
    (1, {}, (4, 9)),
    (2, {"stride": 2, "padding": "SAME"}, (4, 9, 8)),
    (2, {"padding": ((1, 2), (0, 1)), "dilation": (1, 2), "groups": 2}, (4, 9, 8)),
    (2, {"padding": "SAME_LOWER", "stride": 2, "padding_mode": "REFLECT"}, (4, 8, 8)),
    (2, {"padding": 1, "padding_mode": "CIRCULAR", "groups": 4}, (4, 7, 6)),
    (2, {"padding": "VALID", "padding_mode": "REPLICATE", "use_bias": True}, (4, 7, 6)),
    (3, {"stride": (1, 2, 1), "padding": 1}, (4, 4, 5, 3)),
]


@pytest.mark.parametrize(("rank", "kw", "shape"), CONV_CASES)
def test_conv_equals_equinox(rank, kw, shape):
    args = (rank, 4, 8, 3)
    check_same(peqx.Conv(*args, key=jax.random.key(0), **kw),
               eqx.nn.Conv(*args, key=jax.random.key(0), **kw), _normal(1, shape))


TRANSPOSE_CASES = [
    (1, 3, {"stride": 2}, (4, 5)),
    (2, 3, {"stride": 2, "padding": "SAME"}, (4, 5, 4)),
    (2, 3, {"stride": 3, "padding": "SAME", "output_padding": 1}, (4, 5, 4)),
    (2, 2, {"stride": 4, "padding": "SAME_LOWER", "output_padding": 2}, (4, 3, 4)),
    (2, 3, {"stride": (2, 3), "padding": ((1, 2), (0, 1)), "dilation": (1, 2), "groups": 2,
            "output_padding": (1, 2)}, (4, 4, 5)),
    (2, 3, {"padding": "SAME_LOWER", "stride": 2, "output_padding": 1, "groups": 4},
     (4, 4, 4)),
    (2, 3, {"padding": "VALID", "stride": 2, "dilation": 2, "use_bias": True}, (4, 4, 5)),
    (3, 2, {"stride": 2, "padding": 1, "output_padding": 1, "groups": 2}, (4, 3, 3, 2)),
]


@pytest.mark.parametrize(("rank", "kernel", "kw", "shape"), TRANSPOSE_CASES)
def test_conv_transpose_equals_equinox(rank, kernel, kw, shape):
    args = (rank, 4, 8, kernel)
    check_same(peqx.ConvTranspose(*args, key=jax.random.key(0), **kw),
               eqx.nn.ConvTranspose(*args, key=jax.random.key(0), **kw), _normal(1, shape))


def test_channels_last_and_auto_pad():
    """``data_format="NXC"`` is Equinox's layer on moved axes; ``auto_pad="same_upper"`` is
    Equinox's ``"SAME"`` where the two agree (no output_padding, kernel >= stride)."""
    kw = {"stride": 2, "groups": 2, "key": jax.random.key(0)}
    theirs = eqx.nn.ConvTranspose(2, 4, 6, 4, padding="SAME", **kw)
    x = _normal(1, (4, 5, 3))
    ours = peqx.ConvTranspose(2, 4, 6, 4, auto_pad="same_upper", data_format="NXC", **kw)
    y = ours(jnp.moveaxis(x, 0, -1))
    ref = jnp.moveaxis(theirs(x), 0, -1)
    mag = jnp.moveaxis(_absolute(theirs)(jnp.abs(x)), 0, -1)
    assert_within_bound(y, ref, mag, terms(x, y, theirs.weight))


def test_vmap_jit_and_polyconv_gradients():
    model = peqx.ConvTranspose(2, 3, 4, 3, stride=2, groups=1, key=jax.random.key(0))
    xs = _normal(1, (5, 3, 4, 4))
    batched = eqx.filter_jit(lambda m, x: jax.vmap(m)(x))(model, xs)
    np.testing.assert_allclose(batched[2], model(xs[2]), rtol=1e-5, atol=1e-6)
    jaxpr = str(jax.make_jaxpr(jax.grad(lambda w: jnp.sum(
        eqx.tree_at(lambda m: m.weight, model, w)(xs[0]) ** 2)))(model.weight))
    assert "polyconv_backward_weights" in jaxpr and "conv_general_dilated" not in jaxpr


def test_trains_with_optax():
    key1, key2 = jax.random.split(jax.random.key(0))
    model = (peqx.Conv(1, 2, 4, 3, stride=2, padding=1, key=key1),
             peqx.ConvTranspose(1, 4, 2, 3, stride=2, output_padding=1, dilation=1, groups=2,
                                padding=1, key=key2))
    x = _normal(3, (8, 2, 8))

    def loss(model):
        down, up = model
        y = jax.vmap(lambda xi: up(jax.nn.relu(down(xi))))(x)
        return jnp.mean((y - x) ** 2)

    optimizer = optax.adam(3e-2)
    state = optimizer.init(eqx.filter(model, eqx.is_array))

    @eqx.filter_jit
    def step(model, state):
        value, grads = eqx.filter_value_and_grad(loss)(model)
        updates, state = optimizer.update(grads, state)
        return eqx.apply_updates(model, updates), state, value

    losses = []
    for _ in range(15):
        model, state, value = step(model, state)
        losses.append(float(value))
    assert losses[-1] < 0.8 * losses[0], losses


@pytest.mark.parametrize("name", ["Conv", "ConvTranspose"])
def test_serialised_leaves_interchange_with_equinox(name, tmp_path):
    ours = getattr(peqx, name)(2, 4, 6, 3, stride=2, groups=2, key=jax.random.key(1))
    path = tmp_path / "model.eqx"
    eqx.tree_serialise_leaves(path, ours)
    x = _normal(1, (4, 5, 5))
    for like in (getattr(eqx.nn, name)(2, 4, 6, 3, stride=2, groups=2, key=jax.random.key(2)),
                 getattr(peqx, name)(2, 4, 6, 3, stride=2, groups=2, key=jax.random.key(3))):
        loaded = eqx.tree_deserialise_leaves(path, like)
        np.testing.assert_array_equal(loaded.weight, ours.weight)
        np.testing.assert_allclose(loaded(x), ours(x), rtol=1e-5, atol=1e-5)
    theirs = eqx.tree_deserialise_leaves(path, eqx.nn.ConvTranspose(
        2, 4, 6, 3, stride=2, groups=2, key=jax.random.key(2))) if name == "ConvTranspose" \
        else None
    if theirs is not None:
        eqx.tree_serialise_leaves(path, theirs)
        back = eqx.tree_deserialise_leaves(path, ours)
        np.testing.assert_array_equal(back.weight, theirs.weight)


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="padding_mode"):
        peqx.ConvTranspose(2, 2, 2, 3, padding="SAME", padding_mode="CIRCULAR",
                           key=jax.random.key(0))
    with pytest.raises(ValueError, match="vmap"):
        peqx.Conv(2, 2, 2, 3, key=jax.random.key(0))(jnp.ones((1, 2, 5, 5)))


def test_docstring_examples():
    assert_doctests_pass(peqx)
