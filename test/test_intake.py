# SPDX-License-Identifier: Apache-2.0
"""The request intake in C (csrc/fer_intake.h, flowedge_relay/intake.py) against the rclpy one.

The C intake must decide every message exactly as validation.py, policy intake and the core do
through the rclpy callback: the same discard reason, or the same core decision, and for a package
the same bytes in the staging slot. Both run side by side over the same messages (each on its own
core, with the same clocks), over the stress campaign's corpus (hostile, hostile-but-valid and raw
CDR) and over generated tensors. The CDR reader is checked field by field against rclpy's own
serialization, and against bytes that are not a message at all.
"""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest
from builtin_interfaces.msg import Duration, Time
from core_helpers import TENSOR_CHANGES, broken_tensors
from flowedge_relay_msgs.msg import InferenceRequest, Tensor
from hypothesis import given, settings
from hypothesis import strategies as st
from rclpy.serialization import deserialize_message, serialize_message

from flowedge_relay import policy as policy_mod
from flowedge_relay.core import Core, CoreConfig, Decision, ffi, lib
from flowedge_relay.intake import REASON_KEYS, NativeIntake, PythonIntake
from flowedge_relay.model import default_model_path, load_model
from flowedge_relay.rcl_abi import load_wire
from flowedge_relay.rtc import RtcSpec
from flowedge_relay.timebase import ros_time
from flowedge_relay.validation import ModelContract, Reason, Validator
from flowedge_relay.workers import SlotInputs
from flowedge_relay_tools.harness import build_request, scene_inputs, served_model
from flowedge_relay_tools.stress import ProbeFactory, RequestBuilder

MS = 1_000_000
SMALL = load_model(default_model_path())
VISION = policy_mod.load(policy_mod.vision_policy_path())
U32 = st.integers(0, 2**32 - 1)
U64 = st.integers(0, 2**64 - 1)


# ---- two intakes, one message at a time ---------------------------------------------------------


class Pair:
    """The rclpy intake and the C intake on twin cores: `both(cdr)` decides one message on each,
    at the same instant, and returns the two results as (key or None, decision or None)."""

    def __init__(self, policy: policy_mod.Policy, *, max_nfe: int = 16, queue_capacity: int = 8,
                 max_request_bytes: int = policy_mod.DEFAULT_MAX_REQUEST_BYTES,
                 core_max_nfe: int | None = None, rtc: RtcSpec | None = None,
                 **core_fields) -> None:
        package = policy.kind != "onnx"
        model = policy
        contract = ModelContract.of(policy)
        # as serving.Serving: a payload for a package's inputs, and for a prefix (a single file's
        # observation stays in the core's rows)
        payload = package or rtc is not None
        layout = policy_mod.payload_layout(policy, rtc=rtc is not None) if payload else None

        def core() -> Core:
            extra = ({"two_phase": int(policy.two_phase), "payload_bytes": layout.nbytes,
                      "rtc_max_delay": rtc.max_delay if rtc else 0}
                     if payload else {})
            return Core(CoreConfig(obs_dim=model.obs_dim, action_len=model.action_len,
                                   queue_capacity=queue_capacity,
                                   max_nfe=core_max_nfe or max_nfe, **extra, **core_fields))

        self.py_core, self.c_core = core(), core()
        self.slots = SlotInputs(policy, self.py_core.payload_view, rtc) if payload else None
        staging = (lambda: self.slots[self.py_core.staging_slot()]) if package else None
        prefix = (lambda: self.slots.prefix(self.py_core.staging_slot())) if rtc else None
        self.validator = Validator(contract, max_nfe, intake_target=staging,
                                   max_request_bytes=max_request_bytes, prefix_target=prefix)
        self.py = PythonIntake(self.py_core, self.validator, time.time_ns)
        self.c = NativeIntake(self.c_core, contract, max_nfe, max_request_bytes,
                              layout.prefix_offset if rtc else None)
        self.package = package

    def both(self, cdr: bytes, now_mono: int, now_ros: int):
        c_key, c_decision = self.c.decide(cdr, now_mono, now_ros)
        try:
            msg = deserialize_message(cdr, InferenceRequest)
        except Exception:  # rclpy's take would drop it: the C intake must count it malformed
            return None, (c_key, c_decision)
        reason, decision = self.py.decide(msg, now_mono, now_ros)
        return (reason.value if reason else None, decision), (c_key, c_decision)

    def staged(self) -> tuple[bytes, bytes]:
        """The payload bytes of each core's staging slot (package only)."""
        py = self.py_core.payload_view(self.py_core.staging_slot())
        c = self.c_core.payload_view(self.c_core.staging_slot())
        return bytes(py), bytes(c)

    def close(self) -> None:
        self.py_core.close()
        self.c_core.close()


