# SPDX-License-Identifier: Apache-2.0
"""One test per rule of docs/design.md §4-8 on the C core, with hand-computed expectations.

Times are virtual nanoseconds passed explicitly; T is an arbitrary base time.
"""

import threading
import time
from functools import partial

import numpy as np
import pytest
from core_helpers import U64, make_core, request

from flowedge_relay.core import (
    AgeGate,
    Code,
    Core,
    Decision,
    FailCause,
    InvalidArgument,
    InvalidState,
    Step,
)

T = 1_000_000
OBS = 2
ACT = 2

make = partial(make_core, obs_dim=OBS, action_len=ACT)
# origin T, the ROS-clock deadline 17 ns after the monotonic one (told apart), obs zeros(OBS)
req = partial(request, origin=T, ros_clock_offset=17, obs_dim=OBS)


def sub(core: Core, now=T, **kw) -> Decision:
    return core.submit(req(**{"origin": now, **kw}), now)


def queue(core: Core) -> list[tuple]:
    return [(q.session_id, q.sequence) for q in core.queue_snapshot()]


def codes(core: Core) -> list[tuple]:
    return [(o.code, o.session_id, o.sequence, o.lane) for o in core.pop_outcomes()]


def run_to_done(core: Core, lane: int, now: int) -> None:
    while core.step(lane, now, 1) == Step.CONTINUE:
        pass


# ---- §4 step 2 / §6: duplicates -----------------------------------------------------------------


def test_duplicate_of_queued_is_coalesced_without_output():
    with make() as c:
        assert sub(c, seq=1) == Decision.ACCEPTED
        assert sub(c, seq=1, retry=1, reason=1) == Decision.COALESCED
        assert queue(c) == [(b"s", 1)]
        assert codes(c) == []
        assert c.stats().coalesced == 1


def test_duplicate_check_comes_before_stale_and_retry_gate():
    with make() as c:
        assert sub(c, seq=1, gen=3, deadline=T + 100) == Decision.ACCEPTED
        # Generation 1 < 3 and age 10_000 >= slack 100: still a duplicate first.
        assert sub(c, seq=1, gen=1, deadline=T + 100, retry=1, origin=T - 10_000) == \
            Decision.COALESCED
        assert codes(c) == []


def test_duplicate_drains_late_queued_original_as_expired():
    with make() as c:
        assert sub(c, seq=1, deadline=T + 500) == Decision.ACCEPTED
        assert sub(c, now=T + 500, seq=1, deadline=T + 500, retry=1) == Decision.COALESCED
        (o,) = c.pop_outcomes()
        assert (o.code, o.sequence, o.lane, o.queue_ns, o.compute_ns) == \
            (Code.EXPIRED, 1, -1, 500, 0)
        assert queue(c) == []


def test_duplicate_of_running_is_coalesced_even_when_late():
    with make() as c:
        sub(c, seq=1, deadline=T + 500, nfe=3)
        assert c.dispatch(0, T).sequence == 1
        assert sub(c, now=T + 600, seq=1, retry=1) == Decision.COALESCED
        assert codes(c) == []
        assert c.lanes_snapshot()[0].busy


# ---- §4 steps 3-4 -------------------------------------------------------------------------------


def test_older_generation_is_rejected_stale_and_echoed():
    with make() as c:
        assert sub(c, seq=1, gen=2) == Decision.ACCEPTED
        assert sub(c, seq=2, gen=1, deadline=T + 900, retry=2, reason=4) == \
            Decision.REJECTED_STALE
        (o,) = c.pop_outcomes()
        assert (o.code, o.sequence, o.generation, o.lane) == (Code.REJECTED_STALE, 2, 1, -1)
        assert (o.retry_count, o.retry_reason, o.deadline_ros_ns) == (2, 4, T + 917)
        assert (o.remaining_nfe, o.nfe_done, o.arrival_ns, o.finish_ns) == (1, 0, T, T)
        assert c.session_generation(b"s") == 2
        assert sub(c, seq=3, gen=2) == Decision.ACCEPTED  # equal generation is fresh


def test_deadline_already_passed_is_expired():
    with make() as c:
        assert sub(c, seq=1, deadline=T) == Decision.EXPIRED
        assert sub(c, seq=2, deadline=T - 1) == Decision.EXPIRED
        assert sub(c, seq=3, deadline=T + 1) == Decision.ACCEPTED
        assert [o.code for o in c.pop_outcomes()] == [Code.EXPIRED, Code.EXPIRED]


# ---- §4 step 5 / §6: retry and age gate ---------------------------------------------------------


def test_retry_gate_age_beats_slack():
    # slack = 500; age 500 >= 500 rejects a retry, age 499 does not.
    with make() as c:
        assert sub(c, seq=1, deadline=T + 500, retry=1, origin=T - 500) == \
            Decision.REJECTED_DEADLINE
        assert sub(c, seq=2, deadline=T + 500, retry=1, origin=T - 499) == Decision.ACCEPTED
        # A first attempt is not a retry under the default gate (RETRIES).
        assert sub(c, seq=3, deadline=T + 500, retry=0, origin=T - 5000) == Decision.ACCEPTED
        # No deadline: no slack to compare with.
        assert sub(c, seq=4, retry=3, origin=0) == Decision.ACCEPTED
        assert c.stats().rejected_late_retries == 1
        assert c.pop_outcomes()[0].code == Code.REJECTED_DEADLINE


def test_retry_threshold_and_age_gate_modes():
    with make(reject_if_retry_count_gte=2) as c:
        assert sub(c, seq=1, deadline=T + 10, retry=1, origin=0) == Decision.ACCEPTED
        assert sub(c, seq=2, deadline=T + 10, retry=2, origin=0) == Decision.REJECTED_DEADLINE
    with make(age_gate=AgeGate.ALL) as c:
        assert sub(c, seq=1, deadline=T + 10, origin=T - 10) == Decision.REJECTED_DEADLINE
    with make(age_gate=AgeGate.OFF) as c:
        assert sub(c, seq=1, deadline=T + 10, retry=5, origin=0) == Decision.ACCEPTED


def test_queue_age_gate_rejects_any_old_request():
    with make(reject_if_queue_age_ns_gte=1000) as c:
        assert sub(c, seq=1, origin=T - 1000) == Decision.REJECTED_DEADLINE  # no deadline, too
        assert sub(c, seq=2, origin=T - 999) == Decision.ACCEPTED
        assert sub(c, seq=3, origin=T + 50) == Decision.ACCEPTED  # origin in the future: age 0
        assert c.stats().rejected_late_retries == 1


# ---- §4 step 6 / §7: capacity ------------------------------------------------------------------


def test_full_queue_displaces_latest_deadline():
    with make(queue_capacity=2) as c:
        sub(c, sid=b"a", deadline=T + 5000)
        sub(c, sid=b"b", deadline=T + 9000)
        assert sub(c, sid=b"x", deadline=T + 7000) == Decision.ACCEPTED
        assert queue(c) == [(b"a", 0), (b"x", 0)]
        assert codes(c) == [(Code.REJECTED_CAPACITY, b"b", 0, -1)]
        assert c.stats().displaced == 1


