"""The shared test matrix's fixtures: one ``target`` per backend and array library.

A *target* is a backend plus the array library its inputs come from. Every test that takes the
``target`` fixture runs on each of them. A target whose packages are missing is a visible skip;
a target named in ``POLYCONV_TEST_BACKENDS`` (comma-separated target names) that cannot run is
an error, so CI cannot silently test nothing. A new backend joins the matrix by adding a
``Target`` to ``TARGETS``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from oracle import numpy_dtype

import polyconv

# The JAX backend measures lowerings on first use unless told not to: the tests take its
# deterministic default policy (tests/test_jax.py checks the measuring itself).
os.environ.setdefault("POLYCONV_JAX_AUTOTUNE", "0")

ALL_DTYPES = ("float32", "float16", "bfloat16", "float64")


@dataclass(frozen=True)
class Target:
    """A backend fed with arrays of one library."""

    name: str                   # target name, as in POLYCONV_TEST_BACKENDS
    backend: str                # polyconv backend name
    library: str                # module that must be importable for the arrays
    dtypes: tuple[str, ...] = ALL_DTYPES
    _setup: Callable[[], None] | None = field(default=None, compare=False)

    def available(self) -> str | None:
        """``None`` when the target can run, else the reason it cannot."""
        if self.backend not in polyconv.available_backends():
            return f"polyconv backend {self.backend!r} is not installed"
        if importlib.util.find_spec(self.library) is None:
            return f"array library {self.library!r} is not installed"
        return None

    @property
    def xp(self):
        return importlib.import_module(self.library)

    def asarray(self, x: np.ndarray) -> Any:
        """A numpy array as an array of this target's library (same dtype)."""
        if self.library == "numpy":
            return np.array(x, copy=True)
        if self.library == "jax.numpy":
            import jax.numpy as jnp

            return jnp.asarray(x)
        if self.library == "torch":
            import torch

            if x.dtype == numpy_dtype("bfloat16"):
                return torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
            return torch.from_numpy(np.array(x, copy=True))
        return self.xp.asarray(x)

    def to_numpy(self, y: Any) -> np.ndarray:
        """A result of this target as a float64 numpy array."""
        if self.library == "torch":
            return y.detach().to(dtype=__import__("torch").float64).cpu().numpy()
        if self.library == "array_api_strict":
            return np.asarray(y._array, dtype=np.float64)  # no __array__ by design
        return np.asarray(y).astype(np.float64)

    def dtype_of(self, y: Any) -> str:
        return str(y.dtype).rsplit(".", 1)[-1]

    def call(self, fn: Callable[..., Any], *arrays, **attrs) -> Any:
        """``fn`` on this target: numpy inputs are converted, the result comes back as is."""
        converted = [None if a is None else self.asarray(a) for a in arrays]
        return fn(*converted, backend=self.backend, **attrs)


TARGETS: tuple[Target, ...] = (
    Target("numpy", "numpy", "numpy"),
    Target("jax", "jax", "jax.numpy"),
    Target("array_api-strict", "array_api", "array_api_strict", ("float32", "float64")),
    Target("array_api-numpy", "array_api", "numpy"),
    Target("array_api-jax", "array_api", "jax.numpy"),
    Target("array_api-torch", "array_api", "torch", ("float32", "float16", "bfloat16",
                                                      "float64")),
    Target("torch", "torch", "torch"),
)


def _requested() -> set[str]:
    raw = os.environ.get("POLYCONV_TEST_BACKENDS", "")
    return {t.strip() for t in raw.split(",") if t.strip()}


def pytest_configure(config):
    requested = _requested()
    known = {t.name for t in TARGETS}
    unknown = requested - known
    if unknown:
        msg = (f"POLYCONV_TEST_BACKENDS names unknown targets {sorted(unknown)}; "
               f"known: {sorted(known)}")
        raise pytest.UsageError(msg)
    for target in TARGETS:
        if target.name in requested and (why := target.available()) is not None:
            msg = f"POLYCONV_TEST_BACKENDS asks for {target.name!r} but {why}"
            raise pytest.UsageError(msg)


@pytest.fixture
def jax_x64():
    """JAX in 64-bit mode for the test (for float64 comparisons), restored afterwards."""
    import jax

    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


#: test modules that belong to one backend (``only_with_target``) -> that target
_OWNED: dict[str, str] = {}


def only_with_target(name: str) -> None:
    """Skip the calling test module unless this run selects target ``name``: tests of one
    backend's own features (jit, grad, sharding, its lowerings) run once, in that backend's
    session, not again in every session that happens to have its library installed."""
    _OWNED[sys._getframe(1).f_globals["__name__"]] = name
    requested = _requested()
    if requested and name not in requested:
        pytest.skip(f"tests of the {name} backend's own features run where "
                    f"POLYCONV_TEST_BACKENDS names {name!r} (nox -s \"tests({name})\")",
                    allow_module_level=True)


#: the target whose session also runs the tests that need no backend at all
BACKEND_FREE_SESSION = "numpy"


def pytest_collection_modifyitems(config, items):
    """Each test runs in one session: a test that takes no target (the geometry, the oracle,
    the command line, packaging, the numpy backend's internals) and belongs to no backend's
    own module runs where the numpy target is selected, and is deselected elsewhere."""
    requested = _requested()
    if not requested or BACKEND_FREE_SESSION in requested:
        return
    keep, drop = [], []
    for item in items:
        owned = item.module.__name__ in _OWNED
        per_target = {"target", "lib"} & set(getattr(item, "fixturenames", ()))
        (keep if owned or per_target else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _selected() -> list[Target]:
    requested = _requested()
    if not requested:
        return list(TARGETS)
    return [t for t in TARGETS if t.name in requested]


@pytest.fixture(params=_selected(), ids=lambda t: t.name)
def target(request) -> Target:
    """Every selected backend/array-library pair; missing ones skip visibly."""
    t: Target = request.param
    why = t.available()
    if why is not None:
        pytest.skip(f"target {t.name}: {why}")
    if t.library.startswith("jax"):
        import jax

        jax.config.update("jax_enable_x64", True)
    return t


def require_dtype(target: Target, dtype: str) -> None:
    """Skip (visibly) a dtype the target's array library does not have."""
    if dtype not in target.dtypes:
        pytest.skip(f"{target.library} has no {dtype}")
