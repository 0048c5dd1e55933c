"""oneDNN's primitive API: ``convolution_forward``, ``convolution_backward_data``,
``convolution_backward_weights`` and the three ``deconvolution_*`` primitives, argument for
argument, and benchdnn's problem descriptors (docs/frameworks.md#onednn).

oneDNN's conventions, as its ``conv_desc_init`` / ``deconv_desc_init`` check them:
``strides``; ``padding_l`` (``>= 0``) and ``padding_r`` (``padding_r + stride > 0``: a negative
right pad leaves input positions unread); ``dilates`` counted from 0 (0 is a dense kernel,
polyconv's dilation 1); groups as the weights' leading ``g`` axis (``goihw``: ``[G, OC/G,
IC/G, K..]``, for a deconvolution too, where ``o`` is its dst's channels); dims always in
the logical order ``[N, C, D, H, W]`` and ``[G, O, I, KD, KH, KW]``, the arrays' axis order
given by a memory format tag (``nchw``, ``nhwc``, ``abcd``, ``hwio``, ``gohwi``...). Per
spatial axis the sizes must satisfy ``(large - ek + padding_l + padding_r) / stride + 1 ==
small`` in C's integer division (``ek = (k - 1) * (dilate + 1) + 1``; the large tensor is
src for a convolution, dst for a deconvolution).

polyconv's pads are ``>= 0`` and its ``output_padding`` below the stride, so the right pad
passed on is the one the sizes imply, ``e = (small - 1) * stride + ek - padding_l - large``
(what oneDNN reads or writes: a larger ``padding_r`` only pads zeros that no output reads,
as C's truncation allows): ``pads_end = max(e, 0)``, and a negative ``e`` is positions past
the last product (``output_padding = -e`` on a deconvolution). ``e <= -stride`` (a negative
right pad that drops a whole stride of input) has no polyconv equivalent: a ``ValueError``
says so. Nothing here imports a framework.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._benchdnn import Call, Problem, parse_batch, parse_descriptor
from ._onednn_rules import (
    PRIMITIVES,
    attributes,
    data_format,
    keywords,
    other_sizes,
    weights_axes,
)

__all__ = ["PRIMITIVES", "Call", "Problem", "convolution_backward_data",
           "convolution_backward_weights", "convolution_forward", "deconvolution_backward_data",
           "deconvolution_backward_weights", "deconvolution_forward", "keywords",
           "parse_batch", "parse_descriptor"]


def _logical(shape: Sequence[int], order: Sequence[int]) -> tuple[int, ...]:
    dims = [0] * len(order)
    for axis, j in enumerate(order):
        dims[j] = int(shape[axis])
    return tuple(dims)


def _data_dims(who: str, role: str, x: Any, tag: Any) -> tuple[int, ...]:
    shape = tuple(x.shape)
    fmt = data_format(who, role, tag, len(shape))
    return shape if fmt == "NCX" else (shape[0], shape[-1], *shape[1:-1])


def _weights_in(who: str, family: str, w: Any, tag: Any, ndim: int):
    """The weights' logical dims, and the array polyconv reads (``OIX`` where the tag is no
    polyconv format)."""
    from polyconv._weights import convert_axes

    axes = weights_axes(who, "weights", tag, len(w.shape), ndim)
    logical = ("G" if len(w.shape) == ndim + 3 else "") + "OI" + "X"
    order = [logical.index(c) + (n if c == "X" else 0) for c in axes
             for n in (range(ndim) if c == "X" else (0,))]
    dims = _logical(w.shape, order)
    if axes in ("OIX", "XIO", "IOX", "XOI"):
        return dims, w
    return dims, convert_axes(w, axes, "OIX", family=family)


def _run(primitive: str, first: Any, second: Any, bias: Any, dims: Sequence[int] | None,
         attrs: dict[str, Any]) -> Any:
    """A primitive on arrays: ``first`` is src (forward, backward weights) or diff_dst
    (backward data), ``second`` the weights or (backward weights) diff_dst; ``dims`` the
    dims of the output that the arrays do not give."""
    import polyconv
    from polyconv._weights import convert_axes

    family, fn = PRIMITIVES[primitive]
    direction = primitive.split("_", 1)[1]
    who = f"onednn {primitive}"
    tags = {k: attrs.pop(k, None) for k in ("src_tag", "weights_tag", "dst_tag")}
    tags["src_tag"] = tags["src_tag"] or tags["dst_tag"]
    tags["dst_tag"] = tags["dst_tag"] or tags["src_tag"]
    ndim = len(first.shape) - 2
    if direction == "backward_weights":
        src_dims = _data_dims(who, "src", first, tags["src_tag"])
        dst_dims = _data_dims(who, "dst", second, tags["dst_tag"])
        w_dims = tuple(int(v) for v in dims)
        kw = keywords(primitive, src_dims, w_dims, dst_dims, **attrs, **tags)
        out = getattr(polyconv, fn)(first, second, **kw)
        axes = weights_axes(who, "weights", tags["weights_tag"], len(w_dims), ndim)
        if axes == kw["weights_format"]:
            return out
        return convert_axes(out, kw["weights_format"], axes, family=family,
                            groups=kw["groups"])
    w_dims, weights = _weights_in(who, family, second, tags["weights_tag"], ndim)
    if direction == "forward":
        src_dims = _data_dims(who, "src", first, tags["src_tag"])
        kw = keywords(primitive, src_dims, w_dims, dims, **attrs, **tags)
        return getattr(polyconv, fn)(first, weights, bias, **kw)
    dst_dims = _data_dims(who, "dst", first, tags["dst_tag"])
    src_dims = (tuple(int(v) for v in dims) if dims is not None else
                _backward_src_dims(who, family, dst_dims, w_dims, attrs))
    kw = keywords(primitive, src_dims, w_dims, dst_dims, **attrs, **tags)
    return getattr(polyconv, fn)(first, weights, **kw)


def _backward_src_dims(who, family, dst_dims, w_dims, attrs) -> tuple[int, ...]:
    """A backward-data call's src dims where none are given: a convolution's src with no
    remainder, a deconvolution's by the rule (C's division)."""
    ndim = len(dst_dims) - 2
    attributes_ = attributes(who, ndim, attrs.get("strides", 1), attrs.get("padding_l", 0),
                             attrs.get("padding_r"), attrs.get("dilates", 0))
    g = w_dims[0] if len(w_dims) == ndim + 3 else 1
    return (dst_dims[0], g * w_dims[-ndim - 1],
            *other_sizes(dst_dims[2:], family == "convolution", w_dims[-ndim:], *attributes_))


def convolution_forward(src: Any, weights: Any, bias: Any = None, *,
                        dst_dims: Sequence[int] | None = None, **attrs: Any) -> Any:
    """``dnnl::convolution_forward``: ``dst`` from ``src``, ``weights`` (``[G,] O, I, K..``)
    and ``bias``. ``attrs``: ``strides``, ``padding_l``, ``padding_r``, ``dilates`` and the
    tags ``src_tag``, ``weights_tag``, ``dst_tag`` (default plain, ``nchw``/``oihw``).

    Examples
    --------
    >>> import numpy as np
    >>> from polyconv.dialects import onednn
    >>> x, w = np.ones((1, 5, 5, 4), np.float32), np.ones((2, 3, 2, 3, 3), np.float32)
    >>> onednn.convolution_forward(x, w, strides=2, padding_l=1, src_tag="nhwc",
    ...                            weights_tag="goihw").shape           # 2 groups
    (1, 3, 3, 6)
    """
    return _run("convolution_forward", src, weights, bias, dst_dims, attrs)


def convolution_backward_data(diff_dst: Any, weights: Any, *,
                              diff_src_dims: Sequence[int] | None = None,
                              **attrs: Any) -> Any:
    """``dnnl::convolution_backward_data``: ``diff_src`` (logical dims ``diff_src_dims``;
    default the size with no remainder) from ``diff_dst`` and ``weights``."""
    return _run("convolution_backward_data", diff_dst, weights, None, diff_src_dims, attrs)


def convolution_backward_weights(src: Any, diff_dst: Any, *,
                                 diff_weights_dims: Sequence[int], **attrs: Any) -> Any:
    """``dnnl::convolution_backward_weights``: ``diff_weights`` (logical dims
    ``diff_weights_dims``, ``[G,] O, I, K..``, in ``weights_tag``'s layout) from ``src`` and
    ``diff_dst``. oneDNN's optional ``diff_bias`` is ``diff_dst`` summed over all but the
    channel axis; polyconv has no op for it."""
    return _run("convolution_backward_weights", src, diff_dst, None, diff_weights_dims,
                attrs)


def deconvolution_forward(src: Any, weights: Any, bias: Any = None, *,
                          dst_dims: Sequence[int] | None = None, **attrs: Any) -> Any:
    """``dnnl::deconvolution_forward``: weights ``[G,] O, I, K..`` with ``O`` the dst's
    channels; ``dst_dims`` default: the size with no remainder (benchdnn's choice).

    Examples
    --------
    >>> import numpy as np
    >>> from polyconv.dialects import onednn
    >>> x, w = np.ones((1, 4, 7, 7), np.float32), np.ones((8, 4, 3, 3), np.float32)
    >>> onednn.deconvolution_forward(x, w, strides=2, padding_l=1, padding_r=0).shape
    (1, 8, 14, 14)
    """
    return _run("deconvolution_forward", src, weights, bias, dst_dims, attrs)


def deconvolution_backward_data(diff_dst: Any, weights: Any, *,
                                diff_src_dims: Sequence[int] | None = None,
                                **attrs: Any) -> Any:
    """``dnnl::deconvolution_backward_data``: ``diff_src`` from ``diff_dst`` and ``weights``."""
    return _run("deconvolution_backward_data", diff_dst, weights, None, diff_src_dims, attrs)


def deconvolution_backward_weights(src: Any, diff_dst: Any, *,
                                   diff_weights_dims: Sequence[int], **attrs: Any) -> Any:
    """``dnnl::deconvolution_backward_weights``: ``diff_weights`` (``[G,] O, I, K..``)."""
    return _run("deconvolution_backward_weights", src, diff_dst, None, diff_weights_dims,
                attrs)
