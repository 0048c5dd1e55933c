"""polyconv.layers.linen against flax.linen's own Conv and ConvTranspose: the same params
from the same key, the same outputs and gradients within the error bound."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import only_with_target
from layer_checks import assert_doctests_pass, assert_within_bound, terms

only_with_target("frameworks")
jax = pytest.importorskip("jax")
nn = pytest.importorskip("flax.linen")
jnp = jax.numpy

from polyconv.layers import linen as plinen  # noqa: E402


def _normal(seed: int, shape) -> jax.Array:
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, np.float32))


def _run(layer, params, x, g):
    def loss(params, x):
        y = layer.apply(params, x)
        return jnp.sum(y * g), y

    (_, y), (gp, gx) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1), has_aux=True))(
        params, x)
    return y, gx, gp


CASES = [
    ("Conv", (3,), {"padding": "CAUSAL", "kernel_dilation": 2}, (2, 9, 4)),
    ("Conv", (3, 3), {"padding": ((1, 2), (0, 1)), "strides": 2, "feature_group_count": 2},
     (2, 9, 8, 4)),
    ("Conv", (2, 3), {"padding": "CIRCULAR"}, (2, 6, 7, 4)),
    ("ConvTranspose", (4, 4), {"strides": 2}, (2, 5, 4, 4)),
    ("ConvTranspose", (3, 2), {"strides": (2, 3), "padding": ((1, 2), (0, 3)),
                               "kernel_dilation": (2, 1)}, (2, 4, 5, 4)),
    ("ConvTranspose", (3, 3), {"strides": 2, "padding": "VALID", "transpose_kernel": True},
     (2, 4, 5, 4)),
]


@pytest.mark.parametrize(("cls", "kernel", "kw", "shape"), CASES)
def test_equals_linen(cls, kernel, kw, shape):
    ours, theirs = getattr(plinen, cls)(6, kernel, **kw), getattr(nn, cls)(6, kernel, **kw)
    x = _normal(1, shape)
    params = theirs.init(jax.random.key(0), x)
    mine_params = ours.init(jax.random.key(0), x)
    jax.tree.map(np.testing.assert_array_equal, mine_params, params)
    g = _normal(7, jax.eval_shape(theirs.apply, params, x).shape)
    mine, ref = _run(ours, params, x, g), _run(theirs, params, x, g)
    mag = _run(theirs, jax.tree.map(jnp.abs, params), jnp.abs(x), jnp.abs(g))
    n = terms(x, ref[0], params["params"]["kernel"])
    assert_within_bound(mine[0], ref[0], mag[0], n, what="output")
    assert_within_bound(mine[1], ref[1], mag[1], n, what="input gradient")
    for key in ref[2]["params"]:
        assert_within_bound(mine[2]["params"][key], ref[2]["params"][key],
                            mag[2]["params"][key], n, what=f"{key} gradient")


def test_docstring_examples():
    assert_doctests_pass(plinen)
