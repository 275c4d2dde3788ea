# SPDX-License-Identifier: Apache-2.0
"""A model swap (docs/design.md §9) over real DDS: `model_path` set while the relay serves
steady traffic, from the bundled small policy to the bench policy and back. Nothing is lost or
duplicated, every answer's digest echo names the model that computed it (checked by computing
each INFERENCE answer again, bit for bit, with the echoed model), old-digest requests that
arrive after the switch are counted as model_digest_mismatch, flowedge/model announces each
switch, and a set that cannot be served is refused with the loader's message while the old
model keeps serving."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from flowedge_relay_msgs.msg import ActionMessage as A
from rclpy.parameter import Parameter
from rclpy.parameter_client import AsyncParameterClient
from ros_helpers import running_relay, wait_for

from flowedge_relay import producer
from flowedge_relay.model import (
    FlowSampler,
    default_model_path,
    load_model,
    make_session,
)
from flowedge_relay.producer import follow_served_model
from flowedge_relay_tools.harness import served_model
from flowedge_relay_tools.models import bench_model_path

pytestmark = pytest.mark.ros  # every test here runs a relay over DDS

SMALL, BENCH = load_model(default_model_path()), load_model(bench_model_path())
OBS = np.full(4, 0.1, np.float32)  # the harness's default observation


def _set(h, **values):
    """`ros2 param set` through the relay's parameter service, atomically: the result."""
    client = AsyncParameterClient(h.client, "flowedge_relay")
    assert client.wait_for_services(10.0)
    future = client.set_parameters_atomically([Parameter(k, value=v) for k, v in values.items()])
    assert wait_for(future.done, 60.0), "the parameter service did not answer"
    return future.result().result


def _announced(h) -> list:
    got: list = []
    follow_served_model(h.client, got.append)
    return got


def test_a_swap_under_steady_load_loses_nothing_and_each_answer_names_its_model():
    models = {SMALL.digest: SMALL, BENCH.digest: BENCH}
    with running_relay(model_path=default_model_path(), nfe_ns=3_000_000,
                       admission_reserve_ns=2_000_000) as h:
        served = _announced(h)
        assert wait_for(lambda: served and served[-1].model_digest == SMALL.digest, 10)
        sent: dict[int, str] = {}
        stop = threading.Event()

        def produce() -> None:  # ~200 requests/s, each with the digest served as it is built
            i = 0
            while not stop.is_set():
                digest = served[-1].model_digest
                h.send(h.request(session_id=f"p{i % 4}", sequence=i, remaining_nfe=2,
                                 noise_seed=i, model_digest=digest,
                                 deadline_ms=None if i % 3 else 400))
                sent[i] = digest
                i += 1
                time.sleep(0.005)

        def sends_more(digest: str, count: int = 100) -> bool:
            """The producer's own next `count` requests carry `digest`: each phase gets its
            requests on purpose, not from how the producer's pace meets the switches."""
            mark = len(sent)  # keys are 0, 1, 2, ... in sending order
            return wait_for(
                lambda: sum(sent.get(i) == digest for i in range(mark, len(sent))) >= count, 30)

        sender = threading.Thread(target=produce, daemon=True)
        sender.start()
        try:
            assert sends_more(SMALL.digest)
            result = _set(h, model_path=bench_model_path())
            assert result.successful, result.reason
            assert wait_for(lambda: served[-1].model_digest == BENCH.digest, 10)
            assert producer.ServedModel.from_message(served[-1]) == served_model(BENCH)
            assert sends_more(BENCH.digest)
            result = _set(h, model_path=default_model_path())
            assert result.successful, result.reason
            assert wait_for(lambda: served[-1].model_digest == SMALL.digest, 10)
            assert sends_more(SMALL.digest)
        finally:
            stop.set()
            sender.join(10)
        mismatched = lambda: h.node.relay.counters().discarded["model_digest_mismatch"]  # noqa: E731
        assert wait_for(lambda: len(h.answers()) + mismatched() >= len(sent), 60)
        time.sleep(0.5)  # a duplicate would be here by now
        answers = h.answers()
        discarded = mismatched()
    keys = [a.sequence for a in answers]
    assert len(keys) == len(set(keys))  # none twice
    assert len(keys) + discarded == len(sent)  # none lost: answered, or sent to a model gone
    assert {a.model_digest for a in answers} == {SMALL.digest, BENCH.digest}
    samplers = {d: FlowSampler(make_session(m, 1), m, "euler") for d, m in models.items()}
    computed = 0
    for a in answers:
        if a.code != A.INFERENCE:
            continue
        want = samplers[a.model_digest].sample(OBS, a.sequence, 2)
        assert np.array_equal(np.asarray(a.actions, np.float32), want), a.sequence
        computed += 1
    assert computed > 100


def test_a_model_that_cannot_be_served_is_refused_and_the_old_one_keeps_serving():
    with running_relay() as h:
        served = _announced(h)
        result = _set(h, model_path="/nonexistent/policy.onnx")
        assert not result.successful and "/nonexistent/policy.onnx" in result.reason
        assert h.node.get_parameter("model_path").value == ""
        h.send(h.request(session_id="a", sequence=1))
        assert h.answer_for(1).code == A.INFERENCE
        assert wait_for(lambda: served and served[-1].model_digest == SMALL.digest, 10)
        assert len(served) == 1  # nothing was announced
