"""``polyconv.infer_shape`` against the oracle's own geometry (docs/semantics.md#geometry), for
every op name,
every form of ``dst_shape``/``weights_shape`` and their aliases; and for refused calls, the very
same exception as the op itself."""

from __future__ import annotations

import numpy as np
import pytest
from bad_calls import BAD_CALLS, BadCall
from cases import build_case, grid
from oracle import FUNCTIONS, INPUTS, KINDS, MAIN_OPS, OP_NAMES, Geometry, geometry

import polyconv

ALL_FUNCTIONS = tuple(FUNCTIONS)
# A busy row of the grid (see cases.build_case), varied by the tests below.
ROW = {"rank": 2, "kernel": "mixed", "strides": "mixed", "dilations": 2, "pads": "asym",
       "auto_pad": "same_lower", "groups": "some", "data_format": "NCX",
       "weights_format": "default", "dtype": "float32", "spelling": "keyword", "bias": True,
       "output_padding": "max", "dst": "full", "wshape": "full"}
CASES = [case for i, fn in enumerate(ALL_FUNCTIONS)
         for case in grid(fn, full=fn in MAIN_OPS, seed=51 + i)]


def check_plan(plan, geo: Geometry) -> None:
    """The documented fields of the plan against the oracle's resolution of the same call."""
    assert plan.shape == geo.output_shape
    assert plan.pads_begin == geo.pads_begin
    assert plan.pads_end == geo.pads_end
    assert plan.primitive == KINDS[geo.kind][1]
    assert plan.strides == geo.strides
    assert plan.dilations == geo.dilations
    assert plan.kernel == geo.kernel
    assert plan.groups == geo.groups
    assert plan.batch == geo.batch
    assert (plan.a_channels, plan.b_channels) == (geo.a_channels, geo.b_channels)
    assert (plan.a_spatial, plan.b_spatial) == (geo.a_spatial, geo.b_spatial)
    if geo.family == "conv_transpose" or geo.primitive == "backward_data":
        assert plan.output_padding == geo.output_padding


def _shape_call(case):
    """``infer_shape``'s positional shapes and keywords for a grid case."""
    return (*case.shapes, *case.positional), dict(case.attrs)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.label)
def test_matches_oracle(case):
    shapes, attrs = _shape_call(case)
    check_plan(polyconv.infer_shape(case.fn, *shapes, **attrs), case.geometry())


@pytest.mark.parametrize("name", sorted(OP_NAMES))
def test_every_name_and_the_function_itself(name):
    fn = OP_NAMES[name]
    case = build_case(fn, ROW, seed=1)
    shapes, attrs = _shape_call(case)
    geo = case.geometry()
    for op in (name, fn, getattr(polyconv, fn)):
        check_plan(polyconv.infer_shape(op, *shapes, **attrs), geo)


SPELLINGS = ["positional", "keyword", "alias"]


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("form", ["full", "spatial"])
@pytest.mark.parametrize("fn", ["convolution_backward_data", "conv_transpose",
                                "convolution_backprop_data"])
@pytest.mark.parametrize("auto_pad", ["none", "same_upper"])
def test_dst_shape_forms(fn, form, spelling, auto_pad):
    case = build_case(fn, {**ROW, "dst": form, "spelling": spelling, "auto_pad": auto_pad},
                      seed=2)
    shapes, attrs = _shape_call(case)
    check_plan(polyconv.infer_shape(fn, *shapes, **attrs), case.geometry())


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("form", ["full", "spatial"])
@pytest.mark.parametrize("fn", ["convolution_backward_weights", "conv_transpose_backward_weights",
                                "convolution_backprop_filters",
                                "conv_transpose_backprop_filters"])
def test_weights_shape_forms(fn, form, spelling):
    case = build_case(fn, {**ROW, "wshape": form, "spelling": spelling,
                           "weights_format": "default" if spelling == "keyword" else "OIX"},
                      seed=3)
    shapes, attrs = _shape_call(case)
    check_plan(polyconv.infer_shape(fn, *shapes, **attrs), case.geometry())


