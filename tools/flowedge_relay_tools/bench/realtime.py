# SPDX-License-Identifier: Apache-2.0
"""The real-time deployment mode as the benches start it (docs/robot-computer.md): the options,
the relay's parameters and environment, the client's own scheduling, and what the relay's threads
really got, read back from its diagnostics.

`overload --realtime` and `calibrate --realtime` share it, so a relay is calibrated in the mode it
will run in, with the same priorities, CPUs and Fast DDS profile. It imports no other bench
module (overload imports calibrate, and perfdoc reads applied_short).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path

#: --realtime's SCHED_FIFO priorities: config/relay.yaml's real-time example (intake above the
#: publisher above the workers; Fast DDS's threads at 58 in config/fastdds_realtime.xml)
RT_PRIORITIES = {"executor": 60, "publisher": 55, "worker": 50}
#: --realtime: the client's SCHED_FIFO priority during the trace, below all of the relay's
RT_CLIENT_PRIORITY = 45
FASTDDS_PROFILE = Path(__file__).resolve().parents[3] / "config" / "fastdds_realtime.xml"
ALLOWED_CPUS = sorted(os.sched_getaffinity(0))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--realtime, --rt-intake-cpus, --rt-worker-cpus, --rt-client-priority and --rt-dds."""
    parser.add_argument("--realtime", action="store_true",
                        help="start the relay in the real-time deployment mode: request intake "
                             f"and publisher at SCHED_FIFO {RT_PRIORITIES['executor']} / "
                             f"{RT_PRIORITIES['publisher']}, workers at SCHED_FIFO "
                             f"{RT_PRIORITIES['worker']}, memory locked (docs/robot-computer.md)")
    parser.add_argument("--rt-intake-cpus", type=int, nargs="+", metavar="CPU",
                        default=[ALLOWED_CPUS[0]],
                        help="--realtime: CPUs of the request intake and publisher threads "
                             f"(default {ALLOWED_CPUS[0]})")
    parser.add_argument("--rt-worker-cpus", type=int, nargs="+", metavar="CPU",
                        default=[ALLOWED_CPUS[-1]],
                        help=f"--realtime: CPUs of the workers (default {ALLOWED_CPUS[-1]})")
    parser.add_argument("--rt-client-priority", type=int, default=RT_CLIENT_PRIORITY,
                        metavar="PRIO",
                        help="--realtime: this process's threads (the producer "
                             "and the answers' subscriber, its DDS threads included) run at "
                             "SCHED_FIFO PRIO on the --rt-intake-cpus, as a robot runs the "
                             "controller that waits for the "
                             f"answers (default {RT_CLIENT_PRIORITY}; 0: normal scheduling, so a "
                             "starved client shows as late answers the relay published in time)")
    parser.add_argument("--rt-dds", action="store_true",
                        help="--realtime: Fast DDS's own threads at SCHED_FIFO too, from "
                             "config/fastdds_realtime.xml")


def realtime_params(args: argparse.Namespace) -> dict:
    """The relay parameters of --realtime ({} without it)."""
    if not args.realtime:
        return {}
    if getattr(args, "in_process", False):  # calibrate-check has no such option
        raise ValueError("--realtime starts the relay as its own process: not with --in-process")
    p = RT_PRIORITIES
    return {"executor_rt_priority": p["executor"], "executor_cpu_affinity": args.rt_intake_cpus,
            "publisher_rt_priority": p["publisher"], "publisher_cpu_affinity": args.rt_intake_cpus,
            "worker_rt_priority": p["worker"], "worker_cpu_affinity": args.rt_worker_cpus,
            "lock_memory": True}  # fmt: skip


def latency_text(found: dict | None) -> str:
    if not found:
        return "host latency: not measured (--realtime only)"
    return (f"host latency on CPU {found['cpu']} at SCHED_FIFO {found['priority']}, "
            f"{found['seconds']:g} s saturated: late wake-up p99 {found['late_ns_p99'] / 1e3:.0f} "
            f"us, max {found['late_ns_max'] / 1e6:.1f} ms, {found['over_1ms']} over 1 ms, steal "
            f"{found['steal_ms']:.0f} ms" + (f"; {found['refused']}" if found["refused"] else ""))