def test_full_queue_rejects_what_cannot_displace():
    with make(queue_capacity=2) as c:
        sub(c, sid=b"a", deadline=T + 5000)
        sub(c, sid=b"b", deadline=T + 9000)
        assert sub(c, sid=b"x", deadline=T + 9000) == Decision.REJECTED_CAPACITY  # not earlier
        assert sub(c, sid=b"y") == Decision.REJECTED_CAPACITY                     # no deadline
        assert queue(c) == [(b"a", 0), (b"b", 0)]
        assert [o.session_id for o in c.pop_outcomes()] == [b"x", b"y"]
        assert c.stats().displaced == 0


def test_no_deadline_is_latest_and_ties_displace_latest_arrival():
    with make(queue_capacity=3) as c:
        sub(c, sid=b"a", deadline=T + 100)
        sub(c, sid=b"b")
        sub(c, sid=b"c")
        assert sub(c, sid=b"x", deadline=T + 1_000_000) == Decision.ACCEPTED
        assert codes(c) == [(Code.REJECTED_CAPACITY, b"c", 0, -1)]
    with make(queue_capacity=2) as c:
        sub(c, sid=b"a", deadline=T + 500)
        sub(c, sid=b"b", deadline=T + 500)
        assert sub(c, sid=b"x", deadline=T + 499) == Decision.ACCEPTED
        assert codes(c) == [(Code.REJECTED_CAPACITY, b"b", 0, -1)]


def test_capacity_is_counted_after_work_x_cancels():
    with make(queue_capacity=1) as c:
        sub(c, seq=1, gen=1, deadline=T + 100)
        assert sub(c, seq=2, gen=2, deadline=T + 900) == Decision.ACCEPTED
        assert queue(c) == [(b"s", 2)]
        assert codes(c) == [(Code.REJECTED_STALE, b"s", 1, -1)]
        assert c.stats().displaced == 0


# ---- §4: a request rejected at steps 3-7 changes nothing ----------------------------------------


def test_rejection_at_admission_changes_nothing():
    with make(workers=1, queue_capacity=2, nfe_ns=100) as c:
        sub(c, seq=1, gen=1, nfe=5)                            # runs 500 ns
        c.dispatch(0, T)
        sub(c, seq=2, gen=1)                                   # queued, no deadline
        sub(c, sid=b"o", deadline=T + 100_000)                 # fills the queue
        before = (queue(c), c.lanes_snapshot(), c.stats())
        # gen 2 would cancel seq 1 and 2; capacity would let it displace b"o"; but it cannot
        # finish in 50 ns (lane frees at T+100, one NFE -> T+200).
        assert sub(c, seq=3, gen=2, deadline=T + 150) == Decision.REJECTED_DEADLINE
        after = c.stats()
        assert (queue(c), c.lanes_snapshot()) == before[:2]
        assert c.session_generation(b"s") == 1
        assert not c.lanes_snapshot()[0].cancelled
        assert (after.displaced, after.outcomes[Code.REJECTED_STALE]) == (0, 0)
        assert codes(c) == [(Code.REJECTED_DEADLINE, b"s", 3, -1)]


def test_rejection_at_capacity_changes_nothing():
    with make(queue_capacity=1) as c:
        sub(c, sid=b"a", seq=1, gen=1, deadline=T + 100)
        c.dispatch(0, T)                                   # a runs
        sub(c, sid=b"b", seq=1, gen=1)                     # b queued: the queue is full
        assert sub(c, sid=b"a", seq=2, gen=5) == Decision.REJECTED_CAPACITY
        assert c.session_generation(b"a") == 1
        assert not c.lanes_snapshot()[0].cancelled


# ---- §4 step 8: accepting a newer generation ---------------------------------------------------


def test_newer_generation_prunes_queued_and_cancels_running():
    with make(workers=1) as c:
        sub(c, seq=1, gen=1, nfe=3)
        c.dispatch(0, T)
        sub(c, seq=2, gen=1)
        assert sub(c, now=T + 10, seq=3, gen=2) == Decision.ACCEPTED
        assert codes(c) == [(Code.REJECTED_STALE, b"s", 2, -1)]
        assert c.lanes_snapshot()[0].cancelled
        assert c.session_generation(b"s") == 2
        assert c.step(0, T + 100, 90) == Step.STOP_STALE
        (o,) = c.pop_outcomes()
        assert (o.code, o.sequence, o.lane, o.nfe_done, o.remaining_nfe) == \
            (Code.REJECTED_STALE, 1, 0, 1, 2)
        assert (o.queue_ns, o.compute_ns) == (0, 100)
        s = c.stats()
        assert (s.nfe_total, s.nfe_wasted, s.lanes_busy) == (1, 1, 0)


def test_cancelled_after_last_step_finishes_stale():
    with make(workers=1) as c:
        sub(c, seq=1, gen=1, nfe=1)
        c.dispatch(0, T)
        assert c.step(0, T + 10, 10) == Step.DONE
        sub(c, now=T + 11, seq=2, gen=2)
        assert c.finish(0, T + 12, np.ones(ACT, np.float32)) == Code.REJECTED_STALE
        assert [(o.code, o.actions) for o in c.pop_outcomes()] == [(Code.REJECTED_STALE, None)]


# ---- §5: calibrated admission ------------------------------------------------------------------


def test_admission_off_when_nfe_ns_is_zero():
    with make(nfe_ns=0, max_nfe=64) as c:
        assert sub(c, deadline=T + 1, nfe=64) == Decision.ACCEPTED
        assert not c.queue_snapshot()[0].tested


def test_admission_single_lane_prefix_sums():
    # W = 1, nfe 100, idle lane. EDF: A(d+300, 2 NFE) -> 200; B(d+600, 3) -> 500.
    with make(workers=1, nfe_ns=100) as c:
        assert sub(c, sid=b"a", deadline=T + 300, nfe=2) == Decision.ACCEPTED
        assert sub(c, sid=b"b", deadline=T + 600, nfe=3) == Decision.ACCEPTED
        # x(d+450, 1): A 200, x 300 <= 450, B 600 <= 600.
        assert sub(c, sid=b"x", deadline=T + 450, nfe=1) == Decision.ACCEPTED
        # y(d+450, 1) sorts after x (tie, later arrival): y 400 <= 450 but B 700 > 600.
        assert sub(c, sid=b"y", deadline=T + 450, nfe=1) == Decision.REJECTED_DEADLINE
        # z(d+2000) after B: A 200, x 300, B 600, z 700.
        assert sub(c, sid=b"z", deadline=T + 700, nfe=1) == Decision.ACCEPTED
        assert [q.tested for q in c.queue_snapshot()] == [True] * 4


