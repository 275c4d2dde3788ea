"""Issue 8: hostile input, faults and bursts lose nothing and crash nothing (over real DDS).

Each test starts a real RelayNode and client (harness.running_relay) and runs one scenario from
flowedge_relay/stress.py, the same code `python -m flowedge_relay.stress` runs for the figures.
No test asserts on a duration: waits are generous upper bounds, the checks are on counts.
"""

from __future__ import annotations

import time

import pytest
from builtin_interfaces.msg import Time
from diagnostic_msgs.msg import DiagnosticStatus
from flowedge_relay_msgs.msg import ActionMessage
from rclpy.serialization import serialize_message
from ros_helpers import running_relay, status_values, wait_for

from flowedge_relay import stress, validation

A = ActionMessage
OK, WARN, ERROR = (stress.level(DiagnosticStatus(level=lv)) for lv in (
    DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR))


def _alive(h) -> bool:
    return all(stress.relay_threads_alive(h.relay).values())


# ---- hostile input ---------------------------------------------------------------------------


def test_malformed_campaign_answers_valid_once_and_counts_invalid_per_reason():
    """Generated hostile input (typed and raw CDR) interleaved with valid traffic."""
    with running_relay() as h:
        fig = stress.run_malformed(h, messages=700, seed=8, warmup=100)
    assert stress.malformed_ok(fig) == []
    assert fig["crashes"] == 0 and fig["hangs"] == 0
    assert fig["valid_requests"] > 200 and fig["valid_unanswered"] == 0
    assert fig["diagnostics_invalid_discarded"] == sum(fig["invalid_counted_by_reason"].values())
    assert fig["diagnostics_by_reason"] == fig["invalid_counted_by_reason"]
    assert len(fig["invalid_counted_by_reason"]) >= 8  # most reasons exercised
    assert fig["undeliverable_raw"] > 0  # truncated / lying CDR reached DDS and was dropped


def test_regression_fields_that_killed_the_request_thread():
    """REGRESSION (found by the campaign): retry_reason > 5 made the core raise FER_EINVAL, and a
    deadline with sec < 0 made CFFI raise OverflowError, inside the subscription callback: the
    request executor thread died and the relay never admitted anything again."""
    with running_relay() as h:
        h.send(h.request(session_id="a", sequence=1, retry_reason=200, retry_count=1))
        h.send(h.request(session_id="a", sequence=2, deadline=Time(sec=-5, nanosec=0)))
        h.send(h.request(session_id="a", sequence=3, origin_stamp=Time(sec=-2**31, nanosec=0)))
        h.send(h.request(session_id="a", sequence=4, deadline=Time(sec=1, nanosec=2**32 - 1)))
        h.send(h.request(session_id="a", sequence=5))
        marker = h.answer_for(5)
        values = status_values(h.latest_status("admission"))
        time.sleep(0.3)
        answered = {a.sequence for a in h.answers()}
        assert _alive(h)
    assert marker is not None and marker.code == A.INFERENCE and answered == {5}
    assert values["invalid.retry_reason_unknown"] == "1"
    assert values["invalid.time_invalid"] == "3"
    assert values["invalid.core_refused"] == "0"


def test_a_request_the_core_refuses_is_counted_and_the_thread_survives(monkeypatch):
    """Defense in depth: should validation ever miss a case, the node counts core_refused and
    keeps going (simulated by widening the retry_reason check past what the core accepts)."""
    monkeypatch.setattr(validation, "RETRY_REASON_MAX", 255)
    with running_relay() as h:
        h.send(h.request(session_id="a", sequence=1, retry_reason=77, retry_count=1))
        h.send(h.request(session_id="a", sequence=2))
        marker = h.answer_for(2)
        refused = h.relay.validator.discarded[validation.Reason.CORE_REFUSED]
        assert _alive(h)
    assert marker is not None and refused == 1


