"""An independent reference for the six ops, written from the contract only
(docs/semantics.md, docs/numerics.md).

Nothing here imports polyconv: the geometry (sizes, auto_pad rules F and T, ``dst_shape`` and
``weights_shape`` handling, weight layouts per family) is re-derived from the contract's
formulas, and
the values come from the definition of the canonical convolution
(docs/semantics.md#canonical-convolution)::

    b[n, o, y] = sum_{i < Ca/G} sum_k  a[n, g*Ca/G + i, y*s + k*d - pb] * W[o, i, k]

written as one contraction with a 0/1 *selection tensor* per spatial axis,
``S[y, k, x] = (x == y*s + k*d - pb)``. The three primitives are the same contraction with a
different free operand: ``forward`` keeps ``b``, ``backward_data`` keeps ``a`` (the explicit
adjoint: every product ``b*W`` is scattered to the ``a`` position it was read from) and
``backward_weights`` keeps ``W`` (the explicit sum over ``n`` and ``y``). Out-of-range positions of
``a`` simply have no selection entry, which is the zero padding.

Values are accumulated in ``np.longdouble`` (extended precision where the platform has it), so
that in float64 the reference's own rounding stays well below the error bound
(docs/numerics.md#error-bound). Next to the
value of every output element the reference returns the terms of that bound: ``abs_sum``
(``sum |a*w|`` over the element's products, plus ``|bias|``) and ``n`` (the number of terms).

Only tiny shapes are meant to go through here; the code favours being obviously right.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# --------------------------------------------------------------------------------------------
# op names (docs/semantics.md#six-ops)
# --------------------------------------------------------------------------------------------

#: canonical op kind -> (family, primitive, large tensor name, small tensor name)
KINDS = {
    "convolution": ("convolution", "forward", "src", "dst"),
    "convolution_backward_data": ("convolution", "backward_data", "diff_src", "diff_dst"),
    "convolution_backward_weights": ("convolution", "backward_weights", "src", "diff_dst"),
    "conv_transpose": ("conv_transpose", "backward_data", "dst", "src"),
    "conv_transpose_backward_data": ("conv_transpose", "forward", "diff_dst", "diff_src"),
    "conv_transpose_backward_weights": ("conv_transpose", "backward_weights", "diff_dst", "src"),
}

#: public function name -> (canonical kind, default weights format)
FUNCTIONS = {
    "convolution": ("convolution", "XIO"),
    "convolution_backward_data": ("convolution_backward_data", "XIO"),
    "convolution_backward_weights": ("convolution_backward_weights", "XIO"),
    "conv_transpose": ("conv_transpose", "XOI"),
    "conv_transpose_backward_data": ("conv_transpose_backward_data", "XOI"),
    "conv_transpose_backward_weights": ("conv_transpose_backward_weights", "XOI"),
    # older-spec aliases
    "convolution_backprop_data": ("convolution_backward_data", "XIO"),
    "convolution_backprop_filters": ("convolution_backward_weights", "XIO"),
    # the older spec's default filter_format, with ConvTranspose-family meaning
    # (docs/semantics.md#layouts)
    "conv_transpose_backprop_filters": ("conv_transpose_backward_weights", "XIO"),
}

#: the six functions of docs/semantics.md#six-ops, and the older-spec aliases
MAIN_OPS = tuple(KINDS)
ALIAS_OPS = tuple(fn for fn in FUNCTIONS if fn not in KINDS)

#: every op name (docs/semantics.md#six-ops): oneDNN Graph names, older-spec names with and
#: without ``-1``
OP_NAMES = {
    "Convolution": "convolution",
    "ConvolutionBackwardData": "convolution_backward_data",
    "ConvolutionBackwardWeights": "convolution_backward_weights",
    "ConvTranspose": "conv_transpose",
    "ConvTransposeBackwardData": "conv_transpose_backward_data",
    "ConvTransposeBackwardWeights": "conv_transpose_backward_weights",
    "ConvolutionBackpropData": "convolution_backprop_data",
    "ConvolutionBackpropData-1": "convolution_backprop_data",
    "ConvolutionBackpropFilters": "convolution_backprop_filters",
    "ConvolutionBackpropFilters-1": "convolution_backprop_filters",
    "ConvTransposeBackpropFilters": "conv_transpose_backprop_filters",
    "ConvTransposeBackpropFilters-1": "conv_transpose_backprop_filters",
}

#: the positional array inputs of each kind, in signature order
INPUTS = {
    "convolution": ("src", "weights", "bias"),
    "convolution_backward_data": ("diff_dst", "weights"),
    "convolution_backward_weights": ("src", "diff_dst"),
    "conv_transpose": ("src", "weights", "bias"),
    "conv_transpose_backward_data": ("diff_dst", "weights"),
    "conv_transpose_backward_weights": ("src", "diff_dst"),
}


def function_of(op: str) -> str:
    """A public function name for an op given by function name or by ``OPS`` name."""
    return OP_NAMES.get(op, op)


def kind_of(op: str) -> str:
    """The canonical kind (one of :data:`KINDS`) of a function name or ``OPS`` name."""
    return FUNCTIONS[function_of(op)][0]


# --------------------------------------------------------------------------------------------
# per-axis formulas (docs/semantics.md#geometry)
# --------------------------------------------------------------------------------------------


class InvalidGeometry(ValueError):
    """The oracle's own refusal of a call (empty output, unreachable dst_shape, ...)."""


