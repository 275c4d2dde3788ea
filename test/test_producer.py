# SPDX-License-Identifier: Apache-2.0
"""producer.build_request: requests built from numpy arrays pass the relay's tensor intake."""

from __future__ import annotations

import numpy as np
import pytest
from flowedge_relay_msgs.msg import InferenceRequest
from test_policy import write_tiny_package

from flowedge_relay import policy as P
from flowedge_relay.model import default_model_path
from flowedge_relay.producer import (
    InputDecl,
    ServedModel,
    build_request,
    parse_inputs,
)


@pytest.fixture
def tiny(tmp_path) -> P.Policy:
    return P.load(write_tiny_package(tmp_path / "pkg"))


def _arrays() -> dict[str, np.ndarray]:
    return {
        "image": np.array([[[0, 255], [51, 102]]], np.uint8),
        "state": np.array([1.5, -2.0, 0.25], np.float32),
    }


def test_request_roundtrips_through_intake(tiny):
    served = ServedModel.from_policy(tiny)
    req = build_request(
        served,
        _arrays(),
        session_id="arm/1",
        sequence=7,
        remaining_nfe=10,
        deadline_ns=12_500_000_001,
        noise_seed=99,
        generation=3,
        origin_ns=1_000_000_000,
    )
    assert isinstance(req, InferenceRequest)
    assert (req.model_digest, req.action_dim, req.action_horizon) == (tiny.digest, 2, 3)
    assert (req.observation_dim, len(req.observation)) == (0, 0)
    assert (req.deadline.sec, req.deadline.nanosec) == (12, 500_000_001)
    assert (req.origin_stamp.sec, req.noise_seed, req.generation) == (1, 99, 3)
    bufs = P.InputBuffers(tiny)
    assert P.intake(req.inputs, tiny, bufs, P.request_bytes(req)) is None
    np.testing.assert_allclose(bufs["image"][0], [[[-1.0, 1.0], [-0.6, -0.2]]], atol=1e-6)
    assert bufs["state"][0].tobytes() == _arrays()["state"].tobytes()
    # One byte under the request's own size is over the limit.
    assert P.intake(req.inputs, tiny, bufs, P.request_bytes(req) - 1) == "request_too_large"


def test_same_kind_cast_and_producer_side_errors(tiny):
    served = ServedModel.from_policy(tiny)
    arrays = _arrays()
    arrays["state"] = arrays["state"].astype(np.float64)  # float64 -> float32: same kind
    req = build_request(served, arrays, session_id="s", sequence=1, remaining_nfe=1)
    assert P.intake(req.inputs, tiny, P.InputBuffers(tiny)) is None
    kw = {"session_id": "s", "sequence": 1, "remaining_nfe": 1}
    with pytest.raises(ValueError, match=r"missing \['state'\]"):
        build_request(served, {"image": arrays["image"]}, **kw)
    with pytest.raises(ValueError, match=r"undeclared \['tokens'\]"):
        build_request(served, {**arrays, "tokens": np.zeros(3)}, **kw)
    with pytest.raises(ValueError, match=r"'image': expected shape \[1, 2, 2\], got \[2, 2\]"):
        build_request(served, {**arrays, "image": np.zeros((2, 2), np.uint8)}, **kw)
    with pytest.raises(ValueError, match=r"'image': expected uint8, got float32"):
        build_request(served, {**arrays, "image": np.zeros((1, 2, 2), np.float32)}, **kw)


def test_single_vector_model_uses_the_observation_shorthand():
    pol = P.load(default_model_path())
    served = ServedModel.from_policy(pol)
    obs = np.array([0.5, -1.25, 3.0, 1e-30], np.float32)
    req = build_request(served, {"observation": obs}, session_id="s", sequence=1, remaining_nfe=4)
    assert req.observation_dim == 4 and len(req.inputs) == 0
    assert np.asarray(req.observation, np.float32).tobytes() == obs.tobytes()
    assert (req.action_dim, req.action_horizon, req.model_digest) == (2, 8, pol.digest)


def test_advertised_description_parses_back(tiny):
    text = tiny.describe_inputs()
    served = ServedModel.from_description(tiny.digest, text, 2, 3)
    assert served == ServedModel.from_policy(tiny)
    assert parse_inputs("a:bool[4]; b : int64 [ 1, 7 ]") == (
        InputDecl("a", "bool", (4,)),
        InputDecl("b", "int64", (1, 7)),
    )
    for bad in ("image:float64[2]", "image[2]", "image:uint8(2)"):
        with pytest.raises(ValueError, match="cannot parse"):
            parse_inputs(bad)


def test_vision_request_through_intake_equals_local_sampling():
    """The bundled two-phase package: producer -> Tensor bytes -> intake (one copy, normalized)
    -> sampler bound to those buffers gives bit-identical actions to the local numpy path."""
    from flowedge_relay_tools.models import detour_task as task

    package = P.load(P.vision_policy_path())
    served = ServedModel.from_policy(package)
    obs = task.sample_observations(np.random.default_rng(8), 3)
    images = task.render_observation(obs)
    sampler = P.PolicySampler(package, P.make_sessions(package))
    for i in range(3):
        arrays = {"image": images[i], "state": obs[i, :2]}
        req = build_request(served, arrays, session_id="cam", sequence=i, remaining_nfe=10)
        bufs = P.InputBuffers(package)
        assert P.intake(req.inputs, package, bufs, P.request_bytes(req)) is None
        sampler.start(req.noise_seed, req.remaining_nfe, bufs)
        sampler.prefix()
        for _ in range(req.remaining_nfe):
            sampler.nfe()
        via_message = sampler.actions().copy()
        local = P.PolicySampler(package, P.make_sessions(package)).sample(arrays, 0, 10)
        assert via_message.shape == (16,) and np.isfinite(via_message).all()
        assert via_message.tobytes() == local.tobytes()


