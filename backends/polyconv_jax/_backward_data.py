"""backward_data lowerings (``b, W -> a``): the direct lhs-dilated convolution, the lowerings
built from per-tap products (elementwise, folded phases, per group, matrix product then
overlap-add), the table of every lowering and the default policy that picks one. The phase
(sub-pixel) decompositions are in :mod:`polyconv_jax._subpixel`.

Notation and the measurements behind the policy: the docs page "JAX lowerings".
"""

from __future__ import annotations

import itertools
import math

import jax.numpy as jnp
import numpy as np
from jax import lax

from polyconv import ConvPlan
from polyconv._phases import AxisPhases
from polyconv._phases import phases as plan_phases

from . import _sliced, _taps
from ._forward import (
    ELEMENTWISE_MAX_CHANNELS,
    channel_vector,
    few_channels,
    few_per_group,
    fold_first_axis,
    folded_conv,
    forward_elementwise,
    group_channels,
    splits_by_group,
    splits_by_regions,
    sum_by_first_tap,
    taps_first,
    unfold,
)
from ._subpixel import (
    _by_phase,
    _interleave,
    _phase_shape,
    _phases,
    _phases_matmul,
    _subpixel,
    _subpixel_matmul,
)
from ._xla import _conv_general, _data_spec, _dnums, _merge, _regroup, rearranged_once


def _direct(plan: ConvPlan, precision, b, w):
    """One stride-1 convolution of ``b`` dilated by ``s`` (``lhs_dilation``)."""
    data = _data_spec(plan)
    perm = plan.weights_perm
    eks = plan.effective_kernel
    w = lax.rev(w, perm[2:])
    if plan.groups > 1:
        w = _regroup(w, perm[0], perm[1], plan.groups)
    padding = [(ek - 1 - pb, x + pb - 1 - (y - 1) * s)
               for x, y, s, ek, pb in zip(plan.a_spatial, plan.b_spatial, plan.strides, eks,
                                          plan.pads_begin)]
    # The transposed kernel: out-feature = the Ca axis, in-feature = the Cb axis.
    return _conv_general(
        b, w, window_strides=(1,) * plan.ndim, padding=padding, lhs_dilation=plan.strides,
        rhs_dilation=plan.dilations,
        dimension_numbers=_dnums(data, (perm[1], perm[0], *perm[2:]), data),
        feature_group_count=plan.groups, precision=precision,
        preferred_element_type=plan.acc_dtype)


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
    regions (:func:`polyconv_jax._forward.by_regions`) instead of padding a copy of ``b``:
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


def _first_axis_kernel(wc, taps: list[int]):
    """The kernel ``[T0*Cb/G, G*Ca/G, K_rest..]`` of the first axis's taps ``taps`` stacked
    along input channels, from ``wc`` ``[G, Cb/G, Ca/G, K..]``."""
    g, cb_g, ca_g = wc.shape[:3]
    k0 = jnp.stack([wc[:, :, :, k] for k in taps], axis=1)      # [G, T0, Cb/G, Ca/G, ..]
    k0 = jnp.moveaxis(k0, 0, 2)                                  # [T0, Cb/G, G, Ca/G, ..]
    return k0.reshape((len(taps) * cb_g, g * ca_g, *k0.shape[4:]))


def _folded_padding(rest, phase, taps) -> list[tuple[int, int]]:
    """Pads of the folded convolution of one phase of the axes after the first: the window's
    first row is the phase's last tap, at offset ``top - m`` (the input is padded for every
    tap's offset); the merged axis keeps ``R0*B1'`` rows, the others their rows."""
    padding = []
    for i, (p, ri, t) in enumerate(zip(rest, phase, taps)):
        extent = (len(t) - 1) * p.shift_step + 1
        lo = p.phase_shifts[ri][-1] - p.max_shift
        hi = extent - 1 - lo if i == 0 else -p.max_shift + extent - 1 - lo
        padding.append((lo, hi))
    return padding


