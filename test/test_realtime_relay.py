# SPDX-License-Identifier: Apache-2.0
"""The real-time deployment mode on real relays (docs/robot-computer.md), over DDS.

Each relay is a `flowedge-relayd` process; the test talks to it only as a robot's nodes would
(requests and answers, /diagnostics) and checks the relay's read-back against this test's own
read of /proc/<tid> (a thread id names the thread system-wide). Four cases: the OS grants every
setting (root here: SCHED_FIFO at the asked priority on the asked CPUs for the workers, the
request intake and the publisher, memory locked); the OS refuses them (prlimit and setpriv take
CAP_SYS_NICE, CAP_IPC_LOCK and both rlimits away, and a CPU is asked that this machine lacks): the
relay answers all the same and the workers status is WARN naming each refusal; Fast DDS's own
threads from config/fastdds_realtime.xml; and the promise on a busy computer: two CPU hogs and
about twice the relay's compute offered, every request answered exactly once, with the mode as
the OS grants it and refused (degraded).
"""

from __future__ import annotations

import os
import pathlib
import re

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticStatus
from rt_helpers import CPUS, REFUSING, fifo_refused, needs_fifo, needs_refusing

from flowedge_relay.core import Code
from flowedge_relay.realtime import MAX_CPU, parse_cpu_list
from flowedge_relay_tools.bench import noise
from flowedge_relay_tools.bench.client import INFERENCE, remote_relay, set_policy
from flowedge_relay_tools.bench.loadgen import relay_under_load
from flowedge_relay_tools.harness import model_path, wait_for

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


# -- the promise under two hogs ------------------------------------------------------------------

#: the overload's requests, cycling, and every answer each may get once the queue is full and
#: the hogs delay arrivals: expired when sent; more NFE than fit before the deadline (admission's
#: REJECTED_DEADLINE, REJECTED_CAPACITY where a full queue holds nothing it may displace, EXPIRED
#: where it reached the relay after its deadline); no deadline (computed, or displaced or turned
#: away by a full queue); a deadline it fits when sent (any of those, or computed)
MIX = ("expired", "rejected", "admitted", "due")
TURNED_AWAY = {Code.REJECTED_DEADLINE, Code.REJECTED_CAPACITY, Code.EXPIRED}
MAY_GET = {"expired": {Code.EXPIRED}, "rejected": TURNED_AWAY,
           "admitted": {Code.INFERENCE, Code.REJECTED_CAPACITY},
           "due": {Code.INFERENCE, *TURNED_AWAY}}
#: requests offered per second: a seventh of what the C intake answers (> 10,000/s), so the
#: intake is never the limit; the compute asked is made twice the relay's by the NFE per request
RATE = 1500.0
LOAD_S = 3.0
MAX_NFE = 64  # the relay's default max_nfe


@pytest.mark.parametrize("refused", [pytest.param(False, id="as_the_os_grants"),
                                     pytest.param(True, id="refused", marks=needs_refusing)])
def test_every_request_is_answered_once_under_two_hogs_and_twice_the_compute(refused):
    """The exactly-once promise (invariant 1) on a busy robot computer: the relay as deployed
    with every real-time setting asked (as the OS grants them, and refused by prlimit/setpriv:
    degraded), two CPU hogs at normal priority from before the load until its last answer (both
    cores busy), and the C load generator offering four kinds of valid request at RATE, their
    NFE sized from the relay's own NFE cost under the hogs so the compute asked is about twice
    what it can do. Every request is received (no middleware loss), decided once and answered
    exactly once with an answer its kind may get, and the load really overran the relay.
    Margins, not speeds: the rate is far below the intake's, and the answers get 30 s."""
    with relay_under_load(wrapper=REFUSING if refused else (), model_path=model_path("bench"),
                          workers=1, **ASKED) as (relay, gen, proc):
        with noise.cpu_hog("continuous", processes=2) as hogs:
            # the relay's NFE cost with both hogs running: its capacity here and now
            gen.run(gen.load(["admitted"], 200.0, 100))
            nfe_ns = relay.stats().nfe_ns_p50
            per_cycle = round(2 * 1e9 / nfe_ns * len(MIX) / RATE)  # NFE per cycle of MIX at 2x
            due_nfe = min(max(per_cycle - 1, 1), MAX_NFE)  # `admitted` is 1 NFE
            overrun = RATE / len(MIX) * (1 + due_nfe) * nfe_ns / 1e9
            assert overrun >= 1.5, f"this host computes too fast to overrun ({nfe_ns:.0f} ns)"
            admission = int(2 * nfe_ns)  # admission on, with room for the hogs
            set_policy(relay, nfe_ns=admission)
            count = int(RATE * LOAD_S)
            load = gen.load(list(MIX), RATE, count, rejected_nfe=MAX_NFE,
                            rejected_slack_ns=MAX_NFE // 2 * admission, due_nfe=due_nfe,
                            due_slack_ns=4 * due_nfe * admission)  # fmt: skip
            before = relay.stats()
            r = gen.run(load, drain_s=30.0)
        # every request decided: the relay's counters have caught up
        wait_for(lambda: relay.stats().decided - before.decided >= count, 10.0)
        after = relay.stats()
        level, message, values = relay.workers_status(timeout=10)
    log = "".join(proc.lines[-20:])
    assert hogs["processes"] == 2 and hogs["ran_throughout"], hogs
    assert r.sent == count and r.publish_failed == 0
    assert (r.answered_once, r.unanswered, r.duplicated, r.stray) == (count, 0, 0, 0), log
    assert after.received - before.received == count  # the relay took every request ...
    assert after.middleware_lost - before.middleware_lost == 0  # ... none lost before it
    assert after.decided - before.decided == count  # one decision each
    assert after.outputs_dropped - before.outputs_dropped == 0
    kinds = np.arange(count) % len(MIX)
    for k, kind in enumerate(MIX):
        got = set(np.unique(r.codes[kinds == k]).tolist())
        assert got <= MAY_GET[kind], (kind, got)
    computing = r.codes[kinds >= MIX.index("admitted")]
    # it overran: the computing kinds were both computed and turned away in the one load
    assert (computing == Code.INFERENCE).any() and (computing != Code.INFERENCE).any()
    # the mode ran as asked where the OS grants it, degraded and saying so where it refuses
    if refused or fifo_refused() is not None:
        assert level == ord(DiagnosticStatus.WARN) and values["rt.refused"] != "none", message
    else:
        assert values["rt.refused"] == "none", message
