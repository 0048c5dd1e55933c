"""The test matrix, one session per backend, plus lint.

``nox`` runs every default session; ``nox -s "tests(numpy)"`` runs one backend's tests. Each
test session sets ``POLYCONV_TEST_BACKENDS`` so that a backend that fails to install is an
error, not a skip.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "tests", "frameworks", "docs", "examples"]
nox.options.reuse_existing_virtualenvs = True

PYPROJECT = nox.project.load_toml("pyproject.toml")
TEST_DEPS = nox.project.dependency_groups(PYPROJECT, "test")


# CPU-only PyTorch, never the CUDA build: the exact local version "+cpu" exists only on
# PyTorch's CPU index (and in local wheel caches), so no resolver can substitute the CUDA wheel
# and its nvidia-* dependencies. macOS wheels are CPU-only and carry no local version.
TORCH_VERSION = "2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

#: backend -> (what to install, whether CPU torch too, the test targets it runs: see
#: tests/conftest.py TARGETS). Each target runs in exactly one session; the tests that need no
#: backend (geometry, oracle, command line, packaging) run once, in the numpy session, which
#: has torch as the independent reference of tests/test_vs_torch.py. The torch session has
#: JAX too, so that the PyTorch porting example meets both libraries.
BACKENDS = {
    "numpy": (".", True, "numpy"),
    "jax": (".[jax]", False, "jax"),
    "array_api": (".[jax,array-api]", False, "array_api-strict,array_api-numpy,array_api-jax"),
    "torch": (".[jax,array-api]", True, "torch,array_api-torch"),
}


def _install_torch(session: nox.Session, backend: str) -> None:
    """CPU torch; where it cannot be installed the torch session is skipped visibly and the
    numpy session runs without its torch comparisons (they skip visibly too)."""
    import sys

    from nox.command import CommandFailed

    spec = f"torch=={TORCH_VERSION}" + ("" if sys.platform == "darwin" else "+cpu")
    try:
        session.install(spec, "--extra-index-url", TORCH_CPU_INDEX)
    except CommandFailed as exc:
        why = f"torch is not installable here: `pip install {spec}` failed ({exc})"
        if backend == "torch":
            session.skip(why)
        session.warn(why)


#: what the tests that need no backend (run in the numpy session) need besides: the
#: benchmarks page's plots, drawn by tests/test_records.py
NO_BACKEND_DEPS = ["matplotlib>=3.7"]


@nox.session
@nox.parametrize("backend", list(BACKENDS), ids=list(BACKENDS))
def tests(session: nox.Session, backend: str) -> None:
    """The shared matrix on one backend's targets, plus that backend's own tests
    (``nox -s "tests(jax)"`` runs one; the torch session uses CPU torch and is skipped visibly
    when torch cannot be installed here)."""
    install, with_torch, targets = BACKENDS[backend]
    session.install(install, *TEST_DEPS, *(NO_BACKEND_DEPS if backend == "numpy" else ()))
    if with_torch:
        _install_torch(session, backend)
    session.run("pytest", "-n", "auto", *session.posargs,
                env={"POLYCONV_TEST_BACKENDS": targets})


#: the tests that meet other frameworks' own runtimes (tests/conftest.py routes them to the
#: ``frameworks`` group): the dialects, the weight converter, the peers of ``compare --peers``
#: and the exported cases; the layers' tests join here
FRAMEWORK_TESTS = ["tests/test_weights.py", "tests/test_dialect_*.py", "tests/test_layers_*.py",
                   "tests/test_peers.py"]
#: what they run against: TensorFlow's CPU wheel (about 20 s to install from a warm cache,
#: its tests about 5 s) meets tests/test_dialect_tensorflow.py; the other Keras tests run on
#: Keras's JAX backend
FRAMEWORK_DEPS = [".[jax,onnx,openvino,flax,equinox,keras]", "optax",
                  "tensorflow-cpu; sys_platform != 'darwin'",
                  "tensorflow; sys_platform == 'darwin'"]


@nox.session
def frameworks(session: nox.Session) -> None:
    """The dialects, the weight converter and the layers against each framework's own
    runtime: onnxruntime and the ONNX reference, OpenVINO, PyTorch (CPU), TensorFlow, Keras
    (JAX backend, and its TensorFlow backend for the Keras dialect), Flax, ``lax`` and
    oneDNN's published benchdnn cases."""
    import pathlib

    session.install(*FRAMEWORK_DEPS, *TEST_DEPS)
    _install_torch(session, "frameworks")
    files = sorted({str(p) for pattern in FRAMEWORK_TESTS for p in pathlib.Path().glob(pattern)})
    session.run("pytest", "-n", "2", *files, *session.posargs,
                env={"POLYCONV_TEST_BACKENDS": "frameworks", "KERAS_BACKEND": "jax"})
    session.run("pytest", "tests/test_dialect_tensorflow.py", "-k", "keras", *session.posargs,
                env={"POLYCONV_TEST_BACKENDS": "frameworks", "KERAS_BACKEND": "tensorflow"})


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation, with warnings as errors (figures and CLI help are generated; the
    layers' API pages import Flax, Equinox, Keras and torch)."""
    session.install(".[jax,flax,equinox,keras]",
                    *nox.project.dependency_groups(PYPROJECT, "docs"))
    _install_torch(session, "docs")
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html",
                *session.posargs, env={"KERAS_BACKEND": "jax"})


