"""Worker of tests/test_jax_spatial_sharding.py: polyconv.spatially_sharded on 8 CPU devices.

``values``: the six ops on a grid of geometries (overlapping kernels larger than the stride,
strides, dilations, asymmetric pads, output_padding, groups, both data layouts, bfloat16),
split over 2, 3, 4 and 8 devices along one spatial axis (evenly or not) and over a 2x4 mesh
along two, equal the unsharded call and the float64 oracle. ``grads``: ``jax.grad`` of the
sharded Convolution and ConvTranspose equals the unsharded gradient and the oracle's backward
ops (and with a replicated bias, the unsharded gradient), that of two backward ops the
unsharded gradient, and the compiled programs' only collectives are the halo permutes (plus
the all-reduce of a weights gradient or a loss). ``errors``: the refusals. Prints "<section>
ok". (The step over 2 ``jax.distributed`` processes is examples/unet3d_spatially_sharded.py's
``--processes 2``, run by tests/test_examples.py.)"""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import polyconv

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the tests' oracle
from oracle import assert_within_bound, reference

rng = np.random.default_rng(0)
TRANSPOSED = {"conv_transpose", "conv_transpose_backward_data",
              "conv_transpose_backward_weights"}


def mesh_of(*shape):
    names = ("x", "y")[:len(shape)]
    return Mesh(np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape), names)


def calls(op, data, channels, weights, attrs, fmt, dtype):
    """The op's positional arguments: random arrays (and its shape argument)."""
    def arr(shape):
        return jnp.asarray(rng.standard_normal(shape), dtype=dtype)
    n, spatial = data
    cin = channels[0]

    def dshape(c, sp):
        return (n, *sp, c) if fmt == "NXC" else (n, c, *sp)
    family = "conv_transpose" if op in TRANSPOSED else "convolution"
    w = arr(weights)
    fwd = polyconv.infer_shape(family, dshape(cin, spatial), weights, **attrs)
    src, dst = dshape(cin, spatial), fwd.shape
    if op in ("convolution", "conv_transpose"):
        return (arr(src), w)
    if op in ("convolution_backward_data", "conv_transpose_backward_data"):
        return (arr(dst), w, src) if op == "convolution_backward_data" else (arr(dst), w)
    return (arr(src), arr(dst), weights)


# kernel, strides, dilations, pads_begin, pads_end, output_padding, groups, spatial size (of
# the Convolution's src / the ConvTranspose's src), channels in/out, devices on axis H
GRID = [
    ((3, 3), 1, 1, 1, 1, 0, 1, (16, 6), (3, 4), 8),        # same, overlapping
    ((3, 3), 2, 1, 1, 1, 1, 2, (16, 6), (4, 6), 4),        # k3 s2 op1, groups
    ((4, 3), 2, 1, 1, 1, 0, 1, (16, 6), (2, 3), 2),        # k4 s2
    ((2, 2), 2, 1, 0, 0, 0, 1, (16, 6), (2, 3), 8),        # k2 s2
    ((3, 3), 1, 2, (2, 1), (2, 1), 0, 1, (12, 5), (2, 3), 3),    # dilated, 3 devices
    ((5, 3), (3, 1), 1, (3, 1), (1, 1), (2, 0), 1, (24, 5), (2, 3), 4),   # s3 asymmetric
    ((3, 3), 2, 2, (2, 1), (1, 1), 0, 1, (16, 5), (2, 3), 4),    # strided and dilated
    ((3, 3), 2, 1, 0, 0, 1, 1, (18, 5), (2, 3), 2),        # shards read shifting windows
]
OPS = ("convolution", "convolution_backward_data", "convolution_backward_weights",
       "conv_transpose", "conv_transpose_backward_data", "conv_transpose_backward_weights")


def attrs_of(kernel, s, d, pb, pe, op, groups, transposed):
    attrs = dict(strides=s, dilations=d, pads_begin=pb, pads_end=pe, groups=groups)
    if transposed:
        attrs["output_padding"] = op
    return attrs


