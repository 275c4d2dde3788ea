# SPDX-License-Identifier: Apache-2.0
"""The core's half of real-time chunking (docs/design.md §5.4): a prefix request's window is a
deadline, and the rows the robot runs meanwhile (frozen_rows) are fixed at dispatch from the same
finish bound admission promised."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from core_helpers import collect, make_core, request
from hypothesis import given, settings
from hypothesis import strategies as st

from flowedge_relay import rtc
from flowedge_relay.core import Code, Decision, InvalidArgument, Step

NOW = 10_000_000
NFE = 100
ROWS_MAX = 4096  # FER_RTC_MAX_ROWS


def with_prefix(req, rows: int, start: int, period: int, start_ros: int = 0):
    return dataclasses.replace(req, prefix_rows=rows, prefix_start_ns=start,
                               prefix_start_ros_ns=start_ros or start + 7, action_period_ns=period)


def window_end(rows: int, max_delay: int, start: int, period: int) -> int:
    """When the robot has executed every row the chunk could still freeze (the reference:
    flowedge_relay.rtc, which producers and the evaluation use)."""
    return rtc.deadline_of(start, rows, max_delay, period)


def frozen_rows(bound: int, rows: int, max_delay: int, start: int, period: int) -> int:
    """§5.4: d = ceil((bound - start) / period), at least 0, at most the window."""
    return rtc.frozen_rows(bound, start, period, rows, max_delay)


def run_to_end(c, lane: int, now: int, nfe: int) -> None:
    for _ in range(nfe - 1):
        assert c.step(lane, now, NFE) == Step.CONTINUE
    assert c.step(lane, now, NFE) == Step.DONE
    assert c.finish(lane, now, np.zeros(0, np.float32)) == Code.INFERENCE


def core(**config):
    base = {"workers": 1, "queue_capacity": 64, "obs_dim": 1, "action_len": 0,
            "rtc_max_delay": 8}
    return make_core(**{**base, **config})


@settings(max_examples=300, deadline=None)
@given(queued=st.lists(st.tuples(st.integers(0, 3000), st.integers(1, 8)), max_size=10),
       running=st.integers(0, 8), nfe=st.integers(1, 8), rows=st.integers(1, 12),
       max_delay=st.integers(1, 12), start=st.integers(-2000, 2000),
       period=st.integers(1, 600), deadline=st.integers(0, 4000),
       reserve=st.sampled_from([0, 30]))
def test_the_prefix_window_is_admitted_as_a_deadline(queued, running, nfe, rows, max_delay, start,
                                                     period, deadline, reserve):
    """A prefix request is decided exactly as a plain one whose deadline is the earlier of its own
    and the window's end, on the same core state; its answer still echoes its own deadline."""
    end = window_end(rows, max_delay, NOW + start, period)
    plain_deadline = min(NOW + deadline, end) if deadline else end
    decisions = []
    for prefixed in (True, False):
        with core(rtc_max_delay=max_delay) as c:
            if running:
                c.submit(request(b"r", 0, nfe=running, origin=NOW, obs_dim=1), NOW)
                c.dispatch(0, NOW)
            for i, (rel, n) in enumerate(queued):
                c.submit(request(b"q%d" % i, 0, nfe=n, deadline=NOW + rel if rel else 0,
                                 origin=NOW, obs_dim=1), NOW)
            c.set_calibration(NFE, reserve)
            if prefixed:
                x = with_prefix(request(b"x", 0, nfe=nfe, deadline=NOW + deadline if deadline
                                        else 0, ros_clock_offset=5, origin=NOW, obs_dim=1),
                                rows, NOW + start, period)
            else:
                x = request(b"x", 0, nfe=nfe, deadline=plain_deadline, origin=NOW, obs_dim=1)
            decisions.append(c.submit(x, NOW))
            if prefixed and decisions[0] != Decision.ACCEPTED:
                (o,) = collect(c, 1)
                assert o.deadline_ros_ns == x.deadline_ros_ns
                assert o.chunk_start_ros_ns == x.prefix_start_ros_ns and o.frozen_rows == 0
    assert decisions[0] == decisions[1]


@settings(max_examples=300, deadline=None)
@given(nfe=st.integers(1, 8), rows=st.integers(1, 12), max_delay=st.integers(1, 12),
       start=st.integers(-2000, 500), period=st.integers(1, 400), wait=st.integers(0, 300),
       reserve=st.sampled_from([0, 30, 250]), batch=st.sampled_from([1, 3]))
def test_frozen_rows_come_from_the_finish_bound_at_dispatch(nfe, rows, max_delay, start, period,
                                                            wait, reserve, batch):
    """d = ceil((dispatch + remaining NFE x cost in use + reserve - prefix_start) / period),
    clamped to [0, min(rows, max_delay)]; the INFERENCE answer carries it and the prefix start,
    and the work's deadline is now when row d starts, never before the bound."""
    with core(rtc_max_delay=max_delay, batch_slots=batch, nfe_ns=NFE,
              admission_reserve_ns=reserve) as c:
        x = with_prefix(request(b"x", 0, nfe=nfe, origin=NOW, obs_dim=1), rows, NOW + start,
                        period)
        decision = c.submit(x, NOW)
        end = window_end(rows, max_delay, NOW + start, period)
        assert decision == (Decision.ACCEPTED if NOW + nfe * NFE + reserve <= end
                            else Decision.EXPIRED if NOW >= end else Decision.REJECTED_DEADLINE)
        if decision != Decision.ACCEPTED:
            return
        t = NOW + wait
        work = c.dispatch_worker(0, t)
        if t + nfe * NFE > end:  # can no longer finish by the window's end: answered at dispatch
            assert work is None
            (o,) = collect(c, 1)
            assert o.code == Code.EXPIRED and o.frozen_rows == 0
            return
        d = frozen_rows(t + nfe * NFE + reserve, rows, max_delay, NOW + start, period)
        assert work.frozen_rows == d
        assert work.deadline_ns == min(end, NOW + start + d * period)  # row d: the switch
        run_to_end(c, work.lane, t, nfe)
        (o,) = collect(c, 1)
        assert (o.code, o.frozen_rows, o.chunk_start_ros_ns) == (Code.INFERENCE, d,
                                                                x.prefix_start_ros_ns)


