"""The per-group lowerings (``grouped``): one ungrouped problem per group (or per block of
groups), each computed by the lowering the chooser picks for it.

XLA CPU's grouped convolutions (``feature_group_count``, ``batch_group_count``) cost about as
much as ungrouped ones of the same width; ``G`` separate ones cost ``1/G`` each. The chooser
sits above this module: its choice reaches the records as the ``lower`` parameter."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax.numpy as jnp
from jax import lax

from polyconv import ConvPlan
from polyconv._choice import Implementation

#: ``lower(primitive, plan, precision, repeats) -> run``: the kernel of the lowering chosen for
#: ``plan``, a problem the program holds ``repeats`` copies of (measured as their total)
Lower = Callable[[str, ConvPlan, Any, int], Callable[..., Any]]


#: the per-group lowerings (``grouped``: one ungrouped problem per group) apply up to this many
#: groups. Their programs hold a problem per group, and XLA compiles them in time that grows
#: with the count: a depthwise weight gradient of 144 groups took 145 s to compile (and ran
#: 12x slower than ``depthwise``), so beyond this they are neither chosen nor measured (the
#: weight gradient takes groups in blocks there: :func:`group_block`).
GROUPED_MAX_GROUPS = 32


def splits_by_group(plan: ConvPlan) -> bool:
    """Whether the per-group lowerings (``grouped``) apply: 2 to :data:`GROUPED_MAX_GROUPS`
    groups."""
    return 1 < plan.groups <= GROUPED_MAX_GROUPS


def group_block(plan: ConvPlan) -> int:
    """Groups per problem of the ``grouped`` weight gradient: 1 up to
    :data:`~polyconv_jax.GROUPED_MAX_GROUPS` groups, else the fewest that divide
    the groups into at most that many blocks. Past that bound a program of one problem per
    group compiles too slowly (a depthwise weight gradient of 144 groups: 145 s), while a
    block's products across its groups cost little where each group has few channels, and
    it applies only where they have at least 2 on both sides (ResNeXt-101 64x4d's 64 groups
    of 4, in blocks of 2: 2 CPUs, 58 ms against 151 for ``depthwise``, side by side in one
    busy process; depthwise layers have ``depthwise``)."""
    bound = GROUPED_MAX_GROUPS
    return next(k for k in range(1, plan.groups + 1)
                if plan.groups % k == 0 and plan.groups // k <= bound)


def by_group(primitive: str, plan: ConvPlan, precision, x, y, *, lower: Lower):
    """The per-group lowerings (``grouped``): one ungrouped problem per group, joined along
    the result's channel axis (the weights' ``Cb`` axis for a weight gradient). Group ``g``
    reads its channels of each operand (``Ca/G`` of ``a``, ``Cb/G`` of ``b``, rows ``[g*Cb/G,
    ..)`` of ``W``). The inner problem's lowering is chosen as the ``G`` copies the program
    holds (``lower``'s ``repeats``). XLA CPU's grouped convolutions
    (``feature_group_count``, ``batch_group_count``) cost about as much as ungrouped ones of
    the same width; ``G`` separate ones cost ``1/G`` each.

    A weight gradient of more groups than :data:`GROUPED_MAX_GROUPS`
    takes them in blocks (:func:`group_block`): one
    ungrouped weight gradient per block of ``k`` groups, whose products across two groups
    are computed and dropped (``k`` times the products, each entry kept still the sum of
    exactly its own)."""
    g = plan.groups
    per = group_block(plan) if primitive == "backward_weights" else 1
    parts_count = g // per
    ca, cb = plan.a_channels // parts_count, plan.b_channels // parts_count
    sub = plan.with_(groups=1, a_channels=ca, b_channels=cb)
    inner = lower(primitive, sub, precision, parts_count)
    c, o = plan.channel_axis, plan.weights_perm[0]
    x_size, y_size, y_axis, joined = {"forward": (ca, cb, o, c), "backward_data": (cb, cb, o, c),
                                      "backward_weights": (ca, cb, c, o)}[primitive]
    parts = [inner(sub, precision, lax.slice_in_dim(x, i * x_size, (i + 1) * x_size, axis=c),
                   lax.slice_in_dim(y, i * y_size, (i + 1) * y_size, axis=y_axis))
             for i in range(parts_count)]
    if per > 1:
        parts = [_block_diagonal(sub, part, per) for part in parts]
    return jnp.concatenate(parts, axis=joined)


def _block_diagonal(sub: ConvPlan, w, per: int):
    """The weights of each of the ``per`` groups of a block, from the block's ungrouped
    weight gradient ``w`` (``sub``'s layout): ``[Cb, Ca/per, K..]`` canonical, in that
    layout."""
    wc = jnp.transpose(w, sub.weights_perm)                         # [Cb, Ca, K..]
    cb, ca = sub.b_channels // per, sub.a_channels // per
    wc = wc.reshape((per, cb, per, ca, *sub.kernel))
    wc = jnp.stack([wc[i, :, i] for i in range(per)]).reshape((per * cb, ca, *sub.kernel))
    return jnp.transpose(wc, sub.weights_inverse_perm)


def weights_apply(plan: ConvPlan) -> bool:
    """The weight gradient per group up to :data:`GROUPED_MAX_GROUPS` groups, past it in blocks
    of groups where each has at least 2 channels on both sides (:func:`group_block`)."""
    return splits_by_group(plan) or (
        plan.groups > 1 and min(plan.a_channels, plan.b_channels) // plan.groups >= 2)


def implementations(lower: Lower) -> tuple[Implementation, ...]:
    """The ``grouped`` records of the three primitives, their inner problems' lowerings chosen
    by ``lower``."""
    return tuple(Implementation("grouped", p, partial(by_group, p, lower=lower), applies=a)
                 for p, a in (("forward", splits_by_group), ("backward_data", splits_by_group),
                              ("backward_weights", weights_apply)))
