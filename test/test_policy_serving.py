# SPDX-License-Identifier: Apache-2.0
"""Serving a policy package: request tensors -> the staging slot's payload (one copy) -> the
worker's sampler bound to that slot; and the same over real DDS through the node.

The first half runs the relay's own pieces (validation.Validator with its intake target,
workers.SlotInputs, policy.PolicySampler) on plain uint8 buffers standing in for the C core's
slot payloads, so the layout, the intake and the worker binding are tested whatever the core
offers. The second half starts the real node with `model_path:=<package dir>`; it needs the
core's per-slot payloads and prefix_done (docs/core-api.md) and is skipped on a core without them.
"""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import broken_tensors
from flowedge_relay_msgs.msg import ActionMessage, InferenceRequest, Tensor

from flowedge_relay import policy as P
from flowedge_relay.producer import ServedModel, build_request
from flowedge_relay.validation import ModelContract, Reason, Validator
from flowedge_relay.workers import SlotInputs
from flowedge_relay_tools.models import detour_task as task

A = ActionMessage
SLOTS = 4


@pytest.fixture(scope="module")
def vision() -> P.Policy:
    return P.load(P.vision_policy_path())


def _scene(seed: int) -> dict[str, np.ndarray]:
    """Inputs for one detour scene, rendered by the package's own render function."""
    obs = task.sample_observations(np.random.default_rng(seed), 1)
    return {"image": task.render_observation(obs)[0], "state": obs[0, :2].astype(np.float32)}


class _Slots:
    """Plain uint8 payloads standing in for the core's, and a movable staging slot."""

    def __init__(self, policy: P.Policy) -> None:
        self.inputs = SlotInputs(policy, self.view)
        self.payloads = [np.zeros(self.inputs.payload_bytes, np.uint8) for _ in range(SLOTS)]
        self.staging = 0

    def view(self, slot: int) -> np.ndarray:
        return self.payloads[slot]

    def target(self) -> P.InputBuffers:
        return self.inputs[self.staging]


def _request(policy: P.Policy, arrays, seq: int = 1, seed: int = 5, nfe: int = 10):
    return build_request(ServedModel.from_policy(policy), arrays, session_id="cam",
                         sequence=seq, remaining_nfe=nfe, noise_seed=seed)


def _run(sampler: P.PolicySampler, buffers: P.InputBuffers, seed: int, nfe: int) -> np.ndarray:
    """What a worker does with a dispatched slot: start on its buffers, prefix once, NFEs."""
    sampler.start(seed, nfe, buffers)
    sampler.prefix()
    for _ in range(nfe):
        sampler.nfe()
    return sampler.actions().copy()


def test_payload_layout_is_aligned_and_views_share_the_payload(vision):
    layout = P.payload_layout(vision)
    assert list(layout.offsets) == [s.name for s in vision.inputs]
    assert all(off % P.PAYLOAD_ALIGN == 0 for off in layout.offsets.values())
    # image normalized -> float32 [2,32,32]; state float32 [2]
    assert layout.sizes == {"image": 2 * 32 * 32 * 4, "state": 2 * 4}
    assert layout.nbytes % P.PAYLOAD_ALIGN == 0 and layout.nbytes >= sum(layout.sizes.values())
    payload = np.zeros(layout.nbytes, np.uint8)
    bufs = P.InputBuffers.over_payload(vision, payload, layout)
    assert bufs["image"].shape == (1, 2, 32, 32) and bufs["image"].dtype == np.float32
    assert np.shares_memory(bufs["image"], payload) and np.shares_memory(bufs["state"], payload)
    bufs["state"][0, 1] = 3.5
    off = layout.offsets["state"]
    assert payload[off + 4 : off + 8].view(np.float32)[0] == np.float32(3.5)
    with pytest.raises(ValueError, match="payload"):
        P.InputBuffers.over_payload(vision, np.zeros(layout.nbytes - 1, np.uint8), layout)


