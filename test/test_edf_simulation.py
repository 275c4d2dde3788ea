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

Two-phase models (docs/design.md §5, §10): each dispatched request first runs a prefix pass,
reported with prefix_done, then its NFEs. With prefix passes <= prefix_ns (and NFEs <= nfe_ns) the
promise holds; with slower prefix passes, or with the prefix left out of admission (prefix_ns = 0),
the same harness finds misses.
"""

import heapq
import random

import numpy as np
import pytest

from flowedge_relay.core import (
    AgeGate,
    Code,
    Core,
    CoreConfig,
    CostModel,
    Decision,
    Request,
    Step,
)

NFE_NS = 1_000
PREFIX_NS = 3_000
ARRIVE, STEP, PREFIX = 0, 1, 2


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
    events: list[tuple] = []
    order = 0

    def push(t, kind, data):
        nonlocal order
        order += 1
        heapq.heappush(events, (t, order, kind, data))

    # Workload: bursts of arrivals; mean load about 0.9 of W lanes at 4.5 NFE (and one prefix
    # pass, for a two-phase model) per request.
    t, gens = 0, {}
    mean_gap = (4.5 * NFE_NS + pfx) / (0.9 * workers)
    for i in range(n_requests):
        t += int(rng.expovariate(1.0 / mean_gap)) if rng.random() < 0.7 else 0
        sid = b"s%d" % rng.randrange(12)
        if rng.random() < 0.1:
            gens[sid] = gens.get(sid, 0) + 1            # cancels this session's older work
        nfe = rng.randint(1, 8)
        deadline = 0 if rng.random() < 0.15 else \
            t + pfx + rng.randint(nfe, 12 * nfe) * NFE_NS
        push(t, ARRIVE, dict(sid=sid, seq=i, gen=gens.get(sid, 0), nfe=nfe, deadline=deadline,
                             origin=t, retry=0))
        if rng.random() < 0.1:                           # a blind retry shortly after
            push(t + rng.randint(1, 3 * NFE_NS), ARRIVE,
                 dict(sid=sid, seq=i, gen=gens.get(sid, 0), nfe=nfe, deadline=deadline,
                      origin=t, retry=1))

    decisions: dict[tuple, Decision] = {}
    deadlines: dict[tuple, int] = {}
    busy = [False] * workers
    took = [0] * workers  # duration of the NFE each lane is running
    with Core(cfg) as core:
        if adaptive:  # one measured NFE at the longest duration the workload will take
            core.submit(Request(session_id=b"prime", sequence=0, generation=0, retry_count=0,
                                retry_reason=0, origin_ns=0, deadline_ns=0, deadline_ros_ns=0,
                                remaining_nfe=1, noise_seed=0, observation=obs), 0)
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
            now, _, kind, data = heapq.heappop(events)
            assert now >= last
            last = now
            if kind == ARRIVE:
                r = data
                # A blind retry accepted on its own (its original already answered) is a request
                # of its own, judged like any other: keyed apart by its retry_count.
                key = (r["sid"], r["seq"], r["retry"])
                d = core.submit(Request(
                    session_id=r["sid"], sequence=r["seq"], generation=r["gen"],
                    retry_count=r["retry"], retry_reason=1 if r["retry"] else 0,
                    origin_ns=r["origin"], deadline_ns=r["deadline"], deadline_ros_ns=0,
                    remaining_nfe=r["nfe"], noise_seed=0, observation=obs), now)
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
