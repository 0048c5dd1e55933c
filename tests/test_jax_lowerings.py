"""The JAX backend's lowerings, each forced over the attribute grid against the float64
oracle: backward_data, backward_weights and forward, in every dtype and layout; forcing,
the default choice, NaN locality; and the one padded row of unpadded 2-D convolutions on CPU.
Helpers shared with tests/test_jax.py come from it."""

from __future__ import annotations

import itertools
import math
import re
import zlib

import numpy as np
import pytest
from conftest import only_with_target

only_with_target("jax")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from jax_grid import (  # noqa: E402
    _LAYOUTS,
    _bias_grad,
    _close,
    _data,
    _hlo,
    _per_axis,
    _weights,
)
from oracle import assert_within_bound, reference  # noqa: E402
from polyconv_jax import (  # noqa: E402
    _choice,
    _common,
    _elementwise,
    _grouped,
    _patches,
    _plain,
    _policy,
    _sliced,
    _subpixel,
    _xla,
)

import polyconv  # noqa: E402


def _record_applies(primitive: str, plan, name: str) -> bool:
    return _choice.CHOOSER.get(primitive, name).applies(plan)


def _exact(plan, name: str) -> bool:
    """Whether a backward_data lowering forms exactly the definition's products for ``plan``."""
    return (_choice.CHOOSER.get("backward_data", name).exact_on_nonfinite
            or _subpixel.subpixel_is_exact(plan))


def _forced(**by_primitive: str):
    return polyconv.implementation(",".join(f"jax:{p}={n}" for p, n in by_primitive.items()))

pytestmark = pytest.mark.usefixtures("jax_x64")   # the comparisons here are in float64

# --------------------------------------------------------------------------------------------
# backward_data lowerings: each one over the attribute grid, against the oracle
# --------------------------------------------------------------------------------------------

BACKWARD_DATA_LOWERINGS = _choice.LOWERINGS["backward_data"]

# (op, kernel, attributes, groups). Tuples are per axis and cut to the rank. "groups": an int;
# "dw": one input channel of the primitive's small tensor per group (depthwise); "dw2": the
# same with two output channels per group (channel multiplier). "dst": a dst_shape one row
# longer than the attributes give (conv_transpose), or the src shape (convolution family).
_BD_VARIANTS = (
    ("conv_transpose", (3, 3, 3),
     {"strides": 2, "pads_begin": 1, "pads_end": 1, "output_padding": 1}, 1),
    ("conv_transpose", (3, 2, 3),
     {"strides": (3, 2, 1), "pads_begin": (2, 0, 1), "pads_end": (0, 1, 2),
      "output_padding": (2, 1, 0)}, 2),
    # dilation not coprime with the stride: phases that no tap reaches
    ("conv_transpose", (3, 2, 3),
     {"strides": 2, "dilations": 2, "pads_begin": (1, 0, 2), "pads_end": (2, 1, 0),
      "output_padding": 1}, "dw"),
    ("conv_transpose", (2, 3, 3),
     {"strides": (3, 2, 3), "dilations": (3, 4, 2), "output_padding": (0, 1, 2)}, 1),
    # kernel smaller than the stride
    ("conv_transpose", (1, 2, 1),
     {"strides": (3, 3, 2), "output_padding": (2, 1, 1)}, "dw2"),
    ("conv_transpose", (3, 4, 2),
     {"auto_pad": "same_upper", "strides": 2, "output_padding": 1}, 2),
    ("conv_transpose", (2, 3, 3),
     {"auto_pad": "same_lower", "strides": (3, 2, 2), "dilations": (2, 1, 2)}, "dw"),
    ("conv_transpose", (3, 3, 2),
     {"auto_pad": "valid", "strides": (2, 1, 3), "output_padding": (1, 0, 2)}, "dw2"),
    # pads larger than the kernel: phases cropped away at the start
    ("conv_transpose", (2, 3, 2),
     {"strides": 2, "pads_begin": (4, 3, 2), "pads_end": (0, 5, 1)}, 2),
    ("conv_transpose", (3, 3, 3),
     {"strides": 3, "pads_begin": 1, "pads_end": (2, 1, 0), "dst": True}, 1),
    ("conv_transpose", (3, 1, 2), {"strides": (1, 3, 1), "pads_begin": (1, 0, 0)}, "dw2"),
    # padding at the start only, the first tap's window all padding on the first axis
    ("conv_transpose", (3, 2, 3), {"dilations": (3, 1, 2), "pads_begin": (4, 0, 3)}, "dw"),
    ("conv_transpose", (3, 2, 3), {"dilations": 2, "pads_begin": 1}, 2),   # no stride
    ("convolution_backward_data", (3, 3, 2),
     {"strides": 2, "pads_begin": (1, 0, 1), "pads_end": (0, 1, 1), "dst": True}, 2),
    ("convolution_backward_data", (3, 2, 3),
     {"auto_pad": "same_upper", "strides": (2, 3, 2), "dst": True}, "dw"),
    ("convolution_backward_data", (4, 3, 2),
     {"strides": (3, 2, 2), "dilations": (2, 2, 1), "output_padding": (1, 1, 0)}, 3),
    ("convolution_backward_data", (2, 2, 3),
     {"auto_pad": "same_lower", "strides": 2, "dilations": (3, 1, 2), "dst": True}, 1),
)
_SMALL_BD = {1: (4,), 2: (3, 4), 3: (3, 2, 3)}


def _bd_channels(op, groups):
    """(channels of the op's data input, of its output, groups); ``dw``: one channel of the
    small tensor ``b`` per group."""
    if groups == "dw":
        return 3, 3, 3
    if groups == "dw2":
        return 2, 4, 2
    return {1: (3, 4, 1), 2: (4, 6, 2), 3: (6, 3, 3)}[groups]


