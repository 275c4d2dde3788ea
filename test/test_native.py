# SPDX-License-Identifier: Apache-2.0
"""The native NFE loop (csrc/fer_exec.c, flowedge_relay/native.py) with the real C core, the
real ONNX Runtime C library of the onnxruntime wheel and the bundled models.

Bit identity is the contract: the same request through the C loop and through the Python loop
(model.FlowSampler / policy.PolicySampler) gives the same bytes. Timing is never asserted except
as a lower bound the fault delay guarantees.
"""

from __future__ import annotations

import threading
import time
from functools import partial

import numpy as np
import pytest
from core_helpers import make_core
from core_helpers import request as core_request
from flowedge_relay_msgs.msg import ActionMessage as A
from ros_helpers import running_relay, status_values, wait_for

from flowedge_relay import native
from flowedge_relay import policy as P
from flowedge_relay.batch import BATCH_ATOL, BATCH_RTOL
from flowedge_relay.core import Code, Core, CoreError, Decision, Request, Step, ffi
from flowedge_relay.model import (
    FlowSampler,
    default_model_path,
    load_model,
    make_session,
)
from flowedge_relay.workers import WorkerPool
from flowedge_relay_tools.models import bench_model_path
from flowedge_relay_tools.models import detour_task as task

MS = 1_000_000
OBS = task.sample_observations(np.random.default_rng(7), 6)

pytestmark = pytest.mark.skipif(not native.default_library(),
                                reason="the onnxruntime wheel has no libonnxruntime.so")


@pytest.fixture(scope="module")
def small():
    return load_model(default_model_path())


@pytest.fixture(scope="module")
def vision():
    return P.load(P.vision_policy_path())


# sequence and generation 1, noise seed 1, unless told
request = partial(core_request, seq=1, gen=1, seed=1)


class Harness:
    """A native loop, its report buffers and a stop flag, as one worker holds them."""

    def __init__(self, nat: native.NativeLoop) -> None:
        self.nat = nat
        self.ring = np.zeros(64, np.int64)
        self.counters = np.zeros(3, np.uint64)
        self.report = native.Report(self.ring, self.counters)
        self.flag = ffi.new("uint32_t[]", 1)
        self.fault = ffi.new("uint64_t[]", 1)

    def run(self, core: Core, n_rows: int = 1, flags: int = 0) -> int:
        return self.nat.run(core, n_rows, self.flag, self.report, self.fault, flags)


def dispatch(core: Core, req: Request, lane: int = 0):
    assert core.submit(req, time.monotonic_ns()) == Decision.ACCEPTED
    work = core.dispatch(lane, time.monotonic_ns())
    assert work is not None and work.lane == lane
    return work


@pytest.mark.parametrize("path", [default_model_path(), bench_model_path()],
                         ids=["policy_small", "policy_bench"])
@pytest.mark.parametrize("solver", ["euler", "midpoint"])
def test_single_graph_models_bit_identical_to_the_python_loop(path, solver):
    info = load_model(path)
    ref = FlowSampler(make_session(info, 1), info, solver)
    sampler = FlowSampler(make_session(info, 1), info, solver)
    h = Harness(native.NativeLoop(info.model_bytes, native.step_spec(info)))
    assert h.nat.ort_version  # the wheel's library answered
    with make_core(obs_dim=info.obs_dim, action_len=info.action_len) as core:
        for i, nfe in enumerate((1, 2, 5, 10)):  # odd totals end midpoint with one Euler NFE
            expected = ref.sample(OBS[i], 40 + i, nfe)
            work = dispatch(core, request(b"s%d" % i, nfe=nfe, seed=40 + i, obs=OBS[i]))
            sampler.start(work.observation, work.noise_seed, work.remaining_nfe)
            h.nat.load(0, 0, sampler, {"observation": work.observation})
            assert h.run(core) == native.ROWS_ENDED and h.nat.result(0) == Step.DONE
            h.nat.store(0, sampler)
            assert sampler.actions().tobytes() == expected.tobytes(), (solver, nfe)
            assert sampler.remaining == 0
            assert core.finish(0, time.monotonic_ns(), sampler.actions()) == Code.INFERENCE
    h.nat.close()


