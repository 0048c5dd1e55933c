"""The numpy backend raises glibc's malloc thresholds once, on its first computation, unless
told not to or the user set them; ``import polyconv`` alone changes nothing. Checked by where
glibc puts a 64 MB block (its own statistics, ``mallinfo2``), in fresh processes. The JAX
backend's side: tests/test_jax_malloc.py."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="the malloc thresholds are glibc's")

_CALLS = {
    "import only": "import polyconv",
    "numpy": "import numpy as np, polyconv\n"
             "polyconv.convolution(np.ones((1, 4, 1), np.float32), np.ones((1, 1, 1), np.float32),"
             " data_format='NXC', weights_format='XIO')",
    "jax": "import jax.numpy as jnp, polyconv\n"
           "polyconv.convolution(jnp.ones((1, 4, 1)), jnp.ones((1, 1, 1)), data_format='NXC',"
           " weights_format='XIO')",
}

# after the call: the bytes glibc holds in mmapped blocks while a 64 MB block is allocated
_PROBE = """
import ctypes
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


def _mmapped_bytes(call: str, **env: str) -> int:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("MALLOC_") and k not in ("POLYCONV_MALLOC", "GLIBC_TUNABLES")}
    out = subprocess.run([sys.executable, "-c", _CALLS[call] + "\n" + _PROBE],
                         env={**base, "JAX_PLATFORMS": "cpu", **env}, text=True,
                         capture_output=True, timeout=120, check=True)
    return int(out.stdout.split()[-1])


LEFT_ALONE = [{"POLYCONV_MALLOC": "0"}, {"MALLOC_MMAP_THRESHOLD_": "1000000"}]
LEFT_ALONE_IDS = ["turned-off", "user-setting"]


def test_a_large_block_comes_from_the_heap_after_a_numpy_call():
    assert _mmapped_bytes("numpy") < 64 << 20


@pytest.mark.parametrize("env", LEFT_ALONE, ids=LEFT_ALONE_IDS)
def test_malloc_is_left_alone_when_told_or_set_by_the_user(env):
    assert _mmapped_bytes("numpy", **env) >= 64 << 20


def test_importing_polyconv_leaves_malloc_alone():
    assert _mmapped_bytes("import only") >= 64 << 20
