"""The phase geometry (polyconv._phases) against brute-force enumeration of the canonical
convolution's index pairs: integers only, no arrays."""

from __future__ import annotations

import itertools

import pytest

import polyconv
from polyconv._phases import adjoint_phases, axis_phases, in_range, phases

# one axis: large size A, small size B, kernel, stride, dilation, pad_begin (B is free: the
# windows only clip, whatever geometry produced it)
AXES = [g for g in itertools.product(range(1, 8), range(1, 6), range(1, 5), range(1, 4),
                                     range(1, 4), range(0, 4))]


def pairs(a, b, k, s, d, pb):
    """Every in-range ``(y, k, x)`` of the canonical convolution on one axis."""
    return {(y, kk, y * s + kk * d - pb) for y in range(b) for kk in range(k)
            if 0 <= y * s + kk * d - pb < a}


def test_in_range_is_exactly_the_in_range_indices():
    for offset, step, count, size in itertools.product(range(-7, 8), range(1, 4), range(6),
                                                       range(7)):
        want = [i for i in range(count) if 0 <= i * step + offset < size]
        win = in_range(offset, step, count, size)
        if not want:
            assert win is None
            continue
        assert list(range(count))[win.index] == want
        assert list(range(size))[win.positions] == [i * step + offset for i in want]
        assert win.count == len(want) and win.first == want[0] * step + offset


def test_axis_numbers_match_brute_force():
    for a, b, k, s, d, pb in AXES:
        ax = axis_phases(a, b, k, s, d, pb)
        got = set()
        for kk in range(k):
            # tap k reads phase r at shift q: a[y*s + k*d - pb] is phase_r[y + q]
            r, q = ax.phase[kk], ax.shift[kk]
            assert (y := 5) * s + kk * d - pb == (y + q) * s + r - pb
            assert 0 <= r < s
            win = ax.tap_window(kk)
            if win is None:
                continue
            ys = list(range(b))[win.index]
            xs = list(range(a))[win.positions]
            got |= {(y, kk, x) for y, x in zip(ys, xs, strict=True)}
        assert got == pairs(a, b, k, s, d, pb), (a, b, k, s, d, pb)
        # taps per phase: a partition of the kernel, ascending, evenly spaced
        assert sorted(t for ts in ax.taps for t in ts) == list(range(k))
        for r, ts in enumerate(ax.taps):
            assert all(ax.phase[t] == r for t in ts)
            assert all(t1 - t0 == ax.tap_step for t0, t1 in itertools.pairwise(ts))
            assert all(ax.shift[t1] - ax.shift[t0] == ax.shift_step
                       for t0, t1 in itertools.pairwise(ts))
        assert ax.max_shift == max(ax.shift)


def test_the_window_pairs_every_cell_with_its_terms():
    # brute force: every (y, k) pair whose position x = y*s + k*d - pb is in a lands in cell
    # q = X // s of phase r = X % s (X = x + pb), on window row j = max_shift - (k*d) // s,
    # whose tap there is k and whose padded b row (q - q_lo + j) holds b[y]; and the padded
    # b is rows + max_shift rows long
    for a, b, k, s, d, pb in AXES:
        ax = axis_phases(a, b, k, s, d, pb)
        lo, hi = ax.window_pads
        assert lo + b + hi == ax.rows + ax.max_shift
        assert len(ax.window_taps) == ax.max_shift + 1
        assert all(len(row) == s for row in ax.window_taps)
        for y, kk, x in pairs(a, b, k, s, d, pb):
            q, r = divmod(x + pb, s)
            j = ax.max_shift - (kk * d) // s
            assert ax.q_lo <= q < ax.q_lo + ax.rows
            assert ax.window_taps[j][r] == kk
            assert q - ax.q_lo + j - lo == y
        # each tap appears once in the window; every other entry is the zero tap (k)
        taps = [t for row in ax.window_taps for t in row if t != k]
        assert sorted(taps) == list(range(k))


def test_phase_cells_cover_the_large_axis():
    for a, b, k, s, d, pb in AXES:
        ax = axis_phases(a, b, k, s, d, pb)
        # cells 0..cells-1 of every phase reach every x, each exactly once; no fewer would
        covered = {}
        for r in range(s):
            for i in range(ax.cells):
                x = i * s + r - pb
                if 0 <= x < a:
                    assert x not in covered
                    covered[x] = (r, i)
        assert sorted(covered) == list(range(a))
        assert max(i for _, i in covered.values()) == ax.cells - 1
        # the window of each phase is exactly its in-range cells, also for a larger grid
        for cells in (ax.cells, ax.cells + 3):
            for r in range(s):
                want = [i for i in range(cells) if 0 <= i * s + r - pb < a]
                win = ax.phase_window(r, cells)
                if not want:
                    assert win is None
                    continue
                assert list(range(cells))[win.index] == want
                assert list(range(a))[win.positions] == [i * s + r - pb for i in want]
        # the tight cover: rows q_lo.. interleaved hold a from crop on, and no row is spare
        assert ax.q_lo * s <= pb < (ax.q_lo + 1) * s
        assert ax.crop == pb - ax.q_lo * s
        assert (ax.q_lo + ax.rows - 1) * s < pb + a <= (ax.q_lo + ax.rows) * s


