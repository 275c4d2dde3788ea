# SPDX-License-Identifier: Apache-2.0
"""Real-time chunking served over real DDS (docs/design.md §5.4): a producer's prefix comes back
as the answer's first frozen_rows rows bit for bit, the rest conditioned as the evaluation's
reference solver conditions it, chunk_start echoed; a plain request is served as before; a prefix
the served model does not take is discarded and counted, never answered."""

from __future__ import annotations

import numpy as np
import pytest

from flowedge_relay import policy as P
from flowedge_relay.producer import ServedModel, build_request
from flowedge_relay.rtc import ChunkSplicer
from flowedge_relay.timebase import stamp_ns
from flowedge_relay_tools import rtc_rollout as rr

PERIOD_NS = 20_000_000
NFE = 10


@pytest.fixture(scope="module")
def served() -> ServedModel:
    return ServedModel.from_policy(P.load(P.rtc_policy_path()))


def _request(h, served: ServedModel, seq: int, prefix=None, seed: int = 3,
             period_ns: int = PERIOD_NS):
    now = h.client.get_clock().now().nanoseconds
    obs = np.random.default_rng(seq).standard_normal(6).astype(np.float32)
    req = build_request(served, {"observation": obs}, session_id="arm", sequence=seq,
                        remaining_nfe=NFE, deadline_ns=now + 10_000_000_000, noise_seed=seed,
                        origin_ns=now, prefix=prefix, action_period_ns=period_ns)
    return req, obs


