"""Other frameworks' own convolutions ("peers"), called with a polyconv call's meaning.

``polyconv compare --peers`` asks whether PyTorch, onnxruntime, the ONNX reference, ``lax``,
OpenVINO, TensorFlow, Keras and Flax compute what polyconv's contract says for one call. Each
peer translates a resolved :class:`~polyconv.ConvPlan` (pads, strides, dilations, groups,
output_padding already resolved) into its framework's own call, once, here; the
channels-last ones choose among the paddings their framework takes the one that its dialect
(:mod:`polyconv.dialects`) reads back as the plan's, so each framework's padding rule stays
written once. Where the framework has no way to say the call a peer raises
:class:`CannotExpress` naming the attribute. A peer imports its framework
only when it runs, so ``import polyconv`` stays light.

Every peer gets its operands in the framework-neutral form the ONNX operators take: data
channels-first (``NCX``) and weights canonical ``[Cb, Ca/G, K..]``, which is ONNX's and
PyTorch's ``W`` for both Conv (``[OC, IC/G, K..]``) and ConvTranspose (``[IC, OC/G, K..]``);
it returns its output channels-first. The verdict uses the same float64 reference and error
bound as polyconv's own backends (:func:`polyconv.compare`).
"""

from __future__ import annotations

import functools
import importlib.util
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._formatting import _json_float

__all__ = ["PEERS", "CannotExpress", "Peer", "PeerResult", "onnx_model", "peer_names",
           "peer_operands", "peer_output"]

#: The ops a peer computes: the forward op of each family, and their data and weights
#: gradients (by the peer's own autodiff of its forward op).
FORWARD_OPS = ("convolution", "conv_transpose")
PEER_OPS = (*FORWARD_OPS, "convolution_backward_data", "convolution_backward_weights",
            "conv_transpose_backward_data", "conv_transpose_backward_weights")


class CannotExpress(Exception):
    """The peer's own operator has no way to say this call."""

    def __init__(self, attribute: str, why: str):
        super().__init__(f"{attribute}: {why}")
        self.attribute, self.why = attribute, why


@dataclass(frozen=True)
class Peer:
    """One framework's own operator.

    ``run(plan, x, w, bias)`` takes ``x`` channels-first, ``w`` as ``[Cb, Ca/G, K..]`` and
    ``bias`` (or ``None``), all numpy arrays of the call's dtype, and returns the output
    channels-first as an array numpy can read.
    """

    name: str
    run: Callable[..., Any]
    modules: tuple[str, ...] = ()
    install: str = ""
    #: ``grad(plan, x, w, dy, wrt)``: the gradient of the family's forward ``plan`` with
    #: respect to ``wrt`` (``"src"`` or ``"weights"``), as ``run`` takes and gives arrays;
    #: ``None`` where the framework has none, ``no_grad`` saying why.
    grad: Callable[..., Any] | None = None
    no_grad: str = ""
    #: ``convention(plan, attrs)``: a note where the peer was given the call in another form
    #: than the user's because its framework's convention differs (or ``""``).
    convention: Callable[..., str] | None = None
    #: The version to report, where the distribution's alone is not enough (imports it).
    describe: Callable[[], str] | None = None

    @property
    def version(self) -> str | None:
        """The installed version of the distribution it runs (its last module's name)."""
        from importlib import metadata

        if self.describe is not None:
            return self.describe()
        try:
            return metadata.version(self.modules[-1]) if self.modules else None
        except metadata.PackageNotFoundError:
            return None

    @property
    def available(self) -> bool:
        """Whether every module it imports is installed (nothing is imported to find out)."""
        return all(importlib.util.find_spec(m) is not None for m in self.modules)


