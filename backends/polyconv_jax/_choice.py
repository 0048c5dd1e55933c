"""The JAX backend's lowerings as one list of records, and the core chooser over them.

Every primitive has several exact lowerings, each an :class:`~polyconv._choice.Implementation`
declared in its family's module (:data:`IMPLEMENTATIONS`; the first of each primitive is the
plain one-call lowering a hand-written ``lax`` call would be). A plan's lowering is chosen
when the primitive is traced, by :data:`CHOOSER` (:mod:`polyconv._choice`):

1. one forced by :func:`polyconv.implementation` or ``POLYCONV_IMPLEMENTATION`` (e.g.
   ``"jax:backward_data=phases_matmul"``), where it applies;
2. with measuring on (:func:`polyconv.autotune`, ``POLYCONV_AUTOTUNE=1``; off by default), the
   fastest of :func:`candidates`, compiled and timed on random inputs of the plan's shapes on
   the default device (:func:`measure`), kept per device, JAX version, ``XLA_FLAGS``,
   primitive, geometry, dtype and precision: the plain lowering unless another is faster by
   more than 10%, else the policy's unless another is faster by more than 3%. Plans under
   :data:`MEASURE_MIN_MACS` multiply-adds, of batch 0 or float64 are not measured; in a
   multi-process run (``jax.distributed``) nothing is timed, since every process must
   compile the same program: a choice comes from the cache file or the policy;
3. otherwise the platform's policy (:mod:`._policy`).

The choice is made for ``jax.default_backend()``'s platform, where a measurement runs.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import math
import os
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from polyconv import ConvPlan
from polyconv._choice import PRIMITIVES, Chooser, Implementation, Measurement, time_candidates

from . import (
    _elementwise,
    _folded,
    _grouped,
    _patches,
    _plain,
    _policy,
    _sliced,
    _space_to_depth,
    _subpixel,
    _taps,
    _xla,
)


def lowering(primitive: str, plan: ConvPlan, precision, repeats: int = 1):
    """The kernel of the lowering chosen for ``plan`` (see :func:`choose`): what the per-group
    and space-to-depth lowerings compute their inner problems with."""
    return CHOOSER.get(primitive, choose(primitive, plan, precision, repeats)).run


#: every lowering of the backend, each primitive's plain one first: adding one is its module
#: and one line here (docs/architecture.md)
IMPLEMENTATIONS: tuple[Implementation, ...] = (
    _plain.FORWARD,
    _plain.BACKWARD_DATA,
    _plain.BACKWARD_WEIGHTS,
    _plain.BANDS,
    _subpixel.PHASES_MATMUL,
    _subpixel.SUBPIXEL,
    _subpixel.SUBPIXEL_MATMUL,
    _subpixel.WEIGHTS_PHASES,
    _elementwise.FORWARD,
    _elementwise.BACKWARD_DATA,
    _elementwise.UPSAMPLED,
    _elementwise.DEPTHWISE,
    _patches.FORWARD,
    _patches.BACKWARD_WEIGHTS,
    _folded.FORWARD,
    _folded.BACKWARD_DATA,
    _folded.BACKWARD_WEIGHTS,
    _sliced.FORWARD,
    _sliced.BACKWARD_DATA,
    _sliced.BACKWARD_WEIGHTS,
    _taps.FORWARD,
    _taps.FORWARD_OVERLAP_ADD,
    _taps.BACKWARD_DATA,
    _taps.BACKWARD_DATA_OVERLAP_ADD,
    _taps.BACKWARD_WEIGHTS,
    *_grouped.implementations(lowering),
    _space_to_depth.implementation(lowering),
)


def context() -> str:
    """What a measurement holds for besides the plan: the device's platform and kind, the JAX
    version, and the process's ``XLA_FLAGS`` (which change how XLA compiles every candidate;
    spacing aside)."""
    device = jax.devices()[0]
    flags = " ".join(os.environ.get("XLA_FLAGS", "").split())
    return " ".join((device.platform, device.device_kind, f"jax-{jax.__version__}",
                     *([f"XLA_FLAGS={flags}"] if flags else [])))


#: measuring keeps the plain lowering (a hand-written ``lax`` call's) unless another is faster
#: by more than this fraction: a closer win is within the noise of how a lowering timed alone
#: ranks inside a whole program (docs/design_notes.md), and it is what a user compares against
MEASURE_PLAIN_TIE = 0.10
#: ... and then the policy's unless another is faster by more than this fraction
MEASURE_TIE = 0.03

CHOOSER = Chooser("jax", IMPLEMENTATIONS, policy=_policy.policy,
                  ties=((_policy.PLAIN, MEASURE_PLAIN_TIE), (None, MEASURE_TIE)),
                  context=context, answering_for=_xla.answering_for)

#: the lowerings' names per primitive, the plain one first
LOWERINGS = {p: CHOOSER.names(p) for p in PRIMITIVES}


def choose(primitive: str, plan: ConvPlan, precision, repeats: int = 1) -> str:
    """The lowering that computes ``primitive`` for ``plan`` (see the module docstring).

    ``repeats``: the program computes that many copies of ``plan`` (a per-group lowering's
    inner problem, one per group), so it is measured when all of them together reach
    :data:`MEASURE_MIN_MACS` (ResNeXt-50's 32 groups of 4 channels: 1.8M multiply-adds
    each, where the policy's weight gradient ran 3-4x slower than the best)."""
    return CHOOSER.choose(primitive, plan, key=repr(precision),
                          measure=partial(_measurement, primitive, plan, precision, repeats))


def _measurement(primitive: str, plan: ConvPlan, precision, repeats: int,
                 default: str) -> Measurement | None:
    """What measuring ``plan`` takes (:func:`polyconv._choice.Chooser.choose`), or ``None``
    where it is not measured: too small to win anything, empty, or float64 (for checking,
    not speed)."""
    if (plan.macs * repeats < MEASURE_MIN_MACS or plan.batch == 0
            or plan.dtype == "float64"):
        return None
    return Measurement(candidates(primitive, plan, default),
                       partial(measure, primitive, plan, precision),
                       cached_only=jax.process_count() > 1)


def _worth_measuring(primitive: str, plan: ConvPlan, name: str, cpu: bool) -> bool:
    """Whether an applicable lowering is measured: exact on non-finite inputs for the plan,
    and not one that cannot win where measuring it would cost more than any choice saves
    (docs/design_notes.md has the figures): on CPU the lhs-dilated ``direct`` of a strided 3-D
    backward_data (100-400x the others) and ``folded`` on grouped plans (XLA CPU's grouped
    slow path) or on channels-first 1-D and 2-D forwards (within 10% of ``direct``: picked
    by noise); ``sliced`` below 3-D, or for a backward_data strided past its first axis;
    ``taps`` with narrow products or many taps (:func:`polyconv_jax._taps.measured`)."""
    if not (CHOOSER.get(primitive, name).exact_on_nonfinite
            or _subpixel.subpixel_is_exact(plan)):
        return False
    strided = any(s > 1 for s in plan.strides)
    if cpu and name == "direct" and primitive == "backward_data" and plan.ndim >= 3 and strided:
        return False
    if cpu and name == "folded" and (plan.groups > 1 or (
            primitive == "forward" and not plan.channels_last and plan.ndim <= 2)):
        return False
    if name == "sliced":
        return plan.ndim >= 3 and (primitive != "backward_data"
                                   or set(plan.strides[1:]) == {1})
    if name == "taps":
        contracted = {"forward": plan.a_channels, "backward_data": plan.b_channels,
                      "backward_weights": min(plan.a_channels, plan.b_channels)}[primitive]
        return _taps.measured(plan, contracted)
    return True


def candidates(primitive: str, plan: ConvPlan, default: str | None = None) -> list[str]:
    """The lowerings measured for a plan, the default pick's first: the applicable ones worth
    measuring (:func:`_worth_measuring`). On CPU a grouped weight gradient measures only
    ``depthwise`` and ``grouped`` where either applies: the others compute it with XLA CPU's
    batch-grouped convolution, 10-600x their time (seconds a call)."""
    cpu = jax.default_backend() == "cpu"
    names = [n for n in CHOOSER.applicable(primitive, plan)
             if _worth_measuring(primitive, plan, n, cpu)]
    if cpu and primitive == "backward_weights" and plan.groups > 1 and (
            {"depthwise", "grouped"} & set(names)):
        names = [n for n in names if n in ("depthwise", "grouped")]
    default = default or CHOOSER.default(primitive, plan)
    return sorted(names, key=lambda name: name != default)


# --------------------------------------------------------------------------------------------
# measuring: compile each candidate, time it
# --------------------------------------------------------------------------------------------


#: plans with fewer multiply-adds take the default policy: measuring would cost more than
#: the best lowering can save (a few milliseconds of compilation per candidate)
MEASURE_MIN_MACS = 20_000_000
#: timed rounds per measurement (each round times every remaining candidate once)
MEASURE_ROUNDS = 5
#: a candidate whose first timed call takes this many times the best so far is dropped
MEASURE_DROP_FACTOR = 3.0
#: on an accelerator each timed "call" is this many calls queued back to back, waited for
#: once (see :func:`_time`), fewer where their results would hold more than
#: :data:`MEASURE_QUEUED_BYTES` at once (large calls are not dispatch-bound anyway)
MEASURE_QUEUED_CALLS = 10
MEASURE_QUEUED_BYTES = 1 << 30


_WORKER = "polyconv-autotune"


def _inputs(primitive: str, plan: ConvPlan):
    """Random operands of the plan's shapes and dtype, on the default device."""
    rng = np.random.default_rng(0)
    return [jnp.asarray(rng.standard_normal(s, dtype=np.float32)).astype(plan.dtype)
            for s in plan.operand_shapes(primitive)]


def _time(fn, args, calls: int = 1) -> float:
    """Seconds per call of ``fn(*args)``: ``calls`` calls issued back to back, waited for
    once. On an accelerator one call of a small plan is mostly the host's dispatch and
    wait (0.1-0.2 ms on an H200, noisy, against kernels of tens of microseconds: one
    measurement there took ``im2col`` at 0.17 ms against 0.20 for ``direct``, which
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
    return jax.jit(partial(CHOOSER.get(primitive, name).run, plan, precision))


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
    # in the caller's context, so that the caller's settings (autotune, forcing)
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
