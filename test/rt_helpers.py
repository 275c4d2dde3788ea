# SPDX-License-Identifier: Apache-2.0
"""Test-side helpers for the real-time settings (flowedge_relay/realtime.py): what this host
allows, and the wrapper that takes SCHED_FIFO and mlock away from a child process for real."""

from __future__ import annotations

import os
import shutil
import threading

import pytest

from flowedge_relay import realtime as rt

CPUS = sorted(os.sched_getaffinity(0))
#: run a child under this and the OS refuses it SCHED_FIFO (no CAP_SYS_NICE, RLIMIT_RTPRIO 0)
#: and mlock (no CAP_IPC_LOCK, RLIMIT_MEMLOCK 0), as on a robot computer nobody prepared
REFUSING = ["prlimit", "--rtprio=0", "--memlock=0", "--", "setpriv",
            "--bounding-set=-sys_nice,-ipc_lock", "--inh-caps=-sys_nice,-ipc_lock", "--"]


def fifo_refused() -> str | None:
    """None where this process may use SCHED_FIFO, else why not (tried on a thread)."""
    roles = rt.ThreadRoles()
    thread = threading.Thread(target=roles.apply, args=("probe", rt.ThreadSettings((), 1),
                                                        lambda _: None))  # fmt: skip
    thread.start()
    thread.join()
    return "; ".join(roles.get("probe").refused_at_start()) or None


_REFUSED = fifo_refused()
#: the granted path: skipped, saying why, where this process may not use SCHED_FIFO
needs_fifo = pytest.mark.skipif(_REFUSED is not None,
                                reason=f"the OS refuses SCHED_FIFO here: {_REFUSED}")
#: the refused path: skipped, saying why, where prlimit or setpriv is missing
needs_refusing = pytest.mark.skipif(
    not (shutil.which("prlimit") and shutil.which("setpriv")),
    reason="needs util-linux's prlimit and setpriv to take the privileges away",
)
