"""oneDNN's primitive conventions as polyconv's keywords: memory format tags, the sizes rule
and the pads it implies (docs/frameworks.md#onednn; the rules are stated in
:mod:`polyconv.dialects.onednn`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._common import per_axis

#: oneDNN primitive -> (family, polyconv function)
PRIMITIVES = {
    "convolution_forward": ("convolution", "convolution"),
    "convolution_backward_data": ("convolution", "convolution_backward_data"),
    "convolution_backward_weights": ("convolution", "convolution_backward_weights"),
    "deconvolution_forward": ("conv_transpose", "conv_transpose"),
    "deconvolution_backward_data": ("conv_transpose", "conv_transpose_backward_data"),
    "deconvolution_backward_weights": ("conv_transpose", "conv_transpose_backward_weights"),
}
SPATIAL = {1: "w", 2: "hw", 3: "dhw"}
_PREFIXES = ("dnnl::memory::format_tag::", "memory::format_tag::", "format_tag::", "tag::",
             "dnnl_")


def c_div(a: int, b: int) -> int:
    """C's integer division, truncating toward zero (oneDNN's and benchdnn's arithmetic)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _tag_order(who: str, role: str, tag: Any, names: str, rank: int) -> tuple[int, ...]:
    """The logical axis (index into ``names``, oneDNN's logical order) of each axis of an
    array in layout ``tag``; ``None`` is the plain layout (``abcd``)."""
    if tag is None:
        return tuple(range(rank))
    text = str(tag)
    for prefix in _PREFIXES:
        text = text.removeprefix(prefix)
    plain = names
    letters = "abcdef"[:rank]
    if text in ("any", "undef", "format_tag_any", "format_tag_undef"):
        msg = (f"{who}: {role}_tag={tag!r} lets oneDNN choose its own (blocked) layout; "
               f"polyconv reads plain arrays: name the layout of the array you pass, e.g. "
               f"{role}_tag={plain!r}")
        raise ValueError(msg)
    if text != text.lower() or not text.isalpha():
        msg = (f"{who}: {role}_tag={tag!r} is a blocked layout (its upper-case letters or "
               f"digits split an axis into blocks); polyconv reads plain arrays: reorder "
               f"to a plain layout such as {plain!r} first")
        raise ValueError(msg)
    if len(text) == rank and set(text) == set(names):
        return tuple(names.index(c) for c in text)
    if len(text) == rank and set(text) == set(letters):
        return tuple(letters.index(c) for c in text)
    msg = (f"{who}: {role}_tag={tag!r} does not name the {rank} axes of {role} (a "
           f"permutation of {plain!r} or of {letters!r}); its shape has {rank} axes")
    raise ValueError(msg)


def data_format(who: str, role: str, tag: Any, rank: int) -> str:
    """polyconv's ``data_format`` for a oneDNN data tag (``nchw``, ``nhwc``, ``acdb``...)."""
    ndim = rank - 2
    names = "nc" + SPATIAL.get(ndim, "".join(chr(ord("p") + i) for i in range(ndim)))
    order = _tag_order(who, role, tag, names, rank)
    if order == tuple(range(rank)):
        return "NCX"
    if order == (0, *range(2, rank), 1):
        return "NXC"
    msg = (f"{who}: {role}_tag={tag!r} has no polyconv data format: polyconv reads "
           f"channels-first ({names!r}) or channels-last "
           f"({names[0] + names[2:] + names[1]!r}) arrays; transpose to one of them first")
    raise ValueError(msg)


def weights_axes(who: str, role: str, tag: Any, rank: int, ndim: int) -> str:
    """A oneDNN weights tag (``oihw``, ``hwio``, ``goihw``, ``hwigo``...) as an axis order
    of ``G``, ``O``, ``I`` and ``X`` (the spatial axes, in order)."""
    grouped = rank == ndim + 3
    logical = ("g" if grouped else "") + "oi" + SPATIAL.get(
        ndim, "".join(chr(ord("p") + i) for i in range(ndim)))
    order = _tag_order(who, role, tag, logical, rank)
    first = len(logical) - ndim
    where = [order.index(j) for j in range(first, first + ndim)]
    if where != list(range(where[0], where[0] + ndim)):
        msg = (f"{who}: {role}_tag={tag!r} splits or reorders the spatial axes; polyconv "
               f"reads them together and in order ({logical!r}, {logical[-ndim:]!r} kept "
               f"together); transpose the weights first")
        raise ValueError(msg)
    axes = ""
    for j in order:
        letter = logical[j].upper() if j < len(logical) - ndim else "X"
        if letter != "X" or not axes.endswith("X"):
            axes += letter
    return axes


