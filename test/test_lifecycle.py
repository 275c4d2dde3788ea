# SPDX-License-Identifier: Apache-2.0
"""The managed relay (docs/design.md §9) over real DDS, through its lifecycle services
(`~/change_state`, `~/get_state`): each transition and what a producer sees in each state, a
configure that fails, exactly-once across deactivate and activate under load, and the latched
`flowedge/model`."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticStatus
from flowedge_relay_msgs.msg import ActionMessage as A
from flowedge_relay_msgs.msg import RelayStats
from lifecycle_msgs.msg import State, Transition
from lifecycle_msgs.srv import ChangeState, GetState
from relayd import observer, relayds
from ros_helpers import running_relay, status_values, wait_for

from flowedge_relay import policy, producer
from flowedge_relay.producer import follow_served_model

pytestmark = pytest.mark.ros  # every test here runs a relay over DDS
# sequences of the requests the test sends itself, above any the producer reaches
INACTIVE_BATCH_BASE = 1_000_000


class Manager:
    """What a lifecycle manager does, through the relay's services (ros2 lifecycle set, nav2)."""

    def __init__(self, h) -> None:
        self.h = h
        node = h.client
        self._change = node.create_client(ChangeState, "/flowedge_relay/change_state")
        self._get = node.create_client(GetState, "/flowedge_relay/get_state")
        assert self._change.wait_for_service(10.0) and self._get.wait_for_service(10.0)

    def _call(self, client, request, timeout: float = 30.0):
        future = client.call_async(request)
        assert wait_for(future.done, timeout), "the lifecycle service did not answer"
        return future.result()

    def state(self) -> str:
        return self._call(self._get, GetState.Request()).current_state.label

    def transition(self, transition_id: int) -> bool:
        request = ChangeState.Request()
        request.transition.id = transition_id
        return self._call(self._change, request).success


def _stats(h) -> list:
    got: list = []
    h.client.create_subscription(RelayStats, "flowedge/stats", got.append, 10)
    return got


def _served(h) -> list:
    """A late subscriber to the latched flowedge/model: it still gets what is served."""
    got: list = []
    follow_served_model(h.client, got.append)
    return got


def test_each_transition_and_what_a_producer_sees_in_each_state():
    with running_relay(autostart=False) as h:
        m = Manager(h)
        stats, served = _stats(h), _served(h)
        # unconfigured: no model, so nothing can be validated: discarded, counted, no answer
        assert m.state() == "unconfigured"
        h.send(h.request(session_id="u", sequence=1))
        assert wait_for(lambda: h.node.relay.counters().discarded["model_unavailable"] == 1, 10)
        model = h.latest_status("model")
        assert model.level == DiagnosticStatus.WARN and "not configured" in model.message
        assert wait_for(lambda: served and served[-1].model_digest == "", 10)

        # configure: the model is loaded and warmed; inactive answers at once, no compute
        assert m.transition(Transition.TRANSITION_CONFIGURE) and m.state() == "inactive"
        assert wait_for(lambda: served and served[-1].model_digest == h.model.digest, 10)
        h.send(h.request(session_id="i", sequence=2))
        answer = h.answer_for(2)
        assert answer.code == A.REJECTED_CAPACITY and answer.nfe_done == 0
        admission = h.latest_status("admission")
        values = status_values(admission)
        assert admission.level == DiagnosticStatus.WARN and "inactive" in admission.message
        assert values["lifecycle_state"] == "inactive" and values["rejected_inactive"] == "1"
        assert wait_for(lambda: stats and stats[-1].lifecycle_state == State.PRIMARY_STATE_INACTIVE
                        and stats[-1].rejected_inactive == 1, 10)

        # activate: admitted and computed
        assert m.transition(Transition.TRANSITION_ACTIVATE) and m.state() == "active"
        h.send(h.request(session_id="a", sequence=3))
        assert h.answer_for(3).code == A.INFERENCE
        assert wait_for(lambda: stats[-1].lifecycle_state == State.PRIMARY_STATE_ACTIVE, 10)

        # deactivate, cleanup: the model is released, requests are model_unavailable again
        assert m.transition(Transition.TRANSITION_DEACTIVATE) and m.state() == "inactive"
        h.send(h.request(session_id="d", sequence=4))
        assert h.answer_for(4).code == A.REJECTED_CAPACITY
        assert m.transition(Transition.TRANSITION_CLEANUP) and m.state() == "unconfigured"
        assert h.node.relay.pool is None
        assert wait_for(lambda: served[-1].model_digest == "", 10)
        h.send(h.request(session_id="c", sequence=5))
        assert wait_for(lambda: h.node.relay.counters().discarded["model_unavailable"] == 2, 10)

        # configure again, then shutdown from active
        assert m.transition(Transition.TRANSITION_CONFIGURE)
        assert m.transition(Transition.TRANSITION_ACTIVATE)
        h.send(h.request(session_id="a2", sequence=6))
        assert h.answer_for(6).code == A.INFERENCE
        assert m.transition(Transition.TRANSITION_ACTIVE_SHUTDOWN) and m.state() == "finalized"
    answered = [a.sequence for a in h.answers()]
    assert sorted(answered) == [2, 3, 4, 6]  # exactly once each; 1 and 5 were never valid


