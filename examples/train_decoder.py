"""Train a small decoder whose upsampling is a grouped, strided, output-padded ConvTranspose.

``jax.jit(jax.grad(...))`` differentiates straight through polyconv's ops: the gradients of
``conv_transpose`` are ``conv_transpose_backward_data`` / ``_backward_weights`` with the same
attributes. The data are synthetic: images made by a fixed random "teacher" decoder of the same
shape, which the student learns to imitate.

Run it with ``python examples/train_decoder.py`` (needs jax).
"""

import sys

import numpy as np

import polyconv

try:
    import jax
    import jax.numpy as jnp
except ImportError:
    sys.exit("this example needs JAX: pip install 'polyconv-ops[jax]'")

# latent [N, 4, 4, 8] --ConvTranspose (groups 2, stride 2, pads 1, output_padding 1)-->
# [N, 8, 8, 8] --relu, Convolution 3x3 same--> image [N, 8, 8, 1]
# Weights: ConvTranspose XOI [K, K, OC/groups, IC], Convolution XIO [K, K, IC, OC] (defaults).
UP = {"strides": 2, "pads_begin": 1, "pads_end": 1, "output_padding": 1, "groups": 2}
OUT = {"auto_pad": "same_upper"}


def init(seed, scale=0.3):
    rng = np.random.default_rng(seed)  # numpy: no compilation for a one-off draw
    return {
        "up_w": jnp.asarray(scale * rng.standard_normal((3, 3, 4, 8)), jnp.float32),  # XOI
        "up_b": jnp.zeros(8),
        "out_w": jnp.asarray(scale * rng.standard_normal((3, 3, 8, 1)), jnp.float32),  # XIO
        "out_b": jnp.zeros(1),
    }


def decode(params, z):
    h = polyconv.conv_transpose(z, params["up_w"], params["up_b"], **UP)
    h = jax.nn.relu(h)
    return polyconv.convolution(h, params["out_w"], params["out_b"], **OUT)


def loss(params, z, target):
    return jnp.mean((decode(params, z) - target) ** 2)


teacher = init(seed=1, scale=0.5)
z = jnp.asarray(np.random.default_rng(2).standard_normal((32, 4, 4, 8)), jnp.float32)
images = decode(teacher, z)
print("latent", z.shape, "-> images", images.shape)

params = init(seed=0)
grad = jax.jit(jax.grad(loss))  # the gradients run polyconv's backward ops
loss_jit = jax.jit(loss)
LR = 0.05


@jax.jit
def sgd_step(params, z, images):
    g = grad(params, z, images)
    return jax.tree_util.tree_map(lambda p, d: p - LR * d, params, g)


losses = [float(loss_jit(params, z, images))]
for step in range(1, 201):
    params = sgd_step(params, z, images)
    if step % 50 == 0:
        losses.append(float(loss_jit(params, z, images)))
        print(f"step {step:3d}  loss {losses[-1]:.5f}")

print(f"loss {losses[0]:.5f} -> {losses[-1]:.5f}")
assert losses[-1] < 0.5 * losses[0], "the loss did not fall"
