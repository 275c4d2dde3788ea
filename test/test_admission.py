# SPDX-License-Identifier: Apache-2.0
"""The admission predicate of docs/design.md §5 (csrc/fer_admit.c), alone and through the core.

- hand-computed lane simulations, saturation at UINT64_MAX, check_from, zero lanes;
- W = 1 equals the prefix-sum test of ADR 0015 (docs/design.md#decision-record): every affected EDF
  deadline prefix fits;
- W > 1 equals an independent heap-based simulation in Python;
- a two-phase job's pending prefix (prefix_ns) is paid once, before its NFEs (docs/design.md §5).
"""

import heapq

import pytest
from core_helpers import request
from flowedge_relay._fer_core import ffi, lib
from hypothesis import given, settings
from hypothesis import strategies as st

from flowedge_relay.core import Core, CoreConfig, Decision, Request, Step

U64 = 2**64 - 1


def q_request(i: int, rel: int, n: int, now: int) -> Request:
    """Session q<i>'s request of n NFE at `now`, its deadline `rel` later (0: none)."""
    return request(b"q%d" % i, 0, nfe=n, seed=0, deadline=now + rel if rel else 0, origin=now,
                   obs_dim=1)


def first_miss(lanes, jobs, check_from=0, nfe=100, reserve=0, prefix=0):
    """jobs: [(deadline, remaining_nfe)] or [(deadline, remaining_nfe, prefix_pending)] in EDF
    order."""
    ls = ffi.new("uint64_t[]", list(lanes) or [0])
    before = list(ls)
    js = ffi.new("struct fer_admit_job[]", max(len(jobs), 1))
    for i, (d, n, *pending) in enumerate(jobs):
        js[i].deadline_ns, js[i].remaining_nfe = d, n
        js[i].prefix_pending = pending[0] if pending else 0
    scratch = ffi.new("uint64_t[]", max(len(lanes), 1))
    got = lib.fer_admit_first_miss(ls, len(lanes), js, len(jobs), check_from, nfe, prefix,
                                   reserve, scratch)
    assert list(ls) == before  # inputs are not modified
    return got


# ---- hand-computed --------------------------------------------------------------------------


def test_two_lanes_by_hand():
    # Lanes free at 300 and 0; nfe 100. A(250, 2) -> lane 1: 200. x(400, 1) -> lane 1: 300.
    # B(600, 3) -> lane 0 (300): 600 <= 600.
    assert first_miss([300, 0], [(250, 2), (400, 1), (600, 3)]) == 3
    # Lanes at 300 and 50: A -> lane 1: 250; x -> lane 1: 350; B -> lane 0: 600.
    assert first_miss([300, 50], [(250, 2), (350, 1), (600, 3)]) == 3
    assert first_miss([300, 50], [(250, 2), (349, 1), (600, 3)]) == 1
    assert first_miss([300, 0], [(250, 2), (400, 1), (599, 3)]) == 2
    # The first failing index is reported even when later jobs fail too.
    assert first_miss([0], [(100, 1), (150, 1), (150, 1)]) == 1


def test_reserve_is_added_to_every_finish():
    assert first_miss([0], [(100, 1)], reserve=0) == 1
    assert first_miss([0], [(100, 1)], reserve=1) == 0
    assert first_miss([0], [(1000, 1), (300, 2)], reserve=100) == 1  # 200; 400 > 300


def test_jobs_before_check_from_are_placed_but_not_judged():
    jobs = [(50, 2), (1000, 1)]          # job 0 misses (200 > 50); job 1 ends at 300
    assert first_miss([0], jobs, check_from=0) == 0
    assert first_miss([0], jobs, check_from=1) == 2
    assert first_miss([0], [(50, 2), (250, 1)], check_from=1) == 1  # delayed by job 0


def test_no_deadline_jobs_are_never_judged():
    assert first_miss([0], [(0, 10**6)]) == 1
    assert first_miss([0], [(100, 1), (0, 5), (0, 5)]) == 3


