"""polyconv against PyTorch: the six ops in float64, on random geometries, on every target.

The expectations come from PyTorch alone (``torch.nn.functional.conv{1,2,3}d``,
``conv_transpose{1,2,3}d`` and ``torch.autograd.grad``), never from polyconv or the tests'
oracle. The translation of the oneDNN attributes into torch calls is written out here, from
docs/semantics.md only:

* pads (asymmetric): ``F.pad`` of the input, then torch with ``padding=0``;
* the transposed direction: torch with ``padding=0`` gives every product, ``s*(B-1) + ek``
  positions per axis; the oneDNN output is the window ``[pb, pb + A)`` of it, zero-extended
  past its end (positions that output_padding or dst_shape add get the bias only);
* ``auto_pad``: the pads are computed here (docs/semantics.md#auto-pad: rule F on the large
  size, rule T ``ek - s``) and the user's own pads are passed too, to be ignored;
* layouts: NXC is moved to torch's NCX; the weights formats are transposed to torch's conv
  weight ``[OC, IC/g, K..]`` (Convolution OIX) or conv_transpose weight ``[IC, OC/g, K..]``
  (ConvTranspose IOX); ``None`` leaves the family's default format (XIO / XOI).

Every problem is a canonical convolution from a large tensor ``a`` ``[N, Ca, A..]`` to a small
one ``b`` ``[N, Cb, B..]`` with weights ``[Cb, Ca/G, K..]``, which is both torch's conv weight
of ``a -> b`` and torch's conv_transpose weight of ``b -> a``. Eager JAX compiles every call
for its shapes, so the JAX targets run fewer examples.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import polyconv

torch = pytest.importorskip("torch")
F = torch.nn.functional

EXAMPLES = 100
EXAMPLES_JAX = {"jax": 20, "array_api-jax": 4}  # eager JAX: ~0.1 s / ~0.6 s a call
RTOL = ATOL = 1e-9
AUTO_PADS = ("none", "explicit", "valid", "same_upper", "same_lower", "SAME_UPPER", "Same_Lower")
WEIGHTS_FORMATS = ("OIX", "XIO", "IOX", "XOI", None)
DEFAULT_WEIGHTS_FORMAT = {"convolution": "XIO", "conv_transpose": "XOI"}


def run_examples(target, strategy, check) -> None:
    """``check(case)`` on ``strategy``'s examples, as many as the target affords."""
    n = EXAMPLES_JAX.get(target.name, EXAMPLES)
    settings(max_examples=n, deadline=None, derandomize=True, database=None,
             suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])(
        given(strategy)(check))()


# --------------------------------------------------------------------------------------------
# geometry (docs/semantics.md#geometry), computed here
# --------------------------------------------------------------------------------------------


