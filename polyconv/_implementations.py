"""What a process can ask about a backend's implementations: which there are, which one a
call gets without measuring (on this platform or another), and what measuring found. The
benchmarks (polyconv/benchmarks) ask through these functions only."""

from __future__ import annotations

from ._choice import _CHOOSERS, PRIMITIVES, Chooser
from ._plan import ConvPlan

__all__ = ["default_implementation", "implementations", "measured"]


def measured() -> dict[str, dict[str, float]]:
    """Every backend's measurements so far: by key (as :func:`chosen`'s), the seconds per
    call each candidate took (``inf`` for one that failed or was dropped as slow).
    """
    out: dict[str, dict[str, float]] = {}
    for c in _CHOOSERS.values():
        out.update(c.measured())
    return out


def _chooser(backend: str, primitive: str) -> Chooser:
    """``backend``'s chooser (its module imported if need be), ``primitive`` checked."""
    from ._backends import get_backend, registered_backends

    if primitive not in PRIMITIVES:
        msg = (f"primitive={primitive!r} is not a primitive; the primitives are "
               f"{', '.join(PRIMITIVES)} (a plan's .primitive says which one an op computes)")
        raise ValueError(msg)
    if backend not in registered_backends():
        msg = (f"backend={backend!r} is not a registered backend; registered: "
               f"{', '.join(registered_backends())}")
        raise ValueError(msg)
    get_backend(backend)
    if backend not in _CHOOSERS:
        msg = (f"backend={backend!r} has one implementation of each primitive, nothing to "
               f"choose among; the backends that choose: {', '.join(sorted(_CHOOSERS))}")
        raise ValueError(msg)
    return _CHOOSERS[backend]


def implementations(backend: str, primitive: str,
                    plan: ConvPlan | None = None) -> tuple[str, ...]:
    """The names of ``backend``'s implementations of ``primitive``, the plain one first (the
    glossary of docs/architecture.md); with ``plan``, only those that apply to it: what
    :func:`implementation` can force there and what measuring compares.

    Parameters
    ----------
    backend : str
        A backend that chooses among implementations (``"numpy"``, ``"jax"``); imported if
        need be.
    primitive : {"forward", "backward_data", "backward_weights"}
    plan : ConvPlan, optional
        A plan of the geometry (:func:`infer_shape`'s, with ``.with_(dtype=...)`` where the
        dtype matters).

    Raises
    ------
    ValueError
        For a backend that is not registered or has nothing to choose (``"torch"``,
        ``"array_api"``), or a name that is not a primitive.

    Examples
    --------
    >>> import polyconv
    >>> plan = polyconv.infer_shape("convolution", (8, 56, 56, 64), (3, 3, 64, 64))
    >>> names = polyconv.implementations("numpy", "forward", plan)
    >>> set(names) <= set(polyconv.implementations("numpy", "forward"))
    True
    """
    chooser = _chooser(backend, primitive)
    return chooser.names(primitive) if plan is None else chooser.applicable(primitive, plan)


def default_implementation(backend: str, primitive: str, plan: ConvPlan, *,
                           platform: str | None = None) -> str:
    """The implementation ``backend`` picks for ``plan``'s ``primitive`` when none is forced
    or measured: its cost model's cheapest, or its policy's pick (what a first call runs with
    measuring off, the default).

    Parameters
    ----------
    backend, primitive, plan
        As for :func:`implementations`.
    platform : str, optional
        For a backend whose policy depends on the device (JAX: ``"cpu"``, ``"gpu"``, others
        take the plain lowering), the platform to answer for, this process's default device's
        if not given: how recorded measurements of another machine are checked against the
        policy. A cost model (numpy) is the same on every platform.

    Examples
    --------
    >>> import polyconv
    >>> plan = polyconv.infer_shape("convolution", (8, 56, 56, 64), (3, 3, 64, 64))
    >>> pick = polyconv.default_implementation("numpy", "forward", plan.with_(dtype="float32"))
    >>> pick in polyconv.implementations("numpy", "forward", plan)
    True
    """
    return _chooser(backend, primitive).default(primitive, plan, platform=platform)
