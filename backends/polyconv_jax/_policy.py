"""The default lowering of each primitive without measuring: rules set from measurements, one
set per platform (docs/jax_lowerings.md has the measurements, docs/design_notes.md how the
rules fare against the corpus records, ``polyconv bench --policy-check``). On the CPU the
rules of :func:`choose_forward`, :func:`choose_backward_data` and
:func:`choose_backward_weights` (2-core x86 hosts); on GPU :func:`gpu_policy` (an H100 and an
H200); elsewhere (TPU, not measured) the plain lowering, which is what XLA's own convolution
autotuning sees."""

from __future__ import annotations

import math
from collections.abc import Sequence

from polyconv import ConvPlan
from polyconv._phases import phases as plan_phases

from . import _sliced, _space_to_depth, _taps
from ._common import _phases
from ._elementwise import ELEMENTWISE_MAX_CHANNELS, depthwise_applies
from ._grouped import splits_by_group, weights_apply
from ._patches import patches_fit
from ._plain import bands_apply, direct_applies
from ._subpixel import subpixel_is_exact
from ._xla import platform as current_platform

#: each primitive's plain lowering (a hand-written ``lax`` call's)
PLAIN = "direct"


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


def plain_is_fast(plan: ConvPlan) -> bool:
    """A 2-D channels-last ungrouped plan of few input channels (``Ca``, at most
    :data:`ELEMENTWISE_POLICY_CHANNELS`) whose ``Ca*Cb`` passes
    :data:`ELEMENTWISE_POLICY_PRODUCT`: there XLA CPU's convolution is off its few-channel
    slow path (the 3->64 inputs above), so a strided forward gains nothing by space-to-depth
    for its compile (DCGAN's 64->3 k4 s2 ConvT: the plain call as fast or faster on both
    Xeon records, 6x less compile; YOLOv5s's 3->32 and wav2vec 2.0's 1-D 1->512 stay)."""
    return (plan.ndim == 2 and plan.channels_last and plan.groups == 1
            and plan.a_channels <= ELEMENTWISE_POLICY_CHANNELS
            and plan.a_channels * plan.b_channels > ELEMENTWISE_POLICY_PRODUCT)