def _end_pads(who: str, large, small, kernel, strides, dilates, padding_l, padding_r,
              transposed: bool) -> tuple[list[int], list[int]]:
    """oneDNN's checks, then per axis the end pad the sizes imply (may be negative)."""
    ends = []
    for i, (a, b, k, s, d, pl, pr) in enumerate(zip(large, small, kernel, strides, dilates,
                                                    padding_l, padding_r)):
        ek = (k - 1) * (d + 1) + 1
        if s < 1 or d < 0 or pl < 0 or pr + s <= 0:
            msg = (f"{who}: axis {i}: oneDNN needs stride > 0, dilate >= 0 (0 is a dense "
                   f"kernel), padding_l >= 0 and padding_r + stride > 0; got stride={s}, "
                   f"dilate={d}, padding_l={pl}, padding_r={pr}")
            raise ValueError(msg)
        if c_div(a - ek + pl + pr, s) + 1 != b:
            big, little = ("dst", "src") if transposed else ("src", "dst")
            msg = (f"{who}: axis {i}: oneDNN needs ({big} - ek + padding_l + padding_r) / "
                   f"stride + 1 == {little} (C division, ek = (k - 1) * (dilate + 1) + 1 = "
                   f"{ek}); got {big}={a}, {little}={b}, padding_l={pl}, padding_r={pr}, "
                   f"stride={s}: fix the dims or the pads")
            raise ValueError(msg)
        end = (b - 1) * s + ek - pl - a
        if end <= -s:
            msg = (f"{who}: axis {i}: padding_r={pr} with stride {s} leaves {-end} "
                   f"position(s) of the {'dst' if transposed else 'src'} past the last "
                   f"kernel tap, a whole stride or more, which polyconv cannot express (its "
                   f"output_padding is below the stride); drop them from the "
                   f"{'dst' if transposed else 'src'} (size {a + end + s - 1}) instead")
            raise ValueError(msg)
        ends.append(end)
    return ends


def attributes(who: str, ndim: int, strides: Any, padding_l: Any, padding_r: Any,
               dilates: Any) -> tuple[tuple[int, ...], ...]:
    """``strides``, ``padding_l``, ``padding_r`` (default: ``padding_l``, as oneDNN's C API
    takes a null ``padding_r``) and ``dilates`` per axis."""
    padding_l = per_axis(who, "padding_l", padding_l, ndim, 0)
    padding_r = padding_l if padding_r is None else per_axis(who, "padding_r", padding_r,
                                                              ndim, 0)
    return (per_axis(who, "strides", strides, ndim, 1), padding_l, padding_r,
            per_axis(who, "dilates", dilates, ndim, 0))


def other_sizes(sizes, to_large: bool, kernel, strides, padding_l, padding_r,
                dilates) -> list[int]:
    """The sizes on the other side of oneDNN's sizes rule: the small side in C's division,
    or the large side with no remainder (benchdnn's choice where a dst is not given)."""
    out = []
    for n, k, s, pl, pr, d in zip(sizes, kernel, strides, padding_l, padding_r, dilates):
        ek = (k - 1) * (d + 1) + 1
        out.append((n - 1) * s + ek - pl - pr if to_large else c_div(n - ek + pl + pr, s) + 1)
    return out


def polyconv_weights_shape(family: str, weights_dims: Sequence[int], ndim: int,
                            fmt: str) -> tuple[int, ...]:
    """polyconv's weights shape in ``fmt`` for oneDNN's weights dims: a Convolution's ``O``
    and a ConvTranspose's ``I`` are all the channels, the other per group
    (docs/semantics.md#layouts)."""
    dims = tuple(int(v) for v in weights_dims)
    g = dims[0] if len(dims) == ndim + 3 else 1
    o, i = dims[-ndim - 2:-ndim]
    kernel = dims[-ndim:]
    sizes = {"O": g * o, "I": i} if family == "convolution" else {"O": o, "I": g * i}
    return tuple(v for c in fmt for v in ((*kernel,) if c == "X" else (sizes[c],)))


def _one_data_format(who: str, src_tag: Any, dst_tag: Any, rank: int) -> str:
    fmt = data_format(who, "src", src_tag, rank)
    if dst_tag is not None and data_format(who, "dst", dst_tag, rank) != fmt:
        msg = (f"{who}: src_tag={src_tag!r} and dst_tag={dst_tag!r} differ; polyconv "
               f"reads both in one data format: pass arrays of one layout")
        raise ValueError(msg)
    return fmt


