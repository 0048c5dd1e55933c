"""The shared test matrix's fixtures: one ``target`` per backend and array library.

A *target* is a backend plus the array library its inputs come from. Every test that takes the
``target`` fixture runs on each of them. A target whose packages are missing is a visible skip;
a target named in ``POLYCONV_TEST_BACKENDS`` (comma-separated target names) that cannot run is
an error, so CI cannot silently test nothing. A new backend joins the matrix by adding a
``Target`` to ``TARGETS``.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from oracle import numpy_dtype

import polyconv

# Measuring is off by default on every backend: the tests take the deterministic default
# picks (polyconv.autotune turns it on: tests/test_numpy_measure.py, tests/test_jax_choice.py).

ALL_DTYPES = ("float32", "float16", "bfloat16", "float64")


@dataclass(frozen=True)
class Target:
    """A backend fed with arrays of one library."""

    name: str                   # target name, as in POLYCONV_TEST_BACKENDS
    backend: str                # polyconv backend name
    library: str                # module that must be importable for the arrays
    dtypes: tuple[str, ...] = ALL_DTYPES
    _setup: Callable[[], None] | None = field(default=None, compare=False)
    # the devices a test may put this library's arrays on (None: the default)
    devices: Callable[[Any], list] = field(default=lambda xp: [None], compare=False)
    # eager JAX compiles every call once per shape: smoke tests run fewer dtypes there
    expensive: bool = False
    # where the arrays go when a test names no device (None: the library's default)
    default_device: str | None = None

    @property
    def array_library(self) -> str:
        """Top-level module of the arrays: ``numpy``, ``jax``, ``torch``, ``array_api_strict``."""
        return self.library.split(".", 1)[0]

    @property
    def dedicated(self) -> bool:
        """Whether the arrays' library has a backend of its own (calls without ``backend=``
        go there, not to the generic array-API backend)."""
        return self.array_library in ("numpy", "jax", "torch")

    @property
    def smoke_dtypes(self) -> tuple[str, ...]:
        return ("float64", "bfloat16") if self.expensive else self.dtypes

    def available(self) -> str | None:
        """``None`` when the target can run, else the reason it cannot."""
        if self.backend not in polyconv.available_backends():
            return f"polyconv backend {self.backend!r} is not installed"
        if importlib.util.find_spec(self.library) is None:
            return f"array library {self.library!r} is not installed"
        if self.default_device == "cuda" and not _cuda_available(self.array_library):
            return f"{self.array_library} sees no CUDA device"
        return None

    @property
    def xp(self):
        return importlib.import_module(self.library)

    def asarray(self, x: np.ndarray, device: Any = None) -> Any:
        """A numpy array as an array of this target's library (same dtype), on ``device``
        (the target's default when ``None``)."""
        device = device or self.default_device
        if self.library == "numpy":
            return np.array(x, copy=True)
        if self.library == "jax.numpy":
            import jax.numpy as jnp

            return jnp.asarray(x)
        if self.library == "torch":
            import torch

            if x.dtype == numpy_dtype("bfloat16"):
                t = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
            else:
                t = torch.from_numpy(np.array(x, copy=True))
            return t if device is None else t.to(device)
        if self.library == "cupy":
            return self.xp.asarray(x)                      # on the current CUDA device
        return self.xp.asarray(x, device=device)

    def to_numpy(self, y: Any) -> np.ndarray:
        """A result of this target as a float64 numpy array."""
        if self.library == "torch":
            return y.detach().to(dtype=__import__("torch").float64).cpu().numpy()
        if self.library == "array_api_strict":
            return np.asarray(y._array, dtype=np.float64)  # no __array__ by design
        if self.library == "cupy":
            return y.get().astype(np.float64)              # no implicit copy to the host
        return np.asarray(y).astype(np.float64)

    def dtype_of(self, y: Any) -> str:
        return str(y.dtype).rsplit(".", 1)[-1]

    def call(self, fn: Callable[..., Any], *arrays, **attrs) -> Any:
        """``fn`` on this target: numpy inputs are converted, the result comes back as is."""
        converted = [None if a is None else self.asarray(a) for a in arrays]
        return fn(*converted, backend=self.backend, **attrs)


def _strict_devices(xp):
    """Every array-api-strict device but ``no_x64`` (no 64-bit dtypes at all); its
    ``no_float64`` device checks that float32 inputs never touch float64."""
    return [d for d in xp.__array_namespace_info__().devices() if "x64" not in str(d)]


TARGETS: tuple[Target, ...] = (
    Target("numpy", "numpy", "numpy"),
    Target("jax", "jax", "jax.numpy"),
    Target("array_api-strict", "array_api", "array_api_strict", ("float32", "float64"),
           devices=_strict_devices),
    Target("array_api-numpy", "array_api", "numpy"),
    Target("array_api-jax", "array_api", "jax.numpy", expensive=True),
    Target("array_api-torch", "array_api", "torch", devices=lambda xp: ["cpu", "meta"]),
    Target("torch", "torch", "torch"),
)

#: targets on a CUDA GPU: selected only where ``POLYCONV_TEST_BACKENDS`` names them (a GPU
#: machine; CI has none), so a run without a GPU shows no skip for each of their tests
GPU_TARGETS: tuple[Target, ...] = (
    Target("torch-cuda", "torch", "torch", default_device="cuda"),
    Target("array_api-cupy", "array_api", "cupy", ("float32", "float16", "float64"),
           default_device="cuda"),
)


#: names of test groups that own their modules (``only_with_target``) without being a target
#: of the matrix: ``frameworks`` runs the tests against other frameworks' runtimes (ONNX,
#: OpenVINO, Keras, Flax...: tests/test_weights.py, tests/test_dialect_*.py), in the nox
#: session of that name
SESSION_GROUPS = ("frameworks",)


def _cuda_available(library: str) -> bool:
    try:
        if library == "torch":
            return importlib.import_module("torch").cuda.is_available()
        return importlib.import_module(library).cuda.runtime.getDeviceCount() > 0
    except Exception:  # no driver, no device
        return False


def _requested() -> set[str]:
    raw = os.environ.get("POLYCONV_TEST_BACKENDS", "")
    return {t.strip() for t in raw.split(",") if t.strip()}


def pytest_configure(config):
    requested = _requested()
    known = {t.name for t in TARGETS + GPU_TARGETS} | set(SESSION_GROUPS)
    unknown = requested - known
    if unknown:
        msg = (f"POLYCONV_TEST_BACKENDS names unknown targets {sorted(unknown)}; "
               f"known: {sorted(known)}")
        raise pytest.UsageError(msg)
    for target in TARGETS + GPU_TARGETS:
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
        if name in SESSION_GROUPS:
            why = (f"tests against other frameworks' runtimes run where POLYCONV_TEST_BACKENDS "
                   f"names {name!r} (nox -s {name})")
        else:
            why = (f"tests of the {name} backend's own features run where "
                   f"POLYCONV_TEST_BACKENDS names {name!r} (nox -s \"tests({name})\")")
        pytest.skip(why, allow_module_level=True)


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
    return [t for t in TARGETS + GPU_TARGETS if t.name in requested]


def backend_targets(backend: str) -> list:
    """The selected targets of one backend, for a module of that backend's own tests; where
    the run selects none, one skipped parameter says which sessions run them (rather than
    pytest's "empty parameter set")."""
    chosen = [t for t in _selected() if t.backend == backend]
    if chosen:
        return chosen
    names = ", ".join(t.name for t in TARGETS if t.backend == backend)
    raw = os.environ.get("POLYCONV_TEST_BACKENDS", "")
    reason = (f"POLYCONV_TEST_BACKENDS={raw!r} names no target of the {backend} backend "
              f"({names}); the sessions that select them run these tests")
    return [pytest.param(None, marks=pytest.mark.skip(reason=reason), id=f"no-{backend}")]


@contextlib.contextmanager
def use_target(t: Target) -> Iterator[Target]:
    """``t``, ready to use for one test: a missing one skips visibly; JAX runs in 64-bit
    mode, restored afterwards (a later test must not find float64 arrays by default)."""
    why = t.available()
    if why is not None:
        pytest.skip(f"target {t.name}: {why}")
    if not t.library.startswith("jax"):
        yield t
        return
    import jax

    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    try:
        yield t
    finally:
        jax.config.update("jax_enable_x64", before)


@pytest.fixture(params=_selected(), ids=lambda t: t.name)
def target(request) -> Iterator[Target]:
    """Every selected backend/array-library pair; missing ones skip visibly."""
    with use_target(request.param) as t:
        yield t


def require_dtype(target: Target, dtype: str) -> None:
    """Skip (visibly) a dtype the target's array library does not have."""
    if dtype not in target.dtypes:
        pytest.skip(f"{target.library} has no {dtype}")


@pytest.fixture(autouse=True)
def _forget_dispatch():
    """Each test starts with polyconv's dispatch cache empty: a cached call keeps the backend
    object it was specialised for, and tests swap registered backends (``_backends._LOADED``)
    under names other tests used."""
    from polyconv import _dispatch

    _dispatch._DISPATCH.clear()
