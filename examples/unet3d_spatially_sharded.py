"""One training step of a small 3-D U-Net on a volume split along its depth over 8 devices.

Every convolution of the network is ``polyconv.spatially_sharded``: each device holds an
eighth of the volume's depth, and before each layer receives from its two neighbours only the
planes that layer reads (one ``ppermute`` each way). ``jax.grad`` of the loss runs the same
exchanges in reverse through polyconv's own backward ops; the weights gradients are summed
over the devices. The step equals the same step computed unsharded.

On a CPU-only machine JAX can pretend to have several devices: the XLA flag below must be set
before jax is imported. Run it with ``python examples/unet3d_spatially_sharded.py``.
"""

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import numpy as np

import polyconv

try:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec
except ImportError:
    sys.exit("this example needs JAX: pip install 'polyconv-ops[jax]'")

if jax.device_count() < 8:
    sys.exit("expected 8 devices: was jax imported before XLA_FLAGS was set?")
mesh = jax.make_mesh((8,), ("depth",))
split = NamedSharding(mesh, PartitionSpec(None, "depth"))     # NXC: split D over the devices

SAME = {"auto_pad": "same_upper"}
DOWN = {"strides": 2, "pads_begin": 1, "pads_end": 1}                      # k3 s2
UP = {"strides": 2, "pads_begin": 1, "pads_end": 1, "output_padding": 1}   # k3 s2 op1


def unet(params, x, conv):
    """Two levels: conv, down, conv, up (ConvTranspose), skip connection, conv, 1x1x1 head."""
    relu = jax.nn.relu
    e1 = relu(conv("convolution", x, params["e1"], **SAME))              # 16^3 x 8
    e2 = relu(conv("convolution", e1, params["down"], **DOWN))          # 8^3 x 16
    e2 = relu(conv("convolution", e2, params["e2"], **SAME))
    u = relu(conv("conv_transpose", e2, params["up"], **UP))             # 16^3 x 8
    d = relu(conv("convolution", jnp.concatenate([u, e1], axis=-1), params["d1"], **SAME))
    return conv("convolution", d, params["head"])                       # 1x1x1: 16^3 x 1


def sharded(op, x, w, **attrs):
    return polyconv.spatially_sharded(op, x, w, mesh=mesh, spatial=("depth",), **attrs)


def plain(op, x, w, **attrs):
    return getattr(polyconv, op)(x, w, **attrs)


def step(params, x, target, conv, lr=0.05):
    def loss(params):
        return jnp.mean((unet(params, x, conv) - target) ** 2)
    value, grads = jax.value_and_grad(loss)(params)
    return value, jax.tree.map(lambda p, g: p - lr * g, params, grads)


rng = np.random.default_rng(0)


def init(*shape):
    return jnp.asarray(rng.standard_normal(shape) / np.sqrt(np.prod(shape[:-1])), jnp.float32)


params = {"e1": init(3, 3, 3, 1, 8), "down": init(3, 3, 3, 8, 16), "e2": init(3, 3, 3, 16, 16),
          "up": init(3, 3, 3, 8, 16),          # XOI: ConvTranspose 16 -> 8 channels
          "d1": init(3, 3, 3, 16, 8), "head": init(1, 1, 1, 8, 1)}
x = jnp.asarray(rng.standard_normal((1, 16, 16, 16, 1)), jnp.float32)   # N, D, H, W, C
target = jnp.asarray(rng.standard_normal((1, 16, 16, 16, 1)), jnp.float32)

xs, ts = jax.device_put(x, split), jax.device_put(target, split)
loss_sharded, new_sharded = jax.jit(lambda p, x, t: step(p, x, t, sharded))(params, xs, ts)
loss_plain, new_plain = jax.jit(lambda p, x, t: step(p, x, t, plain))(params, x, target)

print(f"volume {x.shape[1:4]} split along D: {x.shape[1] // 8} planes per device, "
      f"{xs.sharding.spec}")
print(f"loss sharded {float(loss_sharded):.6f}, unsharded {float(loss_plain):.6f}")
np.testing.assert_allclose(loss_sharded, loss_plain, rtol=1e-5)
for name in params:
    np.testing.assert_allclose(new_sharded[name], new_plain[name], rtol=1e-4, atol=1e-6,
                               err_msg=name)
print("sharded step == unsharded step (every updated weight)")
