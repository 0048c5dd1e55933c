"""Keywords of other libraries: an unknown keyword's message names the polyconv spelling
(``stride=`` -> ``strides=``, ``padding=1`` -> ``pads_begin=1, pads_end=1``,
``padding="same"`` -> ``auto_pad="same_upper"``), see docs/semantics.md#validation."""

from __future__ import annotations

import difflib

_PAD_WORDS = frozenset({"padding", "pad", "pads", "paddings"})
_SAME_NAMES = {"same": "same_upper", "same_upper": "same_upper", "same_lower": "same_lower",
               "valid": "valid"}
_RENAMED = {  # other libraries' keyword -> polyconv's
    "stride": "strides", "dilation": "dilations", "dilation_rate": "dilations",
    "rhs_dilation": "dilations", "window_strides": "strides", "group": "groups",
    "feature_group_count": "groups", "output_size": "dst_shape", "out_shape": "dst_shape",
    "output_shape": "dst_shape", "filter_shape": "weights_shape",
    "kernel_shape": "weights_shape", "kernel_size": "weights_shape",
    "weights_layout": "weights_format", "kernel_layout": "weights_format",
    "filter_layout": "weights_format", "kernel_format": "weights_format",
    "layout": "data_format", "data_layout": "data_format", "padding_mode": None,
    "in_channels": None, "out_channels": None,
}


def _pads_suggestion(key: str, value) -> str | None:
    """``pads_begin=..., pads_end=...`` or ``auto_pad=...`` for another library's padding."""
    if isinstance(value, str):
        mode = _SAME_NAMES.get(value.lower())
        return None if mode is None else f"auto_pad={mode!r}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"pads_begin={value}, pads_end={value}"
    if isinstance(value, (list, tuple)) and value:
        if all(isinstance(v, (list, tuple)) and len(v) == 2 for v in value):  # [(lo, hi)..]
            begin, end = tuple(v[0] for v in value), tuple(v[1] for v in value)
        elif all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            if key == "pads" and len(value) % 2 == 0:  # ONNX: all begins, then all ends
                half = len(value) // 2
                begin, end = tuple(value[:half]), tuple(value[half:])
            else:  # PyTorch: one symmetric pad per axis
                begin = end = tuple(value)
        else:
            return None
        return f"pads_begin={begin}, pads_end={end}"
    return None


def _keyword_hint(name: str, key: str, value, accepted: frozenset[str]) -> str:
    """What to write instead of the unknown keyword ``key`` of function ``name``."""
    if key in _PAD_WORDS:
        pads = (f"polyconv has no {key}=: it takes pads_begin= and pads_end= (per spatial "
                f"axis), or auto_pad='same_upper', 'same_lower' or 'valid'")
        suggestion = _pads_suggestion(key, value)
        if suggestion == "auto_pad='same_upper'":
            pads += (f"; 'same_upper' puts the odd pad element at the end, as {key}='same' "
                     f"does in PyTorch, TensorFlow and Keras")
        return pads if suggestion is None else f"did you mean {suggestion}? ({pads})"
    if key == "output_padding":
        return (f"output_padding belongs to the transposed direction (conv_transpose, "
                f"convolution_backward_data and the ConvTranspose backward ops): {name} has no "
                f"output_padding attribute, whatever its value")
    if key == "padding_mode":
        return "polyconv pads with zeros only (padding_mode='zeros')"
    if key in ("in_channels", "out_channels"):
        return "the channel counts come from the shapes of the data and the weights"
    wanted = _RENAMED.get(key)
    if wanted is None:
        close = difflib.get_close_matches(key, sorted(accepted), n=1, cutoff=0.75)
        wanted = close[0] if close else None
    if wanted in accepted:
        return f"did you mean {wanted}=?"
    if wanted == "dst_shape":
        return (f"{name}'s output shape follows from its inputs and attributes "
                f"(polyconv.infer_shape gives it); dst_shape= belongs to conv_transpose and "
                f"convolution_backward_data")
    if wanted == "weights_shape":
        return "the kernel size comes from the weights' shape"
    return ""


def unexpected_keyword(name: str, key: str, value, accepted: frozenset[str]) -> str:
    """The message for an unknown keyword: Python's, plus the polyconv spelling if any."""
    msg = f"{name}() got an unexpected keyword argument {key!r}"
    hint = _keyword_hint(name, key, value, accepted)
    return f"{msg}; {hint}" if hint else msg
