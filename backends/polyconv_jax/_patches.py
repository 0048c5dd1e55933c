"""Gather, then multiply (``im2col``): the windows of every tap stacked along
channels and one matrix product, for the forward and the weight gradient."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
from jax import lax

from polyconv import ConvPlan
from polyconv._choice import Implementation

from ._common import windows
from ._xla import platform

#: the im2col lowerings apply while their patches are at most this many times the larger
#: data tensor
PATCHES_MAX_GROWTH = 32


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
    :func:`patches`) contracted with ``b`` over batch and rows,
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


def applies(plan: ConvPlan) -> bool:
    """Ungrouped, patches that fit (:func:`patches_fit`), and never where XLA GPU may abort the
    process compiling them (:func:`patches_abort_xla_gpu`)."""
    return patches_fit(plan) and not (
        patches_abort_xla_gpu(plan) and platform() == "gpu")


FORWARD = Implementation("im2col", "forward", _forward_patches, applies=applies)
BACKWARD_WEIGHTS = Implementation("im2col", "backward_weights", _weights_patches,
                                  applies=applies)
