"""The ``taps`` lowerings: one matrix product per kernel tap, over only the rows it reads; and
``matmul_overlap_add``: one product for all taps first, then each tap's block laid at the rows
it writes (forward, and backward_data's GEMM + col2im).

Tap ``k`` of an ungrouped convolution adds ``a[i*s + k*d - pb] @ W_k`` to output row ``i``
(``W_k``: the tap's ``[Ca, Cb]`` weights). Where ``i*s + k*d - pb`` falls in the padding the
product is zero, so each tap is one product over the output rows whose reads fall inside
``a`` (its *region*, per axis a run ``lo <= i < hi``), a strided slice of ``a`` as it lies; a
tap that reads only padding does no work. The taps' products are padded to the whole output
and added in the accumulation dtype (one fused loop). backward_data is the transpose (each
tap's product of ``b``'s region with ``W_k``'s transpose, laid on the rows of ``a`` it
writes, ``s - 1`` zeros between them) and backward_weights contracts each tap's slice of
``a`` with ``b``'s region.

Nothing is gathered: each tap reads its slice once and multiplies, so it pays where the
products are wide (many channels to contract) and where the padding holds much of what a
convolution would multiply: DeepLabV3's ASPP 3x3 at dilation 12 on 33x33 (2048 -> 256
channels) reads padding in 43% of its taps' rows. On 2 CPUs (jaxlib 0.10.2) its forward took
37-40 ms against 80-87 for the plain convolution (PyTorch 42); a 1x1 256 -> 64 forward 2.7
ms against 6.1; a 3x3 64 -> 64 8.3 against 6.8, 20.5 against 9.4 channels first. So it is
measured where the contracted side has :data:`TAPS_MIN_CHANNELS` channels or more.
"""

from __future__ import annotations

import itertools
import math

import jax.numpy as jnp
from jax import lax

from polyconv import ConvPlan
from polyconv._choice import Implementation

from ._common import _interleave, _phase_shape, _phases
from ._xla import add_all

#: the ``taps`` lowerings are measured from this many channels on the contracted side
#: (:func:`measured`): with fewer, each tap's product is too narrow to pay for its pass over
#: the output
TAPS_MIN_CHANNELS = 128
#: ... and up to this many taps (each is one more product to compile)
TAPS_MAX = 27


