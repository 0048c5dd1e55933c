"""The oracle checked on its own, with no polyconv: hand-computed cases, a literal loop
implementation of the formulas of docs/semantics.md, and identities."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from oracle import (
    FUNCTIONS,
    KINDS,
    InvalidGeometry,
    assert_within_bound,
    geometry,
    numpy_dtype,
    random_array,
    reference,
    same_total_rule_f,
    same_total_rule_t,
    split_same,
)


def ncx(*values) -> np.ndarray:
    """A ``[1, 1, X]`` float64 array (NCX)."""
    return np.array(values, dtype=np.float64).reshape(1, 1, -1)


def kernel_1d(*values) -> np.ndarray:
    """A 1-channel 1-D kernel in OIX/IOX (``[1, 1, K]``)."""
    return np.array(values, dtype=np.float64).reshape(1, 1, -1)


NCX_OIX = {"data_format": "NCX", "weights_format": "OIX"}
NCX_IOX = {"data_format": "NCX", "weights_format": "IOX"}


# --------------------------------------------------------------------------------------------
# hand-computed values
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("attrs", "expected"), [
    ({}, [3, 5]),
    ({"pads_begin": 1, "pads_end": 1}, [1, 3, 5, 3]),
    ({"pads_begin": 1, "pads_end": 1, "strides": 2}, [1, 5]),
    ({"pads_begin": 0, "pads_end": 1, "strides": 2}, [3, 3]),
    ({"auto_pad": "same_upper"}, [3, 5, 3]),   # total 1: the odd element at the end
    ({"auto_pad": "same_lower"}, [1, 3, 5]),   # total 1: the odd element at the beginning
    ({"auto_pad": "valid", "pads_begin": 5}, [3, 5]),
])
def test_convolution_1d_by_hand(attrs, expected):
    r = reference("convolution", ncx(1, 2, 3), kernel_1d(1, 1), **NCX_OIX, **attrs)
    np.testing.assert_array_equal(r.y.ravel(), expected)


def test_convolution_dilated_and_bias_by_hand():
    r = reference("convolution", ncx(1, 2, 3, 4, 5), kernel_1d(1, 10), np.array([0.5]),
                  dilations=2, **NCX_OIX)
    np.testing.assert_array_equal(r.y.ravel(), [31.5, 42.5, 53.5])
    np.testing.assert_array_equal(r.abs_sum.ravel(), [31.5, 42.5, 53.5])
    np.testing.assert_array_equal(r.n.ravel(), [3, 3, 3])


def test_convolution_2d_nxc_xio_by_hand():
    x = np.arange(9.0).reshape(1, 3, 3, 1)              # NXC
    w = np.array([[1.0, 0.0], [0.0, -1.0]]).reshape(2, 2, 1, 1)   # XIO
    r = reference("convolution", x, w)
    np.testing.assert_array_equal(r.y[0, :, :, 0], [[0 - 4, 1 - 5], [3 - 7, 4 - 8]])


def test_conv_transpose_stride_2_by_hand():
    src, w = ncx(1, 2), kernel_1d(1, 10, 100)
    # dst[x] = sum over y, k with x = 2*y + k of src[y] * w[k]
    r = reference("conv_transpose", src, w, strides=2, **NCX_IOX)
    np.testing.assert_array_equal(r.y.ravel(), [1, 10, 100 + 2, 20, 200])
    np.testing.assert_array_equal(r.n.ravel(), [1, 1, 2, 1, 1])
    cropped = reference("conv_transpose", src, w, strides=2, pads_begin=1, pads_end=1,
                        **NCX_IOX)
    np.testing.assert_array_equal(cropped.y.ravel(), [10, 102, 20])
    padded = reference("conv_transpose", src, w, np.array([0.5]), strides=2,
                       output_padding=1, **NCX_IOX)
    np.testing.assert_array_equal(padded.y.ravel(), [1.5, 10.5, 102.5, 20.5, 200.5, 0.5])
    # The last position receives the bias only: one term.
    np.testing.assert_array_equal(padded.n.ravel(), [2, 2, 3, 2, 2, 1])


def test_conv_transpose_same_pads_by_hand():
    # k=3, s=2: rule T gives total 1, so the output is s*B = 4 long.
    src, w = ncx(1, 2), kernel_1d(1, 10, 100)
    full = [1, 10, 102, 20, 200]
    upper = reference("conv_transpose", src, w, strides=2, auto_pad="same_upper", **NCX_IOX)
    lower = reference("conv_transpose", src, w, strides=2, auto_pad="same_lower", **NCX_IOX)
    np.testing.assert_array_equal(upper.y.ravel(), full[:4])   # pb=0, pe=1
    np.testing.assert_array_equal(lower.y.ravel(), full[1:])   # pb=1, pe=0


def test_conv_transpose_dst_shape_by_hand():
    src, w = ncx(1, 2), kernel_1d(1, 10, 100)
    # dst_shape 6 with explicit zero pads is output_padding 1.
    r = reference("conv_transpose", src, w, strides=2, dst_shape=(6,), **NCX_IOX)
    np.testing.assert_array_equal(r.y.ravel(), [1, 10, 102, 20, 200, 0])
    assert r.geometry.output_padding == (1,)
    # same_upper with dst_shape: rule F on A=3 (ceil(3/2) == 2): total (2-1)*2 + 3 - 3 = 2.
    r = reference("conv_transpose", src, w, strides=2, dst_shape=(1, 1, 3),
                  auto_pad="same_upper", **NCX_IOX)
    np.testing.assert_array_equal(r.y.ravel(), [10, 102, 20])


def test_grouped_by_hand():
    # Convolution, groups=2, 1x1 kernel: each output channel sees its own input channel.
    x = np.array([[1.0, 2.0], [3.0, 4.0]]).reshape(1, 2, 2)       # NCX: C=2, X=2
    w = np.array([10.0, 100.0]).reshape(2, 1, 1)                    # OIX [OC, IC/G, K]
    r = reference("convolution", x, w, groups=2, **NCX_OIX)
    np.testing.assert_array_equal(r.y[0], [[10, 20], [300, 400]])
    # ConvTranspose, groups=2, IC=2, OC=4: IOX [IC, OC/G, K]; input channel 0 feeds outputs
    # 0-1 (the first group), input channel 1 feeds outputs 2-3.
    w = np.array([[1.0, 2.0], [3.0, 4.0]]).reshape(2, 2, 1)
    r = reference("conv_transpose", x, w, groups=2, **NCX_IOX)
    np.testing.assert_array_equal(r.y[0], [[1, 2], [2, 4], [9, 12], [12, 16]])
    # The same weights as XOI ([K, OC/G, IC]) give the same result.
    r2 = reference("conv_transpose", x, np.transpose(w, (2, 1, 0)), groups=2,
                   data_format="NCX", weights_format="XOI")
    np.testing.assert_array_equal(r2.y, r.y)


def test_grouped_convolution_outer_split_by_hand():
    # IC=4, OC=2, groups=2: output channel 0 reads input channels 0-1, channel 1 reads 2-3.
    x = np.array([1.0, 2.0, 4.0, 8.0]).reshape(1, 4, 1)
    w = np.array([[1.0, 10.0], [100.0, 1000.0]]).reshape(2, 2, 1)   # OIX
    r = reference("convolution", x, w, groups=2, **NCX_OIX)
    np.testing.assert_array_equal(r.y.ravel(), [1 + 20, 400 + 8000])


def test_backward_weights_by_hand():
    # dW[k] = sum_y src[y + k] * diff_dst[y]
    src, dy = ncx(1, 2, 3), ncx(1, 10)
    r = reference("convolution_backward_weights", src, dy, weights_shape=(2,), **NCX_OIX)
    np.testing.assert_array_equal(r.y.ravel(), [1 + 20, 2 + 30])
    np.testing.assert_array_equal(r.n.ravel(), [2, 2])


def test_backward_data_by_hand():
    # diff_src[x] = sum over (y, k) with x = y + k of diff_dst[y] * w[k]
    r = reference("convolution_backward_data", ncx(1, 10), kernel_1d(1, 2), **NCX_OIX)
    np.testing.assert_array_equal(r.y.ravel(), [1, 2 + 10, 20])


# --------------------------------------------------------------------------------------------
# geometry formulas by hand (docs/semantics.md#geometry)
# --------------------------------------------------------------------------------------------


def test_same_rules_by_hand():
    # A=5, s=2, ek=4: B = ceil(5/2) = 3, total = (3-1)*2 + 4 - 5 = 3.
    assert same_total_rule_f(5, 2, 4) == 3
    assert split_same(3, "same_upper") == (1, 2)
    assert split_same(3, "same_lower") == (2, 1)
    assert same_total_rule_f(6, 3, 1) == 0
    assert same_total_rule_t(2, 5) == 3
    assert same_total_rule_t(3, 2) == 0


def test_geometry_by_hand():
    g = geometry("convolution", (2, 5, 5, 3), (3, 3, 3, 4), strides=2, auto_pad="same_upper")
    assert (g.b_shape, g.pads_begin, g.pads_end) == ((2, 3, 3, 4), (1, 1), (1, 1))
    g = geometry("ConvTranspose", (8, 32, 32, 64), (3, 3, 64, 64), strides=2,
                 auto_pad="same_upper", output_padding=1)
    assert (g.a_shape, g.pads_begin, g.pads_end) == ((8, 65, 65, 64), (0, 0), (1, 1))
    g = geometry("convolution_backward_data", (1, 4, 4, 8), (3, 3, 2, 8), strides=2,
                 pads_begin=1, pads_end=1, output_padding=1)
    assert g.a_shape == (1, 8, 8, 2)
    # weights_shape in spatial form takes channels from the data.
    g = geometry("conv_transpose_backward_weights", (1, 4, 4, 8), (1, 8, 8, 2),
                 weights_shape=(3, 3), strides=2, pads_begin=1, pads_end=1, output_padding=1)
    assert g.weights_shape == (3, 3, 2, 8)
    # The older ConvTransposeBackpropFilters defaults to XIO: [K.., IC, OC/G].
    g = geometry("ConvTransposeBackpropFilters-1", (1, 4, 4, 8), (1, 8, 8, 2),
                 filter_shape=(3, 3), strides=2, pads_begin=1, pads_end=1, output_padding=1)
    assert g.weights_shape == (3, 3, 8, 2)


@pytest.mark.parametrize(("op", "shapes", "attrs"), [
    ("convolution", [(1, 2, 1), (5, 1, 1)], {}),
    ("conv_transpose", [(1, 1, 1), (1, 1, 1)], {"pads_begin": 1}),
    ("conv_transpose", [(1, 2, 1), (3, 1, 1)], {"strides": 2, "dst_shape": (7,)}),
    ("conv_transpose", [(1, 2, 1), (3, 1, 1)], {"strides": 2, "dst_shape": (2,),
                                                "auto_pad": "same_upper"}),
])
def test_geometry_refuses(op, shapes, attrs):
    with pytest.raises(InvalidGeometry):
        geometry(op, *shapes, **attrs)


# --------------------------------------------------------------------------------------------
# a third implementation: the formulas of docs/semantics.md as literal loops (NCX, OIX / IOX)
# --------------------------------------------------------------------------------------------


def loop_convolution(x, w, s, d, pb, out_sizes, groups):
    """``dst[n, o, y] = sum_{i, k} x[n, g*IC/G + i, y*s + k*d - pb] * w[o, i, k]``."""
    n_, ic = x.shape[:2]
    oc, icg = w.shape[:2]
    kernel = w.shape[2:]
    out = np.zeros((n_, oc, *out_sizes))
    for n, o in itertools.product(range(n_), range(oc)):
        g = o // (oc // groups)
        for y in itertools.product(*map(range, out_sizes)):
            for i in range(icg):
                for k in itertools.product(*map(range, kernel)):
                    pos = tuple(yy * ss + kk * dd - pp
                                for yy, kk, ss, dd, pp in zip(y, k, s, d, pb))
                    if all(0 <= p < size for p, size in zip(pos, x.shape[2:])):
                        out[(n, o, *y)] += x[(n, g * (ic // groups) + i, *pos)] * w[(o, i, *k)]
    return out


def loop_conv_transpose(x, w, s, d, pb, out_sizes, groups):
    """Scatter form: ``dst[n, g*OC/G + j, y*s + k*d - pb] += src[n, c, y] * w[c, j, k]``."""
    n_, ic = x.shape[:2]
    ocg = w.shape[1]
    kernel = w.shape[2:]
    out = np.zeros((n_, ocg * groups, *out_sizes))
    for n, c in itertools.product(range(n_), range(ic)):
        g = c // (ic // groups)
        for y in itertools.product(*map(range, x.shape[2:])):
            for j in range(ocg):
                for k in itertools.product(*map(range, kernel)):
                    pos = tuple(yy * ss + kk * dd - pp
                                for yy, kk, ss, dd, pp in zip(y, k, s, d, pb))
                    if all(0 <= p < size for p, size in zip(pos, out_sizes)):
                        out[(n, g * ocg + j, *pos)] += x[(n, c, *y)] * w[(c, j, *k)]
    return out


def loop_backward_weights(a, b, s, d, pb, kernel, groups):
    """``dW[o, i, k] = sum_{n, y} a[n, g*Ca/G + i, y*s + k*d - pb] * b[n, o, y]``."""
    n_, ca = a.shape[:2]
    cb = b.shape[1]
    out = np.zeros((cb, ca // groups, *kernel))
    for o, i in itertools.product(range(cb), range(ca // groups)):
        g = o // (cb // groups)
        for k in itertools.product(*map(range, kernel)):
            for n in range(n_):
                for y in itertools.product(*map(range, b.shape[2:])):
                    pos = tuple(yy * ss + kk * dd - pp
                                for yy, kk, ss, dd, pp in zip(y, k, s, d, pb))
                    if all(0 <= p < size for p, size in zip(pos, a.shape[2:])):
                        out[(o, i, *k)] += a[(n, g * (ca // groups) + i, *pos)] * b[(n, o, *y)]
    return out


def assert_close(actual, desired):
    np.testing.assert_allclose(actual, desired, rtol=1e-12, atol=1e-12)


LOOP_CASES = [
    # ndim, strides, dilations, kernel, groups, auto_pad, pads_begin, pads_end, output_padding
    (1, (2,), (1,), (3,), 1, "none", (1,), (0,), (1,)),
    (1, (3,), (2,), (2,), 2, "same_lower", (0,), (0,), (2,)),
    (2, (2, 1), (1, 2), (2, 2), 2, "same_upper", (0, 0), (0, 0), (1, 0)),
    (2, (1, 2), (2, 1), (3, 1), 3, "none", (2, 0), (0, 1), (0, 1)),
    (2, (2, 2), (1, 1), (1, 3), 1, "valid", (0, 0), (0, 0), (1, 1)),
]


@pytest.mark.parametrize("case", LOOP_CASES, ids=[str(i) for i in range(len(LOOP_CASES))])
def test_oracle_matches_loops(case):
    ndim, s, d, kernel, groups, auto_pad, pb, pe, opad = case
    rng = np.random.default_rng(1)
    attrs = {"strides": s, "dilations": d, "auto_pad": auto_pad, "pads_begin": pb,
             "pads_end": pe, "groups": groups, "data_format": "NCX"}
    ca, cb = 2 * groups, 3 * groups
    x = rng.standard_normal((2, ca, *(6, 5)[:ndim]))
    w_conv = rng.standard_normal((cb, 2, *kernel))          # OIX [OC, IC/G, K]

    conv = reference("convolution", x, w_conv, weights_format="OIX", **attrs)
    geo = conv.geometry
    assert_close(conv.y, loop_convolution(x, w_conv, s, d, geo.pads_begin,
                                          geo.b_spatial, groups))
    dy = rng.standard_normal(conv.shape)
    dw = reference("convolution_backward_weights", x, dy, weights_shape=kernel,
                   weights_format="OIX", **attrs)
    assert_close(dw.y, loop_backward_weights(x, dy, s, d, geo.pads_begin,
                                             kernel, groups))

    src = rng.standard_normal((2, cb, *(3, 2)[:ndim]))
    w_t = rng.standard_normal((cb, 2, *kernel))             # IOX [IC, OC/G, K]
    ct = reference("conv_transpose", src, w_t, weights_format="IOX", output_padding=opad,
                   **attrs)
    geo = ct.geometry
    assert_close(ct.y, loop_conv_transpose(src, w_t, s, d, geo.pads_begin,
                                           geo.a_spatial, groups))
    # diff_src of ConvTranspose (a strided convolution) and its weights gradient
    dd = rng.standard_normal(ct.shape)
    ctbd = reference("conv_transpose_backward_data", dd, w_t, weights_format="IOX",
                     output_padding=opad, **attrs)
    assert_close(ctbd.y, loop_convolution(dd, w_t, s, d, geo.pads_begin,
                                          geo.b_spatial, groups))
    ctbw = reference("conv_transpose_backward_weights", src, dd, weights_shape=kernel,
                     weights_format="IOX", output_padding=opad, **attrs)
    assert_close(ctbw.y, loop_backward_weights(dd, src, s, d, geo.pads_begin,
                                               kernel, groups))


# --------------------------------------------------------------------------------------------
# layouts: hand-written permutations
# --------------------------------------------------------------------------------------------

# Canonical W [Cb, Ca/G, K1, K2] -> each format, written out for two spatial axes: in the
# Convolution family the canonical order is O, I (OIX); in the ConvTranspose family I, O (IOX).
FROM_CANONICAL_2D = {
    "convolution": {"OIX": (0, 1, 2, 3), "IOX": (1, 0, 2, 3), "XIO": (2, 3, 1, 0),
                    "XOI": (2, 3, 0, 1)},
    "conv_transpose": {"IOX": (0, 1, 2, 3), "OIX": (1, 0, 2, 3), "XOI": (2, 3, 1, 0),
                       "XIO": (2, 3, 0, 1)},
}


@pytest.mark.parametrize("op", sorted(FUNCTIONS))
def test_every_weights_and_data_format_agrees(op):
    """All four weight formats and both data formats describe the same computation."""
    kind, _ = FUNCTIONS[op]
    family, primitive, _, _ = KINDS[kind]
    canonical_format = "OIX" if family == "convolution" else "IOX"
    rng = np.random.default_rng(2)
    w_canon = rng.standard_normal((4, 3, 2, 3))       # Cb=4, Ca/G=3, groups=2: Ca=6
    a_ncx = rng.standard_normal((2, 6, 5, 6))         # the large tensor
    attrs = {"strides": (2, 1), "groups": 2, "auto_pad": "same_upper"}
    if primitive == "backward_weights":
        partner = "convolution" if family == "convolution" else "conv_transpose_backward_data"
        b_shape = reference(partner, a_ncx, w_canon, data_format="NCX",
                            weights_format=canonical_format, **attrs).shape
    else:
        b_shape = (2, 4, 3, 4)
    b_ncx = rng.standard_normal(b_shape)              # the small tensor
    results = []
    for fmt, perm in FROM_CANONICAL_2D[family].items():
        w = np.transpose(w_canon, perm)
        for data_format in ("NCX", "NXC"):
            def user(t, data_format=data_format):
                return t if data_format == "NCX" else np.moveaxis(t, 1, -1)

            extra = {"data_format": data_format, "weights_format": fmt, **attrs}
            if primitive == "forward":
                r = reference(op, user(a_ncx), w, **extra)
            elif primitive == "backward_data":
                r = reference(op, user(b_ncx), w, **extra)
            else:
                large, small = user(a_ncx), user(b_ncx)
                args = (large, small) if family == "convolution" else (small, large)
                r = reference(op, *args, weights_shape=w.shape, **extra)
            if primitive == "backward_weights":
                results.append(np.transpose(r.y, np.argsort(perm)))
            else:
                results.append(r.y if data_format == "NCX" else np.moveaxis(r.y, -1, 1))
    assert len(results) == 8
    for y in results[1:]:
        np.testing.assert_allclose(y, results[0], rtol=1e-13, atol=1e-13)


# --------------------------------------------------------------------------------------------
# identities (docs/semantics.md#canonical-convolution)
# --------------------------------------------------------------------------------------------

ADJOINT_CASES = [
    # ndim, attrs
    (1, {"strides": 3, "dilations": 2, "pads_begin": 2, "pads_end": 1, "groups": 2}),
    (2, {"strides": (2, 1), "auto_pad": "same_lower", "groups": 1}),
    (2, {"strides": 2, "auto_pad": "same_upper", "output_padding": 1, "groups": 3}),
    (3, {"strides": (1, 2, 1), "dilations": (2, 1, 1), "auto_pad": "valid", "groups": 2}),
]


@pytest.mark.parametrize(("ndim", "attrs"), ADJOINT_CASES)
@pytest.mark.parametrize("family", ["convolution", "conv_transpose"])
def test_dot_product_identities(family, ndim, attrs):
    """<fwd(x, W), dy> = <x, bwd_data(dy, W)> = <W, bwd_weights(x, dy)> under one set of
    attributes (docs/semantics.md#canonical-convolution); default formats XIO / XOI."""
    rng = np.random.default_rng(4)
    groups = attrs["groups"]
    attrs = dict(attrs)
    if family == "convolution":
        attrs.pop("output_padding", None)
    kernel = (2, 3, 2)[:ndim]
    x = rng.standard_normal((2, *(5, 4, 3)[:ndim], 2 * groups))
    if family == "convolution":
        w = rng.standard_normal((*kernel, 2, 3 * groups))   # XIO [K.., IC/G, OC]
    else:
        w = rng.standard_normal((*kernel, 3, 2 * groups))   # XOI [K.., OC/G, IC]
    y = reference(family, x, w, **attrs)
    dy = rng.standard_normal(y.shape)
    if family == "convolution":
        dx = reference("convolution_backward_data", dy, w, dst_shape=x.shape, **attrs)
        dw = reference("convolution_backward_weights", x, dy, weights_shape=w.shape, **attrs)
    else:
        dx = reference("conv_transpose_backward_data", dy, w, **attrs)
        dw = reference("conv_transpose_backward_weights", x, dy, weights_shape=w.shape,
                       **attrs)
    assert dx.shape == x.shape
    assert dw.shape == w.shape
    lhs = np.vdot(y.y, dy)
    scale = np.vdot(y.abs_sum, np.abs(dy))      # sum of |x * w * dy| over all products
    assert abs(lhs - np.vdot(x, dx.y)) <= 1e-12 * scale
    assert abs(lhs - np.vdot(w, dw.y)) <= 1e-12 * scale


PAIR_ATTRS = [
    {"strides": 2, "pads_begin": (1, 0), "pads_end": (0, 2), "output_padding": (1, 0)},
    {"strides": (3, 1), "dilations": 2, "pads_begin": 1, "groups": 2,
     "output_padding": (2, 0)},
    {"strides": (3, 1), "dilations": 2, "auto_pad": "same_lower", "groups": 2},
    {"strides": 2, "auto_pad": "same_upper", "groups": 2, "output_padding": 1},
    {"strides": (1, 2), "auto_pad": "valid", "groups": 2},
]


def _pair_inputs(attrs, data_format):
    rng = np.random.default_rng(5)
    groups = attrs.get("groups", 1)
    w = rng.standard_normal((2 * groups, 3, 2, 3))     # IOX [IC, OC/G, K] = OIX [OC, IC/G, K]
    ic = w.shape[0]
    src = rng.standard_normal((2, ic, 3, 4) if data_format == "NCX" else (2, 3, 4, ic))
    return rng, w, src


@pytest.mark.parametrize("attrs", PAIR_ATTRS)
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_conv_transpose_is_convolution_backward_data(attrs, data_format):
    """ConvTranspose IOX ``[IC, OC/G, K]`` and ConvolutionBackwardData OIX ``[OC, IC/G, K]``
    are the same canonical ``W`` ``[Cb, Ca/G, K]``: the two ops coincide
    (docs/semantics.md#canonical-convolution)."""
    _, w, src = _pair_inputs(attrs, data_format)
    common = {**attrs, "data_format": data_format}
    ct = reference("conv_transpose", src, w, weights_format="IOX", **common)
    cbd = reference("convolution_backward_data", src, w, weights_format="OIX", **common)
    np.testing.assert_array_equal(ct.y, cbd.y)
    np.testing.assert_array_equal(ct.n, cbd.n)


@pytest.mark.parametrize("attrs", [a for a in PAIR_ATTRS
                                   if not a.get("auto_pad", "none").startswith("same")])
@pytest.mark.parametrize("data_format", ["NCX", "NXC"])
def test_conv_transpose_backward_ops_are_convolutions(attrs, data_format):
    """ConvTransposeBackwardData is Convolution and ConvTransposeBackwardWeights is
    ConvolutionBackwardWeights with the roles of the tensors swapped (explicit pads only:
    with same_* the families resolve pads by different rules)."""
    rng, w, src = _pair_inputs(attrs, data_format)
    common = {**attrs, "data_format": data_format}
    conv_attrs = {k: v for k, v in common.items() if k != "output_padding"}
    dd = rng.standard_normal(reference("conv_transpose", src, w, weights_format="IOX",
                                       **common).shape)
    ctbd = reference("conv_transpose_backward_data", dd, w, weights_format="IOX", **common)
    conv = reference("convolution", dd, w, weights_format="OIX", **conv_attrs)
    np.testing.assert_array_equal(ctbd.y, conv.y)
    ctbw = reference("conv_transpose_backward_weights", src, dd, weights_shape=w.shape,
                     weights_format="IOX", **common)
    cbw = reference("convolution_backward_weights", dd, src, weights_shape=w.shape,
                    weights_format="OIX", **conv_attrs)
    np.testing.assert_array_equal(ctbw.y, cbw.y)


# --------------------------------------------------------------------------------------------
# the bound helper
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_bound_accepts_rounding_and_rejects_errors(dtype):
    rng = np.random.default_rng(6)
    x = random_array(rng, (2, 6, 3), dtype)
    w = random_array(rng, (3, 3, 4), dtype)
    r = reference("convolution", x, w)
    rounded = r.y.astype(numpy_dtype(dtype)).astype(np.float64)
    assert_within_bound(rounded, r.y, r.abs_sum, r.n, dtype)
    worst_allowed = np.abs(r.y) * 2.0**-10 + r.n * 2.0**-23 * r.abs_sum
    for bad in (r.y + 2 * worst_allowed + 1e-3, np.where(r.n > 0, np.nan, r.y),
                r.y[:, ::-1]):
        with pytest.raises(AssertionError, match="outside the error bound"):
            assert_within_bound(bad, r.y, r.abs_sum, r.n, dtype)
    with pytest.raises(AssertionError, match="shape"):
        assert_within_bound(r.y[:1], r.y, r.abs_sum, r.n, dtype)


def test_bound_is_tight_in_float64():
    ref = np.array([1.0, 0.0])
    assert_within_bound(ref, ref, np.zeros(2), np.zeros(2, int), "float64")
    with pytest.raises(AssertionError, match="index"):
        assert_within_bound(np.array([1.0, 1e-300]), ref, np.zeros(2), np.zeros(2, int),
                            "float64")
    with pytest.raises(AssertionError):
        assert_within_bound(np.array([1.0 + 2**-50, 0.0]), ref, np.zeros(2),
                            np.zeros(2, int), "float64")
