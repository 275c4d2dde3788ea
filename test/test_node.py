# SPDX-License-Identifier: Apache-2.0
"""The relay node over real DDS: every outcome from a real scenario, parameters, diagnostics.

Each test starts a real RelayNode (request executor thread + main executor + workers running the
bundled ONNX model) and a real client node in a private rclpy context.

No outcome here depends on timing luck on a loaded host: a deadline that must be met by the
trip to the relay gets a margin of hundreds of ms, work that must still be running when a later
request arrives is held by `fault_nfe_delay_ms` for seconds (and released through the live
parameter once the decisions are observed), and bursts are paced by what the relay received.
"""

from __future__ import annotations

import threading
import time

import pytest
from diagnostic_msgs.msg import DiagnosticStatus
from flowedge_relay_msgs.msg import ActionMessage
from rclpy.parameter import Parameter
from ros_helpers import running_relay, status_values, wait_for

A = ActionMessage
HOLD_NFE_MS = 200.0  # fault_nfe_delay_ms that holds a lane: 64 NFE = 12.8 s of work
HOLD_NFE = 64  # max_nfe


def _release(h) -> None:
    """End the hold: held work finishes at its next NFE boundary (<= HOLD_NFE_MS)."""
    assert h.node.set_parameters([Parameter("fault_nfe_delay_ms", value=0.0)])[0].successful


@pytest.mark.ros
def test_inference_answer_carries_actions_and_echoes_the_request():
    with running_relay() as h:
        req = h.request(session_id="arm", sequence=42, generation=3, retry_count=0,
                        remaining_nfe=4, noise_seed=9, deadline_ms=5_000)
        h.send(req)
        ans = h.answer_for(42)
    assert ans is not None and ans.code == A.INFERENCE
    m = h.model
    assert len(ans.actions) == m.action_horizon * m.action_dim
    assert (ans.session_id, ans.generation, ans.model_digest) == ("arm", 3, m.digest)
    assert (ans.observation_dim, ans.action_dim, ans.action_horizon) == (
        m.obs_dim, m.action_dim, m.action_horizon)
    assert (ans.deadline.sec, ans.deadline.nanosec) == (req.deadline.sec, req.deadline.nanosec)
    assert ans.nfe_done == 4 and ans.remaining_nfe == 0 and ans.compute_ns > 0


@pytest.mark.ros
def test_deadline_already_passed_is_expired():
    with running_relay() as h:
        h.send(h.request(sequence=1, deadline_ms=-5))
        ans = h.answer_for(1)
    assert ans.code == A.EXPIRED and len(ans.actions) == 0 and ans.nfe_done == 0


@pytest.mark.ros
def test_admission_is_off_by_default():
    """With nfe_ns = 0 even a hopeless deadline is queued (and then expires), never rejected.

    8 NFE x 200 ms cannot finish in 800 ms, while 800 ms is ample for the trip to the relay and
    the dispatch: the request starts, then stops EXPIRED at a step boundary."""
    with running_relay(fault_nfe_delay_ms=200.0) as h:
        assert h.node.get_parameter("nfe_ns").value == 0
        h.send(h.request(sequence=1, remaining_nfe=8, deadline_ms=800))
        ans = h.answer_for(1)
    assert ans.code == A.EXPIRED and 1 <= ans.nfe_done < 8


@pytest.mark.ros
def test_calibrated_admission_rejects_what_cannot_finish():
    # 1 s per NFE: the first needs 8 s but has 4 s (seconds to spare for the trip on a loaded
    # host: rejected at admission, not expired on arrival); the second needs 2 s of its 10 s.
    with running_relay(nfe_ns=1_000_000_000) as h:
        h.send(h.request(sequence=1, remaining_nfe=8, deadline_ms=4_000))
        h.send(h.request(sequence=2, remaining_nfe=2, deadline_ms=10_000))
        first, second = h.answer_for(1), h.answer_for(2)
    assert first.code == A.REJECTED_DEADLINE and first.nfe_done == 0
    assert first.remaining_nfe == 8
    assert second.code == A.INFERENCE


