# SPDX-License-Identifier: Apache-2.0
"""rtc.py: the frozen-row arithmetic, the two conditionings, the manifest block, the splicer.

The conditionings are checked against the contract element by element (frozen rows bit for bit,
the flow interpolation in the stated float32 operation order, reproduced by a C loop compiled
with -ffp-contract=off), the d arithmetic against an exact rational reference."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flowedge_relay import rtc
from flowedge_relay.model import integrator_plan

H, D = 8, 2  # the bundled policies' horizon and action dim


# ---------------------------------------------------------------- d and the deadline


def _frozen_reference(finish: int, start: int, period: int, rows: int, max_delay: int) -> int:
    """Count the prefix rows due strictly before the finish bound, one by one, then clamp."""
    due_before = sum(1 for i in range(rows) if start + i * period < finish)
    return min(due_before, max_delay)


@settings(max_examples=400, deadline=None)
@given(
    start=st.integers(0, 2**62),
    offset=st.integers(-(2**40), 2**40),
    period=st.integers(1, 10**9),
    rows=st.integers(0, 64),
    max_delay=st.integers(0, 64),
)
def test_frozen_rows_matches_reference(start, offset, period, rows, max_delay):
    finish = start + offset
    d = rtc.frozen_rows(finish, start, period, rows, max_delay)
    assert d == _frozen_reference(finish, start, period, rows, max_delay)
    ceil = math.ceil(Fraction(finish - start, period))
    assert d == max(0, min(ceil, rows, max_delay))


@settings(max_examples=300, deadline=None)
@given(
    start=st.integers(0, 2**62),
    period=st.integers(1, 10**9),
    rows=st.integers(0, 16),
    max_delay=st.integers(0, 16),
)
def test_deadline_is_when_the_first_unfreezable_row_is_due(start, period, rows, max_delay):
    deadline = rtc.deadline_of(start, rows, max_delay, period)
    assert deadline == start + min(rows, max_delay) * period
    limit = min(rows, max_delay)
    unclamped = 10**6  # frozen_rows without its clamps: what the finish time alone asks for
    assert rtc.frozen_rows(deadline, start, period, unclamped, unclamped) == limit
    assert rtc.frozen_rows(deadline + 1, start, period, unclamped, unclamped) == limit + 1


def test_frozen_rows_boundaries():
    ms = 1_000_000
    assert rtc.frozen_rows(100 * ms, 100 * ms, 20 * ms, 8, 4) == 0  # lands as row 0 is due
    assert rtc.frozen_rows(100 * ms + 1, 100 * ms, 20 * ms, 8, 4) == 1
    assert rtc.frozen_rows(160 * ms, 100 * ms, 20 * ms, 8, 4) == 3  # row 3 due exactly then
    assert rtc.frozen_rows(160 * ms + 1, 100 * ms, 20 * ms, 8, 4) == 4
    assert rtc.frozen_rows(10_000 * ms, 100 * ms, 20 * ms, 8, 4) == 4  # max_delay
    assert rtc.frozen_rows(10_000 * ms, 100 * ms, 20 * ms, 2, 4) == 2  # prefix rows
    assert rtc.frozen_rows(50 * ms, 100 * ms, 20 * ms, 8, 4) == 0  # before the prefix starts
    assert rtc.frozen_rows(10_000 * ms, 100 * ms, 20 * ms, 0, 4) == 0  # empty prefix
    for bad in [(1, 0, 0, 8, 4), (1, 0, -5, 8, 4), (1, 0, 5, -1, 4), (1, 0, 5, 8, -1)]:
        with pytest.raises(ValueError):
            rtc.frozen_rows(*bad)
    with pytest.raises(ValueError):
        rtc.deadline_of(0, 8, 4, 0)


# ---------------------------------------------------------------- conditionings

SPECIALS = np.array(
    [-0.0, 0.0, 1e-45, -1e-45, 1.1754942e-38, 3.4028235e38, -3.4028235e38, 1.0, -2.5, 0.1],
    np.float32,
)


def _arrays(seed: int, n: int = H * D) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal(n, dtype=np.float32)
    target = (rng.standard_normal(n) * 3).astype(np.float32)
    target[: len(SPECIALS)] = SPECIALS[:n]
    state = rng.standard_normal(n, dtype=np.float32)
    return x0, target, state


@pytest.mark.parametrize("d", [0, 1, 3, 4])
def test_hold_prefix_copies_frozen_rows_bit_for_bit_and_nothing_else(d):
    x0, prefix, state = _arrays(d)
    before = state.copy()
    rtc.hold_prefix(state, prefix, d, D)
    assert state[: d * D].tobytes() == prefix[: d * D].tobytes()  # -0.0, subnormals, extremes
    assert state[d * D :].tobytes() == before[d * D :].tobytes()


@pytest.mark.parametrize("convention", rtc.TIME_CONVENTIONS)
def test_training_time_rows_and_state(convention):
    x0, prefix, state = _arrays(5)
    t_rows = np.full(H, np.nan, np.float32)
    rtc.condition_training_time(state, t_rows, np.float32(0.3), prefix, 3, D, convention)
    clean = np.float32(1.0 if convention == "0_to_1" else 0.0)
    assert t_rows.tolist() == [clean] * 3 + [np.float32(0.3)] * 5
    assert state[: 3 * D].tobytes() == prefix[: 3 * D].tobytes()
    before = state.copy()
    rtc.condition_training_time(state, t_rows, np.float32(0.7), prefix, 0, D, convention)
    assert t_rows.tolist() == [np.float32(0.7)] * H and state.tobytes() == before.tobytes()


def _inpaint_reference(x, t, x0, target, n, convention):
    """The docstring's operation order, one float32 element at a time."""
    t = np.float32(t)
    w = np.float32(np.float32(1.0) - t)
    a, b = (w, t) if convention == "0_to_1" else (t, w)
    out = x.copy()
    for e in range(n):
        out[e] = np.float32(np.float32(a * x0[e]) + np.float32(b * target[e]))
    return out


