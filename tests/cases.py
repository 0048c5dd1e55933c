"""The attribute grid of the shared matrix: a deterministic covering of every attribute value.

Each op has a list of *dimensions* (rank, kernel, strides, ..., dtype) with a few abstract values
each. :func:`pairwise` picks a small set of rows in which every pair of values of every two
dimensions appears at least once (greedy, seeded: the same rows on every run and every xdist
worker); :func:`covering` only guarantees that every value appears. :func:`build_case` turns one
row into a concrete, valid call: shapes are grown until the oracle accepts the geometry.

Nothing here imports polyconv; geometry comes from the oracle.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import oracle
from oracle import FUNCTIONS, INPUTS, KINDS, InvalidGeometry

# --------------------------------------------------------------------------------------------
# covering arrays
# --------------------------------------------------------------------------------------------


def _pair(i: int, a: int, j: int, b: int) -> tuple[int, int, int, int]:
    """A pair of (dimension, value index) entries, in dimension order."""
    return (i, a, j, b) if i < j else (j, b, i, a)


def pairwise(dims: dict[str, list], seed: int) -> list[dict[str, Any]]:
    """Rows covering every pair of values of every two dimensions (AETG-style greedy)."""
    names = list(dims)
    sizes = [len(dims[n]) for n in names]
    k = len(names)
    uncovered = {(i, a, j, b) for i in range(k) for j in range(i + 1, k)
                 for a in range(sizes[i]) for b in range(sizes[j])}
    rng = random.Random(seed)

    def new_pairs(row: list, m: int, v: int) -> int:
        """How many uncovered pairs value ``v`` of dimension ``m`` adds to a partial row."""
        return sum(_pair(o, row[o], m, v) in uncovered
                   for o in range(k) if row[o] is not None)

    def complete(i: int, a: int, j: int, b: int) -> list[int]:
        row: list = [None] * k
        row[i], row[j] = a, b
        rest = [m for m in range(k) if row[m] is None]
        rng.shuffle(rest)
        for m in rest:
            gains = [(new_pairs(row, m, v), rng.random(), v) for v in range(sizes[m])]
            row[m] = max(gains)[2]
        return row

    def covered(row: list[int]) -> set:
        return {(i, row[i], j, row[j]) for i in range(k) for j in range(i + 1, k)}

    rows = []
    while uncovered:
        pool = sorted(uncovered)
        candidates = [complete(*pool[0])] + [complete(*rng.choice(pool)) for _ in range(15)]
        best = max(candidates, key=lambda row: len(covered(row) & uncovered))
        rows.append(best)
        uncovered -= covered(best)
    return [{n: dims[n][v] for n, v in zip(names, row)} for row in rows]


def covering(dims: dict[str, list], seed: int) -> list[dict[str, Any]]:
    """As many rows as the largest dimension; every value of every dimension appears."""
    rng = random.Random(seed)
    count = max(len(v) for v in dims.values())
    orders = {}
    for name, values in dims.items():
        order = list(range(len(values)))
        rng.shuffle(order)
        orders[name] = order
    return [{name: values[orders[name][r % len(values)]] for name, values in dims.items()}
            for r in range(count)]


# --------------------------------------------------------------------------------------------
# abstract attribute values
# --------------------------------------------------------------------------------------------

DTYPES = ["float32", "float16", "bfloat16", "float64"]

# Per-axis values for "mixed": the lists/tuples are given to the op as they are.
KERNELS = {1: (1, 1, 1), 2: (2, 2, 2), 3: (3, 3, 3), "mixed": (3, 1, 2)}
STRIDES = {1: 1, 2: 2, 3: 3, "mixed": {1: [3], 2: (1, 2), 3: (2, 1, 3)}}
DILATIONS = {1: 1, 2: 2, "mixed": {1: [2], 2: (2, 1), 3: (1, 2, 1)}}
# (groups, channels of the large tensor a, channels of the small tensor b); "multiplier": two
# channels of b per channel of a in each group (a depthwise channel multiplier)
GROUPS = {"1": (1, 3, 4), "some": (2, 4, 6), "depthwise": (3, 3, 3), "multiplier": (3, 3, 6)}
# Free spatial sizes: of the large tensor (forward-direction ops) or the small one.
LARGE_SIZES = {1: (7,), 2: (6, 5), 3: (5, 4, 4)}
SMALL_SIZES = {1: (4,), 2: (3, 4), 3: (2, 3, 2)}
BATCH = 2

COMMON_DIMS = {
    "rank": [1, 2, 3],
    "kernel": [1, 2, 3, "mixed"],
    "strides": [1, 2, 3, "mixed"],
    "dilations": [1, 2, "mixed"],
    "pads": ["zero", "int", "asym"],
    "auto_pad": ["none", "same_upper", "same_lower", "valid"],
    "groups": ["1", "some", "depthwise", "multiplier"],
    "data_format": ["NXC", "NCX", "default"],
    "weights_format": ["XIO", "OIX", "IOX", "XOI", "default"],
    "dtype": DTYPES,
    "spelling": ["positional", "keyword", "alias"],
}
KIND_DIMS = {
    "convolution": {"bias": [True, False]},
    "convolution_backward_data": {"output_padding": ["zero", "max"],
                                  "dst": [None, "full", "spatial"]},
    "convolution_backward_weights": {"wshape": ["full", "spatial"]},
    "conv_transpose": {"bias": [True, False], "output_padding": ["zero", "max"],
                       "dst": [None, "full", "spatial"]},
    "conv_transpose_backward_data": {"output_padding": ["zero", "max"]},
    "conv_transpose_backward_weights": {"output_padding": ["zero", "max"],
                                        "wshape": ["full", "spatial"]},
}


def dims_for(fn: str) -> dict[str, list]:
    return {**COMMON_DIMS, **KIND_DIMS[FUNCTIONS[fn][0]]}


def _per_axis(value, rank: int):
    """The attribute as given to the op: an int, or a per-axis list/tuple."""
    if isinstance(value, dict):
        return value[rank]
    return value


def _tuple(value, rank: int) -> tuple[int, ...]:
    return (value,) * rank if isinstance(value, int) else tuple(value)


# --------------------------------------------------------------------------------------------
# concrete cases
# --------------------------------------------------------------------------------------------


@dataclass
class Case:
    """One concrete call: how to call polyconv, and what to give the oracle."""

    fn: str                                 # public function name
    dtype: str
    shapes: tuple                           # array input shapes, signature order
    positional: tuple = ()                  # dst_shape / weights_shape given positionally
    attrs: dict = field(default_factory=dict)        # keywords for polyconv
    oracle_attrs: dict = field(default_factory=dict)  # keywords for the oracle
    seed: int = 0
    label: str = ""

    def arrays(self) -> list[np.ndarray | None]:
        rng = np.random.default_rng(self.seed)
        return [None if s is None else oracle.random_array(rng, s, self.dtype)
                for s in self.shapes]

    def expected(self, arrays) -> oracle.Reference:
        return oracle.reference(self.fn, *arrays, **self.oracle_attrs)

    def geometry(self) -> oracle.Geometry:
        shapes = [s for s, name in zip(self.shapes, INPUTS[self.kind]) if name != "bias"]
        return oracle.geometry(self.fn, *shapes, **self.oracle_attrs)

    @property
    def kind(self) -> str:
        return FUNCTIONS[self.fn][0]


AUTO_PAD_SPELLINGS = {
    "none": ["none", "NONE", "None", None, "explicit", "EXPLICIT"],
    "same_upper": ["same_upper", "SAME_UPPER", "Same_Upper"],
    "same_lower": ["same_lower", "SAME_LOWER", "Same_Lower"],
    "valid": ["valid", "VALID", "Valid"],
}


def _concrete(fn, row, grow, base_attrs, extra, w_shape, data):
    """Input shapes (and ``extra`` keywords) for one size attempt; the oracle checks them."""
    kind = FUNCTIONS[fn][0]
    family, primitive, _, _ = KINDS[kind]
    rank = row["rank"]
    _, ca, cb = GROUPS[row["groups"]]
    s = _tuple(base_attrs["strides"], rank)
    mode = oracle.normalize_auto_pad(base_attrs.get("auto_pad"))
    max_opad = tuple(x - 1 for x in s) if row.get("output_padding") == "max" else (0,) * rank
    large_sizes = tuple(x + grow for x in LARGE_SIZES[rank])
    small_sizes = tuple(x + grow for x in SMALL_SIZES[rank])

    if family == "convolution":
        a_sp = large_sizes
    else:  # the large tensor is a ConvTranspose output: s*(B-1) + ek - pads + opad
        ct = oracle.geometry("conv_transpose", data(cb, small_sizes), w_shape,
                             output_padding=max_opad, **base_attrs)
        a_sp = ct.a_spatial
        if kind != "conv_transpose" and any(ct.output_padding):
            extra["output_padding"] = ct.output_padding

    if primitive == "forward":
        shapes = (data(ca, a_sp), w_shape)
    elif primitive == "backward_weights":
        partner = "convolution" if family == "convolution" else "conv_transpose_backward_data"
        fwd = oracle.geometry(partner, data(ca, a_sp), w_shape, **base_attrs)
        large, small = data(ca, a_sp), data(cb, fwd.b_spatial)
        shapes = (large, small) if family == "convolution" else (small, large)
        kernel = tuple(fwd.kernel)
        extra["weights_shape"] = kernel if row["wshape"] == "spatial" else w_shape
    else:  # backward_data: convolution_backward_data, conv_transpose
        shapes = (data(cb, small_sizes), w_shape)
        if row["dst"] is None:
            if any(max_opad):
                extra["output_padding"] = max_opad
        else:
            if mode in ("same_upper", "same_lower"):
                # rule F: ceil(A/s) == B, i.e. A in [s*(B-1)+1, s*B]
                a_sp = tuple(si * (bi - 1) + 1 + oi
                             for si, bi, oi in zip(s, small_sizes, max_opad))
            else:  # the transposed size with output_padding: implied by dst_shape
                a_sp = oracle.geometry(fn, *shapes, output_padding=max_opad,
                                       **base_attrs).a_spatial
            extra["dst_shape"] = data(ca, a_sp) if row["dst"] == "full" else a_sp
    geo = oracle.geometry(fn, *shapes, **base_attrs, **extra)
    if (row.get("dst") and row["output_padding"] == "max" and any(geo.output_padding)
            and row["spelling"] == "keyword"):
        # The output_padding that dst_shape implies may be given as well (it must agree);
        # with the other spellings dst_shape alone implies it.
        extra["output_padding"] = geo.output_padding
    return shapes, geo


def build_case(fn: str, row: dict[str, Any], seed: int, label: str = "") -> Case:
    """A valid call of ``fn`` for one row of abstract values (see :data:`COMMON_DIMS`)."""
    kind, default_format = FUNCTIONS[fn]
    family = KINDS[kind][0]
    rank = row["rank"]
    kernel = KERNELS[row["kernel"]][:rank]
    strides = _per_axis(STRIDES[row["strides"]], rank)
    dilations = _per_axis(DILATIONS[row["dilations"]], rank)
    groups, ca, cb = GROUPS[row["groups"]]
    fmt = default_format if row["weights_format"] == "default" else row["weights_format"]
    channels_last = row["data_format"] != "NCX"
    auto_pad = row.get("auto_pad_value", row["auto_pad"])
    spelling = row["spelling"]

    attrs: dict[str, Any] = {"strides": strides, "dilations": dilations, "groups": groups}
    if row["auto_pad"] != "none" or "auto_pad_value" in row:
        attrs["auto_pad"] = auto_pad
    # Explicit pads are given even with auto_pad: they must then be ignored.
    if row["pads"] == "int":
        attrs["pads_begin"] = attrs["pads_end"] = 1
    elif row["pads"] == "asym":
        attrs["pads_begin"] = [1, 0, 2][:rank]
        attrs["pads_end"] = (0, 2, 1)[:rank]
    if row["data_format"] != "default":
        attrs["data_format"] = row["data_format"]

    canonical_w = (cb, ca // groups, *kernel)
    w_shape = oracle.weights_user_shape(canonical_w, fmt, family)

    batch = row.get("batch", BATCH)

    def data(channels, spatial):
        return oracle.data_shape(batch, channels, spatial, channels_last)

    base_attrs = {**attrs, "weights_format": fmt}
    for grow in range(12):
        extra: dict[str, Any] = {}
        try:
            shapes, geo = _concrete(fn, row, grow, base_attrs, extra, w_shape, data)
            break
        except InvalidGeometry:
            continue
    else:  # pragma: no cover - a grid value that can never be valid is a bug in this file
        raise AssertionError(f"no valid sizes for {fn} {row}")

    if "bias" in INPUTS[kind] and row.get("bias"):
        shapes = (*shapes, geo.bias_shape)

    oracle_attrs = {**base_attrs, **extra}
    # How polyconv is called: the shape arguments and weights_format in three spellings.
    call_attrs = dict(attrs)
    positional: tuple = ()
    if row["weights_format"] != "default":
        call_attrs["filter_format" if spelling == "alias" else "weights_format"] = fmt
    for key, alias in (("dst_shape", "output_shape"), ("weights_shape", "filter_shape")):
        if key not in extra:
            continue
        value = extra[key]
        positional_ok = kind in ("convolution_backward_data", "convolution_backward_weights",
                                 "conv_transpose_backward_weights")
        if spelling == "positional" and positional_ok:
            positional = (value,)
        else:
            call_attrs[alias if spelling == "alias" else key] = value
    if "output_padding" in extra:
        call_attrs["output_padding"] = extra["output_padding"]
    return Case(fn=fn, dtype=row["dtype"], shapes=shapes, positional=positional,
                attrs=call_attrs, oracle_attrs=oracle_attrs, seed=seed, label=label)


def describe(row: dict[str, Any]) -> str:
    parts = [f"r{row['rank']}", f"k{row['kernel']}", f"s{row['strides']}",
             f"d{row['dilations']}", f"p{row['pads']}", str(row["auto_pad"]),
             f"g{row['groups']}", row["data_format"], row["weights_format"], row["dtype"],
             row["spelling"]]
    for key in ("bias", "output_padding", "dst", "wshape", "batch"):
        if key in row:
            parts.append(f"{key}={row[key]}")
    return "-".join(parts)


def grid(fn: str, *, full: bool, seed: int) -> list[Case]:
    """The cases of one function: pairwise over its dimensions, or a plain covering."""
    rows = pairwise(dims_for(fn), seed) if full else covering(dims_for(fn), seed)
    return [build_case(fn, row, seed * 1000 + i, f"{fn}-{i:02d}-{describe(row)}")
            for i, row in enumerate(rows)]
