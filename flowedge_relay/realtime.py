"""Optional real-time settings for the calling thread: CPU affinity and SCHED_FIFO priority.

Both are opt-in. Where the OS refuses (no CAP_SYS_NICE, a container without the CPUs), the
thread keeps normal scheduling and the caller gets a warning text: a robot should come up
degraded and say so, not refuse to start.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence


def apply_thread_settings(
    name: str,
    cpus: Sequence[int] = (),
    fifo_priority: int = 0,
    warn: Callable[[str], None] = print,
) -> dict[str, object]:
    """Apply affinity (if cpus) and SCHED_FIFO (if fifo_priority > 0) to the calling thread."""
    applied: dict[str, object] = {"affinity": None, "fifo_priority": 0}
    if cpus:
        try:
            os.sched_setaffinity(0, set(cpus))
            applied["affinity"] = sorted(cpus)
        except (OSError, ValueError) as exc:
            warn(f"{name}: CPU affinity {list(cpus)} not applied ({exc}); running unpinned")
    if fifo_priority > 0:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(fifo_priority))
            applied["fifo_priority"] = fifo_priority
        except (OSError, ValueError, AttributeError) as exc:
            warn(
                f"{name}: SCHED_FIFO priority {fifo_priority} not applied ({exc}); "
                "running with normal scheduling"
            )
    return applied
