"""Batch slots (docs/design.md §5.1): batch.BatchRows against the batch-1 samplers, and the worker
pool's batched loop with the real C core (the core's W x B lanes: test_batch_core.py).

Conditions are made, not waited for: requests are queued before the workers start (so the first
step has every slot filled), and a fault delay per step holds rows in flight while a test acts.
"""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

from flowedge_relay import policy as P
from flowedge_relay.batch import BATCH_ATOL, BATCH_RTOL, BatchRows, RowSpec
from flowedge_relay.core import (
    Code,
    Core,
    CoreConfig,
    Decision,
    Request,
)
from flowedge_relay.model import (
    FlowSampler,
    bench_model_path,
    default_model_path,
    load_model,
    make_session,
)
from flowedge_relay.models import detour_task as task
from flowedge_relay.workers import WorkerPool

MS = 1_000_000
HANG_GUARD_S = 30.0
OBS = task.sample_observations(np.random.default_rng(7), 64)


def req(sid: bytes, seq: int = 0, gen: int = 0, nfe: int = 3, deadline: int = 0,
        now: int = 0, obs_dim: int = 4) -> Request:
    return Request(session_id=sid, sequence=seq, generation=gen, retry_count=0, retry_reason=0,
                   origin_ns=now, deadline_ns=deadline, deadline_ros_ns=0, remaining_nfe=nfe,
                   noise_seed=seq, observation=OBS[seq % len(OBS)][:obs_dim].copy())


def core_of(workers: int = 1, slots: int = 4, **kw) -> Core:
    return Core(CoreConfig(workers=workers, batch_slots=slots, obs_dim=4, action_len=16, **kw))


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
        for r in range(rows.n - 1, -1, -1):
            lane = int(rows.lane[r])
            if rows.remaining(r) == 0:
                finished[lane] = rows.actions(r).copy()
                rows.leave(r)
            elif leave_at.get(lane) == stepno:
                rows.leave(r)


@pytest.mark.parametrize("path", [default_model_path(), bench_model_path()])
@pytest.mark.parametrize("solver", ["euler", "midpoint"])
def test_one_row_is_bit_identical_and_any_batch_is_within_tolerance(path, solver):
    info, sess, ref = _single(path, solver)
    rows = BatchRows(RowSpec.of(info, solver), {"velocity": sess}, 8, 64)
    rng = random.Random(hash((path, solver)) & 0xFFFF)
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
        for r in range(rows.n - 1, -1, -1):
            lane = int(rows.lane[r])
            if rows.remaining(r) == 0:
                finished[lane] = rows.actions(r).copy()
                rows.leave(r)
            elif leave_at.get(lane) == stepno:
                rows.leave(r)
    assert len(finished) >= 8
    for s, arr in finished.items():
        nfe = next(p[1] for p in plan if p[0] == s)
        assert _close(arr, want(s, nfe)), s


# ---- the worker pool's batched loop with the real core ------------------------------------


def _collect(core: Core, n: int) -> list:
    got: list = []
    guard = time.monotonic() + HANG_GUARD_S
    while len(got) < n:
        assert time.monotonic() < guard, f"only {len(got)} of {n} outcomes arrived"
        core.wait_outputs(20 * MS)
        got.extend(core.pop_outcomes())
    return got


def test_pool_with_batch_slots_answers_each_request_once_with_batch_one_results():
    info, _, ref = _single(default_model_path(), "euler")
    with Core(CoreConfig(workers=2, batch_slots=4, obs_dim=4, action_len=16,
                         queue_capacity=64)) as core:
        n = 30
        for i in range(n):  # queued before the workers start: the first steps are full
            assert core.submit(req(b"s%d" % i, i, gen=1, nfe=2 + i % 9), 1) == Decision.ACCEPTED
        pool = WorkerPool(core, info, workers=2)
        pool.start()
        try:
            got = _collect(core, n)
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
    with Core(CoreConfig(workers=1, batch_slots=4, obs_dim=4, action_len=16)) as core:
        for i in range(4):
            core.submit(req(b"s%d" % i, i, gen=1, nfe=6), 1)
        pool = WorkerPool(core, info, workers=1, fault_nfe_delay_ns=40 * MS)
        pool.start()
        try:
            guard = time.monotonic() + HANG_GUARD_S
            while core.stats().lanes_busy < 4:  # every row held
                assert time.monotonic() < guard
                time.sleep(0.002)
            now = time.monotonic_ns()
            assert core.submit(req(b"s2", 9, gen=2, nfe=3), now) == Decision.ACCEPTED
            got = {o.sequence: o for o in _collect(core, 5)}
        finally:
            pool.stop()
        assert got[2].code == Code.REJECTED_STALE and got[2].nfe_done < 6
        for i in (0, 1, 3):
            assert got[i].code == Code.INFERENCE
            assert _close(got[i].actions, ref.sample(OBS[i], i, 6))
        assert got[9].code == Code.INFERENCE  # the freed slot took the newer generation
        assert _close(got[9].actions, ref.sample(OBS[9], 9, 3))
