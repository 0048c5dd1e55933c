"""``polyconv.compare``: it passes every working backend and FAILS a broken one.

The pass/fail line is checked against the independent oracle (``tests/oracle.py``): a fake
backend returns the oracle's exact result moved by a chosen multiple of the oracle's error
bound, so ``compare`` must pass it at 0.4x and fail it at 3x. Fakes join the registry by
monkeypatching its table of loaded backends, the way a third-party entry point would appear.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import numpy as np
import oracle
import pytest

import polyconv
from polyconv import _backends, _dispatch

# (op, input shapes, attrs): one small call per op, with strides, groups, pads and bias.
CALLS = [
    ("Convolution", {"src": (2, 7, 6, 4), "weights": (3, 3, 2, 6), "bias": (6,)},
     {"strides": 2, "groups": 2, "pads_begin": (1, 0), "pads_end": (0, 1)}),
    ("ConvolutionBackwardData", {"diff_dst": (1, 4, 3, 6), "weights": (3, 3, 2, 6)},
     {"strides": 2, "groups": 2, "auto_pad": "same_upper", "output_padding": 1}),
    ("ConvolutionBackwardWeights", {"src": (2, 7, 6, 4), "diff_dst": (2, 4, 3, 6),
                                    "weights_shape": (3, 3)},
     {"strides": 2, "groups": 2, "auto_pad": "same_lower"}),
    ("ConvTranspose", {"src": (1, 4, 5, 6), "weights": (3, 3, 2, 6), "bias": (6,)},
     {"strides": 2, "groups": 3, "pads_begin": (1, 0), "pads_end": (0, 1),
      "output_padding": (1, 0)}),
    ("ConvTransposeBackwardData", {"diff_dst": (1, 3, 9, 8), "weights": (3, 3, 3, 2)},
     {"strides": 2, "auto_pad": "same_upper", "data_format": "NCX", "weights_format": "IOX",
      "output_padding": (1, 0)}),
    ("ConvTransposeBackwardWeights", {"src": (2, 5, 4), "diff_dst": (2, 12, 3),
                                      "weights_shape": (3,)},
     {"strides": 2, "output_padding": 1}),
]


def _inputs(shapes: dict, dtype: str, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for role, shape in shapes.items():
        if role.endswith("_shape"):
            out.append(shape)
        else:
            out.append(rng.uniform(-1, 1, shape).astype(oracle.numpy_dtype(dtype)))
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("op", "shapes", "attrs"), CALLS, ids=[c[0] for c in CALLS])
def test_every_available_backend_passes(op, shapes, attrs, dtype):
    report = polyconv.compare(op, *_inputs(shapes, dtype), **attrs)
    assert [r.backend for r in report.results] == list(polyconv.available_backends())
    assert report.ok, str(report)
    ref = oracle.reference(op, *(x for x in _inputs(shapes, dtype)
                                 if isinstance(x, np.ndarray)),
                           **attrs, **{k: v for k, v in shapes.items() if k.endswith("_shape")})
    assert report.shape == ref.shape
    assert report.input_shapes == {k: tuple(v) for k, v in shapes.items()}
    for r in report.results:
        assert r.shape == ref.shape and r.dtype == dtype
        assert 0.0 <= r.max_ratio <= 1.0 and r.max_abs_error >= 0.0
        assert r.status == "ok" and r.error is None and r.seconds >= 0.0


# --------------------------------------------------------------------------------------------
# fake backends
# --------------------------------------------------------------------------------------------


class Fixed:
    """A backend that ignores its inputs and returns one prepared array."""

    name = "fixed"

    def __init__(self, result):
        self.result = result
        self.calls = 0

    def _out(self, *args, **kwargs):
        self.calls += 1
        return self.result

    forward = backward_data = backward_weights = _out


class Raising:
    name = "raising"

    def _out(self, *args, **kwargs):
        msg = "this backend is broken"
        raise RuntimeError(msg)

    forward = backward_data = backward_weights = _out


class Compiling(Fixed):
    """A backend whose first call is slow, as JAX's is while it traces and compiles."""

    name = "compiling"
    FIRST = 0.3

    def _out(self, *args, **kwargs):
        if self.calls == 0:
            time.sleep(self.FIRST)
        return super()._out(*args, **kwargs)

    forward = backward_data = backward_weights = _out


def _register(monkeypatch, name: str, backend) -> None:
    monkeypatch.setitem(_backends._LOADED, name, backend)
    _dispatch._DISPATCH.clear()     # calls cached under this name ran the backend it replaces


OP, SHAPES, ATTRS = CALLS[3]  # ConvTranspose with groups, strides, asymmetric pads, bias