@dataclass(frozen=True)
class PeerResult:
    """How one peer did on one call.

    ``status`` is ``"agrees"`` (within the error bound; ``detail`` may note a documented
    difference of convention the call was given around), ``"disagrees"`` (beyond it, or a
    wrong shape: ``max_ratio``, ``max_abs_error`` and ``where``, the output index of the
    largest err/bound), ``"cannot express"`` (``detail`` names the attribute and why) or
    ``"raises"`` (the peer's own operator raised on a call it accepts: ``detail``).
    """

    peer: str
    status: str
    max_abs_error: float = math.nan
    max_ratio: float = math.nan
    where: tuple[int, ...] | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (non-finite floats become strings)."""
        return {"peer": self.peer, "status": self.status,
                "max_abs_error": _json_float(self.max_abs_error),
                "max_ratio": _json_float(self.max_ratio),
                "where": None if self.where is None else list(self.where),
                "detail": self.detail}

    def __str__(self) -> str:
        if self.status == "agrees":
            note = f"; {self.detail}" if self.detail else ""
            return f"agrees (err/bound {self.max_ratio:.2g}){note}"
        if self.status == "disagrees":
            at = "" if self.where is None else f" at {self.where}"
            return (f"DISAGREES: max abs error {self.max_abs_error:.3g}, err/bound "
                    f"{self.max_ratio:.3g}{at}{'; ' + self.detail if self.detail else ''}")
        return f"{self.status}: {self.detail}"


# --------------------------------------------------------------------------------------------
# a framework's call, run forward or differentiated by the framework's own autodiff
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Call:
    """One framework's own operator on one plan: ``fn(x, w, b)`` on the framework's arrays
    (``b`` may be ``None``), ``x`` and ``w`` numpy in the framework's layouts, ``kind`` the
    array library (``"torch"``, ``"jax"``, ``"tensorflow"``) whose autodiff gives the
    gradients; ``kernel_back`` turns a kernel-shaped array back into ``[Cb, Ca/G, K..]``."""

    kind: str
    fn: Callable[..., Any]
    x: np.ndarray
    w: np.ndarray
    channels_last: bool = False
    kernel_back: Callable[[np.ndarray], np.ndarray] = lambda g: g
    #: ``(attribute, why)`` where the framework has no gradient of this call
    no_grad: tuple[str, str] | None = None


def _tensor(kind: str, a):
    if a is None:
        return None
    if kind == "torch":
        import torch

        return torch.from_numpy(np.asarray(a, np.float64)).to(getattr(torch, str(a.dtype)))
    if kind == "jax":
        import jax.numpy as jnp

        return jnp.asarray(a)
    if kind == "tensorflow":
        import tensorflow as tf

        return tf.constant(a)
    raise CannotExpress("backend", f"this peer has no way to run arrays of {kind!r}")


def _numpy(kind: str, y) -> np.ndarray:
    if kind == "torch":
        return y.detach().double().numpy()
    return np.asarray(y).astype(np.float64)


def _forward(make: Callable[..., _Call]) -> Callable[..., np.ndarray]:
    """A peer's ``run``: the call made by ``make(plan, x, w)`` run forward, channels-first."""

    def run(plan, x, w, bias):
        call = make(plan, x, w)
        if call.kind == "torch":
            import torch

            with torch.no_grad():
                y = call.fn(*(_tensor("torch", a) for a in (call.x, call.w, bias)))
        else:
            y = call.fn(*(_tensor(call.kind, a) for a in (call.x, call.w, bias)))
        y = _numpy(call.kind, y)
        return np.moveaxis(y, -1, 1) if call.channels_last else y

    return run


def _vjp(call: _Call, dy: np.ndarray, wrt: str) -> np.ndarray:
    """The framework's own gradient of ``call`` with respect to ``wrt`` (``"src"`` or
    ``"weights"``) for the output cotangent ``dy`` (in the framework's layout)."""
    kind = call.kind
    x, w, g = (_tensor(kind, a) for a in (call.x, call.w, dy))
    if kind == "torch":
        import torch

        target = (x if wrt == "src" else w).requires_grad_(True)
        (out,) = torch.autograd.grad(call.fn(x, w, None), target, g)
    elif kind == "jax":
        import jax

        f = (lambda a: call.fn(a, w, None)) if wrt == "src" else (lambda a: call.fn(x, a, None))
        y, pull = jax.vjp(f, x if wrt == "src" else w)
        (out,) = pull(g.astype(y.dtype))
    else:
        import tensorflow as tf

        target = x if wrt == "src" else w
        with tf.GradientTape() as tape:
            tape.watch(target)
            y = call.fn(x, w, None)
        out = tape.gradient(y, target, output_gradients=g)
    return _numpy(kind, out)


def _gradient(make: Callable[..., _Call]) -> Callable[..., np.ndarray]:
    """A peer's ``grad``: ``grad(plan, x, w, dy, wrt)`` on the family's forward ``plan``,
    operands channels-first and ``[Cb, Ca/G, K..]``, by the framework's autodiff."""

    def grad(plan, x, w, dy, wrt):
        call = make(plan, x, w)
        if call.no_grad is not None:
            raise CannotExpress(*call.no_grad)
        if call.channels_last:
            dy = _nxc(dy)
        g = _vjp(call, dy, wrt)
        if wrt == "weights":
            return call.kernel_back(g)
        return np.moveaxis(g, -1, 1) if call.channels_last else g

    return grad


# --------------------------------------------------------------------------------------------
# the translations, one per peer
# --------------------------------------------------------------------------------------------


def _transposed(plan) -> bool:
    return plan.primitive == "backward_data"