@pytest.mark.parametrize("fn", ALL_FUNCTIONS)
def test_attributes_as_keywords_match_the_op_defaults(fn):
    """Leaving every attribute out means strides 1, pads 0, dilations 1, no auto_pad,
    groups 1, NXC and the function's default weights format
    (docs/semantics.md#layouts)."""
    kind, default_format = FUNCTIONS[fn]
    case = build_case(fn, {**ROW, "strides": 1, "dilations": 1, "pads": "zero",
                           "auto_pad": "none", "groups": "1", "data_format": "default",
                           "weights_format": "default", "output_padding": "zero",
                           "dst": None, "wshape": "spatial"}, seed=4)
    shapes, attrs = _shape_call(case)
    shape_keywords = {k: v for k, v in attrs.items() if k in ("weights_shape", "filter_shape")}
    plan = polyconv.infer_shape(fn, *shapes, **shape_keywords)
    geo = geometry(fn, *[s for s, name in zip(case.shapes, INPUTS[kind]) if name != "bias"],
                   weights_shape=case.oracle_attrs.get("weights_shape"),
                   weights_format=default_format)
    check_plan(plan, geo)


def test_docstring_example_numbers():
    """The contract's numbers worked by hand: ConvTranspose, same_upper, stride 2, k=3,
    output_padding 1: rule T total 1 = (0, 1), 65 = 2*32 + 1."""
    plan = polyconv.infer_shape("ConvTranspose", (8, 32, 32, 64), (3, 3, 64, 64), strides=2,
                                auto_pad="same_upper", output_padding=1)
    assert (plan.shape, plan.pads_begin, plan.pads_end) == ((8, 65, 65, 64), (0, 0), (1, 1))
    plan = polyconv.infer_shape("Convolution", (1, 5, 7, 2), (4, 4, 2, 3), strides=2,
                                auto_pad="same_lower")
    # rule F: A=5: ceil 3, total (3-1)*2 + 4 - 5 = 3 -> lower (2, 1); A=7: total 3 -> (2, 1)
    assert (plan.shape, plan.pads_begin, plan.pads_end) == ((1, 3, 4, 3), (2, 2), (1, 1))


# --------------------------------------------------------------------------------------------
# errors: the same exception as the op
# --------------------------------------------------------------------------------------------

SHAPE_ERRORS = [b for b in BAD_CALLS if b.shape_only]


def _raised(fn, *args, **kwargs) -> BaseException:
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # any exception: it is what is compared
        return exc
    raise AssertionError("no exception")


@pytest.mark.parametrize("bad", SHAPE_ERRORS, ids=lambda b: b.id)
def test_same_error_as_the_op(bad: BadCall):
    from_op = _raised(getattr(polyconv, bad.fn), *bad.inputs, *bad.positional, **bad.attrs)
    from_shapes = _raised(polyconv.infer_shape, bad.fn, *bad.shapes(), *bad.positional,
                          **bad.attrs)
    assert type(from_shapes) is type(from_op)
    assert str(from_shapes) == str(from_op)


@pytest.mark.parametrize("bad", [b for b in SHAPE_ERRORS if b.fn in MAIN_OPS][::7],
                         ids=lambda b: b.id)
def test_same_error_under_the_ops_name(bad: BadCall):
    """Through its OPS name, infer_shape raises what the function raises."""
    name = next(n for n, f in OP_NAMES.items() if f == bad.fn)
    from_op = _raised(polyconv.OPS[name], *bad.inputs, *bad.positional, **bad.attrs)
    from_shapes = _raised(polyconv.infer_shape, name, *bad.shapes(), *bad.positional,
                          **bad.attrs)
    assert (type(from_shapes), str(from_shapes)) == (type(from_op), str(from_op))


