# SPDX-License-Identifier: Apache-2.0
"""Discrete-event simulation of the relay in virtual time, driving the real C core.

docs/design.md §5's promise: if no NFE takes longer than nfe_ns (and dispatch lag fits in the
reserve), no admitted request that is not cancelled ever misses its deadline. The harness:

- random workloads (bursty arrivals, 1..8 NFE, tight and loose deadlines, no-deadline requests,
  generation bumps that cancel queued and running work, blind retries that get coalesced);
- W worker lanes that dispatch the moment they are free (zero dispatch lag) and call
  step / finish after every NFE, whose duration is drawn per step;
- every outcome collected from the rings and matched to its request.

With NFE durations <= nfe_ns it asserts zero misses; with durations above nfe_ns the very same
harness finds misses, so the first assertion is not vacuous. Each step reports its real duration
to the core, so the adaptive cost model (docs/design.md §5.2) sees what the lanes did: with it, the
same too-slow durations are priced in and the promise holds again at the measured cost.

Batch slots (docs/design.md §5.1, simulate_batched): W workers x B slots, each worker running one
batched step over the rows it holds, free slots joining at step boundaries; with every step (and,
two-phase, every boundary's prefix pass plus step) within nfe_ns no admitted request misses, and
with slower steps the same harness finds misses.

Two-phase models (docs/design.md §5, §10): each dispatched request first runs a prefix pass,
reported with prefix_done, then its NFEs. With prefix passes <= prefix_ns (and NFEs <= nfe_ns) the
promise holds; with slower prefix passes, or with the prefix left out of admission (prefix_ns = 0),
the same harness finds misses.
"""

import heapq
import random

import numpy as np
import pytest
from core_helpers import request

from flowedge_relay.core import (
    AgeGate,
    Code,
    Core,
    CoreConfig,
    CostModel,
    Decision,
    Step,
)

NFE_NS = 1_000
PREFIX_NS = 3_000
ARRIVE, STEP, PREFIX = 0, 1, 2


class _Events:
    """The simulations' event queue: (time, kind, data) popped in time order, ties in push
    order."""

    def __init__(self) -> None:
        self._heap: list[tuple] = []
        self._order = 0

    def push(self, t: int, kind: int, data) -> None:
        self._order += 1
        heapq.heappush(self._heap, (t, self._order, kind, data))

    def pop(self) -> tuple:
        t, _, kind, data = heapq.heappop(self._heap)
        return t, kind, data

    def __bool__(self) -> bool:
        return bool(self._heap)


def _arrivals(rng: random.Random, n_requests: int, lanes: int, pfx: int, sessions: int,
              retries: bool):
    """The workload: bursts of arrivals at a mean load of about 0.9 of `lanes` at 4.5 NFE (and
    one prefix pass of pfx, for a two-phase model) per request; 10% bump their session's
    generation (cancelling its older work), 15% have no deadline; with `retries`, 10% are sent
    again shortly after as a blind retry. Yields (arrival time, request fields)."""
    t, gens = 0, {}
    mean_gap = (4.5 * NFE_NS + pfx) / (0.9 * lanes)
    for i in range(n_requests):
        t += int(rng.expovariate(1.0 / mean_gap)) if rng.random() < 0.7 else 0
        sid = b"s%d" % rng.randrange(sessions)
        if rng.random() < 0.1:
            gens[sid] = gens.get(sid, 0) + 1
        nfe = rng.randint(1, 8)
        deadline = 0 if rng.random() < 0.15 else t + pfx + rng.randint(nfe, 12 * nfe) * NFE_NS
        req = dict(sid=sid, seq=i, gen=gens.get(sid, 0), nfe=nfe, deadline=deadline)
        if not retries:
            yield t, req
            continue
        yield t, dict(req, origin=t, retry=0)
        if rng.random() < 0.1:
            yield t + rng.randint(1, 3 * NFE_NS), dict(req, origin=t, retry=1)


