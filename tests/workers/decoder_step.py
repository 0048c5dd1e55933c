"""A data-parallel training step of a small decoder built from polyconv ops, for the
scale-out tests (run as a script, never imported by pytest).

    python decoder_step.py sharded               # 8 CPU devices in one process
    python decoder_step.py distributed PORT ID   # process ID of 2, coordinator on localhost

Each mode computes one SGD step (forward, ``jax.grad``, update) with the batch sharded over
every device and compares it with the same step on one device, then prints ``step ok``.
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import polyconv

BATCH = 8


def init(rng):
    """Parameters of a decoder: latent 4x4x16 -> ConvTranspose 16->8 (k4 s2 p1) -> ReLU ->
    ConvTranspose 8->4 (k3 s2, grouped 2, output_padding 1) -> Convolution 4->3 (k3 p1)."""
    def u(*shape):
        return jnp.asarray(rng.uniform(-0.3, 0.3, shape), jnp.float32)
    return {"w1": u(4, 4, 8, 16), "b1": u(8), "w2": u(3, 3, 2, 8), "b2": u(4),
            "w3": u(3, 3, 4, 3), "b3": u(3)}


def decoder(params, z):
    h = polyconv.conv_transpose(z, params["w1"], params["b1"], strides=2, pads_begin=1,
                                pads_end=1)
    h = jax.nn.relu(h)
    h = polyconv.conv_transpose(h, params["w2"], params["b2"], strides=2, pads_begin=1,
                                pads_end=1, output_padding=1, groups=2)
    return polyconv.convolution(jnp.tanh(h), params["w3"], params["b3"], pads_begin=1,
                                pads_end=1)


def loss(params, z, target):
    return jnp.mean((decoder(params, z) - target) ** 2)


@jax.jit
def step(params, z, target):
    value, grads = jax.value_and_grad(loss)(params, z, target)
    return value, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


def data(rng):
    z = jnp.asarray(rng.standard_normal((BATCH, 4, 4, 16)), jnp.float32)
    target = jnp.asarray(rng.uniform(-1, 1, (BATCH, 16, 16, 3)), jnp.float32)
    return z, target


def check(value, params, ref_value, ref_params):
    np.testing.assert_allclose(np.asarray(value), np.asarray(ref_value), rtol=1e-5)
    for name in ref_params:
        np.testing.assert_allclose(np.asarray(params[name]), np.asarray(ref_params[name]),
                                   rtol=1e-5, atol=1e-6, err_msg=name)


def main(argv: list[str]) -> None:
    if argv[0] == "distributed":   # before anything touches a device
        port, pid = argv[1], int(argv[2])
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=pid,
                                   initialization_timeout=120)
        assert jax.process_count() == 2 and jax.device_count() == 2 * jax.local_device_count()
    rng = np.random.default_rng(0)
    params, (z, target) = init(rng), data(rng)
    with jax.default_device(jax.local_devices()[0]):
        ref_value, ref_params = step(params, z, target)    # on one device of this process
    mesh = jax.make_mesh((jax.device_count(),), ("batch",), axis_types=(AxisType.Auto,))
    batch, replicated = NamedSharding(mesh, P("batch")), NamedSharding(mesh, P())
    if argv[0] == "distributed":
        half = BATCH // 2
        local = slice(jax.process_index() * half, (jax.process_index() + 1) * half)
        zs, ts = (jax.make_array_from_process_local_data(batch, np.asarray(a)[local])
                  for a in (z, target))
        ps = jax.tree.map(lambda p: jax.make_array_from_process_local_data(
            replicated, np.asarray(p)), params)
    else:
        zs, ts = jax.device_put(z, batch), jax.device_put(target, batch)
        ps = jax.device_put(params, replicated)
    value, new = step(ps, zs, ts)
    assert all(p.sharding.is_fully_replicated for p in jax.tree.leaves(new))
    # replicated results: every process holds them whole
    check(value, jax.tree.map(lambda p: np.asarray(p.addressable_data(0)), new),
          ref_value, ref_params)
    print("step ok", argv[0], jax.process_index(), jax.device_count())


if __name__ == "__main__":
    main(sys.argv[1:])
