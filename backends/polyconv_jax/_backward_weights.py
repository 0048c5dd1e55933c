"""backward_weights lowerings (``a, b -> W``) and the default policy that picks one."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
from jax import lax

from polyconv import ConvPlan

from . import _forward, _sliced, _taps
from ._backward_data import narrow
from ._forward import (
    ELEMENTWISE_MAX_CHANNELS,
    ELEMENTWISE_POLICY_CHANNELS,
    folded_operand,
    folded_spec,
    group_channels,
    pad_large,
    patches,
    patches_fit,
    read_pads,
    splits_by_group,
    windows,
)
from ._subpixel import _phases
from ._xla import _conv_general, _data_spec, _dnums, _merge


def _weights_direct(plan: ConvPlan, precision, a, b):
    data = _data_spec(plan)
    perm = plan.weights_perm
    swapped = (data[1], data[0], *data[2:])  # batch <-> feature: N is contracted
    w = _conv_general(
        a, b, window_strides=plan.dilations, padding=read_pads(plan), rhs_dilation=plan.strides,
        # output "batch" = Ca/G (the weights' in axis), "feature" = Cb: the user's layout
        dimension_numbers=_dnums(swapped, swapped, (perm[1], perm[0], *perm[2:])),
        batch_group_count=plan.groups, precision=precision,
        preferred_element_type=plan.acc_dtype)
    return w


#: output positions per piece of ``bands``: one image's rows are cut into runs of about this
#: many (a whole image when smaller)
BAND_POSITIONS = 2048
#: ``bands`` applies up to this many pieces (each is one more convolution to compile)
BAND_PIECES = 64
#: the default policy takes ``bands`` from this many channels on both sides: there XLA CPU's
#: weight-gradient convolution slows down 3-10x (2 CPUs, 4x56x56, 3x3: 32->32 ``direct``
#: 2.5 ms, ``bands`` 3.2; 64->64 25 and 8.5), while with fewer channels ``bands``'s many
#: small convolutions cost 1.3-5x ``direct``'s one (4->4, ResNeXt-50's groups: 1.4 ms
#: against 0.47)
BANDS_MIN_CHANNELS = 64


def band_edges(plan: ConvPlan) -> list[tuple[int, int]]:
    """The runs of ``b``'s first spatial axis that ``bands`` makes, as ``(start, stop)``."""
    rows = plan.b_spatial[0]
    per_row = math.prod(plan.b_spatial[1:])
    count = max(1, min(rows, round(rows * per_row / BAND_POSITIONS)))
    edges = [round(i * rows / count) for i in range(count + 1)]
    return list(itertools.pairwise(edges))


def _weights_bands(plan: ConvPlan, precision, a, b):
    """``direct`` one image and one run of output rows at a time, summed.

    XLA CPU (jaxlib 0.10.2) computes a weight gradient's convolution on one thread, and
    contracting over a batch, or over a large image, runs well below its speed for one
    image's rows: ResNet-50's 64->64 3x3 at batch 4 takes 6.4 ms whole and 3.9 ms as 32
    pieces; U-Net's 128x128 64->64 9.4 ms whole, 5.3 ms in 8 runs of rows. Each piece is the
    rows of ``a`` its outputs read, with the pads that fall inside it: exactly the products
    of the whole, summed in float32 (:ref:`accumulation`)."""
    sp = plan.spatial_axes[0]
    s, pb, ek = plan.strides[0], plan.pads_begin[0], plan.effective_kernel[0]
    size = plan.a_spatial[0]
    runs = band_edges(plan)
    total = None
    for n in range(plan.batch):
        an, bn = lax.slice_in_dim(a, n, n + 1), lax.slice_in_dim(b, n, n + 1)
        for y0, y1 in runs:
            lo, hi = y0 * s - pb, (y1 - 1) * s - pb + ek       # the rows of a read, unpadded
            if min(hi, size) <= max(lo, 0):
                continue                                    # only padding: no products
            sub = plan.with_(
                batch=1, a_spatial=(min(hi, size) - max(lo, 0), *plan.a_spatial[1:]),
                b_spatial=(y1 - y0, *plan.b_spatial[1:]),
                pads_begin=(max(-lo, 0), *plan.pads_begin[1:]),
                pads_end=(max(hi - size, 0), *plan.pads_end[1:]),
                output_padding=(0, *plan.output_padding[1:]))
            part = _weights_direct(sub, precision,
                                   lax.slice_in_dim(an, max(lo, 0), min(hi, size), axis=sp),
                                   lax.slice_in_dim(bn, y0, y1, axis=sp))
            total = part if total is None else total + part
    return jnp.zeros(plan.weights_shape, plan.acc_dtype) if total is None else total


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


