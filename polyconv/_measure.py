"""Choosing among a backend's exact implementations of a primitive by timing them.

The backends that measure (the JAX backend's lowerings, the numpy backend's strategies) share
the rule: every candidate is timed once, a candidate far slower than the best is not timed
again, the rest are timed in interleaved rounds, and each one's fastest call is its estimate
(on a shared machine other work only ever adds time, so the minimum is the steadiest
statistic for ranking, as ``timeit`` advises). The winner is the fastest, except that a
preferred candidate (the plain lowering, the cost model's pick) is kept when it is within the
noise of the measurement.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator, Mapping, Sequence

from ._backends import env_switch
from ._geometry import ConvPlan

#: the plan fields a measurement depends on (not the op's name, bias or precision request):
#: ``conv_transpose`` and ``convolution_backward_data`` share their backward_data's. Not
#: ``output_padding``, which the sizes imply: a strided Convolution whose size rule leaves
#: rows past its last product has ``output_padding`` 0 in its own plan (whose backward_data
#: its gradient computes) and those rows in ``convolution_backward_data``'s; one geometry,
#: one measurement (two had let the gradient and the backward ops pick apart by noise)
GEOMETRY = ("batch", "a_channels", "b_channels", "groups", "a_spatial", "b_spatial", "kernel",
            "strides", "dilations", "pads_begin", "pads_end", "channels_last",
            "weights_perm", "dtype")


def geometry(plan: ConvPlan) -> str:
    """The part of a measurement's key that a plan gives."""
    return ",".join(f"{f}={getattr(plan, f)}" for f in GEOMETRY)


class Switch:
    """Measuring on or off: a context manager per thread or task, else an environment
    variable (on unless set to ``0``, ``off``, ``false``, ``no``)."""

    def __init__(self, env_var: str):
        self.env_var = env_var
        self._value: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
            f"measure:{env_var}", default=None)

    def enabled(self) -> bool:
        value = self._value.get()
        return env_switch(self.env_var) if value is None else value

    @contextlib.contextmanager
    def __call__(self, enabled: bool = True) -> Iterator[None]:
        token = self._value.set(bool(enabled))
        try:
            yield
        finally:
            self._value.reset(token)


def time_candidates(calls: Mapping[str, Callable[[], float]], rounds: int = 0,
                    drop_factor: float = math.inf) -> dict[str, float]:
    """Seconds per call of each candidate: ``calls[name]()`` runs it once and returns the
    seconds it took (``inf`` if it cannot run; an exception counts as that).

    Each candidate is called once; one whose call took ``drop_factor`` times the best is not
    called again (that call stands). The others are called in ``rounds`` more interleaved
    rounds (alternating the order), and each one's fastest call is its estimate. With no
    rounds, each candidate's one call is its estimate.
    """
    def once(name: str) -> float:
        try:
            return calls[name]()
        except Exception:       # a candidate that cannot run here never wins
            return math.inf

    times = {name: [once(name)] for name in calls}
    best = min((t[0] for t in times.values()), default=math.inf)
    alive = [n for n in calls if times[n][0] <= drop_factor * best < math.inf]
    for r in range(rounds):
        for name in (alive if r % 2 else alive[::-1]):
            times[name].append(once(name))
    return {name: min(t) for name, t in times.items()}


def pick(times: Mapping[str, float], keep: Sequence[tuple[str, float]] = ()) -> str:
    """The fastest of ``times``, unless a candidate of ``keep`` (``(name, tie)`` in order of
    preference) takes at most ``1 + tie`` times the fastest's: then the first such one."""
    fastest = min(times, key=times.__getitem__)
    for name, tie in keep:
        if name in times and times[name] <= (1 + tie) * times[fastest]:
            return name
    return fastest
