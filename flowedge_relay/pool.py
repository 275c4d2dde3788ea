# SPDX-License-Identifier: Apache-2.0
"""Pool membership (docs/design.md §13): who is in the relay pool, from DDS alone.

Why here and not in C: membership changes a few times a lease at most; what must be fast (the
ownership test on every request, the standby table, the takeover) is in C (csrc/fer_pool.c).
This module only announces this member, follows the others and pushes each new view down.

- Each member publishes a PoolMember on `flowedge/pool` (reliable, transient local, liveliness
  MANUAL_BY_TOPIC with lease `pool_lease_ms`) on every change and every lease / 3: each publish
  is the liveliness assertion DDS checks. No heartbeat protocol of our own: a member learns of a
  death from DDS (a liveliness-changed event), and the announcements' stamps tell which member
  lapsed (hosts of a pool keep synchronised clocks, as deadlines already require).
- The view: the live members whose state is active (a draining member stays until it says it
  left), each with its key, digests and the window [owning_from, owning_until) of request
  origin stamps it owns. Every member computes the same owner for the same request.
- A member lost by death (not by a drain) is taken over: the C core re-decides the requests it
  kept as that member's successor.
- Its own stall: a member silent for more than lease + 100 ms may have been declared dead and
  taken over. The C pool finds it (whichever thread acts first: the intake, a publisher, this
  module's timer), holds every output of work that arrived before (dropped once another member's
  answer names it, published when due and unanswered: docs/design.md §13.2) and decides no
  request stamped before its rejoin; this module then bumps the epoch and rejoins with a new
  owning_from.

Threads: the subscription, its event and the timer run in one callback group, spun by a thread
of its own (RelayPool.start): a main executor behind on diagnostics, stats or parameter calls
must not delay the announcements, since a member whose announcements stop for a lease is dead to
the pool. The lifecycle hooks (activate, drain, leave) run in the lifecycle group. A lock keeps
the member table and this member's own state consistent between them.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from flowedge_relay_msgs.msg import ActionMessage, PoolMember, PoolSpill
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.duration import Duration
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.qos import (
    DurabilityPolicy,
    HistoryPolicy,
    LivelinessPolicy,
    QoSProfile,
    ReliabilityPolicy,
)

from flowedge_relay.core import lib
from flowedge_relay.producer import ACTIONS_TOPIC, answers_qos
from flowedge_relay.rcl_abi import load_wire
from flowedge_relay.timebase import ros_time

POOL_TOPIC = "flowedge/pool"
#: handovers of spill on capacity (docs/design.md §13.5): reliable, volatile
SPILL_TOPIC = "flowedge/pool/spill"
#: how long the spill sender waits for a handover before it looks at its stop flag
SPILL_WAIT_NS = 100_000_000
MS = 1_000_000
#: held work is due at most this many leases + the stall margin after the watermark (a
#: successor's copy without a deadline: + 3 leases, + 2; one of its own arriving 2 leases late)
HOLD_SETTLE_LEASES = 6
#: lifecycle_msgs/State ids a member announces
UNCONFIGURED, INACTIVE, ACTIVE, FINALIZED = 1, 2, 3, 4
#: a member silent longer than lease + this may have been declared dead and taken over (the
#: takeover bound the pool promises is lease + this, docs/design.md §13); the C pool's, which
#: applies it
STALL_MARGIN_NS = int(lib.FER_POOL_STALL_MARGIN_NS)
#: the subscription keeps this many announcements unread: a joiner gets every member's latched
#: one at once (KEEP_LAST 1 applies per writer on the writer's side; a reader of depth 1 would
#: keep only the last of them, since PoolMember has no key)
READER_DEPTH = 64
#: at activation, how long a member waits for the announcements of the writers discovery has
#: already matched (transient local delivers them just after matching), in leases
DISCOVERY_WAIT_LEASES = 2
HEARD_MAX = 4096

def member_key(relay_id: str) -> int:
    """A member's 64-bit key in the rendezvous hash (the C pool's: splitmix64 of FNV-1a)."""
    from flowedge_relay.core import pool_key

    return pool_key(relay_id)


_RELAY_ID: list[str] = []


def relay_id() -> str:
    """`<hostname>-<pid>-<8 hex random>`, made once per process."""
    if not _RELAY_ID:
        _RELAY_ID.append(f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}")
    return _RELAY_ID[0]


def pool_qos(lease_ms: int, depth: int = 1) -> QoSProfile:
    """flowedge/pool's QoS: reliable, transient local, KEEP_LAST, liveliness MANUAL_BY_TOPIC with
    the pool's lease (a reader's lease is what it requests; a writer's is what DDS enforces)."""
    return QoSProfile(
        depth=depth, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL, liveliness=LivelinessPolicy.MANUAL_BY_TOPIC,
        liveliness_lease_duration=Duration(nanoseconds=lease_ms * MS),
    )