def test_two_intra_op_threads_bit_identical_too():
    """intra_op_threads > 1 takes the session-config path (no pool spinning) on both sides."""
    info = load_model(bench_model_path())
    ref = FlowSampler(make_session(info, 2), info)
    sampler = FlowSampler(make_session(info, 2), info)
    h = Harness(native.NativeLoop(info.model_bytes, native.step_spec(info), intra_op_threads=2))
    with make_core(obs_dim=info.obs_dim, action_len=info.action_len) as core:
        expected = ref.sample(OBS[3], 17, 6)
        work = dispatch(core, request(b"t2", nfe=6, seed=17, obs=OBS[3]))
        sampler.start(work.observation, work.noise_seed, 6)
        h.nat.load(0, 0, sampler, {"observation": work.observation})
        assert h.run(core) == native.ROWS_ENDED and h.nat.result(0) == Step.DONE
        h.nat.store(0, sampler)
        assert sampler.actions().tobytes() == expected.tobytes()
    h.nat.close()


def test_two_phase_package_step_graph_bit_identical(vision):
    """The prefix runs in Python (its outputs are the context); the steps run natively."""
    ref = P.PolicySampler(vision, P.make_sessions(vision))
    sampler = P.PolicySampler(vision, P.make_sessions(vision))
    spec = native.step_spec(vision)
    assert {s.name for s in spec.statics} >= {c.name for c in vision.context}
    h = Harness(native.NativeLoop(vision.step_graph.data, spec))
    rng = np.random.default_rng(3)
    arrays = {s.name: (rng.integers(0, 256, s.shape) if s.wire_dtype == np.uint8
                       else rng.standard_normal(s.shape)).astype(s.wire_dtype)
              for s in vision.inputs}
    with make_core(obs_dim=0, action_len=vision.action.horizon * vision.action.output_dim,
                   two_phase=1) as core:
        for nfe in (3, 10):
            expected = ref.sample(arrays, 11, nfe)
            P.fill_buffers(vision, sampler.buffers, arrays)
            dispatch(core, request(b"v%d" % nfe, nfe=nfe, obs_dim=0,
                                   obs=np.zeros(0, np.float32)))
            sampler.start(11, nfe)
            sampler.prefix()
            assert core.prefix_done(0, time.monotonic_ns(), 1000) == Step.CONTINUE
            bufs = sampler.buffers.arrays
            statics = {s.name: bufs[s.name] if s.name in bufs else sampler.context_arrays[s.name]
                       for s in spec.statics}
            h.nat.load(0, 0, sampler, statics)
            assert h.run(core) == native.ROWS_ENDED and h.nat.result(0) == Step.DONE
            h.nat.store(0, sampler)
            assert sampler.actions().tobytes() == expected.tobytes(), nfe
            core.finish(0, time.monotonic_ns(), sampler.actions())
    h.nat.close()


def test_stop_flag_is_honoured_before_every_step_and_the_report_is_written(small):
    sampler = FlowSampler(make_session(small, 1), small)
    h = Harness(native.NativeLoop(small.model_bytes, native.step_spec(small)))
    with make_core() as core:
        work = dispatch(core, request(b"a", nfe=6))
        sampler.start(work.observation, work.noise_seed, 6)
        h.nat.load(0, 0, sampler, {"observation": work.observation})
        h.flag[0] = 1
        assert h.run(core) == native.STOPPED  # before the first step: nothing ran
        assert core.lanes_snapshot()[0].nfe_done == 0 and h.counters[0] == 0
        h.flag[0] = 0
        for k in (1, 2):  # ONE_STEP hands control back at each boundary
            assert h.run(core, flags=native.ONE_STEP) == native.YIELDED
            assert core.lanes_snapshot()[0].nfe_done == k and h.counters[0] == k
            assert h.nat.rows[0].next == k and h.nat.result(0) == Step.CONTINUE
        assert h.counters[1] > 0 and (h.ring[:2] > 0).all() and (h.ring[2:] == 0).all()
        # raised from another thread while it runs: it returns at the next boundary
        h.fault[0] = 30 * MS
        threading.Timer(0.045, lambda: h.flag.__setitem__(0, 1)).start()
        assert h.run(core) == native.STOPPED
        done = core.lanes_snapshot()[0].nfe_done
        assert 3 <= done < 6 and h.counters[0] == done
        assert (h.ring[2:done] >= 30 * MS).all()  # the fault delay is inside each NFE
        h.flag[0], h.fault[0] = 0, 0
        assert h.run(core) == native.ROWS_ENDED and h.nat.result(0) == Step.DONE
        assert h.counters[0] == 6 == core.stats().nfe_total
    h.nat.close()


