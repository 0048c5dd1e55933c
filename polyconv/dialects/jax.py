"""JAX's ``lax.conv_general_dilated`` and ``lax.conv_transpose``, argument for argument
(docs/frameworks.md#jax-and-flax).

The layouts come from ``dimension_numbers`` (lax's defaults when ``None``), read as polyconv's
``data_format`` and ``weights_format`` with no transpose. ``padding`` is ``"SAME"``,
``"SAME_LOWER"``, ``"VALID"`` or one ``(lo, hi)`` pair per spatial axis. For
``lax.conv_transpose`` the pairs pad the stride-dilated input (lax's convention; with
``use_consistent_padding=True`` they crop the output, as polyconv's pads do), the strings
follow lax's own rule, and the kernel is flipped unless ``transpose_kernel=True`` (with it,
the ``rhs`` is the kernel of the forward convolution, polyconv's). Flax's ``Conv`` and
``ConvTranspose`` call these two with the same ``padding``, so this is Flax's rule too.
Nothing here imports jax.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._common import crops, dilated_input_crops, extents, namespace, per_axis

__all__ = ["conv_general_dilated", "conv_transpose", "layouts", "transpose_pads"]

_DEFAULT_TRANSPOSE_SPECS = {1: ("NHC", "HIO", "NHC"), 2: ("NHWC", "HWIO", "NHWC"),
                            3: ("NHWDC", "HWDIO", "NHWDC")}


def _spatial_letters(spec: str, drop: str) -> str:
    return "".join(c for c in spec if c not in drop)


def layouts(who: str, dimension_numbers: Any, ndim: int, *,
            transposed: bool = False) -> tuple[str, str]:
    """``(data_format, weights_format)`` for lax's ``dimension_numbers`` (strings);
    ``transposed`` reads the ``rhs`` spec of ``lax.conv_transpose(transpose_kernel=True)``,
    whose ``O`` and ``I`` name the forward convolution's channels."""
    if dimension_numbers is None:                # lax.conv_general_dilated's default
        space = "HWD"[:ndim] if ndim <= 3 else "".join(chr(65 + i) for i in range(ndim))
        dimension_numbers = ("NC" + space, "OI" + space, "NC" + space)
    if not all(isinstance(s, str) for s in dimension_numbers):
        msg = (f"{who}: dimension_numbers must be three strings (lhs, rhs, out specs such as "
               f"('NHWC', 'HWIO', 'NHWC')); got {dimension_numbers!r}")
        raise ValueError(msg)
    lhs, rhs, out = dimension_numbers
    space = _spatial_letters(lhs, "NC")
    data = {"N" + space + "C": "NXC", "NC" + space: "NCX"}.get(lhs)
    weights = rhs.replace(space, "X") if _spatial_letters(rhs, "OI") == space else rhs
    if transposed:
        weights = weights.translate(str.maketrans("OI", "IO"))
    if data is None or out != lhs or weights not in ("OIX", "XIO", "IOX", "XOI"):
        msg = (f"{who}: dimension_numbers={dimension_numbers!r} has no polyconv layout: the "
               f"lhs and out specs must be equal, batch first, the channels next to it or "
               f"last (NCHW, NHWC), and the rhs spec its O and I together, first or last, "
               f"the spatial axes in the lhs's order (OIHW, HWIO, IOHW, HWOI); transpose the "
               f"arrays to such a layout first")
        raise ValueError(msg)
    return data, weights


def _forward_padding(who: str, padding: Any, ndim: int) -> dict[str, Any]:
    if isinstance(padding, str):
        mode = {"SAME": "same_upper", "SAME_LOWER": "same_lower", "VALID": "valid"}.get(
            padding.upper())
        if mode is None:
            msg = (f"{who}: padding must be 'SAME', 'SAME_LOWER', 'VALID' or {ndim} (lo, hi) "
                   f"pairs; got padding={padding!r}")
            raise ValueError(msg)
        return {"auto_pad": mode}
    pairs = [tuple(int(v) for v in p) for p in padding]
    if len(pairs) != ndim or any(len(p) != 2 for p in pairs):
        msg = f"{who}: padding must be {ndim} (lo, hi) pairs; got padding={padding!r}"
        raise ValueError(msg)
    if any(v < 0 for p in pairs for v in p):
        msg = (f"{who}: padding={padding!r} has a negative pad, which crops the input: "
               f"polyconv pads are >= 0; slice the input instead and pass the rest")
        raise ValueError(msg)
    return {"pads_begin": tuple(p[0] for p in pairs), "pads_end": tuple(p[1] for p in pairs)}