def simulate(seed: int, workers: int, nfe_lo: float, nfe_hi: float, n_requests: int = 250,
             adaptive: bool = False, prefix: tuple[float, float] | None = None,
             admit_prefix: bool = True):
    """Returns (misses, admitted_tested, stats, outcomes_by_key, decisions). adaptive: the
    adaptive cost model (window maximum over a window longer than the run), primed with one NFE
    (and prefix pass) of the longest duration the lanes will take, so that it admits at the
    measured cost. prefix: a two-phase model whose prefix passes take (lo, hi) x PREFIX_NS;
    admit_prefix=False configures prefix_ns = 0 (the prefix left out of admission)."""
    rng = random.Random(seed)
    two_phase = prefix is not None
    pfx = PREFIX_NS if two_phase else 0
    cfg = CoreConfig(workers=workers, queue_capacity=32, max_sessions=16, max_nfe=8, obs_dim=1,
                     action_len=1, ring_capacity=4096, nfe_ns=NFE_NS,
                     age_gate=AgeGate.RETRIES,
                     cost_model=CostModel.ADAPTIVE if adaptive else CostModel.STATIC,
                     cost_window_ns=10**15, cost_quantile_ppm=1_000_000,
                     two_phase=int(two_phase), prefix_ns=pfx if admit_prefix else 0)
    obs = np.zeros(1, np.float32)
    actions = np.zeros(1, np.float32)
    events = _Events()
    push = events.push
    for t, req in _arrivals(rng, n_requests, workers, pfx, sessions=12, retries=True):
        push(t, ARRIVE, req)

    decisions: dict[tuple, Decision] = {}
    deadlines: dict[tuple, int] = {}
    busy = [False] * workers
    took = [0] * workers  # duration of the NFE each lane is running
    with Core(cfg) as core:
        if adaptive:  # one measured NFE at the longest duration the workload will take
            core.submit(request(b"prime", 0, seed=0, origin=0, obs=obs), 0)
            assert core.dispatch(0, 0) is not None
            if two_phase:
                assert core.prefix_done(0, 0, int(PREFIX_NS * prefix[1])) == Step.CONTINUE
            assert core.step(0, 0, int(NFE_NS * nfe_hi)) == Step.DONE
            core.finish(0, 0, actions)

        def try_dispatch(now):
            for lane in range(workers):
                if not busy[lane]:
                    w = core.dispatch(lane, now)
                    if w is not None:
                        busy[lane] = True
                        if two_phase:
                            took[lane] = max(1, int(PREFIX_NS * rng.uniform(*prefix)))
                            push(now + took[lane], PREFIX, lane)
                        else:
                            took[lane] = duration()
                            push(now + took[lane], STEP, lane)

        def duration():
            return max(1, int(NFE_NS * rng.uniform(nfe_lo, nfe_hi)))

        last = 0
        while events:
            now, kind, data = events.pop()
            assert now >= last
            last = now
            if kind == ARRIVE:
                r = data
                # A blind retry accepted on its own (its original already answered) is a request
                # of its own, judged like any other: keyed apart by its retry_count.
                key = (r["sid"], r["seq"], r["retry"])
                d = core.submit(request(
                    r["sid"], r["seq"], gen=r["gen"], nfe=r["nfe"], seed=0,
                    deadline=r["deadline"], retry=r["retry"], reason=1 if r["retry"] else 0,
                    origin=r["origin"], obs=obs), now)
                decisions[key] = d
                deadlines[key] = r["deadline"]
            else:
                lane = data
                if kind == PREFIX:
                    res = core.prefix_done(lane, now, took[lane])
                else:
                    res = core.step(lane, now, took[lane])
                if res == Step.CONTINUE:
                    took[lane] = duration()
                    push(now + took[lane], STEP, lane)
                else:
                    if res == Step.DONE:
                        core.finish(lane, now, actions)
                    busy[lane] = False
            try_dispatch(now)
        outcomes: dict[tuple, list] = {}
        for o in core.pop_outcomes(100_000):
            # A retry that was not coalesced answers for itself: keep originals apart.
            outcomes.setdefault((o.session_id, o.sequence, o.retry_count), []).append(o)
        stats = core.stats()

    misses = 0
    tested = 0
    for key, d in decisions.items():
        if d != Decision.ACCEPTED:
            continue
        (o,) = outcomes[key]                     # exactly one answer per admitted request
        if deadlines[key] == 0:
            assert o.code == Code.INFERENCE or o.code in (Code.REJECTED_STALE,
                                                          Code.REJECTED_CAPACITY)
            continue
        tested += 1
        if o.code in (Code.REJECTED_STALE, Code.REJECTED_CAPACITY):
            continue                             # cancelled by a newer generation / displaced
        if o.code == Code.EXPIRED or o.finish_ns > deadlines[key]:
            misses += 1
        else:
            assert o.code == Code.INFERENCE and o.actions is not None
    return misses, tested, stats, outcomes, decisions


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_no_admitted_request_misses_when_nfe_within_calibration(workers):
    total_tested = total_rejected = total_cancelled = 0
    for seed in range(25):
        misses, tested, stats, outcomes, decisions = simulate(seed, workers, 0.5, 1.0)
        assert misses == 0, f"seed {seed}: {misses} admitted requests missed"
        assert stats.calibration_misses == 0
        total_tested += tested
        total_rejected += sum(d == Decision.REJECTED_DEADLINE for d in decisions.values())
        total_cancelled += stats.outcomes[Code.REJECTED_STALE]
    # The workloads are not trivially easy: admission both admits and refuses, and generation
    # bumps cancel work.
    assert total_tested > 1000 and total_rejected > 100 and total_cancelled > 20


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_same_harness_finds_misses_when_nfe_exceeds_calibration(workers):
    misses = calibration = 0
    for seed in range(10):
        m, _, stats, _, _ = simulate(seed, workers, 1.2, 2.0)
        misses += m
        calibration += stats.calibration_misses
    assert misses > 0
    assert calibration == misses   # every miss of a tested request is counted as calibration


