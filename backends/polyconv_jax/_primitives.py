"""The three primitives as JAX primitives, closed under differentiation and batching.

Each primitive (``forward`` ``a, W -> b``, ``backward_data`` ``b, W -> a``,
``backward_weights`` ``a, b -> W``) is bilinear, and the adjoint identities of the canonical
convolution say which primitive computes each of its cotangents (``<F(a, W), b> =
<a, D(b, W)> = <W, Wt(a, b)>``; :data:`polyconv._optable.ADJOINTS`):

==================  =========================  =========================
primitive           cotangent of 1st input     cotangent of 2nd input
==================  =========================  =========================
forward F(a, W)     D(g, W)                    Wt(a, g)
backward_data D     F(g, W)                    Wt(g, b)
backward_weights    D(b, g)                    F(a, g)
==================  =========================  =========================

So each is a JAX primitive (``polyconv_forward`` ...) whose parameters are the plan, the
precision and the chosen lowering, with the rules JAX asks of a primitive:

- **differentiation**: bilinear (``jvp`` is the primitive applied to each tangent), and the
  transpose of each input is the adjoint primitive of the table, with its own chosen
  lowering. Reverse mode therefore runs polyconv's backward primitives themselves, never JAX's
  transpose of a lowering (which lands on XLA's slow weight-gradient and lhs-dilated paths,
  or on a transposed program XLA compiles worse); a second derivative runs through the same
  rules;
- **batching** (``vmap``): the mapped axis is folded into the batch (data mapped, weights
  shared) or into the groups (anything else, the way JAX batches its own convolution), and
  the primitive runs once on the folded plan;
- **lowering**: the chosen lowering, inlined as ordinary ``lax`` operations, so ``jit``,
  sharding and export see plain StableHLO; the output's type (shape, dtype, sharding) is
  that of the traced lowering;
- **varying axes** (``shard_map``): as for JAX's own convolution, both inputs are cast to
  vary along the union of their mesh axes before the bind, so that the cotangent of a
  replicated input (weights, usually) comes back summed over the devices, replicated.

Every primitive maps operands of the plan's dtype to the accumulation dtype; a cotangent
comes back in the plan's dtype (the one rounding of each primitive's result, exact in
reverse mode, whose cotangents come in the plan's dtype). The bias is added outside, so its
gradient is JAX's reduction.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from polyconv import ConvPlan
from polyconv._optable import ADJOINTS

from . import _choice


def _compute(x, y, *, primitive: str, plan: ConvPlan, precision, lowering: str):
    """The primitive by the named lowering, in the accumulation dtype."""
    if primitive == "backward_weights" and plan.batch == 0:
        # nothing to contract: XLA would form a degenerate convolution
        return jnp.zeros(plan.weights_shape, plan.acc_dtype)
    return _choice.CHOOSER.get(primitive, lowering).run(plan, precision, x, y)


@functools.lru_cache(maxsize=4096)
def _out_aval(primitive: str, plan: ConvPlan, precision, lowering: str, x, y):
    """The output's type: that of the lowering traced on the inputs' types, so JAX's own
    rules give its sharding (explicit meshes) and varying axes (``shard_map``)."""
    def fn(x, y):
        return [_compute(x, y, primitive=primitive, plan=plan, precision=precision,
                         lowering=lowering)]

    try:
        from jax._src.interpreters.partial_eval import abstract_eval_fun

        debug = jax.api_util.debug_info("polyconv", fn, (x, y), {})
    except (ImportError, AttributeError):   # a JAX without them: shape and dtype only
        out = jax.eval_shape(lambda x, y: fn(x, y)[0], *(
            jax.ShapeDtypeStruct(v.shape, v.dtype) for v in (x, y)))
        return jax.core.ShapedArray(out.shape, out.dtype)
    (out,) = abstract_eval_fun(fn, x, y, debug_info=debug)
    return out


def _abstract_eval(primitive: str, x, y, **params):
    return _out_aval(primitive, params["plan"], params["precision"], params["lowering"], x, y)


def bind(primitive: str, plan: ConvPlan, precision, x, y):
    """Apply ``primitive`` to ``x, y`` with the lowering chosen for ``plan`` now."""
    lowering = _choice.choose(primitive, plan, precision)
    x, y = _vary_alike(x, y)
    return _PRIMITIVES[primitive].bind(x, y, plan=plan, precision=precision,
                                       lowering=lowering)


def _varying(x) -> frozenset:
    """The ``shard_map`` mesh axes along which ``x`` varies (``check_vma``)."""
    typeof = getattr(jax, "typeof", None)
    if typeof is None:          # a JAX without varying-axes types
        return frozenset()
    aval = typeof(x)
    mat = getattr(aval, "mat", None)
    return mat.varying if mat is not None else getattr(aval, "vma", frozenset())


def _vary_alike(x, y):
    """``x`` and ``y`` cast to vary along the union of their mesh axes, as JAX's own
    convolution does: the transpose of that cast sums a replicated input's cotangent over
    the devices, so each cotangent has its input's type."""
    vx, vy = _varying(x), _varying(y)
    if vx == vy:
        return x, y
    return tuple(v if vv >= vx | vy else _pvary(v, tuple((vx | vy) - vv))
                 for v, vv in ((x, vx), (y, vy)))


