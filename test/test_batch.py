# SPDX-License-Identifier: Apache-2.0
"""Batch slots (docs/design.md §5.1): batch.BatchRows against the batch-1 samplers, and the worker
pool's batched loop with the real C core (the core's W x B lanes: test_batch_core.py).

Conditions are made, not waited for: requests are queued before the workers start (so the first
step has every slot filled), and a fault delay per step holds rows in flight while a test acts.
"""

from __future__ import annotations

import os
import random
import time
import zlib
from functools import partial

import numpy as np
import pytest
from core_helpers import HANG_GUARD_S, MS, collect, make_core, request, wait_for

from flowedge_relay import policy as P
from flowedge_relay.batch import BATCH_ATOL, BATCH_RTOL, BatchRows, RowSpec
from flowedge_relay.core import (
    Code,
    Core,
    Decision,
)
from flowedge_relay.model import (
    FlowSampler,
    default_model_path,
    load_model,
    make_session,
)
from flowedge_relay.workers import SlotInputs, WorkerPool
from flowedge_relay_tools.models import bench_model_path
from flowedge_relay_tools.models import detour_task as task

OBS = task.sample_observations(np.random.default_rng(7), 64)


def _settle(rows: BatchRows, stepno: int, leave_at: dict, finished: dict) -> None:
    """After a step: rows with no NFE left leave with their actions kept in `finished`, rows
    whose planned leave step (`leave_at`, by lane) is this one leave without."""
    for r in range(rows.n - 1, -1, -1):
        lane = int(rows.lane[r])
        if rows.remaining(r) == 0:
            finished[lane] = rows.actions(r).copy()
            rows.leave(r)
        elif leave_at.get(lane) == stepno:
            rows.leave(r)


req = partial(request, nfe=3, origin=0, obs=OBS)  # 3 NFE, origin 0, observation OBS[seq]


# ---- results: BatchRows against the batch-1 samplers --------------------------------------


def _single(path: str, solver: str):
    info = load_model(path)
    sess = make_session(info)
    return info, sess, FlowSampler(sess, info, solver)


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.all(np.abs(a - b) <= BATCH_ATOL + BATCH_RTOL * np.abs(b)))


def _drive(rows: BatchRows, plan: list[tuple], inputs, finished: dict) -> None:
    """Run a random composition: plan is a list of (seed, nfe, join_at_step, leave_after or
    None); rows join at their step, some leave early (stale / expired), the rest finish."""
    pending = sorted(plan, key=lambda p: p[2])
    stepno, k = 0, 0
    leave_at: dict[int, int] = {}
    while k < len(pending) or rows.n:
        while k < len(pending) and pending[k][2] <= stepno and rows.n < rows.slots:
            seed, nfe, _, leave = pending[k]
            rows.join(lane=seed, slot=seed, noise_seed=seed, total_nfe=nfe, inputs=inputs(seed))
            if leave is not None:
                leave_at[seed] = stepno + leave
            k += 1
        if rows.n:
            rows.prefix(0, 0)
            rows.run()
        stepno += 1
        _settle(rows, stepno, leave_at, finished)


@pytest.mark.parametrize("path", [default_model_path(), bench_model_path()])
@pytest.mark.parametrize("solver", ["euler", "midpoint"])
def test_one_row_is_bit_identical_and_any_batch_is_within_tolerance(path, solver):
    info, sess, ref = _single(path, solver)
    rows = BatchRows(RowSpec.of(info, solver), {"velocity": sess}, 8, 64)
    # a seed stable across processes (str hash() is salted per process) and clone directories
    rng = random.Random(zlib.crc32(f"{os.path.basename(path)}/{solver}".encode()))
    for seed in range(4):  # one row at a time: exactly the batch-1 arithmetic
        nfe = rng.randint(1, 12)
        rows.join(seed, seed, seed, nfe, OBS[seed])
        for _ in range(nfe):
            rows.run()
        assert np.array_equal(rows.actions(0), ref.sample(OBS[seed], seed, nfe))
        rows.leave(0)
    # random compositions: joins at step boundaries, early leaves, rows moved by compaction
    plan = [(s, rng.randint(1, 16), rng.randint(0, 20),
             rng.choice([None, None, None, rng.randint(1, 4)])) for s in range(40)]
    finished: dict[int, np.ndarray] = {}
    _drive(rows, plan, lambda s: OBS[s], finished)
    assert len(finished) >= 25
    worst = 0.0
    for seed, arr in finished.items():
        nfe = next(p[1] for p in plan if p[0] == seed)
        want = ref.sample(OBS[seed], seed, nfe)
        assert _close(arr, want), (seed, np.max(np.abs(arr - want)))
        worst = max(worst, float(np.max(np.abs(arr - want))))
    print(f"\n{path.rsplit('/', 1)[-1]} {solver}: largest |batched - batch 1| = {worst:.3g}")


