"""A grouped, dilated ConvTranspose with ``output_padding`` in Equinox.

``polyconv.layers.equinox.ConvTranspose`` is ``equinox.nn.ConvTranspose`` (same signature,
``weight``/``bias`` fields and initialisation, unbatched ``[C, X..]`` inputs) computed by
polyconv: its weight gradient is one strided convolution, where Equinox's layer goes through
XLA's lhs-dilated convolution (equinox#1041). This script checks the layer against Equinox's
own on a configuration both have, then trains a small upsampler a few steps.

Run it with ``python examples/equinox_grouped_conv_transpose.py`` (needs
``polyconv-ops[equinox]`` and optax).
"""

import sys

import numpy as np

try:
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import optax
except ImportError:
    sys.exit("this example needs Equinox and optax: pip install 'polyconv-ops[equinox]' optax")

from polyconv.layers.equinox import ConvTranspose

# 2-D, 8 -> 6 channels in 2 groups, kernel 3 dilated by 2, stride 2, pads of the equivalent
# convolution (1, 2) x (2, 1), output_padding 1: [8, 5, 6] -> [6, 11, 13]
CONFIG = {"stride": 2, "dilation": 2, "groups": 2, "padding": ((1, 2), (2, 1)),
          "output_padding": 1}


def main() -> None:
    key = jax.random.key(0)
    ours = ConvTranspose(2, 8, 6, 3, key=key, **CONFIG)
    theirs = eqx.nn.ConvTranspose(2, 8, 6, 3, key=key, **CONFIG)
    assert (ours.weight == theirs.weight).all()          # same key, same initialisation

    x = jnp.asarray(np.random.default_rng(0).standard_normal((8, 5, 6)), jnp.float32)
    y = ours(x)
    print("output:", y.shape, "max |polyconv - equinox| =",
          float(jnp.abs(y - theirs(x)).max()))
    assert y.shape == (6, 11, 13)
    assert jnp.allclose(y, theirs(x), atol=1e-5)

    # train it to imitate a fixed "teacher" upsampler on a batch (jax.vmap over unbatched
    # inputs, as in Equinox)
    teacher = ConvTranspose(2, 8, 6, 3, key=jax.random.key(1), **CONFIG)
    xs = jnp.asarray(np.random.default_rng(1).standard_normal((16, 8, 5, 6)), jnp.float32)
    targets = jax.vmap(teacher)(xs)
    optimizer = optax.adam(1e-2)
    state = optimizer.init(eqx.filter(ours, eqx.is_array))

    @eqx.filter_jit
    def step(model, state):
        def loss_fn(model):
            return jnp.mean((jax.vmap(model)(xs) - targets) ** 2)

        loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
        updates, state = optimizer.update(grads, state)
        return eqx.apply_updates(model, updates), state, loss

    losses = []
    for _ in range(30):
        ours, state, loss = step(ours, state)
        losses.append(float(loss))
    print(f"loss: {losses[0]:.4f} -> {losses[-1]:.4f} in {len(losses)} Adam steps")
    assert losses[-1] < 0.5 * losses[0], losses


if __name__ == "__main__":
    main()
