"""The one place where attributes and shapes become numbers.

Every public op is resolved here, from shapes alone, into a :class:`ConvPlan`: the canonical
convolution (docs/semantics.md#canonical-convolution) with every pad, size and layout already
fixed. Backends see only plans;
they never see ``"same_upper"``, a weight format string or a shape they must check.

Nothing in this module touches an array: it is pure Python on tuples of ints, so
:func:`polyconv.infer_shape` and the ops share one code path and raise the same errors.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass, field

from ._optable import Family, OpSpec, Primitive

AUTO_PADS = ("none", "same_upper", "same_lower", "valid")
_AUTO_PAD_ALIASES = {"none": "none", "explicit": "none", "notset": "none",
                     "same_upper": "same_upper", "same_lower": "same_lower", "valid": "valid"}
DATA_FORMATS = ("NXC", "NCX")
WEIGHTS_FORMATS = ("XIO", "OIX", "IOX", "XOI")


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
    its alias, or two dtypes of one layer, are one key of a per-plan cache.

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
    output_padding: tuple[int, ...]
    channels_last: bool
    weights_perm: tuple[int, ...]
    data_format: str = field(compare=False)
    weights_format: str = field(compare=False)
    dtype: str | None = field(default=None, compare=False)
    has_bias: bool = field(default=False, compare=False)
    precision: object = field(default=None, compare=False)

    # --- derived numbers -------------------------------------------------------------------
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
        from dataclasses import fields

        head = ("shape", "pads_begin", "pads_end", "output_padding")
        items = [(name, getattr(self, name)) for name in head]
        items += [(f.name, getattr(self, f.name)) for f in fields(self) if f.name not in head]
        return f"ConvPlan({', '.join(f'{name}={value!r}' for name, value in items)})"

    def with_(self, **changes) -> ConvPlan:
        """A copy with some fields replaced."""
        from dataclasses import replace

        return replace(self, **changes)


# --------------------------------------------------------------------------------------------
# attribute parsing
# --------------------------------------------------------------------------------------------


def _fmt(values) -> str:
    return repr(tuple(values)) if isinstance(values, (list, tuple)) else repr(values)


def _as_int(op: str, name: str, value) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        msg = f"{op}: {name} must be an integer; got {name}={value!r} ({type(value).__name__})"
        raise TypeError(msg)
    return _concrete(op, name, value, lambda: operator.index(value))


def _concrete(op: str, name: str, value, convert):
    """``convert()``, with a clear error where ``value`` is traced (a JAX array under jit):
    geometry is resolved when the call is made, so it must be known then."""
    try:
        return convert()
    except TypeError as e:
        from ._backends import concretization_errors  # the backends name their errors

        if not isinstance(e, concretization_errors()):
            raise
        msg = (f"{op}: {name} must be concrete (known when the call is traced: under jax.jit, "
               f"a static argument or a Python value); got a traced value")
        raise TypeError(msg) from None


def parse_ints(op: str, name: str, value, ndim: int) -> tuple[int, ...]:
    """An int (broadcast) or a sequence of ``ndim`` ints."""
    if isinstance(value, (str, bytes)) or value is None:
        msg = (f"{op}: {name} must be an integer or a sequence of {ndim} integers; "
               f"got {name}={value!r}")
        raise TypeError(msg)
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple)):
        value = _concrete(op, name, value, value.tolist)  # numpy/JAX/torch ints
        if not isinstance(value, list):
            value = [value] * ndim
    elif hasattr(value, "__index__") and not isinstance(value, bool):
        return (_concrete(op, name, value, lambda: operator.index(value)),) * ndim
    if not isinstance(value, Sequence):
        msg = (f"{op}: {name} must be an integer or a sequence of {ndim} integers; "
               f"got {name}={value!r} ({type(value).__name__})")
        raise TypeError(msg)
    items = tuple(value)
    for item in items:
        if isinstance(item, bool) or not hasattr(item, "__index__"):
            msg = (f"{op}: {name} must contain integers only; got {name}={items!r}")
            raise TypeError(msg)
    items = _concrete(op, name, value, lambda: tuple(operator.index(i) for i in items))
    if len(items) != ndim:
        msg = (f"{op}: {name} must have one entry per spatial axis ({ndim}, from the data "
               f"rank); got {name}={items!r} with {len(items)} entries")
        raise ValueError(msg)
    return items


def _is_empty(value) -> bool:
    if isinstance(value, (list, tuple)):
        return not value
    return not isinstance(value, (str, bytes)) and getattr(value, "shape", None) == (0,)


def _parse_pads(op: str, name: str, value, ndim: int, auto_pad: str) -> tuple[int, ...]:
    """``pads_begin``/``pads_end``: as :func:`parse_ints`, and empty where ``auto_pad``
    computes the pads (oneDNN's own calls pass ``[]`` with ``auto_pad="SAME_UPPER"``)."""
    if _is_empty(value):
        if auto_pad != "none":
            return (0,) * ndim
        msg = (f"{op}: {name} must have one entry per spatial axis ({ndim}, from the data "
               f"rank); got {name}=() with 0 entries (empty pads are accepted only where "
               f"auto_pad computes them: 'same_upper', 'same_lower' or 'valid')")
        raise ValueError(msg)
    return parse_ints(op, name, value, ndim)


def _check_min(op: str, name: str, values: tuple[int, ...], lo: int) -> None:
    if any(v < lo for v in values):
        rule = "positive" if lo == 1 else "non-negative"
        msg = f"{op}: {name} must be {rule} (>= {lo}) per axis; got {name}={values!r}"
        raise ValueError(msg)


#: ``precision`` names (case-insensitive) -> the ``jax.lax.Precision`` member each means
PRECISION_NAMES = {
    "default": "DEFAULT", "fastest": "DEFAULT", "bfloat16": "DEFAULT",
    "high": "HIGH", "tensorfloat32": "HIGH", "bfloat16_3x": "HIGH",
    "highest": "HIGHEST", "float32": "HIGHEST",
}


def check_precision(op: str, precision) -> None:
    """``precision`` is None, a name of :data:`PRECISION_NAMES`, a ``jax.lax.Precision``, or a
    pair of these for (input, weights). Checked for every backend
    (docs/semantics.md#validation), though only
    backends with precision modes (JAX) use it: the others always compute at full precision.
    """
    def one(value) -> bool:
        if isinstance(value, str):
            return value.lower() in PRECISION_NAMES
        kind = type(value)
        return kind.__name__ == "Precision" and kind.__module__.startswith("jax")

    if precision is None:
        return
    pair = isinstance(precision, (tuple, list))
    if (all(one(p) for p in precision) and len(precision) == 2) if pair else one(precision):
        return
    msg = (f"{op}: precision must be None (full precision), a jax.lax.Precision, one of "
           f"{', '.join(map(repr, PRECISION_NAMES))} (case-insensitive), or a pair of "
           f"these for (input, weights); got precision={precision!r}")
    raise ValueError(msg)


def parse_choice(op: str, name: str, value, accepted: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        msg = (f"{op}: {name} must be a string, one of {', '.join(map(repr, accepted))}; "
               f"got {name}={value!r} ({type(value).__name__})")
        raise TypeError(msg)
    canon = value.upper()
    if canon not in accepted:
        msg = (f"{op}: unknown {name} {value!r}; accepted values are "
               f"{', '.join(map(repr, accepted))}")
        raise ValueError(msg)
    return canon


def parse_auto_pad(op: str, value) -> str:
    if value is None:
        return "none"
    if not isinstance(value, str):
        msg = (f"{op}: auto_pad must be a string, one of {', '.join(map(repr, AUTO_PADS))}; "
               f"got auto_pad={value!r} ({type(value).__name__})")
        raise TypeError(msg)
    canon = _AUTO_PAD_ALIASES.get(value.lower())
    if canon is None:
        msg = (f"{op}: unknown auto_pad {value!r}; accepted values are "
               f"{', '.join(map(repr, AUTO_PADS))} (case-insensitive; 'explicit' = 'none')")
        raise ValueError(msg)
    return canon


def _shape(op: str, name: str, shape) -> tuple[int, ...]:
    try:
        dims = tuple(shape)
    except TypeError:
        msg = f"{op}: {name} must be a shape (a sequence of integers); got {shape!r}"
        raise TypeError(msg) from None
    for dim in dims:
        if isinstance(dim, bool) or not hasattr(dim, "__index__"):
            msg = f"{op}: {name} must be a shape (a sequence of integers); got {shape!r}"
            raise TypeError(msg)
    return _concrete(op, name, shape, lambda: tuple(operator.index(d) for d in dims))


# --------------------------------------------------------------------------------------------
# layouts
# --------------------------------------------------------------------------------------------


def _split_data(op: str, name: str, shape: tuple[int, ...], channels_last: bool):
    n = shape[0]
    if channels_last:
        return n, shape[-1], shape[1:-1]
    return n, shape[1], shape[2:]


def _weights_axes(fmt: str, ndim: int) -> dict[str, object]:
    """Positions of O, I and the spatial axes for a weights format of rank ``ndim + 2``."""
    axes: dict[str, object] = {}
    pos = 0
    for letter in fmt:
        if letter == "X":
            axes["X"] = tuple(range(pos, pos + ndim))
            pos += ndim
        else:
            axes[letter] = pos
            pos += 1
    return axes


def _weights_perm(fmt: str, ndim: int, family: Family) -> tuple[int, ...]:
    axes = _weights_axes(fmt, ndim)
    cb, ca = ("O", "I") if family == "convolution" else ("I", "O")
    return (axes[cb], axes[ca], *axes["X"])


_AXIS_MEANING = {"convolution": {"O": "OC", "I": "IC/groups"},
                 "conv_transpose": {"O": "OC/groups", "I": "IC"}}


def _weights_meaning(family: Family, fmt: str) -> str:
    names = {**_AXIS_MEANING[family], "X": "K.."}
    return ", ".join(names[letter] for letter in fmt)


#: The weights format of each family that goes with channels-first data in PyTorch and ONNX
#: (and with channels-last data in TensorFlow and JAX): tried first by the layout hint.
_USUAL_WEIGHTS = {("convolution", "NCX"): "OIX", ("convolution", "NXC"): "XIO",
                  ("conv_transpose", "NCX"): "IOX", ("conv_transpose", "NXC"): "XOI"}


def _channels_fit(family: Family, primitive: str, data: dict[str, tuple[int, ...]],
                  order: tuple[str, str], weights: tuple[int, ...] | None, groups: int,
                  data_format: str, weights_format: str) -> bool:
    """Whether the data and weights channels agree when read in these formats.

    ``data`` holds the full data shapes by name; ``order`` names the (large, small) data
    inputs of a backward-weights op, or (first, first) otherwise; ``weights`` is the full
    weights shape, ``None`` when only the kernel sizes are known.
    """
    def channels(name: str) -> int:
        shape = data[name]
        return shape[-1] if data_format == "NXC" else shape[1]

    ndim = len(next(iter(data.values()))) - 2
    if weights is not None:
        perm = _weights_perm(weights_format, ndim, family)
        w_cb, w_ca = weights[perm[0]], weights[perm[1]]
    if primitive == "backward_weights":
        a, b = channels(order[0]), channels(order[1])
    elif primitive == "forward":
        a, b = channels(order[0]), w_cb
    else:
        a, b = w_ca * groups, channels(order[0])
    if a % groups or b % groups or min(a, b) < 1:
        return False
    return weights is None or (w_cb, w_ca) == (b, a // groups)


def _layout_hint(family: Family, primitive: str, data: dict[str, tuple[int, ...]],
                 order: tuple[str, str], weights: tuple[int, ...] | None, groups: int,
                 data_format: str, weights_format: str) -> str:
    """How the data was read and, where other formats make the channels agree, which."""
    channels_last = data_format == "NXC"
    axis = len(data[order[0]]) - 1 if channels_last else 1
    read = (f"the data is read as {data_format} "
            f"({'[N, X.., C], channels last' if channels_last else '[N, C, X..], channels first'}"
            f"{', the default' if channels_last else ''}), so its channels are "
            f"{', '.join(f'{n}.shape[{axis}]={data[n][axis]}' for n in dict.fromkeys(order))}")
    # The other data layout with its usual weights (the PyTorch user's NCX + OIX/IOX), the
    # other data layout alone, then the other weights formats, the usual ones first.
    other = "NCX" if channels_last else "NXC"
    candidates = [(other, weights_format)]
    if weights is not None:
        def usual_first(fmt: str) -> list[str]:
            usual = _USUAL_WEIGHTS[family, fmt]
            return sorted(WEIGHTS_FORMATS, key=lambda f: f != usual)

        candidates = [(other, _USUAL_WEIGHTS[family, other]), *candidates]
        candidates += [(data_format, f) for f in usual_first(data_format)]
        candidates += [(other, f) for f in usual_first(other)]
    candidates = [c for c in dict.fromkeys(candidates) if c != (data_format, weights_format)]
    for dfmt, wfmt in candidates:
        if _channels_fit(family, primitive, data, order, weights, groups, dfmt, wfmt):
            changes = []
            if dfmt != data_format:
                changes.append(f"data_format={dfmt!r}")
            if wfmt != weights_format:
                changes.append(f"weights_format={wfmt!r}")
            torch = (" (channels-first data and PyTorch's weights layout)"
                     if dfmt == "NCX" and wfmt == _USUAL_WEIGHTS[family, "NCX"] else "")
            return (f"{read}. These shapes fit {', '.join(changes)}{torch}: if that is how "
                    f"they are laid out, pass {' and '.join(changes)}")
    return read


# --------------------------------------------------------------------------------------------
# geometry formulas (docs/semantics.md#geometry)
# --------------------------------------------------------------------------------------------


def _same_total_forward(a: int, s: int, ek: int) -> int:
    """Rule F: total pad so that ``B = ceil(A / s)``."""
    return max((math.ceil(a / s) - 1) * s + ek - a, 0)


def _same_total_transposed(s: int, ek: int) -> int:
    """Rule T: total pad independent of sizes, so that ``A = s*B + output_padding``."""
    return max(ek - s, 0)


def _split_total(total: int, auto_pad: str) -> tuple[int, int]:
    if auto_pad == "same_upper":
        pb = total // 2
        return pb, total - pb
    pe = total // 2
    return total - pe, pe


def _resolve_pads(auto_pad, rule, large, strides, eks, pads_begin, pads_end):
    """Per-axis pads. ``rule`` is ``"F"`` (needs ``large``) or ``"T"``."""
    if auto_pad == "none":
        return pads_begin, pads_end
    if auto_pad == "valid":
        zeros = (0,) * len(strides)
        return zeros, zeros
    pbs, pes = [], []
    for i, (s, ek) in enumerate(zip(strides, eks)):
        if rule == "F":
            total = _same_total_forward(large[i], s, ek)
        else:
            total = _same_total_transposed(s, ek)
        pb, pe = _split_total(total, auto_pad)
        pbs.append(pb)
        pes.append(pe)
    return tuple(pbs), tuple(pes)


def _forward_size(op, a_spatial, strides, eks, pb, pe, what: str) -> tuple[int, ...]:
    """``B = floor((A + pb + pe - ek) / s) + 1``; an empty output is an error."""
    out = []
    for i, (a, s, ek, b0, e0) in enumerate(zip(a_spatial, strides, eks, pb, pe)):
        if a + b0 + e0 < ek:
            msg = (f"{op}: the output would be empty on spatial axis {i}: {what} size {a} + "
                   f"pads {b0}+{e0} is smaller than the dilated kernel extent {ek} "
                   f"((kernel-1)*dilation+1); got {what} spatial={tuple(a_spatial)}, "
                   f"pads_begin={tuple(pb)}, pads_end={tuple(pe)}, "
                   f"effective kernel={tuple(eks)}")
            raise ValueError(msg)
        out.append((a + b0 + e0 - ek) // s + 1)
    return tuple(out)


def _transposed_size(op, b_spatial, strides, eks, pb, pe, opad, what: str) -> tuple[int, ...]:
    """``A = s*(B-1) + ek - pb - pe + output_padding``; ``A < 1`` is an error."""
    out = tuple(s * (b - 1) + ek - p0 - p1 + o
                for b, s, ek, p0, p1, o in zip(b_spatial, strides, eks, pb, pe, opad))
    if any(a < 1 for a in out):
        msg = (f"{op}: the {what} would be empty: s*(B-1) + ek - pads_begin - pads_end + "
               f"output_padding = {out} (< 1) with B={tuple(b_spatial)}, strides="
               f"{tuple(strides)}, effective kernel={tuple(eks)}, pads_begin={tuple(pb)}, "
               f"pads_end={tuple(pe)}, output_padding={tuple(opad)}")
        raise ValueError(msg)
    return out


def _implied_output_padding(a_spatial, b_spatial, strides, eks, pb, pe) -> tuple[int, ...]:
    return tuple(a - (s * (b - 1) + ek - p0 - p1)
                 for a, b, s, ek, p0, p1 in zip(a_spatial, b_spatial, strides, eks, pb, pe))


# --------------------------------------------------------------------------------------------
# the resolver
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Attrs:
    """Raw keyword attributes of one call, before resolution."""

    strides: object = 1
    pads_begin: object = 0
    pads_end: object = 0
    dilations: object = 1
    auto_pad: object = "none"
    output_padding: object = 0
    groups: object = 1
    data_format: object = "NXC"
    weights_format: object = "XIO"


@dataclass(frozen=True)
class _Data:
    """The data inputs of a call, read in its data format."""

    spec: OpSpec
    data_format: str
    first: str                                  # the first data input, the rank reference
    shapes: dict[str, tuple[int, ...]]          # full shapes by input name
    ndim: int

    @property
    def op(self) -> str:
        return self.spec.name

    @property
    def channels_last(self) -> bool:
        return self.data_format == "NXC"

    def batch(self, name: str) -> int:
        return self.shapes[name][0]

    def channels(self, name: str) -> int:
        return self.shapes[name][-1 if self.channels_last else 1]

    def spatial(self, name: str) -> tuple[int, ...]:
        shape = self.shapes[name]
        return shape[1:-1] if self.channels_last else shape[2:]

    def no_batch(self) -> str:
        layout = "[N, X.., C]" if self.channels_last else "[N, C, X..]"
        return (f"if {self.first} lacks its batch axis, add one ({self.first}[None]): the "
                f"data must be {layout} ({self.data_format}), batch first")


@dataclass(frozen=True)
class _Numbers:
    """The numeric attributes, parsed and range-checked."""

    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    output_padding: tuple[int, ...]
    groups: int


def resolve(spec: OpSpec, shapes: dict[str, tuple[int, ...] | None], attrs: Attrs,
            *, dst_shape=None, weights_shape=None) -> ConvPlan:
    """Resolve one call of the op ``spec`` into a :class:`ConvPlan`.

    ``shapes`` holds the input shapes by argument name (``src``/``diff_dst``/``weights``/
    ``bias``), ``None`` for an absent optional input. The steps run in the order a reader
    checks a call: formats, data shapes and rank, numeric attributes, weights and channels,
    spatial sizes and pads, bias. Each raises the op's own error for what it finds wrong.
    """
    op = spec.name
    data_format = parse_choice(op, "data_format", attrs.data_format, DATA_FORMATS)
    weights_format = parse_choice(op, "weights_format", attrs.weights_format, WEIGHTS_FORMATS)
    auto_pad = parse_auto_pad(op, attrs.auto_pad)
    data = _read_data(spec, shapes, data_format)
    nums = _read_numbers(data, attrs, auto_pad)
    a_channels, b_channels, kernel = _read_weights(data, nums.groups, weights_format,
                                                   shapes.get("weights"), weights_shape)
    eks = tuple((k - 1) * d + 1 for k, d in zip(kernel, nums.dilations))
    size = _transposed_sizes if spec.primitive == "backward_data" else _forward_sizes
    a_sp, b_sp, pb, pe, opad = size(data, nums, eks, auto_pad, kernel, a_channels, dst_shape)
    bias = shapes.get("bias")
    if bias is not None:
        _check_bias(op, bias, b_channels if spec.primitive == "forward" else a_channels)
    return ConvPlan(
        op=op, primitive=spec.primitive, batch=data.batch(data.first), a_channels=a_channels,
        b_channels=b_channels, groups=nums.groups, a_spatial=a_sp, b_spatial=b_sp,
        kernel=kernel, strides=nums.strides, dilations=nums.dilations, pads_begin=pb,
        pads_end=pe, output_padding=opad, channels_last=data.channels_last,
        weights_perm=_weights_perm(weights_format, data.ndim, spec.family),
        data_format=data_format, weights_format=weights_format, has_bias=bias is not None,
    )


def _read_data(spec: OpSpec, shapes, data_format: str) -> _Data:
    """The data shapes: rank >= 3, one rank for all, a channel and a position per axis."""
    op = spec.name
    names = [name for name in ("src", "diff_dst") if shapes.get(name) is not None]
    first = names[0]
    first_shape = _shape(op, first, shapes[first])
    data = _Data(spec, data_format, first, {first: first_shape}, len(first_shape) - 2)
    if len(first_shape) < 3:
        msg = (f"{op}: {first} must have rank >= 3 ([N, C, X..] or [N, X.., C], at least one "
               f"spatial axis); got {first}.shape={first_shape}; {data.no_batch()}")
        raise ValueError(msg)
    for name in names:
        shape = _shape(op, name, shapes[name])
        if len(shape) != data.ndim + 2:
            msg = (f"{op}: {name} must have the same rank as {first} ({data.ndim + 2}); got "
                   f"{first}.shape={first_shape}, {name}.shape={shape}")
            raise ValueError(msg)
        data.shapes[name] = shape
        if data.channels(name) < 1 or any(x < 1 for x in data.spatial(name)):
            msg = (f"{op}: {name} must have at least one channel and a non-empty spatial "
                   f"extent ({data_format}); got {name}.shape={shape}")
            raise ValueError(msg)
    return data


def _read_numbers(data: _Data, attrs: Attrs, auto_pad: str) -> _Numbers:
    """strides, dilations, pads, output_padding and groups, with their ranges."""
    op, ndim = data.op, data.ndim
    nums = _Numbers(
        strides=parse_ints(op, "strides", attrs.strides, ndim),
        dilations=parse_ints(op, "dilations", attrs.dilations, ndim),
        pads_begin=_parse_pads(op, "pads_begin", attrs.pads_begin, ndim, auto_pad),
        pads_end=_parse_pads(op, "pads_end", attrs.pads_end, ndim, auto_pad),
        output_padding=parse_ints(op, "output_padding", attrs.output_padding, ndim),
        groups=_as_int(op, "groups", attrs.groups),
    )
    for name, lo in (("strides", 1), ("dilations", 1), ("pads_begin", 0), ("pads_end", 0),
                     ("output_padding", 0)):
        _check_min(op, name, getattr(nums, name), lo)
    if nums.groups < 1:
        msg = f"{op}: groups must be a positive integer; got groups={nums.groups}"
        raise ValueError(msg)
    if any(o >= s for o, s in zip(nums.output_padding, nums.strides)):
        msg = (f"{op}: output_padding must be in [0, stride) per axis; got "
               f"output_padding={nums.output_padding}, strides={nums.strides}")
        raise ValueError(msg)
    return nums


def _read_weights(data: _Data, groups: int, weights_format: str, weights, weights_shape):
    """``(a_channels, b_channels, kernel)`` from the weights (an array's shape, or the
    ``weights_shape`` of a backward-weights op) and the data channels, checked together."""
    spec, op, ndim = data.spec, data.op, data.ndim
    read_as = (f"{data.first}.shape={data.shapes[data.first]} gives {ndim} spatial "
               f"{'axis' if ndim == 1 else 'axes'}; {data.no_batch()}")
    if spec.primitive == "backward_weights":
        given = _weights_from_shape_arg(op, weights_shape, ndim, weights_format, read_as)
        a_channels, b_channels = data.channels(spec.large), data.channels(spec.small)
    else:
        given = _shape(op, "weights", weights)
        if len(given) != ndim + 2:
            msg = (f"{op}: weights must have rank {ndim + 2} ({weights_format}, matching "
                   f"{data.first}.shape={data.shapes[data.first]}); got weights.shape={given}"
                   f"{'; ' + read_as if len(given) == ndim + 3 else ''}")
            raise ValueError(msg)
        a_channels = b_channels = None
    full = None if given[0] == "spatial" else given

    def layout_hint() -> str:
        order = ((spec.large, spec.small) if spec.primitive == "backward_weights"
                 else (data.first, data.first))
        return _layout_hint(spec.family, spec.primitive, data.shapes, order, full, groups,
                            data.data_format, weights_format)

    if full is None:
        kernel = given[1]
        _check_groups(op, groups, a_channels, b_channels, spec.large, spec.small, layout_hint)
    else:
        perm = _weights_perm(weights_format, ndim, spec.family)
        kernel = tuple(full[i] for i in perm[2:])
        w_cb, w_ca = full[perm[0]], full[perm[1]]
        if spec.primitive == "forward":
            a_channels, b_channels = data.channels(data.first), w_cb
        elif spec.primitive == "backward_data":
            a_channels, b_channels = w_ca * groups, data.channels(data.first)
        _check_weights_channels(data, weights_format, full, (w_cb, w_ca), groups,
                                (a_channels, b_channels), layout_hint)
    if any(k < 1 for k in kernel):
        msg = f"{op}: kernel sizes must be positive; got kernel spatial sizes {kernel}"
        raise ValueError(msg)
    return a_channels, b_channels, tuple(kernel)


def _check_weights_channels(data: _Data, weights_format, full, w_channels, groups, channels,
                            layout_hint) -> None:
    """The weights' two channel axes against the data channels."""
    spec, op = data.spec, data.op
    (w_cb, w_ca), (a_channels, b_channels) = w_channels, channels
    meaning = _weights_meaning(spec.family, weights_format)
    wname = "weights_shape" if spec.primitive == "backward_weights" else "weights.shape"
    if w_cb < 1 or w_ca < 1:
        msg = (f"{op}: {wname}={full} must have at least one channel on each channel "
               f"axis ({weights_format} weights are [{meaning}])")
        raise ValueError(msg)
    _check_groups(op, groups, a_channels, b_channels, spec.large, spec.small, layout_hint)
    ic, oc = ((a_channels, b_channels) if spec.family == "convolution"
              else (b_channels, a_channels))
    role_cb, role_ca = ("O", "I") if spec.family == "convolution" else ("I", "O")
    axis = _AXIS_MEANING[spec.family]
    wrong = [f"the {role} axis ({axis[role]}) must be {want}, got {got}"
             for role, want, got in ((role_cb, b_channels, w_cb),
                                     (role_ca, a_channels // groups, w_ca))
             if want != got]
    if wrong:
        msg = (f"{op}: {wname}={full} does not match the data channels: {weights_format} "
               f"weights are [{meaning}] and here IC={ic}, OC={oc}, groups={groups}, so "
               f"{'; '.join(wrong)}; {layout_hint()}")
        raise ValueError(msg)


def _forward_sizes(data: _Data, nums: _Numbers, eks, auto_pad, kernel, a_channels,
                   dst_shape):
    """Forward and backward weights: the large size is given; pads by rule F (Convolution
    family) or T (ConvTranspose family), the small size follows. ``output_padding`` is refused
    by the Convolution family and must agree with the sizes in the ConvTranspose family."""
    del a_channels, dst_shape
    spec, op = data.spec, data.op
    a_sp = data.spatial(spec.large)
    rule = "F" if spec.family == "convolution" else "T"
    pb, pe = _resolve_pads(auto_pad, rule, a_sp, nums.strides, eks, nums.pads_begin,
                           nums.pads_end)
    b_sp = _forward_size(op, a_sp, nums.strides, eks, pb, pe, spec.large)
    if spec.primitive == "backward_weights":
        _check_small_given(data, b_sp, nums, kernel, pb, pe)
    if spec.family == "convolution":
        _no_output_padding(op, nums.output_padding)
        return a_sp, b_sp, pb, pe, (0,) * data.ndim
    opad = _implied_output_padding(a_sp, b_sp, nums.strides, eks, pb, pe)
    _consistent_output_padding(op, nums.output_padding, opad, spec.large, a_sp)
    return a_sp, b_sp, pb, pe, opad


def _check_small_given(data: _Data, b_sp, nums: _Numbers, kernel, pb, pe) -> None:
    """A backward-weights op is given both data tensors: batch and sizes must agree."""
    spec, op = data.spec, data.op
    large, small = spec.large, spec.small
    if data.batch(large) != data.batch(small):
        msg = (f"{op}: {large} and {small} must have the same batch size; got "
               f"{large}.shape={data.shapes[large]}, {small}.shape={data.shapes[small]}")
        raise ValueError(msg)
    if data.spatial(small) != b_sp:
        what = "convolution" if spec.family == "convolution" else "ConvTranspose"
        msg = (f"{op}: {small} spatial sizes {data.spatial(small)} do not match the {what} of "
               f"{large} spatial sizes {data.spatial(large)}, which gives {b_sp} with strides="
               f"{nums.strides}, dilations={nums.dilations}, kernel={kernel}, pads_begin={pb}, "
               f"pads_end={pe}")
        raise ValueError(msg)


def _transposed_sizes(data: _Data, nums: _Numbers, eks, auto_pad, kernel, a_channels,
                      dst_shape):
    """Backward data: the small size is given; the large size comes from ``dst_shape`` (pads
    by rule F on it) or from the transposed formula (pads by rule T)."""
    del kernel
    spec, op = data.spec, data.op
    b_sp = data.spatial(spec.small)
    if dst_shape is None:
        pb, pe = _resolve_pads(auto_pad, "T", None, nums.strides, eks, nums.pads_begin,
                               nums.pads_end)
        a_sp = _transposed_size(op, b_sp, nums.strides, eks, pb, pe, nums.output_padding,
                                spec.large)
        return a_sp, b_sp, pb, pe, nums.output_padding
    a_sp = _large_from_dst_shape(op, dst_shape, data.ndim, data.channels_last,
                                 data.batch(data.first), a_channels, data.data_format)
    pb, pe = _resolve_pads(auto_pad, "F", a_sp, nums.strides, eks, nums.pads_begin,
                           nums.pads_end)
    _check_dst_shape(op, a_sp, b_sp, nums.strides, eks, pb, pe, auto_pad, spec.small)
    opad = _implied_output_padding(a_sp, b_sp, nums.strides, eks, pb, pe)
    _consistent_output_padding(op, nums.output_padding, opad, "dst_shape", a_sp)
    return a_sp, b_sp, pb, pe, opad


def _check_bias(op: str, bias, channels: int) -> None:
    shape = _shape(op, "bias", bias)
    if shape != (channels,):
        msg = (f"{op}: bias must have shape (OC,) = ({channels},), one value per output "
               f"channel; got bias.shape={shape}")
        raise ValueError(msg)


def _check_groups(op, groups, a_channels, b_channels, large_name, small_name, layout_hint):
    if a_channels % groups or b_channels % groups:
        msg = (f"{op}: groups must divide both channel counts; got groups={groups}, "
               f"{large_name} channels={a_channels}, {small_name} channels={b_channels}; "
               f"{layout_hint()}")
        raise ValueError(msg)


def _no_output_padding(op, output_padding):
    if any(output_padding):
        msg = (f"{op}: output_padding is not accepted by this op (it belongs to the "
               f"transposed direction); got output_padding={output_padding}")
        raise ValueError(msg)


def _consistent_output_padding(op, given, implied, what, a_sp):
    """A non-zero ``output_padding`` must equal the one the shapes imply."""
    if any(given) and tuple(given) != tuple(implied):
        msg = (f"{op}: output_padding={tuple(given)} contradicts the {what} spatial sizes "
               f"{tuple(a_sp)}, which imply output_padding={tuple(implied)}")
        raise ValueError(msg)


def _weights_from_shape_arg(op, weights_shape, ndim, fmt, read_as):
    if weights_shape is None:
        msg = (f"{op}: weights_shape is required (the full {fmt} weights shape, or the "
               f"{ndim} spatial kernel sizes)")
        raise TypeError(msg)
    shp = _shape(op, "weights_shape", weights_shape)
    if len(shp) == ndim:
        return ("spatial", shp)
    if len(shp) == ndim + 2:
        return shp
    msg = (f"{op}: weights_shape must be the full weights shape ({ndim + 2} entries, "
           f"{fmt}) or the spatial kernel sizes ({ndim} entries); got weights_shape={shp}"
           f"{'; ' + read_as if len(shp) == ndim + 3 else ''}")
    raise ValueError(msg)


def _large_from_dst_shape(op, dst_shape, ndim, channels_last, batch, channels, data_format):
    shp = _shape(op, "dst_shape", dst_shape)
    if len(shp) == ndim:
        spatial = shp
    elif len(shp) == ndim + 2:
        n, c, spatial = _split_data(op, "dst_shape", shp, channels_last)
        if n != batch or c != channels:
            msg = (f"{op}: dst_shape {shp} ({data_format}) must have batch {batch} and "
                   f"{channels} channels (from the inputs and groups); got batch {n}, "
                   f"channels {c}")
            raise ValueError(msg)
    else:
        msg = (f"{op}: dst_shape must be the full output shape ({ndim + 2} entries, "
               f"{data_format}) or the spatial sizes only ({ndim} entries); got dst_shape={shp}")
        raise ValueError(msg)
    if any(x < 1 for x in spatial):
        msg = f"{op}: dst_shape spatial sizes must be positive; got dst_shape={shp}"
        raise ValueError(msg)
    return tuple(spatial)


def _check_dst_shape(op, a_sp, b_sp, strides, eks, pb, pe, auto_pad, small_name):
    """``dst_shape`` must be reachable: the forward conv of it gives back ``b``."""
    bad = []
    for i, (a, b, s, ek, p0, p1) in enumerate(zip(a_sp, b_sp, strides, eks, pb, pe)):
        if auto_pad in ("same_upper", "same_lower"):
            ok = math.ceil(a / s) == b
            lo, hi = s * (b - 1) + 1, s * b
        else:
            ok = a + p0 + p1 >= ek and (a + p0 + p1 - ek) // s + 1 == b
            lo = s * (b - 1) + ek - p0 - p1
            lo, hi = max(lo, 1), lo + s - 1
        if not ok:
            bad.append(f"axis {i}: {a} not in [{lo}, {hi}]")
    if bad:
        msg = (f"{op}: dst_shape spatial sizes {tuple(a_sp)} cannot be reached from "
               f"{small_name} spatial sizes {tuple(b_sp)} with strides={tuple(strides)}, "
               f"effective kernel={tuple(eks)}, pads_begin={tuple(pb)}, pads_end={tuple(pe)} "
               f"(auto_pad={auto_pad!r}); reachable sizes: {'; '.join(bad)}")
        raise ValueError(msg)