@pytest.mark.parametrize("convention", rtc.TIME_CONVENTIONS)
@pytest.mark.parametrize("t", [0.0, 0.1, 0.3333333, 0.5, 0.9, 0.99999994, 1.0])
def test_inpaint_is_the_flow_interpolation_in_the_stated_order(convention, t):
    x0, target, state = _arrays(11)
    target = np.clip(target, -1e30, 1e30)  # finite products
    d = 3
    want = _inpaint_reference(state, t, x0, target, d * D, convention)
    got, tmp = state.copy(), np.empty_like(state)
    rtc.inpaint(got, np.float32(t), x0, target, d, D, convention, tmp)
    assert got.tobytes() == want.tobytes()
    assert got[d * D :].tobytes() == state[d * D :].tobytes()  # free rows untouched


@pytest.mark.parametrize("convention", rtc.TIME_CONVENTIONS)
def test_inpaint_ends_exactly_at_the_target(convention):
    """At the clean time the projection is the target itself (== for every finite value; a
    signed zero may come out +0.0), and the final copy makes it the same bits."""
    rng = np.random.default_rng(3)
    times, _, _ = integrator_plan("euler", np.float32(1 if convention == "0_to_1" else -1), 10)
    land = rtc.landing_times(times, convention)
    assert land[-1] == rtc.clean_time(convention)
    for _ in range(50):
        x0 = rng.standard_normal(H * D, dtype=np.float32) * np.float32(rng.uniform(0.01, 100))
        target = rng.standard_normal(H * D, dtype=np.float32) * np.float32(rng.uniform(0.01, 100))
        target[:4] = [-0.0, 0.0, 1e-45, -1e-45]
        x = rng.standard_normal(H * D, dtype=np.float32)
        tmp = np.empty_like(x)
        rtc.inpaint(x, land[-1], x0, target, 4, D, convention, tmp)
        assert np.array_equal(x[:8], target[:8])
        rtc.hold_prefix(x, target, 4, D)
        assert x[:8].tobytes() == target[:8].tobytes()