def test_configure_fails_on_a_model_that_cannot_be_served_and_stays_unconfigured():
    with running_relay(autostart=False, model_path="/nonexistent/policy.onnx") as h:
        m = Manager(h)
        assert m.transition(Transition.TRANSITION_CONFIGURE) is False
        assert m.state() == "unconfigured"
        model = h.latest_status("model")
        assert model.level == DiagnosticStatus.ERROR and "/nonexistent/policy.onnx" in model.message
        h.send(h.request(session_id="x", sequence=1))
        assert wait_for(lambda: h.node.relay.counters().discarded["model_unavailable"] == 1, 10)


def test_autostart_configures_and_activates_and_a_broken_model_stays_up_unconfigured():
    with running_relay() as h:
        assert Manager(h).state() == "active"
    with running_relay(model_path="/nonexistent/policy.onnx") as h:
        assert Manager(h).state() == "unconfigured"
        assert h.latest_status("model").level == DiagnosticStatus.ERROR


def test_every_request_is_answered_exactly_once_across_deactivate_and_activate_under_load():
    """A producer keeps sending (with deadlines the relay can keep, and some it cannot) while a
    manager deactivates and activates twice, and until both rounds are done. Every request gets
    one answer; work admitted before a deactivate is served (or expires), never dropped; a known
    batch sent once deactivate has returned is answered REJECTED_CAPACITY, each request in it;
    and deactivate returns only once the core holds no work.

    Nothing here rests on how the producer's pace meets the transitions: it runs until both
    rounds are over, and the inactive window gets its requests from the batch, on purpose."""
    rounds, batch = 2, 8
    with running_relay(queue_capacity=16, nfe_ns=2_000_000, fault_nfe_delay_ms=1.0) as h:
        m = Manager(h)
        # one INFERENCE for certain: sent and answered alone, before the load starts
        h.send(h.request(session_id="first", sequence=INACTIVE_BATCH_BASE - 1))
        assert h.answer_for(INACTIVE_BATCH_BASE - 1).code == A.INFERENCE
        rounds_done = threading.Event()
        sent: list[int] = []

        def produce() -> None:
            i = 0
            while not rounds_done.is_set():
                h.send(h.request(session_id=f"s{i % 6}", sequence=i, remaining_nfe=1 + i % 3,
                                 deadline_ms=None if i % 4 else 200))
                sent.append(i)
                if i % 50 == 49:  # never far ahead of what the relay has taken
                    wait_for(lambda s=i: h.node.relay.counters().received > s - 25, 10)
                i += 1

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        idle_after_deactivate, inactive_codes = [], []
        try:
            for r in range(rounds):
                # the producer runs until rounds_done, so it certainly gets this far
                assert wait_for(lambda r=r: h.node.relay.counters().received > 100 + r * 200, 30)
                assert m.transition(Transition.TRANSITION_DEACTIVATE)
                st = h.node.relay.core.stats()
                idle_after_deactivate.append(st.queue_depth == 0 and st.lanes_busy == 0)
                first = INACTIVE_BATCH_BASE + r * batch
                h.send(*[h.request(session_id=f"off{r}", sequence=first + k, remaining_nfe=1)
                         for k in range(batch)])
                inactive_codes += [getattr(h.answer_for(first + k), "code", None)
                                   for k in range(batch)]
                assert m.transition(Transition.TRANSITION_ACTIVATE)
        finally:
            rounds_done.set()
            producer.join(30)
        assert not producer.is_alive()
        expected = sorted([*sent, INACTIVE_BATCH_BASE - 1,
                           *range(INACTIVE_BATCH_BASE, INACTIVE_BATCH_BASE + rounds * batch)])
        assert wait_for(lambda: len(h.answers()) >= len(expected), 60)
        time.sleep(0.3)  # room for an answer too many
        stats = h.node.relay.core.stats()
    keys = [a.sequence for a in h.answers()]
    assert sorted(keys) == expected  # exactly once, nothing lost
    assert inactive_codes == [A.REJECTED_CAPACITY] * (rounds * batch)
    assert {a.code for a in h.answers()} >= {A.REJECTED_CAPACITY, A.INFERENCE}
    assert idle_after_deactivate == [True] * rounds
    assert stats.rejected_inactive >= rounds * batch


