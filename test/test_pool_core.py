# SPDX-License-Identifier: Apache-2.0
"""A relay pool's C mechanism (csrc/fer_pool.h, core.Pool, the C intake with a pool).

The ranking and the standby table are checked against test/pool_reference.py over random
operations; the intake's not_owner drop, the successor's standby, answers removing entries,
expiry, and the takeover answering each kept request exactly once (admitted, or EXPIRED) run on
a real core through the real C intake, with explicit clocks.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
from flowedge_relay_msgs.msg import ActionMessage, InferenceRequest, PoolSpill
from hypothesis import given, settings
from hypothesis import strategies as st
from pool_reference import (
    Bound,
    Member,
    RefStandby,
    fnv1a64,
    key_of,
    mix64,
    ranking,
    spill_target,
)
from rclpy.node import Node
from rclpy.serialization import deserialize_message, serialize_message

from flowedge_relay.core import (
    Code,
    Core,
    CoreConfig,
    Decision,
    InvalidArgument,
    Pool,
    PoolRole,
    PoolViewMember,
    RejectReason,
    RingFull,
    ffi,
    lib,
    pool_hash,
    pool_key,
)
from flowedge_relay.intake import NOT_OWNER, SPILLED, STANDBY, NativeIntake, pool_owns
from flowedge_relay.model import default_model_path, load_model
from flowedge_relay.publisher import ActionPublisher, action_message
from flowedge_relay.rcl_abi import load_serializer, load_wire
from flowedge_relay.relay import Host
from flowedge_relay.timebase import ros_time
from flowedge_relay.validation import ModelContract
from flowedge_relay_tools.harness import build_request

MS = 1_000_000
LEASE = 500 * MS
SMALL = load_model(default_model_path())
DIGEST = SMALL.digest
MONO = 10**12  # the intake's monotonic clock in these tests
ROS = 1_700_000_000 * 10**9  # and its ROS clock, at the same instant


# the C paths read and write messages through the .msg's generated type support
load_wire()
load_serializer()


def members(*keys: int, **window) -> list[PoolViewMember]:
    return [PoolViewMember(k, (DIGEST,), **window) for k in keys]


def session_where(pool: Pool, role: PoolRole, origin: int = ROS, digest: str = DIGEST) -> str:
    """A session id this pool has `role` for, under its current view."""
    for i in range(10_000):
        sid = f"robot-{i}"
        if pool.role(sid.encode(), digest, origin) == role:
            return sid
    raise AssertionError(f"no session with role {role!r}")


def request_cdr(sid: str, seq: int = 1, now_ros: int = ROS, **fields) -> bytes:
    return serialize_message(build_request(SMALL, now_ros, session_id=sid, sequence=seq,
                                           **fields))


def answer_cdr(sid: str, seq: int, relay_id: str = "owner", code: int = Code.INFERENCE) -> bytes:
    return serialize_message(ActionMessage(session_id=sid, sequence=seq, relay_id=relay_id,
                                           code=code, actions=[0.5] * SMALL.action_len))


class Member_:
    """This relay as a pool member: a pool, a core, the C intake deciding through both."""

    def __init__(self, relay_id: str = "self-1-00000001", queue_capacity: int = 8,
                 **pool_args) -> None:
        self.pool = Pool(relay_id, lease_ns=LEASE, **pool_args)
        self.core = Core(CoreConfig(obs_dim=SMALL.obs_dim, action_len=SMALL.action_len,
                                    queue_capacity=queue_capacity, max_nfe=16))
        contract = ModelContract(DIGEST, SMALL.obs_dim, SMALL.action_dim, SMALL.action_horizon)
        self.intake = NativeIntake(self.core, contract, 16, 1 << 20, pool=self.pool)

    def decide(self, cdr: bytes, dt_ms: float = 0):
        dt = int(dt_ms * MS)
        return self.intake.decide(cdr, MONO + dt, ROS + dt)

    def service(self, dt_ms: float = 0) -> int:
        dt = int(dt_ms * MS)
        return self.intake.service_pool(MONO + dt, ROS + dt)

    def books(self) -> tuple[int, int]:
        """(decided + not_owner, received + taken_over_requests + held_requests_decided): equal
        once nothing is held, the books a bench reads off RelayStats."""
        c = self.pool.counters()
        return (self.core.stats().submitted + c.not_owner,
                self.intake.received + c.taken_over_requests + c.held_requests_decided)


# ---- hashing and ranking ----------------------------------------------------------------------


def test_hashes_are_fnv1a64_and_splitmix64():
    # published FNV-1a 64 vectors, and splitmix64's finaliser of its first state increment
    assert pool_hash(b"") == fnv1a64(b"") == 0xCBF29CE484222325
    assert pool_hash(b"a") == 0xAF63DC4C8601EC8C
    assert pool_hash("foobar") == 0x85944171F73967E8
    assert lib.fer_pool_mix64(0x9E3779B97F4A7C15) == mix64(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF
    assert pool_key("relay-a") == key_of("relay-a") == Pool("relay-a").key


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=64, unique=True),
       sid=st.binary(min_size=1, max_size=64), origin=st.integers(0, 100),
       data=st.data())  # fmt: skip
def test_owner_and_successor_match_the_reference(keys, sid, origin, data):
    view = [Member(k, tuple(data.draw(st.sets(st.sampled_from("abc"), max_size=2))),
                   data.draw(st.sampled_from([0, 10, 50])), data.draw(st.sampled_from([0, 60, 90])))
            for k in keys]  # fmt: skip
    digest = data.draw(st.sampled_from("abc"))
    pool = Pool("probe")
    pool.set_view([PoolViewMember(m.key, m.digests, m.owning_from, m.owning_until)
                   for m in view])
    expected = ranking(view, sid, digest, origin)[:2] + [0, 0]
    assert pool.ranking(sid, digest, origin) == (expected[0], expected[1])


def test_sessions_spread_evenly_over_the_members():
    pool = Pool("probe")
    keys = [pool_key(f"relay-{i}") for i in range(16)]
    pool.set_view([PoolViewMember(k) for k in keys])
    owned = dict.fromkeys(keys, 0)
    for s in range(16 * 1000):
        owned[pool.ranking(f"session-{s}".encode(), DIGEST, 0)[0]] += 1
    ratio = max(owned.values()) / statistics.mean(owned.values())
    assert ratio <= 1.15, owned
    # and a hash that ignored the session would fail the same check
    assert max(owned.values()) < 16 * 1000


def test_one_failure_moves_only_the_dead_members_sessions():
    pool = Pool("probe")
    keys = [pool_key(f"relay-{i}") for i in range(8)]
    pool.set_view([PoolViewMember(k) for k in keys])
    sids = [f"s{i}".encode() for i in range(2000)]
    before = {s: pool.ranking(s, DIGEST, 0) for s in sids}
    pool.set_view([PoolViewMember(k) for k in keys[1:]])
    for s in sids:
        owner, successor = before[s]
        now = pool.ranking(s, DIGEST, 0)[0]
        # a dead owner's session goes to its successor; every other session stays put
        assert now == (successor if owner == keys[0] else owner)


def test_cutover_windows_decide_by_the_requests_origin_stamp():
    me = Member_()
    other = pool_key("other")
    t_join = ROS + 1000 * MS
    me.pool.set_view(members(other) + [PoolViewMember(me.pool.key, (DIGEST,), t_join)])
    # find a session this member owns once it counts
    me.pool.set_view(members(other, me.pool.key))
    sid = session_where(me.pool, PoolRole.OWNER)
    me.pool.set_view(members(other) + [PoolViewMember(me.pool.key, (DIGEST,), t_join)])
    assert me.pool.role(sid.encode(), DIGEST, t_join - 1) == PoolRole.OTHER
    assert me.pool.role(sid.encode(), DIGEST, t_join) == PoolRole.OWNER
    # a drain: owning_until bounds it the same way, at every member alike
    me.pool.set_view(members(other) + [PoolViewMember(me.pool.key, (DIGEST,), 0, t_join)])
    assert me.pool.role(sid.encode(), DIGEST, t_join - 1) == PoolRole.OWNER
    assert me.pool.role(sid.encode(), DIGEST, t_join) == PoolRole.OTHER
    # a digest no member serves: nobody owns it, so it is decided here as by a single relay
    assert me.pool.role(sid.encode(), "sha256:none", ROS) == PoolRole.UNOWNED


def test_a_view_refuses_repeated_keys_and_too_many_members():
    pool = Pool("probe")
    with pytest.raises(InvalidArgument):
        pool.set_view([PoolViewMember(1), PoolViewMember(1)])
    with pytest.raises(InvalidArgument):
        pool.set_view([PoolViewMember(k + 1) for k in range(lib.FER_POOL_MEMBERS_MAX + 1)])
    with pytest.raises(InvalidArgument):
        pool.set_view([PoolViewMember(1, tuple(f"d{i}" for i in range(9)))])


# ---- the intake with a pool -------------------------------------------------------------------


def test_not_owner_is_dropped_before_any_copy_and_counted():
    me = Member_()
    owner, successor = pool_key("a"), pool_key("b")
    me.pool.set_view(members(owner, successor, me.pool.key))
    sid = session_where(me.pool, PoolRole.OTHER)
    slot = me.core.staging_slot()
    view = me.core.payload_view(slot)
    assert me.decide(request_cdr(sid)) == (NOT_OWNER, None)
    c = me.pool.counters()
    assert (c.not_owner, c.standby_stored, c.standby_entries) == (1, 0, 0)
    assert me.core.stats().submitted == 0 and me.intake.received == 1
    assert me.core.staging_slot() == slot and not view.any()
    # the owner's own request goes the whole way, as without a pool
    mine = session_where(me.pool, PoolRole.OWNER)
    assert me.decide(request_cdr(mine)) == (None, Decision.ACCEPTED)
    assert me.pool.counters().owned_sessions == 1


def test_the_intake_decides_each_request_against_the_view_and_window_in_force():
    """The intake remembers a session's ranking per view: a new view, or an origin stamp before
    a member's owning_from, is decided afresh, never from what was remembered."""
    me = Member_()
    other = pool_key("other")
    me.pool.set_view(members(other, me.pool.key, pool_key("third")))
    sid = session_where(me.pool, PoolRole.OTHER)
    assert me.decide(request_cdr(sid, 1)) == (NOT_OWNER, None)
    assert me.decide(request_cdr(sid, 2)) == (NOT_OWNER, None)  # remembered
    me.pool.set_view(members(me.pool.key))  # the others leave: this member owns every session
    assert me.decide(request_cdr(sid, 3)) == (None, Decision.ACCEPTED)
    # this member joins at t_join: a request first issued before that is the other's alone
    t_join = ROS + 10 * MS
    me.pool.set_view(members(other) + [PoolViewMember(me.pool.key, (DIGEST,), t_join)])
    mine = session_where(me.pool, PoolRole.OWNER, origin=t_join)
    assert me.decide(request_cdr(mine, 1, now_ros=ROS)) == (NOT_OWNER, None)
    assert me.decide(request_cdr(mine, 2, now_ros=t_join)) == (None, Decision.ACCEPTED)
    assert me.decide(request_cdr(mine, 3, now_ros=ROS)) == (NOT_OWNER, None)