def _pvary(x, axes: tuple):
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(x, axes, to="varying")
    return jax.lax.pvary(x, axes)   # the JAX releases before pcast


def _transpose(primitive: str, slot: int, ct, x, y, *, plan: ConvPlan, precision, lowering):
    """The cotangent of input ``slot``: the adjoint primitive (table above) applied to the
    cotangent, rounded to the plan's dtype, and the other input."""
    del lowering
    adjoint, position = ADJOINTS[primitive][slot]
    other = y if slot == 0 else x
    g = ct.astype(other.dtype)
    args = (g, other) if position == 0 else (other, g)
    return bind(adjoint, plan, precision, *args).astype(other.dtype)


# --------------------------------------------------------------------------------------------
# batching: the mapped axis folded into the batch or the groups
# --------------------------------------------------------------------------------------------

#: per primitive: the role of each input and of the output (``"data"`` ``[N, C, ..]`` or
#: ``"weights"`` in the user's layout)
_ROLES = {"forward": ("data", "weights", "data"),
          "backward_data": ("data", "weights", "data"),
          "backward_weights": ("data", "data", "weights")}


def _fold(x, dim, size: int, axis: int):
    """``x`` with its mapped axis ``dim`` (``None``: not mapped, broadcast) merged into axis
    ``axis`` of the unmapped array, the mapped index outermost."""
    if dim is None:
        x, dim = jnp.broadcast_to(x[None], (size, *x.shape)), 0
    x = jnp.moveaxis(x, dim, axis)
    return x.reshape(*x.shape[:axis], size * x.shape[axis + 1], *x.shape[axis + 2:])


