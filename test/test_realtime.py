# SPDX-License-Identifier: Apache-2.0
"""Thread roles apply their real-time settings and /proc reads back what the OS holds.

Real threads and the real /proc of this process; where the OS has to refuse (no CAP_SYS_NICE,
RLIMIT_RTPRIO 0, no CAP_IPC_LOCK, RLIMIT_MEMLOCK 0) a child Python runs under setpriv and
prlimit, which take those away for real. The granted path needs this process to be allowed
SCHED_FIFO (root with CAP_SYS_NICE, as here and in CI); elsewhere those tests skip, saying why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from rt_helpers import CPUS, REFUSING, needs_fifo, needs_refusing

from flowedge_relay import realtime as rt


@contextmanager
def role_thread(roles: rt.ThreadRoles, name: str,
                settings: rt.ThreadSettings) -> Iterator[rt.ThreadRole]:  # fmt: skip
    """A thread that applies role `name` and then waits until the block ends."""
    done, ready = threading.Event(), threading.Event()

    def body() -> None:
        roles.apply(name, settings, lambda _: None)
        ready.set()
        done.wait()

    thread = threading.Thread(target=body)
    thread.start()
    ready.wait(10)
    try:
        yield roles.get(name)
    finally:
        done.set()
        thread.join(10)


def test_cpu_lists_read_and_write_the_kernel_format():
    assert rt.parse_cpu_list("0-2,5,7-8\n") == {0, 1, 2, 5, 7, 8}
    assert rt.cpu_list([8, 0, 1, 2, 5, 7]) == "0-2,5,7-8"
    assert rt.cpu_list([3]) == "3" and rt.parse_cpu_list("") == frozenset()
    # what the kernel wrote for this very thread
    assert rt.read_thread(threading.get_native_id()).cpus == frozenset(CPUS)


def test_intra_op_affinities_count_processors_from_one():
    """ONNX Runtime 1.32 refuses processor id 0 (`Processor id must start from 1`)."""
    assert rt.intra_op_affinities([1, 0]) == "2;1"
    assert rt.intra_op_affinities([]) == ""


def test_a_role_refuses_values_out_of_range():
    with pytest.raises(ValueError, match="priority 100"):
        rt.ThreadRole("w", rt.ThreadSettings((), 100))
    with pytest.raises(ValueError, match="CPU ids"):
        rt.ThreadRole("w", rt.ThreadSettings((rt.MAX_CPU + 1,), 0))


@needs_fifo
def test_a_thread_applies_its_role_and_proc_reads_it_back():
    roles = rt.ThreadRoles()
    cpu = CPUS[-1]
    with role_thread(roles, "worker0", rt.ThreadSettings((cpu,), 3)) as role:
        state = rt.read_thread(role.tid)
        assert (state.policy, state.rt_priority, state.cpus) == ("SCHED_FIFO", 3, {cpu})
        assert role.outcome() == {"affinity": [cpu], "fifo_priority": 3}
        values, refused = roles.report()
        assert refused == [] and values["rt.refused"] == "none"
        assert values["rt.worker0"] == (f"SCHED_FIFO 3, CPUs {cpu} (asked SCHED_FIFO 3, CPUs "
                                        f"{cpu}; tid {role.tid})")  # fmt: skip
        assert "SCHED_FIFO 3 x1" in values["rt.threads"]
    values, refused = roles.report()
    assert values["rt.worker0"].startswith("exited") and refused == []
    assert "SCHED_FIFO 3" not in values["rt.threads"]


@needs_fifo
def test_a_setting_changed_later_is_reported_for_as_long_as_it_holds():
    """The report compares what the OS holds now with what was asked, not the start's result:
    another process moving the thread back to SCHED_OTHER raises the refusal, and putting it
    back clears it."""
    roles = rt.ThreadRoles()
    with role_thread(roles, "request", rt.ThreadSettings((), 4)) as role:
        assert roles.refusals() == []
        os.sched_setscheduler(role.tid, os.SCHED_OTHER, os.sched_param(0))
        (text,) = roles.refusals()
        assert text == ("request SCHED_FIFO 4 refused (changed since it was applied); running "
                        "SCHED_OTHER")  # fmt: skip
        os.sched_setscheduler(role.tid, os.SCHED_FIFO, os.sched_param(4))
        assert roles.refusals() == []


def test_a_cpu_set_outside_the_machine_is_refused_with_why_and_the_thread_keeps_its_own():
    roles = rt.ThreadRoles()
    with role_thread(roles, "publisher", rt.ThreadSettings((rt.MAX_CPU,), 0)) as role:
        assert role.outcome() == {"affinity": None, "fifo_priority": 0}
        assert rt.read_thread(role.tid).cpus == frozenset(CPUS)
        (text,) = roles.refusals()
        assert text.startswith(f"publisher CPUs {rt.MAX_CPU} refused (EINVAL: Invalid argument")
        assert text.endswith(f"running on CPUs {rt.cpu_list(CPUS)}")


def test_the_summary_counts_every_thread_of_the_process_by_class():
    roles = rt.ThreadRoles()
    with role_thread(roles, "a", rt.ThreadSettings()), role_thread(roles, "b", rt.ThreadSettings()):
        states = rt.process_threads()
        assert len(states) == len(os.listdir("/proc/self/task"))
        summary = rt.summarize(states)
        total = sum(int(part.rsplit(" x", 1)[1]) for part in summary.split(", "))
        assert total == len(states) and "SCHED_OTHER x" in summary
        assert {roles.get("a").tid, roles.get("b").tid} <= {s.tid for s in states}
    fifo = [rt.ThreadState(1, "SCHED_FIFO", 5, frozenset()), rt.ThreadState(2, "SCHED_OTHER", 0,
            frozenset()), rt.ThreadState(3, "SCHED_FIFO", 60, frozenset())]  # fmt: skip
    assert rt.summarize(fifo) == "SCHED_FIFO 60 x1, SCHED_FIFO 5 x1, SCHED_OTHER x1"


_CHILD = """
import json, threading
from flowedge_relay import realtime as rt
roles = rt.ThreadRoles()
roles.lock_memory(print)
applied, done = threading.Event(), threading.Event()
def body():
    roles.apply("worker0", rt.ThreadSettings((), 5), print)
    applied.set()
    done.wait()
