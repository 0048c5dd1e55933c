"""The ``polyconv`` command: ``shape`` agrees with ``infer_shape`` (and with the oracle's
independent geometry), bad arguments are one clean line and exit status 2, ``compare`` runs
and reports in text and JSON."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import time

import numpy as np
import oracle
import pytest

import polyconv
from polyconv import _backends
from polyconv._cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _dims(shape) -> str:
    return "x".join(map(str, shape))


# --------------------------------------------------------------------------------------------
# polyconv shape
# --------------------------------------------------------------------------------------------

# (op, {option: shape}, {attr: value}); the shapes are the op's positional inputs
SHAPE_CASES = [
    ("ConvTranspose", {"src": (8, 32, 32, 64), "weights": (3, 3, 64, 64)},
     {"strides": 2, "auto_pad": "same_upper", "output_padding": 1}),
    ("ConvTranspose", {"src": (1, 4, 5, 6), "weights": (3, 3, 2, 6)},
     {"strides": 2, "groups": 3, "pads_begin": (1, 0), "pads_end": (0, 1),
      "output_padding": (1, 0)}),
    ("ConvTranspose", {"src": (2, 3, 4, 4), "weights": (3, 2, 3, 3), "dst_shape": (7, 8)},
     {"strides": 2, "auto_pad": "same_lower", "data_format": "NCX", "weights_format": "IOX"}),
    ("Convolution", {"src": (2, 7, 6, 4), "weights": (3, 3, 2, 6), "bias": (6,)},
     {"strides": (2, 1), "dilations": (1, 2), "groups": 2, "auto_pad": "same_lower"}),
    ("Convolution", {"src": (1, 9, 3), "weights": (4, 3, 5)}, {"auto_pad": "valid",
                                                               "strides": 3}),
    ("ConvolutionBackwardData", {"diff_dst": (1, 4, 3, 6), "weights": (3, 3, 2, 6)},
     {"strides": 2, "groups": 2, "auto_pad": "same_upper", "output_padding": 1}),
    ("ConvolutionBackpropData-1", {"diff_dst": (1, 4, 4, 6), "weights": (3, 3, 2, 6),
                                   "dst_shape": (8, 7)},
     {"strides": 2, "auto_pad": "same_upper"}),
    ("ConvolutionBackwardWeights", {"src": (2, 7, 6, 4), "diff_dst": (2, 4, 3, 6),
                                    "weights_shape": (3, 3)},
     {"strides": 2, "groups": 2, "auto_pad": "same_lower"}),
    ("ConvTransposeBackwardData", {"diff_dst": (1, 9, 8, 3), "weights": (3, 3, 3, 2)},
     {"strides": 2, "auto_pad": "same_upper", "output_padding": (1, 0)}),
    ("ConvTransposeBackwardWeights", {"src": (2, 5, 4), "diff_dst": (2, 11, 3),
                                      "weights_shape": (3, 3, 4)},
     {"strides": 2, "output_padding": 1, "pads_begin": 1, "pads_end": 0}),
]


def _argv(op: str, shapes: dict, attrs: dict) -> list[str]:
    argv = ["shape", op]
    for key, value in {**shapes, **attrs}.items():
        flag = "--" + key.replace("_", "-")
        argv += [flag, _dims(value) if isinstance(value, tuple) else str(value)]
    return argv


@pytest.mark.parametrize(("op", "shapes", "attrs"), SHAPE_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(SHAPE_CASES)])
def test_shape_agrees_with_infer_shape_and_the_oracle(capsys, op, shapes, attrs):
    code, out, err = run(capsys, *_argv(op, shapes, attrs), "--json")
    assert code == 0, err
    got = json.loads(out)
    kw = dict(attrs)
    if op == "ConvTranspose" and "dst_shape" in shapes:  # a keyword there, not positional
        kw["dst_shape"] = shapes["dst_shape"]
    positional = [v for k, v in shapes.items() if k not in kw]
    plan = polyconv.infer_shape(op, *positional, **kw)
    assert tuple(got["shape"]) == plan.shape
    assert tuple(got["pads_begin"]) == plan.pads_begin
    assert tuple(got["pads_end"]) == plan.pads_end
    assert tuple(got["output_padding"]) == plan.output_padding
    # independently: the oracle's geometry, written from docs/semantics.md only
    arrays = {k: v for k, v in shapes.items() if not k.endswith("_shape") and k != "bias"}
    extra = {k: v for k, v in shapes.items() if k.endswith("_shape")}
    geo = oracle.geometry(op, *arrays.values(), **extra, **attrs)
    assert tuple(got["shape"]) == tuple(geo.output_shape)
    assert tuple(got["pads_begin"]) == tuple(geo.pads_begin)
    assert tuple(got["pads_end"]) == tuple(geo.pads_end)
    # the text form says the same
    code, text, _ = run(capsys, *_argv(op, shapes, attrs))
    assert code == 0
    assert f"shape {plan.shape}" in text.splitlines()[0]
    assert f"pads_begin      {plan.pads_begin}" in text


def test_shape_op_names_are_case_and_separator_insensitive(capsys):
    for op in ("ConvTranspose", "convtranspose", "conv_transpose", "CONV-TRANSPOSE"):
        code, out, _ = run(capsys, "shape", op, "--src", "1x4x4x3", "--weights", "3,3,2,3",
                           "--json")
        assert code == 0 and json.loads(out)["function"] == "conv_transpose"


# --------------------------------------------------------------------------------------------
# bad arguments: one line on stderr, exit status 2, no traceback
# --------------------------------------------------------------------------------------------

BAD = {
    "no command": ([], "required"),
    "unknown command": (["frobnicate"], "invalid choice"),
    "unknown option": (["shape", "Convolution", "--frob", "1"], "unrecognized arguments"),
    "unknown op": (["shape", "Conv", "--src", "1x5x5x2", "--weights", "3x3x2x4"],
                   "unknown op 'Conv'"),
    "not a shape": (["shape", "Convolution", "--src", "1x5xfive", "--weights", "3x3x2x4"],
                    "argument --src"),
    "not an int list": (["shape", "Convolution", "--src", "1x5x5x2", "--weights", "3x3x2x4",
                         "--strides", "2,b"], "argument --strides"),
    "groups not an int": (["shape", "Convolution", "--src", "1x5x5x2", "--weights",
                           "3x3x2x4", "--groups", "1.5"], "argument --groups"),
    "zero stride (ValueError)": (["shape", "Convolution", "--src", "1x5x5x2", "--weights",
                                  "3x3x2x4", "--strides", "0"], "strides must be positive"),
    "unknown auto_pad": (["shape", "Convolution", "--src", "1x5x5x2", "--weights", "3x3x2x4",
                          "--auto-pad", "middle"], "unknown auto_pad 'middle'"),
    "unknown data_format": (["shape", "Convolution", "--src", "1x5x5x2", "--weights",
                             "3x3x2x4", "--data-format", "NHCW"], "unknown data_format"),
    "output_padding >= stride": (["shape", "ConvTranspose", "--src", "1x5x5x2", "--weights",
                                  "3x3x4x2", "--strides", "2", "--output-padding", "2"],
                                 "output_padding must be in [0, stride)"),
    "output_padding on Convolution": (["shape", "Convolution", "--src", "1x5x5x2",
                                       "--weights", "3x3x2x4", "--output-padding", "1"],
                                      "unexpected keyword argument 'output_padding'"),
    "channel mismatch": (["shape", "Convolution", "--src", "1x5x5x3", "--weights",
                          "3x3x2x4"], "does not match the data channels"),
    "empty output": (["shape", "Convolution", "--src", "1x2x2x2", "--weights", "3x3x2x4"],
                     "would be empty"),
    "attribute length": (["shape", "Convolution", "--src", "1x5x5x2", "--weights",
                          "3x3x2x4", "--strides", "1,2,3"], "one entry per spatial axis"),
    "missing shape (TypeError)": (["shape", "ConvolutionBackwardWeights", "--src", "1x5x5x2",
                                   "--diff-dst", "1x3x3x4"], "weights_shape is required"),
    "missing input": (["shape", "Convolution", "--src", "1x5x5x2"],
                      "missing the shape of required input 'weights'"),
    "input the op does not take": (["shape", "Convolution", "--src", "1x5x5x2", "--weights",
                                    "3x3x2x4", "--diff-dst", "1x3x3x4"],
                                   "Convolution does not take --diff-dst"),
    "unknown backend": (["compare", "--op", "Convolution", "--src", "1x5x5x2", "--weights",
                         "3x3x2x4", "--backends", "nope"], "unknown backend 'nope'"),
    "unknown dtype": (["compare", "--dtypes", "float8"], "unknown dtype 'float8'"),
    "attributes without shapes": (["compare", "--strides", "2"], "need input shapes"),
    "compare with a bad geometry": (["compare", "--op", "ConvTranspose", "--src", "1x5x5x2",
                                     "--weights", "3x3x4x2", "--pads-begin", "-1"],
                                    "pads_begin must be non-negative"),
    "compare op needs weights": (["compare", "--op", "ConvTranspose", "--src", "1x5x5x2"],
                                 "ConvTranspose needs --weights"),
    "compare op needs src": (["compare", "--op", "ConvTransposeBackwardData", "--weights",
                              "3x3x4x2"], "needs --diff-dst (or --src to derive it from)"),
    "no op fits the shapes": (["compare", "--src", "1x5x5x3", "--weights", "3x3x2x4"],
                              "no op accepts these shapes"),
    "compare with --src only": (["compare", "--src", "1x8x8x4"],
                                "no op accepts these shapes and attributes: Convolution, "
                                "ConvolutionBackwardData, ConvTranspose and "
                                "ConvTransposeBackwardData need --weights; "
                                "ConvolutionBackwardWeights and ConvTransposeBackwardWeights "
                                "need --weights-shape (or --weights)"),
}


@pytest.mark.parametrize("argv,match", BAD.values(), ids=BAD.keys())
def test_bad_arguments_are_one_clean_line(capsys, argv, match):
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("polyconv: error: ")
    assert match in lines[0]
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [["compare", "--src", "1x8x8x4"],
                                  ["compare", "--weights", "3x3x4x4", "--backends", "numpy"]])
def test_compare_names_each_op_once(capsys, argv):
    """No "Convolution: Convolution needs --weights": an op is named once per reason."""
    _, _, err = run(capsys, *argv)
    for op in ("Convolution", "ConvTranspose", "ConvolutionBackwardData"):
        assert f"{op}: {op} " not in err, err
        assert f"{op} needs" not in err.replace(f"skipping {op}: ", ""), err


def test_bad_arguments_in_a_real_process():
    proc = subprocess.run([sys.executable, "-m", "polyconv", "shape", "ConvTranspose",
                           "--src", "1x5x5x2", "--weights", "3x3x4x2", "--strides", "2",
                           "--output-padding", "3"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("polyconv: error: conv_transpose: output_padding")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_help_and_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "compare" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert polyconv.__version__ in capsys.readouterr().out


# --------------------------------------------------------------------------------------------
# polyconv compare
# --------------------------------------------------------------------------------------------

SMALL = ["--op", "ConvTranspose", "--src", "2x5x4x6", "--weights", "3x3x2x6", "--strides", "2",
         "--groups", "3", "--pads-begin", "1,0", "--pads-end", "0x1", "--output-padding", "1"]


def test_compare_one_op(capsys):
    code, out, err = run(capsys, "compare", *SMALL, "--dtypes", "f32,bf16")
    assert code == 0, out + err
    assert "FAIL" not in out and "ERROR" not in out
    assert out.strip().splitlines()[-1].startswith("polyconv compare: OK, all ")
    assert out.strip().splitlines()[-3].startswith("ran 2 comparisons on ")
    for backend in polyconv.available_backends():
        assert backend in out


def test_compare_json(capsys):
    code, out, _ = run(capsys, "compare", *SMALL, "--json", "--backends", "numpy")
    assert code == 0
    report = json.loads(out)
    assert report["ok"] is True and report["backends"] == ["numpy"]
    assert report["dtypes"] == ["float32", "float16", "bfloat16"]
    assert len(report["comparisons"]) == 3
    expected = polyconv.infer_shape("ConvTranspose", (2, 5, 4, 6), (3, 3, 2, 6), strides=2,
                                    groups=3, pads_begin=(1, 0), pads_end=(0, 1),
                                    output_padding=1).shape
    for c in report["comparisons"]:
        assert c["op"] == "conv_transpose" and tuple(c["shape"]) == expected
        assert c["input_shapes"]["bias"] == [6]
        assert c["results"][0]["ok"] is True


def test_compare_derives_the_backward_inputs(capsys):
    code, out, err = run(capsys, "compare", "--src", "1x6x5x4", "--weights", "3x3x4x4",
                         "--strides", "2", "--auto-pad", "same_upper", "--backends", "numpy",
                         "--dtypes", "float32", "--json")
    assert code == 0, err
    ops = [c["op"] for c in json.loads(out)["comparisons"]]
    assert ops == ["convolution", "convolution_backward_data", "convolution_backward_weights",
                   "conv_transpose", "conv_transpose_backward_data",
                   "conv_transpose_backward_weights"]


def test_compare_skips_ops_that_reject_the_attributes(capsys):
    code, out, err = run(capsys, "compare", "--src", "1x5x5x4", "--weights", "3x3x4x4",
                         "--strides", "2", "--output-padding", "1", "--backends", "numpy",
                         "--dtypes", "float32", "--json")
    assert code == 0, err
    assert "skipping Convolution:" in err
    ops = {c["op"] for c in json.loads(out)["comparisons"]}
    assert "convolution" not in ops and "conv_transpose" in ops


def test_builtin_suite_on_numpy(capsys):
    code, out, err = run(capsys, "compare", "--backends", "numpy", "--dtypes", "float32")
    assert code == 0, out
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("polyconv compare: ")
    # the verdict sends the reader to a page they can open, not to a document outside
    # the repository
    assert 'within the error bound of the docs page "The numerical contract"' in summary
    assert "SPEC" not in out
    for op in ("Convolution", "ConvolutionBackwardData", "ConvolutionBackwardWeights",
               "ConvTranspose", "ConvTransposeBackwardData", "ConvTransposeBackwardWeights"):
        assert f"\n{op} " in out
    for word in ("same_upper", "same_lower", "valid", "output_padding", "grouped",
                 "depthwise", "dilated", "1d", "3d", "dst_shape"):
        assert word in out
    assert "[1/" in err.replace(" ", "")  # progress goes to stderr


def test_builtin_suite_filtered_by_op(capsys):
    code, out, _ = run(capsys, "compare", "--op", "ConvTransposeBackwardWeights",
                       "--backends", "numpy", "--dtypes", "bf16", "--json", "-q")
    assert code == 0
    ops = {c["op"] for c in json.loads(out)["comparisons"]}
    assert ops == {"conv_transpose_backward_weights"}


class _Wrong:
    """Correct shapes and dtypes, wrong values: the numpy backend's result plus one."""

    name = "wrong"

    def __init__(self):
        self.inner = _backends.get_backend("numpy")

    def forward(self, plan, *args):
        return self._plus_one(self.inner.forward(plan, *args))

    def backward_data(self, plan, *args):
        return self._plus_one(self.inner.backward_data(plan, *args))

    def backward_weights(self, plan, *args):
        return self._plus_one(self.inner.backward_weights(plan, *args))

    @staticmethod
    def _plus_one(y):
        return (y.astype("float64") + 1.0).astype(y.dtype)