def test_raw_cdr_invalid_utf8_truncated_and_lying_lengths_do_not_hurt_the_relay():
    with running_relay() as h:
        good = serialize_message(h.request(session_id="abc", sequence=1))
        at = good.find(b"abc")
        bad_utf8 = good[:at] + b"\xff\xfe\xed" + good[at + 3:]
        huge_len = good[:at - 4] + b"\xff\xff\xff\x7f" + good[at:]
        for payload in (b"", good[:3], good[: len(good) // 2], good[:-1], huge_len, bad_utf8,
                        b"\x00\x01\x00\x00" + b"\xff" * 300):
            h.pub.publish(payload)
        h.send(h.request(session_id="ok", sequence=2))
        assert h.answer_for(2) is not None
        replaced = h.answer_for(1)  # invalid UTF-8 arrives replaced (U+FFFD), still answered once
        time.sleep(0.3)
        assert _alive(h)
        keys = [(a.session_id, a.sequence) for a in h.answers()]
    assert replaced is not None and replaced.session_id == "\ufffd" * 3
    assert sorted(keys, key=repr) == sorted([("\ufffd" * 3, 1), ("ok", 2)], key=repr)


# ---- faults ----------------------------------------------------------------------------------


def test_consumer_stops_draining_admission_keeps_deciding_and_drops_are_counted():
    with running_relay(output_ring_capacity=16, action_output_wait_ms=5) as h:
        fig = stress.fault_consumer_stops(h, n=400)
        output = h.latest_status("output")
    assert fig["all_submitted"] and fig["workers_went_idle"]  # nothing blocked on the full rings
    assert fig["answers_while_paused"] == 0
    assert fig["rejection_outputs_dropped"] > 0 and fig["action_outputs_dropped"] > 0
    assert fig["accounting_closes"] and fig["duplicate_answers"] == 0  # answered or counted
    assert fig["rings_drained_after_resume"] and fig["answered_after_resume"]
    assert stress.level(output) == WARN
    assert all(fig["threads_alive"].values())


def test_slow_worker_calibration_misses_are_counted_with_warn():
    with running_relay(nfe_ns=2_000_000, fault_nfe_delay_ms=40.0) as h:
        fig = stress.fault_slow_worker(h)
    assert fig["unanswered"] == fig["duplicates"] == fig["unexpected"] == 0
    assert fig["calibration_misses"] >= 1 and fig["diag_calibration_misses"] >= 1
    assert fig["admission_level"] == WARN and "calibration" in fig["admission_message"]
    assert fig["workers_level"] == WARN


def test_worker_thread_dies_lane_leaves_admission_in_flight_gets_an_outcome():
    with running_relay(workers=2, fault_nfe_delay_ms=20.0) as h:
        fig = stress.fault_worker_dies(h)
    assert fig["lanes_alive_before"] == 2 and fig["lanes_alive_after"] == 1
    assert fig["in_flight_code"] == A.EXPIRED
    assert fig["workers_level"] == ERROR and "died" in fig["workers_message"]
    assert fig["later_codes"] == [A.INFERENCE] * 4  # the other lane goes on
    assert fig["unanswered"] == fig["duplicates"] == fig["unexpected"] == 0
    alive = fig["threads_alive"]
    assert alive["request"] and alive["publisher"] and sum(alive.values()) == len(alive) - 1


def test_regression_all_workers_dead_still_answers_every_valid_request():
    """Regression: with every lane dead, valid requests used to sit in the queue unanswered."""
    with running_relay(workers=1) as h:
        h.relay.pool.inject_worker_crash(0)
        assert wait_for(lambda: h.relay.core.stats().lanes_alive == 0, 10)
        h.send(h.request(session_id="a", sequence=1))
        h.send(h.request(session_id="a", sequence=2, deadline_ms=300))
        first, second = h.answer_for(1, timeout=3), h.answer_for(2, timeout=3)
    assert first is not None and second is not None


@pytest.mark.parametrize("kind", ["missing", "corrupt", "truncated"])
def test_missing_or_corrupt_model_is_error_and_requests_discarded_node_stays_up(tmp_path, kind):
    from flowedge_relay.model import default_model_path

    path = tmp_path / "model.onnx"
    if kind == "corrupt":
        path.write_bytes(b"\x08\x07 not an onnx protobuf " * 64)
    elif kind == "truncated":
        data = open(default_model_path(), "rb").read()
        path.write_bytes(data[: len(data) // 3])
    with running_relay(model_path=str(path)) as h:
        fig = stress.fault_bad_model(h)
    assert fig["model_level"] == ERROR and "model.onnx" in fig["model_message"]
    assert fig["answers"] == 0 and fig["discarded_model_unavailable"] >= 5
    assert fig["diagnostics_still_published"] and fig["request_thread_alive"]


def test_burst_of_ten_times_capacity_is_answered_exactly_once():
    """10 x (queue_capacity + workers) valid requests in one burst, with invalid ones mixed
    in: identified by (session_id, sequence), none unanswered, none answered twice."""
    # 2 ms per NFE (injected) so the burst really outruns the worker
    with running_relay(queue_capacity=32, nfe_ns=5_000_000, fault_nfe_delay_ms=2.0) as h:
        fig = stress.fault_burst(h, factor=10)
    assert fig["burst"] == 330
    assert fig["unanswered"] == 0 and fig["duplicates"] == 0 and fig["unexpected"] == 0
    assert fig["dropped"] == 0
    assert A.INFERENCE in fig["codes"] and A.REJECTED_CAPACITY in fig["codes"]
    assert fig["invalid_discarded"] == 33


def test_sessions_far_beyond_max_sessions_stay_bounded_and_answered():
    with running_relay(max_sessions=16) as h:
        fig = stress.fault_many_sessions(h, sessions=200)
    assert fig["unanswered"] == fig["duplicates"] == fig["unexpected"] == 0
    assert fig["sessions_gauge"] <= 16 and fig["sessions_evicted"] > 0


# ---- soak ------------------------------------------------------------------------------------


def test_short_soak_at_80_percent_of_capacity_accounting_closes():
    from flowedge_relay.model import default_model_path

    with running_relay(model_path=default_model_path()) as h:
        fig = stress.run_soak(h, duration_s=6.0, load=0.8, sample_s=0.5)
    assert stress.soak_ok(fig) == []
    assert fig["valid_sent"] > 50 and fig["coalesced"] + fig["answered"] == fig["valid_sent"]
    assert fig["invalid_discarded"] == fig["invalid_sent"]
    assert len(fig["samples"]) >= 8