def test_two_phase_package_rows_match_the_policy_sampler():
    pol = P.load(P.vision_policy_path())
    sessions = P.make_sessions(pol)
    ref = P.PolicySampler(pol, sessions)
    images = task.render_observation(OBS[:24])
    buffers = {}
    for s in range(24):
        b = P.InputBuffers(pol)
        P.fill_buffers(pol, b, {"image": images[s], "state": OBS[s, :2]})
        buffers[s] = b

    def want(s: int, nfe: int) -> np.ndarray:
        ref.use_buffers(buffers[s])
        ref.start(s, nfe)
        ref.prefix()
        for _ in range(nfe):
            ref.nfe()
        return ref.actions().copy()

    rows = BatchRows(RowSpec.of(pol, pol.solver), sessions, 4, 64)
    rows.join(0, 0, 0, 5, buffers[0])  # one row: bit-identical, prefix included
    rows.prefix(0, 1)
    for _ in range(5):
        rows.run()
    assert np.array_equal(rows.actions(0), want(0, 5))
    rows.leave(0)
    rng = random.Random(3)
    plan = [(s, rng.randint(1, 10), rng.randint(0, 12), rng.choice([None, None, 2]))
            for s in range(24)]
    finished: dict[int, np.ndarray] = {}
    pending = sorted(plan, key=lambda p: p[2])
    stepno = k = 0
    leave_at: dict[int, int] = {}
    while k < len(pending) or rows.n:
        first = rows.n
        while k < len(pending) and pending[k][2] <= stepno and rows.n < rows.slots:
            s, nfe, _, leave = pending[k]
            rows.join(s, s, s, nfe, buffers[s])
            if leave is not None:
                leave_at[s] = stepno + leave
            k += 1
        rows.prefix(first, rows.n - first)  # the joiners' prefix passes in one call
        if rows.n:
            rows.run()
        stepno += 1
        _settle(rows, stepno, leave_at, finished)
    assert len(finished) >= 8
    for s, arr in finished.items():
        nfe = next(p[1] for p in plan if p[0] == s)
        assert _close(arr, want(s, nfe)), s


# ---- the worker pool's batched loop with the real core ------------------------------------


def test_pool_with_batch_slots_answers_each_request_once_with_batch_one_results():
    info, _, ref = _single(default_model_path(), "euler")
    with make_core(workers=2, batch_slots=4, queue_capacity=64) as core:
        n = 30
        for i in range(n):  # queued before the workers start: the first steps are full
            assert core.submit(req(b"s%d" % i, i, gen=1, nfe=2 + i % 9), 1) == Decision.ACCEPTED
        pool = WorkerPool(core, info, workers=2)
        pool.start()
        try:
            got = collect(core, n)
        finally:
            pool.stop()
        assert sorted(o.sequence for o in got) == list(range(n))  # each exactly once
        for o in got:
            assert o.code == Code.INFERENCE
            assert _close(o.actions, ref.sample(OBS[o.sequence], o.sequence, 2 + o.sequence % 9))
        stats = pool.batch_stats()
        assert stats["batch_slots"] == 4 and stats["mean_rows_per_step"] > 1.0
        assert 4 in stats["step_ns_by_rows"]
        assert sum(o.nfe_done for o in got) == pool.nfe_count == core.stats().nfe_total