def test_rows_end_one_by_one_with_their_own_result_through_the_core(small):
    """Three rows on three lanes (the n_rows API): one is cancelled by a newer generation, one
    runs to DONE, one expires; each comes back with its own result while the others go on."""
    samplers = [FlowSampler(make_session(small, 1), small) for _ in range(3)]
    h = Harness(native.NativeLoop(small.model_bytes, native.step_spec(small), max_rows=3))
    with make_core(workers=3) as core:
        deadline = time.monotonic_ns() + 250 * MS
        reqs = [request(b"exp", nfe=40, deadline=deadline),
                request(b"ok", nfe=4, seed=5, obs=OBS[1]), request(b"old", nfe=40)]
        for lane, (req, s) in enumerate(zip(reqs, samplers, strict=True)):
            work = dispatch(core, req, lane)
            s.start(work.observation, work.noise_seed, work.remaining_nfe)
            h.nat.load(lane, lane, s, {"observation": work.observation})
        h.fault[0] = 20 * MS
        assert h.run(core, 3, flags=native.ONE_STEP) == native.YIELDED  # every row stepped once
        assert core.submit(request(b"old", seq=2, gen=2, nfe=1),
                           time.monotonic_ns()) == Decision.ACCEPTED
        assert h.run(core, 3) == native.ROWS_ENDED  # the next boundary
        assert [h.nat.result(r) for r in range(3)] == [Step.CONTINUE] * 2 + [Step.STOP_STALE]
        assert h.run(core, 2) == native.ROWS_ENDED  # rows 0 and 1 go on, row 2 is gone
        assert [h.nat.result(0), h.nat.result(1)] == [Step.CONTINUE, Step.DONE]
        h.nat.store(1, samplers[1])
        assert core.finish(1, time.monotonic_ns(), samplers[1].actions()) == Code.INFERENCE
        assert h.run(core, 1) == native.ROWS_ENDED and h.nat.result(0) == Step.STOP_EXPIRED
        outs = {o.session_id: o for o in core.pop_outcomes()}
        assert outs[b"old"].code == Code.REJECTED_STALE and outs[b"old"].nfe_done == 2
        assert outs[b"exp"].code == Code.EXPIRED and outs[b"exp"].finish_ns >= deadline
        ok = outs[b"ok"]
        assert ok.code == Code.INFERENCE and ok.nfe_done == 4
        # batched runs may round differently from batch 1 (other GEMM kernels): close, not equal
        single = FlowSampler(make_session(small, 1), small).sample(OBS[1], 5, 4)
        np.testing.assert_allclose(ok.actions, single, rtol=1e-4, atol=1e-5)
        assert h.counters[0] == core.stats().nfe_total
    h.nat.close()


def test_join_flag_returns_at_a_boundary_only_with_a_free_row_and_queued_work(small):
    """FER_EXEC_JOIN: with work queued and a free row the run returns JOINABLE after one step
    (never before the first: every call makes progress); with every row taken it runs on."""
    sampler = FlowSampler(make_session(small, 1), small)
    h = Harness(native.NativeLoop(small.model_bytes, native.step_spec(small), max_rows=2))
    with make_core(workers=2) as core:
        work = dispatch(core, request(b"a", nfe=6))
        sampler.start(work.observation, work.noise_seed, 6)
        h.nat.load(0, 0, sampler, {"observation": work.observation})
        assert h.run(core, 1, flags=native.JOIN) == native.ROWS_ENDED  # none queued: to the end
        assert h.nat.result(0) == Step.DONE
        core.finish(0, time.monotonic_ns(), np.zeros(16, np.float32))
        work = dispatch(core, request(b"b", nfe=6))
        sampler.start(work.observation, work.noise_seed, 6)
        h.nat.load(0, 0, sampler, {"observation": work.observation})
        assert core.submit(request(b"c", nfe=4), time.monotonic_ns()) == Decision.ACCEPTED
        assert h.run(core, 1, flags=native.JOIN) == native.JOINABLE
        assert h.nat.rows[0].next == 1 and core.queued() == 1  # one step, then back
        second = core.dispatch(1, time.monotonic_ns())
        sampler.start(second.observation, second.noise_seed, 4)
        h.nat.load(1, 1, sampler, {"observation": second.observation})
        assert core.submit(request(b"d", nfe=2), time.monotonic_ns()) == Decision.ACCEPTED
        assert h.run(core, 2, flags=native.JOIN) == native.ROWS_ENDED  # full: on until one ends
        assert h.nat.rows[0].next == 5 and h.nat.result(1) == Step.DONE
        assert h.counters[2] == 6 + 1 + 4 and h.counters[0] == 6 + 1 + 2 * 4  # steps, NFEs
        assert list(h.ring[:11] > 0) == [True] * 11 and h.ring[11] == 0  # one entry a step
    h.nat.close()


