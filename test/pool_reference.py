# SPDX-License-Identifier: Apache-2.0
"""A small pure-Python reference of a relay pool's C mechanism (docs/design.md §13).

Written from the contract: the rendezvous ranking of a request over a view (FNV-1a 64 of the
session id, the splitmix64 finaliser, owning windows on the origin stamp, keys compared last),
and the standby table (entries and one byte ring arena in arrival order, the oldest evicted to
make room, holes given back when they reach the oldest end, answers removing every entry of
their (session_id, sequence), an answer seen first remembered in a direct-mapped filter, expiry
at deadline + lease while the owner is in the view, + 4 x lease otherwise). The property test in
test/test_pool_core.py drives it and the C pool with the same operations and compares them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

M64 = 2**64 - 1
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3


def fnv1a64(data: bytes) -> int:
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & M64
    return h


def mix64(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def key_of(relay_id: str) -> int:
    return mix64(fnv1a64(relay_id.encode()))


@dataclass(frozen=True)
class Member:
    key: int
    digests: tuple[str, ...] = ()  # empty: every digest
    owning_from: int = 0  # ROS ns, 0 = unbounded
    owning_until: int = 0


def covers(m: Member, digest: str, origin: int) -> bool:
    """m counts for a request of `digest` first issued at `origin` (0 = unset: every member)."""
    if origin and ((m.owning_from and origin < m.owning_from)
                   or (m.owning_until and origin >= m.owning_until)):
        return False
    return not m.digests or digest in m.digests


def ranking(view: list[Member], session_id: bytes, digest: str, origin: int) -> list[int]:
    """Every covering member's key, highest score first (score, then key, descending)."""
    h = fnv1a64(session_id)
    ranked = sorted((m for m in view if covers(m, digest, origin)),
                    key=lambda m: (mix64(m.key ^ h), m.key), reverse=True)
    return [m.key for m in ranked]


@dataclass(frozen=True)
class Bound:
    """A member's announced bound (PoolMember workers, nfe_ns, admission_reserve_ns,
    queue_depth): what an owner judges a spill target by (docs/design.md §13.5)."""

    workers: int = 0
    nfe_ns: int = 0
    admission_reserve_ns: int = 0
    queue_depth: int = 0


def spill_target(view: list[Member], bounds: dict[int, Bound], me: int, session_id: bytes,
                 digest: str, origin: int, remaining_nfe: int, deadline: int,
                 now: int) -> int:
    """The member this owner (key me) hands a would-be REJECTED_CAPACITY to, 0 = none: the
    request's successor, if me owns it, the successor announces workers, and its bound (reserve
    + nfe_ns x remaining_nfe x (1 + ceil(queue_depth / workers))) is below the slack (deadline -
    now; no deadline: any bound)."""
    ranked = ranking(view, session_id, digest, origin)
    if len(ranked) < 2 or ranked[0] != me:
        return 0
    b = bounds.get(ranked[1], Bound())
    if b.workers == 0:
        return 0
    if deadline:
        rounds = 1 + -(-b.queue_depth // b.workers)
        bound = b.admission_reserve_ns + b.nfe_ns * remaining_nfe * rounds
        if deadline <= now or bound >= deadline - now:
            return 0
    return ranked[1]


@dataclass
class Entry:
    sid_hash: int
    sequence: int
    owner: int
    arrival: int
    deadline: int
    span: int
    live: bool = True


@dataclass
class RefStandby:
    """The standby table: `capacity` entries, `arena` bytes, lease in ns."""

    capacity: int
    arena: int
    lease: int
    entries: list[Entry] = field(default_factory=list)  # oldest first, live or not
    head: int = 0  # arena offset of the oldest span
    used: int = 0
    answered: dict[int, int] = field(default_factory=dict)  # filter slot -> fingerprint
    counters: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("standby_stored", "standby_answered", "standby_expired", "standby_evicted",
         "answers_early"), 0))

    @property
    def mask(self) -> int:
        n = 2
        while n < 2 * self.capacity:
            n <<= 1
        return n - 1

    @staticmethod
    def fingerprint(sid_hash: int, sequence: int) -> int:
        return mix64(sid_hash ^ mix64(sequence)) | 1

    def _pop_oldest(self) -> None:
        x = self.entries.pop(0)
        if x.live:
            self.counters["standby_evicted"] += 1
        self.head = (self.head + x.span) % self.arena
        self.used -= x.span
        if self.used == 0:
            self.head = 0

    def _pop_dead(self) -> None:
        while self.entries and not self.entries[0].live:
            self._pop_oldest()

    def _fit(self, n: int) -> int | None:
        """The bytes a new span of n takes now (n, or n + the skipped tail), or None."""
        if self.used == 0:
            return n if n <= self.arena else None
        tail = (self.head + self.used) % self.arena
        if tail > self.head:
            if n <= self.arena - tail:
                return n
            return self.arena - tail + n if n <= self.head else None
        return n if n <= self.head - tail else None

    def put(self, session_id: bytes, sequence: int, nbytes: int, owner: int, arrival: int,
            deadline: int) -> None:
        h = fnv1a64(session_id)
        fp = self.fingerprint(h, sequence)
        if self.answered.get(fp & self.mask) == fp:
            self.counters["answers_early"] += 1
            return
        if nbytes > self.arena:
            self.counters["standby_evicted"] += 1
            return
        self._pop_dead()
        while len(self.entries) == self.capacity or self._fit(nbytes) is None:
            self._pop_oldest()
        span = self._fit(nbytes)
        self.used += span
        self.entries.append(Entry(h, sequence, owner, arrival, deadline, span))
        self.counters["standby_stored"] += 1

    def answer(self, session_id: bytes, sequence: int) -> int:
        h = fnv1a64(session_id)
        hit = [x for x in self.entries if x.live and (x.sid_hash, x.sequence) == (h, sequence)]
        for x in hit:
            x.live = False
        if hit:
            self.counters["standby_answered"] += len(hit)
        else:
            fp = self.fingerprint(h, sequence)
            self.answered[fp & self.mask] = fp
        self._pop_dead()
        return len(hit)

    def expire(self, now: int, live_keys: set[int]) -> int:
        n = 0
        for x in self.entries:
            if x.live and x.deadline:
                due = x.deadline + self.lease * (1 if x.owner in live_keys else 4)
                if now >= due:
                    x.live = False
                    n += 1
        self.counters["standby_expired"] += n
        self._pop_dead()
        return n

    def take(self, owner: int) -> list[Entry]:
        """A takeover of `owner`: its live entries, oldest first, out of the table."""
        taken = [x for x in self.entries if x.live and x.owner == owner]
        for x in taken:
            x.live = False
        self._pop_dead()
        return taken

    def live(self) -> list[tuple[int, int, int]]:
        return [(x.sid_hash, x.sequence, x.owner) for x in self.entries if x.live]

    @property
    def bytes_used(self) -> int:
        return self.used