def test_request_taken_into_the_staging_slot_and_sampled_there_is_bit_identical(vision):
    """One copy: intake writes the normalized tensors into the slot payload itself, and a
    sampler bound to that slot gives exactly the local sampling's actions."""
    slots = _Slots(vision)
    v = Validator(ModelContract.of(vision), max_nfe=64, intake_target=slots.target)
    sampler = P.PolicySampler(vision, P.make_sessions(vision))
    local = P.PolicySampler(vision, P.make_sessions(vision))
    for slot, seed in ((2, 5), (0, 11), (3, 5)):
        arrays = _scene(seed)
        slots.staging = slot
        reason, sid, obs = v.check(_request(vision, arrays, seed=seed))
        assert reason is None and sid == b"cam" and obs.size == 0
        payload = slots.payloads[slot]
        normalized = np.empty((1, 2, 32, 32), np.float32)
        vision.input["image"].normalization.apply(arrays["image"], normalized[0])
        assert slots.inputs[slot]["image"].tobytes() == normalized.tobytes()
        assert np.shares_memory(slots.inputs[slot]["image"], payload)
        got = _run(sampler, slots.inputs[slot], seed, 10)
        want = local.sample(arrays, seed, 10)
        assert got.shape == (vision.action_len,) and np.isfinite(got).all()
        assert got.tobytes() == want.tobytes()
    assert slots.inputs[2] is slots.inputs[2]  # views and OrtValues made once per slot
    assert v.total_discarded() == 0


def test_a_slot_holds_its_request_while_the_next_is_staged(vision):
    """The worker's slot is untouched by intake into the next staging slot."""
    slots = _Slots(vision)
    v = Validator(ModelContract.of(vision), max_nfe=64, intake_target=slots.target)
    first, second = _scene(1), _scene(2)
    slots.staging = 1
    assert v.check(_request(vision, first))[0] is None
    slots.staging = 3  # the core took slot 1 and staged another
    assert v.check(_request(vision, second))[0] is None
    sampler = P.PolicySampler(vision, P.make_sessions(vision))
    got = _run(sampler, slots.inputs[1], 5, 6)
    want = P.PolicySampler(vision, P.make_sessions(vision)).sample(first, 5, 6)
    assert got.tobytes() == want.tobytes()


def _mutated(vision: P.Policy, change: str) -> InferenceRequest:
    return broken_tensors(_request(vision, _scene(3)), change)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("shape", Reason.INPUT_SHAPE),
        ("missing", Reason.INPUT_MISSING),
        ("extra", Reason.INPUT_UNEXPECTED),
        ("duplicate", Reason.INPUT_DUPLICATE),
        ("dtype", Reason.INPUT_DTYPE),
        ("bytes", Reason.INPUT_BYTES),
        ("not_finite", Reason.INPUT_NOT_FINITE),
        ("observation", Reason.OBSERVATION_LENGTH),
    ],
)
def test_each_bad_tensor_request_is_discarded_by_its_own_reason(vision, change, reason):
    slots = _Slots(vision)
    v = Validator(ModelContract.of(vision), max_nfe=64, intake_target=slots.target)
    got, _, obs = v.check(_mutated(vision, change))
    assert got is reason and obs is None
    assert v.discarded[reason] == 1 and v.total_discarded() == 1


def test_oversized_request_is_discarded_before_any_copy(vision):
    slots = _Slots(vision)
    limit = P.payload_layout(vision).sizes["image"]  # the uint8 image fits, image + state not
    v = Validator(ModelContract.of(vision), max_nfe=64, intake_target=slots.target,
                  max_request_bytes=2 * 32 * 32)
    assert limit > 2 * 32 * 32
    got, _, _ = v.check(_request(vision, _scene(4)))
    assert got is Reason.REQUEST_TOO_LARGE and v.discarded[Reason.REQUEST_TOO_LARGE] == 1
    assert not slots.payloads[0].any()  # nothing was copied


def test_tensor_inputs_to_a_single_vector_model_are_unexpected():
    from flowedge_relay.model import default_model_path

    small = P.load(default_model_path())
    v = Validator(ModelContract.of(small), max_nfe=64)
    req = build_request(ServedModel.from_policy(small), {"observation": np.zeros(small.obs_dim)},
                        session_id="s", sequence=1, remaining_nfe=2)
    assert v.check(req)[0] is None
    req.inputs = [Tensor(name="observation", dtype=0, shape=[1], data=b"\0" * 4)]
    assert v.check(req)[0] is Reason.INPUT_UNEXPECTED


