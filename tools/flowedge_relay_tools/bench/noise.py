# SPDX-License-Identifier: Apache-2.0
"""A CPU-hog neighbour for the benches' `--noise` option: the load a shared robot computer sees.

    # what cpu_hog() starts:
    python -m flowedge_relay_tools.bench.noise --busy-ms 50 --sleep-ms 50

One process, one thread, at normal priority: it spins on the CPU for `busy_ms`, then sleeps
`sleep_ms`, and again, until it is terminated. Duty cycle busy / (busy + sleep); `sleep_ms` 0
spins continuously. The spin is pure Python arithmetic (no syscalls), so while busy it competes
with the relay for a core exactly like any other runnable process; on a 2-core host a 50% duty
cycle takes a quarter of the machine on average, in bursts long enough (50 ms) to span many
NFEs and whole requests. `cpu_hog(spec, processes=2)` runs two such neighbours: on a 2-core
host both cores busy at normal priority, the load the real-time mode is for (a relay whose
threads run at SCHED_FIFO preempts them; one at normal priority shares the cores with them).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from flowedge_relay_tools.bench.host import cpu_seconds

DEFAULT = "50/50"


def parse(spec: str) -> tuple[float, float]:
    """`BUSY/SLEEP` in ms (e.g. 50/50) or `continuous` -> (busy_ms, sleep_ms)."""
    if spec == "continuous":
        return 1000.0, 0.0
    busy, sep, sleep = spec.partition("/")
    try:
        b, s = float(busy), float(sleep)
    except ValueError:
        b, s = -1.0, -1.0
    if not sep or b <= 0 or s < 0:
        raise ValueError(f"--noise wants BUSY_MS/SLEEP_MS (e.g. 50/50) or continuous, got {spec!r}")
    return b, s


def describe(busy_ms: float, sleep_ms: float, processes: int = 1) -> str:
    who = "one process" if processes == 1 else f"{processes} processes at normal priority, each"
    if sleep_ms == 0:
        return f"{who} spinning continuously (100% of one core)"
    duty = busy_ms / (busy_ms + sleep_ms)
    return (f"{who} busy {busy_ms:g} ms / sleep {sleep_ms:g} ms "
            f"({duty:.0%} of one core, in {busy_ms:g} ms bursts)")


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a child from /proc (0.0 where /proc is not there)."""
    try:
        return cpu_seconds(pid)
    except (OSError, IndexError, ValueError):
        return 0.0


@contextmanager
def cpu_hog(spec: str, processes: int = 1) -> Iterator[dict]:
    """Run `processes` neighbours while the block runs; the dict it yields gets their measured
    CPU use (together) and whether every one was still running when the block ended."""
    busy_ms, sleep_ms = parse(spec)
    if processes < 1:
        raise ValueError(f"--noise-hogs wants at least 1 process, got {processes}")
    procs = [subprocess.Popen(
        [sys.executable, "-m", "flowedge_relay_tools.bench.noise", "--busy-ms", str(busy_ms),
         "--sleep-ms", str(sleep_ms)],
    ) for _ in range(processes)]  # fmt: skip
    info = {"spec": spec, "busy_ms": busy_ms, "sleep_ms": sleep_ms,
            "duty_cycle": busy_ms / (busy_ms + sleep_ms), "processes": processes,
            "description": describe(busy_ms, sleep_ms, processes),
            "pids": [proc.pid for proc in procs]}  # fmt: skip
    start = time.monotonic()
    try:
        yield info
    finally:
        info["cpu_seconds"] = sum(_cpu_seconds(proc.pid) for proc in procs)
        info["wall_seconds"] = time.monotonic() - start
        info["measured_cores"] = info["cpu_seconds"] / max(info["wall_seconds"], 1e-9)
        info["ran_throughout"] = all(proc.poll() is None for proc in procs)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def spin(busy_ms: float, sleep_ms: float) -> None:
    """Forever: spin busy_ms, sleep sleep_ms."""
    busy_ns, x = int(busy_ms * 1e6), 0
    while True:
        end = time.monotonic_ns() + busy_ns
        while time.monotonic_ns() < end:
            for i in range(200):
                x = (x * 1103515245 + i) & 0xFFFFFFFF
        if sleep_ms:
            time.sleep(sleep_ms / 1e3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy-ms", type=float, default=50.0)
    parser.add_argument("--sleep-ms", type=float, default=50.0)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))  # may start ignored in a background job
    # a neighbour at normal priority, whatever its parent runs at (overload --realtime's client
    # is SCHED_FIFO, and a child inherits its parent's class)
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    try:
        spin(args.busy_ms, args.sleep_ms)
    except SystemExit:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