def test_zero_lanes_miss_every_finite_deadline():
    assert first_miss([], [(U64, 1)]) == 0
    assert first_miss([], [(10, 1), (U64, 1)], check_from=1) == 1
    assert first_miss([], [(0, 1)]) == 1


def test_saturation_at_uint64_max():
    # Lane start near the top: 1 NFE ends beyond UINT64_MAX -> saturated -> misses even U64.
    assert first_miss([U64 - 10], [(U64, 1)]) == 0
    # Ends exactly at U64 - 10 + 10 = U64: the saturated value also means "never".
    assert first_miss([U64 - 10], [(U64, 1)], nfe=10) == 0
    assert first_miss([U64 - 10], [(U64 - 1, 1)], nfe=9) == 1
    # remaining_nfe x nfe_ns overflows on its own.
    assert first_miss([0], [(U64 - 1, 2**40)], nfe=2**30) == 0
    assert first_miss([0], [(U64 - 1, 2**33)], nfe=2**30) == 1   # 2^63 fits
    # The reserve can overflow too.
    assert first_miss([0], [(U64 - 1, 1)], nfe=1, reserve=U64 - 1) == 0
    # A saturated lane stays saturated: job 1 waits for lane 1 (300 + 300 > 500)
    # (job 1 would fit on lane 0 if U64 wrapped to a small time).
    assert first_miss([U64, 0], [(500, 3), (500, 3)]) == 1


# ---- W = 1 is ADR 0015's prefix-sum test --------------------------------------------------


def prefix_sum_first_miss(start, jobs, check_from, nfe, reserve, prefix=0):
    """ADR 0015: job i of the EDF order finishes at start + nfe * sum(remaining of jobs <= i)
    (+ prefix for each of them whose prefix is pending)."""
    total = start
    for i, (d, n, *pending) in enumerate(jobs):
        if d == 0:
            break
        total += n * nfe + (prefix if pending and pending[0] else 0)
        if i >= check_from and not (total + reserve < U64 and total + reserve <= d):
            return i
    return len(jobs)


times = st.one_of(st.integers(0, 10_000), st.integers(U64 - 10_000, U64))
edf_jobs = st.lists(st.tuples(times, st.integers(1, 64)), max_size=30).map(
    lambda js: sorted(js, key=lambda j: (j[0] == 0, j[0])))


@settings(max_examples=1500, deadline=None)
@given(start=times, jobs=edf_jobs, data=st.data(),
       nfe=st.sampled_from([0, 1, 100, 2**20, 2**58]), reserve=st.sampled_from([0, 50, 2**62]))
def test_single_lane_equals_adr0015_prefix_sums(start, jobs, data, nfe, reserve):
    check_from = data.draw(st.integers(0, len(jobs)))
    assert first_miss([start], jobs, check_from, nfe, reserve) == \
        prefix_sum_first_miss(start, jobs, check_from, nfe, reserve)


# ---- W > 1 equals an independent simulation --------------------------------------------------


def heap_first_miss(lanes, jobs, check_from, nfe, reserve, prefix=0):
    if not lanes:
        return next((i for i, (d, *_) in enumerate(jobs) if i >= check_from and d), len(jobs))
    heap = [(t, i) for i, t in enumerate(lanes)]
    heapq.heapify(heap)
    for i, (d, n, *pending) in enumerate(jobs):
        if d == 0:
            break
        t, lane = heapq.heappop(heap)
        end = min(t + (prefix if pending and pending[0] else 0) + n * nfe, U64)
        heapq.heappush(heap, (end, lane))
        if i >= check_from and not (end + reserve < U64 and end + reserve <= d):
            return i
    return len(jobs)


@settings(max_examples=1500, deadline=None)
@given(lanes=st.lists(times, max_size=5), jobs=edf_jobs, data=st.data(),
       nfe=st.sampled_from([1, 100, 2**58]), reserve=st.sampled_from([0, 50]))