def _exact_plus(factor: float, dtype: str):
    """The oracle's exact ConvTranspose result moved by ``factor`` x its error bound."""
    inputs = _inputs(SHAPES, dtype)
    ref = oracle.reference(OP, *inputs, **ATTRS)
    eps = oracle.EPS[dtype]
    bound = eps * np.abs(ref.y) + ref.n * oracle.EPS[oracle.acc_dtype(dtype)] * ref.abs_sum
    sign = np.where(np.arange(ref.y.size).reshape(ref.y.shape) % 2, 1.0, -1.0)
    moved = (ref.y + sign * factor * bound).astype(oracle.numpy_dtype(dtype))
    return inputs, moved


@pytest.mark.parametrize("factor", [0.0, 0.4])
def test_a_backend_within_the_bound_passes(monkeypatch, factor):
    inputs, moved = _exact_plus(factor, "float32")
    _register(monkeypatch, "fixed", Fixed(moved))
    report = polyconv.compare(OP, *inputs, backends=["numpy", "fixed"], **ATTRS)
    assert report.ok, str(report)
    fixed = report.results[1]
    assert fixed.backend == "fixed" and fixed.ok and fixed.max_ratio <= 1.0


@pytest.mark.parametrize("factor", [3.0, 100.0])
def test_a_backend_outside_the_bound_fails(monkeypatch, factor):
    inputs, moved = _exact_plus(factor, "float32")
    _register(monkeypatch, "fixed", Fixed(moved))
    report = polyconv.compare(OP, *inputs, backends="numpy,fixed", **ATTRS)
    assert not report.ok
    numpy_row, fixed = report.results
    assert numpy_row.ok
    assert not fixed.ok and fixed.status == "FAIL" and fixed.max_ratio > 1.0
    assert "FAILED: fixed" in str(report)
    assert report.worst is fixed