def _bd_case(op, kernel, variant, groups, nd, fmt, wfmt):
    """Arrays (float64) and keyword arguments of one backward_data call, for ``op``."""
    rng = np.random.default_rng(zlib.crc32(repr((op, kernel, nd, fmt, wfmt)).encode()))
    cin, cout, g = _bd_channels(op, groups)
    kernel = kernel[:nd]
    attrs = {k: _per_axis(v, nd) for k, v in variant.items() if k != "dst"}
    attrs.update(data_format=fmt, weights_format=wfmt, groups=g)
    family = "convolution" if op.startswith("convolution") else "conv_transpose"
    # cin = Cb (diff_dst of the convolution family, src of conv_transpose), cout = Ca
    w = _weights(rng, cin, cout // g, kernel, wfmt, family)
    small = list(_SMALL_BD[nd])
    for _ in range(6):   # grow the input until the geometry is valid (large pads)
        shape = (2, *small, cin) if fmt == "NXC" else (2, cin, *small)
        try:
            plan = polyconv.infer_shape(op, shape, w.shape, **attrs)
            break
        except ValueError:
            small = [b + 1 for b in small]
    else:
        raise AssertionError("no valid geometry")
    if variant.get("dst"):
        grow = 1 if family == "conv_transpose" else 0
        sp = tuple(a + grow for a in plan.a_spatial)
        attrs["dst_shape"] = sp if nd % 2 else plan.with_(a_spatial=sp).a_shape
        plan = polyconv.infer_shape(op, shape, w.shape, **attrs)
    x = rng.uniform(-1, 1, shape)
    arrays = [x, rng.uniform(-1, 1, w.shape)]
    if family == "conv_transpose":
        arrays.append(rng.uniform(-1, 1, plan.a_channels))   # bias
    return plan, arrays, attrs


def _lowering_params(lowerings, applies):
    """Every lowering that ``applies(lowering, groups)`` on two variants per layout."""
    params = []
    for i, (nd, fmt, wfmt) in enumerate(_LAYOUTS):
        for j in range(2):
            v = (3 * i + 5 * j) % len(_BD_VARIANTS)
            op, kernel, variant, groups = _BD_VARIANTS[v]
            for lowering in lowerings:
                # an ungrouped-only lowering takes the variant's geometry without groups
                g = groups if applies(lowering, groups) else 1
                if applies(lowering, g):
                    params.append(pytest.param(op, kernel, variant, g, nd, fmt, wfmt, lowering,
                                               id=f"{lowering}-{nd}d-{fmt}-{wfmt}-v{v}-g{g}"))
    return params


#: the lowerings that compute ungrouped plans only
UNGROUPED_ONLY = ("matmul_overlap_add", "im2col", "taps")


def _applies(lowering, groups):
    """Whether a lowering computes plans of ``groups``: the ungrouped-only ones without
    groups, ``grouped`` (one problem per group) with them, every other one on all."""
    if lowering in UNGROUPED_ONLY:
        return groups == 1
    return lowering != "grouped" or groups != 1


def _bd_params():
    return _lowering_params(BACKWARD_DATA_LOWERINGS, _applies)


@pytest.mark.parametrize(("op", "kernel", "variant", "groups", "nd", "fmt", "wfmt", "lowering"),
                         _bd_params())
def test_backward_data_lowering_matches_the_oracle(op, kernel, variant, groups, nd, fmt, wfmt,
                                                   lowering):
    plan, arrays, attrs = _bd_case(op, kernel, variant, groups, nd, fmt, wfmt)
    assert plan.primitive == "backward_data"
    if lowering == "direct" and _plain.direct_aborts_xla_cpu(plan):
        pytest.skip("XLA CPU aborts compiling this lhs-dilated convolution (see "
                    "direct_aborts_xla_cpu); the other lowerings cover the geometry")
    assert _record_applies("backward_data", plan, lowering)
    with _forced(backward_data=lowering):
        y = getattr(polyconv, op)(*(jnp.asarray(a) for a in arrays), **attrs)
    ref = reference(op, *arrays, **attrs)
    assert y.shape == ref.shape
    assert_within_bound(np.asarray(y), ref.y, ref.abs_sum, ref.n, "float64")


@pytest.mark.parametrize("primitive", ["forward", "backward_data", "backward_weights"])
def test_the_grid_covers_every_lowering_and_geometry_feature(primitive):
    """Guard the grids: every lowering meets strides 1-3, mixed strides, dilations that
    share a factor with the stride, kernels smaller than the stride, every auto_pad,
    output_padding, dst_shape, groups and depthwise (where it computes grouped plans), both
    formats, all weights formats and ranks 1-3."""
    grid = FORWARD_LOWERINGS if primitive == "forward" else _choice.LOWERINGS[primitive]
    seen: dict[str, set] = {name: set() for name in grid}
    params = {"forward": _fw_params, "backward_data": _bd_params,
              "backward_weights": _bw_params}[primitive]
    for p in params():
        op, kernel, variant, groups, nd, fmt, wfmt, lowering = p.values
        plan, _, _ = _bd_case(op, kernel, variant, groups, nd, fmt, wfmt)
        features = seen[lowering]
        features.update({f"rank{nd}", fmt, wfmt, op, f"auto_pad={variant.get('auto_pad')}"})
        features.update(f"s{s}" for s in plan.strides)
        if len(set(plan.strides)) > 1:
            features.add("mixed strides")
        if any(np.gcd(d, s) > 1 and s > 1 for d, s in zip(plan.dilations, plan.strides)):
            features.add("d, s not coprime")
        if any(k < s for k, s in zip(plan.kernel, plan.strides)):
            features.add("k < s")
        if any(plan.output_padding):
            features.add("output_padding")
        if "dst" in variant:
            features.add("dst_shape")
        if plan.pads_begin != plan.pads_end:
            features.add("asymmetric pads")
        features.add("depthwise" if plan.b_channels == plan.groups > 1 else
                     "groups" if plan.groups > 1 else "no groups")
        if primitive != "backward_data":    # the windows of a (_common.windows)
            in_place = not _common.reads_past_end(plan)
            features.add("windows in place" if in_place else "padded copy")
            if in_place and any(-(-pb // s) >= bs for pb, s, bs in zip(
                    plan.pads_begin, plan.strides, plan.b_spatial)):   # the first tap's
                features.add("a window of padding only")
    common = {"rank1", "rank2", "rank3", "NXC", "NCX", "XIO", "OIX", "IOX", "XOI", "s1", "s2",
              "s3", "mixed strides", "k < s", "output_padding", "dst_shape",
              "asymmetric pads", "conv_transpose", "convolution_backward_data",
              "d, s not coprime", "depthwise", "groups", "auto_pad=same_upper",
              "auto_pad=same_lower", "auto_pad=valid", "auto_pad=None"}
    if primitive != "backward_data":
        common |= {"windows in place", "padded copy", "a window of padding only"}
    for lowering, features in seen.items():
        needed = common - ({"depthwise", "groups"} if lowering in UNGROUPED_ONLY else set())
        assert needed <= features, (lowering, sorted(needed - features))


@pytest.mark.parametrize("lowering", BACKWARD_DATA_LOWERINGS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_backward_data_lowering_low_precision(lowering, dtype):
    """f32 accumulation and one rounding at the end in every lowering
    (docs/numerics.md#accumulation)."""
    from oracle import random_array

    rng = np.random.default_rng(12)
    groups = 4 if lowering == "elementwise" else 2
    x = random_array(rng, (2, 5, 4, 4), dtype)                 # NXC, IC = 4
    w = random_array(rng, (3, 3, 8 // groups, 4), dtype)      # XOI: OC = 8
    bias = random_array(rng, (8,), dtype)
    attrs = {"strides": 2, "pads_begin": (1, 0), "pads_end": (0, 1), "output_padding": 1,
             "groups": groups}
    with _forced(backward_data=lowering):
        y = polyconv.conv_transpose(jnp.asarray(x), jnp.asarray(w), jnp.asarray(bias), **attrs)
    assert y.dtype == np.dtype(x.dtype)
    ref = reference("conv_transpose", x, w, bias, **attrs)
    assert_within_bound(np.asarray(y.astype(jnp.float64)), ref.y, ref.abs_sum, ref.n, dtype)


@pytest.mark.parametrize("lowering", BACKWARD_DATA_LOWERINGS)
@pytest.mark.parametrize("fmt", ["NXC", "NCX"])
def test_grad_and_vmap_through_each_backward_data_lowering(lowering, fmt):
    """jax.grad of conv_transpose through every lowering equals the backward ops; vmap over a
    leading axis equals a loop; both inside jit."""
    rng = np.random.default_rng(13)
    ungrouped = lowering in UNGROUPED_ONLY
    groups = 4 if lowering == "elementwise" else 1 if ungrouped else 2
    attrs = {"strides": (2, 3), "pads_begin": (1, 0), "pads_end": (0, 2),
             "output_padding": (1, 2), "dilations": (1, 2), "groups": groups,
             "data_format": fmt, "weights_format": "IOX"}
    x = jnp.asarray(_data(rng, 2, 4, (3, 4), fmt))
    w = jnp.asarray(rng.standard_normal((4, 8 // groups, 3, 2)))   # IOX [IC, OC/G, K..]
    bias = jnp.asarray(rng.standard_normal(8))
    y_shape = polyconv.infer_shape("ConvTranspose", x.shape, w.shape, **attrs).shape
    cot = jnp.asarray(rng.standard_normal(y_shape))

    @jax.jit
    def grads_and_ops(x, w, bias, cot):
        def loss(x, w, bias):
            return jnp.vdot(polyconv.conv_transpose(x, w, bias, **attrs), cot)

        return (jax.grad(loss, argnums=(0, 1, 2))(x, w, bias),
                (polyconv.conv_transpose_backward_data(cot, w, **attrs),
                 polyconv.conv_transpose_backward_weights(x, cot, w.shape, **attrs),
                 _bias_grad(cot, fmt)))

    with _forced(backward_data=lowering):
        grads, ops = grads_and_ops(x, w, bias, cot)
        stacked = jnp.stack([x, 2.0 * x - 1.0, -x])
        mapped = jax.jit(jax.vmap(lambda x: polyconv.conv_transpose(x, w, bias, **attrs)))(
            stacked)
        direct = [polyconv.conv_transpose(stacked[i], w, bias, **attrs) for i in range(3)]
    for grad, op in zip(grads, ops):
        _close(grad, op)
    for i in range(3):
        _close(mapped[i], direct[i])


def _convolutions(text: str) -> list[str]:
    return [line for line in text.splitlines() if "stablehlo.convolution" in line]


def _lhs_dilated(text: str) -> bool:
    """Whether any convolution in ``text`` dilates its input (the transposed slow path)."""
    return any(set(m.split(", ")) != {"1"}
               for m in re.findall(r"lhs_dilate = \[([^\]]*)\]", text))


def test_forcing_reaches_xla(monkeypatch):
    """What each forced lowering traces to (and that the setting is scoped). The plans are
    tiny: ``grouped``'s per-group problems are chosen as larger ones would be (the small-plan
    rule would leave them to the lhs-dilated convolution)."""
    monkeypatch.setattr(_policy, "SMALL_MACS", 0)
    rng = np.random.default_rng(14)
    x = jnp.asarray(rng.standard_normal((1, 4, 4, 4)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((3, 3, 2, 4)), jnp.float32)   # XOI, groups 2

    def hlo(groups, w=w):
        return _hlo(lambda x, w: polyconv.conv_transpose(x, w, strides=2, groups=groups), x, w)

    with _forced(backward_data="direct"):
        (conv,) = _convolutions(hlo(2))
        assert "lhs_dilate = [2, 2]" in conv and _lhs_dilated(conv)
    # one convolution per phase won no corpus row: the weight gradient's "phases" only
    with (pytest.raises(ValueError, match="no implementation 'jax:backward_data=phases'"),
          _forced(backward_data="phases")):
        pass
    with _forced(backward_data="subpixel"):
        (conv,) = _convolutions(hlo(2))
        assert not _lhs_dilated(conv)
    for lowering in ("phases_matmul", "subpixel_matmul"):
        with _forced(backward_data=lowering):
            text = hlo(2)
            assert not _convolutions(text) and "stablehlo.dot_general" in text
    with _forced(backward_data="phases_folded"):
        # one stride-1 convolution per phase of the second axis per phase of the first (2-D:
        # 1-D convolutions over the merged rows), none lhs-dilated, no matrix product
        text = hlo(2)
        convs = _convolutions(text)
        assert len(convs) == 4 and not _lhs_dilated(text) and "dot_general" not in text
        assert all("dim_numbers = [b, 0, f]x[i, o, 0]->[b, 0, f]" in c for c in convs)
    with _forced(backward_data="grouped"):   # one product per group
        # (16 channels per group: with fewer, the policy takes elementwise loops per group)
        text = _hlo(lambda x, w: polyconv.conv_transpose(x, w, strides=2, groups=2),
                    jnp.ones((1, 4, 4, 32), jnp.float32), jnp.ones((3, 3, 2, 32), jnp.float32))
        assert not _lhs_dilated(text)
        assert text.count("stablehlo.dot_general") + len(_convolutions(text)) >= 2
    with _forced(backward_data="elementwise"):
        text = hlo(2)
        assert not _convolutions(text) and "dot_general" not in text
        # not applicable (more than ELEMENTWISE_MAX_CHANNELS input channels per group): the
        # default choice instead
        wide = _elementwise.ELEMENTWISE_MAX_CHANNELS + 1
        text = _hlo(lambda x, w: polyconv.conv_transpose(x, w, strides=2),
                    jnp.ones((1, 4, 4, wide), jnp.float32), jnp.ones((3, 3, 2, wide), jnp.float32))
        assert _convolutions(text) or "dot_general" in text
        assert not _lhs_dilated(text)
    # a block's forcing adds to the enclosing one's, the inner item winning
    with _forced(backward_data="direct"), _forced(backward_data="phases_matmul"):
        assert not _lhs_dilated(hlo(2))


def test_forcing_from_the_environment(monkeypatch):
    rng = np.random.default_rng(15)
    x = jnp.asarray(rng.standard_normal((1, 4, 4, 2)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((3, 3, 4, 2)), jnp.float32)

    def text():
        return _hlo(lambda x, w: polyconv.conv_transpose(x, w, strides=2), x, w)

    monkeypatch.setenv("POLYCONV_IMPLEMENTATION", "jax:backward_data=phases_matmul")
    assert not _lhs_dilated(text())
    monkeypatch.setenv("POLYCONV_IMPLEMENTATION", " jax: backward_data = direct ")
    assert _lhs_dilated(text())
    monkeypatch.setenv("POLYCONV_IMPLEMENTATION", "jax:backward_data=nonesuch")
    with pytest.raises(ValueError, match="POLYCONV_IMPLEMENTATION: no implementation "
                                         "'jax:backward_data=nonesuch'"):
        text()
    with (pytest.raises(ValueError, match="implementation: no implementation "
                                          "'jax:forward=phases'"),
          _forced(forward="phases")):
        pass


def test_default_lowering_choice():
    """The measured heuristic (see polyconv_jax._policy): no strided backward_data is left
    to XLA's lhs-dilated convolution but channels-last ones wide on both sides, no depthwise
    one to XLA's grouped convolution."""
    choose = _policy.choose_backward_data

    def plan(src, w, **attrs):
        return polyconv.infer_shape("ConvTranspose", src, w, **attrs)

    assert choose(plan((8, 32, 32, 64), (3, 3, 64, 64))) == "direct"          # no stride
    # ungrouped, few channels read (b's) and few written: XLA CPU's convolution is slow there
    assert choose(plan((64, 28, 28, 6), (5, 5, 1, 6))) == "elementwise"       # LeNet's input
    assert choose(plan((16, 32, 32, 8), (3, 3, 16, 8))) == "elementwise"      # 8 x 16 = 128
    assert choose(plan((16, 32, 32, 8), (3, 3, 32, 8))) == "direct"           # 8 x 32
    assert choose(plan((16, 32, 32, 16), (3, 3, 1, 16))) == "direct"          # 16 read
    assert choose(plan((1, 16, 32, 32, 32), (3, 3, 3, 32, 32))) == "sliced"   # 3-D: 2-D ones
    # groups whose own problem would go elementwise: one elementwise program, not one a group
    assert choose(plan((1, 16, 32, 32, 32), (3, 3, 3, 8, 32), groups=4)) == "elementwise"
    assert choose(plan((1, 5, 5, 5, 20), (3, 3, 3, 4, 20), groups=4)) == "elementwise"
    assert choose(plan((8, 32, 32, 64), (3, 3, 16, 64), groups=4)) == "grouped"
    assert choose(plan((8, 32, 32, 512), (3, 3, 8, 512), groups=64)) == "direct"
    assert choose(plan((8, 32, 32, 64), (3, 3, 1, 64), strides=2, groups=64)) == "elementwise"
    assert choose(plan((8, 32, 32, 64), (3, 3, 1, 64), groups=64)) == "elementwise"
    assert choose(plan((8, 32, 32, 64), (3, 3, 2, 64), strides=2, groups=16)) == "elementwise"
    assert choose(plan((8, 32, 32, 64), (3, 3, 8, 64), strides=2, groups=8)) == "elementwise"
    # depthwise up-sampling whose phases fill one window (CenterNet's k4 s2 and k8 s4):
    # upsampled for channels-first data, or more than 4 phases; elementwise otherwise, and
    # wherever the window has zero taps (k3 s2) or a phase one tap (k2 s2, channels-first)
    ncx = {"data_format": "NCX", "weights_format": "IOX", "groups": 64}
    up = {"strides": 2, "pads_begin": 1, "pads_end": 1}
    assert choose(plan((4, 64, 64, 64), (64, 1, 4, 4), **up, **ncx)) == "upsampled"
    assert choose(plan((4, 64, 64, 64), (4, 4, 1, 64), **up, groups=64)) == "elementwise"
    assert choose(plan((4, 64, 32, 32), (64, 1, 8, 8), strides=4, pads_begin=2, pads_end=2,
                       **ncx)) == "upsampled"
    assert choose(plan((4, 32, 32, 64), (8, 8, 1, 64), strides=4, pads_begin=2, pads_end=2,
                       groups=64)) == "upsampled"
    assert choose(plan((4, 32, 2000), (32, 1, 16), strides=8, pads_begin=4, pads_end=4,
                       **{**ncx, "groups": 32})) == "upsampled"
    assert choose(plan((4, 64, 64, 64), (64, 1, 3, 3), **up, output_padding=1,
                       **ncx)) == "elementwise"
    assert choose(plan((8, 64, 56, 56), (64, 1, 2, 2), strides=2, **ncx)) == "elementwise"
    assert choose(plan((2, 8, 8, 512), (3, 3, 1, 512), strides=2, groups=64)) == "phases_matmul"
    assert choose(plan((8, 32, 32, 64), (2, 2, 64, 64), strides=2)) == "matmul_overlap_add"
    assert choose(plan((2, 16, 16, 16, 32), (3, 3, 3, 32, 32), strides=2)) == "matmul_overlap_add"
    assert choose(plan((2, 16, 16, 16, 16), (3, 3, 3, 16, 16), strides=2)) == "matmul_overlap_add"
    assert choose(plan((2, 16, 16, 16, 32), (4, 4, 4, 32, 32), strides=2)) == "matmul_overlap_add"
    assert (choose(plan((2, 4, 4, 4, 4, 32), (3, 3, 3, 3, 32, 32), strides=2))
            == "matmul_overlap_add")
    assert choose(plan((8, 32, 32, 16), (4, 4, 16, 16), strides=2)) == "subpixel"
    assert choose(plan((4, 4000, 256), (16, 128, 256), strides=8)) == "subpixel"
    for src, w, s in (((4, 4000, 256), (16, 128, 256), 8), ((8, 32, 32, 16), (3, 3, 16, 16), 2)):
        assert choose(plan(src, w, strides=s)) != "direct"
    # what no rule above takes: the lhs-dilated convolution where both sides are wide and
    # channels-last, else multiply first and overlap-add (the per-phase convolutions are gone)
    assert choose(plan((8, 32, 32, 64), (3, 3, 64, 64), strides=2)) == "direct"
    assert choose(plan((8, 32, 32, 64), (3, 3, 48, 64), strides=2)) == "matmul_overlap_add"
    assert choose(plan((8, 64, 32, 32), (64, 64, 3, 3), strides=2, data_format="NCX",
                       weights_format="IOX")) == "matmul_overlap_add"
    # ... but one product per tap over strided views in 1-D over wide channels-first data
    # (undilated: dilated ones stay with the overlap-add)
    assert choose(plan((4, 384, 750), (384, 384, 3), strides=2, data_format="NCX",
                       weights_format="IOX")) == "taps"
    assert choose(plan((4, 384, 750), (384, 384, 3), strides=2, dilations=2,
                       data_format="NCX", weights_format="IOX")) == "matmul_overlap_add"
    # over the whole test grid: never the sub-pixel lowerings with zero taps (NaN locality)
    for p in _bd_params():
        op, kernel, variant, groups, nd, fmt, wfmt, _ = p.values
        grid_plan, _, _ = _bd_case(op, kernel, variant, groups, nd, fmt, wfmt)
        choice = choose(grid_plan)
        assert _exact(grid_plan, choice)
        few_per_group = grid_plan.groups > 1 and grid_plan.b_channels // grid_plan.groups <= 4
        few = grid_plan.groups == 1 and grid_plan.b_channels <= 8 and (
            grid_plan.a_channels * grid_plan.b_channels <= 128)
        stride_one = all(s == 1 for s in grid_plan.strides) and not (few_per_group or few)
        sliced = stride_one and nd == 3 and grid_plan.groups == 1     # 2-D convolutions
        grouped = stride_one and grid_plan.groups > 1
        expect = "sliced" if sliced else "grouped" if grouped else choice
        assert (choice, choice == "direct") == (expect, stride_one and expect == "direct")
        assert (choice in ("elementwise", "upsampled")) == (few_per_group or few), grid_plan


# --------------------------------------------------------------------------------------------
# backward_weights lowerings: the same grid, as the weights gradients of those calls
# --------------------------------------------------------------------------------------------

BACKWARD_WEIGHTS_LOWERINGS = _choice.LOWERINGS["backward_weights"]


def _same_geometry_attrs(op, plan, attrs):
    """A grid call's attributes for another op of its family over the same geometry: no
    dst_shape; output_padding as dst_shape implied it (ConvTranspose family), or none (the
    Convolution family's src shape implies it)."""
    attrs = {k: v for k, v in attrs.items() if k != "dst_shape"}
    if op.startswith("convolution"):
        attrs.pop("output_padding", None)
    else:
        attrs["output_padding"] = plan.output_padding
    return attrs


def _assert_same_geometry(plan, other, primitive):
    assert other.primitive == primitive
    assert (other.a_spatial, other.b_spatial, other.pads_begin) == (
        plan.a_spatial, plan.b_spatial, plan.pads_begin)
_WEIGHTS_OP = {"conv_transpose": "conv_transpose_backward_weights",
               "convolution_backward_data": "convolution_backward_weights"}


def _bw_params():
    return _lowering_params(BACKWARD_WEIGHTS_LOWERINGS, _applies)


def test_default_forward_choice():
    """The CPU policy for forward convolutions (see polyconv_jax._policy.choose_forward)."""
    choose = _policy.choose_forward

    def plan(src, w, **attrs):
        return polyconv.infer_shape("convolution", src, w, pads_begin=1, pads_end=1, **attrs)

    assert choose(plan((8, 56, 56, 96), (3, 3, 1, 96), groups=96)) == "elementwise"
    assert choose(plan((4, 56, 56, 128), (3, 3, 4, 128), groups=32)) == "elementwise"
    # ungrouped, up to 4 input channels and Ca*Cb up to 128 (LeNet-5's first layer, 3->32)
    assert choose(plan((64, 28, 28, 1), (5, 5, 1, 6))) == "elementwise"
    assert choose(plan((32, 32, 32, 3), (3, 3, 3, 32))) == "elementwise"
    assert choose(plan((16, 32, 32, 8), (3, 3, 8, 16))) == "folded"           # 8 read
    assert choose(plan((4, 224, 224, 3), (7, 7, 3, 64), strides=2)) != "elementwise"  # 192
    # strided 2-D: folded compiles ~10x the plain call and gains nothing both records agree on
    assert choose(plan((4, 224, 224, 3), (7, 7, 3, 64), strides=2)) == "direct"
    # 1x1: one matrix product (XLA CPU's 1x1 convolution is slow), but not strided (there
    # it is as fast, and compiles less than the strided slice and product)
    assert choose(plan((4, 56, 56, 256), (1, 1, 256, 64))) == "im2col"
    assert choose(plan((4, 56, 56, 256), (1, 1, 256, 512), strides=2)) == "direct"
    # more channels per group: one ungrouped convolution per group, up to the bound
    assert choose(plan((4, 56, 56, 64), (3, 3, 16, 64), groups=4)) == "grouped"
    assert choose(plan((4, 56, 56, 256), (3, 3, 8, 256), groups=32)) == "grouped"
    assert choose(plan((4, 56, 56, 512), (3, 3, 8, 512), groups=64)) == "direct"
    # strided 3-D: gather patches, multiply once (XLA CPU's 3-D convolutions are slow) where
    # the patches are narrow or the windows apart; wide overlapping ones (27 windows of 32
    # channels) as 2-D problems, which compile in a third of the time and run as fast
    assert choose(plan((8, 32, 32, 32, 1), (3, 3, 3, 1, 64), strides=2)) == "im2col"
    assert choose(plan((8, 32, 32, 32, 2), (3, 3, 3, 2, 128), strides=2)) == "im2col"
    assert choose(plan((1, 32, 40, 48, 64), (2, 2, 2, 64, 128), strides=2)) == "im2col"
    assert choose(plan((1, 32, 32, 32, 32), (3, 3, 3, 32, 64), strides=2)) == "sliced"
    assert choose(plan((1, 32, 64, 64, 32), (3, 3, 3, 32, 32))) == "sliced"
    assert choose(plan((4, 56, 56, 64), (3, 3, 64, 64))) == "folded"          # 2-D NXC


def test_default_backward_weights_choice():
    """The CPU policy for weight gradients (see polyconv_jax._policy)."""
    choose = _policy.choose_backward_weights

    def plan(src, w, **attrs):
        return polyconv.infer_shape("convolution_backward_weights", src,
                                    polyconv.infer_shape("convolution", src, w, **attrs).shape,
                                    w, **attrs)

    # 2-D, no stride, from 64 channels on both sides: the first axis's taps folded
    assert choose(plan((4, 56, 56, 64), (3, 3, 64, 64), pads_begin=1, pads_end=1)) == "folded"
    assert choose(plan((1, 128, 128, 64), (3, 3, 64, 64), pads_begin=1, pads_end=1)) == "folded"
    # ... narrower: XLA's one convolution
    assert choose(plan((4, 56, 56, 4), (3, 3, 4, 4), pads_begin=1, pads_end=1)) == "direct"
    assert choose(plan((4, 56, 56, 32), (3, 3, 32, 32), pads_begin=1, pads_end=1)) == "direct"
    assert choose(plan((4, 56, 56, 64), (3, 3, 64, 32), pads_begin=1, pads_end=1)) == "direct"
    assert choose(plan((16, 16, 16, 128), (3, 3, 128, 64), pads_begin=1, pads_end=1)) == "folded"
    # patches copying the data at most 4 times (a stride, 1-D k3): gather, multiply once
    assert choose(plan((4, 56, 56, 128), (3, 3, 128, 128), strides=2)) == "im2col"
    assert choose(plan((4, 2048, 128), (3, 128, 64))) == "im2col"
    assert choose(plan((8, 56, 56, 96), (3, 3, 1, 96), groups=96)) == "depthwise"
    assert choose(plan((8, 56, 56, 64), (3, 3, 8, 64), groups=8)) == "grouped"
    # a channel multiplier (one src channel per group, two dst channels), and up to 8 channels
    # per group on both sides past the per-group lowering's 32 groups: elementwise, never XLA's
    # grouped weight-gradient convolution (seconds a call); ResNeXt-50's 32 groups of 4 per group
    assert choose(plan((8, 56, 56, 32), (3, 3, 1, 64), groups=32)) == "depthwise"
    assert choose(plan((8, 56, 56, 144), (3, 3, 1, 288), groups=144)) == "depthwise"
    # ... but groups of 2 channels or more on both sides in blocks (ResNeXt-101's 64x4d: 8.5x)
    assert choose(plan((4, 56, 56, 512), (3, 3, 8, 512), groups=64)) == "grouped"
    assert choose(plan((4, 56, 56, 128), (3, 3, 4, 128), groups=32)) == "grouped"
    assert choose(plan((2, 16, 16, 16, 32), (3, 3, 3, 32, 32), strides=2)) == "im2col"
    # 3-D without a stride: per tap of the first axis, 2-D weight gradients in pieces
    assert choose(plan((1, 32, 64, 64, 32), (3, 3, 3, 32, 32), pads_begin=1,
                       pads_end=1)) == "sliced"
    assert choose(plan((1, 32, 64, 64, 32), (3, 3, 3, 8, 32), pads_begin=1, pads_end=1,
                       groups=4)) == "grouped"
    # more pieces than a program should hold: not applicable
    big = plan((64, 64, 64, 64), (3, 3, 64, 64), pads_begin=1, pads_end=1)
    assert not _record_applies("backward_weights", big, "bands")
    assert choose(big) == "folded"


@pytest.mark.parametrize("fmt", ["NXC", "NCX"])
@pytest.mark.parametrize("nd", [2, 3])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_dot_lowerings_low_precision_both_layouts(dtype, nd, fmt):
    """The lowerings built on matrix products, in both layouts and 2-D/3-D: 16-bit operands
    reach XLA CPU's dot in every form it supports, with float32 accumulation."""
    from oracle import random_array

    rng = np.random.default_rng(23)
    attrs = {"strides": 2, "pads_begin": 1, "pads_end": 1, "output_padding": 1,
             "data_format": fmt, "weights_format": "XOI"}
    sp = (4,) * nd
    x = random_array(rng, (2, *sp, 6) if fmt == "NXC" else (2, 6, *sp), dtype)
    w = random_array(rng, (*(3,) * nd, 2, 6), dtype)              # XOI: OC 2, IC 6
    y_shape = polyconv.infer_shape("ConvTranspose", x.shape, w.shape, **attrs).shape
    dy = random_array(rng, y_shape, dtype)
    calls = [("backward_data", "matmul_overlap_add", "conv_transpose", (x, w), {}),
             ("forward", "im2col", "conv_transpose_backward_data", (dy, w), {}),
             ("backward_weights", "im2col", "conv_transpose_backward_weights",
              (x, dy), {"weights_shape": w.shape})]
    for primitive, lowering, op, args, extra in calls:
        with _forced(**{primitive: lowering}):
            y = getattr(polyconv, op)(*(jnp.asarray(a) for a in args), **extra, **attrs)
        assert y.dtype == np.dtype(x.dtype)
        ref = reference(op, *args, **extra, **attrs)
        assert_within_bound(np.asarray(y.astype(jnp.float64)), ref.y, ref.abs_sum, ref.n,
                            dtype)


# --------------------------------------------------------------------------------------------
# forward lowerings: the same grid, as the forward-direction op of those calls
# --------------------------------------------------------------------------------------------

#: forward lowerings of restricted geometries, with grids of their own
#: (tests/test_jax_space_to_depth.py)
RESTRICTED_FORWARD = ("space_to_depth", "matmul_overlap_add")
FORWARD_LOWERINGS = tuple(name for name in _choice.LOWERINGS["forward"]
                          if name not in RESTRICTED_FORWARD)
_FORWARD_OP = {"conv_transpose": "conv_transpose_backward_data",
               "convolution_backward_data": "convolution"}


def _fw_params():
    # elementwise: every grid plan has at most 6 channels per group
    return _lowering_params(FORWARD_LOWERINGS, _applies)


@pytest.mark.parametrize(("op", "kernel", "variant", "groups", "nd", "fmt", "wfmt", "lowering"),
                         _fw_params())
def test_forward_lowering_matches_the_oracle(op, kernel, variant, groups, nd, fmt, wfmt,
                                             lowering):
    plan, arrays, attrs = _bd_case(op, kernel, variant, groups, nd, fmt, wfmt)
    large = np.random.default_rng(19).uniform(-1, 1, plan.a_shape)
    attrs = _same_geometry_attrs(op, plan, attrs)
    forward_op = _FORWARD_OP[op]
    fplan = polyconv.infer_shape(forward_op, large.shape, arrays[1].shape, **attrs)
    _assert_same_geometry(plan, fplan, "forward")
    assert _record_applies("forward", fplan, lowering)
    with _forced(forward=lowering):
        y = getattr(polyconv, forward_op)(jnp.asarray(large), jnp.asarray(arrays[1]), **attrs)
    ref = reference(forward_op, large, arrays[1], **attrs)
    assert y.shape == ref.shape
    assert_within_bound(np.asarray(y), ref.y, ref.abs_sum, ref.n, "float64")


# channels-last forward problems whose taps read past the end of src: (src spatial, kernel,
# attributes). On CPU the elementwise lowering computes the stride-1 ones by regions of output
# rows, the strided ones whole; test_by_regions_computes_any_geometry splits them all.
_REGIONS = (
    ((9, 8), (3, 3), {"pads_begin": 1, "pads_end": 1}),
    ((11, 10), (3, 2), {"strides": (2, 3), "pads_begin": (2, 0), "pads_end": (1, 3)}),
    ((13,), (4,), {"dilations": 3, "pads_begin": 4, "pads_end": 5}),
    ((6, 7, 5), (3, 3, 2), {"strides": (1, 2, 1), "pads_begin": (1, 2, 0), "pads_end": 1}),
    ((5, 6), (2, 2), {"pads_begin": (3, 0), "pads_end": (0, 4)}),   # pads wider than the kernel
    ((4, 4), (5, 5), {"pads_begin": 2, "pads_end": 2}),             # no row reads no zero
)


@pytest.mark.parametrize(("spatial", "kernel", "attrs"), _REGIONS)
@pytest.mark.parametrize("channels", [3, 6])
@pytest.mark.parametrize("op", ["convolution", "conv_transpose"])
def test_elementwise_by_regions_matches_the_oracle(op, spatial, kernel, attrs, channels,
                                                   monkeypatch):
    """The elementwise forward by regions of output rows (:func:`_elementwise.by_regions`), and
    the stride-1 elementwise backward_data through it (a ConvTranspose, as the forward
    convolution of its flipped, transposed kernel): the oracle's values, and a NaN or
    infinity in src reaching exactly the outputs that read it; depthwise (3 groups of 1) and
    2 channels per group, with a channel multiplier."""
    strided = set(np.ravel(attrs.get("strides", 1))) != {1}
    if op == "conv_transpose" and strided:
        pytest.skip("strided backward_data is computed by phases")
    rng = np.random.default_rng(29)
    jax.clear_caches()                  # the regions are taken when a program is traced
    monkeypatch.setattr(_elementwise, "REGIONS_MIN_MACS", 0)    # these plans are small
    calls = []
    monkeypatch.setattr(_elementwise, "by_regions",
                        lambda *args, by=_elementwise.by_regions: calls.append(1) or by(*args))
    # conv_transpose: IOX weights [IC, OC/G, K..], its IC is the channels of its src
    attrs = {**attrs, "groups": 3, "data_format": "NXC",
             "weights_format": "OIX" if op == "convolution" else "IOX"}
    x = rng.uniform(-1, 1, (2, *spatial, channels))
    w = rng.uniform(0.5, 1, (channels, 2, *kernel) if op == "conv_transpose"
                    else (6, channels // 3, *kernel))
    primitive = "forward" if op == "convolution" else "backward_data"
    ref = reference(op, x, w, **attrs)
    with _forced(**{primitive: "elementwise"}):
        y = getattr(polyconv, op)(jnp.asarray(x), jnp.asarray(w), **attrs)
    # strided convolutions keep the whole output; a ConvTranspose whose pads are wider than
    # its kernel computes by phases
    whole = strided or (op == "conv_transpose" and spatial == (5, 6))
    assert bool(calls) != whole, "the regions were not taken where they apply"
    assert_within_bound(np.asarray(y), ref.y, ref.abs_sum, ref.n, "float64")
    point = (1, *(n // 2 for n in spatial), channels - 1)
    for corner in (point, (1, *(n - 1 for n in spatial), 0)):
        one = np.zeros_like(x)
        one[corner] = 1.0
        hit = reference(op, one, w, **attrs).y != 0
        for value in (np.nan, np.inf):
            poisoned = x.copy()
            poisoned[corner] = value
            with _forced(**{primitive: "elementwise"}):
                y = np.asarray(getattr(polyconv, op)(jnp.asarray(poisoned), jnp.asarray(w),
                                                     **attrs))
            assert np.array_equal(~np.isfinite(y), hit), (corner, value)


@pytest.mark.parametrize(("spatial", "kernel", "attrs"), _REGIONS)
def test_by_regions_computes_any_geometry(spatial, kernel, attrs):
    """:func:`_elementwise.by_regions` itself, strided geometries included (which the default
    lowering computes whole): the oracle's values."""
    from functools import partial

    rng = np.random.default_rng(31)
    attrs = {**attrs, "groups": 3, "data_format": "NXC", "weights_format": "OIX"}
    x = rng.uniform(-1, 1, (2, *spatial, 3))
    w = rng.uniform(-1, 1, (6, 1, *kernel))
    plan = polyconv.infer_shape("Convolution", x.shape, w.shape, **attrs).with_(dtype="float64")
    terms = partial(_elementwise._elementwise_terms, precision=None, w=jnp.asarray(w))
    y = jax.jit(lambda a: _elementwise.by_regions(plan, a, terms))(jnp.asarray(x))
    ref = reference("convolution", x, w, **attrs)
    assert_within_bound(np.asarray(y), ref.y, ref.abs_sum, ref.n, "float64")


@pytest.mark.parametrize("lowering", FORWARD_LOWERINGS)
@pytest.mark.parametrize("fmt", ["NXC", "NCX"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_forward_lowering_low_precision(lowering, fmt, dtype):
    """float32 accumulation and one rounding at the end in every forward lowering, 16-bit
    data in both layouts (docs/numerics.md#accumulation); a stride and uneven pads on the
    second axis (the folded lowering's merged one)."""
    from oracle import random_array

    rng = np.random.default_rng(24)
    groups = 1 if lowering in UNGROUPED_ONLY else 2
    attrs = {"strides": (1, 2), "pads_begin": (1, 0), "pads_end": (1, 2), "groups": groups,
             "data_format": fmt, "weights_format": "OIX"}
    x = random_array(rng, (2, 7, 9, 4) if fmt == "NXC" else (2, 4, 7, 9), dtype)
    w = random_array(rng, (6, 4 // groups, 3, 3), dtype)
    bias = random_array(rng, (6,), dtype)
    with _forced(forward=lowering):
        y = polyconv.convolution(jnp.asarray(x), jnp.asarray(w), jnp.asarray(bias), **attrs)
    assert y.dtype == np.dtype(x.dtype)
    ref = reference("convolution", x, w, bias, **attrs)
    assert_within_bound(np.asarray(y.astype(jnp.float64)), ref.y, ref.abs_sum, ref.n, dtype)


@pytest.mark.parametrize(("op", "kernel", "variant", "groups", "nd", "fmt", "wfmt", "lowering"),
                         _bw_params())
def test_backward_weights_lowering_matches_the_oracle(op, kernel, variant, groups, nd, fmt, wfmt,
                                                      lowering, monkeypatch, request):
    # runs of a few output positions, so that ``bands`` cuts the grid's small images into
    # several runs of rows, pads inside some and not others
    monkeypatch.setattr(_plain, "BAND_POSITIONS", 5)
    plan, arrays, attrs = _bd_case(op, kernel, variant, groups, nd, fmt, wfmt)
    small = arrays[0]
    w_shape = arrays[1].shape
    large = np.random.default_rng(16).uniform(-1, 1, plan.a_shape)
    attrs = _same_geometry_attrs(op, plan, attrs)
    weights_op = _WEIGHTS_OP[op]
    # src, diff_dst
    inputs = (large, small) if weights_op == "convolution_backward_weights" else (small, large)
    wplan = polyconv.infer_shape(weights_op, *(x.shape for x in inputs), w_shape, **attrs)
    _assert_same_geometry(plan, wplan, "backward_weights")
    ref = reference(weights_op, *inputs, weights_shape=w_shape, **attrs)
    # the im2col lowering gathers the grid's few channels channels-first from channels-last
    # data; with the threshold at 0 it gathers them channel-minor, as for many channels,
    # and multiplies channels-last patches as b's transpose times them (ratio 0) or as they
    # lie (ratio inf); channels-first b goes on the left of the product (ratio 0) or on the
    # right (inf), one image at a time (0 rows) or with the batch contracted too (inf)
    variants = [(_patches.PATCHES_CHANNELS_FIRST_MAX,
                 _patches.PATCHES_TRANSPOSED_MIN_RATIO,
                 _patches.PATCHES_LEFT_MIN_RATIO,
                 _patches.PATCHES_PER_IMAGE_MIN_ROWS)]
    if lowering == "im2col":
        variants += ([(0, 0.0, 1.0, math.inf), (0, math.inf, 1.0, math.inf)] if fmt == "NXC"
                     else [(0, 1.0, 0.0, 0), (0, 1.0, math.inf, 0),
                           (0, 1.0, 0.0, math.inf), (0, 1.0, math.inf, math.inf)])
        request.addfinalizer(jax.clear_caches)   # no program of the patched ones outlives it
    for first, ratio, left, per_image in variants:
        monkeypatch.setattr(_patches, "PATCHES_CHANNELS_FIRST_MAX", first)
        monkeypatch.setattr(_patches, "PATCHES_TRANSPOSED_MIN_RATIO", ratio)
        monkeypatch.setattr(_patches, "PATCHES_LEFT_MIN_RATIO", left)
        monkeypatch.setattr(_patches, "PATCHES_PER_IMAGE_MIN_ROWS", per_image)
        if len(variants) > 1:
            jax.clear_caches()  # the constants are read when a program is traced
        with _forced(backward_weights=lowering):
            y = getattr(polyconv, weights_op)(*(jnp.asarray(x) for x in inputs), w_shape,
                                              **attrs)
        assert y.shape == ref.shape == w_shape
        assert_within_bound(np.asarray(y), ref.y, ref.abs_sum, ref.n, "float64")


@pytest.mark.parametrize(("lowering", "ratio", "fmt"),
                         [(name, math.inf, "NXC") for name in BACKWARD_WEIGHTS_LOWERINGS]
                         + [("im2col", 0.0, "NXC"), ("im2col", 0.0, "NCX")])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_backward_weights_lowering_low_precision(lowering, ratio, fmt, dtype, monkeypatch,
                                                 request):
    from oracle import random_array

    # im2col's three products, channel-minor patches multiplied as they lie (ratio
    # inf) and b's transpose times them (ratio 0); channels-first b times the patches, one
    # image at a time (NCX, ratio 0); the other lowerings ignore the constants
    monkeypatch.setattr(_patches, "PATCHES_CHANNELS_FIRST_MAX", 0)
    monkeypatch.setattr(_patches, "PATCHES_TRANSPOSED_MIN_RATIO", ratio)
    monkeypatch.setattr(_patches, "PATCHES_LEFT_MIN_RATIO", ratio)
    monkeypatch.setattr(_patches, "PATCHES_PER_IMAGE_MIN_ROWS", ratio)
    jax.clear_caches()          # the constants are read when a program is traced
    request.addfinalizer(jax.clear_caches)

    rng = np.random.default_rng(17)
    groups = 4 if lowering == "depthwise" else 2
    attrs = {"strides": 2, "pads_begin": (1, 0), "pads_end": (0, 1), "output_padding": 1,
             "groups": groups, "data_format": fmt}
    x = random_array(rng, (2, 5, 4, 4) if fmt == "NXC" else (2, 4, 5, 4), dtype)   # IC = 4
    w_shape = (3, 3, 8 // groups, 4)                            # XOI: OC = 8
    dy_shape = polyconv.infer_shape("ConvTranspose", x.shape, w_shape, **attrs).shape
    dy = random_array(rng, dy_shape, dtype)
    with _forced(backward_weights=lowering):
        y = polyconv.conv_transpose_backward_weights(jnp.asarray(x), jnp.asarray(dy), w_shape,
                                                     **attrs)
    assert y.dtype == np.dtype(x.dtype)
    ref = reference("conv_transpose_backward_weights", x, dy, weights_shape=w_shape, **attrs)
    assert_within_bound(np.asarray(y.astype(jnp.float64)), ref.y, ref.abs_sum, ref.n, dtype)


# channels-last depthwise weight gradients large enough to be summed in blocks of positions
# (src spatial, src channels, groups, kernel, strides; "same" pads); a last one too small
_DEPTHWISE_BLOCKED = (
    ((32, 32), 6, 6, (3, 3), 1),          # 2048 positions: the 9 products in one reduction
    ((64, 64), 6, 3, (3, 3), 2),          # 2 channels in a group, strided: 18 products in 4
    ((1024,), 4, 4, (7,), 1),             # one spatial axis, 7 products in one reduction
    ((16, 16, 10), 2, 2, (3, 3, 3), 1),   # 3-D: 27 products, 6 reductions
    ((13, 11), 6, 6, (3, 3), 1),          # 2 * 11 * 9 positions: the whole-row reduction
)


def _check_weights_lowering(lowering, rng, x, plan, w_shape, attrs, dtype):
    """convolution_backward_weights of ``x`` and a random ``dy`` with ``lowering`` forced:
    the input dtype, and the float64 oracle's values within the bound."""
    from oracle import random_array

    dy = random_array(rng, plan.shape, dtype)
    with _forced(backward_weights=lowering):
        y = polyconv.convolution_backward_weights(jnp.asarray(x), jnp.asarray(dy), w_shape,
                                                  **attrs)
    assert y.dtype == np.dtype(x.dtype)
    ref = reference("convolution_backward_weights", x, dy, weights_shape=w_shape, **attrs)
    assert_within_bound(np.asarray(y.astype(jnp.float64)), ref.y, ref.abs_sum, ref.n, dtype)


@pytest.mark.parametrize(("spatial", "channels", "groups", "kernel", "strides"),
                         _DEPTHWISE_BLOCKED)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_depthwise_weights_in_blocks_of_positions_match_the_oracle(spatial, channels, groups,
                                                                   kernel, strides, dtype):
    """The depthwise weight gradient summed in blocks of positions, in reductions of a few
    products each (the grid's small problems take the whole-row reduction): the oracle's
    values, in float32 and bfloat16, one, two and three spatial axes."""
    from oracle import random_array

    rng = np.random.default_rng(23)
    attrs = {"strides": strides, "pads_begin": 1 if kernel[0] == 3 else 3, "groups": groups,
             "pads_end": 1 if kernel[0] == 3 else 3, "data_format": "NXC", "weights_format": "OIX"}
    x = random_array(rng, (2, *spatial, channels), dtype)
    w_shape = (groups, channels // groups, *kernel)        # one dst channel per group
    plan = polyconv.infer_shape("Convolution", x.shape, w_shape, **attrs)
    positions = 2 * math.prod(plan.shape[1:-1])
    blocked = positions // _elementwise.DEPTHWISE_BLOCK >= 256
    assert blocked == (spatial != (13, 11))
    assert not blocked or positions % _elementwise.DEPTHWISE_BLOCK == 0
    _check_weights_lowering("depthwise", rng, x, plan, w_shape, attrs, dtype)


@pytest.mark.parametrize(("nd", "fmt", "wfmt"), [(1, "NCX", "OIX"), (2, "NXC", "XIO"),
                                                (2, "NCX", "IOX"), (3, "NXC", "XOI")])
@pytest.mark.parametrize(("bound", "groups", "per_group"), [(1, 4, (2, 3)), (2, 4, (3, 2)),
                                                             (2, 6, (2, 2))])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_grouped_weights_in_blocks_of_groups_match_the_oracle(nd, fmt, wfmt, bound, groups,
                                                              per_group, dtype, monkeypatch,
                                                              request):
    """Past the per-group bound (patched down to 1 and 2 groups here) the ``grouped`` weight
    gradient takes its groups in blocks (one ungrouped weight gradient per block, the
    products across groups dropped): the oracle's values, with a stride, a dilation and
    asymmetric pads, every layout."""
    from oracle import random_array

    monkeypatch.setattr(_grouped, "GROUPED_MAX_GROUPS", bound)
    jax.clear_caches()          # the bound is read when a program is traced
    request.addfinalizer(jax.clear_caches)
    rng = np.random.default_rng(29)
    ca, cb = groups * per_group[0], groups * per_group[1]
    attrs = {"strides": (2, 1, 2)[:nd], "dilations": (1, 2, 1)[:nd], "pads_begin": 1,
             "pads_end": (0, 2, 1)[:nd], "groups": groups, "data_format": fmt,
             "weights_format": wfmt}
    spatial = (7, 6, 5)[:nd]
    x = random_array(rng, (2, *spatial, ca) if fmt == "NXC" else (2, ca, *spatial), dtype)
    sizes = {"O": (cb,), "I": (per_group[0],), "X": (3, 2, 2)[:nd]}
    w_shape = tuple(itertools.chain.from_iterable(sizes[c] for c in wfmt))
    plan = polyconv.infer_shape("Convolution", x.shape, w_shape, **attrs)
    assert _record_applies("backward_weights", plan.with_(primitive="backward_weights"), "grouped")
    assert _grouped.group_block(plan) == -(-groups // bound) > 1     # blocks of several groups
    _check_weights_lowering("grouped", rng, x, plan, w_shape, attrs, dtype)


@pytest.mark.parametrize(("fmt", "strides", "positions", "max_pieces", "chunks"), [
    ("NXC", 1, 3 * 12, 64, [3, 3, 3, 1]),       # 3 images of 4x3 per piece, the last short
    ("NCX", (2, 1, 1), 12, 64, [1] * 6),        # one image each
    ("NXC", 1, 12, 6, [5, 5]),                  # at most 6 pieces in all: 2 per tap, larger
])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sliced_weights_in_pieces_match_the_oracle(fmt, strides, positions, max_pieces,
                                                   chunks, dtype, monkeypatch):
    """The ``sliced`` weight gradient cuts each tap's merged batch into pieces (the grid's
    small problems take one): the oracle's values, with pieces of one and several images,
    a short last piece, and pieces grown to keep their count within the bound."""
    from oracle import random_array

    monkeypatch.setattr(_sliced, "SLICE_PIECE_POSITIONS", positions)
    monkeypatch.setattr(_sliced, "SLICE_MAX_PIECES", max_pieces)
    rng = np.random.default_rng(29)
    attrs = {"strides": strides, "pads_begin": (1, 0, 1), "pads_end": (0, 1, 1),
             "dilations": (1, 2, 1), "data_format": fmt, "weights_format": "OIX"}
    spatial = (6, 5, 3)             # outputs: 5 or 3 rows of 4x3 images
    x = random_array(rng, (2, *spatial, 3) if fmt == "NXC" else (2, 3, *spatial), dtype)
    w_shape = (4, 3, 3, 2, 3)
    plan = polyconv.infer_shape("Convolution", x.shape, w_shape, **attrs)
    images = 2 * plan.b_spatial[0]
    chunk = _sliced.slice_chunk(plan)
    assert [min(chunk, images - i) for i in range(0, images, chunk)] == chunks
    _check_weights_lowering("sliced", rng, x, plan, w_shape, attrs, dtype)


@pytest.mark.parametrize("lowering", BACKWARD_WEIGHTS_LOWERINGS)
def test_grad_of_conv_transpose_with_each_backward_weights_lowering(lowering):
    """The backward_weights lowerings give jax.grad's weights gradient (and are traceable
    under jit and vmap)."""
    rng = np.random.default_rng(18)
    ungrouped = lowering in UNGROUPED_ONLY
    groups = 4 if lowering == "depthwise" else 1 if ungrouped else 2
    attrs = {"strides": (2, 3), "pads_begin": (1, 0), "pads_end": (0, 2),
             "output_padding": (1, 2), "dilations": (1, 2), "groups": groups,
             "data_format": "NCX", "weights_format": "XIO"}
    x = jnp.asarray(_data(rng, 2, 4, (3, 4), "NCX"))
    w = jnp.asarray(rng.standard_normal((3, 2, 4, 8 // groups)))   # XIO [K.., IC, OC/G]
    y_shape = polyconv.infer_shape("ConvTranspose", x.shape, w.shape, **attrs).shape
    cots = jnp.asarray(rng.standard_normal((3, *y_shape)))
    grad = jax.vmap(jax.grad(lambda w, cot: jnp.vdot(polyconv.conv_transpose(x, w, **attrs),
                                                     cot)), in_axes=(None, 0))(w, cots)
    with _forced(backward_weights=lowering):
        ops = jax.jit(jax.vmap(lambda cot: polyconv.conv_transpose_backward_weights(
            x, cot, w.shape, **attrs)))(cots)
    _close(grad, ops)


@pytest.mark.parametrize("lowering", BACKWARD_DATA_LOWERINGS)
@pytest.mark.parametrize(("kernel", "strides", "groups"),
                         [((3, 2), (2, 3), 2), ((4, 3), (2, 3), 2), ((3, 3), (2, 2), 4),
                          ((3, 3), (2, 2), 1)])
def test_nan_reaches_exactly_the_outputs_that_read_it(lowering, kernel, strides, groups):
    """A NaN or infinity in ``b`` poisons exactly the outputs that read it (no products with
    zero taps), in every lowering -- except those that form the phases' common window
    (``subpixel``, ``subpixel_matmul``, ``upsampled``) when it has zero taps (not
    :func:`subpixel_is_exact`), which the default choice never uses."""
    rng = np.random.default_rng(19)
    attrs = {"strides": strides, "pads_begin": (1, 0), "pads_end": (0, 1), "groups": groups,
             "data_format": "NCX", "weights_format": "IOX"}
    cin = groups if lowering == "elementwise" and groups > 1 else 2 * groups
    x = rng.uniform(-1, 1, (2, cin, 4, 3))
    w = rng.uniform(0.5, 1, (cin, 2, *kernel))                 # IOX [IC, OC/G, K..]
    plan = polyconv.infer_shape("ConvTranspose", x.shape, w.shape, **attrs)
    if not _record_applies("backward_data", plan, lowering):
        pytest.skip(f"{lowering} does not apply")
    one = np.zeros_like(x)
    one[1, 1, 2, 1] = 1.0
    hit = np.asarray(polyconv.conv_transpose(one, np.abs(w), backend="jax", **attrs)) != 0
    for value in (np.nan, np.inf):
        poisoned = x.copy()
        poisoned[1, 1, 2, 1] = value
        with _forced(backward_data=lowering):
            y = np.asarray(polyconv.conv_transpose(jnp.asarray(poisoned), jnp.asarray(w),
                                                   **attrs))
        local = np.array_equal(~np.isfinite(y), hit)
        if not _exact(plan, lowering):
            assert not local   # the documented exception
        else:
            assert local, (lowering, value)
    choice = _policy.choose_backward_data(plan)
    assert choice != "direct"
    assert _exact(plan, choice)


# --------------------------------------------------------------------------------------------
# one padded row for unpadded 2-D convolutions on CPU (_xla._conv_general)
# --------------------------------------------------------------------------------------------


@pytest.fixture
def pad_every_unpadded_conv(monkeypatch):
    """Take the one-padded-row path for every unpadded 2-D convolution, however small
    (compiled executables are dropped before and after, so none is reused across the
    threshold)."""
    jax.clear_caches()
    monkeypatch.setattr(_xla, "PAD_FAST_PATH_MACS", 0)
    # the forward convolution itself (the policy takes elementwise loops for so few channels)
    with _forced(forward="direct"):
        yield
    jax.clear_caches()


def _padded_convs(fn, *args) -> list[str]:
    """The ``pad = ...`` of every convolution in ``fn``'s lowered (CPU) StableHLO."""
    text = jax.jit(fn).lower(*args).as_text()
    return re.findall(r"convolution\(.*?pad = (\[\[[^]]*\](?:, \[[^]]*\])*\])", text)


# (op, src or diff_dst shape NXC, weights, attrs): unpadded 2-D calls of each primitive, with
# strides where the new row adds an output row, where it does not, and on mixed axes
_UNPADDED_2D = [
    ("convolution", (2, 7, 6, 3), (3, 2, 3, 4), {}),
    ("convolution", (2, 7, 8, 3), (3, 3, 3, 4), {"strides": (2, 3)}),
    ("convolution", (2, 8, 7, 3), (2, 3, 3, 4), {"strides": 2, "dilations": (1, 2)}),
    ("convolution", (2, 7, 6, 3), (3, 2, 3, 4), {"auto_pad": "valid", "strides": (1, 2)}),
    ("conv_transpose_backward_data", (2, 9, 7, 3), (3, 3, 3, 4), {"strides": 2}),
    ("convolution_backward_weights", (2, 7, 6, 3), (3, 2), {}),
    ("convolution_backward_weights", (2, 9, 7, 3), (3, 3), {"strides": 2}),
    ("conv_transpose_backward_weights", (2, 4, 3, 3), (3, 2), {"strides": 2}),
]


def _unpadded_case(rng, op, src, w, attrs, fmt):
    """Inputs (NXC ``src`` moved to ``fmt``) and attributes of one ``_UNPADDED_2D`` call."""
    attrs = {**attrs, "data_format": fmt}
    x = rng.uniform(-1, 1, src if fmt == "NXC" else (src[0], src[-1], *src[1:-1]))
    if not op.endswith("backward_weights"):
        return [x, rng.uniform(-1, 1, w)], attrs
    # the weights gradients: diff_dst from the forward op, with 5 output channels
    forward, weights = (("convolution", (*w, src[-1], 5)) if op.startswith("convolution")
                        else ("conv_transpose", (*w, 5, src[-1])))
    diff_dst = polyconv.infer_shape(forward, x.shape, weights, **attrs).shape
    return [x, rng.uniform(-1, 1, diff_dst)], {**attrs, "weights_shape": w}


@pytest.mark.usefixtures("pad_every_unpadded_conv")
@pytest.mark.parametrize("fmt", ["NXC", "NCX"])
@pytest.mark.parametrize(("op", "src", "w", "attrs"), _UNPADDED_2D)
def test_one_padded_row_matches_the_oracle(op, src, w, attrs, fmt):
    rng = np.random.default_rng(zlib.crc32(f"{op}{src}{fmt}".encode()))
    arrays, attrs = _unpadded_case(rng, op, src, w, attrs, fmt)
    fn = getattr(polyconv, op)
    pads = _padded_convs(lambda *xs: fn(*xs, **attrs), *map(jnp.asarray, arrays))
    assert "[[0, 1], [0, 0]]" in pads or "[[0, 0], [0, 1]]" in pads, pads
    y = fn(*(jnp.asarray(a) for a in arrays), **attrs)
    ref = reference(op, *arrays, **attrs)
    assert_within_bound(np.asarray(y), ref.y, ref.abs_sum, ref.n, "float64")


@pytest.mark.usefixtures("pad_every_unpadded_conv")
def test_one_padded_row_under_grad_vmap_and_nan():
    rng = np.random.default_rng(31)
    x = rng.uniform(-1, 1, (2, 7, 6, 3))
    w = rng.uniform(-1, 1, (3, 2, 3, 4))
    dy = rng.uniform(-1, 1, (2, 5, 5, 4))

    def loss(x, w):
        return jnp.vdot(polyconv.convolution(x, w), jnp.asarray(dy))

    gx, gw = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.asarray(x), jnp.asarray(w))
    for got, op, args, extra in (
            (gx, "convolution_backward_data", (dy, w), {"dst_shape": x.shape}),
            (gw, "convolution_backward_weights", (x, dy), {"weights_shape": w.shape})):
        ref = reference(op, *args, **extra)
        assert_within_bound(np.asarray(got), ref.y, ref.abs_sum, ref.n, "float64")
    xs = jnp.asarray(np.stack([x, -x, 2 * x]))
    got = jax.vmap(lambda x: polyconv.convolution(x, jnp.asarray(w)))(xs)
    for i in range(3):
        _close(got[i], polyconv.convolution(xs[i], jnp.asarray(w)))
    poisoned = x.copy()
    poisoned[1, 6, 5, 2] = np.nan        # the last row and column: read by one output only
    y = np.asarray(polyconv.convolution(jnp.asarray(poisoned), jnp.asarray(w)))
    bad = np.argwhere(np.isnan(y))
    assert {tuple(i[:3]) for i in bad} == {(1, 4, 4)}


def test_one_padded_row_is_taken_where_it_pays():
    """On CPU, the plain call (``direct``, forced: the policy may decompose these plans): an
    unpadded 2-D convolution with overlapping windows and 10^8 multiply-adds or more; not a
    grouped one, a 1-D or 3-D one, a padded one, or non-overlapping windows."""
    def pads(shape, kernel, **attrs):
        x = jax.ShapeDtypeStruct(shape, jnp.float32)
        w = jax.ShapeDtypeStruct(kernel, jnp.float32)
        with _forced(forward="direct"):
            return _padded_convs(lambda x, w: polyconv.convolution(x, w, **attrs), x, w)

    assert pads((8, 58, 58, 64), (3, 3, 64, 64)) == ["[[0, 1], [0, 0]]"]
    # stride 2 on 57 rows: the new row is skipped, so the first axis gets it, no slice
    assert pads((8, 113, 114, 64), (3, 3, 64, 64), strides=2) == ["[[0, 1], [0, 0]]"]
    assert pads((8, 114, 113, 64), (3, 3, 64, 64), strides=2) == ["[[0, 0], [0, 1]]"]
    assert pads((1, 18, 18, 64), (3, 3, 64, 64)) == ["[[0, 0], [0, 0]]"]         # small
    assert pads((8, 64, 64, 256), (2, 2, 256, 256), strides=2) == ["[[0, 0], [0, 0]]"]
    assert pads((8, 58, 58, 64), (3, 3, 64, 64), pads_begin=1) == ["[[1, 0], [1, 0]]"]
    assert pads((8, 58, 58, 64), (3, 3, 8, 64), groups=8) == ["[[0, 0], [0, 0]]"]   # grouped
    assert pads((8, 4000, 256), (16, 256, 128)) == ["[[0, 0]]"]


@pytest.mark.parametrize("src, shape", [
    ((2, 3, 4, 5), (6, 20)),            # runs of adjacent axes merged
    ((2, 3, 1, 4), (6, 4)),             # a unit axis merged away
    ((6, 4), (6, 1, 4)),                # a unit axis inserted: not a merge
    ((6, 4), (2, 3, 4)),                # a split: not a merge
    ((2, 6), (4, 3)),                   # neither
])
def test_merge_reshapes_to_any_shape(src, shape):
    # the sharding-friendly reshape merges one run of axes at a time; a shape that is not a
    # merge of adjacent axes must still come out (it used to loop forever)
    x = np.arange(math.prod(src), dtype=np.float32).reshape(src)
    np.testing.assert_array_equal(np.asarray(_xla._merge(jnp.asarray(x), shape)),
                                  x.reshape(shape))


# --------------------------------------------------------------------------------------------
# weights rearranged once, not fused into the elementwise loops (_xla.rearranged_once)
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_rearranged_once_moves_every_value_unchanged(dtype):
    """A transpose and reshape by :func:`_xla.rearranged_once` equals numpy's bit for bit on
    signed zeros, infinities, NaN payloads, subnormals and the extremes, jitted and under
    vmap, and its derivative is the rearranged cotangent."""
    dt = jnp.dtype(dtype)
    info = jnp.finfo(dt)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, float(info.smallest_subnormal),
                        -float(info.smallest_subnormal), float(info.max), float(info.min)])
    bits = np.dtype(f"u{dt.itemsize}")
    values = np.random.default_rng(24).standard_normal(2 * 3 * 4 * 5).astype(dt)
    values[: special.size] = special.astype(dt)
    values.view(bits)[special.size] = 0x7FC1 if dt.itemsize == 2 else 0x7FC00123  # a payload
    x = values.reshape(2, 3, 4, 5)

    def rearrange(v):
        return v.transpose(2, 0, 3, 1).reshape(4, 10, 3)

    want = rearrange(x).view(bits)
    batched = np.stack([x, x[::-1]])
    for got, expect in ((jax.jit(_xla.rearranged_once, static_argnums=1)(x, rearrange), want),
                        (jax.vmap(lambda v: _xla.rearranged_once(v, rearrange))(batched),
                         np.stack([want, rearrange(x[::-1]).view(bits)]))):
        assert np.asarray(got).dtype == dt
        assert np.array_equal(np.asarray(got).view(bits), expect)
    cot = jnp.asarray(np.arange(120.0).reshape(4, 10, 3))
    grad = jax.grad(lambda v: jnp.vdot(_xla.rearranged_once(v, rearrange), cot))(
        jnp.zeros((2, 3, 4, 5)))
    assert np.array_equal(rearrange(np.asarray(grad)), cot)


@pytest.mark.parametrize("op", ["convolution", "convolution_backward_data"])
def test_elementwise_loops_read_weights_computed_once(op):
    """On CPU, the loop of a depthwise elementwise lowering does not read PyTorch-layout
    (``OIX``) weights through a fused transpose, which left it unvectorized (3-4x slower):
    the transposed weights are a loop of their own."""
    if jax.default_backend() != "cpu":
        pytest.skip("the fusion is XLA CPU's")
    c = 16
    attrs = {"strides": 1, "pads_begin": 1, "pads_end": 1, "groups": c,
             "data_format": "NXC", "weights_format": "OIX"}
    x = jnp.zeros((2, 9, 9, c), jnp.float32)
    w = jnp.zeros((c, 1, 3, 3), jnp.float32)
    fn = getattr(polyconv, op)
    args = (x, w) if op == "convolution" else (x, w, x.shape)
    primitive = "forward" if op == "convolution" else "backward_data"
    with _forced(**{primitive: "elementwise"}):
        text = jax.jit(lambda a, b: fn(a, b, *args[2:], **attrs)).lower(*args[:2]).compile(
            ).as_text()
    loops = re.split(r"\n(?=%)", text)
    big = [body for body in loops if re.search(r"-> f32\[2,9,9,16\]", body.split("\n")[0])]
    assert big, text
    assert not any("transpose(" in body for body in big), big
