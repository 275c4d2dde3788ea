# SPDX-License-Identifier: Apache-2.0
"""The worker's request cycle in C (csrc/fer_serve.h, native.Serve) with the real core and models.

Its results are checked bit for bit against the batch-1 samplers by test_batch.py and
test_native.py (every pool with nfe_loop auto serves through it); here: the time grid against
model.integrator_plan, that a request is served while this thread holds the GIL, the counters the
supervisor reads, and stop / crash with rows held.
"""

from __future__ import annotations

import sys
import time
from functools import partial

import numpy as np
import pytest
from core_helpers import HANG_GUARD_S, MS, collect, make_core, wait_for
from core_helpers import request as core_request
from hypothesis import given, settings
from hypothesis import strategies as st

from flowedge_relay import native
from flowedge_relay import policy as P
from flowedge_relay.core import Code, Decision, ffi, lib
from flowedge_relay.model import SOLVERS, default_model_path, integrator_plan, load_model
from flowedge_relay.workers import SlotInputs, WorkerPool


@pytest.fixture(scope="module")
def small():
    return load_model(default_model_path())


OBS = np.repeat(0.1 * np.arange(64)[:, None], 4, axis=1).astype(np.float32)  # row i: 0.1 i
core_of = partial(make_core, batch_slots=2)  # two slots unless told
request = partial(core_request, gen=1, obs=OBS)  # generation 1, observation OBS[seq]


@settings(max_examples=200, deadline=None)
@given(solver=st.sampled_from(SOLVERS), sign=st.sampled_from([1, -1]),
       total=st.integers(1, 700))
def test_plan_is_the_integrators_float32_for_float32(solver, sign, total):
    times = np.zeros(total, np.float32)
    kinds = np.zeros(total, np.int8)
    dt, half = ffi.new("float *"), ffi.new("float *")
    rc = lib.fer_plan_fill(native.SOLVER_CODES[solver], sign, total,
                           ffi.cast("float *", times.ctypes.data),
                           ffi.cast("int8_t *", kinds.ctypes.data), dt, half)
    assert rc == 0
    want_t, want_k, want_dt = integrator_plan(solver, np.float32(sign), total)
    assert times.tobytes() == want_t.tobytes() and (kinds == want_k).all()
    assert np.float32(dt[0]).tobytes() == want_dt.tobytes()
    assert np.float32(half[0]).tobytes() == np.float32(want_dt / 2).tobytes()


def test_plan_checks_its_arguments():
    t, k = ffi.new("float[]", 4), ffi.new("int8_t[]", 4)
    dt, half = ffi.new("float *"), ffi.new("float *")
    assert lib.fer_plan_fill(0, 1, 0, t, k, dt, half) == lib.FER_EINVAL  # no NFE
    assert lib.fer_plan_fill(2, 1, 4, t, k, dt, half) == lib.FER_EINVAL  # no such solver
    assert lib.fer_plan_fill(0, 0, 4, t, k, dt, half) == lib.FER_EINVAL  # no direction
    assert lib.fer_plan_fill(0, 1, 4, ffi.NULL, k, dt, half) == lib.FER_EINVAL


def test_a_request_is_served_while_this_thread_holds_the_gil(small):
    """Dispatch, join, steps and answer need no GIL: this thread spins in pure Python (which
    never releases the GIL by itself within the switch interval, set far beyond the guard) until
    the worker has computed and answered the request; a worker that needed the GIL would be
    stuck until the guard fails the test."""
    with core_of() as core, WorkerPool(core, small) as pool:
        w = pool._workers[0]
        assert w.serve is not None and pool.worker_info()[0]["nfe_loop"] == "native"
        interval = sys.getswitchinterval()
        sys.setswitchinterval(100.0)
        try:
            assert core.submit(request(b"s1", 1, nfe=6),
                               time.monotonic_ns()) == Decision.ACCEPTED
            guard = time.monotonic() + HANG_GUARD_S / 3
            while not (w.counters[0] == 6 and w.counters[3] == 0) and time.monotonic() < guard:
                pass
            served = bool(w.counters[0] == 6 and w.counters[3] == 0)
        finally:
            sys.setswitchinterval(interval)
        assert served, f"NFEs {w.counters[0]}, rows held {w.counters[3]}"
        (out,) = collect(core, 1)
        assert out.code == Code.INFERENCE and out.nfe_done == 6


def test_counters_show_the_rows_held_and_return_to_zero(small):
    """slots_in_use (the diagnostic's) is the serve's row count, written by C as it changes."""
    with core_of(batch_slots=2, max_nfe=512) as core, \
            WorkerPool(core, small, fault_nfe_delay_ns=2 * MS, drill=True) as pool:
        for seq in (1, 2):
            assert core.submit(request(b"s%d" % seq, seq, nfe=400),
                               time.monotonic_ns()) == Decision.ACCEPTED
        assert wait_for(lambda: pool.batch_stats()["slots_in_use"] == [2], HANG_GUARD_S,
                        0.001), pool.batch_stats()
        assert pool.inflight_ns(time.monotonic_ns()) >= 0 and pool._workers[0].holding
        core.submit(request(b"s1", 3, nfe=1, gen=2), time.monotonic_ns())  # cancels seq 1
        core.submit(request(b"s2", 4, nfe=1, gen=2), time.monotonic_ns())  # cancels seq 2
        got = {o.sequence: o.code for o in collect(core, 4)}
        assert got == {1: Code.REJECTED_STALE, 2: Code.REJECTED_STALE, 3: Code.INFERENCE,
                       4: Code.INFERENCE}
        assert wait_for(lambda: pool.batch_stats()["slots_in_use"] == [0], HANG_GUARD_S,
                        0.001), pool.batch_stats()


