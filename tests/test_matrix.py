"""Every target against the independent oracle, over a covering grid of attributes.

The six ops each get a pairwise covering (every pair of attribute values appears together at
least once) of: spatial rank 1-3, kernel sizes, strides (1, 2, 3, per-axis mixes), dilations,
explicit pads (none, symmetric ints, asymmetric per-axis lists; also given, and ignored, under
auto_pad), auto_pad modes, groups (1, 1 < groups < channels, depthwise), data formats, all four
weights formats plus the family default, every dtype, how shape arguments and formats are spelt
(positional, keyword, older-spec alias), and per op bias, output_padding (0 or stride-1),
dst_shape (absent, full, spatial) and weights_shape (full, spatial). The older-spec functions
get a plain covering; every name in ``polyconv.OPS`` and every auto_pad spelling gets a case.

Each result must have the target's array type, the input dtype, the oracle's shape, and values
within the error bound (docs/numerics.md#error-bound) of the oracle's exact values.
"""

from __future__ import annotations

import numpy as np
import pytest
from bad_calls import BASE
from cases import AUTO_PAD_SPELLINGS, Case, build_case, grid
from conftest import require_dtype
from oracle import (
    ALIAS_OPS,
    FUNCTIONS,
    KINDS,
    MAIN_OPS,
    OP_NAMES,
    assert_within_bound,
    numpy_dtype,
    random_array,
    reference,
)

import polyconv

GRID = [case for i, fn in enumerate(MAIN_OPS) for case in grid(fn, full=True, seed=11 + i)]
ALIAS_GRID = [case for i, fn in enumerate(ALIAS_OPS)
              for case in grid(fn, full=False, seed=31 + i)]


def run(target, case: Case, arrays, fn=None):
    """Call the op on the target's arrays, the shape arguments spelt as the case says."""
    fn = fn if fn is not None else getattr(polyconv, case.fn)
    converted = [None if a is None else target.asarray(a) for a in arrays]
    return fn(*converted, *case.positional, backend=target.backend, **case.attrs)


def check_result(target, y, ref, dtype: str) -> None:
    """Array type, dtype and shape first, then the values against the error bound
    (docs/numerics.md#error-bound)."""
    like = target.asarray(np.zeros(1, numpy_dtype(dtype)))
    assert isinstance(y, type(like)), (
        f"result is {type(y).__module__}.{type(y).__qualname__}, expected the target's "
        f"array type {type(like).__module__}.{type(like).__qualname__}")
    assert target.dtype_of(y) == dtype, f"result dtype {y.dtype}, expected {dtype}"
    assert tuple(y.shape) == ref.shape, f"result shape {tuple(y.shape)} != oracle {ref.shape}"
    assert_within_bound(target.to_numpy(y), ref.y, ref.abs_sum, ref.n, dtype)


def check_case(target, case: Case, fn=None) -> None:
    require_dtype(target, case.dtype)
    arrays = case.arrays()
    ref = case.expected(arrays)
    check_result(target, run(target, case, arrays, fn), ref, case.dtype)


@pytest.mark.parametrize("case", GRID, ids=lambda c: c.label)
def test_grid(target, case):
    check_case(target, case)


@pytest.mark.parametrize("case", ALIAS_GRID, ids=lambda c: c.label)
def test_older_spec_functions(target, case):
    check_case(target, case)


# --------------------------------------------------------------------------------------------
# names and spellings
# --------------------------------------------------------------------------------------------

# One moderately busy row: 2-D, stride 2, asymmetric pads, two groups, NCX.
BUSY_ROW = {"rank": 2, "kernel": "mixed", "strides": "mixed", "dilations": 2, "pads": "asym",
            "auto_pad": "none", "groups": "some", "data_format": "NCX",
            "weights_format": "default", "dtype": "float32", "spelling": "keyword",
            "bias": True, "output_padding": "max", "dst": None, "wshape": "spatial"}


def test_ops_table_has_every_spec_name():
    assert set(polyconv.OPS) == set(OP_NAMES)


@pytest.mark.parametrize("name", sorted(OP_NAMES))
def test_every_ops_name(target, name):
    fn = OP_NAMES[name]
    assert polyconv.OPS[name] is getattr(polyconv, fn)
    case = build_case(fn, BUSY_ROW, seed=5, label=name)
    require_dtype(target, case.dtype)
    arrays = case.arrays()
    ref = reference(name, *arrays, **case.oracle_attrs)
    check_result(target, run(target, case, arrays, polyconv.OPS[name]), ref, case.dtype)