@pytest.mark.ros
def test_runtime_change_of_nfe_ns_takes_effect():
    with running_relay() as h:
        h.send(h.request(sequence=1, remaining_nfe=8, deadline_ms=2_000))
        assert h.answer_for(1).code == A.INFERENCE
        result = h.node.set_parameters([Parameter("nfe_ns", value=1_000_000_000)])
        assert result[0].successful
        h.send(h.request(sequence=2, remaining_nfe=8, deadline_ms=2_000))
        assert h.answer_for(2).code == A.REJECTED_DEADLINE
        bad = h.node.set_parameters([Parameter("age_gate", value="sometimes")])
        assert not bad[0].successful
        out_of_range = h.node.set_parameters([Parameter("nfe_ns", value=-1)])
        assert not out_of_range[0].successful
        assert h.node.get_parameter("nfe_ns").value == 1_000_000_000


@pytest.mark.ros
def test_newer_generation_cancels_queued_and_running_work():
    with running_relay(fault_nfe_delay_ms=HOLD_NFE_MS) as h:  # request 1 runs for 12.8 s
        h.send(h.request(session_id="r", sequence=1, generation=1, remaining_nfe=HOLD_NFE))
        assert wait_for(lambda: h.node.relay.core.stats().lanes_busy == 1, 10)
        h.send(h.request(session_id="r", sequence=2, generation=1, remaining_nfe=20))
        assert wait_for(lambda: h.node.relay.core.stats().queue_depth == 1, 10)
        h.send(h.request(session_id="r", sequence=3, generation=2, remaining_nfe=1))
        running, queued, newer = h.answer_for(1), h.answer_for(2), h.answer_for(3)
    assert queued.code == A.REJECTED_STALE and queued.nfe_done == 0
    assert running.code == A.REJECTED_STALE and 1 <= running.nfe_done < HOLD_NFE
    assert newer.code == A.INFERENCE


@pytest.mark.ros
def test_stale_generation_is_rejected():
    with running_relay() as h:
        h.send(h.request(session_id="r", sequence=1, generation=5))
        assert h.answer_for(1).code == A.INFERENCE
        h.send(h.request(session_id="r", sequence=2, generation=4))
        assert h.answer_for(2).code == A.REJECTED_STALE


@pytest.mark.ros
def test_full_queue_displaces_the_latest_deadline():
    with running_relay(queue_capacity=2, fault_nfe_delay_ms=HOLD_NFE_MS) as h:
        # occupies the worker (12.8 s) until released below
        h.send(h.request(session_id="a", sequence=1, remaining_nfe=HOLD_NFE))
        assert wait_for(lambda: h.node.relay.core.stats().lanes_busy == 1, 10)
        h.send(h.request(session_id="b", sequence=2))                    # no deadline
        h.send(h.request(session_id="c", sequence=3, deadline_ms=60_000))
        assert wait_for(lambda: h.node.relay.core.stats().queue_depth == 2, 10)
        h.send(h.request(session_id="d", sequence=4))                    # cannot displace
        h.send(h.request(session_id="e", sequence=5, deadline_ms=30_000))  # displaces b
        rejected_self, displaced = h.answer_for(4), h.answer_for(2)
        assert h.node.relay.core.stats().lanes_busy == 1  # decided while "a" still held the worker
        _release(h)
        kept = h.answer_for(5, timeout=30)
    assert rejected_self.code == A.REJECTED_CAPACITY
    assert displaced.code == A.REJECTED_CAPACITY
    assert kept.code == A.INFERENCE


@pytest.mark.ros
def test_invalid_input_is_discarded_counted_and_unanswered():
    with running_relay() as h:
        h.send(h.request(sequence=1, model_digest="sha256:" + "0" * 64))
        h.send(h.request(sequence=2, observation=[float("nan")] * h.model.obs_dim))
        h.send(h.request(sequence=3, remaining_nfe=0))
        h.send(h.request(sequence=4))  # a valid one, as a marker that the others went by
        assert h.answer_for(4).code == A.INFERENCE
        status = h.latest_status("admission")
        values = status_values(status)
        time.sleep(0.3)
        answered = {a.sequence for a in h.answers()}
    assert answered == {4}
    assert values["invalid.model_digest_mismatch"] == "1"
    assert values["invalid.observation_not_finite"] == "1"
    assert values["invalid.remaining_nfe_zero"] == "1"
    assert values["invalid_discarded"] == "3"