def test_expiry_mid_loop_single_row(small):
    sampler = FlowSampler(make_session(small, 1), small)
    h = Harness(native.NativeLoop(small.model_bytes, native.step_spec(small)))
    with make_core() as core:
        deadline = time.monotonic_ns() + 100 * MS
        work = dispatch(core, request(b"d", nfe=30, deadline=deadline))
        sampler.start(work.observation, work.noise_seed, 30)
        h.nat.load(0, 0, sampler, {"observation": work.observation})
        h.fault[0] = 10 * MS
        assert h.run(core) == native.ROWS_ENDED and h.nat.result(0) == Step.STOP_EXPIRED
        (out,) = core.pop_outcomes()
        assert out.code == Code.EXPIRED and out.finish_ns >= deadline
        assert 1 <= out.nfe_done < 30 and out.nfe_done == h.counters[0]
    h.nat.close()


def test_time_runs_is_the_step_call_alone_over_exactly_its_rows(small):
    """The bench's model-call timer (fer_exec_time_runs) makes the Run a step makes and nothing
    else: the velocities of its rows are the Python session's for the same inputs, bit for bit,
    the rows beyond n and the solver state are untouched, no core is needed, one duration per
    run; row counts outside 1..max_rows are refused."""
    rng = np.random.default_rng(3)
    spec = native.step_spec(small)
    bufs = native.RowBuffers.zeros(spec, 4)
    bufs.x[...] = rng.standard_normal(bufs.x.shape, np.float32)
    bufs.t[...] = rng.random(bufs.t.shape, np.float32)
    bufs.statics["observation"][...] = OBS[:4]
    nat = native.NativeLoop(small.model_bytes, spec, max_rows=4, buffers=bufs)
    bufs.v[...] = 0  # create ran every row count once (ORT's first runs)
    try:
        ns = nat.time_runs(3, 5)
        assert ns.shape == (5,) and ns.dtype == np.uint64 and (ns > 0).all()
        (want,) = make_session(small, 1).run(None, {
            "x": bufs.x[:3], "t": bufs.t[:3], "observation": bufs.statics["observation"][:3]})
        assert bufs.v[:3].tobytes() == want.tobytes()
        assert not bufs.v[3].any() and not bufs.state.any()
        for bad in (0, 5):
            with pytest.raises(native.NativeError, match="invalid"):
                nat.time_runs(bad, 1)
    finally:
        nat.close()
    with pytest.raises(native.NativeError, match="closed"):
        nat.time_runs(1, 1)


def test_a_wrong_library_path_is_a_clear_error_and_the_pool_falls_back(small):
    with pytest.raises(native.NativeUnavailable, match="cannot load ONNX Runtime from /nonexist"):
        native.NativeLoop(small.model_bytes, native.step_spec(small), library="/nonexistent.so")
    with pytest.raises(native.NativeUnavailable, match="OrtGetApiBase"):  # a library, not ORT
        native.NativeLoop(small.model_bytes, native.step_spec(small), library="libm.so.6")
    with pytest.raises(native.NativeUnavailable, match="session"):  # ORT refuses the bytes
        native.NativeLoop(b"not a model", native.step_spec(small))
    ref = FlowSampler(make_session(small, 1), small).sample(OBS[0], 9, 5)
    with make_core() as core, WorkerPool(core, small, ort_library="/nonexistent.so") as pool:
        (info,) = pool.worker_info()
        assert info["nfe_loop"] == "python" and "/nonexistent.so" in info["nfe_loop_note"]
        assert core.submit(request(b"f", nfe=5, seed=9, obs=OBS[0]), time.monotonic_ns()) == 0
        core.wait_outputs(10_000 * MS)
        (out,) = core.pop_outcomes()
        assert out.code == Code.INFERENCE and out.actions.tobytes() == ref.tobytes()