SPELLINGS = [(mode, spelling) for mode, spellings in AUTO_PAD_SPELLINGS.items()
             for spelling in spellings]


@pytest.mark.parametrize("op", MAIN_OPS)
@pytest.mark.parametrize(("mode", "spelling"), SPELLINGS,
                         ids=[repr(s) for _, s in SPELLINGS])
def test_auto_pad_spellings(target, op, mode, spelling):
    """auto_pad is case-insensitive; None and "explicit" mean "none"."""
    row = {**BUSY_ROW, "auto_pad": mode, "auto_pad_value": spelling, "kernel": 3,
           "strides": 2, "dilations": 1, "output_padding": "zero"}
    if KINDS[FUNCTIONS[op][0]][1] == "backward_data":
        row["dst"] = "spatial" if mode == "same_lower" else None
    case = build_case(op, row, seed=6, label=f"{op}-{spelling}")
    assert case.attrs["auto_pad"] == spelling
    check_case(target, case)


def _spelt(fmt: str, rank: int, lower: bool) -> str:
    """``fmt`` with its spatial axes named as PyTorch, TensorFlow and ONNX name them."""
    spelt = fmt.replace("X", ("W", "HW", "DHW")[rank - 1])
    return spelt.lower() if lower else spelt


@pytest.mark.parametrize("op", MAIN_OPS)
@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("data_format", ["NXC", "NCX"])
def test_layout_spellings(target, op, rank, data_format):
    """NCHW, NDHWC, OIHW, HWIO, ... (any case) are spellings of NCX, NXC, OIX, XIO, ... on
    data of as many spatial axes (docs/semantics.md#layouts)."""
    weights_format = ("OIX", "XIO", "IOX", "XOI")[(rank + (data_format == "NCX")) % 4]
    row = {**BUSY_ROW, "rank": rank, "data_format": data_format,
           "weights_format": weights_format}
    case = build_case(op, row, seed=13, label=f"{op}-{rank}-{data_format}")
    lower = rank == 2
    case.attrs = {**case.attrs, "data_format": _spelt(data_format, rank, lower),
                  "weights_format": _spelt(weights_format, rank, lower)}
    check_case(target, case)
    assert polyconv.infer_shape(op, *case.shapes, *case.positional,
                                **case.attrs).data_format == data_format


# --------------------------------------------------------------------------------------------
# details worth a case of their own
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_bias_reaches_positions_without_products(target, dtype):
    """ConvTranspose with kernel 1, stride 3 and output_padding 2: two out of three positions
    receive no product, only the bias (docs/semantics.md#canonical-convolution)."""
    require_dtype(target, dtype)
    rng = np.random.default_rng(8)
    src = random_array(rng, (2, 3, 4, 2), dtype)         # NXC, IC=2
    w = random_array(rng, (1, 1, 5, 2), dtype)            # XOI [K, K, OC, IC]
    bias = random_array(rng, (5,), dtype)
    attrs = {"strides": 3, "output_padding": 2}
    ref = reference("conv_transpose", src, w, bias, **attrs)
    assert ref.shape == (2, 9, 12, 5)
    np.testing.assert_array_equal(ref.n[:, 1::3, :, :], 1)   # the bias alone
    y = target.call(polyconv.conv_transpose, src, w, bias, **attrs)
    check_result(target, y, ref, dtype)


@pytest.mark.parametrize("fn", MAIN_OPS)
def test_empty_batch(target, fn):
    """A batch of 0 is a valid shape: an empty result, and zero weight gradients."""
    _, shapes, positional = BASE[fn]
    rng = np.random.default_rng(9)
    arrays = [random_array(rng, (0, *s[1:]) if i == 0 or positional else s, "float32")
              for i, s in enumerate(shapes)]
    extra = () if positional is None else (positional,)
    ref = reference(fn, *arrays, **({} if positional is None else {"weights_shape": positional}))
    y = getattr(polyconv, fn)(*(target.asarray(a) for a in arrays), *extra,
                              backend=target.backend)
    check_result(target, y, ref, "float32")


