# SPDX-License-Identifier: Apache-2.0
"""Request checks: each discard reason, counted; valid input passes with its observation."""

import math

import numpy as np
import pytest
from flowedge_relay_msgs.msg import InferenceRequest
from relay_helpers import plain_relay

from flowedge_relay.validation import (
    SESSION_ID_MAX_BYTES,
    ModelContract,
    Reason,
    Validator,
)

MODEL = ModelContract("sha256:" + "a" * 64, observation_dim=4, action_dim=2, action_horizon=8)


def valid(**fields) -> InferenceRequest:
    msg = InferenceRequest(
        session_id="robot-1", sequence=1, generation=1, remaining_nfe=8,
        model_digest=MODEL.digest, observation_dim=4, action_dim=2, action_horizon=8,
        observation=[0.1, 0.2, 0.3, 0.4],
    )
    for key, value in fields.items():
        setattr(msg, key, value)
    return msg


def test_valid_request_passes_and_returns_float32_observation():
    v = Validator(MODEL, max_nfe=64)
    reason, sid, obs = v.check(valid())
    assert reason is None and sid == b"robot-1"
    assert obs.dtype == np.float32 and obs.tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert v.total_discarded() == 0


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"session_id": ""}, Reason.SESSION_ID_EMPTY),
        ({"session_id": "x" * (SESSION_ID_MAX_BYTES + 1)}, Reason.SESSION_ID_TOO_LONG),
        ({"session_id": "é" * (SESSION_ID_MAX_BYTES // 2 + 1)}, Reason.SESSION_ID_TOO_LONG),
        ({"session_id": "x" * 10_000_000}, Reason.SESSION_ID_TOO_LONG),
        ({"model_digest": "sha256:" + "b" * 64}, Reason.DIGEST_MISMATCH),
        ({"model_digest": "z" * 100_000}, Reason.DIGEST_MISMATCH),
        ({"observation_dim": 5}, Reason.DIMS_MISMATCH),
        ({"action_dim": 3}, Reason.DIMS_MISMATCH),
        ({"action_horizon": 2**32 - 1}, Reason.DIMS_MISMATCH),
        ({"remaining_nfe": 0}, Reason.NFE_ZERO),
        ({"remaining_nfe": 65}, Reason.NFE_ABOVE_MAX),
        ({"remaining_nfe": 2**32 - 1}, Reason.NFE_ABOVE_MAX),
        ({"observation": [0.0, 1.0, 2.0]}, Reason.OBSERVATION_LENGTH),
        ({"observation": [0.0] * 100_000}, Reason.OBSERVATION_LENGTH),
        ({"observation": [0.0, math.nan, 0.0, 0.0]}, Reason.OBSERVATION_NOT_FINITE),
        ({"observation": [0.0, 0.0, -math.inf, 0.0]}, Reason.OBSERVATION_NOT_FINITE),
    ],
)
def test_each_invalid_input_is_discarded_and_counted(fields, reason):
    v = Validator(MODEL, max_nfe=64)
    got, _, obs = v.check(valid(**fields))
    assert got is reason and obs is None
    assert v.discarded[reason] == 1 and v.total_discarded() == 1


def test_no_model_discards_everything_as_model_unavailable():
    v = Validator(None, max_nfe=64)
    assert v.check(valid())[0] is Reason.MODEL_UNAVAILABLE
    assert v.discarded[Reason.MODEL_UNAVAILABLE] == 1


def test_counters_have_a_fixed_key_set():
    """Hostile input cannot grow the counters: the keys are the Reason enum, nothing else."""
    v = Validator(MODEL, max_nfe=64)
    for i in range(200):
        v.check(valid(session_id="", model_digest=f"garbage-{i}"))
    assert set(v.discarded) == set(Reason)


def test_a_flood_of_invalid_requests_is_counted_per_message_and_logged_once_per_period():
    """Each discard is one counter (per reason) and one integer compare; the log line
    comes at most once per DISCARD_LOG_PERIOD_NS, with how many it stood for. (rclpy's own
    throttle walked the stack on every call: a discard cost more than a decision.) The rclpy
    intake's path (Relay.on_request), on a relay without DDS."""
    with plain_relay(workers=1) as (relay, _sink):
        assert relay.configure() is None
        m = relay.serving.model
        bad = InferenceRequest(session_id="x", sequence=1, generation=1, remaining_nfe=0,
                               model_digest=m.digest, observation_dim=m.obs_dim,
                               action_dim=m.action_dim, action_horizon=m.action_horizon,
                               observation=[0.1] * m.obs_dim)
        long_id = InferenceRequest(session_id="\u00e9" * 300)
        for _ in range(500):
            relay.on_request(bad)
            relay.on_request(long_id)
        discarded = dict(relay.serving.validator.discarded)
        suppressed = relay.discarded_suppressed
        received, accepted = relay.counters().received, relay.stats().accepted
    assert discarded[Reason.NFE_ZERO] == 500 and discarded[Reason.SESSION_ID_TOO_LONG] == 500
    assert received == 1000 and accepted == 0
    assert suppressed == 999  # one line logged (the first); the other 999 waited for the next
