"""JAX-only tests of the jax backend: jit, grad, vmap, precision, x64 and sharding.

Agreement with the oracle (and so with every other backend) is the shared matrix's job; here
the backend is checked against JAX itself: ``jax.grad`` of ``convolution`` and
``conv_transpose`` must equal polyconv's backward ops for every attribute combination.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import polyconv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _x64():
    """The comparisons here are in float64."""
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield
    jax.config.update("jax_enable_x64", before)


def _run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    pythonpath = os.pathsep.join([str(ROOT), str(ROOT / "backends"),
                                  os.environ.get("PYTHONPATH", "")])
    full_env = {**os.environ, "PYTHONPATH": pythonpath, "JAX_PLATFORMS": "cpu", **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full_env,
                          capture_output=True, text=True, timeout=600, check=False)


# --------------------------------------------------------------------------------------------
# the attribute grid
# --------------------------------------------------------------------------------------------

# spatial sizes of the large tensor (convolution src) and of the small one (conv_transpose
# src), and the kernel, per rank
_LARGE = {1: (9,), 2: (7, 6), 3: (5, 6, 5)}
_SMALL = {1: (5,), 2: (4, 3), 3: (3, 2, 3)}
_KERNEL = {1: (3,), 2: (3, 2), 3: (2, 3, 2)}


def _per_axis(value, nd):
    return value[:nd] if isinstance(value, tuple) else value


# Geometry variants; each layout combination below is paired with several of them, so every
# variant meets every rank and both data formats. "groups": "dw" is depthwise.
_CONV_VARIANTS = (
    {},
    {"strides": 2, "pads_begin": 1, "pads_end": 2, "groups": 2},
    {"strides": (2, 1, 3), "dilations": 2, "pads_begin": 2, "pads_end": 0},
    {"auto_pad": "same_upper", "strides": 2, "groups": 2},
    {"auto_pad": "SAME_LOWER", "strides": 3, "dilations": (2, 1, 2)},
    {"auto_pad": "valid", "strides": 2, "dilations": (1, 2, 1), "groups": "dw"},
    {"auto_pad": "explicit", "pads_begin": (0, 3, 1), "pads_end": (4, 0, 1), "groups": "dw"},
    {"auto_pad": None, "strides": 2, "dilations": 2, "pads_begin": 1, "pads_end": 1,
     "groups": 2},
)
_TRANSPOSE_VARIANTS = (
    {},
    {"strides": 2, "pads_begin": 1, "pads_end": 1, "output_padding": 1, "groups": 2},
    {"strides": (3, 2, 2), "dilations": 2, "pads_begin": (0, 2, 1), "pads_end": (2, 0, 1),
     "output_padding": (2, 1, 0)},
    {"auto_pad": "same_upper", "strides": 2, "groups": 2, "output_padding": 1},
    {"auto_pad": "same_lower", "strides": (2, 3, 1), "dilations": 2, "groups": "dw"},
    {"auto_pad": "valid", "strides": 3, "output_padding": 2, "groups": "dw"},
    # pads larger than the kernel: negative padding in the lowering
    {"strides": 2, "pads_begin": (3, 2, 2), "pads_end": (0, 1, 1), "groups": 2},
    {"strides": 2, "pads_begin": 1, "pads_end": 1, "dst_shape": "+1"},
)
_LAYOUTS = list(itertools.product((1, 2, 3), ("NXC", "NCX"), ("XIO", "OIX", "IOX", "XOI")))


def _cases(variants, per_layout=3):
    cases = []
    for i, (nd, fmt, wfmt) in enumerate(_LAYOUTS):
        for j in range(per_layout):
            v = (i * per_layout + j) % len(variants)
            cases.append(pytest.param(nd, fmt, wfmt, variants[v],
                                      id=f"{nd}d-{fmt}-{wfmt}-v{v}"))
    return cases


def _attrs(variant, nd, fmt, wfmt):
    attrs = {k: _per_axis(v, nd) for k, v in variant.items() if k not in ("groups", "dst_shape")}
    return {**attrs, "data_format": fmt, "weights_format": wfmt}


def _data(rng, n, c, spatial, fmt):
    shape = (n, *spatial, c) if fmt == "NXC" else (n, c, *spatial)
    return rng.standard_normal(shape)


def _weights(rng, cb, ca_g, kernel, wfmt, family):
    """Random weights in ``wfmt`` for the family's meaning of O and I (SPEC §2)."""
    o, i = (cb, ca_g) if family == "convolution" else (ca_g, cb)
    sizes = {"O": (o,), "I": (i,), "X": kernel}
    return rng.standard_normal(tuple(itertools.chain.from_iterable(sizes[c] for c in wfmt)))