def test_admission_two_lanes_hand_simulation():
    # nfe 100. Lane 0 runs 3 NFE (frees T+300), lane 1 idle (T).
    def setup(c):
        sub(c, sid=b"r", nfe=3)
        c.dispatch(0, T)
        assert sub(c, sid=b"a", deadline=T + 250, nfe=2) == Decision.ACCEPTED  # L1 -> 200
        assert sub(c, sid=b"b", deadline=T + 600, nfe=3) == Decision.ACCEPTED  # L1 200 -> 500

    with make(workers=2, nfe_ns=100) as c:
        setup(c)
        # x(d+400, 1): A on L1 -> 200; x on L1 (200 < 300) -> 300; B on L0 (300, lower index on a
        # tie) -> 600 <= 600.
        assert sub(c, sid=b"x", deadline=T + 400, nfe=1) == Decision.ACCEPTED
    with make(workers=2, nfe_ns=100) as c:
        setup(c)
        # Same, but x needs 2 NFE: x on L1 -> 400 <= 400; B on L0 -> 600 <= 600: accepted.
        assert sub(c, sid=b"x", deadline=T + 400, nfe=2) == Decision.ACCEPTED
        # y(d+400, 1) after x: A L1 200, x L1 400, y L0 400 <= 400, B L1 (400) -> 700 > 600.
        assert sub(c, sid=b"y", deadline=T + 400, nfe=1) == Decision.REJECTED_DEADLINE


def test_admission_cancelled_running_work_counts_one_nfe():
    with make(workers=1, nfe_ns=100) as c:
        sub(c, sid=b"s", gen=1, nfe=10)             # frees at T + 1000 unless cancelled
        c.dispatch(0, T)
        assert sub(c, sid=b"o", deadline=T + 250) == Decision.REJECTED_DEADLINE  # 1100 > 250
        # gen 2 cancels the running work: the lane frees after the step in flight, T + 100.
        assert sub(c, sid=b"s", seq=1, gen=2, deadline=T + 200) == Decision.ACCEPTED
        # Already-cancelled running work also counts one NFE for later requests.
        assert sub(c, sid=b"p", deadline=T + 300) == Decision.ACCEPTED   # 100 + 100 + 100


def test_admission_excludes_many_cancelled_queued_requests():
    # 12 queued requests of s (more than the core's 8-entry fast path), 1 NFE each, due at
    # T+1300: they end at 100..1200. x (6 NFE, due T+1350) sorts after them.
    with make(workers=1, nfe_ns=100, queue_capacity=16) as c:
        for i in range(12):
            assert sub(c, seq=i, gen=1, deadline=T + 1300) == Decision.ACCEPTED
        # Same generation: x waits for all 12 and ends at 1800 > 1350.
        assert sub(c, seq=98, gen=1, deadline=T + 1350, nfe=6) == Decision.REJECTED_DEADLINE
        # Generation 2 cancels all 12: x alone ends at 600.
        assert sub(c, seq=99, gen=2, deadline=T + 1350, nfe=6) == Decision.ACCEPTED
        assert queue(c) == [(b"s", 99)]
        outs = c.pop_outcomes()
        assert [o.sequence for o in outs] == [98] + list(range(12))   # pruned in EDF order
        assert {o.code for o in outs[1:]} == {Code.REJECTED_STALE}


def test_admission_no_deadline_sorts_last_and_is_never_tested():
    with make(workers=1, nfe_ns=100) as c:
        sub(c, sid=b"r", nfe=50)
        c.dispatch(0, T)                                                 # frees at T + 5000
        assert sub(c, sid=b"n", nfe=64 - 14) == Decision.ACCEPTED        # hopeless, untested
        assert sub(c, sid=b"d", deadline=T + 5100) == Decision.ACCEPTED  # n is behind it
        assert [(q.session_id, q.tested) for q in c.queue_snapshot()] == \
            [(b"d", True), (b"n", False)]


def test_no_alive_lane_answers_everything():
    with make(workers=2, nfe_ns=100) as c:
        sub(c, seq=1, deadline=T + 10**9)
        sub(c, seq=2)
        c.dispatch(0, T)
        c.disable_lane(0, T)                       # seq 1 EXPIRED; seq 2 still queued for lane 1
        assert codes(c) == [(Code.EXPIRED, b"s", 1, 0)]
        c.disable_lane(1, T + 5)                   # the last lane: the queue is drained
        assert codes(c) == [(Code.REJECTED_CAPACITY, b"s", 2, 1)]
        assert c.stats().queue_depth == 0
        # Nothing can run any more: the lane simulation rejects a judged request...
        assert sub(c, seq=3, deadline=T + 10**9) == Decision.REJECTED_DEADLINE
        # ...and everything else has no capacity (instead of waiting forever in the queue).
        assert sub(c, seq=4) == Decision.REJECTED_CAPACITY
        c.set_calibration(0, 0)
        assert sub(c, seq=5, deadline=T + 10**9) == Decision.REJECTED_CAPACITY
        assert [o.sequence for o in c.pop_outcomes()] == [3, 4, 5]


def test_after_shutdown_the_last_lane_expires_what_is_queued():
    """The relay stopping (shutdown, then each lane disabled once its worker has exited) answers
    admitted work it will not finish EXPIRED, queued or running, and counts no calibration miss;
    without shutdown (dead workers) the queue is REJECTED_CAPACITY, as above."""
    with make(workers=2, nfe_ns=100) as c:
        sub(c, seq=1, deadline=T + 10**9)
        sub(c, seq=2, deadline=T + 10**9)
        sub(c, seq=3)
        c.dispatch(0, T)
        c.shutdown()
        c.disable_lane(0, T)                       # seq 1, running: EXPIRED
        c.disable_lane(1, T + 5)                   # the last lane: seq 2 and 3, queued: EXPIRED
        assert sorted((o.code, o.sequence) for o in c.pop_outcomes()) == \
            [(Code.EXPIRED, 1), (Code.EXPIRED, 2), (Code.EXPIRED, 3)]
        assert c.stats().queue_depth == 0 and c.stats().calibration_misses == 0


def test_admission_reserve():
    with make(workers=1, nfe_ns=100, admission_reserve_ns=1) as c:
        assert sub(c, seq=1, deadline=T + 100) == Decision.REJECTED_DEADLINE  # 100 + 1 > 100
        assert sub(c, seq=2, deadline=T + 101) == Decision.ACCEPTED


def test_admission_does_not_judge_requests_ahead_of_x():
    with make(workers=1, nfe_ns=100) as c:
        sub(c, sid=b"a", deadline=T + 300, nfe=2)
        c.set_calibration(200, 0)   # a now looks late (400 > 300): x does not make it later
        assert sub(c, sid=b"x", deadline=T + 1000) == Decision.ACCEPTED   # a 400, x 600
        assert sub(c, sid=b"y", deadline=T + 250) == Decision.REJECTED_DEADLINE  # y 200, a 600


def test_admission_saturates_near_uint64_max():
    now = U64 - 1000
    with make(workers=1, nfe_ns=100, max_nfe=64) as c:
        # 9 NFE end at U64 - 100 <= U64 - 1.
        assert sub(c, now=now, seq=1, deadline=U64 - 1, nfe=9) == Decision.ACCEPTED
        # Behind it, 1 more NFE ends exactly at U64: the saturated value, meets nothing.
        assert sub(c, now=now, seq=2, deadline=U64, nfe=1) == Decision.REJECTED_DEADLINE
        # 20 NFE overflow: saturated, rejected instead of wrapping to a small time.
        assert sub(c, now=now, seq=3, deadline=U64 - 1, nfe=20) == Decision.REJECTED_DEADLINE


