"""The shard geometry of polyconv._halo against a brute-force enumeration written from the
contract (docs/semantics.md#canonical-convolution): every pair ``(y, k)`` of the canonical
convolution pairs ``b[y]`` with ``a[y*s + k*d - pb]``; the rows each output shard reads, the
window it takes, the rows each input shard's data reaches, and the halos, are collected from
those pairs one by one."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polyconv._halo import axis_halo, even_split, plan_axis_halo


def _pairs(large, small, kernel, stride, dilation, pad):
    """Every (y, x) product of the axis, x unclipped."""
    for y in range(small):
        for k in range(kernel):
            yield y, y * stride + k * dilation - pad


def _shard_of(bounds, i):
    return next(j for j in range(len(bounds) - 1) if bounds[j] <= i < bounds[j + 1])


def _hull(values):
    return (min(values), max(values) + 1) if values else None


def brute(primitive, large, small, kernel, stride, dilation, pad, out_b, in_b):
    """Per shard (reads, window, touches, left, right), from the pairs alone."""
    n = len(out_b) - 1
    reads, window, touches = ([set() for _ in range(n)] for _ in range(3))
    data = primitive == "backward_data"
    for y, x in _pairs(large, small, kernel, stride, dilation, pad):
        inside = 0 <= x < large
        out_i, in_i = (x, y) if data else (y, x)
        if data:
            if inside:
                window[_shard_of(out_b, x)].add(y)
        else:
            window[_shard_of(out_b, y)].add(x)
        if inside:
            reads[_shard_of(out_b, out_i)].add(in_i)
            touches[_shard_of(in_b, in_i)].add(out_i)
    if data:   # the unclipped window: every y (any integer) whose product lands in the shard
        for y in range(-large - kernel * dilation - 2, small + large + kernel * dilation + 2):
            for k in range(kernel):
                x = y * stride + k * dilation - pad
                if 0 <= x < large:
                    window[_shard_of(out_b, x)].add(y)
    out = []
    for j in range(n):
        i0, i1 = in_b[j], in_b[j + 1]
        r = _hull(reads[j])
        left = max(0, i0 - r[0]) if r else 0
        right = max(0, r[1] - i1) if r else 0
        out.append((r, _hull(window[j]), _hull(touches[j]), left, right))
    return out


def _bounds(size, n, cuts):
    """Uneven boundaries from sorted cut points, or the even split."""
    if cuts is None:
        return even_split(size, n)
    return (0, *sorted(c % (size + 1) for c in cuts[: n - 1]), size)


def check(primitive, large, small, kernel, stride, dilation, pad, n, out_cuts=None,
          in_cuts=None):
    data = primitive == "backward_data"
    out_size, in_size = (large, small) if data else (small, large)
    out_b = _bounds(out_size, n, out_cuts)
    in_b = _bounds(in_size, n, in_cuts)
    h = axis_halo(primitive, large, small, kernel, stride, dilation, pad, out_b, in_b)
    expected = brute(primitive, large, small, kernel, stride, dilation, pad, out_b, in_b)
    assert len(h.shards) == n
    for j, (sh, (reads, window, touches, left, right)) in enumerate(zip(h.shards, expected)):
        where = f"shard {j} of {primitive} {large=} {small=} k{kernel} s{stride} d{dilation} " \
                f"pb{pad} out {out_b} in {in_b}"
        assert sh.out == (out_b[j], out_b[j + 1]), where
        assert sh.own == (in_b[j], in_b[j + 1]), where
        if reads is None:
            assert sh.reads[0] == sh.reads[1], where
        else:
            assert sh.reads == reads, where
        if window is not None:
            assert sh.window == window, where
        if touches is None:
            assert sh.touches[0] == sh.touches[1], where
        else:
            assert sh.touches == touches, where
        assert (sh.left, sh.right) == (left, right), where
    assert h.left == max(e[3] for e in expected)
    assert h.right == max(e[4] for e in expected)
    # every read row sits in the shard itself or an immediate neighbour, brute force
    ok = all(r is None or all(abs(_shard_of(in_b, i) - j) <= 1 for i in range(*r)
                              if in_b[0] <= i < in_b[-1])
             for j, (r, *_rest) in enumerate(expected))
    assert h.neighbours_suffice == ok


def _geometry(kernel, stride, dilation, pb, pe, small, opad):
    """``large`` from the contract's size rule ``A = s*(B-1) + ek - pb - pe + op``."""
    ek = (kernel - 1) * dilation + 1
    return stride * (small - 1) + ek - pb - pe + opad