@pytest.mark.ros
def test_frozen_rows_are_the_prefix_and_the_rest_is_the_reference_solver(served):
    """Admission off: d is the window's end, min(rows, max_delay) = 4, whatever the timing, so
    the whole answer is checked bit for bit against rtc_rollout's solver (one row: batch 1)."""
    from ros_helpers import running_relay, status_values

    reference = rr.RtcSampler(rr.load_rtc_policy().session)
    with running_relay(model_path=P.rtc_policy_path(), nfe_ns=0) as h:
        model = status_values(h.latest_status("model"))
        assert (model["rtc_mode"], model["rtc_max_delay"]) == ("training_time", "4")
        assert status_values(h.latest_status("workers"))["nfe_loop"] == "native"  # C serves
        splicer = ChunkSplicer(2, PERIOD_NS)
        now = h.client.get_clock().now().nanoseconds
        old = np.random.default_rng(0).standard_normal((8, 2)).astype(np.float32)
        splicer.start(old, now - 3 * PERIOD_NS // 2)  # row 1 executing: rows 2..7 to come
        prefix = splicer.prefix(now)
        req, obs = _request(h, served, 1, prefix)
        plain, plain_obs = _request(h, served, 2)
        h.send(req, plain)
        answer, plain_answer = h.answer_for(1), h.answer_for(2)
    got = np.asarray(answer.actions, np.float32)
    rows = prefix[0].reshape(-1)
    assert answer.code == answer.INFERENCE and answer.frozen_rows == 4
    assert stamp_ns(answer.chunk_start) == prefix[1] == splicer.start_ns + 2 * PERIOD_NS
    assert got[:8].tobytes() == rows[:8].tobytes()
    want = reference.sample(obs[None], np.array([3]), NFE, "training_time", [rows], 4)[0]
    assert got.tobytes() == want.tobytes()
    splicer.splice(got, answer.frozen_rows, stamp_ns(answer.chunk_start))
    assert splicer.chunk[:4].tobytes() == old[2:6].tobytes()  # the robot's rows, unchanged
    assert plain_answer.frozen_rows == 0 and stamp_ns(plain_answer.chunk_start) == 0
    plain_want = reference.sample(plain_obs[None], np.array([3]), NFE)[0]
    assert np.asarray(plain_answer.actions, np.float32).tobytes() == plain_want.tobytes()


@pytest.mark.ros
def test_with_admission_d_counts_the_rows_due_before_the_finish_bound(served):
    """Admission on, one action per second: the prefix started 1.5 s before it was sent, so at
    dispatch the finish bound (10 NFE x 1 ms + a 5 ms reserve after it) lies in row 1 or, if the
    relay took the request a second late, row 2: d is 2 or 3 (ceil), however the host runs."""
    from ros_helpers import running_relay

    second = 1_000_000_000
    with running_relay(model_path=P.rtc_policy_path(), nfe_ns=1_000_000,
                       admission_reserve_ns=5_000_000) as h:
        now = h.client.get_clock().now().nanoseconds
        rows = np.random.default_rng(1).standard_normal(16).astype(np.float32)
        req, _ = _request(h, served, 1, (rows, now - 3 * second // 2), period_ns=second)
        h.send(req)
        answer = h.answer_for(1)
    assert answer.code == answer.INFERENCE and answer.frozen_rows in (2, 3)
    d = answer.frozen_rows
    assert np.asarray(answer.actions, np.float32)[: 2 * d].tobytes() == rows[: 2 * d].tobytes()


@pytest.mark.ros
def test_a_prefix_is_discarded_and_counted_where_rtc_is_off(served):
    from ros_helpers import running_relay, status_values, wait_for

    with running_relay(model_path=P.rtc_policy_path(), rtc_mode="off") as h:
        now = h.client.get_clock().now().nanoseconds
        req, _ = _request(h, served, 1, (np.zeros(4, np.float32), now))
        plain, _ = _request(h, served, 2)
        h.send(req, plain)
        assert h.answer_for(2).frozen_rows == 0  # sent after: the prefix one was taken by then
        counted = {}

        def discarded() -> bool:
            counted.update(status_values(h.latest_status("admission")))
            return counted.get("invalid.prefix_unsupported") == "1"

        assert wait_for(discarded, 10), counted
        assert [a.sequence for a in h.answers()] == [2]


@pytest.mark.ros
@pytest.mark.parametrize("intake_loop", ["auto", "python"])
def test_inpaint_serves_the_default_single_file_model(intake_loop):
    """rtc_mode inpaint on the bundled policy_small.onnx (a single-file Euler flow policy, no
    rtc: block): served with max_delay horizon - 1, the prefix taken by either intake, the answer
    the reference solver's bit for bit (admission off: d = min(rows, max_delay))."""
    import dataclasses

    from ros_helpers import running_relay, status_values

    from flowedge_relay.model import default_model_path

    small = P.load(default_model_path())
    reference = rr.RtcSampler(P.make_session(small.graphs["velocity"].data, 1))
    served = dataclasses.replace(ServedModel.from_policy(small), rtc_mode="inpaint",
                                 rtc_max_delay=7)
    with running_relay(rtc_mode="inpaint", nfe_ns=0, intake_loop=intake_loop) as h:
        model = status_values(h.latest_status("model"))
        assert (model["rtc_mode"], model["rtc_max_delay"]) == ("inpaint", "7")
        loops = status_values(h.latest_status("workers"))
        assert (loops["nfe_loop"], loops["intake_loop"]) == (
            "native", "native" if intake_loop == "auto" else "python"), loops
        now = h.client.get_clock().now().nanoseconds
        rows = np.random.default_rng(4).standard_normal(12).astype(np.float32)  # 6 rows
        obs = np.random.default_rng(5).standard_normal(4).astype(np.float32)
        sent = [build_request(served, {"observation": obs}, session_id="arm", sequence=seq,
                              remaining_nfe=NFE, deadline_ns=now + 10_000_000_000,
                              noise_seed=3, origin_ns=now, prefix=prefix,
                              action_period_ns=PERIOD_NS)
                for seq, prefix in ((1, (rows, now + PERIOD_NS)), (2, None))]  # fmt: skip
        h.send(*sent)
        answer, plain = h.answer_for(1), h.answer_for(2)
    got = np.asarray(answer.actions, np.float32)
    assert answer.code == answer.INFERENCE and answer.frozen_rows == 6
    assert stamp_ns(answer.chunk_start) == now + PERIOD_NS
    assert got[:12].tobytes() == rows.tobytes()
    want = reference.sample(obs[None], np.array([3]), NFE, "inpaint", [rows], 6)[0]
    assert got.tobytes() == want.tobytes()
    assert plain.code == plain.INFERENCE and plain.frozen_rows == 0
    plain_want = reference.sample(obs[None], np.array([3]), NFE)[0]
    assert np.asarray(plain.actions, np.float32).tobytes() == plain_want.tobytes()


@pytest.mark.ros
def test_a_mode_that_cannot_be_served_says_what_to_change():
    """inpaint on the single file with the midpoint solver (the conditioning follows Euler's
    states): the model's ERROR names the parameter to set, never a silent off."""
    from diagnostic_msgs.msg import DiagnosticStatus
    from ros_helpers import running_relay

    with running_relay(rtc_mode="inpaint", solver="midpoint") as h:
        status = h.latest_status("model")
    assert status.level == DiagnosticStatus.ERROR
    assert "set the solver parameter to euler" in status.message, status.message