def _now() -> tuple[int, int]:
    return time.monotonic_ns(), time.time_ns()


# ---- the CDR reader -----------------------------------------------------------------------------


def _parse(cdr: bytes):
    load_wire()  # the request's plan, from InferenceRequest.msg's introspection type support
    view = ffi.new("struct fer_request_view *")
    rc = lib.fer_request_parse(cdr, len(cdr), view)
    return rc, view


def _bytes(ptr, n: int) -> bytes:
    return bytes(ffi.buffer(ptr, n)) if n else b""


@st.composite
def requests(draw) -> InferenceRequest:
    text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                   max_size=20)
    tensors = draw(st.lists(st.builds(
        Tensor, name=text, dtype=st.integers(0, 255),
        shape=st.lists(U32, max_size=4), data=st.binary(max_size=40)), max_size=4))
    return InferenceRequest(
        session_id=draw(text), sequence=draw(U64), generation=draw(U64),
        retry_count=draw(U32), retry_reason=draw(st.integers(0, 255)),
        origin_stamp=Time(sec=draw(st.integers(-2**31, 2**31 - 1)), nanosec=draw(U32)),
        deadline=Time(sec=draw(st.integers(-2**31, 2**31 - 1)), nanosec=draw(U32)),
        remaining_nfe=draw(U32), model_digest=draw(text), observation_dim=draw(U32),
        action_dim=draw(U32), action_horizon=draw(U32),
        observation=draw(st.lists(st.floats(width=32, allow_nan=False), max_size=8)),
        noise_seed=draw(U64), inputs=tensors,
        prefix_actions=draw(st.lists(st.floats(width=32, allow_nan=False), max_size=8)),
        prefix_start=Time(sec=draw(st.integers(-2**31, 2**31 - 1)), nanosec=draw(U32)),
        action_period=Duration(sec=draw(st.integers(-2**31, 2**31 - 1)), nanosec=draw(U32)),
        client_id=draw(text))


@settings(max_examples=300, deadline=None)
@given(requests())
def test_the_cdr_reader_reads_every_field_rclpy_serializes(msg):
    cdr = serialize_message(msg)  # the view points into these bytes: keep them alive
    rc, v = _parse(cdr)
    assert rc == 0
    assert _bytes(v.session_id, v.session_id_len) == msg.session_id.encode()
    assert (v.sequence, v.generation, v.retry_count, v.retry_reason) == (
        msg.sequence, msg.generation, msg.retry_count, msg.retry_reason)
    assert (v.origin_stamp_sec, v.origin_stamp_nanosec) == (
        msg.origin_stamp.sec, msg.origin_stamp.nanosec)
    assert (v.deadline_sec, v.deadline_nanosec) == (msg.deadline.sec, msg.deadline.nanosec)
    assert v.remaining_nfe == msg.remaining_nfe
    assert _bytes(v.model_digest, v.model_digest_len) == msg.model_digest.encode()
    assert (v.observation_dim, v.action_dim, v.action_horizon) == (
        msg.observation_dim, msg.action_dim, msg.action_horizon)
    obs = np.frombuffer(_bytes(v.observation, 4 * v.observation_len), np.float32)
    assert obs.tolist() == np.asarray(msg.observation, np.float32).tolist()
    assert v.noise_seed == msg.noise_seed and v.inputs_len == len(msg.inputs)
    assert v.tensor_bytes == sum(len(t.data) for t in msg.inputs)
    for t, tv in zip(msg.inputs, v.inputs, strict=False):
        assert _bytes(tv.name, tv.name_len) == t.name.encode() and tv.dtype == t.dtype
        shape = _bytes(tv.shape, 4 * tv.shape_len)
        assert list(struct.unpack(f"<{tv.shape_len}I", shape)) == list(t.shape)
        assert _bytes(tv.data, tv.data_len) == bytes(t.data)
    prefix = np.frombuffer(_bytes(v.prefix_actions, 4 * v.prefix_actions_len),
                           np.float32)
    assert prefix.tolist() == np.asarray(msg.prefix_actions, np.float32).tolist()
    assert (v.prefix_start_sec, v.prefix_start_nanosec) == (
        msg.prefix_start.sec, msg.prefix_start.nanosec)
    assert (v.action_period_sec, v.action_period_nanosec) == (
        msg.action_period.sec, msg.action_period.nanosec)
    assert _bytes(v.client_id, v.client_id_len) == msg.client_id.encode()


