"""forward lowerings (``a, W -> b``) and the default policy that picks one."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from polyconv import ConvPlan

from . import _sliced, _space_to_depth, _taps
from ._xla import _conv_general, _data_spec, _dnums, _merge, add_all, rearranged_once


def _conv(plan: ConvPlan, precision, a, w):
    """The forward convolution as one ``conv_general_dilated`` call (the plain lowering)."""
    data = _data_spec(plan)
    perm = plan.weights_perm
    # XLA's output size floor((A + pb + pe - ek)/s) + 1 is plan.b_spatial by construction
    # (also for conv_transpose_backward_data, where A carries output_padding < s).
    padding = list(zip(plan.pads_begin, plan.pads_end))
    return _conv_general(
        a, w, window_strides=plan.strides, padding=padding, rhs_dilation=plan.dilations,
        dimension_numbers=_dnums(data, perm, data), feature_group_count=plan.groups,
        precision=precision, preferred_element_type=plan.acc_dtype)


def read_pads(plan: ConvPlan) -> list[tuple[int, int]]:
    """Per spatial axis, the zeros before and after ``a`` that make it the rows the taps read,
    ``(B-1)*s + ek``: ``(pb, (B-1)*s + ek - A - pb)`` (the second negative where the last
    rows of ``a`` are read by no tap)."""
    return [(pb, (bs - 1) * s + ek - sz - pb) for sz, bs, s, ek, pb in zip(
        plan.a_spatial, plan.b_spatial, plan.strides, plan.effective_kernel, plan.pads_begin)]


def pad_large(plan: ConvPlan, a):
    """``a`` padded (or cropped) to the rows the taps read: ``(B-1)*s + ek`` per axis."""
    config = [(0, 0, 0)] * a.ndim
    for ax, pads in zip(plan.spatial_axes, read_pads(plan)):
        config[ax] = (*pads, 0)
    return lax.pad(a, jnp.zeros((), a.dtype), config)


def tap_window(plan: ConvPlan, x, tap, axes=None):
    """The rows of padded ``x`` (:func:`pad_large`) that tap ``tap`` reads for every output
    row: start ``k*d``, stride ``s``, ``B`` rows, on ``axes`` (default: the spatial axes)."""
    start, limit, strides = [0] * x.ndim, list(x.shape), [1] * x.ndim
    for ax, t, d, s, bs in zip(axes or plan.spatial_axes, tap, plan.dilations, plan.strides,
                               plan.b_spatial):
        start[ax], limit[ax], strides[ax] = t * d, t * d + (bs - 1) * s + 1, s
    return lax.slice(x, start, limit, strides)


def reads_past_end(plan: ConvPlan) -> bool:
    """Whether the last window of some tap reaches past the end of ``a`` (into ``pads_end``
    on some axis): ``(B-1)*s + ek - pb > A``."""
    return any(after > 0 for _, after in read_pads(plan))


def windows(plan: ConvPlan, a) -> Callable[[tuple[int, ...]], Any]:
    """``tap -> `` the rows of ``a`` that tap reads for every output row, zeros where they
    fall in the padding: :func:`tap_window` of :func:`pad_large`'s copy of ``a``.

    Where no tap reads past the end of ``a`` (:func:`reads_past_end`; padding at the start
    only, or none), each window is a strided slice of ``a`` itself with its leading zeros
    padded on, which XLA CPU computes inside the loop that reads it; the padded copy is a pass
    of its own over the whole tensor. MobileNetV2's strided 3x3 depthwise forward (8x112x112,
    96 channels, 2 CPUs): 2.1-2.4 ms against 5.4-6.1. Zeros padded at the end inside the loop
    ran 2-4x slower than the copy (3x3 and 7x7 kernels, strides 1 and 2), so that case keeps
    the copy. Measured on CPU only: other platforms keep the copy, and their programs stay the
    ones measured there (the platform is ``jax.default_backend()``'s when the call is traced,
    as for the lowering choice)."""
    if reads_past_end(plan) or jax.default_backend() != "cpu":
        x = pad_large(plan, a)
        return partial(tap_window, plan, x)
    return partial(_window_in_place, plan, a)


def _window_in_place(plan: ConvPlan, a, tap):
    """:func:`windows` where no tap reads past the end: a strided slice of ``a`` from the
    first output row whose read is inside ``a``, zeros padded before it."""
    start, limit, strides = [0] * a.ndim, list(a.shape), [1] * a.ndim
    low = [(0, 0, 0)] * a.ndim
    for ax, t, d, s, bs, pb in zip(plan.spatial_axes, tap, plan.dilations, plan.strides,
                                   plan.b_spatial, plan.pads_begin):
        first = max(0, -((t * d - pb) // s))     # rows before it read the padding
        if first >= bs:                          # every row reads the padding
            shape = list(a.shape)
            for ax2, bs2 in zip(plan.spatial_axes, plan.b_spatial):
                shape[ax2] = bs2
            return jnp.zeros(shape, a.dtype)
        start[ax] = first * s + t * d - pb
        limit[ax], strides[ax] = start[ax] + (bs - first - 1) * s + 1, s
        low[ax] = (first, 0, 0)
    return lax.pad(lax.slice(a, start, limit, strides), jnp.zeros((), a.dtype), low)


def group_channels(plan: ConvPlan, x, i: int, per_group: int, repeat: int):
    """Channel ``i`` of every group of ``x`` (groups of ``per_group`` channels), each repeated
    ``repeat`` times in place: the operand of one elementwise term, with as many channels as
    its result. (A strided slice, not a split into ``(G, per_group)`` axes: such a split
    leaves a unit minor axis for channels-last data, and XLA CPU's fused loop then runs
    unvectorized, 3x slower.)"""
    c = plan.channel_axis
    if per_group > 1:
        x = lax.slice_in_dim(x, i, x.shape[c], per_group, axis=c)
    return jnp.repeat(x, repeat, axis=c) if repeat > 1 else x


def channel_vector(plan: ConvPlan, v):
    """A vector over channels shaped to broadcast along the data's channel axis."""
    return v if plan.channels_last else v.reshape((-1,) + (1,) * plan.ndim)