def _channels(variant):
    """(channels of the op's input, of its output, groups)."""
    groups = variant.get("groups", 1)
    if groups == "dw":
        return 4, 8, 4
    return 4, 6, groups


def _bias_grad(cot, fmt):
    axes = tuple(i for i in range(cot.ndim) if i != (cot.ndim - 1 if fmt == "NXC" else 1))
    return cot.sum(axis=axes)


def _close(actual, expected):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=1e-10,
                               atol=1e-10)


@pytest.mark.parametrize(("nd", "fmt", "wfmt", "variant"), _cases(_CONV_VARIANTS))
def test_grad_of_convolution_is_the_backward_ops(nd, fmt, wfmt, variant):
    rng = np.random.default_rng(0)
    ic, oc, groups = _channels(variant)
    attrs = {**_attrs(variant, nd, fmt, wfmt), "groups": groups}
    x = jnp.asarray(_data(rng, 2, ic, _LARGE[nd], fmt))
    w = jnp.asarray(_weights(rng, oc, ic // groups, _KERNEL[nd], wfmt, "convolution"))
    bias = jnp.asarray(rng.standard_normal(oc))
    y_shape = polyconv.infer_shape("Convolution", x.shape, w.shape, **attrs).shape
    cot = jnp.asarray(rng.standard_normal(y_shape))

    @jax.jit  # one compilation for the whole comparison
    def grads_and_ops(x, w, bias, cot):
        def loss(x, w, bias):
            return jnp.vdot(polyconv.convolution(x, w, bias, **attrs), cot)

        return (jax.grad(loss, argnums=(0, 1, 2))(x, w, bias),
                (polyconv.convolution_backward_data(cot, w, x.shape, **attrs),
                 polyconv.convolution_backward_weights(x, cot, w.shape, **attrs),
                 _bias_grad(cot, fmt)))

    for grad, op in zip(*grads_and_ops(x, w, bias, cot)):
        _close(grad, op)


@pytest.mark.parametrize(("nd", "fmt", "wfmt", "variant"), _cases(_TRANSPOSE_VARIANTS))
def test_grad_of_conv_transpose_is_the_backward_ops(nd, fmt, wfmt, variant):
    rng = np.random.default_rng(1)
    ic, oc, groups = _channels(variant)
    attrs = {**_attrs(variant, nd, fmt, wfmt), "groups": groups}
    x = jnp.asarray(_data(rng, 2, ic, _SMALL[nd], fmt))
    w = jnp.asarray(_weights(rng, ic, oc // groups, _KERNEL[nd], wfmt, "conv_transpose"))
    bias = jnp.asarray(rng.standard_normal(oc))
    extra = {}
    if variant.get("dst_shape") == "+1":  # one row more than the attributes give
        plan = polyconv.infer_shape("ConvTranspose", x.shape, w.shape, **attrs)
        extra["dst_shape"] = tuple(a + 1 for a in plan.a_spatial)
    y_shape = polyconv.infer_shape("ConvTranspose", x.shape, w.shape, **attrs, **extra).shape
    cot = jnp.asarray(rng.standard_normal(y_shape))

    @jax.jit
    def grads_and_ops(x, w, bias, cot):
        def loss(x, w, bias):
            return jnp.vdot(polyconv.conv_transpose(x, w, bias, **attrs, **extra), cot)

        return (jax.grad(loss, argnums=(0, 1, 2))(x, w, bias),
                (polyconv.conv_transpose_backward_data(cot, w, **attrs),
                 polyconv.conv_transpose_backward_weights(x, cot, w.shape, **attrs),
                 _bias_grad(cot, fmt)))

    for grad, op in zip(*grads_and_ops(x, w, bias, cot)):
        _close(grad, op)


@pytest.mark.parametrize("fmt", ["NXC", "NCX"])
def test_grad_of_the_backward_data_ops(fmt):
    """Second order: the backward-data ops are differentiable too (and linear in each input)."""
    rng = np.random.default_rng(2)
    attrs = {"strides": 2, "pads_begin": 1, "pads_end": 0, "groups": 2, "data_format": fmt}
    w = jnp.asarray(rng.standard_normal((3, 3, 2, 6)))           # XIO: [K, K, IC/G, OC]
    dy = jnp.asarray(_data(rng, 2, 6, (4, 4), fmt))
    dx = polyconv.convolution_backward_data(dy, w, **attrs)
    cot = jnp.asarray(rng.standard_normal(dx.shape))
    g = jax.grad(lambda dy: jnp.vdot(polyconv.convolution_backward_data(dy, w, **attrs), cot))
    # d<bwd_data(dy), cot>/d dy = forward(cot), given the same large shape
    _close(g(dy), polyconv.convolution(cot, w, **attrs))


# --------------------------------------------------------------------------------------------
# jit, no retracing, vmap
# --------------------------------------------------------------------------------------------


def _six_op_inputs(rng, fmt="NXC", n=2):
    """Inputs for each of the six ops (a strided, grouped, padded geometry)."""
    attrs = {"strides": 2, "pads_begin": 1, "pads_end": 1, "groups": 2, "data_format": fmt}
    t_attrs = {**attrs, "output_padding": 1}
    x = _data(rng, n, 4, (7, 6), fmt)
    wc = rng.standard_normal((3, 3, 2, 6))   # convolution XIO [K, K, IC/G, OC]
    wt = rng.standard_normal((3, 3, 3, 4))   # conv_transpose XOI [K, K, OC/G, IC]
    y_shape = polyconv.infer_shape("Convolution", x.shape, wc.shape, **attrs).shape
    t_shape = polyconv.infer_shape("ConvTranspose", x.shape, wt.shape, **t_attrs).shape
    dy = rng.standard_normal(y_shape)
    dt = rng.standard_normal(t_shape)
    bc, bt = rng.standard_normal(6), rng.standard_normal(6)
    return {
        "convolution": (polyconv.convolution, (x, wc, bc), attrs),
        "convolution_backward_data": (
            lambda dy, w: polyconv.convolution_backward_data(dy, w, x.shape, **attrs),
            (dy, wc), {}),
        "convolution_backward_weights": (
            lambda x, dy: polyconv.convolution_backward_weights(x, dy, wc.shape, **attrs),
            (x, dy), {}),
        "conv_transpose": (polyconv.conv_transpose, (x, wt, bt), t_attrs),
        "conv_transpose_backward_data": (polyconv.conv_transpose_backward_data, (dt, wt),
                                         t_attrs),
        "conv_transpose_backward_weights": (
            lambda x, dt: polyconv.conv_transpose_backward_weights(x, dt, wt.shape, **t_attrs),
            (x, dt), {}),
    }


SIX = ("convolution", "convolution_backward_data", "convolution_backward_weights",
       "conv_transpose", "conv_transpose_backward_data", "conv_transpose_backward_weights")


@pytest.mark.parametrize("name", SIX)
def test_jit_matches_eager_and_does_not_retrace(name):
    rng = np.random.default_rng(3)
    fn, args, attrs = _six_op_inputs(rng)[name]
    traces = []

    @jax.jit
    def jitted(*args):
        traces.append(1)
        return fn(*args, **attrs)

    args = [jnp.asarray(a) for a in args]
    eager = fn(*args, **attrs)
    _close(jitted(*args), eager)
    other = [a + 1.0 for a in args]
    _close(jitted(*other), fn(*other, **attrs))
    assert len(traces) == 1  # same shapes: one trace, one compilation


def test_eager_calls_compile_once_per_plan():
    """The plan is a static (hashable) jit argument: repeated eager calls reuse the executable."""
    from polyconv_jax import _lowering

    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal((2, 5, 5, 3)))
    w = jnp.asarray(rng.standard_normal((3, 3, 3, 4)))
    polyconv.convolution(x, w, strides=2, auto_pad="same_upper")
    before = _lowering.forward._cache_size()
    for _ in range(3):
        polyconv.convolution(x + 1.0, w, strides=2, auto_pad="same_upper")
    assert _lowering.forward._cache_size() == before
    plan = polyconv.infer_shape("Convolution", x.shape, w.shape, strides=2)
    assert hash(plan) == hash(polyconv.infer_shape("Convolution", x.shape, w.shape, strides=2))


def test_jit_of_grad():
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((2, 6, 6, 4)))
    w = jnp.asarray(rng.standard_normal((3, 3, 2, 4)))   # XOI, groups 2: OC = 4
    attrs = {"strides": 2, "auto_pad": "same_upper", "groups": 2, "output_padding": 1}

    def loss(x, w):
        return jnp.sum(jnp.sin(polyconv.conv_transpose(x, w, **attrs)))

    eager = jax.grad(loss, argnums=(0, 1))(x, w)
    jitted = jax.jit(jax.grad(loss, argnums=(0, 1)))(x, w)
    for a, b in zip(jitted, eager):
        _close(a, b)


@pytest.mark.parametrize("fmt", ["NXC", "NCX"])
@pytest.mark.parametrize("name", SIX)
def test_vmap_over_a_leading_axis_equals_a_loop(name, fmt):
    rng = np.random.default_rng(6)
    fn, args, attrs = _six_op_inputs(rng, fmt)[name]
    stacked = [jnp.asarray(np.stack([a, 2.0 * a - 1.0, -a])) for a in args]
    got = jax.vmap(lambda *xs: fn(*xs, **attrs))(*stacked)
    for i in range(3):
        _close(got[i], fn(*[s[i] for s in stacked], **attrs))


def test_vmap_over_the_weights_only():
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.standard_normal((2, 6, 5)))            # NXC, rank 1
    ws = jnp.asarray(rng.standard_normal((4, 3, 5, 2)))        # 4 XIO kernels
    got = jax.vmap(lambda w: polyconv.convolution(x, w, strides=2), in_axes=0)(ws)
    for i in range(4):
        _close(got[i], polyconv.convolution(x, ws[i], strides=2))


# --------------------------------------------------------------------------------------------
# inputs, dtypes, precision
# --------------------------------------------------------------------------------------------


def test_numpy_inputs_with_backend_jax_come_back_as_numpy():
    import ml_dtypes

    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 5, 5, 2))
    w = rng.standard_normal((3, 3, 2, 4))
    for dtype in (np.float32, np.float16, ml_dtypes.bfloat16, np.float64):
        y = polyconv.convolution(x.astype(dtype), w.astype(dtype), backend="jax")
        assert isinstance(y, np.ndarray)
        assert y.dtype == np.dtype(dtype)
        y_jax = polyconv.convolution(jnp.asarray(x.astype(dtype)), jnp.asarray(w.astype(dtype)))
        assert isinstance(y_jax, jax.Array)
        assert y_jax.dtype == np.dtype(dtype)
        _close(np.asarray(y, np.float64), np.asarray(y_jax, np.float64))


