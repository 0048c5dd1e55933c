"""Weights from one layout to another: polyconv's four formats and each framework's own
(docs/frameworks.md#weights).

A layout is an order of the axes ``O``, ``I`` and ``X`` (as in docs/semantics.md#layouts),
maybe a leading group axis ``G``, maybe a spatial flip (the kernel of ``lax.conv_transpose``
and Flax's ``ConvTranspose`` without ``transpose_kernel``), and, for the one form of a
ConvTranspose written as a forward convolution (``lax.conv_general_dilated`` with
``lhs_dilation``), the per-group swap of the two channel axes. Every conversion goes through
the family's canonical ``[Cb, Ca/G, K..]`` (``weights_perm``'s order) and uses only the array
API (array-api-compat), so it works on numpy, JAX and torch arrays without importing a library
the caller did not use.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._attributes import WEIGHTS_FORMATS

#: the polyconv formats spelt with their spatial axes named (``OIHW``, ``HWIO``, ``DHWIO``):
#: spelling -> (format, spatial axes)
_SPELLED = {fmt.replace("X", axes): (fmt, len(axes))
            for fmt in WEIGHTS_FORMATS for axes in ("W", "HW", "DHW")}

FAMILIES = ("convolution", "conv_transpose")
_FAMILY_ALIASES = {"convolution": "convolution", "conv": "convolution",
                   "conv_transpose": "conv_transpose", "convtranspose": "conv_transpose",
                   "deconvolution": "conv_transpose"}


@dataclass(frozen=True)
class _Layout:
    axes: str             # the axes in order: O, I, X (all spatial axes) and maybe G first
    flip: bool = False    # every spatial axis reversed
    swap: bool = False    # a ConvTranspose's weights as its forward convolution's (per group)


_T = _Layout
#: framework layout name -> {family: layout}; a family missing means the framework has no
#: such op (what the error says). The ConvTranspose ``O`` is OC/G, its ``I`` the input
#: channels (docs/semantics.md#layouts).
FRAMEWORK_LAYOUTS: dict[str, dict[str, _Layout]] = {
    "torch": {"convolution": _T("OIX"), "conv_transpose": _T("IOX")},
    "onnx": {"convolution": _T("OIX"), "conv_transpose": _T("IOX")},
    "tensorflow": {"convolution": _T("XIO"), "conv_transpose": _T("XOI")},
    "keras": {"convolution": _T("XIO"), "conv_transpose": _T("XOI")},
    "flax": {"convolution": _T("XIO"), "conv_transpose": _T("XIO", flip=True)},
    "flax-transpose-kernel": {"conv_transpose": _T("XOI")},
    "lax": {"convolution": _T("XIO"), "conv_transpose": _T("XIO", flip=True)},
    "lax-transpose-kernel": {"conv_transpose": _T("XOI")},
    "lax-lhs-dilation": {"convolution": _T("XIO"),
                         "conv_transpose": _T("XIO", flip=True, swap=True)},
    "openvino": {"convolution": _T("OIX"), "conv_transpose": _T("IOX")},
    "openvino-group": {"convolution": _T("GOIX"), "conv_transpose": _T("GIOX")},
    "onednn": {"convolution": _T("OIX"), "conv_transpose": _T("OIX")},
    "onednn-group": {"convolution": _T("GOIX"), "conv_transpose": _T("GOIX")},
}
_NAME_ALIASES = {"pytorch": "torch", "tf": "tensorflow", "jax": "lax"}

#: what each framework layout is, for the error messages and the docs
FRAMEWORK_OPS = {
    "torch": "torch.nn.Conv*d.weight / ConvTranspose*d.weight",
    "onnx": "ONNX Conv / ConvTranspose input W",
    "tensorflow": "tf.nn.conv*d filters (HWIO) / tf.nn.conv*d_transpose filters",
    "keras": "keras.layers.Conv*D.kernel / Conv*DTranspose.kernel",
    "flax": "Flax Conv.kernel / ConvTranspose.kernel (transpose_kernel=False)",
    "flax-transpose-kernel": "Flax ConvTranspose.kernel with transpose_kernel=True",
    "lax": "lax.conv_general_dilated rhs (HWIO) / lax.conv_transpose rhs (HWIO)",
    "lax-transpose-kernel": "lax.conv_transpose rhs (HWIO) with transpose_kernel=True",
    "lax-lhs-dilation": ("lax.conv_general_dilated rhs (HWIO) that computes the op; for a "
                         "ConvTranspose: with lhs_dilation=strides"),
    "openvino": "OpenVINO Convolution / ConvolutionBackpropData filters",
    "openvino-group": "OpenVINO GroupConvolution / GroupConvolutionBackpropData filters",
    "onednn": "oneDNN convolution / deconvolution weights (oihw: deconvolution's o is its dst)",
    "onednn-group": "oneDNN grouped convolution / deconvolution weights (goihw)",
}


def _family(value: Any) -> str:
    key = value.lower() if isinstance(value, str) else None
    if key not in _FAMILY_ALIASES:
        msg = (f"convert_weights: family must be one of {FAMILIES}, the op family whose "
               f"weights these are (ConvTranspose weights and Convolution weights of one "
               f"framework differ); got family={value!r}")
        raise ValueError(msg)
    return _FAMILY_ALIASES[key]


def _layout(role: str, value: Any, family: str, ndim: int) -> _Layout:
    """The layout named by ``src`` or ``dst``: a polyconv format (``OIX``, spelt ``OIHW``
    too) or a framework's name."""
    if not isinstance(value, str):
        msg = f"convert_weights: {role} must be a string; got {role}={value!r}"
        raise TypeError(msg)
    upper = value.upper()
    if upper in WEIGHTS_FORMATS:
        return _Layout(upper)
    if upper in _SPELLED:
        fmt, spelled = _SPELLED[upper]
        if spelled != ndim:
            msg = (f"convert_weights: {role}={value!r} names {spelled} spatial axes but the "
                   f"weights have {ndim}; pass {role}={fmt!r}, which fits any number")
            raise ValueError(msg)
        return _Layout(fmt)
    name = _NAME_ALIASES.get(value.lower(), value.lower())
    if name not in FRAMEWORK_LAYOUTS:
        msg = (f"convert_weights: unknown {role}={value!r}; pass a polyconv weights format "
               f"({', '.join(WEIGHTS_FORMATS)}) or a framework layout "
               f"({', '.join(FRAMEWORK_LAYOUTS)})")
        raise ValueError(msg)
    layout = FRAMEWORK_LAYOUTS[name].get(family)
    if layout is None:
        other = [f for f in FAMILIES if f in FRAMEWORK_LAYOUTS[name]]
        msg = (f"convert_weights: {role}={value!r} ({FRAMEWORK_OPS[name]}) has no "
               f"{family} weights, only {', '.join(other)}; for a {family} pass the "
               f"framework name without the flag (e.g. {name.split('-')[0]!r})")
        raise ValueError(msg)
    return layout


