"""polyconv.layers.torch against torch.nn's own Conv*d and ConvTranspose*d: the same
parameters from the same seed, the same outputs and gradients within the error bound on a
grid of what torch supports; what torch lacks (asymmetric pads, "same" on ConvTranspose)
against torch's layer on a padded or cropped tensor; torch.compile, training, state_dict."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import only_with_target
from layer_checks import assert_doctests_pass, assert_within_bound, terms

only_with_target("frameworks")
torch = pytest.importorskip("torch")

from polyconv.layers import torch as ptorch  # noqa: E402

CONV = {1: torch.nn.Conv1d, 2: torch.nn.Conv2d, 3: torch.nn.Conv3d}
TRANSPOSE = {1: torch.nn.ConvTranspose1d, 2: torch.nn.ConvTranspose2d,
             3: torch.nn.ConvTranspose3d}


def _normal(seed: int, shape) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).standard_normal(shape, np.float32))


def _run(layer, x, g, **call):
    x = x.clone().requires_grad_(True)
    y = layer(x, **call)
    grads = torch.autograd.grad((y * g).sum(), [x, *layer.parameters()])
    return y.detach(), grads[0], list(grads[1:])


def _absolute(layer):
    import copy

    out = copy.deepcopy(layer)
    with torch.no_grad():
        for p in out.parameters():
            p.abs_()
    return out


def check_same(ours, theirs, x, **call) -> None:
    assert ours.state_dict().keys() == theirs.state_dict().keys()
    for key, value in theirs.state_dict().items():
        torch.testing.assert_close(ours.state_dict()[key], value, rtol=0, atol=0)
    g = _normal(7, theirs(x, **call).shape)
    mine, ref = _run(ours, x, g, **call), _run(theirs, x, g, **call)
    mag = _run(_absolute(theirs), x.abs(), g.abs(), **call)
    n = terms(x, ref[0], theirs.weight.detach())
    assert_within_bound(mine[0], ref[0], mag[0], n, what="output")
    assert_within_bound(mine[1], ref[1], mag[1], n, what="input gradient")
    for a, b, m in zip(mine[2], ref[2], mag[2], strict=True):
        assert_within_bound(a, b, m, n, what="parameter gradient")


def _pair(cls_ours, cls_theirs, rank, *args, **kw):
    torch.manual_seed(0)
    ours = cls_ours(rank, *args, **kw)
    torch.manual_seed(0)
    return ours, cls_theirs(*args, **kw)


CONV_CASES = [
    (1, {"padding": 2, "dilation": 2}, (2, 4, 9)),
    (2, {"stride": 2, "padding": 1}, (2, 4, 9, 8)),
    (2, {"padding": "same", "dilation": (1, 2), "groups": 2}, (2, 4, 9, 8)),
    (2, {"padding": "valid", "stride": (2, 1), "bias": False, "groups": 4}, (2, 4, 9, 8)),
    (3, {"stride": (1, 2, 1), "padding": (1, 0, 1)}, (1, 4, 4, 5, 3)),
]


@pytest.mark.parametrize(("rank", "kw", "shape"), CONV_CASES)
def test_conv_equals_torch(rank, kw, shape):
    check_same(*_pair(ptorch.Conv, CONV[rank], rank, 4, 8, 3, **kw), _normal(1, shape))


TRANSPOSE_CASES = [
    (1, {"stride": 2}, (2, 4, 5)),
    (2, {"stride": 2, "padding": 1, "output_padding": 1}, (2, 4, 5, 4)),
    (2, {"stride": (2, 3), "padding": (1, 2), "dilation": 2, "groups": 2,
         "output_padding": (1, 2)}, (2, 4, 4, 5)),
    (2, {"stride": 3, "padding": 2, "groups": 4, "bias": False}, (2, 4, 4, 3)),
    (3, {"stride": 2, "padding": (0, 1, 0), "output_padding": 1}, (1, 4, 3, 2, 3)),
]


@pytest.mark.parametrize(("rank", "kw", "shape"), TRANSPOSE_CASES)
def test_conv_transpose_equals_torch(rank, kw, shape):
    check_same(*_pair(ptorch.ConvTranspose, TRANSPOSE[rank], rank, 4, 8, 3, **kw),
               _normal(1, shape))


def test_output_size_equals_torch():
    ours, theirs = _pair(ptorch.ConvTranspose, torch.nn.ConvTranspose2d, 2, 4, 6, 3,
                         stride=3, padding=1)
    check_same(ours, theirs, _normal(1, (2, 4, 4, 5)), output_size=(12, 15))


def test_asymmetric_pads_equal_torch_on_a_padded_input():
    ours, theirs = _pair(ptorch.Conv, torch.nn.Conv2d, 2, 4, 6, 3, stride=2,
                         padding=((0, 2), (1, 0)))
    theirs.padding = (0, 0)
    x = _normal(1, (2, 4, 8, 7))
    padded = torch.nn.functional.pad(x, (1, 0, 0, 2))
    torch.testing.assert_close(ours(x), theirs(padded), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize(("kernel", "extra"), [(4, 0), (3, 0), (4, 1)])
def test_same_conv_transpose_equals_torch_cropped(kernel, extra):
    """``padding="same"`` (pytorch#80301): torch's layer without padding (with the same
    ``output_padding``), cropped by the ``same_upper`` pads (total ``k - s``, the odd one at
    the end): the output is ``in * stride + output_padding``."""
    ours, theirs = _pair(ptorch.ConvTranspose, torch.nn.ConvTranspose2d, 2, 4, 6, kernel,
                         stride=2, padding="same", output_padding=extra)
    theirs.padding = (0, 0)
    x = _normal(1, (2, 4, 5, 4))
    total = kernel - 2
    begin, end = total // 2, total - total // 2
    full = theirs(x)
    cropped = full[..., begin:full.shape[-2] - end, begin:full.shape[-1] - end]
    y = ours(x)
    assert y.shape[-2:] == (10 + extra, 8 + extra)
    torch.testing.assert_close(y, cropped, rtol=2e-5, atol=2e-5)


def test_compile_and_training():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        ptorch.Conv(1, 2, 8, 3, stride=2, padding=((0, 1),)), torch.nn.ReLU(),
        ptorch.ConvTranspose(1, 8, 2, 3, stride=2, padding="same", output_padding=1,
                             groups=2))
    x = _normal(3, (8, 2, 8))
    compiled = torch.compile(model, backend="eager")
    torch.testing.assert_close(compiled(x), model(x))
    optimizer = torch.optim.Adam(model.parameters(), 1e-2)
    losses = []
    for _ in range(15):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(compiled(x)[..., :8], x)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses


def test_state_dict_interchanges_with_torch(tmp_path):
    theirs = torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, groups=2)
    path = tmp_path / "state.pt"
    torch.save(theirs.state_dict(), path)
    ours = ptorch.ConvTranspose(2, 4, 6, 3, stride=2, padding=1, groups=2)
    ours.load_state_dict(torch.load(path))
    x = _normal(1, (1, 4, 5, 5))
    torch.testing.assert_close(ours(x), theirs(x), rtol=2e-5, atol=2e-5)
    torch.save(ours.state_dict(), path)
    theirs.load_state_dict(torch.load(path))


def test_errors_name_the_fix():
    with pytest.raises(ValueError, match="padding_mode"):
        ptorch.Conv(2, 2, 2, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match="auto_pad"):
        ptorch.ConvTranspose(2, 2, 2, 3, auto_pad="same")


def test_docstring_examples():
    assert_doctests_pass(ptorch)
