"""The autotune cache file: choices measured in one process, read by the next.

A versioned JSON file named by ``POLYCONV_AUTOTUNE_CACHE``, keyed by backend, device kind,
library versions, primitive and plan (the chooser makes the keys). A corrupt or foreign file
is ignored with a warning, never trusted; writes go through a private temporary and an atomic
replace.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path

CACHE_ENV = "POLYCONV_AUTOTUNE_CACHE"
#: the file's format; a file of another format or version is ignored with a warning
CACHE_FORMAT = "polyconv-autotune"
CACHE_VERSION = 1



def path() -> Path | None:
    path = os.environ.get(CACHE_ENV, "").strip()
    return Path(path) if path else None


def read(path: Path) -> dict[str, str]:
    """The entries of a cache file; a missing file is empty, a corrupt or foreign one is
    ignored with a warning (never trusted)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        warnings.warn(f"{CACHE_ENV}: cannot read {path} ({exc}); ignored", stacklevel=2)
        return {}
    try:
        stored = json.loads(text)
        ok = (stored.get("format") == CACHE_FORMAT and stored.get("version") == CACHE_VERSION
              and isinstance(stored.get("choices"), dict))
    except (ValueError, AttributeError):
        ok = False
    if not ok:
        warnings.warn(f"{CACHE_ENV}: {path} is not a polyconv autotune cache of version "
                      f"{CACHE_VERSION}; ignored (it is replaced when a plan is measured)",
                      stacklevel=2)
        return {}
    return {k: v for k, v in stored["choices"].items()
            if isinstance(k, str) and isinstance(v, str)}


def write(path: Path, choices: Mapping[str, str]) -> None:
    """Merge ``choices`` into the file: a private temporary in its folder, then an atomic
    replace (no name another user can plant a link at, nothing left behind on failure)."""
    merged = {**read(path), **choices}
    body = json.dumps({"format": CACHE_FORMAT, "version": CACHE_VERSION, "choices": merged},
                      indent=0, sort_keys=True)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            f.write(body)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        warnings.warn(f"{CACHE_ENV}: cannot write {path} ({exc}); the choice is kept for "
                      "this process only", stacklevel=2)
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