def test_landing_times_follow_the_grid():
    times, _, _ = integrator_plan("euler", np.float32(1), 4)
    assert rtc.landing_times(times, "0_to_1").tolist() == [0.25, 0.5, 0.75, 1.0]
    times, _, _ = integrator_plan("euler", np.float32(-1), 4)
    assert rtc.landing_times(times, "1_to_0").tolist() == [0.75, 0.5, 0.25, 0.0]
    times, _, _ = integrator_plan("midpoint", np.float32(1), 4)  # half, full, half, full
    assert rtc.landing_times(times, "0_to_1").tolist() == [0.25, 0.5, 0.75, 1.0]
    with pytest.raises(ValueError):
        rtc.clean_time("0_to_2")


C_LOOP = r"""
void inpaint(float *x, float t, const float *x0, const float *target, int n, int flip) {
    float w = 1.0f - t;
    float a = flip ? t : w, b = flip ? w : t;
    for (int e = 0; e < n; ++e) {
        x[e] = a * x0[e] + b * target[e];
    }
}

void inpaint_fused(float *x, float t, const float *x0, const float *target, int n, int flip) {
    float w = 1.0f - t;
    float a = flip ? t : w, b = flip ? w : t;
    for (int e = 0; e < n; ++e) {
        x[e] = fmaf(a, x0[e], b * target[e]);  /* what contraction would compile to */
    }
}
"""