#: ONNX Conv and ConvTranspose take these element types (bfloat16 is not among them).
_ONNX_DTYPES = ("float16", "float32", "float64")


def onnx_attributes(plan, auto_pad: str | None = None,
                    output_shape: Sequence[int] | None = None) -> dict[str, Any]:
    """The ONNX node attributes of ``plan``'s Conv / ConvTranspose: explicit pads, or
    ``auto_pad`` (ONNX's string) in their place, and ConvTranspose's ``output_shape``."""
    attrs = {"strides": list(plan.strides), "dilations": list(plan.dilations),
             "group": plan.groups, "kernel_shape": list(plan.kernel)}
    if auto_pad is None:
        attrs["pads"] = [*plan.pads_begin, *plan.pads_end]
    else:
        attrs["auto_pad"] = auto_pad
    if _transposed(plan) and any(plan.output_padding):
        attrs["output_padding"] = list(plan.output_padding)
    if output_shape is not None:
        attrs["output_shape"] = list(output_shape)
    return attrs


def onnx_auto_pad(plan) -> dict[str, Any] | None:
    """The ONNX attributes with ``auto_pad`` (and ConvTranspose's ``output_shape`` where it
    takes one) that the ONNX dialect reads back as ``plan``'s pads, so the ONNX peers' own
    SAME_UPPER / SAME_LOWER / VALID rules are checked; else ``None``: explicit pads, as where
    ONNX's ConvTranspose SAME puts output_padding into the pads (docs/frameworks.md)."""
    from .dialects import onnx as dialect

    op_type = "ConvTranspose" if _transposed(plan) else "Conv"
    x_shape = (plan.batch, plan.b_channels if _transposed(plan) else plan.a_channels,
               *(plan.b_spatial if _transposed(plan) else plan.a_spatial))
    w_shape = (plan.b_channels, plan.a_channels // plan.groups, *plan.kernel)
    for output_shape in ((None, list(plan.a_spatial)) if _transposed(plan) else (None,)):
        for auto_pad in ("SAME_UPPER", "SAME_LOWER", "VALID"):
            attrs = onnx_attributes(plan, auto_pad, output_shape)
            kw = _dialect_keywords(dialect.keywords, op_type, x_shape, w_shape, **attrs)
            if kw is not None and _means(plan, kw, x_shape, w_shape):
                return attrs
    return None


def _onnx_convention(plan, attrs: dict[str, Any]) -> str:
    """Where the call's ``auto_pad`` with ``output_padding`` reaches the ONNX peers in
    another form (ONNX's ConvTranspose SAME_* puts output_padding into the pads), how."""
    mode = str(attrs.get("auto_pad") or "").lower()
    if plan.op != "conv_transpose" or mode not in ("same_upper", "same_lower") or \
            not any(plan.output_padding):
        return ""
    onnx = onnx_auto_pad(plan)
    given = ("explicit pads" if onnx is None else
             f"auto_pad={onnx['auto_pad']} with output_shape={onnx.get('output_shape')}")
    return (f"auto_pad={mode} with output_padding {plan.output_padding} given as {given}: "
            f"ONNX's ConvTranspose {mode.upper()} alone puts output_padding into the pads, a "
            "documented difference of convention (docs/frameworks.md#onnx)")


def onnx_model(plan, dtype: str, with_bias: bool, opset: int = 17,
               attributes: dict[str, Any] | None = None):
    """A one-node ONNX model of ``plan`` (inputs ``X``, ``W`` and ``B`` if ``with_bias``;
    output ``Y``), for the ONNX peers (with :func:`onnx_auto_pad`'s attributes where they
    mean the plan's pads) and ``polyconv cases export`` (explicit pads)."""
    if dtype not in _ONNX_DTYPES:
        raise CannotExpress("dtype", f"{dtype}: ONNX Conv and ConvTranspose take float16, "
                                     f"float and double only")
    from onnx import helper

    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    op_type = "ConvTranspose" if _transposed(plan) else "Conv"
    names = ["X", "W", "B"] if with_bias else ["X", "W"]
    x_shape, y_shape = _ncx(plan, plan.b_shape if _transposed(plan) else plan.a_shape), \
        _ncx(plan, plan.shape)
    w_shape = (plan.b_channels, plan.a_channels // plan.groups, *plan.kernel)
    shapes = [x_shape, w_shape, (plan.bias_channels,)][:len(names)]
    node = helper.make_node(op_type, names, ["Y"], **(attributes or onnx_attributes(plan)))
    graph = helper.make_graph(
        [node], f"polyconv_{op_type}",
        [helper.make_tensor_value_info(n, elem, list(s)) for n, s in zip(names, shapes)],
        [helper.make_tensor_value_info("Y", elem, list(y_shape))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             producer_name="polyconv")


def _ncx(plan, shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(shape)
    return (shape[0], shape[-1], *shape[1:-1]) if plan.channels_last else shape


def _onnx_feeds(x, w, bias) -> dict[str, np.ndarray]:
    feeds = {"X": np.ascontiguousarray(x), "W": np.ascontiguousarray(w)}
    if bias is not None:
        feeds["B"] = np.ascontiguousarray(bias)
    return feeds


def _onnxruntime(plan, x, w, bias):
    import onnxruntime as ort

    model = onnx_model(plan, str(x.dtype), bias is not None,
                       attributes=onnx_auto_pad(plan))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, _onnx_feeds(x, w, bias))[0]


def _onnx_reference(plan, x, w, bias):
    from onnx.reference import ReferenceEvaluator

    model = onnx_model(plan, str(x.dtype), bias is not None,
                       attributes=onnx_auto_pad(plan))
    return ReferenceEvaluator(model).run(None, _onnx_feeds(x, w, bias))[0]


def _torch_pads(plan) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """PyTorch's ``padding`` and ``output_padding`` for ``plan``: one pad per axis for both
    sides; a transposed call's end crop is ``padding - output_padding``."""
    begin, end = plan.pads_begin, plan.pads_end
    if not _transposed(plan):
        if begin != end:
            raise CannotExpress("pads_begin/pads_end", f"asymmetric pads {begin}/{end}: "
                                "torch.nn.functional.conv{n}d takes one pad per axis for "
                                "both sides".format(n=plan.ndim))
        return begin, (0,) * plan.ndim
    opad = tuple(b - e + o for b, e, o in zip(begin, end, plan.output_padding))
    limits = tuple(max(s, d) for s, d in zip(plan.strides, plan.dilations))
    if any(not 0 <= o < m for o, m in zip(opad, limits)):
        raise CannotExpress("pads_begin/pads_end/output_padding", (
            f"pads {begin}/{end} with output_padding {plan.output_padding} need PyTorch's "
            f"output_padding {opad}, outside 0 <= output_padding < max(stride, dilation) "
            f"{limits}"))
    return begin, opad


def _torch_call(plan, x, w) -> _Call:
    import torch.nn.functional as F

    if plan.ndim not in (1, 2, 3):
        raise CannotExpress("rank", f"{plan.ndim} spatial axes: torch.nn.functional has 1, "
                                    "2 and 3")
    padding, opad = _torch_pads(plan)
    kw = {"stride": plan.strides, "padding": padding, "dilation": plan.dilations,
          "groups": plan.groups}
    if _transposed(plan):
        conv = getattr(F, f"conv_transpose{plan.ndim}d")
        return _Call("torch", lambda x, w, b: conv(x, w, b, output_padding=opad, **kw), x, w)
    conv = getattr(F, f"conv{plan.ndim}d")
    return _Call("torch", lambda x, w, b: conv(x, w, b, **kw), x, w)


def _lax_transpose_pairs(plan) -> list[tuple[int, int]]:
    """``lax.conv_transpose``'s ``padding`` for a transposed ``plan``: it pads the
    stride-dilated input, the complement of the forward pads within the kernel; checked
    against the JAX dialect's reading of it (the one translation of lax's convention)."""
    from .dialects.jax import transpose_pads

    pairs = [(ek - 1 - b, ek - 1 - e + o) for ek, b, e, o in zip(
        plan.effective_kernel, plan.pads_begin, plan.pads_end, plan.output_padding)]
    try:
        pads = transpose_pads("lax.conv_transpose", pairs, plan.strides,
                              plan.effective_kernel)
    except ValueError as exc:
        raise CannotExpress("pads_begin/pads_end/output_padding", str(exc)) from None
    if _end_crops(pads) != _end_crops(_pads_of(plan)):
        raise AssertionError(f"lax padding {pairs} reads back as {pads}")
    return pairs


def _lax_call(plan, x, w) -> _Call:
    from jax import lax

    sp = "DHW"[-plan.ndim:] if plan.ndim <= 3 else "".join(str(i) for i in range(plan.ndim))
    dn = (f"NC{sp}", f"OI{sp}", f"NC{sp}")
    shape = (1, -1) + (1,) * plan.ndim

    def with_bias(y, b):
        return y if b is None else y + b.reshape(shape)

    if _transposed(plan):
        if plan.groups != 1:
            raise CannotExpress("groups", f"groups={plan.groups}: jax.lax.conv_transpose has "
                                          "no feature_group_count")
        pairs = _lax_transpose_pairs(plan)
        return _Call("jax", lambda x, w, b: with_bias(lax.conv_transpose(
            x, w, plan.strides, pairs, rhs_dilation=plan.dilations, dimension_numbers=dn,
            transpose_kernel=True, precision=lax.Precision.HIGHEST), b), x, w)
    pads = list(zip(plan.pads_begin, plan.pads_end))
    return _Call("jax", lambda x, w, b: with_bias(lax.conv_general_dilated(
        x, w, plan.strides, pads, rhs_dilation=plan.dilations, dimension_numbers=dn,
        feature_group_count=plan.groups, precision=lax.Precision.HIGHEST), b), x, w)


def _openvino(plan, x, w, bias):
    import openvino as ov
    import openvino.opset15 as ops

    if str(x.dtype) not in ("float32", "float16"):
        raise CannotExpress("dtype", f"{x.dtype}: this peer feeds OpenVINO numpy float16 and "
                                     "float32 arrays only")
    if any(p < 0 for p in (*plan.pads_begin, *plan.pads_end)):
        raise CannotExpress("pads_begin/pads_end", f"negative pads {plan.pads_begin}/"
                                                   f"{plan.pads_end}: OpenVINO's are >= 0")
    g = plan.groups
    param = ops.parameter(list(x.shape), x.dtype)
    kw = {"strides": list(plan.strides), "pads_begin": list(plan.pads_begin),
          "pads_end": list(plan.pads_end), "dilations": list(plan.dilations)}
    if g > 1:   # OpenVINO's group filters: [G, Cb/G, Ca/G, K..] for both directions
        w = w.reshape(g, plan.b_channels // g, plan.a_channels // g, *plan.kernel)
    if _transposed(plan):
        op = ops.group_convolution_backprop_data if g > 1 else ops.convolution_backprop_data
        node = op(param, ops.constant(w), output_padding=list(plan.output_padding), **kw)
    else:
        op = ops.group_convolution if g > 1 else ops.convolution
        node = op(param, ops.constant(w), **kw)
    if bias is not None:
        node = ops.add(node, ops.constant(bias.reshape((1, -1) + (1,) * plan.ndim)))
    # f32 inference precision: OpenVINO may otherwise compute in bf16 on CPUs that have it
    compiled = ov.compile_model(ov.Model([node], [param]), "CPU",
                                {"INFERENCE_PRECISION_HINT": "f32"})
    return compiled(x)[0]


# --------------------------------------------------------------------------------------------
# channels-last peers (TensorFlow, Keras, Flax): their arguments found through the dialects
# --------------------------------------------------------------------------------------------


def _pads_of(plan) -> dict[str, tuple[int, ...]]:
    return {"pads_begin": plan.pads_begin, "pads_end": plan.pads_end,
            "output_padding": plan.output_padding}


def _end_crops(pads: dict[str, tuple[int, ...]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The begin and end crops that pads mean (only ``pads_end - output_padding`` counts)."""
    opad = pads.get("output_padding") or (0,) * len(pads["pads_begin"])
    return tuple(pads["pads_begin"]), tuple(e - o for e, o in zip(pads["pads_end"], opad))


def _nxc(x):
    return np.ascontiguousarray(np.moveaxis(x, 1, -1))


def _kernel_last(plan, w):
    """``[Cb, Ca/G, K..]`` as TensorFlow's, Keras's and Flax's kernel: ``[K.., Ca/G, Cb]``
    (``XIO``) for a convolution, ``[K.., Ca, Cb]`` (``XOI``) transposed (groups of 1)."""
    return np.ascontiguousarray(np.moveaxis(w, (0, 1), (-1, -2)))


def _kernel_back(plan, g):
    """A kernel-shaped gradient from :func:`_kernel_last`'s layout (or TensorFlow's
    depthwise ``[KH, KW, IC, multiplier]``) back to ``[Cb, Ca/G, K..]``."""
    g = g.reshape(*plan.kernel, plan.w_shape[1], plan.w_shape[0])
    return np.ascontiguousarray(np.moveaxis(g, (-1, -2), (0, 1)))


def _means(plan, keywords: dict[str, Any], src_shape, weights_shape) -> bool:
    """Whether a dialect's keywords, on these shapes, resolve to ``plan``'s geometry."""
    from ._ops import infer_shape

    fn = "conv_transpose" if _transposed(plan) else "convolution"
    try:
        got = infer_shape(fn, src_shape, weights_shape, **keywords)
    except (ValueError, TypeError):
        return False
    same = ("primitive", "groups", "a_spatial", "b_spatial", "kernel", "strides", "dilations")
    return (all(getattr(got, f) == getattr(plan, f) for f in same)
            and _end_crops(_pads_of(got)) == _end_crops(_pads_of(plan)))


def _first_meaning(plan, candidates, who: str, allowed: str) -> dict[str, Any]:
    """The first of ``candidates`` (``(arguments, their dialect keywords or None)``) that
    means ``plan``, else :class:`CannotExpress` saying which pads the framework can take."""
    for args, keywords, shapes in candidates:
        if keywords is not None and _means(plan, keywords, *shapes):
            return args
    attribute = "pads_begin/pads_end/output_padding" if _transposed(plan) and any(
        plan.output_padding) else "pads_begin/pads_end"
    raise CannotExpress(attribute, (
        f"pads {plan.pads_begin}/{plan.pads_end}"
        + (f" with output_padding {plan.output_padding}" if _transposed(plan) else "")
        + f": {who} takes {allowed}, and none of them gives these"))


def _dialect_keywords(fn, *args, **kw):
    """A dialect's keywords, or ``None`` where it refuses the arguments."""
    try:
        return fn(*args, **kw)
    except (ValueError, TypeError):
        return None


def _tf_arguments(plan, x_shape, w_shape) -> tuple[str, dict[str, Any]]:
    """The ``tf.nn`` function and its keywords that mean ``plan`` (read back through
    :mod:`polyconv.dialects.tensorflow`)."""
    from .dialects import tensorflow as dialect

    n, g = plan.ndim, plan.groups
    if n not in (1, 2, 3):
        raise CannotExpress("rank", f"{n} spatial axes: tf.nn has conv1d, conv2d and conv3d")
    transposed = _transposed(plan)
    out_shape = (plan.batch, *plan.a_spatial, plan.a_channels)
    depthwise = (not transposed and g > 1 and g == plan.a_channels and n == 2)
    if transposed and g > 1:
        raise CannotExpress("groups", f"groups={g}: tf.nn.conv{n}d_transpose has no groups")
    if transposed and any(d > 1 for d in plan.dilations):
        raise CannotExpress("dilations", f"dilations {plan.dilations}: TensorFlow's CPU "
                                         "transposed convolution takes dilation 1 only")
    if depthwise:
        op, fn, poly_w = ("depthwise_conv2d", "depthwise_conv2d",
                          (*plan.kernel, 1, plan.b_channels))
        w_shape = (*plan.kernel, g, plan.b_channels // g)
    else:
        op, fn, poly_w = (("conv_transpose", f"conv{n}d_transpose", w_shape) if transposed
                          else ("conv", f"conv{n}d", w_shape))
    paddings = ["VALID", "SAME"]
    if n == 2 and min((*plan.pads_begin, *plan.pads_end)) >= 0:   # explicit: conv2d only
        paddings.insert(0, [[0, 0], *zip(plan.pads_begin, plan.pads_end), [0, 0]])
    candidates = []
    for padding in paddings:
        kw = {"strides": plan.strides, "padding": padding, "dilations": plan.dilations}
        if transposed:
            kw["output_shape"] = out_shape
        candidates.append(({**kw, "padding": [list(p) for p in padding]
                            if not isinstance(padding, str) else padding},
                           _dialect_keywords(dialect.keywords, op, x_shape, w_shape, **kw),
                           (x_shape, poly_w)))
    allowed = "'SAME', 'VALID'" + (" or explicit pads" if n == 2 else
                                   " (explicit pads are conv2d's only)")
    return fn, _first_meaning(plan, candidates, f"tf.nn.{fn}", allowed)


def _tensorflow_call(plan, x, w) -> _Call:
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # TensorFlow's start-up banner
    import tensorflow as tf

    x, w = _nxc(x), _kernel_last(plan, w)
    depthwise = (not _transposed(plan) and plan.groups > 1 and plan.ndim == 2
                 and plan.groups == plan.a_channels)
    if depthwise:   # [KH, KW, 1, IC * multiplier] as [KH, KW, IC, multiplier]
        w = w.reshape(*plan.kernel, plan.groups, plan.b_channels // plan.groups)
    fn, kw = _tf_arguments(plan, x.shape, w.shape)
    if fn == "depthwise_conv2d":
        kw["strides"] = [1, *kw["strides"], 1]
    elif fn == "conv1d":
        kw["stride"] = kw.pop("strides")
    elif plan.ndim == 3:   # conv3d and conv3d_transpose take TensorFlow's N + 2 form only
        kw["strides"], kw["dilations"] = ([1, *kw[k], 1] for k in ("strides", "dilations"))
    conv = getattr(tf.nn, fn)
    no_grad = None   # what TensorFlow's CPU kernels refuse to differentiate
    if any(d > 1 for d in plan.dilations):
        no_grad = ("dilations", f"dilations {plan.dilations}: TensorFlow's CPU gradient "
                                "kernels (Conv2DBackpropInput) take dilation 1 only")
    elif plan.groups > 1 and not depthwise:
        no_grad = ("groups", f"groups={plan.groups}: TensorFlow has no CPU gradient of a "
                             "grouped convolution")
    return _Call("tensorflow", lambda x, w, b: conv(x, w, **kw) if b is None
                 else conv(x, w, **kw) + b, x, w, channels_last=True,
                 kernel_back=lambda g: _kernel_back(plan, g), no_grad=no_grad)


def _keras_arguments(plan, x_shape, w_shape) -> dict[str, Any]:
    """``keras.ops.conv`` / ``conv_transpose``'s keywords that mean ``plan`` (read back
    through :mod:`polyconv.dialects.keras`)."""
    from .dialects import keras as dialect

    transposed = _transposed(plan)
    if transposed and plan.groups > 1:
        raise CannotExpress("groups", f"groups={plan.groups}: keras.ops.conv_transpose has "
                                      "no groups")
    if _keras_on_tensorflow():
        if transposed and any(d > 1 for d in plan.dilations):
            raise CannotExpress("dilations", f"dilations {plan.dilations}: Keras's "
                                "TensorFlow backend transposes with dilation 1 only on CPU")
        if any(s > 1 for s in plan.strides) and any(d > 1 for d in plan.dilations):
            raise CannotExpress("strides/dilations", (
                f"strides {plan.strides} with dilations {plan.dilations}: Keras's TensorFlow "
                "backend (tf.nn.convolution) takes strides > 1 with dilation 1 only"))
    op = "conv_transpose" if transposed else "conv"
    opads = [None, plan.output_padding] if transposed else [None]
    candidates = []
    for padding in ("valid", "same"):
        for opad in opads:
            kw = {"strides": plan.strides, "padding": padding, "dilation_rate": plan.dilations,
                  "data_format": "channels_last"}
            if transposed:
                kw["output_padding"] = opad
            candidates.append((kw, _dialect_keywords(dialect.keywords, op, x_shape, w_shape,
                                                     **kw), (x_shape, w_shape)))
    allowed = ("padding 'valid' or 'same'" +
               (" with or without output_padding" if transposed else ""))
    return _first_meaning(plan, candidates, f"keras.ops.{op}", allowed)


def _keras_on_tensorflow() -> bool:
    import keras

    return keras.backend.backend() == "tensorflow"


def _keras_call(plan, x, w) -> _Call:
    import keras

    x, w = _nxc(x), _kernel_last(plan, w)
    kw = _keras_arguments(plan, x.shape, w.shape)
    conv = keras.ops.conv_transpose if _transposed(plan) else keras.ops.conv
    return _Call(keras.backend.backend(), lambda x, w, b: conv(x, w, **kw) if b is None
                 else conv(x, w, **kw) + b, x, w, channels_last=True,
                 kernel_back=lambda g: _kernel_back(plan, g))


def _tensorflow_version() -> str | None:
    from importlib import metadata

    for name in ("tensorflow", "tensorflow-cpu"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return None


def _keras_backend() -> str:
    import keras

    return f"{keras.__version__} ({keras.backend.backend()} backend)"


def _flax_call(plan, x, w) -> _Call:
    from flax import linen
    from jax import lax

    x, w = _nxc(x), _kernel_last(plan, w)
    common = {"features": plan.a_channels if _transposed(plan) else plan.b_channels,
              "kernel_size": plan.kernel, "strides": plan.strides,
              "kernel_dilation": plan.dilations, "dtype": x.dtype, "param_dtype": x.dtype,
              "precision": lax.Precision.HIGHEST}
    if _transposed(plan):
        if plan.groups != 1:
            raise CannotExpress("groups", f"groups={plan.groups}: flax.linen.ConvTranspose "
                                          "has no feature_group_count")
        layer = functools.partial(linen.ConvTranspose, padding=_lax_transpose_pairs(plan),
                                  transpose_kernel=True, **common)
    else:
        layer = functools.partial(linen.Conv, padding=list(zip(plan.pads_begin, plan.pads_end)),
                                  feature_group_count=plan.groups, **common)

    def apply(x, w, b):
        params = {"kernel": w} if b is None else {"kernel": w, "bias": b}
        return layer(use_bias=b is not None).apply({"params": params}, x)

    return _Call("jax", apply, x, w, channels_last=True,
                 kernel_back=lambda g: _kernel_back(plan, g))


_ONNX_NO_GRAD = ("ONNX's Conv and ConvTranspose are forward operators and ONNX has no "
                 "convolution gradient operator (the data gradient of one family is the "
                 "other family's forward op, checked there)")

#: Every built-in peer, in report order.
PEERS: tuple[Peer, ...] = (
    Peer("torch", _forward(_torch_call), ("torch",), "pip install torch",
         grad=_gradient(_torch_call)),
    Peer("onnxruntime", _onnxruntime, ("onnx", "onnxruntime"), "pip install onnx onnxruntime",
         no_grad=_ONNX_NO_GRAD, convention=_onnx_convention),
    Peer("onnx-reference", _onnx_reference, ("onnx",), "pip install onnx",
         no_grad=_ONNX_NO_GRAD, convention=_onnx_convention),
    Peer("lax", _forward(_lax_call), ("jax",), "pip install jax", grad=_gradient(_lax_call)),
    Peer("openvino", _openvino, ("openvino",), "pip install openvino", no_grad=(
        "OpenVINO is an inference runtime: its opsets have no weights gradient and no "
        "autodiff (its ConvolutionBackpropData is the transposed convolution, checked as "
        "ConvTranspose)")),
    Peer("tensorflow", _forward(_tensorflow_call), ("tensorflow",), "pip install tensorflow-cpu",
         describe=_tensorflow_version, grad=_gradient(_tensorflow_call)),
    Peer("keras", _forward(_keras_call), ("keras",), "pip install keras (and a backend: "
         "tensorflow, jax or torch)", describe=_keras_backend, grad=_gradient(_keras_call)),
    Peer("flax", _forward(_flax_call), ("jax", "flax"), "pip install flax",
         grad=_gradient(_flax_call)),
)


def peer_names(names: Sequence[str | Peer] | str | None) -> tuple[list[Peer], list[Peer]]:
    """The peers asked for (``"all"``: every built-in one) as ``(installed, absent)``.

    Raises
    ------
    ValueError
        For a name that is no peer.
    """
    if names is None:
        return [], []
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    known = {p.name: p for p in PEERS}
    chosen: list[Peer] = []
    for name in names:
        if isinstance(name, Peer):
            chosen.append(name)
        elif name == "all":
            chosen.extend(PEERS)
        elif name in known:
            chosen.append(known[name])
        else:
            msg = (f"peers: unknown peer {name!r}; the peers are {', '.join(known)}, or "
                   f"'all' for every installed one")
            raise ValueError(msg)
    chosen = list({p.name: p for p in chosen}.values())
    return [p for p in chosen if p.available], [p for p in chosen if not p.available]


def peer_operands(plan, arrays: dict[str, np.ndarray]) -> tuple[Any, Any, Any]:
    """A forward call's ``src``, ``weights`` and ``bias`` (or ``None``) as every peer takes
    them: data channels-first, weights ``[Cb, Ca/G, K..]``."""
    x = np.moveaxis(arrays["src"], -1, 1) if plan.channels_last else arrays["src"]
    w = np.transpose(arrays["weights"], plan.weights_perm)
    return np.ascontiguousarray(x), np.ascontiguousarray(w), arrays.get("bias")


def peer_output(peer: Peer, plan, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """``peer``'s output for one call of any of :data:`PEER_OPS` (``arrays`` by role, in the
    call's layouts), in the call's output layout. A gradient op runs as the peer's autodiff
    of the family's forward op, the other operand zero (the gradient does not read it)."""
    if plan.op in FORWARD_OPS:
        y = np.asarray(peer.run(plan, *peer_operands(plan, arrays)), np.float64)
        return np.moveaxis(y, 1, -1) if plan.channels_last else y
    if peer.grad is None:
        raise CannotExpress("op", f"{plan.op}: {peer.no_grad}")
    transposed_family = plan.op.startswith("conv_transpose")
    forward = plan.with_(primitive="backward_data" if transposed_family else "forward",
                         op="conv_transpose" if transposed_family else "convolution")
    x_shape = _ncx(forward, forward.b_shape if transposed_family else forward.a_shape)

    def ncx(a):
        return np.ascontiguousarray(np.moveaxis(a, -1, 1) if plan.channels_last else a)

    dy = ncx(arrays["diff_dst"])
    if plan.op.endswith("backward_data"):
        w = np.ascontiguousarray(np.transpose(arrays["weights"], plan.weights_perm))
        g = peer.grad(forward, np.zeros(x_shape, dy.dtype), w, dy, "src")
        g = np.asarray(g, np.float64)
        return np.moveaxis(g, 1, -1) if plan.channels_last else g
    g = peer.grad(forward, ncx(arrays["src"]), np.zeros(forward.w_shape, dy.dtype), dy,
                  "weights")
    return np.transpose(np.asarray(g, np.float64), plan.weights_inverse_perm)