def test_admission_remaining_times_nfe_overflow():
    with make(workers=1, nfe_ns=2**63, max_nfe=64) as c:
        assert sub(c, seq=1, deadline=U64 - 1, nfe=2) == Decision.REJECTED_DEADLINE  # 2 * 2^63
        assert sub(c, seq=2, deadline=U64 - 1, nfe=1) == Decision.ACCEPTED           # T + 2^63
    with make(workers=1, nfe_ns=100, max_nfe=64) as c:
        sub(c, seq=1, nfe=64)
        c.dispatch(0, T)
        c.set_calibration(2**60, 0)  # the running lane: 64 * 2^60 overflows -> never frees
        assert sub(c, seq=2, deadline=U64 - 1) == Decision.REJECTED_DEADLINE


# ---- dispatch -----------------------------------------------------------------------------------


def test_dispatch_is_edf_with_ties_by_arrival():
    with make(queue_capacity=8) as c:
        for sid, d in [(b"a", 500), (b"b", 300), (b"c", 500), (b"d", 0), (b"e", 300)]:
            sub(c, sid=sid, deadline=T + d if d else 0)
        got = []
        for _ in range(5):
            got.append(c.dispatch(0, T).session_id)
            c.step(0, T, 1)
            c.finish(0, T, np.zeros(ACT, np.float32))
        assert got == [b"b", b"e", b"a", b"c", b"d"]
        assert c.dispatch(0, T) is None


def test_dispatch_expires_work_that_can_no_longer_finish():
    with make(workers=1, nfe_ns=100) as c:
        assert sub(c, sid=b"a", deadline=T + 500, nfe=3) == Decision.ACCEPTED
        assert sub(c, sid=b"b", deadline=T + 900, nfe=1) == Decision.ACCEPTED
        # At T+201: a would end at T+501 > T+500 -> EXPIRED (a calibration miss); b runs.
        w = c.dispatch(0, T + 201)
        assert w.session_id == b"b"
        (o,) = c.pop_outcomes()
        assert (o.code, o.session_id, o.lane, o.queue_ns, o.nfe_done) == \
            (Code.EXPIRED, b"a", 0, 201, 0)
        assert c.stats().calibration_misses == 1
    with make(workers=1, nfe_ns=0) as c:
        sub(c, sid=b"a", deadline=T + 500, nfe=3)
        sub(c, sid=b"b", deadline=T + 501, nfe=3)
        assert c.dispatch(0, T + 500).session_id == b"b"   # a: now >= deadline; b: not yet
        assert codes(c) == [(Code.EXPIRED, b"a", 0, 0)]
        assert c.stats().calibration_misses == 0           # never tested: not a miss


def test_queue_timeout_rejects_at_dispatch():
    with make(queue_timeout_ns=1000) as c:
        sub(c, sid=b"a")
        sub(c, now=T + 1, sid=b"b")
        assert c.dispatch(0, T + 1001).session_id == b"b"  # a waited 1001 > 1000; b 1000
        assert codes(c) == [(Code.REJECTED_DEADLINE, b"a", 0, 0)]
        assert c.stats().calibration_misses == 0


def test_observation_is_copied_at_submit():
    with make() as c:
        obs = np.array([1.5, -2.0], np.float32)
        c.submit(req(obs=obs), T)
        obs[:] = 99
        assert c.dispatch(0, T).observation.tolist() == [1.5, -2.0]


# ---- step / finish ------------------------------------------------------------------------------


def test_steps_then_finish_emits_inference():
    with make(workers=1) as c:
        sub(c, seq=7, deadline=T + 1000, nfe=2, retry=1, reason=1)
        w = c.dispatch(0, T + 100)
        assert (w.sequence, w.remaining_nfe, w.deadline_ns, w.noise_seed) == (7, 2, T + 1000, 7)
        assert c.step(0, T + 300, 200) == Step.CONTINUE
        assert c.lanes_snapshot()[0].remaining_nfe == 1
        assert c.step(0, T + 500, 190) == Step.DONE
        assert c.output_space(0)
        assert c.finish(0, T + 1000, np.array([0.25, 4.0], np.float32)) == Code.INFERENCE
        (o,) = c.pop_outcomes()
        assert (o.code, o.sequence, o.lane, o.nfe_done, o.remaining_nfe) == \
            (Code.INFERENCE, 7, 0, 2, 0)
        assert (o.queue_ns, o.compute_ns, o.arrival_ns, o.finish_ns) == (100, 900, T, T + 1000)
        assert (o.retry_count, o.retry_reason, o.deadline_ros_ns) == (1, 1, T + 1017)
        assert o.actions.tolist() == [0.25, 4.0]
        s = c.stats()
        assert (s.nfe_total, s.nfe_wasted, s.busy_ns, s.outcomes[0]) == (2, 0, 390, 1)


def test_step_stops_expired_work_between_steps():
    with make(workers=1, nfe_ns=100) as c:
        sub(c, deadline=T + 300, nfe=3)                    # tested: fits exactly
        c.dispatch(0, T)
        assert c.step(0, T + 299, 150) == Step.CONTINUE
        assert c.step(0, T + 300, 150) == Step.STOP_EXPIRED  # now >= deadline, 1 step left
        (o,) = c.pop_outcomes()
        assert (o.code, o.nfe_done, o.remaining_nfe, o.lane) == (Code.EXPIRED, 2, 1, 0)
        s = c.stats()
        assert (s.nfe_wasted, s.calibration_misses, s.lanes_busy) == (2, 1, 0)


def test_finish_after_deadline_is_expired_without_actions():
    with make(workers=1) as c:
        sub(c, seq=1, deadline=T + 100)
        c.dispatch(0, T)
        c.step(0, T + 100, 100)
        assert c.finish(0, T + 100, np.ones(ACT, np.float32)) == Code.INFERENCE  # on time
        sub(c, now=T + 100, seq=2, deadline=T + 200)
        c.dispatch(0, T + 100)
        c.step(0, T + 150, 50)
        assert c.finish(0, T + 201, np.ones(ACT, np.float32)) == Code.EXPIRED
        assert [(o.code, o.actions is None) for o in c.pop_outcomes()] == \
            [(Code.INFERENCE, False), (Code.EXPIRED, True)]
        assert c.stats().nfe_wasted == 1
        assert c.stats().calibration_misses == 0   # admission off: never promised


def test_failed_work_is_answered_inference_failed_without_actions():
    """A model call that raised or actions that are not finite: INFERENCE_FAILED, no actions,
    counted per cause, the NFE spent wasted, no calibration miss; at any point of the work."""
    with make(workers=1, nfe_ns=100) as c:
        sub(c, seq=1, deadline=T + 1000, nfe=2)
        c.dispatch(0, T)
        assert c.step(0, T + 100, 100) == Step.CONTINUE
        assert c.fail(0, T + 150, FailCause.RUNTIME_ERROR) == Code.INFERENCE_FAILED  # mid-steps
        sub(c, now=T + 200, seq=2, deadline=T + 1000, nfe=1)
        c.dispatch(0, T + 200)
        assert c.step(0, T + 300, 100) == Step.DONE
        assert c.fail(0, T + 300, FailCause.NON_FINITE) == Code.INFERENCE_FAILED  # at finish
        with pytest.raises(InvalidState):
            c.fail(0, T + 300, FailCause.NON_FINITE)  # the lane holds nothing now
        with pytest.raises(InvalidArgument):
            c.fail(0, T + 300, 2)  # no such cause
        got = [(o.code, o.sequence, o.actions, o.frozen_rows, o.nfe_done)
               for o in c.pop_outcomes()]
        assert got == [(Code.INFERENCE_FAILED, 1, None, 0, 1),
                       (Code.INFERENCE_FAILED, 2, None, 0, 1)]
        s = c.stats()
        assert (s.outcomes[Code.INFERENCE_FAILED], s.failed, s.nfe_wasted,
                s.calibration_misses, s.lanes_busy) == (2, [1, 1], 2, 0, 0)


