# SPDX-License-Identifier: Apache-2.0
"""The host's wake-up latency at a real-time priority, measured the way cyclictest does.

    python -m flowedge_relay_tools.bench.latency --cpu 1 --priority 51 --seconds 5

A SCHED_FIFO thread pinned to one CPU sleeps to a deadline every --interval-us and records how
late it woke. Whatever can hold a real-time worker off its CPU shows as a late wake-up: a higher
priority thread, the kernel's reserved share for normal tasks (RT throttling, the fair server),
interrupts, and on a virtual machine the hypervisor descheduling the vCPU (steal time, also read
from /proc/stat). The longest is a stall an admitted request can meet at any time, so
`admission_reserve_ns` has to cover it (docs/robot-computer.md). `overload --realtime` runs it on
the workers' CPU while the relay is saturated, beside its own calibration; `calibrate` runs it
next to its saturated and overload phases, at normal priority on any CPU (`--priority 0`, no
`--cpu`) where the relay runs at normal priority: there a neighbour's time slice is the stall.

Its own process, so that no other thread's GIL sits between the timer and the measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np


def steal_ms() -> float:
    """This guest's stolen time so far, all CPUs (/proc/stat's 8th cpu field), in ms."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) * 1000 / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


#: late wake-ups at least this long are kept one by one with --stalls: enough to pool the tail of
#: several probes (calibrate's rounds) without sending every sample
STALL_KEEP_NS = 100_000


def measure(seconds: float, interval_us: int, stalls: bool = False) -> dict:
    """Sleep to a deadline every interval_us for `seconds` (this thread's scheduling as set);
    the lateness of each wake-up, summarized, and the steal time meanwhile; with `stalls`, every
    late wake-up of STALL_KEEP_NS or more too (`stalls_ns`), so that probes can be pooled."""
    period = interval_us * 1_000
    late: list[int] = []
    steal0 = steal_ms()
    target = time.monotonic_ns() + period
    end = target + int(seconds * 1e9)
    while target < end:
        delay = target - time.monotonic_ns()
        if delay > 0:
            time.sleep(delay * 1e-9)
        now = time.monotonic_ns()
        late.append(max(now - target, 0))
        target += period
        if target < now:  # skip the deadlines a long stall swallowed
            target = now + period
    values = np.asarray(late, np.int64)
    kept = {"stalls_ns": values[values >= STALL_KEEP_NS].tolist()} if stalls else {}
    return kept | {
        "samples": len(late),
        "interval_us": interval_us,
        "seconds": seconds,
        "late_ns_p50": float(np.percentile(values, 50)),
        "late_ns_p99": float(np.percentile(values, 99)),
        "late_ns_p99_9": float(np.percentile(values, 99.9)),
        "late_ns_max": float(values.max()),
        "over_1ms": int((values > 1_000_000).sum()),
        "steal_ms": steal_ms() - steal0,
    }


def probe(cpu: int | None, priority: int, seconds: float, interval_us: int = 1_000,
          stalls: bool = False) -> dict:  # fmt: skip
    """Run the measurement in its own process on `cpu` (None: wherever the OS puts it) at
    SCHED_FIFO `priority` (0: normal scheduling); its summary, with `refused` set (and normal
    scheduling) where the OS refused the priority; `stalls`: with every late wake-up of
    STALL_KEEP_NS or more."""
    where = [] if cpu is None else ["--cpu", str(cpu)]
    if stalls:
        where.append("--stalls")
    out = subprocess.run(
        [sys.executable, "-m", "flowedge_relay_tools.bench.latency", *where,
         "--priority", str(priority), "--seconds", str(seconds), "--interval-us",
         str(interval_us)],
        capture_output=True, text=True, check=True, timeout=seconds + 60,
        preexec_fn=_normal_scheduling,
    )  # fmt: skip
    return json.loads(out.stdout)


def _normal_scheduling() -> None:
    """In the child before it starts: normal scheduling. Started from a SCHED_FIFO thread (the
    bench client in the real-time mode) it would inherit that class and run Python's start-up
    and its imports, a few hundred ms of CPU, at the client's priority, holding the client's own
    threads off their CPU (SCHED_FIFO does not share a CPU between equal priorities) until
    it sets its own."""
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", type=int, help="pin to this CPU (default: not pinned)")
    parser.add_argument("--priority", type=int, default=51,
                        help="SCHED_FIFO priority (1-99; 0: normal scheduling)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--interval-us", type=int, default=1_000)
    parser.add_argument("--stalls", action="store_true",
                        help=f"also list every late wake-up of {STALL_KEEP_NS} ns or more")
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    refused = ""
    try:
        if args.priority > 0:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(args.priority))
        else:  # a neighbour's child inherits its class: normal scheduling on purpose
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    except OSError as exc:
        refused = f"SCHED_FIFO {args.priority} refused: {exc.strerror}"
    report = measure(args.seconds, args.interval_us, args.stalls)
    report.update(cpu=args.cpu if args.cpu is not None else "any",
                  priority=0 if refused else args.priority, refused=refused)
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
