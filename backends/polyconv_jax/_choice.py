"""Which lowering computes a primitive: forced, measured, or the platform's default policy.

Every primitive has several exact lowerings (:data:`LOWERINGS`; the first of each is the plain
one-call lowering a hand-written ``lax`` call would be). A plan's lowering is chosen when the
primitive is traced, in this order:

1. a lowering forced by :func:`force_lowering` or ``POLYCONV_JAX_LOWERING`` (tests,
   benchmarks), where it can compute the plan;
2. measured (autotuning, on by default): every applicable exact lowering is compiled and
   timed on random inputs of the plan's shapes on the default device, interleaved (on an
   accelerator, :data:`MEASURE_QUEUED_CALLS` calls queued at a time), and the
   fastest (by its fastest call; the plain lowering when within 10%, else the policy's when
   within 3%) is kept for the process (and in ``POLYCONV_JAX_AUTOTUNE_CACHE``, a JSON file,
   when set), per (platform, device kind, XLA options, primitive, geometry, dtype,
   precision). The plain lowering is always a candidate, so the choice cannot lose to it by
   more than the noise of the measurement. Plans under :data:`MEASURE_MIN_MACS`
   multiply-adds are not measured: there is too little to win;
3. otherwise the platform's default policy: on CPU the rules of each family's ``choose_*``
   (set from measurements on a 2-core x86 CPU); on GPU :func:`gpu_policy` (set from
   measurements on an H100 and an H200); elsewhere (TPU, not measured) the plain lowering,
   which is what XLA's own convolution autotuning sees.

``POLYCONV_JAX_AUTOTUNE=0`` (or :func:`autotune` ``(False)``) turns measuring off, for
deterministic lowerings (the test suite does this). In a multi-process run
(``jax.distributed``) nothing is measured, since every process must compile the same
program: choices come from the cache file (measure once, share the file) or the policy.
The choice is made for ``jax.default_backend()``'s platform, where the measurement runs.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import json
import math
import os
import threading
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from polyconv import ConvPlan
from polyconv._measure import Switch, geometry, pick, time_candidates

from ._backward_data import (
    BACKWARD_DATA,
    applicable,
    choose_backward_data,
    direct_aborts_xla_cpu,
    exact,
)
from ._backward_weights import (
    BACKWARD_WEIGHTS,
    choose_backward_weights,
    group_block,
    weights_applicable,
)
from ._forward import (
    FORWARD,
    choose_forward,
    few_per_group,
    forward_applicable,
    patches_abort_xla_gpu,
    splits_by_group,
)
from ._taps import measured as taps_measured

#: the lowerings of each primitive, by name; the first is the plain one-call lowering
IMPLEMENTATIONS = {"forward": FORWARD, "backward_data": BACKWARD_DATA,
                   "backward_weights": BACKWARD_WEIGHTS}
LOWERINGS = {p: tuple(impls) for p, impls in IMPLEMENTATIONS.items()}
_APPLICABLE = {"forward": forward_applicable, "backward_data": applicable,
               "backward_weights": weights_applicable}
_CPU_POLICY = {"forward": choose_forward, "backward_data": choose_backward_data,
               "backward_weights": choose_backward_weights}

ENV_VAR = "POLYCONV_JAX_LOWERING"
AUTOTUNE_ENV = "POLYCONV_JAX_AUTOTUNE"
CACHE_ENV = "POLYCONV_JAX_AUTOTUNE_CACHE"

#: plans with fewer multiply-adds take the default policy: measuring would cost more than
#: the best lowering can save (a few milliseconds of compilation per candidate)
MEASURE_MIN_MACS = 20_000_000
#: timed rounds per measurement (each round times every remaining candidate once)
MEASURE_ROUNDS = 5
#: a lowering within this fraction of the fastest counts as tied: the policy's is kept
MEASURE_TIE = 0.03
#: the plain lowering (a hand-written ``lax`` call's) is kept unless another is faster by
#: more than this fraction: a closer win is within the noise of one measurement, or of how
#: a lowering timed alone ranks inside a whole program (DeepLabV3's dilated ASPP
#: backward_data, 2 CPUs: ``phases_matmul`` timed 7% faster than ``direct`` alone, and its
#: gradient then ran 6-10% slower, 1.17x the ``lax`` call's in a corpus run), and the plain
#: lowering is the one a user compares against
MEASURE_PLAIN_TIE = 0.10
#: a candidate whose first timed call takes this many times the best so far is dropped
MEASURE_DROP_FACTOR = 3.0
#: on an accelerator each timed "call" is this many calls queued back to back, waited for
#: once (see :func:`_time`), fewer where their results would hold more than
#: :data:`MEASURE_QUEUED_BYTES` at once (large calls are not dispatch-bound anyway)
MEASURE_QUEUED_CALLS = 10
MEASURE_QUEUED_BYTES = 1 << 30

_FORCED: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "polyconv_jax_forced_lowering", default=None)
_AUTOTUNE = Switch(AUTOTUNE_ENV)


# --------------------------------------------------------------------------------------------
# forcing and switching (tests, benchmarks)
# --------------------------------------------------------------------------------------------

def _check_forced(where: str, forced: dict[str, str]) -> dict[str, str]:
    for primitive, name in forced.items():
        if primitive not in LOWERINGS or name not in LOWERINGS[primitive]:
            choices = "; ".join(f"{p}: {', '.join(names)}" for p, names in LOWERINGS.items())
            msg = f"{where}: unknown lowering {primitive}={name!r}; the lowerings are {choices}"
            raise ValueError(msg)
    return forced


@contextlib.contextmanager
def force_lowering(**by_primitive: str | None):
    """Within the block, trace the JAX backend's primitives with the named lowerings.

    For tests and benchmarks, e.g. ``force_lowering(backward_data="phases")``; the names are
    in :data:`LOWERINGS`. A lowering that cannot compute a plan (``elementwise`` with more than
    8 channels per group, ``grouped`` on an ungrouped plan, ...) falls back to the usual
    choice, and so does ``patches_matmul`` where XLA GPU may abort compiling it
    (:func:`~polyconv_jax._forward.patches_abort_xla_gpu`). The setting is read when a
    polyconv op is *traced*: a function that was already jitted keeps the lowering it was
    compiled with. It overrides the environment variable
    ``POLYCONV_JAX_LOWERING`` (same names, e.g. ``backward_data=phases,backward_weights=direct``),
    which is read per call.
    """
    forced = _check_forced("force_lowering",
                           {k: v for k, v in by_primitive.items() if v is not None})
    token = _FORCED.set(forced)
    try:
        yield
    finally:
        _FORCED.reset(token)


def _forced() -> dict[str, str]:
    forced = _FORCED.get()
    if forced is None:
        text = os.environ.get(ENV_VAR, "").strip()
        forced = {}
        for item in filter(None, (t.strip() for t in text.split(","))):
            key, _, name = item.partition("=")
            forced[key.strip()] = name.strip()
        forced = _check_forced(ENV_VAR, forced)
    return forced


def requested(primitive: str) -> str | None:
    """The lowering forced for ``primitive`` (context, then environment), or ``None``."""
    return _forced().get(primitive)


def autotune(enabled: bool = True):
    """Within the block, measure (``True``) or take the default policy (``False``) when a
    lowering is chosen; overrides ``POLYCONV_JAX_AUTOTUNE``. Read at trace time."""
    return _AUTOTUNE(enabled)


def autotune_enabled() -> bool:
    return _AUTOTUNE.enabled()


def settings() -> tuple:
    """The choice settings in force, hashable: part of each primitive's jit cache key, so a
    change of setting retraces instead of reusing another setting's lowering."""
    return tuple(sorted(_forced().items())), autotune_enabled()