def test_stop_with_rows_held_answers_each_of_them_expired(small):
    with core_of(batch_slots=4) as core:
        pool = WorkerPool(core, small, fault_nfe_delay_ns=5 * MS, drill=True)
        pool.start()
        for seq in range(3):
            assert core.submit(request(b"s%d" % seq, seq, nfe=60),
                               time.monotonic_ns()) == Decision.ACCEPTED
        assert wait_for(lambda: pool.batch_stats()["slots_in_use"] == [3], HANG_GUARD_S,
                        0.001), pool.batch_stats()
        pool.stop()
        got = collect(core, 3)
        assert sorted(o.sequence for o in got) == [0, 1, 2]
        assert {o.code for o in got} == {Code.EXPIRED}


def test_the_prefix_passes_are_counted_for_a_two_phase_package():
    vision = P.load(P.vision_policy_path())
    layout = P.payload_layout(vision)
    with core_of(obs_dim=0, two_phase=1, payload_bytes=layout.nbytes,
                 action_len=vision.action.horizon * vision.action.output_dim) as core:
        slots = SlotInputs(vision, core.payload_view)
        with WorkerPool(core, vision, slot_inputs=slots) as pool:
            assert pool._workers[0].serve is not None
            for seq in range(3):
                P.fill_buffers(vision, slots[core.staging_slot()],
                               {"image": np.zeros((2, 32, 32), np.uint8),
                                "state": np.zeros(2, np.float32)})
                r = request(b"s%d" % seq, seq, nfe=4, obs=np.zeros(0, np.float32))
                assert core.submit(r, time.monotonic_ns()) == Decision.ACCEPTED
            got = collect(core, 3)
            assert {o.code for o in got} == {Code.INFERENCE}
            assert 1 <= pool.prefix_count() <= 3  # joiners share a pass
            p50, _, n = pool.prefix_percentiles()
            assert n == pool.prefix_count() and p50 > 0


def test_create_and_run_check_their_arguments(small):
    """fer_serve_create refuses a config that breaks its invariants (nothing made), and
    fer_serve_run a core it does not fit (batch_slots, action_len), before touching anything."""
    loop = native.NativeLoop(small.model_bytes, native.step_spec(small), max_rows=2)
    counters, ring = np.zeros(5, np.uint64), np.zeros(8, np.int64)
    index = np.arange(16, dtype=np.uint32)

    def config(**change):
        c = ffi.new("struct fer_serve_config *")
        c.worker, c.max_rows, c.max_nfe, c.solver, c.sign = 0, 2, 64, 0, 1
        c.x_len, c.obs_dim, c.n_actions = 16, 4, 16
        c.x, c.state = ffi.cast("float *", loop.x.ctypes.data), \
            ffi.cast("float *", loop.state.ctypes.data)
        c.action_index = ffi.cast("uint32_t *", index.ctypes.data)
        c.rows_held = ffi.cast("uint64_t *", counters.ctypes.data)
        c.prefix_count = ffi.cast("uint64_t *", counters[4:].ctypes.data)
        c.prefix_ring, c.prefix_ring_len = ffi.cast("int64_t *", ring.ctypes.data), ring.size
        for name, value in change.items():
            setattr(c, name, value)
        return c

    def create(cfg, rows=loop.rows):
        out = ffi.new("struct fer_serve **")
        rc = lib.fer_serve_create(cfg, loop._exec, ffi.NULL, rows, out)
        return rc, out[0]

    rc, serve = create(config())
    assert rc == lib.FER_OK and serve != ffi.NULL
    for bad in ({"solver": 2}, {"sign": 0}, {"max_rows": 0}, {"max_nfe": 0},
                {"action_offset": ffi.cast("float *", ring.ctypes.data)},  # no scale with it
                {"prefix_ring_len": 0}, {"n_moves": lib.FER_SERVE_MAX_MOVES + 1}):
        rc, none = create(config(**bad))
        assert rc == lib.FER_EINVAL and none == ffi.NULL, bad
    index[3] = 16  # an action index past the state row
    assert create(config())[0] == lib.FER_EINVAL
    index[3] = 3
    assert create(config(), rows=ffi.NULL)[0] == lib.FER_EINVAL
    flag = ffi.new("uint32_t *", 0)
    report = native.Report(np.zeros(8, np.int64), counters)
    with core_of(batch_slots=1) as one_slot, core_of(batch_slots=2) as two_slots:
        assert lib.fer_serve_run(serve, one_slot.ptr, flag, ffi.NULL, report.c) \
            == lib.FER_EINVAL  # a serve of 2 rows on a core of 1 batch slot
        flag[0] = 1
        assert lib.fer_serve_run(serve, two_slots.ptr, flag, ffi.NULL, report.c) \
            == lib.FER_EXEC_STOPPED  # fits: the raised flag is seen before anything else
    assert lib.fer_serve_rows(serve) == 0
    lib.fer_serve_destroy(serve)
    lib.fer_serve_destroy(ffi.NULL)
    loop.close()