def _unfold(y, size: int, axis: int):
    """The inverse of :func:`_fold`: axis ``axis`` split, the mapped index first."""
    y = y.reshape(*y.shape[:axis], size, y.shape[axis] // size, *y.shape[axis + 1:])
    return jnp.moveaxis(y, axis, 0)


def _batch(primitive: str, args, dims, *, plan: ConvPlan, precision, lowering):
    del lowering
    x, y = args
    size = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    roles = _ROLES[primitive]
    channel = plan.channel_axis % (plan.ndim + 2)
    if size == 0:
        return jnp.zeros((0, *plan.with_(primitive=primitive).shape), plan.acc_dtype), 0
    if roles[1] == "weights" and dims[1] is None:
        # data mapped, weights shared: one call on a batch of size * N
        folded = plan.with_(batch=size * plan.batch)
        out = bind(primitive, folded, precision, _fold(x, dims[0], size, 0), y)
        return _unfold(out, size, 0), 0
    # otherwise: one call with size * G groups, each operand's channels stacked (a shared
    # data operand repeated), like JAX's batching of its own convolution
    axes = {"data": channel, "weights": plan.weights_perm[0]}
    folded = plan.with_(groups=size * plan.groups, a_channels=size * plan.a_channels,
                        b_channels=size * plan.b_channels)
    operands = [_fold(a, d, size, axes[role]) for a, d, role in zip(args, dims, roles)]
    out = bind(primitive, folded, precision, *operands)
    return _unfold(out, size, axes[roles[2]]), 0


def _make(primitive: str) -> Primitive:
    p = Primitive(f"polyconv_{primitive}")
    compute = functools.partial(_compute, primitive=primitive)
    p.def_impl(jax.jit(compute, static_argnames=("plan", "precision", "lowering")))
    p.def_abstract_eval(functools.partial(_abstract_eval, primitive))
    mlir.register_lowering(p, mlir.lower_fun(compute, multiple_results=False))
    ad.defbilinear(p, functools.partial(_transpose, primitive, 0),
                   functools.partial(_transpose, primitive, 1))
    batching.primitive_batchers[p] = functools.partial(_batch, primitive)
    return p


_PRIMITIVES = {name: _make(name) for name in ADJOINTS}


# --------------------------------------------------------------------------------------------
# the jitted entry points (plan, precision and the choice settings are static)
# --------------------------------------------------------------------------------------------


def _finish(plan: ConvPlan, y, bias, channel_axis: int):
    """Bias in the accumulation dtype, then the one rounding to ``plan.dtype``."""
    if bias is not None:
        shape = [1] * y.ndim
        shape[channel_axis] = bias.shape[0]
        y = y + bias.astype(y.dtype).reshape(shape)
    return y.astype(plan.dtype)


def _forward(plan: ConvPlan, precision, settings, a, w, bias=None):
    del settings  # part of the cache key only: the choice reads the settings in force
    return _finish(plan, bind("forward", plan, precision, a, w), bias, plan.channel_axis)


def _backward_data(plan: ConvPlan, precision, settings, b, w, bias=None):
    del settings
    return _finish(plan, bind("backward_data", plan, precision, b, w), bias, plan.channel_axis)


def _backward_weights(plan: ConvPlan, precision, settings, a, b):
    del settings
    return bind("backward_weights", plan, precision, a, b).astype(plan.dtype)


forward = jax.jit(_forward, static_argnums=(0, 1, 2))
backward_data = jax.jit(_backward_data, static_argnums=(0, 1, 2))
backward_weights = jax.jit(_backward_weights, static_argnums=(0, 1, 2))
_ENTRIES = {"forward": _forward, "backward_data": _backward_data,
            "backward_weights": _backward_weights}


def entry(plan: ConvPlan, precision, settings):
    """``plan``'s primitive as a jitted function of its arrays alone, for this precision and
    these choice settings: an eager call is then one dispatch of a cached jitted function,
    with no static arguments to hash. ``plan`` (``op`` = its primitive, no precision) is
    keyed on its geometry and dtype, so an op and its aliases share one."""
    return _entry(plan, plan.dtype, precision, settings)


@functools.lru_cache(maxsize=4096)
def _entry(plan: ConvPlan, dtype: str | None, precision, settings):
    del dtype  # part of the key only: plans compare on their geometry alone
    return jax.jit(functools.partial(_ENTRIES[plan.primitive], plan, precision, settings))


# --------------------------------------------------------------------------------------------
# inputs
# --------------------------------------------------------------------------------------------


def x64_enabled() -> bool:
    """Whether JAX keeps float64 (``jax_enable_x64``, including context overrides)."""
    return jax.dtypes.canonicalize_dtype(np.float64) == np.dtype(np.float64)


def prepare(plan: ConvPlan, *arrays):
    """Check the dtype against JAX's x64 mode; numpy (or other) inputs become JAX arrays."""
    if plan.dtype == "float64" and not x64_enabled():
        msg = (f"{plan.op}: float64 inputs need 64-bit mode in JAX, which is off (JAX would "
               f"silently compute in float32). Enable it with "
               f"jax.config.update('jax_enable_x64', True) or JAX_ENABLE_X64=1, or pass "
               f"float32 inputs")
        raise TypeError(msg)
    out = []
    for x in arrays:
        if x is None or isinstance(x, jax.Array):  # jax.Array covers tracers too
            out.append(x)
        else:
            dtype = getattr(x, "dtype", None)
            if isinstance(dtype, np.dtype) and not dtype.isnative:
                x = np.asarray(x, dtype.newbyteorder("="))  # JAX takes native byte order only
            out.append(jnp.asarray(x))
    return out