# --------------------------------------------------------------------------------------------
# the choice
# --------------------------------------------------------------------------------------------

def is_applicable(primitive: str, plan: ConvPlan, lowering: str,
                  platform: str | None = None) -> bool:
    """Whether ``lowering`` can compute ``plan`` on ``platform`` (default: JAX's): the
    family's own rule, and no im2col where XLA GPU may abort compiling it
    (:func:`~polyconv_jax._forward.patches_abort_xla_gpu`)."""
    if lowering == "patches_matmul" and patches_abort_xla_gpu(plan) and (
            (platform or jax.default_backend()) == "gpu"):
        return False
    return _APPLICABLE[primitive](plan, lowering)


def candidates(primitive: str, plan: ConvPlan, platform: str | None = None) -> list[str]:
    """The lowerings measured for a plan: applicable ones that form exactly the products of
    the definition (so a NaN or infinity reaches exactly the outputs that read it), the
    default policy's first. On CPU the lhs-dilated convolution of a strided 3-D
    backward_data is left out: it is XLA CPU's slow path, 100-400x the time of every other
    lowering (seconds per call on decoder layers), so measuring it would cost more than any
    choice can save, and it cannot win; so is it where XLA CPU may abort compiling it
    (:func:`~polyconv_jax._backward_data.direct_aborts_xla_cpu`). Nor are the ``folded``
    lowerings of grouped plans on CPU: their convolutions are XLA CPU's grouped slow path,
    like ``direct``'s (a depthwise weight gradient's took 2.5-5.6 s a call, against 8-33 ms
    for ``depthwise``), so they cannot win either. For the same reason a grouped weight
    gradient measures on CPU only ``depthwise`` and ``grouped`` where either applies: the
    others (``direct``, ``bands``, ``phases``, ``sliced``) compute it with XLA CPU's
    batch-grouped convolution, 10-600x their time on the corpus's grouped layers (ResNeXt-50's
    32 groups of 4: 4.9-5.0 s a call against 8.6 ms; ResNeXt-101 64x4d's 64 groups of 4: 24 s
    against 64 ms), so their two measured calls would make a first call take minutes. Nor is
    the ``folded`` forward of
    channels-first data with one or two spatial axes on CPU: there it runs within 10% of the
    plain convolution either way, so its measurement picks by noise (the U-Net's 3x3 64->64
    at 128x128: measured 5% faster and taken, it then ran 21.2 ms against 19.5 for ``direct``
    alternated in one process, 1.29x the ``lax`` call in the corpus's rounds); with three
    axes it halves XLA CPU's 3-D convolution and is measured. The ``sliced`` lowerings
    (convolutions of rank ``nd - 1``, one per tap of the first axis) are measured for 3-D and
    up only, where they stand in for XLA CPU's 3-D convolution; a backward_data's only
    without a stride past the first axis (its inner problems would be lhs-dilated
    convolutions, XLA CPU's slow path). The ``taps`` lowerings (one product per tap over the
    rows it reads) are measured from :data:`~polyconv_jax._taps.TAPS_MIN_CHANNELS`
    contracted channels (both sides for a weight gradient) and up to
    :data:`~polyconv_jax._taps.TAPS_MAX` taps that read ``a``. On GPU the im2col
    lowerings are not applicable where XLA GPU may abort compiling them
    (:func:`is_applicable`)."""
    platform = platform or jax.default_backend()
    out = [name for name in LOWERINGS[primitive]
           if is_applicable(primitive, plan, name, platform)]
    if primitive == "backward_data":
        out = [name for name in out if exact(plan, name)]
    if platform == "cpu" and primitive == "backward_data" and (
            (plan.ndim >= 3 and any(s > 1 for s in plan.strides))
            or direct_aborts_xla_cpu(plan)):
        out = [name for name in out if name != "direct"]
    if platform == "cpu" and (plan.groups > 1 or (
            primitive == "forward" and not plan.channels_last and plan.ndim <= 2)):
        out = [name for name in out if name != "folded"]
    if platform == "cpu" and primitive == "backward_weights" and plan.groups > 1 and (
            {"depthwise", "grouped"} & set(out)):
        out = [name for name in out if name in ("depthwise", "grouped")]
    if plan.ndim < 3 or (primitive == "backward_data" and set(plan.strides[1:]) != {1}):
        out = [name for name in out if name != "sliced"]
    contracted = {"forward": plan.a_channels, "backward_data": plan.b_channels,
                  "backward_weights": min(plan.a_channels, plan.b_channels)}[primitive]
    if not taps_measured(plan, contracted):
        out = [name for name in out if name != "taps"]
    first = policy(primitive, plan, platform)
    return sorted(out, key=lambda name: name != first)