def same_total(rule: str, a: int, k: int, s: int, d: int) -> int:
    ek = (k - 1) * d + 1
    if rule == "F":
        return max((-(-a // s) - 1) * s + ek - a, 0)
    return max(ek - s, 0)


def effective_pads(auto_pad: str, rule: str, a, kernel, strides, dilations, pb, pe):
    """Per-axis (pads_begin, pads_end) after auto_pad; ``a`` is only read by rule F."""
    mode = auto_pad.lower()
    if mode in ("none", "explicit"):
        return tuple(pb), tuple(pe)
    if mode == "valid":
        return (0,) * len(kernel), (0,) * len(kernel)
    begin, end = [], []
    for i, (k, s, d) in enumerate(zip(kernel, strides, dilations)):
        total = same_total(rule, a[i] if rule == "F" else 0, k, s, d)
        small, big = total // 2, total - total // 2
        begin.append(small if mode == "same_upper" else big)
        end.append(big if mode == "same_upper" else small)
    return tuple(begin), tuple(end)


@dataclass(frozen=True)
class Case:
    """One canonical problem: ``a`` [N, Ca, A..] -> ``b`` [N, Cb, B..], weights [Cb, Ca/G, K..]."""

    batch: int
    ca: int
    cb: int
    groups: int
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    user_pads: tuple[tuple[int, ...], tuple[int, ...]]   # what the call passes
    auto_pad: str
    pads_begin: tuple[int, ...]                           # what the contract makes of them
    pads_end: tuple[int, ...]
    a: tuple[int, ...]
    b: tuple[int, ...]
    output_padding: tuple[int, ...]                       # A - (s*(B-1) + ek - pb - pe)
    data_format: str | None
    weights_format: str | None
    full_shapes: bool       # dst_shape / weights_shape in full, else spatial only
    with_dst: bool          # pass dst_shape (rule "F" cases of ops that take one)
    with_opad: bool         # pass output_padding where it is optional: with dst_shape, or
                            # to the ConvTranspose backward ops (else they infer it)
    bias: bool
    seed: int

    @property
    def rank(self) -> int:
        return len(self.kernel)

    @property
    def a_shape(self):
        return (self.batch, self.ca, *self.a)

    @property
    def b_shape(self):
        return (self.batch, self.cb, *self.b)

    @property
    def w_shape(self):
        return (self.cb, self.ca // self.groups, *self.kernel)

    def rng(self):
        return np.random.default_rng(self.seed)

    def attrs(self, **extra):
        out = {"strides": self.strides, "dilations": self.dilations,
               "pads_begin": self.user_pads[0], "pads_end": self.user_pads[1],
               "auto_pad": self.auto_pad, "groups": self.groups, **extra}
        if self.data_format is not None:
            out["data_format"] = self.data_format
        if self.weights_format is not None:
            out["weights_format"] = self.weights_format
        return out

    # layouts --------------------------------------------------------------------------------

    @property
    def nxc(self) -> bool:
        return self.data_format in (None, "NXC")

    def data(self, x: np.ndarray) -> np.ndarray:
        """NCX -> the case's data format."""
        return np.ascontiguousarray(np.moveaxis(x, 1, -1)) if self.nxc else x

    def data_shape(self, ncx_shape) -> tuple[int, ...]:
        n, c, *sp = ncx_shape
        return (n, *sp, c) if self.nxc else (n, c, *sp)

    def _perm(self, family: str) -> list[int]:
        """Axes of an OIX array (O, I as the contract defines them for ``family``) in
        the format."""
        fmt = self.weights_format or DEFAULT_WEIGHTS_FORMAT[family]
        axes = {"O": [0], "I": [1], "X": list(range(2, 2 + self.rank))}
        return [ax for letter in fmt for ax in axes[letter]]

    def weights(self, w: np.ndarray, family: str) -> np.ndarray:
        """Canonical [Cb, Ca/G, K..] -> the user's weights in the case's format.

        Convolution: canonical = OIX (O = OC = Cb, I = IC/g = Ca/G). ConvTranspose:
        canonical = IOX (I = IC = Cb, O = OC/g = Ca/G)."""
        oix = w if family == "convolution" else np.swapaxes(w, 0, 1)
        return np.ascontiguousarray(np.transpose(oix, self._perm(family)))

    def weights_user_shape(self, family: str) -> tuple[int, ...]:
        return self.weights(np.empty(self.w_shape), family).shape

    def large_size_attrs(self) -> dict:
        """How an op that can take ``dst_shape`` learns A: ``dst_shape`` (full or spatial,
        with a consistent ``output_padding`` alongside or not) or ``output_padding``."""
        if not self.with_dst:
            return {"output_padding": self.output_padding}
        extra = {"dst_shape": self.data_shape(self.a_shape) if self.full_shapes else self.a}
        if self.with_opad:
            extra["output_padding"] = self.output_padding
        return extra

    def optional_output_padding(self) -> dict:
        """The ConvTranspose backward ops infer output_padding; pass it or not."""
        return {"output_padding": self.output_padding} if self.with_opad else {}


def _per_axis(draw, rank, lo, hi):
    return tuple(draw(st.lists(st.integers(lo, hi), min_size=rank, max_size=rank)))


@st.composite
def cases(draw, rule: str) -> Case:
    """``rule`` "F": the large size A is drawn and same_* pads follow rule F on it (B follows),
    as for ops that know A (and for dst_shape); "T": the small size B and output_padding are
    drawn, same_* pads follow rule T (A follows)."""
    rank = draw(st.integers(1, 3))
    small = rank == 3
    kernel = _per_axis(draw, rank, 1, 2 if small else 3)
    strides = _per_axis(draw, rank, 1, 3)
    dilations = _per_axis(draw, rank, 1, 2)
    user_pads = (_per_axis(draw, rank, 0, 2), _per_axis(draw, rank, 0, 2))
    auto_pad = draw(st.sampled_from(AUTO_PADS))
    groups = draw(st.integers(1, 4))
    ca = groups * draw(st.integers(1, 2))  # Ca/G == 1: depthwise Convolution
    cb = groups * draw(st.integers(1, 2))  # Cb/G == 1: depthwise ConvTranspose
    eks = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if rule == "F":
        a = _per_axis(draw, rank, 1, 4 if small else 8)
        pb, pe = effective_pads(auto_pad, "F", a, kernel, strides, dilations, *user_pads)
        room = [ai + p0 + p1 - ek for ai, p0, p1, ek in zip(a, pb, pe, eks)]
        assume(all(r >= 0 for r in room))
        b = tuple(r // s + 1 for r, s in zip(room, strides))
        opad = tuple(r % s for r, s in zip(room, strides))
    else:
        b = _per_axis(draw, rank, 1, 3 if small else 5)
        opad = tuple(draw(st.integers(0, s - 1)) for s in strides)
        pb, pe = effective_pads(auto_pad, "T", None, kernel, strides, dilations, *user_pads)
        a = tuple(s * (bi - 1) + ek - p0 - p1 + op
                  for s, bi, ek, p0, p1, op in zip(strides, b, eks, pb, pe, opad))
        assume(all(ai >= 1 for ai in a))
    return Case(batch=draw(st.integers(1, 2)), ca=ca, cb=cb, groups=groups, kernel=kernel,
                strides=strides, dilations=dilations, user_pads=user_pads, auto_pad=auto_pad,
                pads_begin=pb, pads_end=pe, a=a, b=b, output_padding=opad,
                data_format=draw(st.sampled_from(["NXC", "NCX", None])),
                weights_format=draw(st.sampled_from(WEIGHTS_FORMATS)),
                full_shapes=draw(st.booleans()), with_dst=rule == "F",
                with_opad=draw(st.booleans()), bias=draw(st.booleans()),
                seed=draw(st.integers(0, 2**32 - 1)))


# --------------------------------------------------------------------------------------------
# PyTorch references (NCX, canonical weights)
# --------------------------------------------------------------------------------------------


def _t(x: np.ndarray, grad: bool = False):
    return torch.tensor(x, dtype=torch.float64, requires_grad=grad)


def _pad_axis(x, rank: int, axis: int, begin: int, end: int):
    """F.pad of spatial ``axis`` only (F.pad lists the last axis first)."""
    pad = [0] * (2 * rank)
    pad[2 * (rank - 1 - axis)], pad[2 * (rank - 1 - axis) + 1] = begin, end
    return F.pad(x, pad)


def torch_convolution(a, w, c: Case):
    """a [N, Ca, A..] -> b [N, Cb, B..]: pad a asymmetrically, then torch's conv."""
    for i in range(c.rank):
        a = _pad_axis(a, c.rank, i, c.pads_begin[i], c.pads_end[i])
    conv = getattr(F, f"conv{c.rank}d")
    return conv(a, w, stride=c.strides, dilation=c.dilations, groups=c.groups)


def torch_conv_transpose(b, w, c: Case):
    """b [N, Cb, B..] -> a [N, Ca, A..]: torch's conv_transpose without padding yields every
    product at position ``y*s + k*d``; output position x reads position ``x + pb``, and reads
    zero past the last product."""
    conv_t = getattr(F, f"conv_transpose{c.rank}d")
    full = conv_t(b, w, stride=c.strides, dilation=c.dilations, groups=c.groups)
    for i in range(c.rank):
        axis, begin, size = 2 + i, c.pads_begin[i], c.a[i]
        missing = begin + size - full.shape[axis]
        if missing > 0:
            full = _pad_axis(full, c.rank, i, 0, missing)
        full = full.narrow(axis, begin, size)
    return full


def _with_bias(y, bias):
    return y if bias is None else y + _t(bias).reshape(1, -1, *([1] * (y.ndim - 2)))


def _grad(out, wrt, grad_out: np.ndarray) -> np.ndarray:
    (g,) = torch.autograd.grad(out, wrt, grad_outputs=_t(grad_out))
    return g.detach().numpy()


def assert_matches(target, got, expected: np.ndarray, c: Case, what: str) -> None:
    got = target.to_numpy(got)
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != torch's {expected.shape}"
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL,
                               err_msg=f"{what} vs torch on {target.name}: {c}")


def _maybe_bias(c: Case, rng, channels: int):
    return rng.standard_normal(channels) if c.bias else None


# --------------------------------------------------------------------------------------------
# Convolution family: expectations from torch's conv and its autograd
# --------------------------------------------------------------------------------------------


def test_convolution(target):
    def check(c: Case):
        rng = c.rng()
        a, w = rng.standard_normal(c.a_shape), rng.standard_normal(c.w_shape)
        bias = _maybe_bias(c, rng, c.cb)
        expected = _with_bias(torch_convolution(_t(a), _t(w), c), bias).detach().numpy()
        got = target.call(polyconv.convolution, c.data(a), c.weights(w, "convolution"), bias,
                          **c.attrs())
        assert_matches(target, got, c.data(expected), c, "convolution")

    run_examples(target, cases("F"), check)


def test_convolution_backward_data(target):
    """With dst_shape (full or spatial; rule F on it), or without (rule T, output_padding)."""

    def check(c: Case):
        rng = c.rng()
        w, db = rng.standard_normal(c.w_shape), rng.standard_normal(c.b_shape)
        a = _t(np.zeros(c.a_shape), grad=True)
        b = torch_convolution(a, _t(w), c)
        assert tuple(b.shape) == c.b_shape
        expected = _grad(b, a, db)
        got = target.call(polyconv.convolution_backward_data, c.data(db),
                          c.weights(w, "convolution"), **c.attrs(**c.large_size_attrs()))
        assert_matches(target, got, c.data(expected), c, "convolution_backward_data")

    run_examples(target, st.one_of(cases("F"), cases("T")), check)


def test_convolution_backward_weights(target):
    def check(c: Case):
        rng = c.rng()
        a, db = rng.standard_normal(c.a_shape), rng.standard_normal(c.b_shape)
        w = _t(np.zeros(c.w_shape), grad=True)
        b = torch_convolution(_t(a), w, c)
        assert tuple(b.shape) == c.b_shape
        expected = _grad(b, w, db)
        shape = c.weights_user_shape("convolution") if c.full_shapes else c.kernel
        got = target.call(polyconv.convolution_backward_weights, c.data(a), c.data(db),
                          **c.attrs(weights_shape=shape))
        assert_matches(target, got, c.weights(expected, "convolution"), c,
                       "convolution_backward_weights")

    run_examples(target, cases("F"), check)


# --------------------------------------------------------------------------------------------
# ConvTranspose family: expectations from torch's conv_transpose (cropped) and its autograd
# --------------------------------------------------------------------------------------------


def test_conv_transpose(target):
    """Without dst_shape (output_padding, rule T) or with it (full or spatial, rule F)."""

    def check(c: Case):
        rng = c.rng()
        b, w = rng.standard_normal(c.b_shape), rng.standard_normal(c.w_shape)
        bias = _maybe_bias(c, rng, c.ca)
        expected = _with_bias(torch_conv_transpose(_t(b), _t(w), c), bias).detach().numpy()
        assert expected.shape == c.a_shape
        got = target.call(polyconv.conv_transpose, c.data(b), c.weights(w, "conv_transpose"),
                          bias, **c.attrs(**c.large_size_attrs()))
        assert_matches(target, got, c.data(expected), c, "conv_transpose")

    run_examples(target, st.one_of(cases("F"), cases("T")), check)


def test_conv_transpose_backward_data(target):
    def check(c: Case):
        rng = c.rng()
        w, da = rng.standard_normal(c.w_shape), rng.standard_normal(c.a_shape)
        b = _t(np.zeros(c.b_shape), grad=True)
        a = torch_conv_transpose(b, _t(w), c)
        expected = _grad(a, b, da)
        got = target.call(polyconv.conv_transpose_backward_data, c.data(da),
                          c.weights(w, "conv_transpose"),
                          **c.attrs(**c.optional_output_padding()))
        assert_matches(target, got, c.data(expected), c, "conv_transpose_backward_data")

    run_examples(target, cases("T"), check)


def test_conv_transpose_backward_weights(target):
    def check(c: Case):
        rng = c.rng()
        b, da = rng.standard_normal(c.b_shape), rng.standard_normal(c.a_shape)
        w = _t(np.zeros(c.w_shape), grad=True)
        a = torch_conv_transpose(_t(b), w, c)
        expected = _grad(a, w, da)
        shape = c.weights_user_shape("conv_transpose") if c.full_shapes else c.kernel
        got = target.call(polyconv.conv_transpose_backward_weights, c.data(b), c.data(da),
                          **c.attrs(weights_shape=shape, **c.optional_output_padding()))
        assert_matches(target, got, c.weights(expected, "conv_transpose"), c,
                       "conv_transpose_backward_weights")

    run_examples(target, cases("T"), check)