def test_inpaint_matches_a_c_loop_compiled_without_contraction(tmp_path):
    """What a C implementation in the relay's core would compute, compiled with
    -ffp-contract=off (no fused multiply-add): the same bits as rtc.inpaint."""
    cffi = pytest.importorskip("cffi")
    ffi = cffi.FFI()
    ffi.cdef(
        "void inpaint(float *, float, const float *, const float *, int, int);"
        "void inpaint_fused(float *, float, const float *, const float *, int, int);"
    )
    ffi.set_source(
        "_rtc_inpaint_c",
        "#include <math.h>\n" + C_LOOP,
        extra_compile_args=["-O2", "-ffp-contract=off", "-std=c99"],
        libraries=["m"],
    )
    import importlib.util

    lib_path = ffi.compile(tmpdir=str(tmp_path), verbose=False)
    spec = importlib.util.spec_from_file_location("_rtc_inpaint_c", lib_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rng = np.random.default_rng(9)
    n = 4096

    def run_c(fn, state, t, x0, target, flip) -> np.ndarray:
        out = state.copy()
        buf = lambda a: ffi.from_buffer("float[]", a)  # noqa: E731
        fn(buf(out), np.float32(t), buf(x0), buf(target), n, flip)
        return out

    fused_differs = 0
    for convention, flip in (("0_to_1", 0), ("1_to_0", 1)):
        for t in [0.0, 0.1, 0.37, 0.5, 0.9, 1.0]:
            x0 = rng.standard_normal(n, dtype=np.float32) * np.float32(7)
            target = rng.standard_normal(n, dtype=np.float32) * np.float32(3)
            state = rng.standard_normal(n, dtype=np.float32)
            py_out = state.copy()
            rtc.inpaint(py_out, np.float32(t), x0, target, n // D, D, convention, np.empty_like(x0))
            c_out = run_c(module.lib.inpaint, state, t, x0, target, flip)
            assert py_out.tobytes() == c_out.tobytes(), (convention, t)
            fused = run_c(module.lib.inpaint_fused, state, t, x0, target, flip)
            fused_differs += py_out.tobytes() != fused.tobytes()
    assert fused_differs > 0  # the comparison sees one rounding less


# ---------------------------------------------------------------- the manifest's rtc: block


def test_parse_rtc_accepts_both_modes():
    spec = rtc.parse_rtc({"mode": "training_time", "time_input": "t", "max_delay": 4}, "rtc", H)
    assert spec == rtc.RtcSpec("training_time", 4, "t")
    assert rtc.parse_rtc({"mode": "inpaint", "max_delay": 7}, "rtc", H) == rtc.RtcSpec(
        "inpaint", 7, None
    )
    assert rtc.parse_rtc({"mode": "inpaint", "max_delay": 30}, "rtc").max_delay == 30


@pytest.mark.parametrize(
    "raw, message",
    [
        ([1, 2], "rtc: expected a mapping with mode and max_delay, found [1, 2]"),
        (
            {"mode": "inpaint", "max_delay": 2, "guidance": 1},
            "rtc: expected only the keys mode, time_input, max_delay, found ['guidance']",
        ),
        (
            {"mode": "guided", "max_delay": 2},
            "rtc.mode: expected one of ['training_time', 'inpaint'], found 'guided'",
        ),
        ({"mode": "inpaint"}, "rtc.max_delay: expected a positive integer, found None"),
        (
            {"mode": "inpaint", "max_delay": 0},
            "rtc.max_delay: expected a positive integer, found 0",
        ),
        (
            {"mode": "inpaint", "max_delay": True},
            "rtc.max_delay: expected a positive integer, found True",
        ),
        (
            {"mode": "inpaint", "max_delay": 2.0},
            "rtc.max_delay: expected a positive integer, found 2.0",
        ),
        (
            {"mode": "inpaint", "max_delay": 8},
            "rtc.max_delay: expected < action.horizon (8), one row at least left to generate, "
            "found 8",
        ),
        (
            {"mode": "training_time", "max_delay": 4},
            "rtc.time_input: expected the name of the graph's per-row time input "
            "(training_time), found None",
        ),
        (
            {"mode": "training_time", "max_delay": 4, "time_input": ""},
            "rtc.time_input: expected the name of the graph's per-row time input "
            "(training_time), found ''",
        ),
        (
            {"mode": "inpaint", "max_delay": 4, "time_input": "t"},
            "rtc.time_input: expected none for inpaint, found 't'",
        ),
    ],
)
def test_parse_rtc_names_field_expected_and_found(raw, message):
    with pytest.raises(rtc.RtcManifestError) as err:
        rtc.parse_rtc(raw, "rtc", H)
    assert str(err.value) == message


def test_rtc_manifest_errors_are_model_errors():
    from flowedge_relay.model import ModelError

    with pytest.raises(ModelError, match="^pkg: rtc.mode: "):
        rtc.parse_rtc({"mode": None, "max_delay": 1}, "pkg: rtc")


# ---------------------------------------------------------------- rtc_mode against the policy

_TT = rtc.RtcSpec("training_time", 4, "t")


@pytest.mark.parametrize(
    ("declared", "requested", "package", "want"),
    [
        (None, "inpaint", False, rtc.RtcSpec("inpaint", H - 1)),  # a single .onnx flow policy
        (None, "inpaint", True, rtc.RtcSpec("inpaint", H - 1)),
        (None, "auto", False, None),
        (None, "off", False, None),
        (_TT, "auto", True, _TT),
        (_TT, "inpaint", True, rtc.RtcSpec("inpaint", 4)),  # the declared max_delay
        (_TT, "off", True, None),
    ],
)
def test_resolve_serves_inpaint_on_any_euler_flow_policy(declared, requested, package, want):
    assert rtc.resolve(declared, requested, package=package, solver="euler", horizon=H) == want


@pytest.mark.parametrize(
    ("declared", "requested", "package", "solver", "horizon", "says"),
    [
        (None, "inpaint", False, "midpoint", H, "set the solver parameter to euler"),
        (None, "inpaint", True, "midpoint", H, "flow.solver: euler in its policy.yaml"),
        (_TT, "auto", True, "midpoint", H, "flow.solver: euler"),
        (None, "training_time", False, "euler", H, "set rtc_mode to inpaint"),
        (None, "training_time", True, "euler", H, "rtc: {mode: training_time"),
        (None, "inpaint", False, "euler", 1, "set rtc_mode to off"),
        (None, "sometimes", False, "euler", H, "rtc_mode: expected one of"),
    ],
)
def test_resolve_says_what_to_change_when_a_mode_cannot_be_served(
    declared, requested, package, solver, horizon, says
):
    with pytest.raises(rtc.RtcManifestError) as err:
        rtc.resolve(declared, requested, package=package, solver=solver, horizon=horizon)
    assert str(err.value).startswith("rtc_mode") and says in str(err.value), str(err.value)


# ---------------------------------------------------------------- producer side

P = 20_000_000  # 50 Hz


def _chunk(base: float, rows: int = H) -> np.ndarray:
    return (base + np.arange(rows * D, dtype=np.float32)).reshape(rows, D)


def test_splicer_prefix_is_what_is_not_yet_executed():
    s = rtc.ChunkSplicer(D, P)
    s.start(_chunk(0), 1_000 * P)
    assert s.action_at(999 * P) is None and s.action_at(1_000 * P).tolist() == [0, 1]
    assert s.action_at(1_000 * P + P - 1).tolist() == [0, 1]  # row 0 until row 1 is due
    assert s.action_at(1_003 * P).tolist() == [6, 7] and s.action_at(1_008 * P) is None
    prefix, start = s.prefix(1_003 * P)  # row 3 due exactly now: not executed yet
    assert start == 1_003 * P and prefix.tolist() == list(range(6, 16))
    prefix, start = s.prefix(1_003 * P + 1)  # row 3 started: the prefix begins at row 4
    assert start == 1_004 * P and prefix.tolist() == list(range(8, 16))
    prefix, start = s.prefix(990 * P)  # before the chunk starts: all of it
    assert start == 1_000 * P and len(prefix) == H * D
    prefix, start = s.prefix(1_020 * P)  # ran out: empty, on the grid after the last row
    assert prefix.size == 0 and start == 1_008 * P
    prefix[:] = -1  # a copy: the chunk is not touched through it
    assert s.chunk[0].tolist() == [0, 1]


def test_splicer_switches_at_row_d():
    s = rtc.ChunkSplicer(D, P)
    s.start(_chunk(0), 0)
    prefix, start = s.prefix(4 * P)  # rows 4..7 left; the answer lands 3 periods later
    d = rtc.frozen_rows(7 * P, start, P, len(prefix) // D, 4)
    assert d == 3
    conditioned = _chunk(100)
    conditioned[:d] = prefix[: d * D].reshape(d, D)  # what the relay answers
    naive = _chunk(200)  # no conditioning: its first d rows are never executed
    for answer in (conditioned, naive):
        s.start(_chunk(0), 0)
        executed = [s.action_at(k * P).tolist() for k in range(7)]  # rows 0..6 meanwhile
        s.splice(answer, d, start)
        executed += [s.action_at(k * P).tolist() for k in range(7, 12)]
        old = _chunk(0).tolist()
        assert executed[:7] == old[:7]  # the old chunk until the switch
        assert executed[7:] == answer[3:8].tolist()  # the new one from its row d
        assert s.start_ns == start and s.rows == H
    s.start(_chunk(0), 0)
    prefix, start = s.prefix(3 * P + 1)  # row 3 in progress: the prefix starts at row 4
    s.splice(conditioned, 0, start)  # answered before row 4 is due: row 3 goes on until then
    assert s.action_at(4 * P - 1).tolist() == _chunk(0)[3].tolist()
    assert s.action_at(4 * P).tolist() == conditioned[0].tolist()
    with pytest.raises(ValueError, match="grid"):
        s.splice(naive, 0, start + 1)
    with pytest.raises(ValueError, match="frozen_rows"):
        s.splice(naive, 9, s.start_ns)
