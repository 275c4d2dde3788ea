# SPDX-License-Identifier: Apache-2.0
"""Batch slots (docs/design.md §5.1) in the C core, in virtual time through CFFI: W x B lanes,
worker w owning lanes [w*B, (w+1)*B) and ring w + 1, dispatch_worker filling free slots in EDF
order, worker_wait, independent leaves, admission over W x B lanes (a free slot of a stepping
worker priced at its next boundary), and a dead worker's lanes. Also run by `make sanitize`."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from core_helpers import MS, make_core, request

from flowedge_relay.core import Code, Decision, InvalidArgument, Step

OBS = np.random.default_rng(7).uniform(-1, 1, (64, 4)).astype(np.float32)
req = partial(request, nfe=3, origin=0, obs=OBS)  # 3 NFE, origin 0, observation OBS[seq]


def test_lanes_are_workers_times_slots_and_each_worker_owns_its_range():
    with make_core(workers=3, batch_slots=4, queue_capacity=8) as core:
        assert (core.lanes, core.batch_slots) == (12, 4)
        assert list(core.worker_lanes(1)) == [4, 5, 6, 7]
        assert len(core.lanes_snapshot()) == 12 and core.stats().lanes_alive == 12
        assert core.slots == 8 + 12 + 1
        with pytest.raises(InvalidArgument):
            core.dispatch(12, 0)
        with pytest.raises(InvalidArgument):
            core.dispatch_worker(3, 0)
        with pytest.raises(InvalidArgument):
            core.worker_wait(3, 0)
    with pytest.raises(InvalidArgument):
        make_core(batch_slots=65)


def test_dispatch_worker_fills_free_slots_in_edf_order_then_reports_none():
    with make_core(workers=2, batch_slots=3) as core:
        for i, d in enumerate([900, 500, 700, 0, 600]):  # deadlines; 0 = none (last)
            assert core.submit(req(b"s%d" % i, i, deadline=d * MS), 0) == Decision.ACCEPTED
        assert core.queued() == 5
        got = [core.dispatch_worker(1, 0) for _ in range(4)]
        assert [w.lane for w in got[:3]] == [3, 4, 5] and got[3] is None  # worker 1 is full
        assert [w.sequence for w in got[:3]] == [1, 4, 2]  # EDF: 500, 600, 700
        w = core.dispatch_worker(0, 0)
        assert (w.lane, w.sequence) == (0, 0)
        assert core.queued() == 1
        # a freed slot is the next one taken: lane 4 finishes, worker 1 refills lane 4
        for _ in range(3):
            res = core.step(4, 1, 1)
        assert res == Step.DONE
        core.finish(4, 1, np.zeros(16, np.float32))
        assert core.dispatch_worker(1, 1).lane == 4
        assert core.dispatch_worker(1, 1) is None and core.queued() == 0


def test_worker_wait_needs_queued_work_and_a_free_slot():
    with make_core(workers=1, batch_slots=2) as core:
        assert not core.worker_wait(0, 1_000)  # nothing queued
        for i in range(3):
            core.submit(req(b"s%d" % i, i), 0)
        assert core.worker_wait(0, 1_000)
        core.dispatch_worker(0, 0)
        assert core.worker_wait(0, 1_000)  # one slot still free
        core.dispatch_worker(0, 0)
        assert core.queued() == 1 and not core.worker_wait(0, 1_000)  # both slots taken


def test_rows_leave_independently_and_outcomes_go_to_the_worker_ring():
    with make_core(workers=2, batch_slots=2, ring_capacity=1) as core:
        for i in range(3):
            core.submit(req(b"s%d" % i, i, gen=1, nfe=2), 0)
        a, b = core.dispatch_worker(0, 0), core.dispatch_worker(0, 0)
        c = core.dispatch_worker(1, 0)
        assert (a.lane, b.lane, c.lane) == (0, 1, 2)
        # a newer generation of b's session: b stops at its next step, a goes on
        assert core.submit(req(b"s1", 9, gen=2, nfe=2), 1) == Decision.ACCEPTED
        assert core.step(0, 2, 1) == Step.CONTINUE
        assert core.step(1, 2, 1) == Step.STOP_STALE
        assert not core.output_space(0) and not core.output_space(1)  # worker 0's one record
        assert core.output_space(2)  # worker 1's ring is its own
        (o,) = core.pop_outcomes()
        assert (o.code, o.sequence, o.lane) == (Code.REJECTED_STALE, 1, 1)
        assert core.step(0, 3, 1) == Step.DONE
        assert core.finish(0, 3, np.ones(16, np.float32)) == Code.INFERENCE
        (o,) = core.pop_outcomes()
        assert (o.code, o.sequence, o.lane) == (Code.INFERENCE, 0, 0)
        assert core.dispatch_worker(0, 3).sequence == 9  # the freed slot takes the new one


def test_admission_simulates_w_times_b_lanes():
    """W = 1, B = 2, nfe_ns 1 ms: two 3-NFE requests due in 3 ms both fit (one per slot), where
    one lane (B = 1) could serve only the first."""
    for slots, second in ((2, Decision.ACCEPTED), (1, Decision.REJECTED_DEADLINE)):
        with make_core(workers=1, batch_slots=slots, nfe_ns=MS) as core:
            assert core.submit(req(b"a", 0, nfe=3, deadline=3 * MS), 0) == Decision.ACCEPTED
            assert core.submit(req(b"b", 1, nfe=3, deadline=3 * MS), 0) == second


def test_a_free_slot_of_a_stepping_worker_is_priced_at_its_next_boundary():
    """A request joining a worker that is stepping other rows waits for the step in flight: the
    free slot starts at now + nfe_ns. A worker holding nothing takes it now."""
    with make_core(workers=1, batch_slots=2, nfe_ns=MS) as core:
        assert core.submit(req(b"a", 0, nfe=2, deadline=2 * MS), 0) == Decision.ACCEPTED
        assert core.submit(req(b"b", 1, nfe=2, deadline=2 * MS), 0) == Decision.ACCEPTED
    with make_core(workers=1, batch_slots=2, nfe_ns=MS) as core:
        assert core.submit(req(b"a", 0, nfe=8), 0) == Decision.ACCEPTED
        assert core.dispatch_worker(0, 0) is not None  # worker 0 now steps one row
        assert core.submit(req(b"b", 1, nfe=2, deadline=2 * MS), 0) == Decision.REJECTED_DEADLINE
        assert core.submit(req(b"c", 2, nfe=2, deadline=3 * MS), 0) == Decision.ACCEPTED


def test_the_last_lanes_of_a_dead_worker_drain_the_queue_once():
    with make_core(workers=1, batch_slots=3) as core:
        for i in range(5):
            core.submit(req(b"s%d" % i, i), 0)
        core.dispatch_worker(0, 0)
        for lane in core.worker_lanes(0):
            core.disable_lane(lane, 1)
        codes = sorted(int(o.code) for o in core.pop_outcomes())
        assert codes == [Code.REJECTED_CAPACITY] * 4 + [Code.EXPIRED]
        assert core.stats().lanes_alive == 0
        assert core.submit(req(b"x", 9), 2) == Decision.REJECTED_CAPACITY
