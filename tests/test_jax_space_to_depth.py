"""The JAX backend's forward lowerings for restricted geometries, against the float64 oracle:
``space_to_depth`` (strided, undilated plans whose kernels are whole multiples of
their strides), with each lowering of its inner stride-1 plan, and ``matmul_overlap_add``
(multiply first: ungrouped plans whose product is no wider than ``a``); where they apply,
NaN and infinity reaching exactly the outputs that read them, 16-bit data, and the measured
choice seeing them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import only_with_target

only_with_target("jax")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from jax_grid import _weights  # noqa: E402
from oracle import assert_within_bound, reference  # noqa: E402
from polyconv_jax import _choice, _space_to_depth  # noqa: E402

import polyconv  # noqa: E402


def _applies(plan, name: str) -> bool:
    return _choice.CHOOSER.get("forward", name).applies(plan)


# (src spatial, kernel, attributes): strided, undilated, kernel a multiple of the stride on
# every axis (a stride of 1 takes any kernel)
_S2D = (
    ((40,), (16,), {"strides": 8, "pads_begin": 4, "pads_end": 4}),     # FCN-8s's upscore
    ((11,), (4,), {"strides": 2, "pads_begin": 5, "pads_end": 0}),      # pads past the kernel
    ((12,), (6,), {"strides": 3, "pads_begin": 2, "pads_end": 0}),      # unread trailing rows
    ((9, 10), (6, 6), {"strides": 2, "pads_begin": 2, "pads_end": 2}),  # YOLOv5's stem
    ((8, 9), (4, 3), {"strides": (2, 1), "pads_begin": (1, 0), "pads_end": (2, 1)}),
    ((7, 8), (2, 4), {"strides": 2, "auto_pad": "same_upper"}),
    ((5, 6, 5), (2, 4, 2), {"strides": 2, "pads_begin": (0, 1, 1), "pads_end": (1, 1, 0)}),
)
_FORMATS = (("NXC", "XIO"), ("NCX", "OIX"), ("NXC", "IOX"), ("NCX", "XOI"))
#: the inner plan's lowerings tried (with groups: the ones that compute grouped plans)
_INNER = ("direct", "matmul_overlap_add", "im2col", "taps", "elementwise")


def _case(spatial, kernel, attrs, fmt, wfmt, ca, cb, groups, seed=0, low=-1.0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(low, 1, (2, *spatial, ca) if fmt == "NXC" else (2, ca, *spatial))
    w = _weights(rng, cb, ca // groups, kernel, wfmt, "convolution")
    if low > 0:
        w = np.abs(w) + 0.5
    attrs = {**attrs, "data_format": fmt, "weights_format": wfmt, "groups": groups}
    return x, w, attrs


@pytest.fixture
def inner(request, monkeypatch):
    """The inner plan's lowering, where it computes it (else the usual choice); the list
    records each time it was taken."""
    choose, taken = _choice.choose, []

    def forced(primitive, plan, precision, repeats=1):
        if _applies(plan, request.param) and plan.strides == (1,) * plan.ndim:
            taken.append(request.param)
            return request.param
        return choose(primitive, plan, precision, repeats)

    monkeypatch.setattr(_choice, "choose", forced)
    jax.clear_caches()
    return request.param, taken


#: (groups, inner lowering): the ungrouped-only inner lowerings without groups
_GROUPS_INNER = [(g, name) for g in (1, 2) for name in _INNER
                 if g == 1 or name in ("direct", "elementwise")]


@pytest.mark.usefixtures("jax_x64")
@pytest.mark.parametrize(("groups", "inner"), _GROUPS_INNER, indirect=["inner"])
@pytest.mark.parametrize(("fmt", "wfmt"), _FORMATS)
@pytest.mark.parametrize(("spatial", "kernel", "attrs"), _S2D)
def test_space_to_depth_forward_matches_the_oracle(spatial, kernel, attrs, fmt, wfmt, groups,
                                                   inner):
    inner, taken = inner
    # elementwise computes the inner plan's S*Ca/G channels only up to 8 per group;
    # matmul_overlap_add needs few output channels
    phases = math.prod(np.broadcast_to(attrs["strides"], len(spatial)))
    ca, cb = {"elementwise": (groups * max(1, 8 // phases), 2 * groups),
              "matmul_overlap_add": (12, 1)}.get(inner, (4, 6))
    x, w, attrs = _case(spatial, kernel, attrs, fmt, wfmt, ca, cb, groups)
    plan = polyconv.infer_shape("convolution", x.shape, w.shape, **attrs)
    assert _applies(plan, "space_to_depth")
    sub = _space_to_depth.inner_plan(plan)
    assert sub.b_spatial == plan.b_spatial and sub.strides == (1,) * plan.ndim
    if inner in ("matmul_overlap_add", "elementwise"):
        assert _applies(sub, inner), "the case does not reach the inner one"
    with polyconv.implementation("jax:forward=space_to_depth"):
        y = polyconv.convolution(jnp.asarray(x), jnp.asarray(w), **attrs)
    ref = reference("convolution", x, w, **attrs)
    assert y.shape == ref.y.shape
    assert_within_bound(np.asarray(y), ref.y, ref.abs_sum, ref.n, "float64")
    assert taken and set(taken) == {inner}, "the inner plan did not take the lowering under test"


# (src spatial, kernel, attributes) for the multiply-first forward: any geometry
_OVERLAP = (
    ((9,), (3,), {"pads_begin": 1, "pads_end": 1}),
    ((13,), (4,), {"strides": 3, "dilations": 2, "pads_begin": 4, "pads_end": 0}),
    ((7, 6), (2, 3), {"strides": (2, 1), "pads_begin": (3, 0), "pads_end": (0, 2)}),
    ((8, 8), (2, 2), {"strides": 2}),
    ((5, 6, 5), (2, 2, 2), {"dilations": (2, 1, 1), "pads_begin": 1, "pads_end": (0, 1, 2)}),
)


@pytest.mark.usefixtures("jax_x64")
@pytest.mark.parametrize(("fmt", "wfmt"), _FORMATS)
@pytest.mark.parametrize(("spatial", "kernel", "attrs"), _OVERLAP)
def test_matmul_overlap_add_forward_matches_the_oracle(spatial, kernel, attrs, fmt, wfmt):
    taps = math.prod(kernel)
    x, w, attrs = _case(spatial, kernel, attrs, fmt, wfmt, 2 * taps, 2, 1)
    plan = polyconv.infer_shape("convolution", x.shape, w.shape, **attrs)
    assert _applies(plan, "matmul_overlap_add")
    with polyconv.implementation("jax:forward=matmul_overlap_add"):
        y = polyconv.convolution(jnp.asarray(x), jnp.asarray(w), **attrs)
    ref = reference("convolution", x, w, **attrs)
    assert_within_bound(np.asarray(y), ref.y, ref.abs_sum, ref.n, "float64")


@pytest.mark.parametrize(("lowering", "case", "channels"), [
    ("space_to_depth", _S2D[2], (4, 6)), ("space_to_depth", _S2D[4], (4, 6)),
    ("space_to_depth", _S2D[6], (4, 6)),
    ("matmul_overlap_add", _OVERLAP[1], (8, 2)), ("matmul_overlap_add", _OVERLAP[2], (12, 2))])
def test_nan_and_inf_reach_exactly_the_outputs_that_read_them(lowering, case, channels):
    """Every value of ``a`` meets only real taps: a NaN or infinity in ``src`` (its first,
    a middle and its last position; in the 1-D space-to-depth case the last is a row no tap
    reads) is non-finite in exactly the outputs the oracle gives it a nonzero weight in
    (positive weights: no cancellation)."""
    spatial, kernel, attrs = case
    x, w, attrs = _case(spatial, kernel, attrs, "NXC", "XIO", *channels, 1, seed=3, low=0.5)
    points = [(0, *(0,) * len(spatial), 0), (1, *(n // 2 for n in spatial), 1),
              (1, *(n - 1 for n in spatial), channels[0] - 1)]
    for point in points:
        one = np.zeros_like(x)
        one[point] = 1.0
        hit = reference("convolution", one, w, **attrs).y != 0
        for value in (np.nan, np.inf):
            poisoned = x.copy()
            poisoned[point] = value
            with polyconv.implementation(f"jax:forward={lowering}"):
                y = np.asarray(polyconv.convolution(jnp.asarray(poisoned), jnp.asarray(w),
                                                    **attrs))
            assert np.array_equal(~np.isfinite(y), hit), (point, value)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("lowering", ["space_to_depth", "matmul_overlap_add"])
def test_16_bit_data_within_the_bound(dtype, lowering):
    """16-bit data through the space-to-depth copy and the inner product: the oracle's
    float32 bound, in the data's dtype."""
    case, channels = ((_S2D[3], (4, 6)) if lowering == "space_to_depth" else (_OVERLAP[2], (12, 2)))
    spatial, kernel, attrs = case
    x, w, attrs = _case(spatial, kernel, attrs, "NCX", "OIX", *channels, 1, seed=5)
    x, w = (np.asarray(jnp.asarray(v, dtype).astype(jnp.float32), np.float64) for v in (x, w))
    with polyconv.implementation(f"jax:forward={lowering}"):
        y = polyconv.convolution(jnp.asarray(x, dtype), jnp.asarray(w, dtype), **attrs)
    assert y.dtype == jnp.dtype(dtype)
    ref = reference("convolution", x, w, **attrs)
    y = np.asarray(y.astype(jnp.float32), np.float64)
    assert_within_bound(y, ref.y, ref.abs_sum, ref.n, dtype)


