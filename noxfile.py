"""The test matrix, one session per backend, plus lint.

``nox`` runs every default session; ``nox -s tests-numpy`` runs one. Each test session sets
``POLYCONV_TEST_BACKENDS`` so that a backend that fails to install is an error, not a skip.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "tests-numpy", "tests-jax", "tests-array_api", "tests-torch",
                         "docs", "examples"]
nox.options.reuse_existing_virtualenvs = True

PYPROJECT = nox.project.load_toml("pyproject.toml")
TEST_DEPS = nox.project.dependency_groups(PYPROJECT, "test")


def _pytest(session: nox.Session, targets: str, *extra: str) -> None:
    session.run(
        "pytest", "-n", "auto", *extra, *session.posargs,
        env={"POLYCONV_TEST_BACKENDS": targets},
    )


@nox.session(name="tests-numpy")
def tests_numpy(session: nox.Session) -> None:
    """The shared matrix on the numpy backend."""
    session.install(".", *TEST_DEPS)
    _pytest(session, "numpy")


@nox.session(name="tests-jax")
def tests_jax(session: nox.Session) -> None:
    """The shared matrix on numpy and JAX, plus the JAX-only tests."""
    session.install(".[jax]", *TEST_DEPS)
    _pytest(session, "numpy,jax")


@nox.session(name="tests-array_api")
def tests_array_api(session: nox.Session) -> None:
    """The generic array-API backend on array-api-strict, numpy and jax.numpy arrays."""
    session.install(".[jax,array-api]", *TEST_DEPS)
    _pytest(session, "numpy,array_api-strict,array_api-numpy,array_api-jax")


# CPU-only PyTorch, never the CUDA build: the exact local version "+cpu" exists only on
# PyTorch's CPU index (and in local wheel caches), so no resolver can substitute the CUDA wheel
# and its nvidia-* dependencies. macOS wheels are CPU-only and carry no local version.
TORCH_VERSION = "2.13.0"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


@nox.session(name="tests-torch")
def tests_torch(session: nox.Session) -> None:
    """The generic array-API backend on torch.Tensor inputs (CPU torch; skipped visibly when
    torch cannot be installed here). JAX is installed too, so that the PyTorch porting
    example meets both libraries."""
    session.install(".[jax,array-api]", *TEST_DEPS)
    import sys

    from nox.command import CommandFailed

    spec = f"torch=={TORCH_VERSION}" + ("" if sys.platform == "darwin" else "+cpu")
    try:
        session.install(spec, "--extra-index-url", TORCH_CPU_INDEX)
    except CommandFailed as exc:
        session.skip(f"torch is not installable here: `pip install {spec}` failed ({exc})")
    _pytest(session, "numpy,array_api-torch")


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation, with warnings as errors (figures and CLI help are generated)."""
    session.install(".[jax]", *nox.project.dependency_groups(PYPROJECT, "docs"))
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html",
                *session.posargs)


@nox.session
def examples(session: nox.Session) -> None:
    """Every script in examples/, each in its own process, as a user would run it."""
    session.install(".[jax]")
    import pathlib

    for script in sorted(pathlib.Path("examples").glob("*.py")):
        session.run("python", str(script))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole tree."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", ".")


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmark suite (not a test): writes docs/benchmarks.json (every library on all
    CPUs), docs/benchmarks-1thread.json (on one thread) and docs/benchmarks-corpus.json (the
    real-model layers, forward and gradient) for the docs page.

    PyTorch is a peer when it can be installed (CPU build only); otherwise it is skipped.
    """
    session.install(".[jax]")
    from nox.command import CommandFailed

    try:
        session.install(f"torch=={TORCH_VERSION}+cpu", "--extra-index-url", TORCH_CPU_INDEX)
    except CommandFailed:
        session.log("torch is not installable here: the PyTorch peer is skipped")
    session.run("polyconv", "bench", "--json", "docs/benchmarks.json", *session.posargs)
    session.run("polyconv", "bench", "--threads", "1", "--json", "docs/benchmarks-1thread.json",
                *session.posargs)
    session.run("polyconv", "bench", "--corpus", "--json", "docs/benchmarks-corpus.json")