def _expected_drop(view: list[Member], me: int, sid: bytes) -> object:
    """What the C intake's first key is for a request of `sid`: the reference ranking's role."""
    ranked = ranking(view, sid, DIGEST, ROS)
    return STANDBY if ranked[1] == me else None if ranked[0] == me else NOT_OWNER


def _view_of(me: Member_, *others: str) -> list[Member]:
    view = [Member(me.pool.key, (DIGEST,))] + [Member(pool_key(o), (DIGEST,)) for o in others]
    me.pool.set_view(members(*(m.key for m in view)))
    return view


def test_the_intakes_memo_of_sessions_never_lends_one_sessions_ranking_to_another():
    """The C intake remembers each session's id bytes, hash and ranking in 4,096 slots: with more
    sessions than slots (so they share slots), each request, first seen or remembered, goes to
    the reference ranking's owner, under the view in force."""
    me = Member_(standby_entries=64)
    sids = [f"robot-{i:05d}".encode() for i in range(6000)] + [
        b"", b"r", b"ro", b"rob1", b"robot", b"x" * 40, b"y" * 41, b"z" * 90]
    seq = 0
    for others in (("a", "b"), ("a", "b"), ("a", "c")):  # the last: a new view
        view = _view_of(me, *others)
        wrong = []
        for sid in sids:
            for _ in range(2):  # hashed or remembered, then remembered
                seq += 1
                got = me.decide(request_cdr(sid.decode(), seq))[0]
                got = got if got in (NOT_OWNER, STANDBY) else None  # decided here, whatever
                if got != _expected_drop(view, me.pool.key, sid):
                    wrong.append((sid, got))
        assert wrong == [], f"view {others}: {wrong[:5]}"


def test_a_session_id_ends_at_its_first_nul_in_the_drop_as_in_the_full_read():
    """The drop reads the session id's bytes as the CDR length gives them and takes the string
    to end at its first NUL (as rosidl's C strings and the full read do), remembered or not."""
    me = Member_()
    view = _view_of(me, "a", "b")
    for role, expected in ((PoolRole.OTHER, NOT_OWNER), (PoolRole.SUCCESSOR, STANDBY)):
        sid = session_where(me.pool, role)
        # bytes after the NUL that would rank the request elsewhere, were they read
        tail = next(t for t in (f"Z{i}" for i in range(1000))
                    if _expected_drop(view, me.pool.key, (sid + t).encode()) != expected)
        cdr = bytearray(request_cdr(sid + tail))
        assert cdr[8:9 + len(sid + tail)] == (sid + tail + "\0").encode()
        cdr[8 + len(sid)] = 0  # the string is `sid`; its CDR bytes run on past the NUL
        for seq in range(2):  # hashed, then remembered
            assert me.decide(bytes(cdr))[0] == expected
            assert me.decide(request_cdr(sid, seq + 2))[0] == expected


def test_a_truncated_request_is_dropped_only_when_its_header_is_whole():
    """The drop reads the header straight from the bytes, every length checked against what is
    left: a request cut anywhere before the end of its model_digest is malformed (decided here,
    counted), one cut after it is another member's (dropped), remembered or not."""
    me = Member_()
    _view_of(me, "a", "b")
    sid = session_where(me.pool, PoolRole.OTHER)
    cdr = request_cdr(sid)
    head_end = cdr.index(DIGEST.encode() + b"\0") + len(DIGEST) + 1
    for cut in range(len(cdr)):
        key, _ = me.decide(cdr[:cut])
        assert key == (NOT_OWNER if cut >= head_end else "request_malformed"), cut


@settings(max_examples=100, deadline=None)
@given(sid=st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
                   min_size=1, max_size=20),
       origin_sec=st.sampled_from([-1, 0, 1_699_999_999, 1_700_000_000, 1_700_000_001]),
       origin_nanosec=st.sampled_from([0, 5, 999_999_999, 1_000_000_000]),
       digest=st.sampled_from([DIGEST, "sha256:other"]))  # fmt: skip
def test_the_rclpy_intakes_pool_check_is_the_c_intakes(sid, origin_sec, origin_nanosec, digest):
    """pool_owns (the rclpy intake) and the C intake leave the same requests to other members,
    invalid origin stamps and unserved digests included."""
    me = Member_()
    t_join = ROS  # this member counts from ROS on; the others always
    me.pool.set_view([PoolViewMember(pool_key("a"), (DIGEST,)), PoolViewMember(pool_key("b")),
                      PoolViewMember(me.pool.key, (DIGEST,), t_join)])
    msg = build_request(SMALL, ROS, session_id=sid, sequence=1, model_digest=digest)
    msg.origin_stamp.sec, msg.origin_stamp.nanosec = origin_sec, origin_nanosec
    key, _ = me.decide(serialize_message(msg))
    assert pool_owns(me.pool, msg) == (key not in (NOT_OWNER, STANDBY))
    # both counted it
    assert me.pool.counters().not_owner + me.pool.counters().unowned in (0, 2)


def test_a_successor_keeps_the_request_until_an_answer_names_it():
    me = Member_()
    owner = pool_key("owner")
    me.pool.set_view(members(owner, me.pool.key))
    sid = session_where(me.pool, PoolRole.SUCCESSOR)
    assert me.decide(request_cdr(sid, 7)) == (STANDBY, None)
    assert me.decide(request_cdr(sid, 8)) == (STANDBY, None)
    assert me.pool.standby() == [(pool_hash(sid), 7, owner), (pool_hash(sid), 8, owner)]
    assert me.pool.answer(answer_cdr(sid, 7)) == 1
    assert me.pool.standby() == [(pool_hash(sid), 8, owner)]
    # this member's own answers are not the owner's: ignored
    assert me.pool.answer(answer_cdr(sid, 8, relay_id=me.pool.relay_id)) == 0
    c = me.pool.counters()
    assert (c.standby_stored, c.standby_answered, c.standby_entries, c.not_owner) == (2, 1, 1, 2)
    # an answer that comes before its request: the request is not kept
    assert me.pool.answer(answer_cdr(sid, 9)) == 0
    assert me.decide(request_cdr(sid, 9)) == (STANDBY, None)
    assert me.pool.counters().answers_early == 1 and len(me.pool.standby()) == 1
    with pytest.raises(InvalidArgument):
        me.pool.answer(b"\x00\x01\x00\x00 not an answer")
    assert me.pool.counters().answers_malformed == 1