@settings(max_examples=300, deadline=None)
@given(requests(), st.data())
def test_truncated_bytes_never_parse_and_nothing_is_read_past_the_end(msg, data):
    cdr = serialize_message(msg)
    cut = data.draw(st.integers(0, len(cdr) - 1))
    # a copy of exactly `cut` bytes: under ASan (make sanitize) a read past it would fail
    short = bytes(cdr[:cut])
    assert _parse(short)[0] == -1 or len(cdr) - cut < 4  # Fast CDR pads to 4 bytes at the end


def test_big_endian_and_other_encapsulations_are_not_parsed():
    cdr = bytearray(serialize_message(InferenceRequest(session_id="a")))
    assert _parse(bytes(cdr))[0] == 0
    for header in (b"\x00\x00", b"\x00\x07", b"\x01\x01"):
        cdr[0:2] = header
        assert _parse(bytes(cdr))[0] == -1


# ---- the same decision for every message --------------------------------------------------------


def _corpus(n: int, seed: int, mix: str):
    model = SMALL
    builder = RequestBuilder(_contract_of(model))
    factory = ProbeFactory(builder, seed, 16)
    for i in range(n):
        probe = factory.make(i, mix)
        yield probe.kind, (probe.payload if isinstance(probe.payload, bytes)
                           else serialize_message(probe.payload))


def _contract_of(model):
    from flowedge_relay_tools.stress import Contract

    return Contract.of(model)


@pytest.mark.parametrize("mix", ["mixed", "flood"])
def test_the_c_intake_decides_the_stress_corpus_as_the_rclpy_intake(mix):
    """Every message of the campaign's corpus (valid, hostile, hostile-but-valid, raw CDR):
    the same reason or decision, in the same order, on twin cores (admission on, a small queue,
    so capacity, staleness and expiry all happen)."""
    pair = Pair(policy_mod.load(default_model_path()), nfe_ns=2 * MS)
    kinds: dict[str, set] = {}
    try:
        for kind, cdr in _corpus(1500, seed=11, mix=mix):
            now_mono, now_ros = _now()
            py, c = pair.both(cdr, now_mono, now_ros)
            if py is None:  # rclpy cannot deserialize it: dropped there, counted here
                assert c == ("request_malformed", None), kind
                continue
            assert c == py, (kind, c, py)
            kinds.setdefault(kind, set()).add(py[0] or py[1].name)
    finally:
        pair.close()
    outcomes = set().union(*kinds.values())
    assert len(kinds) >= (12 if mix == "mixed" else 8)  # the corpus's kinds were exercised
    assert "ACCEPTED" in outcomes and len(outcomes) >= (8 if mix == "mixed" else 5), outcomes


def _vision_request(seed: int, **fields) -> InferenceRequest:
    return build_request(VISION, time.time_ns(),
                         arrays=scene_inputs(served_model(VISION), seed), **fields)


CHANGES = ["valid", *TENSOR_CHANGES]


def test_the_c_intake_takes_a_package_request_into_the_same_staging_bytes():
    """The vision package: each kind of tensor failure gets the same reason, and a valid
    request's normalized image and state land bit for bit where the rclpy intake puts them."""
    pair = Pair(VISION, max_request_bytes=1 << 20, nfe_ns=0)
    seen = set()
    try:
        for i in range(3 * len(CHANGES)):
            change = CHANGES[i % len(CHANGES)]
            req = _vision_request(i, session_id=f"s{i}", sequence=i)
            if change != "valid":
                broken_tensors(req, change)
            py, c = pair.both(serialize_message(req), *_now())
            assert c == py, (change, c, py)
            seen.add(py[0])
            if change == "valid":
                assert py == (None, Decision.ACCEPTED)
            # after a failure both staging slots hold the tensors copied before it, the same
            py_bytes, c_bytes = pair.staged()
            if change in ("valid",):
                continue  # the accepted slot moved on; compare the queued one below
            assert py_bytes == c_bytes, change
        for slot in range(pair.c_core.slots):  # every queued request's payload, bit for bit
            assert bytes(pair.py_core.payload_view(slot)) == bytes(pair.c_core.payload_view(slot))
    finally:
        pair.close()
    assert seen >= {None, "input_shape", "input_missing", "input_unexpected", "input_duplicate",
                    "input_dtype", "input_bytes", "input_not_finite", "request_too_large",
                    "observation_length"}