def test_compare_exits_1_when_a_backend_breaks_the_bound(capsys, monkeypatch):
    monkeypatch.setitem(_backends._LOADED, "wrong", _Wrong())
    code, out, _ = run(capsys, "compare", *SMALL, "--backends", "numpy,wrong", "--dtypes",
                       "float32")
    assert code == 1
    assert "FAILED: wrong" in out
    assert "1 of 2 results FAILED" in out.splitlines()[-1]
    code, out, _ = run(capsys, "compare", "--op", "Convolution", "--backends", "numpy,wrong",
                       "--dtypes", "float32", "-q")
    assert code == 1 and "FAIL" in out and "failures:" in out
    code, out, _ = run(capsys, "compare", *SMALL, "--backends", "wrong", "--json")
    assert code == 1 and json.loads(out)["ok"] is False


# --------------------------------------------------------------------------------------------
# polyconv backends
# --------------------------------------------------------------------------------------------


def test_backends_lists_every_registered_backend(capsys):
    code, out, _ = run(capsys, "backends", "--json")
    assert code == 0
    info = {b["name"]: b for b in json.loads(out)}
    assert set(info) == set(polyconv.registered_backends())
    for name in polyconv.available_backends():
        assert info[name]["available"] is True
    assert "numpy" in info["numpy"]["versions"]
    code, text, _ = run(capsys, "backends")
    assert code == 0 and text.splitlines()[0].split()[:2] == ["backend", "available"]