def _ns(t) -> int:
    return int(t.sec) * 1_000_000_000 + int(t.nanosec)


@dataclass(frozen=True)
class ViewMember:
    """One member as the C ownership test needs it (ROS ns; 0 = unbounded)."""

    relay_id: str
    key: int
    owning_from_ns: int
    owning_until_ns: int
    digests: tuple[str, ...]
    #: its announced bound (docs/design.md §13.5), filled only while this member spills; workers
    #: 0 = not a spill target (draining, or spill off here)
    workers: int = 0
    nfe_ns: int = 0
    admission_reserve_ns: int = 0
    queue_depth: int = 0


@dataclass
class _Member:
    msg: PoolMember
    key: int

    @property
    def stamp_ns(self) -> int:
        return _ns(self.msg.stamp)

    @property
    def in_view(self) -> bool:
        return self.msg.state == ACTIVE

    def view(self, spill: bool = False) -> ViewMember:
        m = self.msg
        bound = (m.workers, m.nfe_ns, m.admission_reserve_ns, m.queue_depth) \
            if spill and not m.draining else (0, 0, 0, 0)
        return ViewMember(m.relay_id, self.key, _ns(m.owning_from), _ns(m.owning_until),
                          tuple(m.model_digests), *bound)


@dataclass(frozen=True)
class Served:
    """What this member announces about what it serves, read from the node when announcing."""

    digests: tuple[str, ...]
    workers: int
    nfe_ns: int
    admission_reserve_ns: int
    queue_depth: int

    @staticmethod
    def by(relay, p: dict) -> Served:
        """What a relay.Relay serves (nothing yet while its node is being built: the membership
        announces at once), read under its core lock; `p` the node's parameter values."""
        digests, depth = relay.served() if relay is not None else ((), 0)
        return Served(digests=digests, workers=p["workers"], nfe_ns=p["nfe_ns"],
                      admission_reserve_ns=p["admission_reserve_ns"], queue_depth=depth)