def test_a_single_wrong_element_fails(monkeypatch):
    inputs, exact = _exact_plus(0.0, "float32")
    broken = exact.copy()
    broken.flat[broken.size // 2] += np.float32(1e-3)
    _register(monkeypatch, "fixed", Fixed(broken))
    report = polyconv.compare(OP, *inputs, backends=["fixed"], **ATTRS)
    assert not report.ok
    assert report.results[0].max_abs_error == pytest.approx(1e-3, rel=1e-2)


def test_wrong_shape_and_wrong_dtype_fail(monkeypatch):
    inputs, exact = _exact_plus(0.0, "float32")
    _register(monkeypatch, "fixed", Fixed(exact[:, :-1]))
    report = polyconv.compare(OP, *inputs, backends=["fixed"], **ATTRS)
    assert not report.ok and "wrong shape" in report.results[0].note
    _register(monkeypatch, "fixed", Fixed(exact.astype(np.float64)))
    report = polyconv.compare(OP, *inputs, backends=["fixed"], **ATTRS)
    (r,) = report.results
    assert not r.ok and r.max_ratio <= 1.0 and "wrong dtype" in r.note


def test_a_raising_backend_is_an_error_row_not_a_crash(monkeypatch):
    _register(monkeypatch, "raising", Raising())
    report = polyconv.compare(OP, *_inputs(SHAPES, "float32"), backends=["numpy", "raising"],
                              **ATTRS)
    assert not report.ok
    assert report.results[0].ok
    r = report.results[1]
    assert r.status == "ERROR" and r.error == "RuntimeError: this backend is broken"
    assert "this backend is broken" in str(report)
    json.dumps(report.to_dict())  # inf/nan are encoded as strings


# --------------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------------


def test_report_table_and_json():
    inputs = _inputs(SHAPES, "float32")
    report = polyconv.compare(OP, *inputs, backends=["numpy"], label="my case", **ATTRS)
    text = str(report)
    assert text.splitlines()[0].startswith("my case: conv_transpose(")
    assert "numpy" in text and "err/bound" in text
    assert text.splitlines()[-1] == ('all backends within the error bound of the docs page '
                                     '"The numerical contract"')
    assert "SPEC" not in text
    d = json.loads(json.dumps(report.to_dict()))
    assert d["ok"] is True and d["op"] == "conv_transpose" and d["dtype"] == "float32"
    assert d["shape"] == list(report.shape) == list(polyconv.infer_shape(
        OP, *(x.shape for x in inputs), **ATTRS).shape)
    assert d["pads_begin"] == [1, 0] and d["pads_end"] == [0, 1]
    assert d["input_shapes"]["src"] == [1, 4, 5, 6]
    assert d["attrs"]["pads_begin"] == [1, 0]
    (row,) = d["results"]
    assert set(row) >= {"backend", "library", "shape", "dtype", "max_abs_error", "max_ratio",
                        "ok", "seconds", "status"}


def test_time_is_a_warm_run_and_the_first_call_is_apart(monkeypatch):
    """Compilation (a slow first call) is reported apart, not in the run time."""
    inputs, exact = _exact_plus(0.0, "float32")
    backend = Compiling(exact)
    _register(monkeypatch, "compiling", backend)
    report = polyconv.compare(OP, *inputs, backends=["compiling"], **ATTRS)
    (r,) = report.results
    assert r.ok and backend.calls == 2
    assert r.first_seconds >= Compiling.FIRST
    assert r.seconds < Compiling.FIRST / 2
    header = str(report).splitlines()[1]
    assert "first call" in header and "run (warm)" in header
    assert " time " not in f" {header} "
    row = json.loads(json.dumps(report.to_dict()))["results"][0]
    assert row["first_seconds"] >= Compiling.FIRST > row["seconds"]


def test_op_given_as_function_or_function_name():
    inputs = _inputs(SHAPES, "float32")
    for op in (polyconv.conv_transpose, "conv_transpose", "ConvTranspose"):
        report = polyconv.compare(op, *inputs, backends=["numpy"], **ATTRS)
        assert report.op == "conv_transpose" and report.ok


def test_inputs_are_not_modified():
    inputs = _inputs(SHAPES, "float32")
    copies = [x.copy() for x in inputs]
    polyconv.compare(OP, *inputs, **ATTRS)
    for x, c in zip(inputs, copies):
        np.testing.assert_array_equal(x, c)


def test_nan_inputs_propagate_and_agree():
    inputs = _inputs(SHAPES, "float32")
    inputs[0][0, 1, 2, 0] = np.nan
    report = polyconv.compare(OP, *inputs, backends=["numpy"], **ATTRS)
    assert report.ok, str(report)


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda x, w: polyconv.compare("Nope", x, w), ValueError, "unknown op 'Nope'"),
    (lambda x, w: polyconv.compare(OP, x, w, backends=["nope"]), ValueError,
     "unknown backend 'nope'"),
    (lambda x, w: polyconv.compare(OP, x, w, backends=[]), ValueError, "at least one"),
    (lambda x, w: polyconv.compare(OP, x, w, backend="numpy"), TypeError, "backends="),
    (lambda x, w: polyconv.compare(OP, x, w, strides=0), ValueError,
     "strides must be positive"),
    (lambda x, w: polyconv.compare(OP, x.astype(np.float16), w), TypeError,
     "share one floating dtype"),
    (lambda x, w: polyconv.compare(OP, x.astype(np.int32), w.astype(np.int32)), TypeError,
     "floating point"),
    (lambda x, w: polyconv.compare(OP, x, w, None, None), TypeError, "at most 3"),
])
def test_invalid_calls_raise_the_ops_errors(call, error, match):
    x, w = _inputs({"src": (1, 4, 4, 3), "weights": (3, 3, 2, 3)}, "float32")
    with pytest.raises(error, match=match):
        call(x, w)


def test_unavailable_backend_is_a_value_error(monkeypatch):
    entry = _backends.BackendEntry("ghost", "polyconv_ghost_not_installed", ("numpy",), "x")
    monkeypatch.setitem(_backends._BUILTIN, "ghost", entry)
    x, w = _inputs({"src": (1, 4, 4, 3), "weights": (3, 3, 2, 3)}, "float32")
    with pytest.raises(ValueError, match="'ghost' is not installed"):
        polyconv.compare(OP, x, w, backends=["ghost"])


def test_compare_on_numpy_does_not_import_jax():
    code = textwrap.dedent("""
        import sys
        import numpy as np
        import polyconv
        x = np.ones((1, 4, 4, 3), np.float32)
        w = np.ones((3, 3, 2, 3), np.float32)
        assert polyconv.compare("ConvTranspose", x, w, strides=2, backends=["numpy"]).ok
        assert "jax" not in sys.modules, "compare imported jax"
    """)
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------------------------
# peers: another framework's operator checked against the same reference
# --------------------------------------------------------------------------------------------