def test_the_answers_watch_parses_what_the_c_publisher_writes():
    pool = Pool("owner-7-0000beef")
    pool.set_epoch(3)
    core = Core(CoreConfig(obs_dim=SMALL.obs_dim, action_len=SMALL.action_len))
    pub = ActionPublisher._create(core, SMALL)
    assert lib.fer_publisher_set_pool(pub, pool.ptr) == lib.FER_OK
    o = ffi.new("struct fer_outcome *")
    o.session_id[0:3] = b"r-1"
    o.session_id_len, o.sequence, o.code, o.has_actions = 3, 42, lib.FER_INFERENCE, 1
    act = ffi.new("float[]", [0.25] * SMALL.action_len)
    buf = ffi.new("uint8_t[]", lib.fer_action_cdr_max(pub))
    n = lib.fer_action_cdr(pub, o, act, ROS, buf, len(buf))
    data = bytes(ffi.buffer(buf, n))
    msg = deserialize_message(data, ActionMessage)
    assert (msg.relay_id, msg.pool_epoch, msg.session_id, msg.sequence) == (
        "owner-7-0000beef", 3, "r-1", 42)
    # the Python loop's message says the same
    from flowedge_relay.core import Outcome
    py = action_message(Outcome(Code.INFERENCE, b"r-1", 42, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1,
                                np.full(SMALL.action_len, 0.25, np.float32)), ROS, SMALL, pool)
    assert (py.relay_id, py.pool_epoch) == (msg.relay_id, msg.pool_epoch)
    # a member's watch removes the entry this answer names
    me = Pool("succ")
    me.standby_put(request_cdr("r-1", 42), pool.key, MONO, MONO + 10 * MS, MONO)
    assert me.answer(data) == 1 and me.standby() == []


def test_standby_is_bounded_in_entries_and_bytes_and_evicts_the_oldest():
    one = len(request_cdr("s", 0))
    pool = Pool("succ", standby_entries=4, standby_bytes=10 * one)
    for seq in range(6):
        pool.standby_put(request_cdr("s", seq), 1, MONO, 0, MONO)
    assert [s for _, s, _ in pool.standby()] == [2, 3, 4, 5]
    c = pool.counters()
    assert (c.standby_entries, c.standby_evicted, c.standby_capacity) == (4, 2, 4)
    pool = Pool("succ", standby_entries=100, standby_bytes=3 * one)
    for seq in range(5):
        pool.standby_put(request_cdr("s", seq), 1, MONO, 0, MONO)
    assert [s for _, s, _ in pool.standby()] == [2, 3, 4]
    assert pool.counters().standby_bytes <= 3 * one
    # a request larger than the whole arena is not kept, and counted
    pool.standby_put(request_cdr("s", 9, observation_dim=0) + bytes(4 * one), 1, MONO, 0, MONO)
    assert pool.counters().standby_evicted == 3 and len(pool.standby()) == 3


def test_standby_expires_after_deadline_plus_lease_while_the_owner_lives():
    pool = Pool("succ", lease_ns=LEASE)
    live, gone = pool_key("live"), pool_key("gone")
    pool.set_view(members(live))
    pool.standby_put(request_cdr("a", 1), live, MONO, MONO + 100 * MS, MONO)
    pool.standby_put(request_cdr("b", 1), gone, MONO, MONO + 100 * MS, MONO)
    pool.standby_put(request_cdr("c", 1), live, MONO, 0, MONO)  # no deadline
    assert pool.expire(MONO + 100 * MS + LEASE - 1) == 0
    assert pool.expire(MONO + 100 * MS + LEASE) == 1
    assert [o for _, _, o in pool.standby()] == [gone, live]
    assert pool.expire(MONO + 100 * MS + 4 * LEASE) == 1  # an owner outside the view: 4 leases
    assert pool.standby() == [(pool_hash("c"), 1, live)]
    assert pool.counters().standby_expired == 2


# ---- takeover --------------------------------------------------------------------------------


def test_takeover_answers_each_kept_request_exactly_once():
    me = Member_()
    dead = pool_key("dead")
    me.pool.set_view(members(dead, me.pool.key))
    sid = session_where(me.pool, PoolRole.SUCCESSOR)
    # one with slack left, one whose deadline passes before the takeover, one answered already
    assert me.decide(request_cdr(sid, 1, deadline_ms=5000)) == (STANDBY, None)
    assert me.decide(request_cdr(sid, 2, deadline_ms=50)) == (STANDBY, None)
    assert me.decide(request_cdr(sid, 3, deadline_ms=5000)) == (STANDBY, None)
    me.pool.answer(answer_cdr(sid, 3, relay_id="dead"))
    assert me.service(100) == 0  # nothing posted: nothing re-decided
    me.pool.set_view(members(me.pool.key))  # the dead member leaves the view
    me.pool.takeover(dead)
    assert me.service(600) == 2
    queued = [q.sequence for q in me.core.queue_snapshot()]
    outcomes = me.core.pop_outcomes()
    assert queued == [1]
    assert [(o.sequence, o.code) for o in outcomes] == [(2, Code.EXPIRED)]
    c = me.pool.counters()
    assert (c.takeovers, c.taken_over_requests, c.standby_entries) == (1, 2, 0)
    # again: nothing is left to answer twice
    me.pool.takeover(dead)
    assert me.service(700) == 0 and me.core.pop_outcomes() == []
    assert me.pool.counters().takeovers == 2
    # the intake counted each message once as received, the re-decisions as decided
    assert me.intake.received == 3


def test_a_takeover_keeps_the_arrival_time_for_the_age_gate():
    me = Member_()
    me.core.set_policy(1, lib.FER_AGE_GATE_ALL, 0, 0)  # age beats slack for every request
    dead = pool_key("dead")
    me.pool.set_view(members(dead, me.pool.key))
    sid = session_where(me.pool, PoolRole.SUCCESSOR, origin=0)
    # no origin_stamp: its age runs from its first arrival, not from the takeover
    unset = {"origin_stamp": ros_time(0)}
    assert me.decide(request_cdr(sid, 1, deadline_ms=5000, **unset)) == (STANDBY, None)
    me.pool.set_view(members(me.pool.key))
    me.pool.takeover(dead)
    assert me.service(3000) == 1  # aged 3 s, 2 s of slack left: the age gate refuses it
    assert [(o.sequence, o.code) for o in me.core.pop_outcomes()] == [
        (1, Code.REJECTED_DEADLINE)]
    # the same request arriving fresh at that instant is young, and admitted
    fresh = request_cdr(sid, 2, now_ros=ROS + 3000 * MS, deadline_ms=2000, **unset)
    assert me.decide(fresh, 3000) == (None, Decision.ACCEPTED)


# ---- spill on capacity ------------------------------------------------------------------------

OWNER_ID, TARGET_ID = "owner-1-0000000a", "target-2-0000000b"


def spill_pair(spill_bytes: int = 1 << 20,
               target_spill_bytes: int = 1 << 20) -> tuple[Member_, Member_, str]:
    """An owner with a queue of 1 and spill on, its session's successor (the target) idle, both
    with the same view (the target's announced bound: 1 worker, 1 ms an NFE, nothing queued);
    and a session the owner owns. The owner's queue is full."""
    owner = Member_(OWNER_ID, queue_capacity=1, spill_bytes=spill_bytes)
    target = Member_(TARGET_ID, spill_bytes=target_spill_bytes)
    view = [PoolViewMember(owner.pool.key, (DIGEST,), relay_id=OWNER_ID),
            PoolViewMember(target.pool.key, (DIGEST,), workers=1, nfe_ns=MS,
                           relay_id=TARGET_ID)]
    for m in (owner, target):
        m.pool.set_view(view)
    owner.pool.set_spill(True)
    sid = session_where(owner.pool, PoolRole.OWNER)
    assert owner.decide(request_cdr(sid, 1, deadline_ms=5000)) == (None, Decision.ACCEPTED)
    return owner, target, sid


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 6), sid=st.binary(min_size=1, max_size=16), nfe=st.integers(1, 16),
       slack_ms=st.sampled_from([0, 1, 5, 50, 500]), data=st.data())  # fmt: skip
def test_the_spill_target_is_the_references(n, sid, nfe, slack_ms, data):
    """Which member an owner may spill a request to: the reference model's choice (the
    successor, by its announced bound against the request's slack), over random views, bounds
    and deadlines; a request this member does not own is never spilled."""
    me = Pool("probe-self", spill_bytes=1 << 16)
    me.set_spill(True)
    keys = [me.key] + [pool_key(f"m{i}") for i in range(n)]
    bounds = {k: Bound(data.draw(st.integers(0, 3)), data.draw(st.sampled_from([0, MS, 5 * MS])),
                       data.draw(st.sampled_from([0, 2 * MS])), data.draw(st.integers(0, 5)))
              for k in keys[1:]}  # fmt: skip
    view = [Member(k, (DIGEST,)) for k in keys]
    me.set_view([PoolViewMember(k, (DIGEST,), relay_id=f"m{k}", **(
        {"workers": bounds[k].workers, "nfe_ns": bounds[k].nfe_ns,
         "admission_reserve_ns": bounds[k].admission_reserve_ns,
         "queue_depth": bounds[k].queue_depth} if k in bounds else {})) for k in keys])
    deadline = ROS + slack_ms * MS if slack_ms else 0
    expected = spill_target(view, bounds, me.key, sid, DIGEST, 0, nfe, deadline, ROS)
    owner, successor = me.ranking(sid, DIGEST, 0)
    got = successor if owner == me.key and me.spill_fits(successor, nfe, deadline, ROS,
                                                         100) else 0
    assert got == expected