def check(op, args, attrs, mesh, spatial, dtype, where):
    plain = getattr(polyconv, op)(*args, **attrs)
    got = polyconv.spatially_sharded(op, *args, mesh=mesh, spatial=spatial, **attrs)
    assert got.shape == plain.shape and got.dtype == plain.dtype, (where, got.shape)
    arrays = [np.asarray(a, dtype=np.float64) for a in args if not isinstance(a, tuple)]
    shapes = {"convolution_backward_data": "dst_shape"}.get(op)
    extra = {shapes: args[-1]} if shapes else {}
    if op.endswith("backward_weights"):
        extra = {"weights_shape": args[-1]}
    ref = reference(op, *arrays, **attrs, **extra)
    name = str(jnp.dtype(dtype))
    try:
        assert_within_bound(got, ref.y, ref.abs_sum, ref.n, name)
        bound = 2 * (ref.n * (2.0 ** -52 if name == "float64" else 2.0 ** -23) * ref.abs_sum
                     + 2.0 ** -7 * np.abs(ref.y) * (name == "bfloat16"))
        diff = np.abs(np.asarray(got, np.float64) - np.asarray(plain, np.float64))
        assert (diff <= bound).all(), f"differs from the unsharded call by {diff.max()}"
    except AssertionError as e:
        raise AssertionError(f"{where}: {e}") from None
    return got