def test_the_shutdown_transition_ends_the_process_as_sigint_does(tmp_path):
    """flowedge-relayd as deployed, driven like `ros2 lifecycle set`: configure, activate, then
    shutdown; the answer comes back, and the process exits cleanly on its own."""
    with relayds(tmp_path, ["--ros-args", "-p", "autostart:=false"]) as (proc,), \
            observer() as obs:
        client = obs.node.create_client(ChangeState, "/flowedge_relay/change_state")
        assert client.wait_for_service(timeout_sec=30)
        for transition in (Transition.TRANSITION_CONFIGURE, Transition.TRANSITION_ACTIVATE,
                           Transition.TRANSITION_ACTIVE_SHUTDOWN):
            future = client.call_async(ChangeState.Request(transition=Transition(id=transition)))
            obs.executor.spin_until_future_complete(future, timeout_sec=30)
            assert future.done() and future.result().success, transition
        assert proc.wait(timeout=30) == 0
    log = (tmp_path / "relay0.log").read_text()
    assert "autostart off" in log and "Traceback" not in log


def test_a_producer_builds_its_requests_from_the_latched_model_topic():
    """flowedge/model carries what a producer needs: for the two-phase
    package, its tensor inputs with dtype and shape; ServedModel.from_message turns it into
    what producer.build_request takes, and the request it builds is served."""
    vision = policy.load(policy.vision_policy_path())
    with running_relay(model_path=policy.vision_policy_path(), nfe_ns=5_000_000,
                       prefix_ns=7_000_000) as h:
        served = _served(h)
        assert wait_for(lambda: served, 10)
        msg = served[-1]
        assert (msg.nfe_ns, msg.prefix_ns) == (5_000_000, 7_000_000)
        assert msg.model_kind.startswith("two-phase") and msg.execution_providers
        model = producer.ServedModel.from_message(msg)
        assert model == producer.ServedModel.from_policy(vision)
        arrays = {d.name: np.zeros(d.shape, d.wire_dtype) for d in model.inputs}
        h.send(producer.build_request(model, arrays, session_id="m", sequence=1,
                                      remaining_nfe=2))
        answer = h.answer_for(1)
        assert answer.code == A.INFERENCE and answer.model_digest == vision.digest
        assert len(answer.actions) == vision.action_dim * vision.action_horizon
