# SPDX-License-Identifier: Apache-2.0
"""The message types (Tensor included) round-trip over real DDS between two real rclpy nodes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from builtin_interfaces.msg import Time
from flowedge_relay_msgs.msg import (
    ActionMessage,
    InferenceRequest,
    PoolMember,
    RelayStats,
    Tensor,
)
from rclpy.qos import QoSProfile, ReliabilityPolicy
from ros_helpers import ros_context, spinning, wait_for, wait_for_subscribers

QOS = QoSProfile(depth=64, reliability=ReliabilityPolicy.RELIABLE)
UINT64_MAX = 2**64 - 1
UINT32_MAX = 2**32 - 1


def _roundtrip(msg_type, messages):
    """Publish messages from one node, receive them on another, return what arrived."""
    import rclpy

    received = []
    with ros_context() as ctx:
        tx = rclpy.create_node("msg_tx", context=ctx)
        rx = rclpy.create_node("msg_rx", context=ctx)
        try:
            rx.create_subscription(msg_type, "roundtrip", received.append, QOS)
            pub = tx.create_publisher(msg_type, "roundtrip", QOS)
            with spinning(tx, rx, context=ctx):
                wait_for_subscribers(pub)
                for m in messages:
                    pub.publish(m)
                assert wait_for(lambda: len(received) >= len(messages), timeout=10)
        finally:
            tx.destroy_node()
            rx.destroy_node()
    return received


@pytest.mark.ros
def test_inference_request_roundtrip():
    req = InferenceRequest(
        session_id="arm-left/7",
        sequence=UINT64_MAX,
        generation=UINT64_MAX - 1,
        retry_count=UINT32_MAX,
        retry_reason=InferenceRequest.RETRY_AFTER_CAPACITY,
        origin_stamp=Time(sec=1_700_000_000, nanosec=123_456_789),
        deadline=Time(sec=2**31 - 1, nanosec=999_999_999),
        remaining_nfe=16,
        model_digest="sha256:" + "ab" * 32,
        observation_dim=4,
        action_dim=2,
        action_horizon=8,
        observation=[0.5, -1.25, math.pi, 1e-30],
        noise_seed=UINT64_MAX,
        client_id="fleet/arm-left",
    )
    (got,) = _roundtrip(InferenceRequest, [req])
    assert got == req
    assert len(got.observation) == got.observation_dim
    assert (got.deadline.sec, got.deadline.nanosec) == (2**31 - 1, 999_999_999)
    constants = [
        InferenceRequest.RETRY_NONE,
        InferenceRequest.RETRY_TIMEOUT,
        InferenceRequest.RETRY_AFTER_STALE,
        InferenceRequest.RETRY_AFTER_DEADLINE,
        InferenceRequest.RETRY_AFTER_CAPACITY,
        InferenceRequest.RETRY_AFTER_EXPIRED,
    ]
    assert constants == [0, 1, 2, 3, 4, 5]


CODES = {
    "INFERENCE": 0,
    "REJECTED_STALE": 1,
    "REJECTED_DEADLINE": 2,
    "REJECTED_CAPACITY": 3,
    "EXPIRED": 4,
}


@pytest.mark.ros
def test_action_message_every_code_roundtrips():
    assert {name: getattr(ActionMessage, name) for name in CODES} == CODES
    sent = []
    for name, code in CODES.items():
        horizon, dim = 8, 2
        msg = ActionMessage(
            code=code,
            session_id=f"s-{name}",
            sequence=code,
            generation=UINT64_MAX,
            retry_count=code,
            model_digest="sha256:" + "0f" * 32,
            observation_dim=4,
            action_dim=dim,
            action_horizon=horizon,
            deadline=Time(sec=12, nanosec=345),
            remaining_nfe=0 if code == 0 else 7,
            actions=[float(i) / 4 for i in range(horizon * dim)] if code == 0 else [],
            nfe_done=9,
            queue_ns=UINT64_MAX,
            compute_ns=1,
            retry_reason=InferenceRequest.RETRY_TIMEOUT,
            client_id=f"robot-{code}",
            reject_reason=ActionMessage.REJECT_FAIR_SHARE if code == 3 else 0,
        )
        msg.header.stamp = Time(sec=5, nanosec=6)
        msg.header.frame_id = "relay"
        sent.append(msg)
    got = _roundtrip(ActionMessage, sent)
    assert sorted(got, key=lambda m: m.code) == sent
    inference = next(m for m in got if m.code == ActionMessage.INFERENCE)
    assert len(inference.actions) == inference.action_horizon * inference.action_dim
    assert all(len(m.actions) == 0 for m in got if m.code != ActionMessage.INFERENCE)


@pytest.mark.ros
def test_relay_stats_is_flat_and_numeric():
    """rqt_plot graphs numeric fields: every field but the stamp must be a number, except
    top_clients (docs/design.md §7.1): a client is named by its id, a string, so the per-client
    view is one bounded list of ClientShare (ros2 topic echo prints each client as one block,
    rqt_plot graphs top_clients[i]/share_in_use) whose every other field is a number."""
    from flowedge_relay_msgs.msg import ClientShare

    from flowedge_relay.diagnostics import TOP_CLIENTS

    numeric = {"uint64", "uint32", "double"}
    fields = RelayStats.get_fields_and_field_types()
    assert fields.pop("top_clients") == f"sequence<flowedge_relay_msgs/ClientShare, {TOP_CLIENTS}>"
    for name, kind in fields.items():
        if name == "stamp":
            continue
        assert kind in numeric, (name, kind)
    share = ClientShare.get_fields_and_field_types()
    assert share.pop("client_id") == "string" and set(share.values()) <= numeric, share
    top = [ClientShare(client_id=f"robot-{i}", share_in_use=0.5, admitted_nfe_per_s=1e3,
                       fair_share_rejections=UINT64_MAX, weight=i) for i in range(TOP_CLIENTS)]
    stats = RelayStats(queue_depth=3, latency_p99_ms=1.5, rejected_capacity=UINT64_MAX,
                       top_clients=top)
    (got,) = _roundtrip(RelayStats, [stats])
    assert got == stats


REQUEST_FIELDS = {
    "session_id": "string", "sequence": "uint64", "generation": "uint64",
    "retry_count": "uint32", "retry_reason": "uint8",
    "origin_stamp": "builtin_interfaces/Time", "deadline": "builtin_interfaces/Time",
    "remaining_nfe": "uint32", "model_digest": "string", "observation_dim": "uint32",
    "action_dim": "uint32", "action_horizon": "uint32", "observation": "sequence<float>",
    "noise_seed": "uint64", "inputs": "sequence<flowedge_relay_msgs/Tensor>",
    "client_id": "string",
}
TENSOR_FIELDS = {
    "name": "string", "dtype": "uint8", "shape": "sequence<uint32>", "data": "sequence<uint8>",
}
ACTION_FIELDS = {
    "header": "std_msgs/Header", "code": "uint8", "session_id": "string", "sequence": "uint64",
    "generation": "uint64", "retry_count": "uint32", "model_digest": "string",
    "observation_dim": "uint32", "action_dim": "uint32", "action_horizon": "uint32",
    "deadline": "builtin_interfaces/Time", "remaining_nfe": "uint32",
    "actions": "sequence<float>", "nfe_done": "uint32", "queue_ns": "uint64",
    "compute_ns": "uint64", "client_id": "string", "reject_reason": "uint8",
}


POOL_MEMBER_FIELDS = {
    "pool": "string", "relay_id": "string", "host": "string", "model_digest": "string",
    "model_digests": "sequence<string>", "state": "uint8", "draining": "boolean",
    "workers": "uint32", "nfe_ns": "uint64", "admission_reserve_ns": "uint64",
    "queue_depth": "uint32", "epoch": "uint32", "owning_from": "builtin_interfaces/Time",
    "owning_until": "builtin_interfaces/Time", "stamp": "builtin_interfaces/Time",
}


@pytest.mark.parametrize(
    ("msg_type", "contract"),
    [
        (InferenceRequest, REQUEST_FIELDS),
        (ActionMessage, ACTION_FIELDS),
        (Tensor, TENSOR_FIELDS),
        (PoolMember, POOL_MEMBER_FIELDS),
    ],
)
def test_fields_are_the_contract(msg_type, contract):
    """docs/design.md §2: names and types are the contract; adding is fine, renaming is not."""
    fields = msg_type.get_fields_and_field_types()
    assert {k: fields.get(k) for k in contract} == contract


def test_reject_reasons_are_the_cores():
    """docs/design.md §7.1: a robot tells "the relay is full" from "over your share" by these."""
    from flowedge_relay.core import RejectReason

    assert {r.name: int(r) for r in RejectReason} == {
        "NONE": ActionMessage.REJECT_NONE, "CAPACITY": ActionMessage.REJECT_CAPACITY,
        "FAIR_SHARE": ActionMessage.REJECT_FAIR_SHARE}
    assert (ActionMessage.REJECT_NONE, ActionMessage.REJECT_CAPACITY,
            ActionMessage.REJECT_FAIR_SHARE) == (0, 1, 2)


TENSOR_DTYPES = {
    "FLOAT32": (0, "<f4"),
    "UINT8": (1, "u1"),
    "INT64": (2, "<i8"),
    "INT32": (3, "<i4"),
    "FLOAT16": (4, "<f2"),
    "BOOL": (5, "?"),
}


@pytest.mark.ros
def test_request_with_tensor_inputs_roundtrips_bytes_exactly():
    """docs/design.md §2: named tensors, every dtype, data as C-order little-endian bytes."""
    assert {k: getattr(Tensor, k) for k in TENSOR_DTYPES} == {
        k: code for k, (code, _) in TENSOR_DTYPES.items()
    }
    rng = np.random.default_rng(5)
    arrays = {
        "FLOAT32": rng.standard_normal((2, 3)).astype("<f4"),
        "UINT8": rng.integers(0, 256, (1, 8, 8), dtype=np.uint8),
        "INT64": np.array([2**63 - 1, -(2**63), 7], "<i8"),
        "INT32": np.array([[-1, 2**31 - 1]], "<i4"),
        "FLOAT16": np.array([65504.0, -0.5, 1e-4], "<f2"),
        "BOOL": np.array([True, False, True, True]),
    }
    tensors = [
        Tensor(
            name=f"in_{kind.lower()}",
            dtype=TENSOR_DTYPES[kind][0],
            shape=list(arr.shape),
            data=arr.astype(TENSOR_DTYPES[kind][1]).tobytes(order="C"),
        )
        for kind, arr in arrays.items()
    ]
    req = InferenceRequest(
        session_id="vision/1",
        sequence=3,
        remaining_nfe=10,
        model_digest="sha256:" + "cd" * 32,
        action_dim=2,
        action_horizon=8,
        noise_seed=9,
        inputs=tensors,
    )
    assert req.observation_dim == 0 and len(req.observation) == 0
    (got,) = _roundtrip(InferenceRequest, [req])
    assert got == req
    assert [t.name for t in got.inputs] == [t.name for t in tensors]
    for t, (kind, arr) in zip(got.inputs, arrays.items(), strict=True):
        back = np.frombuffer(t.data, dtype=TENSOR_DTYPES[kind][1]).reshape(tuple(t.shape))
        assert back.tobytes() == arr.astype(TENSOR_DTYPES[kind][1]).tobytes(), kind
        assert len(t.data) == back.size * back.itemsize
