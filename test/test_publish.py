# SPDX-License-Identifier: Apache-2.0
"""The publisher thread's C loop (csrc/fer_publish.h, flowedge_relay/publisher.py).

fer_action_cdr's bytes are checked against rclpy's own (de)serialization of the message the
Python loop builds, over random outcomes; the loop itself runs over a real rcl publisher (a
subscriber receives what it published), keeps counting when rcl refuses, and over DDS a relay
on each loop answers the same requests with the same messages.
"""

from __future__ import annotations

import threading
import time
from functools import partial

import numpy as np
import pytest
from core_helpers import MS, make_core, request
from flowedge_relay_msgs.msg import ActionMessage
from hypothesis import given, settings
from hypothesis import strategies as st
from rclpy.node import Node
from rclpy.serialization import deserialize_message, serialize_message
from ros_helpers import ros_context, running_relay, spinning, status_values, wait_for

from flowedge_relay.core import Code, Core, Outcome, ffi, lib
from flowedge_relay.model import default_model_path, load_model
from flowedge_relay.publisher import ActionPublisher, action_message
from flowedge_relay.rcl_abi import load_serializer, publish_functions
from flowedge_relay.relay import Host
from flowedge_relay.timebase import ROS_TIME_MAX_NS

MODEL = load_model(default_model_path())  # policy_small: the messages' digest and dims
ACT = MODEL.action_len
U64 = st.integers(0, 2**64 - 1)
U32 = st.integers(0, 2**32 - 1)


_core = partial(make_core, obs_dim=MODEL.obs_dim, action_len=ACT)


def _publisher(core: Core, model=MODEL):
    load_serializer()  # fer_action_cdr's bytes: rmw_serialize of the generated struct
    return ActionPublisher._create(core, model)


def _c_bytes(pub, o: Outcome, stamp_ns: int) -> bytes:
    c = ffi.new("struct fer_outcome *")
    sid = o.session_id
    c.session_id[0:len(sid)] = sid
    c.session_id_len, c.code, c.lane = len(sid), int(o.code), o.lane
    c.retry_count, c.retry_reason = o.retry_count, o.retry_reason
    c.remaining_nfe, c.nfe_done = o.remaining_nfe, o.nfe_done
    c.has_actions = o.actions is not None
    c.sequence, c.generation, c.deadline_ros_ns = o.sequence, o.generation, o.deadline_ros_ns
    c.queue_ns, c.compute_ns = o.queue_ns, o.compute_ns
    c.arrival_ns, c.finish_ns = o.arrival_ns, o.finish_ns
    c.client_id[0:len(o.client_id)] = o.client_id  # §7.1: echoed, with the reject reason
    c.client_id_len, c.reject_reason = len(o.client_id), o.reject_reason
    act = ffi.NULL if o.actions is None else ffi.from_buffer("float[]", o.actions)
    cap = lib.fer_action_cdr_max(pub)
    buf = ffi.new("uint8_t[]", cap)
    n = lib.fer_action_cdr(pub, c, act, stamp_ns, buf, cap)
    assert n > 0
    return bytes(ffi.buffer(buf, n))


@st.composite
def outcomes(draw) -> Outcome:
    code = draw(st.sampled_from(list(Code)))
    # a ROS string never holds NUL (rclpy reads C strings), so no session id does
    text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
                   max_size=20)  # fmt: skip
    sid = draw(text).encode("utf-8")[: lib.FER_SESSION_ID_MAX]
    sid = sid.decode("utf-8", "ignore").encode("utf-8")  # a cut may split a character
    cid = draw(text).encode("utf-8")[: lib.FER_SESSION_ID_MAX]
    cid = cid.decode("utf-8", "ignore").encode("utf-8")
    actions = None
    if code == Code.INFERENCE:
        actions = np.asarray(draw(st.lists(st.floats(width=32, allow_nan=False),
                                           min_size=ACT, max_size=ACT)), np.float32)  # fmt: skip
    return Outcome(
        code=code, session_id=sid, sequence=draw(U64), generation=draw(U64),
        retry_count=draw(U32), retry_reason=draw(st.integers(0, 255)),
        deadline_ros_ns=draw(st.one_of(st.just(0), U64, st.integers(0, 2 * ROS_TIME_MAX_NS))),
        remaining_nfe=draw(U32), nfe_done=draw(U32), queue_ns=draw(U64), compute_ns=draw(U64),
        arrival_ns=0, finish_ns=0, lane=-1, actions=actions, client_id=cid,
        reject_reason=draw(st.integers(0, 2)),
    )  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(o=outcomes(), stamp=st.integers(-(2**63), 2**63 - 1),
       with_model=st.booleans())  # fmt: skip
