"""Other frameworks' own convolutions ("peers"), called with a polyconv call's meaning.

``polyconv compare --peers`` asks whether PyTorch, onnxruntime, the ONNX reference, ``lax``,
OpenVINO, TensorFlow, Keras and Flax compute what polyconv's contract says for one call. Each
peer translates a resolved :class:`~polyconv.ConvPlan` (pads, strides, dilations, groups,
output_padding already resolved) into its framework's own call, once (:mod:`._peer_calls`,
:mod:`._peer_onnx`, over :mod:`._peer_base`); the
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

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._peer_base import (
    FORWARD_OPS,
    PEER_OPS,
    CannotExpress,
    Peer,
    PeerResult,
    _forward,
    _gradient,
    _ncx,
)
from ._peer_calls import (
    _flax_call,
    _keras_backend,
    _keras_call,
    _lax_call,
    _tensorflow_call,
    _tensorflow_version,
    _torch_call,
)
from ._peer_onnx import _onnx_convention, _onnx_reference, _onnxruntime, _openvino, onnx_model

__all__ = ["FORWARD_OPS", "PEERS", "PEER_OPS", "CannotExpress", "Peer", "PeerResult",
           "onnx_model", "peer_names", "peer_operands", "peer_output"]


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
