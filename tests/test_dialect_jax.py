"""The JAX dialect against ``lax.conv_general_dilated`` and ``lax.conv_transpose`` themselves,
on a grid of arguments including both ``transpose_kernel`` conventions
(docs/frameworks.md#jax-and-flax)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from conftest import only_with_target

from polyconv.dialects import jax as dialect

only_with_target("frameworks")
jax = pytest.importorskip("jax")
lax = jax.lax

RNG = np.random.default_rng(0)
SPECS = {"NHWC": (("NHWC", "HWIO", "NHWC"), (0, 2, 3, 1), (2, 3, 1, 0)),
         "NCHW": (("NCHW", "OIHW", "NCHW"), (0, 1, 2, 3), (0, 1, 2, 3))}


def _close(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, what
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9, err_msg=str(what))


@pytest.fixture(autouse=True)
def _x64(jax_x64):
    """float64 on both sides: any difference is the translation's, not rounding's."""


def test_conv_general_dilated_grid():
    checked = 0
    for (k, s, d), g, padding, layout in itertools.product(
            ((1, 1, 1), (2, 2, 1), (3, 1, 2), (3, 2, 2), (2, 1, 2), (2, 3, 1)), (1, 2),
            ("SAME", "SAME_LOWER", "VALID", "pairs"), SPECS):
        dn, x_perm, w_perm = SPECS[layout]
        x = np.transpose(RNG.standard_normal((2, 2 * g, 6, 5)), x_perm)   # from NCHW
        w = np.transpose(RNG.standard_normal((3 * g, 2, k, 2)), w_perm)   # from OIHW
        pad = [(1, 0), (2, 1)] if padding == "pairs" else padding
        args = ((s, 1), pad)
        kw = {"rhs_dilation": (d, 1), "dimension_numbers": dn, "feature_group_count": g}
        want = lax.conv_general_dilated(x, w, *args, **kw)
        _close(dialect.conv_general_dilated(x, w, *args, **kw), want, (k, s, d, g, pad))
        checked += 1
    assert checked == 96


def test_conv_transpose_grid():
    checked = 0
    for k, s, d, padding, flag, consistent in itertools.product(
            (1, 2, 3, 4), (1, 2, 3), (1, 2), ("SAME", "VALID", "pairs", "crops"),
            (False, True), (False, True)):
        if (consistent and padding != "crops") or (padding == "crops" and not consistent):
            continue
        pad = {"pairs": [(k * d - 1, k - 1), (0, 1)], "crops": [(1, 0), (0, 1)]}.get(
            padding, padding)
        x = RNG.standard_normal((2, 4, 3, 3))
        w = RNG.standard_normal((k, 2, 3, 3))                  # HWIO, the I/O as lax reads
        kw = {"rhs_dilation": (d, 1), "dimension_numbers": ("NHWC", "HWIO", "NHWC"),
              "transpose_kernel": flag, "use_consistent_padding": consistent}
        try:
            want = lax.conv_transpose(x, w, (s, 2), pad, **kw)
        except (ValueError, TypeError):
            continue
        try:
            got = dialect.conv_transpose(x, w, (s, 2), pad, **kw)
        except ValueError as e:
            # what polyconv cannot express: a bias-only position before the first product
            assert "negative begin crop" in str(e) or "below the stride" in str(e), e
            continue
        _close(got, want, (k, s, d, pad, flag))
        checked += 1
    assert checked > 80, checked


def test_default_dimension_numbers():
    x, w = RNG.standard_normal((1, 2, 6)), RNG.standard_normal((3, 2, 2))   # NCH, OIH
    _close(dialect.conv_general_dilated(x, w, (2,), "SAME"),
           lax.conv_general_dilated(x, w, (2,), "SAME"), "NCH")
    x, w = RNG.standard_normal((1, 4, 3)), RNG.standard_normal((2, 3, 2))   # NHC, HIO
    _close(dialect.conv_transpose(x, w, (2,), "SAME"), lax.conv_transpose(x, w, (2,), "SAME"),
           "NHC")


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"lhs_dilation": (2, 2)}, "is a transposed convolution"),
    ({"batch_group_count": 2}, "batch_group_count=2"),
    ({"padding": [(-1, 0), (0, 0)]}, "negative pad"),
    ({"dimension_numbers": ("NHWC", "WHIO", "NHWC")}, "has no polyconv layout"),
])
def test_refusals_say_why(kwargs, match):
    args = {"window_strides": (1, 1), "padding": "SAME", **kwargs}
    with pytest.raises(ValueError, match=match):
        dialect.conv_general_dilated(np.ones((2, 4, 4, 2)), np.ones((2, 2, 2, 2)), **args)
