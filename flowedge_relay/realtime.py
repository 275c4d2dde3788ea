# SPDX-License-Identifier: Apache-2.0
"""Real-time settings of the relay's threads by role, and what the OS really applied.

Every thread on a request's path (request intake, workers, publisher) asks for a CPU set and a
SCHED_FIFO priority under a role name ("request", "worker0", "publisher"); the thread applies
them to itself (csrc/fer_rt.h, so a thread started in C can do the same without the GIL) and
the outcome stays in the role's record. The process may lock its memory (mlockall). Everything
is opt-in. Where the OS refuses (no CAP_SYS_NICE, RLIMIT_RTPRIO 0, a CPU outside the
container's set, no CAP_IPC_LOCK), the thread keeps what it had and the caller gets a warning
text: a robot should come up degraded and say so, not refuse to start.

What the OS applied is read back from /proc (`/proc/self/task/<tid>/stat` for the policy and
rt_priority, `.../status` for Cpus_allowed_list, VmLck of `/proc/self/status`), never assumed:
`ThreadRoles.report()` is what the `workers` status on /diagnostics shows, and names each
setting the OS does not hold now, with why it was refused.
docs/robot-computer.md is the operator's side.
"""

from __future__ import annotations

import errno
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from flowedge_relay.core import ffi, lib

MAX_CPU = lib.FER_RT_MAX_CPU  # the largest CPU id a CPU set may name (glibc's CPU_SETSIZE - 1)
MAX_FIFO_PRIORITY = 99
#: policy numbers of /proc/<pid>/task/<tid>/stat field 41 (linux/sched.h)
POLICIES = {0: "SCHED_OTHER", 1: "SCHED_FIFO", 2: "SCHED_RR", 3: "SCHED_BATCH", 5: "SCHED_IDLE",
            6: "SCHED_DEADLINE"}  # fmt: skip
FIFO = "SCHED_FIFO"
_STAT_RT_PRIORITY, _STAT_POLICY = 37, 38  # fields 40 and 41, counted after the ") "


def _errno_text(err: int) -> str:
    """`EPERM: Operation not permitted`, what a log line and the diagnostic say of a refusal."""
    return f"{errno.errorcode.get(err, str(err))}: {os.strerror(err)}"


def _affinity_text(err: int) -> str:
    """A refused CPU set's errno, with what EINVAL means there."""
    text = _errno_text(err)
    if err == errno.EINVAL:
        text += ": no CPU of the set is online and allowed to this process (its cpuset)"
    return text


def cpu_list(cpus: Iterable[int]) -> str:
    """CPUs in the kernel's list format (`0-2,5`), as Cpus_allowed_list writes them."""
    ids = sorted(set(cpus))
    runs: list[str] = []
    for c in ids:
        if runs and int(runs[-1].rsplit("-", 1)[-1]) == c - 1:
            runs[-1] = f"{runs[-1].split('-')[0]}-{c}"
        else:
            runs.append(str(c))
    return ",".join(runs)


