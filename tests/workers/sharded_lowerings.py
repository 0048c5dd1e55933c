"""Worker of tests/test_jax_scale_out.py: every lowering of every primitive on inputs
batch-sharded over 8 CPU devices (auto and explicit meshes) equals the unsharded result and
keeps the batch split. Prints "lowerings sharding ok"."""

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from polyconv_jax import _choice

import polyconv

jax.config.update("jax_enable_x64", True)
assert jax.device_count() == 8, jax.devices()
rng = np.random.default_rng(0)
N = 16

def ops(attrs, w_shape):
    # primitive -> (function, index of the batch-sized input, output sharded on batch)
    return {
        "backward_data": (lambda x, w: polyconv.conv_transpose(x, w, **attrs), True),
        "forward": (lambda dy, w: polyconv.conv_transpose_backward_data(dy, w, **attrs),
                    True),
        "backward_weights": (lambda x, dy: polyconv.conv_transpose_backward_weights(
            x, dy, w_shape, **attrs), False),
    }

for axis_type in (AxisType.Auto, AxisType.Explicit):
    mesh = jax.make_mesh((8,), ("data",), axis_types=(axis_type,))
    batch, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    for fmt in ("NXC", "NCX"):
        for groups, ic in ((2, 4), (4, 4)):     # grouped; depthwise (one channel a group)
            attrs = dict(strides=(2, 3), pads_begin=(1, 0), pads_end=(0, 1),
                         output_padding=(1, 2), groups=groups, data_format=fmt)
            x = rng.standard_normal((N, 5, 4, ic) if fmt == "NXC" else (N, ic, 5, 4))
            w = rng.standard_normal((3, 2, 6 // groups, ic))   # XOI: OC = 6
            dy = rng.standard_normal(
                polyconv.infer_shape("ConvTranspose", x.shape, w.shape, **attrs).shape)
            args = {"backward_data": (x, w), "forward": (dy, w),
                    "backward_weights": (x, dy)}
            for primitive, (fn, batched) in ops(attrs, w.shape).items():
                if primitive == "backward_weights" and axis_type == AxisType.Explicit:
                    # contracting the sharded batch needs an out_sharding in explicit
                    # mode, which no backward_weights lowering passes yet (nor did the
                    # one-convolution lowering before them)
                    continue
                plain = args[primitive]
                sharded = [jax.device_put(a, batch if a.shape[0] == N else replicated)
                           for a in plain]
                for name in _choice.LOWERINGS[primitive]:
                    with polyconv.implementation(f"jax:{primitive}={name}"):
                        got = jax.jit(fn)(*sharded)
                        want = jax.jit(fn)(*plain)
                    where = (axis_type, fmt, groups, primitive, name)
                    np.testing.assert_allclose(np.asarray(got), np.asarray(want),
                                               rtol=1e-12, atol=1e-12, err_msg=str(where))
                    if batched:
                        assert got.sharding.is_equivalent_to(batch, got.ndim), where
                    else:
                        assert got.sharding.is_fully_replicated, (where, got.sharding)
print("lowerings sharding ok")
