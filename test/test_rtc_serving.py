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
from flowedge_relay.tooling import rtc_rollout as rr

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
