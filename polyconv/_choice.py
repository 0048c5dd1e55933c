"""Choosing among a backend's implementations of a primitive: one chooser for every backend.

An implementation (a numpy strategy, a JAX lowering) is an :class:`Implementation` record,
declared in the module that holds its kernel. A backend lists its records in a
:class:`Chooser`, and the chooser owns everything else: forcing (:func:`implementation`,
``POLYCONV_IMPLEMENTATION``), the default pick (the backend's cost model or policy: no timing),
measuring when asked (:func:`autotune`, ``POLYCONV_AUTOTUNE``), the cache of what was chosen
(in memory, and in a file when asked), and what it logs under the ``polyconv`` logger.

The default costs nothing at a first call, as PyTorch's ``cudnn.benchmark`` is off by default:
measuring runs only when a user turns it on, once per plan (concurrent first calls of one plan
wait for one measurement), with a one-line notice in the log.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import _cache_file
from ._optable import Primitive
from ._plan import ConvPlan

__all__ = ["Chooser", "Implementation", "autotune", "chosen", "implementation"]

log = logging.getLogger("polyconv")

FORCE_ENV = "POLYCONV_IMPLEMENTATION"
AUTOTUNE_ENV = "POLYCONV_AUTOTUNE"


PRIMITIVES: tuple[Primitive, ...] = ("forward", "backward_data", "backward_weights")
#: default picks remembered per chooser (plans a process sees; the memo starts over past it)
DEFAULTS_KEPT = 4096


def _always(plan: ConvPlan) -> bool:
    return True


@dataclass(frozen=True)
class Implementation:
    """One way a backend computes one primitive.

    Attributes
    ----------
    name : str
        Its name in the glossary of implementations (docs/architecture.md), unique per
        backend and primitive; the name forcing takes.
    primitive : {"forward", "backward_data", "backward_weights"}
    run : callable
        The kernel, in the backend's own calling convention.
    applies : callable, optional
        ``applies(plan) -> bool``: whether it can compute ``plan`` (default: every plan).
    exact_on_nonfinite : bool
        Whether its sums hold only the definition's terms, so that a NaN or an infinity
        reaches exactly the outputs that read it (docs/numerics.md#nan-and-inf).
    cost : callable, optional
        ``cost(plan) -> seconds``: its estimated time, priced from the helpers its kernel
        uses; the default pick is the cheapest priced implementation unless the backend
        gives a policy.
    """

    name: str
    primitive: Primitive
    run: Callable[..., Any]
    applies: Callable[[ConvPlan], bool] = _always
    exact_on_nonfinite: bool = True
    cost: Callable[[ConvPlan], float] | None = None


# --------------------------------------------------------------------------------------------
# forcing: one API and one environment grammar for every backend
# --------------------------------------------------------------------------------------------

#: one forcing: ``(backend or None, primitive or None, name)``
Forcing = tuple[str | None, str | None, str]

_FORCED: contextvars.ContextVar[tuple[Forcing, ...] | None] = contextvars.ContextVar(
    "polyconv_implementation", default=None)
_CHOOSERS: dict[str, Chooser] = {}


def _parse(where: str, text: str) -> tuple[Forcing, ...]:
    """``[backend:][primitive=]name`` items separated by commas."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        backend, _, rest = item.rpartition(":")
        primitive, _, name = rest.rpartition("=")
        out.append((backend.strip() or None, primitive.strip() or None, name.strip()))
    _check(where, out)
    return tuple(out)


def _known_names(backend: str | None, primitive: str | None) -> set[str]:
    choosers = [_CHOOSERS[backend]] if backend in _CHOOSERS else list(_CHOOSERS.values())
    return {impl.name for c in choosers for impl in c.implementations
            if primitive in (None, impl.primitive)}


def _glossary() -> str:
    return "; ".join(
        f"{b} {p}: {', '.join(c.names(p))}"
        for b, c in sorted(_CHOOSERS.items()) for p in PRIMITIVES if c.names(p))


def _check(where: str, forced: Sequence[Forcing]) -> None:
    """Unknown backends, primitives or names raise ``ValueError`` naming ``where``. A named
    backend is loaded to learn its names; a name no loaded backend has loads the others."""
    from ._backends import available_backends, get_backend, registered_backends

    for backend, primitive, name in forced:
        text = ":".join(filter(None, (backend, "=".join(filter(None, (primitive, name))))))
        if primitive is not None and primitive not in PRIMITIVES:
            msg = (f"{where}: unknown primitive {primitive!r} in {text!r}; the primitives are "
                   f"{', '.join(PRIMITIVES)}")
            raise ValueError(msg)
        if backend is not None and backend not in _CHOOSERS:
            if backend not in registered_backends():
                msg = (f"{where}: unknown backend {backend!r} in {text!r}; the backends are "
                       f"{', '.join(registered_backends())}")
                raise ValueError(msg)
            get_backend(backend)        # its chooser registers itself on import
        if backend is None and name not in _known_names(None, primitive):
            for other in available_backends():
                get_backend(other)
        if name not in _known_names(backend, primitive):
            msg = (f"{where}: no implementation {text!r}; the implementations are "
                   f"{_glossary() or 'those of the backends once loaded'}")
            raise ValueError(msg)


@contextlib.contextmanager
def implementation(spec: str | None = None, **per_primitive: str) -> Iterator[None]:
    """Force implementations by name inside a ``with`` block (this thread or task only).

    ``spec`` is what ``POLYCONV_IMPLEMENTATION`` holds, comma-separated items of the form
    ``[backend:][primitive=]name``: ``"matmul_overlap_add"`` forces it on every backend and
    primitive that has it, ``"jax:backward_data=phases_matmul"`` one backend's one primitive.
    Keywords are ``primitive=name`` items. The block's forcing replaces the environment's and
    adds to an enclosing block's. A forced implementation that cannot compute a plan leaves
    that plan to the default pick (the log says so). Unknown names raise ``ValueError``; the
    names are in the glossary of docs/architecture.md. The setting is read when a JAX op is
    traced: a function jitted before keeps its implementation.

    Examples
    --------
    >>> import numpy as np, polyconv
    >>> x, w = np.ones((1, 4, 4, 8), np.float32), np.ones((3, 3, 3, 8), np.float32)
    >>> with polyconv.implementation("numpy:backward_data=matmul_overlap_add"):
    ...     y = polyconv.conv_transpose(x, w, strides=2)
    >>> y.shape
    (1, 9, 9, 3)
    """
    items = _parse("implementation", spec or "")
    items += _parse("implementation", ",".join(f"{p}={n}" for p, n in per_primitive.items()))
    token = _FORCED.set((*(_FORCED.get() or ()), *items))
    try:
        yield
    finally:
        _FORCED.reset(token)


def _reader(name: str) -> Callable[[], str]:
    """A function reading environment variable ``name`` (``""`` when unset) on each call,
    as ``os.environ.get`` does: from the mapping ``os.environ`` keeps its encoded values in
    where it has one (CPython's), 0.05 us a read against 0.4-0.8 through ``os.environ``'s
    key encoding, on every call of every op."""
    environ = os.environ
    data = getattr(environ, "_data", None)
    encode, decode = (getattr(environ, n, None) for n in ("encodekey", "decodevalue"))
    if not isinstance(data, dict) or encode is None or decode is None:
        return lambda: environ.get(name, "")    # pragma: no cover - not CPython's os
    key = encode(name)

    def read() -> str:
        value = data.get(key)
        return "" if value is None else decode(value)

    return read


_PARSED: dict[str, tuple[Forcing, ...]] = {}
_FORCE_TEXT = _reader(FORCE_ENV)
_AUTOTUNE_TEXT = _reader(AUTOTUNE_ENV)


def _forced() -> tuple[Forcing, ...]:
    context = _FORCED.get()
    if context is not None:
        return context
    text = _FORCE_TEXT()                        # one read: another thread may change it
    parsed = _PARSED.get(text)
    if parsed is None:
        parsed = _PARSED[text] = _parse(FORCE_ENV, text)
    return parsed


# --------------------------------------------------------------------------------------------
# measuring: off by default, one switch for every backend
# --------------------------------------------------------------------------------------------

_AUTOTUNE: contextvars.ContextVar[bool | None] = contextvars.ContextVar(
    "polyconv_autotune", default=None)


def _on(text: str) -> bool:
    return text.strip().lower() in ("1", "on", "true", "yes")


@contextlib.contextmanager
def autotune(enabled: bool = True) -> Iterator[None]:
    """Measure the candidate implementations of each new plan inside a ``with`` block (this
    thread or task only); overrides ``POLYCONV_AUTOTUNE`` (off unless ``1``).

    Off by default: a plan's first call then costs what any call costs, and the backend's
    cost model or policy picks. On, each plan's first call (a JAX op's first trace) times its
    candidates once and keeps the fastest for the process (and in the file
    ``POLYCONV_AUTOTUNE_CACHE`` names, when set); the ``polyconv`` logger says when it
    measures and what it chose.

    Examples
    --------
    >>> import numpy as np, polyconv
    >>> x, w = np.ones((1, 8, 8, 8), np.float32), np.ones((3, 3, 8, 8), np.float32)
    >>> with polyconv.autotune():
    ...     y = polyconv.convolution(x, w, weights_format="XIO")
    >>> y.shape
    (1, 6, 6, 8)
    """
    token = _AUTOTUNE.set(bool(enabled))
    try:
        yield
    finally:
        _AUTOTUNE.reset(token)


def autotune_enabled() -> bool:
    value = _AUTOTUNE.get()
    return _on(_AUTOTUNE_TEXT()) if value is None else value


def settings() -> tuple:
    """The choice settings in force, hashable: part of a traced primitive's cache key (a
    change of setting retraces instead of reusing another setting's choice)."""
    return _forced(), autotune_enabled()


# --------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------

def time_candidates(calls: Mapping[str, Callable[[], float]], rounds: int = 0,
                    drop_factor: float = math.inf) -> dict[str, float]:
    """Seconds per call of each candidate: ``calls[name]()`` runs it once and returns the
    seconds it took (``inf`` if it cannot run; an exception counts as that).

    Each candidate is called once; one whose call took ``drop_factor`` times the best is not
    called again. The others are called in ``rounds`` more interleaved rounds (alternating
    the order), and each one's fastest call is its estimate: on a shared machine other work
    only ever adds time, so the minimum is the steadiest statistic for ranking.
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


# --------------------------------------------------------------------------------------------
# the chooser
# --------------------------------------------------------------------------------------------

@dataclass
class Measurement:
    """What a backend gives the chooser to measure one plan: which candidates, and how to time
    them (``time(names) -> {name: seconds}``). With ``cached_only`` nothing is timed, and only
    a choice measured before (this process, or the cache file) replaces the default pick:
    for the processes of a multi-process run, which must all compile one program."""

    names: Sequence[str]
    time: Callable[[Sequence[str]], Mapping[str, float]]
    cached_only: bool = False


class Chooser:
    """The one place a backend's implementation of a primitive is chosen for a plan.

    Parameters
    ----------
    backend : str
        The backend's name (forcing's ``backend:`` prefix, the cache key, the log).
    implementations : sequence of Implementation
        Every implementation, each primitive's plain one first (the one a hand-written
        call of the backend's library would be).
    policy : callable, optional
        ``policy(primitive, plan, names) -> name``: the default pick among the applicable
        ``names``; by default the cheapest by the records' ``cost``, else the first.
    ties : sequence of (name or None, float)
        When measuring, a candidate kept if within ``1 + tie`` of the fastest, in order;
        ``None`` stands for the default pick.
    context : callable, optional
        ``context() -> str``: the device kind and library versions a measurement holds for
        (part of the cache key).
    answering_for : callable, optional
        ``answering_for(platform)``: a context manager under which the records'
        ``applies`` and the policy answer as on ``platform`` (``"cpu"``, ``"gpu"``...), for
        a backend whose rules depend on the device; without it they are the same everywhere.
    """

    def __init__(self, backend: str, implementations: Sequence[Implementation], *,
                 policy: Callable[[str, ConvPlan, Sequence[str]], str] | None = None,
                 ties: Sequence[tuple[str | None, float]] = ((None, 0.0),),
                 context: Callable[[], str] = lambda: "",
                 answering_for: Callable[[str], contextlib.AbstractContextManager] | None = None):
        self.backend = backend
        self.implementations = tuple(implementations)
        self._by_name = {(i.primitive, i.name): i for i in self.implementations}
        if len(self._by_name) != len(self.implementations):
            msg = f"{backend}: two implementations of one primitive share a name"
            raise ValueError(msg)
        self._policy = policy
        self.ties = tuple(ties)
        self.context = context
        self._answering_for = answering_for
        self._lock = threading.Lock()
        self._measuring: dict[str, threading.Lock] = {}
        self._chosen: dict[str, str] = {}
        self._times: dict[str, dict[str, float]] = {}
        self._loaded: set[str] = set()
        self._defaults: dict[tuple[str, ConvPlan, str | None], tuple[tuple[str, ...], str]] = {}
        _CHOOSERS[backend] = self

    # --- the records -----------------------------------------------------------------------
    def names(self, primitive: str) -> tuple[str, ...]:
        return tuple(i.name for i in self.implementations if i.primitive == primitive)

    def get(self, primitive: str, name: str) -> Implementation:
        return self._by_name[(primitive, name)]

    def applicable(self, primitive: str, plan: ConvPlan) -> tuple[str, ...]:
        return tuple(i.name for i in self.implementations
                     if i.primitive == primitive and i.applies(plan))

    def costs(self, primitive: str, plan: ConvPlan,
              names: Sequence[str] | None = None) -> dict[str, float]:
        """The priced estimate, in seconds, of each of ``names`` (default: the applicable
        implementations) that has a cost."""
        names = self.applicable(primitive, plan) if names is None else names
        return {n: c(plan) for n in names if (c := self.get(primitive, n).cost) is not None}

    def default(self, primitive: str, plan: ConvPlan,
                names: Sequence[str] | None = None, platform: str | None = None) -> str:
        """The pick without measuring: the backend's policy, else the cheapest priced; with
        ``platform``, the pick on that platform (the same unless the backend's rules depend
        on the device: ``answering_for``)."""
        if platform is not None and self._answering_for is not None:
            with self._answering_for(platform):
                return self.default(primitive, plan, names)
        names = self.applicable(primitive, plan) if names is None else tuple(names)
        if self._policy is not None:
            return self._policy(primitive, plan, names)
        priced = self.costs(primitive, plan, names)
        return min(priced, key=priced.__getitem__) if priced else names[0]

    def _default_of(self, primitive: str, plan: ConvPlan) -> tuple[tuple[str, ...], str]:
        """``(applicable names, default pick)``, remembered per plan: a repeated call of a
        layer pays a dictionary lookup, not its rules and prices again."""
        memo_key = (primitive, plan, plan.dtype)
        known = self._defaults.get(memo_key)
        if known is None:
            names = self.applicable(primitive, plan)
            known = names, self.default(primitive, plan, names)
            if len(self._defaults) >= DEFAULTS_KEPT:
                self._defaults.clear()
            self._defaults[memo_key] = known
        return known

    def forced(self, primitive: str) -> str | None:
        """The name forced for this backend's ``primitive``, the last matching item winning."""
        name = None
        for backend, prim, forced in _forced():
            if (backend in (None, self.backend) and prim in (None, primitive)
                    and (primitive, forced) in self._by_name):
                name = forced
        return name

    # --- the choice ------------------------------------------------------------------------
    def choose(self, primitive: str, plan: ConvPlan, *, key: str = "",
               measure: Callable[[str], Measurement | None] | None = None) -> str:
        """The implementation of ``primitive`` for ``plan``: the forced one where it applies,
        else (autotuning on, and ``measure(default)`` giving a :class:`Measurement`) the
        fastest measured, else the default pick. ``key`` is the part of the choice's key
        the plan does not give (precision, ...)."""
        forced = self.forced(primitive)
        if forced is not None:
            if self.get(primitive, forced).applies(plan):
                self._log(primitive, plan, forced, "forced")
                return forced
            self._log(primitive, plan, None, f"forced {forced!r} does not apply")
        names, default = self._default_of(primitive, plan)
        if len(names) > 1 and measure is not None and autotune_enabled():
            job = measure(default)
            if job is not None and len(job.names) > 1:
                return self._measured(primitive, plan, key, default, job)
        self._log(primitive, plan, default, "default")
        return default

    def _key(self, primitive: str, plan: ConvPlan, key: str) -> str:
        # a gradient computes an adjoint primitive on its op's plan: one key with the op
        # that computes that primitive directly
        if plan.primitive != primitive:
            plan = plan.with_(primitive=primitive)
        return "|".join(filter(None, (self.backend, self.context(), primitive,
                                      plan.key, key)))

    def _measured(self, primitive: str, plan: ConvPlan, key: str, default: str,
                  job: Measurement) -> str:
        full = self._key(primitive, plan, key)
        with self._lock:
            gate = self._measuring.setdefault(full, threading.Lock())
        with gate:          # one measurement per plan: concurrent first calls wait for it
            known = self._known(full, job.names)
            if known is not None:
                self._log(primitive, plan, known, "measured before")
                return known
            if job.cached_only:
                self._log(primitive, plan, default, "default (not measured before; not "
                          "measuring here)")
                return default
            log.info("polyconv: measuring %d %s implementations of %s for %s (once per "
                     "plan; polyconv.autotune(False) or POLYCONV_AUTOTUNE=0 turns it off)",
                     len(job.names), self.backend, primitive, _describe(plan))
            times = dict(job.time(job.names))
            keep = [(default if name is None else name, tie) for name, tie in self.ties]
            choice = pick(times, keep)
            with self._lock:
                self._chosen[full] = choice
                self._times[full] = times
            path = _cache_file.path()
            if path is not None:
                _cache_file.write(path, {full: choice})
        self._log(primitive, plan, choice, "measured "
                  + ", ".join(f"{n} {t * 1e3:.3g} ms" for n, t in times.items()))
        return choice

    def _known(self, full: str, names: Sequence[str]) -> str | None:
        path = _cache_file.path()
        with self._lock:
            if path is not None and str(path) not in self._loaded:
                self._loaded.add(str(path))
                self._chosen.update({k: v for k, v in _cache_file.read(path).items()
                                     if k.startswith(self.backend + "|")})
            known = self._chosen.get(full)
        return known if known in names else None

    def cached(self, primitive: str, plan: ConvPlan, names: Sequence[str],
               key: str = "") -> str | None:
        """A choice measured before (this process, or the cache file), without measuring."""
        return self._known(self._key(primitive, plan, key), names)

    def measured(self) -> dict[str, dict[str, float]]:
        """Each measurement of this process: seconds per call of every candidate."""
        with self._lock:
            return {k: dict(v) for k, v in self._times.items()}

    def chosen(self) -> dict[str, str]:
        """The choices measured so far (and read from the cache file), by key."""
        with self._lock:
            return dict(self._chosen)

    def forget(self) -> None:
        """Drop what was measured or read from the cache file (tests: a fresh process)."""
        with self._lock:
            self._chosen.clear()
            self._times.clear()
            self._loaded.clear()
            self._measuring.clear()
            self._defaults.clear()

    def _log(self, primitive: str, plan: ConvPlan, name: str | None, why: str) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("polyconv: %s %s %s -> %s (%s)", self.backend, primitive,
                      _describe(plan), name or "the default pick", why)


def _describe(plan: ConvPlan) -> str:
    return (f"a={plan.a_shape} b={plan.b_shape} kernel={plan.kernel} strides={plan.strides} "
            f"groups={plan.groups} dtype={plan.dtype}")


def chosen() -> dict[str, str]:
    """Every backend's measured choices so far, by key (``backend|...|primitive|geometry``)."""
    out: dict[str, str] = {}
    for c in _CHOOSERS.values():
        out.update(c.chosen())
    return out