def _oracle_peer(transpose_kernel: bool):
    """A peer computed by the independent oracle (channels-first data, ``[Cb, Ca/G, K..]``
    weights, as every peer gets them), optionally with its kernel's two spatial axes swapped:
    the mistake a wrong weights translation makes. Its gradients are the adjoint by
    definition, ``<f(e_i), dy>`` for each basis array ``e_i`` of the operand."""
    from polyconv._peers import Peer

    def run(plan, x, w, bias):
        if transpose_kernel:
            w = np.swapaxes(w, -1, -2)
        op = "convolution" if plan.primitive == "forward" else "conv_transpose"
        return oracle.reference(op, x, w, bias, strides=plan.strides, dilations=plan.dilations,
                                groups=plan.groups, pads_begin=plan.pads_begin,
                                pads_end=plan.pads_end, output_padding=plan.output_padding,
                                data_format="NCX", weights_format="OIX" if op ==
                                "convolution" else "IOX").y

    def grad(plan, x, w, dy, wrt):
        target = x if wrt == "src" else w
        g = np.zeros(target.shape)
        for i in np.ndindex(target.shape):
            e = np.zeros(target.shape)
            e[i] = 1.0
            g[i] = np.sum(run(plan, *((e, w) if wrt == "src" else (x, e)), None) * dy)
        return g

    return Peer("transposed-kernel" if transpose_kernel else "oracle", run, grad=grad)


@pytest.mark.parametrize("op", ["convolution_backward_data", "convolution_backward_weights",
                                "conv_transpose_backward_data",
                                "conv_transpose_backward_weights"])
def test_a_peer_with_a_transposed_kernel_is_reported_as_disagreeing_on_gradients(op):
    rng = np.random.default_rng(1)
    fwd = "conv_transpose" if op.startswith("conv_transpose") else "convolution"
    x = rng.uniform(-1, 1, (1, 5, 6, 4)).astype(np.float32)
    w_shape = (3, 3, 2, 4) if fwd == "conv_transpose" else (3, 3, 4, 2)
    attrs = {"strides": 2, "pads_begin": (1, 0), "pads_end": (0, 1)}
    plan = polyconv.infer_shape(fwd, x.shape, w_shape, **attrs)
    dy = rng.uniform(-1, 1, plan.shape).astype(np.float32)
    w = rng.uniform(-1, 1, w_shape).astype(np.float32)
    inputs = ((dy, w) if op == "conv_transpose_backward_data" else
              (dy, w, x.shape) if op.endswith("data") else (x, dy, w_shape))
    c = polyconv.compare(op, *inputs, backends=["numpy"], peers=[_oracle_peer(False),
                                                                _oracle_peer(True)], **attrs)
    right, wrong = c.peers
    assert (right.peer, right.status) == ("oracle", "agrees")
    assert (wrong.peer, wrong.status) == ("transposed-kernel", "disagrees")
    assert c.ok


@pytest.mark.parametrize("op", ["convolution", "conv_transpose"])
def test_a_peer_with_a_transposed_kernel_is_reported_as_disagreeing(op):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, 5, 6, 4)).astype(np.float32)
    w = rng.uniform(-1, 1, (3, 3, 2, 4) if op == "conv_transpose" else (3, 3, 4, 2)
                    ).astype(np.float32)
    c = polyconv.compare(op, x, w, backends=["numpy"], strides=2, pads_begin=(1, 0),
                         pads_end=(0, 1), peers=[_oracle_peer(False), _oracle_peer(True)])
    right, wrong = c.peers
    assert (right.peer, right.status) == ("oracle", "agrees")
    assert (wrong.peer, wrong.status) == ("transposed-kernel", "disagrees")
    assert wrong.max_ratio > 1 and len(wrong.where) == 4
    assert c.ok                                    # a peer's finding is not polyconv's failure
    assert "peer transposed-kernel: DISAGREES" in str(c)
    assert c.to_dict()["peers"][1]["status"] == "disagrees"


def test_a_peer_without_gradients_cannot_express_them_and_unknown_names_are_refused():
    from polyconv._peers import Peer

    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (1, 5, 6, 4)).astype(np.float32)
    w = rng.uniform(-1, 1, (3, 3, 4, 2)).astype(np.float32)
    dy = rng.uniform(-1, 1, (1, 3, 4, 2)).astype(np.float32)
    forward_only = Peer("forward-only", _oracle_peer(False).run, no_grad="no autodiff here")
    c = polyconv.compare("convolution_backward_data", dy, w, (1, 5, 6, 4), backends=["numpy"],
                         peers=[forward_only])
    (r,) = c.peers
    assert (r.status, r.detail) == ("cannot express", "op: convolution_backward_data: no "
                                                      "autodiff here")
    with pytest.raises(ValueError, match=r"unknown peer 'tensorflw'.*torch, onnxruntime"):
        polyconv.compare("convolution", x, w, backends=["numpy"], peers="tensorflw")