def test_calls_out_of_lane_state_raise():
    with make(workers=1) as c:
        with pytest.raises(InvalidState):
            c.step(0, T, 1)                               # idle lane
        with pytest.raises(InvalidState):
            c.finish(0, T, np.zeros(ACT, np.float32))     # idle lane
        sub(c, nfe=2)
        c.dispatch(0, T)
        with pytest.raises(InvalidState):
            c.dispatch(0, T)                              # busy lane
        with pytest.raises(InvalidState):
            c.finish(0, T, np.zeros(ACT, np.float32))     # not DONE
        run_to_done(c, 0, T)
        with pytest.raises(InvalidState):
            c.step(0, T, 1)                               # DONE: finish, not step
        with pytest.raises(InvalidArgument):
            c.step(1, T, 1)                               # no such lane


# ---- §8: rings and drops -----------------------------------------------------------------------


def test_full_rings_drop_and_count():
    with make(workers=1, ring_capacity=1) as c:
        assert sub(c, seq=1, deadline=T) == Decision.EXPIRED       # ring 0: 1/1
        assert sub(c, seq=2, deadline=T) == Decision.EXPIRED       # dropped
        s = c.stats()
        assert (s.outcomes[Code.EXPIRED], s.rejection_outputs_dropped) == (2, 1)
        # Ring 1: an EXPIRED at dispatch fills it, then the INFERENCE has no room.
        sub(c, seq=3, deadline=T + 10)
        sub(c, seq=4, deadline=T + 100)
        assert c.dispatch(0, T + 10).sequence == 4
        assert not c.output_space(0)
        c.step(0, T + 20, 10)
        assert c.finish(0, T + 20, np.ones(ACT, np.float32)) == Code.INFERENCE
        s = c.stats()
        assert (s.outcomes[Code.INFERENCE], s.action_outputs_dropped) == (1, 1)
        assert [o.sequence for o in c.pop_outcomes()] == [1, 3]
        assert c.output_space(0)


def test_pop_outcomes_round_robin_over_rings():
    with make(workers=1) as c:
        sub(c, seq=1, deadline=T)                   # ring 0
        sub(c, seq=2, deadline=T)                   # ring 0
        sub(c, seq=3, deadline=T + 5)
        sub(c, seq=4)
        c.dispatch(0, T + 5)                        # seq 3 EXPIRED into ring 1
        assert [o.sequence for o in c.pop_outcomes(2)] == [1, 3]
        assert [o.sequence for o in c.pop_outcomes()] == [2]


def test_wait_outputs_wakes_on_commit_from_another_thread():
    with make() as c:
        woke = []

        def publisher():
            t0 = time.monotonic()
            c.wait_outputs(5_000_000_000)
            woke.append((time.monotonic() - t0, c.pop_outcomes()))

        th = threading.Thread(target=publisher)
        th.start()
        time.sleep(0.05)
        sub(c, deadline=T)                          # EXPIRED into ring 0 rings the doorbell
        th.join(5)
        assert woke and woke[0][0] < 2.0 and woke[0][1][0].code == Code.EXPIRED


def test_wait_for_work_wakes_on_submit_and_shutdown():
    with make(workers=2) as c:
        assert c.wait_for_work(0, 1_000_000) is False      # empty: times out after 1 ms
        results = []

        def worker(lane):
            results.append((lane, c.wait_for_work(lane, 5_000_000_000)))

        th = threading.Thread(target=worker, args=(0,))
        th.start()
        time.sleep(0.05)
        sub(c)
        th.join(5)
        assert results == [(0, True)]
        c.dispatch(0, T)
        waiters = [threading.Thread(target=worker, args=(1,)),
                   threading.Thread(target=lambda: results.append(c.wait_outputs(5 * 10**9)))]
        t0 = time.monotonic()
        for th in waiters:
            th.start()
        time.sleep(0.05)
        c.shutdown()
        for th in waiters:
            th.join(5)
        assert time.monotonic() - t0 < 2.0
        assert (1, False) in results


# ---- sessions ----------------------------------------------------------------------------------


def finish_all(c: Core, now: int) -> None:
    while (w := c.dispatch(0, now)) is not None:
        run_to_done(c, w.lane, now)
        c.finish(0, now, np.zeros(ACT, np.float32))


def test_full_session_table_evicts_least_recently_accepted_idle_session():
    with make(max_sessions=2) as c:
        sub(c, now=T, sid=b"a", gen=5)
        sub(c, now=T + 1, sid=b"b", gen=5)
        sub(c, now=T + 2, sid=b"a", seq=1, gen=5)   # a accepted again: b is now the LRU
        finish_all(c, T + 3)
        assert sub(c, now=T + 4, sid=b"c") == Decision.ACCEPTED
        assert c.session_generation(b"b") is None
        assert c.session_generation(b"a") == 5
        s = c.stats()
        assert (s.sessions, s.sessions_evicted) == (2, 1)
        # Eviction forgets the watermark: b's old generation 0 is no longer stale.
        finish_all(c, T + 5)
        assert sub(c, now=T + 6, sid=b"b", gen=0) == Decision.ACCEPTED


def test_full_session_table_with_no_idle_session_rejects_capacity():
    with make(max_sessions=2, workers=1) as c:
        sub(c, sid=b"a")
        sub(c, sid=b"b")
        c.dispatch(0, T)                                      # a running, b queued
        assert sub(c, sid=b"c") == Decision.REJECTED_CAPACITY
        assert c.stats().sessions_evicted == 0
        assert sub(c, sid=b"a", seq=1) == Decision.ACCEPTED   # known sessions still work


def test_early_evictions_are_counted_against_session_idle_ns():
    with make(max_sessions=1, session_idle_ns=1000) as c:
        sub(c, now=T, sid=b"a")
        finish_all(c, T)
        sub(c, now=T + 999, sid=b"b")                         # a seen 999 ago: early
        finish_all(c, T + 999)
        sub(c, now=T + 1999, sid=b"c")                        # b seen 1000 ago: not early
        s = c.stats()
        assert (s.sessions_evicted, s.sessions_evicted_early) == (2, 1)


# ---- lanes, counters, validation ---------------------------------------------------------------


def test_disable_lane_expires_in_flight_work():
    with make(workers=2, nfe_ns=100) as c:
        sub(c, deadline=T + 1000, nfe=3)
        c.dispatch(1, T)
        c.step(1, T + 100, 100)
        c.disable_lane(1, T + 150)
        c.disable_lane(1, T + 150)                            # idempotent
        (o,) = c.pop_outcomes()
        assert (o.code, o.lane, o.nfe_done, o.remaining_nfe) == (Code.EXPIRED, 1, 1, 2)
        s = c.stats()
        assert (s.lanes_alive, s.lanes_busy, s.calibration_misses, s.nfe_wasted) == (1, 0, 0, 1)
        with pytest.raises(InvalidState):
            c.dispatch(1, T)


