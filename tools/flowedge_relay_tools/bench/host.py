# SPDX-License-Identifier: Apache-2.0
"""What every bench report records about the machine it ran on (`host` in each JSON), so a
figure always names its host. It imports no other bench module: the benches import it, and
perfdoc reads the `host` it wrote.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def proc_stat_cpu_seconds(stat: str) -> float:
    """utime + stime, in seconds, from the text of a /proc/<pid>/stat (proc(5): fields 14 and
    15, counted after the command name, which may hold spaces and parentheses)."""
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | str = "self") -> float:
    """The CPU time a process (all its threads) has used so far, on any core: a load's cost
    that a busy host's waiting does not inflate, as wall time would."""
    with open(f"/proc/{pid}/stat") as f:
        return proc_stat_cpu_seconds(f.read())


def host_info() -> dict:
    """CPU model, cores, load average, versions, commit: enough to say which machine."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load = list(os.getloadavg())
    except OSError:
        load = []
    try:
        import onnxruntime

        ort_version = onnxruntime.__version__
    except ImportError:  # pragma: no cover - the relay needs it anyway
        ort_version = "?"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
            timeout=5,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "loadavg_at_start": [round(x, 2) for x in load],
        "kernel": platform.release(),
        "python": platform.python_version(),
        "onnxruntime": ort_version,
        "commit": commit,
        "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