@pytest.mark.ros
def test_diagnostics_report_each_concern_with_levels():
    with running_relay() as h:
        h.send(h.request(sequence=1, deadline_ms=5_000))
        h.answer_for(1)
        statuses = {t: h.latest_status(t) for t in
                    ("admission", "queue", "workers", "model", "output")}
    assert all(s is not None for s in statuses.values())
    ids = {s.hardware_id for s in statuses.values()}
    assert len(ids) == 1 and ids.pop().startswith("flowedge_relay@")
    assert statuses["model"].level == DiagnosticStatus.OK
    # admission off while a deadline arrived: WARN, as docs/design.md §9 says
    assert statuses["admission"].level == DiagnosticStatus.WARN
    workers = status_values(statuses["workers"])
    for key in ("nfe_ns_p50", "nfe_ns_p99", "nfe_ns_configured", "lane_utilisation"):
        assert key in workers
    assert float(workers["nfe_ns_p50"]) > 0
    assert workers["nfe_loop"] == "native"  # the default: NFEs in C, without the GIL


@pytest.mark.ros
def test_missing_model_is_an_error_diagnostic_and_the_node_stays_up(tmp_path):
    with running_relay(model_path=str(tmp_path / "nope.onnx")) as h:
        h.send(h.request(sequence=1))
        status = h.latest_status("model")
        time.sleep(0.3)
        assert h.answers() == []
        admission = status_values(h.latest_status("admission"))
    assert status.level == DiagnosticStatus.ERROR and "nope.onnx" in status.message
    assert admission["invalid.model_unavailable"] == "1"


@pytest.mark.ros
def test_exactly_one_outcome_per_valid_request_above_capacity():
    """1,200 valid requests, 6 sessions, deadlines and generations mixed, offered faster than
    one worker can serve: every request gets exactly one answer.

    Chunks of 50 (above queue_capacity + workers) go out back to back, each as soon as the relay
    has taken the previous one: faster than the worker serves, never more than a chunk waiting
    in DDS history or an outcome ring, whatever the host's load. Three outcomes are certain by
    construction: INFERENCE (request 0, sent and answered alone first), REJECTED_STALE (a frame
    of generation 1 of session s0 in each chunk, after request 0 proved generation 2 accepted),
    EXPIRED (deadlines already passed, current generations)."""
    n, chunk = 1200, 50
    with running_relay(queue_capacity=32, nfe_ns=2_000_000) as h:

        def request(i: int):
            if i % chunk == 49:  # a late frame: s0 accepted generation 2 with request 0
                return h.request(session_id="s0", sequence=i, generation=1, remaining_nfe=1)
            return h.request(
                session_id=f"s{i % 6}", sequence=i, generation=2 + i // 300,
                remaining_nfe=1 + i % 6,
                deadline_ms=(None if i % 5 == 0 else -1 if i % chunk == 7
                             else 30 + (i * 7) % 300),
            )

        h.send(request(0))
        first = h.answer_for(0)
        assert first is not None and first.code == A.INFERENCE
        for start in range(1, n, chunk):
            stop = min(start + chunk, n)
            # built at send time, so deadlines (30-330 ms, one in five none) are relative to now
            h.send(*[request(i) for i in range(start, stop)])
            assert wait_for(lambda s=stop: h.node.relay.counters().received >= s, 30), (
                h.node.relay.counters(), stop)
        h.wait_answers(n, timeout=120)
        time.sleep(0.5)  # room for an answer too many
        answers = h.answers()
        stats = h.node.relay.core.stats()
    assert stats.rejection_outputs_dropped == 0 and stats.action_outputs_dropped == 0
    by_seq: dict[int, int] = {}
    for a in answers:
        by_seq[a.sequence] = by_seq.get(a.sequence, 0) + 1
    assert len(answers) == n
    assert set(by_seq) == set(range(n)) and set(by_seq.values()) == {1}
    codes = {a.code for a in answers}
    assert {A.INFERENCE, A.REJECTED_STALE, A.EXPIRED} <= codes
    late = [a for a in answers if a.sequence % chunk == 49]
    assert late and all(a.code == A.REJECTED_STALE for a in late)