RTC_POLICY = policy_mod.load(policy_mod.rtc_policy_path())
#: a prefix request's variations (docs/design.md §5.4's validation), each a change to a valid one
PREFIX_CHANGES = {
    "valid": {},
    "one row": {"rows": 1},
    "whole horizon": {"rows": 8},
    "window passed": {"start_s": -10.0},
    "window too short": {"rows": 1, "start_s": 0.0, "period": Duration(nanosec=MS)},
    "part of a row": {"extra": 1},
    "above the horizon": {"rows": 9},
    "nan": {"bad": float("nan")},
    "inf": {"bad": float("-inf")},
    "period zero": {"period": Duration()},
    "period negative": {"period": Duration(sec=-1)},
    "period nanosec": {"period": Duration(nanosec=1_000_000_000)},
    "start invalid": {"start": Time(sec=-5)},
}


def _prefix_request(i: int, now_ros: int, *, rows: int = 4, extra: int = 0, bad=None,
                    start_s: float = 0.05, start: Time | None = None,
                    period: Duration | None = None, policy=RTC_POLICY) -> bytes:
    g = np.random.default_rng(i)
    prefix = g.standard_normal(2 * rows + extra).astype(np.float32)
    if bad is not None:
        prefix[len(prefix) // 2] = bad
    obs = g.standard_normal(policy.inputs[0].shape[0]).astype(np.float32)
    req = build_request(policy, now_ros, session_id=f"s{i}", sequence=i, remaining_nfe=2,
                        arrays={"observation": obs})
    req.prefix_actions = prefix.tolist()
    req.prefix_start = start or ros_time(now_ros + int(start_s * 1e9))
    req.action_period = period or Duration(nanosec=20 * MS)
    return serialize_message(req)


@pytest.mark.parametrize("served", ["training_time", "off", "single file inpaint"])
def test_a_prefix_is_decided_and_staged_alike_by_both_intakes(served):
    """Real-time chunking's prefix: the same reason or decision from both intakes for each kind
    of prefix, and a valid prefix's rows bit for bit in the same place of the staging slot.
    With rtc off every prefix is prefix_unsupported; a plain request is served as before. A
    single .onnx file with inpaint: its slots hold the prefix alone, decided the same way."""
    policy, rtc = RTC_POLICY, (RTC_POLICY.rtc if served != "off" else None)
    if served == "single file inpaint":
        policy = policy_mod.load(default_model_path())
        rtc = RtcSpec("inpaint", policy.action_horizon - 1)
    pair = Pair(policy, rtc=rtc, nfe_ns=MS, queue_capacity=64)
    seen = {}
    try:
        for i in range(2 * len(PREFIX_CHANGES)):
            change = list(PREFIX_CHANGES)[i % len(PREFIX_CHANGES)]
            now_mono, now_ros = _now()
            py, c = pair.both(_prefix_request(i, now_ros, **PREFIX_CHANGES[change],
                                              policy=policy), now_mono, now_ros)
            assert c == py, (change, c, py)
            seen[change] = py[0] or py[1].name
        plain = build_request(policy, time.time_ns(), session_id="plain",
                              arrays={"observation": np.zeros(policy.inputs[0].shape[0],
                                                              np.float32)})
        py, c = pair.both(serialize_message(plain), *_now())
        assert c == py == (None, Decision.ACCEPTED)
        for slot in range(pair.c_core.slots):  # every queued request's payload, bit for bit
            assert bytes(pair.py_core.payload_view(slot)) == bytes(pair.c_core.payload_view(slot))
    finally:
        pair.close()
    if served == "off":
        assert set(seen.values()) == {"prefix_unsupported"}
        return
    assert seen == {
        "valid": "ACCEPTED", "one row": "ACCEPTED", "whole horizon": "ACCEPTED",
        "window passed": "EXPIRED", "window too short": "REJECTED_DEADLINE",
        "part of a row": "prefix_shape", "above the horizon": "prefix_shape",
        "nan": "prefix_not_finite", "inf": "prefix_not_finite",
        "period zero": "action_period_invalid", "period negative": "action_period_invalid",
        "period nanosec": "action_period_invalid", "start invalid": "time_invalid"}


# ---- normalization: numpy's arithmetic, for every dtype -----------------------------------------


WIRE = {0: np.float32, 1: np.uint8, 2: np.int64, 3: np.int32, 4: np.float16, 5: np.bool_}


def _one_input_intake(dtype: int, shape: tuple[int, ...], scale, shift):
    count = int(np.prod(shape))
    core = Core(CoreConfig(obs_dim=0, action_len=1, payload_bytes=4 * count + 64))
    cfg = ffi.new("struct fer_intake_config *")
    cfg.model_ok, cfg.max_nfe, cfg.max_request_bytes = 1, 4, 1 << 20
    cfg.digest[0:1], cfg.digest_len = b"d", 1
    cfg.n_inputs = 1
    spec = cfg.inputs[0]
    spec.name[0:1], spec.name_len, spec.dtype = b"x", 1, dtype
    spec.ndim = len(shape)
    for k, d in enumerate(shape):
        spec.shape[k] = d
    spec.count = count
    keep = []
    if scale is not None:
        keep = [np.ascontiguousarray(scale, np.float32), np.ascontiguousarray(shift, np.float32)]
        spec.scale = ffi.from_buffer("float[]", keep[0])
        spec.shift = ffi.from_buffer("float[]", keep[1])
    out = ffi.new("struct fer_intake **")
    assert lib.fer_intake_create(core.ptr, cfg, out) == lib.FER_OK
    return core, ffi.gc(out[0], lib.fer_intake_destroy), keep


def _tensor_request(dtype: int, shape, data: bytes) -> bytes:
    return serialize_message(InferenceRequest(
        session_id="n", model_digest="d", remaining_nfe=1,
        inputs=[Tensor(name="x", dtype=dtype, shape=list(shape), data=data)]))


finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(WIRE)), st.integers(1, 24), st.data())
def test_normalization_is_numpys_arithmetic_for_every_dtype(dtype, n, data):
    wire = WIRE[dtype]
    if wire is np.bool_:
        values = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), wire)
    elif np.issubdtype(wire, np.integer):
        info = np.iinfo(wire)
        values = np.array(data.draw(st.lists(st.integers(int(info.min), int(info.max)),
                                             min_size=n, max_size=n)), wire)
    else:
        width = 16 if wire is np.float16 else 32
        values = np.array(data.draw(st.lists(st.floats(width=width, allow_nan=False,
                                                       allow_infinity=False),
                                             min_size=n, max_size=n)), wire)
    scale = np.array(data.draw(st.lists(finite32, min_size=n, max_size=n)), np.float32)
    shift = np.array(data.draw(st.lists(finite32, min_size=n, max_size=n)), np.float32)
    core, intake, _keep = _one_input_intake(dtype, (n,), scale, shift)
    try:
        decision = ffi.new("int32_t *")
        cdr = _tensor_request(dtype, (n,), values.tobytes())
        reason = lib.fer_intake_decide(intake, cdr, len(cdr), 1, 10**18, decision)
        assert reason == 0 and decision[0] == Decision.ACCEPTED
        got = np.frombuffer(bytes(core.payload_view(0))[:4 * n], np.float32)
        want = np.zeros(n, np.float32)
        with np.errstate(all="ignore"):
            policy_mod.Normalization("mean_std", scale, shift, {}).apply(values, want)
        assert got.tobytes() == want.tobytes(), (values, scale, shift, got, want)
    finally:
        core.close()