def taps_first(plan: ConvPlan, w, per_b_channel: bool = False):
    """The weights in the accumulation dtype as ``[K.., Ca/G, Cb]`` (one tap's weights for
    one ``a`` channel of each group, a run over ``Cb``: what forward's terms multiply), or
    with ``per_b_channel`` as ``[K.., Cb/G, Ca]`` (one ``b`` channel of each group, a run
    over ``Ca``: backward_data's). Either way the run one elementwise term reads is
    contiguous and :func:`rearranged_once`, which keeps the term's fused loop vectorized."""
    k = tuple(range(2, plan.ndim + 2))
    g = plan.groups

    def rearrange(v):
        v = v.transpose(plan.weights_perm)                              # [Cb, Ca/G, K..]
        if not per_b_channel:
            return v.transpose((*k, 1, 0))
        v = v.reshape((g, plan.b_channels // g, *v.shape[1:]))         # [G, Cb/G, Ca/G, K..]
        v = v.transpose((*(a + 1 for a in k), 1, 0, 2))                # [K.., Cb/G, G, Ca/G]
        return v.reshape((*plan.kernel, plan.b_channels // g, plan.a_channels))

    return rearranged_once(w, rearrange).astype(plan.acc_dtype)


def sum_by_first_tap(terms):
    """The sum of ``(tap, term)`` pairs, each run of equal first tap index summed first (a
    kernel row at a time: fewer rounding steps in long sums, and faster fused loops)."""
    return add_all(add_all(term for _, term in run)
                   for _, run in itertools.groupby(terms, key=lambda pair: pair[0][0]))


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


def splits_by_regions(plan: ConvPlan) -> bool:
    """Whether the elementwise lowerings compute ``plan`` by regions of output rows
    (:func:`by_regions`) where a padded copy would be read: channels-last data, stride 1,
    on CPU (the measurements of :func:`forward_elementwise`)."""
    return (plan.channels_last and set(plan.strides) == {1}
            and jax.default_backend() == "cpu")


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


def patches(plan: ConvPlan, a):
    """The windows of every tap stacked along channels (im2col): ``[N, B.., T*Ca]`` in tap-major
    order for channels-last data, ``[N, T*Ca, B..]`` for channels-first (no transpose of the
    data either way)."""
    window_of = windows(plan, a)
    taps = [window_of(tap) for tap in itertools.product(*(range(k) for k in plan.kernel))]
    c = plan.channel_axis
    stacked = jnp.stack(taps, axis=c)                 # [.., T, Ca, ..]
    return stacked.reshape((*stacked.shape[:c], len(taps) * plan.a_channels,
                            *stacked.shape[c + 2:]))


def patches_fit(plan: ConvPlan) -> bool:
    """Whether the im2col lowerings apply: ungrouped, and patches at most
    :data:`PATCHES_MAX_GROWTH` times the larger data tensor."""
    rows = plan.batch * math.prod(plan.b_spatial)
    size = rows * math.prod(plan.kernel) * plan.a_channels
    largest = max(plan.batch * math.prod(plan.a_spatial) * plan.a_channels,
                  rows * plan.b_channels)
    return plan.groups == 1 and size <= PATCHES_MAX_GROWTH * largest


def patches_abort_xla_gpu(plan: ConvPlan) -> bool:
    """Whether XLA GPU (jaxlib 0.11.2) may abort the process compiling an im2col lowering:
    with a one-tap kernel and a stride, the patches are one strided slice, which XLA fuses
    into its Triton matrix product, and its tiling pass fails a check
    (``triton_tiling_propagation.cc``: "src_fragment_it != src_fragments_order.end()"; seen
    on 3 of 10 such plans of the test grid, with padding). Such plans never get the im2col
    lowerings on GPU, not even when forced."""
    return math.prod(plan.kernel) == 1 and any(s > 1 for s in plan.strides)


def weights_matrix(plan: ConvPlan, w):
    """The weights as ``[T*Ca, Cb]`` (tap-major rows, as :func:`patches` orders them)."""
    wc = jnp.transpose(w, plan.weights_perm)           # [Cb, Ca, K..]
    wc = jnp.transpose(wc, (*range(2, plan.ndim + 2), 1, 0))
    return wc.reshape((-1, plan.b_channels))


def _forward_patches(plan: ConvPlan, precision, a, w):
    """Gather, then multiply (im2col): every tap's window stacked along channels, one matrix
    product with ``[T*Ca, Cb]``. Cheap when ``T*Ca`` is small (few input channels) or the
    windows do not overlap (kernel = stride: the patches are ``a`` itself, rearranged)."""
    p, wm = patches(plan, a), weights_matrix(plan, w)
    if plan.channels_last:      # [N, B.., T*Ca] @ [T*Ca, Cb]
        return lax.dot_general(p, wm, (((p.ndim - 1,), (0,)), ((), ())), precision=precision,
                               preferred_element_type=plan.acc_dtype)
    # [Cb, T*Ca] @ [N, T*Ca, B..] -> [Cb, N, B..]: the spatial axes stay minor, and moving
    # the batch axis back in front is free for a batch of one. XLA CPU's dot of this form
    # has no 16-bit operands with a float32 result (DotThunk): such operands are widened
    # first, which changes nothing (their products are exact in float32).
    if wm.dtype != plan.acc_dtype:
        wm, p = wm.astype(plan.acc_dtype), p.astype(plan.acc_dtype)
    if plan.batch > 1 and jax.default_backend() == "cpu":
        # one product per image, the weights broadcast along the batch: [N, Cb, B..] as it
        # is laid out, where moving the batch axis is a copy of the output. wav2vec 2.0's
        # 1->512 k10 s5 feature encoder on 2 x 16000 samples, 2 CPUs: 4.0 ms -> 1.5.
        wb = jnp.broadcast_to(wm.T, (plan.batch, *wm.T.shape))       # [N, Cb, T*Ca]
        return lax.dot_general(wb, p, (((2,), (1,)), ((0,), (0,))), precision=precision,
                               preferred_element_type=plan.acc_dtype)
    y = lax.dot_general(wm, p, (((0,), (1,)), ((), ())), precision=precision,
                        preferred_element_type=plan.acc_dtype)
    return jnp.moveaxis(y, 0, 1)


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


#: the im2col lowerings apply while their patches are at most this many times the larger
#: data tensor
PATCHES_MAX_GROWTH = 32

#: the per-group lowerings (``grouped``: one ungrouped problem per group) apply up to this many
#: groups. Their programs hold a problem per group, and XLA compiles them in time that grows
#: with the count: a depthwise weight gradient of 144 groups took 145 s to compile (and ran
#: 12x slower than ``depthwise``), so beyond this they are neither chosen nor measured (the
#: weight gradient takes groups in blocks there: ``_backward_weights.group_block``).
GROUPED_MAX_GROUPS = 32


def splits_by_group(plan: ConvPlan) -> bool:
    """Whether the per-group lowerings (``grouped``) apply: 2 to :data:`GROUPED_MAX_GROUPS`
    groups."""
    return 1 < plan.groups <= GROUPED_MAX_GROUPS


#: the elementwise lowerings handle at most this many channels per group on their
#: contracted side (their cost grows with it; a matrix product's does not)
ELEMENTWISE_MAX_CHANNELS = 8

#: the default policies take ``elementwise`` up to this many channels per group on the
#: contracted side (between this and ``ELEMENTWISE_MAX_CHANNELS`` a matrix product was faster)
ELEMENTWISE_POLICY_CHANNELS = 4


def few_per_group(plan: ConvPlan, channels: int) -> bool:
    """Whether ``plan`` is grouped with at most :data:`ELEMENTWISE_POLICY_CHANNELS` of
    ``channels`` (the contracted side's count) per group: where the default policies leave
    XLA CPU's grouped convolution for the elementwise lowerings."""
    return plan.groups > 1 and channels // plan.groups <= ELEMENTWISE_POLICY_CHANNELS


#: ungrouped plans with few contracted channels take the elementwise lowerings by policy
#: while ``Ca*Cb`` is at most this (XLA CPU's convolution of 1-4 input channels is a slow
#: path: LeNet-5's 1->6 5x5 forward 3.4-4.1 ms against 0.5-0.8, a 3->32 3x3 5.4 against
#: 0.7, a 3->8 3x3x3 37 against 2.2; from 192, ResNet-50's 3->64 stem and DCGAN's 3->64
#: discriminator input, its loops lost 1.3-2.2x)
ELEMENTWISE_POLICY_PRODUCT = 128


def few_channels(plan: ConvPlan, contracted: int, most: int) -> bool:
    """Whether ``plan`` is ungrouped with at most ``most`` ``contracted`` channels and at most
    :data:`ELEMENTWISE_POLICY_PRODUCT` as ``Ca*Cb``: where the default policies take the
    elementwise lowerings over XLA CPU's convolution."""
    return (plan.groups == 1 and contracted <= most
            and plan.a_channels * plan.b_channels <= ELEMENTWISE_POLICY_PRODUCT)


def _forward_grouped(plan: ConvPlan, precision, a, w):
    """One ungrouped forward convolution per group (:func:`polyconv_jax._choice.by_group`):
    XLA CPU's grouped convolution costs about as much as the ungrouped one (StyleGAN2's
    modulated 3x3, 4 groups of 512: 254 ms against 33-48)."""
    from ._choice import by_group  # (that module imports this one)

    return by_group("forward", plan, precision, a, w)


#: the forward lowerings, by name; the first is the plain one
FORWARD = {"direct": _conv, "elementwise": forward_elementwise,
           "patches_matmul": _forward_patches, "folded": _forward_folded,
           "sliced": _sliced.forward, "taps": _taps.forward, "grouped": _forward_grouped,
           "matmul_overlap_add": _taps.forward_overlap_add, "subpixel": _space_to_depth.forward}


def forward_applicable(plan: ConvPlan, lowering: str) -> bool:
    """Whether ``lowering`` can compute ``plan``'s forward convolution."""
    if lowering == "elementwise":
        return plan.a_channels // plan.groups <= ELEMENTWISE_MAX_CHANNELS
    if lowering == "patches_matmul":
        return patches_fit(plan)
    if lowering == "taps":
        return plan.groups == 1
    if lowering == "matmul_overlap_add":    # several taps, a product no wider than ``a``
        taps = math.prod(plan.kernel)
        return plan.groups == 1 and taps > 1 and taps * plan.b_channels <= plan.a_channels
    if lowering == "subpixel":
        return _space_to_depth.applies(plan)
    if lowering == "grouped":
        return splits_by_group(plan)
    return lowering in FORWARD


def choose_forward(plan: ConvPlan) -> str:
    """The default forward lowering on CPU: ``elementwise`` for groups with at most
    :data:`ELEMENTWISE_POLICY_CHANNELS` input channels each (XLA CPU's grouped convolution
    is a slow path: 40x for a depthwise 3x3, 6x more with a stride) and for ungrouped plans
    of as few input channels and few output ones (:func:`few_channels`), ``grouped`` for other
    groups up to :data:`GROUPED_MAX_GROUPS` (that path costs about as much as the ungrouped
    convolution: 4 groups of 16 channels 3.5-4x, of 512 5-8x), ``patches_matmul`` for
    other ungrouped plans with few input columns (``Ca*prod(K) <= 64`` and 10^7 multiply-adds
    or more: 3-D 2->128 k3 s2; 3-D 1->64 k3 s2 3.3 ms against 22, ``elementwise`` 2.0),
    ``sliced`` where :func:`~polyconv_jax._sliced.slices`
    (3-4x), else ``direct``."""
    if (few_per_group(plan, plan.a_channels)
            or few_channels(plan, plan.a_channels, ELEMENTWISE_POLICY_CHANNELS)):
        return "elementwise"
    if plan.groups > 1:
        return "grouped" if splits_by_group(plan) else "direct"
    from ._backward_data import narrow  # (that module imports this one)

    if narrow(plan) and patches_fit(plan):
        return "patches_matmul"
    return "sliced" if _sliced.slices(plan) else "direct"
