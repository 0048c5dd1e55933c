"""The six public ops, their older-spec aliases, ``OPS`` and ``infer_shape``.

Each op is a thin wrapper: check the arrays' types, resolve the call into a
:class:`~polyconv.ConvPlan` (``_geometry.resolve``, shared with :func:`infer_shape`), pick the
backend, run one of its three primitives.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import Any

from . import _dispatch
from ._dispatch import _call, _prepare, call_fast, call_key
from ._geometry import ConvPlan, resolve
from ._keywords import unexpected_keyword
from ._optable import OP_TABLE, SHAPE_ARGUMENTS, OpSpec, lookup
from ._optable import spec as op_spec

IntOrSeq = int | Sequence[int]
Array = Any

def _check_keywords(name: str, kwargs: dict[str, Any], known: frozenset[str]) -> None:
    """Refuse an unknown keyword with :func:`unexpected_keyword`'s message (which names the
    polyconv spelling of PyTorch's, Keras's, JAX's or ONNX's keyword)."""
    for key, value in kwargs.items():
        if key not in known:
            raise TypeError(unexpected_keyword(name, key, value, known))


def _keywords(fn: Callable[..., Any]) -> frozenset[str]:
    params = inspect.signature(fn).parameters
    return frozenset(k for k, p in params.items()
                     if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))


#: each op's keyword parameters, by function name (read once, when the op is defined: no
#: cache lookup per call, which torch.compile would have to trace)
_KNOWN: dict[str, frozenset[str]] = {}


def _public(fn: Callable[..., Any]) -> Callable[..., Any]:
    """One of the six ops: unknown keywords refused with a hint, the parameters shared by
    every op documented from the op table. ``fn``'s body returns its parameters as Python
    bound them (``locals()``: its own messages for a wrong call), the first time a call's
    key (:func:`~polyconv._dispatch.call_key`) is met; later calls with that key go straight
    to the primitive it got."""
    spec = op_spec(fn.__name__)
    name = spec.name
    known = _KNOWN[name] = _keywords(fn)
    arrays = sum(1 for param in spec.positional if param not in SHAPE_ARGUMENTS)

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        key = call_key(name, arrays, args, kwargs)
        try:
            entry = None if key is None else _dispatch._DISPATCH.get(key)
        except TypeError:        # an array type whose dtype or shape does not hash
            key = entry = None
        if entry is not None:    # a call like one that passed every check: no binding
            run, pick = entry
            return run(*args) if pick is None else run(*pick(args))
        _check_keywords(name, kwargs, known)
        return call_fast(spec, key, args, fn(*args, **kwargs))

    if checked.__doc__:  # None under python -OO
        common = _COMMON_DOC.format(large=spec.large, wfmt=spec.weights_format)
        checked.__doc__ = checked.__doc__.replace("{common}", common.strip() + "\n")
    return checked


def _bound(spec: OpSpec, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``args`` and ``kwargs`` bound to the parameters of the function ``spec`` computes,
    defaults applied (for the older-spec aliases and for :func:`infer_shape`)."""
    fn = globals()[spec.kind].__wrapped__
    _check_keywords(spec.name, kwargs, _KNOWN[spec.kind])
    try:
        bound = inspect.signature(fn).bind_partial(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"{spec.name}() {e}") from None
    bound.apply_defaults()
    return bound.arguments


def _call_as(name: str, *args, **kwargs) -> Array:
    """An older-spec alias: the function it names, under its own name."""
    spec = op_spec(name)
    return _call(spec, _bound(spec, args, kwargs))


# --------------------------------------------------------------------------------------------
# the six ops
# --------------------------------------------------------------------------------------------