def test_cdr_is_the_message_the_python_loop_builds(o, stamp, with_model):
    model = MODEL if with_model else None
    with _core() as core:
        data = _c_bytes(_publisher(core, model), o, stamp)
    expected = action_message(o, min(max(stamp, 0), ROS_TIME_MAX_NS), model)
    assert deserialize_message(data, ActionMessage) == expected
    # rmw's own serialization has the same length (its padding bytes are not zeroed)
    assert len(data) == len(serialize_message(expected))


def test_cdr_refuses_a_short_buffer_and_missing_actions():
    with _core() as core:
        pub = _publisher(core)
        c = ffi.new("struct fer_outcome *")
        c.code, c.has_actions = lib.FER_INFERENCE, 1
        act = ffi.new("float[]", ACT)
        need = lib.fer_action_cdr(pub, c, act, 0, ffi.new("uint8_t[]", 4096), 4096)
        assert 0 < need <= lib.fer_action_cdr_max(pub)
        assert lib.fer_action_cdr(pub, c, act, 0, ffi.new("uint8_t[]", need), need - 1) == 0
        assert lib.fer_action_cdr(pub, c, ffi.NULL, 0, ffi.new("uint8_t[]", 4096), 4096) == 0
        c.session_id_len = lib.FER_SESSION_ID_MAX + 1
        assert lib.fer_action_cdr(pub, c, act, 0, ffi.new("uint8_t[]", 4096), 4096) == 0
    out = ffi.new("struct fer_publisher **")
    assert lib.fer_publisher_create(ffi.NULL, b"", 0, 0, 0, 0, out) == lib.FER_EINVAL
    with _core() as core:
        too_long = b"d" * (lib.FER_DIGEST_MAX + 1)
        assert lib.fer_publisher_create(core.ptr, too_long, len(too_long), 0, 0, 0,
                                        out) == lib.FER_EINVAL  # fmt: skip
        assert out[0] == ffi.NULL


def _finished(core: Core, n: int) -> None:
    """n INFERENCE outcomes in the core's rings (submitted, dispatched, stepped, finished)."""
    for seq in range(n):
        now = 1_000 * MS + seq
        core.submit(request(b"s", seq, seed=0, origin=now, obs_dim=MODEL.obs_dim), now)
        assert core.dispatch(0, now) is not None
        core.step(0, now + MS, MS)
        core.finish(0, now + 2 * MS, np.full(ACT, seq, np.float32))


@pytest.mark.ros
def test_loop_publishes_through_rcl_and_counts_latency():
    """fer_publish_run over a real rcl publisher: a subscriber gets every outcome, in order."""
    n = 5
    with ros_context() as ctx, _core() as core:
        node = Node("publish_test", context=ctx)
        got: list = []
        node.create_subscription(ActionMessage, "out", got.append, 100)
        rclpy_pub = node.create_publisher(ActionMessage, "out", 100)
        pub = _publisher(core)
        publish, reset = publish_functions()
        with spinning(node, context=ctx):
            assert wait_for(lambda: rclpy_pub.get_subscription_count() == 1)
            _finished(core, n)
            pub.stop = 1  # one pass: drain what is there, then return
            with rclpy_pub.handle:
                rc = lib.fer_publish_run(pub, publish, ffi.cast("void *", rclpy_pub.handle.pointer),
                                         reset, MS)  # fmt: skip
            assert rc == 0
            assert wait_for(lambda: len(got) == n)
        node.destroy_node()
    assert (pub.published, pub.failed) == (n, 0)
    assert [m.sequence for m in got] == list(range(n))
    assert [m.actions[0] for m in got] == [float(s) for s in range(n)]
    assert all(m.code == ActionMessage.INFERENCE and m.model_digest == MODEL.digest for m in got)
    assert pub.latency_count == n
    assert list(pub.latency_ms[0:n]) == [2.0] * n  # finish - arrival: 2 ms each


@pytest.mark.ros
def test_loop_counts_what_rcl_refuses_and_goes_on():
    """After the context is shut down rcl refuses every publish: each is counted, none is lost
    from the count, and the loop still returns."""
    with ros_context() as ctx, _core() as core:
        node = Node("publish_refused", context=ctx)
        rclpy_pub = node.create_publisher(ActionMessage, "out", 10)
        pub = _publisher(core)
        publish, reset = publish_functions()
        _finished(core, 3)
        with rclpy_pub.handle:
            pointer = ffi.cast("void *", rclpy_pub.handle.pointer)
            ctx.shutdown()
            pub.stop = 1
            assert lib.fer_publish_run(pub, publish, pointer, reset, MS) == 0
        assert core.pop_outcomes() == []  # all three were taken from the ring
    assert (pub.published, pub.failed) == (0, 3) and pub.last_error != 0