def test_an_owner_at_capacity_hands_the_request_to_its_successor_who_answers_once():
    """pool_spill: a request the owner would answer REJECTED_CAPACITY is handed over (no answer
    at the owner, counted spilled_out); the handover names the target and carries the request's
    bytes; the target decides it as an arrival (admitted here), drops its own standby copy and
    filters a later one, so its takeover of the owner never decides it again; the target's
    answer clears the owner's record."""
    owner, target, sid = spill_pair()
    cdr = request_cdr(sid, 2, deadline_ms=5000)
    assert target.decide(cdr) == (STANDBY, None)  # the successor keeps its copy, as always
    assert owner.decide(cdr) == (SPILLED, None)
    assert owner.core.pop_outcomes() == []  # nobody answered at the owner
    assert owner.pool.standby() == [(pool_hash(sid), 2, target.pool.key)]
    handover = owner.pool.spill_next(0)
    msg = deserialize_message(handover, PoolSpill)
    assert (msg.relay_id, msg.target, msg.session_id, msg.sequence) == (OWNER_ID, TARGET_ID,
                                                                         sid, 2)
    assert bytes(msg.request) == cdr and owner.pool.spill_next(0) is None
    assert owner.pool.spill_in(handover, MONO) == 0  # it names another member: ignored there
    assert target.pool.spill_in(handover, MONO) == 1
    assert target.service(1) == 1
    assert [q.sequence for q in target.core.queue_snapshot()] == [2]  # admitted there
    assert target.pool.standby() == []
    assert target.decide(cdr, 2) == (STANDBY, None) and target.pool.standby() == []  # filtered
    target.pool.set_view([PoolViewMember(target.pool.key, (DIGEST,))])
    target.pool.takeover(owner.pool.key)
    assert target.service(3) == 0 and target.core.pop_outcomes() == []
    assert owner.pool.answer(answer_cdr(sid, 2, relay_id=TARGET_ID)) == 1
    o, t = owner.pool.counters(), target.pool.counters()
    assert (o.spilled_out, o.spill_ignored, o.standby_entries) == (1, 1, 0)
    assert (t.spilled_in, t.spill_ignored, t.spilled_out) == (1, 0, 0)


def test_only_a_capacity_rejection_spills_and_only_when_the_bound_fits():
    """REJECTED_STALE and REJECTED_DEADLINE are answered by the owner, never handed over; a
    capacity rejection too when spill is off, or when the target's announced bound does not fit
    the request's slack."""
    owner, _, sid = spill_pair()
    stale = request_cdr(sid, 3, deadline_ms=5000, generation=0)
    assert owner.decide(stale) == (None, Decision.REJECTED_STALE)
    aged = request_cdr(sid, 4, now_ros=ROS - 2000 * MS, deadline_ms=2500, retry_count=1)
    assert owner.decide(aged) == (None, Decision.REJECTED_DEADLINE)  # age 2 s >= 0.5 s slack
    # the target announces 2 s an NFE and 1 queued: 4 NFE x 2 s x 2 rounds do not fit 6 s
    slow = PoolViewMember(pool_key(TARGET_ID), (DIGEST,), workers=1, nfe_ns=2000 * MS,
                          queue_depth=1, relay_id=TARGET_ID)
    owner.pool.set_view([PoolViewMember(owner.pool.key, (DIGEST,)), slow])
    assert owner.decide(request_cdr(sid, 5, deadline_ms=6000)) == (None,
                                                                   Decision.REJECTED_CAPACITY)
    assert not owner.pool.spill_fits(slow.key, 4, ROS + 6000 * MS, ROS, 100)
    assert owner.pool.spill_fits(slow.key, 4, ROS + 17000 * MS, ROS, 100)
    assert owner.pool.spill_fits(slow.key, 4, 0, ROS, 100)  # no deadline: any bound fits
    owner.pool.set_spill(False)
    assert owner.decide(request_cdr(sid, 6, deadline_ms=5000)) == (None,
                                                                   Decision.REJECTED_CAPACITY)
    assert [(o.sequence, o.code) for o in owner.core.pop_outcomes()] == [
        (3, Code.REJECTED_STALE), (4, Code.REJECTED_DEADLINE), (5, Code.REJECTED_CAPACITY),
        (6, Code.REJECTED_CAPACITY)]
    c = owner.pool.counters()
    assert c.spilled_out == 0 and owner.pool.spill_next(0) is None
    owner.pool.set_spill(True)
    owner.pool.set_view([PoolViewMember(owner.pool.key, (DIGEST,)),
                         PoolViewMember(slow.key, (DIGEST,), workers=1, relay_id=TARGET_ID)])
    assert owner.decide(request_cdr(sid, 7, deadline_ms=5000)) == (SPILLED, None)


SPILL_STEP = st.tuples(st.integers(0, 2), st.integers(0, 1),
                       st.sampled_from([None, 1, 40, 5000, 100_000]), st.integers(1, 8),
                       st.integers(0, 1), st.integers(0, 30), st.booleans())  # fmt: skip


@settings(max_examples=120, deadline=None)
@given(steps=st.lists(SPILL_STEP, min_size=1, max_size=40), queue=st.integers(1, 3),
       fair=st.booleans(), target_nfe_ms=st.sampled_from([1, 50, 2000]),
       boxed=st.integers(1, 4))  # fmt: skip
def test_the_owner_decides_first_and_only_a_capacity_rejection_tries_the_handover(
        steps, queue, fair, target_nfe_ms, boxed):
    """The hot path: an owner with spill on makes the same decisions, in the same state, as a
    twin with spill off (the core decides first); only a decision REJECTED_CAPACITY with reason
    capacity becomes a handover, exactly when the target's bound fits and its out box has room
    (spill_fits, looked at only then), and every other request, a fair-share rejection
    included, is answered at the owner as by the twin, once. Random sessions, clients,
    deadlines, NFE, generations, clocks, and an out box of one to four handovers drained at
    random by the sender."""
    size = len(request_cdr("robot-0", 1, deadline_ms=5000))
    twins = [Member_(OWNER_ID, queue_capacity=queue, spill_bytes=boxed * (size + 512))
             for _ in range(2)]
    off, on = twins
    target_key = pool_key(TARGET_ID)
    view = [PoolViewMember(off.pool.key, (DIGEST,), relay_id=OWNER_ID),
            PoolViewMember(target_key, (DIGEST,), workers=1, nfe_ns=target_nfe_ms * MS,
                           relay_id=TARGET_ID)]
    sids = []
    for m in twins:
        m.pool.set_view(view)
        m.core.set_fair_share(fair)
    on.pool.set_spill(True)
    for i in range(10_000):
        sid = f"robot-{i}"
        if on.pool.role(sid.encode(), DIGEST, ROS) == PoolRole.OWNER:
            sids.append(sid)
        if len(sids) == 3:
            break
    t_ms, spilled = 0, 0
    for seq, (si, client, deadline_ms, nfe, gen, dt_ms, drain) in enumerate(steps, start=1):
        t_ms += dt_ms
        now_ros = ROS + t_ms * MS
        cdr = request_cdr(sids[si], seq, now_ros=now_ros, deadline_ms=deadline_ms,
                          remaining_nfe=nfe, generation=1 + gen, client_id=f"client-{client}")
        deadline = now_ros + deadline_ms * MS if deadline_ms is not None else 0
        fits = on.pool.spill_fits(target_key, nfe, deadline, now_ros, len(cdr))
        want = off.decide(cdr, t_ms)
        got = on.decide(cdr, t_ms)
        want_out = [(o.sequence, o.code, o.reject_reason) for o in off.core.pop_outcomes()]
        got_out = [(o.sequence, o.code, o.reject_reason) for o in on.core.pop_outcomes()]
        capacity = (seq, Code.REJECTED_CAPACITY, RejectReason.CAPACITY) in want_out
        if want == (None, Decision.REJECTED_CAPACITY) and capacity and fits:
            assert got == (SPILLED, None)
            assert got_out == [o for o in want_out if o[0] != seq]  # the rest, once each
            spilled += 1
        else:
            assert got == want and got_out == want_out
        assert on.core.queue_snapshot() == off.core.queue_snapshot()
        if drain:
            on.pool.spill_next(0)
    assert on.pool.counters().spilled_out == spilled and off.pool.counters().spilled_out == 0
    assert on.core.stats().submitted == off.core.stats().submitted == len(steps)


def test_the_owner_answers_a_spilled_request_once_when_its_target_dies():
    """The target dies before answering: the owner's takeover of it decides the handed-over
    request itself, as an arrival, and never spills it again (here its queue is still full:
    REJECTED_CAPACITY; past its deadline: EXPIRED). A second takeover answers nothing."""
    owner, target, sid = spill_pair()
    assert owner.decide(request_cdr(sid, 2, deadline_ms=6000)) == (SPILLED, None)
    assert owner.decide(request_cdr(sid, 3, deadline_ms=9000)) == (SPILLED, None)
    owner.pool.set_view([PoolViewMember(owner.pool.key, (DIGEST,), relay_id=OWNER_ID)])
    owner.pool.takeover(target.pool.key)
    assert owner.service(7000) == 2  # 2 is past its deadline; 3 has 2 s left
    outcomes = {o.sequence: o.code for o in owner.core.pop_outcomes()}
    queued = [q.sequence for q in owner.core.queue_snapshot()]
    assert outcomes.get(2) == Code.EXPIRED
    assert (outcomes.get(3) == Code.REJECTED_CAPACITY) != (3 in queued)  # once, either way
    c = owner.pool.counters()
    assert (c.spilled_out, c.spill_back, c.taken_over_requests, c.standby_entries) == (2, 2, 2, 0)
    assert owner.pool.spill_next(0) is not None  # the two handovers were made
    owner.pool.takeover(target.pool.key)
    assert owner.service(7100) == 0 and owner.core.pop_outcomes() == []