def test_retry_counters_by_count_and_reason():
    with make() as c:
        sub(c, seq=1, retry=0, reason=0)
        sub(c, seq=2, retry=1, reason=1)
        sub(c, seq=3, retry=3, reason=4)
        sub(c, seq=3, retry=9, reason=4)                      # coalesced: still counted
        s = c.stats()
        assert s.retries_by_count == [0, 1, 0, 1, 0, 0, 0, 1]
        assert s.retries_by_reason == [0, 1, 0, 0, 2, 0]
        assert (s.submitted, s.accepted, s.coalesced) == (4, 3, 1)


def test_gauges():
    with make(workers=2) as c:
        sub(c, now=T + 5, seq=1)
        sub(c, now=T + 7, seq=2)
        sub(c, now=T + 9, seq=3)
        c.dispatch(0, T + 10)
        s = c.stats()
        assert (s.queue_depth, s.sessions, s.lanes_busy, s.lanes_alive) == (2, 1, 1, 2)
        assert s.oldest_queued_arrival_ns == T + 7


def test_invalid_input_raises_and_is_not_counted():
    with make(max_nfe=4) as c:
        for bad in [dict(nfe=0), dict(nfe=5), dict(sid=b"x" * 65), dict(reason=6)]:
            with pytest.raises(InvalidArgument):
                sub(c, **bad)
        with pytest.raises(InvalidArgument):
            c.submit(req(obs=np.zeros(OBS + 1, np.float32)), T)
        assert sub(c, sid=b"x" * 64, nfe=4) == Decision.ACCEPTED
        assert c.stats().submitted == 1
    for bad in [dict(workers=0), dict(queue_capacity=0), dict(max_sessions=0),
                dict(ring_capacity=0), dict(workers=65), dict(max_nfe=0)]:
        with pytest.raises(InvalidArgument):
            make(**bad)


def test_every_c_entry_point_refuses_bad_arguments_alike():
    """Each int-returning call answers FER_EINVAL for a NULL core / ring / output or a bad lane,
    instead of crashing (shutdown and get_config once dereferenced NULL)."""
    from flowedge_relay._fer_core import ffi, lib

    null = ffi.NULL
    with make(workers=2) as c:
        core = c.ptr
        cfg = ffi.new("struct fer_config *")
        calls = {
            "shutdown": lambda: lib.fer_core_shutdown(null),
            "get_config(NULL core)": lambda: lib.fer_core_get_config(null, cfg),
            "get_config(NULL out)": lambda: lib.fer_core_get_config(core, null),
            "submit": lambda: lib.fer_core_submit(null, null, T),
            "wait_for_work(bad lane)": lambda: lib.fer_core_wait_for_work(core, 2, 0),
            "dispatch(bad lane)": lambda: lib.fer_core_dispatch(core, 2, T, null),
            "step(bad lane)": lambda: lib.fer_core_step(core, 2, T, 1),
            "output_space(bad lane)": lambda: lib.fer_core_output_space(core, 2),
            "finish(bad lane)": lambda: lib.fer_core_finish(core, 2, T, null),
            "disable_lane(bad lane)": lambda: lib.fer_core_disable_lane(core, 2, T),
            "wait_outputs": lambda: lib.fer_core_wait_outputs(null, 0),
            "pop_outcomes": lambda: lib.fer_core_pop_outcomes(core, null, null, 1),
            "set_calibration": lambda: lib.fer_core_set_calibration(null, 1, 0, 0),
            "staging_slot": lambda: lib.fer_core_staging_slot(null),
            "prefix_done(bad lane)": lambda: lib.fer_core_prefix_done(core, 2, T, 1),
            "set_policy(age_gate)": lambda: lib.fer_core_set_policy(core, 1, 3, 0, 0),
            "stats": lambda: lib.fer_core_stats(core, null),
            "queue_snapshot": lambda: lib.fer_core_queue_snapshot(core, null, 1),
            "lanes_snapshot": lambda: lib.fer_core_lanes_snapshot(core, null, 1),
            "session_generation": lambda: lib.fer_core_session_generation(core, null, 1, null),
            "ring_create": lambda: lib.fer_ring_create(4, 0, null),
            "ring_push": lambda: lib.fer_ring_push(null, null, null),
            "ring_pop": lambda: lib.fer_ring_pop(null, null, null),
            "ring_wait": lambda: lib.fer_ring_wait(null, 0),
        }
        results = {name: call() for name, call in calls.items()}
        assert results == dict.fromkeys(calls, lib.FER_EINVAL)
        # None of them touched the core: it still works, and shutdown through the wrapper is OK.
        assert sub(c) == Decision.ACCEPTED
        c.shutdown()
        assert not c.wait_for_work(0, 10**9)


def test_ring_capacity_is_rounded_to_a_power_of_two():
    with make(ring_capacity=3) as c:
        for i in range(6):
            sub(c, seq=i, deadline=T)
        assert c.stats().rejection_outputs_dropped == 2   # 4 fit


def test_close_is_idempotent_and_closed_core_refuses_calls():
    c = make()
    c.close()
    c.close()
    with pytest.raises(InvalidState):
        sub(c)


def test_vocabulary_matches_header_and_messages():
    """One vocabulary: Code <-> FER_* <-> ActionMessage, retry reasons <-> InferenceRequest."""
    from flowedge_relay._fer_core import lib
    from flowedge_relay_msgs.msg import ActionMessage, InferenceRequest

    from flowedge_relay.core import RETRY_COUNT_BUCKETS, RETRY_REASON_MAX, Code, Decision

    assert [c.name for c in Code] == [
        "INFERENCE", "REJECTED_STALE", "REJECTED_DEADLINE", "REJECTED_CAPACITY", "EXPIRED",
        "INFERENCE_FAILED",
    ]
    assert len(Code) == lib.FER_NUM_CODES
    for code in Code:
        assert code.value == getattr(lib, f"FER_{code.name}") == getattr(ActionMessage, code.name)
        if code not in (Code.INFERENCE, Code.INFERENCE_FAILED):  # submit decides neither: a
            # decision is ACCEPTED (0) or the outcome itself
            assert Decision[code.name].value == code.value
        assert code.key == code.name.lower()
    reasons = [name for name in dir(InferenceRequest) if name.startswith("RETRY_")
               and name.isupper()]
    assert max(getattr(InferenceRequest, n) for n in reasons) == RETRY_REASON_MAX
    assert RETRY_REASON_MAX == InferenceRequest.RETRY_AFTER_EXPIRED
    assert RETRY_COUNT_BUCKETS == 8  # retry_count buckets 0..7+, diagnostics keys count_1..7+
    assert Decision.COALESCED not in set(Code)  # a decision apart from every outcome code


# ---- §5, §10: two-phase models (prefix_ns) ------------------------------------------------------


