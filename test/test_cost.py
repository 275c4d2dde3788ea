# SPDX-License-Identifier: Apache-2.0
"""docs/design.md §5.2 on the C core (csrc/fer_cost.c) in virtual time: the measured NFE tail, the
adaptive cost model and what admission decides with it.

Every NFE duration is chosen here and fed through Core.step with a chosen `now`, so what the
estimate must be at each instant is known exactly (a sample that is equal for the whole window
is reported exactly: the tail is capped at the window's maximum). Two-phase models have a second
estimator for prefix passes (fed by Core.prefix_done), checked at the end.
"""

from functools import partial

import numpy as np
import pytest
from core_helpers import make_core, request
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_model import RefCost

from flowedge_relay.core import (
    Code,
    Core,
    CostModel,
    Decision,
    InvalidArgument,
    Step,
)

T = 10_000_000_000  # an arbitrary base time, ns
S = 1_000_000_000
FLOOR = 100_000  # configured nfe_ns
RESERVE = 5_000_000  # admission_reserve_ns: a stall is an excess of at least RESERVE / 2
OBS = ACT = 2


make = partial(make_core, obs_dim=OBS, action_len=ACT, nfe_ns=FLOOR, max_nfe=100_000,
               queue_capacity=8, cost_model=CostModel.ADAPTIVE)


# session s, seed 0, origin T unless told, the same deadline on both clocks
req = partial(request, b"s", seed=0, ros_clock_offset=0, origin=T, obs_dim=OBS)


class Lane:
    """Lane 0 running no-deadline requests of `per_request` NFE back to back (each dispatched as
    the one before it ends), stepped with chosen durations. The block mean's blocks close at a
    request's end once they hold 16 spans (at 128 in one long request): requests of 16 NFE make
    every request one block."""

    def __init__(self, core: Core, now: int = T, seq: int = 1, per_request: int = 16) -> None:
        self.core, self.now, self.seq, self.per_request = core, now, seq, per_request
        self._next()

    def _next(self) -> None:
        self.left = self.per_request
        assert self.core.submit(req(self.seq, nfe=self.per_request, origin=self.now),
                                self.now) == Decision.ACCEPTED
        assert self.core.dispatch(0, self.now) is not None
        self.seq += 1_000  # clear of the sequences the tests submit themselves

    def nfe(self, duration_ns: int, n: int = 1) -> None:
        for _ in range(n):
            self.now += duration_ns
            self.left -= 1
            end = self.left == 0
            assert self.core.step(0, self.now, duration_ns) == (Step.DONE if end else
                                                                Step.CONTINUE)
            if end:
                self.core.finish(0, self.now, np.zeros(ACT, np.float32))
                self._next()


def test_static_measures_the_tail_but_admits_with_the_configured_value():
    with make(cost_model=CostModel.STATIC) as c:
        lane = Lane(c)
        lane.nfe(300_000, 50)
        k = c.cost_stats(lane.now)
        assert k.cost_model == CostModel.STATIC
        assert k.observed_tail_ns == k.window_max_ns == 300_000
        assert k.configured_ns == FLOOR and k.in_use_ns == FLOOR  # drift, not adaptation
        assert k.window_samples == k.samples_total == 50


def test_estimate_reacts_within_a_second_of_virtual_time():
    with make() as c:
        lane = Lane(c)
        lane.nfe(FLOOR, 2000)  # 0.2 s at the calibrated cost
        assert c.cost_stats(lane.now).in_use_ns == FLOOR
        start = lane.now
        # The host gets loaded: NFEs cost 4x. With p90 the estimate follows once 10% of the
        # window is slow: 223 NFEs after 2,000 fast ones, 89 ms, far less than a second.
        while c.cost_stats(lane.now).in_use_ns < 400_000:
            lane.nfe(400_000)
            assert lane.now - start < S, "no reaction within 1 s of virtual time"
        k = c.cost_stats(lane.now)
        assert lane.now - start <= 230 * 400_000
        assert 400_000 <= k.observed_tail_ns <= 400_000 * 1.07  # bucket width, capped at max
        assert k.in_use_ns == k.observed_tail_ns


def test_estimate_decays_after_the_window_and_never_goes_below_the_floor():
    with make() as c:
        lane = Lane(c)
        lane.nfe(500_000, 100)
        assert c.cost_stats(lane.now).in_use_ns == 500_000
        spike_end = lane.now
        # Fast NFEs for a whole window: the slow ones age out, and 20 us is below the floor.
        while lane.now < spike_end + S + S // 4:
            lane.nfe(20_000, 100)
        k = c.cost_stats(lane.now)
        assert k.observed_tail_ns == 20_000
        assert k.in_use_ns == FLOOR