def test_a_handover_the_targets_full_in_box_cannot_take_is_given_back_and_answered_once():
    """The target's intake is stalled on purpose (never serviced) with its in box holding one
    handover: the next ones are given back at once (counted spill_returned), addressed to their
    owner; the owner decides each as its own arrival, once, never spilling it again (counted
    spill_taken_back, not spilled_in): in time and still full, REJECTED_CAPACITY; past its
    deadline, EXPIRED. A give-back the owner's own full in box cannot take is refused until it
    has room (the relay waits lease / 4 for it). The handover the target took is answered there
    and clears the owner's record: every request answered once."""
    one = 16 + (len(spill_handover_probe()) + 15) // 16 * 16  # the target's in box: one
    owner, target, sid = spill_pair(spill_bytes=848, target_spill_bytes=one)
    handovers = {}
    for seq in range(2, 6):
        assert owner.decide(request_cdr(sid, seq, deadline_ms=5000)) == (SPILLED, None)
        handovers[seq] = owner.pool.spill_next(0)
    assert target.pool.spill_in(handovers[2], MONO) == 1  # and its intake never runs
    backs = {}
    for seq in (3, 4, 5):
        assert target.pool.spill_in(handovers[seq], MONO) == lib.FER_POOL_SPILL_GIVE_BACK
        backs[seq] = target.pool.spill_give_back(handovers[seq])
        msg = deserialize_message(backs[seq], PoolSpill)
        assert (msg.relay_id, msg.target, msg.sequence) == (OWNER_ID, OWNER_ID, seq)
        assert bytes(msg.request) == request_cdr(sid, seq, deadline_ms=5000)
        assert target.pool.spill_in(backs[seq], MONO) == 0  # addressed to the owner only
    assert owner.pool.spill_in(backs[3], MONO) == owner.pool.spill_in(backs[4], MONO) == 1
    with pytest.raises(RingFull):  # the owner's in box holds two: the third waits
        owner.pool.spill_in(backs[5], MONO)
    assert owner.service(1) == 2
    assert owner.pool.standby() == [(pool_hash(sid), q, target.pool.key) for q in (2, 5)]
    assert target.service(2) == 1 and [q.sequence for q in target.core.queue_snapshot()] == [2]
    assert owner.pool.answer(answer_cdr(sid, 2, relay_id=TARGET_ID)) == 1
    assert owner.pool.standby() == [(pool_hash(sid), 5, target.pool.key)]
    assert owner.pool.spill_in(backs[5], MONO) == 1
    assert owner.service(6000) == 1  # past its deadline now
    assert [(o.sequence, o.code) for o in owner.core.pop_outcomes()] == [
        (3, Code.REJECTED_CAPACITY), (4, Code.REJECTED_CAPACITY), (5, Code.EXPIRED)]
    assert owner.pool.spill_next(0) is None  # never spilled again
    assert owner.pool.spill_in(backs[3], MONO) == 1 and owner.service(6001) == 0  # once
    assert owner.core.pop_outcomes() == [] == owner.pool.standby() == target.core.pop_outcomes()
    o, t = owner.pool.counters(), target.pool.counters()
    assert (o.spilled_out, o.spill_taken_back, o.spilled_in, o.spill_dropped) == (4, 3, 0, 1)
    assert (t.spill_returned, t.spilled_in, t.spill_taken_back) == (3, 1, 0)


def spill_handover_probe() -> bytes:
    """One handover of the spill pair's size (its request as request_cdr makes it)."""
    owner, _, sid = spill_pair()
    owner.decide(request_cdr(sid, 2, deadline_ms=5000))
    return owner.pool.spill_next(0)


def test_a_handover_after_the_targets_takeover_of_its_owner_is_not_decided_again():
    """The owner hands a request over and dies before the target reads the handover: the
    target's takeover of the owner decides its own copy; the handover, read after, is dropped
    (counted spill_dropped), so the request is answered once."""
    owner, target, sid = spill_pair()
    cdr = request_cdr(sid, 2, deadline_ms=5000)
    assert target.decide(cdr) == (STANDBY, None)
    assert owner.decide(cdr) == (SPILLED, None)
    handover = owner.pool.spill_next(0)
    target.pool.set_view([PoolViewMember(target.pool.key, (DIGEST,))])
    target.pool.takeover(owner.pool.key)
    assert target.service(1) == 1
    assert target.pool.spill_in(handover, MONO) == 1
    assert target.service(2) == 0
    assert [q.sequence for q in target.core.queue_snapshot()] == [2]  # once
    c = target.pool.counters()
    assert (c.taken_over_requests, c.spilled_in, c.spill_dropped) == (1, 0, 1)


def test_handover_boxes_are_bounded_and_keep_their_order_across_the_wrap():
    """The out box holds at most what its bytes allow: with no room the owner answers itself
    (nothing is handed over that cannot be published); records come out in order across the
    arena's wrap. A handover made before the target's own stall is not decided there (its owner
    takes it back on the death it saw)."""
    size = len(request_cdr("robot-0", 1))
    owner, target, sid = spill_pair(spill_bytes=4 * (size + 512))
    pending, published, refused = [], [], 0
    for seq in range(2, 60):
        kind, decision = owner.decide(request_cdr(sid, seq, deadline_ms=5000))
        if kind == SPILLED:
            pending.append(seq)
            continue
        assert decision == Decision.REJECTED_CAPACITY and pending  # full: answered here
        refused += 1
        published.append(deserialize_message(owner.pool.spill_next(0), PoolSpill).sequence)
    while (h := owner.pool.spill_next(0)) is not None:
        published.append(deserialize_message(h, PoolSpill).sequence)
    spilled = [q for q in range(2, 60) if q in set(published)]
    assert published == spilled  # in order, each once, across many wraps of the arena
    assert refused >= 10 and len(spilled) + refused == 58
    assert owner.pool.counters().spilled_out == len(spilled)
    assert len([o for o in owner.core.pop_outcomes()]) == refused
    # the target, after its own stall, drops a handover made before it: counted, unanswered
    assert owner.decide(request_cdr(sid, 99, deadline_ms=5000)) == (SPILLED, None)
    handover = owner.pool.spill_next(0)
    target.pool.surrender(time.monotonic_ns())  # the others are in its view: it surrenders
    assert target.pool.spill_in(handover, MONO) == 1
    assert target.service(1) == 0 and target.core.pop_outcomes() == []
    assert target.core.queue_snapshot() == []
    assert target.pool.counters().spill_dropped == 1


# ---- the reference model ---------------------------------------------------------------------

OPS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 5), st.integers(0, 7), st.integers(0, 2),
              st.integers(0, 40), st.sampled_from([0, 100, 400])),
    st.tuples(st.just("answer"), st.integers(0, 5), st.integers(0, 7)),
    st.tuples(st.just("expire"), st.integers(0, 2000)),
), max_size=60)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(ops=OPS, entries=st.integers(1, 8), arena_floats=st.integers(30, 200))
def test_standby_matches_the_reference_model(ops, entries, arena_floats):
    owners = [pool_key(f"m{i}") for i in range(3)]
    live = set(owners[:2])
    pool = Pool("succ", standby_entries=entries, standby_bytes=4 * arena_floats + 200,
                lease_ns=LEASE)
    pool.set_view([PoolViewMember(k) for k in live])
    ref = RefStandby(entries, 4 * arena_floats + 200, LEASE)
    now = MONO
    for op in ops:
        if op[0] == "put":
            _, s, seq, o, floats, dl = op
            cdr = serialize_message(InferenceRequest(session_id=f"s{s}", sequence=seq,
                                                     observation=[0.5] * floats))
            deadline = now + dl * MS if dl else 0
            pool.standby_put(cdr, owners[o], now, deadline, now)
            ref.put(f"s{s}".encode(), seq, len(cdr), owners[o], now, deadline)
        elif op[0] == "answer":
            _, s, seq = op
            assert pool.answer(answer_cdr(f"s{s}", seq)) == ref.answer(f"s{s}".encode(), seq)
        else:
            now += op[1] * MS
            assert pool.expire(now) == ref.expire(now, live)
        assert pool.standby() == ref.live()
    c = pool.counters()
    assert {k: getattr(c, k) for k in ref.counters} == ref.counters
    assert c.standby_bytes == ref.bytes_used
    assert c.standby_entries == len(ref.live())


# ---- the intake loop over DDS ----------------------------------------------------------------


@pytest.mark.ros
@pytest.mark.parametrize(("setting", "why"), [("intake_loop:=python", "intake_loop: python"),
                                               ("use_sim_time:=true", "use_sim_time")])
