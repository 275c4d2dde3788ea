# SPDX-License-Identifier: Apache-2.0
"""`bench pool`: a relay pool of real `flowedge-relayd` processes over DDS (docs/design.md §13).

    flowedge_relay_bench pool [--quick] [--members 3] [--lease-ms 1000] [--load 2]
                              [--spill-only | --intake-only] [--intake-members 1 2 4]
                              [--intake-rates R ...] [--json PATH] [--plot PATH.png]

Each relay runs as deployed, in a namespace of its own with the pool's topics remapped to one
shared set (as launch/pool.launch.py does), in the bench's private DDS domain. Admission is
calibrated: an inline calibration (`calibrate.inline`) of one relay with as many worker lanes as
the whole pool has (the members share this host's cores, so the pool's lanes contend as one
relay's would) gives `nfe_ns` and `admission_reserve_ns` for every member, and the pool's
capacity is the NFE per second admission bounds, members x workers x 1e9 / nfe_ns. A robot-like
rclpy node in this process offers `--load` x that (Poisson arrivals over sessions picked so each
member owns as many, NFE and slack uniform) and stamps every answer as it receives it.

- (a) kill -9 of one member of three under that load: answers per (session_id, sequence) sent
  before the kill, during the takeover (up to the survivors' takeover counter) and after:
  missing and duplicated (targets 0 and 0); the takeover latency from the kill to the survivors'
  takeover counter (flowedge/stats at 20 Hz, so seen up to 50 ms late) and to the first answer a
  survivor gave for one of the victim's sessions (target <= lease + 100 ms); on time among
  admitted across the pool at receipt (target >= 99.9%). A request of the victim's sessions
  answered by a survivor is taken over; answered EXPIRED with no NFE done it was expired when the
  takeover decided it (not admitted there) and is counted apart.
- (b) a member joins the other two under load (lifecycle activate): the sessions whose answering
  member changed across its owning_from (target <= 1/N + 10%), whether they all moved to it, and
  duplicates (target 0).
- (c) a member frozen with SIGSTOP for `--freeze-s` then SIGCONT: missing (0) and duplicates
  (target 0; a duplicate is tagged when its answers differ in relay_id or pool_epoch, so a
  producer keeping the first drops the stale one), what the frozen member counted `surrendered`
  and its stalls, what the others took over.
- (d) the aggregate intake of one pool of 1, 2 and 4 members on this host: a C load generator
  (bench/loadgen.py) floods expired-on-arrival requests over 64 sessions, so the figure is the
  decision path, not compute. Every member takes every request off DDS (a successor keeps a
  standby copy) and drops the ones it does not own in the C intake, so only the decisions split.
  Per pool size the offered rate steps up a ramp (to the ~40,000/s the generator sends) until a
  step is short (a request unanswered or answered twice, one lost in DDS or dropped on output,
  or the generator behind its schedule), then once halfway back: the highest rate answered in
  full is the size's ceiling here, bounded by this host, whose cores the members share with the
  generator (os.sched_getaffinity; printed). Per step, the CPU time (utime + stime,
  /proc/<pid>/stat) of this process (the generator) and of each member, less the member's share
  at rest: CPU-us per request taken, per owned decision (the pool of one's at the same rate) and
  per not_owner drop (the rest), and the pool's decisions/s with one core per member: each
  member's decisions per CPU-second of load on the core its rest leaves, summed, but no more
  than the busiest member takes (every member takes every request), which the host does not
  bound. Sizes compare at the highest rate all of them answered in full (a member's CPU per
  request falls as the rate rises); there, over every member of every size, the decision's and
  the drop's CPU-us by least squares. Next to it, the C intake's not_owner drop against a full
  decision (bench/pool_sim.py's measurement).
  `--intake-only` runs (d) alone (uncalibrated: its requests are never admitted).
- (f) one owner pushed past its capacity (a queue of 2; 2x what one member serves, from the
  calibration's mean compute per NFE, on its sessions, since at 2x admission's p99 bound a
  member served all with room to spare; slack 2-6 leases so its refusals are capacity ones)
  with `pool_spill` off, then on: answered once, duplicated, spilled, on time and goodput side
  by side. `--spill-only` runs (f) alone.

Targets are printed, never asserted. A measurement on a shared host: the load average is recorded.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from flowedge_relay_msgs.msg import ActionMessage, PoolMember, RelayStats
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters

from flowedge_relay.core import Code, Pool, PoolViewMember
from flowedge_relay.pool import pool_qos
from flowedge_relay.timebase import stamp_ns
from flowedge_relay_tools.bench import calibrate, pool_sim
from flowedge_relay_tools.bench.client import (
    RELAY_MODULE,
    BenchClient,
    NodeProcess,
    model_path,
    private_context,
    relay_for_bench,
    relay_ros_args,
    warm_up,
)
from flowedge_relay_tools.bench.host import cpu_seconds, host_info
from flowedge_relay_tools.bench.progress import Progress
from flowedge_relay_tools.bench.tables import VERDICT, format_rows, percent
from flowedge_relay_tools.harness import load_served, spinning, wait_for, wait_for_relay

#: the pool's topics every member shares (launch/pool.launch.py remaps the same four)
TOPICS = ("flowedge/requests", "flowedge/actions", "flowedge/pool", "flowedge/pool/spill",
          "flowedge/model")
TARGETS = {"missing": 0, "duplicated": 0, "on_time_among_admitted": 0.999,
           "takeover_over_lease_ms": 100, "moved_over_fair_share": 0.10}  # fmt: skip
NFE_RANGE = (4, 16)  # NFE per request of the robot-like load
STATS_HZ = 20.0
MS = 1_000_000


@dataclass(frozen=True)
class Size:
    cal_requests: int
    cal_s: float
    before_s: float  # load before the event
    after_s: float  # load after the event (after the cutover, for a join)
    sessions_per_member: int
    intake_rates: tuple[float, ...]  # (d): the ramp of offered requests/s, up to a short step
    intake_s: float  # (d): seconds per step
    intake_idle_s: float  # (d): seconds each pool size's members are watched at rest


#: (d)'s full ramp: up to the ~40,000 requests/s one C load generator sends on a 2-core host
FULL_RAMP = (2000.0, 4000.0, *(8000.0 + 4000.0 * k for k in range(9)))
SIZES = {"quick": Size(12, 0.3, 0.8, 1.0, 2, (500.0, 2000.0), 0.4, 0.5),
         "full": Size(150, 2.0, 2.0, 2.5, 8, FULL_RAMP, 1.0, 2.0)}  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="tiny sizes (CI)")
    parser.add_argument("--members", type=int, default=3, help="members of the pool in a-c")
    parser.add_argument("--workers", type=int, default=1, help="worker threads per member")
    parser.add_argument("--lease-ms", type=int, default=None,
                        help="pool_lease_ms (default 1000; 500 --quick): above the worst stall "
                             "of a shared 2-core host, so only the bench's events take over")
    parser.add_argument("--load", type=float, default=2.0,
                        help="x the pool's calibrated capacity in a-c (default 2)")
    parser.add_argument("--freeze-s", type=float, default=None,
                        help="(c) seconds frozen (default 2; 1.2 --quick)")
    parser.add_argument("--slack-ms", type=float, nargs=2, default=None, metavar=("MIN", "MAX"),
                        help="deadline slack per request (default 100 .. 2 x lease)")
    parser.add_argument("--nfe-ns", type=int, default=None,
                        help="skip the calibration: this nfe_ns")
    parser.add_argument("--admission-reserve-ns", type=int, default=0,
                        help="with --nfe-ns: this admission_reserve_ns (default 0)")
    parser.add_argument("--intake-members", type=int, nargs="+", default=[1, 2, 4],
                        help="(d) pool sizes (default 1 2 4)")
    parser.add_argument("--intake-rates", type=float, nargs="+", default=None,
                        help="(d) the ramp of offered requests/s, stepped up until the pool is "
                             "short (default 2000 4000 8000 .. 40000; quick 500 2000)")
    parser.add_argument("--intake-only", action="store_true",
                        help="run (d) only: each pool size's ceiling and CPU per request")
    parser.add_argument("--udp", action="store_true",
                        help="Fast DDS over UDPv4 only (FASTDDS_BUILTIN_TRANSPORTS=UDPv4), for "
                             "the relays and this process: no shared-memory transport")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--spill-only", action="store_true",
                        help="run (f) only: an owner past its capacity, pool_spill off and on")


# ---- the pool's processes and what they report ---------------------------------------------


def member_args(ns: str, pool: str, i: int, params: dict) -> list[str]:
    """Member i's --ros-args: its own namespace, the pool's four topics remapped to ns's."""
    args = relay_ros_args({**params, "pool": pool}, f"{ns}/r{i}")
    for topic in TOPICS:
        args += ["-r", f"{topic}:={ns}/{topic}"]
    return args


@dataclass
class Member:
    """One flowedge-relayd of the pool and what the bench read from it."""

    index: int
    proc: NodeProcess
    relay_id: str = ""
    stats: list = field(default_factory=list)  # RelayStats, in arrival order
    status: dict = field(default_factory=dict)  # its `pool` status on /diagnostics
    announced: PoolMember | None = None

    @property
    def pid(self) -> int:
        return self.proc.proc.pid

    def alive(self) -> bool:
        return self.proc.proc.poll() is None