def test_backends_copes_with_a_missing_backend(capsys, monkeypatch):
    entry = _backends.BackendEntry("ghost", "polyconv_ghost_not_installed",
                                   ("ghost_lib_not_installed",), "not here")
    monkeypatch.setitem(_backends._BUILTIN, "ghost", entry)
    code, out, _ = run(capsys, "backends", "--json")
    assert code == 0
    ghost = {b["name"]: b for b in json.loads(out)}["ghost"]
    assert ghost["available"] is False and ghost["devices"] is None


def test_bench_smoke(tmp_path, capsys):
    # the suite runs end to end (one round, one case) and writes its JSON; timings are not
    # asserted, only the structure and the arithmetic relating its fields
    from polyconv.benchmarks import report, suite

    out = tmp_path / "bench.json"
    assert suite.main(["--repeats", "1", "--warmup", "0", "--lead-in", "0",
                       "--cases", "depthwise", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["machine"]["cpus"] >= 1 and results["matmul_gflops"] > 0
    (case,) = results["cases"]
    assert case["case"] == "ConvTranspose 2D depthwise g64"
    times = case["median_s"]
    assert times["polyconv-numpy"] > 0
    for name, t in times.items():
        assert case["speed_vs_numpy"][name] == pytest.approx(times["polyconv-numpy"] / t)
        assert case["gflops"][name] == pytest.approx(case["gflop"] / t)
    assert set(times) | set(case["skipped"]) == {c.name for c in suite.COMPETITORS}
    assert 0 < case["numpy_peak_extra_memory_ratio"] <= 2
    assert "ConvTranspose 2D depthwise g64" in capsys.readouterr().out
    assert "depthwise" in report.suite_markdown(results)


def test_bench_corpus_smoke(tmp_path, capsys):
    # the real-model corpus runs end to end through `polyconv bench --corpus` (one layer, one
    # round) and writes its JSON; only structure and the ratios' arithmetic are asserted
    from polyconv.benchmarks import corpus
    from polyconv.benchmarks import report as corpus_report

    out = tmp_path / "corpus.json"
    assert main(["bench", "--corpus", "--layers", "DCGAN G: ConvT 64->3", "--repeats", "1",
                       "--warmup", "0", "--competitors",
                       "polyconv-jax,polyconv-jax backward ops,lax,polyconv-numpy",
                       "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    rows = results["layers"]
    assert [r["mode"] for r in rows] == ["forward", "gradient"]
    for row in rows:
        assert row["layer"] == "DCGAN G: ConvT 64->3 k4 s2 32x32"
        assert row["source"].startswith("pytorch/examples dcgan")
        assert row["median_s"]["polyconv-numpy"] > 0
        if "polyconv-jax" in row["median_s"]:
            t = row["median_s"]
            assert corpus_report.ratios(row)["jax/lax"] == pytest.approx(
                t["polyconv-jax"] / t["lax"])
        if "polyconv-jax" in row["median_s"] and row["mode"] == "gradient":
            # the gradient is its backward ops' program, and the tables say so
            assert ["polyconv-jax", "polyconv-jax backward ops"] in row["same_program"]
            assert f"{corpus_report.ratios(row)['jax/own ops']:.2f}=" in (
                corpus_report.format_markdown(results))
    assert "DCGAN G: ConvT 64->3" in capsys.readouterr().out
    assert ("| DCGAN G: ConvT 64->3 k4 s2 32x32 | gradient |"
            in corpus_report.format_markdown(results))
    # every layer resolves (its shapes are a valid call) and names its public source
    for layer in corpus.LAYERS:
        assert layer.plan.shape and layer.source and layer.flops > 0


def test_bench_corpus_on_gpu_reports_what_could_not_run(tmp_path, monkeypatch):
    # `--device gpu` runs JAX on its default device and the CUDA peers; on a machine without
    # CUDA the PyTorch and CuPy peers are skipped with their reason, not silently dropped
    pytest.importorskip("jax")
    from polyconv.benchmarks import harness
    from polyconv.benchmarks import report as corpus_report

    queued = []
    timed_call = harness.timed_call
    monkeypatch.setattr(harness, "timed_call", lambda fn, n=1, q=False: (
        queued.append((n, q)), timed_call(fn, n, q))[1])

    out = tmp_path / "gpu.json"
    assert main(["bench", "--corpus", "--device", "gpu", "--batch-scale", "2", "--layers",
                       "DCGAN G: ConvT 64->3", "--modes", "forward", "--repeats", "1",
                       "--warmup", "0", "--competitors", "polyconv-jax,lax,torch,polyconv-cupy",
                       "--queued", "3", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    (row,) = results["layers"]
    assert results["machine"]["queued_calls"] == 3 and set(queued) == {(3, True)}
    assert "calls queued per timing 3" in corpus_report.format_markdown(results)
    assert set(row["median_s"]) | set(row["skipped"]) == {"polyconv-jax", "lax", "torch",
                                                          "polyconv-cupy"}
    assert results["machine"]["batch_scale"] == 2 and "jax_device" in results["machine"]
    # the batch doubled: 32 images of 32x32 inputs, 64 -> 3 channels, 16 taps each
    assert row["gflop"] == pytest.approx(2 * (16 * 2) * 32 * 32 * 64 * 3 * 16 / 1e9)
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        assert "torch" in row["skipped"]


def test_bench_corpus_time_limit_and_several_layers(tmp_path, monkeypatch):
    # `--layers a|b` takes every layer matching one of the parts, in the corpus's order; with
    # --json the record is written after every row (a run cut short keeps its rows), and
    # `--time-limit` starts no row past it, listing those left
    from polyconv.benchmarks import corpus
    from polyconv.benchmarks import main as bench

    out = tmp_path / "corpus.json"
    argv = ["--corpus", "--layers", "MNIST|dcgan g: convt 64->3", "--modes", "forward",
            "--repeats", "1", "--warmup", "0", "--competitors", "polyconv-numpy",
            "--json", str(out)]
    assert bench(argv) == 0
    results = json.loads(out.read_text())
    assert [r["layer"] for r in results["layers"]] == ["DCGAN G: ConvT 64->3 k4 s2 32x32",
                                                       "MNIST CNN: Conv 1->32 k3 28x28 NCX"]
    assert "not_run" not in results
    assert bench([*argv, "--time-limit", "0"]) == 0
    results = json.loads(out.read_text())
    assert results["layers"] == [] and results["not_run"] == [
        "DCGAN G: ConvT 64->3 k4 s2 32x32 forward", "MNIST CNN: Conv 1->32 k3 28x28 NCX forward"]
    run_layer = corpus.run_layer

    def second_fails(layer, *args):
        if layer.title.startswith("MNIST"):
            raise KeyboardInterrupt
        return run_layer(layer, *args)

    monkeypatch.setattr(corpus, "run_layer", second_fails)
    with pytest.raises(KeyboardInterrupt):
        bench(argv)
    assert [r["layer"] for r in json.loads(out.read_text())["layers"]] == [
        "DCGAN G: ConvT 64->3 k4 s2 32x32"]
    # an empty part matches nothing more (not every layer); no text matches every layer
    assert corpus.matching_layers("no such layer|") == []
    assert [ly.title for ly in corpus.matching_layers("|mnist")] == [
        "MNIST CNN: Conv 1->32 k3 28x28 NCX"]
    assert len(corpus.matching_layers("")) == len(corpus.LAYERS)
    assert corpus.matching_layers("mnist", 3)[0].src[0] == 3 * 64
    with pytest.raises(SystemExit):
        bench([*argv, "--queued", "0"])


def test_queued_timing_issues_the_calls_back_to_back_and_waits_once():
    # `--queued N`: N calls issued, one wait, the time divided by N; where a competitor cannot
    # queue (a synchronous call) it is called N times
    from polyconv.benchmarks.harness import Jitted, Waited, timed_call

    log = []
    waited = Waited(lambda: log.append("call"), lambda: (log.append("wait"), time.sleep(0.05)))
    per_call = timed_call(waited, 5, queued=True)
    assert log == ["call"] * 5 + ["wait"]
    assert 0.05 / 5 <= per_call < 0.05
    log.clear()
    assert timed_call(waited) >= 0.05 and log == ["call", "wait"]
    log.clear()
    assert timed_call(waited, 2) >= 0.05 and log == ["call", "wait"] * 2
    log.clear()
    timed_call(lambda: log.append("sync"), 3, queued=True)
    assert log == ["sync"] * 3
    jax = pytest.importorskip("jax")
    calls = []
    step = jax.jit(lambda a: a + 1.0)

    def counted(a):
        calls.append(a)
        return step(a)

    assert float(Jitted(counted, (jax.numpy.float32(1.0),)).queued(4)) == 2.0
    assert len(calls) == 4


def test_corpus_ratios_take_pytorchs_best_full_precision_configuration():
    # on CUDA PyTorch runs in two memory formats (the faster is the peer) and with TF32,
    # which is reported apart: it is not the same arithmetic
    from polyconv.benchmarks.report import ratios

    row = {"median_s": {"polyconv-jax": 2.0, "torch": 4.0, "torch NCX": 1.0, "torch tf32": 0.5,
                        "polyconv-torch": 1.5, "polyconv-cupy": 3.0, "lax": 2.0}}
    assert ratios(row) == {"jax/lax": 1.0, "jax/torch": 2.0, "jax/torch tf32": 4.0,
                           "polyconv-torch/torch": 1.5, "cupy/torch": 3.0}


def test_records_name_the_environment_settings_that_change_kernels(monkeypatch):
    # XLA's CPU options and glibc's arena count change what a run measures: a record that
    # ran under them says so, in its JSON and in the docs' table, and one without them
    # names none
    from polyconv.benchmarks import harness as suite
    from polyconv.benchmarks import report as corpus_report

    flags = "--xla_cpu_experimental_ynn_fusion_type=dot"
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    plain = suite.machine()
    assert not {"xla_flags", "malloc_arena_max", "openblas_coretype"} & set(plain)
    monkeypatch.setenv("XLA_FLAGS", flags)
    monkeypatch.setenv("MALLOC_ARENA_MAX", "1")
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    m = suite.machine()
    assert (m["xla_flags"], m["malloc_arena_max"]) == (flags, "1")
    assert m["openblas_coretype"] == "Haswell"
    line = corpus_report.format_markdown({"machine": m, "layers": []}).splitlines()[0]
    assert f"XLA_FLAGS {flags}" in line and "MALLOC_ARENA_MAX 1" in line
    assert "OPENBLAS_CORETYPE Haswell" in line


def test_the_machine_record_names_versions_without_importing_the_libraries():
    # the corpus writes its record after every row: reading PyTorch's and JAX's versions must
    # not import them (PyTorch's thread pools would start between the timings); the versions
    # are those the libraries report once imported
    code = ("import json, sys\n"
            "from polyconv.benchmarks import harness\n"
            "m = harness.machine()\n"
            "loaded = [mod for mod in ('jax', 'torch') if mod in sys.modules]\n"
            "own = {mod: __import__(mod).__version__ for mod in ('jax', 'torch') if mod in m}\n"
            "print(json.dumps([loaded, {mod: m[mod] for mod in own}, own]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    loaded, recorded, own = json.loads(out.splitlines()[-1])
    assert loaded == [] and recorded == own


def test_bench_cases_filter_matching_nothing_is_an_error(capsys):
    from polyconv.benchmarks import suite

    with pytest.raises(SystemExit) as exc:
        suite.main(["--cases", "no such case"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "'no such case' matches no case name" in err and "ConvTranspose 3D" in err


def test_bench_competitors_selects(tmp_path, capsys):
    # --competitors runs only the named ones; without polyconv-numpy (the baseline) the table
    # gives times without ratios
    from polyconv.benchmarks import suite

    out = tmp_path / "bench.json"
    assert suite.main(["--repeats", "1", "--warmup", "0", "--lead-in", "0", "--cases",
                       "depthwise", "--competitors", "polyconv-numpy", "--json", str(out)]) == 0
    (case,) = json.loads(out.read_text())["cases"]
    assert set(case["median_s"]) == {"polyconv-numpy"}
    pytest.importorskip("jax")
    assert suite.main(["--repeats", "1", "--warmup", "0", "--lead-in", "0", "--cases",
                       "depthwise", "--competitors", "polyconv-jax", "--json", str(out)]) == 0
    (case,) = json.loads(out.read_text())["cases"]
    assert set(case["median_s"]) == {"polyconv-jax"}
    assert case["speed_vs_numpy"]["polyconv-jax"] is None
    row = [line for line in capsys.readouterr().out.splitlines()
           if line.startswith("ConvTranspose 2D depthwise g64")][-1]
    assert "ms" in row and " x" not in row


@pytest.mark.parametrize(("bench", "named"), [("suite", "polyconv-torch"),
                                               ("corpus", "polyconv-numpy")])
def test_bench_refuses_an_unknown_competitor(bench, named, capsys):
    # a usage error naming the unknown one and the competitors there are (no jax needed)
    module = importlib.import_module(f"polyconv.benchmarks.{bench}")
    with pytest.raises(SystemExit) as exc:
        module.main(["--competitors", "polyconv-numpy,nope"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown nope" in err and named in err


def test_bench_lead_in_lasts_its_calls_and_its_time(monkeypatch):
    from polyconv.benchmarks import harness

    monkeypatch.setattr(harness, "LEAD_IN_SECONDS", 0.02)
    calls = []
    t0 = time.perf_counter()
    harness.lead_in(lambda: calls.append(1), 3)
    assert time.perf_counter() - t0 >= 0.02 and len(calls) >= 3
    calls.clear()
    monkeypatch.setattr(harness, "LEAD_IN_SECONDS", 0.0)
    harness.lead_in(lambda: calls.append(1), 3)
    assert len(calls) == 3


def test_bench_torch_tensors_are_torch_allocated():
    # numpy's allocations may be 16-byte aligned only, which slows oneDNN: every torch
    # competitor gets a copy in torch's memory, equal to the array
    torch = pytest.importorskip("torch")
    from polyconv.benchmarks import harness

    a = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)
    view = np.moveaxis(a, -1, 1)
    t = harness.torch_tensor(view, torch.float32)
    assert t.is_contiguous() and t.data_ptr() % 64 == 0
    assert t.data_ptr() != a.ctypes.data
    np.testing.assert_array_equal(t.numpy(), view)


def test_bench_threads_reruns_pinned(tmp_path):
    # --threads reruns the suite in a process whose libraries all use that many threads
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "polyconv.benchmarks", "--threads", "1",
                           "--repeats", "1", "--warmup", "0", "--lead-in", "0",
                           "--cases", "depthwise", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    assert results["machine"]["threads"] == 1
    assert "every library on 1 thread(s)" in proc.stdout


#: small cases of each kind of the suite, with IC != OC so that a swapped weights layout shows
def _small_cases(suite):
    return [
        suite._ct("ConvTranspose", 2, (5, 6), 4, 6, 3, 2, 1, 1),
        suite._ct("grouped", 2, (5, 6), 4, 6, 3, 2, 1, 1, groups=2),
        suite._ct("1-D", 2, (9,), 4, 6, 4, 2, 1, 0),
        suite._ct("3-D", 1, (3, 4, 3), 4, 6, 3, 2, 1, 1),
        suite.Case("Convolution", "convolution", ((2, 7, 6, 4), (3, 3, 4, 6)),
                   dict(strides=2, pads_begin=1, pads_end=0)),
        suite.Case("Convolution grouped", "convolution", ((2, 7, 6, 4), (3, 3, 2, 6)),
                   dict(strides=2, pads_begin=1, pads_end=1, groups=2)),
        suite.Case("ConvolutionBackwardData", "convolution_backward_data",
                   ((2, 4, 3, 6), (3, 3, 4, 6)), dict(strides=2, pads_begin=1, pads_end=1),
                   extra=((7, 6),)),
        suite.Case("ConvolutionBackwardWeights", "convolution_backward_weights",
                   ((2, 7, 6, 4), (2, 7, 6, 6)), dict(pads_begin=1, pads_end=1),
                   extra=((3, 3, 4, 6),)),
        suite.Case("ConvTransposeBackwardWeights", "conv_transpose_backward_weights",
                   ((2, 5, 4, 4), (2, 10, 8, 6)),
                   dict(strides=2, pads_begin=1, pads_end=1, output_padding=1, groups=2),
                   extra=((3, 3, 3, 4),)),
    ]


@pytest.mark.parametrize("peer", ["lax", "torch"])
def test_bench_peers_compute_each_op(peer):
    """Each peer computes the op it is timed against, on small cases of each kind of the
    suite: its output, in its own layout, is polyconv's (numpy backend) in polyconv's."""
    pytest.importorskip({"lax": "jax", "torch": "torch"}[peer])
    from polyconv.benchmarks import harness, peers, suite

    for case in _small_cases(suite):
        plan = case.plan
        arrays = harness.random_arrays(case.shapes, case.dtype)
        want = getattr(polyconv, case.op)(*arrays, *case.extra, backend="numpy", **case.attrs)
        call = getattr(peers, peer)(plan, "forward", suite.operands(case, arrays), case.dtype)
        if call is None:           # PyTorch has no asymmetric pads but in a forward
            assert peer == "torch" and plan.pads_begin != plan.pads_end, case.name
            continue
        got = call()
        if peer == "torch":
            got = got[1] if isinstance(got, tuple) else got
            got = got.numpy()
            if plan.primitive == "backward_weights":   # canonical [Cb, Ca/G, K..]
                want = np.transpose(want, plan.weights_perm)
            else:                                      # NCX
                got = np.moveaxis(got, 1, -1)
        elif plan.primitive == "backward_weights":     # lax's [K.., I, O]
            want = peers.lax_weights(plan, "forward", np.transpose(want, plan.weights_perm))
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4,
                                   err_msg=f"{peer}: {case.name}")


@pytest.mark.parametrize("peer", ["lax", "torch"])
def test_bench_peers_compute_each_layers_gradient(peer):
    """In a corpus row's gradient mode each peer gives the cotangents of the layer's input
    and weights: polyconv's two backward ops, for a Convolution and a grouped ConvTranspose
    in both layouts."""
    pytest.importorskip({"lax": "jax", "torch": "torch"}[peer])
    from polyconv.benchmarks import corpus, peers
    from polyconv.benchmarks.corpus_layers import _conv, _ct

    layers = [_conv("m", "conv", (2, 9, 8), 4, 6, 3, 2, 1),
              _conv("m", "conv NCX", (2, 9, 8), 4, 6, 3, 1, 1, groups=2, fmt="NCX"),
              _ct("m", "convT", (2, 5, 4), 4, 6, 3, 2, 1, op=1, groups=2),
              _ct("m", "convT NCX", (2, 5), 6, 4, 4, 2, 1, fmt="NCX")]
    for layer in layers:
        plan = layer.plan
        x, w, g = corpus._inputs(layer)
        want = corpus.polyconv_eager(layer, "gradient", (x, w, g))()
        dx, dw = getattr(peers, peer)(plan, "gradient", (x, w, g), layer.dtype)()[:2]
        dx, dw = np.asarray(dx), np.asarray(dw)
        if peer == "torch":
            dx = np.moveaxis(dx, 1, -1) if plan.channels_last else dx
            want_w = np.transpose(want[1], plan.weights_perm)
        else:
            want_w = peers.lax_weights(plan, plan.primitive,
                                       np.transpose(want[1], plan.weights_perm))
        np.testing.assert_allclose(dx, want[0], rtol=1e-4, atol=1e-4, err_msg=layer.name)
        np.testing.assert_allclose(dw, want_w, rtol=1e-4, atol=1e-4, err_msg=layer.name)