def test_the_tools_request_builder_goes_through_build_request_for_both_kinds(tiny):
    """harness.build_request (tests, bench client, demo, drill, stress): a package gets its
    declared tensors (a detour scene for the bundled vision package, seeded values otherwise),
    a single .onnx model the observation shorthand; fields still override afterwards."""
    from flowedge_relay.model import load_model
    from flowedge_relay_tools import harness

    vision = P.load(P.vision_policy_path())
    req = harness.build_request(vision, 5_000_000_000, deadline_ms=20, sequence=9)
    assert [t.name for t in req.inputs] == ["image", "state"] and req.observation_dim == 0
    assert (req.sequence, req.origin_stamp.sec, req.deadline.nanosec) == (9, 5, 20_000_000)
    bufs = P.InputBuffers(vision)
    assert P.intake(req.inputs, vision, bufs) is None
    scene = harness.scene_inputs(harness.served_model(vision), 3)
    assert scene["image"].dtype == np.uint8 and scene["image"].max() > 0  # a rendered goal
    np.testing.assert_array_equal(scene["image"], harness.scene_inputs(
        harness.served_model(vision), 3)["image"])  # seeded
    other = harness.build_request(tiny, 0)  # unknown package inputs: valid seeded values
    assert P.intake(other.inputs, tiny, P.InputBuffers(tiny)) is None
    small = load_model(default_model_path())
    one = harness.build_request(small, 0, remaining_nfe=2)
    assert (one.observation_dim, len(one.observation), one.inputs) == (small.obs_dim, 4, [])
    assert one.model_digest == small.digest and one.remaining_nfe == 2
    assert harness.model_path("vision") == P.vision_policy_path()
    assert harness.model_path("/x.onnx") == "/x.onnx"


def test_a_robot_tells_a_fair_share_refusal_from_a_full_relay():
    """docs/design.md §7.1: the request names its client; REJECTED_CAPACITY says why."""
    from flowedge_relay_msgs.msg import ActionMessage as A

    from flowedge_relay.producer import over_fair_share

    served = ServedModel.from_policy(P.load(default_model_path()))
    obs = np.zeros(served.observation_dim, np.float32)
    req = build_request(served, {"observation": obs}, session_id="arm/1", sequence=1,
                        remaining_nfe=2, client_id="fleet/arm")
    assert req.client_id == "fleet/arm"
    assert over_fair_share(A(code=A.REJECTED_CAPACITY, reject_reason=A.REJECT_FAIR_SHARE))
    assert not over_fair_share(A(code=A.REJECTED_CAPACITY, reject_reason=A.REJECT_CAPACITY))
    assert not over_fair_share(A(code=A.INFERENCE))


def _publish_answers(sessions: list[tuple[str, int]], *ids_lists) -> list:
    """Each id list's answer subscription in one private context, fed `sessions` over DDS."""
    import time

    import rclpy
    from flowedge_relay_msgs.msg import ActionMessage
    from rclpy.node import Node

    from flowedge_relay.producer import answer_subscription, answers_qos
    from flowedge_relay_tools.harness import ros_context, spinning, wait_for_subscribers

    with ros_context() as ctx:
        relay, robot = Node("answers_relay", context=ctx), Node("answers_robot", context=ctx)
        got: list[list] = [[] for _ in ids_lists]
        subs = [answer_subscription(robot, ids, got[k].append)
                for k, ids in enumerate(ids_lists)]
        pub = relay.create_publisher(ActionMessage, "flowedge/actions", answers_qos())
        with spinning(relay, robot, context=ctx):
            wait_for_subscribers(pub, len(ids_lists))
            for session, sequence in sessions:
                pub.publish(ActionMessage(session_id=session, sequence=sequence))
            pub.wait_for_all_acked(rclpy.duration.Duration(seconds=10))
            time.sleep(0.5)
        relay.destroy_node()
        robot.destroy_node()
    return [(sub, [(a.session_id, a.sequence) for a in g])
            for sub, g in zip(subs, got, strict=True)]


@pytest.mark.ros
def test_answer_subscription_takes_only_its_sessions_once():
    """docs/design.md §13.3: a robot's answer subscription gets its own sessions' answers only,
    filtered by the middleware (a content filter on session_id: Fast DDS on Jazzy and Kilted),
    each (session_id, sequence) once, the second counted; where the filter cannot carry the ids
    (a quote in one) it filters in Python, counting what it dropped."""
    import rclpy

    sent = [("arm/1", 1), ("arm/3", 1), ("arm/2", 1), ("arm/1", 1), ("x", 7), ("arm/2", 2),
            ("o'hare", 1), ("arm/1", 2)]
    (mw, mw_got), (py, py_got) = _publish_answers(sent, ["arm/1", "arm/2"], ["o'hare", "arm/3"])
    assert mw_got == [("arm/1", 1), ("arm/2", 1), ("arm/2", 2), ("arm/1", 2)]
    assert mw.duplicates == 1
    if rclpy.get_rmw_implementation_identifier() == "rmw_fastrtps_cpp":
        assert mw.filtered_by == "middleware" and mw.foreign == 0
    assert py_got == [("arm/3", 1), ("o'hare", 1)]
    assert py.filtered_by == "python" and py.foreign == 6 and py.duplicates == 0