def test_a_package_validator_needs_an_intake_target(vision):
    with pytest.raises(ValueError, match="intake_target"):
        Validator(ModelContract.of(vision), max_nfe=64)


# ---------------------------------------------------------------- over real DDS

def _served(h) -> ServedModel:
    """What the relay advertises on /diagnostics, as a producer reads it."""
    from ros_helpers import status_values

    values = status_values(h.latest_status("model"))
    return ServedModel.from_description(
        values["model_digest"], values["model_inputs"], int(values["action_dim"]),
        int(values["action_horizon"]), int(values["observation_dim"]),
    )


def _send(h, served: ServedModel, arrays, seq: int, deadline_ms: float | None = 10_000,
          **kw) -> InferenceRequest:
    now = h.client.get_clock().now().nanoseconds
    deadline = now + int(deadline_ms * 1e6) if deadline_ms is not None else 0
    req = build_request(served, arrays, session_id=kw.pop("session_id", "cam"), sequence=seq,
                        remaining_nfe=kw.pop("remaining_nfe", 10), deadline_ns=deadline,
                        noise_seed=kw.pop("noise_seed", 7), origin_ns=now, **kw)
    h.send(req)
    return req


@pytest.mark.ros
def test_vision_package_served_over_dds_bit_identical_and_bad_tensors_counted(vision):
    from ros_helpers import running_relay, status_values, wait_for

    arrays = _scene(21)
    want = P.PolicySampler(vision, P.make_sessions(vision)).sample(arrays, 7, 10)
    with running_relay(model_path=P.vision_policy_path()) as h:
        served = _served(h)
        assert served.digest == vision.digest and served.observation_dim == 0
        assert [(d.name, d.dtype, d.shape) for d in served.inputs] == [
            ("image", "uint8", (2, 32, 32)), ("state", "float32", (2,))]
        _send(h, served, arrays, 1)
        _send(h, served, arrays, 2)
        bad = {
            3: "shape", 4: "missing", 5: "extra", 6: "dtype",
        }
        for seq, change in bad.items():
            req = _mutated(vision, change)
            req.sequence = seq
            h.send(req)
        big = build_request(served, arrays, session_id="cam", sequence=7, remaining_nfe=4)
        big.inputs[0].data = b"\0" * (P.DEFAULT_MAX_REQUEST_BYTES + 1)
        h.send(big)
        _send(h, served, arrays, 8)  # sent after the bad ones: all of them were taken by then
        first, second, last = h.answer_for(1), h.answer_for(2), h.answer_for(8)
        counted = {}

        def all_counted() -> bool:
            counted.update(status_values(h.latest_status("admission")))
            return all(int(counted.get(f"invalid.{r.value}", 0)) == 1 for r in (
                Reason.INPUT_SHAPE, Reason.INPUT_MISSING, Reason.INPUT_UNEXPECTED,
                Reason.INPUT_DTYPE, Reason.REQUEST_TOO_LARGE))

        assert wait_for(all_counted, 10), counted
        model = status_values(h.latest_status("model"))
        loop = status_values(h.latest_status("workers"))["nfe_loop"]
        answered = {a.sequence for a in h.answers()}
    for ans in (first, second, last):
        assert ans is not None and ans.code == A.INFERENCE and ans.nfe_done == 10
        assert (ans.observation_dim, ans.action_dim, ans.action_horizon) == (0, 2, 8)
        got = np.array(ans.actions, np.float32)
        assert got.shape == (16,) and np.isfinite(got).all()
        assert got.tobytes() == want.tobytes()  # same inputs and seed: bit-identical
    assert answered == {1, 2, 8}  # discarded requests get no answer
    assert int(counted["invalid_discarded"]) == 5
    assert model["model_kind"] == "two-phase (package)"
    assert model["execution_providers"] == "CPUExecutionProvider"
    assert int(model["prefix_samples"]) >= 3
    assert loop == "native"  # the step graph ran in the C loop, the prefix in Python