class PoolMembership:
    """This relay's membership of pool `name`, on `node` (a RelayNode or any rclpy node).

    `served()` tells what is served now; `sink` is where views, epochs, takeovers and
    surrenders go (the C pool of the serving core: `CorePoolSink` below, or a test's recorder).
    """

    def __init__(self, node, name: str, lease_ms: int, served: Callable[[], Served],
                 sink, member_id: str | None = None) -> None:
        self.node = node
        self.name = name
        self.lease_ns = int(lease_ms) * MS
        self.relay_id = member_id or relay_id()  # another id: several members in one process
        self.key = member_key(self.relay_id)
        self.host = socket.gethostname()
        self._served = served
        self.sink = sink
        self._lock = threading.RLock()
        self.state = INACTIVE
        self.draining = False
        self.epoch = 0  # 1 at the first activation
        self.owning_from_ns = 0
        self.owning_until_ns = 0
        self.owning = False  # in its own view: active, or draining until it leaves
        self._drain_stopped: Callable[[], bool] = lambda: False  # the drain's stop flag
        self.spill = False  # pool_spill: the view carries the others' bounds (§13.5)
        self._members: dict[str, _Member] = {}
        #: relay_id -> (epoch, ROS ns) when declared dead: an older announcement cannot revive it
        self._dead: dict[str, tuple[int, int]] = {}
        self._heard: set[str] = set()  # every writer heard from (any pool), for discovery
        self._not_alive = 0  # writers on flowedge/pool DDS reports not alive now
        self._watch_until = 0  # monotonic: judge the stamps at each tick until then
        self._rejudge = None  # a one-shot timer: judge again when a lapsed stamp is a lease old
        self.deaths = 0
        self.stalls = 0
        self.last_takeover_ns = 0  # monotonic, when the last death was handed to the core
        self._view: tuple[ViewMember, ...] | None = None
        self._digests: tuple[str, ...] = ()  # served now, as of the latest announcement
        self._surrender_seen = 0  # the C pool's own-stall watermark this member rejoined after
        self.closed = False
        self.group = MutuallyExclusiveCallbackGroup()
        self._pub = node.create_publisher(PoolMember, POOL_TOPIC, pool_qos(lease_ms),
                                          callback_group=self.group)
        self._sub = node.create_subscription(
            PoolMember, POOL_TOPIC, self._on_member, pool_qos(lease_ms, READER_DEPTH),
            callback_group=self.group,
            event_callbacks=SubscriptionEventCallbacks(liveliness=self._on_liveliness))
        self._timer = node.create_timer(self.lease_ns / 3e9, self._tick, callback_group=self.group)
        self.publish()

    # -- time -------------------------------------------------------------------------------

    def _now_ros(self) -> int:
        return self.node.get_clock().now().nanoseconds

    # -- this member -----------------------------------------------------------------------

    def announcement(self, s: Served) -> PoolMember:
        return PoolMember(
            pool=self.name, relay_id=self.relay_id, host=self.host,
            model_digest=s.digests[0] if s.digests else "", model_digests=list(s.digests),
            state=self.state, draining=self.draining, workers=s.workers, nfe_ns=s.nfe_ns,
            admission_reserve_ns=s.admission_reserve_ns, queue_depth=s.queue_depth,
            epoch=self.epoch, owning_from=ros_time(self.owning_from_ns),
            owning_until=ros_time(self.owning_until_ns), stamp=ros_time(self._now_ros()))

    def publish(self) -> None:
        """Announce this member (also the liveliness assertion)."""
        served = self._served()  # not under this lock: the node reads its core under its own
        with self._lock:
            if self.closed:
                return
            if served.digests != self._digests:
                self._digests = served.digests
                self._push_view()
            msg = self.announcement(served)
        try:
            self._pub.publish(msg)
        except Exception:
            if self.node.context.ok():
                raise
            return
        if self.epoch:  # owned once (nothing to surrender before): alive from here for the
            # others (the C pool checks the gap first, so this never hides a stall)
            self.sink.alive(time.monotonic_ns())

    def _others_active(self) -> bool:
        return any(m.in_view for m in self._members.values())

    def _wait_for_discovery(self) -> None:
        """Until every writer discovery matched on flowedge/pool has been heard from (its latched
        announcement arrives just after matching), at most DISCOVERY_WAIT_LEASES leases: a
        member that joins a running pool must know it is not alone."""
        end = time.monotonic_ns() + DISCOVERY_WAIT_LEASES * self.lease_ns
        while time.monotonic_ns() < end:
            writers = self._sub.get_publisher_count() - 1  # less its own
            with self._lock:
                heard = len(self._heard)
            if heard >= writers:
                return
            time.sleep(0.01)

    def activate(self) -> None:
        """Become an owner: a new epoch; owning_from = now + 2 x lease when other members are
        active (requests stamped before then stay with their owners: a join moves no request in
        flight), unbounded when none is (the pool starts with this member)."""
        self._wait_for_discovery()
        with self._lock:
            self._become_owner(alone=not self._others_active())
        self.publish()

    def _become_owner(self, alone: bool) -> None:
        self.epoch += 1
        self.state = ACTIVE
        self.draining = False
        self.owning = True
        self.owning_from_ns = 0 if alone else self._now_ros() + 2 * self.lease_ns
        self.owning_until_ns = 0
        self.sink.set_epoch(self.epoch)
        self._push_view()

    def drain(self, stopped: Callable[[], bool] = lambda: False) -> None:
        """Stop owning: announce owning_until = now + 2 x lease and keep deciding what is owned
        until then (every member has the announcement by then: requests stamped later go to
        their next owner, the earlier ones stay here). Returns at owning_until (or at stop)."""
        with self._lock:
            if not self.owning:
                return
            self.draining = True
            self.owning_until_ns = self._now_ros() + 2 * self.lease_ns
            until = self.owning_until_ns
            self._push_view()
            self._drain_stopped = stopped
        self.publish()
        while self._now_ros() < until and not stopped():
            time.sleep(0.005)

    def leave(self, state: int = INACTIVE) -> None:
        """Out of the pool's view (after a drain has answered all it admitted), or announce an
        unconfigured or finalized member: never a takeover, since nothing is left.

        After a drain it stays in the view, answering what it still owns (REJECTED_CAPACITY,
        no longer accepting), until owning_until + 2 x lease: a request stamped just before
        owning_until that its intake takes late (a busy host) is still its own then. Leaving at
        once dropped it: the others had ranked it to this member and kept no decision of it."""
        with self._lock:
            until = self.owning_until_ns + 2 * self.lease_ns if self.draining else 0
            stopped = self._drain_stopped
        while self._now_ros() < until and not stopped():
            time.sleep(0.005)
        with self._lock:
            self.owning = False
            self.draining = False
            self.state = state
            self.owning_from_ns = self.owning_until_ns = 0
            self._push_view()
        self.publish()

    # -- the others ------------------------------------------------------------------------

    def _on_member(self, msg: PoolMember) -> None:
        if msg.relay_id == self.relay_id:
            return
        with self._lock:
            if len(self._heard) >= HEARD_MAX:
                self._heard.clear()
            self._heard.add(msg.relay_id)
        if msg.pool != self.name:
            return
        with self._lock:
            dead = self._dead.get(msg.relay_id)
            if dead is not None:
                if msg.epoch <= dead[0] and _ns(msg.stamp) <= dead[1]:
                    return  # sent before it was declared dead: it stays dead
                del self._dead[msg.relay_id]
            if msg.state in (UNCONFIGURED, FINALIZED):
                gone = self._members.pop(msg.relay_id, None)
                if gone is not None and gone.in_view:  # stopped without a drain
                    self._push_view()
                    self._take_over(gone, "stopped without draining")
            else:
                member = self._members.get(msg.relay_id)
                self._members[msg.relay_id] = _Member(
                    msg, member.key if member else member_key(msg.relay_id))
            self._push_view()

    def _on_liveliness(self, info) -> None:
        """DDS says a writer on flowedge/pool changed liveliness: the stamps tell which member
        lapsed (announcements waiting to be read are read first: a live member's newest one may
        be among them)."""
        with self._lock:
            self._not_alive = int(info.not_alive_count)
            lapsed = info.not_alive_count_change > 0 or info.alive_count_change < 0
            if lapsed:  # a writer that went away leaves no not-alive count: watch a while
                self._watch_until = time.monotonic_ns() + 3 * self.lease_ns
        if lapsed:
            self._drain_announcements()
            self._judge("on DDS's lost-liveliness event")

    def _drain_announcements(self) -> None:
        from flowedge_relay.executors import take_waiting

        take_waiting(self._sub, self._on_member, READER_DEPTH)

    def _judge(self, found: str) -> None:
        """Every member whose newest announcement is older than the lease is dead (called while
        DDS reports a lapsed writer). One silent for over half a lease (a live member announces
        every lease / 3) is judged again the moment its stamp is a lease old: DDS's event can
        come a hair before that, and the next tick would be up to a third of a lease late."""
        now = self._now_ros()
        due = None
        with self._lock:
            for rid, member in list(self._members.items()):
                past = now - member.stamp_ns - self.lease_ns
                if past <= 0:
                    if -past < self.lease_ns // 2:
                        due = -past if due is None else min(due, -past)
                    continue
                del self._members[rid]
                self._dead[rid] = (member.msg.epoch, now)
                self.deaths += 1
                if member.in_view:
                    self._push_view()
                    self._take_over(member, f"lost its liveliness (found {found}, "
                                            f"{past / MS:.0f} ms past its last stamp + lease)")
        if due is not None:
            self._judge_again(due + MS)

    def _judge_again(self, delay_ns: int) -> None:
        if self.closed:
            return
        if self._rejudge is not None:
            self.node.destroy_timer(self._rejudge)
        self._rejudge = self.node.create_timer(delay_ns / 1e9, self._on_rejudge,
                                               callback_group=self.group)

    def _on_rejudge(self) -> None:
        timer, self._rejudge = self._rejudge, None
        if timer is not None:
            self.node.destroy_timer(timer)  # one shot
        self._judge("as its lease ran out")

    def _take_over(self, member: _Member, why: str) -> None:
        """The requests this member kept as `member`'s successor are decided here now."""
        self.sink.takeover(member.key)
        self.last_takeover_ns = time.monotonic_ns()
        self.node.get_logger().warning(
            f"pool {self.name}: member {member.msg.relay_id} {why}; its sessions are taken over")

    def _tick(self) -> None:
        """Every lease / 3: the own-stall check, the announcement (liveliness), and while DDS
        reports a lapsed writer, the stamps again (an event can come before a stamp is a lease
        old where clocks differ by a few ms)."""
        now = time.monotonic_ns()
        with self._lock:
            # found here, or already by the intake or a publisher if they ran first
            mark = self.sink.stall_check(now)
            stalled = self.owning and mark > self._surrender_seen
            self._surrender_seen = max(self._surrender_seen, mark)
            if stalled:
                self.stalls += 1
                self._surrender_seen = self.sink.surrender(now)
                draining, until = self.draining, self.owning_until_ns
                # always from a cutover: its table of the others is stale after the stall, and
                # it owns nothing stamped before 2 x lease from the surrender (the C pool)
                self._become_owner(alone=False)
                if draining:  # a drain goes on, with its own cutover
                    self.draining, self.owning_until_ns = True, until
                    self._push_view()
        if stalled:
            self.node.get_logger().warning(
                f"pool {self.name}: this member was silent for more than the lease + "
                f"{STALL_MARGIN_NS // MS} ms; its work was surrendered, epoch {self.epoch}")
        self.publish()
        if self._not_alive > 0 or now < self._watch_until:
            self._judge("at the lease / 3 tick")

    # -- the view --------------------------------------------------------------------------

    def view(self) -> tuple[ViewMember, ...]:
        """The members that own requests now (this one included while it owns), by key."""
        with self._lock:
            members = [m.view(self.spill) for m in self._members.values() if m.in_view]
            if self.owning:
                members.append(ViewMember(self.relay_id, self.key, self.owning_from_ns,
                                          self.owning_until_ns, self._digests))
        return tuple(sorted(members, key=lambda m: m.key))

    def _push_view(self) -> None:
        # an own stall is judged against the view it happened in, before any change to it
        self.sink.stall_check(time.monotonic_ns())
        view = self.view()
        if view != self._view:
            self._view = view
            self.sink.set_view(view)

    def set_spill(self, on: bool) -> None:
        """pool_spill: the view carries the others' announced bounds (spill targets)."""
        with self._lock:
            self.spill = bool(on)
            self._push_view()

    def values(self) -> dict[str, object]:
        """The pool status on /diagnostics (the C counters are added by the node)."""
        with self._lock:
            view = self.view()
            return {
                "pool": self.name,
                "relay_id": self.relay_id,
                "pool_epoch": self.epoch,
                "pool_members": len(view),
                "members": ",".join(m.relay_id for m in view) or "none",
                "owning": self.owning,
                "draining": self.draining,
                "owning_from_ns": self.owning_from_ns,
                "owning_until_ns": self.owning_until_ns,
                "pool_lease_ms": self.lease_ns // MS,
                "deaths_seen": self.deaths,
                "stalls": self.stalls,
            }

    def close(self, state: int = UNCONFIGURED) -> None:
        """Announce `state` (cleanup: unconfigured; shutdown: finalized) and leave the topic."""
        if self.closed:
            return
        self.leave(state)
        with self._lock:
            self.closed = True
        node = self.node
        for destroy, entity in ((node.destroy_timer, self._timer),
                                (node.destroy_timer, self._rejudge),
                                (node.destroy_subscription, self._sub),
                                (node.destroy_publisher, self._pub)):
            try:
                destroy(entity)
            except Exception:  # the node already gone (teardown)
                pass


