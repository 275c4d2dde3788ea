# SPDX-License-Identifier: Apache-2.0
"""INFERENCE_FAILED over real DDS (docs/design.md §3): a request whose actions are not finite, or
whose model call raised, is answered INFERENCE_FAILED with no actions, counted per cause on
/diagnostics and flowedge/stats; the model keeps serving. Every path: the Python loop, the C
loop, batched slots (one bad row fails only its own request), a two-phase prefix pass, and
real-time chunking. The policies are ONNX graphs built by the test (test/failing_models.py)."""

from __future__ import annotations

import numpy as np
import pytest
from failing_models import NAN_AT, OBS_DIM, RAISE_AT, write_package, write_single_file

PERIOD_NS = 20_000_000
GOOD = np.array([0.1, 0.0, 0.3, -0.2], np.float32)
NAN = np.array([NAN_AT, 1.0, 0.3, -0.2], np.float32)
RAISES = np.array([0.2, RAISE_AT, 0.3, -0.2], np.float32)


def _send(h, seq: int, obs: np.ndarray, nfe: int = 3, **fields):
    req = h.request(arrays={"observation": obs}, session_id=f"s{seq}", sequence=seq,
                    remaining_nfe=nfe, deadline_ms=60_000, **fields)
    h.send(req)


def _counters(h, answered: int) -> dict[str, str]:
    from ros_helpers import status_values, wait_for

    values: dict[str, str] = {}

    def settled() -> bool:  # the counters are read on the diagnostics timer
        values.update(status_values(h.latest_status("admission")))
        total = sum(int(values.get(f"outcome.{k}", 0)) for k in ("inference", "inference_failed"))
        return total >= answered

    assert wait_for(settled, 20)
    return values


def _assert_failed(answer) -> None:
    assert answer.code == answer.INFERENCE_FAILED
    assert len(answer.actions) == 0 and answer.frozen_rows == 0


def _assert_good(answer) -> None:
    assert answer.code == answer.INFERENCE
    actions = np.asarray(answer.actions, np.float32)
    assert actions.size == 16 and np.isfinite(actions).all()


@pytest.mark.ros
@pytest.mark.parametrize(("loop", "slots"), [("python", 1), ("auto", 1), ("python", 4),
                                             ("auto", 4)])
def test_nan_and_raising_requests_are_answered_inference_failed_on_every_loop(
        tmp_path, loop, slots):
    """A single .onnx: good, NaN, good, raising, good, one after another; then with batch slots
    a NaN row among good rows stepped together (queued while dispatch is held, so all four join
    one boundary): only the NaN request fails. Counted per cause; the workers stay alive and
    the model keeps serving."""
    from ros_helpers import running_relay, status_values, wait_for

    model = write_single_file(tmp_path)
    with running_relay(model_path=model, nfe_loop=loop, batch_slots=slots, workers=1,
                       nfe_ns=0) as h:
        assert status_values(h.latest_status("workers"))["nfe_loop"] == \
            ("native" if loop == "auto" else "python")
        for seq, obs in enumerate([GOOD, NAN, GOOD, RAISES, GOOD]):
            _send(h, seq, obs)
            h.answer_for(seq)  # one at a time: the raising call holds no other request
        answers = {a.sequence: a for a in h.wait_answers(5)}
        for seq in (0, 2, 4):
            _assert_good(answers[seq])
        _assert_failed(answers[1])
        _assert_failed(answers[3])
        n = 5
        if slots > 1:  # dispatch held until all four are queued: they join one step together
            core = h.node.relay.serving.core
            core.hold_dispatch(True)
            batch = [GOOD, GOOD, NAN, GOOD]
            for i, obs in enumerate(batch):
                _send(h, n + i, obs, nfe=4)
            assert wait_for(lambda: core.queued() == len(batch), 20)
            core.hold_dispatch(False)
            got = {a.sequence: a for a in h.wait_answers(n + len(batch))}
            for i in range(len(batch)):
                (_assert_failed if i == 2 else _assert_good)(got[n + i])
            n += len(batch)
            batch_stats = h.node.relay.serving.pool.batch_stats()
            assert max(batch_stats["step_ns_by_rows"]) == len(batch)  # stepped together
        values = _counters(h, n)
        workers = status_values(h.latest_status("workers"))
        _send(h, 100, GOOD)
        _assert_good(h.answer_for(100))  # still served
    failed_nan = 2 if slots > 1 else 1
    assert values["failed.non_finite"] == str(failed_nan)
    assert values["failed.runtime_error"] == "1"
    assert values["outcome.inference_failed"] == str(failed_nan + 1)
    assert workers["dead_lanes"] == "none"
    assert workers["publisher_loop"] == "native"  # the C publisher's CDR wrote code 5, no actions


