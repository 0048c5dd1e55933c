"""The phase (sub-pixel) lowerings. backward_data: per phase of the stride, one stride-1
problem with exactly that phase's taps as matrix products (``phases_matmul``), or one fused
convolution whose output channels are the phases (``subpixel``, ``subpixel_matmul``); the
weight gradient: one convolution per phase of the large tensor (``phases``). The phase numbers
come from :mod:`polyconv._phases`.

Notation and measurements: the docs page "JAX lowerings".
"""

from __future__ import annotations

import itertools
import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from polyconv import ConvPlan
from polyconv._choice import Implementation
from polyconv._phases import phases as plan_phases

from ._common import _crop, _interleave, _phases, pad_large
from ._xla import _conv_general, _data_spec, _dnums, _merge


def _fused_kernel(plan: ConvPlan, w):
    """The sub-pixel kernel ``[Cb, Ca/G, L1, s1, .., Ld, sd]`` (canonical channel order).

    Row ``j`` of axis ``i``, phase ``r``, holds the tap ``k`` with shift ``m_k = top - j`` in
    phase ``r``, or zero where that phase has no such tap (a gather from the kernel with one
    zero tap appended: exact, and differentiable).
    """
    w = jnp.transpose(w, plan.weights_perm)       # [Cb, Ca/G, K..]
    zero = jnp.zeros((), w.dtype)
    for i, p in enumerate(_phases(plan)):
        axis = 2 + 2 * i                           # earlier axes already split in (L, s)
        index = np.array(p.window_taps)            # kernel: the appended zero tap
        config = [(0, 0, 0)] * w.ndim
        config[axis] = (0, 1, 0)
        w = jnp.take(lax.pad(w, zero, config), index.reshape(-1), axis=axis)
        w = w.reshape((*w.shape[:axis], *index.shape, *w.shape[axis + 1:]))
    return w


