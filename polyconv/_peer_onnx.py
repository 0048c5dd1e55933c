"""The peers that run a one-node ONNX model: onnxruntime, the ONNX reference evaluator and
OpenVINO (:mod:`polyconv._peers`), and the model itself, which ``polyconv cases export``
writes too."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._peer_base import CannotExpress, _dialect_keywords, _means, _ncx, _transposed

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
    x_shape, w_shape = _ncx(plan, plan.b_shape if _transposed(plan) else plan.a_shape), \
        plan.w_shape
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
    shapes = [x_shape, plan.w_shape, (plan.bias_channels,)][:len(names)]
    node = helper.make_node(op_type, names, ["Y"], **(attributes or onnx_attributes(plan)))
    graph = helper.make_graph(
        [node], f"polyconv_{op_type}",
        [helper.make_tensor_value_info(n, elem, list(s)) for n, s in zip(names, shapes)],
        [helper.make_tensor_value_info("Y", elem, list(y_shape))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             producer_name="polyconv")


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
