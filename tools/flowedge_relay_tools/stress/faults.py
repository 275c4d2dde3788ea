# SPDX-License-Identifier: Apache-2.0
"""The fault drills, with figures: what the relay does when its surroundings fail.

The output consumer stops draining, NFEs run far slower than calibrated, a worker dies mid
request, the model is missing or corrupt, a burst of ten times what the relay holds, far more
sessions than max_sessions. Each drill runs on a fresh relay (`run_faults`); the tests assert
the same functions (test/test_robustness.py).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from flowedge_relay_tools.stress.flood import pace
from flowedge_relay_tools.stress.report import param, received, relay_threads_alive


def fault_consumer_stops(h, n: int = 400) -> dict:
    """The output consumer stops draining: admission keeps deciding at full speed, full rings
    drop and count, nothing blocks; once it drains again, answers flow again."""
    from flowedge_relay_tools.harness import wait_for

    node = h.node
    st0 = node.relay.core.stats()
    node.relay.fault_pause_output.set()
    time.sleep(0.05)
    t0 = time.monotonic()
    for start in range(0, n, 100):
        h.send(*[h.request(session_id=f"c{i % 4}", sequence=i, remaining_nfe=1,
                           deadline_ms=-1 if i % 2 else None) for i in range(start, start + 100)])
        pace(node, received(node) + 0, backlog=10_000)
    submitted = wait_for(lambda: node.relay.core.stats().submitted - st0.submitted >= n, 30.0)
    admit_s = time.monotonic() - t0
    idle = wait_for(lambda: node.relay.core.stats().queue_depth == 0
                    and node.relay.core.stats().lanes_busy == 0, 30.0)
    st = node.relay.core.stats()
    answers_while_paused = len(h.answers())
    node.relay.fault_pause_output.clear()
    rej_drop = st.rejection_outputs_dropped - st0.rejection_outputs_dropped
    act_drop = st.action_outputs_dropped - st0.action_outputs_dropped
    # the rings drain first (everything not dropped is answered), then new work flows again
    drained = wait_for(lambda: len(h.answers()) >= n - rej_drop - act_drop, 30.0)
    h.send(h.request(session_id="after", sequence=10**6))
    after = h.answer_for(10**6, timeout=30)
    st_after = node.relay.core.stats()
    time.sleep(0.3)
    keys = Counter((a.session_id, a.sequence) for a in h.answers())
    return {
        "requests": n,
        "all_submitted": submitted,
        "seconds_to_submit_all": round(admit_s, 3),
        "workers_went_idle": idle,
        "answers_while_paused": answers_while_paused,
        "rejection_outputs_dropped": rej_drop,
        "action_outputs_dropped": act_drop,
        "answers_after_resume": len(h.answers()),
        "rings_drained_after_resume": drained,
        "duplicate_answers": sum(1 for c in keys.values() if c > 1),
        "answered_after_resume": after is not None,
        "accounting_closes": len(h.answers()) - 1 + rej_drop + act_drop == n,
        "relay_received": received(node),
        "submitted_after_resume": st_after.submitted - st0.submitted,
        "outcomes_after_resume": [a - b for a, b in zip(st_after.outcomes, st0.outcomes,
                                                        strict=True)],
        "threads_alive": relay_threads_alive(node),
    }


def level(status) -> int:
    """DiagnosticStatus.level as an int (rclpy maps the `byte` type to bytes)."""
    lv = status.level
    return lv[0] if isinstance(lv, bytes) else int(lv)


def exactly_once(answers, sent_keys) -> dict:
    """Answers identified by (session_id, sequence) against the keys of the valid requests."""
    got = Counter((a.session_id, a.sequence) for a in answers)
    sent = Counter(sent_keys)
    return {
        "valid": sum(sent.values()),
        "unanswered": sum(1 for k in sent if got[k] == 0),
        "duplicates": sum(1 for k, c in got.items() if c > sent.get(k, 0) and k in sent),
        "unexpected": sum(c for k, c in got.items() if k not in sent),
    }


def fault_slow_worker(h) -> dict:
    """NFEs much slower than the calibrated nfe_ns: admitted work misses, counted, WARN. The
    deadlines (500 ms) leave room for a slow delivery on a loaded host, and the six requests'
    720 ms of real work (3 NFE x 40 ms each, one worker) outlast them however late they
    arrive: admission (2 ms per NFE) takes them, and at least the last misses."""
    from flowedge_relay_tools.harness import status_values

    keys = []
    for i in range(6):
        h.send(h.request(session_id=f"slow{i}", sequence=i, remaining_nfe=3, deadline_ms=500))
        keys.append((f"slow{i}", i))
    h.wait_answers(len(keys), timeout=30)
    admission, workers = h.latest_status("admission"), h.latest_status("workers")
    time.sleep(0.3)
    st = h.node.relay.core.stats()
    return {
        **exactly_once(h.answers(), keys),
        "calibration_misses": st.calibration_misses,
        "expired": st.outcomes[4],
        "admission_level": level(admission),
        "admission_message": admission.message,
        "workers_level": level(workers),
        "workers_message": workers.message,
        "diag_calibration_misses": int(status_values(admission)["calibration_misses"]),
    }


def fault_worker_dies(h) -> dict:
    """Kill the worker holding a long request: its lane leaves admission, the in-flight
    request gets an outcome, ERROR diagnostics, the other lane keeps serving."""
    from flowedge_relay_tools.harness import wait_for

    node = h.node
    h.send(h.request(session_id="long", sequence=1, remaining_nfe=40))
    wait_for(lambda: any(lane.busy for lane in node.relay.core.lanes_snapshot()), 10)
    lane = next(x.lane for x in node.relay.core.lanes_snapshot() if x.busy)
    alive_before = node.relay.core.stats().lanes_alive
    node.relay.inject_worker_crash(lane)
    in_flight = h.answer_for(1, timeout=10)
    wait_for(lambda: node.relay.core.stats().lanes_alive == alive_before - 1, 10)
    workers = h.latest_status("workers")
    for i in range(2, 6):
        h.send(h.request(session_id="after", sequence=i, remaining_nfe=2))
    later = [h.answer_for(i, timeout=20) for i in range(2, 6)]
    time.sleep(0.2)
    return {
        **exactly_once(h.answers(), [("long", 1)] + [("after", i) for i in range(2, 6)]),
        "crashed_lane": lane,
        "lanes_alive_before": alive_before,
        "lanes_alive_after": node.relay.core.stats().lanes_alive,
        "in_flight_code": None if in_flight is None else in_flight.code,
        "in_flight_nfe_done": None if in_flight is None else in_flight.nfe_done,
        "workers_level": level(workers),
        "workers_message": workers.message,
        "later_codes": [None if a is None else a.code for a in later],
        "threads_alive": relay_threads_alive(node),
    }


def fault_bad_model(h) -> dict:
    """Missing or corrupt model at start: ERROR, valid requests discarded, node stays up."""
    from flowedge_relay_tools.harness import status_values

    for i in range(5):
        h.send(h.request(session_id="m", sequence=i))
    model = h.latest_status("model")
    admission = status_values(h.latest_status("admission"))
    time.sleep(0.3)
    h.send(h.request(session_id="m", sequence=99))
    again = h.latest_status("model")  # still publishing diagnostics after more input
    time.sleep(0.3)
    return {
        "model_level": level(model),
        "model_message": model.message,
        "answers": len(h.answers()),
        "discarded_model_unavailable": int(admission["invalid.model_unavailable"]),
        "diagnostics_still_published": again is not None,
        "request_thread_alive": relay_threads_alive(h.node)["request"],
    }


def fault_burst(h, factor: int = 10, sessions: int = 8) -> dict:
    """A burst of `factor` x what the relay can hold (queue_capacity + workers), sent at once,
    mixed with duplicate retries and invalid input: exactly one answer per valid request."""
    node = h.node
    capacity = param(node, "queue_capacity") + param(node, "workers")
    n = factor * capacity
    keys, batch = [], []
    for i in range(n):
        sid = f"burst{i % sessions}"
        req = h.request(session_id=sid, sequence=i, remaining_nfe=1 + i % 4,
                        deadline_ms=None if i % 3 else 2_000 + i)
        batch.append(req)
        keys.append((sid, i))
        if i % 10 == 0:  # an invalid one: no answer, counted
            batch.append(h.request(session_id=sid, sequence=10**9 + i, remaining_nfe=0))
    st0 = node.relay.core.stats()
    t0 = time.monotonic()
    h.send(*batch)
    h.wait_answers(n, timeout=60)
    time.sleep(0.5)
    st = node.relay.core.stats()
    codes = Counter(a.code for a in h.answers())
    return {
        "burst": n,
        "capacity": capacity,
        "seconds": round(time.monotonic() - t0, 2),
        **exactly_once(h.answers(), keys),
        "codes": dict(sorted(codes.items())),
        "dropped": st.rejection_outputs_dropped + st.action_outputs_dropped
        - st0.rejection_outputs_dropped - st0.action_outputs_dropped,
        "invalid_discarded": sum(node.relay.counters().discarded.values()),
    }


def fault_many_sessions(h, sessions: int = 200) -> dict:
    """Far more producer sessions than max_sessions: the table stays bounded, idle sessions are
    evicted, every request is still answered exactly once. Each batch (fewer sessions than the
    table holds) is answered before the next goes out, so its sessions are idle when the next
    ones need their places: evictions happen by construction, however fast the relay takes
    requests."""
    keys = []
    batch_size = max(1, param(h.node, "max_sessions") // 2)
    for start in range(0, sessions, batch_size):
        batch = []
        for i in range(start, min(start + batch_size, sessions)):
            batch.append(h.request(session_id=f"sess{i}", sequence=i, remaining_nfe=1))
            keys.append((f"sess{i}", i))
        h.send(*batch)
        h.wait_answers(len(keys), timeout=30)
    h.wait_answers(sessions, timeout=60)
    time.sleep(0.3)
    st = h.node.relay.core.stats()
    return {
        **exactly_once(h.answers(), keys),
        "max_sessions": param(h.node, "max_sessions"),
        "sessions_gauge": st.sessions,
        "sessions_evicted": st.sessions_evicted,
        "codes": dict(sorted(Counter(a.code for a in h.answers()).items())),
    }


def run_faults(workers: int = 2, progress=None) -> dict:
    """Every fault drill once, with its figures (the tests assert the same functions)."""
    import tempfile

    from flowedge_relay_tools.harness import running_relay

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        corrupt = Path(tmp) / "corrupt.onnx"
        corrupt.write_bytes(b"\x08\x07garbage" * 100)
        drills = [
            ("consumer_stops_draining", fault_consumer_stops,
             dict(output_ring_capacity=16, action_output_wait_ms=5)),
            ("slow_worker", fault_slow_worker,
             dict(nfe_ns=2_000_000, fault_nfe_delay_ms=40.0)),
            ("worker_dies", fault_worker_dies, dict(workers=workers, fault_nfe_delay_ms=20.0)),
            ("model_missing", fault_bad_model, dict(model_path=str(Path(tmp) / "nope.onnx"))),
            ("model_corrupt", fault_bad_model, dict(model_path=str(corrupt))),
            ("burst_10x", fault_burst,
             dict(queue_capacity=32, nfe_ns=5_000_000, fault_nfe_delay_ms=2.0)),
            ("sessions_beyond_max", fault_many_sessions, dict(max_sessions=16)),
        ]
        for name, drill, params in drills:
            t0 = time.monotonic()
            with running_relay(drill=True, **params) as h:
                out[name] = drill(h)
            out[name]["params"] = params
            if progress:
                progress(f"faults: {name} done in {time.monotonic() - t0:.1f} s")
    return out