def _subpixel(plan: ConvPlan, precision, b, w):
    """One stride-1 convolution into ``prod(s)`` times the channels, then depth-to-space.

    All phases share one window of ``L = top - bottom + 1`` rows per axis (the union of the
    phases' shifts); a phase's missing taps are zeros, so this does ``prod(L*s)/prod(K)``
    times the multiply-adds of the exact sum (1.78x for k3 s2 in 2-D, 1 for k16 s8) but is a
    single, dense, stride-1 XLA convolution. Output channels are ordered
    ``[G, s1..sd, Ca/G]`` (feature groups must be outermost).
    """
    axes = _phases(plan)
    nd, g = plan.ndim, plan.groups
    ca_g = plan.a_channels // g
    fused = _fused_kernel(plan, w)                 # [Cb, Ca/G, L1, s1, ..]
    lengths = fused.shape[2::2]
    fused = fused.reshape((g, plan.b_channels // g, *fused.shape[1:]))
    # -> [Cb/G, G, s1..sd, Ca/G, L1..Ld]
    order = (1, 0, *(4 + 2 * i for i in range(nd)), 2, *(3 + 2 * i for i in range(nd)))
    fused = jnp.transpose(fused, order)
    phases = math.prod(p.stride for p in axes)
    fused = fused.reshape((plan.b_channels // g, g * phases * ca_g, *lengths))
    padding = [p.window_pads for p in axes]
    data = _data_spec(plan)
    y = _conv_general(
        b, fused, window_strides=(1,) * nd, padding=padding,
        dimension_numbers=_dnums(data, (1, 0, *range(2, nd + 2)), data),
        feature_group_count=g, precision=precision, preferred_element_type=plan.acc_dtype)
    rows = y.shape[plan.spatial_axes[0]:plan.spatial_axes[0] + nd]
    steps = tuple(p.stride for p in axes)
    if plan.channels_last:   # [N, R.., G, s.., Ca/G] -> [N, R1, s1, .., Rd, sd, G, Ca/G]
        y = y.reshape((plan.batch, *rows, g, *steps, ca_g))
        order = (0, *itertools.chain.from_iterable((1 + i, nd + 2 + i) for i in range(nd)),
                 nd + 1, 2 * nd + 2)
        y = _merge(jnp.transpose(y, order),
                   (plan.batch, *(n * s for n, s in zip(rows, steps)), plan.a_channels))
    else:                    # [N, G, s.., Ca/G, R..] -> [N, G, Ca/G, R1, s1, .., Rd, sd]
        y = y.reshape((plan.batch, g, *steps, ca_g, *rows))
        order = (0, 1, nd + 2,
                 *itertools.chain.from_iterable((nd + 3 + i, 2 + i) for i in range(nd)))
        y = _merge(jnp.transpose(y, order),
                   (plan.batch, plan.a_channels, *(n * s for n, s in zip(rows, steps))))
    return _crop(plan, axes, y)


def _group_major(plan: ConvPlan, x, channels: int):
    """A data tensor in the user's layout as ``[G, N, X.., C/G]`` (outer group split)."""
    nd, g = plan.ndim, plan.groups
    if plan.channels_last:
        return jnp.moveaxis(x.reshape((*x.shape[:-1], g, channels // g)), nd + 1, 0)
    x = x.reshape((plan.batch, g, channels // g, *x.shape[2:]))
    return jnp.transpose(x, (1, 0, *range(3, nd + 3), 2))


def _windows(plan: ConvPlan, b):
    """``b`` group-major and padded for every phase's window: ``[G, N, B'.., Cb/G]``.

    Padded so that output row ``q_lo`` of every phase reads its tap with shift ``m`` at
    index ``top - m`` (``top``: the largest shift on that axis).
    """
    x = _group_major(plan, b, plan.b_channels)
    config = [(0, 0, 0)] * x.ndim
    for i, p in enumerate(_phases(plan)):
        config[2 + i] = (*p.window_pads, 0)
    return lax.pad(x, jnp.zeros((), x.dtype), config)


def _product(plan: ConvPlan, precision, x, offsets, kernel, unroll: int = 8):
    """``sum_t x[.., offset_t + rows.., :] @ kernel[:, t]``, one matrix product per group.

    ``x`` from :func:`_windows`; ``offsets``: per tap a tuple of start rows; ``kernel``:
    ``[G, T*Cb/G, cols]``. The shifted windows are stacked into patches
    ``[G, N, R.., T*Cb/G]`` (``T`` times the input's memory; batch and rows stay separate
    axes, for sharding). Up to ``unroll`` groups get a product each; more groups, one
    ``dot_general`` batched over them. Returns ``[G, N, R.., cols]`` in the accumulation
    dtype.
    """
    g, n = x.shape[0], x.shape[1]
    rows = tuple(p.rows for p in _phases(plan))
    windows = [lax.slice(x, (0, 0, *offset, 0),
                         (g, n, *(o + r for o, r in zip(offset, rows)), x.shape[-1]))
               for offset in offsets]
    patches = jnp.stack(windows, axis=-2)
    patches = patches.reshape((*patches.shape[:-2], len(offsets) * x.shape[-1]))
    last = patches.ndim - 1
    if g <= unroll:
        return jnp.stack([lax.dot_general(patches[i], kernel[i], (((last - 1,), (0,)), ((), ())),
                                          precision=precision,
                                          preferred_element_type=plan.acc_dtype)
                          for i in range(g)])
    return lax.dot_general(patches, kernel, (((last,), (1,)), ((0,), (0,))),
                           precision=precision, preferred_element_type=plan.acc_dtype)


def _subpixel_matmul(plan: ConvPlan, precision, b, w):
    """The sub-pixel product of :func:`_subpixel` as explicit matrix products.

    Patches of all ``T = prod(L)`` window rows (see :func:`_product`) times the sub-pixel
    kernel ``[G, T*Cb/G, prod(s)*Ca/G]``, then depth-to-space. No convolution: XLA's CPU
    matrix products beat its small-window and grouped convolutions, and the wide right-hand
    side (``prod(s)*Ca/G`` columns) keeps them efficient for narrow channels.
    """
    axes = _phases(plan)
    nd, g = plan.ndim, plan.groups
    cb_g, ca_g = plan.b_channels // g, plan.a_channels // g
    fused = _fused_kernel(plan, w)                 # [Cb, Ca/G, L1, s1, ..]
    lengths = fused.shape[2::2]
    steps = tuple(p.stride for p in axes)
    fused = fused.reshape((g, cb_g, ca_g, *fused.shape[2:]))
    # -> [G, L1..Ld, Cb/G, s1..sd, Ca/G]
    order = (0, *(3 + 2 * i for i in range(nd)), 1, *(4 + 2 * i for i in range(nd)), 2)
    fused = jnp.transpose(fused, order).reshape(
        (g, math.prod(lengths) * cb_g, math.prod(steps) * ca_g))
    offsets = list(itertools.product(*(range(n) for n in lengths)))
    y = _product(plan, precision, _windows(plan, b), offsets, fused)
    rows = y.shape[2:2 + nd]
    y = y.reshape((g, plan.batch, *rows, *steps, ca_g))
    interleaved = tuple(itertools.chain.from_iterable((2 + i, 2 + nd + i) for i in range(nd)))
    sizes = tuple(r * s for r, s in zip(rows, steps))
    if plan.channels_last:   # -> [N, R1, s1, .., Rd, sd, G, Ca/G]
        y = jnp.transpose(y, (1, *interleaved, 0, 2 + 2 * nd))
        y = _merge(y, (plan.batch, *sizes, plan.a_channels))
    else:                    # -> [N, G, Ca/G, R1, s1, .., Rd, sd]
        y = jnp.transpose(y, (1, 0, 2 + 2 * nd, *interleaved))
        y = _merge(y, (plan.batch, plan.a_channels, *sizes))
    return _crop(plan, axes, y)


def _phases_matmul(plan: ConvPlan, precision, b, w):
    """Per phase of the stride, one stride-1 problem with exactly that phase's taps, as explicit
    matrix products: exact multiply-adds.

    Per phase, patches of its ``T_r`` taps (see :func:`_product`) times the kernel
    ``[G, T_r*Cb/G, Ca/G]`` of those taps; then the phases are interleaved.
    """
    axes = _phases(plan)
    g = plan.groups
    cb_g, ca_g = plan.b_channels // g, plan.a_channels // g
    wc = jnp.transpose(w, plan.weights_perm)                    # [Cb, Ca/G, K..]
    wc = wc.reshape((g, cb_g, ca_g, *plan.kernel))
    x = _windows(plan, b)
    parts = {}
    for r in itertools.product(*(range(p.stride) for p in axes)):
        taps = list(itertools.product(*(zip(p.taps[ri], p.phase_shifts[ri])
                                        for p, ri in zip(axes, r))))
        if not taps:
            parts[r] = jnp.zeros((g, plan.batch, *(p.rows for p in axes), ca_g),
                                 plan.acc_dtype)
            continue
        kernel = jnp.stack([wc[(slice(None),) * 3 + tuple(k for k, _ in tap)]
                            for tap in taps], axis=1)           # [G, T, Cb/G, Ca/G]
        kernel = kernel.reshape((g, len(taps) * cb_g, ca_g))
        offsets = [tuple(p.max_shift - m for p, (_, m) in zip(axes, tap)) for tap in taps]
        parts[r] = _product(plan, precision, x, offsets, kernel)
    return _interleave(plan, axes, parts, group_major=True)


def subpixel_is_exact(plan: ConvPlan) -> bool:
    """Whether the sub-pixel window holds only real taps (every phase of every axis has a tap
    at every window row: k4 s2, k16 s8, k2 s2, ..., not k3 s2).

    Only then do ``subpixel`` and ``subpixel_matmul`` form exactly the products of the
    definition; otherwise their zero taps meet ``b`` too, and a NaN or infinity in ``b``
    reaches outputs that do not read it (``0 * inf = nan``). The default choice never makes
    such products.
    """
    return plan_phases(plan).fills_window


def _taps_to_layout(plan: ConvPlan, taps: dict):
    """Per-tap weights ``taps[k]`` (the user's layout, spatial sizes 1) -> the full kernel."""
    perm = plan.weights_perm
    order = list(itertools.product(*(range(k) for k in plan.kernel)))
    y = jnp.stack([taps[k] for k in order])
    y = y.reshape((*plan.kernel, *y.shape[1:]))      # [K.., user layout with unit spatial]
    nd = plan.ndim
    # the user's axis p comes from K axis i where perm[2 + i] == p, else from itself
    source = {perm[2 + i]: i for i in range(nd)}
    y = jnp.transpose(y, [source.get(p, nd + p) for p in range(nd + 2)] +
                      [nd + perm[2 + i] for i in range(nd)])
    return y.reshape(plan.weights_shape)


def _weights_phases(plan: ConvPlan, precision, a, b):
    """One convolution per phase of the large tensor, none with a dilated kernel.

    Tap ``k`` reads ``a`` at ``y*s + k*d`` (padded coordinates): all taps of phase
    ``r = k*d mod s`` read the sub-image ``a[r::s]`` at shifts ``m_k`` that are ``dd`` apart,
    so their weights are one stride-``dd`` correlation of that sub-image with ``b``
    (``direct``'s convolution with ``s = 1``). The phase results are then put in tap order.
    """
    data = _data_spec(plan)
    perm = plan.weights_perm
    swapped = (data[1], data[0], *data[2:])
    x = pad_large(plan, a)
    axes = _phases(plan)
    taps = {}
    for r in itertools.product(*(range(p.stride) for p in axes)):
        ks = [p.taps[ri] for p, ri in zip(axes, r)]
        if not all(ks):
            continue
        start, limit, strides = [0] * x.ndim, list(x.shape), [1] * x.ndim
        for ax, p, t, d, bs in zip(plan.spatial_axes, axes, ks, plan.dilations,
                                   plan.b_spatial):
            start[ax] = t[0] * d
            limit[ax] = start[ax] + (bs - 1 + (len(t) - 1) * p.shift_step) * p.stride + 1
            strides[ax] = p.stride
        sub = lax.slice(x, start, limit, strides)
        w = _conv_general(
            sub, b, window_strides=tuple(p.shift_step for p in axes), padding=[(0, 0)] * plan.ndim,
            dimension_numbers=_dnums(swapped, swapped, (perm[1], perm[0], *perm[2:])),
            batch_group_count=plan.groups, precision=precision,
            preferred_element_type=plan.acc_dtype)
        for js in itertools.product(*(range(len(t)) for t in ks)):
            s0, s1 = [0] * w.ndim, list(w.shape)
            for ax, j in zip(perm[2:], js):
                s0[ax], s1[ax] = j, j + 1
            taps[tuple(t[j] for t, j in zip(ks, js))] = lax.slice(w, s0, s1)
    return _taps_to_layout(plan, taps)


PHASES_MATMUL = Implementation("phases_matmul", "backward_data", _phases_matmul)
# their zero taps meet b where the phases do not fill one window (k3 s2): exact only where they
# do (:func:`subpixel_is_exact`)
SUBPIXEL = Implementation("subpixel", "backward_data", _subpixel, exact_on_nonfinite=False)
SUBPIXEL_MATMUL = Implementation("subpixel_matmul", "backward_data", _subpixel_matmul,
                                 exact_on_nonfinite=False)
WEIGHTS_PHASES = Implementation("phases", "backward_weights", _weights_phases)