def test_unknown_op_name():
    with pytest.raises(ValueError, match=r"unknown op 'Deconvolution'.*'ConvTranspose'"):
        polyconv.infer_shape("Deconvolution", (1, 3, 3, 1), (1, 1, 1, 1))
    with pytest.raises(ValueError, match=r"unknown op"):
        polyconv.infer_shape(np.add, (1, 3, 3, 1), (1, 1, 1, 1))


def test_too_many_shapes_and_unknown_keywords():
    with pytest.raises(TypeError, match="conv_transpose_backward_data"):
        polyconv.infer_shape("conv_transpose_backward_data", (1, 3, 3, 1), (1, 1, 1, 1),
                             (1, 3, 3, 1))
    from_op = _raised(polyconv.convolution, np.zeros((1, 3, 3, 1), "float32"),
                      np.zeros((1, 1, 1, 1), "float32"), dst_shape=(3, 3))
    from_shapes = _raised(polyconv.infer_shape, "convolution", (1, 3, 3, 1), (1, 1, 1, 1),
                          dst_shape=(3, 3))
    assert type(from_shapes) is type(from_op) is TypeError
    assert "dst_shape" in str(from_shapes)


def test_repr_shows_the_answer_first():
    """What infer_shape returns prints the output shape and the resolved pads first."""
    plan = polyconv.infer_shape("ConvTranspose", (8, 32, 32, 64), (3, 3, 64, 64), strides=2,
                                auto_pad="same_upper", output_padding=1)
    text = repr(plan)
    assert text.startswith("ConvPlan(shape=(8, 65, 65, 64), pads_begin=(0, 0), "
                           "pads_end=(1, 1), output_padding=(1, 1), "), text
    assert "a_spatial=(65, 65)" in text and "weights_format='XOI'" in text


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "same_lower", "valid"])
@pytest.mark.parametrize("fn", ALL_FUNCTIONS)
def test_empty_pads_where_auto_pad_computes_them(fn, auto_pad):
    """oneDNN's own call shape: ``pads_begin=[]``, ``pads_end=[]`` with ``auto_pad``."""
    case = build_case(fn, {**ROW, "auto_pad": auto_pad.lower()}, seed=5)
    shapes, attrs = _shape_call(case)
    attrs = {k: v for k, v in attrs.items() if k not in ("pads_begin", "pads_end", "auto_pad")}
    expected = polyconv.infer_shape(fn, *shapes, auto_pad=auto_pad, **attrs)
    for empty in ([], (), np.array([], dtype=np.int64)):
        plan = polyconv.infer_shape(fn, *shapes, pads_begin=empty, pads_end=empty,
                                    auto_pad=auto_pad, **attrs)
        assert plan == expected
    check_plan(expected, case.geometry())


def test_empty_pads_run_on_arrays():
    x = np.random.default_rng(0).standard_normal((1, 5, 5, 2)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((3, 3, 2, 4)).astype(np.float32)
    y = polyconv.convolution(x, w, strides=2, pads_begin=[], pads_end=[],
                             auto_pad="SAME_UPPER")
    np.testing.assert_array_equal(y, polyconv.convolution(x, w, strides=2,
                                                          auto_pad="same_upper"))


def test_plans_compare_on_geometry_alone():
    """An op and its older name, or one layer in two dtypes, are one plan (one cache key of
    every per-plan cache); another stride is another plan."""
    shapes = ((2, 4, 4, 6), (3, 3, 3, 6))
    new = polyconv.infer_shape("convolution_backward_data", *shapes, strides=2)
    old = polyconv.infer_shape("ConvolutionBackpropData-1", *shapes, strides=2)
    assert new.op != old.op
    assert new == old and hash(new) == hash(old)
    assert new.with_(dtype="float16") == new.with_(dtype="float32")
    assert polyconv.infer_shape("convolution_backward_data", *shapes, strides=1) != new