def test_where_they_apply_and_are_measured():
    """``space_to_depth`` needs a stride, no dilation and whole multiples of the stride (else its
    zero taps would meet ``a``); ``matmul_overlap_add`` an ungrouped plan of several taps whose
    product is no wider than ``a``; the CPU's measured choice sees each where it applies."""
    def plan(src, kernel, ca, cb, groups=1, **attrs):
        return polyconv.infer_shape("convolution", (1, *src, ca), (*kernel, ca // groups, cb),
                                    groups=groups, **attrs)

    fcn = plan((512, 512), (16, 16), 21, 21, strides=8, pads_begin=4, pads_end=4)
    yolo = plan((640, 640), (6, 6), 3, 32, strides=2, pads_begin=2, pads_end=2)
    for p in (fcn, yolo, plan((64, 64), (4, 4), 64, 8, groups=4, strides=2)):
        assert _applies(p, "space_to_depth")
    for p in (plan((56, 56), (3, 3), 64, 64, strides=2),                  # k3 s2: zero taps
              plan((56, 56), (4, 3), 64, 64, strides=2),                  # on one axis
              plan((56, 56), (4, 4), 64, 64, strides=2, dilations=2),
              plan((56, 56), (4, 4), 64, 64)):                             # no stride
        assert not _applies(p, "space_to_depth")
    inner = _space_to_depth.inner_plan(fcn)
    assert (inner.a_channels, inner.kernel, inner.a_spatial) == (21 * 64, (2, 2), (65, 65))
    assert _applies(inner, "matmul_overlap_add")
    for p in (fcn, plan((56, 56), (1, 1), 256, 64), plan((56, 56), (2, 2), 64, 64, groups=2)):
        assert not _applies(p, "matmul_overlap_add")
    assert "space_to_depth" in _choice.candidates("forward", fcn)
    assert "matmul_overlap_add" in _choice.candidates("forward", inner)