_COMMON_DOC = """
    strides, dilations : int or sequence of int, default 1
        Per spatial axis (an int is broadcast).
    pads_begin, pads_end : int or sequence of int, default 0
        Explicit zero padding of the {large} tensor, ignored when ``auto_pad`` is not none.
    auto_pad : {{"none", "same_upper", "same_lower", "valid"}}, default "none"
        Case-insensitive; ``None`` and ``"explicit"`` mean ``"none"``.
    groups : int, default 1
    data_format : {{"NXC", "NCX"}}, default "NXC"
    weights_format : {{"XIO", "OIX", "IOX", "XOI"}}, default "{wfmt}"
        Axis order of the weights; see :ref:`layouts` for what O and I mean in this
        family.
        ``filter_format`` is an alias.
    backend : str, optional
        ``"numpy"``, ``"jax"``, ``"array_api"``...; inferred from the inputs by default.
    precision : optional
        ``None`` (full precision, the default), a ``jax.lax.Precision``, one of its names
        (``"default"``, ``"high"``, ``"highest"``, ...), or a pair for (input, weights). Used
        by backends with precision modes (JAX); the others always compute at full precision.
        Checked on every backend.
"""


@_public
def convolution(src: Array, weights: Array, bias: Array | None = None, *,
                strides: IntOrSeq = 1, pads_begin: IntOrSeq = 0, pads_end: IntOrSeq = 0,
                dilations: IntOrSeq = 1, auto_pad: str | None = "none", groups: int = 1,
                data_format: str = "NXC", weights_format: str | None = None,
                backend: str | None = None, precision: Any = None,
                filter_format: str | None = None) -> Array:
    """Convolution (oneDNN Graph ``Convolution``).

    ``dst[n, oc, y] = bias[oc] + sum_{i, k} src[n, g*IC/G + i, y*s + k*d - pb] *
    W[oc, i, k]``, with ``g = oc // (OC/G)``. Output spatial size
    ``floor((X + pb + pe - ((K-1)*d + 1)) / s) + 1``.

    Parameters
    ----------
    src : array
        ``[N, X.., IC]`` (NXC) or ``[N, IC, X..]`` (NCX).
    weights : array
        ``[K.., IC/G, OC]`` for the default XIO; OIX, IOX and XOI are accepted too.
    bias : array, optional
        ``[OC]``.
    {common}
    Returns
    -------
    dst : array
        Same array type and dtype as ``src``.

    Examples
    --------
    >>> import numpy as np, polyconv
    >>> x = np.ones((1, 5, 5, 2), np.float32)
    >>> w = np.ones((3, 3, 2, 4), np.float32)
    >>> polyconv.convolution(x, w, auto_pad="same_upper").shape
    (1, 5, 5, 4)
    """
    return locals()  # exactly the parameters, bound by Python; run by _public


@_public
def convolution_backward_data(diff_dst: Array, weights: Array,
                              dst_shape: Sequence[int] | None = None, *,
                              strides: IntOrSeq = 1, pads_begin: IntOrSeq = 0,
                              pads_end: IntOrSeq = 0, dilations: IntOrSeq = 1,
                              auto_pad: str | None = "none", output_padding: IntOrSeq = 0,
                              groups: int = 1, data_format: str = "NXC",
                              weights_format: str | None = None, backend: str | None = None,
                              precision: Any = None, output_shape: Sequence[int] | None = None,
                              filter_format: str | None = None) -> Array:
    """Gradient of :func:`convolution` with respect to ``src`` (``ConvolutionBackwardData``).

    The exact adjoint of the convolution with the same attributes. Without ``dst_shape`` the
    output (``diff_src``) size is ``s*(Y-1) + (K-1)*d + 1 - pb - pe + output_padding`` and
    ``same_*`` pads use the transposed rule ``max(ek - s, 0)``; with ``dst_shape`` (alias
    ``output_shape``; the full shape or the spatial sizes) ``same_*`` pads follow the forward
    rule on that shape.

    Parameters
    ----------
    diff_dst : array
        ``[N, Y.., OC]`` (NXC) or ``[N, OC, Y..]`` (NCX).
    weights : array
        Convolution weights (``[K.., IC/G, OC]`` for XIO).
    dst_shape : sequence of int, optional
        Shape of ``diff_src``: full (``data_format`` order) or spatial only.
    output_padding : int or sequence of int, default 0
        Extra rows at the end of each axis, in ``[0, stride)``.
    {common}
    Returns
    -------
    diff_src : array

    Examples
    --------
    >>> import numpy as np, polyconv
    >>> dy = np.ones((1, 3, 3, 4), np.float32)
    >>> w = np.ones((3, 3, 2, 4), np.float32)
    >>> polyconv.convolution_backward_data(dy, w, strides=2, output_padding=1).shape
    (1, 8, 8, 2)
    """
    return locals()  # exactly the parameters, bound by Python; run by _public