def few_channels(plan: ConvPlan, contracted: int, most: int) -> bool:
    """Whether ``plan`` is ungrouped, or split per group (``grouped``), with at most ``most``
    of its ``contracted`` channels and at most :data:`ELEMENTWISE_POLICY_PRODUCT` as
    ``Ca/G * Cb/G`` per group: where the default policies take the elementwise lowerings over
    XLA CPU's convolution. For a grouped plan that is one elementwise program where
    ``grouped`` would hold one per group, each as slow to compile (a 3-D ConvTranspose of 4
    groups of 5 -> 4 channels: 34 s against 2; docs/design_notes.md)."""
    g = plan.groups
    return ((g == 1 or splits_by_group(plan)) and contracted // g <= most
            and (plan.a_channels // g) * (plan.b_channels // g) <= ELEMENTWISE_POLICY_PRODUCT)


#: the output side of a backward_data is narrow up to this many channels (``Ca``) ...
NARROW_OUT_CHANNELS = 4
#: ... against at least this many contracted ones (``Cb``)
NARROW_WIDE_CHANNELS = 64


#: ... for plans of at least this many multiply-adds (smaller ones were not measured)
NARROW_MIN_MACS = 10_000_000
#: ... or this many contracted channels for a backward_data without a stride, which has no
#: phase decomposition to prefer (MNIST's 1->32: multiply first 2.75x faster than plain)
NARROW_UNSTRIDED_WIDE_CHANNELS = 32


#: a strided backward_data left after the other rules takes the lhs-dilated convolution
#: (``direct``) with channels-last data and at least this many channels on both sides, where
#: the corpus records have it within 1.0-1.4x of the best (DCGAN's 512->256 to 128->64,
#: ResNet-50's strided 3x3), else ``matmul_overlap_add``
LHS_DILATED_MIN_CHANNELS = 64


def narrow(plan: ConvPlan, wide: int = NARROW_WIDE_CHANNELS) -> bool:
    """An ungrouped plan of some size whose ``a`` side has few channels against a ``b`` side
    of at least ``wide``: a backward_data there multiplies first (one wide product) and
    overlap-adds its narrow result, where the phase convolutions, or the one convolution
    without a stride, would each have a narrow output."""
    return (plan.groups == 1 and plan.a_channels <= NARROW_OUT_CHANNELS
            and plan.b_channels >= wide and plan.macs >= NARROW_MIN_MACS)


#: im2col gathers fewer than this many copies of ``a`` (``prod(K)/prod(S)``) ...
PATCHES_COPIES_BELOW = 4
#: ... with at most this many taps on any axis (a long 1-D kernel's gather gained nothing)
PATCHES_MAX_AXIS_TAPS = 8
#: ... or its product has at most this many columns (``Ca*prod(K)``)
PATCHES_MAX_COLUMNS = 64


def narrow_patches(plan: ConvPlan) -> bool:
    """An ungrouped plan of some size whose patches make a narrow matrix: at most
    :data:`PATCHES_MAX_COLUMNS` columns (``Ca*prod(K)``), on :data:`NARROW_MIN_MACS` or
    more multiply-adds."""
    return (plan.groups == 1 and patches_fit(plan)
            and plan.a_channels * math.prod(plan.kernel) <= PATCHES_MAX_COLUMNS
            and plan.macs >= NARROW_MIN_MACS)


def gathers_little(plan: ConvPlan) -> bool:
    """Whether gathering ``a``'s patches copies it fewer than :data:`PATCHES_COPIES_BELOW`
    times with at most :data:`PATCHES_MAX_AXIS_TAPS` taps on any axis (strided kernels, 1x1),
    or makes a narrow matrix (at most :data:`PATCHES_MAX_COLUMNS` columns, on plans of
    :data:`NARROW_MIN_MACS` or more): there one matrix product over the patches beats XLA
    CPU's convolution by more than the gather's compile costs. A stride-1 3x3 copies the image
    9 times; at 4 copies (k4 s2 over wide channels) the warm gain was within noise, as for
    k16 s8; a 16x16 kernel's gather compiles for seconds."""
    taps = math.prod(plan.kernel)
    return narrow_patches(plan) or (
        plan.groups == 1 and patches_fit(plan) and max(plan.kernel) <= PATCHES_MAX_AXIS_TAPS
        and taps < PATCHES_COPIES_BELOW * math.prod(plan.strides))


#: space-to-depth (``space_to_depth``) up to this many contracted channels (or any count
#: where the kernel equals the stride): it multiplies the contraction by ``prod(S)``
SUBPIXEL_MAX_CHANNELS = 32


#: the sub-pixel backward_data (where exact) past this many phases
SUBPIXEL_MIN_PHASES = 8


def dilated(plan: ConvPlan) -> bool:
    """A dilated kernel: XLA CPU's dilated convolution is a slow path, where ``taps`` (one
    product per tap over strided views) gathers nothing."""
    return any(d > 1 for d in plan.dilations)


#: the GPU's weight gradient gathers patches up to this many kernel taps
PATCHES_MAX_TAPS = 32


#: ``folds`` from this many output positions per image (``b``'s)
FOLD_MIN_POSITIONS = 64


def folds(plan: ConvPlan) -> bool:
    """A 2-D channels-last plan whose first kernel axis has several taps, over at least
    :data:`FOLD_MIN_POSITIONS` output positions: stacking those taps along channels
    (``folded``) widens the contraction and leaves XLA CPU a 1-D convolution it runs well;
    with one tap on that axis, or a map of a few positions (a generator's 1x1 input), there
    is nothing to gain for the compile."""
    return (plan.ndim == 2 and plan.channels_last and plan.kernel[0] > 1
            and math.prod(plan.b_spatial) >= FOLD_MIN_POSITIONS)


#: the weight gradient folds without a stride from this many channels on both sides (the
#: narrowest where the records show ``folded`` winning; below, the plain one)
FOLDED_MIN_CHANNELS = 64


def windows_apart(plan: ConvPlan) -> bool:
    """Kernels no longer than their strides: the windows do not overlap."""
    return all(k <= s for k, s in zip(plan.kernel, plan.strides))


def one_tap(plan: ConvPlan) -> bool:
    """A 1x1 kernel: one matrix product, which XLA CPU's convolution runs several times slower."""
    return math.prod(plan.kernel) == 1


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


def choose_forward(plan: ConvPlan) -> str:
    """The default forward lowering on CPU. Few input channels per group go elementwise (XLA
    CPU's grouped convolution is a slow path), other groups ``grouped``; dilated kernels
    ``taps``; strided 3-D plans gather patches (its 3-D convolutions are slow) where they
    make a narrow matrix or the windows do not overlap (:func:`windows_apart`), other 3-D
    plans ``sliced`` (a gather of many wide windows compiles one XLA loop per window: MONAI's
    3x3x3 s2 forward 10x the plain call's compile as ``im2col``, 3x as ``sliced``, which runs
    as fast); strided channels-first plans whose patches make a narrow matrix one product
    over them (:func:`narrow_patches`: wav2vec 2.0's 1->512 k10 s5, 6.6x faster than
    space-to-depth since that product reads channels-first data as it lies); other strided
    plans with narrow inputs (unless the plain call is fast there: :func:`plain_is_fast`) or
    kernels equal to their strides go space-to-depth
    (``space_to_depth``: a wide stride-1 contraction); ungrouped plans of few channels
    elementwise (:func:`few_channels`); 1x1 kernels without a stride one matrix product
    (XLA CPU's strided 1x1 convolution is as fast, and compiles 2-4x less: ResNet-50's
    downsample); 2-D
    channels-last plans without a stride ``folded`` (:func:`folds`; strided ones gained
    within noise or lost, and compile ~6x the plain call: ResNet-50's stem); else
    ``direct``."""
    if (few_per_group(plan, plan.a_channels)
            or (few_channels(plan, plan.a_channels, ELEMENTWISE_POLICY_CHANNELS)
                and not any(s > 1 for s in plan.strides))):
        return "elementwise"
    if plan.groups > 1:
        return "grouped" if splits_by_group(plan) else "direct"
    if dilated(plan):
        return "taps" if _taps.measured(plan, plan.a_channels) else "direct"
    strided = any(s > 1 for s in plan.strides)
    if plan.ndim >= 3:
        if not strided:
            return "sliced" if _sliced.slices(plan) else "direct"
        if patches_fit(plan) and (narrow_patches(plan) or windows_apart(plan)):
            return "im2col"
        return "sliced" if patches_fit(plan) else "direct"
    if strided and not plan.channels_last and narrow_patches(plan):
        return "im2col"
    if _space_to_depth.applies(plan) and (
            (plan.a_channels <= SUBPIXEL_MAX_CHANNELS and not plain_is_fast(plan))
            or plan.kernel == plan.strides):
        return "space_to_depth"
    if few_channels(plan, plan.a_channels, ELEMENTWISE_POLICY_CHANNELS):
        return "elementwise"
    if one_tap(plan) and patches_fit(plan) and not strided:
        return "im2col"
    if folds(plan) and not strided:
        return "folded"
    return "direct"


def choose_backward_data(plan: ConvPlan) -> str:
    """The backward_data lowering on CPU. Only lowerings that form exactly the canonical products
    are chosen (``subpixel*`` only where :func:`subpixel_is_exact`).

    Few contracted channels per group go elementwise (``upsampled`` where :func:`upsamples`).
    Without a stride: ``grouped`` for splittable groups, ``taps`` for dilated kernels, ``sliced`` in
    3-D, ``matmul_overlap_add`` where the output side is narrow (:func:`narrow`, from
    :data:`NARROW_UNSTRIDED_WIDE_CHANNELS`), one product for 1x1 kernels, else ``direct``
    (``phases_folded`` gained within noise on one host and compiles 10x longer).
    With one: ``subpixel_matmul`` (one product of ``S*Ca`` outputs over the few taps of each
    phase) where exact with more than :data:`SUBPIXEL_MIN_PHASES` phases (1-D, 2-D: one piece,
    where the other decompositions make one per phase or tap, and compile for seconds);
    ``matmul_overlap_add`` where the output side is narrow (:func:`narrow`) and in 3-D (XLA
    CPU's 3-D convolutions are slow); other groups ``grouped`` or ``phases_matmul``;
    ``subpixel`` where exact and 1-D or of few channels;
    ``matmul_overlap_add`` where each phase has at most one tap (the overlap-add is then a reshape);
    else ``phases_matmul`` in 16 bits (XLA CPU's products beat its convolutions there),
    ``taps`` in 1-D channels-first over wide channels, undilated (one product per tap, nothing
    gathered: wav2vec 2.0's and Whisper's k3 s2, 1.04-1.22x faster than
    ``matmul_overlap_add``),
    ``direct`` for channels-last data wide on both sides (:data:`LHS_DILATED_MIN_CHANNELS`),
    else ``matmul_overlap_add`` (on the corpus records as fast as the per-phase convolutions
    these replaced, or faster, and cheaper to compile: docs/design_notes.md).
    """
    if (few_per_group(plan, plan.b_channels)
            or few_channels(plan, plan.b_channels, ELEMENTWISE_MAX_CHANNELS)):
        return "upsampled" if upsamples(plan) else "elementwise"
    if all(s == 1 for s in plan.strides):
        return _backward_data_unstrided(plan)
    exact = plan.groups == 1 and subpixel_is_exact(plan)
    if exact and plan.ndim <= 2 and math.prod(plan.strides) > SUBPIXEL_MIN_PHASES:
        return "subpixel_matmul"
    if narrow(plan) or (plan.groups == 1 and plan.ndim >= 3):
        return "matmul_overlap_add"
    if plan.groups > 1:
        return "grouped" if splits_by_group(plan) else "phases_matmul"
    if exact and (plan.ndim == 1
                  or min(plan.a_channels, plan.b_channels) <= SUBPIXEL_MAX_CHANNELS):
        return "subpixel"
    if all(len(taps) <= 1 for p in _phases(plan) for taps in p.taps):
        return "matmul_overlap_add"
    if plan.dtype in ("float16", "bfloat16"):
        return "phases_matmul"
    if (plan.ndim == 1 and not plan.channels_last and not dilated(plan)
            and _taps.measured(plan, plan.b_channels)):
        return "taps"
    if (plan.channels_last and min(plan.a_channels, plan.b_channels) >= LHS_DILATED_MIN_CHANNELS
            and direct_applies(plan)):
        return PLAIN
    return "matmul_overlap_add"


def _backward_data_unstrided(plan: ConvPlan) -> str:
    """:func:`choose_backward_data` without a stride (nothing to decompose into phases)."""
    if splits_by_group(plan):
        return "grouped"
    if plan.groups > 1:
        return "direct"
    if dilated(plan):
        return "taps" if _taps.measured(plan, plan.b_channels) else "direct"
    if _sliced.slices(plan):
        return "sliced"
    if narrow(plan, NARROW_UNSTRIDED_WIDE_CHANNELS):
        return "matmul_overlap_add"
    return "phases_matmul" if one_tap(plan) else "direct"


def choose_backward_weights(plan: ConvPlan) -> str:
    """The backward_weights lowering on CPU.

    XLA CPU's ``batch_group_count`` convolution is a slow path, so grouped plans are split per group
    (``grouped``, in blocks of groups past its bound) or go elementwise (``depthwise``: one channel
    per group on one side and at most :data:`ELEMENTWISE_POLICY_CHANNELS` on the other, or where
    ``grouped`` does not apply); groups of 2-4 channels on both sides (ResNeXt's) stay ``grouped``,
    several times faster than ``depthwise``. Ungrouped: dilated kernels ``taps``; 1-D and 2-D
    plans of one input channel ``folded`` (the lone channel widened to the first axis's taps:
    MNIST's 1->32 and wav2vec 2.0's 1->512, 1.8-1.9x faster than ``im2col``), and 2-D
    channels-last ones whose patches make a narrow matrix (:func:`narrow_patches`: DCGAN's 64->3
    k4 s2, 1.4-1.7x faster than ``im2col`` on two of three measurements, and a third of its
    compile); plans whose patches copy ``a`` little (:func:`gathers_little`) one matrix product
    over them (``im2col``); 3-D ones ``sliced`` without a stride, else ``phases`` (XLA's 3-D
    weight gradient with a dilated kernel is slow); 2-D plans ``folded`` without a stride (from
    :data:`FOLDED_MIN_CHANNELS` channels on both sides) or with windows apart, strided ones of
    few input channels ``bands`` (the folded operand is narrow there); else ``direct``.
    """
    if plan.groups > 1:
        fewer, more = sorted(c // plan.groups for c in (plan.a_channels, plan.b_channels))
        if depthwise_applies(plan) and (
                (fewer == 1 and more <= ELEMENTWISE_POLICY_CHANNELS)
                or not weights_apply(plan)):
            return "depthwise"
        return "grouped" if weights_apply(plan) else "direct"
    if dilated(plan):
        contracted = min(plan.a_channels, plan.b_channels)
        return "taps" if _taps.measured(plan, contracted) else "direct"
    if plan.a_channels == 1 and plan.ndim <= 2:
        return "folded"                                 # the lone channel widened to K0
    if plan.ndim == 2 and plan.channels_last and narrow_patches(plan):
        return "folded"                 # im2col's gain is reading channels-first data as is
    if gathers_little(plan):
        return "im2col"
    strided = any(s > 1 for s in plan.strides)
    if plan.ndim >= 3:
        return "phases" if strided else "sliced" if _sliced.slices(plan) else "direct"
    if plan.ndim != 2:
        return "direct"
    if (not strided and min(plan.a_channels, plan.b_channels) >= FOLDED_MIN_CHANNELS) or (
            strided and windows_apart(plan)):
        return "folded"                                 # wide, or windows apart
    if strided and plan.a_channels <= ELEMENTWISE_POLICY_CHANNELS and bands_apply(plan):
        return "bands"
    return "direct"


#: the GPU policy's preferred lowering per primitive, for ungrouped plans (measured on an
#: H100 over the real-model corpus: docs/records/corpus-h100.json); the plain lowering otherwise
GPU_PREFERRED = {"forward": "im2col", "backward_data": "matmul_overlap_add",
                 "backward_weights": "im2col"}


#: the GPU forward gathers patches only up to this many kernel taps (a 3-D 3x3x3 kernel's
#: 27 gathered copies made it 1.2-1.6x slower than the plain convolution)
GPU_PATCHES_MAX_TAPS = 16


def gpu_policy(primitive: str, plan: ConvPlan, names: Sequence[str]) -> str:
    """The default lowering on GPU (XLA's cuDNN convolutions). Groups of 2 to
    :data:`ELEMENTWISE_POLICY_CHANNELS` channels on both sides go elementwise, their weight
    gradient per group (:func:`narrow_groups`); a few wide groups (:func:`wide_groups`) one
    convolution per group; dilated kernels ``taps`` (cuDNN's dilated convolution is slow).
    Ungrouped: the weight gradient gathers patches and multiplies once (``im2col``)
    up to :data:`PATCHES_MAX_TAPS` taps (a slice per tap of a 16x16 kernel loses to cuDNN);
    a strided backward_data multiplies first and overlap-adds (``matmul_overlap_add``), or
    is one convolution of ``S*Ca`` outputs (``subpixel_matmul``) where that is exact and
    each phase has one tap or there are more than :data:`SUBPIXEL_MIN_PHASES` phases
    (the overlap-add is then a reshape, or too many pieces); a 1x1 backward_data without a
    stride is one product (``phases_matmul``); the forward gathers patches up to
    :data:`GPU_PATCHES_MAX_TAPS` taps. Everything else, other grouped plans (depthwise ones
    included) and one-tap strided plans (:func:`~polyconv_jax._patches.patches_abort_xla_gpu`),
    takes the plain lowering."""
    if narrow_groups(plan):
        name = "grouped" if primitive == "backward_weights" else "elementwise"
        # (per group, as measured: not in blocks of groups)
        if name in names and (
                name != "grouped" or splits_by_group(plan)):
            return name
    if wide_groups(plan) and primitive != "backward_weights" and "grouped" in names:
        return "grouped"
    if (dilated(plan) and primitive != "backward_weights" and "taps" in names
            and _taps.measured(plan, plan.b_channels if primitive == "backward_data"
                               else plan.a_channels)):
        return "taps"
    name = GPU_PREFERRED[primitive]
    if (primitive == "backward_data" and one_tap(plan) and "phases_matmul" in names
            and all(s == 1 for s in plan.strides)):
        return "phases_matmul"
    if primitive == "backward_data" and subpixel_is_exact(plan) and (
            math.prod(plan.strides) > SUBPIXEL_MIN_PHASES
            or all(len(taps) <= 1 for p in _phases(plan) for taps in p.taps)):
        name = "subpixel_matmul"
    # not applicable: grouped plans (each preferred lowering is for ungrouped ones only) and
    # the im2col that XLA GPU may abort compiling
    if (name not in names
            or (primitive == "backward_data" and all(s == 1 for s in plan.strides))
            or (primitive == "forward" and math.prod(plan.kernel) > GPU_PATCHES_MAX_TAPS)
            or (primitive == "backward_weights"
                and math.prod(plan.kernel) > PATCHES_MAX_TAPS)):
        return PLAIN
    return name




#: ``wide_groups``: at most this many groups ...
GPU_WIDE_MAX_GROUPS = 8
#: ... of at least this many channels on both sides
GPU_WIDE_MIN_CHANNELS = 64


def wide_groups(plan: ConvPlan) -> bool:
    """Whether ``plan`` has a few groups of many channels (StyleGAN2's modulated 4x512),
    where XLA GPU's grouped convolution lost to one convolution per group."""
    return (1 < plan.groups <= GPU_WIDE_MAX_GROUPS and splits_by_group(plan)
            and min(plan.a_channels, plan.b_channels) // plan.groups >= GPU_WIDE_MIN_CHANNELS)


def narrow_groups(plan: ConvPlan) -> bool:
    """Whether ``plan`` has groups of 2 to :data:`ELEMENTWISE_POLICY_CHANNELS` channels on both
    sides (ResNeXt-50's 32 groups of 4): there
    XLA GPU's grouped convolution lost 6-7x to the elementwise lowerings (forward 0.31 ms
    against 0.048, backward_data 0.33 against 0.046, on an H200) and 2.1x to the weight
    gradient per group (0.69 against 0.32); one layer, at the corpus's CPU batch. Depthwise
    plans (one channel per group) are not narrow groups: there the grouped convolution took
    at most 1.3x the best lowering's time in 19 of 21 GPU measurements (four layers, their
    three primitives, H100 and H200 runs; the other two, MobileNetV2's strided
    backward_data, 1.4-1.6x)."""
    return all(few_per_group(plan, channels) and channels > plan.groups
               for channels in (plan.a_channels, plan.b_channels))


CPU_RULES = {"forward": choose_forward, "backward_data": choose_backward_data,
             "backward_weights": choose_backward_weights}


#: plans under this much work take the plain lowering on CPU: its call takes at most a
#: millisecond or two even on XLA CPU's grouped and lhs-dilated slow paths, less than what
#: compiling a decomposition adds (0.1-2 s on the test grid's plans, against 10-90 ms for the
#: plain call's first call; docs/design_notes.md)
SMALL_MACS = 1_000_000


def plain_work(plan: ConvPlan, primitive: str) -> int:
    """The multiply-adds of ``primitive``'s plain convolution: the plan's, except for a
    strided backward_data, whose lhs-dilated convolution also multiplies the zeros between the
    rows of ``b`` (``prod(strides)`` times as many)."""
    if primitive == "backward_data":
        return plan.macs * math.prod(plan.strides)
    return plan.macs


def small(plan: ConvPlan, primitive: str) -> bool:
    """Whether ``plan`` is too small for any decomposition's compilation to pay: its plain
    convolution does under :data:`SMALL_MACS` multiply-adds (:func:`plain_work`). Issue 51's
    grouped 3-D ConvTranspose at stride 2 is not: its lhs-dilated backward_data took 22-60 ms
    a call, against 0.2 ms by ``elementwise``."""
    return plain_work(plan, primitive) < SMALL_MACS


def policy(primitive: str, plan: ConvPlan, names: Sequence[str],
           platform: str | None = None) -> str:
    """The default among the applicable ``names`` (the chooser's policy): the CPU rules on CPU
    (the plain lowering for :func:`small` plans), :func:`gpu_policy` on GPU, the plain lowering
    elsewhere; the first of ``names`` where a rule's pick does not apply."""
    platform = platform or current_platform()
    if platform == "cpu":
        name = PLAIN if small(plan, primitive) else CPU_RULES[primitive](plan)
    elif platform == "gpu":
        name = gpu_policy(primitive, plan, names)
    else:
        name = PLAIN
    return name if name in names else names[0]