def test_multi_lane_equals_heap_simulation(lanes, jobs, data, nfe, reserve):
    check_from = data.draw(st.integers(0, len(jobs)))
    assert first_miss(lanes, jobs, check_from, nfe, reserve) == \
        heap_first_miss(lanes, jobs, check_from, nfe, reserve)


# ---- two-phase jobs: a pending prefix is paid once, before the NFEs -------------------------


def test_pending_prefix_by_hand():
    # nfe 100, prefix 50: a pending job of 1 NFE ends at 150, one without a pending prefix at 100.
    assert first_miss([0], [(150, 1, 1)], prefix=50) == 1
    assert first_miss([0], [(149, 1, 1)], prefix=50) == 0
    assert first_miss([0], [(100, 1, 0)], prefix=50) == 1
    # Two lanes (0, 120): A(1 NFE + prefix) on lane 0 -> 150; B(2 NFE + prefix) on lane 1 -> 370;
    # C(1 NFE, no prefix) on lane 0 -> 250.
    jobs = [(150, 1, 1), (370, 2, 1), (250, 1, 0)]
    assert first_miss([0, 120], jobs, prefix=50) == 3
    assert first_miss([0, 120], jobs[:2] + [(249, 1, 0)], prefix=50) == 2
    # The prefix saturates like everything else.
    assert first_miss([0], [(U64 - 1, 1, 1)], nfe=1, prefix=U64) == 0
    assert first_miss([10], [(U64 - 1, 1, 1)], nfe=1, prefix=U64 - 12) == 1


edf_jobs_2p = st.lists(st.tuples(times, st.integers(1, 64), st.integers(0, 1)), max_size=30).map(
    lambda js: sorted(js, key=lambda j: (j[0] == 0, j[0])))
prefixes = st.sampled_from([0, 1, 50, 250, 2**20, 2**62])


@settings(max_examples=1000, deadline=None)
@given(start=times, jobs=edf_jobs_2p, data=st.data(), nfe=st.sampled_from([0, 1, 100, 2**58]),
       reserve=st.sampled_from([0, 50]), prefix=prefixes)
def test_single_lane_with_prefix_equals_prefix_sums(start, jobs, data, nfe, reserve, prefix):
    check_from = data.draw(st.integers(0, len(jobs)))
    assert first_miss([start], jobs, check_from, nfe, reserve, prefix) == \
        prefix_sum_first_miss(start, jobs, check_from, nfe, reserve, prefix)


@settings(max_examples=1000, deadline=None)
@given(lanes=st.lists(times, max_size=5), jobs=edf_jobs_2p, data=st.data(),
       nfe=st.sampled_from([1, 100, 2**58]), reserve=st.sampled_from([0, 50]), prefix=prefixes)
def test_multi_lane_with_prefix_equals_heap_simulation(lanes, jobs, data, nfe, reserve, prefix):
    check_from = data.draw(st.integers(0, len(jobs)))
    assert first_miss(lanes, jobs, check_from, nfe, reserve, prefix) == \
        heap_first_miss(lanes, jobs, check_from, nfe, reserve, prefix)


# ---- through the core: W = 1 decisions are the prefix-sum test on the EDF queue ------------


def with_cede(ns: int, cede: int, every: int) -> int:
    """docs/design.md §5.3: ns of compute on a worker that pauses `cede` per `every` of it."""
    return ns + (ns * cede + every - 1) // every if cede else ns


@settings(max_examples=300, deadline=None)
@given(queued=st.lists(st.tuples(st.integers(0, 3000), st.integers(1, 8)), max_size=12),
       running=st.integers(0, 8), x=st.tuples(st.integers(1, 3000), st.integers(1, 8)),
       reserve=st.sampled_from([0, 30]), cede=st.sampled_from([0, 1, 7, 50]),
       every=st.sampled_from([1, 60, 333, 10_000]))
