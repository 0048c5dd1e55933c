"""A DCGAN generator in Flax nnx, trained a few steps with optax.

The generator upsamples with ``polyconv.layers.flax.ConvTranspose``: Flax's own module
(``kernel`` and ``bias`` params, ``rngs``, ``padding``) plus what ``flax.nnx.ConvTranspose``
lacks, here ``output_padding`` and ``feature_group_count``. Its gradients are polyconv's own
backward ops. To keep it fast on a CPU the "discriminator" is replaced by a fixed target: the
generator learns to reproduce 16x16 images from their latent codes (the adversarial loop is
the usual one; only the loss changes).

Run it with ``python examples/dcgan_flax_nnx.py`` (needs ``polyconv-ops[flax]`` and optax).
"""

import sys

import numpy as np

try:
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
except ImportError:
    sys.exit("this example needs Flax and optax: pip install 'polyconv-ops[flax]' optax")

from polyconv.layers.flax import Conv, ConvTranspose


class Generator(nnx.Module):
    """latent [N, 1, 1, 16] -> [N, 4, 4, 32] -> [N, 8, 8, 16] -> [N, 16, 16, 1]."""

    def __init__(self, rngs: nnx.Rngs):
        # 1 -> 4: a 4x4 kernel, no padding ("VALID"), as DCGAN's first layer
        self.project = ConvTranspose(16, 32, (4, 4), padding="VALID", rngs=rngs)
        self.norm1 = nnx.BatchNorm(32, rngs=rngs)
        # 4 -> 8 and 8 -> 16: Flax's padding (zeros around the dilated input) plus
        # output_padding at the end, the geometry of PyTorch's ConvTranspose2d(3, stride=2,
        # padding=1, output_padding=1); the first one grouped
        self.up1 = ConvTranspose(32, 16, (3, 3), strides=2, padding=((1, 1), (1, 1)),
                                 output_padding=1, feature_group_count=2, rngs=rngs)
        self.norm2 = nnx.BatchNorm(16, rngs=rngs)
        self.up2 = ConvTranspose(16, 8, (3, 3), strides=2, padding=((1, 1), (1, 1)),
                                 output_padding=1, rngs=rngs)
        self.out = Conv(8, 1, (3, 3), padding="SAME", rngs=rngs)

    def __call__(self, z):
        x = nnx.relu(self.norm1(self.project(z)))
        x = nnx.relu(self.norm2(self.up1(x)))
        x = nnx.relu(self.up2(x))
        return jnp.tanh(self.out(x))


def main() -> None:
    rng = np.random.default_rng(0)                  # numpy: nothing to compile for the data
    z = jnp.asarray(rng.standard_normal((32, 1, 1, 16)), jnp.float32)
    grid = np.linspace(-1, 1, 16, dtype=np.float32)
    phase = rng.uniform(0, np.pi, (32, 1, 1, 1)).astype(np.float32)
    target = jnp.asarray(np.sin(3 * grid[None, :, None, None] + phase)
                         * np.cos(2 * grid[None, None, :, None]))

    model = Generator(nnx.Rngs(0))
    assert model(z).shape == (32, 16, 16, 1)
    optimizer = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer):
        def loss_fn(model):
            return jnp.mean((model(z) - target) ** 2)

        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    losses = [float(step(model, optimizer)) for _ in range(40)]
    print(f"generator loss: {losses[0]:.4f} -> {losses[-1]:.4f} in {len(losses)} Adam steps")
    assert losses[-1] < 0.5 * losses[0], losses
    print("the generator's kernel is Flax's layout:", model.up2.kernel.shape,
          "(KH, KW, in, out / groups), used as flax.nnx.ConvTranspose uses it")
    jax.block_until_ready(model(z))


if __name__ == "__main__":
    main()
