"""Each framework's own attributes, spoken exactly: call polyconv with a framework's
attributes and get that framework's answer (docs/frameworks.md).

One module per framework, each imported on first use and importing no framework itself:
:mod:`~polyconv.dialects.onnx`, :mod:`~polyconv.dialects.torch`,
:mod:`~polyconv.dialects.keras`, :mod:`~polyconv.dialects.tensorflow`,
:mod:`~polyconv.dialects.jax`,
:mod:`~polyconv.dialects.openvino` and :mod:`~polyconv.dialects.onednn` (oneDNN's
primitive API and benchmark descriptors). Each translates onto the one contract
(docs/semantics.md) and says, with a ``ValueError``, where a framework's rule has no
polyconv equivalent.
"""

from __future__ import annotations

DIALECTS = ("onnx", "torch", "keras", "tensorflow", "jax", "openvino", "onednn")


def __getattr__(name: str):
    if name in DIALECTS:
        from importlib import import_module

        module = import_module(f".{name}", __name__)
        globals()[name] = module
        return module
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(DIALECTS))
