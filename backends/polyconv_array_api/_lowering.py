"""The three primitives (docs/semantics.md#canonical-convolution) in the Python array API
standard.

Everything here is a function of the standard, reached through
``array_api_compat.array_namespace``: no item assignment, no in-place updates, no
library-specific array calls. New arrays are created on the input's device.

Internal layout
    Data tensors are worked on as ``[G, N, S.., C/G]`` (groups first, channels last): per
    kernel tap, one strided slice of the spatial axes, reshaped to ``[G, N*prod(S), C/G]``, is
    multiplied by the tap's ``[G, C/G, C'/G]`` weight matrix in one batched ``matmul`` (the
    groups are the batch axis). The user's layout is converted once on the way in and once on
    the way out (``permute_dims`` + ``reshape``).

forward (a, W -> b)
    ``b = sum_k slice_k(pad(a)) @ W_k``: the large tensor is zero-padded (``concat``) or
    cropped once to exactly the window the taps read, then every tap is a strided slice.

backward_data (b, W -> a)
    Polyphase: position ``p = x + pb`` of the padded large tensor receives tap ``k`` from
    ``b[y]`` where ``p = y*s + k*d``. Writing ``k*d = q*s + r`` (``0 <= r < s``), tap ``k``
    feeds only phase ``r`` (the positions ``p = m*s + r``), at phase index ``m = y + q``. So
    each phase is a stride-1 correlation of the once-padded ``b`` (one slice + one matmul per
    tap, no wasted products on inserted zeros), and the phases are interleaved with
    ``stack`` + ``reshape`` (zero phases where no tap lands, when ``s > (K-1)*d + 1``). Only
    the phase indices that land inside ``a`` are computed; output_padding rows past the last
    product come out as zeros (bias only).

backward_weights (a, b -> W)
    ``W_k = b^T @ slice_k(pad(a))`` per tap, contracting over batch and space in one matmul,
    then ``stack`` over taps.

Numerics (docs/numerics.md#accumulation): inputs are cast to the accumulation dtype (float32,
or float64 for float64)
first, the sum over taps is kept in it, bias is added in it, and the result is cast to the input
dtype once at the end.

The only library-specific code is :func:`_precision`: inside a call on JAX arrays, float32
matmuls run with ``jax.default_matmul_precision("highest")`` (unless the caller passes
``precision=``), because JAX's default precision on GPU/TPU uses TF32/bf16 passes that the contract
forbids. PyTorch's float32 matmul is full precision by default.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from typing import TYPE_CHECKING, Any

import array_api_compat

from polyconv._phases import phases

if TYPE_CHECKING:
    from polyconv import Samples
    from polyconv._geometry import ConvPlan

_ALL = slice(None)


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _setup(plan: ConvPlan, *arrays: Any) -> tuple[Any, Any, Any]:
    """Namespace, device and accumulation dtype of one call."""
    present = [x for x in arrays if x is not None]
    try:
        xp = array_api_compat.array_namespace(*present)
    except TypeError:
        # Reached with backend="array_api" forced on arrays of several libraries (the inferred
        # path refuses them earlier, in polyconv._backends.infer_backend).
        types = ", ".join(f"{type(x).__module__}.{type(x).__qualname__}" for x in present)
        msg = (f"{plan.op}: the array_api backend needs every array input from one array-API "
               f"namespace; got {types}. Convert them to one library first")
        raise TypeError(msg) from None
    device = array_api_compat.device(present[0])
    acc = getattr(xp, plan.acc_dtype)
    return xp, device, acc


def _precision(xp: Any, plan: ConvPlan) -> contextlib.AbstractContextManager:
    """Full-precision float32 matmuls on JAX (its default allows TF32/bf16 passes on GPU/TPU)."""
    if not array_api_compat.is_jax_namespace(xp):
        return contextlib.nullcontext()
    import jax

    level = plan.precision
    if isinstance(level, (tuple, list)):
        level = level[0] if level else None
    if level is None:
        level = "highest"
    elif not isinstance(level, str):
        level = getattr(level, "name", str(level)).lower()  # e.g. jax.lax.Precision.HIGHEST
    return jax.default_matmul_precision(level)


def _astype(xp: Any, x: Any, dtype: Any) -> Any:
    return x if x.dtype == dtype else xp.astype(x, dtype)


def _window(xp: Any, x: Any, axis: int, lo: int, length: int, device: Any) -> Any:
    """``x[lo : lo + length]`` along ``axis``, reading zeros outside ``[0, n)``.

    Zero padding and cropping in one, with ``concat`` (no item assignment).
    """
    n = x.shape[axis]
    if lo == 0 and length == n:
        return x
    start = min(max(lo, 0), n)
    stop = min(max(lo + length, 0), n)
    kept = max(stop - start, 0)
    before = min(max(-lo, 0), length)
    after = length - before - kept

    def zeros(size: int) -> Any:
        shape = list(x.shape)
        shape[axis] = size
        return xp.zeros(tuple(shape), dtype=x.dtype, device=device)

    parts = []
    if before:
        parts.append(zeros(before))
    if kept:
        index = [_ALL] * x.ndim
        index[axis] = slice(start, stop)
        parts.append(x[tuple(index)])
    if after:
        parts.append(zeros(after))
    return parts[0] if len(parts) == 1 else xp.concat(parts, axis=axis)


def _to_groups(xp: Any, x: Any, plan: ConvPlan, channels: int,
               spatial: tuple[int, ...], acc: Any) -> Any:
    """User-layout data (``NXC`` or ``NCX``) -> ``[G, N, S.., C/G]`` in ``acc``."""
    g, n, d = plan.groups, plan.batch, plan.ndim
    x = _astype(xp, x, acc)
    if plan.channels_last:
        x = xp.reshape(x, (n, *spatial, g, channels // g))
        axes = (d + 1, 0, *range(1, d + 1), d + 2)
    else:
        x = xp.reshape(x, (n, g, channels // g, *spatial))
        axes = (1, 0, *range(3, d + 3), 2)
    return xp.permute_dims(x, axes)


def _from_groups(xp: Any, y: Any, plan: ConvPlan, channels: int,
                 spatial: tuple[int, ...]) -> Any:
    """``[G, N, S.., C/G]`` -> the user's data layout."""
    n, d = plan.batch, plan.ndim
    if plan.channels_last:
        y = xp.permute_dims(y, (1, *range(2, d + 2), 0, d + 2))
        return xp.reshape(y, (n, *spatial, channels))
    y = xp.permute_dims(y, (1, 0, d + 2, *range(2, d + 2)))
    return xp.reshape(y, (n, channels, *spatial))