#: the GPU policy's preferred lowering per primitive, for ungrouped plans (measured on an
#: H100 over the real-model corpus: docs/benchmarks-gpu.json); the plain lowering otherwise
GPU_PREFERRED = {"forward": "patches_matmul", "backward_data": "matmul_overlap_add",
                 "backward_weights": "patches_matmul"}
#: the GPU forward gathers patches only up to this many kernel taps (a 3-D 3x3x3 kernel's
#: 27 gathered copies made it 1.2-1.6x slower than the plain convolution)
GPU_PATCHES_MAX_TAPS = 16


def gpu_policy(primitive: str, plan: ConvPlan) -> str:
    """The default lowering on GPU (measured on an H100, XLA's cuDNN convolutions, the
    real-model corpus at 8x its CPU batches). For ungrouped plans: the weight gradient
    gathers patches and multiplies once (``patches_matmul``: 1.0-1.4x faster than XLA's
    weight-gradient convolution on 2-D and 1-D layers, 1.8-2.9x on 3-D up-convolutions,
    26-36x on the 3-D 64->1 decoder);
    a strided backward_data multiplies first and overlap-adds (``matmul_overlap_add``:
    1.2-1.7x, 40x on that decoder in bfloat16); the forward gathers patches when the kernel
    has at most :data:`GPU_PATCHES_MAX_TAPS` taps (1.1-1.9x). Groups of 2 to
    :data:`~polyconv_jax._forward.ELEMENTWISE_POLICY_CHANNELS` channels on both sides go
    elementwise, their weight gradient per group (:func:`narrow_groups`). Everything else,
    other grouped plans (depthwise ones included) and one-tap strided plans
    (:func:`~polyconv_jax._forward.patches_abort_xla_gpu`), takes the plain lowering."""
    if narrow_groups(plan):
        name = "grouped" if primitive == "backward_weights" else "elementwise"
        # (per group, as measured: not in blocks of groups)
        if is_applicable(primitive, plan, name, "gpu") and (
                name != "grouped" or splits_by_group(plan)):
            return name
    name = GPU_PREFERRED[primitive]
    # not applicable: grouped plans (each preferred lowering is for ungrouped ones only) and
    # the im2col that XLA GPU may abort compiling
    if (not is_applicable(primitive, plan, name, "gpu")
            or (primitive == "backward_data" and all(s == 1 for s in plan.strides))
            or (primitive == "forward" and math.prod(plan.kernel) > GPU_PATCHES_MAX_TAPS)):
        return LOWERINGS[primitive][0]
    return name