def test_a_stale_row_leaves_without_disturbing_the_others():
    info, _, ref = _single(default_model_path(), "euler")
    with make_core(workers=1, batch_slots=4) as core:
        for i in range(4):
            core.submit(req(b"s%d" % i, i, gen=1, nfe=6), 1)
        pool = WorkerPool(core, info, workers=1, fault_nfe_delay_ns=40 * MS, drill=True)
        pool.start()
        try:
            assert wait_for(lambda: core.stats().lanes_busy >= 4, HANG_GUARD_S, 0.002)  # rows held
            now = time.monotonic_ns()
            assert core.submit(req(b"s2", 9, gen=2, nfe=3), now) == Decision.ACCEPTED
            got = {o.sequence: o for o in collect(core, 5)}
        finally:
            pool.stop()
        assert got[2].code == Code.REJECTED_STALE and got[2].nfe_done < 6
        for i in (0, 1, 3):
            assert got[i].code == Code.INFERENCE
            assert _close(got[i].actions, ref.sample(OBS[i], i, 6))
        assert got[9].code == Code.INFERENCE  # the freed slot took the newer generation
        assert _close(got[9].actions, ref.sample(OBS[9], 9, 3))


# ---- the native rows loop against the Python rows loop (the same pool, nfe_loop auto / python) --


def _vision_arrays(n: int) -> list[dict[str, np.ndarray]]:
    images = task.render_observation(OBS[:n])
    return [{"image": images[s], "state": OBS[s, :2]} for s in range(n)]


class _Served:
    """One model served by a real core and pool: how to build its core, submit request i and
    compute request i's batch-1 actions."""

    def __init__(self, name: str, solver: str) -> None:
        self.name, self.solver = name, solver
        if name == "policy_vision":
            self.model = P.load(P.vision_policy_path())
            self.arrays = _vision_arrays(len(OBS))
            self._ref = P.PolicySampler(self.model, P.make_sessions(self.model))
        else:
            path = default_model_path() if name == "policy_small" else bench_model_path()
            self.model, _, self._ref = _single(path, solver)

    def core(self, slots: int) -> Core:
        m = self.model
        if isinstance(m, P.Policy):
            return make_core(batch_slots=slots, obs_dim=0, two_phase=1,
                             action_len=m.action.horizon * m.action.output_dim,
                             payload_bytes=P.payload_layout(m).nbytes, queue_capacity=64)
        return make_core(batch_slots=slots, obs_dim=m.obs_dim, action_len=m.action_len,
                         queue_capacity=64)

    def pool(self, core: Core, loop: str, **kw) -> WorkerPool:
        if isinstance(self.model, P.Policy):
            slots = SlotInputs(self.model, core.payload_view)
            return WorkerPool(core, self.model, slot_inputs=slots, nfe_loop=loop, **kw)
        return WorkerPool(core, self.model, solver=self.solver, nfe_loop=loop, **kw)

    def submit(self, core: Core, pool: WorkerPool | None, i: int, session: int, gen: int,
               nfe: int) -> None:
        package = isinstance(self.model, P.Policy)  # its inputs go in the slot's payload
        r = req(b"s%d" % session, i, gen=gen, nfe=nfe,
                obs=np.zeros(0, np.float32) if package else OBS)
        if package:
            slots = pool.slot_inputs if pool is not None else SlotInputs(self.model,
                                                                         core.payload_view)
            P.fill_buffers(self.model, slots[core.staging_slot()], self.arrays[i % len(OBS)])
        assert core.submit(r, time.monotonic_ns()) == Decision.ACCEPTED

    def want(self, i: int, nfe: int) -> np.ndarray:
        if isinstance(self.model, P.Policy):
            return self._ref.sample(self.arrays[i % len(OBS)], i, nfe).copy()
        return self._ref.sample(OBS[i % len(OBS)], i, nfe)


SERVED = [("policy_small", "euler"), ("policy_small", "midpoint"), ("policy_bench", "euler"),
          ("policy_bench", "midpoint"), ("policy_vision", "")]