def _weight_taps(xp: Any, w: Any, plan: ConvPlan, acc: Any, *, a_to_b: bool) -> Any:
    """User-layout weights -> ``[K.., G, Ca/G, Cb/G]`` (``a_to_b``) or ``[K.., G, Cb/G, Ca/G]``.

    ``result[(*k, ...)]`` is tap ``k``'s batched matrix (the trailing ellipsis is required by
    the standard for partial multi-axis indexing).
    """
    g, d = plan.groups, plan.ndim
    w = xp.permute_dims(_astype(xp, w, acc), plan.weights_perm)      # [Cb, Ca/G, K..]
    w = xp.reshape(w, (g, plan.b_channels // g, plan.a_channels // g, *plan.kernel))
    taps = tuple(range(3, 3 + d))
    return xp.permute_dims(w, (*taps, 0, 2, 1) if a_to_b else (*taps, 0, 1, 2))


def _padded_large(xp: Any, x: Any, plan: ConvPlan, device: Any) -> Any:
    """Pad/crop the grouped large tensor to exactly the window the taps read."""
    for j, (b, s, ek, pb) in enumerate(zip(plan.b_spatial, plan.strides,
                                           plan.effective_kernel, plan.pads_begin)):
        x = _window(xp, x, 2 + j, -pb, (b - 1) * s + ek, device)
    return x


def _tap_slices(plan: ConvPlan):
    """Each kernel tap with the index of its strided slice of :func:`_padded_large`."""
    for k in itertools.product(*(range(kk) for kk in plan.kernel)):
        index = tuple(slice(kj * d, kj * d + (b - 1) * s + 1, s)
                      for kj, d, b, s in zip(k, plan.dilations, plan.b_spatial, plan.strides))
        yield k, (_ALL, _ALL, *index, _ALL)


def _finish(xp: Any, y: Any, plan: ConvPlan, bias: Any, acc: Any, dtype: Any) -> Any:
    """Add the bias over the channel axis (in ``acc``), then round once to ``dtype``."""
    if bias is not None:
        bias = _astype(xp, bias, acc)
        if not plan.channels_last:
            bias = xp.reshape(bias, (bias.shape[0], *(1,) * plan.ndim))
        y = y + bias
    return _astype(xp, y, dtype)


# --------------------------------------------------------------------------------------------
# the backend
# --------------------------------------------------------------------------------------------


class ArrayAPIBackend:
    """The generic backend: any array-API namespace, through array-api-compat."""

    name = "array_api"

    def __repr__(self) -> str:
        return "<polyconv backend 'array_api'>"

    def describe(self) -> dict[str, Any]:
        """Facts for ``polyconv backends`` (see :class:`polyconv.BackendHooks`): the versions
        of the array-API libraries installed here that the tests feed it."""
        import importlib.util
        from importlib.metadata import PackageNotFoundError, version

        versions = {}
        for dist in ("array_api_strict", "torch"):
            if importlib.util.find_spec(dist) is not None:
                with contextlib.suppress(PackageNotFoundError):
                    versions[dist] = version(dist)
        return {"versions": versions, "devices": "those of the input arrays"}

    def samples(self, dtype: str) -> Samples:
        """array-api-strict arrays (float32/float64, when installed) for
        :func:`polyconv.compare`, else numpy arrays."""
        import importlib.util

        from polyconv import Samples

        if dtype in ("float32", "float64") and importlib.util.find_spec("array_api_strict"):
            import array_api_strict
            import numpy as np

            return Samples("array_api_strict", array_api_strict.asarray,
                           to_numpy=lambda y: np.from_dlpack(y).astype(np.float64))
        from polyconv._backends import NUMPY_SAMPLES

        return NUMPY_SAMPLES

    def forward(self, plan: ConvPlan, a: Any, w: Any, bias: Any = None) -> Any:
        """``a`` ``[N, Ca, A..]``, weights -> ``b`` ``[N, Cb, B..]`` (+ bias over Cb)."""
        xp, device, acc = _setup(plan, a, w, bias)
        g = plan.groups
        cg, cbg = plan.a_channels // g, plan.b_channels // g
        m = plan.batch * math.prod(plan.b_spatial)
        with _precision(xp, plan):
            x = _padded_large(xp, _to_groups(xp, a, plan, plan.a_channels, plan.a_spatial,
                                              acc), plan, device)
            wt = _weight_taps(xp, w, plan, acc, a_to_b=True)
            out = None
            for k, index in _tap_slices(plan):
                t = xp.matmul(xp.reshape(x[index], (g, m, cg)), wt[(*k, ...)])
                out = t if out is None else out + t
        out = xp.reshape(out, (g, plan.batch, *plan.b_spatial, cbg))
        y = _from_groups(xp, out, plan, plan.b_channels, plan.b_spatial)
        return _finish(xp, y, plan, bias, acc, a.dtype)

    def backward_data(self, plan: ConvPlan, b: Any, w: Any, bias: Any = None) -> Any:
        """``b`` ``[N, Cb, B..]``, weights -> ``a`` ``[N, Ca, A..]`` (+ bias over Ca)."""
        xp, device, acc = _setup(plan, b, w, bias)
        g, n, d = plan.groups, plan.batch, plan.ndim
        cg, cbg = plan.a_channels // g, plan.b_channels // g
        strides = plan.strides
        geometry = phases(plan)
        # Per axis: phase cells q_lo .. q_lo+rows-1 cover the padded positions [pb, pb + A).
        m0 = tuple(ax.q_lo for ax in geometry.axes)
        length = tuple(ax.rows for ax in geometry.axes)
        qmax = tuple(ax.max_shift for ax in geometry.axes)
        m = n * math.prod(length)

        with _precision(xp, plan):
            y = _to_groups(xp, b, plan, plan.b_channels, plan.b_spatial, acc)
            for j in range(d):  # b[y] for y in [m0 - qmax, m0 + L), zeros outside
                y = _window(xp, y, 2 + j, m0[j] - qmax[j], length[j] + qmax[j], device)
            wt = _weight_taps(xp, w, plan, acc, a_to_b=False)
            parts: dict[tuple[int, ...], Any] = {}
            for tap in geometry.taps:
                index = tuple(slice(qm - qj, qm - qj + lj)
                              for qm, qj, lj in zip(qmax, tap.shift, length))
                window = xp.reshape(y[(_ALL, _ALL, *index, _ALL)], (g, m, cbg))
                t = xp.matmul(window, wt[(*tap.k, ...)])
                r = tap.phase
                parts[r] = t if r not in parts else parts[r] + t

        leaf_shape = (g, n, *length, cg)

        def interleave(prefix: tuple[int, ...], j: int) -> Any:
            if j == d:
                if prefix in parts:
                    return xp.reshape(parts[prefix], leaf_shape)
                return xp.zeros(leaf_shape, dtype=acc, device=device)
            pieces = [interleave((*prefix, r), j + 1) for r in range(strides[j])]
            if len(pieces) == 1:
                return pieces[0]
            stacked = xp.stack(pieces, axis=3 + j)         # [.., L_j, s_j, ..]
            shape = stacked.shape
            return xp.reshape(stacked, (*shape[:2 + j], shape[2 + j] * shape[3 + j],
                                        *shape[4 + j:]))

        full = interleave((), 0)                            # positions m0*s .. (m0+L)*s - 1
        crop = tuple(slice(ax.crop, ax.crop + ax.size) for ax in geometry.axes)
        x = _from_groups(xp, full[(_ALL, _ALL, *crop, _ALL)], plan, plan.a_channels,
                         plan.a_spatial)
        return _finish(xp, x, plan, bias, acc, b.dtype)

    def backward_weights(self, plan: ConvPlan, a: Any, b: Any) -> Any:
        """``a``, ``b`` -> weights in the user's ``weights_format``."""
        xp, device, acc = _setup(plan, a, b)
        g = plan.groups
        cg, cbg = plan.a_channels // g, plan.b_channels // g
        m = plan.batch * math.prod(plan.b_spatial)
        with _precision(xp, plan):
            x = _padded_large(xp, _to_groups(xp, a, plan, plan.a_channels, plan.a_spatial,
                                              acc), plan, device)
            y = _to_groups(xp, b, plan, plan.b_channels, plan.b_spatial, acc)
            yt = xp.permute_dims(xp.reshape(y, (g, m, cbg)), (0, 2, 1))   # [G, Cb/G, M]
            taps = [xp.matmul(yt, xp.reshape(x[index], (g, m, cg)))
                    for _, index in _tap_slices(plan)]                     # [G, Cb/G, Ca/G]
        wk = xp.stack(taps, axis=-1)                                        # [.., prod(K)]
        wk = xp.reshape(wk, plan.w_shape)                                   # [Cb, Ca/G, K..]
        wk = _astype(xp, wk, a.dtype)
        return xp.permute_dims(wk, plan.weights_inverse_perm)


BACKEND = ArrayAPIBackend()