def conv_general_dilated(lhs: Any, rhs: Any, window_strides: Sequence[int], padding: Any,
                         lhs_dilation: Sequence[int] | None = None,
                         rhs_dilation: Sequence[int] | None = None,
                         dimension_numbers: Any = None, feature_group_count: int = 1,
                         batch_group_count: int = 1, **kwargs: Any) -> Any:
    """``lax.conv_general_dilated`` on polyconv (``precision`` passes through).

    Examples
    --------
    >>> import numpy as np
    >>> from polyconv.dialects import jax
    >>> x, w = np.ones((1, 5, 5, 2), np.float32), np.ones((3, 3, 2, 4), np.float32)
    >>> jax.conv_general_dilated(x, w, (2, 2), "SAME",
    ...                          dimension_numbers=("NHWC", "HWIO", "NHWC")).shape
    (1, 3, 3, 4)
    """
    import polyconv

    who, ndim = "lax.conv_general_dilated", len(lhs.shape) - 2
    if lhs_dilation is not None and any(d != 1 for d in lhs_dilation):
        msg = (f"{who}: lhs_dilation={tuple(lhs_dilation)} is a transposed convolution: use "
               f"polyconv.dialects.jax.conv_transpose, or polyconv.conv_transpose with "
               f"convert_weights(rhs, 'lax-lhs-dilation', ...)")
        raise ValueError(msg)
    if batch_group_count != 1:
        msg = (f"{who}: batch_group_count={batch_group_count} (a grouped weight gradient) has "
               f"no polyconv equivalent; use polyconv.convolution_backward_weights")
        raise ValueError(msg)
    data_format, weights_format = layouts(who, dimension_numbers, ndim)
    return polyconv.convolution(
        lhs, rhs, strides=per_axis(who, "window_strides", window_strides, ndim, 1),
        dilations=per_axis(who, "rhs_dilation", rhs_dilation, ndim, 1),
        groups=int(feature_group_count), data_format=data_format,
        weights_format=weights_format, **_forward_padding(who, padding, ndim), **kwargs)


def transpose_pads(who: str, padding: Any, strides: Sequence[int], eks: Sequence[int],
                   consistent: bool = False) -> dict[str, tuple[int, ...]]:
    """polyconv's pads for ``lax.conv_transpose``'s ``padding`` (dilated-input pads, or lax's
    ``"SAME"``/``"VALID"`` rule, or, ``consistent``, crops of the output)."""
    ndim = len(strides)
    if isinstance(padding, str):
        if padding.upper() not in ("SAME", "VALID"):
            msg = f"{who}: padding must be 'SAME', 'VALID' or (lo, hi) pairs; got {padding!r}"
            raise ValueError(msg)
        pairs = []
        for ek, s in zip(eks, strides):      # lax's _conv_transpose_padding
            if padding.upper() == "SAME":
                total = ek + s - 2
                lo = ek - 1 if s > ek - 1 else -(-total // 2)
            else:
                total, lo = ek + s - 2 + max(ek - s, 0), ek - 1
            pairs.append((lo, total - lo))
        return dilated_input_crops(who, pairs, eks, strides, f"padding={padding!r}")
    pairs = [tuple(int(v) for v in p) for p in padding]
    if len(pairs) != ndim or any(len(p) != 2 for p in pairs):
        msg = f"{who}: padding must be {ndim} (lo, hi) pairs; got padding={padding!r}"
        raise ValueError(msg)
    if consistent:
        return crops(who, [p[0] for p in pairs], [p[1] for p in pairs], strides,
                     f"padding={padding!r}")
    return dilated_input_crops(who, pairs, eks, strides, f"padding={padding!r}")


def conv_transpose(lhs: Any, rhs: Any, strides: Sequence[int], padding: Any,
                   rhs_dilation: Sequence[int] | None = None, dimension_numbers: Any = None,
                   transpose_kernel: bool = False, precision: Any = None,
                   use_consistent_padding: bool = False) -> Any:
    """``lax.conv_transpose`` on polyconv.

    Examples
    --------
    >>> import numpy as np
    >>> from polyconv.dialects import jax
    >>> x, w = np.ones((1, 4, 4, 8), np.float32), np.ones((3, 3, 8, 2), np.float32)
    >>> jax.conv_transpose(x, w, (2, 2), "SAME").shape
    (1, 8, 8, 2)
    """
    import polyconv

    who, ndim = "lax.conv_transpose", len(lhs.shape) - 2
    spec = dimension_numbers or _DEFAULT_TRANSPOSE_SPECS.get(ndim)
    data_format, weights_format = layouts(who, spec, ndim, transposed=bool(transpose_kernel))
    dilations = per_axis(who, "rhs_dilation", rhs_dilation, ndim, 1)
    strides = per_axis(who, "strides", strides, ndim, 1)
    kernel = [rhs.shape[i] for i, c in enumerate(weights_format.replace("X", "X" * ndim))
              if c == "X"]
    pads = transpose_pads(who, padding, strides, extents(kernel, dilations),
                          use_consistent_padding)
    if not transpose_kernel:              # lax uses the kernel as it is: flipped for polyconv
        first = weights_format.index("X")
        rhs = namespace(rhs).flip(rhs, axis=tuple(range(first, first + ndim)))
    return polyconv.conv_transpose(lhs, rhs, strides=strides, dilations=dilations,
                                   data_format=data_format, weights_format=weights_format,
                                   precision=precision, **pads)
