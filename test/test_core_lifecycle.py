# SPDX-License-Identifier: Apache-2.0
"""The core's lifecycle and model-swap primitives (csrc/fer.h: set_accepting, hold_dispatch,
reserve_lanes_until, drain_bound), in virtual time: what an inactive relay answers, what a
swapped-in core may promise while the old one drains, and when the old one is done."""

from __future__ import annotations

from functools import partial

from core_helpers import make_core, request

from flowedge_relay.core import Code, Decision, Step

T = 1_000_000
MS = 1_000_000
make = partial(make_core, obs_dim=2, action_len=2)
req = partial(request, origin=T, obs_dim=2)


def sub(core, now=T, **kw) -> Decision:
    return core.submit(req(**{"origin": now, **kw}), now)


def codes(core) -> list[tuple]:
    return [(o.code, o.session_id, o.sequence) for o in core.pop_outcomes()]


def test_not_accepting_answers_every_valid_request_capacity_and_changes_nothing():
    with make(nfe_ns=MS) as c:
        assert sub(c, seq=1, gen=1, nfe=3) == Decision.ACCEPTED
        c.set_accepting(False)
        # a newer generation, a deadline already passed, an unreachable deadline: all the same
        for kw in ({"seq": 2, "gen": 9}, {"seq": 3, "deadline": T - 1},
                   {"seq": 4, "deadline": T + 1}, {"sid": b"other", "seq": 5}):
            assert sub(c, **kw) == Decision.REJECTED_CAPACITY
        assert codes(c) == [(Code.REJECTED_CAPACITY, b"s", 2), (Code.REJECTED_CAPACITY, b"s", 3),
                            (Code.REJECTED_CAPACITY, b"s", 4),
                            (Code.REJECTED_CAPACITY, b"other", 5)]
        assert c.session_generation(b"s") == 1  # no generation advance, nothing cancelled
        assert [q.sequence for q in c.queue_snapshot()] == [1]
        assert c.stats().rejected_inactive == 4
        # a retry of queued work is still coalesced: it gets its one answer from the original
        assert sub(c, seq=1, gen=1, retry=1, reason=1) == Decision.COALESCED
        c.set_accepting(True)
        assert sub(c, seq=6, gen=1) == Decision.ACCEPTED
        assert c.stats().rejected_inactive == 4


def test_queued_work_is_served_while_not_accepting():
    with make() as c:
        sub(c, seq=1, nfe=2)
        c.set_accepting(False)
        work = c.dispatch(0, T)
        assert work is not None and work.sequence == 1
        assert c.step(0, T + 10, 5) == Step.CONTINUE
        assert c.step(0, T + 20, 5) == Step.DONE


def test_held_dispatch_waits_until_released():
    with make() as c:
        c.hold_dispatch(True)
        sub(c, seq=1)
        assert c.dispatch(0, T) is None
        assert c.wait_for_work(0, 0) is False
        c.hold_dispatch(False)
        assert c.wait_for_work(0, 0) is True
        assert c.dispatch(0, T).sequence == 1


def test_a_reserve_pushes_every_lane_start_in_admission():
    """A swapped-in core while the old drains: a request that fits on an idle core is rejected
    when the lanes are reserved past its deadline, and admitted when the reserve still leaves
    room."""
    with make(nfe_ns=MS, workers=2) as c:
        c.reserve_lanes_until(T + 10 * MS)
        assert sub(c, seq=1, nfe=2, deadline=T + 11 * MS) == Decision.REJECTED_DEADLINE
        assert sub(c, seq=2, nfe=2, deadline=T + 12 * MS) == Decision.ACCEPTED
        c.reserve_lanes_until(0)
        assert sub(c, seq=3, nfe=2, deadline=T + 2 * MS) == Decision.ACCEPTED


def test_drain_bound_is_the_lane_simulation_of_what_the_core_holds():
    with make(nfe_ns=MS, workers=2) as c:
        assert c.drain_bound(T) == T  # nothing held
        sub(c, seq=1, nfe=4)          # runs on lane 0: done at T + 4 ms
        c.dispatch(0, T)
        sub(c, seq=2, nfe=3)          # queued: lane 1 (idle) at T + 3 ms
        sub(c, seq=3, nfe=2)          # queued: lane 1 again, T + 3 + 2 = T + 5 ms
        assert c.drain_bound(T) == T + 5 * MS
        c.reserve_lanes_until(T + 10 * MS)  # queued work cannot start before the reserve:
        assert c.drain_bound(T) == T + 13 * MS  # seq 2 on a lane from T + 10 ms, seq 3 beside it


def test_drain_bound_of_work_with_deadlines_is_at_most_the_latest_deadline_plus_one_nfe():
    """Work with a deadline ends by it (expired at dispatch, or stopped at the first boundary
    after it), however slow the NFEs became since it was admitted."""
    with make(nfe_ns=MS) as c:
        assert sub(c, seq=1, nfe=4, deadline=T + 5 * MS) == Decision.ACCEPTED
        assert sub(c, seq=2, nfe=4, deadline=T + 9 * MS) == Decision.ACCEPTED
        assert c.drain_bound(T) == T + 8 * MS  # the simulation: 4 + 4 NFE
        c.set_calibration(10 * MS, 0)  # NFEs got ten times slower
        assert c.drain_bound(T) == T + 9 * MS + 10 * MS  # not T + 80 ms
        assert sub(c, seq=3, nfe=1) == Decision.ACCEPTED  # no deadline: the simulation
        assert c.drain_bound(T) == T + 90 * MS


def test_drain_bound_with_admission_off_uses_the_measured_nfe_or_the_deadlines():
    with make() as c:  # nfe_ns 0, nothing measured yet
        sub(c, seq=1, nfe=4, deadline=T + 7 * MS)
        assert c.drain_bound(T) == T + 7 * MS  # the deadline is all that is known
        sub(c, seq=2, nfe=4)
        assert c.drain_bound(T) == 2**64 - 1  # and no deadline: no bound
        c.dispatch(0, T)
        assert c.step(0, T + 2 * MS, 2 * MS) == Step.CONTINUE  # one NFE measured: 2 ms
        # seq 1 has 3 NFE left (6 ms), then seq 2's 4 (8 ms), at the measured cost
        assert c.drain_bound(T + 2 * MS) == T + 16 * MS