def effective_kernel(k: int, d: int) -> int:
    return (k - 1) * d + 1


def forward_size(a: int, ek: int, s: int, pb: int, pe: int) -> int:
    """``B = floor((A + pb + pe - ek) / s) + 1``; refuses an empty output."""
    if a + pb + pe < ek:
        raise InvalidGeometry(f"empty forward output: A={a} pb={pb} pe={pe} ek={ek}")
    return (a + pb + pe - ek) // s + 1


def transposed_size(b: int, ek: int, s: int, pb: int, pe: int, opad: int) -> int:
    """``A = s*(B-1) + ek - pb - pe + output_padding``; refuses ``A < 1``."""
    a = s * (b - 1) + ek - pb - pe + opad
    if a < 1:
        raise InvalidGeometry(f"empty transposed output: B={b} s={s} ek={ek} pb={pb} pe={pe}")
    return a


def ceil_div(a: int, s: int) -> int:
    return -(-a // s)


def same_total_rule_f(a: int, s: int, ek: int) -> int:
    """Rule F: the total pad that makes ``B = ceil(A / s)``."""
    return max((ceil_div(a, s) - 1) * s + ek - a, 0)


def same_total_rule_t(s: int, ek: int) -> int:
    """Rule T: ``max(ek - s, 0)``, independent of the sizes."""
    return max(ek - s, 0)


def split_same(total: int, mode: str) -> tuple[int, int]:
    """``same_upper`` puts the odd element at the end, ``same_lower`` at the beginning."""
    if mode == "same_upper":
        return total // 2, total - total // 2
    if mode == "same_lower":
        return total - total // 2, total // 2
    raise AssertionError(mode)


def normalize_auto_pad(value) -> str:
    """``None``/``"none"``/``"explicit"`` (any case) -> ``"none"``; others lower-cased."""
    if value is None:
        return "none"
    mode = value.lower()
    if mode == "explicit":
        return "none"
    if mode not in ("none", "same_upper", "same_lower", "valid"):
        raise InvalidGeometry(f"unknown auto_pad {value!r}")
    return mode


def per_axis(value, ndim: int) -> tuple[int, ...]:
    if isinstance(value, (int, np.integer)):
        return (int(value),) * ndim
    out = tuple(int(v) for v in value)
    if len(out) != ndim:
        raise InvalidGeometry(f"{value!r} does not have {ndim} entries")
    return out


# --------------------------------------------------------------------------------------------
# layouts (docs/semantics.md#layouts)
# --------------------------------------------------------------------------------------------


def data_shape(batch: int, channels: int, spatial, channels_last: bool) -> tuple[int, ...]:
    if channels_last:
        return (batch, *spatial, channels)
    return (batch, channels, *spatial)


def split_data_shape(shape, channels_last: bool):
    """``(N, C, spatial)`` of a data shape."""
    shape = tuple(shape)
    if channels_last:
        return shape[0], shape[-1], shape[1:-1]
    return shape[0], shape[1], shape[2:]


def weights_labels(fmt: str, ndim: int) -> list[str]:
    """Axis labels of a weights format: ``"XIO"``, 2 -> ``["X0", "X1", "I", "O"]``."""
    labels = []
    for letter in fmt:
        if letter == "X":
            labels.extend(f"X{j}" for j in range(ndim))
        else:
            labels.append(letter)
    return labels


def canonical_labels(family: str, ndim: int) -> list[str]:
    """Labels of canonical ``W`` ``[Cb, Ca/G, K..]``.

    In the Convolution family ``O`` is the full output channel count (Cb) and ``I`` the input
    channels per group; in the ConvTranspose family ``I`` is the full input channel count (Cb)
    and ``O`` the output channels per group.
    """
    cb, ca = ("O", "I") if family == "convolution" else ("I", "O")
    return [cb, ca, *(f"X{j}" for j in range(ndim))]


def weights_to_canonical(w: np.ndarray, fmt: str, family: str) -> np.ndarray:
    ndim = w.ndim - 2
    user = weights_labels(fmt, ndim)
    return np.transpose(w, [user.index(lab) for lab in canonical_labels(family, ndim)])


def weights_from_canonical(w: np.ndarray, fmt: str, family: str) -> np.ndarray:
    ndim = w.ndim - 2
    canon = canonical_labels(family, ndim)
    return np.transpose(w, [canon.index(lab) for lab in weights_labels(fmt, ndim)])


def weights_user_shape(canonical_shape, fmt: str, family: str) -> tuple[int, ...]:
    ndim = len(canonical_shape) - 2
    sizes = dict(zip(canonical_labels(family, ndim), canonical_shape))
    return tuple(sizes[lab] for lab in weights_labels(fmt, ndim))


# --------------------------------------------------------------------------------------------
# geometry of one call
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Geometry:
    """One call resolved into the canonical convolution (every number fixed)."""

    kind: str
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
    weights_format: str

    @property
    def family(self) -> str:
        return KINDS[self.kind][0]

    @property
    def primitive(self) -> str:
        return KINDS[self.kind][1]

    @property
    def ndim(self) -> int:
        return len(self.kernel)

    @property
    def a_shape(self) -> tuple[int, ...]:
        return data_shape(self.batch, self.a_channels, self.a_spatial, self.channels_last)

    @property
    def b_shape(self) -> tuple[int, ...]:
        return data_shape(self.batch, self.b_channels, self.b_spatial, self.channels_last)

    @property
    def canonical_weights_shape(self) -> tuple[int, ...]:
        return (self.b_channels, self.a_channels // self.groups, *self.kernel)

    @property
    def weights_shape(self) -> tuple[int, ...]:
        return weights_user_shape(self.canonical_weights_shape, self.weights_format,
                                  self.family)

    @property
    def output_shape(self) -> tuple[int, ...]:
        return {"forward": self.b_shape, "backward_data": self.a_shape,
                "backward_weights": self.weights_shape}[self.primitive]

    @property
    def bias_shape(self) -> tuple[int, ...]:
        return (self.b_channels if self.primitive == "forward" else self.a_channels,)

    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        """The array inputs' shapes by argument name (bias excluded)."""
        large, small = KINDS[self.kind][2], KINDS[self.kind][3]
        shapes = {large: self.a_shape, small: self.b_shape, "weights": self.weights_shape}
        return {name: shapes[name] for name in INPUTS[self.kind] if name != "bias"}


def _alias(value, alias_value):
    return alias_value if value is None else value


def geometry(op: str, *shapes, dst_shape=None, weights_shape=None, strides=1, pads_begin=0,
             pads_end=0, dilations=1, auto_pad="none", output_padding=0, groups=1,
             data_format="NXC", weights_format=None, output_shape=None, filter_shape=None,
             filter_format=None) -> Geometry:
    """Resolve a *valid* call from its input shapes (positional, in signature order).

    Raises :class:`InvalidGeometry` for calls the contract refuses on sizes (empty outputs,
    unreachable ``dst_shape``); it does not try to diagnose anything else.
    """
    fn = function_of(op)
    kind, default_format = FUNCTIONS[fn]
    family, primitive, _, _ = KINDS[kind]
    dst_shape = _alias(dst_shape, output_shape)
    weights_shape = _alias(weights_shape, filter_shape)
    fmt = _alias(_alias(weights_format, filter_format), default_format).upper()
    mode = normalize_auto_pad(auto_pad)
    channels_last = data_format.upper() == "NXC"
    named = dict(zip(INPUTS[kind], shapes))
    first = named[INPUTS[kind][0]]
    ndim = len(first) - 2
    strides = per_axis(strides, ndim)
    dilations = per_axis(dilations, ndim)
    pads_begin = per_axis(pads_begin, ndim)
    pads_end = per_axis(pads_end, ndim)
    output_padding = per_axis(output_padding, ndim)

    # Channels and kernel: from the weights array, or from weights_shape and the data.
    if primitive == "backward_weights":
        a_name = "src" if family == "convolution" else "diff_dst"
        b_name = "diff_dst" if family == "convolution" else "src"
        batch, a_channels, a_sp = split_data_shape(named[a_name], channels_last)
        _, b_channels, b_sp_given = split_data_shape(named[b_name], channels_last)
        wshape = tuple(weights_shape)
        if len(wshape) == ndim:
            kernel = wshape
        else:
            sizes = dict(zip(weights_labels(fmt, ndim), wshape))
            kernel = tuple(sizes[f"X{j}"] for j in range(ndim))
    else:
        sizes = dict(zip(weights_labels(fmt, ndim), named["weights"]))
        kernel = tuple(sizes[f"X{j}"] for j in range(ndim))
        cb_label, ca_label = canonical_labels(family, ndim)[:2]
        if primitive == "forward":
            batch, a_channels, a_sp = split_data_shape(first, channels_last)
            b_channels = sizes[cb_label]
        else:
            batch, b_channels, b_sp = split_data_shape(first, channels_last)
            a_channels = sizes[ca_label] * groups
    eks = [effective_kernel(k, d) for k, d in zip(kernel, dilations)]
    # Which rule same_* uses: F on a known large size, T otherwise
    # (the table of docs/semantics.md#auto-pad).
    rule = "F" if family == "convolution" else "T"

    def pads(large_sizes, rule):
        if mode == "none":
            return pads_begin, pads_end
        if mode == "valid":
            return (0,) * ndim, (0,) * ndim
        pb, pe = [], []
        for j in range(ndim):
            if rule == "F":
                total = same_total_rule_f(large_sizes[j], strides[j], eks[j])
            else:
                total = same_total_rule_t(strides[j], eks[j])
            lo, hi = split_same(total, mode)
            pb.append(lo)
            pe.append(hi)
        return tuple(pb), tuple(pe)

    def forward_sizes(a_sp, pb, pe):
        return tuple(forward_size(a_sp[j], eks[j], strides[j], pb[j], pe[j])
                     for j in range(ndim))

    def implied_output_padding(a_sp, b_sp, pb, pe):
        return tuple(a_sp[j] - (strides[j] * (b_sp[j] - 1) + eks[j] - pb[j] - pe[j])
                     for j in range(ndim))

    if primitive == "forward":
        pb, pe = pads(a_sp, rule)
        b_sp = forward_sizes(a_sp, pb, pe)
        opad = implied_output_padding(a_sp, b_sp, pb, pe) if family != "convolution" \
            else (0,) * ndim
    elif primitive == "backward_weights":
        pb, pe = pads(a_sp, rule)
        b_sp = forward_sizes(a_sp, pb, pe)
        if b_sp != tuple(b_sp_given):
            raise InvalidGeometry(f"small tensor sizes {b_sp_given} != forward sizes {b_sp}")
        opad = implied_output_padding(a_sp, b_sp, pb, pe) if family != "convolution" \
            else (0,) * ndim
    elif dst_shape is not None:
        dst = tuple(dst_shape)
        a_sp = dst if len(dst) == ndim else split_data_shape(dst, channels_last)[2]
        pb, pe = pads(a_sp, "F")
        for j in range(ndim):
            if mode in ("same_upper", "same_lower"):
                ok = ceil_div(a_sp[j], strides[j]) == b_sp[j]
            else:
                ok = (a_sp[j] + pb[j] + pe[j] >= eks[j]
                      and forward_size(a_sp[j], eks[j], strides[j], pb[j], pe[j]) == b_sp[j])
            if not ok:
                raise InvalidGeometry(f"dst_shape {dst} unreachable from {b_sp}")
        opad = implied_output_padding(a_sp, b_sp, pb, pe)
    else:
        pb, pe = pads(None, "T")
        a_sp = tuple(transposed_size(b_sp[j], eks[j], strides[j], pb[j], pe[j],
                                     output_padding[j]) for j in range(ndim))
        opad = output_padding

    return Geometry(kind=kind, batch=batch, a_channels=a_channels, b_channels=b_channels,
                    groups=groups, a_spatial=tuple(a_sp), b_spatial=tuple(b_sp),
                    kernel=tuple(kernel), strides=strides, dilations=dilations,
                    pads_begin=tuple(pb), pads_end=tuple(pe), output_padding=tuple(opad),
                    channels_last=channels_last, weights_format=fmt)


# --------------------------------------------------------------------------------------------
# the three primitives on canonical NCX data and canonical W [Cb, Ca/G, K..]
# --------------------------------------------------------------------------------------------

_ACC = np.longdouble


def selection(b: int, k: int, a: int, s: int, d: int, pb: int) -> np.ndarray:
    """``S[y, k, x] = 1`` where tap ``k`` of output ``y`` reads ``x = y*s + k*d - pb``."""
    y = np.arange(b)[:, None, None]
    t = np.arange(k)[None, :, None]
    x = np.arange(a)[None, None, :]
    return (x == y * s + t * d - pb).astype(_ACC)


def _contract(geo: Geometry, a, b, w, keep: str) -> np.ndarray:
    """The canonical sum with two of ``a``, ``b``, ``w`` given and the third kept free.

    Summed over everything not kept: ``sum a[n, g*Ca/G+i, x] W[o, i, k] b[n, o, y] S[y, k, x]``,
    group by group. Only the two given operands and the selection tensors enter the einsum.
    """
    nd = geo.ndim
    n_, i_, o_ = 0, 1, 2
    ys = [3 + j for j in range(nd)]
    ks = [3 + nd + j for j in range(nd)]
    xs = [3 + 2 * nd + j for j in range(nd)]
    sel = []
    for j in range(nd):
        sel += [selection(geo.b_spatial[j], geo.kernel[j], geo.a_spatial[j], geo.strides[j],
                          geo.dilations[j], geo.pads_begin[j]), [ys[j], ks[j], xs[j]]]
    subs = {"a": [n_, i_, *xs], "b": [n_, o_, *ys], "w": [o_, i_, *ks]}
    ca_g = geo.a_channels // geo.groups
    cb_g = geo.b_channels // geo.groups
    parts = []
    for g in range(geo.groups):
        ops = {"a": None if a is None else a[:, g * ca_g:(g + 1) * ca_g],
               "b": None if b is None else b[:, g * cb_g:(g + 1) * cb_g],
               "w": None if w is None else w[g * cb_g:(g + 1) * cb_g]}
        args = []
        for name in ("a", "b", "w"):
            if name != keep:
                args += [ops[name], subs[name]]
        operands = (*args, *sel, subs[keep])
        # Without a memory limit numpy's path search keeps intermediates tiny and is slow.
        path = np.einsum_path(*operands, optimize=("greedy", 1e8))[0]
        parts.append(np.einsum(*operands, optimize=path))
    # a and b are split along their channel axis (1); W along its Cb axis (0).
    return np.concatenate(parts, axis=0 if keep == "w" else 1)


def forward(geo: Geometry, a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``a`` ``[N, Ca, A..]``, ``W`` ``[Cb, Ca/G, K..]`` -> ``b`` ``[N, Cb, B..]``."""
    return _contract(geo, a, None, w, keep="b")


def backward_data(geo: Geometry, b: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The adjoint of :func:`forward` in ``a``: ``b``, ``W`` -> ``a`` ``[N, Ca, A..]``."""
    return _contract(geo, None, b, w, keep="a")


def backward_weights(geo: Geometry, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The adjoint of :func:`forward` in ``W``: ``a``, ``b`` -> ``W`` ``[Cb, Ca/G, K..]``."""
    return _contract(geo, a, b, None, keep="w")


# --------------------------------------------------------------------------------------------
# the six ops
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    """The exact result of a call and the terms of its error bound, per element
    (docs/numerics.md#error-bound)."""

    y: np.ndarray          # float64 (rounded from extended precision), the user's layout
    abs_sum: np.ndarray    # sum |a*w| over the element's products, plus |bias|
    n: np.ndarray          # number of terms (products, plus one for the bias)
    geometry: Geometry

    @property
    def shape(self) -> tuple[int, ...]:
        return self.y.shape


def _to_acc(x) -> np.ndarray:
    return np.asarray(x).astype(np.float64).astype(_ACC)


def _data_to_ncx(x: np.ndarray, channels_last: bool) -> np.ndarray:
    return np.moveaxis(x, -1, 1) if channels_last else x


def _data_from_ncx(x: np.ndarray, channels_last: bool) -> np.ndarray:
    return np.moveaxis(x, 1, -1) if channels_last else x


def reference(op: str, *arrays, **attrs) -> Reference:
    """Evaluate op ``op`` (function name or ``OPS`` name) on numpy arrays, exactly.

    ``arrays`` are the op's array inputs in signature order (``bias`` may be ``None`` or
    omitted); ``attrs`` are the op's keywords, including ``dst_shape``/``weights_shape`` and
    their aliases.
    """
    kind = kind_of(op)
    names = INPUTS[kind]
    given = dict(zip(names, arrays))
    bias = given.pop("bias", None)
    geo = geometry(op, *(np.shape(given[name]) for name in names if name != "bias"), **attrs)
    cl = geo.channels_last
    fmt, family = geo.weights_format, geo.family
    large, small = KINDS[kind][2], KINDS[kind][3]

    def value_and_bound(fn, *operands):
        """``fn`` on the operands, on their absolute values, and on all-ones."""
        y = fn(*operands)
        abs_sum = fn(*(np.abs(x) for x in operands))
        n = fn(*(np.ones_like(x) for x in operands))
        return y, abs_sum, n

    if geo.primitive == "backward_weights":
        a = _data_to_ncx(_to_acc(given[large]), cl)
        b = _data_to_ncx(_to_acc(given[small]), cl)
        outs = value_and_bound(lambda a, b: backward_weights(geo, a, b), a, b)
        outs = [weights_from_canonical(t, fmt, family) for t in outs]
    else:
        w = weights_to_canonical(_to_acc(given["weights"]), fmt, family)
        if geo.primitive == "forward":
            a = _data_to_ncx(_to_acc(given[large]), cl)
            outs = value_and_bound(lambda a, w: forward(geo, a, w), a, w)
        else:
            b = _data_to_ncx(_to_acc(given[small]), cl)
            outs = value_and_bound(lambda b, w: backward_data(geo, b, w), b, w)
        if bias is not None:
            bvec = _to_acc(bias).reshape((1, -1) + (1,) * geo.ndim)
            outs = [outs[0] + bvec, outs[1] + np.abs(bvec), outs[2] + 1]
        outs = [_data_from_ncx(t, cl) for t in outs]
    y, abs_sum, n = outs
    return Reference(y=np.ascontiguousarray(y, dtype=np.float64),
                     abs_sum=np.ascontiguousarray(abs_sum, dtype=np.float64),
                     n=np.rint(np.asarray(n, dtype=np.float64)).astype(np.int64),
                     geometry=geo)


# --------------------------------------------------------------------------------------------
# the error bound (docs/numerics.md#error-bound)
# --------------------------------------------------------------------------------------------

EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7, "float32": 2.0**-23, "float64": 2.0**-52}


def acc_dtype(dtype: str) -> str:
    return "float64" if dtype == "float64" else "float32"


def assert_within_bound(y, ref, abs_sum, n, dtype: str) -> None:
    """``|y - y_exact| <= eps(out)*|y_exact| + n*eps(acc)*sum|a*w|`` for every element.

    ``y`` is the result under test (anything ``np.asarray`` takes), ``ref``/``abs_sum``/``n``
    come from :func:`reference`, ``dtype`` is the output dtype's name. NaN never passes.
    """
    y = np.asarray(y, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert y.shape == ref.shape, f"shape {y.shape} != reference shape {ref.shape}"
    err = np.abs(y - ref)
    bound = EPS[dtype] * np.abs(ref) + n * EPS[acc_dtype(dtype)] * abs_sum
    ok = err <= bound
    if ok.all():
        return
    bad = np.argwhere(~ok)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(ok, 0.0, np.nan_to_num(err / bound, nan=np.inf, posinf=np.inf))
    worst = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
    first = tuple(int(i) for i in bad[0])
    msg = (f"{len(bad)} of {y.size} elements outside the error bound ({dtype}); "
           f"worst at index {tuple(int(i) for i in worst)}: got {y[worst]!r}, exact "
           f"{ref[worst]!r}, |error| {err[worst]:.3g} > bound {bound[worst]:.3g} "
           f"(n={int(np.asarray(n)[worst])}, sum|a*w|={abs_sum[worst]:.3g}); first bad index "
           f"{first}: got {y[first]!r}, exact {ref[first]!r}")
    raise AssertionError(msg)


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a dtype name (``bfloat16`` is ``ml_dtypes.bfloat16``)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def random_array(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Values of magnitude in [1/4, 1] with random signs, exactly representable in ``dtype``.

    Keeping magnitudes away from zero keeps float16 products on the grid of its subnormals, so
    that underflow can never push a result outside the bound.
    """
    mag = rng.uniform(0.25, 1.0, size=shape)
    sign = rng.choice([-1.0, 1.0], size=shape)
    return (mag * sign).astype(numpy_dtype(dtype) if isinstance(dtype, str) else dtype)