def _weights_grouped(plan: ConvPlan, precision, a, b):
    """One ungrouped backward_weights per group (:func:`polyconv_jax._choice.by_group`;
    XLA's ``batch_group_count`` is slow on CPU), or per block of groups past
    :data:`~polyconv_jax._forward.GROUPED_MAX_GROUPS` (:func:`group_block`)."""
    from ._choice import by_group  # (that module imports this one)

    return by_group("backward_weights", plan, precision, a, b)


def group_block(plan: ConvPlan) -> int:
    """Groups per problem of the ``grouped`` weight gradient: 1 up to
    :data:`~polyconv_jax._forward.GROUPED_MAX_GROUPS` groups, else the fewest that divide
    the groups into at most that many blocks. Past that bound a program of one problem per
    group compiles too slowly (a depthwise weight gradient of 144 groups: 145 s), while a
    block's products across its groups cost little where each group has few channels, and
    it applies only where they have at least 2 on both sides (ResNeXt-101 64x4d's 64 groups
    of 4, in blocks of 2: 2 CPUs, 58 ms against 151 for ``depthwise``, side by side in one
    busy process; depthwise layers have ``depthwise``)."""
    bound = _forward.GROUPED_MAX_GROUPS
    return next(k for k in range(1, plan.groups + 1)
                if plan.groups % k == 0 and plan.groups // k <= bound)


#: channels of ``a`` up to which :func:`_weights_patches` gathers channels-first patches from
#: channels-last data: XLA CPU copies channel-minor windows of a few values at a time slowly,
#: whole rows fast (2 CPUs: ResNet-50's 7x7 stem, 3->64 on 4x224x224, 23 ms against 38;
#: DCGAN's 64->3 layer, whose weight gradient gathers the 16x64x64x3 output gradient, 4.4
#: against 5.9). The forward's patches gained nothing from it (20.9 ms against 19.9 on the
#: stem, whose ``folded`` lowering takes 12.4).
PATCHES_CHANNELS_FIRST_MAX = 8


#: :func:`_weights_patches` multiplies channels-last patches as ``b``'s transpose times the
#: patches when their rows are at least this many times their columns (``T*Ca``)
PATCHES_TRANSPOSED_MIN_RATIO = 1.0

#: ... and channels-first ``b`` on the left of the product where ``Cb`` is more than this many
#: times the patches' columns (``T*Ca``)
PATCHES_LEFT_MIN_RATIO = 1.0

#: ... and channels-first operands of several images contracted one image at a time, then
#: summed, where an image has at least this many output positions (``prod(B)``)
PATCHES_PER_IMAGE_MIN_ROWS = 8192


def _weights_patches(plan: ConvPlan, precision, a, b):
    """Gather, then multiply (im2col): the patches of ``a`` (see
    :func:`polyconv_jax._forward.patches`) contracted with ``b`` over batch and rows,
    ``[T*Ca, Cb]``, then put in the user's weights layout.

    On CPU (other platforms keep the programs measured there), channels-last ``a`` with few
    channels is gathered channels-first (:data:`PATCHES_CHANNELS_FIRST_MAX`), and
    channels-last patches with more rows than columns (:data:`PATCHES_TRANSPOSED_MIN_RATIO`)
    are multiplied as ``b``'s transpose ``[Cb, rows]`` times ``[rows, T*Ca]``: XLA CPU runs a
    matrix product whose left operand is contracted over its leading axis (the rows, for
    both channels-last operands) at about half the rate of one contracted over its trailing
    axis (12544 rows into ``[576, 64]``: 10.4 ms against 5.1 on a 2-CPU AVX-512 host), and
    transposing ``b`` costs one pass over it. With more columns than rows the result
    outweighs ``b``, and the transpose lost (DCGAN's 512->256 layer). Measured there, the
    weight gradient alone: ResNet-50's 3x3 64->64 19.8 ms -> 11.1, nnU-Net's ConvT3d
    128->64 18.9 -> 8.9, DCGAN's 128->64 11.1 -> 9.5.

    Channels-first operands are both contracted over their trailing axes (the rows); there
    XLA CPU's product runs at the rate of its right operand's repacking, so the wider one,
    ``b`` where ``Cb > T*Ca`` (:data:`PATCHES_LEFT_MIN_RATIO`), goes on the left (2-CPU
    AVX2 host, forced, alternated: the 3-D decoder's ConvT3d 64->1 weight gradient 76 -> 28
    ms, pix2pix's 128->3 8.9 -> 4.0, MNIST's first layer at batch 64 4.1 -> 3.6). With
    several images, each of :data:`PATCHES_PER_IMAGE_MIN_ROWS` positions or more, a product
    contracting the batch too needs both operands transposed; one product per image (a
    batched product), summed, needs none: WaveNet's 1-D 64->128 k2 d8 on 4 x 16008 samples
    40 -> 28 ms, the 3-D decoder at batch 2 15 -> 12. Smaller images lost (Mask R-CNN's 32
    RoIs of 14x14, 52 -> 146 ms; ResNet-50's 3x3 at 4x56x56, 21 -> 24)."""
    rows_b = (0, *plan.spatial_axes)                 # batch and rows, contracted
    cpu = jax.default_backend() == "cpu"
    # both operands channels-first with several large images: one product per image, summed
    per_image = (cpu and not plan.channels_last and plan.batch > 1
                 and math.prod(plan.b_spatial) >= PATCHES_PER_IMAGE_MIN_ROWS)

    def contract(x, y, x_rows, y_rows):
        if per_image:
            return lax.dot_general(x, y, ((x_rows[1:], y_rows[1:]), ((0,), (0,))),
                                   precision=precision,
                                   preferred_element_type=plan.acc_dtype).sum(axis=0)
        return lax.dot_general(x, y, ((x_rows, y_rows), ((), ())), precision=precision,
                               preferred_element_type=plan.acc_dtype)

    if plan.channels_last and plan.a_channels <= PATCHES_CHANNELS_FIRST_MAX and cpu:
        plan, a = plan.with_(channels_last=False), jnp.moveaxis(a, -1, 1)
    rows_a = (0, *plan.spatial_axes)
    p = patches(plan, a)
    nd, ca, cb = plan.ndim, plan.a_channels, plan.b_channels
    rows = plan.batch * math.prod(plan.b_spatial)
    if (cpu and plan.channels_last
            and rows >= PATCHES_TRANSPOSED_MIN_RATIO * math.prod(plan.kernel) * ca):
        bt = jnp.moveaxis(b, -1, 0)                                      # [Cb, N, B..]
        y = lax.dot_general(bt, p, ((tuple(range(1, nd + 2)), rows_a), ((), ())),
                            precision=precision, preferred_element_type=plan.acc_dtype)
        y = y.reshape((cb, *plan.kernel, ca))                           # [Cb, K.., Ca]
        to_canonical = (0, nd + 1, *range(1, nd + 1))
    elif (cpu and not plan.channels_last
          and cb > PATCHES_LEFT_MIN_RATIO * math.prod(plan.kernel) * ca):
        y = contract(b, p, rows_b, rows_a).reshape((cb, *plan.kernel, ca))   # [Cb, K.., Ca]
        to_canonical = (0, nd + 1, *range(1, nd + 1))
    else:
        y = contract(p, b, rows_a, rows_b).reshape((*plan.kernel, ca, cb))   # [K.., Ca, Cb]
        to_canonical = (nd + 1, nd, *range(nd))
    y = jnp.transpose(y, to_canonical)                                  # [Cb, Ca, K..]
    return jnp.transpose(y, plan.weights_inverse_perm)


def _weights_folded(plan: ConvPlan, precision, a, b):
    """The weight gradient of the folded forward (:func:`~polyconv_jax._forward.
    folded_operand`: the first axis's taps stacked along channels, the first two axes
    merged): ``b`` laid on the merged outputs, each row's ``A1'/s1 - B1`` extra outputs zero
    (so the windows that straddle two rows add nothing), and XLA's weight gradient of the
    merged convolution of rank ``nd - 1``, ``[K0*Ca/G, Cb, K_rest..]``, rearranged into the
    user's layout.

    XLA CPU (jaxlib 0.10.2) runs the 1-D weight gradient of a 2-D problem well: on 2 CPUs
    ResNet-50's 3x3 64->64 (4x56x56) 14.5 ms against 20.6 for ``patches_matmul`` and 28 for
    ``bands``, U-Net's 3x3 64->64 at 128x128 17.1 ms against 41.6 for ``direct``; a 3-D
    layer's 2-D one ran slower (786 ms against 409 for ``bands`` on 3x3x3 32->32 at
    32x64x64), and so did the k2 s2 up-convolutions (``patches_matmul`` 1.4-3.4x faster), so
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


BACKWARD_WEIGHTS = {"direct": _weights_direct, "bands": _weights_bands, "phases": _weights_phases,
                    "depthwise": _weights_depthwise, "grouped": _weights_grouped,
                    "patches_matmul": _weights_patches, "folded": _weights_folded,
                    "sliced": _sliced.backward_weights, "taps": _taps.backward_weights}


def weights_applicable(plan: ConvPlan, lowering: str) -> bool:
    """Whether ``lowering`` can compute ``plan``'s backward_weights."""
    if lowering == "depthwise":
        return all(c // plan.groups <= ELEMENTWISE_MAX_CHANNELS
                   for c in (plan.a_channels, plan.b_channels))
    if lowering == "grouped":
        return splits_by_group(plan) or (
            plan.groups > 1 and min(plan.a_channels, plan.b_channels) // plan.groups >= 2)
    if lowering == "bands":
        return 1 < plan.batch * len(band_edges(plan)) <= BAND_PIECES
    if lowering == "patches_matmul":
        return patches_fit(plan)
    if lowering == "taps":
        return plan.groups == 1
    return lowering in BACKWARD_WEIGHTS


def choose_backward_weights(plan: ConvPlan) -> str:
    """The backward_weights lowering for a plan (measured on XLA CPU: module docstring).

    XLA CPU's ``batch_group_count`` convolution is a slow path (100x torch for 8 groups), so
    grouped plans are split per group (``grouped``), depthwise ones go elementwise
    (``depthwise``: one channel per group on one side and at most
    :data:`~polyconv_jax._forward.ELEMENTWISE_POLICY_CHANNELS` on the other, a channel
    multiplier included, or up to :data:`~polyconv_jax._forward.ELEMENTWISE_MAX_CHANNELS` on
    both sides where ``grouped`` does not apply: a 3x3 32->64 layer in 32 groups at 8x56x56
    took 3.4 ms against 10 per group and 3.5 s for ``direct``; ResNeXt-50's 32 groups of 4
    ran as fast per group); strided 3-D plans use ``phases`` (XLA's 3-D weight gradient with a
    dilated kernel is 3x slower); ungrouped plans with few input columns
    (:func:`~polyconv_jax._backward_data.narrow`) gather patches and multiply once
    (``patches_matmul``: 2.5x faster for a 3-D 1->64 k3 s2 gradient); ungrouped 3-D plans
    without a stride take ``sliced`` (3-4x faster than ``direct``); 2-D plans without a
    stride whose images have :data:`BAND_POSITIONS` output positions or more and
    :data:`BANDS_MIN_CHANNELS` channels on both sides take ``bands``
    (ResNet-50's 3x3 64->64 at 56x56 1.6x, U-Net's at 128x128 1.4x); everything else stays
    ``direct``.
    """
    if narrow(plan) and patches_fit(plan):
        return "patches_matmul"
    if plan.groups > 1:
        fewer, more = sorted(c // plan.groups for c in (plan.a_channels, plan.b_channels))
        if weights_applicable(plan, "depthwise") and (
                (fewer == 1 and more <= ELEMENTWISE_POLICY_CHANNELS)
                or not splits_by_group(plan)):
            return "depthwise"
        return "grouped" if splits_by_group(plan) else "direct"
    if plan.ndim >= 3 and any(s > 1 for s in plan.strides):
        return "phases"
    if _sliced.slices(plan):
        return "sliced"
    if (plan.ndim == 2 and all(s == 1 for s in plan.strides)
            and math.prod(plan.b_spatial) >= BAND_POSITIONS
            and min(plan.a_channels, plan.b_channels) >= BANDS_MIN_CHANNELS
            and weights_applicable(plan, "bands")):
        return "bands"
    return "direct"