def test_prefix_is_paid_once_per_request_in_admission():
    # W = 1, nfe 100, prefix 50: a request of n NFE costs 50 + 100 n while its prefix is pending.
    with make(workers=1, nfe_ns=100, two_phase=1, prefix_ns=50) as c:
        assert sub(c, sid=b"a", deadline=T + 150, nfe=1) == Decision.ACCEPTED     # 150
        assert sub(c, sid=b"b", deadline=T + 299, nfe=1) == Decision.REJECTED_DEADLINE  # 300
        assert sub(c, sid=b"b", deadline=T + 300, nfe=1) == Decision.ACCEPTED
        assert sub(c, sid=b"c", deadline=T + 550, nfe=2) == Decision.ACCEPTED     # 300 + 250
    # The same prefix_ns on a single-graph model is ignored: today's arithmetic.
    with make(workers=1, nfe_ns=100, two_phase=0, prefix_ns=50) as c:
        assert sub(c, sid=b"a", deadline=T + 100, nfe=1) == Decision.ACCEPTED
        assert sub(c, sid=b"b", deadline=T + 200, nfe=1) == Decision.ACCEPTED


@pytest.mark.parametrize("two_phase, prefix_ns", [(1, 0), (0, 0), (0, 10**6)])
def test_without_a_prefix_cost_decisions_are_unchanged(two_phase, prefix_ns):
    # test_admission_single_lane_prefix_sums, verbatim, with a zero or ignored prefix.
    with make(workers=1, nfe_ns=100, two_phase=two_phase, prefix_ns=prefix_ns) as c:
        assert sub(c, sid=b"a", deadline=T + 300, nfe=2) == Decision.ACCEPTED
        assert sub(c, sid=b"b", deadline=T + 600, nfe=3) == Decision.ACCEPTED
        assert sub(c, sid=b"x", deadline=T + 450, nfe=1) == Decision.ACCEPTED
        assert sub(c, sid=b"y", deadline=T + 450, nfe=1) == Decision.REJECTED_DEADLINE
        assert sub(c, sid=b"z", deadline=T + 700, nfe=1) == Decision.ACCEPTED


def test_lane_start_counts_the_pending_prefix_until_it_is_reported():
    # nfe 100, prefix 500. r (2 NFE) runs on the only lane from T.
    def running(c, gen=0):
        assert sub(c, sid=b"r", gen=gen, nfe=2) == Decision.ACCEPTED
        assert c.dispatch(0, T) is not None
        assert c.lanes_snapshot()[0].prefix_pending

    with make(workers=1, nfe_ns=100, two_phase=1, prefix_ns=500) as c:
        running(c)
        # Prefix pending: the lane frees at T + 500 + 200; x (1 NFE) pays its own 600 after it.
        assert sub(c, sid=b"x", deadline=T + 1299) == Decision.REJECTED_DEADLINE
        assert sub(c, sid=b"x", deadline=T + 1300) == Decision.ACCEPTED
    with make(workers=1, nfe_ns=100, two_phase=1, prefix_ns=500) as c:
        running(c)
        # Reported at T + 400: now only the 2 NFE remain, from T + 400: free at T + 600.
        assert c.prefix_done(0, T + 400, 400) == Step.CONTINUE
        assert not c.lanes_snapshot()[0].prefix_pending
        assert sub(c, sid=b"x", deadline=T + 1199, now=T + 400) == Decision.REJECTED_DEADLINE
        assert sub(c, sid=b"x", deadline=T + 1200, now=T + 400) == Decision.ACCEPTED
    with make(workers=1, nfe_ns=100, two_phase=1, prefix_ns=500) as c:
        running(c, gen=1)
        # gen 2 cancels r while its prefix runs: the unit in flight is the prefix (T + 500),
        # after which prefix_done stops it; x itself then pays 500 + 100.
        assert sub(c, sid=b"r", seq=1, gen=2, deadline=T + 1099) == \
            Decision.REJECTED_DEADLINE
        assert sub(c, sid=b"r", seq=1, gen=2, deadline=T + 1100) == Decision.ACCEPTED
        assert c.lanes_snapshot()[0].cancelled
    with make(workers=1, nfe_ns=100, two_phase=1, prefix_ns=500) as c:
        running(c, gen=1)
        assert c.prefix_done(0, T, 0) == Step.CONTINUE
        # Cancelled during an NFE: the unit in flight is one NFE (T + 100).
        assert sub(c, sid=b"r", seq=1, gen=2, deadline=T + 700) == Decision.ACCEPTED


def test_dispatch_expiry_counts_the_pending_prefix():
    for at, expired in [(T + 150, False), (T + 151, True)]:
        with make(workers=1, nfe_ns=100, two_phase=1, prefix_ns=50) as c:
            assert sub(c, sid=b"a", deadline=T + 500, nfe=3) == Decision.ACCEPTED  # 350
            w = c.dispatch(0, at)
            assert (w is None) == expired
            if expired:
                assert codes(c) == [(Code.EXPIRED, b"a", 0, 0)]
                assert c.stats().calibration_misses == 1


def test_prefix_done_stops_stale_and_expired_work_before_its_first_nfe():
    cfg = dict(workers=1, nfe_ns=100, two_phase=1, prefix_ns=50)
    with make(**cfg) as c:   # stale: a newer generation arrived while the prefix ran
        sub(c, sid=b"s", gen=1, nfe=3)
        c.dispatch(0, T)
        assert sub(c, sid=b"s", seq=1, gen=2) == Decision.ACCEPTED
        assert c.prefix_done(0, T + 40, 40) == Step.STOP_STALE
        (o,) = c.pop_outcomes()
        assert (o.code, o.sequence, o.nfe_done, o.remaining_nfe, o.compute_ns) == \
            (Code.REJECTED_STALE, 0, 0, 3, 40)
        assert c.dispatch(0, T + 40).sequence == 1          # the lane is free again
    with make(**cfg) as c:   # expired: the prefix took longer than calibrated
        assert sub(c, deadline=T + 150) == Decision.ACCEPTED  # tested: 50 + 100
        c.dispatch(0, T)
        assert c.prefix_done(0, T + 150, 150) == Step.STOP_EXPIRED
        assert codes(c) == [(Code.EXPIRED, b"s", 0, 0)]
        s = c.stats()
        assert (s.calibration_misses, s.lanes_busy, s.nfe_total, s.busy_ns) == (1, 0, 0, 150)
    with make(**cfg) as c:   # on time: CONTINUE, then the NFEs as usual
        assert sub(c, deadline=T + 250, nfe=2) == Decision.ACCEPTED
        c.dispatch(0, T)
        assert c.prefix_done(0, T + 49, 49) == Step.CONTINUE
        assert c.step(0, T + 149, 100) == Step.CONTINUE
        assert c.step(0, T + 249, 100) == Step.DONE
        assert c.finish(0, T + 249, np.ones(ACT, np.float32)) == Code.INFERENCE
        assert c.stats().busy_ns == 249


