"""The fixes that refusals name, checked by what they say and, where they give a rewrite, by
running it: the layout hint on a DCGAN layer, the command line's flags, PyTorch's
``output_padding >= stride``, mixed dtypes, and wrappers of JAX arrays such as
``nnx.Param`` (docs/semantics.md#validation)."""

from __future__ import annotations

import numpy as np
import pytest

import polyconv
from polyconv._cli import main


def _message(exc: type, fn, *args, **kwargs) -> str:
    with pytest.raises(exc) as info:
        fn(*args, **kwargs)
    return str(info.value)


# --------------------------------------------------------------------------------------------
# layouts
# --------------------------------------------------------------------------------------------


def test_layout_hint_changes_fewest_attributes_with_a_plausible_kernel():
    """DCGAN's second layer on a 4x4 map, weights [K, K, IC, OC]: the fix is XIO (one
    attribute, a 4x4 kernel), not NCX data with IOX weights (two, a 512x256 kernel)."""
    msg = _message(ValueError, polyconv.infer_shape, "ConvTranspose", (1, 4, 4, 512),
                   (4, 4, 512, 256), strides=2)
    assert "pass weights_format='XIO'" in msg, msg
    assert "IOX" not in msg.split("These shapes fit")[1], msg


def test_layout_hint_names_both_readings_of_square_data():
    """[1, 64, 64, 64] data with PyTorch's [128, 64, 3, 3] weights fits NXC with OIX weights
    and NCX with OIX: both are named, the one that changes less first."""
    msg = _message(ValueError, polyconv.infer_shape, "Convolution", (1, 64, 64, 64),
                   (128, 64, 3, 3))
    fits = msg.split("These shapes fit")[1]
    assert "pass weights_format='OIX'" in fits, msg
    assert "they also fit data_format='NCX', weights_format='OIX'" in fits, msg
    assert fits.index("pass weights_format='OIX'") < fits.index("also fit"), msg


def test_the_command_line_suggests_its_flags(capsys):
    status = main(["shape", "ConvTranspose", "--src", "1,4,4,512", "--weights",
                   "4,4,512,256", "--strides", "2"])
    err = capsys.readouterr().err
    assert status == 2
    assert "pass --weights-format XIO" in err, err
    assert "weights_format=" not in err and "data_format=" not in err, err


def test_the_command_line_suggests_flags_for_numbers_too(capsys):
    status = main(["shape", "ConvTranspose", "--src", "1,4,4,8", "--weights", "3,3,8,8",
                   "--strides", "2", "--pads-end", "1", "--output-padding", "2"])
    err = capsys.readouterr().err
    assert status == 2
    assert "pass --pads-end 0,0, --output-padding 1,1" in err, err
    assert "got output_padding=(2, 2)" in err, err   # what was given stays as the library says


# --------------------------------------------------------------------------------------------
# PyTorch's output_padding >= stride
# --------------------------------------------------------------------------------------------

# torch.nn.ConvTranspose2d(8, 4, 3, stride=2, dilation=3, output_padding=2, padding=p)
ATTRS = {"strides": 2, "dilations": 3, "output_padding": 2}


@pytest.mark.parametrize("padding", [0, 1, 2])
def test_output_padding_at_or_above_stride_gives_the_rewrite(padding):
    msg = _message(ValueError, polyconv.infer_shape, "ConvTranspose", (1, 8, 5, 5),
                   (8, 4, 3, 3), pads_begin=padding, pads_end=padding, data_format="NCX",
                   weights_format="IOX", **ATTRS)
    assert "output_padding must be in [0, stride)" in msg
    assert "only pads_end - output_padding changes the result" in msg, msg
    if padding >= 1:
        pe = (padding - 1,) * 2
        assert f"pass pads_end={pe}, output_padding=(1, 1)" in msg, msg
    else:
        assert "pass output_padding=(1, 1) and append (1, 1) positions" in msg, msg
        assert "holding the bias" in msg, msg