PLANS = [
    ("conv_transpose", (2, 5, 4, 3), (3, 2, 4, 3), dict(strides=(2, 3), pads_begin=(1, 0),
                                                        pads_end=(0, 2), output_padding=(1, 2))),
    ("convolution", (1, 9, 7, 2), (3, 2, 2, 4), dict(strides=(3, 2), dilations=(2, 3),
                                                    pads_begin=(2, 1), pads_end=(0, 3))),
    ("convolution", (1, 6, 5, 4, 1), (2, 3, 2, 1, 2), dict(strides=(2, 1, 3),
                                                          pads_begin=(1, 0, 1))),
    ("convolution", (1, 8, 1), (4, 1, 1), dict(strides=1, dilations=2, auto_pad="same_upper")),
]


@pytest.mark.parametrize("op,src,wts,attrs", PLANS)
def test_plan_taps_and_windows_match_brute_force(op, src, wts, attrs):
    plan = polyconv.infer_shape(op, src, wts, **attrs)
    ph = phases(plan)
    assert ph is phases(plan)                                    # cached
    assert len(ph.taps) == len(list(itertools.product(*map(range, plan.kernel))))
    want = set()
    for y in itertools.product(*map(range, plan.b_spatial)):
        for t, k in enumerate(itertools.product(*map(range, plan.kernel))):
            x = tuple(yi * s + ki * d - pb for yi, ki, s, d, pb in
                      zip(y, k, plan.strides, plan.dilations, plan.pads_begin))
            if all(0 <= xi < a for xi, a in zip(x, plan.a_spatial)):
                want.add((y, t, x))
    got = set()
    for t, b_index, a_index in ph.tap_windows:
        assert ph.taps[t].k == tuple(itertools.product(*map(range, plan.kernel)))[t]
        ys = itertools.product(*(list(range(n))[sl] for n, sl in zip(plan.b_spatial, b_index)))
        xs = itertools.product(*(list(range(n))[sl] for n, sl in zip(plan.a_spatial, a_index)))
        got |= {(y, t, x) for y, x in zip(ys, xs, strict=True)}
    assert got == want
    # the phases reached, each with its taps, ascending; in order of their first tap
    seen = [tap.phase for tap in ph.taps]
    assert [r for r, _ in ph.by_phase] == list(dict.fromkeys(seen))
    for r, ts in ph.by_phase:
        assert ts == tuple(t for t, tap in enumerate(ph.taps) if tap.phase == r)
    assert ph.every_phase_reached == all(set(ax.phase) == set(range(ax.stride))
                                         for ax in ph.axes)
    # each phase's cells hold distinct positions of a, all of them over all phases
    covered = []
    for r in itertools.product(*(range(s) for s in plan.strides)):
        win = ph.phase_window(r)
        if win is None:
            continue
        cells, xs = win
        for i, x in zip(itertools.product(*(list(range(ax.cells))[sl] for ax, sl in
                                            zip(ph.axes, cells))),
                        itertools.product(*(list(range(n))[sl] for n, sl in
                                            zip(plan.a_spatial, xs))), strict=True):
            assert x == tuple(ii * s + ri - pb for ii, s, ri, pb in
                              zip(i, plan.strides, r, plan.pads_begin))
            covered.append(x)
    assert sorted(covered) == list(itertools.product(*map(range, plan.a_spatial)))


@pytest.mark.parametrize("op,src,wts,attrs", [
    *PLANS,
    ("conv_transpose", (1, 4, 3, 2), (2, 2, 2, 2), dict(strides=2)),                # covered
    ("conv_transpose", (1, 4, 3, 2), (2, 2, 2, 2), dict(strides=(3, 2), output_padding=(2, 1))),
    ("convolution", (1, 9, 8, 2), (2, 3, 2, 2), dict(strides=(2, 3), pads_begin=(1, 0)))])
def test_one_tap_per_phase_and_cover_match_brute_force(op, src, wts, attrs):
    # counted from every (y, k) pair directly: how many terms each position of a receives
    plan = polyconv.infer_shape(op, src, wts, **attrs)
    terms = dict.fromkeys(itertools.product(*map(range, plan.a_spatial)), 0)
    for y in itertools.product(*map(range, plan.b_spatial)):
        for k in itertools.product(*map(range, plan.kernel)):
            x = tuple(yi * s + ki * d - pb for yi, ki, s, d, pb in
                      zip(y, k, plan.strides, plan.dilations, plan.pads_begin))
            if x in terms:
                terms[x] += 1
    ph = phases(plan)
    # one tap per phase: no position gets two terms (the converse holds on these plans,
    # where every tap meets the data)
    assert ph.one_tap_per_phase == (max(terms.values()) <= 1)
    if ph.one_tap_per_phase:
        assert ph.windows_cover == (min(terms.values()) == 1)


