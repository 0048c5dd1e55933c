"""Shard a batch over 8 devices and run a ConvTranspose on it, under jax.jit.

On a CPU-only machine JAX can pretend to have several devices: the XLA flag below must be set
before jax is imported. polyconv's JAX backend passes the attributes as static numbers to
``lax.conv_general_dilated``, so XLA partitions the op along the batch like any other; the
result stays sharded and equals the unsharded numpy result.

Run it with ``python examples/sharded_batch.py`` (needs jax).
"""

import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()

import numpy as np

import polyconv

try:
    import jax
    from jax.sharding import NamedSharding, PartitionSpec
except ImportError:
    sys.exit("this example needs JAX: pip install 'polyconv-ops[jax]'")

devices = jax.devices()
print(f"{len(devices)} devices:", ", ".join(str(d) for d in devices))
if len(devices) < 8:
    sys.exit("expected 8 devices: was jax imported before XLA_FLAGS was set?")

mesh = jax.make_mesh((8,), ("batch",))
batch = NamedSharding(mesh, PartitionSpec("batch"))   # split axis 0 (N) over the devices
replicated = NamedSharding(mesh, PartitionSpec())

rng = np.random.default_rng(0)
x = rng.standard_normal((16, 6, 6, 8)).astype(np.float32)   # NXC, 2 samples per device
w = rng.standard_normal((3, 3, 4, 8)).astype(np.float32)    # XOI: [K, K, OC, IC]
attrs = {"strides": 2, "auto_pad": "same_upper"}

x_sharded = jax.device_put(x, batch)
w_replicated = jax.device_put(w, replicated)


@jax.jit
def upsample(x, w):
    return polyconv.conv_transpose(x, w, **attrs)


y = upsample(x_sharded, w_replicated)
print("input ", x_sharded.shape, x_sharded.sharding.spec)
print("output", y.shape, y.sharding.spec)
for shard in y.addressable_shards[:2]:
    print("  shard on", shard.device, "holds rows", shard.index[0], "shape", shard.data.shape)
assert len(y.addressable_shards) == 8
assert all(s.data.shape[0] == 2 for s in y.addressable_shards), "the batch is not split"

expected = polyconv.conv_transpose(x, w, **attrs)  # numpy, one device
np.testing.assert_allclose(np.asarray(y), expected, rtol=1e-5, atol=1e-5)
print("sharded result == numpy result")
