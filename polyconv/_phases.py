"""The phase decomposition of a strided canonical convolution: pure integers, one per plan.

The canonical convolution (docs/semantics.md#canonical-convolution) pairs, per spatial axis,
``b[y]`` with ``a[y*s + k*d - pb]`` for each kernel tap ``k``. Split the large axis into its
``s`` *phases*: cell ``i`` of phase ``r`` is the padded position ``i*s + r``, i.e.
``a[i*s + r - pb]`` (zero where that is out of range). Tap ``k`` then reads one phase with unit
stride::

    a[y*s + k*d - pb] = phase_r[y + q]      r = (k*d) % s  (its phase),  q = (k*d) // s  (its shift)

so every strided convolution is ``prod(s)`` stride-1 ones on the phases, each with the taps of
its phase (possibly none: then that phase of ``backward_data``'s result receives no product).
The lowerings of every backend (the numpy backend's phase grid, JAX's per-phase and sub-pixel
``backward_data``, the array-API shift-and-add) read these numbers from here instead of
deriving them again.

Everything is a tuple of ints, computed once per geometry (cached) and shared by every plan
with the same spatial geometry::

    >>> import polyconv
    >>> from polyconv._phases import phases
    >>> plan = polyconv.infer_shape("conv_transpose", (1, 4, 1), (3, 1, 1), strides=2,
    ...                             pads_begin=1, pads_end=1, output_padding=1)
    >>> ax = phases(plan).axes[0]
    >>> ax.phase, ax.shift                   # per tap k = 0, 1, 2
    ((0, 1, 0), (0, 0, 1))
    >>> ax.taps                              # per phase r = 0, 1
    ((0, 2), (1,))
    >>> ax.tap_window(0)                     # b[1:4] meets a[1:6:2] through tap 0
    Window(start=1, stop=4, first=1, step=2)
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Any

__all__ = ["AdjointPhase", "AxisPhases", "Phases", "Tap", "Window", "adjoint_phases",
           "axis_phases", "in_range", "phases"]


@dataclass(frozen=True)
class Window:
    """Indices ``i`` in ``range(start, stop)``, paired with positions ``first + (i-start)*step``
    of another axis (``first = start*step + offset``): the in-range part of an affine map."""

    start: int
    stop: int
    first: int
    step: int

    @property
    def count(self) -> int:
        return self.stop - self.start

    @property
    def index(self) -> slice:
        """The indices ``i``, as a slice."""
        return slice(self.start, self.stop)

    @property
    def positions(self) -> slice:
        """The positions they pair with, as a (strided) slice."""
        return slice(self.first, self.first + (self.count - 1) * self.step + 1, self.step)


def in_range(offset: int, step: int, count: int, size: int) -> Window | None:
    """The ``i`` in ``[0, count)`` with ``0 <= i*step + offset < size`` (``step >= 1``), or
    ``None`` when there is none.

    >>> in_range(-1, 2, 4, 6)                # i*2 - 1 in [0, 6): i = 1, 2, 3 -> 1, 3, 5
    Window(start=1, stop=4, first=1, step=2)
    """
    lo = max(0, -(offset // step))                   # smallest i with i*step + offset >= 0
    hi = min(count - 1, (size - 1 - offset) // step)  # largest with i*step + offset < size
    if hi < lo:
        return None
    return Window(lo, hi + 1, lo * step + offset, step)


@dataclass(frozen=True)
class AxisPhases:
    """One spatial axis: ``size`` (``A``), ``small`` (``B``), ``kernel``, ``stride``,
    ``dilation``, ``pad`` (``pb``), and the phase numbers derived from them.

    Attributes
    ----------
    phase, shift : tuple of int
        Per tap ``k``: its phase ``r = (k*d) % s`` and shift ``q = (k*d) // s``; ``b[y]`` meets
        ``phase_r[y + q]``.
    taps : tuple of tuple of int
        Per phase ``r`` in ``range(s)``: its taps, ascending (``()`` for a phase no tap
        reaches). Consecutive taps of a phase are ``tap_step = s / gcd(d, s)`` apart and their
        shifts ``shift_step = d / gcd(d, s)`` apart.
    max_shift : int
        The largest shift, ``((K-1)*d) // s``.
    cells : int
        Phase cells ``0 .. cells-1`` cover every position of ``a``: ``ceil((pb + A) / s)``.
    q_lo, rows, crop : int
        The tightest cover: cells ``q_lo .. q_lo+rows-1`` of every phase, interleaved, are the
        padded positions ``[q_lo*s, (q_lo+rows)*s)``, which hold ``a`` from ``crop`` on
        (``q_lo = pb // s``, ``crop = pb - q_lo*s``).
    """

    size: int
    small: int
    kernel: int
    stride: int
    dilation: int
    pad: int
    phase: tuple[int, ...]
    shift: tuple[int, ...]
    taps: tuple[tuple[int, ...], ...]
    max_shift: int
    cells: int
    q_lo: int
    rows: int
    crop: int
    tap_step: int
    shift_step: int

    @property
    def phase_shifts(self) -> tuple[tuple[int, ...], ...]:
        """Per phase ``r``: the shifts of its taps (in the order of :attr:`taps`)."""
        return tuple(tuple(self.shift[k] for k in ks) for ks in self.taps)

    @property
    def window_taps(self) -> tuple[tuple[int, ...], ...]:
        """The phases' common window, ``max_shift + 1`` rows: row ``j``, per phase ``r``, the tap
        of that phase with shift ``max_shift - j``, or ``kernel`` where it has none (a zero
        tap, for a lowering that appends one). Cell ``q`` of phase ``r`` receives row ``j``'s
        tap times ``b[q - max_shift + j]``."""
        rows = [[self.kernel] * self.stride for _ in range(self.max_shift + 1)]
        for r, (ks, ms) in enumerate(zip(self.taps, self.phase_shifts)):
            for k, m in zip(ks, ms):
                rows[self.max_shift - m][r] = k
        return tuple(map(tuple, rows))

    @property
    def window_pads(self) -> tuple[int, int]:
        """Rows of zeros before and after ``b`` (negative: rows of ``b`` cut off, which no cell
        reads) such that, for cells ``q_lo .. q_lo+rows-1``, window row ``j`` of cell ``q``
        is the padded ``b``'s row ``q - q_lo + j``: ``rows + max_shift`` rows in all."""
        lo = self.max_shift - self.q_lo
        return lo, self.rows + self.max_shift - self.small - lo

    def tap_window(self, k: int) -> Window | None:
        """``b`` indices ``y`` whose tap-``k`` partner ``a[y*s + k*d - pb]`` is in range
        (``Window.positions`` are those ``a`` indices), or ``None``."""
        return in_range(k * self.dilation - self.pad, self.stride, self.small, self.size)

    def phase_window(self, r: int, cells: int | None = None) -> Window | None:
        """Cells ``i < cells`` (default :attr:`cells`) of phase ``r`` that hold a position of
        ``a`` (``Window.positions`` are those ``a`` indices), or ``None``."""
        return in_range(r - self.pad, self.stride, self.cells if cells is None else cells,
                        self.size)


@functools.lru_cache(maxsize=1024)
def axis_phases(size: int, small: int, kernel: int, stride: int, dilation: int,
                pad: int) -> AxisPhases:
    """The :class:`AxisPhases` of one axis (cached)."""
    s, d = stride, dilation
    phase = tuple((k * d) % s for k in range(kernel))
    shift = tuple((k * d) // s for k in range(kernel))
    taps = tuple(tuple(k for k in range(kernel) if phase[k] == r) for r in range(s))
    cells = -(-(pad + size) // s)
    q_lo = pad // s
    g = math.gcd(d, s)
    return AxisPhases(size, small, kernel, s, d, pad, phase, shift, taps, max(shift), cells,
                      q_lo, cells - q_lo, pad - q_lo * s, s // g, d // g)


@dataclass(frozen=True)
class Tap:
    """One kernel tap (a multi-index ``k``): its phase and its shift per axis."""

    k: tuple[int, ...]
    phase: tuple[int, ...]
    shift: tuple[int, ...]


@dataclass(frozen=True)
class Phases:
    """All spatial axes of one plan.

    Attributes
    ----------
    axes : tuple of AxisPhases
    taps : tuple of Tap
        Every kernel tap, in row-major (C) order of the kernel: ``taps[t]`` is column ``t`` of
        ``W.reshape(Cb, Ca/G, -1)``.
    by_phase : tuple of (phase, tuple of int)
        The phases some tap reaches, in order of their first tap, each with the indices ``t``
        of its taps (ascending). A phase absent here receives no product.
    """

    axes: tuple[AxisPhases, ...]
    taps: tuple[Tap, ...]
    by_phase: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]

    @property
    def strides(self) -> tuple[int, ...]:
        return tuple(ax.stride for ax in self.axes)

    @property
    def every_phase_reached(self) -> bool:
        """Whether every one of the ``prod(s)`` phases has a tap."""
        return len(self.by_phase) == math.prod(self.strides)

    @property
    def fills_window(self) -> bool:
        """Whether every phase of every axis has a tap at each shift ``0 .. max_shift`` (k2 s2,
        k4 s2, k16 s8; not k3 s2): the phases' common window then holds only real taps, and
        the sub-pixel lowerings (one product into every phase) form exactly the products of
        the definition."""
        return all(ms == tuple(range(ax.max_shift + 1))
                   for ax in self.axes for ms in ax.phase_shifts)

    @property
    def one_tap_per_phase(self) -> bool:
        """Whether every phase has at most one tap (e.g. kernel <= stride): each position of
        ``a`` then receives at most one tap's product."""
        return all(len(ts) == 1 for _, ts in self.by_phase)

    @property
    def windows_cover(self) -> bool:
        """With :attr:`one_tap_per_phase` (the windows are then disjoint): whether the taps'
        in-range windows cover every position of ``a``."""
        cells = sum(math.prod(len(range(*s.indices(ax.size))) for s, ax in zip(pos, self.axes))
                    for _, _, pos in self.tap_windows)
        return cells == math.prod(ax.size for ax in self.axes)

    @functools.cached_property
    def tap_windows(self) -> tuple[tuple[int, tuple[slice, ...], tuple[slice, ...]], ...]:
        """``(t, b_index, a_index)`` per tap that meets the data: the spatial slices of the
        in-range window of ``b`` and of the ``a`` positions it pairs with (strided)."""
        per_axis = [[ax.tap_window(k) for k in range(ax.kernel)] for ax in self.axes]
        out = []
        for t, tap in enumerate(self.taps):
            wins = [per_axis[i][k] for i, k in enumerate(tap.k)]
            if all(w is not None for w in wins):
                out.append((t, tuple(w.index for w in wins), tuple(w.positions for w in wins)))
        return tuple(out)

    def phase_window(self, phase: tuple[int, ...], cells: tuple[int, ...] | None = None
                     ) -> tuple[tuple[slice, ...], tuple[slice, ...]] | None:
        """The spatial slices ``(cell index, a positions)`` of one phase's in-range cells among
        the first ``cells`` per axis (default: :attr:`AxisPhases.cells`), or ``None``;
        remembered (a strategy asks for it on every call)."""
        memo = self._phase_windows
        key = (phase, cells)
        if key not in memo:
            sizes = cells if cells is not None else tuple(ax.cells for ax in self.axes)
            wins = [ax.phase_window(r, c) for ax, r, c in zip(self.axes, phase, sizes)]
            memo[key] = (None if any(w is None for w in wins) else
                         (tuple(w.index for w in wins), tuple(w.positions for w in wins)))
        return memo[key]

    @functools.cached_property
    def _phase_windows(self) -> dict:
        return {}


@functools.lru_cache(maxsize=512)
def _phases(geometry: tuple[tuple[int, ...], ...]) -> Phases:
    axes = tuple(axis_phases(*g) for g in zip(*geometry))
    taps = tuple(Tap(k, tuple(ax.phase[i] for ax, i in zip(axes, k)),
                     tuple(ax.shift[i] for ax, i in zip(axes, k)))
                 for k in itertools.product(*(range(ax.kernel) for ax in axes)))
    groups: dict[tuple[int, ...], list[int]] = {}
    for t, tap in enumerate(taps):
        groups.setdefault(tap.phase, []).append(t)
    return Phases(axes, taps, tuple((r, tuple(ts)) for r, ts in groups.items()))


@functools.lru_cache(maxsize=4096)
def phases(plan: Any) -> Phases:
    """The :class:`Phases` of a :class:`~polyconv.ConvPlan` (cached per spatial geometry:
    large and small sizes, kernel, strides, dilations, pads_begin; and per plan, whose hash
    is kept: a strategy asks on every call)."""
    return _phases((plan.a_spatial, plan.b_spatial, plan.kernel, plan.strides, plan.dilations,
                    plan.pads_begin))


@dataclass(frozen=True)
class AdjointPhase:
    """One phase of ``backward_data`` as a forward convolution of ``b``.

    Attributes
    ----------
    plan : ConvPlan or None
        The stride-1 forward plan over ``b`` (its large tensor) whose output is this phase's
        in-range cells of ``a``, in order; ``None`` when no tap reaches the phase (its cells of
        ``a`` receive no product).
    taps : tuple of tuple of int
        Per axis, the kernel taps of the phase in the order of that plan's kernel (the
        phase's taps reversed: the correlation runs over ``b`` backwards).
    a_index : tuple of slice
        Per axis, the (strided) positions of ``a`` that the cells are.
    """

    plan: Any
    taps: tuple[tuple[int, ...], ...]
    a_index: tuple[slice, ...]


def adjoint_phases(plan: Any) -> tuple[AdjointPhase, ...]:
    """``backward_data`` of ``plan`` phase by phase (every phase that holds a position of
    ``a``), each as a forward convolution of ``b`` with that phase's taps.

    Cell ``q`` of phase ``r`` (the position ``q*s + r - pb`` of ``a``) receives
    ``b[q - m_j] * W[k_j]`` from the phase's taps ``k_j`` with shifts ``m_j = m_0 +
    j*shift_step``. Over the in-range cells ``q = i0 + i`` and the taps reversed
    (``j' = J-1-j``) that reads ``b[i + (i0 - m_last) + j'*shift_step]``: a stride-1
    convolution with dilation ``shift_step`` and pads ``m_last - i0`` before (either sign).
    With strides of 1 there is one phase: the convolution of ``b`` with the flipped kernel."""
    ph = phases(plan)
    out = []
    for r in itertools.product(*(range(ax.stride) for ax in ph.axes)):
        wins = [ax.phase_window(ri) for ax, ri in zip(ph.axes, r)]
        if any(w is None for w in wins):
            continue
        taps = tuple(ax.taps[ri][::-1] for ax, ri in zip(ph.axes, r))
        a_index = tuple(w.positions for w in wins)
        if not all(taps):
            out.append(AdjointPhase(None, taps, a_index))
            continue
        pads_begin, pads_end = [], []
        for ax, ks, w in zip(ph.axes, taps, wins):
            pb = ax.shift[ks[0]] - w.start              # ks[0]: the largest shift
            pads_begin.append(pb)
            pads_end.append(w.count - ax.small - pb + (len(ks) - 1) * ax.shift_step)
        sub = plan.with_(
            primitive="forward", a_channels=plan.b_channels, b_channels=plan.a_channels,
            a_spatial=plan.b_spatial, b_spatial=tuple(w.count for w in wins),
            kernel=tuple(len(ks) for ks in taps), strides=(1,) * len(taps),
            dilations=tuple(ax.shift_step for ax in ph.axes), pads_begin=tuple(pads_begin),
            pads_end=tuple(pads_end), output_padding=(0,) * len(taps))
        out.append(AdjointPhase(sub, taps, a_index))
    return tuple(out)
