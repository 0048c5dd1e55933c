"""Spatial sharding: :func:`polyconv.spatially_sharded` against XLA's own partitioning.

A 3-D U-Net decoder level on a volume split along D over 2, 4 and 8 host devices: a
ConvTranspose (``k2`` stride 2, or ``k3`` stride 2 with output_padding 1) doubling the volume
and halving the channels, then a 3x3x3 Convolution, forward and the gradient with respect to
both weights. Each side is one jitted program on the same mesh with the same input sharding:
polyconv's sharded ops, and the plain ``lax.conv_general_dilated`` calls
(:func:`~polyconv.benchmarks.peers.lax_function`, the ConvTranspose lhs-dilated as
``lax.conv_transpose`` emits it) with the data's sharding constrained to the same split, so
that XLA's SPMD partitioner decides the communication. Per side: the bytes per device of the
compiled program (XLA's memory analysis: arguments, outputs and temporaries), the bytes each
device receives (the result sizes of the program's collectives), which collectives, and the
seconds per call (median of interleaved rounds). Both sides' results are checked equal first.

Host devices share the machine's cores, so the times compare the two programs, not scaling.
Runs in a child process with as many host devices as the largest count asks, unless JAX has
them already. Run with ``polyconv bench --spatial [--devices 2,4,8] [--size D H W]``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

import polyconv

from .harness import log, machine, medians, time_calls, write_record
from .peers import lax_function, lax_weights

#: ConvTranspose variants of the level: name -> attributes on each spatial axis
UPSAMPLINGS = {"k2 s2": dict(kernel=2, strides=2, pads_begin=0, pads_end=0, output_padding=0),
               "k3 s2 op1": dict(kernel=3, strides=2, pads_begin=1, pads_end=1,
                                 output_padding=1)}
COLLECTIVES = ("collective-permute", "all-gather", "all-reduce", "all-to-all",
               "reduce-scatter")
_DTYPE_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "s32": 4, "u32": 4, "pred": 1}
_TYPE = re.compile(r"(\w+)\[([\d,]*)\]")
CHILD = "POLYCONV_BENCH_SPATIAL_CHILD"


def received_bytes(text: str) -> tuple[int, list[str]]:
    """Bytes per device that the collectives of a compiled program's text produce, and their
    kinds (a synchronous op's result, or an asynchronous pair's ``-done``)."""
    total, kinds = 0, set()
    for line in text.splitlines():
        found = re.search(r"= (\(?[^=]*?\)?) (" + "|".join(COLLECTIVES) + r")(-done)?\(", line)
        if not found:       # an asynchronous pair's -start is not matched: its -done is
            continue
        kinds.add(found[2])
        for dtype, dims in _TYPE.findall(found[1]):
            size = int(np.prod([int(d) for d in dims.split(",") if d])) if dims else 1
            total += size * _DTYPE_BYTES.get(dtype, 4)
    return total, sorted(kinds)


def memory_bytes(compiled: Any) -> int | None:
    """Arguments, outputs and temporaries of a compiled program, per device."""
    m = compiled.memory_analysis()
    if m is None:
        return None
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
               - m.alias_size_in_bytes)


def level(size, channels: int, up: dict[str, int]):
    """The level's two calls: their attributes, weights shapes and plans."""
    nd = len(size)
    t_attrs = dict(strides=up["strides"], pads_begin=up["pads_begin"],
                   pads_end=up["pads_end"], output_padding=up["output_padding"])
    c_attrs = dict(auto_pad="same_upper")
    wt = (up["kernel"],) * nd + (channels // 2, channels)     # XOI
    wc = (3,) * nd + (channels // 2, channels // 2)            # XIO
    pt = polyconv.infer_shape("conv_transpose", (1, *size, channels), wt, **t_attrs)
    pc = polyconv.infer_shape("convolution", pt.shape, wc, **c_attrs)
    return t_attrs, c_attrs, wt, wc, pt, pc


def sides(mesh, size, channels, up):
    """The two programs, as functions of (x, transposed weights, convolution weights), and
    the lax side's weights from polyconv's."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    t_attrs, c_attrs, _, _, pt, pc = level(size, channels, up)
    split = NamedSharding(mesh, P(None, "z"))

    def ours(x, wt, wc):
        y = polyconv.spatially_sharded("conv_transpose", x, wt, mesh=mesh, spatial=("z",),
                                       **t_attrs)
        y = jax.nn.relu(y)
        return polyconv.spatially_sharded("convolution", y, wc, mesh=mesh, spatial=("z",),
                                          **c_attrs)

    up_lax, conv_lax = lax_function(pt, "backward_data"), lax_function(pc, "forward")

    def xla(x, wt, wc):
        y = jax.lax.with_sharding_constraint(up_lax(x, wt), split)
        y = jax.nn.relu(y)
        return jax.lax.with_sharding_constraint(conv_lax(y, wc), split)

    def lax_side_weights(wt, wc):
        return (lax_weights(pt, "backward_data", np.transpose(wt, pt.weights_perm)),
                lax_weights(pc, "forward", np.transpose(wc, pc.weights_perm)))
    return ours, xla, lax_side_weights, split


def run_level(devices: int, size, channels: int, name: str, repeats: int) -> list[dict]:
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    up = UPSAMPLINGS[name]
    mesh = Mesh(np.array(jax.devices()[:devices]), ("z",))
    ours, xla, lax_side_weights, split = sides(mesh, size, channels, up)
    _, _, wt_shape, wc_shape, _, _ = level(size, channels, up)
    rng = np.random.default_rng(0)
    x = jax.device_put(rng.standard_normal((1, *size, channels), np.float32), split)
    wt = rng.standard_normal(wt_shape, np.float32) / np.sqrt(channels)
    wc = rng.standard_normal(wc_shape, np.float32) / np.sqrt(channels)
    replicated = NamedSharding(mesh, P())
    args = {"polyconv": (x, *(jax.device_put(w, replicated) for w in (wt, wc))),
            "xla": (x, *(jax.device_put(w, replicated) for w in lax_side_weights(wt, wc)))}
    rows = []
    for mode in ("forward", "gradient"):
        fns = {"polyconv": ours, "xla": xla}
        if mode == "gradient":
            fns = {k: jax.grad(lambda x, a, b, f=f: jnp.sum(f(x, a, b) ** 2), argnums=(1, 2))
                   for k, f in fns.items()}
        compiled = {k: jax.jit(f).lower(*args[k]).compile() for k, f in fns.items()}
        out = {k: jax.block_until_ready(c(*args[k])) for k, c in compiled.items()}
        if mode == "forward":
            diff = float(np.max(np.abs(np.asarray(out["polyconv"]) - np.asarray(out["xla"]))))
            scale = float(np.max(np.abs(np.asarray(out["xla"]))))
            if diff > 1e-4 * scale:
                msg = f"{name} on {devices}: the two sides differ by {diff} (scale {scale})"
                raise AssertionError(msg)
        times = medians(time_calls({k: (lambda c=c, a=args[k]: jax.block_until_ready(c(*a)))
                                    for k, c in compiled.items()}, repeats, 1, log,
                                   f"{name} {mode} on {devices}"))
        for k, c in compiled.items():
            moved, kinds = received_bytes(c.as_text())
            rows.append({"upsampling": name, "devices": devices, "mode": mode, "side": k,
                         "seconds": times[k], "memory_bytes": memory_bytes(c),
                         "received_bytes": moved, "collectives": kinds})
    return rows


def table(rows: list[dict]) -> str:
    head = (f"{'level':10} {'dev':>3} {'mode':8} {'side':8} {'ms':>9} {'MiB/dev':>9} "
            f"{'recv MiB':>9}  collectives")
    lines = [head, "-" * len(head)]
    for r in rows:
        mem = "-" if r["memory_bytes"] is None else f"{r['memory_bytes'] / 2**20:9.2f}"
        lines.append(f"{r['upsampling']:10} {r['devices']:>3} {r['mode']:8} {r['side']:8} "
                     f"{r['seconds'] * 1e3:9.2f} {mem:>9} {r['received_bytes'] / 2**20:9.3f}"
                     f"  {', '.join(r['collectives']) or '-'}")
    return "\n".join(lines)


def _child(argv: list[str], devices: int) -> int:
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"
    env = {**os.environ, "XLA_FLAGS": flags.strip(), "JAX_PLATFORMS": "cpu", CHILD: "1"}
    return subprocess.run([sys.executable, "-m", "polyconv", "bench", "--spatial", *argv],
                          env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="polyconv bench --spatial", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default="2,4,8",
                        help="device counts to split D over (default 2,4,8)")
    parser.add_argument("--size", type=int, nargs=3, default=(32, 32, 32),
                        metavar=("D", "H", "W"), help="the level's input volume")
    parser.add_argument("--channels", type=int, default=16,
                        help="input channels (the level halves them)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds")
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    counts = [int(c) for c in args.devices.split(",")]
    if not os.environ.get(CHILD):    # host devices are counted when JAX starts
        return _child(argv, max(counts))
    import jax

    if jax.device_count() < max(counts):
        parser.error(f"JAX has {jax.device_count()} devices, fewer than {max(counts)}")
    rows = []
    for name in UPSAMPLINGS:
        for n in counts:
            rows += run_level(n, tuple(args.size), args.channels, name, args.repeats)
    print(table(rows))
    write_record(args.json, {"machine": machine(), "size": list(args.size),
                               "channels": args.channels, "rows": rows})
    return 0
