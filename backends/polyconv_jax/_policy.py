"""The default lowering of each primitive without measuring: rules set from measurements, one
set per platform (docs/jax_lowerings.md has the measurements). On the CPU the rules of
:func:`choose_forward`, :func:`choose_backward_data` and :func:`choose_backward_weights`
(2-core x86 hosts); on GPU :func:`gpu_policy` (an H100 and an H200); elsewhere (TPU, not
measured) the plain lowering, which is what XLA's own convolution autotuning sees."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax

from polyconv import ConvPlan
from polyconv._phases import phases as plan_phases

from . import _sliced
from ._common import _phases
from ._elementwise import ELEMENTWISE_MAX_CHANNELS, depthwise_applies
from ._grouped import splits_by_group
from ._patches import patches_fit
from ._plain import BAND_POSITIONS, BANDS_MIN_CHANNELS, bands_apply
from ._subpixel import subpixel_is_exact

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
    if narrow(plan) and patches_fit(plan):
        return "patches_matmul"
    return "sliced" if _sliced.slices(plan) else "direct"


def choose_backward_data(plan: ConvPlan) -> str:
    """The backward_data lowering for a plan (measured on XLA CPU: see the module docstring).

    Only lowerings that form exactly the products of the canonical convolution are chosen (NaN
    and infinity in
    ``b`` reach exactly the outputs that read them): ``subpixel*`` only where
    :func:`subpixel_is_exact`.

    1. Groups with at most 4 input channels each (depthwise: 1, any channel multiplier):
       ``elementwise``, with or without a stride (XLA CPU's grouped convolutions are a slow
       path: 40x for a stride-1 depthwise 3x3); so do ungrouped plans with at most 8 input
       channels and ``Ca*Cb <= 128`` (:func:`few_channels`; LeNet-5's
       first input gradient, 6->1 5x5, 3.6 ms against 0.7; 16->8 3x3 0.9 against 0.6).
       ``upsampled`` instead where :func:`upsamples`.
    2. No stride: ``direct`` (nothing to decompose; one stride-1 convolution); ``sliced``
       where :func:`~polyconv_jax._sliced.slices` (3-D: 2-D convolutions, 2.5-3.5x);
       ``grouped`` for groups up to :data:`~polyconv_jax._grouped.GROUPED_MAX_GROUPS` (XLA
       CPU's grouped convolution costs about as much as the ungrouped one: 4 groups of 16
       channels 4x, 2 groups of 32 in 3-D 9x).
       Ungrouped with a narrow output side (:func:`narrow`): ``matmul_overlap_add``.
    3. Other groups: ``grouped`` (one ungrouped problem per group, each chosen by rules 4-8)
       up to :data:`~polyconv_jax._grouped.GROUPED_MAX_GROUPS` groups, else
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


