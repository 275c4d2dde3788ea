# SPDX-License-Identifier: Apache-2.0
"""Build the C core extension for the tests when it is missing or older than its sources.

Imported (and ensure_built() called) by test/conftest.py before any test module imports
flowedge_relay.core, so `pytest test/` works in a fresh clone once the venv exists.
"""

import fcntl
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PKG = ROOT / "flowedge_relay"


def _stale() -> bool:
    built = list(PKG.glob("_fer_core*.so"))
    if not built:
        return True
    # the core includes the messages' generated headers (csrc/fer_wire.h)
    sources = [*(ROOT / "csrc").glob("*.[ch]"), *(ROOT / "msg").glob("*.msg"),
               PKG / "_build_core.py"]
    newest = max(p.stat().st_mtime for p in sources)
    return min(p.stat().st_mtime for p in built) < newest


def ensure_built() -> None:
    if not _stale():
        return
    lock_dir = ROOT / "build"
    lock_dir.mkdir(exist_ok=True)
    # Two pytest processes (or pytest and `make core`) must not build into the same place at once.
    with open(lock_dir / ".fer_core.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _stale():
            from flowedge_relay import _build_core

            _build_core.build_in_place()