def _vision_rows(vision, slots: int):
    from flowedge_relay.batch import BatchRows, RowSpec
    return BatchRows(RowSpec.of(vision, vision.solver), P.make_sessions(vision), slots, 16)


@pytest.mark.parametrize("slots, joins", [(1, [(0, 1)]), (4, [(0, 4)]), (4, [(0, 1), (1, 3)]),
                                          (4, [(0, 2), (2, 1), (3, 1)])])
def test_native_prefix_pass_bit_identical_to_the_python_prefix(vision, slots, joins):
    """fer_pass over the joining rows writes the same context bytes as the Python ORT prefix,
    batched the same way (B = 1 and B = 4 joins, all at once or in groups), other rows kept."""
    py, nat = _vision_rows(vision, slots), _vision_rows(vision, slots)
    nat.attach_prefix(native.PrefixPass(vision.graphs["prefix"].data, nat.prefix_in,
                                        nat.context, max_rows=slots))
    rng = np.random.default_rng(5)
    lanes = iter(range(slots))
    for first, count in joins:
        for _ in range(count):
            arrays = {s.name: (rng.integers(0, 256, s.shape) if s.wire_dtype == np.uint8
                               else rng.standard_normal(s.shape)).astype(s.wire_dtype)
                      for s in vision.inputs}
            buf = P.InputBuffers(vision)
            P.fill_buffers(vision, buf, arrays)
            lane = next(lanes)
            py.join(lane, -1, lane, 4, buf)
            nat.join(lane, -1, lane, 4, buf)
        before = {k: v.copy() for k, v in nat.context.items()}
        py.prefix(first, count)
        nat.prefix(first, count)
        for name, rows in py.context.items():
            held = slice(0, first + count)  # creating the pass ran it over every row
            assert rows[held].tobytes() == nat.context[name][held].tobytes(), (name, first)
            assert rows[first:first + count].any(), name
            others = np.r_[0:first, first + count:slots]
            assert nat.context[name][others].tobytes() == before[name][others].tobytes()
    nat.native_prefix.close()


def _vision_arrays(vision, rng) -> dict[str, np.ndarray]:
    return {s.name: (rng.integers(0, 256, s.shape) if s.wire_dtype == np.uint8
                     else rng.standard_normal(s.shape)).astype(s.wire_dtype)
            for s in vision.inputs}  # fmt: skip


def test_boundary_in_one_native_call_reports_like_the_python_boundary(vision):
    """BatchRows.prefix_done: the native boundary (fer_pass_run_done: the pass timed in C, then
    Core.prefix_done per joiner, one call) gives the Python boundary's results, contexts and
    outcomes: a joiner whose deadline passed during the wait is EXPIRED there, before any NFE,
    and its row-mate carries on."""
    cfg = dict(workers=1, obs_dim=0, action_len=vision.action_len, two_phase=1, batch_slots=2)
    rng = np.random.default_rng(11)
    arrays = [_vision_arrays(vision, rng) for _ in range(2)]
    seen = []
    for use_native in (False, True):
        rows = _vision_rows(vision, 2)
        if use_native:
            rows.attach_prefix(native.PrefixPass(vision.graphs["prefix"].data, rows.prefix_in,
                                                 rows.context, max_rows=2))
        with make_core(**cfg) as core:
            now = time.monotonic_ns()
            for i, deadline in enumerate((0, now + 20 * MS)):
                req = request(b"b%d" % i, nfe=4, seed=i, deadline=deadline, obs_dim=0)
                assert core.submit(req, now) == Decision.ACCEPTED
            for i in range(2):
                work = core.dispatch_worker(0, time.monotonic_ns())
                buf = P.InputBuffers(vision)
                P.fill_buffers(vision, buf, arrays[i])
                rows.join(work.lane, -1, work.noise_seed, 4, buf)
            time.sleep(0.03)  # b1's deadline passes before the boundary (EDF: b1 is row 0)
            end, pass_ns, results = rows.prefix_done(core, 0, 2)
            assert 0 < pass_ns < 10**9 and end <= time.monotonic_ns()
            assert [Step(int(r)) for r in results] == [Step.STOP_EXPIRED, Step.CONTINUE]
            (out,) = core.pop_outcomes()
            assert out.code == Code.EXPIRED and out.nfe_done == 0 and out.session_id == b"b1"
            seen.append({k: v[1].tobytes() for k, v in rows.context.items()})
        if use_native:
            rows.native_prefix.close()
    assert seen[0] == seen[1]