def _hlo(fn, *args):
    return jax.jit(fn).lower(*args).as_text()


def test_precision_default_is_highest_and_can_be_lowered():
    rng = np.random.default_rng(9)
    x = jnp.asarray(rng.standard_normal((1, 5, 5, 2)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((3, 3, 2, 4)), jnp.float32)
    text = _hlo(lambda x, w: polyconv.convolution(x, w), x, w)
    assert "precision HIGHEST" in text
    for precision, want in (("default", "DEFAULT"), ("HIGH", "HIGH"),
                            (jax.lax.Precision.DEFAULT, "DEFAULT"),
                            (("highest", jax.lax.Precision.HIGH), "HIGH")):
        text = _hlo(lambda x, w, p=precision: polyconv.conv_transpose(x, w, precision=p),
                    x, jnp.transpose(w, (0, 1, 3, 2)))
        assert f"precision {want}>" in text
        y = polyconv.convolution(x, w, precision=precision)   # same values on CPU
        _close(y, polyconv.convolution(x, w))
    # an explicit setting wins over the global default
    with jax.default_matmul_precision("bfloat16"):
        assert "precision HIGHEST" in _hlo(lambda x, w: polyconv.convolution(x, w), x, w)


@pytest.mark.parametrize("bad", ["fast", 3, ("high",), ("high", "highest", "default"),
                                 jax.lax.DotAlgorithmPreset.DEFAULT])
def test_precision_is_validated(bad):
    x = jnp.ones((1, 5, 5, 2), jnp.float32)
    w = jnp.ones((3, 3, 2, 4), jnp.float32)
    with pytest.raises(ValueError, match=r"convolution: precision must be .* got precision="):
        polyconv.convolution(x, w, precision=bad)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_accumulates_in_float32_with_one_final_cast(dtype):
    rng = np.random.default_rng(10)
    x = jnp.asarray(rng.standard_normal((1, 6, 6, 8)), dtype)
    w = jnp.asarray(rng.standard_normal((3, 3, 8, 4)), dtype)
    b = jnp.asarray(rng.standard_normal(4), dtype)
    text = _hlo(lambda x, w, b: polyconv.convolution(x, w, b), x, w, b)
    conv_line = next(line for line in text.splitlines() if "stablehlo.convolution" in line)
    assert conv_line.rstrip().endswith("xf32>")   # accumulated and returned in float32
    assert text.count("stablehlo.convert") == 2   # the bias up, the result down: nothing else
    x64, w64, b64 = (np.asarray(v, np.float64) for v in (x, w, b))
    exact = polyconv.convolution(x64, w64, b64, backend="jax")
    magnitude = polyconv.convolution(np.abs(x64), np.abs(w64), backend="jax")
    y = polyconv.convolution(x, w, b)
    assert y.dtype == x.dtype
    # SPEC §5: one rounding to the output dtype plus float32 accumulation error (72 products)
    bound = (float(jnp.finfo(dtype).eps) * np.abs(exact)
             + 73 * float(np.finfo(np.float32).eps) * (magnitude + np.abs(b64)))
    assert np.all(np.abs(np.asarray(y, np.float64) - exact) <= bound)


def test_float64_without_x64_is_an_error():
    result = _run_python("""
        import numpy as np, jax, jax.numpy as jnp, polyconv
        assert not jax.config.jax_enable_x64
        x = np.ones((1, 5, 5, 2)); w = np.ones((3, 3, 2, 4))
        try:
            polyconv.convolution(x, w, backend="jax")
        except TypeError as e:
            print("TypeError:", e)
        else:
            raise SystemExit("no error")
        y = polyconv.convolution(x.astype(np.float32), w.astype(np.float32), backend="jax")
        assert y.dtype == np.float32
        y = polyconv.convolution(jnp.asarray(x), jnp.asarray(w))   # jax makes these float32
        assert y.dtype == jnp.float32
        """, JAX_ENABLE_X64="0")
    assert result.returncode == 0, result.stderr
    assert "convolution: float64 inputs need 64-bit mode in JAX" in result.stdout
    assert "jax_enable_x64" in result.stdout


# --------------------------------------------------------------------------------------------
# sharding
# --------------------------------------------------------------------------------------------

_SHARDING_SCRIPT = """
    import numpy as np, jax, jax.numpy as jnp, polyconv
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    jax.config.update("jax_enable_x64", True)
    assert jax.device_count() == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("data",))
    batch = NamedSharding(mesh, P("data"))
    rng = np.random.default_rng(0)
    N = 16
    for fmt in ("NXC", "NCX"):
        attrs = dict(strides=2, pads_begin=1, pads_end=1, groups=2, data_format=fmt)
        t_attrs = dict(attrs, output_padding=1)
        def data(c, sp):
            return rng.standard_normal((N, *sp, c) if fmt == "NXC" else (N, c, *sp))
        x = data(4, (9, 8))
        wc = rng.standard_normal((3, 3, 2, 6))    # XIO
        wt = rng.standard_normal((3, 3, 3, 4))    # XOI
        bias = rng.standard_normal(6)
        dy = data(6, (5, 4))
        dt = data(6, (18, 16))
        ops = {
            "convolution": (lambda x, w, b: polyconv.convolution(x, w, b, **attrs),
                            (x, wc, bias), "batch"),
            "convolution_backward_data": (
                lambda dy, w: polyconv.convolution_backward_data(dy, w, x.shape, **attrs),
                (dy, wc), "batch"),
            "convolution_backward_weights": (
                lambda x, dy: polyconv.convolution_backward_weights(x, dy, wc.shape, **attrs),
                (x, dy), "replicated"),
            "conv_transpose": (lambda x, w, b: polyconv.conv_transpose(x, w, b, **t_attrs),
                               (x, wt, bias), "batch"),
            "conv_transpose_backward_data": (
                lambda dt, w: polyconv.conv_transpose_backward_data(dt, w, **t_attrs),
                (dt, wt), "batch"),
            "conv_transpose_backward_weights": (
                lambda x, dt: polyconv.conv_transpose_backward_weights(x, dt, wt.shape,
                                                                       **t_attrs),
                (x, dt), "replicated"),
        }
        for name, (fn, args, want) in ops.items():
            plain = [jnp.asarray(a) for a in args]
            # batch-sized inputs are sharded over the mesh, weights and bias replicated
            sharded = [jax.device_put(a, batch) if a.shape[0] == N else
                       jax.device_put(a, NamedSharding(mesh, P())) for a in plain]
            expected = np.asarray(fn(*plain))
            for how, f in (("eager", fn), ("jit", jax.jit(fn))):
                got = f(*sharded)
                np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-12, atol=1e-12,
                                           err_msg=f"{fmt} {name} {how}")
                if want == "batch":
                    ok = got.sharding.is_equivalent_to(batch, got.ndim)
                else:
                    ok = got.sharding.is_fully_replicated
                assert ok, (fmt, name, how, want, got.sharding)
        # the weights gradient of a loss over a batch-sharded input comes back replicated
        def loss(x, w, b):
            return jnp.sum(polyconv.convolution(x, w, b, **attrs) ** 2)
        xs = jax.device_put(jnp.asarray(x), batch)
        grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(xs, jnp.asarray(wc),
                                                           jnp.asarray(bias))
        plain = jax.grad(loss, argnums=(0, 1, 2))(jnp.asarray(x), jnp.asarray(wc),
                                                 jnp.asarray(bias))
        for g, p in zip(grads, plain):
            np.testing.assert_allclose(np.asarray(g), np.asarray(p), rtol=1e-12, atol=1e-12)
        assert grads[0].sharding.is_equivalent_to(batch, grads[0].ndim), grads[0].sharding
        assert grads[1].sharding.is_fully_replicated, grads[1].sharding
        assert grads[2].sharding.is_fully_replicated, grads[2].sharding
    print("sharding ok")
"""


def test_sharded_batch_over_8_devices():
    flags = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8")
    result = _run_python(_SHARDING_SCRIPT, XLA_FLAGS=flags.strip())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "sharding ok" in result.stdout
