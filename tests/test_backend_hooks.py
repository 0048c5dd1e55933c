"""A third-party backend (entry point) states its own facts through the optional hooks of
:class:`polyconv.BackendHooks` and is then a first-class citizen: dispatch picks it for its
arrays, ``polyconv backends`` describes it, :func:`polyconv.compare` feeds it its own arrays.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import polyconv
from polyconv import _backends


class FakeArray:
    """An array of a library no built-in backend knows (``fakelib``)."""

    def __init__(self, data):
        self.data = np.asarray(data)
        self.shape, self.dtype = self.data.shape, self.data.dtype


FakeArray.__module__ = "fakelib"


class FakeBackend:
    """Computes with the numpy backend, on FakeArrays."""

    name = "fake"
    libraries = ("fakelib",)

    def __init__(self):
        self.calls = 0

    def _run(self, primitive, plan, *arrays):
        self.calls += 1
        numpy = polyconv.get_backend("numpy")
        args = [None if a is None else a.data for a in arrays]
        return FakeArray(getattr(numpy, primitive)(plan, *args))

    def forward(self, plan, a, w, bias=None):
        return self._run("forward", plan, a, w, bias)

    def backward_data(self, plan, b, w, bias=None):
        return self._run("backward_data", plan, b, w, bias)

    def backward_weights(self, plan, a, b):
        return self._run("backward_weights", plan, a, b)

    def describe(self):
        return {"versions": {"fakelib": "1.2.3"}, "devices": "fake:0"}

    def samples(self, dtype):
        return polyconv.Samples("fakelib arrays", FakeArray,
                                to_numpy=lambda y: y.data.astype(np.float64))


class _EntryPoint:
    name, value = "fake", "fake_package:BACKEND"

    def __init__(self, backend):
        self.backend = backend

    def load(self):
        return self.backend


@pytest.fixture
def fake(monkeypatch):
    backend = FakeBackend()
    monkeypatch.setattr(_backends, "_entry_points", lambda: {"fake": _EntryPoint(backend)})
    monkeypatch.delitem(_backends._LOADED, "fake", raising=False)
    yield backend
    _backends._LOADED.pop("fake", None)


def test_dispatch_picks_the_backend_that_owns_the_arrays(fake):
    x, w = FakeArray(np.ones((1, 5, 5, 2), np.float32)), FakeArray(np.ones((3, 3, 2, 4),
                                                                           np.float32))
    assert _backends.infer_backend("convolution", {"src": x, "weights": w}) == "fake"
    y = polyconv.convolution(x, w)
    assert isinstance(y, FakeArray) and fake.calls == 1
    np.testing.assert_array_equal(y.data, polyconv.convolution(x.data, w.data))


def test_backends_listing_uses_describe(fake, capsys):
    from polyconv._cli import main

    assert main(["backends", "--json"]) == 0
    info = {b["name"]: b for b in json.loads(capsys.readouterr().out)}["fake"]
    assert info["available"] is True
    assert info["versions"] == {"fakelib": "1.2.3"}
    assert info["devices"] == "fake:0"


def test_compare_feeds_the_backend_its_own_arrays(fake):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 6, 3)).astype(np.float32)
    w = rng.standard_normal((3, 3, 3, 4)).astype(np.float32)
    result = polyconv.compare("convolution", x, w, backends=["numpy", "fake"])
    row = {r.backend: r for r in result.results}["fake"]
    assert row.ok and row.library == "fakelib arrays", result
    assert fake.calls >= 1


def test_built_in_backends_state_their_facts():
    numpy = polyconv.get_backend("numpy")
    assert numpy.libraries == ("numpy",)
    assert _backends.describe_backend("numpy")["devices"] == "cpu (host memory)"
    assert _backends.backend_samples("numpy", "float32").label == "numpy"
