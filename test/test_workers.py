# SPDX-License-Identifier: Apache-2.0
"""Worker threads with the real C core and the real small model.

No wall-time assertions: cancellation and expiry are measured in NFEs. `fault_nfe_delay_ns`
makes every NFE slow enough that a test can act while a request is mid-run; loops that wait for
something have a generous hang guard, never a pass/fail deadline.
"""

from __future__ import annotations

import threading
import time
from functools import partial

import numpy as np
import pytest
from core_helpers import HANG_GUARD_S, MS, collect, make_core, wait_for
from core_helpers import request as core_request
from hypothesis import given, settings
from hypothesis import strategies as st
from rt_helpers import CPUS, needs_fifo

from flowedge_relay import realtime as rt
from flowedge_relay.core import Code, Core, CostModel, Decision, Request
from flowedge_relay.model import FlowSampler, default_model_path, load_model, make_session
from flowedge_relay.workers import WorkerPool, p50_p99
from flowedge_relay_tools.models import detour_task as task


@pytest.fixture(scope="module")
def model():
    return load_model(default_model_path())


@pytest.fixture(scope="module")
def reference(model):
    """Direct sampler on its own session: what the workers must reproduce bit for bit."""
    return FlowSampler(make_session(model, 1), model, "euler")


OBS = task.sample_observations(np.random.default_rng(99), 8)


# generation 1, 8 NFE, noise seed 1, observation OBS[seq] unless told
request = partial(core_request, gen=1, nfe=8, seed=1, obs=OBS)


def submit(core: Core, req: Request) -> None:
    assert core.submit(req, time.monotonic_ns()) == Decision.ACCEPTED


def lane_nfe_done(core: Core, lane: int = 0) -> int:
    return core.lanes_snapshot()[lane].nfe_done


def worker_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("flowedge-worker-")]


def test_one_request_end_to_end(model, reference):
    with make_core() as core, WorkerPool(core, model, workers=1) as pool:
        submit(core, request(b"a", 1, nfe=8, seed=5))
        (out,) = collect(core, 1)
        assert out.code == Code.INFERENCE and out.lane == 0
        assert out.nfe_done == 8 and out.remaining_nfe == 0
        assert out.actions.dtype == np.float32 and out.actions.shape == (model.action_len,)
        assert out.actions.tobytes() == reference.sample(OBS[1], 5, 8).tobytes()
        p50, p99, samples = pool.nfe_percentiles()
        assert samples == pool.nfe_count == 8 and 0 < p50 <= p99
        pool.stop()
    assert worker_threads() == []


def test_determinism_through_workers(model, reference):
    """Same (observation, noise_seed, nfe) -> bit-identical actions on any lane, any session."""
    with make_core(workers=2) as core, WorkerPool(core, model, workers=2):
        for i in range(6):
            submit(core, request(b"s%d" % i, i % 3, nfe=5 + i % 3, seed=100 + i % 3))
        outs = collect(core, 6)
    by_seq: dict[int, set[bytes]] = {}
    for out in outs:
        assert out.code == Code.INFERENCE
        expected = reference.sample(OBS[out.sequence], 100 + out.sequence, 5 + out.sequence)
        assert out.actions.tobytes() == expected.tobytes()
        by_seq.setdefault(out.sequence, set()).add(out.actions.tobytes())
    assert all(len(v) == 1 for v in by_seq.values()) and len(by_seq) == 3


def test_midpoint_solver_through_workers(model):
    direct = FlowSampler(make_session(model, 1), model, "midpoint").sample(OBS[2], 3, 7)
    with make_core() as core, WorkerPool(core, model, workers=1, solver="midpoint"):
        submit(core, request(b"m", 2, nfe=7, seed=3))
        (out,) = collect(core, 1)
    assert out.code == Code.INFERENCE and out.nfe_done == 7
    assert out.actions.tobytes() == direct.tobytes()


def test_cancellation_stops_within_one_nfe(model):
    """A newer generation cancels running work at the next NFE boundary: the cancelled request
    spends at most one more NFE (the one in flight) after the newer one was accepted."""
    with make_core() as core, WorkerPool(core, model, workers=1, drill=True) as pool:
        pool.fault_nfe_delay_ns = 20 * MS  # each NFE >= 20 ms: room to submit mid-run
        submit(core, request(b"sess", 1, gen=1, nfe=40))
        assert wait_for(lambda: lane_nfe_done(core) >= 3, HANG_GUARD_S,
                        0.001), "never happened: three NFEs of generation 1"
        before = lane_nfe_done(core)
        submit(core, request(b"sess", 2, gen=2, nfe=2))
        after = lane_nfe_done(core)
        outs = {o.generation: o for o in collect(core, 2)}
        stale, fresh = outs[1], outs[2]
        assert stale.code == Code.REJECTED_STALE and stale.actions is None
        # Steps completed when gen 2 was accepted lie in [before, after]; exactly one more ran.
        assert before + 1 <= stale.nfe_done <= after + 1
        assert stale.remaining_nfe == 40 - stale.nfe_done
        assert fresh.code == Code.INFERENCE and fresh.nfe_done == 2
        assert pool.nfe_count == stale.nfe_done + 2  # no NFE was spent after the stop
        assert core.stats().nfe_wasted == stale.nfe_done