GRID = [  # kernel, stride, dilation, pb, pe, small, output_padding
    (3, 1, 1, 1, 1, 16, 0),     # same, overlapping
    (3, 2, 1, 1, 1, 8, 1),      # k3 s2 op1: the decoder's ConvTranspose
    (4, 2, 1, 1, 1, 8, 0),      # k4 s2
    (2, 2, 1, 0, 0, 8, 0),      # k2 s2, no overlap
    (3, 1, 2, 2, 2, 12, 0),     # dilated
    (5, 3, 2, 0, 3, 6, 2),      # strided, dilated, asymmetric pads, output_padding
    (3, 2, 1, -1, 2, 9, 0),     # a negative pad
    (1, 4, 1, 0, 0, 5, 3),      # rows no tap reaches
    (7, 1, 1, 3, 3, 8, 0),      # halo larger than small shards
]


@pytest.mark.parametrize("primitive", ["forward", "backward_data", "backward_weights"])
@pytest.mark.parametrize("geo", GRID, ids=str)
@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_even_shards_match_enumeration(primitive, geo, n):
    kernel, stride, dilation, pb, _pe, small, _opad = geo
    large = _geometry(*geo)
    check(primitive, large, small, kernel, stride, dilation, pb, n)


@settings(max_examples=300, deadline=None)
@given(primitive=st.sampled_from(["forward", "backward_data", "backward_weights"]),
       kernel=st.integers(1, 5), stride=st.integers(1, 4), dilation=st.integers(1, 3),
       pb=st.integers(-2, 5), pe=st.integers(-2, 5), small=st.integers(1, 12),
       opad=st.integers(0, 3), n=st.sampled_from([2, 3, 4, 8]),
       out_cuts=st.none() | st.lists(st.integers(0, 40), min_size=7, max_size=7),
       in_cuts=st.none() | st.lists(st.integers(0, 40), min_size=7, max_size=7))
def test_uneven_shards_match_enumeration(primitive, kernel, stride, dilation, pb, pe, small,
                                         opad, n, out_cuts, in_cuts):
    opad = min(opad, max(stride, dilation) - 1)
    large = _geometry(kernel, stride, dilation, pb, pe, small, opad)
    if large < 1:
        return
    check(primitive, large, small, kernel, stride, dilation, pb, n, out_cuts, in_cuts)


def test_plan_axis_halo_reads_the_plan():
    import polyconv

    plan = polyconv.infer_shape("conv_transpose", (1, 8, 6, 2), (3, 4, 3, 2), strides=2,
                                pads_begin=1, pads_end=1, output_padding=(1, 0))
    assert plan.a_spatial == (16, 12)
    h = plan_axis_halo(plan, 0, even_split(16, 4), even_split(8, 4))
    assert [sh.reads for sh in h.shards] == [(0, 3), (2, 5), (4, 7), (6, 8)]
    assert (h.left, h.right) == (0, 1)
    h1 = plan_axis_halo(plan, 1, even_split(12, 2), even_split(6, 2))
    assert h1.shards[0].reads == (0, 4) and h1.shards[1].reads == (2, 6)


def test_mismatched_splits_are_refused():
    with pytest.raises(ValueError, match="2 output shards but 3 input shards"):
        axis_halo("forward", 8, 8, 3, 1, 1, 1, (0, 4, 8), (0, 3, 6, 8))
    with pytest.raises(ValueError, match="from 0 to the sizes"):
        axis_halo("forward", 8, 8, 3, 1, 1, 1, (0, 4, 7), (0, 4, 8))


def test_even_split():
    for size, n in itertools.product(range(0, 20), [1, 2, 3, 4, 8]):
        b = even_split(size, n)
        sizes = [b[i + 1] - b[i] for i in range(n)]
        assert b[0] == 0 and b[-1] == size and max(sizes) - min(sizes) <= 1
        assert sizes == sorted(sizes, reverse=True)
