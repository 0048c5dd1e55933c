"""The elementwise lowerings, for few channels per group: a sum of shifted windows times
per-channel weights in one fused XLA loop, with no matrix product (there is little to
contract). ``elementwise`` (forward and backward_data), ``upsampled`` (backward_data on the
input upsampled, weights periodic along the output) and ``depthwise`` (the weight gradient),
and the split of an output into regions of rows that read no padding."""

from __future__ import annotations

import itertools
import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from polyconv import ConvPlan
from polyconv._choice import Implementation
from polyconv._phases import AxisPhases

from ._common import (
    _interleave,
    _phase_shape,
    _phases,
    channel_vector,
    group_channels,
    pad_large,
    reads_past_end,
    sum_by_first_tap,
    taps_first,
    windows,
)
from ._xla import _merge, rearranged_once

#: the elementwise lowerings handle at most this many channels per group on their
#: contracted side (their cost grows with it; a matrix product's does not)
ELEMENTWISE_MAX_CHANNELS = 8


def forward_elementwise(plan: ConvPlan, precision, a, w):
    """:func:`_elementwise_terms` of the whole output or, for channels-last data, stride 1
    and taps that read past the end of ``a`` (where :func:`windows` pads a copy of it), on
    CPU, :func:`by_regions`: one loop for the outputs whose taps all read inside ``a``, with
    no padded copy. 2 CPUs, against the whole output: MobileNetV2's 3x3 forward 3.6-3.9 ms
    -> 1.8, ConvNeXt-T's 7x7 6.5 -> 6.0, a conformer's 1-D k31 5.5 -> 4.3, 1-D k3 27 -> 14,
    ResNeXt-50's 3x3 of 4 channels per group 4.5 -> 4.6-4.9 (the one loss at stride 1).
    Strided, EfficientNet-B0's 5x5 ran 1.7-1.8 -> 2.0 (its copy is of the larger side), and
    channels-first data 1.7x slower (the regions split its vectorized minor axis)."""
    if splits_by_regions(plan) and reads_past_end(plan):
        return by_regions(plan, a, partial(_elementwise_terms, precision=precision, w=w))
    return _elementwise_terms(plan, a, precision=precision, w=w)


#: the elementwise lowerings split an output into regions only from this many multiply-adds:
#: each region is one more copy of the loop to compile (up to ``3**nd``), which a smaller
#: plan's call, well under a millisecond, cannot pay back
REGIONS_MIN_MACS = 1_000_000


def splits_by_regions(plan: ConvPlan) -> bool:
    """Whether the elementwise lowerings compute ``plan`` by regions of output rows
    (:func:`by_regions`) where a padded copy would be read: channels-last data, stride 1,
    one or two spatial axes, :data:`REGIONS_MIN_MACS` or more, on CPU (the measurements of
    :func:`forward_elementwise`). A 3-D plan's 27 regions made its program 27 copies of the
    loop, 4-9x as long to compile for no faster call (docs/design_notes.md)."""
    return (plan.channels_last and set(plan.strides) == {1} and plan.ndim <= 2
            and plan.macs >= REGIONS_MIN_MACS and jax.default_backend() == "cpu")


def _region(plan: ConvPlan, a, axis: int, o0: int, o1: int):
    """The sub-problem of outputs ``o0 <= y < o1`` on spatial axis ``axis``: its plan and
    the rows of ``a`` those outputs read (pads only where they read before or past ``a``),
    or ``None`` where they read no row of ``a``."""
    s, ek, pb = plan.strides[axis], plan.effective_kernel[axis], plan.pads_begin[axis]
    first, last = o0 * s - pb, (o1 - 1) * s - pb + ek - 1
    r0, r1 = max(0, first), min(plan.a_spatial[axis], last + 1)
    if r1 <= r0:
        return None

    def put(values, value):
        return (*values[:axis], value, *values[axis + 1:])

    sub = plan.with_(
        a_spatial=put(plan.a_spatial, r1 - r0), b_spatial=put(plan.b_spatial, o1 - o0),
        pads_begin=put(plan.pads_begin, r0 - first), pads_end=put(plan.pads_end, last + 1 - r1),
        output_padding=put(plan.output_padding, 0))
    return sub, lax.slice_in_dim(a, r0, r1, axis=plan.spatial_axes[axis])