@pytest.mark.parametrize("kernel,stride,dilation,full", [
    (4, 2, 1, True), (2, 2, 1, True), (16, 8, 1, True), (6, 3, 1, True), (3, 1, 2, False),
    (3, 2, 1, False), (1, 2, 1, False), (5, 2, 1, False), (4, 2, 2, False), (3, 3, 2, False),
    (5, 3, 2, False)])
def test_fills_window_matches_brute_force(kernel, stride, dilation, full):
    # counted directly: each phase r's shifts are the q with q*s + r = k*d for some tap k
    plan = polyconv.infer_shape("convolution", (1, 30, 2), (kernel, 2, 2), strides=stride,
                                dilations=dilation)
    shifts = {r: sorted((k * dilation) // stride for k in range(kernel)
                        if (k * dilation) % stride == r) for r in range(stride)}
    top = (kernel - 1) * dilation // stride
    assert all(shifts[r] == list(range(top + 1)) for r in shifts) == full
    assert phases(plan).fills_window == full
    square = polyconv.infer_shape("convolution", (1, 30, 30, 2), (kernel, 3, 2, 2),
                                  strides=(stride, 1), dilations=(dilation, 1))
    assert phases(square).fills_window == full     # a stride-1 axis fills its window


def _adjoint_pairs(plan):
    """The ``(y.., k.., x..)`` index pairs that :func:`adjoint_phases` forms: each phase's
    forward convolution of ``b`` (output cell ``i``, tap ``j`` of its kernel reads
    ``b[i + j*d' - pb']``), mapped back to kernel taps and positions of ``a``."""
    got, cells = set(), []
    for phase in adjoint_phases(plan):
        positions = [range(sl.start, sl.stop, sl.step) for sl in phase.a_index]
        cells += list(itertools.product(*positions))
        if phase.plan is None:
            assert not all(phase.taps)
            continue
        sub = phase.plan
        assert sub.strides == (1,) * sub.ndim and sub.a_spatial == plan.b_spatial
        assert sub.b_spatial == tuple(len(p) for p in positions)
        for i in itertools.product(*(range(n) for n in sub.b_spatial)):
            for j in itertools.product(*(range(k) for k in sub.kernel)):
                y = tuple(ii + jj * d - pb for ii, jj, d, pb in
                          zip(i, j, sub.dilations, sub.pads_begin))
                if all(0 <= yy < bb for yy, bb in zip(y, plan.b_spatial)):
                    k = tuple(t[jj] for t, jj in zip(phase.taps, j))
                    x = tuple(p[ii] for p, ii in zip(positions, i))
                    got.add((y, k, x))
    return got, cells


@pytest.mark.parametrize("axis", AXES[::7])
def test_adjoint_phases_form_exactly_the_index_pairs(axis):
    # backward_data phase by phase, as forward convolutions of b: every in-range pair of the
    # canonical convolution once, no other, and every position of a in exactly one phase
    a, b, k, s, d, pb = axis
    base = polyconv.infer_shape("convolution", (1, 8, 1), (1, 1, 1))
    plan = base.with_(a_spatial=(a,), b_spatial=(b,), kernel=(k,), strides=(s,),
                      dilations=(d,), pads_begin=(pb,))
    got, cells = _adjoint_pairs(plan)
    want = {((y,), (kk,), (x,)) for y, kk, x in pairs(a, b, k, s, d, pb)}
    assert got == want
    assert sorted(cells) == [(x,) for x in range(a)]


def test_adjoint_phases_in_two_dimensions():
    plan = polyconv.infer_shape("conv_transpose", (1, 4, 5, 1), (3, 4, 1, 1), strides=(2, 3),
                                pads_begin=(1, 0), pads_end=(0, 2), output_padding=(1, 2),
                                dilations=(1, 2))
    got, cells = _adjoint_pairs(plan)
    want = set()
    for (y0, k0, x0), (y1, k1, x1) in itertools.product(
            *(pairs(a, b, k, s, d, pb) for a, b, k, s, d, pb in
              zip(plan.a_spatial, plan.b_spatial, plan.kernel, plan.strides, plan.dilations,
                  plan.pads_begin))):
        want.add(((y0, y1), (k0, k1), (x0, x1)))
    assert got == want
    assert sorted(cells) == sorted(itertools.product(*(range(a) for a in plan.a_spatial)))
