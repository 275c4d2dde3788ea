# SPDX-License-Identifier: Apache-2.0
"""A relay pool of real `flowedge-relayd` processes over real DDS on loopback (docs/design.md §13).

Three relays of one pool share one request and one answer topic (each in a namespace of its own,
its flowedge/ topics remapped to the pool's, as launch/pool.launch.py does). The test reads the
pool as any ROS tool can: flowedge/pool, /diagnostics, the relays' flowedge/stats.

Conditions are made on purpose, not left to chance: the sessions are picked from the members'
announced relay_ids so that each member owns a known share (the rendezvous hash is computed here
too, independently of the relays), a victim is killed while it holds queued work it cannot have
answered yet, and every wait is for a state the relays report.
"""

from __future__ import annotations

import collections
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from core_helpers import wait_for
from diagnostic_msgs.msg import DiagnosticArray
from flowedge_relay_msgs.msg import ActionMessage, InferenceRequest, PoolMember, RelayStats
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from relayd import relayds

from flowedge_relay.model import default_model_path, load_model
from flowedge_relay.pool import member_key, pool_qos
from flowedge_relay_tools.harness import build_request, ros_context, spinning

pytestmark = pytest.mark.ros

NS = "/pooltest"
POOL = "pooltest"
# A member silent for a lease is dead to the pool: on a shared 2-core host a relay process can
# wait hundreds of ms for a CPU, so the lease is set above that (as a deployment sets it above its
# host's worst stall); the takeover bound is checked against it.
LEASE_MS = 2000
RELAYS = 3
NFE_DELAY_MS = 50  # x 4 NFE: a request holds its worker 200 ms, so a burst stays queued
QUEUED_DEADLINE_MS = 2000  # a burst queued at a member a stall then kills: past due in the stall
STATS_HZ = 20.0  # the takeover counter is read from flowedge/stats, 50 ms apart
TOPICS = ("flowedge/requests", "flowedge/actions", "flowedge/pool", "flowedge/pool/spill",
          "flowedge/model")


def relay_args(i: int) -> list[str]:
    """Relay i of the pool: its own namespace (node name, parameters, flowedge/stats), the
    pool's request, answer, pool and model topics."""
    args = ["--drill", "--ros-args", "-r", f"__ns:={NS}/r{i}"]
    for topic in TOPICS:
        args += ["-r", f"{topic}:={NS}/{topic}"]
    return args + ["-p", f"pool:={POOL}", "-p", f"pool_lease_ms:={LEASE_MS}",
                   "-p", f"fault_nfe_delay_ms:={float(NFE_DELAY_MS)}",
                   "-p", f"stats_rate_hz:={STATS_HZ}"]