def _padded(plan: ConvPlan, a):
    """``a`` with its zeros padded on (:func:`pad_large`), and the plan of it with none: a
    border region's windows are slices of one padded copy (padded inside their loops, XLA
    CPU fuses every region into the loop that joins them, unvectorized: ConvNeXt-T's 7x7
    forward ran 26 ms against 5)."""
    padded = pad_large(plan, a)
    sizes = tuple(padded.shape[ax] for ax in plan.spatial_axes)
    zeros = (0,) * plan.ndim
    return plan.with_(a_spatial=sizes, pads_begin=zeros, pads_end=zeros,
                      output_padding=zeros), padded


def by_regions(plan: ConvPlan, a, compute, axis: int = 0):
    """``compute(plan, a)`` (the forward output), computed per region of output rows: along
    each spatial axis in turn, the rows whose taps read before ``a``, those whose taps all
    read inside it, and those reading past its end, joined along the axis; the inner rows
    split on the next axis, so the innermost region reads ``a`` itself, unpadded. XLA CPU
    fuses a padded copy into no loop that reads it at several offsets: the copy is a pass of
    its own (and padding inside the loop runs slower still, see :func:`windows`); here only
    the thin border regions are padded. No split where some region would read no row of
    ``a`` (pads wider than the kernel): that one's windows are all zeros, which the whole
    computation already multiplies as the contract says."""
    if axis == plan.ndim:
        return compute(plan, a)
    s, ek, pb = plan.strides[axis], plan.effective_kernel[axis], plan.pads_begin[axis]
    size, rows = plan.a_spatial[axis], plan.b_spatial[axis]
    lo = min(rows, -(-pb // s))                         # first row reading no leading zero
    hi = max(lo, min(rows, (size - ek + pb) // s + 1))  # first row reading past the end
    spans = [(o0, o1) for o0, o1 in ((0, lo), (lo, hi), (hi, rows)) if o1 > o0]
    if lo == hi:
        return compute(plan, a)                         # every row reads some zeros
    parts = []
    for o0, o1 in spans:
        region = _region(plan, a, axis, o0, o1)
        if region is None:
            return compute(plan, a)
        inner = (o0, o1) == (lo, hi)
        parts.append(by_regions(*region, compute, axis + 1) if inner
                     else compute(*_padded(*region)))
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts, plan.spatial_axes[axis])


def _elementwise_terms(plan: ConvPlan, a, *, precision, w):
    """Few input channels per group (``Ca/G``; 1 is depthwise, any channel multiplier): per
    tap and input channel of a group, a strided window of ``a`` times that tap's ``[G, Cb/G]``
    weights, summed in the accumulation dtype (one fused XLA loop; no matrix product, as
    there is little to contract). ``precision`` has no effect: accumulation-dtype products
    are exact per element."""
    del precision
    ca_g, cb_g = plan.a_channels // plan.groups, plan.b_channels // plan.groups
    wk = taps_first(plan, w)                                # [K.., Ca/G, Cb]
    window_of = windows(plan, a.astype(plan.acc_dtype))

    def terms():
        for tap in itertools.product(*(range(k) for k in plan.kernel)):
            window = window_of(tap)
            for i in range(ca_g):
                yield tap, (group_channels(plan, window, i, ca_g, cb_g)
                            * channel_vector(plan, wk[(*tap, i)]))

    return sum_by_first_tap(terms())


def _stride_one_as_forward(plan: ConvPlan, w):
    """A stride-1 backward_data as the forward convolution of ``b`` that computes it: each
    group's kernel transposed (``[Ca, Cb/G, K..]``, canonical) and flipped, pads
    ``ek - 1 - pb`` before and ``A - B + pb`` (``ek - 1 - pe``, plus any output padding)
    after: the same taps and products. Its plan and weights, or ``None`` where a pad would
    be negative (pads wider than the kernel)."""
    nd, g = plan.ndim, plan.groups
    before = tuple(e - 1 - p for e, p in zip(plan.effective_kernel, plan.pads_begin))
    after = tuple(size - rows + p for size, rows, p in zip(
        plan.a_spatial, plan.b_spatial, plan.pads_begin))
    if min(before + after) < 0:
        return None
    cb_g, ca_g = plan.b_channels // g, plan.a_channels // g
    wc = w.transpose(plan.weights_perm).reshape((g, cb_g, ca_g, *plan.kernel))
    wc = jnp.swapaxes(wc, 1, 2).reshape((plan.a_channels, cb_g, *plan.kernel))
    wc = jnp.flip(wc, axis=tuple(range(2, nd + 2)))
    forward = plan.with_(
        primitive="forward", a_channels=plan.b_channels, b_channels=plan.a_channels,
        a_spatial=plan.b_spatial, b_spatial=plan.a_spatial, pads_begin=before,
        pads_end=after, output_padding=(0,) * nd, weights_perm=tuple(range(nd + 2)))
    return forward, wc


def _elementwise(plan: ConvPlan, precision, b, w):
    """:func:`_elementwise_phases`, or for stride 1 and channels-last data on CPU the
    forward ``elementwise`` of :func:`_stride_one_as_forward`, which splits the output into
    regions (:func:`by_regions`) instead of padding a copy of ``b``:
    MobileNetV2's stride-1 3x3 input gradient (2 CPUs) 3.6-3.8 ms -> 2.0, ConvNeXt-T's
    7x7 6.2 -> 5.6."""
    as_forward = _stride_one_as_forward(plan, w) if splits_by_regions(plan) else None
    if as_forward is None:
        return _elementwise_phases(plan, precision, b, w)
    forward, wc = as_forward
    return forward_elementwise(forward, precision, b, wc)


def _elementwise_phases(plan: ConvPlan, precision, b, w):
    """Shift-and-multiply-add, for few input channels per group (``Cb/G``; 1 is depthwise,
    with any channel multiplier ``Ca/G``).

    Each phase is a sum, over its taps and the ``Cb/G`` input channels of a group, of a
    shifted window of one channel of ``b`` times that tap's ``[G, Ca/G]`` weights, in the
    accumulation dtype: one fused XLA loop per phase, ``Cb/G`` times the taps' multiply-adds
    per output, no matrix product (with ``Cb/G`` that small there is little to contract).
    Then the phases are interleaved. ``precision`` has no effect: products of the
    accumulation dtype are exact per element.
    """
    del precision
    axes = _phases(plan)
    g = plan.groups
    cb_g, ca_g = plan.b_channels // g, plan.a_channels // g
    acc = plan.acc_dtype
    wk = taps_first(plan, w, per_b_channel=True)            # [K.., Cb/G, Ca]
    tops = tuple(p.max_shift for p in axes)
    config = [(0, 0, 0)] * b.ndim
    for ax, p in zip(plan.spatial_axes, axes):
        config[ax] = (*p.window_pads, 0)
    bp = lax.pad(b.astype(acc), jnp.zeros((), acc), config)
    parts = {}
    for r in itertools.product(*(range(p.stride) for p in axes)):
        def terms(r=r):
            for tap in itertools.product(*(zip(p.taps[ri], p.phase_shifts[ri])
                                           for p, ri in zip(axes, r))):
                start, limit = [0] * bp.ndim, list(bp.shape)
                for ax, p, top, (_, m) in zip(plan.spatial_axes, axes, tops, tap):
                    start[ax], limit[ax] = top - m, top - m + p.rows
                window = lax.slice(bp, start, limit)
                ks = tuple(k for k, _ in tap)
                for i in range(cb_g):
                    yield ks, (group_channels(plan, window, i, cb_g, ca_g)
                               * channel_vector(plan, wk[(*ks, i)]))

        total = sum_by_first_tap(terms())
        if total is None:
            parts[r] = jnp.zeros(_phase_shape(plan, axes), acc)
        else:
            parts[r] = _merge(total, _phase_shape(plan, axes))
    return _interleave(plan, axes, parts)


def _repeated(plan: ConvPlan, x, axes: tuple[AxisPhases, ...]):
    """``x`` with each spatial row repeated ``s`` times in place (row ``t`` of the result is
    row ``t // s``): a broadcast and a merge per axis, which XLA fuses into its readers."""
    for ax, p in zip(plan.spatial_axes, axes):
        if p.stride > 1:
            shape = list(x.shape)
            x = jnp.broadcast_to(jnp.expand_dims(x, ax + 1),
                                 (*shape[:ax + 1], p.stride, *shape[ax + 1:]))
            x = x.reshape((*shape[:ax], shape[ax] * p.stride, *shape[ax + 1:]))
    return x


def _periodic(plan: ConvPlan, axes: tuple[AxisPhases, ...], v):
    """``v`` (one value per ``a`` channel and phase of every axis: ``[s.., Ca]`` for
    channels-last data, ``[Ca, s..]`` for channels-first) laid over the output, where
    position ``x`` of axis ``i`` takes phase ``(x + crop_i) % s_i``: an array that broadcasts
    against ``a``, for XLA to fuse into the loop that reads it."""
    c = plan.a_channels
    tiles = [-(-(p.crop + p.size) // p.stride) for p in axes]
    lead, tail = ((), (c,)) if plan.channels_last else ((c,), ())
    v = v.reshape((*lead, *itertools.chain.from_iterable((1, p.stride) for p in axes), *tail))
    v = jnp.broadcast_to(v, (*lead, *itertools.chain.from_iterable(
        (n, p.stride) for n, p in zip(tiles, axes)), *tail))
    v = v.reshape((*lead, *(n * p.stride for n, p in zip(tiles, axes)), *tail))
    return lax.slice(v, (*(0 for _ in lead), *(p.crop for p in axes), *(0 for _ in tail)),
                     (*lead, *(p.crop + p.size for p in axes), *tail))


def _upsampled(plan: ConvPlan, precision, b, w):
    """Shift-and-multiply-add on ``b`` upsampled, for few input channels per group (``Cb/G``,
    as ``elementwise``).

    Each spatial row of ``b`` (padded to the phases' common window) is repeated ``s`` times,
    so that window row ``j`` of every output position ``x`` is the repeated ``b``'s row
    ``x + crop + j*s``, whatever its phase; the tap that row meets depends on the phase
    alone, ``(x + crop) % s``, so its weights are periodic along the output. ``a`` is then one
    sum over the window's rows of a shifted slice of the repeated ``b`` times periodic
    weights: one fused XLA loop written in the output's own order, with no stack of phases
    to interleave. (For channels-first data that interleave is of the minor axis, and for
    many phases a chain of branches: XLA CPU's loop over it runs unvectorized. 2 CPUs:
    CenterNet's depthwise k4 s2 up-sampling of 64 channels, ``NCX``, 7.1 ms as
    ``elementwise`` against 2.9; its k8 s4, 12.0 against 2.7, and 8.5 against 1.9 for
    ``NXC`` data.)

    Where the window is not filled (:func:`subpixel_is_exact`: k3 s2, dilations) its rows
    without a tap meet a zero weight, and a NaN or infinity in ``b`` reaches outputs that do
    not read it, as in the sub-pixel lowerings: measuring and the default choice take it
    only where the window is filled (:func:`exact`). ``precision`` has no effect: products
    of the accumulation dtype are exact per element.
    """
    del precision
    axes = _phases(plan)
    g = plan.groups
    cb_g, ca_g = plan.b_channels // g, plan.a_channels // g
    acc = plan.acc_dtype
    # [K.., Cb/G, Ca], and a zero tap at index K of each axis (the window's rows a phase has
    # no tap at, where the window is not filled)
    wk = jnp.pad(taps_first(plan, w, per_b_channel=True), [(0, 1)] * plan.ndim + [(0, 0)] * 2)
    config = [(0, 0, 0)] * b.ndim
    for ax, p in zip(plan.spatial_axes, axes):
        config[ax] = (*p.window_pads, 0)
    rep = _repeated(plan, lax.pad(b.astype(acc), jnp.zeros((), acc), config), axes)

    def terms():
        for rows in itertools.product(*(range(p.max_shift + 1) for p in axes)):
            start, limit = [0] * rep.ndim, list(rep.shape)
            for ax, p, j in zip(plan.spatial_axes, axes, rows):
                start[ax] = p.crop + j * p.stride
                limit[ax] = start[ax] + p.size
            window = lax.slice(rep, start, limit)
            # the taps of these window rows, per phase of each axis
            index = np.ix_(*(np.asarray(p.window_taps[j]) for p, j in zip(axes, rows)))
            for i in range(cb_g):
                # [s.., Ca] (or [Ca, s..]), by its own gather: XLA's loop over the output
                # reads it through the periodic broadcast alone, and stays vectorized
                weights = rearranged_once(wk, lambda v, i=i, index=index: (
                    v[index][..., i, :] if plan.channels_last
                    else np.moveaxis(v[index][..., i, :], -1, 0)))
                yield rows, (group_channels(plan, window, i, cb_g, ca_g)
                             * _periodic(plan, axes, weights))

    return sum_by_first_tap(terms())


#: channels-last depthwise weight gradients sum their products over blocks of this many
#: consecutive positions first (see :func:`_weights_depthwise`)
DEPTHWISE_BLOCK = 8


#: ... in XLA reductions of at most this many products each, or of all of them where there
#: are no more than :data:`DEPTHWISE_ONE_REDUCE_MAX`
DEPTHWISE_PRODUCTS_PER_REDUCE = 5


DEPTHWISE_ONE_REDUCE_MAX = 9


def _weights_depthwise(plan: ConvPlan, precision, a, b):
    """Few channels per group on both sides (depthwise: one ``b`` channel per group, or a
    channel multiplier): ``dW[o, i, k] = sum_{n,y} a_k[n, y, g*Ca/G + i] b[n, y, o]`` per tap
    ``k``, channel ``i`` of a group and channel ``o`` of ``b`` (in group ``g``), with no
    contraction over channels to make a matrix product of: one product per tap and ``i``,
    ``a``'s channel repeated ``Cb/G`` times against all of ``b``. The elementwise products of
    every tap and channel are summed over runs
    of rows in variadic XLA reductions, each reading the elements of ``a`` and ``b`` once for
    all its products (a reduction per product reads them once per product: 3-5x slower);
    then the partial sums are summed. ``precision`` has no effect."""
    del precision
    ca_g, cb_g = plan.a_channels // plan.groups, plan.b_channels // plan.groups
    acc = plan.acc_dtype
    window_of, y = windows(plan, a.astype(acc)), b.astype(acc)
    taps = list(itertools.product(*(range(k) for k in plan.kernel)))
    # the rows, and which axes of them one reduction sums. Channels-last data: blocks of
    # DEPTHWISE_BLOCK consecutive positions, [P/8, 8, Cb] summed over the block, in reductions
    # of at most DEPTHWISE_PRODUCTS_PER_REDUCE products (XLA CPU, 2 CPUs, against the whole
    # rows below in one reduction: MobileNetV2's 3x3 layers 10-11 -> 3-5.5 ms, EfficientNet-B0's
    # 5x5 7-8 -> 3.7-4.5, a conformer's 1-D k31 58 -> 8-10, a 3-D k3 1.9 -> 0.8, ConvNeXt-T's
    # 7x7 as fast; blocks of 4, 7 or 16 positions, or one reduction of every product, ran up
    # to 2-10x slower; a 3x3 or a 7-tap kernel's products all in one reduction ran 10-25%
    # faster than in reductions of 5, a 5x5 kernel's in reductions of 9 up to 2x slower);
    # where the positions do not split into 256 or more such blocks,
    # [N, Y.., X*Cb] summed over Y.. (2-4x faster than [N*Y.., X, Cb] over N*Y..) or, with one
    # spatial axis, [N, X, Cb] over N. Channels-first data: [N, Cb, Y.., X] over N and Y.., in
    # one reduction (splitting it ran slower on three of five layers). The rest is summed
    # after.
    front, last = math.prod(plan.b_spatial[:-1]), plan.b_spatial[-1]
    n, cb = plan.batch, plan.b_channels
    positions, block = n * front * last, DEPTHWISE_BLOCK
    per_reduce = None
    if plan.channels_last and positions % block == 0 and positions // block >= 256:
        rows, summed = (positions // block, block, cb), (1,)
        if len(taps) * ca_g > DEPTHWISE_ONE_REDUCE_MAX:
            per_reduce = DEPTHWISE_PRODUCTS_PER_REDUCE
    elif plan.channels_last:
        rows, summed = ((n, front, last * cb), (1,)) if front > 1 else ((n, last, cb), (0,))
    elif front > 1:
        rows, summed = (n, cb, front, last), (0, 2)
    else:
        rows, summed = (n, cb, last), (0,)
    products = tuple(_merge(group_channels(plan, window_of(k), i, ca_g, cb_g) * y, rows)
                     for k in taps for i in range(ca_g))
    per_reduce = per_reduce or len(products)
    sums = []
    for j in range(0, len(products), per_reduce):
        some = products[j:j + per_reduce]
        sums += lax.reduce(some, (jnp.zeros((), acc),) * len(some),
                           lambda s, t: tuple(u + v for u, v in zip(s, t)), summed)
    per_tap = jnp.stack([part.reshape(-1, cb).sum(0) if plan.channels_last else part.sum(-1)
                         for part in sums])
    w = per_tap.reshape((*plan.kernel, ca_g, cb))
    w = jnp.transpose(w, (plan.ndim + 1, plan.ndim, *range(plan.ndim)))  # [Cb, Ca/G, K..]
    return jnp.transpose(w, plan.weights_inverse_perm)


def few_a_channels(plan: ConvPlan) -> bool:
    """At most :data:`ELEMENTWISE_MAX_CHANNELS` channels of ``a`` per group."""
    return plan.a_channels // plan.groups <= ELEMENTWISE_MAX_CHANNELS


def few_b_channels(plan: ConvPlan) -> bool:
    """At most :data:`ELEMENTWISE_MAX_CHANNELS` channels of ``b`` per group."""
    return plan.b_channels // plan.groups <= ELEMENTWISE_MAX_CHANNELS


def depthwise_applies(plan: ConvPlan) -> bool:
    """Few channels per group on both sides."""
    return few_a_channels(plan) and few_b_channels(plan)


FORWARD = Implementation("elementwise", "forward", forward_elementwise, applies=few_a_channels)
BACKWARD_DATA = Implementation("elementwise", "backward_data", _elementwise,
                               applies=few_b_channels)
# its zero taps meet b where the phases do not fill one window (k3 s2): exact only where they do
UPSAMPLED = Implementation("upsampled", "backward_data", _upsampled, applies=few_b_channels,
                           exact_on_nonfinite=False)
DEPTHWISE = Implementation("depthwise", "backward_weights", _weights_depthwise,
                           applies=depthwise_applies)