def _groups(value: Any) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__") or int(value) < 1:
        msg = f"convert_weights: groups must be an integer >= 1; got groups={value!r}"
        raise ValueError(msg)
    return int(value)


def _unwrap(w: Any) -> Any:
    """An object with ``__jax_array__`` (a Flax ``nnx.Param``, an Equinox wrapper) as the
    JAX array it stands for; a JAX array itself is left as it is."""
    if type(w).__module__.split(".")[0] not in ("jax", "jaxlib") and hasattr(
            w, "__jax_array__"):
        return w.__jax_array__()
    return w


def _order(layout: _Layout, family: str) -> str:
    """The layout's axes as canonical letters: ``B`` for the channels the groups do not
    divide, ``A`` for those they do (``[B, A, X..]`` is the canonical order)."""
    meaning = "convolution" if layout.swap else family
    b, a = ("O", "I") if meaning == "convolution" else ("I", "O")
    return layout.axes.replace(b, "B").replace(a, "A")


def _positions(order: str, ndim: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pos = 0
    for letter in order:
        width = ndim if letter == "X" else 1
        out[letter] = tuple(range(pos, pos + width)) if letter == "X" else pos
        pos += width
    return out


def _regroup(xp, c, groups: int, role: str):
    """``[G*b, a, K..]`` -> ``[G*a, b, K..]``: a ConvTranspose's canonical weights and those
    of the forward convolution that computes it, one from the other (per group, the two
    channel axes swap)."""
    cb, ca, *kernel = c.shape
    if cb % groups:
        msg = (f"convert_weights: groups={groups} must divide the channels that the groups "
               f"do not divide in the canonical weights ({cb}) of {role}; pass the groups of "
               f"the layer these weights belong to")
        raise ValueError(msg)
    c = xp.reshape(c, (groups, cb // groups, ca, *kernel))
    c = xp.permute_dims(c, (0, 2, 1, *range(3, c.ndim)))
    return xp.reshape(c, (groups * ca, cb // groups, *kernel))


def _to_canonical(xp, w, layout: _Layout, family: str, groups: int | None):
    order = _order(layout, family)
    ndim = w.ndim - len(order) + 1
    if ndim < 1:
        msg = (f"convert_weights: weights in the layout {layout.axes} need at least "
               f"{len(order)} axes (one spatial); got weights.shape={tuple(w.shape)}")
        raise ValueError(msg)
    pos = _positions(order, ndim)
    if layout.flip:
        w = xp.flip(w, axis=pos["X"])
    lead = ("G",) if "G" in order else ()
    w = xp.permute_dims(w, (*(pos[k] for k in (*lead, "B", "A")), *pos["X"]))
    if lead:
        if groups is not None and groups != w.shape[0]:
            msg = (f"convert_weights: the weights' group axis has {w.shape[0]} groups but "
                   f"groups={groups}; omit groups (it is read from the shape) or pass "
                   f"groups={w.shape[0]}")
            raise ValueError(msg)
        groups = w.shape[0]
        w = xp.reshape(w, (w.shape[0] * w.shape[1], *w.shape[2:]))
    if layout.swap:
        w = _regroup(xp, w, groups or 1, "src")
    return w, groups


def _from_canonical(xp, c, layout: _Layout, family: str, groups: int):
    order = _order(layout, family)
    if layout.swap:
        c = _regroup(xp, c, groups, "dst")
    if "G" in order:
        if c.shape[0] % groups:
            msg = (f"convert_weights: groups={groups} must divide {c.shape[0]}, the channels "
                   f"the group axis of dst={layout.axes!r} splits; pass the groups of the "
                   f"layer these weights belong to")
            raise ValueError(msg)
        c = xp.reshape(c, (groups, c.shape[0] // groups, *c.shape[1:]))
    source = ("G" if "G" in order else "") + "BA"
    ndim = c.ndim - len(source)
    src_pos = _positions(source + "X", ndim)
    perm = [i for letter in order for i in
            (src_pos[letter] if letter == "X" else (src_pos[letter],))]
    c = xp.permute_dims(c, tuple(perm))
    if layout.flip:
        c = xp.flip(c, axis=_positions(order, ndim)["X"])
    return c


def convert_weights(weights: Any, src: str, dst: str, *, family: str,
                    groups: int | None = None) -> Any:
    """Weights from one layout to another: polyconv's formats and each framework's own.

    Transposes, regroups and flips as the two layouts need, with the array's own library
    (numpy, JAX, torch, any array-API array; an object with ``__jax_array__``, such as a
    Flax ``nnx.Param``, is read as its JAX array). Nothing is computed but a permutation of
    the values, so the result is exact.

    Parameters
    ----------
    weights : array
        The weights of one Convolution or ConvTranspose, in layout ``src``.
    src, dst : str
        A polyconv weights format, ``"OIX"``, ``"XIO"``, ``"IOX"`` or ``"XOI"`` (also spelt
        with the spatial axes named: ``"OIHW"``, ``"HWIO"``...), read with the meaning of
        ``family`` (docs/semantics.md#layouts), or a framework's layout:

        ========================= =================================== ==================
        name                      Convolution                         ConvTranspose
        ========================= =================================== ==================
        ``torch``, ``onnx``       ``OIX``                             ``IOX``
        ``tensorflow``, ``keras`` ``XIO`` (HWIO)                      ``XOI``
        ``flax``, ``lax``         ``XIO``                             ``XIO``, flipped
        ``flax-transpose-kernel`` --                                  ``XOI``
        ``lax-transpose-kernel``  --                                  ``XOI``
        ``lax-lhs-dilation``      ``XIO``                             forward conv's
                                                                      ``XIO``, flipped
        ``openvino``              ``OIX``                             ``IOX``
        ``openvino-group``        ``[G, OC/G, IC/G, K..]``            ``[G, IC/G, OC/G,
                                                                      K..]``
        ``onednn``                ``OIX``                             ``OIX``: ``[OC, IC,
                                                                      K..]``
        ``onednn-group``          ``[G, OC/G, IC/G, K..]``            ``[G, OC/G, IC/G,
                                                                      K..]``
        ========================= =================================== ==================

        ``flax``/``lax`` ConvTranspose is the kernel of ``lax.conv_transpose`` (and Flax's
        ``ConvTranspose``) with the default ``transpose_kernel=False``: spatially flipped
        relative to a true transposed convolution. ``lax-lhs-dilation`` is the ``rhs`` of
        the ``lax.conv_general_dilated`` call with ``lhs_dilation=strides`` and
        ``feature_group_count=groups`` that computes the same ConvTranspose (each group's
        channel axes swapped, the kernel flipped).
    family : {"convolution", "conv_transpose"}
        Which op's weights (``"conv"``, ``"ConvTranspose"``, ``"deconvolution"`` are
        accepted too).
    groups : int, optional
        The op's groups, needed to write a layout with a group axis (``openvino-group``,
        ``onednn-group``) or
        the regrouped ``lax-lhs-dilation`` form of a grouped ConvTranspose; read from the
        shape when ``src`` has a group axis. Default 1.

    Returns
    -------
    array
        The same values in layout ``dst``, of the input's array library and dtype.

    Examples
    --------
    A ``torch.nn.ConvTranspose2d`` weight (``[IC, OC/G, KH, KW]``) as a Flax
    ``ConvTranspose`` kernel (``[KH, KW, IC, OC]``, flipped):

    >>> import numpy as np, polyconv
    >>> w = np.arange(2 * 3 * 2 * 2.0).reshape(2, 3, 2, 2)
    >>> k = polyconv.convert_weights(w, "torch", "flax", family="conv_transpose")
    >>> k.shape, bool(k[0, 0, 1, 2] == w[1, 2, 1, 1])   # flipped: k[kh, kw] is w[.., 1-kh, 1-kw]
    ((2, 2, 2, 3), True)

    OpenVINO ``GroupConvolution`` filters ``[G, OC/G, IC/G, K..]`` for polyconv:

    >>> g = np.ones((4, 2, 3, 3, 3), np.float32)
    >>> polyconv.convert_weights(g, "openvino-group", "XIO", family="convolution").shape
    (3, 3, 3, 8)
    """
    fam = _family(family)
    w = _unwrap(weights)
    from array_api_compat import array_namespace

    xp = array_namespace(w)
    given = None if groups is None else _groups(groups)
    rank = len(w.shape)
    src_layout = _layout("src", src, fam, rank - 2)
    dst_layout = _layout("dst", dst, fam, rank - 2 - ("G" in src_layout.axes))
    canonical, read = _to_canonical(xp, w, src_layout, fam, given)
    return _from_canonical(xp, canonical, dst_layout, fam, read or 1)


def convert_axes(weights: Any, src: str, dst: str, *, family: str,
                 groups: int | None = None) -> Any:
    """:func:`convert_weights` between any two axis orders of ``G`` (optional), ``O``, ``I``
    and ``X`` (the spatial axes, together, in order), as oneDNN's format tags (``gohwi``,
    ``hwigo``) name them; for the dialects, which read such tags."""
    fam = _family(family)
    w = _unwrap(weights)
    from array_api_compat import array_namespace

    canonical, read = _to_canonical(array_namespace(w), w, _Layout(src), fam, groups)
    return _from_canonical(array_namespace(w), canonical, _Layout(dst), fam,
                           read or groups or 1)