def _serve(served: _Served, loop: str, slots: int, seed: int) -> tuple[dict, dict, list]:
    """A random composition through the real core and pool: 8 requests queued before the start,
    then waves submitted at random instants (joins at step boundaries), a third of them a newer
    generation of a running session (its row leaves as REJECTED_STALE). A 2 ms fault delay per
    step keeps rows in flight while the waves arrive. Returns outcomes by sequence, the NFE total
    of each sequence, and the worker info."""
    rng = random.Random(seed)
    nfe_of: dict[int, int] = {}
    with served.core(slots) as core:
        pool = served.pool(core, loop, fault_nfe_delay_ns=2 * MS, drill=True)
        i, gen = 0, {}

        def submit(k: int) -> None:
            nonlocal i
            for _ in range(k):
                session = rng.randrange(12)
                gen[session] = gen.get(session, 0) + 1
                nfe_of[i] = rng.randint(1, 12)
                served.submit(core, pool, i, session, gen[session], nfe_of[i])
                i += 1

        submit(8)
        pool.start()
        try:
            for _ in range(6):
                time.sleep(rng.uniform(0.0, 0.012))
                submit(rng.randint(1, 4))
            got = collect(core, i)
            info = pool.worker_info()
        finally:
            pool.stop()
        assert pool.nfe_count == core.stats().nfe_total
    outs = {o.sequence: o for o in got}
    assert sorted(outs) == list(range(i)) and len(got) == i  # each exactly once
    return outs, nfe_of, info


@pytest.mark.parametrize(("name", "solver"), SERVED, ids=[f"{n}-{s or 'manifest'}"
                                                         for n, s in SERVED])
def test_native_rows_loop_matches_the_python_rows_loop_over_random_joins_and_leaves(name, solver):
    served = _Served(name, solver)
    results = {}
    for loop in ("auto", "python"):
        outs, nfe_of, info = _serve(served, loop, 4, seed=11)
        assert info[0]["nfe_loop"] == ("native" if loop == "auto" else "python")
        assert any(o.code == Code.REJECTED_STALE for o in outs.values())
        for seq, o in outs.items():
            assert o.code in (Code.INFERENCE, Code.REJECTED_STALE), (seq, o.code)
            if o.code == Code.INFERENCE:
                assert _close(o.actions, served.want(seq, nfe_of[seq])), (loop, seq)
        results[loop] = {s: o.actions for s, o in outs.items() if o.code == Code.INFERENCE}
    both = results["auto"].keys() & results["python"].keys()
    assert both
    for s in both:  # the same request through both loops (row compositions may differ)
        assert _close(results["auto"][s], results["python"][s]), s


@pytest.mark.parametrize(("name", "solver"), SERVED, ids=[f"{n}-{s or 'manifest'}"
                                                         for n, s in SERVED])
def test_one_slot_through_the_rows_loop_is_bit_identical_to_batch_one(name, solver):
    """B = 1 runs the same rows loop: native and Python, byte for byte the batch-1 sampler."""
    served = _Served(name, solver)
    for loop in ("auto", "python"):
        outs, nfe_of, _ = _serve(served, loop, 1, seed=5)
        for seq, o in outs.items():
            if o.code == Code.INFERENCE:
                want = served.want(seq, nfe_of[seq])
                assert o.actions.tobytes() == want.tobytes(), (loop, seq)


def test_a_queued_request_joins_at_the_next_boundary_while_a_row_keeps_running():
    """The native loop leaves C at a step boundary when a slot is free and work is queued
    (FER_EXEC_JOIN): a short request submitted while a long one runs joins it and finishes first,
    the long one going on undisturbed (its result is batch-1's)."""
    info, _, ref = _single(default_model_path(), "euler")
    with make_core(workers=1, batch_slots=2) as core:
        assert core.submit(req(b"long", 0, gen=1, nfe=40), time.monotonic_ns()) == 0
        pool = WorkerPool(core, info, workers=1, fault_nfe_delay_ns=5 * MS, drill=True)
        pool.start()
        try:
            assert pool.worker_info()[0]["nfe_loop"] == "native"
            # the long row is stepping in C
            assert wait_for(lambda: core.lanes_snapshot()[0].nfe_done >= 3, HANG_GUARD_S, 0.002)
            assert core.submit(req(b"short", 1, gen=1, nfe=3), time.monotonic_ns()) == 0
            got = {o.sequence: o for o in collect(core, 2)}
            stats = pool.batch_stats()
        finally:
            pool.stop()
        short, long_ = got[1], got[0]
        assert short.code == long_.code == Code.INFERENCE
        assert short.finish_ns < long_.finish_ns and short.nfe_done == 3
        assert stats["step_ns_by_rows"][2][2] == 3  # three steps of two rows: it joined at once
        assert short.actions.tobytes() == ref.sample(OBS[1], 1, 3).tobytes()
        assert _close(long_.actions, ref.sample(OBS[0], 0, 40))