def test_exactly_at_calibration_is_still_safe():
    # Every NFE takes exactly nfe_ns: the admission test's finish times are then exact, so the
    # boundary cases (finish == deadline) happen and must still be on time.
    for seed in range(15):
        misses, _, stats, _, _ = simulate(seed, 2, 1.0, 1.0)
        assert misses == 0 and stats.calibration_misses == 0


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_adaptive_cost_model_keeps_the_promise_at_the_measured_cost(workers):
    """The durations that break static admission above (1.2-2x nfe_ns): once the adaptive
    model has measured the slowest of them, no admitted request misses."""
    total_tested = 0
    for seed in range(10):
        misses, tested, stats, _, decisions = simulate(seed, workers, 1.2, 2.0, adaptive=True)
        assert misses == 0, f"seed {seed}: {misses} admitted requests missed"
        assert stats.calibration_misses == 0
        total_tested += tested
    assert total_tested > 300  # it still admits: the estimate is the measured cost, not a wall


# ---- two-phase models: the prefix pass in the promise -------------------------------------------


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_promise_holds_with_prefix_passes_within_prefix_ns(workers):
    total_tested = total_rejected = 0
    for seed in range(20):
        misses, tested, stats, _, decisions = simulate(seed, workers, 0.5, 1.0,
                                                       prefix=(0.5, 1.0))
        assert misses == 0, f"seed {seed}: {misses} admitted requests missed"
        assert stats.calibration_misses == 0
        total_tested += tested
        total_rejected += sum(d == Decision.REJECTED_DEADLINE for d in decisions.values())
    assert total_tested > 800 and total_rejected > 100


def test_exactly_at_both_calibrations_is_still_safe():
    for seed in range(10):
        misses, _, stats, _, _ = simulate(seed, 2, 1.0, 1.0, prefix=(1.0, 1.0))
        assert misses == 0 and stats.calibration_misses == 0


@pytest.mark.parametrize("workers", [1, 2, 4])
def test_same_harness_finds_misses_when_prefix_exceeds_prefix_ns(workers):
    misses = calibration = 0
    for seed in range(10):
        m, _, stats, _, _ = simulate(seed, workers, 0.5, 1.0, prefix=(1.5, 3.0))
        misses += m
        calibration += stats.calibration_misses
    assert misses > 0
    assert calibration == misses


