"""The space-to-depth forward lowering (``space_to_depth``).

Without dilation, tap ``k`` of a strided axis reads phase ``r = k % s`` of ``a`` at shift
``m = k // s`` (:mod:`polyconv._phases`): ``a[y*s + k - pb] = phase_r[y + m]``. Stack the
``prod(s)`` phases of ``a`` along its channels (space to depth: ``[N, Q.., S*Ca]`` with
``Q = B + max_shift`` cells per axis) and the strided convolution is a stride-1 one of that
operand with the kernel padded to ``L*s`` taps per axis and split the same way
(``[Cb, S*Ca/G, L..]``, ``L = max_shift + 1``): the *inner plan*, which the measured choice
then computes with its own lowerings (XLA's convolution, im2col, the multiply-first
overlap-add, ...). YOLOv5's 6x6 stride-2 stem on 3 channels becomes a 3x3 convolution of 12
channels; FCN-8s's 16x16 stride-8 kernel on 21 channels a 2x2 one of 1344, whose narrow
output side the multiply-first product suits.

It forms exactly the products of the definition only where every padded tap is a real one
(``K % s == 0`` on every axis: k2 s2, k4 s2, k6 s2, k16 s8, ...); otherwise its zero taps
meet ``a`` and a NaN or infinity there would reach outputs that do not read it, so it does
not apply. Its adjoint, depth to space, is ``backward_data``'s ``subpixel``
(:mod:`._subpixel`). The weight gradient of the inner plan (its padded taps dropped) was
measured too and lost to the other weight-gradient lowerings on every corpus layer it applies
to (FCN-8s 67 ms against 28-35, the U-Net's k2 s2 15 against 12), so it is not a lowering.
"""

from __future__ import annotations

import itertools
import math
from functools import partial

import jax.numpy as jnp
from jax import lax

from polyconv import ConvPlan
from polyconv._choice import Implementation
from polyconv._phases import phases

from ._grouped import Lower


def applies(plan: ConvPlan) -> bool:
    """Whether ``space_to_depth`` computes ``plan``'s forward: a stride, no dilation, and only real
    taps in the padded kernel (``K % s == 0`` per axis: the phases fill their window)."""
    return (any(s > 1 for s in plan.strides) and all(d == 1 for d in plan.dilations)
            and phases(plan).fills_window)


def inner_plan(plan: ConvPlan) -> ConvPlan:
    """The stride-1 plan on the phases of ``a``: ``S*Ca`` channels (ordered ``[G, s.., Ca/G]``,
    so groups stay outermost), ``Q = B + max_shift`` cells and ``L = max_shift + 1`` taps per
    axis, no padding, canonical weights ``[Cb, S*Ca/G, L..]``."""
    axes = phases(plan).axes
    nd = plan.ndim
    return plan.with_(
        a_channels=plan.a_channels * math.prod(plan.strides),
        a_spatial=tuple(p.small + p.max_shift for p in axes),
        kernel=tuple(p.max_shift + 1 for p in axes), strides=(1,) * nd,
        pads_begin=(0,) * nd, pads_end=(0,) * nd, output_padding=(0,) * nd,
        weights_perm=tuple(range(nd + 2)), weights_format="OIX")


def space_to_depth(plan: ConvPlan, a):
    """``a`` padded (or cropped) to ``Q*s`` rows from its first padded row and split into its
    phases along the channels: the inner plan's ``a``, in the user's data layout."""
    axes = phases(plan).axes
    nd, g = plan.ndim, plan.groups
    cells = [p.small + p.max_shift for p in axes]
    config = [(0, 0, 0)] * a.ndim
    for ax, p, q in zip(plan.spatial_axes, axes, cells):
        config[ax] = (p.pad, q * p.stride - p.pad - p.size, 0)
    x = lax.pad(a, jnp.zeros((), a.dtype), config)
    split = tuple(itertools.chain.from_iterable((q, p.stride) for q, p in zip(cells, axes)))
    cells_at = [2 * i for i in range(nd)]          # within ``split``
    steps_at = [2 * i + 1 for i in range(nd)]
    channels = plan.a_channels * math.prod(plan.strides)
    if plan.channels_last:   # [N, Q1, s1, .., G, Ca/G] -> [N, Q.., G, s.., Ca/G]
        x = x.reshape((plan.batch, *split, g, plan.a_channels // g))
        order = (0, *(1 + i for i in cells_at), 2 * nd + 1, *(1 + i for i in steps_at),
                 2 * nd + 2)
        return jnp.transpose(x, order).reshape((plan.batch, *cells, channels))
    # [N, G, Ca/G, Q1, s1, ..] -> [N, G, s.., Ca/G, Q..]
    x = x.reshape((plan.batch, g, plan.a_channels // g, *split))
    order = (0, 1, *(3 + i for i in steps_at), 2, *(3 + i for i in cells_at))
    return jnp.transpose(x, order).reshape((plan.batch, channels, *cells))


def _split_kernel(plan: ConvPlan, w):
    """The user's weights as ``[Cb, Ca/G, L1, s1, .., Ld, sd]``: each axis zero-padded to
    ``L*s`` taps, tap ``k = m*s + r`` at ``(m, r)``."""
    wc = jnp.transpose(w, plan.weights_perm)                    # [Cb, Ca/G, K..]
    axes = phases(plan).axes
    config = [(0, 0, 0)] * 2 + [(0, (p.max_shift + 1) * p.stride - p.kernel, 0) for p in axes]
    wc = lax.pad(wc, jnp.zeros((), wc.dtype), config)
    split = itertools.chain.from_iterable((p.max_shift + 1, p.stride) for p in axes)
    return wc.reshape((*wc.shape[:2], *split))


def inner_weights(plan: ConvPlan, w):
    """The inner plan's weights ``[Cb, S*Ca/G, L..]`` (input channels ``[s.., Ca/G]``)."""
    nd = plan.ndim
    ws = _split_kernel(plan, w)
    order = (0, *(3 + 2 * i for i in range(nd)), 1, *(2 + 2 * i for i in range(nd)))
    ws = jnp.transpose(ws, order)
    return ws.reshape((ws.shape[0], -1, *ws.shape[2 + nd:]))


def forward(plan: ConvPlan, precision, a, w, *, lower: Lower):
    """The forward as the inner plan's, its lowering the one ``lower`` chooses for it (the
    chooser, as for any plan)."""
    sub = inner_plan(plan)
    run = lower("forward", sub, precision, 1)
    return run(sub, precision, space_to_depth(plan, a), inner_weights(plan, w))


def implementation(lower: Lower) -> Implementation:
    """The ``space_to_depth`` forward, its inner plan's lowering chosen by ``lower``."""
    return Implementation("space_to_depth", "forward", partial(forward, lower=lower),
                          applies=applies)