def test_deadline_expiry_between_steps(model):
    with make_core() as core, WorkerPool(core, model, workers=1, drill=True) as pool:
        pool.fault_nfe_delay_ns = 20 * MS  # 40 NFE need >= 800 ms; the deadline allows 300
        deadline = time.monotonic_ns() + 300 * MS
        submit(core, request(b"d", 1, nfe=40, deadline=deadline))
        (out,) = collect(core, 1)
        assert out.code == Code.EXPIRED and out.actions is None
        assert 1 <= out.nfe_done < 40 and out.remaining_nfe == 40 - out.nfe_done
        assert out.finish_ns >= deadline  # stopped because the deadline had passed ...
        assert pool.nfe_count == out.nfe_done  # ... at the first boundary after it
        assert core.stats().nfe_wasted == out.nfe_done


def test_shutdown_with_work_in_flight_joins_every_thread(model):
    core = make_core(workers=2)
    pool = WorkerPool(core, model, workers=2, intra_op_threads=2, drill=True)
    pool.start()
    assert len(worker_threads()) == 2
    pool.fault_nfe_delay_ns = 10 * MS
    submit(core, request(b"x", 1, nfe=60))
    submit(core, request(b"y", 2, nfe=60))
    assert wait_for(lambda: all(lane.busy for lane in core.lanes_snapshot()), HANG_GUARD_S,
                    0.001), "never happened: both lanes busy"
    pool.stop()
    assert worker_threads() == []
    outs = collect(core, 2)  # in-flight work is answered EXPIRED, not dropped
    assert sorted(o.code for o in outs) == [Code.EXPIRED, Code.EXPIRED]
    assert all(o.nfe_done < 60 for o in outs)
    pool.stop()  # idempotent
    core.close()


def test_crashed_worker_lane_disabled_others_continue(model):
    with make_core(workers=2) as core, WorkerPool(core, model, workers=2, drill=True) as pool:
        pool.fault_nfe_delay_ns = 10 * MS
        submit(core, request(b"c", 1, nfe=50))
        busy = wait_for(
            lambda: [x.lane for x in core.lanes_snapshot() if x.busy and x.nfe_done >= 1],
            HANG_GUARD_S, 0.001,
        )
        assert busy, "never happened: the request running"
        lane = busy[0]
        pool.inject_worker_crash(lane)
        health = wait_for(lambda: (h := pool.poll_health(time.monotonic_ns())).dead and h,
                          HANG_GUARD_S, 0.001)
        assert health, "never happened: the crash seen"
        assert health.dead == [lane] and health.stalled == []
        (lost,) = collect(core, 1)
        assert lost.code == Code.EXPIRED and lost.lane == lane and lost.nfe_done < 50
        assert core.stats().lanes_alive == 1
        assert pool.poll_health(time.monotonic_ns()).dead == [lane]  # reported, disabled once
        pool.fault_nfe_delay_ns = 0
        submit(core, request(b"c2", 2, nfe=4))
        (served,) = collect(core, 1)
        assert served.code == Code.INFERENCE and served.lane == 1 - lane
    assert worker_threads() == []


def test_stalled_worker_reported(model):
    with make_core() as core, \
            WorkerPool(core, model, workers=1, stall_ns=2 * MS, drill=True) as pool:
        pool.fault_nfe_delay_ns = 50 * MS
        submit(core, request(b"s", 1, nfe=6))
        health = wait_for(lambda: (h := pool.poll_health(time.monotonic_ns())).stalled and h,
                          HANG_GUARD_S, 0.001)
        assert health, "never happened: a stall"
        assert health.stalled == [0] and health.dead == []
        pool.fault_nfe_delay_ns = 0
        assert collect(core, 1)[0].code == Code.INFERENCE


class _Log:
    def __init__(self):
        self.lines: list[tuple[str, str]] = []

    def warning(self, msg):
        self.lines.append(("warning", msg))

    def error(self, msg):
        self.lines.append(("error", msg))

    def info(self, msg):
        self.lines.append(("info", msg))


