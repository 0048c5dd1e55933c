"""The test matrix, one session per backend, plus lint.

``nox`` runs every default session; ``nox -s tests-numpy`` runs one. Each test session sets
``POLYCONV_TEST_BACKENDS`` so that a backend that fails to install is an error, not a skip.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "tests-numpy", "tests-jax", "tests-array_api"]
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


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole tree."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", ".")