def test_prefix_calls_out_of_order_raise():
    with make(two_phase=1) as c:
        with pytest.raises(InvalidState):
            c.prefix_done(0, T, 1)              # idle lane
        sub(c, nfe=1)
        c.dispatch(0, T)
        with pytest.raises(InvalidState):
            c.step(0, T, 1)                     # the prefix comes first
        assert c.prefix_done(0, T, 1) == Step.CONTINUE
        with pytest.raises(InvalidState):
            c.prefix_done(0, T, 1)              # reported once
        assert c.step(0, T, 1) == Step.DONE
    with make(two_phase=0) as c:                # single-graph: no prefix to report
        sub(c)
        c.dispatch(0, T)
        with pytest.raises(InvalidState):
            c.prefix_done(0, T, 1)
        assert c.step(0, T, 1) == Step.DONE
    with pytest.raises(InvalidArgument):
        make(two_phase=2)


def test_set_calibration_changes_prefix_ns_live():
    with make(workers=1, nfe_ns=100, two_phase=1, prefix_ns=0) as c:
        assert sub(c, sid=b"a", deadline=T + 100) == Decision.ACCEPTED
        c.set_calibration(100, 0, 50)
        assert sub(c, sid=b"b", deadline=T + 250) == Decision.REJECTED_DEADLINE  # 150 + 150
        assert sub(c, sid=b"b", deadline=T + 300) == Decision.ACCEPTED
        c.set_calibration(100, 0)               # prefix_ns defaults to 0
        k = c.cost_stats(T)
        assert (k.prefix_configured_ns, k.prefix_in_use_ns) == (0, 0)


# ---- staging slot and per-request payloads ----------------------------------------------


def payload_of(sid: bytes, seq: int, n: int) -> np.ndarray:
    return np.frombuffer((b"%s:%d|" % (sid, seq)) * n, np.uint8)[:n]


def stage(c: Core, sid: bytes, seq: int, **kw) -> Decision:
    """What the request thread does: payload into the staging slot, then submit."""
    c.payload_view(c.staging_slot())[:] = payload_of(sid, seq, c.config.payload_bytes)
    return sub(c, sid=sid, seq=seq, **kw)


def test_payload_views_are_per_slot_aligned_and_sized():
    with make(workers=2, queue_capacity=3, payload_bytes=100) as c:
        assert c.slots == 3 + 2 + 1
        views = [c.payload_view(i) for i in range(c.slots)]
        assert all(v.dtype == np.uint8 and v.shape == (100,) for v in views)
        assert all(v.ctypes.data % 64 == 0 for v in views)            # a cache line per slot
        addrs = sorted(v.ctypes.data for v in views)
        assert all(b - a >= 128 for a, b in zip(addrs, addrs[1:], strict=False))  # 100 -> 128
        assert c.payload_view(4) is views[4]                          # made once, at create
        assert not views[0].any()
        for bad in (-1, c.slots):
            with pytest.raises(InvalidArgument):
                c.payload_view(bad)
    with make(payload_bytes=0) as c:
        assert c.payload_view(c.staging_slot()).size == 0
    with pytest.raises(InvalidArgument):
        make(payload_bytes=2**30 + 1)


def test_staging_slot_stays_on_rejection_and_changes_on_acceptance():
    with make(workers=1, queue_capacity=2, nfe_ns=100, payload_bytes=16) as c:
        s0 = c.staging_slot()
        assert stage(c, b"a", 0, gen=2, deadline=T + 1000) == Decision.ACCEPTED
        s1 = c.staging_slot()
        assert s1 != s0 and c.queue_snapshot()[0].slot == s0
        rejected = [
            dict(sid=b"a", seq=0, gen=2),                       # coalesced
            dict(sid=b"a", seq=1, gen=1),                       # stale
            dict(sid=b"b", seq=0, deadline=T),                  # expired
            dict(sid=b"b", seq=0, deadline=T + 50),             # admission (100 > 50)
            dict(sid=b"b", seq=0, deadline=T + 500, retry=1, origin=T - 600),  # retry gate
        ]
        for kw in rejected:
            assert stage(c, **kw) != Decision.ACCEPTED
            assert c.staging_slot() == s1
        assert stage(c, b"b", 0, deadline=T + 900) == Decision.ACCEPTED
        s2 = c.staging_slot()
        assert len({s0, s1, s2}) == 3
        assert stage(c, b"c", 0, deadline=0) == Decision.REJECTED_CAPACITY  # full, cannot displace
        assert c.staging_slot() == s2
        # Everything held: a full queue and a busy lane, and still a free staging slot.
        c.dispatch(0, T)
        assert stage(c, b"d", 0, deadline=T + 800) == Decision.ACCEPTED
        held = {q.slot for q in c.queue_snapshot()} | {w.slot for w in c.lanes_snapshot()}
        assert len(held) == 3 and c.staging_slot() not in held


def test_payload_travels_from_submit_to_dispatch_untouched():
    """Bytes written into the staging slot come out at dispatch for that very request, also when
    other requests were displaced, cancelled or rejected in between (their slots get reused)."""
    n = 40
    with make(workers=2, queue_capacity=3, payload_bytes=n, max_nfe=8) as c:
        assert stage(c, b"a", 0, gen=1, deadline=T + 900, nfe=3) == Decision.ACCEPTED
        assert stage(c, b"b", 0, deadline=T + 500) == Decision.ACCEPTED
        assert stage(c, b"c", 0, deadline=T + 800) == Decision.ACCEPTED
        # Full: d (earlier deadline) displaces a's neighbour with the latest deadline (a).
        assert stage(c, b"d", 0, deadline=T + 300) == Decision.ACCEPTED
        assert codes(c) == [(Code.REJECTED_CAPACITY, b"a", 0, -1)]
        # Still full and later than everything queued: refused (its staged bytes get overwritten
        # by the next request); then b's generation 2 cancels queued b0 and takes its room.
        assert stage(c, b"a", 1, gen=2, deadline=T + 950) == Decision.REJECTED_CAPACITY
        assert stage(c, b"b", 1, gen=2, deadline=T + 400) == Decision.ACCEPTED
        assert codes(c) == [(Code.REJECTED_CAPACITY, b"a", 1, -1),
                            (Code.REJECTED_STALE, b"b", 0, -1)]
        # Freed slots get reused: two more accepted after the lanes take work.
        got = {}
        for lane in (0, 1):
            w = c.dispatch(lane, T)
            got[(w.session_id, w.sequence)] = c.payload_view(w.slot).copy()
        assert stage(c, b"f", 0, deadline=T + 700) == Decision.ACCEPTED
        assert stage(c, b"g", 0, deadline=T + 600) == Decision.ACCEPTED
        # The running payloads were not touched by those submits.
        for lane in (0, 1):
            w = c.lanes_snapshot()[lane]
            assert (c.payload_view(w.slot) == got[(w.session_id, w.sequence)]).all()
            assert c.step(lane, T + 1, 1) == Step.DONE
            c.finish(lane, T + 1, np.zeros(ACT, np.float32))
        while (w := c.dispatch(0, T + 1)) is not None:
            got[(w.session_id, w.sequence)] = c.payload_view(w.slot).copy()
            run_to_done(c, 0, T + 1)
            c.finish(0, T + 1, np.zeros(ACT, np.float32))
        assert set(got) == {(b"d", 0), (b"b", 1), (b"c", 0), (b"f", 0), (b"g", 0)}
        for (sid, seq), data in got.items():
            assert (data == payload_of(sid, seq, n)).all(), (sid, seq)
