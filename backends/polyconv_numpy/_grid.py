"""The phase grid of :mod:`._fast`: the zero-padded large tensor split into its phases and laid,
with the small tensor, on one grid of rows where every kernel tap is a fixed row offset."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from polyconv._geometry import ConvPlan
from polyconv._phases import phases

from ._common import add_bias, channels_last_view, copy_channels_first, moveaxis, row_strides


class Grid:
    """Phase-grid geometry: grid sizes, and each tap's phase and row offset.

    The phase numbers (each tap's phase and shift, each phase's in-range cells) are those of
    :mod:`polyconv._phases`; the grid adds the flattening: ``P = max(cells, B + max shift)``
    cells per axis, so that every tap's window of every row lies on the grid.
    """

    def __init__(self, plan: ConvPlan):
        self.plan = plan
        self.ph = ph = phases(plan)
        self.p = tuple(max(ax.cells, ax.small + ax.max_shift) for ax in ph.axes)
        self.rows = plan.batch * math.prod(self.p)
        strides = row_strides(self.p)
        #: (phase, row offset) per tap, taps in kernel row-major order
        self.taps: list[tuple[tuple[int, ...], int]] = [
            (tap.phase, sum(q * st for q, st in zip(tap.shift, strides)))
            for tap in ph.taps]
        self.ks = [tap.k for tap in ph.taps]     #: each tap's kernel index
        self.margin = max(off for _, off in self.taps)
        #: the phases some tap reaches, each with its taps' indices
        self.phases: dict[tuple[int, ...], list[int]] = {r: list(ts) for r, ts in ph.by_phase}
        #: the taps of the phase with the fewest. A loop over phases splits every phase over
        #: threads or none, by this one: a phase left to BLAS's own threads leaves its workers
        #: spinning into the next phase's threads (a 3x3 stride-2 layer's four phases gather
        #: 1-4 taps: with only the 4-tap phase split, 1.55x slower than on one thread; its
        #: grouped version 1.12x)
        self.fewest_taps = min(len(ts) for _, ts in ph.by_phase)

    def _window(self, phase: tuple[int, ...]):
        """``(grid index, large-tensor index)`` of a phase's in-range cells, or ``None``."""
        win = self.ph.phase_window(phase, self.p)
        if win is None:
            return None
        full = slice(None)
        return (full, *win[0], full), (full, *win[1], full)

    def split(self, a: Any, acc: np.dtype) -> dict[tuple[int, ...], np.ndarray]:
        """Phases of the padded large tensor: ``[rows + margin, Ca]`` each (zero tail)."""
        return {phase: self.phase_rows(a, phase, acc) for phase in self.phases}

    def phase_rows(self, a: Any, phase: tuple[int, ...], acc: np.dtype) -> np.ndarray:
        """One phase of the padded large tensor: ``[rows + margin, Ca]`` (zero tail)."""
        a_cl = channels_last_view(a, self.plan)
        rows = np.zeros((self.rows + self.margin, a_cl.shape[-1]), dtype=acc)
        win = self._window(phase)
        if win is not None:
            grid = rows[: self.rows].reshape(self.plan.batch, *self.p, -1)
            grid[win[0]] = a_cl[win[1]]
        return rows

    def phase_rows_channels_first(self, a: Any, phase: tuple[int, ...],
                                  acc: np.dtype) -> np.ndarray:
        """:meth:`phase_rows`, transposed: ``[Ca, rows + margin]``."""
        a_cl = channels_last_view(a, self.plan)
        rows = np.zeros((a_cl.shape[-1], self.rows + self.margin), dtype=acc)
        win = self.ph.phase_window(phase, self.p)
        if win is not None:
            grid = rows[:, : self.rows].reshape(-1, self.plan.batch, *self.p)
            copy_channels_first(grid[(slice(None), slice(None), *win[0])],
                                a_cl[(slice(None), *win[1])])
        return rows

    def output(self, channels: int, dtype: np.dtype, bias: Any) -> tuple[np.ndarray, np.ndarray]:
        """The large tensor in the user's layout and dtype, and its channels-last view.

        Every cell belongs to one phase and is written once by :meth:`put`; only when some
        phase has no tap are the cells filled first, with the bias (or zeros).
        """
        plan = self.plan
        a_cl = (plan.batch, *plan.a_spatial, channels)
        if plan.channels_last:
            out = np.empty(a_cl, dtype=dtype)
            out_cl = out
        else:
            out = np.empty((plan.batch, channels, *plan.a_spatial), dtype=dtype)
            out_cl = moveaxis(out, 1, -1)
        if len(self.phases) < math.prod(plan.strides):
            out_cl[...] = 0 if bias is None else np.asarray(bias).astype(plan.acc_dtype)
        return out, out_cl

    def put(self, out_cl: np.ndarray, phase: tuple[int, ...], rows: np.ndarray, bias: Any,
            channels_first: bool = False) -> None:
        """Write one phase's rows (``[rows, C]``, or ``[C, rows]``), plus the bias, into the
        output: the one rounding to the output dtype."""
        plan, channels = self.plan, out_cl.shape[-1]
        if channels_first:
            grid = moveaxis(rows.reshape(channels, plan.batch, *self.p), 0, -1)
        else:
            grid = rows[: self.rows].reshape(plan.batch, *self.p, channels)
        add_bias(grid, bias)
        win = self._window(phase)
        if win is not None:
            out_cl[win[1]] = grid[win[0]]

    def embed(self, b: Any, lead: int, acc: np.dtype) -> np.ndarray:
        """The small tensor on the grid after ``lead`` zero rows: ``[lead + rows, Cb]``."""
        b_cl = channels_last_view(b, self.plan)
        rows = np.zeros((lead + self.rows, b_cl.shape[-1]), dtype=acc)
        grid = rows[lead:].reshape(self.plan.batch, *self.p, -1)
        grid[self.small_index] = b_cl
        return rows

    def embed_channels_first(self, b: Any, lead: int, acc: np.dtype) -> np.ndarray:
        """:meth:`embed`, transposed: ``[Cb, lead + rows]``."""
        b_cl = channels_last_view(b, self.plan)
        rows = np.zeros((b_cl.shape[-1], lead + self.rows), dtype=acc)
        grid = rows[:, lead:].reshape(-1, self.plan.batch, *self.p)
        grid[(slice(None), *self.small_index[:-1])] = moveaxis(b_cl, -1, 0)
        return rows

    def crop(self, b_rows: np.ndarray) -> np.ndarray:
        """The ``[N, B.., Cb]`` part of small-tensor rows on the grid."""
        return b_rows.reshape(self.plan.batch, *self.p, -1)[self.small_index]

    @property
    def small_index(self):
        return (slice(None), *(slice(0, b) for b in self.plan.b_spatial), slice(None))