def test_a_pool_without_the_c_intake_refuses_to_start_saying_why(setting, why):
    """The ownership test, the standby copy and the takeover live in the C intake; the rclpy
    intake keeps no standby, so a member deciding there would leave a dead owner's requests
    unanswered. A relay with `pool` set and no C intake refuses to start, in one line."""
    from ros_helpers import ros_context

    from flowedge_relay.node import RelayNode
    from flowedge_relay.parameters import ParameterError

    with ros_context() as ctx:
        with pytest.raises(ParameterError) as refused:
            RelayNode(context=ctx, cli_args=["--ros-args", "-p", "autostart:=false", "-p",
                                             "pool:=fleet", "-p", setting])
        message = str(refused.value)
        assert "\n" not in message and message.startswith("pool 'fleet' needs the C request "
                                                          "intake"), message
        assert why in message, message
        # the same relay outside a pool starts, on the rclpy intake
        node = RelayNode(context=ctx, cli_args=["--ros-args", "-p", "autostart:=false", "-p",
                                                setting])
        try:
            assert node.relay_pool is None
        finally:
            node.destroy_node()


@pytest.mark.ros
def test_over_dds_the_intake_loop_keeps_clears_and_takes_over():
    """The C intake loop with a pool, over real subscriptions: a successor's request is kept,
    an answer on flowedge/actions (an extra subscription of the same loop) clears it, and a
    takeover posted from another thread wakes the loop, which re-decides the rest."""
    import threading
    import time

    import rclpy
    from ros_helpers import ros_context, wait_for
    from ros_helpers import wait_for_subscribers as matched

    from flowedge_relay.intake import IntakeLoop

    me = Member_()
    dead = pool_key("dead")
    me.pool.set_view(members(dead, me.pool.key))
    sid = session_where(me.pool, PoolRole.SUCCESSOR, origin=time.time_ns())
    loop = IntakeLoop(1 << 20)
    loop.set_pool(me.pool)
    loop.route(me.intake)
    with ros_context() as ctx:
        node = rclpy.create_node("pool_loop_test", context=ctx)
        requests = node.create_subscription(InferenceRequest, "requests", lambda m: None, 10)
        answers = node.create_subscription(ActionMessage, "actions", lambda m: None, 10)
        req_pub = node.create_publisher(InferenceRequest, "requests", 10)
        ans_pub = node.create_publisher(ActionMessage, "actions", 10)
        thread = threading.Thread(target=loop.run, args=([requests],),
                                  kwargs={"answers": [answers]}, daemon=True)
        thread.start()
        try:
            matched(req_pub)
            matched(ans_pub)
            for seq in (1, 2):
                req_pub.publish(build_request(SMALL, time.time_ns(), session_id=sid,
                                              sequence=seq, deadline_ms=10_000))
            assert wait_for(lambda: me.pool.counters().standby_entries == 2, 10)
            ans_pub.publish(ActionMessage(session_id=sid, sequence=1, relay_id="dead"))
            assert wait_for(lambda: me.pool.counters().standby_answered == 1, 10)
            me.pool.set_view(members(me.pool.key))
            me.pool.takeover(dead)
            assert wait_for(lambda: me.pool.counters().taken_over_requests == 1, 10)
            assert [q.sequence for q in me.core.queue_snapshot()] == [2]
        finally:
            loop.stop()
            thread.join(5)
            node.destroy_node()
    assert not thread.is_alive()
    assert me.pool.counters().standby_entries == 0


# ---- own stall: the surrender watermark ------------------------------------------------------


def test_the_surrender_watermark_only_rises_and_a_stall_is_found_once():
    """Silent (no announcement) for more than lease + the stall margin is this member's own
    stall: the first thread that checks finds it, once, and the watermark rises to its now; an
    explicit surrender raises it too, never lowers it; an announcement never hides a gap."""
    margin = lib.FER_POOL_STALL_MARGIN_NS
    pool = Pool("stalled-1-00000001", lease_ns=LEASE)
    alone = Pool("alone-1-00000001", lease_ns=LEASE)
    alone.set_view(members(alone.key))
    alone.alive(MONO)  # nobody could take its work over: a stall surrenders nothing
    assert alone.stall_check(MONO + 10 * LEASE) == 0 and alone.surrender(MONO) == 0
    pool.set_view(members(pool_key("other"), pool.key))
    assert pool.stall_check(MONO) == 0  # never announced: nothing to judge
    pool.alive(MONO)
    assert pool.stall_check(MONO + LEASE + margin) == 0  # at the bound: not a stall yet
    t = MONO + LEASE + margin + 1
    assert pool.stall_check(t) == t
    assert pool.stall_check(t + MS) == t  # found once, by whoever ran first
    assert pool.counters().stalls_detected == 1
    assert pool.surrender(t - MS) == t  # never lowered
    assert pool.surrender(t + 5 * MS) == t + 5 * MS
    pool.alive(t + 6 * MS)
    assert pool.stall_check(t + 6 * MS + LEASE) == t + 5 * MS  # announced in time: no stall
    late = t + 6 * MS + LEASE + margin + 10 * MS
    pool.alive(late)  # an announcement after a gap: the gap is found first
    c = pool.counters()
    assert (c.stalls_detected, c.surrender_before_ns) == (2, late)
    assert c.surrendered == 0  # nothing was dropped yet: only outputs count


def test_a_surrendered_member_decides_no_request_stamped_before_its_rejoin():
    """After a surrender the member decides no request stamped before 2 x lease from then (the
    others may have taken those over; its rejoin announces owning_from no earlier), delivered
    late, also when its view has lost the others since: one of a session it ranks first
    (every window ignored) is held, not decided (dropped once answered elsewhere, decided when
    due: the next tests), one it ranks second is kept as a copy for the first one's takeover
    (held then: the next tests), any other is dropped before any copy. Later stamps as
    before."""
    me = Member_()
    other = pool_key("other")
    me.pool.set_view(members(other, me.pool.key))
    mine = session_where(me.pool, PoolRole.OWNER)
    kept = session_where(me.pool, PoolRole.SUCCESSOR)
    assert me.decide(request_cdr(mine, 1)) == (None, Decision.ACCEPTED)
    me.pool.surrender(MONO + MS)
    assert me.pool.role(mine.encode(), DIGEST, ROS) == PoolRole.HELD
    assert me.pool.role(kept.encode(), DIGEST, ROS) == PoolRole.STALE_SUCCESSOR
    assert me.pool.ranking(mine.encode(), DIGEST, ROS)[0] == other
    assert me.pool.ranking(kept.encode(), DIGEST, ROS) == (other, 0)
    rejoined = time.time_ns() + 2 * LEASE + 10_000 * MS
    assert me.pool.role(mine.encode(), DIGEST, rejoined) == PoolRole.OWNER
    assert me.pool.role(kept.encode(), DIGEST, rejoined) == PoolRole.SUCCESSOR
    assert me.decide(request_cdr(mine, 2), 2) == (STANDBY, None)  # held
    assert me.decide(request_cdr(kept, 1), 2) == (STANDBY, None)  # a copy, not held
    c = me.pool.counters()
    assert (c.standby_entries, c.held, c.not_owner) == (2, 1, 2)
    # its rejoin moved its own window to the cutover: still the one that holds it (the
    # ranking that picks the holder ignores windows, as the others' does, whatever they heard)
    me.pool.set_view([PoolViewMember(other, (DIGEST,)),
                      PoolViewMember(me.pool.key, (DIGEST,), owning_from_ns=rejoined)])
    assert me.pool.role(mine.encode(), DIGEST, ROS) == PoolRole.HELD
    assert me.pool.role(kept.encode(), DIGEST, ROS) == PoolRole.STALE_SUCCESSOR
    # its view losing the others after the stall is its own stale judgement: still held
    me.pool.set_view(members(me.pool.key))
    assert me.pool.role(mine.encode(), DIGEST, ROS) == PoolRole.HELD
    assert me.decide(request_cdr(mine, 3), 3) == (STANDBY, None)
    assert me.pool.role(mine.encode(), DIGEST, rejoined) == PoolRole.OWNER
    assert [q.sequence for q in me.core.queue_snapshot()] == [1]  # none decided since


def _finished_at(core: Core, sid: bytes, arrivals: list[int], deadline_ros: int = 0) -> None:
    """An INFERENCE outcome per arrival (submitted then, dispatched, stepped, finished); with
    deadline_ros, each request's deadline on the ROS clock (its monotonic one 1 s away)."""
    from core_helpers import request

    for seq, now in enumerate(arrivals):
        offset = deadline_ros - (now + 1000 * MS) if deadline_ros else None
        core.submit(request(sid, seq, origin=now, obs_dim=SMALL.obs_dim,
                            deadline=now + 1000 * MS if deadline_ros else 0,
                            ros_clock_offset=offset), now)
        assert core.dispatch(0, now) is not None
        core.step(0, now + MS, MS)
        core.finish(0, now + 2 * MS, np.full(SMALL.action_len, seq, np.float32))


#: the pool lease of the hold tests: a held outcome is due lease + margin + lease after the mark
HOLD_LEASE = 50 * MS