class CorePoolSink:
    """Where the membership's decisions go: the C pool (core.Pool) all cores' intakes share."""

    def __init__(self, pool) -> None:
        self.pool = pool

    def set_view(self, view: tuple[ViewMember, ...]) -> None:
        from flowedge_relay.core import PoolViewMember

        self.pool.set_view([PoolViewMember(m.key, m.digests, m.owning_from_ns,
                                           m.owning_until_ns, m.workers, m.nfe_ns,
                                           m.admission_reserve_ns, m.queue_depth, m.relay_id)
                            for m in view])

    def set_epoch(self, epoch: int) -> None:
        self.pool.set_epoch(epoch)

    def takeover(self, key: int) -> None:
        self.pool.takeover(key)

    def alive(self, now_mono: int) -> None:
        self.pool.alive(now_mono)

    def stall_check(self, now_mono: int) -> int:
        return self.pool.stall_check(now_mono)

    def surrender(self, now_mono: int) -> int:
        """After this member's own stall: what it held may have been taken over, so the C
        publishers hold it until another member's answer drops it or it is due."""
        return self.pool.surrender(now_mono)


class RelayPool:
    """A relay node's pool (created only with `pool` set): the C pool its intakes and publisher
    share, the answers watch (flowedge/actions, taken in C by the intake loop: an answer clears
    the standby entry of its request) and the membership on flowedge/pool."""

    def __init__(self, node, p: dict, served: Callable[[], Served]) -> None:
        from flowedge_relay.core import Pool

        lease_ms = int(p["pool_lease_ms"])
        load_wire()  # the C pool reads answers and reads and writes handovers through the plans
        self.c = Pool(relay_id(), p["pool_standby_entries"], p["pool_standby_bytes"],
                      lease_ms * MS)
        self.lease_ns = lease_ms * MS
        # reliable, as deep as a robot's answer subscription (producer.py)
        self.answers = node.create_subscription(
            ActionMessage, ACTIONS_TOPIC, lambda _msg: None, answers_qos(),
            callback_group=node.requests.group, raw=True)
        self.membership = PoolMembership(node, p["pool"], lease_ms, served,
                                         CorePoolSink(self.c))
        self._node = node
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Spill (§13.5): every member takes the handovers naming it, whatever its own
        # pool_spill (another member may spill to it); its own spill sender runs once on.
        spill_qos = QoSProfile(depth=int(lib.FER_POOL_SPILL_SLOTS),
                               history=HistoryPolicy.KEEP_LAST,
                               reliability=ReliabilityPolicy.RELIABLE)
        self._spill_pub = node.create_publisher(PoolSpill, SPILL_TOPIC, spill_qos,
                                                callback_group=self.group)
        self._spill_sub = node.create_subscription(PoolSpill, SPILL_TOPIC, self._on_spill,
                                                   spill_qos, callback_group=self.group, raw=True)
        self._sender: threading.Thread | None = None
        self.spill_lost = 0  # give-backs its in box could not take within lease / 4
        self.set_spill(bool(p["pool_spill"]))

    def set_spill(self, on: bool) -> None:
        """pool_spill (at start and on a live set): hand a would-be REJECTED_CAPACITY to the
        request's successor when its announced bound fits."""
        if on and self._sender is None:
            self._sender = threading.Thread(target=self._send_spills, name="flowedge-spill",
                                            daemon=True)
            self._sender.start()
        self.membership.set_spill(on)
        self.c.set_spill(on)

    def _send_spills(self) -> None:
        """The spill sender: each handover the C intake made, published as it is (CDR)."""
        while not self._stop.is_set():
            cdr = self.c.spill_next(SPILL_WAIT_NS)
            if cdr is None:
                continue
            try:
                self._spill_pub.publish(cdr)
            except Exception:
                if self._node.context.ok():
                    raise
                return

    def _on_spill(self, cdr: bytes) -> None:
        """A handover on flowedge/pool/spill: the intake thread decides it if it names this
        member. One its full in box cannot take is given back to its owner at once, which
        answers it itself. A give-back of this member's own handover is waited for: a full in
        box for at most lease / 4 (the announcements share this thread), then it is lost,
        counted and logged (docs/design.md §13.5, both in boxes full)."""
        from flowedge_relay.core import RingFull

        end = time.monotonic_ns() + self.lease_ns // 4
        while True:
            try:
                if self.c.spill_in(cdr, time.monotonic_ns()) == lib.FER_POOL_SPILL_GIVE_BACK:
                    self._spill_pub.publish(self.c.spill_give_back(cdr))
                return
            except RingFull:
                if time.monotonic_ns() >= end:
                    break
                time.sleep(0.001)
        self.spill_lost += 1
        self._node.get_logger().error(
            "pool: a handover given back to this member found its in box full; it is lost")

    @property
    def group(self):
        """The membership's callback group, which only the pool's own thread spins."""
        return self.membership.group

    def start(self, context) -> None:
        """Spin the membership on a thread of its own (see the module docstring)."""
        from flowedge_relay.executors import RequestExecutor, spin_until

        executor = RequestExecutor([self._node], [self.group], context=context)
        self._thread = threading.Thread(target=spin_until, args=(executor, self._stop),
                                        name="flowedge-pool", daemon=True)
        self._thread.start()

    def configured(self) -> None:
        self.membership.leave(INACTIVE)

    def activate(self) -> None:
        self.membership.activate()

    def drain(self, stopped: Callable[[], bool]) -> None:
        self.membership.drain(stopped)

    def leave(self, state: int = INACTIVE) -> None:
        self.membership.leave(state)

    def settle_held(self, stopped: Callable[[], bool] = lambda: False) -> None:
        """Before a stop (SIGINT / SIGTERM, cleanup) after an own stall: wait, while the intake
        still reads the answers watch and the workers finish what came before the watermark
        (held as it finishes), until the latest due of held work without a deadline (6 leases +
        the stall margin after the watermark). A survivor that took the work over has answered
        it by then, so the publisher's last pass, which answers what is still held, duplicates
        only work with a later deadline (docs/design.md §13.2). Waiting only while something
        was held let the stop run before the workers' outcomes were held: duplicates."""
        mark = self.c.stall_check(time.monotonic_ns())  # a stall not found yet is found here
        if not mark:
            return
        bound = mark + HOLD_SETTLE_LEASES * self.lease_ns + int(lib.FER_POOL_STALL_MARGIN_NS)
        while time.monotonic_ns() < bound and not stopped():
            time.sleep(0.005)

    def values(self) -> dict[str, object]:
        """The `pool` status on /diagnostics: the membership, then the C counters."""
        c = self.c.counters()
        return {**self.membership.values(),
                **{k: getattr(c, k) for k in c.__dataclass_fields__ if k != "key"},
                "spill_lost": self.spill_lost}

    def close(self) -> None:
        """At the node's end, after the intake loop and the publishers stopped."""
        self._stop.set()
        for thread in (self._thread, self._sender):
            if thread is not None:
                thread.join(timeout=2.0)
        c = self.c.counters()  # the publishers stopped: every held outcome has ended
        self._node.get_logger().info(
            f"pool at stop: held {c.held}, released {c.held_released}, surrendered "
            f"{c.surrendered}, hold_full {c.hold_full}, holding {self.c.holding()}")
        self.membership.close(FINALIZED)
        self.c.close()