def start_members(ns: str, pool: str, indices: list[int], params: dict) -> list[Member]:
    """flowedge-relayd once per index, started side by side (each up: "relay up" logged)."""
    out: dict[int, Member] = {}
    errors: list[BaseException] = []

    def start(i: int) -> None:
        try:
            out[i] = Member(i, NodeProcess(RELAY_MODULE, member_args(ns, pool, i, params),
                                           timeout=120.0))
        except BaseException as exc:  # surfaced below, after the others are up or failed
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(i,)) for i in indices]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        stop_members(list(out.values()))
        raise errors[0]
    return [out[i] for i in indices]


def stop_members(members: list[Member]) -> None:
    """SIGCONT first (a frozen member cannot stop), then SIGINT each; a killed one is gone."""
    for m in members:
        if m.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(m.pid, signal.SIGCONT)
    for m in members:
        m.proc.stop()


class PoolWatch:
    """The pool as any ROS tool sees it: each member's flowedge/stats and `pool` status, the
    announcements on flowedge/pool; and its lifecycle services."""

    def __init__(self, node, ns: str, members: list[Member], lease_ms: int) -> None:
        self.node, self.ns = node, ns
        self.members = {m.index: m for m in members}
        self.lock = threading.Lock()
        self.cv = threading.Condition(self.lock)
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 100)
        node.create_subscription(PoolMember, f"{ns}/flowedge/pool", self._on_member,
                                 pool_qos(lease_ms, 64))
        for m in members:
            self.add(m)

    def add(self, m: Member) -> None:
        self.members[m.index] = m
        self.node.create_subscription(RelayStats, f"{self.ns}/r{m.index}/flowedge/stats",
                                      lambda msg, m=m: self._on_stats(m, msg), 100)

    def _on_stats(self, m: Member, msg: RelayStats) -> None:
        with self.cv:
            m.stats.append(msg)
            self.cv.notify_all()

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        with self.cv:
            for s in msg.status:
                for m in self.members.values():
                    if s.name == f"{self.ns[1:]}/r{m.index}/flowedge_relay: pool":
                        m.status = {kv.key: kv.value for kv in s.values}
                        m.relay_id = m.status.get("relay_id", m.relay_id)
            self.cv.notify_all()

    def _on_member(self, msg: PoolMember) -> None:
        with self.cv:
            for m in self.members.values():
                if m.relay_id == msg.relay_id:
                    m.announced = msg

    def relay_ids(self, timeout: float = 60.0) -> None:
        if not wait_for(lambda: all(m.relay_id for m in self.members.values()), timeout, 0.05):
            raise TimeoutError("a member published no pool status")

    def view(self, m: Member) -> set[str]:
        with self.lock:
            return set(m.status.get("members", "").split(",")) - {"none", ""}

    def wait_views(self, members: list[Member], timeout: float = 60.0) -> None:
        """Until each of `members` lists exactly them as the pool (its 1 Hz status)."""
        want = {m.relay_id for m in members}
        if not wait_for(lambda: all(self.view(m) == want for m in members), timeout, 0.05):
            raise TimeoutError(f"views did not settle: {[self.view(m) for m in members]}")

    def snapshot(self, m: Member, timeout: float = 10.0) -> RelayStats:
        """The first stats message stamped after this call (it counts all that came before)."""
        since = time.time_ns()
        end = time.monotonic() + timeout
        with self.cv:
            while not m.stats or stamp_ns(m.stats[-1].stamp) < since:
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no fresh flowedge/stats from member {m.index}")
                self.cv.wait(min(left, 0.05))
            return m.stats[-1]

    def first_stamp(self, m: Member, since_ns: int, counter: str,
                    above: int) -> tuple[int, int] | None:  # fmt: skip
        """(the stamp of m's last stats message with `counter` still at most `above`, that of
        its first one after since_ns with it above): the counter moved between the two."""
        with self.lock:
            last = since_ns
            for s in m.stats:
                if getattr(s, counter) > above and stamp_ns(s.stamp) >= since_ns:
                    return last, stamp_ns(s.stamp)
                last = max(last, stamp_ns(s.stamp))
        return None

    def change_state(self, m: Member, transition: int, timeout: float = 60.0) -> None:
        client = self.node.create_client(
            ChangeState, f"{self.ns}/r{m.index}/flowedge_relay/change_state")
        try:
            if not client.wait_for_service(timeout_sec=30):
                raise TimeoutError(f"no lifecycle service of member {m.index}")
            future = client.call_async(ChangeState.Request(transition=Transition(id=transition)))
            if not wait_for(future.done, timeout, 0.02) or not future.result().success:
                raise RuntimeError(f"member {m.index}: transition {transition} failed")
        finally:
            self.node.destroy_client(client)


def decided(s: RelayStats) -> int:
    """Every outcome the member decided (one per answer it published or dropped)."""
    return (s.inference + s.rejected_stale + s.rejected_deadline + s.rejected_capacity
            + s.expired + s.inference_failed)


COUNTERS = ("received", "not_owner", "takeovers", "taken_over_requests", "surrendered",
            "middleware_lost", "standby_evicted", "held", "held_released", "hold_full",
            "held_requests_decided")


def counters(s: RelayStats) -> dict[str, int]:
    out = {k: int(getattr(s, k)) for k in COUNTERS}
    out["decided"] = decided(s)
    out["outputs_dropped"] = int(s.rejection_outputs_dropped + s.action_outputs_dropped)
    return out


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after}


def balanced(d: dict[str, int]) -> bool:
    """A member's books balance: every request it took it decided as owner or dropped as
    not_owner, and every request it took over, or held after a stall and found unanswered when
    due, it decided again (so, at rest, decided + not_owner = received + taken_over_requests +
    held_requests_decided, whatever the events)."""
    return d["decided"] + d["not_owner"] == (d["received"] + d["taken_over_requests"]
                                             + d["held_requests_decided"])


def settled(watch: PoolWatch, members: list[Member], before: dict[int, dict[str, int]],
            ok=lambda per: all(balanced(d) for d in per.values()),
            timeout: float = 15.0) -> dict[int, dict[str, int]]:  # fmt: skip
    """Each member's counters since `before`, once `ok` holds for them (a request still on its
    way to one member, or in its queue, is counted when it is done) or the timeout ran out."""
    end = time.monotonic() + timeout
    while True:
        per = {m.index: delta(counters(watch.snapshot(m)), before[m.index])
               for m in members if m.alive()}
        if ok(per) or time.monotonic() > end:
            return per


# ---- the robot-like load and its ledger ----------------------------------------------------


@dataclass(frozen=True)
class Got:
    """One answer as received: who gave it, with what."""

    code: int
    relay_id: str
    epoch: int
    nfe_done: int
    received_ns: int


class PoolClient(BenchClient):
    """A BenchClient on the pool's topics that keeps every answer, with relay_id and pool_epoch
    (an ordinary subscriber: a whole ActionMessage per answer, as a robot receives them)."""

    def __init__(self, node, info) -> None:
        self.log: dict[tuple[str, int], list[Got]] = collections.defaultdict(list)
        super().__init__(node, info, plain=True)

    def _on_message(self, msg: ActionMessage) -> None:
        got = Got(msg.code, msg.relay_id, msg.pool_epoch, msg.nfe_done, time.time_ns())
        with self._cv:
            self.log[(msg.session_id, msg.sequence)].append(got)
        super()._on_message(msg)

    def answers_to(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], list[Got]]:
        """Every answer received so far to each of `keys`, in arrival order."""
        with self._cv:
            return {k: list(self.log.get(k, ())) for k in keys}


@dataclass(frozen=True)
class Sent:
    key: tuple[str, int]
    sent_ns: int
    deadline_ns: int


class Load:
    """Poisson arrivals at `rate` over `sessions`, from a thread, until stopped."""

    def __init__(self, client: PoolClient, sessions: list[str], rate: float,
                 slack_ns: tuple[int, int], seed: int) -> None:  # fmt: skip
        self.client, self.sessions, self.rate, self.slack = client, sessions, rate, slack_ns
        self.rng = random.Random(seed)
        self.sent: list[Sent] = []
        self.behind_max_ns = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pool-bench-load", daemon=True)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        c, rng, t = self.client, self.rng, time.monotonic_ns()
        while not self._stop.is_set():
            t += int(rng.expovariate(self.rate) * 1e9)
            req = c.request(rng.choice(self.sessions), c.next_sequence(),
                            rng.randint(*NFE_RANGE))
            delay = t - time.monotonic_ns()
            if delay > 0:
                time.sleep(delay * 1e-9)
            self.behind_max_ns = max(self.behind_max_ns, -delay)
            slack = rng.randint(*self.slack)
            at = c.send(req, slack_ns=slack)
            self.sent.append(Sent((req.session_id, req.sequence), at, at + slack))


def ledger(client: PoolClient, sent: list[Sent], drain_s: float) -> dict:
    """Answers per sent request once all are in (or the drain ran out), a duplicate's grace
    after: the first answer per request, and every duplicate with its answers' tags."""
    client.wait_keys([s.key for s in sent], drain_s)
    time.sleep(0.5)  # a duplicate, if any, has arrived by now
    log = client.answers_to([s.key for s in sent])
    missing = [k for k, v in log.items() if not v]
    dups = {k: v for k, v in log.items() if len(v) > 1}
    tagged = sum(len({(g.relay_id, g.epoch) for g in v}) == len(v) for v in dups.values())
    return {"log": log, "missing": missing, "duplicated": dups, "tagged": tagged}


