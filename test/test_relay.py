# SPDX-License-Identifier: Apache-2.0
"""The relay without ROS (flowedge_relay/relay.py): configure, counters, the snapshot, a model
swap and cleanup, driven directly on the real C core, the real ONNX models and the real worker
and publisher threads; no DDS. The lifecycle node over it is tested in test_lifecycle.py and
test_swap.py, over DDS."""

from __future__ import annotations

import time

from relay_helpers import plain_relay

from flowedge_relay.core import Code
from flowedge_relay.model import default_model_path, load_model
from flowedge_relay_tools.harness import build_request
from flowedge_relay_tools.models import bench_model_path
from flowedge_relay_tools.waiting import wait_for

SMALL, BENCH = load_model(default_model_path()), load_model(bench_model_path())
MISSING = "/nonexistent/policy.onnx"
ANSWER_WAIT_S = 60.0  # a loaded host; each wait ends as soon as the answers are there


def _send(relay, model, first: int, count: int) -> None:
    """`count` valid requests for `model`, each its own session, through the Python intake."""
    for i in range(first, first + count):
        relay.on_request(build_request(model, time.time_ns(), session_id=f"s{i}"))


def _answers(sink, count: int) -> list:
    assert wait_for(lambda: len(sink.got()) >= count, ANSWER_WAIT_S), sink.got()
    return sink.got()


def test_unconfigured_it_serves_nothing_and_counts_what_arrives():
    with plain_relay() as (relay, sink):
        _send(relay, SMALL, 0, 3)
        counters, snap = relay.counters(), relay.snapshot("test", (1, "unconfigured"))
        assert counters.received == 3 and counters.discarded["model_unavailable"] == 3
        assert not snap.model_ok and snap.lifecycle_label == "unconfigured"
        assert snap.core.accepted == 0 and sink.got() == []


def test_configured_it_answers_and_the_snapshot_and_counters_say_so():
    with plain_relay(workers=1) as (relay, sink):
        assert relay.configure() is None
        relay.set_accepting(True)
        _send(relay, SMALL, 0, 5)
        answers = _answers(sink, 5)
        assert [a.code for a in answers] == [Code.INFERENCE] * 5
        assert {a.model_digest for a in answers} == {SMALL.digest}
        snap = relay.snapshot("test", (3, "active"))
        assert snap.model_ok and snap.model_digest == SMALL.digest and snap.received == 5
        assert snap.core.accepted == 5 and snap.lifecycle_id == 3 and snap.workers == 1
        assert relay.counters().discarded["model_unavailable"] == 0
        assert relay.threads_alive() == {"publisher": True, "worker0": True}


def test_a_failed_configure_stays_unconfigured_naming_why(tmp_path):
    missing = str(tmp_path / "missing.onnx")
    with plain_relay(model_path=missing) as (relay, _sink):
        problem = relay.configure()
        assert problem and "missing.onnx" in problem
        snap = relay.snapshot()
        assert not snap.model_ok and snap.model_error == problem


def test_a_swap_switches_at_once_and_keeps_the_old_models_counts():
    """The new model answers from the switch on; an old-digest arrival after it is counted as
    model_digest_mismatch; the totals since start keep what the retired model counted."""
    with plain_relay(workers=1) as (relay, sink):
        assert relay.configure() is None
        relay.set_accepting(True)
        _send(relay, SMALL, 0, 4)
        _answers(sink, 4)
        refused = relay.prepare_swap(MISSING, {})  # the old model keeps serving
        assert refused.startswith(f"model_path {MISSING!r} cannot be served")
        assert relay.prepare_swap(bench_model_path(), {"nfe_ns": 0}) is None
        assert relay.apply({"model_path": bench_model_path()}, active=True)
        _send(relay, SMALL, 4, 1)  # the old digest, after the switch
        _send(relay, BENCH, 5, 3)
        answers = _answers(sink, 7)
        assert [a.model_digest for a in answers] == [SMALL.digest] * 4 + [BENCH.digest] * 3
        assert wait_for(lambda: not relay.swap_draining, ANSWER_WAIT_S)  # the old one retired
        counters, stats = relay.counters(), relay.stats()
        assert counters.received == 8 and counters.discarded["model_digest_mismatch"] == 1
        assert stats.accepted == 7 and relay.snapshot().model_digest == BENCH.digest


def test_cleanup_releases_the_model_and_keeps_the_totals():
    with plain_relay(workers=1) as (relay, sink):
        assert relay.configure() is None
        relay.set_accepting(True)
        _send(relay, SMALL, 0, 2)
        _answers(sink, 2)
        relay.set_accepting(False)
        relay.drain()
        relay.cleanup()
        _send(relay, SMALL, 2, 1)
        counters, snap = relay.counters(), relay.snapshot()
        assert counters.received == 3 and counters.discarded["model_unavailable"] == 1
        assert not snap.model_ok and snap.core.accepted == 2 and len(sink.got()) == 2


def test_a_closed_relay_gives_timers_no_snapshot():
    """A timer that fires while the node is destroyed finds the relay closed and reads nothing
    (it was an 'InvalidState: core is closed' in a timer thread at teardown)."""
    with plain_relay() as (relay, _sink):
        assert relay.open_snapshot("stats", lambda: (1, "unconfigured")) is not None
        relay.stop()
        relay.close()
        assert relay.closed and relay.open_snapshot("stats", lambda: (1, "unconfigured")) is None
