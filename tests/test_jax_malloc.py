"""The JAX backend raises glibc's malloc thresholds once, unless told not to or the user set
them: checked by where glibc puts a 64 MB block (its own statistics, ``mallinfo2``), in fresh
processes, after one polyconv call on a JAX array."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest
from conftest import only_with_target

only_with_target("jax")
pytest.importorskip("jax")

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="the malloc thresholds are glibc's")

# prints the bytes glibc holds in mmapped blocks while a 64 MB block is allocated
_PROBE = """
import ctypes, sys
import jax.numpy as jnp, polyconv
polyconv.convolution(jnp.ones((1, 4, 1)), jnp.ones((1, 1, 1)), data_format="NXC",
                     weights_format="XIO")
libc = ctypes.CDLL(None)
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
block = libc.malloc(64 << 20)
print(libc.mallinfo2().hblkhd)
libc.free(block)
"""


def _mmapped_bytes(**env: str) -> int:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("MALLOC_") and k not in ("POLYCONV_JAX_MALLOC", "GLIBC_TUNABLES")}
    out = subprocess.run([sys.executable, "-c", _PROBE], env={**base, **env}, text=True,
                         capture_output=True, timeout=120, check=True)
    return int(out.stdout.split()[-1])


def test_a_large_block_comes_from_the_heap_after_a_jax_call():
    assert _mmapped_bytes() < 64 << 20


@pytest.mark.parametrize("env", [{"POLYCONV_JAX_MALLOC": "0"},
                                 {"MALLOC_MMAP_THRESHOLD_": "1000000"}],
                         ids=["turned-off", "user-setting"])
def test_malloc_is_left_alone_when_told_or_set_by_the_user(env):
    assert _mmapped_bytes(**env) >= 64 << 20