def outcome_counts(sent: list[Sent], log: dict, taken: set) -> dict:
    """On time among admitted at receipt, over the first answer per request; a taken-over
    request answered EXPIRED with no NFE done was decided expired at the takeover (apart)."""
    c = collections.Counter()
    for s in sent:
        answers = log[s.key]
        if not answers:
            continue
        g = answers[0]
        if s.key in taken:
            c["taken_over"] += 1
            if g.code == Code.EXPIRED and g.nfe_done == 0:
                c["taken_over_expired"] += 1
                continue
        if g.code == Code.INFERENCE:
            c["admitted"] += 1
            c["on_time" if g.received_ns <= s.deadline_ns else "late"] += 1
        elif g.code == Code.EXPIRED:
            c["expired" if g.nfe_done else "expired_unstarted"] += 1
        elif g.code == Code.REJECTED_CAPACITY:
            c["rejected_capacity"] += 1
        elif g.code == Code.REJECTED_DEADLINE:
            c["rejected_deadline"] += 1
        else:
            c["other"] += 1
    # admitted: INFERENCE, or EXPIRED after it was queued (the relay kept it to its end)
    c["admitted"] += c["expired"] + c["expired_unstarted"]
    out = dict(c)
    out["on_time_among_admitted"] = c["on_time"] / c["admitted"] if c["admitted"] else None
    return out


