"""The PyTorch dialect against ``torch.nn.functional`` itself, on a grid of arguments
(docs/frameworks.md#pytorch)."""

from __future__ import annotations

import itertools

import pytest
from conftest import only_with_target

from polyconv.dialects import torch as dialect

only_with_target("frameworks")
torch = pytest.importorskip("torch")
F = torch.nn.functional


def _check(fn, torch_fn, x, w, b, **kw):
    """Both on the same tensors; a refusal of torch's must be a refusal here too."""
    try:
        want = torch_fn(x, w, b, **kw)
    except RuntimeError:
        with pytest.raises(ValueError):
            fn(x, w, b, **kw)
        return 0
    got = fn(x, w, b, **kw)
    assert isinstance(got, torch.Tensor)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=str(kw))
    return 1


def test_conv_grid():
    gen = torch.Generator().manual_seed(0)
    checked = 0
    for ndim, k, s, d, g, padding in itertools.product(
            (1, 2), (1, 2, 3), (1, 2), (1, 2), (1, 2),
            (0, 1, 2, "same", "valid", "tuple")):
        if padding == "tuple":
            padding = (1, 0)[:ndim]
        x = torch.randn(2, 2 * g, *(7, 6)[:ndim], generator=gen, dtype=torch.float64)
        w = torch.randn(3 * g, 2, *(k, 2)[:ndim], generator=gen, dtype=torch.float64)
        b = torch.randn(3 * g, generator=gen, dtype=torch.float64)
        torch_fn = (F.conv1d, F.conv2d)[ndim - 1]
        checked += _check(dialect.conv, torch_fn, x, w, b, stride=s, padding=padding,
                          dilation=d, groups=g)
    assert checked > 150, checked


def test_conv_transpose_grid():
    """Every ``output_padding`` PyTorch accepts, below ``max(stride, dilation)``."""
    gen = torch.Generator().manual_seed(1)
    checked = 0
    for ndim, k, s, d, g, padding, opad in itertools.product(
            (1, 2), (1, 2, 3), (1, 2, 3), (1, 2, 3), (1, 2), (0, 1, 2), (0, 1, 2)):
        if opad >= max(s, d):
            continue
        x = torch.randn(2, 2 * g, *(4, 3)[:ndim], generator=gen, dtype=torch.float64)
        w = torch.randn(2 * g, 3, *(k, 2)[:ndim], generator=gen, dtype=torch.float64)
        b = torch.randn(3 * g, generator=gen, dtype=torch.float64)
        torch_fn = (F.conv_transpose1d, F.conv_transpose2d)[ndim - 1]
        try:
            want = torch_fn(x, w, b, stride=s, padding=padding, output_padding=opad,
                            groups=g, dilation=d)
        except RuntimeError:
            continue                                     # an empty output: torch refuses
        try:
            got = dialect.conv_transpose(x, w, b, stride=s, padding=padding,
                                         output_padding=opad, groups=g, dilation=d)
        except ValueError as e:
            # output_padding at or above the stride with too little padding to take it off
            assert "below the stride" in str(e) and opad >= s and padding < opad - s + 1, e
            continue
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        checked += 1
    assert checked > 400, checked


@pytest.mark.parametrize(("op", "kwargs", "match"), [
    ("conv", {"padding": "same", "stride": 2}, "padding='same' takes stride 1"),
    ("conv", {"padding": "full"}, "padding must be an int"),
    ("conv", {"padding_mode": "reflect"}, "padding_mode='reflect' has no polyconv"),
    ("conv_transpose", {"output_padding": 2, "stride": 2}, "below max.stride, dilation"),
])
def test_refusals_say_why(op, kwargs, match):
    with pytest.raises(ValueError, match=match):
        dialect.keywords(op, (1, 2, 6, 6), (2, 2, 3, 3), **kwargs)