@contextlib.contextmanager
def _publishing(name: str, core: Core, pool: Pool, native: bool,
                at_stop: int) -> Iterator[tuple[ActionPublisher, list]]:  # fmt: skip
    """One publisher loop (C or Python) of `pool`'s member on its own thread, its answers
    received by a subscriber of the same node: yields (publisher, answers). On exit it is
    stopped (its last pass at stop included) while the node still spins, until `at_stop`
    answers came, and then 0.3 s more in which nothing else may come."""
    from ros_helpers import ros_context, spinning, wait_for
    from ros_helpers import wait_for_subscribers as matched

    with ros_context() as ctx:
        node = Node(f"{name}_{native}", context=ctx)
        got: list = []
        node.create_subscription(ActionMessage, f"{name}_out", got.append, 100)
        out = node.create_publisher(ActionMessage, f"{name}_out", 100)
        with spinning(node, context=ctx):
            matched(out)
            publisher = ActionPublisher(Host.of(node, out), core, out, SMALL, native=native,
                                        pool=pool)
            thread = threading.Thread(target=publisher.run)
            thread.start()
            try:
                yield publisher, got
            finally:
                publisher.stop()
                thread.join()
            assert wait_for(lambda: len(got) >= at_stop, 10)
            time.sleep(0.3)  # nothing else comes
        node.destroy_node()


@pytest.mark.ros
@pytest.mark.parametrize("native", [True, False], ids=["c_loop", "python_loop"])
def test_outputs_from_before_the_watermark_are_held_then_dropped_if_answered_else_expired(native):
    """Both publisher loops, after an own stall that nobody may have taken over (every member
    stalled): an output of a request that arrived before the watermark is held, not published.
    One that another member answered (the answers watch saw it) is dropped, counted
    surrendered; one nobody answered is published once when due (lease + margin + lease after
    the watermark, its deadline long past), as EXPIRED, never a late INFERENCE; one that arrived
    after the watermark is published at once."""
    from ros_helpers import wait_for

    pool = Pool("frozen-1-00000001", lease_ns=HOLD_LEASE)
    pool.set_view(members(pool_key("other"), pool.key))
    core = Core(CoreConfig(obs_dim=SMALL.obs_dim, action_len=SMALL.action_len))
    mark = time.monotonic_ns()
    before, after = mark - 200 * MS, mark + MS
    # each deadline passed before the watermark (the stall outlasted them)
    _finished_at(core, b"s", [before, before + 10 * MS, after], time.time_ns() - 100 * MS)
    # seq 0 was answered by the member that took it over; its answer came first
    assert pool.answer(answer_cdr("s", 0, relay_id="other")) == 0
    assert pool.surrender(mark) == mark
    with _publishing("surrender", core, pool, native, at_stop=2) as (publisher, got):
        assert publisher.loop == ("native" if native else "python")
        assert wait_for(lambda: len(got) == 1, 10)  # the one after the watermark
        c = pool.counters()
        assert (c.held, c.surrendered) == (1, 1)  # seq 1 held; seq 0 dropped
        due = mark + HOLD_LEASE + lib.FER_POOL_STALL_MARGIN_NS + HOLD_LEASE
        assert wait_for(lambda: len(got) == 2, 10)
        published_at = time.monotonic_ns()
    assert published_at >= due
    assert [(m.session_id, m.sequence, m.code, m.relay_id) for m in got] == [
        ("s", 2, Code.INFERENCE, pool.relay_id), ("s", 1, Code.EXPIRED, pool.relay_id)]
    assert len(got[1].actions) == 0
    c = pool.counters()
    assert (c.held, c.held_released, c.surrendered, c.hold_full) == (1, 1, 1, 0)


@pytest.mark.ros
@pytest.mark.parametrize("native", [True, False], ids=["c_loop", "python_loop"])
def test_outcomes_still_held_at_stop_are_answered_once_unless_answered_elsewhere(native):
    """Both publisher loops, stopped while they hold outcomes from before the watermark, long
    before any is due (a lease of 10 s): what another member answered meanwhile is dropped
    (surrendered), every other one is published once in the last pass, as EXPIRED past its
    deadline and with its actions before it; nothing stays held and the counters balance
    (held = held_released + surrendered). Dropped unpublished at stop, they were lost when no
    other member had answered them (docs/design.md §13.2, held outcomes at stop)."""
    from ros_helpers import wait_for

    pool = Pool("stopper-1-00000001", lease_ns=10_000 * MS)
    pool.set_view(members(pool_key("other"), pool.key))
    core = Core(CoreConfig(obs_dim=SMALL.obs_dim, action_len=SMALL.action_len))
    mark = time.monotonic_ns()
    before = mark - 200 * MS
    _finished_at(core, b"late", [before, before + 10 * MS], time.time_ns() - 100 * MS)
    _finished_at(core, b"live", [before + 20 * MS, before + 30 * MS], time.time_ns() + 60_000 * MS)
    assert pool.surrender(mark) == mark
    with _publishing("held_at_stop", core, pool, native, at_stop=2) as (_, got):
        assert wait_for(lambda: pool.counters().held == 4, 10)
        assert pool.holding() == 4
        # seq 1 of each answered by the member that took it over, while it is held
        for sid in ("late", "live"):
            assert pool.answer(answer_cdr(sid, 1, relay_id="other")) == 0
        assert wait_for(lambda: pool.counters().surrendered == 2, 10)
        assert not got  # nothing due yet: the rest is still held
    assert sorted((m.session_id, m.sequence, m.code, m.relay_id) for m in got) == [
        ("late", 0, Code.EXPIRED, pool.relay_id), ("live", 0, Code.INFERENCE, pool.relay_id)]
    assert [len(m.actions) for m in sorted(got, key=lambda m: m.session_id)] == [
        0, SMALL.action_len]
    c = pool.counters()
    assert (c.held, c.held_released, c.surrendered, c.hold_full) == (4, 2, 2, 0)
    assert pool.holding() == 0


def test_a_held_outcome_is_dropped_once_an_answer_names_it_and_its_slot_is_freed():
    """The hold's slots, as a publisher uses them: an answer arriving while an outcome is held
    marks it answered (held says ANSWERED once, then the slot is free for another); one that
    nobody answers is DUE at max(mark + lease + margin, deadline) + lease, not before (no
    deadline: the max 3 leases later); with
    every slot in use an outcome is dropped, counted hold_full."""
    pool = Pool("holder-1-00000001", lease_ns=HOLD_LEASE)
    pool.set_view(members(pool_key("other"), pool.key))
    slot = ffi.new("int32_t *")
    mark = MONO
    assert lib.fer_pool_hold(pool.ptr, b"a", 1, 1, 0, mark, mark, slot) == lib.FER_POOL_HOLD_WAIT
    answered = slot[0]
    assert lib.fer_pool_hold(pool.ptr, b"a", 1, 2, 0, mark, mark, slot) == lib.FER_POOL_HOLD_WAIT
    due = mark + HOLD_LEASE + lib.FER_POOL_STALL_MARGIN_NS + 3 * HOLD_LEASE + HOLD_LEASE
    assert pool.held(answered, mark) == lib.FER_POOL_HOLD_WAIT
    assert pool.answer(answer_cdr("a", 1, relay_id="other")) == 0
    assert pool.held(answered, mark) == lib.FER_POOL_HOLD_ANSWERED
    assert pool.held(answered, mark) == lib.FER_EINVAL  # freed
    assert pool.held(slot[0], due - 1) == lib.FER_POOL_HOLD_WAIT
    assert pool.held(slot[0], due) == lib.FER_POOL_HOLD_DUE
    # a deadline later than mark + lease + margin sets the due time: deadline + lease
    later = time.time_ns() + 5000 * MS
    now = time.monotonic_ns()
    assert lib.fer_pool_hold(pool.ptr, b"b", 1, 1, later, now, now, slot) == 0
    assert pool.held(slot[0], now + 5000 * MS) == lib.FER_POOL_HOLD_WAIT
    assert pool.held(slot[0], now + 5000 * MS + HOLD_LEASE + 50 * MS) == lib.FER_POOL_HOLD_DUE
    for seq in range(lib.FER_POOL_HOLD_MAX):
        assert lib.fer_pool_hold(pool.ptr, b"c", 1, seq, 0, mark, mark, slot) == 0
    assert lib.fer_pool_hold(pool.ptr, b"c", 1, 999, 0, mark, mark, slot) == lib.FER_EFULL
    c = pool.counters()
    assert (c.held, c.held_released, c.surrendered, c.hold_full) == (
        3 + lib.FER_POOL_HOLD_MAX, 2, 2, 1)


