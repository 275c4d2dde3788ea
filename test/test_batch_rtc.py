# SPDX-License-Identifier: Apache-2.0
"""Real-time chunking in the relay's rows (batch.BatchRows, docs/design.md §5.4): each row is
conditioned exactly as the evaluation's reference solver
(flowedge_relay_tools.rtc_rollout.RtcSampler, rtc.py's arithmetic) conditions it, alone or batched
with other rows, and its frozen rows are the prefix. The same for a package (policy_rtc, both modes)
and a single .onnx flow policy (the bundled policy_small, inpaint: its observation in the core's
rows, its prefix in the slot payload)."""

from __future__ import annotations

import numpy as np
import pytest

from flowedge_relay import policy as P
from flowedge_relay.batch import BATCH_ATOL, BATCH_RTOL, BatchRows, RowSpec
from flowedge_relay.core import Code
from flowedge_relay.model import default_model_path
from flowedge_relay.rtc import RtcSpec
from flowedge_relay.rtc import resolve as resolve_rtc
from flowedge_relay.serving import model_of
from flowedge_relay_tools import rtc_rollout as rr

NFE = 10


@pytest.fixture(scope="module")
def rtc_policy():
    return P.load(rr.rtc_policy_path())


@pytest.fixture(scope="module")
def reference():
    return rr.RtcSampler(rr.load_rtc_policy().session)


@pytest.fixture(scope="module")
def small():
    """The bundled single-file flow policy (the relay's default model) and its reference."""
    policy = P.load(default_model_path())
    return policy, rr.RtcSampler(P.make_session(policy.graphs["velocity"].data, 1))


def _spec(policy, mode: str) -> RtcSpec:
    """What the relay serves for rtc_mode `mode` (rtc.resolve, as serving.rtc_of calls it)."""
    spec = resolve_rtc(policy.rtc, mode, package=policy.kind != "onnx", solver="euler",
                       horizon=policy.action_horizon)
    assert spec is not None and spec.mode == mode
    return spec


def _rows(policy, mode: str, slots: int) -> BatchRows:
    """Rows as a worker makes them: a package from its manifest, a single file as ModelInfo."""
    model = model_of(policy)
    spec = RowSpec.of(model, policy.solver, _spec(policy, mode))
    sessions = (P.make_sessions(policy, 1, P.DEFAULT_PROVIDERS) if policy.kind != "onnx"
                else {"velocity": P.make_session(policy.graphs["velocity"].data, 1)})
    return BatchRows(spec, sessions, slots, 64)


def _requests(n: int, seed: int = 7, obs_dim: int = 6):
    g = np.random.default_rng(seed)
    obs = g.standard_normal((n, obs_dim)).astype(np.float32)
    prefixes = [g.standard_normal(16).astype(np.float32) for _ in range(n)]
    return obs, prefixes


def _run(rows: BatchRows, obs, seeds, prefixes, frozen) -> list[np.ndarray]:
    for i in range(len(obs)):
        rows.join(i, -1, int(seeds[i]), NFE, obs[i], int(frozen[i]), prefixes[i])
    for _ in range(NFE):
        rows.run()
    return [rows.actions(r).copy() for r in range(rows.n)]


@pytest.mark.parametrize("mode", ["training_time", "inpaint"])
@pytest.mark.parametrize("d", [0, 1, 3, 4])
def test_one_row_is_the_reference_solver_bit_for_bit(rtc_policy, reference, mode, d):
    obs, prefixes = _requests(1)
    (got,) = _run(_rows(rtc_policy, mode, 1), obs, [11], prefixes, [d])
    want = reference.sample(obs, np.array([11]), NFE, mode, prefixes, d)[0]
    assert got.tobytes() == want.tobytes()
    assert got[: 2 * d].tobytes() == prefixes[0][: 2 * d].tobytes()


@pytest.mark.parametrize("d", [0, 1, 4, 7])
def test_a_single_file_row_is_the_reference_solver_bit_for_bit(small, d):
    """inpaint on a single .onnx flow policy: up to horizon - 1 = 7 rows frozen (no rtc: block)."""
    policy, ref = small
    assert _spec(policy, "inpaint").max_delay == 7
    obs, prefixes = _requests(1, obs_dim=4)
    (got,) = _run(_rows(policy, "inpaint", 1), obs, [11], prefixes, [d])
    want = ref.sample(obs, np.array([11]), NFE, "inpaint", prefixes, d)[0]
    assert got.tobytes() == want.tobytes()
    assert got[: 2 * d].tobytes() == prefixes[0][: 2 * d].tobytes()


@pytest.mark.parametrize("case", ["training_time", "inpaint", "single file"])
def test_batched_rows_condition_each_row_by_its_own_delay(rtc_policy, reference, small, case):
    policy, ref, mode = ((*small, "inpaint") if case == "single file"
                         else (rtc_policy, reference, case))
    frozen = [0, 4, 2]
    obs, prefixes = _requests(3, seed=9, obs_dim=policy.inputs[0].shape[0])
    seeds = np.array([3, 4, 5])
    got = _run(_rows(policy, mode, 4), obs, seeds, prefixes, frozen)
    for i, d in enumerate(frozen):
        want = ref.sample(obs[i:i + 1], seeds[i:i + 1], NFE, mode, [prefixes[i]], d)[0]
        assert got[i][: 2 * d].tobytes() == prefixes[i][: 2 * d].tobytes()
        np.testing.assert_allclose(got[i], want, rtol=BATCH_RTOL, atol=BATCH_ATOL)


