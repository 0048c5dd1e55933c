"""One training step of a small 3-D U-Net on a volume split along its depth over 8 devices.

Every convolution of the network is ``polyconv.spatially_sharded``: each device holds an
eighth of the volume's depth, and before each layer receives from its two neighbours only the
planes that layer reads (one ``ppermute`` each way). ``jax.grad`` of the loss runs the same
exchanges in reverse through polyconv's own backward ops; the weights gradients are summed
over the devices. The step equals the same step computed unsharded.

On a CPU-only machine JAX can pretend to have several devices: the XLA flag below must be set
before jax is imported. Run it with ``python examples/unet3d_spatially_sharded.py``.

``--processes 2`` runs the same step as a multi-host program would, on this machine: it starts
2 processes of 4 devices each, joined by ``jax.distributed.initialize`` (the coordinator on a
free localhost port, or ``--port``). The 8 devices of the mesh are then those of both
processes; each process builds only its devices' parts of the global arrays and checks only
those parts of the result.
"""

import argparse
import os
import socket
import subprocess
import sys
import time
from functools import partial

import numpy as np

import polyconv

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--processes", type=int, choices=(1, 2), default=1)
parser.add_argument("--port", type=int, default=0, help="the coordinator's port (default: a "
                    "free one); used with --processes")
parser.add_argument("--process-id", type=int, help="set by the launcher for each process")
args = parser.parse_args()
TIMEOUT = 300   # seconds for the whole multi-process run


def launch():
    """Start the processes, wait for all of them, and fail if any fails or hangs."""
    try:   # reserve a port; the coordinator (process 0) binds it again
        with socket.socket() as s:
            s.bind(("127.0.0.1", args.port))
            port = s.getsockname()[1]
    except OSError as e:
        sys.exit(f"cannot bind 127.0.0.1:{args.port} for the coordinator ({e}): pass a free "
                 f"--port, or none to pick one")
    command = [sys.executable, __file__, "--processes", str(args.processes), "--port",
               str(port), "--process-id"]
    procs = [subprocess.Popen([*command, str(i)]) for i in range(args.processes)]
    deadline, timed_out = time.monotonic() + TIMEOUT, False
    while any(p.poll() is None for p in procs):
        timed_out = time.monotonic() > deadline
        if timed_out or any(p.poll() for p in procs):   # a failed one leaves the rest waiting
            for p in procs:
                p.kill()
        time.sleep(0.2)
    failed = [f"process {i} exited with {p.returncode}" for i, p in enumerate(procs)
              if p.returncode]
    if timed_out:
        failed.insert(0, f"timed out after {TIMEOUT} s")
    if failed:
        sys.exit("; ".join(failed))


if args.processes > 1 and args.process_id is None:
    launch()
    sys.exit()

devices = 8 // args.processes   # in each process
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + f" --xla_force_host_platform_device_count={devices}").strip()

try:
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec
except ImportError:
    sys.exit("this example needs JAX: pip install 'polyconv-ops[jax]'")

if args.processes > 1:   # before anything touches a device
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{args.port}", num_processes=args.processes,
                               process_id=args.process_id, initialization_timeout=120)
if jax.device_count() < 8:
    sys.exit("expected 8 devices: was jax imported before XLA_FLAGS was set?")
mesh = jax.make_mesh((8,), ("depth",))
split = NamedSharding(mesh, PartitionSpec(None, "depth"))     # NXC: split D over the devices
replicated = NamedSharding(mesh, PartitionSpec())

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
        y = unet(params, x, conv)
        return jnp.mean((y - target) ** 2), y
    (value, y), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return value, y, jax.tree.map(lambda p, g: p - lr * g, params, grads)


rng = np.random.default_rng(0)   # the same seed in every process: the same data


def init(*shape):
    return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[:-1]))).astype(np.float32)


params = {"e1": init(3, 3, 3, 1, 8), "down": init(3, 3, 3, 8, 16), "e2": init(3, 3, 3, 16, 16),
          "up": init(3, 3, 3, 8, 16),          # XOI: ConvTranspose 16 -> 8 channels
          "d1": init(3, 3, 3, 16, 8), "head": init(1, 1, 1, 8, 1)}
x = rng.standard_normal((1, 16, 16, 16, 1)).astype(np.float32)   # N, D, H, W, C
target = rng.standard_normal((1, 16, 16, 16, 1)).astype(np.float32)


def global_array(a, sharding):
    """A global array of which this process fills only its own devices' parts."""
    return jax.make_array_from_callback(a.shape, sharding, lambda index: a[index])


xs, ts = global_array(x, split), global_array(target, split)
ps = jax.tree.map(lambda p: global_array(p, replicated), params)
loss_sharded, y_sharded, new_sharded = jax.jit(partial(step, conv=sharded))(ps, xs, ts)
with jax.default_device(jax.local_devices()[0]):   # the unsharded step, on one device
    loss_plain, y_plain, new_plain = jax.jit(partial(step, conv=plain))(params, x, target)


def check_local_parts(got, want, **tolerances):
    """Compare the parts of a global array held by this process's devices."""
    for shard in got.addressable_shards:
        np.testing.assert_allclose(shard.data, np.asarray(want)[shard.index], **tolerances)


if jax.process_index() == 0:
    print(f"volume {x.shape[1:4]} split along D: {x.shape[1] // 8} planes per device, "
          f"{xs.sharding.spec}")
    print(f"loss sharded {float(loss_sharded):.6f}, unsharded {float(loss_plain):.6f}")
check_local_parts(loss_sharded, loss_plain, rtol=1e-5)
check_local_parts(y_sharded, y_plain, rtol=1e-4, atol=1e-5)   # split along D like x
for name in params:
    check_local_parts(new_sharded[name], new_plain[name], rtol=1e-4, atol=1e-6, err_msg=name)
if jax.process_index() == 0:
    print("sharded step == unsharded step (the output, every updated weight)")