def regions(plan: ConvPlan):
    """``(tap, [(lo, hi, start)] per axis)`` for each tap (row-major) that reads ``a``
    somewhere: output rows ``lo <= i < hi`` read rows ``start + (i - lo)*s`` of ``a``."""
    for tap in itertools.product(*(range(k) for k in plan.kernel)):
        axes = []
        for k, s, d, pb, size, rows in zip(tap, plan.strides, plan.dilations, plan.pads_begin,
                                           plan.a_spatial, plan.b_spatial):
            lo = max(0, -(-(pb - k * d) // s))
            hi = min(rows, -(-(size + pb - k * d) // s))
            axes.append((lo, hi, lo * s + k * d - pb))
        if all(lo < hi for lo, hi, _ in axes):
            yield tap, axes


def measured(plan: ConvPlan, channels: int) -> bool:
    """Whether the ``taps`` lowering of a primitive contracting ``channels`` is measured."""
    return (plan.groups == 1 and channels >= TAPS_MIN_CHANNELS
            and sum(1 for _ in regions(plan)) <= TAPS_MAX)


def _slice(plan: ConvPlan, x, axes, strides):
    """Rows ``start + s*j`` (``j < hi - lo``) of ``x`` on each spatial axis."""
    start, limit, step = [0] * x.ndim, list(x.shape), [1] * x.ndim
    for ax, (lo, hi, st), s in zip(plan.spatial_axes, axes, strides):
        start[ax], limit[ax], step[ax] = st, st + (hi - lo - 1) * s + 1, s
    return lax.slice(x, start, limit, step)


def _product(plan: ConvPlan, precision, x, m):
    """``x``'s channels (user layout) times ``m`` (``[C, C']``), in the accumulation dtype:
    ``[N, R.., C']`` channels last, ``[C', N, R..]`` channels first (contracted as it lies)."""
    acc = plan.acc_dtype
    if x.dtype != acc:      # exact: products of 16-bit values are exact in float32
        x, m = x.astype(acc), m.astype(acc)
    if plan.channels_last:
        return lax.dot_general(x, m, (((x.ndim - 1,), (0,)), ((), ())), precision=precision,
                               preferred_element_type=acc)
    return lax.dot_general(m, x, (((0,), (1,)), ((), ())), precision=precision,
                           preferred_element_type=acc)


def _place(plan: ConvPlan, y, axes_pads):
    """Product ``y`` (:func:`_product`'s layout) padded on its spatial axes."""
    zero = [(0, 0, 0)] * y.ndim
    first = 1 if plan.channels_last else 2
    for i, pad in enumerate(axes_pads):
        zero[first + i] = pad
    return lax.pad(y, jnp.zeros((), y.dtype), zero)


def _total(plan: ConvPlan, parts, shape):
    """The sum of the taps' placed products (zeros of ``shape`` for none), in the user's
    layout."""
    total = add_all(parts)
    if total is None:
        total = jnp.zeros(shape, plan.acc_dtype)
    return total if plan.channels_last else jnp.moveaxis(total, 0, 1)


def _output_pads(plan: ConvPlan, axes):
    """The zeros around a tap's output rows ``lo <= i < hi`` that make them ``b``'s."""
    return [(lo, rows - hi, 0) for (lo, hi, _), rows in zip(axes, plan.b_spatial)]


def _canonical(plan: ConvPlan, w):
    return jnp.transpose(w, plan.weights_perm)                  # [Cb, Ca, K..]


def forward(plan: ConvPlan, precision, a, w):
    """Each tap's slice of ``a`` times its ``[Ca, Cb]`` weights, padded to ``b``, summed."""
    wc = _canonical(plan, w)
    parts = (_place(plan, _product(plan, precision, _slice(plan, a, axes, plan.strides),
                                   wc[(slice(None), slice(None), *tap)].T),
                    _output_pads(plan, axes))
             for tap, axes in regions(plan))
    n, cb = plan.batch, plan.b_channels
    return _total(plan, parts, (n, *plan.b_spatial, cb) if plan.channels_last
                  else (cb, n, *plan.b_spatial))


def forward_overlap_add(plan: ConvPlan, precision, a, w):
    """Multiply first (``matmul_overlap_add``): all of ``a``'s rows times every tap's weights
    at once (``[Ca, T*Cb]``, one product), then each tap's block of that product at the rows it
    reads (strided), padded to ``b`` and summed. For a narrow output side (``T*Cb`` columns
    against ``Ca`` contracted) this reads ``a`` once, where ``taps`` slices it once per tap
    and ``im2col`` copies it ``T`` times; the rows of ``a`` no tap reads are
    multiplied too (``s`` times the products of the definition per strided axis), and
    dropped: it pays without a stride (a space-to-depth problem: :mod:`._space_to_depth`).
    Ungrouped plans only."""
    wc = _canonical(plan, w)                                    # [Cb, Ca, K..]
    m = jnp.transpose(wc, (1, *range(2, plan.ndim + 2), 0)).reshape((plan.a_channels, -1))
    y = _product(plan, precision, a, m)      # [N, A.., T*Cb] or [T*Cb, N, A..]
    c, cb = (y.ndim - 1 if plan.channels_last else 0), plan.b_channels
    taps = {tap: t for t, tap in enumerate(itertools.product(*(range(k) for k in plan.kernel)))}
    parts = []
    for tap, axes in regions(plan):
        block = lax.slice_in_dim(y, taps[tap] * cb, (taps[tap] + 1) * cb, axis=c)
        parts.append(_place(plan, _slice(plan, block, axes, plan.strides),
                            _output_pads(plan, axes)))
    n = plan.batch
    return _total(plan, parts, (n, *plan.b_spatial, cb) if plan.channels_last
                  else (cb, n, *plan.b_spatial))


def backward_data(plan: ConvPlan, precision, b, w):
    """Each tap's region of ``b`` times its ``[Cb, Ca]`` weights, laid on the rows of ``a``
    it writes (``s - 1`` zeros between them), summed."""
    wc = _canonical(plan, w)
    parts = []
    for tap, axes in regions(plan):
        y = _product(plan, precision, _slice(plan, b, [(lo, hi, lo) for lo, hi, _ in axes],
                                             (1,) * plan.ndim),
                     wc[(slice(None), slice(None), *tap)])
        parts.append(_place(plan, y, [(st, size - st - (hi - lo - 1) * s - 1, s - 1)
                                      for (lo, hi, st), s, size in zip(
                                          axes, plan.strides, plan.a_spatial)]))
    n, ca = plan.batch, plan.a_channels
    return _total(plan, parts, (n, *plan.a_spatial, ca) if plan.channels_last
                  else (ca, n, *plan.a_spatial))


def backward_weights(plan: ConvPlan, precision, a, b):
    """Per tap, its slice of ``a`` contracted with ``b``'s region over the batch and the
    rows (``[Cb, Ca]``); taps that read only padding are zeros."""
    acc = plan.acc_dtype
    c = plan.channel_axis
    rest = [i for i in range(a.ndim) if i != c]
    found = {}
    for tap, axes in regions(plan):
        x = _slice(plan, a, axes, plan.strides)
        y = _slice(plan, b, [(lo, hi, lo) for lo, hi, _ in axes], (1,) * plan.ndim)
        if x.dtype != acc:
            x, y = x.astype(acc), y.astype(acc)
        found[tap] = lax.dot_general(y, x, ((rest, rest), ((), ())), precision=precision,
                                     preferred_element_type=acc)
    zero = jnp.zeros((plan.b_channels, plan.a_channels), acc)
    taps = [found.get(tap, zero) for tap in itertools.product(*(range(k) for k in plan.kernel))]
    wc = jnp.stack(taps, axis=-1).reshape((plan.b_channels, plan.a_channels, *plan.kernel))
    return jnp.transpose(wc, plan.weights_inverse_perm)


def _matmul_overlap_add(plan: ConvPlan, precision, b, w):
    """Multiply first, then overlap-add (GEMM + col2im), for a narrow output side.

    One matrix product of ``b`` (``[rows, Cb]``) with every tap's weights at once
    (``[Cb, Ca*prod(K)]``) gives each input row's contribution to every tap; each output phase
    is then the sum of its taps' shifted slices of that product (one fused XLA loop per
    phase), interleaved. Nothing is gathered before the product, so when ``Ca*prod(K)`` is
    small (few output channels: an image or volume decoder's last layer) this reads ``b``
    once where the phase lowerings copy it once per tap; with one tap per phase (k2 s2) it is
    the product and one interleaving copy. Ungrouped plans only.

    Channels-first data is multiplied as it lies, weights first (``[K.., Ca, Cb] @ [Cb, N,
    B..]``), so the product comes out channels-first too: no transposition of ``b`` or of the
    product (U-Net's 128 -> 64 k2 s2 up-convolution: 3.0 ms against 4.8 ms with ``b`` as the
    left operand).
    """
    axes = _phases(plan)
    nd = plan.ndim
    ca, cb = plan.a_channels, plan.b_channels
    wc = jnp.transpose(w, plan.weights_perm)                    # [Cb, Ca, K..]
    if plan.channels_last:
        wm = wc.reshape((cb, ca * math.prod(plan.kernel)))
        y = lax.dot_general(b, wm, (((plan.channel_axis,), (0,)), ((), ())),
                            precision=precision, preferred_element_type=plan.acc_dtype)
        y = y.reshape((plan.batch, *plan.b_spatial, ca, *plan.kernel))   # [N, B.., Ca, K..]
        spatial, taps = range(1, nd + 1), range(nd + 2, 2 * nd + 2)
    else:
        wm = jnp.transpose(wc, (*range(2, nd + 2), 1, 0)).reshape((-1, cb))
        y = lax.dot_general(wm, b, (((1,), (1,)), ((), ())),
                            precision=precision, preferred_element_type=plan.acc_dtype)
        y = y.reshape((*plan.kernel, ca, plan.batch, *plan.b_spatial))   # [K.., Ca, N, B..]
        spatial, taps = range(nd + 2, 2 * nd + 2), range(nd)
    config = [(0, 0, 0)] * y.ndim
    for ax, p in zip(spatial, axes):
        config[ax] = (*p.window_pads, 0)
    y = lax.pad(y, jnp.zeros((), y.dtype), config)
    parts = {}
    for r in itertools.product(*(range(p.stride) for p in axes)):
        total = None
        for tap in itertools.product(*(zip(p.taps[ri], p.phase_shifts[ri])
                                       for p, ri in zip(axes, r))):
            start, limit = [0] * y.ndim, list(y.shape)
            for ax, p, (_, m) in zip(spatial, axes, tap):
                start[ax], limit[ax] = p.max_shift - m, p.max_shift - m + p.rows
            for ax, (k, _) in zip(taps, tap):
                start[ax], limit[ax] = k, k + 1
            term = lax.slice(y, start, limit)
            term = term.reshape(tuple(n for i, n in enumerate(term.shape) if i not in taps))
            total = term if total is None else total + term
        if total is None:
            parts[r] = jnp.zeros(_phase_shape(plan, axes), plan.acc_dtype)
        elif plan.channels_last:
            parts[r] = total
        else:
            parts[r] = jnp.moveaxis(total, 0, 1)                 # [Ca, N, R..] -> [N, Ca, R..]
    return _interleave(plan, axes, parts)


def ungrouped(plan: ConvPlan) -> bool:
    return plan.groups == 1


def overlap_add_forward_applies(plan: ConvPlan) -> bool:
    """Ungrouped, several taps, and a product no wider than ``a``."""
    taps = math.prod(plan.kernel)
    return plan.groups == 1 and taps > 1 and taps * plan.b_channels <= plan.a_channels


FORWARD = Implementation("taps", "forward", forward, applies=ungrouped)
FORWARD_OVERLAP_ADD = Implementation("matmul_overlap_add", "forward", forward_overlap_add,
                                     applies=overlap_add_forward_applies)
BACKWARD_DATA = Implementation("taps", "backward_data", backward_data, applies=ungrouped)
BACKWARD_DATA_OVERLAP_ADD = Implementation("matmul_overlap_add", "backward_data",
                                           _matmul_overlap_add, applies=ungrouped)
BACKWARD_WEIGHTS = Implementation("taps", "backward_weights", backward_weights,
                                  applies=ungrouped)