@pytest.mark.ros
@pytest.mark.parametrize("native", [True, False])
def test_loop_after_shutdown_polls_for_stop_instead_of_spinning(native):
    """Between the core's shutdown and stop (node.stop() joins the workers in between) the
    doorbell no longer blocks: the loop must poll, not spin. A SCHED_FIFO publisher spinning
    there kept its CPU's other threads (a worker being joined, one holding the GIL) off it."""
    with ros_context() as ctx, _core() as core:
        node = Node("publish_shutdown", context=ctx)
        out = ActionPublisher(Host.of(node, None), core,
                              node.create_publisher(ActionMessage, "out", 10), MODEL,
                              native=native)  # fmt: skip
        assert out.loop == ("native" if native else "python")
        thread = threading.Thread(target=out.run)
        thread.start()
        core.shutdown()
        clock = time.pthread_getcpuclockid(thread.ident)
        cpu0, wall0 = time.clock_gettime_ns(clock), time.monotonic_ns()
        time.sleep(0.5)
        cpu = time.clock_gettime_ns(clock) - cpu0
        wall = time.monotonic_ns() - wall0
        out.stop()
        thread.join(timeout=5)
        node.destroy_node()
    assert not thread.is_alive()
    assert cpu < 0.1 * wall, f"{cpu / 1e6:.1f} ms of CPU in {wall / 1e6:.0f} ms after shutdown"


def test_loop_refuses_null_arguments():
    with _core() as core:
        pub = _publisher(core)
        publish, reset = publish_functions()
        assert lib.fer_publish_run(ffi.NULL, publish, ffi.cast("void *", 1), reset, MS) < 0
        assert lib.fer_publish_run(pub, ffi.NULL, ffi.cast("void *", 1), reset, MS) < 0
        assert lib.fer_publish_run(pub, publish, ffi.NULL, reset, MS) < 0


def _answers(loop: str) -> tuple[dict, dict, np.ndarray]:
    """A relay on `loop` answers three requests (INFERENCE, REJECTED_DEADLINE, EXPIRED):
    the answers by sequence, the workers diagnostic's values, the latency window."""
    # 1 s per NFE: 2 needs 8 s of its 3 s, seconds to spare for the trip on a loaded host
    with running_relay(publisher_loop=loop, nfe_ns=1_000 * MS) as h:
        reqs = (h.request(session_id="arm", sequence=1, remaining_nfe=4, noise_seed=3,
                          deadline_ms=30_000),
                h.request(session_id="arm", sequence=2, remaining_nfe=8, deadline_ms=3_000),
                h.request(session_id="leg", sequence=3, remaining_nfe=2, deadline_ms=-5))
        h.send(*reqs)
        answers = {a.sequence: a for a in h.wait_answers(3)}
        assert [answers[r.sequence].deadline for r in reqs] == [r.deadline for r in reqs]
        values = status_values(h.latest_status("workers"))
        return answers, values, h.node.relay.serving.output.latencies_ms().copy()


def _timeless(msg: ActionMessage) -> ActionMessage:
    """The message without what depends on when it ran (stamp, deadline, queue and compute
    times; _answers checked the deadline against the request's)."""
    msg.header.stamp.sec = msg.header.stamp.nanosec = 0
    msg.deadline.sec = msg.deadline.nanosec = 0
    msg.queue_ns = msg.compute_ns = 0
    return msg


@pytest.mark.ros
def test_relay_answers_the_same_on_either_loop():
    """Over DDS: the diagnostic names the loop, and a relay on the C loop sends the messages a
    relay on the Python loop sends (every field but the timings)."""
    native, native_values, native_lat = _answers("auto")
    python, python_values, python_lat = _answers("python")
    assert native_values["publisher_loop"] == "native"
    assert python_values["publisher_loop"] == "python"
    assert [native[s].code for s in (1, 2, 3)] == [
        ActionMessage.INFERENCE, ActionMessage.REJECTED_DEADLINE, ActionMessage.EXPIRED]
    assert all(a.header.stamp.sec > 0 for a in (*native.values(), *python.values()))
    assert {s: _timeless(a) for s, a in native.items()} == {
        s: _timeless(a) for s, a in python.items()}
    assert len(native[1].actions) == ACT and native[1].model_digest == MODEL.digest
    assert native_lat.size == python_lat.size == 1 and native_lat[0] > 0


@pytest.mark.ros
def test_simulated_time_keeps_the_rclpy_loop():
    """On simulated time the stamp must be the node's clock, which the C loop cannot read: the
    relay publishes through rclpy and says why."""
    with running_relay(use_sim_time=True) as h:  # no /clock: its timers never fire
        values = h.node.relay.loop_values()  # what the workers status would carry
    assert values["publisher_loop"] == "python"
    assert "use_sim_time" in values["publisher_loop_note"]
