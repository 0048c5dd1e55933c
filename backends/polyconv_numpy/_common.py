"""Layout and dtype helpers shared by the numpy backend's two paths."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from typing import Any

import numpy as np

from polyconv import _malloc
from polyconv._geometry import ConvPlan


def moveaxis(x: np.ndarray, source: int, destination: int) -> np.ndarray:
    """``np.moveaxis`` of one axis, without its argument normalisation (a few microseconds of
    a small call, which makes several)."""
    n = x.ndim
    order = [i for i in range(n) if i != source % n]
    order.insert(destination % n, source % n)
    return x.transpose(order)


def channels_last_view(x: Any, plan: ConvPlan) -> np.ndarray:
    """The data tensor as a channels-last view (no copy)."""
    x = np.asarray(x)
    return x if plan.channels_last else moveaxis(x, 1, -1)


def channels_last(x: Any, plan: ConvPlan, acc: np.dtype) -> np.ndarray:
    """The data tensor as a C-contiguous channels-last array of the accumulation dtype."""
    x = np.asarray(x)
    return np.ascontiguousarray(x, dtype=acc) if plan.channels_last else _move_channels(
        x, acc, to_last=True)


def _move_channels(x: np.ndarray, dtype: np.dtype, to_last: bool) -> np.ndarray:
    """``x`` (``[N, C, X..]``, or ``[N, X.., C]`` when not ``to_last``) with its channels moved
    to the other end, C-contiguous, in ``dtype``: by tiles (:func:`transpose`) where ``x`` is
    C-contiguous with a spatial axis and holds values, else numpy's copy of the moved view
    (an empty ``x``, a batch of 0, has no ``-1`` axis to reshape to)."""
    if not x.flags.c_contiguous or x.ndim < 3 or x.size == 0:
        return np.ascontiguousarray(moveaxis(x, 1 if to_last else -1, -1 if to_last else 1),
                                    dtype=dtype)
    n = x.shape[0]
    src = x.reshape(n, x.shape[1], -1) if to_last else x.reshape(n, -1, x.shape[-1])
    out = np.empty((n, *x.shape[2:], x.shape[1]) if to_last
                   else (n, x.shape[-1], *x.shape[1:-1]), dtype=dtype)
    transpose(out.reshape(n, src.shape[2], src.shape[1]), src)
    return out


#: values of one tile of :func:`transpose`, the columns it spans at least, and the rows
#: from which a transpose goes by tiles
_TILE_VALUES = 1 << 14
_TILE_COLUMNS = 256
_TILE_MIN_ROWS = 32
#: bytes from which :func:`transpose` is split over threads (per thread)
_TRANSPOSE_SPLIT_BYTES = 1 << 20


def transpose(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[n] = src[n].T`` (``[N, R, C]`` into ``[N, C, R]``, cast to ``dst``'s dtype), by
    tiles of about :data:`_TILE_VALUES` values (at least :data:`_TILE_MIN_ROWS` rows and
    :data:`_TILE_COLUMNS` columns where there are) that stay in cache, on threads. numpy's
    copy of the whole transposed view reads or writes with a stride of a whole row per
    element: against it (2-CPU x86-64, float32), a U-Net's 64x128x128 output 5.4 -> 1.2 ms,
    a 3-D 32x32x64x64 one 22 -> 3.9, wav2vec 2.0's 2x512x3199 input 17 -> 3.2,
    32x28x28x256 12 -> 7. Fewer rows are copied whole: that copy writes runs of every row
    at once and reads as many streams, as fast (FCN-8s's 21x512x512 output gradient into
    channels-last: 4.4 ms whole, 5.0 by tiles)."""
    n, rows, cols = src.shape
    if rows < _TILE_MIN_ROWS:
        dst[...] = np.swapaxes(src, 1, 2)
        return
    tr = max(1, min(rows, max(_TILE_MIN_ROWS, _TILE_VALUES // max(1, min(cols, _TILE_COLUMNS)))))
    tc = max(1, min(cols, max(_TILE_COLUMNS, _TILE_VALUES // tr)))
    tiles = -(-rows // tr)

    def work(lo: int, hi: int) -> None:
        for j in range(lo, hi):
            i, r0 = j // tiles, j % tiles * tr
            for c0 in range(0, cols, tc):
                dst[i, c0: c0 + tc, r0: r0 + tr] = src[i, r0: r0 + tr, c0: c0 + tc].T

    tile_bytes = tr * cols * max(src.itemsize, dst.itemsize)
    split_rows(n * tiles, work, min_rows=max(1, _TRANSPOSE_SPLIT_BYTES // max(tile_bytes, 1)))


#: bytes of the source one block of :func:`copy_channels_first` reads, and the channels from
#: which it copies by blocks
_TRANSPOSE_BLOCK_BYTES = 1 << 15
_TRANSPOSE_BLOCK_CHANNELS = 32


def copy_channels_first(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = np.moveaxis(src, -1, 0)`` (``src`` channels-last, ``[N, X.., C]``), by
    blocks of ``src``'s lines small enough that the strided reads of one block stay in
    cache. numpy's copy of the whole view walks ``src`` with a stride of ``C`` values per
    element: 4-8x slower from 64 channels up (2-CPU x86-64, float32: ResNeXt-50's
    4x56x56x128 input 9.6 ms against 1.2-2.4), so from :data:`_TRANSPOSE_BLOCK_CHANNELS`
    on (3 channels: as fast either way, and many phases' blocks of a 16x16-strided patch
    embedding cost more in calls than they save). A ``src`` whose channels are not its
    innermost axis in memory (a view of channels-first data) is copied whole: that copy
    reads it in order."""
    if (src.ndim < 3 or src.shape[-1] < _TRANSPOSE_BLOCK_CHANNELS
            or abs(src.strides[-1]) != src.itemsize):
        dst[...] = moveaxis(src, -1, 0)
        return
    line = math.prod(src.shape[2:]) * src.itemsize
    step = max(1, _TRANSPOSE_BLOCK_BYTES // max(line, 1))
    for n in range(src.shape[0]):
        for i in range(0, src.shape[1], step):
            dst[:, n, i: i + step] = moveaxis(src[n, i: i + step], -1, 0)


def to_user_layout(y: np.ndarray, plan: ConvPlan, dtype: np.dtype) -> np.ndarray:
    """A channels-last result in the user's data layout and dtype (one rounding)."""
    return np.ascontiguousarray(y, dtype=dtype) if plan.channels_last else _move_channels(
        y, dtype, to_last=False)


def add_bias(acc: np.ndarray, bias: Any) -> None:
    """Bias over the last (channel) axis, in the accumulation dtype, before the rounding."""
    if bias is not None:
        acc += np.asarray(bias).astype(acc.dtype, copy=False)


def row_strides(extent: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides, in values, of an array of shape ``extent``: a multi-index's offset
    into it flattened is its dot product with these."""
    return tuple(math.prod(extent[i + 1:]) for i in range(len(extent)))


def in_range(start: int, size: int, extent: int) -> tuple[slice, slice]:
    """The part of a window of ``extent`` positions from ``start`` (an axis's coordinate,
    negative in the padding before) that lies on the axis's ``size`` positions: ``(slice of
    the window, slice of the axis)``, both empty where none does."""
    lo = max(start, 0)
    hi = max(min(start + extent, size), lo)
    return slice(lo - start, hi - start), slice(lo, hi)


def canonical_weights(w: Any, plan: ConvPlan, acc: np.dtype) -> np.ndarray:
    """The user's weights as canonical ``[Cb, Ca/G, K..]`` in the accumulation dtype: a
    read-only view of them where they are already in it (no copy of a large layer's weights
    on every call), else a copy."""
    wc = np.transpose(np.asarray(w), plan.weights_perm).astype(acc, copy=False)
    if wc.base is not None and wc.flags.writeable:     # not copied: a view of the user's
        wc = wc.view()
        wc.flags.writeable = False
    return wc


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


#: at least this many rows per thread before a loop is split over threads (numpy's loops
#: alone; loops with matrix products: _MIN_BLAS_ROWS_PER_THREAD, a few blocks' worth)
_MIN_ROWS_PER_THREAD = 4096
_MIN_BLAS_ROWS_PER_THREAD = 512


@cache
def threads() -> int:
    """How many threads :func:`split_rows` uses at most: ``POLYCONV_NUMPY_THREADS`` if set,
    else the CPUs this process may run on (at most 8)."""
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


class _Blas:
    """numpy's BLAS thread pool, held at one thread while polyconv's own threads call it.

    A loop that alternates copies (numpy's, on one thread) with matrix products (BLAS's, on
    all) leaves the other CPUs idle during the copies, and BLAS's idle workers spin for a
    while after each product, which on some hosts (CPUs that share a physical core) halves
    the copies' speed. Ranges of rows on polyconv's own threads, each calling a one-threaded
    BLAS, keep every CPU on useful work instead (ResNet-50's 3x3 64->64 forward: 4.7 ms
    against 5.3-7.6). The limit is process-wide while any such loop runs (counted, so that
    concurrent calls restore it once); `threadpoolctl` finds the library.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._saved: list[tuple[Any, int]] = []

    @functools.cached_property
    def _controllers(self) -> list:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:     # pragma: no cover - a declared dependency
            return []
        return list(ThreadpoolController().select(user_api="blas").lib_controllers)

    def threads(self) -> int | None:
        """The BLAS's configured thread limit (the least of several), or ``None`` where no
        BLAS library can be controlled: then loops that call it are not split. While another
        call's one-thread section holds it at one, the limit that section saved: a result
        must not depend on what other threads run."""
        with self._lock:
            limits = ([n for _, n in self._saved] if self._users
                      else [c.num_threads for c in self._controllers])
        return min(limits) if limits else None

    @contextlib.contextmanager
    def one_thread(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._saved = [(c, c.num_threads) for c in self._controllers]
                for c, _ in self._saved:
                    c.set_num_threads(1)
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    for c, n in self._saved:
                        c.set_num_threads(n)


BLAS = _Blas()


@cache
def start() -> None:
    """What the backend does once per process, on its first computation rather than on a
    plan's: glibc's malloc thresholds (:mod:`polyconv._malloc`) and the search for the BLAS
    library that :class:`_Blas` holds at one thread (importing `threadpoolctl` and reading
    the loaded libraries, about 5 ms, which the first plan to split its products over
    threads paid on top of its own first call)."""
    _malloc.tune()
    BLAS.threads()


def split_rows(rows: int, work: Callable[[int, int], Any], blas: bool = False,
               min_rows: int | None = None) -> list:
    """``work(lo, hi)`` over contiguous, near-equal ranges of ``rows`` that cover it, one per
    thread (:func:`threads`), in parallel; the results in range order. Each call must touch
    only its own rows and scratch. A thread gets at least ``min_rows`` rows (by default
    enough for its start-up to pay off on rows of a few channels).

    numpy's loops release the GIL. ``blas``: the work calls matrix products; then the ranges
    run only where the BLAS can be held at one thread meanwhile (:class:`_Blas`), and on no
    more threads than the BLAS itself may use (``OPENBLAS_NUM_THREADS=1`` keeps a call on one
    thread).
    """
    if min_rows is None:
        min_rows = _MIN_BLAS_ROWS_PER_THREAD if blas else _MIN_ROWS_PER_THREAD
    n = min(threads(), rows // max(min_rows, 1))
    if blas and n > 1:
        n = min(n, BLAS.threads() or 1)
    if n <= 1:
        return [work(0, rows)]
    bounds = [rows * i // n for i in range(n + 1)]
    with BLAS.one_thread() if blas else contextlib.nullcontext():
        return list(_pool(n).map(work, bounds[:-1], bounds[1:]))


#: values per gathered row (the product's contraction) from which a loop of gathers and
#: products is split over threads (:func:`split_products`)
SPLIT_MIN_ROW = 256


def split_products(rows: int, row: int, work: Callable[[int, int], Any],
                   min_rows: int | None = None) -> list:
    """:func:`split_rows` for a loop of gathers and matrix products whose gathered rows hold
    ``row`` values each: split only for a long contraction. With short ones (DCGAN's 64->3
    forward gathers 48 values a row; the 3-D 64->1 decoder's 27) the threads' many short
    calls contend for the GIL, and the loop ran 1.1-1.4x slower split."""
    if row < SPLIT_MIN_ROW:
        return [work(0, rows)]
    return split_rows(rows, work, blas=True, min_rows=min_rows)
