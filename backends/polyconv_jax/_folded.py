"""The folded lowerings: the first spatial axis's taps stacked along channels and the first
two spatial axes merged, so that a problem of rank ``nd`` is convolutions of rank ``nd - 1``
(XLA CPU runs 2-D convolutions far better than 3-D ones). ``folded`` (forward and weight
gradient) and ``phases_folded`` (backward_data, per phase of the other axes)."""

from __future__ import annotations

import itertools
import math

import jax.numpy as jnp
from jax import lax

from polyconv import ConvPlan
from polyconv._choice import Implementation

from ._common import _interleave, _phase_shape, _phases, read_pads
from ._xla import _conv_general, _dnums, _merge


def fold_first_axis(plan: ConvPlan, x, starts, rows: int, step: int):
    """The operand of a folded convolution: windows of ``x`` (padded, in the user's layout)
    along the first spatial axis, ``rows`` rows ``step`` apart from each of ``starts``,
    stacked along channels in ``[G, T0, C/G]`` order; with two or more spatial axes, that
    axis merged with the next (``rows * x``'s second-axis size rows)."""
    g, c, ax = plan.groups, plan.channel_axis, plan.spatial_axes[0]
    x = x.reshape((*x.shape[:c], g, x.shape[c] // g, *x.shape[c + 1:]))   # (G, C/G)
    ax0 = ax + (c < ax)
    xd = jnp.stack([lax.slice_in_dim(x, s, s + (rows - 1) * step + 1, step, axis=ax0)
                    for s in starts], axis=c + 1)                       # [G, T0, C/G]
    xd = _merge(xd, (*xd.shape[:c], math.prod(xd.shape[c:c + 3]), *xd.shape[c + 3:]))
    if plan.ndim > 1:
        xd = xd.reshape((*xd.shape[:ax], rows * xd.shape[ax + 1], *xd.shape[ax + 2:]))
    return xd


def folded_spec(plan: ConvPlan) -> tuple[int, ...]:
    """(batch, feature, spatial..) axes of a folded operand: rank ``nd + 1`` (``nd - 1``
    spatial axes; one, of window one, for a single spatial axis), in the user's layout."""
    cn = max(plan.ndim - 1, 1)
    return (0, cn + 1, *range(1, cn + 1)) if plan.channels_last else (0, 1, *range(2, cn + 2))


def folded_conv(plan: ConvPlan, precision, xd, kernel, padding, strides, dilations):
    """The convolution of a folded operand (:func:`fold_first_axis`) with ``kernel``
    ``[in, out, window..]`` (in-features ``T0*C/G`` per group): of rank ``nd - 1`` over the
    merged axis and the rest; for one spatial axis, a window of one (a matrix product)."""
    cn = max(plan.ndim - 1, 1)
    if plan.ndim == 1:
        kernel, padding, strides, dilations = kernel[..., None], [(0, 0)], (1,), (1,)
    data = folded_spec(plan)
    return _conv_general(
        xd, kernel, window_strides=strides, padding=padding, rhs_dilation=dilations,
        dimension_numbers=_dnums(data, (1, 0, *range(2, cn + 2)), data),
        feature_group_count=plan.groups, precision=precision,
        preferred_element_type=plan.acc_dtype)


def unfold(plan: ConvPlan, z, rows: int, keep: int):
    """A folded convolution's result with its merged axis split back into ``rows`` rows, the
    first ``keep`` outputs of each kept (the others' windows ran into the next row)."""
    if plan.ndim == 1:
        return z
    ax = plan.spatial_axes[0]
    z = z.reshape((*z.shape[:ax], rows, z.shape[ax] // rows, *z.shape[ax + 1:]))
    return lax.slice_in_dim(z, 0, keep, axis=ax + 1)


def folded_operand(plan: ConvPlan, a):
    """``a`` folded for the forward direction (:func:`fold_first_axis`): the first axis's
    taps' windows (``B0`` rows, stride ``s0``) stacked along channels, the second axis
    padded to ``A1'`` columns, a multiple of its stride, and merged with the first. Returns
    the operand and ``A1'`` (1 for one spatial axis)."""
    sa, nd = plan.spatial_axes, plan.ndim
    b0, s0, d0 = plan.b_spatial[0], plan.strides[0], plan.dilations[0]
    config = [(0, 0, 0)] * a.ndim
    config[sa[0]] = (*read_pads(plan)[0], 0)
    width = 1
    if nd > 1:
        s1 = plan.strides[1]
        width = plan.a_spatial[1] + plan.pads_begin[1] + plan.pads_end[1]
        width += -width % s1                                    # A1': a multiple of s1
        config[sa[1]] = (plan.pads_begin[1], width - plan.a_spatial[1] - plan.pads_begin[1], 0)
    x = lax.pad(a, jnp.zeros((), a.dtype), config)
    return fold_first_axis(plan, x, [k * d0 for k in range(plan.kernel[0])], b0, s0), width


def _forward_folded(plan: ConvPlan, precision, a, w):
    """The first spatial axis's taps stacked along channels, the other axes' taps one
    convolution of rank ``nd - 1`` over a tensor whose first two spatial axes are merged.

    Tap ``k0`` of the first axis reads a strided window of ``a`` (``B0`` rows, stride
    ``s0``); the ``K0`` windows are stacked along channels (``K0`` times ``a``'s memory).
    The second axis is padded explicitly to ``A1'`` columns, a multiple of its stride, and
    merged with the first, so the other taps are one convolution (channels ``K0*Ca/G ->
    Cb/G`` per group, the second axis's taps running along the merged axis): row ``r``'s
    outputs are merged outputs ``r*A1'/s1 ..``, and those whose window runs into the next
    row are computed and cropped. For one spatial axis it is im2col with groups.

    XLA CPU (jaxlib 0.10.2) runs the folded convolution faster than its own on some dense
    layers and slower on others, so the measured choice decides (the policy keeps
    ``direct``). Measured on 2 CPUs: ResNet-50's 3x3 64->64 forward (4x56x56, channels last)
    10.1 ms against 14.3 for ``direct``; 3-D 3x3x3 32->32 on 32x64x64, 175 ms against 329
    (2-D convolutions against XLA's 3-D one); but a 16x28x28 128->128 forward 55 ms against
    35."""
    nd = plan.ndim
    xd, width = folded_operand(plan, a)
    wc = jnp.transpose(w, plan.weights_perm)                    # [Cb, Ca/G, K..]
    kernel = jnp.transpose(wc, (2, 1, 0, *range(3, nd + 2)))    # [K0, Ca/G, Cb, K_rest..]
    kernel = kernel.reshape((-1, plan.b_channels, *plan.kernel[1:]))
    padding = list(zip(plan.pads_begin[2:], plan.pads_end[2:]))
    b0 = plan.b_spatial[0]
    if nd > 1:      # the merged axis: outputs for every A1'/s1 columns of every row
        s1 = plan.strides[1]
        padding = [(0, max(0, plan.effective_kernel[1] - s1)), *padding]
    z = folded_conv(plan, precision, xd, kernel, padding, plan.strides[1:],
                    plan.dilations[1:])
    if nd > 1:
        z = lax.slice_in_dim(z, 0, b0 * width // s1, axis=plan.spatial_axes[0])
    return unfold(plan, z, b0, plan.b_spatial[1] if nd > 1 else 0)


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


def _weights_folded(plan: ConvPlan, precision, a, b):
    """The weight gradient of the folded forward (:func:`folded_operand`: the first axis's taps
    stacked along channels, the first two axes merged): ``b`` laid on the merged outputs, each
    row's ``A1'/s1 - B1`` extra outputs zero (so the windows that straddle two rows add
    nothing), and XLA's weight gradient of the merged convolution of rank ``nd - 1``,
    ``[K0*Ca/G, Cb, K_rest..]``, rearranged into the
    user's layout.

    XLA CPU (jaxlib 0.10.2) runs the 1-D weight gradient of a 2-D problem well: on 2 CPUs
    ResNet-50's 3x3 64->64 (4x56x56) 14.5 ms against 20.6 for ``im2col`` and 28 for
    ``bands``, U-Net's 3x3 64->64 at 128x128 17.1 ms against 41.6 for ``direct``; a 3-D
    layer's 2-D one ran slower (786 ms against 409 for ``bands`` on 3x3x3 32->32 at
    32x64x64), and so did the k2 s2 up-convolutions (``im2col`` 1.4-3.4x faster), so
    the measured choice decides."""
    nd, g, sa = plan.ndim, plan.groups, plan.spatial_axes
    xd, width = folded_operand(plan, a)
    cn = max(nd - 1, 1)
    if nd == 1:
        gm, strides, dilations, padding = b, (1,), (1,), [(0, 0)]
    else:
        s1, merged = plan.strides[1], plan.b_spatial[0] * width
        config = [(0, 0, 0)] * b.ndim
        config[sa[1]] = (0, width // s1 - plan.b_spatial[1], 0)
        gm = lax.pad(b, jnp.zeros((), b.dtype), config)
        gm = gm.reshape((*gm.shape[:sa[0]], merged // s1, *gm.shape[sa[0] + 2:]))
        strides, dilations = plan.strides[1:], plan.dilations[1:]
        padding = [(0, (merged // s1 - 1) * s1 + plan.effective_kernel[1] - merged)]
        padding += read_pads(plan)[2:]
    data = folded_spec(plan)
    swapped = (data[1], data[0], *data[2:])                 # batch <-> feature
    y = _conv_general(
        xd, gm, window_strides=dilations, padding=padding, rhs_dilation=strides,
        dimension_numbers=_dnums(swapped, swapped, range(cn + 2)), batch_group_count=g,
        precision=precision, preferred_element_type=plan.acc_dtype)
    y = y.reshape((plan.kernel[0], plan.a_channels // g, plan.b_channels, *plan.kernel[1:]))
    y = jnp.transpose(y, (2, 1, 0, *range(3, nd + 2)))      # [Cb, Ca/G, K..]
    return jnp.transpose(y, plan.weights_inverse_perm)


FORWARD = Implementation("folded", "forward", _forward_folded)
BACKWARD_DATA = Implementation("phases_folded", "backward_data", _folded)
BACKWARD_WEIGHTS = Implementation("folded", "backward_weights", _weights_folded)