# ---- what only the C intake sees ----------------------------------------------------------------


def test_the_core_refusing_a_validated_request_is_counted_and_the_intake_goes_on():
    """Defense in depth: an intake allowing more NFE than the core (a validation gap, made on
    purpose) counts core_refused and keeps deciding."""
    pair = Pair(policy_mod.load(default_model_path()), max_nfe=16, core_max_nfe=4)
    try:
        builder = RequestBuilder(_contract_of(SMALL))
        too_many = serialize_message(builder.request(session_id="a", sequence=1, remaining_nfe=9))
        fine = serialize_message(builder.request(session_id="a", sequence=2, remaining_nfe=2))
        assert pair.c.decide(too_many, *_now()) == ("core_refused", None)
        assert pair.c.decide(fine, *_now()) == (None, Decision.ACCEPTED)
        assert pair.c.discarded()["core_refused"] == 1 and pair.c.received == 2
    finally:
        pair.close()


def test_session_ids_are_keyed_as_rclpy_decodes_them():
    """rosidl decodes strings with errors="replace", and the rclpy intake keys a session by that
    text: invalid UTF-8 must give the C intake the same session id bytes (and length limit)."""
    builder = RequestBuilder(_contract_of(SMALL))
    pair = Pair(policy_mod.load(default_model_path()))
    try:
        for i, raw in enumerate([b"\xed\xa0\x80", b"\xf0\x90\x80a", b"\xe1\x80\xe1\x80\x80",
                                 b"\xff" * 21, b"\xff" * 22, b"ok\xc2"]):
            req = builder.request(session_id="x" * len(raw), sequence=i)
            cdr = bytearray(serialize_message(req))
            at = cdr.find(b"x" * len(raw))
            cdr[at:at + len(raw)] = raw
            py, c = pair.both(bytes(cdr), *_now())
            assert c == py, raw
        assert REASON_KEYS[lib.FER_REASON_SESSION_ID_TOO_LONG] == Reason.SESSION_ID_TOO_LONG.value
    finally:
        pair.close()