def test_idle_relay_forgets_the_tail_after_the_window():
    with make() as c:
        lane = Lane(c)
        lane.nfe(500_000, 10)
        assert c.cost_stats(lane.now + S // 2).in_use_ns == 500_000  # still in the window
        k = c.cost_stats(lane.now + S + S // 4)
        assert k.window_samples == 0 and k.observed_tail_ns == 0
        assert k.in_use_ns == FLOOR
        assert k.samples_total == 10


def test_the_tail_is_a_quantile_not_the_maximum():
    with make() as c:  # p90 by default
        lane = Lane(c)
        for _ in range(50):  # 5% outliers, one NFE in 20 (a neighbour's preemptions)
            lane.nfe(FLOOR, 19)
            lane.nfe(2_000_000)
        k = c.cost_stats(lane.now)
        assert k.quantile_ppm == 900_000 and k.window_max_ns == 2_000_000
        # the upper edge of the p90's bucket (buckets are 1/16 octave wide): conservative
        assert FLOOR <= k.quantile_tail_ns <= FLOOR * 1.07
        # ... but the busiest block (one 16-NFE request) held one outlier: it is charged a sixteenth
        assert k.block_mean_ns == (15 * FLOOR + 2_000_000) // 16
        assert k.observed_tail_ns == k.in_use_ns == k.block_mean_ns
        for _ in range(80):  # now 11% of the window: a sustained slowdown, the p90
            lane.nfe(FLOOR)
            lane.nfe(2_000_000)
        assert c.cost_stats(lane.now).quantile_tail_ns == 2_000_000
    with make(cost_quantile_ppm=990_000) as c:  # p99
        lane = Lane(c)
        lane.nfe(FLOOR, 995)
        lane.nfe(2_000_000, 5)  # 0.5% outliers: not the p99
        assert FLOOR <= c.cost_stats(lane.now).quantile_tail_ns <= FLOOR * 1.07
        lane.nfe(2_000_000, 15)  # now 2% of the window: the p99 is an outlier
        assert c.cost_stats(lane.now).quantile_tail_ns == 2_000_000
    with make(cost_quantile_ppm=1_000_000) as c:  # the maximum
        lane = Lane(c)
        lane.nfe(FLOOR, 995)
        lane.nfe(250_000, 1)
        assert c.cost_stats(lane.now).quantile_tail_ns == 250_000


# ---- the block mean: busy time per step over 16 consecutive steps ---------------------------


def test_a_burst_that_moves_no_quantile_is_priced_by_the_block_mean():
    # 50 ms of NFEs at 3x after half a second of fast ones: 3% of the NFEs, no p90 moves, yet
    # work queued behind the burst runs 3x slower than admission planned. The block mean is the
    # window's p99 block: the burst is priced once more than 1 in 100 of the window's blocks
    # are slow (about 316 in all: four at 3x, after the half-fast one the burst began in).
    with make() as c:
        lane = Lane(c)
        lane.nfe(FLOOR, 5000)
        assert c.cost_stats(lane.now).in_use_ns == FLOOR
        start = lane.now
        while c.cost_stats(lane.now).in_use_ns < 3 * FLOOR:
            lane.nfe(3 * FLOOR)
        assert lane.now - start == (8 + 4 * 16) * 3 * FLOOR  # at its fourth whole block
        lane.nfe(3 * FLOOR, 170 - (lane.now - start) // (3 * FLOOR))
        lane.nfe(FLOOR, 100)
        k = c.cost_stats(lane.now)
        assert FLOOR <= k.quantile_tail_ns <= FLOOR * 1.07
        assert k.block_mean_ns == k.observed_tail_ns == k.in_use_ns == 3 * FLOOR
        k = c.cost_stats(lane.now + S + S // 4)  # and it ages out with the window
        assert (k.block_mean_ns, k.in_use_ns) == (0, FLOOR)


def test_time_between_steps_of_busy_workers_is_charged():
    # Each NFE computes for 100 us but the worker starts the next 200 us later (publishing,
    # dispatching, waiting for a core): a step costs the queue 300 us, as the block mean says.
    with make() as c:
        lane = Lane(c)
        lane.nfe(FLOOR)  # the request's first step (a gap before it is its turnover, below)
        for _ in range(64):
            lane.now += 200_000
            lane.nfe(FLOOR)
        k = c.cost_stats(lane.now)
        assert (k.quantile_tail_ns, k.block_mean_ns, k.in_use_ns) == (FLOOR, 300_000, 300_000)


def test_a_pacing_pause_is_left_out_of_the_span_but_its_overrun_is_not():
    # §5.3: a real-time worker pauses 500 us after every 7.5 ms of compute, and the cost in use
    # prices that (fer_with_cede). Charged to the span as well, a pause would add 500 us / 16 to
    # the block holding it. Reported (Core.paused), only what the sleep overran stays: a wake-up
    # 40 us late is 40 us of the host's, so the block mean prices it like any other gap.
    pause = 500_000
    for late, charged in ((0, FLOOR), (40_000, FLOOR + 40_000 // 16)):
        with make() as c:
            lane = Lane(c)
            lane.nfe(FLOOR)  # the request's first step
            for _ in range(4):
                lane.nfe(FLOOR, 15)
                lane.now += pause + late
                c.paused(0, pause)
                lane.nfe(FLOOR)
            k = c.cost_stats(lane.now)
            assert (k.quantile_tail_ns, k.block_mean_ns) == (FLOOR, charged)
    with make() as c:  # unreported, the same pauses cost their block a sixteenth each
        lane = Lane(c)
        lane.nfe(FLOOR)
        for _ in range(4):
            lane.nfe(FLOOR, 15)
            lane.now += pause
            lane.nfe(FLOOR)
        assert c.cost_stats(lane.now).block_mean_ns == FLOOR + pause // 16
    with make() as c:  # a pause never takes a step's compute out: at most its gap
        lane = Lane(c)
        lane.nfe(FLOOR, 17)
        for _ in range(16):
            c.paused(0, pause)
            lane.nfe(FLOOR)
        assert c.cost_stats(lane.now).block_mean_ns == FLOOR


def test_a_request_is_priced_over_its_own_steps_not_its_worst_sixteen():
    # One 1.5 ms preemption in every request (a neighbour, well under the 5 ms reserve's stall
    # size): a block is the worker's run of whole requests, so each 64-NFE request costs
    # FLOOR + 1.5 ms / 64 per NFE, as admission charges it, not the 1.5 ms / 16 of its worst 16
    # steps. Requests under 16 NFE share a block of 16 spans, closed at a request's end; one long
    # request closes one every 128 steps.
    preemption = 1_500_000
    for per_request, span_n, charged_n in ((64, 64, 64), (4, 16, 16), (100_000, 128, 128)):
        with make(admission_reserve_ns=RESERVE) as c:
            lane = Lane(c, per_request=per_request)
            for _ in range(4):
                lane.nfe(FLOOR, span_n // 2 - 1)
                lane.now += preemption  # mid-request: in a span, not a turnover
                lane.nfe(FLOOR, span_n // 2 + 1)
            k = c.cost_stats(lane.now)
            assert (k.block_mean_ns, k.in_use_ns) == ((charged_n * FLOOR + preemption) //
                                                      charged_n,) * 2


def test_a_request_preempted_past_the_windows_p99_is_left_to_the_reserve():
    # A neighbour's 1.5 ms time slice (under the 5 ms reserve's stall size) lands inside two
    # 16-NFE requests of 400 in the window: those two are past the window's p99 request, which
    # is what static's calibration of whole requests charges, so the block mean stays at the
    # floor; their excess is the reserve's and the other requests' slack, as for static. When
    # one request in twenty meets one, the p99 request is a preempted one, priced in full.
    preemption = 1_500_000
    for every, charged in ((200, FLOOR), (20, FLOOR + preemption // 16)):
        with make(admission_reserve_ns=RESERVE) as c:
            lane = Lane(c)
            for i in range(400):
                lane.nfe(FLOOR, 8)
                lane.now += preemption if i % every == every - 1 else 0
                lane.nfe(FLOOR, 8)
            k = c.cost_stats(lane.now)
            assert (k.block_mean_ns, k.in_use_ns) == (charged, charged)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), per_request=st.sampled_from([16, 24, 64]),
       reserve=st.sampled_from([0, RESERVE]), share=st.sampled_from([0.0, 0.005, 0.03, 0.2]))
def test_the_block_means_quantile_matches_the_reference(seed, per_request, reserve, share):
    # The C estimator's block mean, the p99 of the window's whole-request blocks under the
    # stall rule, equals the reference model's over hundreds of blocks, with preemptions of
    # every size (jitter, stall-sized, past the reserve) landing in a share of the requests,
    # and as the window ages out.
    rng = np.random.default_rng(seed)
    ref = RefCost()
    ref.configure(1, 0, 1_000_000, reserve)
    t = [0, 0, per_request, 0, [], 0, 0]
    with make(admission_reserve_ns=reserve) as c:
        lane = Lane(c, per_request=per_request)
        for i in range(6000 // per_request):
            for j in range(per_request):
                gap = 0
                if j == per_request // 2 and rng.random() < share:
                    gap = int(rng.choice([300_000, 3_000_000, 9_000_000]))
                d = int(rng.integers(FLOOR // 2, 2 * FLOOR))
                lane.now += gap
                lane.nfe(d)
                ends = j == per_request - 1
                ref.record(lane.now, d, ref.turnover(t, gap + d, d), t, ends)
                t[2] = per_request if ends else 0
            if i % 40 == 0:
                assert c.cost_stats(lane.now).block_mean_ns == ref.stats(FLOOR, lane.now)[1]
        for later in (0, S // 3, S // 2, S):
            assert c.cost_stats(lane.now + later).block_mean_ns == \
                ref.stats(FLOOR, lane.now + later)[1]


# ---- the stall rule: one reserve-sized stall per window is the reserve's, not the block mean's --

def stall(lane: Lane, gap_ns: int) -> None:
    """A block of 16 steps at the floor whose first one starts gap_ns late (the worker held off
    its CPU between two steps): its span is gap_ns + FLOOR, 15 spans of FLOOR around it."""
    lane.now += gap_ns
    lane.nfe(FLOOR, 16)


def test_a_single_reserve_sized_stall_is_left_to_the_reserve():
    for reserve, charged in ((RESERVE, FLOOR), (0, (15 * FLOOR + 4_100_000) // 16)):
        with make(admission_reserve_ns=reserve) as c:
            lane = Lane(c)
            lane.nfe(FLOOR, 160)  # ten blocks at the floor
            stall(lane, 4_000_000)  # excess 4 ms: a stall under a 5 ms reserve
            lane.nfe(FLOOR, 48)
            k = c.cost_stats(lane.now)
            # with the reserve, the stall's block costs its typical span; without, a sixteenth
            assert (k.quantile_tail_ns, k.block_mean_ns, k.in_use_ns) == \
                (FLOOR, charged, max(FLOOR, charged))
    with make(admission_reserve_ns=RESERVE) as c:
        # The part of a stall's excess beyond the reserve is still charged: 8 ms - 5 ms.
        lane = Lane(c)
        lane.nfe(FLOOR, 16)
        stall(lane, 8_000_000)
        assert c.cost_stats(lane.now).block_mean_ns == (16 * FLOOR + 3_000_000) // 16


def test_two_stalls_in_the_window_are_both_charged():
    with make(admission_reserve_ns=RESERVE) as c:
        lane = Lane(c)
        lane.nfe(FLOOR, 16)
        stall(lane, 4_000_000)
        lane.nfe(FLOOR, 1000)  # 100 ms later, well inside the 1 s window: a second stall
        assert c.cost_stats(lane.now).block_mean_ns == FLOOR
        stall(lane, 3_000_000)
        k = c.cost_stats(lane.now)
        # the reserve covers one stall per promise, not one per block: both are priced again,
        # the first one too, and at once
        assert (k.block_mean_ns, k.in_use_ns) == ((15 * FLOOR + 4_100_000) // 16,) * 2
        # once the first has aged out (a window later, the second with it) the rule holds again
        lane.nfe(FLOOR, 12_500)
        stall(lane, 4_000_000)
        assert c.cost_stats(lane.now).block_mean_ns == FLOOR


def test_a_sustained_slowdown_and_a_small_preemption_are_charged():
    with make(admission_reserve_ns=RESERVE) as c:
        # every step waits 200 us for a core: no span stands out of its block
        lane = Lane(c)
        lane.nfe(FLOOR)  # the request's first step (a gap before it is its turnover, below)
        for _ in range(64):
            lane.now += 200_000
            lane.nfe(FLOOR)
        assert c.cost_stats(lane.now).block_mean_ns == 300_000
    with make(admission_reserve_ns=RESERVE) as c:
        # a preemption of less than half the reserve is jitter, not a stall: a sixteenth of it
        lane = Lane(c)
        lane.nfe(FLOOR, 16)
        stall(lane, 2_000_000)
        assert c.cost_stats(lane.now).block_mean_ns == (15 * FLOOR + 2_100_000) // 16
    with make(admission_reserve_ns=RESERVE) as c:
        # a slowdown made of long preemptions (one per block) is a stall per block: all charged
        lane = Lane(c)
        for _ in range(8):
            stall(lane, 4_000_000)
        assert c.cost_stats(lane.now).block_mean_ns == (15 * FLOOR + 4_100_000) // 16


def test_a_promise_longer_than_the_window_suspends_the_stall_rule():
    with make(admission_reserve_ns=RESERVE, workers=2) as c:
        lane = Lane(c)
        lane.nfe(FLOOR, 16)
        # admitted with 1.5 s to go: its horizon may hold two stalls a window apart
        deadline = lane.now + S + S // 2
        assert c.submit(req(2, nfe=1, deadline=deadline, origin=lane.now), lane.now) == \
            Decision.ACCEPTED
        assert c.dispatch(1, lane.now) is not None  # lane 1 holds it (it never steps)
        stall(lane, 4_000_000)
        assert c.cost_stats(lane.now).block_mean_ns == (15 * FLOOR + 4_100_000) // 16
        # a sub-window past that deadline (the first stall aged out) one stall is the reserve's
        lane.nfe(FLOOR, 17_600)
        assert lane.now > deadline + S // 4
        stall(lane, 4_000_000)
        assert c.cost_stats(lane.now).block_mean_ns == FLOOR


def test_a_new_reserve_charges_the_stalls_it_did_not_cover():
    with make(admission_reserve_ns=RESERVE) as c:
        lane = Lane(c)
        lane.nfe(FLOOR, 16)
        stall(lane, 4_000_000)
        assert c.cost_stats(lane.now).block_mean_ns == FLOOR
        c.set_calibration(FLOOR, RESERVE // 2)  # 2.5 ms no longer covers a 4 ms excess
        assert c.cost_stats(lane.now).block_mean_ns == (15 * FLOOR + 4_100_000) // 16


# ---- the turnover rule: a request's turnover is paid by its own steps --------------------------


def requests_back_to_back(core: Core, now: int, n: int, nfe: int, gap_ns: int,
                          seq: int = 100) -> int:
    """n requests of `nfe` NFE on lane 0, each arriving and dispatched as the previous one ends,
    its first step starting gap_ns later (the previous answer handed off, the join), every step
    computing FLOOR; returns the time after the last."""
    for i in range(n):
        assert core.submit(req(seq + i, nfe=nfe, origin=now), now) == Decision.ACCEPTED
        assert core.dispatch(0, now) is not None
        now += gap_ns
        for j in range(nfe):
            now += FLOOR
            assert core.step(0, now, FLOOR) == (Step.DONE if j == nfe - 1 else Step.CONTINUE)
        core.finish(0, now, np.zeros(ACT, np.float32))
    return now


def test_a_requests_turnover_is_priced_at_one_nfe_th_per_nfe():
    # 800 us between requests of 64 NFE: each NFE of the queue costs FLOOR + 800 us / 64, not
    # the 800 us / 16 the block holding a request's first step would charge.
    with make() as c:
        now = requests_back_to_back(c, T, 8, 64, 800_000)
        assert c.cost_stats(now).block_mean_ns == FLOOR + 12_500
    # 4-NFE requests: four turnovers in every block, the same 1/NFE as before
    with make() as c:
        now = requests_back_to_back(c, T, 32, 4, 800_000)
        assert c.cost_stats(now).block_mean_ns == FLOOR + 200_000
    # unequal requests: the one whose turnover weighs most per NFE sets the price
    with make() as c:
        now = requests_back_to_back(c, T, 4, 64, 800_000)
        now = requests_back_to_back(c, now, 4, 32, 800_000, seq=200)
        assert c.cost_stats(now).block_mean_ns == FLOOR + 25_000


def test_a_stall_sized_turnover_is_left_to_the_stall_rule():
    # A 4 ms gap before a request's first step: a stall under a 5 ms reserve, so a span of its
    # block as before (the reserve pays it once per window); without a reserve it is turnover.
    for reserve, charged in ((RESERVE, FLOOR), (0, FLOOR + 4_000_000 // 64)):
        with make(admission_reserve_ns=reserve) as c:
            now = requests_back_to_back(c, T, 2, 64, 0)
            now = requests_back_to_back(c, now, 1, 64, 4_000_000, seq=200)
            assert c.cost_stats(now).block_mean_ns == charged


def test_turnover_left_by_work_that_stopped_early_is_paid_by_the_next():
    # A 64-NFE request stopped (stale) after 3 steps leaves 61 installments of its 640 us
    # turnover: the next request's steps take them on, so nothing is lost. The 3 + 13 steps of
    # the two requests are one block, holding exactly the whole 640 us.
    with make() as c:
        now = T
        assert c.submit(req(1, nfe=64, origin=now), now) == Decision.ACCEPTED
        assert c.dispatch(0, now) is not None
        now += 640_000
        for _ in range(2):
            now += FLOOR
            assert c.step(0, now, FLOOR) == Step.CONTINUE
        newer = request(b"s", 2, gen=1, nfe=13, seed=0, origin=now, obs_dim=OBS)
        assert c.submit(newer, now) == Decision.ACCEPTED  # the running one is now stale
        now += FLOOR
        assert c.step(0, now, FLOOR) == Step.STOP_STALE
        assert c.dispatch(0, now) is not None
        for j in range(13):
            now += FLOOR
            assert c.step(0, now, FLOOR) == (Step.DONE if j == 12 else Step.CONTINUE)
        assert c.cost_stats(now).block_mean_ns == FLOOR + 640_000 // 16


def one_nfe_requests(core: Core, now: int, n: int, gap_ns: int, lane: int = 0) -> int:
    """n 1-NFE requests on `lane`, each arriving gap_ns after the previous one finished and
    computing for FLOOR; returns the time after the last."""
    for i in range(n):
        now += gap_ns
        assert core.submit(req(100 + i, nfe=1, origin=now), now) == Decision.ACCEPTED
        assert core.dispatch(lane, now + 1_000) is not None
        now += 1_000 + FLOOR
        assert core.step(lane, now, FLOOR) == Step.DONE
        core.finish(lane, now, np.zeros(ACT, np.float32))
    return now


def test_idle_time_is_not_charged_but_waiting_work_is():
    with make() as c:
        # Idle 5 ms before each arrival: charged from the arrival (1 us to dispatch + the NFE).
        now = one_nfe_requests(c, T, 32, 5_000_000)
        assert c.cost_stats(now).block_mean_ns == FLOOR + 1_000
        # Queued work that waits while the worker finishes and dispatches is charged from the
        # worker's previous step: 8 requests queued at once (4 times), the worker dispatching
        # each 50 us after the previous one's step.
        for i in range(32):
            if i % 8 == 0:
                for k in range(8):
                    assert c.submit(req(200 + i + k, nfe=1, origin=now), now) == Decision.ACCEPTED
            now += 50_000
            assert c.dispatch(0, now) is not None
            now += FLOOR
            assert c.step(0, now, FLOOR) == Step.DONE
            c.finish(0, now, np.zeros(ACT, np.float32))
        assert c.cost_stats(now).block_mean_ns == FLOOR + 50_000


def test_the_rows_of_a_batched_step_charge_the_step_once():
    # B = 4, every row stepped at the same end: each slot advanced one NFE per 250 us step.
    with make(batch_slots=4) as c:
        for i in range(4):
            assert c.submit(req(i + 1, nfe=32, origin=T), T) == Decision.ACCEPTED
            assert c.dispatch_worker(0, T) is not None
        now = T
        for j in range(32):
            now += 250_000
            for lane in range(4):
                assert c.step(lane, now, 250_000) == (Step.DONE if j == 31 else Step.CONTINUE)
        k = c.cost_stats(now)
        assert (k.window_samples, k.block_mean_ns, k.observed_tail_ns) == (128, 250_000, 250_000)


def test_a_prefix_pass_is_not_charged_to_the_next_step():
    with make(two_phase=1, prefix_ns=PREFIX_FLOOR) as c:
        now = prefix_passes(c, T, 900_000, 32)
        k = c.cost_stats(now)
        assert (k.block_mean_ns, k.prefix_observed_tail_ns) == (FLOOR, 900_000)


def _feasible_at_floor(core: Core, now: int, seq: int) -> Decision:
    """10 NFE due in 1.5 ms: fits at 100 us per NFE on an idle lane, not at 300 us."""
    return core.submit(req(seq, nfe=10, deadline=now + 1_500_000, origin=now), now)


@pytest.mark.parametrize("model", [CostModel.STATIC, CostModel.ADAPTIVE])
def test_admission_follows_the_estimate_only_in_adaptive_mode(model):
    with make(cost_model=model, workers=2) as c:
        lane = Lane(c)  # lane 0 measures; lane 1 stays idle for the new request
        lane.nfe(300_000, 100)
        c.pop_outcomes()  # the lane's own answers
        now = lane.now
        decision = _feasible_at_floor(c, now, 2)
        if model == CostModel.STATIC:
            assert decision == Decision.ACCEPTED
        else:
            assert decision == Decision.REJECTED_DEADLINE
            assert [o.code for o in c.pop_outcomes()] == [Code.REJECTED_DEADLINE]
            # Once the slow samples have left the window the same request fits again.
            assert _feasible_at_floor(c, now + S + S // 4, 3) == Decision.ACCEPTED


@pytest.mark.parametrize("model", [CostModel.STATIC, CostModel.ADAPTIVE])
def test_dispatch_expires_what_cannot_finish_at_the_cost_in_use(model):
    with make(cost_model=model, workers=2) as c:
        lane = Lane(c, per_request=1_000)
        lane.nfe(100_000, 100)
        now = lane.now
        assert _feasible_at_floor(c, now, 2) == Decision.ACCEPTED  # admitted at 100 us
        # The host slows down before lane 1 picks it up: 100 NFEs of 300 us end within 10 us.
        for _ in range(100):
            assert c.step(0, now + 10_000, 300_000) == Step.CONTINUE
        work = c.dispatch(1, now + 20_000)
        if model == CostModel.STATIC:
            assert work is not None and work.sequence == 2
        else:  # 10 x 300 us no longer fit in the 1.48 ms left
            assert work is None
            assert [o.code for o in c.pop_outcomes()] == [Code.EXPIRED]


def test_dispatch_judges_one_request_by_the_quantile_not_the_block_mean():
    # Admitted at the floor with 3 ms to spare; then the worker on lane 0 spends 300 us between
    # its 100 us NFEs for 128 steps (a neighbour's burst): the block mean is 400 us and admission
    # prices new work at that, but the request about to start is judged at the NFE quantile.
    with make(workers=2) as c:
        lane = Lane(c, per_request=1_000)  # one long request: blocks of 128 steps
        lane.nfe(FLOOR, 128)
        deadline = lane.now + 128 * 400_000 + 3_000_000
        assert c.submit(req(2, nfe=10, deadline=deadline, origin=lane.now), lane.now) == \
            Decision.ACCEPTED
        for _ in range(128):
            lane.now += 300_000
            lane.nfe(FLOOR)
        k = c.cost_stats(lane.now)
        assert (k.quantile_tail_ns, k.block_mean_ns, k.in_use_ns) == (FLOOR, 400_000, 400_000)
        # a new request like it no longer fits (10 x 400 us > 3 ms) ...
        assert c.submit(req(3, nfe=10, deadline=deadline, origin=lane.now), lane.now) == \
            Decision.REJECTED_DEADLINE
        # ... but the admitted one still can finish at the NFE cost (10 x 100 us): it runs
        work = c.dispatch(1, lane.now)
        assert work is not None and work.sequence == 2


def test_switching_the_model_live_and_validation():
    with make(cost_model=CostModel.STATIC, workers=2) as c:
        lane = Lane(c)
        lane.nfe(300_000, 100)
        assert _feasible_at_floor(c, lane.now, 2) == Decision.ACCEPTED
        c.set_cost_model(CostModel.ADAPTIVE)  # same window: the samples are kept
        assert c.cost_stats(lane.now).in_use_ns == 300_000
        c.set_cost_model(CostModel.ADAPTIVE, window_ns=2 * S)  # a new window starts empty
        k = c.cost_stats(lane.now)
        assert k.window_ns == 2 * S and k.window_samples == 0 and k.in_use_ns == FLOOR
        with pytest.raises(InvalidArgument):
            c.set_cost_model(2)
        with pytest.raises(InvalidArgument):
            c.set_cost_model(CostModel.ADAPTIVE, quantile_ppm=1_000_001)
    with pytest.raises(InvalidArgument):
        make(cost_model=2)
    with pytest.raises(InvalidArgument):
        make(cost_quantile_ppm=1_000_001)


def test_defaults_and_extreme_durations_saturate():
    with make() as c:
        k = c.cost_stats(T)
        assert (k.window_ns, k.quantile_ppm, k.window_samples, k.in_use_ns) == \
            (S, 900_000, 0, FLOOR)
        lane = Lane(c)
        lane.nfe(2**63, 1)  # longer than any bucket: the open-ended last one, capped at max
        k = c.cost_stats(lane.now)
        assert k.observed_tail_ns == 2**63 and k.in_use_ns == 2**63
        # Any finite deadline now misses (saturating arithmetic), nothing wraps to "fits".
        assert c.submit(req(9, nfe=1, deadline=2**64 - 2, origin=lane.now), lane.now) == \
            Decision.REJECTED_DEADLINE


# ---- the prefix estimator (two-phase models): a second instance, same model / window ----------

PREFIX_FLOOR = 400_000  # configured prefix_ns


def prefix_passes(core: Core, now: int, duration_ns: int, n: int, lane: int = 0,
                  seq0: int = 1000) -> int:
    """n requests of 1 NFE through `lane`, each with a measured prefix pass of duration_ns and an
    NFE at the configured cost; returns the time after the last."""
    for i in range(n):
        assert core.submit(req(seq0 + i, nfe=1, origin=now), now) == Decision.ACCEPTED
        assert core.dispatch(lane, now) is not None
        now += duration_ns
        assert core.prefix_done(lane, now, duration_ns) == Step.CONTINUE
        now += FLOOR
        assert core.step(lane, now, FLOOR) == Step.DONE
        core.finish(lane, now, np.zeros(ACT, np.float32))
    return now


def test_prefix_passes_have_their_own_estimate():
    with make(cost_model=CostModel.STATIC, two_phase=1, prefix_ns=PREFIX_FLOOR) as c:
        now = prefix_passes(c, T, 900_000, 20)
        k = c.cost_stats(now)
        assert (k.prefix_configured_ns, k.prefix_observed_tail_ns, k.prefix_samples_total) == \
            (PREFIX_FLOOR, 900_000, 20)
        assert k.prefix_in_use_ns == PREFIX_FLOOR       # static: drift shown, not used
        # The NFE estimate saw only the NFEs.
        assert (k.observed_tail_ns, k.samples_total, k.in_use_ns) == (FLOOR, 20, FLOOR)
        c.set_cost_model(CostModel.ADAPTIVE)
        k = c.cost_stats(now)
        assert k.prefix_in_use_ns == 900_000 and k.in_use_ns == FLOOR


def test_prefix_estimate_never_below_the_floor_and_decays():
    with make(two_phase=1, prefix_ns=PREFIX_FLOOR) as c:
        now = prefix_passes(c, T, 50_000, 10)           # faster than configured
        assert c.cost_stats(now).prefix_in_use_ns == PREFIX_FLOOR
        now = prefix_passes(c, now, 700_000, 10, seq0=2000)
        assert c.cost_stats(now).prefix_in_use_ns == 700_000
        k = c.cost_stats(now + S + S // 4)              # the window has passed
        assert (k.prefix_observed_tail_ns, k.prefix_in_use_ns) == (0, PREFIX_FLOOR)


def test_prefix_in_use_is_zero_without_two_phase_or_admission():
    with make(two_phase=0, prefix_ns=PREFIX_FLOOR) as c:
        assert c.cost_stats(T).prefix_in_use_ns == 0
    with make(two_phase=1, prefix_ns=PREFIX_FLOOR, nfe_ns=0) as c:
        assert c.cost_stats(T).prefix_in_use_ns == 0
        c.set_calibration(FLOOR, 0, PREFIX_FLOOR)
        assert c.cost_stats(T).prefix_in_use_ns == PREFIX_FLOOR


@pytest.mark.parametrize("model", [CostModel.STATIC, CostModel.ADAPTIVE])
def test_admission_prices_the_measured_prefix_only_in_adaptive_mode(model):
    # 1 NFE + prefix due in 1 ms on an idle lane: fits at 400 us + 100 us, not at 950 us + 100 us.
    with make(cost_model=model, workers=1, two_phase=1, prefix_ns=PREFIX_FLOOR) as c:
        now = prefix_passes(c, T, 950_000, 5)
        decision = c.submit(req(1, nfe=1, deadline=now + 1_000_000, origin=now), now)
        assert decision == (Decision.ACCEPTED if model == CostModel.STATIC
                            else Decision.REJECTED_DEADLINE)
        if model == CostModel.ADAPTIVE:
            # Dispatch expiry uses the same estimate: admitted at the floor (before the slow
            # passes were measured), expired at dispatch once they are.
            c.set_cost_model(CostModel.STATIC)
            assert c.submit(req(2, nfe=1, deadline=now + 1_000_000, origin=now), now) == \
                Decision.ACCEPTED
            c.set_cost_model(CostModel.ADAPTIVE)
            assert c.dispatch(0, now) is None
            assert [o.code for o in c.pop_outcomes()][-1] == Code.EXPIRED
