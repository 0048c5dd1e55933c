"""The six ops on data split along spatial axes over a device mesh (docs/spatial_sharding.md).

Inside one ``jax.shard_map`` each device holds an equal slab of every split axis of the op's
input. Per split axis it receives the rows its outputs read from the slabs of its two
neighbours (one ``lax.ppermute`` each way, sized by :mod:`polyconv._halo`), takes the window
its outputs read (padding positions as zeros) and runs polyconv's own primitive on it with
zero pads on that axis; a transposed (``backward_data``) op then keeps the rows of its own
output slab. ``backward_weights`` sums the devices' parts with one ``psum``. The gradients
go through ``shard_map``'s and ``ppermute``'s transposes and polyconv's own derivative rules,
so they are sharded the same way.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from polyconv import ConvPlan
from polyconv._choice import settings as choice_settings
from polyconv._dispatch import _dispatch, _jax_arrays
from polyconv._halo import axis_halo, even_split
from polyconv._ops import _bound
from polyconv._optable import lookup

from . import BACKEND
from ._primitives import prepare
from ._xla import canonical_precision

__all__ = ["spatially_sharded"]


@dataclass(frozen=True)
class _Axis:
    """One split spatial axis: what each device exchanges, where its window starts, and (for
    backward_data) where its output slab starts in the local result."""

    axis: int              # spatial axis
    mesh_axis: str
    devices: int
    own: int               # input rows each device holds
    left: int              # rows received from the device below
    right: int             # rows received from the device above
    pad_lo: int            # zero rows added below and above the received rows
    pad_hi: int
    window: int            # rows of the local input
    starts: tuple[int, ...]    # per device: the window's first row in the padded rows
    crops: tuple[int, ...]     # per device: the output slab's first row in the local result
    local_out: int         # rows of the local output (slab plus the spread of crops)
    pads: tuple[int, int]  # the local plan's pads on this axis
    in_size: int           # the op's input and output rows, and both rounded up to a
    out_size: int          # multiple of the device count (zero rows appended to the input,
    in_padded: int         # the output's extra rows dropped)
    out_padded: int


def _fail(plan: ConvPlan, msg: str) -> None:
    msg = f"{plan.op}: {msg} (docs/spatial_sharding.md)"
    raise ValueError(msg)


def _sizes(plan: ConvPlan, axis: int) -> tuple[int, int]:
    """The op's input and output rows on a spatial axis."""
    large, small = plan.a_spatial[axis], plan.b_spatial[axis]
    return (small, large) if plan.primitive == "backward_data" else (large, small)