@pytest.mark.parametrize("workers", [1, 2])
def test_prefix_left_out_of_admission_misses(workers):
    """prefix_ns = 0 on a model whose prefix takes PREFIX_NS: admission underestimates every
    request, and admitted work misses: the prefix term is what keeps the promise."""
    misses = 0
    for seed in range(10):
        m, _, _, _, _ = simulate(seed, workers, 0.5, 1.0, prefix=(0.5, 1.0), admit_prefix=False)
        misses += m
    assert misses > 0


@pytest.mark.parametrize("workers", [1, 2])
def test_adaptive_prefix_estimate_keeps_the_promise_at_the_measured_cost(workers):
    total_tested = 0
    for seed in range(10):
        misses, tested, stats, _, _ = simulate(seed, workers, 0.5, 1.0, adaptive=True,
                                               prefix=(1.5, 3.0))
        assert misses == 0, f"seed {seed}: {misses} admitted requests missed"
        assert stats.calibration_misses == 0
        total_tested += tested
    assert total_tested > 200


# ---- batch slots (docs/design.md §5.1): W workers x B slots, one batched step at a time ---------

BOUNDARY, STEP_END, PREFIX_END = 3, 4, 5


def simulate_batched(seed: int, workers: int, slots: int, step: tuple[float, float],
                     prefix: tuple[float, float] | None = None, n_requests: int = 300,
                     reserve_ns: int = 0):
    """The batched worker loop in virtual time. Admission simulates W x B lanes advancing one NFE
    per nfe_ns (= NFE_NS, the cost of a full step). Each worker, at a step boundary: its free
    slots take queued work (dispatch_worker, EDF); a two-phase model's joiners run one batched
    prefix pass (prefix x nfe_ns), reported per joiner; then one step of step x nfe_ns for all
    held rows, Core.step per row. A worker holding nothing wakes at the next arrival (zero lag).
    Returns (misses, tested, stats, decisions), like simulate()."""
    rng = random.Random(seed)
    two_phase = prefix is not None
    pfx = NFE_NS // 2 if two_phase else 0  # prefix_ns: the joiner's own pass in admission
    lanes = workers * slots
    cfg = CoreConfig(workers=workers, batch_slots=slots, queue_capacity=64, max_sessions=32,
                     max_nfe=8, obs_dim=1, action_len=1, ring_capacity=8192, nfe_ns=NFE_NS,
                     admission_reserve_ns=reserve_ns, age_gate=AgeGate.RETRIES,
                     two_phase=int(two_phase), prefix_ns=pfx)
    obs, actions = np.zeros(1, np.float32), np.zeros(1, np.float32)
    events = _Events()
    push = events.push
    for t, req in _arrivals(rng, n_requests, lanes, pfx, sessions=24, retries=False):
        push(t, ARRIVE, req)

    decisions: dict[tuple, Decision] = {}
    deadlines: dict[tuple, int] = {}
    rows: list[list[int]] = [[] for _ in range(workers)]  # lanes each worker holds
    active = [False] * workers  # inside a prefix pass or a step (or a boundary is pending)
    max_rows = 0
    with Core(cfg) as core:
        def boundary(wi, now):
            nonlocal max_rows
            joiners = []
            while len(rows[wi]) < slots:
                w = core.dispatch_worker(wi, now)
                if w is None:
                    break
                assert w.lane in core.worker_lanes(wi)
                joiners.append(w.lane)
            rows[wi].extend(joiners)
            max_rows = max(max_rows, len(rows[wi]))
            if two_phase and joiners:
                took = max(1, int(NFE_NS * rng.uniform(*prefix)))
                push(now + took, PREFIX_END, (wi, joiners, took))
            elif rows[wi]:
                start_step(wi, now)
            else:
                active[wi] = False

        def start_step(wi, now):
            took = max(1, int(NFE_NS * rng.uniform(*step)))
            push(now + took, STEP_END, (wi, took))

        while events:
            now, kind, data = events.pop()
            if kind == ARRIVE:
                r = data
                key = (r["sid"], r["seq"])
                decisions[key] = core.submit(request(
                    r["sid"], r["seq"], gen=r["gen"], nfe=r["nfe"], seed=0,
                    deadline=r["deadline"], origin=now, obs=obs), now)
                deadlines[key] = r["deadline"]
                for wi in range(workers):  # idle workers wake at once
                    if not active[wi]:
                        active[wi] = True
                        boundary(wi, now)
            elif kind == PREFIX_END:
                wi, joiners, took = data
                for lane in joiners:
                    if core.prefix_done(lane, now, took) != Step.CONTINUE:
                        rows[wi].remove(lane)
                if rows[wi]:
                    start_step(wi, now)
                else:
                    boundary(wi, now)
            elif kind == STEP_END:
                wi, took = data
                for lane in list(rows[wi]):
                    res = core.step(lane, now, took)
                    if res == Step.DONE:
                        core.finish(lane, now, actions)
                    if res != Step.CONTINUE:
                        rows[wi].remove(lane)
                boundary(wi, now)
        outcomes: dict[tuple, list] = {}
        for o in core.pop_outcomes(100_000):
            assert o.lane < 0 or o.lane < lanes
            outcomes.setdefault((o.session_id, o.sequence), []).append(o)
        stats = core.stats()

    misses = tested = 0
    for key, d in decisions.items():
        if d not in (Decision.ACCEPTED, Decision.COALESCED):
            continue
        if d == Decision.COALESCED:
            continue
        (o,) = outcomes[key]  # exactly one answer per admitted request
        if deadlines[key] == 0:
            continue
        tested += 1
        if o.code in (Code.REJECTED_STALE, Code.REJECTED_CAPACITY):
            continue
        if o.code == Code.EXPIRED or o.finish_ns > deadlines[key]:
            misses += 1
    return misses, tested, stats, decisions, max_rows


