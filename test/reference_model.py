# SPDX-License-Identifier: Apache-2.0
"""A small pure-Python reference of docs/design.md §4-7 (plus dispatch / step / finish / rings).

Written from the contract, not from the C: plain lists kept sorted, a dict of sessions, Python
integers for time (a sum that reaches UINT64_MAX is "saturated" and meets no deadline). The
property tests drive it and the C core with the same operations and compare decisions, outcomes
and state. Where docs/design.md leaves a choice, it makes the one documented in docs/core-api.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from fractions import Fraction

U64 = 2**64 - 1

(INFERENCE, REJECTED_STALE, REJECTED_DEADLINE, REJECTED_CAPACITY, EXPIRED,
 INFERENCE_FAILED) = range(6)
NON_FINITE, RUNTIME_ERROR = range(2)  # INFERENCE_FAILED's causes
ACCEPTED, COALESCED = 0, 6
CONTINUE, DONE, STOP_STALE, STOP_EXPIRED = range(4)
GATE_OFF, GATE_RETRIES, GATE_ALL = range(3)
ESTATE = "ESTATE"
REJECT_NONE, REJECT_CAPACITY, REJECT_FAIR_SHARE = range(3)
SHARE_VICTIMS = 8  # §7.1: over-share queued requests one decision may displace


def client_key(r: dict) -> bytes:
    """§7.1: whom a request is charged to: its client_id, or its session_id without one."""
    return r.get("client_id") or r["session_id"]


def sat(x: int) -> int:
    return min(x, U64)


def meets(end: int, deadline: int) -> bool:
    """A saturated end (>= UINT64_MAX) meets nothing."""
    return end < U64 and end <= deadline


def edf_key(deadline: int, arrival_seq: int) -> tuple:
    return (deadline == 0, deadline, arrival_seq)


@dataclass
class Item:
    session_id: bytes
    sequence: int
    generation: int
    retry_count: int
    retry_reason: int
    remaining_nfe: int
    deadline_ns: int
    deadline_ros_ns: int
    arrival_ns: int
    arrival_seq: int
    tested: bool
    nfe_done: int = 0
    dispatch_ns: int = 0
    cancelled: bool = False
    prefix_pending: bool = False  # two-phase: its prefix pass has not been reported yet
    client_id: bytes = b""  # §7.1: the client charged (the session id when none was sent)
    reject_reason: int = REJECT_NONE
    tracked: bool = True  # §7.1: charged to its client (off: not when the client table was full)

    def key(self) -> tuple:
        return edf_key(self.deadline_ns, self.arrival_seq)


@dataclass
class Session:
    generation: int
    touch: int
    last_seen_ns: int


@dataclass
class Client:
    """§7.1: a tracked client; its committed work is computed from the queue and lanes."""

    weight: int
    touch: int
    last_active_ns: int
    admitted_nfe: int = 0
    fair_share_rejections: int = 0


def cost_bucket_of(v: int) -> int:
    """fer_cost.c's log-linear bucket: 0 below 2^10 ns, then 16 per power of two, the last
    open-ended."""
    if v < 1 << 10:
        return 0
    e = v.bit_length() - 1
    if e >= 10 + 26:
        return 1 + 26 * 16
    return 1 + (e - 10) * 16 + ((v >> (e - 4)) & 15)


def block_quantile(values: list[int], ppm: int) -> int:
    """The ppm quantile of block means as the estimator reads it from its histogram: the largest
    value in the first bucket, from the top, above which at most (1 - q) x n values lie."""
    if not values:
        return 0
    allowed = len(values) * (1_000_000 - ppm) // 1_000_000
    b = sorted((cost_bucket_of(v) for v in values), reverse=True)[min(allowed, len(values) - 1)]
    return max(v for v in values if cost_bucket_of(v) == b)


@dataclass
class RefConfig:
    workers: int
    queue_capacity: int
    max_sessions: int
    max_nfe: int
    action_len: int
    ring_capacity: int
    nfe_ns: int
    admission_reserve_ns: int
    reject_if_retry_count_gte: int
    age_gate: int
    reject_if_queue_age_ns_gte: int
    queue_timeout_ns: int
    session_idle_ns: int
    cost_model: int = 0
    cost_window_ns: int = 0
    cost_quantile_ppm: int = 1_000_000
    two_phase: int = 0
    prefix_ns: int = 0
    batch_slots: int = 1  # §5.1: workers x batch_slots lanes; worker w owns [w*B, (w+1)*B)
    fair_share: int = 0  # §7.1
    max_clients: int = 0  # 0 = 64
    client_weights: tuple = ()  # (pattern, weight): the first fnmatch-matching rule wins


class RefCost:
    """docs/design.md §5.2's measured NFE tail, for the quantile 1.0 (the window maximum) only: the
    window is SUBWINDOWS sub-windows of window / SUBWINDOWS ns rotating on `now`; a sample ages
    out when the sub-window SUBWINDOWS after its own begins; the value admission reads is
    computed when a sample arrives (or stats are read) and holds until every sample in it has
    aged out, after which the configured nfe_ns applies again. The block mean: each worker's step
    spans (passed with a step's first row) fill its block, which closes at the end of a request
    (done or stopped) once it holds BLOCK spans, or at BLOCK_MAX spans; its mean is kept as the
    largest in the sub-window where the block completed, and the block mean is the window's
    BLOCK_PPM quantile of them (the largest below 100 blocks); the tail is the larger of the
    window maximum and that. A worker's block is forgotten after a whole window without a span
    of it, or when the window changes.

    The stall rule: a block's largest span is a stall when its excess over the mean of the
    block's other spans is at least reserve / STALL_DIV (reserve = admission_reserve_ns, never
    with 0); the block's stall-free mean leaves min(excess, reserve) out of its sum. While the
    window holds at most one stall and no promise (a tested acceptance) longer than the window is
    open, the block mean is the quantile of the stall-free means; otherwise of the full ones.

    The turnover rule (`turnover`): a worker's first step after a dispatch takes its gap (span
    minus the step's compute) out of its span into the worker's debt, unless the gap is
    stall-sized, and sets the installment to ceil(debt / the smallest NFE dispatched since the
    last step); every step of the worker adds min(installment, debt) to its span. Before that, a
    pacing pause the worker reported since its last step (`paused`) leaves the span, at most its
    gap: the cost in use prices the pauses on its own (§5.3)."""

    SUBWINDOWS = 4
    BLOCK = 16
    BLOCK_MAX = 128
    STALL_DIV = 2
    BLOCK_PPM = 990_000

    def __init__(self) -> None:
        self.window_ns = 0
        self.model = 0
        self.samples = 0
        self.reserve = 0
        self.long_until = 0
        self.promised_until = 0
        self.resets = 0

    def configure(self, model: int, window_ns: int, quantile_ppm: int, reserve_ns: int = 0) -> None:
        assert quantile_ppm in (0, 1_000_000), "the reference models the maximum only"
        self.model = model
        window = window_ns or 1_000_000_000
        if window != self.window_ns:
            self.window_ns = window
            self.sub_ns = max(window // self.SUBWINDOWS, 1)
            self.epoch = 0
            self.sub_max = [0] * self.SUBWINDOWS
            self.sub_count = [0] * self.SUBWINDOWS
            self.sub_stalls = [0] * self.SUBWINDOWS
            self.sub_means: list[list[tuple[int, int]]] = [[] for _ in range(self.SUBWINDOWS)]
            self.resets += 1
            self.long_until = max(self.long_until, self.promised_until)
        if reserve_ns != self.reserve:
            self.reserve = reserve_ns
            self.sub_means = [[(m, m) for m, _ in means] for means in self.sub_means]
        self._recompute()

    def _recompute(self) -> None:
        total = sum(self.sub_count)
        rule = sum(self.sub_stalls) <= 1 and self.long_until <= sat(self.epoch * self.sub_ns)
        self.block_mean = block_quantile([pair[1 if rule else 0] for means in self.sub_means
                                         for pair in means], self.BLOCK_PPM)
        self.qtail = max(self.sub_max) if total else 0
        self.tail = max(self.qtail, self.block_mean) if total else 0
        self.adm_tail = self.tail if self.model == 1 else 0
        self.adm_qtail = self.qtail if self.model == 1 else 0
        self.valid_until = sat((self.epoch + self.SUBWINDOWS) * self.sub_ns) if total else 0

    def _advance(self, now: int) -> bool:
        e = now // self.sub_ns
        if e <= self.epoch:
            return False
        for i in range(1, min(e - self.epoch, self.SUBWINDOWS) + 1):
            k = (self.epoch + i) % self.SUBWINDOWS
            self.sub_max[k] = self.sub_count[k] = self.sub_stalls[k] = 0
            self.sub_means[k] = []
        self.epoch = e
        return True

    def stall_sized(self, excess: int) -> bool:
        return bool(self.reserve and excess and
                    excess >= self.reserve - self.reserve // self.STALL_DIV)

    def turnover(self, t: list[int], span: int, measured: int) -> int:
        """The span charged for a worker step; t = [debt, installment, nfe, paused] of the
        worker."""
        if not span:
            return 0
        if t[3]:
            span -= min(max(span - max(measured, 1), 0), t[3])
            t[3] = 0
        if t[2]:
            gap = max(span - max(measured, 1), 0)
            if gap and not self.stall_sized(gap):
                t[0] = sat(t[0] + gap)
                span -= gap
            t[1] = -(-t[0] // t[2])
            t[2] = 0
        pay = min(t[1], t[0])
        t[0] -= pay
        return sat(span + pay)

    def _complete_block(self, k: int, block: list[int]) -> None:
        total, n = sat(sum(block)), len(block)
        mean = mean_ex = total // n
        if self.reserve and total < U64:
            top = max(block)
            excess = max(top - (total - top) // (n - 1), 0)
            if self.stall_sized(excess):
                mean_ex = (total - min(excess, self.reserve)) // n
                self.sub_stalls[k] += 1
        self.sub_means[k].append((mean, mean_ex))

    def record(self, now: int, measured: int, span: int = 0, t: list | None = None,
               ends: bool = False) -> None:
        """One NFE; span (the step's first row) fills the block of the worker whose turnover
        list is t, which `ends` (the NFE ended its request) may close."""
        self.samples += 1
        self._advance(now)
        k = self.epoch % self.SUBWINDOWS
        self.sub_count[k] += 1
        self.sub_max[k] = max(self.sub_max[k], measured)
        if t is not None:
            if t[4] and (t[6] != self.resets or self.epoch >= t[5] + self.SUBWINDOWS):
                t[4] = []  # a whole window without a span of this worker
            if span:
                t[4].append(span)
                t[5], t[6] = self.epoch, self.resets
            if len(t[4]) >= self.BLOCK_MAX or (ends and len(t[4]) >= self.BLOCK):
                self._complete_block(k, t[4])
                t[4] = []
        self._recompute()

    def promise(self, now: int, deadline: int) -> None:
        """A tested acceptance at now promised an end by deadline."""
        self.promised_until = max(self.promised_until, deadline)
        if deadline - now > self.window_ns and deadline > self.long_until:
            self.long_until = deadline
            self._recompute()

    def nfe_ns(self, configured: int, now: int) -> int:
        return self.adm_tail if now < self.valid_until and self.adm_tail > configured \
            else configured

    def at_dispatch(self, configured: int, now: int) -> int:
        """What the expiry check at dispatch assumes: the quantile (here the maximum), not the
        block mean."""
        return self.adm_qtail if now < self.valid_until and self.adm_qtail > configured \
            else configured

    def stats(self, configured: int, now: int) -> tuple:
        """(observed tail, block mean, window samples, in use) as fer_core_cost_stats reports
        them."""
        if self._advance(now):
            self._recompute()
        in_use = self.nfe_ns(configured, now) if configured else 0
        return self.tail, self.block_mean, sum(self.sub_count), in_use


@dataclass
class RefStats:
    submitted: int = 0
    accepted: int = 0
    outcomes: list = field(default_factory=lambda: [0] * 6)
    coalesced: int = 0
    rejected_late_retries: int = 0
    retries_by_count: list = field(default_factory=lambda: [0] * 8)
    retries_by_reason: list = field(default_factory=lambda: [0] * 6)
    calibration_misses: int = 0
    rejection_outputs_dropped: int = 0
    action_outputs_dropped: int = 0
    nfe_total: int = 0
    nfe_wasted: int = 0
    displaced: int = 0
    sessions_evicted: int = 0
    sessions_evicted_early: int = 0
    busy_ns: int = 0
    fair_share_rejected: int = 0
    fair_share_displaced: int = 0
    clients_evicted: int = 0
    failed: list = field(default_factory=lambda: [0] * 2)


class RefCore:
    def __init__(self, cfg: RefConfig):
        self.cfg = cfg
        cap = 1
        while cap < cfg.ring_capacity:
            cap *= 2
        self.ring_cap = cap
        self.queue: list[Item] = []               # kept in EDF order
        self.nlanes = cfg.workers * cfg.batch_slots  # §5.1: every batch slot is a lane
        self.lanes: list[Item | None] = [None] * self.nlanes
        self.alive = [True] * self.nlanes
        self.shut_down = False  # fer_core_shutdown: the relay stops
        self.sessions: dict[bytes, Session] = {}
        self.clients: dict[bytes, Client] = {}  # §7.1, with fair_share on or off (it is live)
        self.client_touch = 0
        # ring 0: submit; ring w + 1: worker w, carrying the outcomes of all its lanes
        self.rings: list[list[dict]] = [[] for _ in range(cfg.workers + 1)]
        self.cursor = 0
        self.arrival_seq = 0
        self.touch = 0
        self.st = RefStats()
        self.cost = RefCost()
        self.cost.configure(cfg.cost_model, cfg.cost_window_ns, cfg.cost_quantile_ppm,
                            cfg.admission_reserve_ns)
        self.prefix_cost = RefCost()  # §5.2 for prefix passes: same model, window, quantile
        self.prefix_cost.configure(cfg.cost_model, cfg.cost_window_ns, cfg.cost_quantile_ppm,
                                   cfg.admission_reserve_ns)
        # §5.2 block mean: per worker, the instant its busy time is charged up to (0 = never)
        self.charged = [0] * cfg.workers
        # and its turnover: [debt, installment, smallest NFE dispatched since its last step,
        # pacing pause reported since its last step, the spans of its block being filled, the
        # sub-window of the newest, the estimator's resets then]
        self.turnover = [[0, 0, 0, 0, [], 0, 0] for _ in range(cfg.workers)]

    # ---- helpers ---------------------------------------------------------------------------

    def ring_of(self, lane: int) -> int:
        """Ring 0 for submit's outcomes (lane -1), else the lane's worker's ring."""
        return 0 if lane < 0 else lane // self.cfg.batch_slots + 1

    def prefix_in_use(self, now: int) -> int:
        """§5: what one prefix pass costs in admission and dispatch; 0 for single-graph models."""
        return self.prefix_cost.nfe_ns(self.cfg.prefix_ns, now) if self.cfg.two_phase else 0

    def cost_of(self, it_pending: bool, n: int, nfe: int, prefix: int) -> int:
        """A request's cost: its pending prefix (if any) + n NFEs."""
        return (prefix if it_pending else 0) + n * nfe

    def outstanding(self, sid: bytes) -> list[Item]:
        return [q for q in self.queue if q.session_id == sid] + \
               [w for w in self.lanes if w is not None and w.session_id == sid]

    def _emit(self, ring: int, out: dict) -> None:
        self.st.outcomes[out["code"]] += 1
        if len(self.rings[ring]) < self.ring_cap:
            self.rings[ring].append(out)
        elif out["code"] == INFERENCE:
            self.st.action_outputs_dropped += 1
        else:
            self.st.rejection_outputs_dropped += 1

    def _emit_request(self, r: dict, code: int, now: int, why: int = REJECT_CAPACITY) -> None:
        self._emit(0, dict(code=code, session_id=r["session_id"], sequence=r["sequence"],
                           generation=r["generation"], retry_count=r["retry_count"],
                           retry_reason=r["retry_reason"], deadline_ros_ns=r["deadline_ros_ns"],
                           remaining_nfe=r["remaining_nfe"], nfe_done=0, queue_ns=0,
                           compute_ns=0, arrival_ns=now, finish_ns=now, lane=-1, actions=None,
                           client_id=client_key(r),
                           reject_reason=why if code == REJECTED_CAPACITY else REJECT_NONE))

    # ---- §7.1 fair share -----------------------------------------------------------------------

    def committed(self, cut: tuple = ()) -> dict[bytes, int]:
        """Remaining NFE of each client's queued and running work, without the items in cut."""
        out: dict[bytes, int] = {}
        for it in self.queue + [w for w in self.lanes if w is not None]:
            if any(it is c for c in cut) or not it.tracked:
                continue
            out[it.client_id] = out.get(it.client_id, 0) + it.remaining_nfe
        return out

    def over_share(self, client: bytes, x: tuple, cut: tuple = ()) -> bool:
        """Over its share, with x = (x's client, x's NFE) counted and the items in cut gone:
        committed / all committed > weight / (weights of the clients with committed work)."""
        work = self.committed(cut)
        work[x[0]] = work.get(x[0], 0) + x[1]
        mine = work.get(client, 0)
        active = sum(self.client_weight(k) for k, n in work.items() if n > 0)
        return mine > 0 and mine * active > self.client_weight(client) * sum(work.values())

    def usage(self, item: Item, x: tuple, cut: tuple = ()) -> Fraction:
        """How much of its weight item's client uses: committed / weight (x counted, cut gone)."""
        work = self.committed(cut)
        work[x[0]] = work.get(x[0], 0) + x[1]
        return Fraction(work.get(item.client_id, 0), self.client_weight(item.client_id))

    def client_weight(self, client: bytes) -> int:
        """A tracked client's weight, or the weight a new one would get."""
        known = self.clients.get(client)
        return known.weight if known is not None else self.weight_of(client)

    def set_fair_share(self, on: bool) -> None:
        """Live (§7.1): from the next decision on; the clients were tracked all along."""
        self.cfg.fair_share = int(on)

    def set_client_weights(self, rules: tuple) -> None:
        """Live (§7.1): the rules replace the old ones and every tracked client is re-weighed."""
        self.cfg.client_weights = tuple(rules)
        for k, c in self.clients.items():
            c.weight = self.weight_of(k)

    def weight_of(self, client: bytes) -> int:
        for pattern, weight in self.cfg.client_weights:
            if fnmatchcase(client.decode("latin-1"), pattern):
                return weight
        return 1

    def _emit_item(self, it: Item, code: int, now: int, lane: int, ran: bool,
                   actions=None) -> None:
        if code in (EXPIRED, REJECTED_STALE, INFERENCE_FAILED):
            self.st.nfe_wasted += it.nfe_done
        if code == EXPIRED and it.tested:
            self.st.calibration_misses += 1
        self._emit(self.ring_of(lane), dict(
            code=code, session_id=it.session_id, sequence=it.sequence, generation=it.generation,
            retry_count=it.retry_count, retry_reason=it.retry_reason,
            deadline_ros_ns=it.deadline_ros_ns, remaining_nfe=it.remaining_nfe,
            nfe_done=it.nfe_done,
            queue_ns=max(0, (it.dispatch_ns if ran else now) - it.arrival_ns),
            compute_ns=max(0, now - it.dispatch_ns) if ran else 0,
            arrival_ns=it.arrival_ns, finish_ns=now, lane=lane,
            actions=list(actions) if code == INFERENCE else None, client_id=it.client_id,
            reject_reason=(it.reject_reason or REJECT_CAPACITY) if code == REJECTED_CAPACITY
            else REJECT_NONE))

    # ---- §4 ---------------------------------------------------------------------------------

    def submit(self, r: dict, now: int):
        cfg = self.cfg
        if not (len(r["session_id"]) <= 64 and 1 <= r["remaining_nfe"] <= cfg.max_nfe
                and 0 <= r["retry_reason"] < 6):
            return "EINVAL"
        self.st.submitted += 1
        if r["retry_count"] >= 1:
            self.st.retries_by_count[min(r["retry_count"], 7)] += 1
            self.st.retries_by_reason[r["retry_reason"]] += 1
        sid, gen, dl = r["session_id"], r["generation"], r["deadline_ns"]
        sess = self.sessions.get(sid)

        # 2. duplicate of queued or running (session, sequence)
        for it in self.outstanding(sid):
            if it.sequence == r["sequence"]:
                self.st.coalesced += 1
                if it in self.queue and it.deadline_ns and now >= it.deadline_ns:
                    self.queue.remove(it)
                    self._emit_item(it, EXPIRED, now, -1, ran=False)
                return COALESCED
        # 3. stale generation
        if sess is not None and gen < sess.generation:
            self._emit_request(r, REJECTED_STALE, now)
            return REJECTED_STALE
        # 4. deadline passed
        if dl and now >= dl:
            self._emit_request(r, EXPIRED, now)
            return EXPIRED
        # 5. retry / age gate
        age = max(0, now - r["origin_ns"])
        is_retry = r["retry_count"] >= cfg.reject_if_retry_count_gte
        gated = cfg.age_gate == GATE_ALL or (cfg.age_gate == GATE_RETRIES and is_retry)
        if (dl and gated and age >= dl - now) or \
                (cfg.reject_if_queue_age_ns_gte and age >= cfg.reject_if_queue_age_ns_gte):
            self.st.rejected_late_retries += 1
            self._emit_request(r, REJECTED_DEADLINE, now)
            return REJECTED_DEADLINE

        # 6. capacity after removing the queued work x would cancel
        def cancelled_by_x(it: Item) -> bool:
            return sess is not None and it.session_id == sid and it.generation < gen

        retained = [q for q in self.queue if not cancelled_by_x(q)]
        cid = client_key(r)
        fair = bool(cfg.fair_share)
        x = (cid, r["remaining_nfe"])
        x_over = fair and self.over_share(cid, (cid, 0))  # its own client: before x
        victims: list[Item] = []  # displaced on acceptance
        fair_victims: list[Item] = []  # of those, displaced for the fair share (§7.1)
        if len(retained) >= cfg.queue_capacity:
            over = [q for q in retained if fair and q.tracked and
                    self.over_share(q.client_id, x)]
            if fair and not x_over and over:
                # the client using the most of its weight, then the latest deadline
                victims = fair_victims = [max(over, key=lambda q: (self.usage(q, x), q.key()))]
            else:
                victim = max(retained, key=Item.key)
                if not (dl and (victim.deadline_ns == 0 or dl < victim.deadline_ns)):
                    self._emit_request(r, REJECTED_CAPACITY, now)
                    return REJECTED_CAPACITY
                # work accepted uncharged (off, client table full) counts as within its share
                if fair and x_over and (not victim.tracked or (
                        victim.client_id != cid and not self.over_share(victim.client_id, x))):
                    self.st.fair_share_rejected += 1
                    if cid in self.clients:  # a client not tracked yet has no counter
                        self.clients[cid].fair_share_rejections += 1
                    self._emit_request(r, REJECTED_CAPACITY, now, REJECT_FAIR_SHARE)
                    return REJECTED_CAPACITY
                victims = [victim]
        if not any(self.alive) and not (cfg.nfe_ns and dl):
            self._emit_request(r, REJECTED_CAPACITY, now)     # no lane will ever serve it
            return REJECTED_CAPACITY
        evict = None
        if sess is None and len(self.sessions) >= cfg.max_sessions:
            idle = [(s.touch, k) for k, s in self.sessions.items() if not self.outstanding(k)]
            if not idle:
                self._emit_request(r, REJECTED_CAPACITY, now)
                return REJECTED_CAPACITY
            evict = min(idle)[1]
        client_evict = None
        untracked = False  # §7.1: off and the client table full of busy clients
        if cid not in self.clients and len(self.clients) >= (cfg.max_clients or 64):
            busy = {it.client_id for it in self.queue + [w for w in self.lanes if w is not None]
                    if it.tracked}
            idle_clients = [(c.touch, k) for k, c in self.clients.items() if k not in busy]
            if idle_clients:
                client_evict = min(idle_clients)[1]
            elif fair:
                self._emit_request(r, REJECTED_CAPACITY, now)
                return REJECTED_CAPACITY
            else:
                untracked = True
        # 7. calibrated admission (§7.1: an under-share client may displace over-share work)
        tested = False
        if cfg.nfe_ns and dl:
            kept = [q for q in retained if not any(q is v for v in victims)]
            miss = self._first_miss(r, now, kept, cancelled_by_x)
            if miss is not None and fair and not x_over and any(self.alive):
                extra: list[Item] = []
                while miss is not None and len(extra) < SHARE_VICTIMS:
                    cut = tuple(victims + extra)
                    limit = miss.key() if isinstance(miss, Item) else None
                    x_key = edf_key(dl, self.arrival_seq + 1)
                    ahead = [q for q in kept if not any(q is e for e in extra) and
                             (q.key() <= limit if limit is not None else q.key() < x_key) and
                             q.tracked and self.over_share(q.client_id, x, cut)]
                    if not ahead:
                        break
                    # the client using the most of its weight, then ahead of x, then the
                    # most NFE, then the latest deadline
                    extra.append(max(ahead, key=lambda q: (self.usage(q, x, cut),
                                                           q.key() < x_key, q.remaining_nfe,
                                                           q.key())))
                    miss = self._first_miss(
                        r, now, [q for q in kept if not any(q is e for e in extra)],
                        cancelled_by_x)
                if miss is None:
                    victims = victims + extra
                    fair_victims = fair_victims + extra
            if miss is not None:
                self._emit_request(r, REJECTED_DEADLINE, now)
                return REJECTED_DEADLINE
            tested = True
        # 8. accept
        if client_evict is not None:
            del self.clients[client_evict]
            self.st.clients_evicted += 1
        if evict is not None:
            s = self.sessions.pop(evict)
            self.st.sessions_evicted += 1
            if max(0, now - s.last_seen_ns) < cfg.session_idle_ns:
                self.st.sessions_evicted_early += 1
        if sess is None:
            sess = self.sessions[sid] = Session(generation=gen, touch=0, last_seen_ns=now)
        elif gen > sess.generation:
            sess.generation = gen
            for q in [q for q in self.queue if q.session_id == sid and q.generation < gen]:
                self.queue.remove(q)
                self._emit_item(q, REJECTED_STALE, now, -1, ran=False)
            for w in self.lanes:
                if w is not None and w.session_id == sid and w.generation < gen:
                    w.cancelled = True
        self.touch += 1
        sess.touch = self.touch
        sess.last_seen_ns = now
        for v in victims:
            self.queue.remove(v)
            self.st.displaced += 1
            if any(v is f for f in fair_victims):
                v.reject_reason = REJECT_FAIR_SHARE
                self.st.fair_share_displaced += 1
                self.clients[v.client_id].fair_share_rejections += 1
            self._emit_item(v, REJECTED_CAPACITY, now, -1, ran=False)
        if not untracked:
            client = self.clients.get(cid)
            if client is None:
                client = self.clients[cid] = Client(weight=self.weight_of(cid), touch=0,
                                                    last_active_ns=now)
            self.client_touch += 1
            client.touch = self.client_touch
            client.last_active_ns = now
            client.admitted_nfe += r["remaining_nfe"]
        self.arrival_seq += 1
        self.queue.append(Item(
            session_id=sid, sequence=r["sequence"], generation=gen,
            retry_count=r["retry_count"], retry_reason=r["retry_reason"],
            remaining_nfe=r["remaining_nfe"], deadline_ns=dl,
            deadline_ros_ns=r["deadline_ros_ns"], arrival_ns=now,
            arrival_seq=self.arrival_seq, tested=tested, prefix_pending=bool(cfg.two_phase),
            client_id=cid, tracked=not untracked))
        self.queue.sort(key=Item.key)
        if tested:
            self.cost.promise(now, dl)
        self.st.accepted += 1
        return ACCEPTED

    # ---- §5 -----------------------------------------------------------------------------------

    def _first_miss(self, r, now, kept, cancelled_by_x):
        """None if x fits with the queue `kept` (x's retained queue less its victims), else the
        first job from x on that misses: "x" or the queued Item."""
        return self._admissible(r, now, kept, None, cancelled_by_x, want_miss=True)

    def _admissible(self, r, now, retained, victim, cancelled_by_x, want_miss=False):
        nfe = self.cost.nfe_ns(self.cfg.nfe_ns, now)  # §5.2: static = nfe_ns
        prefix = self.prefix_in_use(now)
        lanes = []
        for i, w in enumerate(self.lanes):
            if not self.alive[i]:
                continue
            if w is None:  # §5.1: a free slot of a stepping worker joins at its next boundary
                b = self.cfg.batch_slots
                stepping = b > 1 and any(x is not None for x in self.lanes[i // b * b:][:b])
                lanes.append(sat(now + nfe) if stepping else now)
            elif w.cancelled or cancelled_by_x(w):  # the unit in flight: prefix or one NFE
                lanes.append(sat(now + (prefix if w.prefix_pending else nfe)))
            else:
                lanes.append(sat(now + self.cost_of(w.prefix_pending, w.remaining_nfe, nfe,
                                                    prefix)))
        if not lanes:
            return "x" if want_miss else False
        x_key = edf_key(r["deadline_ns"], self.arrival_seq + 1)
        jobs = [(q.key(), q.deadline_ns, q.remaining_nfe, q.prefix_pending, q)
                for q in retained if q is not victim]
        jobs.append((x_key, r["deadline_ns"], r["remaining_nfe"], bool(self.cfg.two_phase),
                     "x"))
        jobs.sort(key=lambda j: j[0])
        judged = False
        for _, deadline, n, pending, who in jobs:
            judged = judged or who == "x"
            if deadline == 0:
                break
            k = min(range(len(lanes)), key=lambda i: lanes[i])
            lanes[k] = sat(lanes[k] + self.cost_of(pending, n, nfe, prefix))
            if judged and not meets(lanes[k] + self.cfg.admission_reserve_ns, deadline):
                return who if want_miss else False
        return None if want_miss else True

    # ---- workers --------------------------------------------------------------------------------

    def dispatch(self, lane: int, now: int):
        if not self.alive[lane] or self.lanes[lane] is not None:
            return ESTATE
        # §5.2: what admission assumes; nfe_ns 0 = admission off, and then only a passed
        # deadline expires queued work, however high the measured tail (the core's rule too)
        nfe = self.cost.at_dispatch(self.cfg.nfe_ns, now) if self.cfg.nfe_ns else 0
        prefix = self.prefix_in_use(now)
        while self.queue:
            it = self.queue.pop(0)
            cost = self.cost_of(it.prefix_pending, it.remaining_nfe, nfe, prefix)
            if it.deadline_ns and (not meets(now + cost, it.deadline_ns)
                                   if nfe else now >= it.deadline_ns):
                self._emit_item(it, EXPIRED, now, lane, ran=False)
                continue
            if self.cfg.queue_timeout_ns and now - it.arrival_ns > self.cfg.queue_timeout_ns:
                self._emit_item(it, REJECTED_DEADLINE, now, lane, ran=False)
                continue
            it.dispatch_ns = now
            w, b = lane // self.cfg.batch_slots, self.cfg.batch_slots
            if all(x is None for x in self.lanes[w * b:(w + 1) * b]):
                self.charged[w] = max(self.charged[w], it.arrival_ns)  # busy from its arrival
            t = self.turnover[w]
            t[2] = min(t[2], it.remaining_nfe) if t[2] else it.remaining_nfe
            self.lanes[lane] = it
            return it
        return None

    def dispatch_worker(self, worker: int, now: int):
        """§5.1: the EDF head onto the worker's lowest free alive lane; None without one."""
        b = self.cfg.batch_slots
        for lane in range(worker * b, (worker + 1) * b):
            if self.alive[lane] and self.lanes[lane] is None:
                return self.dispatch(lane, now)
        return None

    def prefix_done(self, lane: int, now: int, measured: int):
        it = self.lanes[lane]
        if not self.alive[lane] or it is None or not it.prefix_pending:
            return ESTATE
        it.prefix_pending = False
        self.st.busy_ns = sat(self.st.busy_ns + measured)
        self.prefix_cost.record(now, measured)
        self.charged[lane // self.cfg.batch_slots] = now  # the next step is charged from here
        if it.cancelled:
            self._free_lane(lane, REJECTED_STALE, now)
            return STOP_STALE
        if it.deadline_ns and now >= it.deadline_ns:
            self._free_lane(lane, EXPIRED, now)
            return STOP_EXPIRED
        return CONTINUE

    def _step_span(self, lane: int, now: int, measured: int) -> int:
        """The worker's busy span for the step ending at now; 0 for a later row of that step."""
        w = lane // self.cfg.batch_slots
        if self.charged[w] == now:
            return 0
        span = now - self.charged[w] if 0 < self.charged[w] < now else 0
        self.charged[w] = now
        return self.cost.turnover(self.turnover[w], max(span, measured, 1), measured)

    def paused(self, lane: int, ns: int) -> None:
        """§5.3: the lane's worker paced itself for ns; its next span leaves that out."""
        t = self.turnover[lane // self.cfg.batch_slots]
        t[3] = sat(t[3] + ns)

    def step(self, lane: int, now: int, measured: int):
        it = self.lanes[lane]
        if not self.alive[lane] or it is None or it.remaining_nfe == 0 or it.prefix_pending:
            return ESTATE
        it.remaining_nfe -= 1
        it.nfe_done += 1
        self.st.nfe_total += 1
        self.st.busy_ns = sat(self.st.busy_ns + measured)
        span = self._step_span(lane, now, measured)
        rc = CONTINUE
        if it.cancelled:
            self._free_lane(lane, REJECTED_STALE, now)
            rc = STOP_STALE
        elif it.remaining_nfe == 0:
            rc = DONE
        elif it.deadline_ns and now >= it.deadline_ns:
            self._free_lane(lane, EXPIRED, now)
            rc = STOP_EXPIRED
        # §5.2: the worker's block closes at the end of a request (done or stopped)
        self.cost.record(now, measured, span, self.turnover[lane // self.cfg.batch_slots],
                         ends=rc != CONTINUE)
        return rc

    def _free_lane(self, lane: int, code: int, now: int, actions=None) -> None:
        it = self.lanes[lane]
        self.lanes[lane] = None
        self._emit_item(it, code, now, lane, ran=True, actions=actions)

    def finish(self, lane: int, now: int, actions):
        it = self.lanes[lane]
        if not self.alive[lane] or it is None or it.remaining_nfe != 0:
            return ESTATE
        if it.cancelled:
            code = REJECTED_STALE
        elif it.deadline_ns and now > it.deadline_ns:
            code = EXPIRED
        else:
            code = INFERENCE
        self._free_lane(lane, code, now, actions)
        return code

    def fail(self, lane: int, now: int, cause: int):
        """The lane's work, at any point, ends INFERENCE_FAILED with no actions."""
        it = self.lanes[lane]
        if not self.alive[lane] or it is None:
            return ESTATE
        it.tested = False  # the model failed, the estimate was not wrong
        self.st.failed[cause] += 1
        self._free_lane(lane, INFERENCE_FAILED, now)
        return INFERENCE_FAILED

    def output_space(self, lane: int) -> bool:
        return len(self.rings[self.ring_of(lane)]) < self.ring_cap

    def shutdown(self) -> None:
        self.shut_down = True

    def disable_lane(self, lane: int, now: int) -> None:
        if not self.alive[lane]:
            return
        it = self.lanes[lane]
        if it is not None:
            it.tested = False  # a dead worker is not a calibration miss
            self._free_lane(lane, EXPIRED, now)
        self.alive[lane] = False
        if not any(self.alive):                                 # the last lane: drain the queue
            code = EXPIRED if self.shut_down else REJECTED_CAPACITY  # a stop, or dead workers
            for q in self.queue:
                q.tested = False  # not a calibration miss either
                self._emit_item(q, code, now, lane, ran=False)
            self.queue = []

    # ---- publisher / any thread -----------------------------------------------------------------

    def pop_outcomes(self, max_n: int) -> list[dict]:
        out = []
        while len(out) < max_n:
            got = False
            for _ in range(len(self.rings)):
                if len(out) >= max_n:
                    break
                ring = self.rings[self.cursor]
                self.cursor = (self.cursor + 1) % len(self.rings)
                if ring:
                    out.append(ring.pop(0))
                    got = True
            if not got:
                break
        return out

    def set_calibration(self, nfe_ns: int, reserve_ns: int, prefix_ns: int = 0) -> None:
        self.cfg.nfe_ns, self.cfg.admission_reserve_ns = nfe_ns, reserve_ns
        self.cfg.prefix_ns = prefix_ns
        self.set_cost_model(self.cfg.cost_model, self.cfg.cost_window_ns,
                            self.cfg.cost_quantile_ppm)

    def set_cost_model(self, model: int, window_ns: int, quantile_ppm: int) -> None:
        self.cfg.cost_model, self.cfg.cost_window_ns = model, window_ns
        self.cfg.cost_quantile_ppm = quantile_ppm
        self.cost.configure(model, window_ns, quantile_ppm, self.cfg.admission_reserve_ns)
        self.prefix_cost.configure(model, window_ns, quantile_ppm, self.cfg.admission_reserve_ns)

    def prefix_cost_stats(self, now: int) -> tuple:
        """(prefix tail, prefix in use, prefix samples) as fer_core_cost_stats reports them."""
        tail, _, _, _ = self.prefix_cost.stats(self.cfg.prefix_ns, now)
        in_use = self.prefix_in_use(now) if self.cfg.nfe_ns else 0
        return tail, in_use, self.prefix_cost.samples

    def set_policy(self, gte: int, gate: int, age_gte: int, timeout: int) -> None:
        self.cfg.reject_if_retry_count_gte, self.cfg.age_gate = gte, gate
        self.cfg.reject_if_queue_age_ns_gte, self.cfg.queue_timeout_ns = age_gte, timeout

    def queue_view(self) -> list[tuple]:
        return [(q.session_id, q.sequence, q.generation, q.deadline_ns, q.arrival_ns,
                 q.remaining_nfe, q.tested) for q in self.queue]

    def lanes_view(self) -> list[tuple]:
        out = []
        for i, w in enumerate(self.lanes):
            if w is None:
                out.append((i, self.alive[i], False))
            else:
                out.append((i, self.alive[i], True, w.session_id, w.sequence, w.generation,
                            w.remaining_nfe, w.nfe_done, w.deadline_ns, w.dispatch_ns,
                            w.cancelled, w.prefix_pending))
        return out
