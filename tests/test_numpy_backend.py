"""The numpy backend's strategies, each forced, over the whole grid.

The backend chooses per plan among ``gather`` (implicit GEMM on a phase grid), ``overlap``
(one product for all taps, then overlap-add; forward and backward_data) and ``gather_b``
(backward_weights), and routes non-finite inputs to its exact path (in-range windows only)
unless the choice is ``overlap``. The shared matrix exercises the default choice; here every
strategy of every primitive runs the same grid against the oracle, and NaN/Inf must come out
of the exact and overlap strategies alike.
"""

from __future__ import annotations

import numpy as np
import pytest
from oracle import numpy_dtype
from test_matrix import GRID, check_case

import polyconv
from polyconv.benchmarks.suite import CASES

polyconv_numpy = pytest.importorskip("polyconv_numpy")


#: every strategy of every primitive appears in one of these
FORCED = {
    "exact": "exact",
    "gather": "gather",
    "overlap": "overlap,backward_weights=gather_b",
}


@pytest.fixture(params=sorted(FORCED))
def forced(request):
    with polyconv_numpy.strategy(FORCED[request.param]):
        yield request.param


@pytest.fixture
def numpy_target():
    from conftest import TARGETS

    return next(t for t in TARGETS if t.name == "numpy")


@pytest.mark.parametrize("case", GRID, ids=lambda c: c.label)
def test_forced_strategy_grid(forced, numpy_target, case):
    check_case(numpy_target, case)


def test_exact_path_by_attribute(monkeypatch, numpy_target):
    monkeypatch.setattr(polyconv_numpy.BACKEND, "fast", False)
    for case in GRID[:40]:
        check_case(numpy_target, case)


@pytest.mark.parametrize("op", ["convolution", "conv_transpose"])
def test_nonfinite_input_takes_the_exact_path(op):
    # an inf in the data (not in the weights): the fast path is exact here too, and both
    # must give inf exactly where the poisoned element is read and finite values elsewhere
    x = np.ones((1, 6, 2), np.float32)
    x[0, 2, 0] = np.inf
    w = np.ones((3, 2, 2), np.float32)
    fn = getattr(polyconv, op)
    y = fn(x, w, strides=2, pads_begin=1, pads_end=1)
    polyconv_numpy.BACKEND.fast = False
    try:
        y_exact = fn(x, w, strides=2, pads_begin=1, pads_end=1)
    finally:
        polyconv_numpy.BACKEND.fast = True
    np.testing.assert_array_equal(y, y_exact)
    assert np.isinf(y).any() and np.isfinite(y).any()



@pytest.mark.parametrize("case", [c for c in CASES if "1D" not in c.name],
                         ids=lambda c: c.name)
def test_peak_memory_at_most_twice_inputs_and_output(case):
    # issue 6's bound on the benchmark cases: no im2col of the whole input, no full-size
    # float32 copies of 2-byte tensors (tracemalloc sees every numpy buffer: a count, not a
    # timing)
    import tracemalloc

    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(numpy_dtype(case.dtype)) for s in case.shapes]
    fn = getattr(polyconv, case.op)
    tracemalloc.start()
    try:
        y = fn(*arrays, *case.extra, **case.attrs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= 2 * (sum(a.nbytes for a in arrays) + y.nbytes)
