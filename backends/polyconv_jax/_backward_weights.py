"""backward_weights lowerings (``a, b -> W``) and the default policy that picks one."""

from __future__ import annotations

import itertools
import math

import jax.numpy as jnp
from jax import lax

from polyconv import ConvPlan

from ._backward_data import narrow
from ._forward import (
    ELEMENTWISE_MAX_CHANNELS,
    few_per_group,
    group_channels,
    pad_large,
    patches,
    patches_fit,
    tap_window,
)
from ._subpixel import _phases
from ._xla import _conv_general, _data_spec, _dnums, _merge


def _weights_direct(plan: ConvPlan, precision, a, b):
    data = _data_spec(plan)
    perm = plan.weights_perm
    eks = plan.effective_kernel
    swapped = (data[1], data[0], *data[2:])  # batch <-> feature: N is contracted
    padding = [(pb, (y - 1) * s + ek - x - pb)
               for x, y, s, ek, pb in zip(plan.a_spatial, plan.b_spatial, plan.strides, eks,
                                          plan.pads_begin)]
    w = _conv_general(
        a, b, window_strides=plan.dilations, padding=padding, rhs_dilation=plan.strides,
        # output "batch" = Ca/G (the weights' in axis), "feature" = Cb: the user's layout
        dimension_numbers=_dnums(swapped, swapped, (perm[1], perm[0], *perm[2:])),
        batch_group_count=plan.groups, precision=precision,
        preferred_element_type=plan.acc_dtype)
    return w


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


def _weights_depthwise(plan: ConvPlan, precision, a, b):
    """One channel of ``b`` per group: ``dW[g, i, k] = sum_{n,y} a_k[n, y, g*Ca/G + i] b[n, y, g]``
    per tap ``k`` and channel ``i`` of a group, with no contraction over channels to make a
    matrix product of. The elementwise products of every tap and channel are summed over the
    batch and all rows but the last spatial axis in one variadic XLA reduction, which reads
    each element of ``a`` and ``b`` once for all taps (a reduction per tap reads them once per
    tap: 3-5x slower); then that axis is summed. ``precision`` has no effect."""
    del precision
    ca_g = plan.a_channels // plan.groups
    acc = plan.acc_dtype
    x, y = pad_large(plan, a.astype(acc)), b.astype(acc)
    taps = list(itertools.product(*(range(k) for k in plan.kernel)))
    # the rows before the last spatial axis merged: [N*Y.., X, G] channels-last,
    # [N, G, Y.., X] channels-first (summed: N*Y.., or N and Y..)
    front, last = plan.b_spatial[:-1], plan.b_spatial[-1]
    if plan.channels_last:
        rows, summed = (plan.batch * math.prod(front), last, plan.groups), (0,)
    elif front:
        rows, summed = (plan.batch, plan.groups, math.prod(front), last), (0, 2)
    else:
        rows, summed = (plan.batch, plan.groups, last), (0,)
    products = tuple(_merge(group_channels(plan, tap_window(plan, x, k), i, ca_g, 1) * y, rows)
                     for k in taps for i in range(ca_g))
    sums = lax.reduce(products, (jnp.zeros((), acc),) * len(products),
                      lambda s, t: tuple(u + v for u, v in zip(s, t)), summed)
    per_tap = jnp.stack([jnp.sum(part, axis=1 - plan.channels_last) for part in sums])
    w = per_tap.reshape((*plan.kernel, ca_g, plan.groups))
    w = jnp.transpose(w, (plan.ndim + 1, plan.ndim, *range(plan.ndim)))  # [Cb, Ca/G, K..]
    return jnp.transpose(w, plan.weights_inverse_perm)


def _weights_grouped(plan: ConvPlan, precision, a, b):
    """One ungrouped backward_weights per group (each by :func:`choose_backward_weights`),
    joined along the weights' ``Cb`` axis (XLA's ``batch_group_count`` is slow on CPU)."""
    g = plan.groups
    ca_g, cb_g = plan.a_channels // g, plan.b_channels // g
    sub = plan.with_(groups=1, a_channels=ca_g, b_channels=cb_g)
    from ._choice import choose  # the inner problems are chosen like any other

    inner = BACKWARD_WEIGHTS[choose("backward_weights", sub, precision)]
    c = plan.channel_axis
    parts = [inner(sub, precision, lax.slice_in_dim(a, i * ca_g, (i + 1) * ca_g, axis=c),
                   lax.slice_in_dim(b, i * cb_g, (i + 1) * cb_g, axis=c)) for i in range(g)]
    return jnp.concatenate(parts, axis=plan.weights_perm[0])


def _weights_patches(plan: ConvPlan, precision, a, b):
    """Gather, then multiply (im2col): the patches of ``a`` (see
    :func:`polyconv_jax._forward.patches`) contracted with ``b`` over batch and rows,
    ``[T*Ca, Cb]``, then put in the user's weights layout."""
    c = plan.channel_axis
    rows = tuple(i for i in range(plan.ndim + 2) if i != c)
    y = lax.dot_general(patches(plan, a), b, ((rows, rows), ((), ())), precision=precision,
                        preferred_element_type=plan.acc_dtype)      # [T*Ca, Cb]
    y = y.reshape((*plan.kernel, plan.a_channels, plan.b_channels))
    y = jnp.transpose(y, (plan.ndim + 1, plan.ndim, *range(plan.ndim)))  # [Cb, Ca, K..]
    return jnp.transpose(y, plan.weights_inverse_perm)


BACKWARD_WEIGHTS = {"direct": _weights_direct, "phases": _weights_phases,
                    "depthwise": _weights_depthwise, "grouped": _weights_grouped,
                    "patches_matmul": _weights_patches}


def weights_applicable(plan: ConvPlan, lowering: str) -> bool:
    """Whether ``lowering`` can compute ``plan``'s backward_weights."""
    if lowering == "depthwise":
        return (plan.b_channels == plan.groups
                and plan.a_channels // plan.groups <= ELEMENTWISE_MAX_CHANNELS)
    if lowering == "grouped":
        return plan.groups > 1
    if lowering == "patches_matmul":
        return patches_fit(plan)
    return lowering in BACKWARD_WEIGHTS


def choose_backward_weights(plan: ConvPlan) -> str:
    """The backward_weights lowering for a plan (measured on XLA CPU: module docstring).

    XLA CPU's ``batch_group_count`` convolution is a slow path (100x torch for 8 groups), so
    grouped plans are split per group (``grouped``), depthwise ones go elementwise
    (``depthwise``); strided 3-D plans use ``phases`` (XLA's 3-D weight gradient with a
    dilated kernel is 3x slower); ungrouped plans with few input columns
    (:func:`~polyconv_jax._backward_data.narrow`) gather patches and multiply once
    (``patches_matmul``: 2.5x faster for a 3-D 1->64 k3 s2 gradient); everything else stays
    ``direct``, which XLA handles well in 1-D and 2-D.
    """
    if narrow(plan) and patches_fit(plan):
        return "patches_matmul"
    if plan.groups > 1:
        if plan.b_channels == plan.groups and few_per_group(plan, plan.a_channels):
            return "depthwise"
        return "grouped" if plan.groups <= 32 else "direct"
    if plan.ndim >= 3 and any(s > 1 for s in plan.strides):
        return "phases"
    return "direct"