def values():
    cases = 0
    for g, (kernel, s, d, pb, pe, opad, groups, spatial, (ci, co), n) in enumerate(GRID):
        mesh = mesh_of(n)
        fmt = "NCX" if g % 3 == 2 else "NXC"
        # every op on the odd geometries, the two forward ops on the others (CI's budget)
        for op in OPS if g % 2 else ("convolution", "conv_transpose"):
            transposed = op in TRANSPOSED
            attrs = attrs_of(kernel, s, d, pb, pe, opad, groups, transposed)
            attrs["data_format"] = fmt
            chans = (ci, co)
            wshape = ((*kernel, ci // groups, co) if not transposed
                      else (*kernel, co // groups, ci))      # XIO / XOI
            args = calls(op, (2, spatial), chans, wshape, attrs, fmt, jnp.float64)
            check(op, args, attrs, mesh, ("x",), jnp.float64, f"grid {g} {op} on {n}")
            cases += 1
    # two spatial axes of a volume over a 2x4 mesh, and a bfloat16 one
    mesh = mesh_of(2, 4)
    for op in ("convolution", "conv_transpose", "conv_transpose_backward_weights"):
        transposed = op in TRANSPOSED
        attrs = attrs_of(None, 2, 1, 1, 1, (1, 1, 1), 1, transposed)
        wshape = (3, 3, 3, 2, 3) if not transposed else (3, 3, 3, 3, 2)
        args = calls(op, (1, (8, 16, 4)), (2, 3), wshape, attrs, "NXC", jnp.float64)
        check(op, args, attrs, mesh, ("x", "y"), jnp.float64, f"3-D {op} on 2x4")
        cases += 1
    attrs = dict(strides=2, pads_begin=1, pads_end=1, output_padding=1)
    args = calls("conv_transpose", (2, (8, 4)), (4, 4), (3, 3, 4, 4), attrs, "NXC",
                 jnp.bfloat16)
    check("conv_transpose", args, attrs, mesh, ("x", "y"), jnp.bfloat16, "bfloat16")
    # the other weights layouts (the plan's weights_perm), beside channels-first data
    for op, wshape, fmt in (("convolution", (4, 3, 3, 3), "OIX"),
                            ("conv_transpose", (3, 4, 3, 3), "IOX")):
        attrs = dict(strides=2, pads_begin=1, pads_end=1, data_format="NCX",
                     weights_format=fmt)
        if op == "conv_transpose":
            attrs["output_padding"] = 1
        args = calls(op, (2, (8, 6)), (3, 4), wshape, attrs, "NCX", jnp.float64)
        check(op, args, attrs, mesh_of(4), ("x",), jnp.float64, f"{op} {fmt}")
        cases += 1
    # uneven splits: zero rows appended to the input, the output's extra rows dropped
    for op, spatial, n, attrs in (
            ("convolution", (10, 5), 4, dict(auto_pad="same_upper")),
            ("convolution", (13, 5), 8, dict(strides=2, pads_begin=1, pads_end=1)),
            ("conv_transpose", (7, 5), 4, dict(strides=2, output_padding=1)),
            ("convolution_backward_weights", (10, 5), 3,
             dict(strides=2, pads_begin=1, pads_end=1)),
            ("conv_transpose_backward_data", (5, 4), 3, dict(strides=2))):
        wshape = (3, 3, 3, 2) if op in TRANSPOSED else (3, 3, 2, 3)
        args = calls(op, (2, spatial), (2, 3), wshape, attrs, "NXC", jnp.float64)
        check(op, args, attrs, mesh_of(n), ("x",), jnp.float64, f"uneven {op} on {n}")
        cases += 1
    # data parallel on top: the batch over one mesh axis, H over the other
    attrs = dict(strides=2, pads_begin=1, pads_end=1)
    args = calls("convolution_backward_weights", (4, (16, 4)), (2, 3), (3, 3, 2, 3), attrs,
                 "NXC", jnp.float64)
    got = polyconv.spatially_sharded("convolution_backward_weights", *args, mesh=mesh,
                                     spatial=("y",), batch="x", **attrs)
    ref = reference("convolution_backward_weights", *map(np.asarray, args[:2]),
                    weights_shape=args[2], **attrs)
    assert_within_bound(got, ref.y, ref.abs_sum, ref.n, "float64")
    print(f"values ok ({cases + 2} cases)")


def collectives(compiled):
    """The kinds of collective in a compiled program."""
    text = compiled.as_text()
    found = {c for c in ("all-gather", "all-to-all", "reduce-scatter", "all-reduce",
                         "collective-permute") if f" {c}(" in text or f" {c}-start(" in text}
    return found


def grads():
    for g in (1, 5, 7):
        kernel, s, d, pb, pe, opad, groups, spatial, (ci, co), n = GRID[g]
        mesh = mesh_of(n)
        split = NamedSharding(mesh, P(None, "x"))
        for op in ("convolution", "conv_transpose"):
            transposed = op == "conv_transpose"
            attrs = attrs_of(kernel, s, d, pb, pe, opad, groups, transposed)
            wshape = ((*kernel, ci // groups, co) if not transposed
                      else (*kernel, co // groups, ci))
            x, w = calls(op, (2, spatial), (ci, co), wshape, attrs, "NXC", jnp.float64)
            y = getattr(polyconv, op)(x, w, **attrs)
            ct = jnp.asarray(rng.standard_normal(y.shape))

            def loss(x, w, op=op, attrs=attrs, mesh=mesh, ct=ct):
                y = polyconv.spatially_sharded(op, x, w, mesh=mesh, spatial=("x",), **attrs)
                return jnp.sum(y * ct)

            def plain_loss(x, w, op=op, attrs=attrs, ct=ct):
                return jnp.sum(getattr(polyconv, op)(x, w, **attrs) * ct)
            xs = jax.device_put(x, split)
            step = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(xs, w).compile()
            dx, dw = step(xs, w)
            px, pw = jax.grad(plain_loss, argnums=(0, 1))(x, w)
            np.testing.assert_allclose(dx, px, rtol=1e-10, atol=1e-10, err_msg=f"{g} {op}")
            np.testing.assert_allclose(dw, pw, rtol=1e-10, atol=1e-10, err_msg=f"{g} {op}")
            data_grad = "conv_transpose_backward_data" if transposed else \
                "convolution_backward_data"
            wgrad = f"{op}_backward_weights"
            extra = {} if transposed else {"dst_shape": x.shape}
            rx = reference(data_grad, np.asarray(ct), np.asarray(w), **attrs, **extra)
            rw = reference(wgrad, np.asarray(x), np.asarray(ct), weights_shape=w.shape,
                           **attrs)
            assert_within_bound(dx, rx.y, rx.abs_sum, rx.n, "float64")
            assert_within_bound(dw, rw.y, rw.abs_sum, rw.n, "float64")
            assert dx.sharding.is_equivalent_to(split, dx.ndim), dx.sharding
            # the forward program's only collectives are the halo permutes
            fwd = jax.jit(lambda x, w, op=op, attrs=attrs, mesh=mesh: polyconv.spatially_sharded(
                op, x, w, mesh=mesh, spatial=("x",), **attrs))
            found = collectives(fwd.lower(xs, w).compile())
            assert found == {"collective-permute"}, (g, op, found)
            found = collectives(step)
            assert found <= {"collective-permute", "all-reduce"}, (g, op, found)
            assert "collective-permute" in found, (g, op, found)
    # the backward ops differentiate too: their gradients are the other primitives, sharded
    kernel, s, d, pb, pe, opad, groups, spatial, (ci, co), n = GRID[1]
    mesh = mesh_of(n)
    for op in ("convolution_backward_data", "conv_transpose_backward_weights"):
        transposed = op in TRANSPOSED
        attrs = attrs_of(kernel, s, d, pb, pe, opad, groups, transposed)
        wshape = ((*kernel, ci // groups, co) if not transposed
                  else (*kernel, co // groups, ci))
        *arrays, shape = calls(op, (2, spatial), (ci, co), wshape, attrs, "NXC", jnp.float64)
        ct = jnp.asarray(rng.standard_normal(getattr(polyconv, op)(*arrays, shape,
                                                                   **attrs).shape))

        def loss(u, v, op=op, attrs=attrs, mesh=mesh, ct=ct, shape=shape):
            y = polyconv.spatially_sharded(op, u, v, shape, mesh=mesh, spatial=("x",),
                                           **attrs)
            return jnp.sum(y * ct)

        def plain_loss(u, v, op=op, attrs=attrs, ct=ct, shape=shape):
            return jnp.sum(getattr(polyconv, op)(u, v, shape, **attrs) * ct)
        got = jax.jit(jax.grad(loss, argnums=(0, 1)))(*arrays)
        want = jax.grad(plain_loss, argnums=(0, 1))(*arrays)
        for g_, w_ in zip(got, want):
            np.testing.assert_allclose(g_, w_, rtol=1e-10, atol=1e-10, err_msg=op)
    # the replicated bias's gradient is summed over the devices like the weights'
    for op in ("convolution", "conv_transpose"):
        transposed = op in TRANSPOSED
        attrs = attrs_of(kernel, s, d, pb, pe, opad, groups, transposed)
        wshape = ((*kernel, ci // groups, co) if not transposed
                  else (*kernel, co // groups, ci))
        x, w = calls(op, (2, spatial), (ci, co), wshape, attrs, "NXC", jnp.float64)
        b = jnp.asarray(rng.standard_normal(co))
        ct = jnp.asarray(rng.standard_normal(getattr(polyconv, op)(x, w, **attrs).shape))

        def loss(x, w, b, op=op, attrs=attrs, mesh=mesh, ct=ct):
            y = polyconv.spatially_sharded(op, x, w, b, mesh=mesh, spatial=("x",), **attrs)
            return jnp.sum(y * ct)

        def plain_loss(x, w, b, op=op, attrs=attrs, ct=ct):
            return jnp.sum(getattr(polyconv, op)(x, w, b, **attrs) * ct)
        got = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, w, b)
        want = jax.grad(plain_loss, argnums=(0, 1, 2))(x, w, b)
        for g_, w_ in zip(got, want):
            np.testing.assert_allclose(g_, w_, rtol=1e-10, atol=1e-10, err_msg=f"{op} bias")
        np.testing.assert_allclose(got[2], np.asarray(ct).sum(axis=(0, 1, 2)), rtol=1e-10,
                                   atol=1e-10, err_msg=f"{op} bias")
    print("grads ok")


def errors():
    x = jnp.ones((1, 10, 4, 2))
    w = jnp.ones((3, 3, 2, 2))
    cases = [
        (dict(mesh=mesh_of(2), spatial=("z",)), "mesh axis 'z' is not an axis"),
        (dict(mesh=mesh_of(2), spatial=("x",), batch="x"), "name a mesh axis twice"),
        (dict(mesh=mesh_of(2), spatial=(None, None)), "splits no spatial axis"),
        (dict(mesh=mesh_of(2), spatial=("x", None, None)), "names 3 axes"),
    ]
    for kwargs, text in cases:
        try:
            polyconv.spatially_sharded("convolution", x, w, **kwargs)
        except ValueError as e:
            assert text in str(e) and "docs/spatial_sharding.md" in str(e), (text, str(e))
        else:
            raise AssertionError(f"no error for {kwargs}")
    # a kernel reaching past the neighbour: 8 rows over 8 devices, 7 taps (and 10 rows,
    # uneven: 2 per device)
    try:
        polyconv.spatially_sharded("convolution", jnp.ones((1, 8, 2)), jnp.ones((7, 2, 2)),
                                   mesh=mesh_of(8), spatial=("x",), auto_pad="same_upper")
    except ValueError as e:
        msg = str(e)
        assert "needs 3 rows from below and 3 from above" in msg, msg
        assert "split this axis over at most 3 devices" in msg, msg
    else:
        raise AssertionError("no error for a halo past the neighbour")
    try:
        polyconv.spatially_sharded("convolution", jnp.ones((1, 10, 2)), jnp.ones((7, 2, 2)),
                                   mesh=mesh_of(8), spatial=("x",), auto_pad="same_upper")
    except ValueError as e:
        assert "leaves 2 input rows per device" in str(e), str(e)
        assert "split this axis over at most 4 devices" in str(e), str(e)
    else:
        raise AssertionError("no error for a halo past the neighbour, uneven")
    print("errors ok")


if __name__ == "__main__":
    jax.config.update("jax_enable_x64", True)
    assert jax.device_count() == 8, jax.devices()
    {"values": values, "grads": grads, "errors": errors}[sys.argv[1]]()