def test_a_row_that_leaves_keeps_the_others_conditioning(rtc_policy, reference):
    """A leave moves the last row into the freed one: its prefix, x(0) and d move with it."""
    obs, prefixes = _requests(3, seed=5)
    seeds, frozen = np.array([1, 2, 3]), [1, 0, 3]
    rows = _rows(rtc_policy, "inpaint", 3)
    for i in range(3):
        rows.join(i, -1, int(seeds[i]), NFE, obs[i], frozen[i], prefixes[i])
    rows.run()
    rows.leave(0)  # row 2 (d = 3) moves into row 0
    for _ in range(NFE - 1):
        rows.run()
    got = rows.actions(0).copy()
    want = reference.sample(obs[2:3], seeds[2:3], NFE, "inpaint", [prefixes[2]], 3)[0]
    assert got[:6].tobytes() == prefixes[2][:6].tobytes()
    np.testing.assert_allclose(got, want, rtol=BATCH_RTOL, atol=BATCH_ATOL)


# ---- through a real core and worker pool: the C serve loop and the Python loop ----------------


def _serve_prefixes(policy, mode: str, loop: str, slots: int, rows_of: list[int]):
    """Requests with rows_of[i] prefix rows through a core with admission off (so d is the
    window's end, min(rows, max_delay): no timing in it) and a pool on `loop`, set up as
    serving.Serving sets them up: a package's inputs and prefix in the slot payload, a single
    file's observation in the core's rows and its prefix alone in the payload. Returns outcomes
    by sequence, each request's (observation, prefix), and the worker info."""
    import dataclasses
    import time

    from core_helpers import collect, make_core, request

    from flowedge_relay.core import Decision
    from flowedge_relay.workers import SlotInputs, WorkerPool

    spec = _spec(policy, mode)
    single = policy.kind == "onnx"
    layout = P.payload_layout(policy, rtc=True)
    sent = {}
    with make_core(batch_slots=slots, obs_dim=policy.obs_dim, action_len=16, queue_capacity=64,
                   payload_bytes=layout.nbytes, rtc_max_delay=spec.max_delay) as core:
        inputs = SlotInputs(policy, core.payload_view, spec)
        pool = WorkerPool(core, model_of(policy), slot_inputs=inputs, nfe_loop=loop)
        obs, prefixes = _requests(len(rows_of), seed=13, obs_dim=policy.inputs[0].shape[0])
        now = time.monotonic_ns()
        start = now + 60_000_000_000  # the windows end a minute from now: nothing expires
        for i, rows in enumerate(rows_of):
            slot = core.staging_slot()
            if not single:
                P.fill_buffers(policy, inputs[slot], {"observation": obs[i]})
            inputs.prefix(slot)[: 2 * rows] = prefixes[i][: 2 * rows]
            r = request(b"s%d" % i, i, nfe=NFE, obs=obs[i] if single else np.zeros(0, np.float32))
            r = dataclasses.replace(r, prefix_rows=rows, prefix_start_ns=start,
                                    prefix_start_ros_ns=7, action_period_ns=PERIOD_NS)
            assert core.submit(r, now) == Decision.ACCEPTED
            sent[i] = (obs[i], prefixes[i])
        pool.start()
        try:
            got = collect(core, len(rows_of))
            info = pool.worker_info()
        finally:
            pool.stop()
    return {o.sequence: o for o in got}, sent, info, spec.max_delay


PERIOD_NS = 20_000_000


@pytest.mark.parametrize("case", ["training_time", "inpaint", "single file"])
@pytest.mark.parametrize("loop", ["auto", "python"])
def test_the_worker_loops_answer_with_the_reference_rows(rtc_policy, reference, small, case,
                                                          loop):
    """One slot: each loop's answer is the reference solver's bit for bit (auto: the C serve
    loop; its d is min(rows, max_delay) with admission off). Four slots: within the batch
    tolerance, the frozen rows exact, each answer carrying its own d and the echoed start.
    "single file": the default model (a single .onnx) with inpaint, max_delay horizon - 1."""
    policy, ref, mode = ((*small, "inpaint") if case == "single file"
                         else (rtc_policy, reference, case))
    rows_of = [0, 1, 3, 4, 6, 8, 2, 5, 7]
    for slots in (1, 4):
        outs, sent, info, max_delay = _serve_prefixes(policy, mode, loop, slots, rows_of)
        assert info[0]["nfe_loop"] == ("native" if loop == "auto" else "python"), info
        for i, rows in enumerate(rows_of):
            o, d = outs[i], min(rows, max_delay)
            obs, prefix = sent[i]
            assert o.code == Code.INFERENCE, (slots, i, o.code)
            assert (o.frozen_rows, o.chunk_start_ros_ns) == (d, 7 if rows else 0)
            assert o.actions[: 2 * d].tobytes() == prefix[: 2 * d].tobytes()
            want = ref.sample(obs[None], np.array([i]), NFE, mode, [prefix], d)[0]
            if slots == 1:
                assert o.actions.tobytes() == want.tobytes(), (slots, i)
            else:
                np.testing.assert_allclose(o.actions, want, rtol=BATCH_RTOL, atol=BATCH_ATOL)
