# SPDX-License-Identifier: Apache-2.0
"""Pool membership (flowedge_relay/pool.py) between real rclpy nodes over DDS, each member's
decisions recorded where the C pool would take them (docs/design.md §13.1, §13.2)."""

from __future__ import annotations

import threading
import time

import pytest
from core_helpers import wait_for
from rclpy.node import Node

from flowedge_relay.pool import (
    POOL_TOPIC,
    PoolMember,
    PoolMembership,
    Served,
    member_key,
    pool_qos,
    relay_id,
)
from flowedge_relay_tools.harness import ros_context, spinning

pytestmark = pytest.mark.ros

LEASE_MS = 1000
SERVED = Served(digests=("sha256:ab",), workers=1, nfe_ns=0, admission_reserve_ns=0,
                queue_depth=0)


class Recorder:
    """What a member hands the C pool: views, epochs, takeovers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.views: list[tuple] = []
        self.epochs: list[int] = []
        self.takeovers: list[int] = []
        self.takeover_ns: list[int] = []  # monotonic, when each takeover came

    def set_view(self, view) -> None:
        with self.lock:
            self.views.append(view)

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def takeover(self, key: int) -> None:
        with self.lock:
            self.takeovers.append(key)
            self.takeover_ns.append(time.monotonic_ns())

    def alive(self, now_mono: int) -> None:
        pass

    def stall_check(self, now_mono: int) -> int:
        return 0

    def surrender(self, now_mono: int) -> int:
        return now_mono

    def keys(self) -> set[int]:
        with self.lock:
            return {m.key for m in self.views[-1]} if self.views else set()


def _member(ctx, name: str, pool: str = "cell",
            lease_ms: int = LEASE_MS) -> tuple[PoolMembership, Recorder]:
    sink = Recorder()
    node = Node(name, context=ctx)
    member = PoolMembership(node, pool, lease_ms, lambda: SERVED, sink,
                            member_id=f"{relay_id()}-{name}")
    assert member.key == member_key(member.relay_id)
    return member, sink


def _close(*members: PoolMembership) -> None:
    """Leave and destroy the nodes: a participant outliving its test would announce into the
    next one (harness.ros_context)."""
    for m in members:
        m.close()
        m.node.destroy_node()


def test_a_joiner_owns_from_a_cutover_and_a_silent_member_is_taken_over_once():
    """The first member owns at once, a joiner from now + 2 x lease (both views agree); another
    pool's member is ignored; a member that falls silent is dead to the other after the lease
    (DDS's liveliness event, then the stamps) and taken over once; an announcement it made before
    is no revival, a later one is."""
    with ros_context() as ctx:
        a, sink_a = _member(ctx, "member_a")
        b, sink_b = _member(ctx, "member_b")
        other, _ = _member(ctx, "member_other", pool="another")
        with spinning(a.node, b.node, other.node, context=ctx):
            a.activate()
            assert a.owning_from_ns == 0 and a.epoch == 1
            assert wait_for(lambda: sink_b.keys() == {a.key}, 10)  # b heard a active
            b.activate()
            assert b.owning_from_ns > a.node.get_clock().now().nanoseconds
            assert wait_for(lambda: sink_a.keys() == {a.key, b.key}, 10)
            assert sink_b.keys() == {a.key, b.key}
            assert sink_a.views[-1] == sink_b.views[-1], "both compute the same view"
            assert other.key not in sink_a.keys() | sink_b.keys()
            assert not sink_a.takeovers

            stale = b.announcement(SERVED)
            (timer,) = b.node.timers
            b.node.destroy_timer(timer)  # b falls silent, its writer stays
            silent_at = time.monotonic()
            assert wait_for(lambda: sink_a.takeovers == [b.key], 10 * LEASE_MS / 1000)
            assert time.monotonic() - silent_at >= LEASE_MS / 1000 * 0.6
            assert sink_a.keys() == {a.key}
            replay = a.node.create_publisher(PoolMember, POOL_TOPIC, pool_qos(LEASE_MS))
            assert wait_for(lambda: replay.get_subscription_count() >= 3, 10)
            replay.publish(stale)  # made before b was declared dead: no revival
            time.sleep(0.5)
            assert sink_a.keys() == {a.key}
            b.publish()  # alive after all: a later announcement revives it
            assert wait_for(lambda: sink_a.keys() == {a.key, b.key}, 10)
            assert sink_a.takeovers == [b.key]
        _close(a, b, other)


def test_a_member_whose_clock_runs_ahead_is_taken_over_as_its_stamp_turns_a_lease_old():
    """A member on a host whose clock runs ahead stamps its announcements in the others' future,
    so when DDS reports its liveliness lost, its newest stamp is not yet a lease old. It is dead
    the moment it is (a one-shot judgement then), not at a later tick of the lease / 3 timer,
    which could come up to a third of a lease past the takeover bound."""
    lease_ms, ahead_ms = 3000, 1000  # a tick every 1,000 ms: one finds it late 75% of the time
    with ros_context() as ctx:
        a, sink_a = _member(ctx, "ahead_a", pool="ahead", lease_ms=lease_ms)
        b, _ = _member(ctx, "ahead_b", pool="ahead", lease_ms=lease_ms)
        with spinning(a.node, b.node, context=ctx):
            a.activate()
            b.activate()
            assert wait_for(lambda: sink_a.keys() == {a.key, b.key}, 10)
            ahead = b.announcement(SERVED)
            ahead_ns = b.node.get_clock().now().nanoseconds + ahead_ms * 1_000_000
            ahead.stamp.sec, ahead.stamp.nanosec = divmod(ahead_ns, 1_000_000_000)
            (timer,) = b.node.timers
            b.node.destroy_timer(timer)  # b falls silent, its writer stays
            b.publish()  # its last liveliness assertion
            # its last stamp, from b's clock 1 s ahead (another writer: it lapses alike)
            skewed = b.node.create_publisher(PoolMember, POOL_TOPIC, pool_qos(lease_ms))
            assert wait_for(lambda: skewed.get_subscription_count() >= 2, 10)
            skewed.publish(ahead)
            due = time.monotonic_ns() + (ahead_ns - a.node.get_clock().now().nanoseconds
                                         + lease_ms * 1_000_000)
            assert wait_for(lambda: sink_a.takeovers == [b.key], 3 * lease_ms / 1000)
            late_ms = (sink_a.takeover_ns[0] - due) / 1e6
            print(f"taken over {late_ms:.0f} ms after its stamp was a lease old")
            assert -20 <= late_ms <= 250
            b.node.destroy_publisher(skewed)
        _close(a, b)


def test_a_drain_announces_owning_until_and_leaves_without_a_takeover():
    """deactivate's drain: owning_until = now + 2 x lease, in both views, decided until then;
    then the member leaves the view, not before owning_until + 2 x lease (a request stamped
    before owning_until that its intake takes late is still its own until then), and the other
    takes nothing over."""
    with ros_context() as ctx:
        a, sink_a = _member(ctx, "drain_a", pool="drain")
        b, sink_b = _member(ctx, "drain_b", pool="drain")
        with spinning(a.node, b.node, context=ctx):
            a.activate()
            assert wait_for(lambda: sink_b.keys() == {a.key}, 10)
            b.activate()
            assert wait_for(lambda: sink_a.keys() == {a.key, b.key}, 10)
            start = b.node.get_clock().now().nanoseconds
            b.drain()
            assert b.node.get_clock().now().nanoseconds >= b.owning_until_ns
            assert b.owning_until_ns - start >= 2 * LEASE_MS * 1_000_000
            (entry,) = [m for m in sink_a.views[-1] if m.key == b.key]
            assert entry.owning_until_ns == b.owning_until_ns
            assert sink_b.keys() == {a.key, b.key}  # still its own view after owning_until
            until = b.owning_until_ns
            b.leave()
            assert b.node.get_clock().now().nanoseconds >= until + 2 * LEASE_MS * 1_000_000
            assert wait_for(lambda: sink_a.keys() == {a.key}, 10)
            assert sink_b.keys() == {a.key}
            time.sleep(2 * LEASE_MS / 1000)
            assert not sink_a.takeovers
        _close(a, b)
