# SPDX-License-Identifier: Apache-2.0
"""docs/design.md §7.1: capacity a client leaves unused returns at its next request (the real core
in virtual time), and fair_share and client_weights are live parameters: over DDS, a set through
the relay's parameter service applies from the next admission decision on a running, active
relay, judges work admitted before it (the core tracks clients either way), and loses or
duplicates no answer. Work is held in the lane by `fault_nfe_delay_ms` until every decision has
been observed, so no outcome depends on timing."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import make_core, request
from flowedge_relay_msgs.msg import ActionMessage
from rclpy.parameter import Parameter
from rclpy.parameter_client import AsyncParameterClient
from ros_helpers import running_relay, status_values, wait_for

from flowedge_relay.core import Code, Decision, RejectReason

A = ActionMessage
NFE_NS = 100  # virtual ns of one NFE (the core's calibration)
HOLD_NFE_MS = 200.0  # fault_nfe_delay_ms that holds a lane: 64 NFE = 12.8 s of work
HOLD_NFE = 64  # max_nfe


def _ask(core, client: bytes, seq: int, now: int, nfe: int, horizon: int) -> Decision:
    """A request of `client` (a session of its own) due `horizon` ns after `now`."""
    r = request(client + b"-%d" % seq, seq, nfe=nfe, deadline=now + horizon, origin=now)
    r.client_id = client
    return core.submit(r, now)


def _drain(core, now: int) -> tuple[list[bytes], int]:
    """Run lane 0 until the queue is empty, NFE_NS per step: the sessions in dispatch order."""
    order = []
    while (w := core.dispatch(0, now)) is not None:
        order.append(w.session_id)
        for _ in range(w.remaining_nfe):
            now += NFE_NS
            core.step(0, now, NFE_NS)
        core.finish(0, now, np.zeros(16, np.float32))
    return order, now


@pytest.mark.parametrize("fair", [True, False])
def test_capacity_left_unused_returns_at_the_clients_next_request(fair):
    """B is served, then stays away; A, alone, takes the lane and the whole queue (work-
    conserving: nothing held back for B). B asks again, with a deadline later than all of A's
    queued work: with the share, that very request is admitted (A's latest queued request is
    displaced, reject_reason fair_share) and finishes inside its horizon, behind only work A had
    queued before it, so B's capacity is back within one request's horizon. Without the share the
    same request is refused REJECTED_CAPACITY: A keeps what it took."""
    core = make_core(workers=1, queue_capacity=3, max_nfe=8, nfe_ns=NFE_NS, fair_share=int(fair))
    try:
        now = 1_000
        assert _ask(core, b"B", 0, now, 2, 10_000) == Decision.ACCEPTED
        order, now = _drain(core, now)
        assert order == [b"B-0"]  # B served, then idle: nothing of it committed
        flood = [_ask(core, b"A", 1, now, 2, 1_500)]
        assert core.dispatch(0, now).session_id == b"A-1"
        flood += [_ask(core, b"A", i, now, 2, 1_500) for i in range(2, 7)]
        assert flood[:4] == [Decision.ACCEPTED] * 4  # the lane and the whole queue are A's
        assert flood[4:] == [Decision.REJECTED_CAPACITY] * 2
        now += NFE_NS
        core.step(0, now, NFE_NS)
        back = _ask(core, b"B", 7, now, 1, 1_400)  # due after every request A has queued
        if not fair:
            assert back == Decision.REJECTED_CAPACITY
            return
        assert back == Decision.ACCEPTED
        now += NFE_NS
        core.step(0, now, NFE_NS)
        core.finish(0, now, np.zeros(16, np.float32))
        order, end = _drain(core, now)
        answers = {o.session_id: o for o in core.pop_outcomes()}
    finally:
        core.close()
    assert order == [b"A-2", b"A-3", b"B-7"]  # A's latest went for B's share
    assert (answers[b"A-4"].code, answers[b"A-4"].reject_reason) == (
        Code.REJECTED_CAPACITY, RejectReason.FAIR_SHARE)
    b = answers[b"B-7"]
    assert b.code == Code.INFERENCE and b.finish_ns <= b.arrival_ns + 1_400


def _set(h, **values):
    """`ros2 param set` through the relay's parameter service: the result."""
    client = AsyncParameterClient(h.client, "flowedge_relay")
    assert client.wait_for_services(10.0)
    future = client.set_parameters([Parameter(k, value=v) for k, v in values.items()])
    assert wait_for(future.done, 60.0), "the parameter service did not answer"
    (result,) = future.result().results
    return result