@pytest.mark.ros
def test_no_relay_thread_outlives_the_node():
    before = {t.ident for t in threading.enumerate()}
    with running_relay(workers=2, fault_nfe_delay_ms=HOLD_NFE_MS) as h:
        h.send(h.request(sequence=1, remaining_nfe=HOLD_NFE))
        assert wait_for(lambda: h.node.relay.core.stats().lanes_busy == 1, 10)  # work in flight
        # teardown starts with the work certainly still running (12.8 s of it)
    time.sleep(0.2)
    left = [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert left == []


@pytest.mark.ros
def test_a_timer_that_fires_during_destroy_node_finds_the_core_closed_and_returns():
    """The stats and diagnostics timers read the core on the main executor's threads while
    destroy_node closes it: whichever comes second sees the other's effect, never a closed
    core mid-read (it was an 'InvalidState: core is closed' in a timer thread at teardown)."""
    from flowedge_relay.node import RelayNode
    from flowedge_relay_tools.harness import ros_context

    with ros_context() as ctx:
        node = RelayNode(context=ctx)
        assert node.status.publish_now()  # the core is open: the timers' bodies read and publish
        node.destroy_node()
        # what a timer firing after the close does: nothing, no closed core read
        assert not node.status.publish_now()
        assert node.relay.core is not None
        assert node.relay.open_snapshot("stats", lambda: (0, "")) is None


@pytest.mark.ros
def test_adr_flags_win_and_show_in_parameters():
    import rclpy
    from rclpy.context import Context

    from flowedge_relay.cli import parse_adr_flags
    from flowedge_relay.node import RelayNode

    ros_args = ["--ros-args", "-p", "nfe_ns:=1", "-p", "admission_reserve_ns:=7"]
    overrides, _ = parse_adr_flags(["--nfe-ns", "250000", *ros_args])
    ctx = Context()
    rclpy.init(args=["flowedge-relayd", *ros_args], context=ctx)
    try:
        node = RelayNode(context=ctx, parameter_overrides=overrides)
        try:
            assert node.get_parameter("nfe_ns").value == 250_000  # the ADR flag wins
            assert node.get_parameter("admission_reserve_ns").value == 7  # --ros-args still apply
        finally:
            node.destroy_node()
    finally:
        ctx.try_shutdown()


@pytest.mark.ros
def test_a_production_relay_has_no_fault_knob_and_a_drill_relay_has_them():
    """Fault injection exists only on a relay started for a drill (`flowedge-relayd --drill`):
    a production relay declares no fault_* parameter, so nobody on the bus can slow it down
    with `ros2 param set`, and its in-process fault hooks refuse."""
    from flowedge_relay.cli import parse_adr_flags
    from flowedge_relay.node import RelayNode
    from flowedge_relay.workers import DrillOnly
    from flowedge_relay_tools.harness import ros_context

    assert parse_adr_flags([])[1].drill is False
    assert parse_adr_flags(["--drill"])[1].drill is True
    with ros_context() as ctx:
        node = RelayNode(context=ctx)
        try:
            names = set(node.list_parameters([], 0).names)
            assert names and not any(n.startswith("fault_") for n in names), names
            for hook in ("fault_pause_intake", "fault_pause_output"):
                with pytest.raises(DrillOnly):
                    getattr(node.relay, hook)
            with pytest.raises(DrillOnly):
                node.relay.inject_worker_crash(0)
            with pytest.raises(DrillOnly):
                node.relay.pool.fault_nfe_delay_ns = 1
            assert node.relay.pool.fault_nfe_delay_ns == 0
        finally:
            node.destroy_node()
        drill = RelayNode(context=ctx, drill=True)
        try:
            assert drill.get_parameter("fault_nfe_delay_ms").value == 0.0
            assert not drill.relay.fault_pause_intake.is_set()
        finally:
            drill.destroy_node()


@pytest.mark.parametrize("bad", [["--nfe-ns", "-5"], ["--nfe-ns", "many"]])
def test_adr_flags_refuse_bad_values(bad):
    from flowedge_relay.cli import parse_adr_flags

    with pytest.raises(SystemExit):
        parse_adr_flags(bad)


# ---- docs/design.md §5.2: drift alarm and adaptive cost model over DDS -----------------------

SLOW_MS = 50.0  # injected NFE delay, far above the 5 ms nfe_ns below: certain on any host
NFE_NS = 5_000_000


def _workers_warn(h, timeout: float = 15.0):
    """The first workers status at WARN within timeout (None if none came)."""
    def warn():
        status = h.latest_status("workers")  # waits for a fresh /diagnostics array
        return status if status is not None and status.level == DiagnosticStatus.WARN else None

    return wait_for(warn, timeout, 0)


@pytest.mark.ros
def test_static_relay_raises_the_drift_alarm_when_nfe_cost_rises_mid_run():
    with running_relay(nfe_ns=NFE_NS, drill=True) as h:
        h.send(h.request(sequence=1, remaining_nfe=2))
        assert h.answer_for(1).code == A.INFERENCE
        assert h.node.set_parameters(
            [Parameter("fault_nfe_delay_ms", value=SLOW_MS)])[0].successful
        # 2 x 40 NFE of >= 50 ms: seconds of slow NFEs while diagnostics are watched
        h.send(h.request(sequence=2, remaining_nfe=40), h.request(sequence=3, remaining_nfe=40))
        status = _workers_warn(h)
    assert status is not None, "no drift alarm on /diagnostics"
    values = status_values(status)
    assert int(values["nfe_ns_observed_tail"]) >= SLOW_MS * 1e6
    assert int(values["nfe_ns_in_use"]) == int(values["nfe_ns_configured"]) == NFE_NS
    assert values["cost_model"] == "static"
    assert "drift" in status.message
    assert values["nfe_ns_observed_tail"] in status.message and str(NFE_NS) in status.message


@pytest.mark.ros
def test_adaptive_relay_prices_the_slower_nfe_into_admission():
    from flowedge_relay_msgs.msg import RelayStats

    # A 10 s window: the slow samples stay in it however slowly this host runs the test.
    with running_relay(nfe_ns=NFE_NS, cost_model="adaptive", cost_window_ms=10_000,
                       drill=True) as h:
        stats: list = []
        h.client.create_subscription(RelayStats, "flowedge/stats", stats.append, 10)
        h.send(h.request(sequence=1, remaining_nfe=2))
        assert h.answer_for(1).code == A.INFERENCE
        assert h.node.set_parameters(
            [Parameter("fault_nfe_delay_ms", value=SLOW_MS)])[0].successful
        h.send(h.request(sequence=2, remaining_nfe=2))
        assert h.answer_for(2).code == A.INFERENCE  # two NFEs of >= 50 ms measured
        assert wait_for(lambda: stats and stats[-1].nfe_ns_in_use >= SLOW_MS * 1e6, 10.0)
        last = stats[-1]
        # 20 NFE due in 600 ms: fit at the configured 5 ms per NFE (100 ms), not at the measured
        # 50 ms (1 s); the 600 ms leave the trip room on a loaded host
        h.send(h.request(sequence=3, remaining_nfe=20, deadline_ms=600))
        adaptive = h.answer_for(3)
        assert h.node.set_parameters([Parameter("cost_model", value="static")])[0].successful
        h.send(h.request(sequence=4, remaining_nfe=20, deadline_ms=600))
        static = h.answer_for(4)
        bad = h.node.set_parameters([Parameter("cost_model", value="sometimes")])
    assert last.cost_model_adaptive and last.nfe_ns_configured == NFE_NS
    assert last.nfe_ns_observed_tail >= SLOW_MS * 1e6 and last.cost_window_ms == 10_000
    assert adaptive.code == A.REJECTED_DEADLINE and adaptive.nfe_done == 0
    assert static.code == A.EXPIRED and static.nfe_done >= 1  # admitted on 5 ms, then late
    assert not bad[0].successful


@pytest.mark.ros
def test_batch_slots_answer_every_valid_request_exactly_once_over_dds():
    """batch_slots:=4 (docs/design.md §5.1): a steady stream of valid requests (plus a stale
    generation, a passed deadline and an invalid one) over real DDS. The relay's steps are held
    at 30 ms by the fault delay, so while the first request runs the others queue and join at step
    boundaries: batches of several rows form by construction, not by timing luck."""
    n = 16
    with running_relay(batch_slots=4, fault_nfe_delay_ms=30.0) as h:
        assert h.node.relay.core.lanes == 4
        sent = [h.request(session_id=f"arm{i}", sequence=i, generation=2, remaining_nfe=3,
                          noise_seed=i, deadline_ms=60_000) for i in range(n)]
        h.send(*sent)
        h.send(h.request(session_id="arm0", sequence=100, generation=1, deadline_ms=60_000))
        h.send(h.request(session_id="late", sequence=101, deadline_ms=-5))
        h.send(h.request(session_id="bad", sequence=102, remaining_nfe=0))  # invalid: no answer
        assert wait_for(lambda: len(h.answers()) >= n + 2, 60.0)
        time.sleep(0.3)  # a duplicate answer would show up here
        workers = status_values(h.latest_status("workers"))
        answers = h.answers()
    by_seq: dict[int, list] = {}
    for a in answers:
        by_seq.setdefault(a.sequence, []).append(a)
    assert sorted(by_seq) == list(range(n)) + [100, 101]
    assert all(len(v) == 1 for v in by_seq.values())  # exactly once
    assert all(by_seq[i][0].code == A.INFERENCE for i in range(n))
    assert by_seq[100][0].code == A.REJECTED_STALE and by_seq[101][0].code == A.EXPIRED
    assert workers["batch_slots"] == "4" and workers["nfe_loop"] == "native"
    assert float(workers["mean_rows_per_step"]) > 1.0
    assert "step_ns_p99.rows_4" in workers or "step_ns_p99.rows_3" in workers


@pytest.mark.ros
def test_a_relay_stopped_as_its_request_thread_starts_stops_whole(monkeypatch):
    """Torn down as it comes up: stop() runs on another thread at the moment spin_relay's thread
    starts the request executor (created, not yet started). stop() must still stop the workers
    and the publisher: it once joined the unstarted thread, which raised and skipped the rest,
    and the core was then closed under running workers. The request thread, started after
    stop(), exits at once."""
    import flowedge_relay.node as node_mod
    from flowedge_relay.node import RelayNode
    from flowedge_relay_tools.harness import ros_context

    class StopFirst(threading.Thread):
        """The request thread, with stop() run by 'another thread' just before it starts."""

        def start(self) -> None:
            if self.name == "flowedge-requests":
                node.stop()
            super().start()

    before = {t.ident for t in threading.enumerate()}
    with ros_context() as ctx:
        node = RelayNode(context=ctx)
        monkeypatch.setattr(node_mod.threading, "Thread", StopFirst)
        node.start_request_executor()
        monkeypatch.undo()
        assert not any(node.relay.threads_alive().values())
        assert node.requests.join(timeout=5.0)
        node.destroy_node()
    time.sleep(0.2)
    assert [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()] == []


def _send_as(h, seq: int, client: str, nfe: int, deadline_ms: int | None = None) -> None:
    """A request of `client` (its session `<client>-<seq>`, `anon-<seq>` for no client)."""
    extra = {} if deadline_ms is None else {"deadline_ms": deadline_ms}
    req = h.request(session_id=f"{client or 'anon'}-{seq}", sequence=seq, remaining_nfe=nfe,
                    **extra)
    req.client_id = client
    h.send(req)


def _b_displaces_a(h):
    """On a fair-share relay with queue_capacity 2 and HOLD_NFE_MS steps: robot-a's long request
    holds the worker (12.8 s, until _release) and two more of a's fill the queue; robot-b, within
    its share, then displaces a's latest (sequence 3). Returns that request's answer."""
    _send_as(h, 1, "robot-a", HOLD_NFE)
    assert wait_for(lambda: h.node.relay.core.stats().lanes_busy == 1, 10)
    _send_as(h, 2, "robot-a", 5, 50_000)
    _send_as(h, 3, "robot-a", 5, 50_000)
    assert wait_for(lambda: h.node.relay.core.stats().queue_depth == 2, 10)
    _send_as(h, 4, "robot-b", 1, 60_000)  # b is within its share: displaces a's latest (3)
    return h.answer_for(3)


@pytest.mark.ros
def test_fair_share_displaces_the_flooding_client_and_says_why():
    """docs/design.md §7.1 over DDS: with fair_share on, robot b (within its share) displaces
    robot a's queued work at a full queue; a's displaced request and a's next one (over its share,
    which may not displace b's) are REJECTED_CAPACITY with reject_reason fair_share; a's request
    without a deadline, which may displace nothing, is plain capacity; answers echo client_id
    (the session id when none is sent)."""
    with running_relay(queue_capacity=2, fair_share=True,
                       fault_nfe_delay_ms=HOLD_NFE_MS) as h:
        _send_as(h, 0, "", 1)
        plain = h.answer_for(0)
        displaced = _b_displaces_a(h)
        _send_as(h, 5, "robot-a", 5, 30_000)  # a is over its share: may not displace b's request
        over = h.answer_for(5)
        _send_as(h, 6, "robot-a", 1)  # no deadline: may displace nothing, the queue is full
        full = h.answer_for(6)
        status = status_values(h.latest_status("queue"))
        assert h.node.relay.core.stats().lanes_busy == 1  # all decided while a's work held it
        _release(h)
        kept = h.answer_for(4, timeout=30)
    assert (displaced.code, displaced.reject_reason) == (A.REJECTED_CAPACITY, A.REJECT_FAIR_SHARE)
    assert displaced.client_id == "robot-a" and displaced.session_id == "robot-a-3"
    assert (over.code, over.reject_reason, over.client_id) == (
        A.REJECTED_CAPACITY, A.REJECT_FAIR_SHARE, "robot-a")
    assert (full.code, full.reject_reason) == (A.REJECTED_CAPACITY, A.REJECT_CAPACITY)
    assert (plain.code, plain.reject_reason, plain.client_id) == (A.INFERENCE, A.REJECT_NONE,
                                                                  "anon-0")
    assert (kept.code, kept.reject_reason, kept.client_id) == (A.INFERENCE, A.REJECT_NONE,
                                                               "robot-b")
    assert status["fair_share"] == "on"
    assert (status["fair_share_rejected"], status["fair_share_displaced"]) == ("1", "1")
    assert status["client.robot-a.fair_share_rejections"] == "2"


@pytest.mark.ros
def test_stats_show_each_top_client_share_rate_and_fair_share_rejections():
    """docs/design.md §7.1 over DDS: flowedge/stats lists the clients with the most committed
    work, most first, each with its share in use, admitted NFE/s and fair-share rejections. While
    robot-a's long request holds the lane, robot-b (within its share) displaces a's queued request:
    the next stats name a, then b (weight 3 from client_weights), shares summing to 1 and a's
    rejection; each client's admitted NFE/s is above 0 in the first stats after its admission
    (the rate's base sample was taken before: the test waits for one stats message first)."""
    from flowedge_relay_msgs.msg import RelayStats

    with running_relay(queue_capacity=2, fair_share=True, client_weights=["robot-b=3"],
                       fault_nfe_delay_ms=HOLD_NFE_MS) as h:
        stats: list = []
        h.client.create_subscription(RelayStats, "flowedge/stats", stats.append, 50)
        assert wait_for(lambda: stats, 10)
        assert stats[-1].top_clients == []  # nothing tracked yet
        displaced = _b_displaces_a(h)

        def decided(m) -> bool:
            return len(m.top_clients) == 2 and m.top_clients[0].fair_share_rejections == 1

        assert wait_for(lambda: any(decided(m) for m in list(stats)), 10)
        got = list(stats)
        _release(h)
        kept = h.answer_for(4, timeout=30)
    assert (displaced.reject_reason, kept.code) == (A.REJECT_FAIR_SHARE, A.INFERENCE)
    a, b = next(m for m in got if decided(m)).top_clients
    assert (a.client_id, a.weight, b.client_id, b.weight) == ("robot-a", 1, "robot-b", 3)
    assert (a.fair_share_rejections, b.fair_share_rejections) == (1, 0)
    assert a.share_in_use > b.share_in_use > 0 and a.share_in_use + b.share_in_use == \
        pytest.approx(1.0)
    rate = {n: max((c.admitted_nfe_per_s for m in got for c in m.top_clients if c.client_id == n),
                   default=0.0) for n in ("robot-a", "robot-b")}
    assert rate["robot-a"] > 0 and rate["robot-b"] > 0, rate