def narrow_groups(plan: ConvPlan) -> bool:
    """Whether ``plan`` has groups of 2 to :data:`~polyconv_jax._forward.
    ELEMENTWISE_POLICY_CHANNELS` channels on both sides (ResNeXt-50's 32 groups of 4): there
    XLA GPU's grouped convolution lost 6-7x to the elementwise lowerings (forward 0.31 ms
    against 0.048, backward_data 0.33 against 0.046, on an H200) and 2.1x to the weight
    gradient per group (0.69 against 0.32); one layer, at the corpus's CPU batch. Depthwise
    plans (one channel per group) are not narrow groups: there the grouped convolution took
    at most 1.3x the best lowering's time in 19 of 21 GPU measurements (four layers, their
    three primitives, H100 and H200 runs; the other two, MobileNetV2's strided
    backward_data, 1.4-1.6x)."""
    return all(few_per_group(plan, channels) and channels > plan.groups
               for channels in (plan.a_channels, plan.b_channels))


def policy(primitive: str, plan: ConvPlan, platform: str | None = None) -> str:
    """The default lowering without measuring: the CPU rules on CPU, the GPU rules
    (:func:`gpu_policy`) on GPU, the plain lowering on other platforms (not measured
    there)."""
    platform = platform or jax.default_backend()
    if platform == "cpu":
        return _CPU_POLICY[primitive](plan)
    if platform == "gpu":
        return gpu_policy(primitive, plan)
    return LOWERINGS[primitive][0]


def choose(primitive: str, plan: ConvPlan, precision, repeats: int = 1) -> str:
    """The lowering that computes ``primitive`` for ``plan`` (see the module docstring).

    ``repeats``: the program computes that many copies of ``plan`` (a per-group lowering's
    inner problem, one per group), so it is measured when all of them together reach
    :data:`MEASURE_MIN_MACS`: ResNeXt-50's 32 groups of 4 channels each are a 1.8M
    multiply-add problem, whose policy choice ran its weight gradient 3-4x slower than the
    best (35-48 ms against 9-12, 2 CPUs)."""
    forced = requested(primitive)
    if forced is not None and is_applicable(primitive, plan, forced):
        return forced
    names = candidates(primitive, plan)
    if len(names) == 1:
        return names[0]
    if (not autotune_enabled() or plan.macs * repeats < MEASURE_MIN_MACS or plan.batch == 0
            or plan.dtype == "float64"):   # float64 is for checking, not speed
        return policy(primitive, plan)
    if jax.process_count() > 1:
        # every process must compile the same program: no measuring (timings differ from
        # host to host), only choices read from the cache file, else the policy
        return _cached(primitive, plan, precision, names) or policy(primitive, plan)
    return _measured(primitive, plan, precision, names)