@pytest.mark.ros
def test_package_keeps_stale_deadline_capacity_and_expired_semantics():
    """With prefix_ns in admission: the same outcomes, decided the same way, as the
    single-vector model (test_node.py)."""
    from rclpy.parameter import Parameter
    from ros_helpers import running_relay, wait_for

    arrays = _scene(22)
    # 10 NFE x 100 ms = 1 s fits a 2.5 s deadline; with the 2 s prefix (3 s) it cannot (the
    # seconds leave the trip room on a loaded host)
    with running_relay(model_path=P.vision_policy_path(), nfe_ns=100_000_000,
                       prefix_ns=2_000_000_000, queue_capacity=2, drill=True) as h:
        served = _served(h)
        _send(h, served, arrays, 1, deadline_ms=2_500, session_id="d")
        _send(h, served, arrays, 2, deadline_ms=5_000, session_id="d", remaining_nfe=2)
        _send(h, served, arrays, 3, deadline_ms=-5, session_id="e")
        deadline, fits, expired = h.answer_for(1), h.answer_for(2), h.answer_for(3)
        assert h.node.set_parameters([Parameter("nfe_ns", value=0),
                                       Parameter("fault_nfe_delay_ms", value=30.0)])[0].successful
        # stale: a newer generation cancels the session's queued and running work
        _send(h, served, arrays, 10, deadline_ms=None, session_id="r", generation=1,
              remaining_nfe=20)
        assert wait_for(lambda: h.node.relay.core.stats().lanes_busy == 1, 10)
        _send(h, served, arrays, 11, deadline_ms=None, session_id="r", generation=1,
              remaining_nfe=20)
        assert wait_for(lambda: h.node.relay.core.stats().queue_depth == 1, 10)
        _send(h, served, arrays, 12, deadline_ms=None, session_id="r", generation=2,
              remaining_nfe=1)
        running, queued, newer = h.answer_for(10), h.answer_for(11), h.answer_for(12)
        # capacity: a full queue (2) and a request without a deadline cannot displace
        _send(h, served, arrays, 20, deadline_ms=None, session_id="a", remaining_nfe=20)
        assert wait_for(lambda: h.node.relay.core.stats().lanes_busy == 1, 10)
        _send(h, served, arrays, 21, deadline_ms=None, session_id="b", remaining_nfe=1)
        _send(h, served, arrays, 22, deadline_ms=60_000, session_id="c", remaining_nfe=1)
        assert wait_for(lambda: h.node.relay.core.stats().queue_depth == 2, 10)
        _send(h, served, arrays, 23, deadline_ms=None, session_id="x", remaining_nfe=1)
        full = h.answer_for(23)
        rest = [h.answer_for(seq, timeout=30) for seq in (20, 21, 22)]
    assert deadline.code == A.REJECTED_DEADLINE and deadline.nfe_done == 0
    assert deadline.remaining_nfe == 10
    assert fits.code == A.INFERENCE and fits.nfe_done == 2
    assert expired.code == A.EXPIRED and expired.nfe_done == 0
    assert queued.code == A.REJECTED_STALE and queued.nfe_done == 0
    assert running.code == A.REJECTED_STALE and running.nfe_done < 20
    assert newer.code == A.INFERENCE
    assert full.code == A.REJECTED_CAPACITY and full.nfe_done == 0
    assert [a.code for a in rest] == [A.INFERENCE] * 3


@pytest.mark.ros
def test_unavailable_execution_provider_is_the_model_error_naming_the_available_ones():
    """CUDA asked for on this CPU host: the model ERROR lists what is available; nothing is
    served on CPU instead (requests are discarded as model_unavailable)."""
    import onnxruntime as ort
    from diagnostic_msgs.msg import DiagnosticStatus
    from ros_helpers import running_relay, status_values, wait_for

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this host has CUDA: the provider is available")
    with running_relay(execution_providers=["CUDAExecutionProvider", "CPUExecutionProvider"]) as h:
        status = h.latest_status("model")
        h.send(h.request(sequence=1))
        key = Reason.MODEL_UNAVAILABLE.value
        assert wait_for(lambda: h.node.relay.counters().discarded[key] == 1, 10)
        assert h.node.relay.pool is None
    assert status.level == DiagnosticStatus.ERROR
    error = status_values(status)["error"]
    assert "CUDAExecutionProvider" in error and "not available" in error
    assert str(ort.get_available_providers()) in error and "CPUExecutionProvider" in error
