"""The one place where attributes and shapes become numbers.

Every public op is resolved here, from shapes alone, into a :class:`ConvPlan`: the canonical
convolution (docs/semantics.md#canonical-convolution) with every pad, size and layout already
fixed. Backends see only plans; they never see ``"same_upper"``, a weight format string or a
shape they must check. The attribute parsers live in :mod:`polyconv._attributes`, the layout
rules in :mod:`polyconv._layouts`, the plan itself in :mod:`polyconv._plan`.

Nothing in this module touches an array: it is pure Python on tuples of ints, so
:func:`polyconv.infer_shape` and the ops share one code path and raise the same errors.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._attributes import (
    AUTO_PADS,
    DATA_FORMATS,
    PRECISION_NAMES,
    WEIGHTS_FORMATS,
    check_min,
    check_precision,
    parse_auto_pad,
    parse_choice,
    parse_int,
    parse_ints,
    parse_pads,
    parse_shape,
)
from ._hints import output_padding_rewrite
from ._layouts import AXIS_MEANING, layout_message, split_data, weights_meaning, weights_perm
from ._limits import INDEX_LIMITS, IndexLimits, check_limits
from ._optable import OpSpec
from ._plan import ConvPlan

# re-exported: the backends and the package read these here
__all__ = ["AUTO_PADS", "DATA_FORMATS", "PRECISION_NAMES", "WEIGHTS_FORMATS", "Attrs",
           "ConvPlan", "check_precision", "resolve"]


# --------------------------------------------------------------------------------------------
# geometry formulas (docs/semantics.md#geometry)
# --------------------------------------------------------------------------------------------


def _same_total_forward(a: int, s: int, ek: int) -> int:
    """Rule F: total pad so that ``B = ceil(A / s)`` (integers only: exact at any size)."""
    return max((-(-a // s) - 1) * s + ek - a, 0)


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
            *, dst_shape=None, weights_shape=None,
            limits: IndexLimits = INDEX_LIMITS) -> ConvPlan:
    """Resolve one call of the op ``spec`` into a :class:`ConvPlan`.

    ``shapes`` holds the input shapes by argument name (``src``/``diff_dst``/``weights``/
    ``bias``), ``None`` for an absent optional input. The steps run in the order a reader
    checks a call: formats, data shapes and rank, numeric attributes, weights and channels,
    spatial sizes and pads, bias, then every number of the plan against ``limits`` (those
    of the backend that runs it). Each raises the op's own error for what it finds wrong.
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
    plan = ConvPlan(
        op=op, primitive=spec.primitive, batch=data.batch(data.first), a_channels=a_channels,
        b_channels=b_channels, groups=nums.groups, a_spatial=a_sp, b_spatial=b_sp,
        kernel=kernel, strides=nums.strides, dilations=nums.dilations, pads_begin=pb,
        pads_end=pe, output_padding=opad, channels_last=data.channels_last,
        weights_perm=weights_perm(weights_format, data.ndim, spec.family),
        data_format=data_format, weights_format=weights_format, has_bias=bias is not None,
    )
    check_limits(plan, spec.large, spec.small, limits)
    return plan


