"""The real-time deployment mode on real relays (docs/robot-computer.md), over DDS.

Each relay is a `flowedge-relayd` process; the test talks to it only as a robot's nodes would
(requests and answers, /diagnostics) and checks the relay's read-back against this test's own
read of /proc/<tid> (a thread id names the thread system-wide). Three cases: the OS grants every
setting (root here: SCHED_FIFO at the asked priority on the asked CPUs for the workers, the
request intake and the publisher, memory locked); the OS refuses them (prlimit and setpriv take
CAP_SYS_NICE, CAP_IPC_LOCK and both rlimits away, and a CPU is asked that this machine lacks): the
relay answers all the same and the workers status is WARN naming each refusal; and Fast DDS's
own threads from config/fastdds_realtime.xml.
"""

from __future__ import annotations

import os
import pathlib
import re

import pytest
from diagnostic_msgs.msg import DiagnosticStatus
from rt_helpers import CPUS, REFUSING, needs_fifo, needs_refusing

from flowedge_relay.realtime import MAX_CPU, parse_cpu_list
from flowedge_relay.tooling.bench.client import INFERENCE, remote_relay

pytestmark = pytest.mark.ros  # every test here starts a relay over DDS

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROFILE = ROOT / "config" / "fastdds_realtime.xml"
POLICIES = {0: "SCHED_OTHER", 1: "SCHED_FIFO"}
# low priorities: enough to tell them apart; a shared test host keeps its normal work going
ASKED = dict(worker_rt_priority=3, executor_rt_priority=5, publisher_rt_priority=4,
             worker_cpu_affinity=[CPUS[-1]], executor_cpu_affinity=[CPUS[0]],
             publisher_cpu_affinity=[CPUS[0]], lock_memory=True)  # fmt: skip


def _proc(tid: int) -> tuple[str, int, frozenset[int]]:
    """(policy, rt_priority, CPUs) of a thread of any process, read here from /proc/<tid>."""
    fields = pathlib.Path(f"/proc/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    status = pathlib.Path(f"/proc/{tid}/status").read_text()
    cpus = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.M).group(1)
    return POLICIES.get(int(fields[38]), fields[38]), int(fields[37]), parse_cpu_list(cpus)


def _tid(value: str) -> int:
    return int(re.search(r"tid (\d+)\)$", value).group(1))


def _answers(client, n: int = 3) -> None:
    """n requests each answered with actions (INFERENCE): the relay serves, whatever its
    scheduling."""
    for _ in range(n):
        req = client.request("rt", client.next_sequence(), 3)
        client.send(req)
        answer = client.answer((req.session_id, req.sequence), 30.0)
        assert answer is not None and answer.code == INFERENCE and answer.nfe_done == 3


@needs_fifo
def test_granted_every_thread_on_the_path_runs_as_asked_and_memory_is_locked():
    """The relay's rt.* keys say what was asked and what the OS holds, and agree with this
    process's own read of /proc/<tid> while the relay runs."""
    with remote_relay(**ASKED) as (relay, client):
        _answers(client)
        level, message, values = relay.workers_status(timeout=10)
        seen = {role: _proc(_tid(values[f"rt.{role}"]))
                for role in ("worker0", "request", "publisher")}  # fmt: skip
        locked = re.search(r"^VmLck:\s*(\d+)", pathlib.Path(
            f"/proc/{client.process.proc.pid}/status").read_text(), re.M).group(1)
    assert level == ord(DiagnosticStatus.OK), message
    assert values["rt.refused"] == "none" and values["rt.lock_memory"] == "on"
    assert int(values["memory_locked_kb"]) > 0 and int(locked) > 0
    for role, prio, cpu in (("worker0", 3, CPUS[-1]), ("request", 5, CPUS[0]),
                            ("publisher", 4, CPUS[0])):  # fmt: skip
        value = values[f"rt.{role}"]
        assert value.startswith(f"SCHED_FIFO {prio}, CPUs {cpu} (asked SCHED_FIFO {prio}, "
                                f"CPUs {cpu}; tid "), value  # fmt: skip
        assert seen[role] == ("SCHED_FIFO", prio, {cpu})
        assert f"SCHED_FIFO {prio} x" in values["rt.threads"]


