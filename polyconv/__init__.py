"""polyconv: the convolution family with one exact meaning on every array library.

Six ops with oneDNN Graph semantics: :func:`convolution`, :func:`convolution_backward_data`,
:func:`convolution_backward_weights`, :func:`conv_transpose`,
:func:`conv_transpose_backward_data` and :func:`conv_transpose_backward_weights`, on numpy
arrays, JAX arrays and any array-API array. All shape, padding and layout logic is resolved
once, by :func:`infer_shape`'s code path, into a :class:`ConvPlan`. :func:`compare` runs one op
on every backend against a float64 reference. :func:`implementation` forces a backend's
implementation by name and :func:`autotune` measures them (off by default);
:func:`implementations` and :func:`default_implementation` say which there are and which
one a call gets. :func:`spatially_sharded` runs an op on JAX data split along spatial axes
over a device mesh.
"""

from ._backends import (
    Backend,
    BackendHooks,
    Samples,
    available_backends,
    get_backend,
    registered_backends,
)
from ._choice import Implementation, autotune, chosen, implementation
from ._geometry import AUTO_PADS, DATA_FORMATS, WEIGHTS_FORMATS, ConvPlan
from ._implementations import default_implementation, implementations, measured
from ._ops import (
    OPS,
    conv_transpose,
    conv_transpose_backprop_filters,
    conv_transpose_backward_data,
    conv_transpose_backward_weights,
    convolution,
    convolution_backprop_data,
    convolution_backprop_filters,
    convolution_backward_data,
    convolution_backward_weights,
    infer_shape,
)

__version__ = "0.1.0"

__all__ = [
    "AUTO_PADS",
    "DATA_FORMATS",
    "OPS",
    "WEIGHTS_FORMATS",
    "Backend",
    "BackendHooks",
    "BackendResult",
    "Comparison",
    "ConvPlan",
    "Implementation",
    "Samples",
    "autotune",
    "available_backends",
    "chosen",
    "compare",
    "conv_transpose",
    "conv_transpose_backprop_filters",
    "conv_transpose_backward_data",
    "conv_transpose_backward_weights",
    "convert_weights",
    "convolution",
    "convolution_backprop_data",
    "convolution_backprop_filters",
    "convolution_backward_data",
    "convolution_backward_weights",
    "default_implementation",
    "get_backend",
    "implementation",
    "implementations",
    "infer_shape",
    "measured",
    "registered_backends",
    "spatially_sharded",
]

# compare() needs numpy; load it on first use so that ``import polyconv`` stays light.
_LAZY = {"compare": "_compare", "Comparison": "_compare", "BackendResult": "_compare",
         "convert_weights": "_weights", "spatially_sharded": "_sharding"}


def __getattr__(name: str):
    if name in _LAZY:
        from importlib import import_module

        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