def test_affinity_and_priority_applied_or_warned(model):
    """What worker_info says was applied is what /proc reports for the worker thread; what the
    OS refused (wherever it does) was warned and is a refusal."""
    log = _Log()
    with (
        make_core() as core,
        WorkerPool(core, model, workers=1, cpu_affinity=[0], rt_priority=1, logger=log) as pool,
    ):
        (info,) = pool.worker_info()
        applied = info["applied"]
        state = rt.read_thread(pool.thread_roles.get("worker0").tid)
        warned = " ".join(msg for level, msg in log.lines if level == "warning")
        refused = " ".join(pool.thread_roles.refusals())
        if applied["affinity"] == [0]:
            assert state.cpus == {0}
        else:
            assert "worker0 CPUs 0 refused" in warned and "worker0 CPUs 0 refused" in refused
        if applied["fifo_priority"] == 1:
            assert state.sched_class == "SCHED_FIFO 1"
        else:
            assert "SCHED_FIFO 1 refused" in warned and "SCHED_FIFO 1 refused" in refused
        submit(core, request(b"p", 1, nfe=3))
        assert collect(core, 1)[0].code == Code.INFERENCE


@needs_fifo
@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs")
@pytest.mark.parametrize("loop", ["native", "python"])
def test_worker_pool_threads_get_the_worker_class_and_their_own_cpus(model, loop):
    """intra_op_threads 2, worker_cpu_affinity [a, b]: the worker on a, the one pool thread of
    each ONNX Runtime session it makes on b (session.intra_op_thread_affinities), every thread
    it starts at the worker's SCHED_FIFO priority (pthread inheritance). The Python loop makes
    one session, the native loop one more (its C API session; the first C API environment of
    the process also starts a thread of its own, which stays on the worker's CPU)."""
    a, b = CPUS[0], CPUS[1]
    before = {s.tid for s in rt.process_threads()}
    nfe_loop = "auto" if loop == "native" else "python"
    with (make_core() as core,
          WorkerPool(core, model, workers=1, intra_op_threads=2, cpu_affinity=[a, b],
                     rt_priority=2, nfe_loop=nfe_loop) as pool):  # fmt: skip
        (info,) = pool.worker_info()
        assert info["nfe_loop"] == loop and info["applied"] == {"affinity": [a], "fifo_priority": 2}
        worker = rt.read_thread(pool.thread_roles.get("worker0").tid)
        assert (worker.sched_class, worker.cpus) == ("SCHED_FIFO 2", {a})
        started = [s for s in rt.process_threads() if s.tid not in before | {worker.tid}]
        assert all(s.sched_class == "SCHED_FIFO 2" and s.cpus in ({a}, {b}) for s in started)
        assert len([s for s in started if s.cpus == {b}]) == (2 if loop == "native" else 1)
        assert pool.thread_roles.refusals() == []
        submit(core, request(b"p", 1, nfe=3))
        assert collect(core, 1)[0].code == Code.INFERENCE


@needs_fifo
def test_a_refused_pool_cpu_is_noted_and_the_pool_shares_the_worker_cpu(model):
    log = _Log()
    with (make_core() as core,
          WorkerPool(core, model, workers=1, intra_op_threads=2,
                     cpu_affinity=[CPUS[0], rt.MAX_CPU], nfe_loop="python",
                     logger=log) as pool):  # fmt: skip
        (text,) = pool.thread_roles.refusals()
        assert text.startswith(f"worker0 ONNX Runtime pool CPUs {rt.MAX_CPU} refused (CPU "
                               f"{rt.MAX_CPU}: EINVAL")  # fmt: skip
        assert any(level == "warning" and "running degraded" in msg for level, msg in log.lines)
        submit(core, request(b"p", 1, nfe=3))
        assert collect(core, 1)[0].code == Code.INFERENCE




def test_pool_rejects_mismatched_configuration(model):
    with make_core(workers=2) as core:
        with pytest.raises(ValueError):
            WorkerPool(core, model, workers=1)
        with pytest.raises(ValueError):
            WorkerPool(core, model, workers=2, solver="rk4")
    with make_core(obs_dim=3) as core:
        with pytest.raises(ValueError):
            WorkerPool(core, model, workers=1)