@nox.session
def examples(session: nox.Session) -> None:
    """Every script in examples/, each in its own process, as a user would run it (the
    layers' examples need Flax, Equinox, Keras and optax)."""
    session.install(".[jax,flax,equinox,keras]", "optax")
    import pathlib

    for script in sorted(pathlib.Path("examples").glob("*.py")):
        session.run("python", str(script))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole tree."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", ".")


#: the benchmarks ``nox -s bench`` runs, each overwriting its record (all of them by default)
BENCH_RUNS = {"suite": [], "corpus": ["--corpus"], "first-calls": ["--first-calls"],
              "implementations": ["--implementations"], "overhead": ["--overhead"],
              "spatial": ["--spatial"]}


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmarks on this CPU (not tests), each overwriting this machine kind's record for
    the docs' benchmarks page, ``docs/records/<benchmark>-<kind>.json`` (the kind from
    ``polyconv bench --machine-kind``: ``avx512``, ``avx2``...): the suite, the real-model
    corpus, the first calls, every implementation forced, the per-call overhead and spatial
    sharding against XLA's partitioning (hours on 2 CPUs);
    ``nox -s bench -- corpus`` runs the ones named.

    PyTorch is a peer when it can be installed (CPU build only); otherwise it is skipped.
    """
    unknown = set(session.posargs) - set(BENCH_RUNS)
    if unknown:
        session.error(f"unknown benchmarks {sorted(unknown)}; they are {list(BENCH_RUNS)}")
    session.install(".[jax]")
    from nox.command import CommandFailed

    try:
        session.install(f"torch=={TORCH_VERSION}+cpu", "--extra-index-url", TORCH_CPU_INDEX)
    except CommandFailed:
        session.log("torch is not installable here: the PyTorch peer is skipped")
    kind = session.run("polyconv", "bench", "--machine-kind", silent=True).strip()
    for name, flags in BENCH_RUNS.items():
        if name in (session.posargs or BENCH_RUNS):
            session.run("polyconv", "bench", *flags, "--json",
                        f"docs/records/{name}-{kind}.json")


@nox.session(venv_backend="none")
def bench_gpu(session: nox.Session) -> None:
    """The real-model corpus on this machine's CUDA GPU (``--device gpu``), overwriting its
    record (``docs/records/corpus-h200.json`` on an H200). It runs in the current
    environment, which must have polyconv, JAX's CUDA build and a CUDA PyTorch (CuPy too, for
    the array-API backend's row): their builds depend on the machine's CUDA, which nox cannot
    choose. Arguments go to the run (``nox -s bench_gpu -- --time-limit 600``)."""
    kind = session.run("polyconv", "bench", "--machine-kind", silent=True).strip()
    session.run("polyconv", "bench", "--corpus", "--device", "gpu", "--json",
                f"docs/records/corpus-{kind}.json", *session.posargs)