# A batch of 0 is the only axis the contract lets be empty (docs/semantics.md#validation:
# every data tensor has a channel and a position per spatial axis, the weights a channel on
# each channel axis): every op, both data formats, every weights format, ranks 1-3.
EMPTY_BATCH_GRID = [
    build_case(fn, {**BUSY_ROW, "batch": 0, "rank": rank, "data_format": data_format,
                    "weights_format": weights_format},
               seed=12, label=f"{fn}-r{rank}-{data_format}-{weights_format}-batch0")
    for fn in MAIN_OPS for data_format in ("NXC", "NCX")
    for rank, weights_format in zip((1, 2, 3, 1, 2), ("OIX", "XIO", "IOX", "XOI", "default"))]


@pytest.mark.parametrize("case", EMPTY_BATCH_GRID, ids=lambda c: c.label)
def test_empty_batch_every_layout(target, case):
    """A batch of 0 in every layout: an empty result of the oracle's shape, and weight
    gradients of zeros (the oracle's)."""
    assert 0 in (case.shapes[0][0], case.shapes[1][0])
    check_case(target, case)


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_numpy_inputs_in_non_native_byte_order(target, dtype):
    """``>f4`` is float32 (numpy's dtype name, not its byte order, is the dtype): numpy inputs
    of the other byte order work on every backend, with integer arrays as attributes."""
    require_dtype(target, dtype)
    if target.library != "numpy" and target.backend != "jax":
        pytest.skip("numpy inputs (given to the numpy, jax and array_api backends)")
    rng = np.random.default_rng(10)
    src = random_array(rng, (2, 7, 6, 4), dtype)
    w = random_array(rng, (3, 3, 4, 6), dtype)
    swapped = np.dtype(dtype).newbyteorder("S")
    attrs = {"strides": np.array([2, 1]), "pads_begin": np.int64(1), "pads_end": (1, 0)}
    y = polyconv.convolution(src.astype(swapped), w.astype(swapped), **attrs,
                             backend=target.backend)
    assert np.asarray(y).dtype.name == dtype
    ref = reference("convolution", src, w, strides=(2, 1), pads_begin=1, pads_end=(1, 0))
    assert_within_bound(np.asarray(y), ref.y, ref.abs_sum, ref.n, dtype)


@pytest.mark.parametrize("fn", ["convolution_backward_data", "conv_transpose"])
@pytest.mark.parametrize("auto_pad", ["none", "valid", "same_upper", "same_lower"])
def test_every_reachable_dst_shape(target, fn, auto_pad):
    """Every size in the reachable range of dst_shape, full and spatial forms
    (docs/semantics.md#explicit-shapes)."""
    rng = np.random.default_rng(9)
    s, k = 3, 2
    dy = random_array(rng, (1, 4, 2, 3), "float64")        # NCX, C=4, B=(2, 3)
    w = random_array(rng, (4, 2, k, k), "float64")        # OIX / IOX: [4, 2, K, K]
    fmt = "OIX" if fn == "convolution_backward_data" else "IOX"
    common = {"strides": s, "auto_pad": auto_pad, "pads_begin": (1, 0), "pads_end": (0, 1),
              "data_format": "NCX", "weights_format": fmt}
    if auto_pad.startswith("same"):
        ranges = [range(s * (b - 1) + 1, s * b + 1) for b in (2, 3)]
    else:
        pads = ((1, 0), (0, 1)) if auto_pad == "none" else ((0, 0), (0, 0))
        ranges = [range(s * (b - 1) + k - p0 - p1, s * (b - 1) + k - p0 - p1 + s)
                  for b, p0, p1 in zip((2, 3), *pads)]
    # every size of axis 0 (axis 1 at its smallest), then every size of axis 1
    sizes = [(h, ranges[1][0]) for h in ranges[0]] + [(ranges[0][-1], x) for x in ranges[1]]
    fn_ = getattr(polyconv, fn)
    for i, (h, wd) in enumerate(sizes):
        dst = (h, wd) if i % 2 else (1, 2, h, wd)
        ref = reference(fn, dy, w, dst_shape=dst, **common)
        assert ref.shape == (1, 2, h, wd)
        y = fn_(target.asarray(dy), target.asarray(w), dst_shape=dst,
                backend=target.backend, **common)
        check_result(target, y, ref, "float64")
