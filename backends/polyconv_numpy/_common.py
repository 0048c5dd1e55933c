"""Layout and dtype helpers shared by the numpy backend's two paths."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

import numpy as np

from polyconv._geometry import ConvPlan


def channels_last_view(x: Any, plan: ConvPlan) -> np.ndarray:
    """The data tensor as a channels-last view (no copy)."""
    x = np.asarray(x)
    return x if plan.channels_last else np.moveaxis(x, 1, -1)


def channels_last(x: Any, plan: ConvPlan, acc: np.dtype) -> np.ndarray:
    """The data tensor as a C-contiguous channels-last array of the accumulation dtype."""
    return np.ascontiguousarray(channels_last_view(x, plan), dtype=acc)


def to_user_layout(y: np.ndarray, plan: ConvPlan, dtype: np.dtype) -> np.ndarray:
    """A channels-last result in the user's data layout and dtype (one rounding)."""
    if not plan.channels_last:
        y = np.moveaxis(y, -1, 1)
    return np.ascontiguousarray(y, dtype=dtype)


def add_bias(acc: np.ndarray, bias: Any) -> None:
    """Bias over the last (channel) axis, in the accumulation dtype, before the rounding."""
    if bias is not None:
        acc += np.asarray(bias).astype(acc.dtype, copy=False)


def canonical_weights(w: Any, plan: ConvPlan, acc: np.dtype) -> np.ndarray:
    """The user's weights as canonical ``[Cb, Ca/G, K..]`` in the accumulation dtype."""
    return np.transpose(np.asarray(w), plan.weights_perm).astype(acc)


def dtypes(x: Any, plan: ConvPlan) -> tuple[np.dtype, np.dtype]:
    """(output dtype, accumulation dtype) of a call."""
    return np.asarray(x).dtype, np.dtype(plan.acc_dtype)


def weights_matrix(w4: np.ndarray, rows: tuple[int, ...], cols: tuple[int, ...]) -> np.ndarray:
    """``w4``'s axes ``rows`` and ``cols`` as one ``[G, rows, cols]`` matrix per group (axis 0),
    in a form BLAS reads in place.

    Copied in whichever order reads ``w4`` at the shorter innermost stride: rows then columns,
    or columns then rows with a transposed view returned. The user's weights layout decides
    (a copy whose innermost axis has a long stride costs milliseconds on large layers).
    """
    g = w4.shape[0]
    n_rows = math.prod(w4.shape[i] for i in rows)
    if abs(w4.strides[cols[-1]]) <= abs(w4.strides[rows[-1]]):
        return np.ascontiguousarray(w4.transpose(0, *rows, *cols)).reshape(g, n_rows, -1)
    m = np.ascontiguousarray(w4.transpose(0, *cols, *rows)).reshape(g, -1, n_rows)
    return m.transpose(0, 2, 1)


#: at least this many rows per thread before a loop is split over threads
_MIN_ROWS_PER_THREAD = 4096


@cache
def threads() -> int:
    """How many threads :func:`split_rows` uses: ``POLYCONV_NUMPY_THREADS`` if set, else
    the CPUs this process may run on (at most 8). numpy's own loops are single-threaded and
    release the GIL; long enough calls (the depthwise weight gradient's) then gain from
    ranges of rows run in parallel, short ones lose to contention for the GIL."""
    env = os.environ.get("POLYCONV_NUMPY_THREADS", "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ValueError(f"POLYCONV_NUMPY_THREADS={env!r}: expected a positive "
                             "number of threads") from None
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(
        os.cpu_count() or 1)
    return max(1, min(8, len(cpus)))


@cache
def _pool(n: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(n, thread_name_prefix="polyconv-numpy")


def split_rows(rows: int, work: Callable[[int, int], Any]) -> list:
    """``work(lo, hi)`` over contiguous, near-equal ranges of ``rows`` that cover it, one per
    thread (:func:`threads`), in parallel; the results in range order. Each call must touch
    only its own rows and scratch."""
    n = min(threads(), rows // _MIN_ROWS_PER_THREAD)
    if n <= 1:
        return [work(0, rows)]
    bounds = [rows * i // n for i in range(n + 1)]
    return list(_pool(n).map(work, bounds[:-1], bounds[1:]))