def _folded(plan: ConvPlan, precision, b, w):
    """The phases with the first spatial axis's taps stacked along channels, the other axes
    by one stride-1 convolution per phase over a tensor whose first two spatial axes are
    folded (merged) into one.

    Per phase ``r0`` of the first axis its ``T0`` shifted windows of ``b`` are stacked along
    channels (``T0`` times ``b``'s memory, ``[G, T0, Cb/G]`` channel order); the first two
    spatial axes, rows ``R0`` and the padded ``B1'``, are merged, and each phase of the other
    axes is one convolution with exactly its taps (channels ``T0*Cb/G`` -> ``Ca/G`` per
    group), the second axis's taps running along the merged axis. Merged rows whose window
    runs past the end of a ``B1'`` row (into the next) are computed and cropped; no output
    reads them. So a 3-D problem is 2-D convolutions (which XLA CPU runs well, unlike its 3-D
    ones), no product is wasted on zero taps, and only one axis's taps are materialised.
    """
    axes = _phases(plan)
    nd = plan.ndim
    first, rest = axes[0], axes[1:]
    config = [(0, 0, 0)] * b.ndim
    for ax, p in zip(plan.spatial_axes, axes):
        config[ax] = (*p.window_pads, 0)
    x = lax.pad(b, jnp.zeros((), b.dtype), config)             # user layout, padded
    g = plan.groups
    wc = jnp.transpose(w, plan.weights_perm)                     # [Cb, Ca/G, K..]
    wc = wc.reshape((g, plan.b_channels // g, plan.a_channels // g, *plan.kernel))
    phase_shape = _phase_shape(plan, axes)
    parts = {}
    for r0 in range(first.stride):
        taps0 = list(zip(first.taps[r0], first.phase_shifts[r0]))
        if not taps0:
            for rr in itertools.product(*(range(p.stride) for p in rest)):
                parts[(r0, *rr)] = jnp.zeros(phase_shape, plan.acc_dtype)
            continue
        top = first.max_shift
        xd = fold_first_axis(plan, x, [top - m for _, m in taps0], first.rows, 1)
        k0 = _first_axis_kernel(wc, [k for k, _ in taps0])
        for rr in itertools.product(*(range(p.stride) for p in rest)):
            taps = [p.taps[ri] for p, ri in zip(rest, rr)]
            if not all(taps):
                parts[(r0, *rr)] = jnp.zeros(phase_shape, plan.acc_dtype)
                continue
            sub = k0
            for i, (p, t) in enumerate(zip(rest, taps)):
                sub = lax.slice_in_dim(sub, t[0], t[-1] + 1, p.tap_step, 2 + i)
            sub = lax.rev(sub, tuple(range(2, 1 + nd)))          # a correlation
            z = folded_conv(plan, precision, xd, sub, _folded_padding(rest, rr, taps),
                            (1,) * (nd - 1), tuple(p.shift_step for p in rest))
            parts[(r0, *rr)] = unfold(plan, z, first.rows, rest[0].rows if rest else 0)
    return _interleave(plan, axes, parts)


def _grouped(plan: ConvPlan, precision, b, w):
    """One ungrouped backward_data per group (:func:`polyconv_jax._choice.by_group`)."""
    from ._choice import by_group  # (that module imports this one)

    return by_group("backward_data", plan, precision, b, w)


def _matmul_overlap_add(plan: ConvPlan, precision, b, w):
    """Multiply first, then overlap-add (GEMM + col2im), for a narrow output side.

    One matrix product of ``b`` (``[rows, Cb]``) with every tap's weights at once
    (``[Cb, Ca*prod(K)]``) gives each input row's contribution to every tap; each output phase
    is then the sum of its taps' shifted slices of that product (one fused XLA loop per
    phase), interleaved. Nothing is gathered before the product, so when ``Ca*prod(K)`` is
    small (few output channels: an image or volume decoder's last layer) this reads ``b``
    once where the phase lowerings copy it once per tap; with one tap per phase (k2 s2) it is
    the product and one interleaving copy. Ungrouped plans only.

    Channels-first data is multiplied as it lies, weights first (``[K.., Ca, Cb] @ [Cb, N,
    B..]``), so the product comes out channels-first too: no transposition of ``b`` or of the
    product (U-Net's 128 -> 64 k2 s2 up-convolution: 3.0 ms against 4.8 ms with ``b`` as the
    left operand).
    """
    axes = _phases(plan)
    nd = plan.ndim
    ca, cb = plan.a_channels, plan.b_channels
    wc = jnp.transpose(w, plan.weights_perm)                    # [Cb, Ca, K..]
    if plan.channels_last:
        wm = wc.reshape((cb, ca * math.prod(plan.kernel)))
        y = lax.dot_general(b, wm, (((plan.channel_axis,), (0,)), ((), ())),
                            precision=precision, preferred_element_type=plan.acc_dtype)
        y = y.reshape((plan.batch, *plan.b_spatial, ca, *plan.kernel))   # [N, B.., Ca, K..]
        spatial, taps = range(1, nd + 1), range(nd + 2, 2 * nd + 2)
    else:
        wm = jnp.transpose(wc, (*range(2, nd + 2), 1, 0)).reshape((-1, cb))
        y = lax.dot_general(wm, b, (((1,), (1,)), ((), ())),
                            precision=precision, preferred_element_type=plan.acc_dtype)
        y = y.reshape((*plan.kernel, ca, plan.batch, *plan.b_spatial))   # [K.., Ca, N, B..]
        spatial, taps = range(nd + 2, 2 * nd + 2), range(nd)
    config = [(0, 0, 0)] * y.ndim
    for ax, p in zip(spatial, axes):
        config[ax] = (*p.window_pads, 0)
    y = lax.pad(y, jnp.zeros((), y.dtype), config)
    parts = {}
    for r in itertools.product(*(range(p.stride) for p in axes)):
        total = None
        for tap in itertools.product(*(zip(p.taps[ri], p.phase_shifts[ri])
                                       for p, ri in zip(axes, r))):
            start, limit = [0] * y.ndim, list(y.shape)
            for ax, p, (_, m) in zip(spatial, axes, tap):
                start[ax], limit[ax] = p.max_shift - m, p.max_shift - m + p.rows
            for ax, (k, _) in zip(taps, tap):
                start[ax], limit[ax] = k, k + 1
            term = lax.slice(y, start, limit)
            term = term.reshape(tuple(n for i, n in enumerate(term.shape) if i not in taps))
            total = term if total is None else total + term
        if total is None:
            parts[r] = jnp.zeros(_phase_shape(plan, axes), plan.acc_dtype)
        elif plan.channels_last:
            parts[r] = total
        else:
            parts[r] = jnp.moveaxis(total, 0, 1)                 # [Ca, N, R..] -> [N, Ca, R..]
    return _interleave(plan, axes, parts)


#: the default policy takes ``matmul_overlap_add`` for ungrouped plans whose product has at
#: most this many columns (``Ca*prod(K)``: an image or volume decoder's last layer, 3-D 64->1
#: k3 s2: 13x faster than ``phases_matmul``, DCGAN 64->3 k4 s2: 2-5x)
NARROW_COLUMNS = 64

#: ... for plans of at least this many multiply-adds (smaller ones were not measured)
NARROW_MIN_MACS = 10_000_000


def narrow(plan: ConvPlan) -> bool:
    """An ungrouped plan of some size whose large side has few columns per input row
    (``Ca*prod(K) <= NARROW_COLUMNS``): the default policy multiplies first there."""
    return (plan.groups == 1 and plan.a_channels * math.prod(plan.kernel) <= NARROW_COLUMNS
            and plan.macs >= NARROW_MIN_MACS)


#: the backward_data lowerings, by name (see :func:`choose_backward_data`)
BACKWARD_DATA = {"direct": _direct, "phases": _by_phase, "phases_matmul": _phases_matmul,
                 "subpixel": _subpixel, "subpixel_matmul": _subpixel_matmul,
                 "phases_folded": _folded, "elementwise": _elementwise,
                 "upsampled": _upsampled,
                 "grouped": _grouped, "matmul_overlap_add": _matmul_overlap_add,
                 "sliced": _sliced.backward_data, "taps": _taps.backward_data}


def applicable(plan: ConvPlan, lowering: str) -> bool:
    """Whether ``lowering`` can compute ``plan``'s backward_data."""
    if lowering in ("elementwise", "upsampled"):
        return plan.b_channels // plan.groups <= ELEMENTWISE_MAX_CHANNELS
    if lowering == "grouped":
        return splits_by_group(plan)
    if lowering in ("matmul_overlap_add", "taps"):
        return plan.groups == 1
    return lowering in BACKWARD_DATA


def direct_aborts_xla_cpu(plan: ConvPlan) -> bool:
    """Whether XLA CPU (jaxlib 0.10.2) may abort the process compiling the ``direct``
    lowering's lhs-dilated convolution: its ``algebraic_simplifier`` check fails ("Window
    dimensions do not match RHS shape") when one axis has a window equal to its dilation and
    no padding and another axis does not -- e.g. the input gradient ``jax.vjp`` gives for a
    stride-2 convolution with kernel (3, 2) and pads 1. This over-approximates it; such
    plans never get the ``direct`` lowering on CPU unless it is forced."""
    axes = []
    for a, b, s, ek, pb in zip(plan.a_spatial, plan.b_spatial, plan.strides,
                               plan.effective_kernel, plan.pads_begin):
        axes.append((s, ek, ek - 1 - pb, a + pb - 1 - (b - 1) * s))
    return (any(s > 1 and ek == s and lo == hi == 0 for s, ek, lo, hi in axes)
            and len(set(axes)) > 1)


#: the lowerings that form every product of the phases' common window, its zero taps too
WINDOWED = ("subpixel", "subpixel_matmul", "upsampled")


def exact(plan: ConvPlan, lowering: str) -> bool:
    """Whether ``lowering`` forms exactly the products of the definition for ``plan`` (a NaN
    or infinity in ``b`` then reaches exactly the outputs that read it): every lowering but
    the :data:`WINDOWED` ones, and those where :func:`subpixel_is_exact`."""
    return lowering not in WINDOWED or subpixel_is_exact(plan)


def subpixel_is_exact(plan: ConvPlan) -> bool:
    """Whether the sub-pixel window holds only real taps (every phase of every axis has a tap
    at every window row: k4 s2, k16 s8, k2 s2, ..., not k3 s2).

    Only then do ``subpixel`` and ``subpixel_matmul`` form exactly the products of the
    definition; otherwise their zero taps meet ``b`` too, and a NaN or infinity in ``b``
    reaches outputs that do not read it (``0 * inf = nan``). The default choice never makes
    such products.
    """
    return plan_phases(plan).fills_window


def upsamples(plan: ConvPlan) -> bool:
    """Whether the default policy takes ``upsampled`` over ``elementwise`` (both for few
    input channels per group): a strided plan whose phases fill one window
    (:func:`subpixel_is_exact`) and either has more than 4 phases or channels-first data and
    more than one tap in some phase -- where ``elementwise``'s interleave of the phases is
    XLA CPU's unvectorized loop. 2 CPUs: depthwise ConvTranspose of 64 channels, k4 s2,
    ``NCX`` 7.1 ms against 2.9 (``NXC`` 1.8 against 2.0: kept); k8 s4 12.0 against 2.7
    (``NXC`` 8.5 against 1.9); k4 s4 28 against 1.6; a 1-D k16 s8 2.1 against 1.3; a 3-D
    k4 s2 2.1 against 1.2; a k2 s2 (one tap per phase), ``NCX``, 1.5 against 1.7: kept."""
    ph = plan_phases(plan)
    strided = math.prod(ph.strides)
    return strided > 1 and ph.fills_window and (
        strided > 4 or (not plan.channels_last and not ph.one_tap_per_phase))


def choose_backward_data(plan: ConvPlan) -> str:
    """The backward_data lowering for a plan (measured on XLA CPU: see the module docstring).

    Only lowerings that form exactly the products of the canonical convolution are chosen (NaN
    and infinity in
    ``b`` reach exactly the outputs that read them): ``subpixel*`` only where
    :func:`subpixel_is_exact`.

    1. Groups with at most 4 input channels each (depthwise: 1, any channel multiplier):
       ``elementwise``, with or without a stride (XLA CPU's grouped convolutions are a slow
       path: 40x for a stride-1 depthwise 3x3); so do ungrouped plans with at most 8 input
       channels and ``Ca*Cb <= 128`` (:func:`~polyconv_jax._forward.few_channels`; LeNet-5's
       first input gradient, 6->1 5x5, 3.6 ms against 0.7; 16->8 3x3 0.9 against 0.6).
       ``upsampled`` instead where :func:`upsamples`.
    2. No stride: ``direct`` (nothing to decompose; one stride-1 convolution); ``sliced``
       where :func:`~polyconv_jax._sliced.slices` (3-D: 2-D convolutions, 2.5-3.5x);
       ``grouped`` for groups up to :data:`~polyconv_jax._forward.GROUPED_MAX_GROUPS` (XLA
       CPU's grouped convolution costs about as much as the ungrouped one: 4 groups of 16
       channels 4x, 2 groups of 32 in 3-D 9x).
       Ungrouped with a narrow output side (:func:`narrow`): ``matmul_overlap_add``.
    3. Other groups: ``grouped`` (one ungrouped problem per group, each chosen by rules 4-8)
       up to :data:`~polyconv_jax._forward.GROUPED_MAX_GROUPS` groups, else
       ``phases_matmul`` (products batched over the groups).
    4. At most one tap per phase (k2 s2, k1 s2, ...): ``phases_matmul`` (each phase is one
       plain matrix product).
    5. Narrow channels (``min(Cb, Ca) <= 16``): ``subpixel_matmul`` where exact, else
       ``phases_matmul``.
    6. 2-D: ``phases``; for float16/bfloat16 ``phases_matmul`` (XLA CPU's 16-bit matrix
       products are faster than its 16-bit convolutions).
    7. 1-D: ``subpixel`` where exact (k16 s8), else ``phases``.
    8. 3-D: ``phases_folded`` (2-D convolutions; XLA CPU's small-window 3-D convolutions are
       slow, and ``phases_matmul``'s patches of all taps cost more than its products).
    9. 4-D and up: ``phases_matmul``.
    """
    if (few_per_group(plan, plan.b_channels)
            or few_channels(plan, plan.b_channels, ELEMENTWISE_MAX_CHANNELS)):
        return "upsampled" if upsamples(plan) else "elementwise"
    if all(s == 1 for s in plan.strides):
        if splits_by_group(plan):
            return "grouped"
        return "sliced" if _sliced.slices(plan) else "direct"
    if narrow(plan):
        return "matmul_overlap_add"
    if plan.groups > 1:
        return "grouped" if splits_by_group(plan) else "phases_matmul"
    axes = _phases(plan)
    if all(len(taps) <= 1 for p in axes for taps in p.taps):
        return "phases_matmul"
    exact = subpixel_is_exact(plan)
    if min(plan.b_channels, plan.a_channels) <= 16:
        return "subpixel_matmul" if exact else "phases_matmul"
    if plan.ndim == 2:
        return "phases_matmul" if plan.dtype in ("float16", "bfloat16") else "phases"
    if plan.ndim == 1:
        return "subpixel" if exact else "phases"
    return "phases_folded" if plan.ndim == 3 else "phases_matmul"