def _read_data(spec: OpSpec, shapes, data_format: str) -> _Data:
    """The data shapes: rank >= 3, one rank for all, a channel and a position per axis."""
    op = spec.name
    names = [name for name in ("src", "diff_dst") if shapes.get(name) is not None]
    first = names[0]
    first_shape = parse_shape(op, first, shapes[first])
    data = _Data(spec, data_format, first, {first: first_shape}, len(first_shape) - 2)
    if len(first_shape) < 3:
        msg = (f"{op}: {first} must have rank >= 3 ([N, C, X..] or [N, X.., C], at least one "
               f"spatial axis); got {first}.shape={first_shape}; {data.no_batch()}")
        raise ValueError(msg)
    for name in names:
        shape = parse_shape(op, name, shapes[name])
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
        pads_begin=parse_pads(op, "pads_begin", attrs.pads_begin, ndim, auto_pad),
        pads_end=parse_pads(op, "pads_end", attrs.pads_end, ndim, auto_pad),
        output_padding=parse_ints(op, "output_padding", attrs.output_padding, ndim),
        groups=parse_int(op, "groups", attrs.groups),
    )
    for name, lo in (("strides", 1), ("dilations", 1), ("pads_begin", 0), ("pads_end", 0),
                     ("output_padding", 0)):
        check_min(op, name, getattr(nums, name), lo)
    if nums.groups < 1:
        msg = f"{op}: groups must be a positive integer; got groups={nums.groups}"
        raise ValueError(msg)
    if any(o >= s for o, s in zip(nums.output_padding, nums.strides)):
        msg = (f"{op}: output_padding must be in [0, stride) per axis; got "
               f"output_padding={nums.output_padding}, strides={nums.strides}; "
               + output_padding_rewrite(nums.output_padding, nums.strides, nums.pads_end,
                                        auto_pad))
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
        given = parse_shape(op, "weights", weights)
        if len(given) != ndim + 2:
            msg = (f"{op}: weights must have rank {ndim + 2} ({weights_format}, matching "
                   f"{data.first}.shape={data.shapes[data.first]}); got weights.shape={given}"
                   f"{'; ' + read_as if len(given) == ndim + 3 else ''}")
            raise ValueError(msg)
        a_channels = b_channels = None
    full = None if given[0] == "spatial" else given

    def hint() -> str:
        order = ((spec.large, spec.small) if spec.primitive == "backward_weights"
                 else (data.first, data.first))
        return layout_message(spec.family, spec.primitive, data.shapes, order, full, groups,
                            data.data_format, weights_format)

    if full is None:
        kernel = given[1]
        _check_groups(op, groups, a_channels, b_channels, spec.large, spec.small, hint)
    else:
        perm = weights_perm(weights_format, ndim, spec.family)
        kernel = tuple(full[i] for i in perm[2:])
        w_cb, w_ca = full[perm[0]], full[perm[1]]
        if spec.primitive == "forward":
            a_channels, b_channels = data.channels(data.first), w_cb
        elif spec.primitive == "backward_data":
            a_channels, b_channels = w_ca * groups, data.channels(data.first)
        _check_weights_channels(data, weights_format, full, (w_cb, w_ca), groups,
                                (a_channels, b_channels), hint)
    if any(k < 1 for k in kernel):
        msg = f"{op}: kernel sizes must be positive; got kernel spatial sizes {kernel}"
        raise ValueError(msg)
    return a_channels, b_channels, tuple(kernel)


def _check_weights_channels(data: _Data, weights_format, full, w_channels, groups, channels,
                            hint) -> None:
    """The weights' two channel axes against the data channels."""
    spec, op = data.spec, data.op
    (w_cb, w_ca), (a_channels, b_channels) = w_channels, channels
    meaning = weights_meaning(spec.family, weights_format)
    wname = "weights_shape" if spec.primitive == "backward_weights" else "weights.shape"
    if w_cb < 1 or w_ca < 1:
        msg = (f"{op}: {wname}={full} must have at least one channel on each channel "
               f"axis ({weights_format} weights are [{meaning}])")
        raise ValueError(msg)
    _check_groups(op, groups, a_channels, b_channels, spec.large, spec.small, hint)
    ic, oc = ((a_channels, b_channels) if spec.family == "convolution"
              else (b_channels, a_channels))
    role_cb, role_ca = ("O", "I") if spec.family == "convolution" else ("I", "O")
    axis = AXIS_MEANING[spec.family]
    wrong = [f"the {role} axis ({axis[role]}) must be {want}, got {got}"
             for role, want, got in ((role_cb, b_channels, w_cb),
                                     (role_ca, a_channels // groups, w_ca))
             if want != got]
    if wrong:
        msg = (f"{op}: {wname}={full} does not match the data channels: {weights_format} "
               f"weights are [{meaning}] and here IC={ic}, OC={oc}, groups={groups}, so "
               f"{'; '.join(wrong)}; {hint()}")
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
    shape = parse_shape(op, "bias", bias)
    if shape != (channels,):
        msg = (f"{op}: bias must have shape (OC,) = ({channels},), one value per output "
               f"channel; got bias.shape={shape}")
        raise ValueError(msg)


def _check_groups(op, groups, a_channels, b_channels, large_name, small_name, hint):
    if a_channels % groups or b_channels % groups:
        msg = (f"{op}: groups must divide both channel counts; got groups={groups}, "
               f"{large_name} channels={a_channels}, {small_name} channels={b_channels}; "
               f"{hint()}")
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
    shp = parse_shape(op, "weights_shape", weights_shape)
    if len(shp) == ndim:
        return ("spatial", shp)
    if len(shp) == ndim + 2:
        return shp
    msg = (f"{op}: weights_shape must be the full weights shape ({ndim + 2} entries, "
           f"{fmt}) or the spatial kernel sizes ({ndim} entries); got weights_shape={shp}"
           f"{'; ' + read_as if len(shp) == ndim + 3 else ''}")
    raise ValueError(msg)


def _large_from_dst_shape(op, dst_shape, ndim, channels_last, batch, channels, data_format):
    shp = parse_shape(op, "dst_shape", dst_shape)
    if len(shp) == ndim:
        spatial = shp
    elif len(shp) == ndim + 2:
        n, c, spatial = split_data(op, "dst_shape", shp, channels_last)
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
            ok = -(-a // s) == b
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