def by_group(primitive: str, plan: ConvPlan, precision, x, y):
    """The per-group lowerings (``grouped``): one ungrouped problem per group, joined along
    the result's channel axis (the weights' ``Cb`` axis for a weight gradient). Group ``g``
    reads its channels of each operand (``Ca/G`` of ``a``, ``Cb/G`` of ``b``, rows ``[g*Cb/G,
    ..)`` of ``W``). The inner problem's lowering is chosen as the ``G`` copies the program
    holds (:func:`choose`'s ``repeats``). XLA CPU's grouped convolutions
    (``feature_group_count``, ``batch_group_count``) cost about as much as ungrouped ones of
    the same width; ``G`` separate ones cost ``1/G`` each.

    A weight gradient of more groups than :data:`~polyconv_jax._forward.GROUPED_MAX_GROUPS`
    takes them in blocks (:func:`~polyconv_jax._backward_weights.group_block`): one
    ungrouped weight gradient per block of ``k`` groups, whose products across two groups
    are computed and dropped (``k`` times the products, each entry kept still the sum of
    exactly its own)."""
    g = plan.groups
    per = group_block(plan) if primitive == "backward_weights" else 1
    parts_count = g // per
    ca, cb = plan.a_channels // parts_count, plan.b_channels // parts_count
    sub = plan.with_(groups=1, a_channels=ca, b_channels=cb)
    inner = IMPLEMENTATIONS[primitive][choose(primitive, sub, precision, repeats=parts_count)]
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


# --------------------------------------------------------------------------------------------
# measuring
# --------------------------------------------------------------------------------------------

_WORKER = "polyconv-autotune"
_lock = threading.Lock()
_measurements: dict[str, str] = {}
_times: dict[str, dict[str, float]] = {}
_loaded_from: str | None = None


def plan_key(primitive: str, plan: ConvPlan, precision) -> str:
    """The measurement's key: device, JAX version, the process's XLA options (``XLA_FLAGS``,
    which change how XLA compiles every candidate), primitive, geometry, dtype, precision."""
    device = jax.devices()[0]
    flags = " ".join(os.environ.get("XLA_FLAGS", "").split())
    return "|".join((device.platform, device.device_kind, jax.__version__,
                     *([f"XLA_FLAGS={flags}"] if flags else []), primitive,
                     geometry(plan), repr(precision)))


def _cache_file() -> Path | None:
    path = os.environ.get(CACHE_ENV, "").strip()
    return Path(path) if path else None


def _load(path: Path | None) -> None:
    global _loaded_from
    if path is None or _loaded_from == str(path):
        return
    _loaded_from = str(path)
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if isinstance(stored, dict):
        _measurements.update({k: v for k, v in stored.items() if isinstance(v, str)})