@_public
def convolution_backward_weights(src: Array, diff_dst: Array,
                                 weights_shape: Sequence[int] | None = None, *,
                                 strides: IntOrSeq = 1, pads_begin: IntOrSeq = 0,
                                 pads_end: IntOrSeq = 0, dilations: IntOrSeq = 1,
                                 auto_pad: str | None = "none", groups: int = 1,
                                 data_format: str = "NXC", weights_format: str | None = None,
                                 backend: str | None = None, precision: Any = None,
                                 filter_shape: Sequence[int] | None = None,
                                 filter_format: str | None = None) -> Array:
    """Gradient of :func:`convolution` with respect to ``weights``.

    Parameters
    ----------
    src : array
        The convolution's input.
    diff_dst : array
        Gradient of the convolution's output; its spatial sizes must be the ones the
        convolution of ``src`` produces.
    weights_shape : sequence of int
        Full weights shape in ``weights_format`` order, or the spatial kernel sizes only.
        ``filter_shape`` is an alias.
    {common}
    Returns
    -------
    diff_weights : array
        In ``weights_format`` layout.

    Examples
    --------
    >>> import numpy as np, polyconv
    >>> x = np.ones((2, 6, 6, 3), np.float32)
    >>> dy = np.ones((2, 4, 4, 8), np.float32)
    >>> polyconv.convolution_backward_weights(x, dy, (3, 3)).shape
    (3, 3, 3, 8)
    """
    return locals()  # exactly the parameters, bound by Python; run by _public


@_public
def conv_transpose(src: Array, weights: Array, bias: Array | None = None, *,
                   strides: IntOrSeq = 1, pads_begin: IntOrSeq = 0, pads_end: IntOrSeq = 0,
                   dilations: IntOrSeq = 1, auto_pad: str | None = "none",
                   output_padding: IntOrSeq = 0, groups: int = 1, data_format: str = "NXC",
                   weights_format: str | None = None,
                   dst_shape: Sequence[int] | None = None, backend: str | None = None,
                   precision: Any = None, output_shape: Sequence[int] | None = None,
                   filter_format: str | None = None) -> Array:
    """Transposed convolution (oneDNN Graph ``ConvTranspose``).

    The gradient of a convolution with respect to its input, applied to ``src``, plus bias.
    Output size ``s*(X-1) + (K-1)*d + 1 - pb - pe + output_padding``; ``same_*`` pads use
    ``max((K-1)*d + 1 - s, 0)`` so that the output is ``s*X + output_padding``. With
    ``dst_shape`` (alias ``output_shape``) the output size is given and ``same_*`` pads follow
    the forward rule on it.

    Parameters
    ----------
    src : array
        ``[N, X.., IC]`` (NXC) or ``[N, IC, X..]`` (NCX).
    weights : array
        ``[K.., OC/G, IC]`` for the default XOI; ``IOX`` ``[IC, OC/G, K..]`` is PyTorch's and
        ONNX's ConvTranspose weight. OIX and XIO are accepted too.
    bias : array, optional
        ``[OC]``, added to every output position.
    output_padding : int or sequence of int, default 0
        Extra rows at the end of each axis, in ``[0, stride)``.
    dst_shape : sequence of int, optional
        Output shape: full (``data_format`` order) or spatial only.
    {common}
    Returns
    -------
    dst : array

    Examples
    --------
    >>> import numpy as np, polyconv
    >>> x = np.ones((1, 4, 4, 8), np.float32)
    >>> w = np.ones((3, 3, 2, 8), np.float32)   # XOI: [K, K, OC/G, IC]
    >>> polyconv.conv_transpose(x, w, strides=2, pads_begin=1, pads_end=1,
    ...                         output_padding=1).shape
    (1, 8, 8, 2)
    """
    return locals()  # exactly the parameters, bound by Python; run by _public


