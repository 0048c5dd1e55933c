"""The resolved description of one call: :class:`ConvPlan`.

Backends see only plans: the canonical convolution (docs/semantics.md#canonical-convolution)
with every pad, size and layout fixed, made by :func:`polyconv._geometry.resolve`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, fields

from ._optable import Primitive


@dataclass(frozen=True)
class ConvPlan:
    """A fully resolved call: the canonical convolution plus the user's layouts
    (docs/semantics.md#canonical-convolution).

    The canonical convolution maps a *large* tensor ``a`` ``[N, Ca, A..]`` to a *small* tensor
    ``b`` ``[N, Cb, B..]`` with weights ``W`` ``[Cb, Ca/G, K..]``::

        b[n, o, y] = sum_{i, k} a[n, g*Ca/G + i, y*s + k*d - pb] * W[o, i, k],  g = o // (Cb/G)

    ``primitive`` says which of ``forward`` (a, W -> b), ``backward_data`` (b, W -> a) and
    ``backward_weights`` (a, b -> W) the op is. Pads are resolved per axis on ``a``.

    Plans compare and hash on the geometry alone: ``op``, ``dtype``, ``precision``,
    ``has_bias`` and the format strings (for messages and reports) are left out, so an op and
    its alias, or two dtypes of one layer, are one key of a per-plan cache. So is
    ``output_padding``, which the sizes imply (a strided Convolution whose size rule leaves
    rows past its last product has 0 in its own plan and those rows in
    ``convolution_backward_data``'s: one geometry, one plan). :attr:`key` adds the dtype.

    Attributes
    ----------
    op : str
        The public function name, used in messages.
    primitive : {"forward", "backward_data", "backward_weights"}
    batch, a_channels, b_channels, groups : int
    a_spatial, b_spatial, kernel : tuple of int
    strides, dilations, pads_begin, pads_end : tuple of int
        Resolved per spatial axis; ``pads_*`` apply to the large tensor ``a``.
    output_padding : tuple of int
        The extra rows of ``a`` past the last product (0 for the forward-direction ops):
        ``A = s*(B-1) + ek - pb - pe + output_padding``.
    channels_last : bool
        ``True`` for ``NXC`` data, ``False`` for ``NCX``; ``a`` and ``b`` share it.
    weights_perm : tuple of int
        Axes of the user's weights in canonical order: ``transpose(weights, weights_perm)``
        is ``W`` ``[Cb, Ca/G, K..]``. Its inverse gives the user layout back.
    data_format, weights_format : str
        The canonical format strings (for reports).
    dtype : str or None
        Name of the common floating dtype of the inputs (``None`` from :func:`infer_shape`).
    has_bias : bool
    precision : object
        Backend precision request, as the caller passed it (JAX normalises it);
        ``None`` means the contract's default: full precision (:ref:`accumulation`).
    """

    op: str = field(compare=False)
    primitive: Primitive
    batch: int
    a_channels: int
    b_channels: int
    groups: int
    a_spatial: tuple[int, ...]
    b_spatial: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    output_padding: tuple[int, ...] = field(compare=False)
    channels_last: bool
    weights_perm: tuple[int, ...]
    data_format: str = field(compare=False)
    weights_format: str = field(compare=False)
    dtype: str | None = field(default=None, compare=False)
    has_bias: bool = field(default=False, compare=False)
    precision: object = field(default=None, compare=False)

    # --- derived numbers -------------------------------------------------------------------
    @functools.cached_property
    def key(self) -> str:
        """The geometry and dtype as text: the key of a choice made for this plan (the same
        for an op and its alias, and for a primitive and the gradient that computes it)."""
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self)
                        if f.compare) + f",dtype={self.dtype}"

    @property
    def ndim(self) -> int:
        """Number of spatial axes."""
        return len(self.kernel)

    @property
    def acc_dtype(self) -> str:
        """Accumulation dtype name (docs/numerics.md#accumulation)."""
        return "float64" if self.dtype == "float64" else "float32"

    @property
    def macs(self) -> int:
        """Multiply-adds of the canonical convolution (padding included)."""
        return (self.batch * math.prod(self.b_spatial) * self.b_channels
                * (self.a_channels // self.groups) * math.prod(self.kernel))

    @property
    def effective_kernel(self) -> tuple[int, ...]:
        """``(k-1)*d + 1`` per axis."""
        return tuple((k - 1) * d + 1 for k, d in zip(self.kernel, self.dilations))

    def _data_shape(self, channels: int, spatial: tuple[int, ...]) -> tuple[int, ...]:
        if self.channels_last:
            return (self.batch, *spatial, channels)
        return (self.batch, channels, *spatial)

    @property
    def a_shape(self) -> tuple[int, ...]:
        """Shape of the large tensor in the user's data layout."""
        return self._data_shape(self.a_channels, self.a_spatial)

    @property
    def b_shape(self) -> tuple[int, ...]:
        """Shape of the small tensor in the user's data layout."""
        return self._data_shape(self.b_channels, self.b_spatial)

    @property
    def w_shape(self) -> tuple[int, ...]:
        """Canonical weights shape ``[Cb, Ca/G, K..]``."""
        return (self.b_channels, self.a_channels // self.groups, *self.kernel)

    @property
    def weights_shape(self) -> tuple[int, ...]:
        """Weights shape in the user's ``weights_format``."""
        out = [0] * len(self.weights_perm)
        for canon_axis, user_axis in enumerate(self.weights_perm):
            out[user_axis] = self.w_shape[canon_axis]
        return tuple(out)

    @property
    def weights_inverse_perm(self) -> tuple[int, ...]:
        """Axes that turn canonical ``W`` back into the user's weights layout."""
        inv = [0] * len(self.weights_perm)
        for canon_axis, user_axis in enumerate(self.weights_perm):
            inv[user_axis] = canon_axis
        return tuple(inv)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the op's output, in the user's layout."""
        if self.primitive == "forward":
            return self.b_shape
        if self.primitive == "backward_data":
            return self.a_shape
        return self.weights_shape

    def operand_shapes(self, primitive: str | None = None) -> tuple[tuple[int, ...], ...]:
        """The shapes of a primitive's two operands (default: the plan's own), in the user's
        layouts: ``a`` and the weights for forward, ``b`` and the weights for backward_data,
        ``a`` and ``b`` for backward_weights."""
        return {"forward": (self.a_shape, self.weights_shape),
                "backward_data": (self.b_shape, self.weights_shape),
                "backward_weights": (self.a_shape, self.b_shape)}[primitive or self.primitive]

    @property
    def bias_channels(self) -> int:
        """Length of the bias vector: the channels of the output tensor."""
        return self.b_channels if self.primitive == "forward" else self.a_channels

    @property
    def channel_axis(self) -> int:
        """Channel axis of the data tensors."""
        return self.ndim + 1 if self.channels_last else 1

    @property
    def spatial_axes(self) -> tuple[int, ...]:
        """Spatial axes of the data tensors."""
        start = 1 if self.channels_last else 2
        return tuple(range(start, start + self.ndim))

    def __repr__(self) -> str:
        # The answer first (what infer_shape is called for), then the canonical description.
        head = ("shape", "pads_begin", "pads_end", "output_padding")
        items = [(name, getattr(self, name)) for name in head]
        items += [(f.name, getattr(self, f.name)) for f in fields(self) if f.name not in head]
        return f"ConvPlan({', '.join(f'{name}={value!r}' for name, value in items)})"

    def __hash__(self) -> int:
        # the generated hash of the compared fields, computed once: plans key the per-plan
        # caches of every call (a repeated call's dictionary lookups hash the same plan)
        try:
            return self.__dict__["_hash"]
        except KeyError:
            value = hash(tuple(getattr(self, f.name) for f in fields(self) if f.compare))
            object.__setattr__(self, "_hash", value)
            return value

    def __getstate__(self) -> dict:
        # a string's hash differs between processes: a pickled plan hashes afresh
        state = dict(self.__dict__)
        state.pop("_hash", None)
        return state

    def with_(self, **changes) -> ConvPlan:
        """A copy with some fields replaced."""
        from dataclasses import replace

        return replace(self, **changes)