def test_after_a_surrender_held_requests_are_dropped_if_answered_else_decided_once_when_due():
    """What a member kept in standby before its own stall is not re-decided by its takeover of
    the owner at once (the owner, alive to the others all along, may have answered it; a death
    judged just after resuming may be a stale view) but held: the owner's answer drops it
    (counted surrendered); unanswered, it is decided here once it is due, 2 leases after
    max(the watermark + lease + margin, its deadline): EXPIRED, its deadline long past. What it
    kept since the stall is taken over at once."""
    me = Member_()
    dead = pool_key("dead")
    me.pool.set_view(members(dead, me.pool.key))
    stamp = time.time_ns() + 60_000 * MS  # past the surrender's exclusion: kept again after it
    sid = session_where(me.pool, PoolRole.SUCCESSOR, origin=stamp)
    for seq in (1, 3):  # deadline MONO + 5 s
        assert me.decide(request_cdr(sid, seq, deadline_ms=5000)) == (STANDBY, None)
    mark = MONO + 10 * MS
    me.pool.surrender(mark)
    assert me.decide(request_cdr(sid, 2, now_ros=stamp, deadline_ms=5000), 20) == (STANDBY, None)
    me.pool.set_view(members(me.pool.key))
    me.pool.takeover(dead)
    assert me.service(30) == 1
    assert [q.sequence for q in me.core.queue_snapshot()] == [2]
    c = me.pool.counters()
    assert (c.taken_over_requests, c.held, c.standby_entries) == (1, 2, 2)
    assert me.pool.answer(answer_cdr(sid, 1, relay_id="dead")) == 1  # its owner answered it
    assert me.pool.counters().surrendered == 1
    due_ms = 5000 + 2 * LEASE // MS
    assert me.service(due_ms - 1) == 0
    assert me.service(due_ms) == 1  # seq 3: nobody answered it
    assert me.service(due_ms + 1000) == 0  # once
    outcomes = [(o.sequence, o.code) for o in me.core.pop_outcomes()]
    assert outcomes == [(3, Code.EXPIRED)]
    c = me.pool.counters()
    assert (c.held, c.held_released, c.surrendered, c.standby_entries) == (2, 1, 1, 0)
    assert c.held_requests_decided == 1  # re-decided, like the takeover's seq 2
    assert me.books() == (5, 5)  # 3 taken as standby (not_owner), 2 decided


def test_a_stale_copy_is_held_when_its_owner_is_taken_over():
    """After its own stall, a request stamped before the exclusion of a session this member
    ranks second is kept as a copy for the first: that owner may have died in a stall of every
    member, and nobody else kept one. The owner's takeover holds the copy (the death may be
    this member's stale view after its stall): dropped if the owner's answer names it, else
    decided here once when due, 2 leases after max(the watermark + lease + margin, its
    arrival, its deadline), as a copy kept before the watermark is."""
    me = Member_()
    dead = pool_key("dead")
    me.pool.set_view(members(dead, me.pool.key))
    sid = session_where(me.pool, PoolRole.SUCCESSOR)
    me.pool.surrender(MONO + MS)
    assert me.pool.role(sid.encode(), DIGEST, ROS) == PoolRole.STALE_SUCCESSOR
    for seq in (1, 2):  # delivered after the stall; deadline MONO + 200 ms
        assert me.decide(request_cdr(sid, seq, deadline_ms=200), 2) == (STANDBY, None)
    assert me.pool.standby() == [(pool_hash(sid), 1, dead), (pool_hash(sid), 2, dead)]
    me.pool.set_view(members(me.pool.key))
    me.pool.takeover(dead)
    assert me.service(3) == 0  # held, not decided at once
    c = me.pool.counters()
    assert (c.takeovers, c.taken_over_requests, c.held) == (1, 0, 2)
    assert me.pool.answer(answer_cdr(sid, 1, relay_id="dead")) == 1  # it answered after all
    due_ms = 1 + (LEASE + lib.FER_POOL_STALL_MARGIN_NS + 2 * LEASE) // MS
    assert me.service(due_ms - 1) == 0
    assert me.service(due_ms) == 1
    assert me.service(due_ms + 1000) == 0  # once
    assert [(o.sequence, o.code) for o in me.core.pop_outcomes()] == [(2, Code.EXPIRED)]
    c = me.pool.counters()
    assert (c.held, c.held_released, c.surrendered, c.held_requests_decided) == (2, 1, 1, 1)
    assert me.books() == (3, 3)  # 2 taken as copies (not_owner), 1 decided when due


def test_a_held_copy_is_dropped_when_its_owner_comes_back_to_the_view():
    """A death this member judges just after its own stall may be its own stale view: the
    owner's next announcement puts it back in the view. Copies its takeover held (one kept
    before the stall, one stale) are then dropped, counted surrendered, not decided when due:
    the live owner answers them, and this member may have missed those answers in its stall.
    An owner that stays out of the view has its copies decided when due (the tests above)."""
    me = Member_()
    owner = pool_key("owner")
    me.pool.set_view(members(owner, me.pool.key))
    sid = session_where(me.pool, PoolRole.SUCCESSOR)
    assert me.decide(request_cdr(sid, 1, deadline_ms=200)) == (STANDBY, None)
    me.pool.surrender(MONO + MS)
    assert me.decide(request_cdr(sid, 2, deadline_ms=200), 2) == (STANDBY, None)  # stale
    me.pool.set_view(members(me.pool.key))
    me.pool.takeover(owner)
    assert me.service(3) == 0
    assert me.pool.counters().held == 2
    me.pool.set_view(members(owner, me.pool.key))  # it announced: alive after all
    assert me.service(4) == 0
    assert me.service(1 + (LEASE + lib.FER_POOL_STALL_MARGIN_NS + 2 * LEASE) // MS) == 0
    assert me.core.pop_outcomes() == [] and me.core.queue_snapshot() == []
    c = me.pool.counters()
    assert (c.held, c.held_released, c.surrendered, c.standby_entries) == (2, 0, 2, 0)
    assert me.books() == (2, 2)  # both left to their owner (not_owner)


@pytest.mark.parametrize("owner_dies", [True, False])
def test_copies_a_stall_covers_outlive_their_deadline_until_a_death_in_it_is_judged(owner_dies):
    """A successor's copy whose deadline + lease passed in this member's own stall is not
    expired by the first pass after it, which finds the stall first: the owner may have died in
    a stall of every member, judged here only lease + margin after the stall was found. Until
    then its deadline counts from there, for a copy kept before the stall and a stale copy kept
    after it alike. A takeover then holds both and answers them, EXPIRED, when due; with the
    owner alive they expire a lease later (its answer would have come)."""
    me = Member_()
    owner = pool_key("owner")
    me.pool.set_view(members(owner, me.pool.key))
    sid = session_where(me.pool, PoolRole.SUCCESSOR)
    me.pool.alive(MONO)
    assert me.decide(request_cdr(sid, 1, deadline_ms=200)) == (STANDBY, None)
    stall_ms = 2000  # the first pass after the stall finds it: the watermark is MONO + 2 s
    assert me.service(stall_ms) == 0
    assert me.pool.counters().surrender_before_ns == MONO + stall_ms * MS
    assert me.decide(request_cdr(sid, 2, deadline_ms=200), stall_ms + 1) == (STANDBY, None)
    judged_ms = stall_ms + (LEASE + lib.FER_POOL_STALL_MARGIN_NS) // MS
    assert me.service(judged_ms) == 0
    assert [q for _, q, _ in me.pool.standby()] == [1, 2]
    if owner_dies:
        me.pool.set_view(members(me.pool.key))
        me.pool.takeover(owner)
        assert me.service(judged_ms) == 0  # held: the death may be this member's stale view
        due_ms = judged_ms + 2 * LEASE // MS
        assert me.service(due_ms - 1) == 0
        assert me.service(due_ms) == 2
        outcomes = sorted((o.sequence, o.code) for o in me.core.pop_outcomes())
        assert outcomes == [(1, Code.EXPIRED), (2, Code.EXPIRED)]
        assert me.books() == (4, 4)
    else:
        expires_ns = MONO + (judged_ms * MS + LEASE)
        assert me.pool.expire(expires_ns - 1) == 0
        assert me.pool.expire(expires_ns) == 2 and me.pool.standby() == []


def test_a_held_request_of_its_own_is_decided_once_when_due_unless_answered():
    """A request delivered after the stall, stamped before the exclusion, of a session this
    member ranks first: held (FER_POOL_HELD), dropped if another member answers it, else
    decided here once, a lease after max(the watermark + lease + margin, its arrival, its
    deadline): a live owner decides a late-delivered request about when it arrives here."""
    me = Member_()
    me.pool.set_view(members(pool_key("other"), me.pool.key))
    sid = session_where(me.pool, PoolRole.OWNER)
    mark = MONO + MS
    me.pool.surrender(mark)
    for seq in (1, 2):  # deadline MONO + 200 ms: before the watermark + lease + margin
        assert me.decide(request_cdr(sid, seq, deadline_ms=200), 2) == (STANDBY, None)
    assert me.pool.answer(answer_cdr(sid, 1, relay_id="other")) == 1
    due_ms = 1 + (LEASE + lib.FER_POOL_STALL_MARGIN_NS + LEASE) // MS
    assert me.service(due_ms - 1) == 0
    assert me.service(due_ms) == 1
    assert me.service(due_ms + 1000) == 0
    assert [(o.sequence, o.code) for o in me.core.pop_outcomes()] == [(2, Code.EXPIRED)]
    # delivered 1.5 s after the stall was found, no deadline: due 3 + 1 leases after arrival
    assert me.decide(request_cdr(sid, 4), 1500) == (STANDBY, None)
    assert me.service(1500 + 4 * LEASE // MS - 1) == 0
    assert me.service(1500 + 4 * LEASE // MS) == 1
    assert [(o.sequence, o.code) for o in me.core.pop_outcomes()] == []  # admitted, queued
    assert [q.sequence for q in me.core.queue_snapshot()] == [4]
    c = me.pool.counters()
    assert (c.held, c.held_released, c.surrendered, c.held_requests_decided) == (3, 2, 1, 2)
    assert me.books() == (5, 5)  # 3 taken as its own but held (not_owner), 2 decided late