@pytest.mark.parametrize("workers,slots", [(1, 2), (1, 4), (2, 4), (3, 8)])
def test_batched_promise_holds_when_every_step_is_within_nfe_ns(workers, slots):
    """§5.1's promise: every batched step <= nfe_ns, so no admitted request misses."""
    total_tested = total_rejected = fullest = 0
    for seed in range(12):
        misses, tested, stats, decisions, max_rows = simulate_batched(
            seed, workers, slots, (0.5, 1.0))
        assert misses == 0, f"seed {seed}: {misses} admitted requests missed"
        assert stats.calibration_misses == 0
        fullest = max(fullest, max_rows)
        total_tested += tested
        total_rejected += sum(d == Decision.REJECTED_DEADLINE for d in decisions.values())
    # not trivially easy: admission refuses some, and batches fill every slot
    assert total_tested > 1000 and total_rejected > 50 and fullest == slots


def test_batched_promise_holds_exactly_at_nfe_ns():
    for seed in range(10):
        misses, _, stats, _, _ = simulate_batched(seed, 2, 4, (1.0, 1.0))
        assert misses == 0 and stats.calibration_misses == 0


@pytest.mark.parametrize("workers,slots", [(1, 4), (2, 4)])
def test_batched_harness_finds_misses_when_steps_exceed_nfe_ns(workers, slots):
    misses = calibration = 0
    for seed in range(10):
        m, _, stats, _, _ = simulate_batched(seed, workers, slots, (1.2, 2.0))
        misses += m
        calibration += stats.calibration_misses
    assert misses > 0 and calibration == misses


@pytest.mark.parametrize("workers,slots", [(1, 4), (2, 3)])
def test_batched_two_phase_promise_holds_when_prefix_and_step_fit_in_nfe_ns(workers, slots):
    """Two-phase at B > 1: held rows wait while the joiners' batched prefix pass runs, so a
    boundary period (prefix pass + step) within nfe_ns keeps the promise (docs/design.md §5.1)."""
    total_tested = 0
    for seed in range(10):
        misses, tested, stats, _, _ = simulate_batched(
            seed, workers, slots, (0.25, 0.5), prefix=(0.25, 0.5))
        assert misses == 0, f"seed {seed}: {misses} admitted requests missed"
        assert stats.calibration_misses == 0
        total_tested += tested
    assert total_tested > 500