def parse_cpu_list(text: str) -> frozenset[int]:
    """The kernel's list format (`0-2,5`) as a set of CPU ids."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(out)


@dataclass(frozen=True)
class ThreadSettings:
    """What one thread role asks for: CPUs (empty = keep the inherited set) and a SCHED_FIFO
    priority (0 = keep the inherited class)."""

    cpus: tuple[int, ...] = ()
    fifo_priority: int = 0

    def describe(self) -> str:
        cls = f"{FIFO} {self.fifo_priority}" if self.fifo_priority else "inherited class"
        return f"{cls}, " + (f"CPUs {cpu_list(self.cpus)}" if self.cpus else "inherited CPUs")


@dataclass(frozen=True)
class ThreadState:
    """What the OS reports for one thread now."""

    tid: int
    policy: str
    rt_priority: int
    cpus: frozenset[int]

    @property
    def sched_class(self) -> str:
        """`SCHED_FIFO 50` (with the real-time priority) or `SCHED_OTHER`."""
        return f"{self.policy} {self.rt_priority}" if self.rt_priority else self.policy

    def describe(self) -> str:
        return f"{self.sched_class}, CPUs {cpu_list(self.cpus)}"


def read_thread(tid: int) -> ThreadState | None:
    """A thread of this process as /proc reports it; None once it has exited."""
    base = f"/proc/self/task/{tid}"
    try:
        with open(f"{base}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"{base}/status") as f:
            cpus = next(line.split(":", 1)[1] for line in f
                        if line.startswith("Cpus_allowed_list:"))  # fmt: skip
    except (OSError, StopIteration, IndexError):
        return None
    policy = int(fields[_STAT_POLICY])
    return ThreadState(tid, POLICIES.get(policy, f"policy {policy}"),
                       int(fields[_STAT_RT_PRIORITY]), parse_cpu_list(cpus))  # fmt: skip


def process_threads() -> list[ThreadState]:
    """Every thread of this process (ONNX Runtime's pools, DDS's, Python's) as /proc reports
    it."""
    states = (read_thread(int(t)) for t in os.listdir("/proc/self/task"))
    return [s for s in states if s is not None]


def summarize(states: Iterable[ThreadState]) -> str:
    """Threads by scheduling class, highest real-time priority first:
    `SCHED_FIFO 60 x1, SCHED_FIFO 50 x3, SCHED_OTHER x14`."""
    counts = Counter(s.sched_class for s in states)
    order = sorted(counts, key=lambda c: (-int(c.rsplit(" ", 1)[1]) if c.startswith(FIFO)
                                          else 0, c))  # fmt: skip
    return ", ".join(f"{c} x{counts[c]}" for c in order)


def memory_locked_kb() -> int:
    """VmLck of /proc/self/status: memory this process holds locked, kB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmLck:"):
                return int(line.split()[1])
    return 0


def lock_memory() -> str | None:
    """mlockall(MCL_CURRENT | MCL_FUTURE) for the whole process; None, or why it was refused."""
    err = lib.fer_rt_lock_memory()
    return None if err == 0 else _errno_text(err)


def usable_cpus(cpus: Sequence[int]) -> tuple[list[int], dict[int, str]]:
    """Which of `cpus` a thread of this process may run on, tried one by one on the calling
    thread (its CPU set is put back after): ONNX Runtime's pool threads pin themselves to the
    CPUs they are given and only log a failure, so the CPUs are checked before they are handed
    over. Returns (usable, {cpu: why not})."""
    mine = os.sched_getaffinity(0)
    usable, refused = [], {}
    try:
        for c in cpus:
            try:
                os.sched_setaffinity(0, {c})
                usable.append(c)
            except OSError as exc:
                refused[c] = _affinity_text(exc.errno or 0)
    finally:
        os.sched_setaffinity(0, mine)
    return usable, refused


def intra_op_affinities(cpus: Sequence[int]) -> str:
    """ONNX Runtime's `session.intra_op_thread_affinities` for a pool of len(cpus) + 1 threads
    (the calling thread is the first and is not listed): one CPU per pool thread, `;` between
    threads, processors counted from 1 (ORT's id k is CPU k - 1; checked against the 1.32
    wheel, which refuses 0). "" for none."""
    return ";".join(str(c + 1) for c in cpus)


class ThreadRole:
    """One role's asked settings and outcome, in the C struct the thread applies them from."""

    def __init__(self, name: str, settings: ThreadSettings) -> None:
        if not 0 <= settings.fifo_priority <= MAX_FIFO_PRIORITY:
            raise ValueError(f"{name}: SCHED_FIFO priority {settings.fifo_priority} not in "
                             f"0..{MAX_FIFO_PRIORITY}")  # fmt: skip
        bad = [c for c in settings.cpus if not 0 <= c <= MAX_CPU]
        if bad:
            raise ValueError(f"{name}: CPU ids {bad} not in 0..{MAX_CPU}")
        self.name, self.settings = name, settings
        #: the struct a thread passes to fer_rt_apply_self (a C thread gets this pointer)
        self.c = ffi.new("struct fer_rt_thread *")
        # the OS thread name (ps, top -H, perf): "fer-" and the role, cut to the kernel's 15
        self.c.name = f"fer-{name}".encode()[: lib.FER_RT_NAME_LEN - 1]
        self.c.fifo_priority = settings.fifo_priority
        for cpu in settings.cpus:
            self.c.cpu_mask[cpu // 64] |= 1 << (cpu % 64)
        #: refusals noted besides the thread's own (its ONNX Runtime pool's CPUs)
        self.notes: list[str] = []

    @property
    def applied(self) -> bool:
        return bool(self.c.applied)

    @property
    def tid(self) -> int:
        return int(self.c.tid) if self.applied else 0

    def apply_self(self) -> None:
        """Apply the settings to the calling thread (any thread, once)."""
        if lib.fer_rt_apply_self(self.c) < 0:
            raise ValueError(f"{self.name}: fer_rt_apply_self refused its arguments")

    def refused_at_start(self) -> list[str]:
        """What the OS refused when the thread applied its settings, and why."""
        out = []
        if self.applied and self.c.affinity_errno:
            out.append(f"{self.name} CPUs {cpu_list(self.settings.cpus)} refused "
                       f"({_affinity_text(self.c.affinity_errno)})")  # fmt: skip
        if self.applied and self.c.fifo_errno:
            out.append(f"{self.name} {FIFO} {self.settings.fifo_priority} refused "
                       f"({_errno_text(self.c.fifo_errno)})")  # fmt: skip
        return out + self.notes

    def outcome(self) -> dict[str, object]:
        """What was applied, as WorkerPool.worker_info's `applied` says it: the CPU list and the
        SCHED_FIFO priority granted (None and 0 where not asked or refused)."""
        cpus_ok = self.applied and self.settings.cpus and not self.c.affinity_errno
        fifo_ok = self.applied and self.settings.fifo_priority and not self.c.fifo_errno
        return {"affinity": sorted(self.settings.cpus) if cpus_ok else None,
                "fifo_priority": self.settings.fifo_priority if fifo_ok else 0}  # fmt: skip

    def differences(self, state: ThreadState) -> list[str]:
        """Each asked setting the OS does not hold now, with why (the refusal at start, or a
        change since)."""
        out = []
        s = self.settings
        if s.cpus and state.cpus != frozenset(s.cpus):
            why = (_affinity_text(self.c.affinity_errno) if self.c.affinity_errno
                   else "changed since it was applied")  # fmt: skip
            out.append(f"{self.name} CPUs {cpu_list(s.cpus)} refused ({why}); running on CPUs "
                       f"{cpu_list(state.cpus)}")  # fmt: skip
        if s.fifo_priority and (state.policy, state.rt_priority) != (FIFO, s.fifo_priority):
            why = (_errno_text(self.c.fifo_errno) if self.c.fifo_errno
                   else "changed since it was applied")  # fmt: skip
            out.append(f"{self.name} {FIFO} {s.fifo_priority} refused ({why}); running "
                       f"{state.sched_class}")  # fmt: skip
        return out


class ThreadRoles:
    """Every role's settings and outcome, and the process's memory lock: what the `workers`
    status reports as `rt.<role>`, `rt.threads`, `memory_locked_kb` and the refusals."""

    def __init__(self) -> None:
        self._roles: dict[str, ThreadRole] = {}
        self._lock = threading.Lock()
        self.lock_memory_asked = False
        self.lock_memory_refused: str | None = None

    def role(self, name: str, settings: ThreadSettings) -> ThreadRole:
        """The record of role `name` (made now): a thread started in C applies it itself with
        fer_rt_apply_self(role.c), after which its starter warns what role.refused_at_start()
        names; a Python thread calls `apply` instead, which does both."""
        record = ThreadRole(name, settings)
        with self._lock:
            self._roles[name] = record
        return record

    def apply(self, name: str, settings: ThreadSettings,
              warn: Callable[[str], None] = print) -> ThreadRole:  # fmt: skip
        """Record role `name` and apply its settings to the calling thread; each refusal is
        warned once, here (the diagnostic repeats it for as long as it holds)."""
        record = self.role(name, settings)
        record.apply_self()
        for text in record.refused_at_start():
            warn(f"{text}; running degraded")
        return record

    def pool_affinities(self, role: ThreadRole, cpus: Sequence[int],
                        warn: Callable[[str], None] = print) -> str:  # fmt: skip
        """ONNX Runtime's `session.intra_op_thread_affinities` for the pool threads of the
        sessions `role`'s thread creates next: one CPU of `cpus` each. "" (the pool threads
        inherit the thread's CPUs, as they inherit its class) when `cpus` is empty, or when a
        CPU is refused, which is then noted on the role and warned."""
        if not cpus:
            return ""
        usable, refused = usable_cpus(cpus)
        if refused:
            why = ", ".join(f"CPU {c}: {text}" for c, text in refused.items())
            note = (f"{role.name} ONNX Runtime pool CPUs {cpu_list(refused)} refused ({why}); "
                    "its pool threads share the worker's CPUs")  # fmt: skip
            role.notes.append(note)
            warn(f"{note}; running degraded")
            return ""
        return intra_op_affinities(usable)

    def lock_memory(self, warn: Callable[[str], None] = print) -> None:
        """mlockall for the process (lock_memory: true), warned where refused."""
        self.lock_memory_asked = True
        self.lock_memory_refused = lock_memory()
        if self.lock_memory_refused:
            warn(f"lock_memory refused ({self.lock_memory_refused}); memory can be paged out, "
                 "running degraded")  # fmt: skip

    def get(self, name: str) -> ThreadRole | None:
        with self._lock:
            return self._roles.get(name)

    def roles(self) -> list[ThreadRole]:
        with self._lock:
            return list(self._roles.values())

    def refusals(self, locked_kb: int | None = None) -> list[str]:
        """Every asked setting the OS does not hold now, with why; [] when all hold. A role
        whose thread has not applied yet or has exited is not judged (a dead worker is its own
        ERROR)."""
        out = []
        for record in self.roles():
            state = read_thread(record.tid) if record.applied else None
            if state is not None:
                out += record.differences(state) + record.notes
        if self.lock_memory_asked:
            locked = memory_locked_kb() if locked_kb is None else locked_kb
            if self.lock_memory_refused:
                out.append(f"lock_memory refused ({self.lock_memory_refused})")
            elif locked == 0:
                out.append("lock_memory: nothing locked now (VmLck 0 kB)")
        return out

    def report(self) -> tuple[dict[str, object], list[str]]:
        """(values, refusals): the `workers` status keys `rt.<role>` (what the OS reports, what
        was asked, tid), `rt.threads` (every thread of the process by class),
        `memory_locked_kb`, `rt.lock_memory` and `rt.refused`; and the refusals that hold now
        (`refusals()`), which make that status WARN."""
        out: dict[str, object] = {}
        for record in self.roles():
            state = read_thread(record.tid) if record.applied else None
            now = state.describe() if state else ("exited" if record.applied else "not started")
            out[f"rt.{record.name}"] = (f"{now} (asked {record.settings.describe()}; "
                                        f"tid {record.tid})")  # fmt: skip
        out["rt.threads"] = summarize(process_threads())
        locked = memory_locked_kb()
        out["memory_locked_kb"] = locked
        out["rt.lock_memory"] = (
            "off" if not self.lock_memory_asked
            else f"refused ({self.lock_memory_refused})" if self.lock_memory_refused
            else "on"
        )
        refused = self.refusals(locked)
        out["rt.refused"] = "; ".join(refused) or "none"
        return out, refused
