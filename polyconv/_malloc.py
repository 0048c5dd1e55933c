"""glibc's malloc thresholds, raised once per process for the backends' large buffers.

XLA CPU gives each compiled program one scratch allocation (its "preallocated temp" buffer,
the sum of the live intermediates) and allocates it with the C library's ``malloc`` on every
call. glibc serves a block above its *mmap threshold* with fresh pages from the kernel and
returns them when the block is freed, so every call pays one page fault (and the zeroing of
a page) per 4 kB of it. The threshold starts at 128 kB and glibc raises it, as such blocks
are freed, up to 32 MB at most; a layer whose scratch buffer is larger than that pays the
faults on every call, for good: the gradient of the 3-D decoder layer of the docs' corpus
(62 MB of scratch) took 25 ms, against 10 ms with the threshold above it. The numpy
backend's buffers of large layers are past 32 MB too (the same layer's backward ops: 28
against 19 ms).

So, on Linux with glibc, the numpy backend and the JAX backend on the CPU raise the mmap
threshold to :data:`MMAP_THRESHOLD` and the trim threshold (how much free memory at the top
of the heap glibc keeps rather than returning it to the kernel) to :data:`TRIM_THRESHOLD`,
once, when they first compute something. The cost is memory: the process keeps up to that
much freed memory instead of returning it at once. ``POLYCONV_MALLOC=0`` leaves malloc
alone, and so does any malloc setting of the user's own (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_`` or ``glibc.malloc`` tunables in
``GLIBC_TUNABLES``).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

from ._backends import env_switch

ENV_VAR = "POLYCONV_MALLOC"
#: blocks up to this size come from the heap, whose pages stay mapped between calls
MMAP_THRESHOLD = 256 << 20
#: free memory at the top of the heap up to this size is kept for the next call
TRIM_THRESHOLD = 512 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3     # mallopt's parameter numbers (malloc.h)
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")

_state: dict[str, bool] = {}


def wanted() -> bool:
    """Whether the thresholds should be raised: Linux with glibc, not turned off, and no
    malloc setting of the user's."""
    if not env_switch(ENV_VAR):
        return False
    if any(os.environ.get(v) for v in _USER_SETTINGS):
        return False
    if "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def tune() -> bool:
    """Raise glibc's thresholds once per process where :func:`wanted`; whether they were.

    Called by a backend on its first computation on the CPU (not at import: ``import
    polyconv`` changes nothing)."""
    if "applied" not in _state:
        applied = False
        if wanted():
            try:
                mallopt = ctypes.CDLL(None).mallopt     # the process's own C library
                mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
                applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                               and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
            except (OSError, AttributeError):
                applied = False
        _state["applied"] = applied
    return _state["applied"]


def applied() -> bool:
    """Whether this process's thresholds were raised by :func:`tune`."""
    return _state.get("applied", False)