def choose_backward_weights(plan: ConvPlan) -> str:
    """The backward_weights lowering for a plan (measured on XLA CPU: module docstring).

    XLA CPU's ``batch_group_count`` convolution is a slow path (100x torch for 8 groups), so
    grouped plans are split per group (``grouped``), depthwise ones go elementwise
    (``depthwise``: one channel per group on one side and at most
    :data:`ELEMENTWISE_POLICY_CHANNELS` on the other, a channel
    multiplier included, or up to :data:`~polyconv_jax._elementwise.ELEMENTWISE_MAX_CHANNELS` on
    both sides where ``grouped`` does not apply: a 3x3 32->64 layer in 32 groups at 8x56x56
    took 3.4 ms against 10 per group and 3.5 s for ``direct``; ResNeXt-50's 32 groups of 4
    ran as fast per group); strided 3-D plans use ``phases`` (XLA's 3-D weight gradient with a
    dilated kernel is 3x slower); ungrouped plans with few input columns
    (:func:`narrow`) gather patches and multiply once
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
        if depthwise_applies(plan) and (
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
            and bands_apply(plan)):
        return "bands"
    return "direct"


#: the GPU policy's preferred lowering per primitive, for ungrouped plans (measured on an
#: H100 over the real-model corpus: docs/benchmarks-gpu.json); the plain lowering otherwise
GPU_PREFERRED = {"forward": "patches_matmul", "backward_data": "matmul_overlap_add",
                 "backward_weights": "patches_matmul"}


#: the GPU forward gathers patches only up to this many kernel taps (a 3-D 3x3x3 kernel's
#: 27 gathered copies made it 1.2-1.6x slower than the plain convolution)
GPU_PATCHES_MAX_TAPS = 16


def gpu_policy(primitive: str, plan: ConvPlan, names: Sequence[str]) -> str:
    """The default lowering on GPU (measured on an H100, XLA's cuDNN convolutions, the
    real-model corpus at 8x its CPU batches). For ungrouped plans: the weight gradient
    gathers patches and multiplies once (``patches_matmul``: 1.0-1.4x faster than XLA's
    weight-gradient convolution on 2-D and 1-D layers, 1.8-2.9x on 3-D up-convolutions,
    26-36x on the 3-D 64->1 decoder);
    a strided backward_data multiplies first and overlap-adds (``matmul_overlap_add``:
    1.2-1.7x, 40x on that decoder in bfloat16); the forward gathers patches when the kernel
    has at most :data:`GPU_PATCHES_MAX_TAPS` taps (1.1-1.9x). Groups of 2 to
    :data:`ELEMENTWISE_POLICY_CHANNELS` channels on both sides go
    elementwise, their weight gradient per group (:func:`narrow_groups`). Everything else,
    other grouped plans (depthwise ones included) and one-tap strided plans
    (:func:`~polyconv_jax._patches.patches_abort_xla_gpu`), takes the plain lowering."""
    if narrow_groups(plan):
        name = "grouped" if primitive == "backward_weights" else "elementwise"
        # (per group, as measured: not in blocks of groups)
        if name in names and (
                name != "grouped" or splits_by_group(plan)):
            return name
    name = GPU_PREFERRED[primitive]
    # not applicable: grouped plans (each preferred lowering is for ungrouped ones only) and
    # the im2col that XLA GPU may abort compiling
    if (name not in names
            or (primitive == "backward_data" and all(s == 1 for s in plan.strides))
            or (primitive == "forward" and math.prod(plan.kernel) > GPU_PATCHES_MAX_TAPS)):
        return PLAIN
    return name


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


#: plans under this many multiply-adds take the plain lowering on CPU: its call takes
#: milliseconds even on XLA CPU's grouped slow path, less than what compiling a decomposition
#: adds (0.1-2 s on the test grid's plans, against 15-420 ms for the plain call's first call;
#: docs/design_notes.md)
SMALL_MACS = 1_000_000


def small(plan: ConvPlan, primitive: str) -> bool:
    """Whether ``plan`` is too small for any decomposition's compilation to pay (under
    :data:`SMALL_MACS`), a strided backward_data aside: it is never left to XLA CPU's
    lhs-dilated convolution (40x the phases on a DCGAN layer, 100-400x in 3-D: tens of
    milliseconds a call even on a small plan)."""
    return plan.macs < SMALL_MACS and not (
        primitive == "backward_data" and any(s > 1 for s in plan.strides))


def policy(primitive: str, plan: ConvPlan, names: Sequence[str],
           platform: str | None = None) -> str:
    """The default among the applicable ``names`` (the chooser's policy): the CPU rules on CPU
    (the plain lowering for :func:`small` plans), :func:`gpu_policy` on GPU, the plain lowering
    elsewhere; the first of ``names`` where a rule's pick does not apply."""
    platform = platform or jax.default_backend()
    if platform == "cpu":
        name = PLAIN if small(plan, primitive) else CPU_RULES[primitive](plan)
    elif platform == "gpu":
        name = gpu_policy(primitive, plan, names)
    else:
        name = PLAIN
    return name if name in names else names[0]