@_public
def conv_transpose_backward_data(diff_dst: Array, weights: Array, *, strides: IntOrSeq = 1,
                                 pads_begin: IntOrSeq = 0, pads_end: IntOrSeq = 0,
                                 dilations: IntOrSeq = 1, auto_pad: str | None = "none",
                                 output_padding: IntOrSeq = 0, groups: int = 1,
                                 data_format: str = "NXC", weights_format: str | None = None,
                                 backend: str | None = None, precision: Any = None,
                                 filter_format: str | None = None) -> Array:
    """Gradient of :func:`conv_transpose` with respect to ``src``.

    A strided convolution of ``diff_dst``. ``same_*`` pads use the transposed rule, the pads of
    the ConvTranspose being differentiated; a non-zero ``output_padding`` must be the one that
    ``diff_dst``'s size implies.

    Parameters
    ----------
    diff_dst : array
        Gradient of the ConvTranspose output.
    weights : array
        ConvTranspose weights (``[K.., OC/G, IC]`` for XOI).
    output_padding : int or sequence of int, default 0
    {common}
    Returns
    -------
    diff_src : array

    Examples
    --------
    >>> import numpy as np, polyconv
    >>> dy = np.ones((1, 8, 8, 2), np.float32)
    >>> w = np.ones((3, 3, 2, 8), np.float32)
    >>> polyconv.conv_transpose_backward_data(dy, w, strides=2, pads_begin=1,
    ...                                       pads_end=1, output_padding=1).shape
    (1, 4, 4, 8)
    """
    return locals()  # exactly the parameters, bound by Python; run by _public


@_public
def conv_transpose_backward_weights(src: Array, diff_dst: Array,
                                    weights_shape: Sequence[int] | None = None, *,
                                    strides: IntOrSeq = 1, pads_begin: IntOrSeq = 0,
                                    pads_end: IntOrSeq = 0, dilations: IntOrSeq = 1,
                                    auto_pad: str | None = "none",
                                    output_padding: IntOrSeq = 0, groups: int = 1,
                                    data_format: str = "NXC",
                                    weights_format: str | None = None,
                                    backend: str | None = None, precision: Any = None,
                                    filter_shape: Sequence[int] | None = None,
                                    filter_format: str | None = None) -> Array:
    """Gradient of :func:`conv_transpose` with respect to ``weights``.

    Parameters
    ----------
    src : array
        The ConvTranspose's input.
    diff_dst : array
        Gradient of the ConvTranspose's output.
    weights_shape : sequence of int
        Full weights shape in ``weights_format`` order, or the spatial kernel sizes only.
        ``filter_shape`` is an alias.
    output_padding : int or sequence of int, default 0
    {common}
    Returns
    -------
    diff_weights : array
        In ``weights_format`` layout.

    Examples
    --------
    >>> import numpy as np, polyconv
    >>> x = np.ones((1, 4, 4, 8), np.float32)
    >>> dy = np.ones((1, 8, 8, 2), np.float32)
    >>> polyconv.conv_transpose_backward_weights(x, dy, (3, 3), strides=2, pads_begin=1,
    ...                                          pads_end=1, output_padding=1).shape
    (3, 3, 2, 8)
    """
    return locals()  # exactly the parameters, bound by Python; run by _public


# --------------------------------------------------------------------------------------------
# older-spec aliases
# --------------------------------------------------------------------------------------------


def convolution_backprop_data(diff_dst: Array, weights: Array,
                              output_shape: Sequence[int] | None = None, **attrs) -> Array:
    """``ConvolutionBackpropData-1``: :func:`convolution_backward_data` by its older name.

    Accepts ``output_shape`` (= ``dst_shape``) and ``filter_format`` (= ``weights_format``).
    """
    return _call_as("convolution_backprop_data", diff_dst, weights, output_shape=output_shape,
                    **attrs)