def test_native_prefix_pass_checks_its_arguments(vision):
    rows = _vision_rows(vision, 2)
    p = native.PrefixPass(vision.graphs["prefix"].data, rows.prefix_in, rows.context, max_rows=2)
    for first, count in ((0, 0), (0, 3), (1, 2), (2, 1)):
        with pytest.raises(native.NativeError, match="status"):
            p.run(first, count)
    with make_core(obs_dim=0, action_len=vision.action_len, two_phase=1) as core:
        with pytest.raises(CoreError):
            p.run_done(core, np.array([0], np.uint32), 0)  # lane 0 holds no work
    p.close()
    with pytest.raises(native.NativeError, match="closed"):
        p.run(0, 1)
    with pytest.raises(native.NativeUnavailable, match="Invalid input name"):
        native.PrefixPass(vision.step_graph.data, rows.prefix_in, rows.context, max_rows=2)
    with pytest.raises(native.NativeUnavailable, match="at most"):
        native.PrefixPass(vision.graphs["prefix"].data, rows.prefix_in, rows.context,
                          max_rows=65)


def test_pool_runs_native_by_default_and_python_when_asked(small, vision):
    with make_core() as core, WorkerPool(core, small) as pool:
        assert pool.worker_info()[0]["nfe_loop"] == "native"
    with make_core() as core, WorkerPool(core, small, nfe_loop="python") as pool:
        assert pool.worker_info()[0]["nfe_loop"] == "python"
    with pytest.raises(ValueError, match="nfe_loop"):
        WorkerPool(make_core(), small, nfe_loop="fast")


def test_parameter_table_and_pool_agree_on_the_loops():
    from flowedge_relay import parameters, workers

    assert parameters.NFE_LOOPS == workers.NFE_LOOPS
    assert parameters.check_value("nfe_loop", "fast") and not parameters.check_value(
        "nfe_loop", "python")


@pytest.mark.ros
@pytest.mark.parametrize(("loop", "slots"), [("auto", 1), ("python", 1), ("auto", 4)])
def test_relay_over_dds_answers_every_valid_request_exactly_once(loop, slots):
    """The real node: the workers diagnostic says which loop runs; 60 requests (INFERENCE,
    EXPIRED on arrival, REJECTED_STALE) each get exactly one answer, the inferences
    bit-identical to the Python sampler (batch_slots 4: within the batch tolerance)."""
    info = load_model(default_model_path())
    ref = FlowSampler(make_session(info, 1), info)
    n = 60
    with running_relay(nfe_loop=loop, workers=2, batch_slots=slots) as h:
        def build(i: int):
            if i % 10 == 9:  # generation 1 after generation 2 of the same session: stale
                return h.request(session_id="s0", sequence=i, generation=1, remaining_nfe=2)
            return h.request(session_id=f"s{i % 3}", sequence=i, generation=2,
                             remaining_nfe=1 + i % 7, noise_seed=i,
                             deadline_ms=-1 if i % 10 == 4 else 10_000)

        h.send(build(0))
        assert h.answer_for(0).code == A.INFERENCE
        for start in range(1, n, 20):
            stop = min(start + 20, n)
            h.send(*[build(i) for i in range(start, stop)])
            assert wait_for(lambda s=stop: h.node.relay.counters().received >= s, 30)
        h.wait_answers(n, timeout=60)
        time.sleep(0.3)  # room for an answer too many
        answers = h.answers()
        workers_status = status_values(h.latest_status("workers"))
        requests = {i: build(i) for i in range(n)}
    assert workers_status["nfe_loop"] == ("native" if loop == "auto" else "python")
    assert sorted(a.sequence for a in answers) == list(range(n))
    codes = {a.sequence: a.code for a in answers}
    assert all(codes[i] == A.REJECTED_STALE for i in range(9, n, 10))
    assert all(codes[i] == A.EXPIRED for i in range(4, n, 10))
    for a in answers:
        if a.code == A.INFERENCE:
            obs = np.asarray(requests[a.sequence].observation, np.float32)
            expected = ref.sample(obs, a.sequence, 1 + a.sequence % 7)
            got = np.asarray(a.actions, np.float32)
            if slots == 1:
                assert got.tobytes() == expected.tobytes()
            else:
                np.testing.assert_allclose(got, expected, rtol=BATCH_RTOL, atol=BATCH_ATOL)
