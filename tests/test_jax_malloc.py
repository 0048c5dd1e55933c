"""The JAX backend on the CPU raises glibc's malloc thresholds once, on its first computation,
unless told not to or the user set them (see tests/test_malloc.py for the probe)."""

from __future__ import annotations

import pytest
from conftest import only_with_target

only_with_target("jax")
pytest.importorskip("jax")

from test_malloc import LEFT_ALONE, LEFT_ALONE_IDS, _mmapped_bytes, pytestmark  # noqa: E402, F401


def test_a_large_block_comes_from_the_heap_after_a_jax_call():
    assert _mmapped_bytes("jax") < 64 << 20


@pytest.mark.parametrize("env", LEFT_ALONE, ids=LEFT_ALONE_IDS)
def test_malloc_is_left_alone_when_told_or_set_by_the_user(env):
    assert _mmapped_bytes("jax", **env) >= 64 << 20