def test_client_ids_are_charged_alike_by_both_intakes():
    """docs/design.md §7.1: both intakes charge a request to the same client (its client_id as
    rclpy decodes it, or its session id when empty) and discard a client_id over the limit as
    client_id_too_long; the outcome echoes the client charged."""
    builder = RequestBuilder(_contract_of(SMALL))
    pair = Pair(policy_mod.load(default_model_path()), fair_share=1)
    try:
        for i, raw in enumerate([b"", b"robot-b", b"\xed\xa0\x80", b"\xff" * 21, b"\xff" * 22,
                                 b"c" * 64, b"c" * 65]):
            req = builder.request(session_id=f"s{i}", sequence=i)
            req.client_id = "y" * len(raw)
            cdr = bytearray(serialize_message(req))
            if raw:
                at = cdr.find(b"y" * len(raw))
                cdr[at:at + len(raw)] = raw
            py, c = pair.both(bytes(cdr), *_now())
            assert c == py, raw
        expect = {b"s0", b"robot-b", "\ufffd".encode() * 3, "\ufffd".encode() * 21, b"c" * 64}
        for core in (pair.py_core, pair.c_core):
            assert {k.client_id for k in core.clients_snapshot()} == expect
            assert {o.client_id for o in core.pop_outcomes()} <= expect
        assert pair.c.discarded()["client_id_too_long"] == 2
        assert pair.validator.discarded[Reason.CLIENT_ID_TOO_LONG] == 2
    finally:
        pair.close()


def test_reason_keys_are_validations_keys():
    assert set(REASON_KEYS[1:]) == {r.value for r in Reason}


# ---- over DDS ------------------------------------------------------------------------------------


@pytest.mark.ros
def test_over_dds_a_message_over_the_size_limit_is_counted_and_the_next_is_answered():
    """A message larger than the intake's buffer (max_request_bytes + FER_INTAKE_SLACK_BYTES)
    is taken into a buffer of its own, freed and counted as request_too_large; the intake goes
    on with the next message."""
    from ros_helpers import running_relay

    with running_relay(max_request_bytes=1024) as h:
        assert h.node.relay.intake_loop == "native", h.node.relay.intake_note
        big = h.request(session_id="big", sequence=1)
        big.observation = [0.0] * (lib.FER_INTAKE_SLACK_BYTES // 4 + 1024)
        h.send(big)
        h.send(h.request(session_id="ok", sequence=2))
        answer = h.answer_for(2)
        counts = h.node.relay.counters()
    assert answer is not None and answer.code == 0
    assert counts.received == 2 and counts.discarded["request_too_large"] == 1


@pytest.mark.ros
@pytest.mark.parametrize(("params", "loop", "note"), [
    ({}, "native", None),
    ({"intake_loop": "python"}, "python", "intake_loop: python requested"),
    ({"use_sim_time": True}, "python", "use_sim_time"),
])
def test_the_workers_status_says_which_intake_runs_and_why(params, loop, note):
    from ros_helpers import running_relay, status_values, wait_for

    with running_relay(**params) as h:
        h.send(h.request(session_id="a", sequence=1))
        assert h.answer_for(1) is not None
        if "use_sim_time" in params:  # no /clock here: the diagnostics timer never fires
            relay = h.node.relay
            values = {"intake_loop": relay.intake_loop, "intake_loop_note": relay.intake_note}
        else:
            assert wait_for(lambda: h.latest_status("workers") is not None, 10)
            values = status_values(h.latest_status("workers"))
    assert values["intake_loop"] == loop
    if note:
        assert note in values["intake_loop_note"]
    else:
        assert "intake_loop_note" not in values
