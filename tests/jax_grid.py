"""The attribute grid and small helpers shared by the JAX backend's test modules
(tests/test_jax.py, tests/test_jax_lowerings.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

# spatial sizes of the large tensor (convolution src) and of the small one (conv_transpose
# src), and the kernel, per rank
_LARGE = {1: (9,), 2: (7, 6), 3: (5, 6, 5)}
_SMALL = {1: (5,), 2: (4, 3), 3: (3, 2, 3)}
_KERNEL = {1: (3,), 2: (3, 2), 3: (2, 3, 2)}


def _per_axis(value, nd):
    return value[:nd] if isinstance(value, tuple) else value


# Geometry variants; each layout combination below is paired with several of them, so every
# variant meets every rank and both data formats. "groups": "dw" is depthwise.
_CONV_VARIANTS = (
    {},
    {"strides": 2, "pads_begin": 1, "pads_end": 2, "groups": 2},
    {"strides": (2, 1, 3), "dilations": 2, "pads_begin": 2, "pads_end": 0},
    {"auto_pad": "same_upper", "strides": 2, "groups": 2},
    {"auto_pad": "SAME_LOWER", "strides": 3, "dilations": (2, 1, 2)},
    {"auto_pad": "valid", "strides": 2, "dilations": (1, 2, 1), "groups": "dw"},
    {"auto_pad": "explicit", "pads_begin": (0, 3, 1), "pads_end": (4, 0, 1), "groups": "dw"},
    {"auto_pad": None, "strides": 2, "dilations": 2, "pads_begin": 1, "pads_end": 1,
     "groups": 2},
)
_TRANSPOSE_VARIANTS = (
    {},
    {"strides": 2, "pads_begin": 1, "pads_end": 1, "output_padding": 1, "groups": 2},
    {"strides": (3, 2, 2), "dilations": 2, "pads_begin": (0, 2, 1), "pads_end": (2, 0, 1),
     "output_padding": (2, 1, 0)},
    {"auto_pad": "same_upper", "strides": 2, "groups": 2, "output_padding": 1},
    {"auto_pad": "same_lower", "strides": (2, 3, 1), "dilations": 2, "groups": "dw"},
    {"auto_pad": "valid", "strides": 3, "output_padding": 2, "groups": "dw"},
    # pads larger than the kernel: negative padding in the lowering
    {"strides": 2, "pads_begin": (3, 2, 2), "pads_end": (0, 1, 1), "groups": 2},
    {"strides": 2, "pads_begin": 1, "pads_end": 1, "dst_shape": "+1"},
)
_LAYOUTS = list(itertools.product((1, 2, 3), ("NXC", "NCX"), ("XIO", "OIX", "IOX", "XOI")))


def _cases(variants, per_layout=3):
    cases = []
    for i, (nd, fmt, wfmt) in enumerate(_LAYOUTS):
        for j in range(per_layout):
            v = (i * per_layout + j) % len(variants)
            cases.append(pytest.param(nd, fmt, wfmt, variants[v],
                                      id=f"{nd}d-{fmt}-{wfmt}-v{v}"))
    return cases


def _attrs(variant, nd, fmt, wfmt):
    attrs = {k: _per_axis(v, nd) for k, v in variant.items() if k not in ("groups", "dst_shape")}
    return {**attrs, "data_format": fmt, "weights_format": wfmt}


def _data(rng, n, c, spatial, fmt):
    shape = (n, *spatial, c) if fmt == "NXC" else (n, c, *spatial)
    return rng.standard_normal(shape)


def _weights(rng, cb, ca_g, kernel, wfmt, family):
    """Random weights in ``wfmt`` for the family's meaning of O and I
    (docs/semantics.md#layouts)."""
    o, i = (cb, ca_g) if family == "convolution" else (ca_g, cb)
    sizes = {"O": (o,), "I": (i,), "X": kernel}
    return rng.standard_normal(tuple(itertools.chain.from_iterable(sizes[c] for c in wfmt)))


def _channels(variant):
    """(channels of the op's input, of its output, groups)."""
    groups = variant.get("groups", 1)
    if groups == "dw":
        return 4, 8, 4
    return 4, 6, groups


def _bias_grad(cot, fmt):
    axes = tuple(i for i in range(cot.ndim) if i != (cot.ndim - 1 if fmt == "NXC" else 1))
    return cot.sum(axis=axes)


def _close(actual, expected):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=1e-10,
                               atol=1e-10)


def _hlo(fn, *args):
    """The StableHLO text of ``fn`` jitted on ``args``."""
    import jax

    return jax.jit(fn).lower(*args).as_text()
