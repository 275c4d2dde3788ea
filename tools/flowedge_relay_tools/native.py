# SPDX-License-Identifier: Apache-2.0
"""The tools' C drivers (tools/csrc: fer_bench.h, fer_loadgen.h) as ``ffi`` and ``lib``, with
``check``, the runtime's one helper from a C status to an exception.

The drivers call the runtime core's C functions without a copy of their own: the relay's core
module (loaded by flowedge_relay.core) is made global before the drivers' module loads, so the
loader binds their calls to it. One core per process, the one the relay runs; the cdef includes
the core's, so cdata from flowedge_relay.core (a ring, rcl's functions) passes as it is.
"""

from __future__ import annotations

import ctypes
import os

from flowedge_relay.core import check, library_path

__all__ = ["check", "ffi", "lib"]


def _load():
    """The drivers' module, its calls into the core bound to the relay's core module."""
    # RTLD_NOLOAD: the module flowedge_relay.core imported, not a second copy; RTLD_GLOBAL: its
    # symbols now resolve the drivers' undefined ones (the drivers' module loads with RTLD_NOW).
    ctypes.CDLL(library_path(), mode=os.RTLD_NOW | os.RTLD_GLOBAL | os.RTLD_NOLOAD)
    try:
        from flowedge_relay_tools._fer_bench import ffi, lib
    except ImportError as exc:  # pragma: no cover - exercised only without a build
        raise ImportError(
            "flowedge_relay_tools._fer_bench (the tools' C drivers) is not built: run `make core` "
            "or `python -m flowedge_relay_tools._build_bench`") from exc
    return ffi, lib


ffi, lib = _load()