@pytest.mark.parametrize("loop", ["auto", "python"])  # the native loop probes in C
def test_nfe_breakdown_probe_is_off_by_default_and_splits_every_nfe_when_asked(
        model, reference, tmp_path, monkeypatch, loop):
    """The bench-only probe hook (set_nfe_probe_factory, bench/nfe_probe.py): every NFE gets
    five instants on three clocks, written when the worker exits; the probe changes no result."""
    from flowedge_relay import workers
    from flowedge_relay.workers import PROBE_POINTS
    from flowedge_relay_tools.bench.nfe_breakdown import parts
    from flowedge_relay_tools.bench.nfe_probe import probe_factory

    with make_core() as core, WorkerPool(core, model, workers=1) as pool:
        assert all(w.probe is None for w in pool._workers)  # off: nothing allocated or read
    monkeypatch.setattr(workers, "_probe_factory", None)  # restored after the test
    workers.set_nfe_probe_factory(probe_factory(str(tmp_path)))
    with make_core() as core, WorkerPool(core, model, workers=1, nfe_loop=loop) as pool:
        assert pool.worker_info()[0]["nfe_loop"] == ("native" if loop == "auto" else "python")
        submit(core, request(b"a", 1, nfe=8, seed=5))
        submit(core, request(b"a", 2, nfe=4, seed=6))
        outs = collect(core, 2)
    assert [o.actions.tobytes() for o in outs] == [
        reference.sample(OBS[1], 5, 8).tobytes(), reference.sample(OBS[2], 6, 4).tobytes()]
    rows = np.load(tmp_path / "nfe-breakdown-lane0.npy")
    assert rows.shape == (12, len(PROBE_POINTS), 3)
    mono = rows[:, :, 0]
    assert (np.diff(mono, axis=1) >= 0).all() and (np.diff(mono[:, 0]) > 0).all()
    d = parts(rows)
    assert (d["ort_cpu"] > 0).all() and (d["gil_wait"] >= 0).all() and (d["ort_runq"] >= 0).all()
    # the NFE is exactly Python before the run + the run + the solver update
    run = rows[:, 2, 0] - rows[:, 1, 0]
    assert (d["py_before"] + run + d["solver"] == d["nfe"]).all()


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.integers(0, 2**40), min_size=0, max_size=300),
       floats=st.booleans())
def test_p50_p99_is_numpys_percentile(values, floats):
    """The stats timer's one-partition percentiles give np.percentile's own floats."""
    arr = np.asarray(values, np.float64 if floats else np.int64)
    want = tuple(float(v) for v in np.percentile(arr, [50, 99])) if arr.size else (0.0, 0.0)
    assert p50_p99(arr) == want


@pytest.mark.parametrize("nfe_loop", ["auto", "python"])
def test_a_pacing_worker_cedes_between_steps_on_either_loop(model, reference, nfe_loop):
    """docs/design.md §5.3: with a cede every 1 ns of compute, each step after the first is
    preceded by a pause of cede_ns (a sleep: never shorter), counted in ceded_ns and inside the
    request's compute time; the actions are the same bits as without pacing."""
    cede = 20 * MS
    with make_core() as core, WorkerPool(core, model, workers=1, nfe_loop=nfe_loop,
                                         cede_ns=cede, cede_every_ns=1) as pool:
        submit(core, request(b"a", 1, nfe=4, seed=5))
        (out,) = collect(core, 1)
        (info,) = pool.worker_info()
    assert info["nfe_loop"] == ("native" if nfe_loop == "auto" else "python")
    assert out.code == Code.INFERENCE and out.nfe_done == 4
    assert out.actions.tobytes() == reference.sample(OBS[1], 5, 4).tobytes()
    assert info["ceded_ns"] >= 3 * cede and out.compute_ns >= 3 * cede


@pytest.mark.parametrize("nfe_loop", ["auto", "python"])
def test_a_pacing_workers_pauses_stay_out_of_the_block_mean(model, nfe_loop):
    """docs/design.md §5.2 / §5.3: the cost in use prices the pauses (fer_with_cede), so the
    loop tells the core of each one and the block mean leaves it out. A 20 ms pause before each
    of 16 steps would put the block mean at 20 ms or more; without it the block holds the steps'
    compute and what the sleeps overran, far less on any host."""
    cede = 20 * MS
    with make_core(cost_model=CostModel.ADAPTIVE, nfe_ns=1) as core, \
            WorkerPool(core, model, workers=1, nfe_loop=nfe_loop, cede_ns=cede,
                       cede_every_ns=1) as pool:
        submit(core, request(b"a", 1, nfe=17, seed=5))
        (out,) = collect(core, 1)
        (info,) = pool.worker_info()
        k = core.cost_stats(time.monotonic_ns())
    assert out.code == Code.INFERENCE and info["ceded_ns"] >= 16 * cede
    assert 0 < k.block_mean_ns < cede // 2


def test_a_worker_that_never_cedes_counts_nothing(model):
    with make_core() as core, WorkerPool(core, model, workers=1) as pool:
        submit(core, request(b"a", 1, nfe=4))
        collect(core, 1)
        assert pool.worker_info()[0]["ceded_ns"] == 0
    with pytest.raises(ValueError, match="every"):
        WorkerPool(core, model, workers=1, cede_ns=1, cede_every_ns=0)
