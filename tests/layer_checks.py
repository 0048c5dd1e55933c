"""What every framework layer test checks: polyconv's layer against the framework's own layer,
within the error bound of docs/numerics.md (twice it: each of the two results meets it
against the exact value).

The bound needs, per element, the sum of the absolute products; for a linear map that is the
same map applied to the absolute values of its inputs, which the *framework's* layer computes
(``magnitude``). So nothing here restates a convolution.
"""

from __future__ import annotations

import numpy as np

EPS = {"float32": 2.0 ** -23, "float64": 2.0 ** -52, "float16": 2.0 ** -10,
       "bfloat16": 2.0 ** -7}


def assert_within_bound(ours, theirs, magnitude, terms: int, dtype: str = "float32",
                        what: str = "output") -> None:
    """``ours`` and ``theirs`` agree within twice the bound of ``dtype`` (accumulating in
    float32, or float64 for float64), ``magnitude`` being the sum of absolute products per
    element and ``terms`` an upper bound on their count."""
    ours, theirs, magnitude = (np.asarray(v, dtype=np.float64) for v in
                               (ours, theirs, magnitude))
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} != {theirs.shape}"
    acc = EPS["float64" if dtype == "float64" else "float32"]
    bound = 2 * (EPS[dtype] * np.abs(theirs) + terms * acc * magnitude) + 1e-30
    ratio = np.abs(ours - theirs) / bound
    worst = np.unravel_index(np.argmax(ratio), ratio.shape) if ratio.size else ()
    assert ratio.size == 0 or ratio.max() <= 1, (
        f"{what}: error/bound {ratio.max():.3g} at {worst}: ours {ours[worst]!r}, "
        f"theirs {theirs[worst]!r}")


def terms(*arrays) -> int:
    """A generous upper bound on the products in any element of any of the three
    computations of a layer: all the values of its operands."""
    return int(sum(np.prod(np.shape(a)) for a in arrays)) + 1


def assert_doctests_pass(module) -> None:
    """The examples in ``module``'s docstrings run and print what they show."""
    import doctest

    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, module.__name__):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0 and result.failed == 0, (
        f"{result.failed} of {result.attempted} examples failed in {module.__name__}")