def keywords(primitive: str, src_dims: Sequence[int], weights_dims: Sequence[int],
             dst_dims: Sequence[int] | None = None, *, strides: Any = 1,
             padding_l: Any = 0, padding_r: Any = None, dilates: Any = 0,
             src_tag: Any = None, weights_tag: Any = None,
             dst_tag: Any = None) -> dict[str, Any]:
    """polyconv's keywords for a oneDNN primitive, from its memory descriptors' dims.

    Parameters
    ----------
    primitive : str
        ``"convolution_forward"``, ``"convolution_backward_data"``,
        ``"convolution_backward_weights"`` or the same three of ``"deconvolution_..."``.
    src_dims, weights_dims, dst_dims : sequence of int
        The logical dims of the primitive's forward tensors (``diff_src`` is ``src``...):
        ``[N, C, D.., H, W]`` and ``[G, O, I, K..]`` (``G`` only for groups). ``dst_dims``
        ``None``: the size the rule gives (for the large side, with no remainder).
    strides, padding_l, padding_r, dilates : int or sequence of int
        As oneDNN takes them (``padding_r`` defaults to ``padding_l``, ``dilates`` to 0).
    src_tag, weights_tag, dst_tag : str, optional
        The arrays' memory format tags (default plain: ``nchw``, ``oihw``, ``goihw``).

    Returns
    -------
    dict
        The keywords of the polyconv function ``PRIMITIVES[primitive][1]``, with the
        weights read in ``weights_format``: the tag's own layout where polyconv has it
        (``oihw`` is ``OIX``, ``hwio`` is ``XIO``...), else ``OIX`` after
        :func:`polyconv.convert_weights` (``"onednn-group"`` for ``goihw``); the
        large shape (``dst_shape``) of a convolution's backward data and the
        ``weights_shape`` of the backward weights are included.

    Examples
    --------
    A right pad of -1 (oneDNN allows it while ``padding_r + stride > 0``): the last input
    position is never read, and polyconv's end pad is 0.

    >>> from polyconv.dialects import onednn
    >>> kw = onednn.keywords("convolution_forward", (2, 16, 14, 14), (32, 16, 3, 3),
    ...                      (2, 32, 6, 6), strides=2, padding_l=0, padding_r=-1)
    >>> kw["pads_begin"], kw["pads_end"], kw["dilations"]
    ((0, 0), (0, 0), (1, 1))
    """
    who = f"onednn {primitive}"
    if primitive not in PRIMITIVES:
        msg = f"onednn: primitive must be one of {list(PRIMITIVES)}; got {primitive!r}"
        raise ValueError(msg)
    family, _ = PRIMITIVES[primitive]
    transposed = family == "conv_transpose"
    src_dims = tuple(int(v) for v in src_dims)
    weights_dims = tuple(int(v) for v in weights_dims)
    ndim = len(src_dims) - 2
    if ndim < 1 or len(weights_dims) not in (ndim + 2, ndim + 3):
        msg = (f"{who}: weights_dims {list(weights_dims)} must have {ndim + 2} dims ([O, I, "
               f"K..]) or {ndim + 3} ([G, O, I, K..]) for src_dims {list(src_dims)}")
        raise ValueError(msg)
    fmt = _one_data_format(who, src_tag, dst_tag, ndim + 2)
    axes = weights_axes(who, "weights", weights_tag, len(weights_dims), ndim)
    grouped = len(weights_dims) == ndim + 3
    groups = weights_dims[0] if grouped else 1
    o, i = weights_dims[-ndim - 2:-ndim]
    kernel = weights_dims[-ndim:]
    strides, padding_l, padding_r, dilates = attributes(who, ndim, strides, padding_l,
                                                        padding_r, dilates)
    if src_dims[1] != groups * i:
        msg = (f"{who}: src has {src_dims[1]} channels but the weights {list(weights_dims)} "
               f"take {groups} x {i}; fix the dims")
        raise ValueError(msg)
    if dst_dims is None:
        dst_dims = (src_dims[0], groups * o, *other_sizes(
            src_dims[2:], transposed, kernel, strides, padding_l, padding_r, dilates))
    dst_dims = tuple(int(v) for v in dst_dims)
    if len(dst_dims) != ndim + 2 or dst_dims[:2] != (src_dims[0], groups * o) or min(
            dst_dims) < 1:
        msg = (f"{who}: dst_dims {list(dst_dims)} must be [{src_dims[0]}, {groups * o}, "
               f"{ndim} positive sizes] (the src's batch, G x O channels)")
        raise ValueError(msg)
    large, small = ((dst_dims, src_dims) if transposed else (src_dims, dst_dims))
    ends = _end_pads(who, large[2:], small[2:], kernel, strides, dilates, padding_l,
                     padding_r, transposed)
    weights_format = axes if axes in ("OIX", "XIO", "IOX", "XOI") else "OIX"
    out: dict[str, Any] = {
        "strides": strides, "dilations": tuple(d + 1 for d in dilates),
        "pads_begin": padding_l, "pads_end": tuple(max(e, 0) for e in ends),
        "groups": groups, "data_format": fmt, "weights_format": weights_format}
    if transposed:
        out["output_padding"] = tuple(max(-e, 0) for e in ends)
    if primitive == "convolution_backward_data":
        out["dst_shape"] = large[2:]
    if primitive.endswith("backward_weights"):
        out["weights_shape"] = polyconv_weights_shape(family, weights_dims, ndim,
                                                        weights_format)
    return out