@pytest.mark.parametrize("padding", [0, 1, 2])
def test_the_output_padding_rewrite_computes_what_pytorch_does(padding):
    """The rewrite the message gives, run against torch's own ConvTranspose2d."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.standard_normal((2, 8, 5, 5)).astype(np.float32))
    w = torch.from_numpy(rng.standard_normal((8, 4, 3, 3)).astype(np.float32))
    b = torch.from_numpy(rng.standard_normal(4).astype(np.float32))
    expected = torch.nn.functional.conv_transpose2d(x, w, b, stride=2, padding=padding,
                                                    output_padding=2, dilation=3)
    common = {"strides": 2, "dilations": 3, "pads_begin": padding, "data_format": "NCX",
              "weights_format": "IOX"}
    if padding >= 1:
        y = polyconv.conv_transpose(x, w, b, pads_end=padding - 1, output_padding=1,
                                    **common)
    else:
        part = polyconv.conv_transpose(x, w, b, pads_end=0, output_padding=1, **common)
        # one more position at the end of each axis, holding the bias alone
        y = b[None, :, None, None].expand(2, 4, part.shape[2] + 1, part.shape[3] + 1).clone()
        y[:, :, :-1, :-1] = part
    assert tuple(y.shape) == tuple(expected.shape)
    np.testing.assert_allclose(y.numpy(), expected.numpy(), rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------------------------
# dtypes and array wrappers
# --------------------------------------------------------------------------------------------


def test_mixed_dtypes_say_how_to_cast():
    src = np.zeros((1, 5, 5, 3), np.float16)
    w = np.zeros((3, 3, 3, 4), np.float32)
    msg = _message(TypeError, polyconv.convolution, src, w)
    assert "src.dtype=float16, weights.dtype=float32" in msg
    assert "cast weights to float16 (src's dtype) to compute in float16" in msg, msg
    assert "or src to float32, before the call" in msg, msg
    assert ".astype(dtype)" in msg and ".to(dtype)" in msg, msg
    polyconv.convolution(src, w.astype(src.dtype))   # the fix works


def test_the_cast_hint_is_the_same_for_torch_tensors():
    """The message is the same on every backend: the hint names both spellings."""
    torch = pytest.importorskip("torch")
    msg = _message(TypeError, polyconv.convolution, torch.zeros(1, 5, 5, 3, dtype=torch.half),
                   torch.zeros(3, 3, 3, 4))
    assert msg == _message(TypeError, polyconv.convolution, np.zeros((1, 5, 5, 3), "f2"),
                           np.zeros((3, 3, 3, 4), "f4"))


class _Param:
    """What a Flax ``nnx.Param`` shows polyconv: shape, dtype and ``__jax_array__``."""

    def __init__(self, value):
        self.value = value
        self.shape, self.dtype = value.shape, value.dtype

    def __jax_array__(self):
        return self.value


class _Bare:
    """A wrapper with ``__jax_array__`` only."""

    def __init__(self, value):
        self.value = value

    def __jax_array__(self):
        return self.value


@pytest.mark.parametrize("wrapper", [_Param, _Bare])
def test_a_wrapper_of_a_jax_array_is_accepted_as_its_array(wrapper):
    """Wherever a JAX array is accepted, so is an object with ``__jax_array__`` (a Flax
    ``nnx.Param``): the op computes on the array it stands for, on the JAX backend."""
    jax = pytest.importorskip("jax")
    rng = np.random.default_rng(3)
    src = jax.numpy.asarray(rng.standard_normal((1, 5, 5, 3), dtype=np.float32))
    w = jax.numpy.asarray(rng.standard_normal((3, 3, 3, 4), dtype=np.float32))
    want = polyconv.convolution(src, w)
    for args in ((src, wrapper(w)), (wrapper(src), w), (wrapper(src), wrapper(w))):
        got = polyconv.convolution(*args)
        assert isinstance(got, jax.Array)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_array_equal(                              # the bias too
        np.asarray(polyconv.convolution(src, w, wrapper(jax.numpy.ones(4)))),
        np.asarray(polyconv.convolution(src, w, jax.numpy.ones(4))))
