"""Backend registry and dispatch.

A backend is one object with a ``name`` and the three primitives of the canonical
convolution (docs/semantics.md#canonical-convolution; see
:class:`Backend`). The registry is a static table of the built-in backends plus the entry-point
group ``polyconv.backends``; a backend module is imported only when a call needs it, so
``import polyconv`` stays light and never imports jax.

Array types are recognised from ``type(x).__module__`` without importing anything, as einops
and array-api-compat do. There is no process-global backend switch: each call picks its own.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol, runtime_checkable

from ._hints import cast_hint
from ._limits import INDEX_LIMITS, IndexLimits
from ._plan import ConvPlan

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")


@runtime_checkable
class Backend(Protocol):
    """What a backend implements: three primitives on resolved plans.

    Every array argument is in the user's layout (``plan.channels_last`` for data, the user's
    weights format, whose canonical order is ``plan.weights_perm``). Each primitive returns the
    output in the user's layout and dtype ``plan.dtype``, accumulating in ``plan.acc_dtype`` with
    one rounding at the end (bias included before that rounding). Inputs are never modified.
    A backend may also state facts about itself: see :class:`BackendHooks`.
    """

    name: str

    def forward(self, plan: ConvPlan, a: Any, w: Any, bias: Any = None) -> Any:
        """``a`` ``[N, Ca, A..]``, weights -> ``b`` ``[N, Cb, B..]`` (+ bias over Cb)."""

    def backward_data(self, plan: ConvPlan, b: Any, w: Any, bias: Any = None) -> Any:
        """``b`` ``[N, Cb, B..]``, weights -> ``a`` ``[N, Ca, A..]`` (+ bias over Ca)."""

    def backward_weights(self, plan: ConvPlan, a: Any, b: Any) -> Any:
        """``a``, ``b`` -> weights in the user's ``weights_format``."""


class BackendHooks:
    """Optional facts a backend object may state about itself (looked up with ``getattr``;
    a backend without them gets the defaults shown). With them an entry-point backend is a
    first-class citizen: inferred for its arrays, listed by ``polyconv backends``, fed its own
    arrays by :func:`polyconv.compare`.

    Attributes
    ----------
    libraries : tuple of str, default ()
        Top-level modules of the array types the backend owns (``("torch",)``): calls on such
        arrays pick it when no ``backend=`` is given. Built-in backends state this in their
        registry entry too, so that dispatch need not import them.
    concretization_errors : tuple of exception types, default ()
        What the backend's library raises when a traced value is made concrete (JAX under
        ``jax.jit``): the op then says that geometry arguments must be static.
    limits : IndexLimits, default ``IndexLimits()``
        The largest numbers the backend can index: every stride, dilation, pad and size of a
        call, each extent and tensor they imply, is checked against them before the backend
        is called (docs/semantics.md#validation). The default: int64 attributes, tensors of
        at most 2**57 bytes; torch declares 32-bit attributes.
    """

    libraries: tuple[str, ...] = ()
    concretization_errors: tuple[type[BaseException], ...] = ()
    limits: IndexLimits = INDEX_LIMITS

    def describe(self) -> dict[str, Any]:
        """``{"versions": {distribution: version}, "devices": str}`` for ``polyconv
        backends``; the versions of the registry entry's requirements are added by the core."""
        return {"versions": {}, "devices": "those of the input arrays"}

    def samples(self, dtype: str) -> Samples:
        """How :func:`polyconv.compare` gives this backend its inputs in ``dtype``."""
        return NUMPY_SAMPLES

    def specialize(self, plan: ConvPlan) -> Callable[..., Any]:
        """``plan``'s primitive as a function of its arrays alone (the primitive's arguments
        after ``plan``), with what depends on the plan alone decided once: the core asks
        for it at a call's first dispatch and calls it for every later call like it, so
        its per-call work is a small call's whole overhead."""
        return functools.partial(getattr(self, plan.primitive), plan)


@dataclass(frozen=True)
class Samples:
    """A backend's sample inputs for :func:`polyconv.compare`.

    ``label`` names the arrays in reports (``"jax.numpy"``, ``"torch cpu (oneDNN 3.7)"``);
    ``asarray`` turns a numpy array (``ml_dtypes.bfloat16`` for bfloat16) into one of them;
    the call runs inside ``context()`` (JAX's 64-bit mode, for example); ``to_numpy`` turns
    a result back into a float64 numpy array.
    """

    label: str
    asarray: Callable[[Any], Any]
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    to_numpy: Callable[[Any], Any] | None = None


def _numpy_copy(x: Any) -> Any:
    import numpy as np

    return np.array(x, copy=True)


NUMPY_SAMPLES = Samples("numpy", _numpy_copy)


def _library(x: Any) -> str:
    """Top-level module of an array's type: ``numpy``, ``jax``, ``torch``, ..."""
    mod = type(x).__module__.split(".", 1)[0]
    return "jax" if mod == "jaxlib" else mod