def test_core_prices_the_workers_pauses(queued, running, x, reserve, cede, every):
    """W = 1 decisions are the prefix-sum test on the EDF queue: without pacing (cede 0) ADR
    0015's exactly, with it (cede_ns per cede_every_ns of compute) at the paced NFE cost with one
    more pause in the reserve; stats show the paced cost."""
    nfe, now = 100, 1_000_000
    config = CoreConfig(workers=1, queue_capacity=64, obs_dim=1, action_len=0, cede_ns=cede,
                        cede_every_ns=every)
    paced = with_cede(nfe, cede, every)
    with Core(config) as c:
        lane_start = now
        if running:
            c.submit(q_request(99, 0, running, now), now)
            c.dispatch(0, now)
            lane_start = now + running * paced
        for i, (rel, n) in enumerate(queued):   # admission off while the queue is built
            assert c.submit(q_request(i, rel, n, now), now) == Decision.ACCEPTED
        c.set_calibration(nfe, reserve)
        assert c.cost_stats(now).in_use_ns == paced
        q = [(item.deadline_ns, item.remaining_nfe) for item in c.queue_snapshot()]
        xd = now + x[0]
        pos = sum(1 for d, _ in q if d != 0 and d <= xd)
        jobs = q[:pos] + [(xd, x[1])] + q[pos:]
        fits = prefix_sum_first_miss(lane_start, jobs, pos, paced, reserve + cede) == len(jobs)
        got = c.submit(q_request(100, x[0], x[1], now), now)
        assert got == (Decision.ACCEPTED if fits else Decision.REJECTED_DEADLINE)


def test_pacing_config_is_checked():
    for bad in ({"cede_ns": 1, "cede_every_ns": 0}, {"cede_ns": 10**9 + 1, "cede_every_ns": 1},
                {"cede_ns": 1, "cede_every_ns": 10**9 + 1}):
        with pytest.raises(ValueError):
            Core(CoreConfig(obs_dim=1, action_len=0, **bad))


@settings(max_examples=300, deadline=None)
@given(queued=st.lists(st.tuples(st.integers(0, 3000), st.integers(1, 8)), max_size=12),
       running=st.integers(0, 8), reported=st.booleans(),
       x=st.tuples(st.integers(1, 3000), st.integers(1, 8)),
       reserve=st.sampled_from([0, 30]), prefix=st.sampled_from([0, 40, 100, 700]))
def test_core_two_phase_single_lane_decision_is_prefix_sum(queued, running, reported, x,
                                                           reserve, prefix):
    """Every queued request and x pay prefix_ns once; the running one only until prefix_done."""
    nfe, now = 100, 1_000_000
    with Core(CoreConfig(workers=1, queue_capacity=64, obs_dim=1, action_len=0,
                         two_phase=1)) as c:
        lane_start = now
        if running:
            c.submit(q_request(99, 0, running, now), now)
            c.dispatch(0, now)
            if reported:
                assert c.prefix_done(0, now, prefix) == Step.CONTINUE
            lane_start = now + running * nfe + (0 if reported else prefix)
        for i, (rel, n) in enumerate(queued):   # admission off while the queue is built
            assert c.submit(q_request(i, rel, n, now), now) == Decision.ACCEPTED
        c.set_calibration(nfe, reserve, prefix)
        q = [(item.deadline_ns, item.remaining_nfe, 1) for item in c.queue_snapshot()]
        xd = now + x[0]
        pos = sum(1 for d, _, _ in q if d != 0 and d <= xd)
        jobs = q[:pos] + [(xd, x[1], 1)] + q[pos:]
        fits = prefix_sum_first_miss(lane_start, jobs, pos, nfe, reserve, prefix) == len(jobs)
        got = c.submit(q_request(100, x[0], x[1], now), now)
        assert got == (Decision.ACCEPTED if fits else Decision.REJECTED_DEADLINE)