_U64 = (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & _U64
    return h


def mix64(x: int) -> int:
    """splitmix64's finaliser."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _U64
    return x ^ (x >> 31)


def owner(session: str, relay_ids: list[str]) -> str:
    """The rendezvous owner of `session` among `relay_ids`, computed here in Python, apart from
    the C pool the relays run: the highest mix64(key ^ fnv1a64(session)), keys compared last,
    with key = mix64(fnv1a64(relay_id))."""
    h = fnv1a64(session.encode())
    key = {r: mix64(fnv1a64(r.encode())) for r in relay_ids}
    assert all(key[r] == member_key(r) for r in relay_ids)  # the relays' keys, from C
    return max(relay_ids, key=lambda r: (mix64(key[r] ^ h), key[r]))


def sessions_owned(relay_ids: list[str], per_member: int, prefix: str = "robot") -> list[str]:
    """Session ids of which each member of `relay_ids` owns exactly `per_member`."""
    picked: dict[str, list[str]] = {r: [] for r in relay_ids}
    k = 0
    while any(len(v) < per_member for v in picked.values()):
        s = f"{prefix}{k}"
        k += 1
        got = picked[owner(s, relay_ids)]
        if len(got) < per_member:
            got.append(s)
    return [s for v in picked.values() for s in v]


def _ns(t) -> int:
    return t.sec * 1_000_000_000 + t.nanosec


class PoolClient:
    """The test's view of the pool: announcements, pool statuses, answers, the relays' stats;
    and a producer."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.model = load_model(default_model_path())
        self.lock = threading.Lock()
        self.members: dict[str, PoolMember] = {}
        self.owning_until: dict[str, int] = {}  # announced by a draining member
        self.status: dict[str, dict[str, str]] = {}
        self.answers: list[tuple[ActionMessage, int]] = []
        self.takeover_stamps: dict[int, int] = {}  # relay -> ROS ns of its first takeover
        self.sent: dict[tuple[str, int], int] = {}  # (session, sequence) -> origin ROS ns
        self._seq: collections.Counter = collections.Counter()
        qos = QoSProfile(depth=10000, history=HistoryPolicy.KEEP_LAST,
                         reliability=ReliabilityPolicy.RELIABLE)
        node.create_subscription(PoolMember, f"{NS}/flowedge/pool", self._on_member,
                                 pool_qos(LEASE_MS, 64))
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 100)
        node.create_subscription(ActionMessage, f"{NS}/flowedge/actions", self._on_answer, qos)
        for i in range(RELAYS):
            node.create_subscription(RelayStats, f"{NS}/r{i}/flowedge/stats",
                                     lambda m, i=i: self._on_stats(i, m), 100)
        self.pub = node.create_publisher(InferenceRequest, f"{NS}/flowedge/requests", qos)

    def _on_member(self, msg: PoolMember) -> None:
        with self.lock:
            self.members[msg.relay_id] = msg
            if msg.draining:
                self.owning_until[msg.relay_id] = _ns(msg.owning_until)

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        with self.lock:
            for s in msg.status:
                if s.name.endswith(": pool"):
                    self.status[s.name.split(":")[0]] = {kv.key: kv.value for kv in s.values}

    def _on_answer(self, msg: ActionMessage) -> None:
        with self.lock:
            self.answers.append((msg, self.node.get_clock().now().nanoseconds))

    def _on_stats(self, i: int, msg: RelayStats) -> None:
        if msg.takeovers > 0 and i not in self.takeover_stamps:
            self.takeover_stamps[i] = _ns(msg.stamp)

    # -- state -------------------------------------------------------------------------------

    def relay_id(self, i: int) -> str:
        """Relay i's relay_id, from its pool status."""
        wait_for(lambda: "relay_id" in self.status.get(f"{NS[1:]}/r{i}/flowedge_relay", {}), 60)
        return self.status[f"{NS[1:]}/r{i}/flowedge_relay"]["relay_id"]

    def view(self, i: int) -> set[str]:
        with self.lock:
            members = self.status.get(f"{NS[1:]}/r{i}/flowedge_relay", {}).get("members", "")
        return set(members.split(",")) - {"none", ""}

    def wait_views(self, relays: list[int], expected: set[str], timeout: float = 60.0) -> None:
        """Until each of `relays` reports `expected` as its view (the 1 Hz pool status)."""
        ok = wait_for(lambda: all(self.view(i) == expected for i in relays), timeout, 0.1)
        assert ok, {i: self.view(i) for i in relays}

    def now(self) -> int:
        return self.node.get_clock().now().nanoseconds

    # -- traffic -----------------------------------------------------------------------------

    def send(self, session: str, **fields) -> tuple[str, int]:
        """One request of `session`, its next sequence (`fields`: deadline_ms and the like)."""
        self._seq[session] += 1
        key = (session, self._seq[session])
        now = self.now()
        req = build_request(self.model, now, session_id=session, sequence=key[1], **fields)
        with self.lock:
            self.sent[key] = now
        self.pub.publish(req)
        return key

    def load(self, sessions: list[str], rate_hz: float, stop: threading.Event) -> threading.Thread:
        """A steady load over `sessions`, round robin, until `stop`."""

        def run() -> None:
            k, period, t = 0, 1.0 / rate_hz, time.monotonic()
            while not stop.is_set():
                self.send(sessions[k % len(sessions)])
                k += 1
                t += period
                time.sleep(max(t - time.monotonic(), 0.0))

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    @contextmanager
    def under_load(self, sessions: list[str], rate_hz: float) -> Iterator[None]:
        """`load` for the body of the with, stopped and joined however it ends."""
        stop = threading.Event()
        thread = self.load(sessions, rate_hz, stop)
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def busy(self, member: str, sessions: list[str], **fields) -> list[tuple[str, int]]:
        """3 requests of each of `sessions` (a member's own: with NFE_DELAY_MS x 4 NFE each,
        200 ms of work apiece there), returned just after `member` answered one of them: the
        rest are queued or running at it, unanswered, and its next answer is 200 ms of compute
        away, so none of its answers is in flight when the caller acts."""
        burst = [self.send(s, **fields) for s in sessions * 3]

        def answered() -> bool:
            return any(r == member and k in burst for k, r in self.answerers().items())

        assert wait_for(answered, 30, 0.005)
        time.sleep(0.02)
        return burst

    def ledger(self, timeout: float = 60.0) -> collections.Counter:
        """Answers per sent request, once every sent request has one (or the timeout)."""

        def all_answered() -> bool:
            with self.lock:
                got = {(a.session_id, a.sequence) for a, _ in self.answers}
                return set(self.sent) <= got

        wait_for(all_answered, timeout, 0.1)
        time.sleep(1.0)  # a duplicate, if any, has arrived by now
        with self.lock:
            return collections.Counter((a.session_id, a.sequence) for a, _ in self.answers
                                       if (a.session_id, a.sequence) in self.sent)

    def assert_exactly_once(self) -> collections.Counter:
        counts = self.ledger()
        with self.lock:
            missing = [k for k in self.sent if counts[k] == 0]
        duplicated = {k: n for k, n in counts.items() if n > 1}
        assert not missing, f"{len(missing)} of {len(self.sent)} unanswered: {missing[:5]}"
        with self.lock:
            detail = [(a.session_id, a.sequence, a.relay_id, a.code, a.pool_epoch, at,
                       self.sent[(a.session_id, a.sequence)]) for a, at in self.answers
                      if (a.session_id, a.sequence) in duplicated]
        assert not duplicated, f"{len(duplicated)} answered twice: {detail[:6]}"
        return counts

    @contextmanager
    def all_frozen(self, procs: list, burst: list[tuple[str, int]],
                   ids: list[str]) -> Iterator[dict[tuple[str, int], str]]:
        """Every member of `procs` stopped (SIGSTOP) just after each of `ids` answered one of
        `burst` (its next answer 200 ms of compute away), for the body of the with; yields the
        answers seen 0.2 s into the freeze (one on its way at the freeze has arrived by then).
        SIGCONT of all however the body ends."""

        def each_answered_one() -> bool:
            by = self.answerers()
            return all(any(by.get(k) == r for k in burst) for r in ids)

        assert wait_for(each_answered_one, 30, 0.005)
        time.sleep(0.02)
        for p in procs:
            os.kill(p.pid, signal.SIGSTOP)
        try:
            time.sleep(0.2)
            yield self.answerers()
        finally:
            for p in procs:
                os.kill(p.pid, signal.SIGCONT)

    def frozen_until_taken_over(self, proc, burst: list[tuple[str, int]], survivors: list[int],
                                expected: set[str]) -> list[tuple[str, int]]:
        """SIGSTOP of `proc` until `survivors` report `expected` as their view (they declared
        it dead and took it over) and for more than lease + margin, then SIGCONT however it
        ends: a state the pool reports, not a guess. Returns the requests of `burst` unanswered
        0.2 s into the freeze (an answer on its way at the freeze has arrived by then)."""
        os.kill(proc.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            time.sleep(0.2)
            held = [k for k in burst if k not in self.answerers()]
            self.wait_views(survivors, expected)
            time.sleep(max(LEASE_MS / 1000 + 0.5 - (time.monotonic() - frozen_at), 0.0))
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        return held

    def answerers(self) -> dict[tuple[str, int], str]:
        with self.lock:
            return {(a.session_id, a.sequence): a.relay_id for a, _ in self.answers}

    def reset(self) -> None:
        with self.lock:
            self.answers.clear()
            self.sent.clear()

    def still_up(self, procs: list, ids: list[str]) -> list[int]:
        """The members whose process still runs (a test before may have stopped one), at least
        two, each listing just them; the ledger reset."""
        live = [i for i in range(RELAYS) if procs[i].poll() is None]
        assert len(live) >= 2, "a takeover needs another member"
        self.wait_views(live, {ids[i] for i in live})
        self.reset()
        return live

    def ensure_active(self, i: int, ids: list[str]) -> None:
        """Relay i active and every member listing the three (a test that failed before may
        have left it inactive)."""
        with self.lock:
            active = self.members[ids[i]].state == 3
        if not active:
            self.change_state(i, Transition.TRANSITION_ACTIVATE)
        self.wait_views(list(range(RELAYS)), set(ids))

    def change_state(self, i: int, transition: int, timeout: float = 120.0) -> None:
        client = self.node.create_client(ChangeState, f"{NS}/r{i}/flowedge_relay/change_state")
        try:
            assert client.wait_for_service(timeout_sec=30)
            future = client.call_async(ChangeState.Request(
                transition=Transition(id=transition)))
            assert wait_for(future.done, timeout, 0.05), "the transition did not return"
            assert future.result().success
        finally:
            self.node.destroy_client(client)


@contextmanager
def pool_client(name: str) -> Iterator[tuple[PoolClient, list[str]]]:
    """A PoolClient spinning once every relay lists all three in its view and takes requests;
    with the relays' ids (also for test/pool_lan_client.py, in another network namespace)."""
    with ros_context() as ctx:
        node = Node(name, context=ctx)
        client = PoolClient(node)
        with spinning(node, context=ctx):
            ids = [client.relay_id(i) for i in range(RELAYS)]
            client.wait_views(list(range(RELAYS)), set(ids))
            assert wait_for(lambda: client.pub.get_subscription_count() >= RELAYS, 60)
            yield client, ids
        node.destroy_node()


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    """Three relays of one pool, each with the others in its view, and the test's client."""
    tmp = tmp_path_factory.mktemp("pool")
    with relayds(tmp, *[relay_args(i) for i in range(RELAYS)]) as procs, \
            pool_client("pool_test_client") as (client, ids):
        yield client, procs, ids


def test_every_request_is_answered_once_by_its_sessions_owner(pool):
    """3 members on one request topic: each request answered exactly once, by the rendezvous
    owner of its session; sessions spread over all members, the others drop (not_owner)."""
    client, _, ids = pool
    client.ensure_active(2, ids)
    client.reset()
    sessions = sessions_owned(ids, 4)
    for _ in range(5):
        for s in sessions:
            client.send(s)
    client.assert_exactly_once()
    by = client.answerers()
    wrong = {k: r for k, r in by.items() if r != owner(k[0], ids)}
    assert not wrong, f"answered by a member that does not own the session: {wrong}"
    assert collections.Counter(by.values()) == {r: 20 for r in ids}
    assert all(int(client.status[f"{NS[1:]}/r{i}/flowedge_relay"]["pool_members"]) == RELAYS
               for i in range(RELAYS))


def test_deactivate_drains_a_member_without_loss(pool):
    """Under steady load, lifecycle deactivate of one member: it announces owning_until, decides
    what it owns until then, answers all it admitted and leaves; every request is answered once,
    and none stamped from owning_until on by the member that left. Reactivated, it rejoins."""
    client, _, ids = pool
    client.ensure_active(2, ids)
    client.reset()
    sessions = sessions_owned(ids, 3, "drain")
    stop = threading.Event()
    thread = client.load(sessions, 30.0, stop)
    try:
        time.sleep(1.0)
        client.change_state(2, Transition.TRANSITION_DEACTIVATE)
        left = client.members[ids[2]]  # deactivate returned: the announcement came before
        assert left.state == 2 and not left.draining  # announced inactive once drained
        client.wait_views([0, 1], {ids[0], ids[1]})
        time.sleep(1.0)
    finally:
        stop.set()
        thread.join()
    client.assert_exactly_once()
    until = client.owning_until[ids[2]]
    with client.lock:
        stamps = dict(client.sent)
    by = client.answerers()
    mine = [k for k, r in by.items() if r == ids[2]]
    assert any(until - 2 * LEASE_MS * 1_000_000 <= stamps[k] < until for k in mine), \
        "the draining member decided nothing in its drain window: no drain was exercised"
    assert not [k for k in mine if stamps[k] >= until]
    assert all(by[k] != ids[2] for k in stamps if stamps[k] >= until)
    client.change_state(2, Transition.TRANSITION_ACTIVATE)
    client.wait_views(list(range(RELAYS)), set(ids))


def test_a_joining_member_takes_only_its_sessions_without_duplicates(pool):
    """A member joins a pool of two under load: from its owning_from on it answers exactly the
    sessions the hash gives it (1/3 of them, chosen so), the others keep theirs, requests
    stamped before owning_from stay with their old owner, and nothing is answered twice."""
    client, _, ids = pool
    client.ensure_active(2, ids)
    client.change_state(2, Transition.TRANSITION_DEACTIVATE)
    client.wait_views([0, 1], {ids[0], ids[1]})
    client.reset()
    sessions = sessions_owned(ids, 10, "join")  # 10 of 30 are the joiner's once it owns
    stop = threading.Event()
    thread = client.load(sessions, 60.0, stop)
    try:
        time.sleep(1.0)
        client.change_state(2, Transition.TRANSITION_ACTIVATE)
        joined = client.members[ids[2]]
        owning_from = _ns(joined.owning_from)
        assert owning_from > 0, "a joiner of a running pool owns from a cutover, not at once"
        assert wait_for(lambda: client.now() > owning_from + 1_000_000_000, 30)
        client.wait_views(list(range(RELAYS)), set(ids))
    finally:
        stop.set()
        thread.join()
    client.assert_exactly_once()
    by = client.answerers()
    with client.lock:
        stamps = dict(client.sent)
    before = {k[0]: r for k, r in by.items() if stamps[k] < owning_from}
    after = {k[0]: r for k, r in by.items() if stamps[k] >= owning_from}
    moved = {s for s in sessions if before.get(s) and after.get(s) and before[s] != after[s]}
    assert moved == {s for s in sessions if owner(s, ids) == ids[2]}
    assert all(after[s] == ids[2] for s in moved)
    assert len(moved) / len(sessions) <= 1 / RELAYS + 0.10
    assert all(r != ids[2] for k, r in by.items() if stamps[k] < owning_from)


def test_a_frozen_member_surrenders_what_it_held_and_each_request_is_answered_once(pool):
    """SIGSTOP of one member of three under load while it holds queued and running work, for
    longer than lease + the stall margin (until both others have taken it over), then SIGCONT:
    the survivors answer what it held, it publishes none of it (counted surrendered) and decides
    none of the requests delivered to it late; every request is answered exactly once, and it
    rejoins with a new epoch."""
    client, procs, ids = pool
    client.ensure_active(2, ids)
    client.reset()
    victim = 0
    name = f"{NS[1:]}/r{victim}/flowedge_relay"
    sessions = sessions_owned(ids, 3, "freeze")
    victims = [s for s in sessions if owner(s, ids) == ids[victim]]
    epoch = client.members[ids[victim]].epoch
    with client.under_load(sessions, 12.0):
        time.sleep(1.0)
        burst = client.busy(ids[victim], victims)  # freeze while it holds the rest
        held = client.frozen_until_taken_over(procs[victim], burst, [1, 2], {ids[1], ids[2]})
        assert held, "the victim held no unanswered work at the freeze: nothing to surrender"
        client.wait_views(list(range(RELAYS)), set(ids))  # it rejoined
        time.sleep(1.0)
    client.assert_exactly_once()
    by = client.answerers()
    assert all(by[k] != ids[victim] for k in held), "the frozen member answered what it held"
    assert wait_for(lambda: int(client.status[name].get("surrendered", 0)) > 0, 10)
    assert int(client.status[name]["stalls"]) >= 1
    assert client.members[ids[victim]].epoch > epoch
    print(f"{len(held)} requests held at the freeze, answered by the others; victim "
          f"surrendered {client.status[name]['surrendered']}")


def test_a_stall_of_every_member_at_once_leaves_no_request_unanswered(pool):
    """SIGSTOP of all three members under load, while each holds queued and running work, for
    longer than lease + the stall margin, then SIGCONT of all (a whole-host stall): each finds
    its own stall and surrenders, but nobody was there to take its work over. What each would
    have dropped is held and consulted against the answers watch (docs/design.md §13.2): every
    request sent before, during and after the stall is answered, once, or again only by a
    member with another relay_id or pool_epoch (the named window; counted and printed here)."""
    client, procs, ids = pool
    client.ensure_active(2, ids)
    client.reset()
    sessions = sessions_owned(ids, 2, "stall")
    names = [f"{NS[1:]}/r{i}/flowedge_relay" for i in range(RELAYS)]
    stalls = [int(client.status[n]["stalls"]) for n in names]
    before = [(int(client.status[n].get("held", 0)), int(client.status[n].get("held_released", 0)))
              for n in names]
    with client.under_load(sessions, 12.0):
        time.sleep(1.0)
        burst = [client.send(s) for s in sessions * 3]  # 1.2 s of work at each member
        with client.all_frozen(procs, burst, ids) as answered:
            held = [k for k in burst if k not in answered]
            time.sleep(LEASE_MS / 1000 + 0.4)  # past lease + margin: each one's own stall
        resumed = time.monotonic()
        assert held, "no member held unanswered work at the stall: nothing was at risk"
        assert wait_for(lambda: all(int(client.status[n]["stalls"]) > s
                                    for n, s in zip(names, stalls, strict=True)), 30)
        client.wait_views(list(range(RELAYS)), set(ids))  # all rejoined
        time.sleep(1.0)
    # held work is due at most 6 leases + margin after the stall was found (a successor's copy
    # of a request without a deadline: max + 3 leases, + 2; or one of its own that arrived 2
    # leases after, + 3 + 1): wait past that, so that a late duplicate would be seen too
    left = (6 * LEASE_MS + 100) / 1000 + 1.0 - (time.monotonic() - resumed)
    time.sleep(max(left, 0.0))
    counts = client.ledger()
    with client.lock:
        missing = [k for k in client.sent if counts[k] == 0]
        tags = collections.defaultdict(list)
        for a, _ in client.answers:
            tags[(a.session_id, a.sequence)].append((a.relay_id, a.pool_epoch))
        sent = len(client.sent)
    assert not missing, f"{len(missing)} of {sent} unanswered: {missing[:5]}"
    duplicated = {k: tags[k] for k, n in counts.items() if n > 1}
    untagged = {k: t for k, t in duplicated.items() if len(set(t)) < len(t)}
    assert not untagged, f"answered twice by one member and epoch: {untagged}"
    after = [(int(client.status[n]["held"]), int(client.status[n]["held_released"]))
             for n in names]
    # each member held work of its own (the rule under test ran at every member), and what
    # nobody else answered (the requests sent during the stall) was answered by its holder
    assert all(a[0] > b[0] for a, b in zip(after, before, strict=True)), (before, after)
    assert sum(a[1] - b[1] for a, b in zip(after, before, strict=True)) > 0, (before, after)
    print(f"{len(held)} requests held at the stall; {sent} sent, 0 unanswered, "
          f"{len(duplicated)} answered twice (tagged); held, released before {before}, "
          f"after {after}")


def test_kill_9_under_load_every_request_is_answered_once_and_taken_over_in_time(pool):
    """kill -9 of one member of three under load, while it holds queued work: every request
    sent before, during and after is answered exactly once (the survivors answer the victim's
    unanswered ones), and the survivors start the takeover within lease + 100 ms of the kill."""
    client, procs, ids = pool
    client.ensure_active(2, ids)
    client.reset()
    victim = 1
    sessions = sessions_owned(ids, 3, "kill")
    victims = [s for s in sessions if owner(s, ids) == ids[victim]]
    with client.under_load(sessions, 12.0):
        time.sleep(1.0)
        burst = client.busy(ids[victim], victims)  # no answer of the victim in flight now
        killed_at = client.now()
        print("killed at", killed_at)
        os.kill(procs[victim].pid, signal.SIGKILL)
        procs[victim].wait(timeout=10)
        client.wait_views([0, 2], {ids[0], ids[2]})
        time.sleep(1.0)
    client.assert_exactly_once()
    by = client.answerers()
    taken = [k for k in burst if by[k] != ids[victim]]
    assert taken, "the victim held no unanswered work at the kill: no takeover was exercised"
    survivors = [i for i in range(RELAYS) if i != victim]
    assert wait_for(lambda: all(i in client.takeover_stamps for i in survivors), 10)
    delay_ms = max(client.takeover_stamps[i] - killed_at for i in survivors) / 1e6
    print(f"takeover {delay_ms:.0f} ms after kill -9 (lease {LEASE_MS} ms); "
          f"{len(taken)} of the victim's requests answered by survivors")
    # the counter is seen at most one stats period late
    assert delay_ms <= LEASE_MS + 100 + 1000 / STATS_HZ


def test_an_owner_killed_in_a_stall_of_every_member_loses_none_of_its_requests(pool):
    """SIGSTOP of every member still up under load, while one holds queued work due in 2 s,
    kill -9 of that one while all are stopped, SIGCONT of the rest past lease + margin and past
    the queued work's deadline + lease: a whole-host stall in which a member dies. The
    survivors' copies of its queued work outlive their deadline until the death can be judged
    (the first pass after the stall does not expire them); what was sent to its sessions during
    the stall reaches the survivors only after their own stall, stamped before their exclusion,
    and the survivor that ranks each such session second keeps a copy. The dead owner's
    takeover holds both kinds and answers them when due (docs/design.md §13.2). Every request
    is answered once, or again only by another relay_id or pool_epoch. Runs on the members
    still up (after the kill test above: two)."""
    client, procs, ids = pool
    live = client.still_up(procs, ids)
    victim, survivors = live[0], live[1:]
    live_ids = [ids[i] for i in live]
    sessions = sessions_owned(live_ids, 2, "dies")
    victims = {s for s in sessions if owner(s, live_ids) == ids[victim]}
    # 4 requests/s of 200 ms: one survivor keeps up alone
    with client.under_load(sessions, 4.0):
        time.sleep(1.0)
        burst = client.busy(ids[victim], sorted(victims), deadline_ms=QUEUED_DEADLINE_MS)
        sent_at = time.monotonic()
        for i in live:
            os.kill(procs[i].pid, signal.SIGSTOP)
        frozen_at = client.now()
        queued = [k for k in burst if k not in client.answerers()]
        try:  # past lease + margin (each one's own stall) and the queued work's deadline + lease
            time.sleep(max(LEASE_MS / 1000 + 0.4, (QUEUED_DEADLINE_MS + LEASE_MS) / 1000 + 0.5
                           - (time.monotonic() - sent_at)))
            os.kill(procs[victim].pid, signal.SIGKILL)
            procs[victim].wait(timeout=10)
        finally:
            for i in survivors:
                os.kill(procs[i].pid, signal.SIGCONT)
        resumed_at = client.now()
        client.wait_views(survivors, {ids[i] for i in survivors})
        time.sleep(1.0)
    # a held copy is due at most 6 leases + margin after the stall was found: wait past that,
    # so that a late duplicate would be seen too
    time.sleep((6 * LEASE_MS + 100) / 1000 + 1.0)
    counts = client.ledger()
    with client.lock:
        stalled = [k for k, at in client.sent.items()
                   if k[0] in victims and frozen_at <= at < resumed_at]
        missing = [k for k in client.sent if counts[k] == 0]
        tags = collections.defaultdict(list)
        for a, _ in client.answers:
            tags[(a.session_id, a.sequence)].append((a.relay_id, a.pool_epoch))
        sent = len(client.sent)
    assert stalled, "nothing was sent to the dead member's sessions during the stall"
    assert queued, "the member killed held no queued work at the stall: nothing was at risk"
    lost = [k for k in stalled if counts[k] == 0]
    lost_queued = [k for k in queued if counts[k] == 0]
    assert not missing, (f"{len(missing)} of {sent} unanswered, {len(lost)} of the "
                         f"{len(stalled)} sent to the dead member during the stall, "
                         f"{len(lost_queued)} of the {len(queued)} queued at it: {missing[:5]}")
    untagged = {k: t for k, t in tags.items() if len(set(t)) < len(t)}
    assert not untagged, f"answered twice by one member and epoch: {untagged}"
    by = client.answerers()
    assert all(by[k] in {ids[i] for i in survivors} for k in stalled + queued)
    print(f"{len(queued)} requests queued at the member killed and {len(stalled)} sent to its "
          f"sessions during the stall, all answered by the survivors; {sent} sent, 0 unanswered, "
          f"{sum(1 for t in tags.values() if len(t) > 1)} answered twice (tagged)")


def test_without_a_pool_nothing_of_it_exists_and_spill_changes_nothing():
    """`pool` empty (the default) is a single relay: no pool topic, thread or status, the pool
    fields of RelayStats 0. `pool_spill: true` there, at start or on a live set, is accepted and
    changes nothing: no spill topic, no sender thread (spill needs a pool)."""
    from rclpy.parameter import Parameter
    from ros_helpers import running_relay

    with running_relay(pool_spill=True) as h:
        assert h.node.relay_pool is None
        topics = {name for name, _ in h.client.get_topic_names_and_types()}
        assert "/flowedge/pool" not in topics and "/flowedge/actions" in topics
        assert "/flowedge/pool/spill" not in topics
        threads = {t.name for t in threading.enumerate()}
        assert "flowedge-pool" not in threads and "flowedge-spill" not in threads

        def names() -> set[str]:
            return {st.name for array in list(h.diagnostics) for st in array.status}

        assert wait_for(lambda: "flowedge_relay: admission" in names(), 30)  # its own arrays
        assert "flowedge_relay: pool" not in names()
        (result,) = h.node.set_parameters([Parameter("pool_spill", value=False)])
        assert result.successful and h.node.relay_pool is None
