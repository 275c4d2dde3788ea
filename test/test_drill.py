# SPDX-License-Identifier: Apache-2.0
"""The blind-retry drill (docs/design.md §6) and the retry rules it rests on.

The drill tests run `flowedge-relay-drill` at 0.4 of its time scale with a 1500 ms happy path
(120 ms per NFE, 440 ms with the fault, 1200 ms budget), so that the margin its verdict relies on
(attempt 1, and with the gate off a late retry, must arrive in time to be admitted: budget -
happy path - reserve) is 540 ms rather than the default conditions' 70 ms at a fifth of the
scale: no scheduling hiccup of a loaded host reaches it. They check that it passes its own
verdict, and that the same drill fails it with the age gate off. The node tests
pin the section 6 rules over real DDS: a retry of a queued id is coalesced and answered once; a
late retry drains its queued late original and is then REJECTED_DEADLINE; and the gate ignores
an idle worker.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from flowedge_relay_msgs.msg import ActionMessage, InferenceRequest
from rclpy.parameter import Parameter
from ros_helpers import running_relay, status_values, wait_for

from flowedge_relay_tools import drill

A = ActionMessage
R = InferenceRequest
SCALE = "0.4"
HAPPY_MS = "1500"
HOLD_NFE_MS = 200.0  # fault_nfe_delay_ms that holds the lane: 64 NFE = 12.8 s of busy work
HOLD_NFE = 64


def _release(h) -> None:
    """End the hold: the busy request finishes at its next NFE boundary (<= HOLD_NFE_MS)."""
    assert h.node.set_parameters([Parameter("fault_nfe_delay_ms", value=0.0)])[0].successful


def _retry(h, first, retry_count: int, reason: int, deadline_ms: float):
    """What a blind client sends: same id and origin_stamp, retry_count + 1, a fresh deadline."""
    return h.request(session_id=first.session_id, sequence=first.sequence,
                     remaining_nfe=first.remaining_nfe, origin_stamp=first.origin_stamp,
                     retry_count=retry_count, retry_reason=reason, deadline_ms=deadline_ms)


def _answers(h, sequence: int) -> list:
    return [a for a in h.answers() if a.sequence == sequence]


# -- the drill ------------------------------------------------------------------------------------

def test_drill_conditions_leave_a_wide_admission_margin():
    cond = drill.Conditions(time_scale=float(SCALE), happy_ms=float(HAPPY_MS))
    cond.check()
    margin = (cond.budget_ms * (1 - cond.reserve_fraction) - cond.happy_ms) * cond.time_scale
    assert margin >= 500  # ms for the trip to the relay before admission would refuse


@pytest.mark.ros
def test_drill_passes_its_own_verdict_at_a_small_time_scale(tmp_path, capsys):
    out = tmp_path / "drill.json"
    rc = drill.main(["--time-scale", SCALE, "--happy-ms", HAPPY_MS, "--json", str(out)])
    report = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert report["verdict"] == "pass", report["reasons"]
    assert rc == 0 and "verdict: PASS" in printed and "retry rejected" in printed
    assert all(report["checks"].values()) and len(report["checks"]) == 4

    budget = 3000 * float(SCALE)
    events = report["events"]
    keys = {"t_ms", "queue_age_ms", "deadline_slack_ms", "retry_count", "worker_utilisation",
            "decision", "nfe_spent_on_id"}
    assert all(keys <= e.keys() for e in events)
    unc = [e for e in events if e["variant"] == "uncapped"]
    sends = [e for e in unc if e["event"] == "send"]
    # The blind client: same id, retry_count 0..3, every attempt with a fresh full budget.
    assert [e["retry_count"] for e in sends] == [0, 1, 2, 3]
    assert {(e["session_id"], e["sequence"]) for e in unc} == {("flowedge-drill-uncapped", 1)}
    assert all(e["deadline_slack_ms"] == pytest.approx(budget) for e in sends)
    assert sends[0]["queue_age_ms"] == 0  # origin_stamp kept: ages grow across the retries
    assert [e["queue_age_ms"] for e in sends] == sorted(e["queue_age_ms"] for e in sends)
    # Rejected retries: after the slack of the original was gone, age >= slack, no NFE.
    rejected = [e for e in unc if e["event"] == "answer" and e["decision"] == "REJECTED_DEADLINE"]
    assert rejected and all(e["t_ms"] >= budget and e["nfe_done"] == 0 for e in rejected)
    assert all(e["queue_age_ms"] >= e["deadline_slack_ms"] for e in sends
               if e["decision"] == "REJECTED_DEADLINE")
    v = report["variants"]
    assert v["uncapped"]["attempts_that_ran"] == 1 and v["uncapped"]["nfe_spent_on_id"] <= 5
    assert v["capped"]["attempts_sent"] == 1
    assert v["uncapped"]["relay"]["rejected_late_retries"] >= 1
    # /diagnostics carried the retry counters
    diag = report["diagnostics"]
    assert int(diag["rejected_late_retries"]) >= 1 and "duplicate_retries_coalesced" in diag
    assert int(diag["retries.count_1"]) >= 1
    milestones = {row["milestone"].split(" (")[0]: row for row in report["timeline"]}
    assert milestones["retry rejected"]["uncapped"] >= milestones["worker late"]["uncapped"]


@pytest.mark.ros
def test_drill_fails_its_verdict_with_the_age_gate_off():
    admission = {**drill.load_admission(None), "age_gate": "off"}
    cond = drill.Conditions(time_scale=float(SCALE), happy_ms=float(HAPPY_MS))
    report = drill.run_drill(cond, admission, log=lambda text: None)
    assert report["verdict"] == "fail"
    assert not report["checks"]["rejects_after_slack_gone"]
    assert not report["checks"]["nfe_not_multiplied"]
    unc = report["variants"]["uncapped"]
    # the late retries were admitted and ran again: the NFE on the id were multiplied
    assert unc["attempts_that_ran"] >= 2 and unc["nfe_spent_on_id"] > 5 // 2
    assert unc["relay"]["rejected_late_retries"] == 0


@pytest.mark.ros
def test_drill_runs_on_the_two_phase_package():
    """`--model vision`: the relay serves the policy package (prefix_ns in admission), the client
    sends image + state tensors, and the verdict is the same as on the single-graph model."""
    admission = drill.load_admission(None)
    cond = drill.Conditions(time_scale=float(SCALE), happy_ms=float(HAPPY_MS))
    report = drill.run_drill(cond, admission, log=lambda text: None, model="vision")
    params = report["relay_parameters"]
    assert params["model_path"].rstrip("/").endswith("policy_vision")
    assert params["prefix_ns"] == cond.ns(cond.prefix_ms) > 0
    assert report["verdict"] == "pass", report["reasons"]
    assert report["variants"]["uncapped"]["attempts_that_ran"] == 1


@pytest.mark.ros
def test_drill_started_in_the_background_stops_cleanly_on_sigint():
    """Started with SIGINT ignored (as `cmd &` starts it), SIGINT still stops the drill: its
    relay and client are torn down, exit 130, no traceback."""
    proc = subprocess.Popen(
        ["bash", "-c", 'trap "" INT; exec "$@"', "bash", sys.executable, "-m",
         "flowedge_relay_tools.drill", "--time-scale", SCALE],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines = []
    watchdog = threading.Timer(120, proc.kill)  # a hang fails the test instead of hanging it
    watchdog.start()
    try:
        for line in proc.stdout:  # the drill is running trials: its relay is up
            lines.append(line)
            if line.startswith("-- happy"):
                break
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = "".join(lines) + out
    assert any(line.startswith("-- happy") for line in lines), out
    assert proc.returncode == 130, out
    assert "interrupted, stopped cleanly" in out
    assert "Traceback" not in out and "never retrieved" not in out


def test_drill_admission_block_loads_and_scales(tmp_path):
    admission = drill.load_admission(None)  # config/drill.yaml
    assert admission["age_gate"] == "retries" and admission["reject_if_retry_count_gte"] == 1
    assert admission["reject_if_queue_age_ms_gte"] > 3000  # a backstop beyond the budget
    params = drill.relay_parameters(drill.Conditions(time_scale=0.1), admission)
    assert params["nfe_ns"] == 50_000_000 and params["admission_reserve_ns"] == 15_000_000
    assert params["reject_if_queue_age_ms_gte"] == admission["reject_if_queue_age_ms_gte"] // 10
    bad = tmp_path / "bad.yaml"
    bad.write_text("flowedge_relay:\n  ros__parameters:\n    nfe_ns: 5\n")
    with pytest.raises(ValueError, match="nfe_ns"):
        drill.load_admission(bad)


# -- the section 6 rules over real DDS ------------------------------------------------------------

@pytest.mark.ros
def test_retry_of_a_queued_id_is_coalesced_and_answered_once():
    with running_relay(fault_nfe_delay_ms=HOLD_NFE_MS) as h:
        # holds the only worker (12.8 s) until released: "arm" certainly waits in the queue
        h.send(h.request(session_id="busy", sequence=1, remaining_nfe=HOLD_NFE))
        assert wait_for(lambda: h.node.relay.core.stats().lanes_busy == 1, 30)
        first = h.request(session_id="arm", sequence=7, remaining_nfe=2, deadline_ms=60_000)
        h.send(first)
        assert wait_for(lambda: h.node.relay.core.stats().queue_depth == 1, 30)
        h.send(_retry(h, first, 1, R.RETRY_TIMEOUT, 60_000))
        assert wait_for(lambda: h.node.relay.core.stats().coalesced == 1, 30)
        stats = h.node.relay.core.stats()
        assert stats.queue_depth == 1 and stats.lanes_busy == 1  # no second copy; still held
        _release(h)
        answer = h.answer_for(7, timeout=30)
        assert h.answer_for(1, timeout=30) is not None
        time.sleep(0.2)  # room for a second answer that must not come
        answers = _answers(h, 7)
        values = status_values(h.latest_status("admission"))
    assert len(answers) == 1
    assert answer.code == A.INFERENCE and answer.retry_count == 0 and answer.nfe_done == 2
    assert values["duplicate_retries_coalesced"] == "1"
    assert values["retries.count_1"] == "1" and values["retries.reason_1"] == "1"
    assert values["rejected_late_retries"] == "0"
    assert values["nfe_total"] == str(HOLD_NFE + 2)


@pytest.mark.ros
def test_late_retry_is_rejected_deadline_and_drains_queued_late_copies():
    # admission off: late work gets queued. "busy" holds the only worker (12.8 s) until
    # released, so "arm" certainly waits in the queue through every step below.
    with running_relay(fault_nfe_delay_ms=HOLD_NFE_MS) as h:
        h.send(h.request(session_id="busy", sequence=1, remaining_nfe=HOLD_NFE))
        assert wait_for(lambda: h.node.relay.core.stats().lanes_busy == 1, 10)
        # 1 s: ample for the trip to the relay, so it is queued rather than EXPIRED on arrival
        first = h.request(session_id="arm", sequence=7, remaining_nfe=2, deadline_ms=1_000)
        h.send(first)
        assert wait_for(lambda: h.node.relay.core.stats().queue_depth == 1, 10)
        time.sleep(1.1)  # its deadline passes while it waits behind the busy worker
        assert h.node.relay.core.stats().queue_depth == 1
        # A blind retry of the queued, late original: coalesced, and the original is drained
        # now (EXPIRED, no NFE) instead of waiting for a worker.
        h.send(_retry(h, first, 1, R.RETRY_TIMEOUT, 150))
        drained = h.answer_for(7, timeout=10)
        stats = h.node.relay.core.stats()
        assert stats.lanes_busy == 1 and stats.queue_depth == 0 and stats.coalesced == 1
        # The client retries again: nothing left to coalesce into; age >= slack -> rejected.
        # (age >= 1.1 s, slack <= 150 ms)
        h.send(_retry(h, first, 2, R.RETRY_AFTER_EXPIRED, 150))
        assert wait_for(lambda: len(_answers(h, 7)) >= 2, 10)
        assert h.node.relay.core.stats().lanes_busy == 1  # all decided while busy still held
        _release(h)
        assert h.answer_for(1, timeout=30) is not None
        time.sleep(0.2)
        answers = _answers(h, 7)
        stats = h.node.relay.core.stats()
    assert drained.code == A.EXPIRED and drained.retry_count == 0 and drained.nfe_done == 0
    assert len(answers) == 2
    rejected = answers[1]
    assert rejected.code == A.REJECTED_DEADLINE and rejected.retry_count == 2
    assert rejected.nfe_done == 0 and rejected.remaining_nfe == 2
    assert stats.rejected_late_retries == 1 and stats.coalesced == 1
    assert stats.nfe_total == HOLD_NFE  # only the busy request ever ran


@pytest.mark.ros
def test_age_gate_rejects_a_late_retry_even_with_an_idle_worker():
    """Utilisation is not a permit: an idle, calibrated relay still rejects age >= slack."""
    with running_relay(nfe_ns=10_000_000) as h:
        old = h.request(sequence=0)
        origin = old.origin_stamp
        origin.sec -= 5  # first issued 5 s ago: age 5 s >= slack (at most 3 s)
        assert h.node.relay.core.stats().lanes_busy == 0
        h.send(h.request(sequence=1, remaining_nfe=2, origin_stamp=origin, deadline_ms=3_000,
                         retry_count=1, retry_reason=R.RETRY_AFTER_EXPIRED))
        late = h.answer_for(1)
        # the same age on a first attempt passes (age_gate: retries), and admission fits it
        h.send(h.request(sequence=2, remaining_nfe=2, origin_stamp=origin, deadline_ms=3_000))
        first = h.answer_for(2)
        stats = h.node.relay.core.stats()
    assert late.code == A.REJECTED_DEADLINE and late.nfe_done == 0
    assert first.code == A.INFERENCE
    assert stats.rejected_late_retries == 1 and stats.nfe_total == 2