@dataclass(frozen=True)
class BackendEntry:
    """A registered backend: where it lives and what it needs."""

    name: str
    module: str
    requires: tuple[str, ...]
    description: str
    libraries: tuple[str, ...] = ()  # array libraries this backend is native to


_BUILTIN: dict[str, BackendEntry] = {
    "numpy": BackendEntry("numpy", "polyconv_numpy", ("numpy",),
                          "direct loops over kernel taps with numpy", ("numpy",)),
    "jax": BackendEntry("jax", "polyconv_jax", ("jax",),
                        "lowered to jax.lax.conv_general_dilated", ("jax",)),
    "array_api": BackendEntry("array_api", "polyconv_array_api", ("array_api_compat",),
                              "any array-API namespace through array-api-compat"),
    "torch": BackendEntry("torch", "polyconv_torch", ("torch",),
                          "native PyTorch convolutions (oneDNN on CPU, cuDNN on CUDA)",
                          ("torch",)),
}


@lru_cache(maxsize=1)
def _entry_points() -> dict[str, Any]:
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group="polyconv.backends")
            if ep.name not in _BUILTIN}


def _installed(entry: BackendEntry) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in (entry.module, *entry.requires))


def env_switch(name: str) -> bool:
    """An on/off environment variable of a backend: on unless set to ``0``, ``off``,
    ``false``, ``no`` or nothing."""
    return os.environ.get(name, "1").strip().lower() not in ("0", "off", "false", "no", "")


def registered_backends() -> tuple[str, ...]:
    """Names of every backend polyconv knows, installed or not."""
    return (*_BUILTIN, *_entry_points())


def available_backends() -> tuple[str, ...]:
    """Names of the backends that can run here (their packages are importable).

    Examples
    --------
    >>> import polyconv
    >>> "numpy" in polyconv.available_backends()
    True
    """
    names = [name for name, entry in _BUILTIN.items() if _installed(entry)]
    names.extend(_entry_points())
    return tuple(names)


_LOADED: dict[str, Backend] = {}


def get_backend(name: str, op: str = "polyconv") -> Backend:
    """The backend object called ``name`` (imported on first use)."""
    if isinstance(name, str) and name in _LOADED:
        return _LOADED[name]
    if not isinstance(name, str):
        known = ", ".join(map(repr, registered_backends()))
        msg = (f"{op}: backend must be a string, one of {known} or None; "
               f"got backend={name!r} ({type(name).__name__})")
        raise TypeError(msg)
    entry = _BUILTIN.get(name)
    if entry is not None:
        missing = [m for m in entry.requires if importlib.util.find_spec(m) is None]
        if missing or importlib.util.find_spec(entry.module) is None:
            extra = name.replace("_", "-")
            msg = (f"{op}: polyconv backend {name!r} is not installed here (missing: "
                   f"{', '.join(missing) or entry.module}); install it with "
                   f"`pip install 'polyconv-ops[{extra}]'` (the distribution is "
                   "polyconv-ops; the package index's 'polyconv' is another project)")
            raise ImportError(msg)
        backend = importlib.import_module(entry.module).BACKEND
    elif name in _entry_points():
        backend = _entry_points()[name].load()
    else:
        msg = (f"{op}: unknown backend {name!r}; known backends are "
               f"{', '.join(map(repr, registered_backends()))}")
        raise ValueError(msg)
    _LOADED[name] = backend
    return backend


def backend_limits(backend: Backend) -> IndexLimits:
    """What ``backend`` can index (its ``limits`` hook, else the default limits)."""
    return getattr(backend, "limits", INDEX_LIMITS)


def concretization_errors() -> tuple[type[BaseException], ...]:
    """What the array libraries in use raise when a traced value is made concrete: the
    ``concretization_errors`` of every loaded backend (see :class:`BackendHooks`). A built-in
    backend whose array library is already imported is loaded to ask it, so that
    :func:`polyconv.infer_shape` under a trace gets the same answer as the ops."""
    for name, entry in _BUILTIN.items():
        imported = any(lib in sys.modules for lib in entry.libraries)
        if name not in _LOADED and imported and _installed(entry):
            get_backend(name)
    return tuple(err for backend in _LOADED.values()
                 for err in getattr(backend, "concretization_errors", ()))


def check_one_library(op: str, arrays: dict[str, Any]) -> str:
    """The one array library of all inputs; mixed libraries are a ``TypeError``."""
    distinct = sorted({_library(x) for x in arrays.values()})
    if len(distinct) > 1:
        described = ", ".join(f"{n}: {type(x).__module__}.{type(x).__qualname__}"
                              for n, x in arrays.items())
        msg = (f"{op}: all array inputs must come from one array library; got {described}. "
               "Convert them to one library first")
        raise TypeError(msg)
    return distinct[0]