@pytest.mark.ros
@pytest.mark.parametrize("loop", ["python", "auto"])
def test_a_nan_from_the_prefix_pass_fails_only_its_request(tmp_path, loop):
    """A two-phase package whose prefix graph puts the NaN in the context: that request fails,
    the others (before and after) are answered, counted as non_finite."""
    from ros_helpers import running_relay

    model = write_package(tmp_path, two_phase=True)
    with running_relay(model_path=model, nfe_loop=loop, workers=1, nfe_ns=0) as h:
        for seq, obs in enumerate([GOOD, NAN, GOOD]):
            _send(h, seq, obs)
            h.answer_for(seq)
        answers = {a.sequence: a for a in h.wait_answers(3)}
        values = _counters(h, 3)
    _assert_good(answers[0])
    _assert_failed(answers[1])
    _assert_good(answers[2])
    assert (values["failed.non_finite"], values["failed.runtime_error"]) == ("1", "0")


@pytest.mark.ros
@pytest.mark.parametrize("loop", ["python", "auto"])
def test_an_rtc_prefix_request_with_a_nan_fails_without_frozen_rows(tmp_path, loop):
    """rtc_mode inpaint on a package: a prefix request whose actions come out NaN is
    INFERENCE_FAILED (no actions, frozen_rows 0, though its frozen rows were finite); a good
    prefix request after it is answered with its frozen rows."""
    from ros_helpers import running_relay

    from flowedge_relay.rtc import ChunkSplicer

    model = write_package(tmp_path, two_phase=False)
    with running_relay(model_path=model, nfe_loop=loop, workers=1, nfe_ns=0,
                       rtc_mode="inpaint") as h:
        for seq, obs in enumerate([NAN, GOOD]):
            _send(h, seq, obs)
            h.answer_for(seq)
            # the robot's chunk started half a period before each prefix request is built, so
            # its prefix holds the chunk's rows however long the answers before it took
            splicer = ChunkSplicer(2, PERIOD_NS)
            splicer.start(np.zeros((8, 2), np.float32),
                          h.client.get_clock().now().nanoseconds - PERIOD_NS // 2)
            h.send(_with_prefix(h, obs, splicer, 10 + seq))
            h.answer_for(10 + seq)
        answers = {a.sequence: a for a in h.wait_answers(4)}
        values = _counters(h, 4)
    _assert_failed(answers[0])
    _assert_good(answers[1])
    _assert_failed(answers[10])
    _assert_good(answers[11])
    assert answers[11].frozen_rows > 0
    assert values["failed.non_finite"] == "2"


def _with_prefix(h, obs, splicer, seq: int):
    """A request with the splicer's prefix (producer.build_request)."""
    import dataclasses

    from flowedge_relay.producer import build_request
    from flowedge_relay_tools.harness import served_model

    served = dataclasses.replace(served_model(h.model), rtc_mode="inpaint", rtc_max_delay=7)
    now = h.client.get_clock().now().nanoseconds
    return build_request(served, {"observation": obs},
                         session_id="arm", sequence=seq, remaining_nfe=3,
                         deadline_ns=now + 60_000_000_000, origin_ns=now,
                         prefix=splicer.prefix(now), action_period_ns=PERIOD_NS)


def test_observation_dims_of_the_test_graphs():
    """The graphs this module serves take the 4-D observations it sends (a guard on the fixture
    itself: a NaN row and a raising row, the rest finite)."""
    import onnxruntime as ort
    from failing_models import velocity_graph

    sess = ort.InferenceSession(velocity_graph().SerializeToString())
    x = np.ones((2, 8, 2), np.float32)
    t = np.full((2, 1), 0.5, np.float32)
    v = sess.run(None, {"x": x, "t": t, "observation": np.stack([GOOD, NAN])})[0]
    assert np.isfinite(v[0]).all() and np.isnan(v[1]).all()
    assert GOOD.size == OBS_DIM
    with pytest.raises(Exception, match="Gather"):
        sess.run(None, {"x": x, "t": t, "observation": np.stack([GOOD, RAISES])})


@pytest.mark.ros
@pytest.mark.parametrize("loop", ["python", "auto"])
def test_model_calls_that_keep_raising_take_the_worker_down_as_before(tmp_path, loop):
    """RUNTIME_ERRORS_IN_A_ROW raising calls with no step between: each request is answered
    INFERENCE_FAILED, then the worker exits as an unexpected exception always made it (workers
    ERROR, its lanes removed), so what follows is REJECTED_CAPACITY, never silence. One step that
    runs in between starts the count again."""
    from ros_helpers import running_relay, status_values, wait_for

    from flowedge_relay.workers import RUNTIME_ERRORS_IN_A_ROW

    model = write_single_file(tmp_path)
    plan = [RAISES] * (RUNTIME_ERRORS_IN_A_ROW - 1) + [GOOD] + [RAISES] * RUNTIME_ERRORS_IN_A_ROW
    with running_relay(model_path=model, nfe_loop=loop, workers=1, nfe_ns=0) as h:
        for seq, obs in enumerate(plan):
            _send(h, seq, obs)
            h.answer_for(seq)
        assert wait_for(lambda: status_values(h.latest_status("workers"))["dead_lanes"] == "0",
                        20)
        workers = h.latest_status("workers")
        _send(h, 99, GOOD)
        after = h.answer_for(99)
        answers = {a.sequence: a for a in h.wait_answers(len(plan) + 1)}
    for seq, obs in enumerate(plan):
        (_assert_good if obs is GOOD else _assert_failed)(answers[seq])
    assert workers.level == workers.ERROR
    assert after.code == after.REJECTED_CAPACITY
