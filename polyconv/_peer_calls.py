"""The peers that call a framework's own convolution from Python: PyTorch, JAX's ``lax``,
TensorFlow, Keras and Flax (:mod:`polyconv._peers`), each translated once and run forward or
through its own autodiff."""

from __future__ import annotations

import functools
from typing import Any

from ._peer_base import (
    CannotExpress,
    _Call,
    _dialect_keywords,
    _end_crops,
    _first_meaning,
    _kernel_back,
    _kernel_last,
    _nxc,
    _pads_of,
    _transposed,
)


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


def _tf_arguments(plan, x_shape, w_shape) -> tuple[str, dict[str, Any]]:
    """The ``tf.nn`` function and its keywords that mean ``plan`` (read back through
    :mod:`polyconv.dialects.tensorflow`)."""
    from .dialects import tensorflow as dialect

    n, g = plan.ndim, plan.groups
    if n not in (1, 2, 3):
        raise CannotExpress("rank", f"{n} spatial axes: tf.nn has conv1d, conv2d and conv3d")
    transposed = _transposed(plan)
    out_shape = (plan.batch, *plan.a_spatial, plan.a_channels)
    depthwise = _tf_depthwise(plan)
    if transposed and g > 1:
        raise CannotExpress("groups", f"groups={g}: tf.nn.conv{n}d_transpose has no groups")
    if transposed and any(d > 1 for d in plan.dilations):
        raise CannotExpress("dilations", f"dilations {plan.dilations}: TensorFlow's CPU "
                                         "transposed convolution takes dilation 1 only")
    if depthwise:
        op, fn, poly_w = ("depthwise_conv2d", "depthwise_conv2d",
                          (*plan.kernel, 1, plan.b_channels))
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


def _tf_depthwise(plan) -> bool:
    """Whether ``plan`` is TensorFlow's ``depthwise_conv2d`` (one input channel per group,
    2-D, not transposed), whose weights are ``[KH, KW, IC, multiplier]``."""
    return (not _transposed(plan) and plan.groups > 1 and plan.ndim == 2
            and plan.groups == plan.a_channels)


def _tensorflow_call(plan, x, w) -> _Call:
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")   # TensorFlow's start-up banner
    import tensorflow as tf

    x, w = _nxc(x), _kernel_last(plan, w)
    if _tf_depthwise(plan):   # [KH, KW, 1, IC * multiplier] as [KH, KW, IC, multiplier]
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
    elif plan.groups > 1 and not _tf_depthwise(plan):
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