@needs_refusing
def test_refused_the_relay_answers_and_warns_naming_each_refused_setting():
    asked = {**ASKED, "worker_cpu_affinity": [MAX_CPU]}  # a CPU this machine does not have
    with remote_relay(wrapper=REFUSING, **asked) as (relay, client):
        _answers(client)
        level, message, values = relay.workers_status(timeout=10)
        logged = "".join(client.process.lines)
    assert level == ord(DiagnosticStatus.WARN)
    eperm = "(EPERM: Operation not permitted)"
    expected = [f"worker0 CPUs {MAX_CPU} refused (EINVAL: Invalid argument",
                f"worker0 SCHED_FIFO 3 refused {eperm}; running SCHED_OTHER",
                f"request SCHED_FIFO 5 refused {eperm}; running SCHED_OTHER",
                f"publisher SCHED_FIFO 4 refused {eperm}; running SCHED_OTHER",
                f"lock_memory refused {eperm}"]  # fmt: skip
    assert message.startswith("1 of 1 workers running; real-time settings refused, running "
                              "degraded: ")  # fmt: skip
    for text in expected:
        assert text in message and text in values["rt.refused"], text
    assert values["memory_locked_kb"] == "0" and values["rt.lock_memory"].startswith("refused")
    assert "SCHED_FIFO" not in values["rt.threads"]
    # the log lines at start stay too
    for text in (f"worker0 SCHED_FIFO 3 refused {eperm}; running degraded",
                 f"request SCHED_FIFO 5 refused {eperm}; running degraded",
                 f"publisher SCHED_FIFO 4 refused {eperm}; running degraded",
                 f"lock_memory refused {eperm}"):  # fmt: skip
        assert text in logged, text


def _dds_threads(pid: int) -> dict[str, tuple[str, int, frozenset[int]]]:
    """Fast DDS's threads of a process by name (dds.ev.0, dds.udp.7411, ...)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        name = pathlib.Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        if name.startswith("dds."):
            out[f"{name}#{tid}"] = _proc(int(tid))
    return out


@needs_fifo
def test_fast_dds_threads_take_their_class_from_the_shipped_profile():
    """config/fastdds_realtime.xml through the variable each Fast DDS reads (2.14 on Jazzy the
    FASTRTPS_ one, 3.2 on Kilted the FASTDDS_ one): the reception, event and sender threads run
    at its SCHED_FIFO 58; the shared-memory watchdog (and Kilted's type lookup) stay as the
    profile says they do. The relay still answers over the profile's transports."""
    env = {"FASTRTPS_DEFAULT_PROFILES_FILE": str(PROFILE)}
    if os.environ.get("ROS_DISTRO", "jazzy") != "jazzy":
        env = {"FASTDDS_DEFAULT_PROFILES_FILE": str(PROFILE)}
    with remote_relay(env=env) as (relay, client):
        _answers(client)
        threads = _dds_threads(client.process.proc.pid)
        _, _, values = relay.workers_status(timeout=10)
    on_path = {n: s for n, s in threads.items()
               if re.match(r"dds\.(ev|asyn|udp|shm\.\d)", n)}  # fmt: skip
    kinds = {re.match(r"dds\.(\w+)", n).group(1) for n in on_path}
    assert kinds == {"ev", "asyn", "udp", "shm"}, threads
    assert {(policy, prio) for policy, prio, _ in on_path.values()} == {("SCHED_FIFO", 58)}
    assert f"SCHED_FIFO 58 x{len(on_path)}" in values["rt.threads"]
    assert values["rt.refused"] == "none"  # the relay's own threads were not asked anything
    rest = {n: s for n, s in threads.items() if n not in on_path}
    assert all(re.match(r"dds\.(shm\.wdog|tls\.)", n) for n in rest), rest
