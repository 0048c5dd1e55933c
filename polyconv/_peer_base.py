"""What every peer of ``polyconv compare --peers`` is made of (:mod:`polyconv._peers`): the
records, a framework's call run forward or differentiated by its own autodiff, and the
layout and padding helpers the translations share."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._formatting import _json_float

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


def _transposed(plan) -> bool:
    return plan.primitive == "backward_data"


def _ncx(plan, shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(shape)
    return (shape[0], shape[-1], *shape[1:-1]) if plan.channels_last else shape


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