def _store(path: Path | None) -> None:
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(_measurements, indent=0, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass   # a cache that cannot be written only costs a new measurement


def measured_choices() -> dict[str, str]:
    """The lowerings measured so far in this process (and loaded from the cache file)."""
    with _lock:
        return dict(_measurements)


def measured_times() -> dict[str, dict[str, float]]:
    """Each measurement of this process: seconds per call of every candidate lowering (the
    fastest call; infinity for one that failed to compile or run), by the same keys."""
    with _lock:
        return {key: dict(times) for key, times in _times.items()}


def _inputs(primitive: str, plan: ConvPlan):
    """Random operands of the plan's shapes and dtype, on the default device."""
    shapes = {"forward": (plan.a_shape, plan.weights_shape),
              "backward_data": (plan.b_shape, plan.weights_shape),
              "backward_weights": (plan.a_shape, plan.b_shape)}[primitive]
    rng = np.random.default_rng(0)
    return [jnp.asarray(rng.standard_normal(s, dtype=np.float32)).astype(plan.dtype)
            for s in shapes]


def _time(fn, args, calls: int = 1) -> float:
    """Seconds per call of ``fn(*args)``: ``calls`` calls issued back to back, waited for
    once. On an accelerator one call of a small plan is mostly the host's dispatch and
    wait (0.1-0.2 ms on an H200, noisy, against kernels of tens of microseconds: one
    measurement there took ``patches_matmul`` at 0.17 ms against 0.20 for ``direct``, which
    then ran 0.29 ms against 0.18), while in a training step calls are queued and the
    device's time is what a lowering changes; with several queued calls the device's time
    is what is timed, and where dispatch still dominates the candidates tie and the plain
    lowering is kept."""
    t0 = time.perf_counter()
    for _ in range(calls - 1):
        fn(*args)
    jax.block_until_ready(fn(*args))
    return (time.perf_counter() - t0) / calls


def _queued_calls(primitive: str, plan: ConvPlan) -> int:
    """How many calls one timed call queues off the CPU (see :data:`MEASURE_QUEUED_CALLS`)."""
    size = math.prod(plan.with_(primitive=primitive).shape) * np.dtype(plan.acc_dtype).itemsize
    return max(1, min(MEASURE_QUEUED_CALLS, MEASURE_QUEUED_BYTES // max(size, 1)))


def _runnable(primitive: str, plan: ConvPlan, precision, name: str):
    """The lowering as a jitted function of the primitive's two operands."""
    return jax.jit(partial(IMPLEMENTATIONS[primitive][name], plan, precision))


def measure(primitive: str, plan: ConvPlan, precision, names, rounds: int = MEASURE_ROUNDS,
            timer=None) -> dict[str, float]:
    """Seconds per call of each lowering in ``names``: the fastest of its timed calls.

    Every candidate is compiled, called once untimed (the first run of a fresh executable
    pays one-time costs, which fell on whichever candidate ran first) and once timed; a
    candidate whose timed call takes :data:`MEASURE_DROP_FACTOR` times the best one is not
    timed again (that call stands). The others are then timed in ``rounds`` interleaved
    rounds (alternating the order). The fastest call is the estimate: on a shared machine
    other work only ever adds time, so the minimum is the steadiest statistic for ranking (as
    timeit advises).
    """
    # JAX's tracing state is per thread: a fresh thread runs the measurement eagerly, even
    # while the caller is being traced (jit, grad, vmap), and so does each nested one (a
    # per-group candidate measures its inner problem while it is being compiled); it runs
    # in the caller's context, so that the caller's settings (autotune, force_lowering)
    # hold for those inner choices too
    context = contextvars.copy_context()
    with concurrent.futures.ThreadPoolExecutor(1, _WORKER) as pool:
        return pool.submit(context.run, _measure_eagerly, primitive, plan, precision, names,
                           rounds, timer).result()


def _measure_eagerly(primitive: str, plan: ConvPlan, precision, names, rounds: int,
                     timer) -> dict[str, float]:
    if timer is None:
        queued = 1 if jax.default_backend() == "cpu" else _queued_calls(primitive, plan)
        timer = partial(_time, calls=queued)
    args = _inputs(primitive, plan)
    calls = {}
    for name in names:
        try:
            fn = _runnable(primitive, plan, precision, name).lower(*args).compile()
            jax.block_until_ready(fn(*args))        # warm-up, untimed
            calls[name] = partial(timer, fn, args)
        except Exception:  # a lowering XLA cannot compile or run here never wins
            calls[name] = lambda: math.inf
    return time_candidates(calls, rounds, MEASURE_DROP_FACTOR)


def _cached(primitive: str, plan: ConvPlan, precision, names) -> str | None:
    with _lock:
        _load(_cache_file())
        known = _measurements.get(plan_key(primitive, plan, precision))
    return known if known in names else None


def _measured(primitive: str, plan: ConvPlan, precision, names) -> str:
    known = _cached(primitive, plan, precision, names)
    if known is not None:
        return known
    key, path = plan_key(primitive, plan, precision), _cache_file()
    times = measure(primitive, plan, precision, names)
    # the plain lowering unless clearly slower, else the policy's unless measurably slower
    choice = pick(times, ((LOWERINGS[primitive][0], MEASURE_PLAIN_TIE),
                          (names[0], MEASURE_TIE)))
    with _lock:
        _measurements[key] = choice
        _times[key] = times
        _store(path)
    return choice
