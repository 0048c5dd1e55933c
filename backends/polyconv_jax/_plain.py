"""The plain lowerings (``direct``): each primitive as one ``conv_general_dilated`` call, what a
hand-written ``lax`` call would be; and ``bands``, the weight gradient's call one image and one
run of output rows at a time."""

from __future__ import annotations

import itertools
import math

import jax.numpy as jnp
from jax import lax

from polyconv import ConvPlan
from polyconv._choice import Implementation

from ._common import read_pads
from ._xla import _conv_general, _data_spec, _dnums, _regroup, platform


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
        precision=precision, preferred_element_type=plan.acc_dtype, weights=True)


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
        preferred_element_type=plan.acc_dtype, weights=True)


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


def direct_applies(plan: ConvPlan) -> bool:
    """backward_data's ``direct``: everywhere but where XLA CPU may abort the process compiling
    it (:func:`direct_aborts_xla_cpu`), not even when forced."""
    return not (direct_aborts_xla_cpu(plan) and platform() == "cpu")


def bands_apply(plan: ConvPlan) -> bool:
    """Whether ``bands`` computes ``plan``: more than one piece, at most :data:`BAND_PIECES`."""
    return 1 < plan.batch * len(band_edges(plan)) <= BAND_PIECES


FORWARD = Implementation("direct", "forward", _conv)
BACKWARD_DATA = Implementation("direct", "backward_data", _direct, applies=direct_applies)
BACKWARD_WEIGHTS = Implementation("direct", "backward_weights", _weights_direct)
BANDS = Implementation("bands", "backward_weights", _weights_bands, applies=bands_apply)