def answer_rates(sent: list[Sent], log: dict, t0_ns: int, bin_ms: int = 100) -> dict:
    """Answers per second by answering member over receive time (the plot)."""
    by: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for s in sent:
        for g in log[s.key]:
            by[g.relay_id][(g.received_ns - t0_ns) // (bin_ms * MS)] += 1
    last = max((k for c in by.values() for k in c), default=0)
    # every bin, empty ones at 0: a member that answers nothing for a while shows it
    return {rid: [(k * bin_ms / 1e3, c[k] * 1000 / bin_ms) for k in range(int(last) + 1)]
            for rid, c in by.items()}


# ---- the scenarios -------------------------------------------------------------------------


@dataclass
class Bench:
    """The pool of a-c, its watch and its client, and how each scenario loads it."""

    members: list[Member]
    watch: PoolWatch
    client: PoolClient
    sessions: list[str]
    owner_of: dict[str, int]  # session -> member index owning it with every member in the view
    rate: float
    slack_ns: tuple[int, int]
    lease_ns: int
    size: Size
    seed: int
    t0_ns: int = 0

    def load(self, offset: int) -> Load:
        return Load(self.client, self.sessions, self.rate, self.slack_ns, self.seed + offset)

    def drain_s(self) -> float:
        return self.slack_ns[1] / 1e9 + 4 * self.lease_ns / 1e9 + 5.0

    def totals(self) -> dict[int, dict[str, int]]:
        return {m.index: counters(self.watch.snapshot(m)) for m in self.members if m.alive()}

    def since(self, before: dict[int, dict[str, int]]) -> dict[int, dict[str, int]]:
        return settled(self.watch, self.members, before)

    def common(self, sent: list[Sent], led: dict, taken: set, t0: int) -> dict:
        counts = collections.Counter(len(v) for v in led["log"].values())
        return {
            "sent": len(sent), "answered_once": counts[1], "missing": len(led["missing"]),
            "duplicate_answers": sum(len(v) for v in led["duplicated"].values()),
            "duplicated": len(led["duplicated"]), "duplicates_tagged": led["tagged"],
            "answers": sum(n * k for k, n in counts.items()),
            "outcomes": outcome_counts(sent, led["log"], taken),
            "send_behind_max_ms": None, "answer_rates": answer_rates(sent, led["log"], t0),
            "duplicate_detail": [
                {"session": k[0], "sequence": k[1],
                 "answers": [{"relay_id": g.relay_id, "epoch": g.epoch, "code": g.code}
                             for g in v]} for k, v in list(led["duplicated"].items())[:8]],
        }  # fmt: skip


def join(b: Bench, joiner: Member) -> dict:
    """(b): `joiner` leaves (drain), then joins the others under load."""
    others = [m for m in b.members if m is not joiner]
    b.watch.change_state(joiner, Transition.TRANSITION_DEACTIVATE)
    b.watch.wait_views(others)
    before = b.totals()
    t0 = time.time_ns()
    with b.load(1) as load:
        time.sleep(b.size.before_s)
        epoch = joiner.announced.epoch if joiner.announced is not None else 0
        activate_at = time.time_ns()
        b.watch.change_state(joiner, Transition.TRANSITION_ACTIVATE)

        def active():
            a = joiner.announced
            return a is not None and a.state == 3 and a.epoch > epoch

        if not wait_for(active, 30, 0.01):
            raise TimeoutError("the joiner announced no activation")
        owning_from = stamp_ns(joiner.announced.owning_from)
        wait_for(lambda: time.time_ns() > owning_from + b.size.after_s * 1e9, 60, 0.02)
    b.watch.wait_views(b.members)
    led = ledger(b.client, load.sent, b.drain_s())
    per = b.since(before)
    stamps = {s.key: s.sent_ns for s in load.sent}
    first = {k: v[0].relay_id for k, v in led["log"].items() if v}
    pre = {k[0]: r for k, r in first.items() if stamps[k] < owning_from}
    post = {k[0]: r for k, r in first.items() if stamps[k] >= owning_from}
    # only sessions with requests on both sides of the cutover can show a move
    seen = {s for s in b.sessions if s in pre and s in post}
    moved = {s for s in seen if pre[s] != post[s]}
    to_joiner = {s for s in moved if post[s] == joiner.relay_id}
    joiners = {s for s in seen if b.owner_of[s] == joiner.index}
    out = b.common(load.sent, led, set(), t0)
    n = len(b.members)
    out.update({
        "joiner": joiner.relay_id, "owning_from_ms": (owning_from - t0) / MS,
        "events_ms": {"activate": (activate_at - t0) / MS, "owning_from": (owning_from - t0) / MS},
        "sessions": len(seen), "sessions_offered": len(b.sessions), "moved": len(moved),
        "moved_to_joiner": len(to_joiner), "joiner_owns_by_hash": len(joiners),
        "moved_exactly_the_joiners": moved == joiners,
        "moved_share": len(moved) / len(seen) if seen else None, "fair_share": 1 / n,
        "answered_by_joiner_before_owning_from": sum(
            1 for k, r in first.items() if r == joiner.relay_id and stamps[k] < owning_from),
        "members": per, "books_balance": all(balanced(d) for d in per.values()),
        "send_behind_max_ms": load.behind_max_ns / MS,
    })  # fmt: skip
    share = out["moved_share"]
    out["met"] = {"moved": None if share is None
                  else share <= 1 / n + TARGETS["moved_over_fair_share"],
                  "duplicated": out["duplicated"] == 0}
    return out


def freeze(b: Bench, frozen: Member, seconds: float) -> dict:
    """(c): `frozen` stopped with SIGSTOP for `seconds`, then SIGCONT, under load."""
    before = b.totals()
    epoch_before = int(frozen.status.get("pool_epoch", 0))
    stalls_before = int(frozen.status.get("stalls", 0))
    t0 = time.time_ns()
    with b.load(2) as load:
        time.sleep(b.size.before_s)
        stopped_at = time.time_ns()
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        resumed_at = time.time_ns()
        time.sleep(b.size.after_s)
        # it rejoins with a new owning_from (2 x lease on): load on until every view has it
        b.watch.wait_views(b.members, timeout=60)
    led = ledger(b.client, load.sent, b.drain_s())
    per = b.since(before)
    stamps = {s.key: s.sent_ns for s in load.sent}
    by_frozen_late = sum(
        1 for k, v in led["log"].items() for g in v
        if g.relay_id == frozen.relay_id and g.received_ns >= resumed_at and stamps[k] < resumed_at)
    second_by_frozen = sum(1 for v in led["duplicated"].values()
                           if any(g.relay_id == frozen.relay_id for g in v[1:]))
    out = b.common(load.sent, led, set(), t0)
    out.update({
        "frozen": frozen.relay_id, "frozen_s": (resumed_at - stopped_at) / 1e9,
        "frozen_surrendered": per[frozen.index]["surrendered"],
        "frozen_stalls": int(frozen.status.get("stalls", 0)) - stalls_before,
        "frozen_epoch": [epoch_before, int(frozen.status.get("pool_epoch", 0))],
        "frozen_answered_after_resume_sent_before": by_frozen_late,
        "duplicates_second_by_frozen": second_by_frozen,
        "others_took_over": sum(d["taken_over_requests"] for i, d in per.items()
                                if i != frozen.index),
        "members": per, "books_balance": all(balanced(d) for d in per.values()),
        "send_behind_max_ms": load.behind_max_ns / MS,
        "events_ms": {"stop": (stopped_at - t0) / MS, "cont": (resumed_at - t0) / MS},
    })  # fmt: skip
    out["met"] = {"missing": out["missing"] == 0,
                  "duplicated": out["duplicated"] == 0,
                  "duplicates_tagged": out["duplicates_tagged"] == out["duplicated"]}
    return out


def kill(b: Bench, victim: Member) -> dict:
    """(a): kill -9 of `victim` under load."""
    survivors = [m for m in b.members if m is not victim]
    before = b.totals()
    base = {m.index: before[m.index]["takeovers"] for m in survivors}
    t0 = time.time_ns()
    with b.load(3) as load:
        time.sleep(b.size.before_s)
        killed_at = time.time_ns()
        os.kill(victim.pid, signal.SIGKILL)
        victim.proc.proc.wait(timeout=10)
        b.watch.wait_views(survivors, timeout=30)
        time.sleep(b.size.after_s)
    led = ledger(b.client, load.sent, b.drain_s())
    per = b.since(before)
    counter_at = {m.index: b.watch.first_stamp(m, killed_at, "takeovers", base[m.index])
                  for m in survivors}
    stamps = [v[1] for v in counter_at.values() if v is not None]
    # judged on the later stamp of each pair (at most a stats period late: conservative)
    takeover_done = max(stamps) if len(stamps) == len(survivors) else None
    victims = {s for s in b.sessions if b.owner_of[s] == victim.index}
    taken = {k for k, v in led["log"].items()
             if v and k[0] in victims and v[0].relay_id != victim.relay_id}
    first_taken = min((v[0].received_ns for k, v in led["log"].items() if k in taken),
                      default=None)
    out = b.common(load.sent, led, taken, t0)
    phases = {"before": lambda t: t < killed_at,
              "during": lambda t: killed_at <= t < (takeover_done or killed_at),
              "after": lambda t: t >= (takeover_done or killed_at)}
    for name, within in phases.items():
        keys = [s.key for s in load.sent if within(s.sent_ns)]
        out[name] = {"sent": len(keys),
                     "missing": sum(1 for k in keys if not led["log"][k]),
                     "duplicated": sum(1 for k in keys if len(led["log"][k]) > 1)}
    lease_ms = b.lease_ns / MS
    out.update({
        "victim": victim.relay_id, "lease_ms": lease_ms,
        "takeover_counter_ms": {str(i): [round((t - killed_at) / MS, 1) for t in v] if v
                                else None for i, v in counter_at.items()},
        "takeover_ms": (takeover_done - killed_at) / MS if takeover_done else None,
        "first_taken_over_answer_ms": (first_taken - killed_at) / MS if first_taken else None,
        "victim_answered_before_kill": sum(1 for v in led["log"].values()
                                           if v and v[0].relay_id == victim.relay_id),
        "taken_over_requests": sum(d["taken_over_requests"] for d in per.values()),
        "members": per, "books_balance": all(balanced(d) for d in per.values()),
        "send_behind_max_ms": load.behind_max_ns / MS,
        "events_ms": {"kill": (killed_at - t0) / MS},
    })  # fmt: skip
    on_time = out["outcomes"]["on_time_among_admitted"]
    out["met"] = {
        "missing": out["missing"] == 0, "duplicated": out["duplicated"] == 0,
        "takeover": out["takeover_ms"] is not None
        and out["takeover_ms"] <= lease_ms + TARGETS["takeover_over_lease_ms"],
        "on_time_among_admitted": None if on_time is None  # nothing admitted: not measured
        else on_time >= TARGETS["on_time_among_admitted"],
    }  # fmt: skip
    return out


def balanced_sessions(members: list[Member], per_member: int, digest: str) -> dict[str, int]:
    """Session ids of which each member owns `per_member` with all of them in the view, by the
    C rendezvous hash the relays run (an observer's core.Pool): session -> owner index."""
    observer = Pool("bench-observer")
    index = {}
    for m in members:
        index[Pool(m.relay_id).key] = m.index
    observer.set_view([PoolViewMember(k, (digest,)) for k in index])
    picked: dict[str, int] = {}
    count = collections.Counter()
    k = 0
    while any(count[m.index] < per_member for m in members):
        sid = f"robot-{k:04d}"
        k += 1
        owner = index[observer.ranking(sid.encode(), digest, 0)[0]]
        if count[owner] < per_member:
            count[owner] += 1
            picked[sid] = owner
    return picked


@contextlib.contextmanager
def pool_of(ns: str, pool: str, indices: list[int], params: dict,
            lease_ms: int) -> Iterator[tuple[list[Member], PoolWatch, object]]:  # fmt: skip
    """Members `indices` of `pool` under `ns`, up, every view listing all; a watch node."""
    members = start_members(ns, pool, indices, params)
    try:
        with private_context() as ctx:
            node = rclpy.create_node("flowedge_bench_pool", namespace=ns, context=ctx)
            try:
                watch = PoolWatch(node, ns, members, lease_ms)
                with spinning(node, context=ctx):
                    watch.relay_ids()
                    watch.wait_views(members)
                    yield members, watch, node
            finally:
                node.destroy_node()
    finally:
        stop_members(members)


def scenarios_abc(args, size: Size, params: dict, capacity_rps: float, lease_ms: int,
                  slack_ns: tuple[int, int], info, bar: Progress) -> dict:
    ns, n = "/poolbench", args.members
    with pool_of(ns, "poolbench", list(range(n)), params, lease_ms) as (members, watch, node):
        client = PoolClient(node, info)
        wait_for_relay(client.pub, client.sub)
        wait_for(lambda: client.pub.get_subscription_count() >= n, 30)
        warm_up(client)
        owner_of = balanced_sessions(members, size.sessions_per_member, client.digest)
        b = Bench(members, watch, client, sorted(owner_of), owner_of, args.load * capacity_rps,
                  slack_ns, lease_ms * MS, size, args.seed)
        out = {}
        bar.update(label="(b) a member joins under load")
        out["join"] = join(b, members[-1])
        bar.advance()
        bar.update(label="(c) a member frozen")
        out["freeze"] = freeze(b, members[1 % n], args.freeze_s)
        bar.advance()
        bar.update(label="(a) kill -9 of a member")
        out["kill"] = kill(b, members[0])
        bar.advance()
        return out


# ---- (d) the aggregate intake ----------------------------------------------------------------
#
# Every member takes every request off DDS (a successor keeps a standby copy of what it does not
# own), so only the decisions split; and the pool's members and the load generator share this
# host's cores. So (d) measures two figures per pool size: the ceiling on this host (the offered
# rate stepped up until the pool no longer answers in full), bounded by the host; and the
# pool's capacity with one core per member, from each member's CPU time during the steps, which
# this host does not bound.

#: (d): a step is short when the generator sent at less than this share of the rate asked
SENDER_KEEPS_UP = 0.95
#: (d): the ramp halves the last interval once, if it is at least twice this (requests/s)
MIN_RAMP_STEP = 1000.0
#: (d) alone, uncalibrated: the members' nfe_ns (an expired-on-arrival request is never admitted)
INTAKE_NFE_NS = 1_000_000
#: (d): counted losses that make a step short (each member's counters, the generator's tally)
SHORT_IF = ("unanswered", "duplicated", "publish_failed", "middleware_lost", "outputs_dropped")


def host_cores() -> dict[str, int]:
    """The host's cores and those this process may run on (its members inherit them)."""
    return {"cpu_count": os.cpu_count() or 0, "allowed": len(os.sched_getaffinity(0))}


def shortfalls(step: dict) -> list[str]:
    """Why a step was not answered in full (empty: it was): every request answered exactly
    once, none lost in DDS or dropped on output, the generator on schedule."""
    out = [f"{k} {step[k]}" for k in SHORT_IF if step[k]]
    if step["offered_per_s"] < SENDER_KEEPS_UP * step["rate"]:
        out.append(f"sender behind ({step['offered_per_s']:.0f}/s of {step['rate']:.0f}/s)")
    return out


def load_cpu_s(d: dict, wall_s: float) -> float:
    """A member's CPU time over a step less what it spends idle in as long (its timers, its
    announcements, DDS's own threads): the load's cost."""
    return d["cpu_s"] - d["idle_share"] * wall_s


def capacity_per_core(per: dict[str, dict], wall_s: float) -> dict:
    """The pool's decisions/s with one core per member, from one step of `wall_s` seconds: per
    member `decided`, `received` (requests it took), `cpu_s` (its process's CPU time) and
    `idle_share` (its CPU share at rest). A member's core leaves 1 - idle_share for the load,
    which costs it load_cpu_s / received per request. Alone, each member would scale its
    decisions to that; summed over members, `sum_per_s`. But every member takes every request,
    so the pool takes no more requests per second than its busiest member can take, and decides
    the pool's decisions per request of them: `bound_per_s`. The capacity is the smaller (None
    if a member's load did not register in its CPU time)."""
    load = {i: load_cpu_s(d, wall_s) for i, d in per.items()}
    if not per or any(load[i] <= 0 or d["received"] <= 0 for i, d in per.items()):
        return {"sum_per_s": None, "bound_per_s": None, "capacity_per_s": None,
                "bounded_by": None}  # fmt: skip
    scale = {i: (1.0 - d["idle_share"]) / load[i] for i, d in per.items()}  # per CPU-s of load
    total = sum(d["decided"] for d in per.values())
    taken = max(d["received"] for d in per.values())
    unbounded = sum(d["decided"] * scale[i] for i, d in per.items())
    busiest = min(per, key=lambda i: per[i]["received"] * scale[i])
    bound = per[busiest]["received"] * scale[busiest] * total / taken
    return {"sum_per_s": unbounded, "bound_per_s": bound, "capacity_per_s": min(unbounded, bound),
            "bounded_by": busiest if bound < unbounded else None}  # fmt: skip


def drop_cost_us(load_cpu_s: float, decided: int, not_owner: int,
                 decision_us: float | None) -> float | None:  # fmt: skip
    """A member's CPU-us per not_owner drop: the load's CPU time (load_cpu_s) less its owned
    decisions at `decision_us` each (a full decision, DDS included: a pool of one at the same
    rate), over its drops. None without the two."""
    if decision_us is None or not_owner <= 0:
        return None
    return (load_cpu_s * 1e6 - decision_us * decided) / not_owner


def fit_costs(points: list[tuple[int, int, float]]) -> tuple[float, float] | None:
    """CPU-us per owned decision and per not_owner drop, least squares over (decided,
    not_owner, load CPU seconds) of members of pools of different sizes at one rate (each size
    splits a member's requests differently between the two); None if the sizes do not tell them
    apart (one size only, or nothing decided)."""
    dd = sum(d * d for d, _, _ in points)
    oo = sum(o * o for _, o, _ in points)
    do = sum(d * o for d, o, _ in points)
    det = dd * oo - do * do
    if det <= 1e-9 * max(dd * oo, 1):
        return None
    dy = sum(d * y for d, _, y in points) * 1e6
    oy = sum(o * y for _, o, y in points) * 1e6
    return (dy * oo - oy * do) / det, (oy * dd - dy * do) / det


def idle_shares(live: list[Member], seconds: float) -> dict[str, float]:
    """Each member's CPU share at rest over `seconds` (no load): what a step's CPU time holds
    besides the load's cost."""
    cpu0, t0 = {m.index: cpu_seconds(m.pid) for m in live}, time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    return {str(m.index): (cpu_seconds(m.pid) - cpu0[m.index]) / wall for m in live}


def intake_step(gen, watch: PoolWatch, live: list[Member], rate: float, seconds: float,
                idle: dict[str, float]) -> dict:  # fmt: skip
    """One step of (d): the expired-on-arrival flood at `rate` for `seconds`; what was answered,
    each member's counters and its process's CPU time (and this process's: the generator, its
    tally and the watch node) over the step; `idle`: each member's CPU share at rest."""
    before = {m.index: counters(watch.snapshot(m)) for m in live}
    cpu0 = {m.index: cpu_seconds(m.pid) for m in live}
    gen0, t0 = cpu_seconds(), time.monotonic()
    r = gen.run(gen.load(["expired"], rate, max(1, int(rate * seconds)), sessions=64),
                drain_s=3.0 + seconds)
    wall = time.monotonic() - t0
    cpu = {m.index: cpu_seconds(m.pid) - cpu0[m.index] for m in live}
    gen_cpu = cpu_seconds() - gen0
    # until every member took (or lost) every request and decided or dropped each
    per = settled(watch, live, before, lambda per: all(
        balanced(d) and d["received"] + d["middleware_lost"] >= r.sent for d in per.values()),
        timeout=5.0)  # fmt: skip
    got = r.first_answer_ns[r.answers > 0]
    span_s = (float(got.max()) - r.first_send_ns) / 1e9 if got.size else 0.0
    pool_decided = sum(d["decided"] for d in per.values())
    by = {str(i): {**d, "cpu_s": cpu[i], "idle_share": idle[str(i)]} for i, d in per.items()}
    load = {i: load_cpu_s(d, wall) for i, d in by.items()}
    step = {
        "rate": rate, "offered_per_s": round(r.offered_per_s(), 1), "sent": r.sent,
        "publish_failed": r.publish_failed, "answered_once": r.answered_once,
        "unanswered": r.unanswered, "duplicated": r.duplicated, "pool_decided": pool_decided,
        "pool_decided_per_s": pool_decided / span_s if span_s > 0 else 0.0,
        "not_owner": {i: d["not_owner"] for i, d in by.items()},
        "taken_over_requests": sum(d["taken_over_requests"] for d in per.values()),
        "held_requests_decided": sum(d["held_requests_decided"] for d in per.values()),
        "decided": {i: d["decided"] for i, d in by.items()},
        "received": {i: d["received"] for i, d in by.items()},
        "middleware_lost": sum(d["middleware_lost"] for d in per.values()),
        "outputs_dropped": sum(d["outputs_dropped"] for d in per.values()),
        "sender_behind_max_ms": r.behind_max_ns / MS, "stray_answers": r.stray,
        "books_balance": all(balanced(d) for d in per.values()),
        "wall_s": wall, "cpu_s": {i: d["cpu_s"] for i, d in by.items()},
        "busy_share": {i: d["cpu_s"] / wall for i, d in by.items()}, "idle_share": idle,
        "load_cpu_s": load,
        "cpu_us_per_request": {i: 1e6 * load[i] / d["received"] if d["received"] else None
                               for i, d in by.items()},
        "generator_cpu_s": gen_cpu, "generator_busy_share": gen_cpu / wall,
        "generator_cpu_us_per_request": 1e6 * gen_cpu / r.sent if r.sent else None,
        "capacity": capacity_per_core(by, wall),
    }  # fmt: skip
    step["short"] = shortfalls(step)
    return step


def intake_costs_split(sizes: list[dict]) -> None:
    """Per step: each member's CPU-us per owned decision (the pool of one's CPU-us per decision
    at the same rate, answered in full: a member's cost per request falls as the rate rises, its
    wakeups taking more requests each) and per not_owner drop (the rest, per drop), and the drop
    over the decision; in place. Without a pool of one in full at that rate, None."""
    one = {s["rate"]: s for z in sizes if z["members"] == 1 for s in z["steps"] if not s["short"]}
    for z in sizes:
        for s in z["steps"]:
            ref = one.get(s["rate"])
            d_us = None
            if ref is not None and ref["decided"]["0"] and ref["load_cpu_s"]["0"] > 0:
                d_us = 1e6 * ref["load_cpu_s"]["0"] / ref["decided"]["0"]
            s["decision_us"] = d_us
            s["not_owner_us"] = {i: drop_cost_us(v, s["decided"][i], s["not_owner"][i], d_us)
                                 for i, v in s["load_cpu_s"].items()}  # fmt: skip
            s["not_owner_over_decision"] = {
                i: None if v is None or not d_us else v / d_us
                for i, v in s["not_owner_us"].items()}


def ceiling(members: int, steps: list[dict], top_rate: float) -> dict:
    """One pool size's steps summed up: the highest rate answered in full (its step's figures
    stand for the size), the first short step and why; `ramp_top` when the ceiling is the top of
    the ramp (the pool was never short: the ramp, not the pool, stopped there; at full size the
    ramp ends near what one generator sends)."""
    full = [s for s in steps if not s["short"]]
    best = max(full, key=lambda s: s["rate"]) if full else None
    short = [s for s in steps if s["short"]]
    first = min(short, key=lambda s: s["rate"]) if short else None
    return {
        "members": members, "steps": steps,
        "ceiling_rate": best["rate"] if best else 0.0,
        "ceiling_offered_per_s": best["offered_per_s"] if best else 0.0,
        "ceiling_decided_per_s": best["pool_decided_per_s"] if best else 0.0,
        "first_short_rate": first["rate"] if first else None,
        "first_short_why": first["short"] if first else [],
        "ramp_top": first is None and best is not None and best["rate"] >= top_rate,
    }  # fmt: skip


def intake(args, size: Size, params: dict, lease_ms: int, bar: Progress) -> list[dict]:
    """A pool of max(intake_members) members, stopped down member by member: at each size the
    expired-on-arrival flood stepped up the ramp until a step is short, then once halfway back;
    per step each member's decisions, not_owner drops and CPU time. One dict per size."""
    from flowedge_relay_tools.bench.loadgen import LoadGenerator

    ns = "/poolbench_intake"
    sizes = sorted(set(args.intake_members), reverse=True)
    rates = sorted(args.intake_rates or size.intake_rates)
    out = []
    with pool_of(ns, "poolbench_intake", list(range(sizes[0])), params,
                 lease_ms) as (members, watch, node):  # fmt: skip
        # its own node, never spun: only the C tally takes the answers (an executor spinning
        # the watch node would take some of them first)
        gen = LoadGenerator(rclpy.create_node("flowedge_bench_load", namespace=ns,
                                              context=node.context),
                            load_served(params["model_path"]))
        wait_for_relay(gen.pub, gen.sub)
        wait_for(lambda: gen.pub.get_subscription_count() >= len(members), 30)
        gen.run(gen.load(["admitted"], 100.0, 20), drain_s=5.0)  # warm up
        live = list(members)
        for n in sizes:
            while len(live) > n:  # a clean stop: it announces finalized and leaves the view
                live.pop().proc.stop()
            watch.wait_views(live)
            idle = idle_shares(live, size.intake_idle_s)
            steps: list[dict] = []
            for k, rate in enumerate(rates):
                bar.update(label=f"(d) {n} member(s), {rate:g}/s")
                steps.append(intake_step(gen, watch, live, rate, size.intake_s, idle))
                bar.advance()
                if steps[-1]["short"]:  # once halfway back to the last step in full
                    bar.advance(len(rates) - k - 1)
                    below = rates[k - 1] if k else 0.0
                    if rate - below >= 2 * MIN_RAMP_STEP:
                        bar.update(label=f"(d) {n} member(s), {(below + rate) / 2:g}/s")
                        steps.append(intake_step(gen, watch, live, (below + rate) / 2,
                                                 size.intake_s, idle))
                    break
            out.append(ceiling(n, steps, rates[-1]))
    intake_costs_split(out)
    return out


# ---- (f) spill on capacity (docs/design.md §13.5) --------------------------------------------
#
# Three members, each with a queue of SPILL_QUEUE requests and the calibrated admission of the
# other scenarios; the load goes to sessions member 0 owns only, at SPILL_LOAD x one member's
# capacity, so the owner is past its capacity while its sessions' successors idle. The same load
# runs with `pool_spill` false on the owner (set live), then true: per run each request's
# answers are counted, who answered, the owner's spilled_out and the others' spilled_in, on time
# among admitted at receipt, and the goodput (answers with actions on time per second of load).

SPILL_QUEUE = 2  # queued requests a member holds: past them, a capacity rejection
SPILL_LOAD = 2.0  # x what one member serves (its mean cost), all on member 0's sessions
#: (f)'s slack, in leases: wide enough that admission passes a request behind a full queue, so
#: the owner's refusals are capacity ones (the queue), the case spill is for
SPILL_SLACK_LEASES = (2, 6)
SPILL_LOAD_S = {"quick": 1.8, "full": 10.0}  # seconds of load per run
SPILL_MEMBERS = 3


def set_spill(node, ns: str, index: int, on: bool) -> None:
    """pool_spill of member `index`, set live through its parameter service."""
    client = node.create_client(SetParameters, f"{ns}/r{index}/flowedge_relay/set_parameters")
    try:
        if not client.wait_for_service(timeout_sec=30):
            raise TimeoutError(f"no parameter service of member {index}")
        value = ParameterValue(type=ParameterType.PARAMETER_BOOL, bool_value=on)
        future = client.call_async(SetParameters.Request(
            parameters=[Parameter(name="pool_spill", value=value)]))
        if not wait_for(future.done, 30, 0.02) or not future.result().results[0].successful:
            raise RuntimeError(f"member {index}: pool_spill {on} refused")
    finally:
        node.destroy_client(client)


def spill(args, size, params: dict, served_rps: float, lease_ms: int,
          slack_ns: tuple[int, int], info, bar) -> dict:  # fmt: skip
    """Both runs of (f) on one pool; {"off": ..., "on": ..., "rate": offered requests/s}.
    served_rps: what the pool's lanes complete at their mean cost (not admission's bound)."""
    ns = "/poolbench_spill"
    p = {**params, "queue_capacity": SPILL_QUEUE}
    rate = SPILL_LOAD * served_rps / args.members  # the members' lanes are equal
    slack_ns = (SPILL_SLACK_LEASES[0] * lease_ms * MS, SPILL_SLACK_LEASES[1] * lease_ms * MS)
    load_s = SPILL_LOAD_S["quick" if args.quick else "full"]
    out: dict = {"rate": rate, "queue_capacity": SPILL_QUEUE, "load": SPILL_LOAD,
                 "slack_ms": [v / MS for v in slack_ns], "load_s": load_s}
    with pool_of(ns, "poolbench_spill", list(range(SPILL_MEMBERS)), p,
                 lease_ms) as (members, watch, node):  # fmt: skip
        client = PoolClient(node, info)
        wait_for_relay(client.pub, client.sub)
        wait_for(lambda: client.pub.get_subscription_count() >= SPILL_MEMBERS, 30)
        warm_up(client)
        owned = balanced_sessions(members, size.sessions_per_member, client.digest)
        sessions = sorted(s for s, i in owned.items() if i == 0)
        owner = members[0]
        for k, on in enumerate((False, True)):
            bar.update(label=f"(f) an owner past its capacity, spill {'on' if on else 'off'}")
            set_spill(node, ns, 0, on)
            before = {m.index: watch.snapshot(m) for m in members}
            t0 = time.time_ns()
            with Load(client, sessions, rate, slack_ns, args.seed + 10 + k) as load:
                time.sleep(load_s)
            seconds = (time.time_ns() - t0) / 1e9
            drain = slack_ns[1] / 1e9 + 4 * lease_ms / 1e3 + 5.0
            led = ledger(client, load.sent, drain)
            time.sleep(2.0 / 20.0 + 0.1)  # the members' next flowedge/stats count it all
            after = {m.index: watch.snapshot(m) for m in members}
            got = collections.Counter(len(v) for v in led["log"].values())
            outcomes = outcome_counts(load.sent, led["log"], set())
            by = {}
            for v in led["log"].values():
                if v:
                    by[v[0].relay_id] = by.get(v[0].relay_id, 0) + 1
            out["on" if on else "off"] = {
                "sent": len(load.sent), "answered_once": got.get(1, 0),
                "missing": len(led["missing"]), "duplicated": len(led["duplicated"]),
                "duplicates_tagged": led["tagged"],
                "answered_by_owner": by.get(owner.relay_id, 0),
                "answered_by_others": sum(n for r, n in by.items() if r != owner.relay_id),
                "spilled_out": after[0].spilled_out - before[0].spilled_out,
                "spilled_in": sum(after[i].spilled_in - before[i].spilled_in
                                  for i in after if i != 0),
                "outcomes": outcomes, "on_time_among_admitted": outcomes["on_time_among_admitted"],
                "goodput_per_s": outcomes.get("on_time", 0) / seconds,
                # a member the host starved for a lease is taken over (§13.2's named windows)
                **{k: sum(getattr(after[i], k) - getattr(before[i], k) for i in after)
                   for k in ("takeovers", "taken_over_requests", "surrendered")},
                "duplicate_detail": [
                    {"session": key[0], "sequence": key[1],
                     "answers": [(g.relay_id, g.epoch, g.code) for g in v]}
                    for key, v in list(led["duplicated"].items())[:3]],
                "load_s": seconds, "send_behind_max_ms": load.behind_max_ns / MS,
            }  # fmt: skip
            bar.advance()
    return out


def spill_rows(r: dict) -> list[dict]:
    """The (f) rows of the report: off and on side by side."""
    out = []
    for key in ("off", "on"):
        s = r[key]
        out.append({
            "measure": f"(f) owner at {r['load']:g}x its capacity, spill {key}: answered once / "
                       "duplicated / missing; spilled out (in); on time among admitted; goodput",
            "measured": f"{s['answered_once']}/{s['sent']} / {s['duplicated']} / {s['missing']}; "
                        f"{s['spilled_out']} ({s['spilled_in']}); "
                        f"{percent(s['on_time_among_admitted'])}; {s['goodput_per_s']:.0f}/s",
            "target": "0 duplicated, 0 missing", "met": "-"})  # fmt: skip
    return out


# ---- the report ------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict:
    host = host_info()
    quick = args.quick
    if args.udp:  # read by every participant made from here on, the relays' (inherited) too
        os.environ["FASTDDS_BUILTIN_TRANSPORTS"] = "UDPv4"
    transport = os.environ.get("FASTDDS_BUILTIN_TRANSPORTS", "Fast DDS default (SHM + UDPv4)")
    size = SIZES["quick" if quick else "full"]
    lease_ms = args.lease_ms or (500 if quick else 1000)
    args.freeze_s = args.freeze_s or (1.2 if quick else 2.0)
    slack = args.slack_ms or (100.0, 2.0 * lease_ms)
    slack_ns = (int(slack[0] * MS), int(slack[1] * MS))
    mean_nfe = sum(NFE_RANGE) / 2
    lanes = args.members * args.workers
    path = model_path("bench")
    info = load_served(path)
    spill_only, intake_only = args.spill_only, args.intake_only
    if spill_only and intake_only:
        raise ValueError("--spill-only and --intake-only exclude each other")
    ramp = args.intake_rates or size.intake_rates
    steps = (1 + (0 if intake_only else 2) + (0 if spill_only else len(set(args.intake_members))
             * len(ramp)) + (0 if spill_only or intake_only else 3))  # fmt: skip
    with Progress("pool", steps, unit=" steps") as bar:
        cal = None
        if args.nfe_ns:
            nfe_ns, reserve = args.nfe_ns, args.admission_reserve_ns
        elif intake_only:  # (d)'s flood is expired on arrival: admission's figures never count
            nfe_ns, reserve = INTAKE_NFE_NS, 0
        else:
            bar.update(label=f"inline calibration, {lanes} lanes")
            with relay_for_bench(False, model_path=path, workers=lanes,
                                 max_nfe=64) as (relay, client):  # fmt: skip
                warm_up(client)
                cal = calibrate.inline(relay, client, mean_nfe, size.cal_requests, size.cal_s)
            nfe_ns = cal["recommended_nfe_ns"]
            reserve = cal["recommended_admission_reserve_ns"]
        bar.advance()
        capacity_rps = lanes * 1e9 / nfe_ns / mean_nfe
        params = dict(model_path=path, workers=args.workers, max_nfe=64, nfe_ns=nfe_ns,
                      admission_reserve_ns=reserve, cost_model="static",
                      pool_lease_ms=lease_ms, stats_rate_hz=STATS_HZ)  # fmt: skip
        abc = {} if spill_only or intake_only else scenarios_abc(
            args, size, params, capacity_rps, lease_ms, slack_ns, info, bar)
        d = [] if spill_only else intake(args, size, params, lease_ms, bar)
        # (f) overloads its owner past what it serves: at 2x the p99 bound's capacity a member
        # served every request with room to spare and nothing spilled
        served_rps = calibrate.capacity(cal, mean_nfe, lanes)[0] if cal else capacity_rps
        f = None if intake_only else spill(args, size, params, served_rps, lease_ms, slack_ns,
                                           info, bar)  # fmt: skip
    costs = ({} if spill_only
             else pool_sim.intake_costs(4, 2000 if quick else 20_000, load_served(path)))
    report = {
        "size": "quick" if quick else "full", "host": host, "members": args.members,
        "workers": args.workers, "lease_ms": lease_ms, "load": args.load,
        "nfe_range": list(NFE_RANGE), "slack_ms": list(slack), "nfe_ns": nfe_ns,
        "admission_reserve_ns": reserve, "capacity_rps": capacity_rps, "transport": transport,
        "calibrated_here": cal is not None,
        "offered_rps": args.load * capacity_rps, "freeze_s": args.freeze_s,
        "calibration": None if cal is None else {
            k: cal.get(k) for k in ("recommended_nfe_ns", "recommended_admission_reserve_ns",
                                    "relay_compute_ns_per_nfe_mean", "noisy_host")},
        "kill": abc.get("kill"), "join": abc.get("join"), "freeze": abc.get("freeze"),
        "intake": d, "intake_s": size.intake_s, "host_cores": host_cores(), "spill": f,
        "drop_over_decision": pool_sim.drop_over_decision(costs) if costs else {},
        "targets": TARGETS,
        "method": (
            f"{args.members} flowedge-relayd of one pool (transport {transport}; lease "
            f"{lease_ms} ms, {args.workers} "
            f"worker(s) each, bench model, calibrated admission: nfe_ns {nfe_ns}, reserve "
            f"{reserve}) over DDS on this host; one rclpy node offers {args.load:g}x the pool's "
            f"capacity ({capacity_rps:.0f} requests/s of {NFE_RANGE[0]}-{NFE_RANGE[1]} NFE, "
            f"slack {slack[0]:g}-{slack[1]:g} ms) over sessions each member owns equally; "
            "answers counted per (session_id, sequence) at receipt. (d): a C load generator "
            "floods expired-on-arrival requests, stepped up per pool size until the pool is "
            "short; decisions read from each member's flowedge/stats, CPU time from /proc"),
    }  # fmt: skip
    report["rows"] = report_rows(report)
    return report


def _verdict(*oks: bool | None) -> str:
    """met only if all are met; MISSED if any is missed; n/a if one was not measured."""
    if any(ok is False for ok in oks):
        return VERDICT[False]
    return VERDICT[None if any(ok is None for ok in oks) else True]


def report_rows(r: dict) -> list[dict]:
    """The report's rows, of the scenarios it ran: (a)-(c), (d), (f)."""
    rows = [] if r["kill"] is None else abc_rows(r)  # --spill-only, --intake-only: none
    rows += intake_rows(r)
    return rows + ([] if r["spill"] is None else spill_rows(r["spill"]))


def abc_rows(r: dict) -> list[dict]:
    """The rows of (a)-(c): answered exactly once, the takeover, the join's moves."""
    k, j, f = r["kill"], r["join"], r["freeze"]
    lease = r["lease_ms"]
    on_time = k["outcomes"]["on_time_among_admitted"]
    ms = lambda v: "-" if v is None else f"{v:.0f} ms"  # noqa: E731
    rows = [
        {"measure": "(a) kill -9: missing / duplicated (before, during, after the takeover)",
         "measured": f"{k['missing']} / {k['duplicated']} ("
                     + ", ".join(f"{k[p]['missing']}/{k[p]['duplicated']}"
                                 for p in ("before", "during", "after")) + ")",
         "target": "0 / 0",
         "met": _verdict(k["met"]["missing"], k["met"]["duplicated"])},
        {"measure": "(a) kill -9: takeover, counter (last survivor) / first taken-over answer",
         "measured": f"{ms(k['takeover_ms'])} / {ms(k['first_taken_over_answer_ms'])}",
         "target": f"<= {lease + TARGETS['takeover_over_lease_ms']:g} ms",
         "met": _verdict(k["met"]["takeover"])},
        {"measure": "(a) kill -9: on time among admitted across the pool, at receipt",
         "measured": percent(on_time), "target": f">= {100 * TARGETS['on_time_among_admitted']:g}%",
         "met": _verdict(k["met"]["on_time_among_admitted"])},
        {"measure": "(b) join: sessions moved (all to the joiner?) / duplicates (tagged)",
         "measured": f"{j['moved']}/{j['sessions']} = {percent(j['moved_share'])} "
                     f"({'yes' if j['moved_exactly_the_joiners'] else 'no'}) / {j['duplicated']}"
                     f" ({j['duplicates_tagged']})",
         "target": f"<= {percent(j['fair_share'] + TARGETS['moved_over_fair_share'])} / 0",
         "met": _verdict(j["met"]["moved"], j["met"]["duplicated"])},
        {"measure": f"(c) SIGSTOP {r['freeze_s']:g} s: missing / duplicated (tagged) / "
                    "surrendered",
         "measured": f"{f['missing']} / {f['duplicated']} ({f['duplicates_tagged']}) / "
                     f"{f['frozen_surrendered']}",
         "target": "0 / 0 (all tagged)",
         "met": _verdict(f["met"]["missing"], f["met"]["duplicated"])},
    ]
    return rows


def step_at(z: dict, rate: float | None) -> dict | None:
    """Pool size z's step at `rate` answered in full (None: none)."""
    return next((s for s in z["steps"] if not s["short"] and s["rate"] == rate), None)


def common_rate(sizes: list[dict]) -> float | None:
    """The highest rate every pool size answered in full: there their costs compare like for
    like (a member's CPU per request depends on the rate)."""
    full = [{s["rate"] for s in z["steps"] if not s["short"]} for z in sizes]
    both = set.intersection(*full) if full else set()
    return max(both) if both else None


def grows(values: list[float | None]) -> bool | None:
    """Whether each value is above the one before (None: fewer than two, or one not measured)."""
    if len(values) < 2 or any(v is None for v in values):
        return None
    return all(b > a for a, b in itertools.pairwise(values))


def _per_s(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}/s"


def per_core(step: dict | None) -> float | None:
    return None if step is None else step["capacity"]["capacity_per_s"]


def intake_rows(r: dict) -> list[dict]:
    """(d)'s rows: per pool size its ceiling on this host (bounded by the host's cores, which
    the members share with the generator) and its decisions/s with one core per member (from CPU
    time: not bounded by the host) at its ceiling and at the rate every size answered in full;
    whether each grows with members; the not_owner drop against a full decision, end to end at
    that rate (a member's CPU) and in C (pool-sim)."""
    rows = []
    sizes = sorted(r["intake"], key=lambda z: z["members"])
    cores = r["host_cores"]["allowed"]
    common = common_rate(sizes)
    at = f"{common:,.0f}/s" if common is not None else "-"
    for z in sizes:
        why = (f" (short at {z['first_short_rate']:,.0f}/s: {', '.join(z['first_short_why'])})"
               if z["first_short_rate"] is not None else
               " (never short: the ramp's top)" if z["ramp_top"] else "")
        rows.append({
            "measure": f"(d) {z['members']} member(s): requests/s answered in full here "
                       "(host-bounded)",
            "measured": f"{_per_s(z['ceiling_offered_per_s'])}{why}",
            "target": "-", "met": "-"})  # fmt: skip
        rows.append({
            "measure": f"(d) {z['members']} member(s): decisions/s with one core per member, at "
                       f"the ceiling / at {at} (CPU time; not host-bounded)",
            "measured": f"{_per_s(per_core(step_at(z, z['ceiling_rate'])))} / "
                        f"{_per_s(per_core(step_at(z, common)))}",
            "target": "-", "met": "-"})  # fmt: skip
    if sizes:
        within = [z for z in sizes if z["members"] <= max(cores - 1, 1)]
        rows.append({
            "measure": f"(d) answered in full here grows with members up to the host's {cores} "
                       "cores (one is the generator's)",
            "measured": ", ".join(f"{z['members']}: {_per_s(z['ceiling_offered_per_s'])}"
                                  for z in sizes),
            "target": f"grows over 1..{max(cores - 1, 1)} member(s)",
            "met": _verdict(grows([z["ceiling_offered_per_s"] for z in within]))})
        cap = [per_core(step_at(z, common)) for z in sizes]
        rows.append({
            "measure": f"(d) decisions/s with one core per member grow with members (at {at}; "
                       "not host-bounded)",
            "measured": ", ".join(f"{z['members']}: {_per_s(v)}"
                                  for z, v in zip(sizes, cap, strict=True)),
            "target": "grows", "met": _verdict(grows(cap))})
    for z in sizes:
        ratios = [v for v in ((step_at(z, common) or {}).get("not_owner_over_decision") or {})
                  .values() if v is not None]  # fmt: skip
        if z["members"] < 2 or not ratios:
            continue
        rows.append({
            "measure": f"(d) not_owner drop / full decision per member, {z['members']} members "
                       f"at {at} (process CPU less the pool of one's decisions: noisy)",
            "measured": ", ".join(f"{v:.2f}" for v in ratios),
            "target": "-", "met": "-"})
    fit = fit_costs([(s["decided"][i], s["not_owner"][i], s["load_cpu_s"][i])
                     for z in sizes if (s := step_at(z, common)) for i in s["decided"]])
    if fit is not None:
        rows.append({
            "measure": f"(d) not_owner drop / full decision, every member of every size at {at} "
                       "(least squares: CPU-us per decision, per drop; process CPU, DDS included)",
            "measured": f"{fit[1] / fit[0]:.2f} ({fit[0]:.1f} us, {fit[1]:.1f} us)",
            "target": f"<= {pool_sim.TARGETS['drop_over_decision']}",
            "met": _verdict(fit[1] / fit[0] <= pool_sim.TARGETS["drop_over_decision"])})
    for m, v in r["drop_over_decision"].items():
        rows.append({"measure": f"(d) not_owner drop / cheapest full decision, {m} members "
                                "(C, p50; pool-sim)",
                     "measured": f"{v:.3f}",
                     "target": f"<= {pool_sim.TARGETS['drop_over_decision']}",
                     "met": _verdict(v <= pool_sim.TARGETS["drop_over_decision"])})
    return rows


def _each(values: dict, fmt: str) -> str:
    return " ".join("-" if v is None else format(v, fmt) for v in values.values())


def intake_table(report: dict) -> str:
    """(d) step by step: what was answered, why a step was short, each member's busy share and
    CPU-us per request taken, per not_owner drop over a full decision, the generator's."""
    rows = []
    for z in report["intake"]:
        for s in z["steps"]:
            cap = s["capacity"]["capacity_per_s"]
            rows.append({
                "members": z["members"], "offered/s": f"{s['offered_per_s']:,.0f}",
                "answered once": f"{s['answered_once']}/{s['sent']}",
                "short": ", ".join(s["short"]) or "-",
                "busy (idle) per member": f"{_each(s['busy_share'], '.2f')} "
                                          f"({_each(s['idle_share'], '.2f')})",
                "us/request (members)": _each(s["cpu_us_per_request"], ".1f"),
                "drop/decision": _each(s.get("not_owner_over_decision", {}), ".2f") or "-",
                "generator busy, us/request": f"{s['generator_busy_share']:.2f}, "
                f"{s['generator_cpu_us_per_request'] or 0:.1f}",
                "per core/s": "-" if cap is None else f"{cap:,.0f}"})  # fmt: skip
    c = report["host_cores"]
    return "\n".join([
        f"(d) step by step, {report['intake_s']:g} s each (this host: {c['cpu_count']} cores, "
        f"{c['allowed']} allowed; the members and the generator share them, so 'offered/s' "
        "answered in full is bounded by the host; 'per core/s' is the pool's decisions/s with one "
        "core per member, from CPU time, and is not):",
        format_rows(rows),
        "busy: CPU time (utime + stime of the process, /proc) over the step's wall time (idle: "
        "at rest, taken off the step's as the members' own overhead); us/request: the load's "
        "CPU-us per request the member took; drop/decision: a member's CPU-us per "
        "not_owner drop (its CPU less its owned decisions at the pool of one's CPU-us per "
        "decision at the same rate) over that decision; generator: this process (the C "
        "generator, its tally, the watch node)"])


def table(report: dict) -> str:
    k, j, f = report["kill"], report["join"], report["freeze"]
    lines = [f"pool: {report['method']}", f"host: {report['host']}",
             format_rows(report["rows"])]
    s = report["spill"]
    for key in ("off", "on") if s is not None else ():
        lines.append(f"(f) spill {key}: {s[key]['sent']} sent at {s['rate']:.1f}/s to one owner "
                     f"(queue {s['queue_capacity']}, slack {s['slack_ms'][0]:g}-"
                     f"{s['slack_ms'][1]:g} ms); answered by the owner "
                     f"{s[key]['answered_by_owner']}, by the others "
                     f"{s[key]['answered_by_others']}; takeovers {s[key]['takeovers']} "
                     f"({s[key]['taken_over_requests']} requests), surrendered "
                     f"{s[key]['surrendered']}; outcomes {s[key]['outcomes']}")
        for d in s[key]["duplicate_detail"]:
            lines.append(f"    duplicate {d['session']}#{d['sequence']}: {d['answers']}")
    if report["intake"]:
        lines.append(intake_table(report))
    if k is None:  # --spill-only, --intake-only
        return "\n".join(lines)
    lines.append(f"(a) takeover counter per survivor, moved between its stats stamps (ms after "
                 f"the kill; stats at {STATS_HZ:g} Hz): "
                 f"{k['takeover_counter_ms']}; taken over: {k['outcomes'].get('taken_over', 0)} "
                 f"(expired at the takeover {k['outcomes'].get('taken_over_expired', 0)}); "
                 f"survivors' taken_over_requests {k['taken_over_requests']}")
    lines.append(f"(a) outcomes: {k['outcomes']}")
    lines.append(f"(b) joiner owns {j['joiner_owns_by_hash']} of {j['sessions']} sessions by the "
                 f"hash; moved to it {j['moved_to_joiner']}; answered by it before its "
                 f"owning_from {j['answered_by_joiner_before_owning_from']}")
    lines.append(f"(c) frozen member: stalls {f['frozen_stalls']}, epoch {f['frozen_epoch']}, "
                 f"surrendered {f['frozen_surrendered']}, answered after resume for requests "
                 f"sent before it {f['frozen_answered_after_resume_sent_before']}; duplicates "
                 f"whose second answer was the frozen member's {f['duplicates_second_by_frozen']}"
                 f"; the others took over {f['others_took_over']}")
    for d in f["duplicate_detail"][:3]:
        lines.append(f"    duplicate {d['session']}#{d['sequence']}: {d['answers']}")
    for s in ("kill", "join", "freeze"):
        lines.append(f"send behind schedule at most ({s}): "
                     f"{report[s]['send_behind_max_ms']:.1f} ms")
    return "\n".join(lines)


def intake_panel(ax, report: dict) -> None:
    """(d) per pool size: requests/s answered in full on this host (bounded by it) next to the
    decisions/s with one core per member (from CPU time, not bounded by it) at the rate every
    size answered in full."""
    sizes = sorted(report["intake"], key=lambda z: z["members"])
    x = range(len(sizes))
    common = common_rate(sizes)
    cap = [per_core(step_at(z, common)) or 0.0 for z in sizes]
    cores = report["host_cores"]["allowed"]
    ax.bar([i - 0.2 for i in x], [z["ceiling_offered_per_s"] for z in sizes], width=0.4,
           color="#2166ac", label=f"answered in full here ({cores} cores, with the generator)")
    ax.bar([i + 0.2 for i in x], cap, width=0.4, color="#1b7837",
           label="one core per member (from CPU time"
                 + (f", at {common:,.0f}/s)" if common is not None else ")"))
    for i, z in enumerate(sizes):
        if z["ramp_top"]:
            ax.annotate("never short: the ramp's top", (i - 0.2, z["ceiling_offered_per_s"]),
                        ha="center", va="bottom", fontsize=6)
    ax.set_xticks(list(x), [str(z["members"]) for z in sizes])
    ax.set_title("(d) the pool's decisions/s per size", fontsize=9)
    ax.set_xlabel("members")
    ax.set_ylabel("requests/s, each decided once")
    ax.legend(fontsize=6)


def plot(report: dict, path: str) -> str:
    from flowedge_relay_tools.bench.plots import save, subplots

    h = report["host"]
    note = (f"lease {report['lease_ms']} ms; {report['transport']}; {h.get('cpu')}, "
            f"{h.get('cores')} cores, load average at start {h.get('loadavg_at_start')}")
    if report["kill"] is None:
        if not report["intake"]:
            raise ValueError("no plot of (f) alone: run without --spill-only")
        fig, ax = subplots(1, 1, width=6.0, height=3.6)
        intake_panel(ax, report)
        return save(fig, path, title="relay pool over DDS: the intake", note=note)
    fig, axes = subplots(2, 2, width=6.0, height=3.6)
    axes = list(axes)
    for ax, (name, title, events) in zip(axes, (
            ("kill", "(a) kill -9 of one member", ("kill",)),
            ("join", "(b) a member joins", ("activate", "owning_from")),
            ("freeze", f"(c) SIGSTOP {report['freeze_s']:g} s", ("stop", "cont"))), strict=False):
        s = report[name]
        for rid, pts in sorted(s["answer_rates"].items()):
            if pts:
                ax.step([p[0] for p in pts], [p[1] for p in pts], where="post",
                        label=rid[-8:], lw=1)
        for e in events:
            ax.axvline(s["events_ms"][e] / 1e3, color="k", ls="--", lw=0.8)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("s (receipt)")
        ax.set_ylabel("answers/s by member")
        ax.legend(fontsize=6)
    intake_panel(axes[3], report)
    return save(fig, path, title="relay pool over DDS (dashed: the event)", note=note)
