"""The examples in the library's docstrings run and print what they show.

Every module of the core and of the numpy backend is checked (the public functions'
docstrings, rendered in the API reference, live there); the other backends' examples need
their libraries and run in their sessions' own tests.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import polyconv

MODULES = sorted(
    # polyconv._sharding's example runs JAX: tests/test_jax_spatial_sharding.py runs it
    [f"polyconv.{m.name}" for m in pkgutil.iter_modules(polyconv.__path__)
     if m.name not in ("__main__", "_sharding")]
    + ["polyconv_numpy", *(f"polyconv_numpy.{m.name}" for m in
                           pkgutil.iter_modules(importlib.import_module("polyconv_numpy").__path__))]
    # the dialects: each translates attributes with no framework installed
    + [f"polyconv.dialects.{m.name}" for m in
       pkgutil.iter_modules(importlib.import_module("polyconv.dialects").__path__)])


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_the_public_functions_have_examples():
    """The examples that the API reference shows are among those run above."""
    finder = doctest.DocTestFinder()
    shown = [name for name in ("convolution", "convolution_backward_data",
                               "convolution_backward_weights", "conv_transpose",
                               "conv_transpose_backward_data", "conv_transpose_backward_weights",
                               "infer_shape", "compare", "available_backends")
             if not any(t.examples for t in finder.find(getattr(polyconv, name)))]
    assert shown == [], f"public functions without a runnable example: {shown}"