def _send(h, seq: int, client: str, nfe: int, deadline_ms: int) -> None:
    """A request of `client` in a session of its own (`<client>-<seq>`)."""
    req = h.request(session_id=f"{client}-{seq}", sequence=seq, remaining_nfe=nfe,
                    deadline_ms=deadline_ms)
    req.client_id = client
    h.send(req)


@pytest.mark.ros
def test_fair_share_set_live_applies_from_the_next_decision_and_answers_all_once():
    """Off: robot-b, at a full queue of robot-a's work, is refused plain capacity (its deadline is
    later than a's). Set on through the parameter service: b's next request displaces a's latest
    (admitted while the share was off, and counted) with reject_reason fair_share, and a, now over
    its share, may not displace b's. Set off again: a's earlier deadline displaces b's by plain
    EDF. A bad client_weights set is refused and changes nothing; a good one re-weighs robot-b at
    once. Every request is answered exactly once."""
    with running_relay(queue_capacity=2, fault_nfe_delay_ms=HOLD_NFE_MS) as h:
        _send(h, 1, "robot-a", HOLD_NFE, 600_000)  # holds the lane until released
        assert wait_for(lambda: h.node.relay.core.stats().lanes_busy == 1, 10)
        _send(h, 2, "robot-a", 5, 50_000)
        _send(h, 3, "robot-a", 5, 50_000)
        assert wait_for(lambda: h.node.relay.core.stats().queue_depth == 2, 10)
        _send(h, 4, "robot-b", 1, 60_000)  # off: the queue is full of earlier deadlines
        refused_off = h.answer_for(4)
        before = h.node.relay.core.stats().fair_share_rejected

        assert _set(h, fair_share=True).successful
        assert status_values(h.latest_status("queue"))["fair_share"] == "on"
        _send(h, 5, "robot-b", 1, 60_000)  # b within its share: displaces a's latest (3)
        displaced = h.answer_for(3)
        _send(h, 6, "robot-a", 5, 30_000)  # a over its share: may not displace b's request
        over = h.answer_for(6)

        bad = _set(h, client_weights=["robot-b=0"])
        assert _set(h, client_weights=["robot-b=3"]).successful
        weights = {c.client_id: c.weight for c in h.node.relay.core.clients_snapshot()}

        assert _set(h, fair_share=False).successful
        _send(h, 7, "robot-a", 5, 20_000)  # off: an earlier deadline displaces b's (5) by EDF
        displaced_off = h.answer_for(5)
        assert h.node.relay.core.stats().lanes_busy == 1  # all decided while a's work held it
        assert h.node.set_parameters(
            [Parameter("fault_nfe_delay_ms", value=0.0)])[0].successful
        answers = h.wait_answers(7, timeout=60)
        stats = h.node.relay.core.stats()
    assert (refused_off.code, refused_off.reject_reason) == (A.REJECTED_CAPACITY,
                                                             A.REJECT_CAPACITY)
    assert before == 0
    assert (displaced.code, displaced.reject_reason, displaced.client_id) == (
        A.REJECTED_CAPACITY, A.REJECT_FAIR_SHARE, "robot-a")
    assert (over.code, over.reject_reason) == (A.REJECTED_CAPACITY, A.REJECT_FAIR_SHARE)
    assert not bad.successful and "robot-b=0" in bad.reason
    assert weights == {b"robot-a": 1, b"robot-b": 3}
    assert (displaced_off.code, displaced_off.reject_reason) == (A.REJECTED_CAPACITY,
                                                                 A.REJECT_CAPACITY)
    # exactly once: seven answers, one per request, and the relay decided seven requests
    assert sorted(a.sequence for a in answers) == [1, 2, 3, 4, 5, 6, 7]
    assert sum(stats.outcomes) == 7
    done = {a.sequence: a.code for a in answers}
    assert (done[1], done[2], done[7]) == (A.INFERENCE,) * 3
    assert (stats.fair_share_rejected, stats.fair_share_displaced) == (1, 1)