@contextlib.contextmanager
def realtime_client(args: argparse.Namespace):
    """--realtime: every thread of this process (the client's executor, the sender threads the
    calibration and the trace start from the main thread, and its DDS threads) at SCHED_FIFO
    --rt-client-priority on the intake CPUs until exit; the hogs set themselves back to normal
    scheduling (noise.py). Yields what it set, said in the report's client_mode.

    Why not on the workers' CPUs: a paced worker hands the normal tasks their share of its CPU
    (docs/design.md §5.3), and a real-time client there takes that share first, so the kernel's
    fair server takes it back from the worker as one ~50 ms stop a second, which the relay's
    promises and its adaptive cost model then pay (measured with --rtc at 2x and 3x: 20 steps
    stopped 10-58 ms in 72 s, none once the client left the workers' CPU). A robot's controller
    does not run on the CPU the relay's workers are given either."""
    prio = getattr(args, "rt_client_priority", 0)
    if not args.realtime or prio <= 0:
        yield "normal scheduling"
        return
    cpus = args.rt_intake_cpus
    tids = [int(t) for t in os.listdir("/proc/self/task")]
    done: list[tuple[int, set[int]]] = []
    try:
        for tid in tids:
            try:
                was = os.sched_getaffinity(tid)
                os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(prio))
                os.sched_setaffinity(tid, cpus)
                done.append((tid, was))
            except OSError:
                pass  # a thread that ended meanwhile, or no CAP_SYS_NICE: said below
        yield (f"SCHED_FIFO {prio} on CPUs {cpus}, {len(done)} of {len(tids)} threads" if done
               else f"normal scheduling (SCHED_FIFO {prio} refused)")
    finally:
        for tid, was in done:
            try:
                os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                os.sched_setaffinity(tid, was)
            except OSError:
                pass


def realtime_env(args: argparse.Namespace) -> dict[str, str] | None:
    """--rt-dds: the Fast DDS profile, under the variable each Fast DDS reads (2.14 on Jazzy
    FASTRTPS_, 3.x FASTDDS_; each ignores the other's or warns)."""
    if not (args.realtime and args.rt_dds):
        return None
    name = ("FASTRTPS_DEFAULT_PROFILES_FILE" if os.environ.get("ROS_DISTRO", "jazzy") == "jazzy"
            else "FASTDDS_DEFAULT_PROFILES_FILE")  # fmt: skip
    return {name: str(FASTDDS_PROFILE)}


def mode(args: argparse.Namespace) -> str:
    if not args.realtime:
        return "normal scheduling"
    p = RT_PRIORITIES
    return (f"real-time: request intake SCHED_FIFO {p['executor']} and publisher "
            f"{p['publisher']} on CPUs {args.rt_intake_cpus}, workers {p['worker']} on CPUs "
            f"{args.rt_worker_cpus}, memory locked"
            + (", Fast DDS threads 58 (config/fastdds_realtime.xml)" if args.rt_dds else ""))


def applied_settings(relay) -> dict[str, str]:
    """The relay's threads' real-time settings as its `workers` diagnostics status reports them
    (rt.*, memory_locked_kb: what the relay read back from /proc), from a RemoteRelay or a
    LocalRelay (the same report)."""
    if hasattr(relay, "workers_status"):
        values = relay.workers_status(timeout=5.0, fresh=False)[2]
    else:
        values = relay.node.thread_roles.report()[0]  # a LocalRelay
    return {k: str(v) for k, v in values.items() if k.startswith("rt.") or k == "memory_locked_kb"}


def applied_short(values: dict[str, str]) -> str:
    """One table cell of applied_settings: `publisher F55@0 request F60@0 worker0 F50@1 mlock`
    (F = SCHED_FIFO and its priority, O = SCHED_OTHER, @ the CPUs), REFUSED where the OS
    refused any asked setting."""
    parts = []
    for key in sorted(values):
        if not key.startswith("rt.") or key in ("rt.threads", "rt.refused", "rt.lock_memory"):
            continue
        cls, _, cpus = values[key].split(" (asked", 1)[0].partition(", CPUs ")
        parts.append(f"{key[3:]} {cls.replace('SCHED_FIFO ', 'F').replace('SCHED_OTHER', 'O')}"
                     f"@{cpus}")  # fmt: skip
    if int(values.get("memory_locked_kb", "0")):
        parts.append("mlock")
    if values.get("rt.refused", "none") != "none":
        parts.append("REFUSED")
    return " ".join(parts) or "-"
