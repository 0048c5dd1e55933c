"""ONNX node attributes executed on JAX, exactly as ONNX defines them.

An ONNX model's ConvTranspose node (here its attributes as a plain dict, as
``onnx.helper.get_attribute_value`` gives them) runs on JAX arrays through
``polyconv.dialects.onnx``: grouped, dilated, with ``auto_pad="SAME_UPPER"`` and an
``output_padding``, whose ONNX meaning differs from polyconv's own ``same_upper`` (ONNX keeps
the output at ``X * strides`` and puts ``output_padding`` into the pads). It works under
``jax.jit`` and ``jax.grad``. When onnx and onnxruntime are installed, the result is checked
against onnxruntime running the same node; otherwise against polyconv's numpy backend.

Run: ``python examples/onnx_attributes_on_jax.py``.
"""

from __future__ import annotations

import importlib.util

import jax
import jax.numpy as jnp
import numpy as np

import polyconv
from polyconv.dialects import onnx

jax.config.update("jax_enable_x64", True)

# the node's attributes, as an ONNX model stores them
ATTRIBUTES = {"auto_pad": b"SAME_UPPER", "group": 2, "strides": [2, 2],
              "dilations": [2, 1], "output_padding": [1, 1], "kernel_shape": [3, 3]}

rng = np.random.default_rng(0)
X = rng.standard_normal((1, 4, 6, 6)).astype(np.float32)      # NCHW, C = 4
W = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)      # [C, M/group, kH, kW]
B = rng.standard_normal(6).astype(np.float32)                 # M = 6


def onnx_conv_transpose(x, w, b):
    return onnx.conv_transpose(x, w, b, **ATTRIBUTES)


x, w, b = jnp.asarray(X), jnp.asarray(W), jnp.asarray(B)
y = jax.jit(onnx_conv_transpose)(x, w, b)
print("ONNX ConvTranspose on JAX:", y.shape, y.dtype)
assert y.shape == (1, 6, 12, 12)           # ONNX's SAME: X * strides, output_padding inside
kw = onnx.keywords("ConvTranspose", X.shape, W.shape, **ATTRIBUTES)
print("as polyconv keywords:", {k: kw[k] for k in ("pads_begin", "pads_end",
                                                   "output_padding")})
print("polyconv's own same_upper would give",
      polyconv.infer_shape("ConvTranspose", X.shape, W.shape, strides=2, dilations=(2, 1),
                           auto_pad="same_upper", output_padding=1, groups=2,
                           data_format="NCX", weights_format="IOX").shape)

# the gradient through the ONNX node, by polyconv's own backward ops
grad_w = jax.grad(lambda w: jnp.sum(onnx_conv_transpose(x, w, b) ** 2))(w)
assert grad_w.shape == W.shape

if importlib.util.find_spec("onnxruntime") and importlib.util.find_spec("onnx"):
    import onnxruntime
    from onnx import TensorProto, helper

    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"],
                            **{k: v.decode() if isinstance(v, bytes) else v
                               for k, v in ATTRIBUTES.items()})
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, a.shape)
                      for n, a in (("x", X), ("w", W), ("b", B))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnxruntime.set_default_logger_severity(3)    # (onnx's shape inference says 13x13)
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    want = session.run(None, {"x": X, "w": W, "b": B})[0]
    print("reference: onnxruntime", onnxruntime.__version__)
else:
    want = onnx.conv_transpose(X, W, B, **ATTRIBUTES)    # numpy arrays: the numpy backend
    print("reference: polyconv's numpy backend (install onnx and onnxruntime to check "
          "against onnxruntime)")
np.testing.assert_allclose(np.asarray(y), want, rtol=1e-4, atol=1e-4)
print("JAX result matches, max |diff| =", float(np.max(np.abs(np.asarray(y) - want))))