def _padded_halo(plan: ConvPlan, axis: int, n: int):
    """The shards of ``axis`` over ``n`` devices, its input and output rounded up to
    multiples of ``n``: the appended input rows are zeros, as the padding past the end is,
    and the appended output rows are dropped, so the shards' rows mean what they do
    unpadded (``shard_map`` takes equal blocks)."""
    in_size, out_size = _sizes(plan, axis)
    in_padded, out_padded = -(-in_size // n) * n, -(-out_size // n) * n
    large, small = ((out_padded, in_padded) if plan.primitive == "backward_data"
                    else (in_padded, out_padded))
    halo = axis_halo(plan.primitive, large, small, plan.kernel[axis], plan.strides[axis],
                     plan.dilations[axis], plan.pads_begin[axis],
                     even_split(out_padded, n), even_split(in_padded, n))
    return halo, in_padded, out_padded


def _fits(halo, own: int) -> bool:
    return max(halo.left, halo.right) <= own and halo.neighbours_suffice


def _split_axis(plan: ConvPlan, axis: int, mesh_axis: str, n: int) -> _Axis:
    """The exchange and local geometry of one spatial axis split over ``n`` devices."""
    data = plan.primitive == "backward_data"
    in_size, out_size = _sizes(plan, axis)
    halo, in_padded, out_padded = _padded_halo(plan, axis, n)
    own = in_padded // n
    if not _fits(halo, own):
        fits = [m for m in range(n, 0, -1)
                if _fits(_padded_halo(plan, axis, m)[0], -(-in_size // m))]
        _fail(plan, f"spatial axis {axis} split over the {n} devices of mesh axis "
                    f"{mesh_axis!r} leaves {own} input rows per device, but a device needs "
                    f"{halo.left} rows from below and {halo.right} from above (the kernel's "
                    f"reach): more than one neighbour holds; split this axis over at most "
                    f"{fits[0] if fits else 1} devices, or give it a larger volume")
    s, pb = plan.strides[axis], plan.pads_begin[axis]
    ek = plan.effective_kernel[axis]
    starts = [sh.window[0] for sh in halo.shards]
    if data:
        # every window start w gives its slab's first row at o = x0 + pb - w*s in the local
        # result; move all windows down by whole rows until no o is negative (a local pad)
        crops = [sh.out[0] + pb - w * s for sh, w in zip(halo.shards, starts)]
        shift = -(min(0, min(crops)) // s)
        starts = [w - shift for w in starts]
        crops = [c + shift * s for c in crops]
        lo = min(crops)
        local_out = out_padded // n + max(crops) - lo
        stops = [sh.window[1] for sh in halo.shards]
        window = max(b - w for b, w in zip(stops, starts))
        end = s * (window - 1) + ek - lo - local_out
        if end < 0:                       # more rows, so that the end pad is not negative
            window += -(end // s)
            end = s * (window - 1) + ek - lo - local_out
        crops = [c - lo for c in crops]
        pads = (lo, end)
    else:
        window = (out_padded // n - 1) * s + ek
        crops = [0] * n
        local_out = out_padded // n
        pads = (0, 0)
    base = [sh.own[0] - halo.left for sh in halo.shards]
    pad_lo = max(0, max(b - w for b, w in zip(base, starts)))
    pad_hi = max(0, max(w + window - (b + halo.left + own + halo.right)
                        for b, w in zip(base, starts)))
    return _Axis(axis, mesh_axis, n, own, halo.left, halo.right, pad_lo, pad_hi, window,
                 tuple(w - b + pad_lo for b, w in zip(base, starts)), tuple(crops), local_out,
                 pads, in_size, out_size, in_padded, out_padded)


def _local_plan(plan: ConvPlan, axes: Sequence[_Axis], batch_devices: int) -> ConvPlan:
    """The plan each device runs: the windows and slabs as sizes, their pads."""
    a_sp, b_sp = list(plan.a_spatial), list(plan.b_spatial)
    pb, pe = list(plan.pads_begin), list(plan.pads_end)
    op = list(plan.output_padding)
    for ax in axes:
        i = ax.axis
        if plan.primitive == "backward_data":
            a_sp[i], b_sp[i] = ax.local_out, ax.window
        else:
            a_sp[i], b_sp[i] = ax.window, ax.out_padded // ax.devices
        pb[i], pe[i] = ax.pads
        op[i] = 0
    return plan.with_(batch=plan.batch // batch_devices, a_spatial=tuple(a_sp),
                      b_spatial=tuple(b_sp), pads_begin=tuple(pb), pads_end=tuple(pe),
                      output_padding=tuple(op))


def _exchange(x, ax: _Axis, dim: int):
    """This device's window of ``x`` along ``dim``: the rows received from its neighbours
    around its own, zeros past the volume's ends, cut at its window start."""
    n = ax.devices
    parts = []
    if ax.pad_lo:
        parts.append(jnp.zeros_like(lax.slice_in_dim(x, 0, 1, axis=dim)).repeat(ax.pad_lo, dim))
    if ax.left:   # the last rows of the device below; the first device gets zeros
        parts.append(lax.ppermute(lax.slice_in_dim(x, ax.own - ax.left, ax.own, axis=dim),
                                  ax.mesh_axis, [(j, j + 1) for j in range(n - 1)]))
    parts.append(x)
    if ax.right:  # the first rows of the device above; the last device gets zeros
        parts.append(lax.ppermute(lax.slice_in_dim(x, 0, ax.right, axis=dim),
                                  ax.mesh_axis, [(j + 1, j) for j in range(n - 1)]))
    if ax.pad_hi:
        parts.append(jnp.zeros_like(lax.slice_in_dim(x, 0, 1, axis=dim)).repeat(ax.pad_hi, dim))
    x = jnp.concatenate(parts, axis=dim) if len(parts) > 1 else x
    return _cut(x, ax.starts, ax.window, ax.mesh_axis, dim)


def _cut(x, starts: tuple[int, ...], size: int, mesh_axis: str, dim: int):
    """Rows ``[start, start + size)`` along ``dim``, ``start`` this device's entry."""
    if len(set(starts)) == 1:
        return lax.slice_in_dim(x, starts[0], starts[0] + size, axis=dim)
    start = jnp.asarray(starts, dtype=jnp.int32)[lax.axis_index(mesh_axis)]
    return lax.dynamic_slice_in_dim(x, start, size, axis=dim)


@functools.lru_cache(maxsize=256)
def _sharded_fn(plan: ConvPlan, mesh: Mesh, spatial: tuple[str | None, ...],
                batch: str | None, arity: int, dtype: str | None, precision: Any,
                settings: Any):
    """The jitted ``shard_map`` of one plan on one mesh (``dtype`` and ``precision`` key
    the cache only: plans compare on their geometry alone; ``settings``, the forcing and
    measuring in force, too: its lowerings are chosen when it is traced, as
    :func:`._primitives.entry`'s)."""
    del dtype, precision, settings
    axes = [_split_axis(plan, i, name, mesh.shape[name])
            for i, name in enumerate(spatial) if name is not None]
    nb = mesh.shape[batch] if batch is not None else 1
    if plan.batch % nb:
        _fail(plan, f"the batch of {plan.batch} does not split evenly over the {nb} devices "
                    f"of mesh axis {batch!r}; use a batch that is a multiple of {nb}")
    local = _local_plan(plan, axes, nb)
    dims = plan.spatial_axes
    data_spec = [None] * (plan.ndim + 2)
    data_spec[0] = batch
    for i, name in enumerate(spatial):
        data_spec[dims[i]] = name
    data = P(*data_spec)
    reduce_over = tuple(name for name in (batch, *spatial) if name is not None)
    primitive = plan.primitive

    def body(*arrays):
        x = arrays[0]
        for ax in axes:
            x = _exchange(x, ax, dims[ax.axis])
        run = getattr(BACKEND, primitive)
        if primitive == "backward_weights":
            return lax.psum(run(local, x, arrays[1]), reduce_over)
        y = run(local, x, *arrays[1:])
        if primitive == "backward_data":
            for ax in axes:
                y = _cut(y, ax.crops, ax.out_padded // ax.devices, ax.mesh_axis,
                         dims[ax.axis])
        return y

    if primitive == "backward_weights":
        in_specs, out_specs = (data, data), P()
    else:
        in_specs, out_specs = (data, *(P(),) * (arity - 1)), data
    mapped = jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)

    def run(*arrays):
        arrays = list(arrays)
        for ax in axes:
            dim = dims[ax.axis]
            arrays[0] = _pad_end(arrays[0], dim, ax.in_padded - ax.in_size)
            if primitive == "backward_weights":
                arrays[1] = _pad_end(arrays[1], dim, ax.out_padded - ax.out_size)
        y = mapped(*arrays)
        if primitive != "backward_weights":
            for ax in axes:
                y = lax.slice_in_dim(y, 0, ax.out_size, axis=dims[ax.axis])
        return y

    return jax.jit(run)


def _pad_end(x, dim: int, rows: int):
    """``x`` with ``rows`` zero rows appended along ``dim``."""
    if not rows:
        return x
    widths = [(0, 0)] * x.ndim
    widths[dim] = (0, rows)
    return jnp.pad(x, widths)


def spatially_sharded(op: str | Any, *args: Any, mesh: Mesh,
                      spatial: Sequence[str | None], batch: str | None = None,
                      **attributes: Any) -> Any:
    """Op ``op`` on data split along spatial axes over ``mesh``: exactly the unsharded
    result, each device exchanging only the halo rows its neighbours hold (re-exported as
    :func:`polyconv.spatially_sharded`)."""
    spec = lookup(op, who="spatially_sharded")
    if attributes.get("backend") not in (None, "jax"):
        msg = (f"spatially_sharded: runs on the JAX backend only; got "
               f"backend={attributes['backend']!r}")
        raise ValueError(msg)
    arguments = _jax_arrays(_bound(spec, args, {**attributes, "backend": "jax"}))
    _, plan, _ = _dispatch(spec, arguments)
    spatial = _check_axes(plan, mesh, spatial, batch)
    arrays = [arguments[name] for name in spec.arrays]
    while arrays and arrays[-1] is None:
        arrays.pop()
    arrays = prepare(plan, *arrays)
    fn = _sharded_fn(plan, mesh, spatial, batch, len(arrays), plan.dtype,
                     canonical_precision(plan.op, plan.precision), choice_settings())
    return fn(*arrays)


def _check_axes(plan: ConvPlan, mesh: Mesh, spatial, batch) -> tuple[str | None, ...]:
    names = tuple(mesh.axis_names)
    if isinstance(spatial, str):
        spatial = (spatial,)
    spatial = tuple(spatial)
    if len(spatial) > plan.ndim:
        _fail(plan, f"spatial={spatial!r} names {len(spatial)} axes but the data has "
                    f"{plan.ndim} spatial axes; give one mesh axis name (or None) per "
                    f"spatial axis, in the data format's order")
    spatial += (None,) * (plan.ndim - len(spatial))
    used = [name for name in (*spatial, batch) if name is not None]
    for name in used:
        if name not in names:
            _fail(plan, f"mesh axis {name!r} is not an axis of the mesh {names}")
    if len(set(used)) != len(used):
        _fail(plan, f"spatial={spatial!r} and batch={batch!r} name a mesh axis twice; "
                    f"each mesh axis may split one data axis")
    if not any(name is not None for name in spatial):
        _fail(plan, f"spatial={spatial!r} splits no spatial axis; name a mesh axis for at "
                    f"least one (or call polyconv.{plan.op} on batch-sharded data)")
    return spatial