def infer_backend(op: str, arrays: dict[str, Any]) -> str:
    """Pick the backend from the input arrays (of one library, see ``check_one_library``)."""
    lib = check_one_library(op, arrays)
    for name, entry in _BUILTIN.items():
        # a loaded backend is installed: no file-system lookup (nor one that torch.compile
        # cannot trace) once it has run
        if lib in entry.libraries and (name in _LOADED or _installed(entry)):
            return name
    for name in _entry_points():  # imported only for arrays no built-in backend owns
        if lib in getattr(get_backend(name, op), "libraries", ()):
            return name
    # Any other array library: the generic array-API backend, if the namespace is known.
    x = next(iter(arrays.values()))
    try:
        import array_api_compat

        array_api_compat.array_namespace(x)
    except TypeError:
        msg = (f"{op}: unsupported array type {type(x).__module__}.{type(x).__qualname__}; "
               f"polyconv accepts numpy arrays, JAX arrays and arrays of any array-API "
               f"library that array-api-compat knows")
        raise TypeError(msg) from None
    return "array_api"


def dtype_name(x: Any) -> str:
    """Library-neutral dtype name: ``float32``, ``bfloat16``, ``int64``, ...

    numpy dtypes give their ``name``, which ignores the byte order (``>f4`` is float32).
    """
    name = getattr(x.dtype, "name", None)
    if type(x.dtype).__module__.startswith("numpy") and isinstance(name, str):
        return name
    return str(x.dtype).rsplit(".", 1)[-1]


def array_layout(x: Any) -> Any:
    """A torch tensor's ``layout`` (``torch.strided`` when dense, ``torch.sparse_coo``, ...),
    ``None`` for other arrays (whose ``layout``, if any, is not asked for: JAX's means memory
    order, and a traced value has none)."""
    return x.layout if _library(x) == "torch" else None


def _sparse_layout(x: Any) -> str | None:
    """The layout of a torch tensor that is not dense, or ``None``."""
    layout = array_layout(x)
    return None if layout is None or str(layout) == "torch.strided" else str(layout)


def check_arrays(op: str, arrays: dict[str, Any]) -> str:
    """Every input is an array of one shared floating dtype; return its name
    (docs/semantics.md#data-types)."""
    for name, x in arrays.items():
        if not (hasattr(x, "shape") and hasattr(x, "dtype")) or isinstance(x, type):
            msg = (f"{op}: {name} must be an array (numpy, JAX or array-API); got "
                   f"{type(x).__name__}")
            raise TypeError(msg)
        layout = _sparse_layout(x)
        if layout is not None:
            msg = (f"{op}: {name} must be a dense array; got a {layout} {type(x).__name__}: "
                   f"pass {name}.to_dense()")
            raise TypeError(msg)
    names = {name: dtype_name(x) for name, x in arrays.items()}
    bad = {n: d for n, d in names.items() if d not in FLOAT_DTYPES}
    if bad:
        got = ", ".join(f"{n}.dtype={d}" for n, d in bad.items())
        msg = (f"{op}: inputs must be floating point ({', '.join(FLOAT_DTYPES)}); got {got}")
        raise TypeError(msg)
    if len(set(names.values())) > 1:
        got = ", ".join(f"{n}.dtype={d}" for n, d in names.items())
        msg = (f"{op}: all inputs must share one floating dtype; got {got}: "
               f"{cast_hint(names)}")
        raise TypeError(msg)
    return next(iter(names.values()))


def restore_type(result: Any, like: Any) -> Any:
    """Return ``result`` in the array library of ``like``, on its device (a forced backend)."""
    if type(result) is type(like) or _library(result) == _library(like):
        return result
    if _library(like) == "numpy":
        import numpy as np

        return np.asarray(result)
    import array_api_compat

    xp = array_api_compat.array_namespace(like)
    return xp.asarray(result, device=array_api_compat.device(like))



# --------------------------------------------------------------------------------------------
# what backends say about themselves (BackendHooks)
# --------------------------------------------------------------------------------------------


def describe_backend(name: str) -> dict[str, Any]:
    """Name, availability, module, description, versions and devices of one registered
    backend (devices ``None`` where it is not available)."""
    from importlib.metadata import PackageNotFoundError, version

    entry = _BUILTIN.get(name)
    if entry is not None:
        module, description, requires = entry.module, entry.description, entry.requires
        available = _installed(entry)
    else:
        module, description, requires = _entry_points()[name].value, "third-party", ()
        available = True
    versions: dict[str, str] = {}
    for dist in requires:
        with contextlib.suppress(PackageNotFoundError):
            versions[dist] = version(dist)
    devices = None
    if available:
        try:
            hook = getattr(get_backend(name), "describe", None)
            facts = hook() if hook is not None else {"devices": "those of the input arrays"}
            versions.update(facts.get("versions", {}))
            devices = facts.get("devices")
        except Exception as exc:  # a broken install must not break the listing
            devices = f"unavailable ({type(exc).__name__}: {exc})"
    return {"name": name, "available": available, "module": module,
            "description": description, "versions": versions, "devices": devices}


def backend_samples(name: str, dtype: str) -> Samples:
    """How :func:`polyconv.compare` feeds backend ``name`` (its ``samples`` hook, or numpy)."""
    backend = get_backend(name)
    hook = getattr(backend, "samples", None)
    return hook(dtype) if hook is not None else NUMPY_SAMPLES