def test_a_plain_request_freezes_nothing_and_echoes_no_chunk_start():
    with core(nfe_ns=NFE) as c:
        x = dataclasses.replace(request(b"x", 0, nfe=2, origin=NOW, obs_dim=1),
                                prefix_start_ns=NOW, prefix_start_ros_ns=9, action_period_ns=1)
        assert c.submit(x, NOW) == Decision.ACCEPTED
        work = c.dispatch(0, NOW)
        assert work.frozen_rows == 0
        run_to_end(c, 0, NOW, 2)
        (o,) = collect(c, 1)
        assert (o.frozen_rows, o.chunk_start_ros_ns) == (0, 0)


def test_with_admission_off_the_whole_window_is_frozen():
    """No calibration, no finish bound: the window's end is the only bound there is."""
    with core(rtc_max_delay=5) as c:
        for seq, rows in enumerate((3, 9)):
            x = with_prefix(request(b"x", seq, nfe=1, origin=NOW, obs_dim=1), rows, NOW, 10**6)
            assert c.submit(x, NOW) == Decision.ACCEPTED
            assert c.dispatch(0, NOW).frozen_rows == min(rows, 5)
            run_to_end(c, 0, NOW, 1)
        assert [o.frozen_rows for o in collect(c, 2)] == [3, 5]


def test_running_work_past_the_window_expires():
    with core(nfe_ns=NFE) as c:
        x = with_prefix(request(b"x", 0, nfe=4, origin=NOW, obs_dim=1), 2, NOW, 300)
        assert c.submit(x, NOW) == Decision.ACCEPTED   # 400 <= 600
        assert c.dispatch(0, NOW).frozen_rows == 2
        assert c.step(0, NOW + 100, NFE) == Step.CONTINUE
        assert c.step(0, NOW + 601, NFE) == Step.STOP_EXPIRED
        (o,) = collect(c, 1)
        assert (o.code, o.frozen_rows, o.chunk_start_ros_ns) == (Code.EXPIRED, 0, NOW + 7)


def test_running_work_past_its_switch_row_expires():
    """Once d is fixed the robot switches at row d: a chunk still computing when that row starts
    would reach it late, so it is EXPIRED there, not at the window's end (a stall past the
    reserve, made here by stepping late on purpose)."""
    with core(nfe_ns=NFE) as c:
        x = with_prefix(request(b"x", 0, nfe=4, origin=NOW, obs_dim=1), 8, NOW, 300)
        assert c.submit(x, NOW) == Decision.ACCEPTED       # window: 8 rows, NOW + 2400
        work = c.dispatch(0, NOW)
        assert work.frozen_rows == 2                        # bound NOW + 400: row 2 at NOW + 600
        assert work.deadline_ns == NOW + 600
        assert c.step(0, NOW + 100, NFE) == Step.CONTINUE
        assert c.step(0, NOW + 600, NFE) == Step.STOP_EXPIRED
        (o,) = collect(c, 1)
        assert (o.code, o.frozen_rows) == (Code.EXPIRED, 0)
        y = with_prefix(request(b"x", 1, nfe=2, origin=NOW, obs_dim=1), 8, NOW, 300)
        assert c.submit(y, NOW) == Decision.ACCEPTED
        assert c.dispatch(0, NOW).frozen_rows == 1          # bound NOW + 200: row 1 at NOW + 300
        assert c.step(0, NOW + 250, NFE) == Step.CONTINUE
        assert c.step(0, NOW + 300, NFE) == Step.DONE
        assert c.finish(0, NOW + 301, np.zeros(0, np.float32)) == Code.EXPIRED
        z = with_prefix(request(b"x", 2, nfe=2, origin=NOW, obs_dim=1), 8, NOW, 300)
        assert c.submit(z, NOW) == Decision.ACCEPTED
        assert c.dispatch(0, NOW).frozen_rows == 1
        assert c.step(0, NOW + 299, NFE) == Step.CONTINUE
        assert c.step(0, NOW + 300, NFE) == Step.DONE
        assert c.finish(0, NOW + 300, np.zeros(0, np.float32)) == Code.INFERENCE
        assert [o.code for o in collect(c, 2)] == [Code.EXPIRED, Code.INFERENCE]


def test_a_prefix_needs_real_time_chunking_on_and_a_period():
    x = with_prefix(request(b"x", 0, nfe=1, origin=NOW, obs_dim=1), 2, NOW, 100)
    with core(rtc_max_delay=0) as c, pytest.raises(InvalidArgument):
        c.submit(x, NOW)
    with core() as c:
        for bad in (dataclasses.replace(x, action_period_ns=0),
                    dataclasses.replace(x, prefix_rows=ROWS_MAX + 1)):
            with pytest.raises(InvalidArgument):
                c.submit(bad, NOW)
        assert c.stats().submitted == 0   # refused before it counts: the node counts why
        assert c.submit(dataclasses.replace(x, prefix_rows=ROWS_MAX), NOW) == Decision.ACCEPTED
    with pytest.raises(InvalidArgument):
        core(rtc_max_delay=ROWS_MAX + 1)