t = threading.Thread(target=body); t.start()
applied.wait()
print(json.dumps({"refused_at_start": roles.get("worker0").refused_at_start(),
                  "lock": roles.lock_memory_refused, "locked_kb": rt.memory_locked_kb(),
                  "refusals": roles.refusals()}))
done.set(); t.join()
"""


def _child(wrapper: list[str]) -> tuple[dict, list[str]]:
    """_CHILD under `wrapper`: its JSON report and the lines it printed before."""
    out = subprocess.run([*wrapper, sys.executable, "-c", _CHILD], capture_output=True,
                         text=True, timeout=60, env=os.environ, check=True)  # fmt: skip
    *lines, report = out.stdout.strip().splitlines()
    return json.loads(report), lines


@needs_refusing
def test_where_the_os_refuses_each_refusal_names_the_errno():
    report, printed = _child(REFUSING)
    assert report["refused_at_start"] == [
        "worker0 SCHED_FIFO 5 refused (EPERM: Operation not permitted)"]
    assert report["lock"] == "EPERM: Operation not permitted" and report["locked_kb"] == 0
    assert report["refusals"] == [
        "worker0 SCHED_FIFO 5 refused (EPERM: Operation not permitted); running SCHED_OTHER",
        "lock_memory refused (EPERM: Operation not permitted)",
    ]
    assert printed == [  # the log lines at start
        "lock_memory refused (EPERM: Operation not permitted); memory can be paged out, running "
        "degraded",
        "worker0 SCHED_FIFO 5 refused (EPERM: Operation not permitted); running degraded",
    ]


@needs_fifo
def test_where_the_os_grants_memory_is_locked():
    """mlockall in a child (it would lock this whole test process's future memory)."""
    report, printed = _child([])
    assert report["lock"] is None and report["locked_kb"] > 0
    assert report["refused_at_start"] == [] and printed == []