def convolution_backprop_filters(src: Array, diff_dst: Array,
                                 filter_shape: Sequence[int] | None = None, **attrs) -> Array:
    """``ConvolutionBackpropFilters-1``: :func:`convolution_backward_weights` by its older name.

    Accepts ``filter_shape`` (= ``weights_shape``) and ``filter_format``.
    """
    return _call_as("convolution_backprop_filters", src, diff_dst, filter_shape=filter_shape,
                    **attrs)


def conv_transpose_backprop_filters(src: Array, diff_dst: Array,
                                    filter_shape: Sequence[int] | None = None,
                                    **attrs) -> Array:
    """``ConvTransposeBackpropFilters-1``: :func:`conv_transpose_backward_weights`.

    Accepts ``filter_shape`` and ``filter_format``. As in the older spec, the default
    ``filter_format`` is ``"XIO"`` (``[K.., IC, OC/G]``: I is the ConvTranspose's input
    channels, O its output channels per group).
    """
    return _call_as("conv_transpose_backprop_filters", src, diff_dst, filter_shape=filter_shape,
                    **attrs)


# --------------------------------------------------------------------------------------------
# OPS and infer_shape
# --------------------------------------------------------------------------------------------

OPS: MappingProxyType[str, Callable[..., Any]] = MappingProxyType({
    name: globals()[spec.name] for spec in OP_TABLE for name in spec.ops_names})
"""Every op name (oneDNN Graph names and older-spec names, with and without ``-1``) -> function."""


def infer_shape(op: str | Callable[..., Any], *input_shapes: Sequence[int] | None,
                **attrs: Any) -> ConvPlan:
    """Shape inference with no arrays: the output shape and the resolved pads of a call.

    Parameters
    ----------
    op : str or callable
        A name from :data:`OPS` (``"ConvTranspose"``, ``"ConvolutionBackpropData-1"``...), a
        polyconv function name (``"conv_transpose"``) or the function itself.
    *input_shapes : sequence of int
        The shapes of the op's positional inputs, in order (``None`` for an absent optional
        one): ``(src, weights[, bias])`` for Convolution and ConvTranspose,
        ``(diff_dst, weights[, dst_shape])`` for the data gradients and
        ``(src, diff_dst, weights_shape)`` for the weights gradients.
    **attrs
        The op's keyword attributes (``strides``, ``auto_pad``, ``dst_shape``...).

    Returns
    -------
    ConvPlan
        ``.shape`` is the output shape, ``.pads_begin``/``.pads_end`` the resolved pads; the
        rest describes the canonical convolution. Errors are those the op itself raises.

    Examples
    --------
    >>> import polyconv
    >>> r = polyconv.infer_shape("ConvTranspose", (8, 32, 32, 64), (3, 3, 64, 64),
    ...                          strides=2, auto_pad="same_upper", output_padding=1)
    >>> r.shape, r.pads_begin, r.pads_end
    ((8, 65, 65, 64), (0, 0), (1, 1))
    """
    spec = lookup(op, who="infer_shape")
    if len(input_shapes) > len(spec.positional):
        msg = (f"{spec.name}() takes at most {len(spec.positional)} positional inputs "
               f"({', '.join(spec.positional)}); got {len(input_shapes)}")
        raise TypeError(msg)
    arguments = _bound(spec, input_shapes, attrs)
    for required in spec.positional:
        if required not in (*SHAPE_ARGUMENTS, "bias") and arguments.get(required) is None:
            msg = f"{spec.name}() missing the shape of required input {required!r}"
            raise TypeError(msg)
    shapes, attrs, dst_shape, weights_shape = _prepare(spec, arguments)
    present = {name: shape for name, shape in shapes.items() if shape is not None}
    return resolve(spec, present, attrs, dst_shape=dst_shape, weights_shape=weights_shape)
