# SPDX-License-Identifier: Apache-2.0
"""`bench overload --rtc`: the RTC trace's requests, its figures and its report.

The figures are checked as arithmetic on known answers, then the trace runs tiny over real DDS
and only the report's structure and its counts are checked, never a timing target.
"""

from __future__ import annotations

import argparse
import json
import os
import types

import numpy as np
import pytest
from flowedge_relay_msgs.msg import ActionMessage
from rclpy.serialization import serialize_message

from flowedge_relay_tools.bench import overload
from flowedge_relay_tools.bench import overload_rtc as rtc
from flowedge_relay_tools.bench.client import Answer, parse_action
from flowedge_relay_tools.bench.trace import TraceSpec

os.environ.setdefault("FLOWEDGE_BENCH_DOMAIN_ID", os.environ.get("ROS_DOMAIN_ID", "0"))

MS = 1_000_000
SERVED = types.SimpleNamespace(rtc_mode="training_time", rtc_max_delay=4, action_dim=2,
                               action_horizon=8)  # fmt: skip


def test_parse_action_reads_frozen_rows_and_chunk_start():
    for name in ("", "s", "session-17"):  # the fields after variable-length ones
        m = ActionMessage(session_id=name, model_digest=name, frozen_rows=3, retry_reason=9)
        m.actions = [0.5] * len(name)
        m.chunk_start.sec, m.chunk_start.nanosec = 1_700_000_000, 123_456_789
        _, ans = parse_action(serialize_message(m), 7)
        assert ans.frozen_rows == 3 and ans.chunk_start_ns == 1_700_000_000_123_456_789


def test_rows_executed_counts_rows_begun_before_receipt():
    p = 10 * MS
    assert rtc.rows_executed(0, 0, p, 8) == 0  # row 0 starts at the receipt: not yet run
    assert rtc.rows_executed(1, 0, p, 8) == 1
    assert rtc.rows_executed(p, 0, p, 8) == 1
    assert rtc.rows_executed(p + 1, 0, p, 8) == 2
    assert rtc.rows_executed(-5 * p, 0, p, 8) == 0  # received before prefix_start
    assert rtc.rows_executed(100 * p, 0, p, 8) == 8  # at most the prefix's rows


def test_the_period_makes_the_window_bind_and_the_trace_is_seeded():
    spec = TraceSpec()
    assert rtc.default_period_ns(spec, 4) == 10 * MS  # slack_min 40 ms / max_delay 4
    a = rtc.RtcTrace.build(spec, SERVED, 100, (1, 8))
    b = rtc.RtcTrace.build(spec, SERVED, 100, (1, 8))
    assert np.array_equal(a.rows, b.rows) and 1 <= a.rows.min() and a.rows.max() <= 8
    assert a.prefix(5).shape == (a.rows[5], 2) and a.prefix(5).dtype == np.float32
    assert a.window_ns(0, 8) == 4 * a.period_ns and a.window_ns(0, 2) == 2 * a.period_ns
    with pytest.raises(SystemExit):
        rtc.RtcTrace.build(spec, types.SimpleNamespace(**{**vars(SERVED), "rtc_mode": "off"}), 4)


def test_measure_counts_in_time_and_spare_rows_from_the_answers():
    p = 10 * MS
    trace = rtc.RtcTrace.build(TraceSpec(), SERVED, 8, (8, 8), period_ms=10)
    start = 1_000 * p

    def ans(code: int, d: int, received: int, published: int) -> Answer:
        return Answer(code, received, published, 8, 0, 0, 0, b"", d, start)

    answers = {  # (d, received after start): spare rows d - k
        ("s", 1): ans(0, 2, start + 15 * MS, start + 14 * MS),  # k 2: in time, spare 0
        ("s", 2): ans(0, 3, start + 5 * MS, start + 4 * MS),  # k 1: in time, spare 2
        ("s", 3): ans(0, 1, start + 11 * MS, start + 9 * MS),  # k 2: late, published in time
        ("s", 4): ans(2, 0, start, start),  # REJECTED_DEADLINE: not counted
    }
    client = types.SimpleNamespace(answers=answers)
    keys = [*answers, ("s", 5)]  # the last one lost
    sent = [(start, 8, start + 60 * MS)] * 4 + [(start, 8, start + 30 * MS)]  # window 40 ms
    m = rtc.measure(client, keys, sent, trace)
    assert (m["inference"], m["in_time"], m["late"]) == (3, 2, 1)
    assert m["late_published_in_time"] == 1 and m["in_time_ratio"] == pytest.approx(2 / 3)
    assert m["spare_rows_hist"] == {"-1": 1, "0": 1, "2": 1} and m["spare_rows_p50"] == 0
    assert m["spare_rows_p90"] == 2 and m["spare_rows_min"] == -1
    assert m["frozen_rows_hist"] == {"1": 1, "2": 1, "3": 1}
    assert m["frozen_over_window"] == 0 and m["chunk_start_mismatch"] == 0
    assert m["margin_ms_min"] == pytest.approx(-1.0) and m["dds_trip_ns_max"] == 2 * MS
    assert m["window_binding"] == 4 and m["window_binding_share"] == pytest.approx(0.8)


def test_the_margin_is_taken_apart_into_reserve_cost_slack_row_end_and_trip():
    """Why d - k is what it is: per answer, margin = reserve + (nfe_done x nfe_ns - compute)
    + (chunk_start + d x period - the bound at nfe_ns) - trip, the means add up, and d - k is
    floor(margin / period)."""
    p, nfe_ns, reserve = 10 * MS, 100_000, 15 * MS
    trace = rtc.RtcTrace.build(TraceSpec(), SERVED, 8, (8, 8), period_ms=10)
    start = 1_000 * p
    # dispatched at start + 1 ms, 40 NFE computed in 2 ms (cost slack 40 x 0.1 - 2 = 2 ms),
    # published at start + 3 ms: the bound at nfe_ns is start + 1 + 4 + 15 = start + 20 ms
    dispatch, compute = start + 1 * MS, 2 * MS
    answers = {
        ("s", 1): Answer(0, dispatch + compute + MS // 2, dispatch + compute, 40, 0, 0, compute,
                         b"", 2, start),  # d 2: bound at row 2's start, received in row 1
        ("s", 2): Answer(0, dispatch + compute + MS, dispatch + compute, 40, 0, 0, compute, b"",
                         3, start),  # d 3: adaptive's cost above nfe_ns pushed it a row on
    }
    keys = list(answers)
    sent = [(start, 8, start + 60 * MS)] * 2
    m = rtc.measure(types.SimpleNamespace(answers=answers), keys, sent, trace, (nfe_ns, reserve))
    x = m["margin_parts_ms"]
    assert x["reserve"] == 15.0 and x["cost_slack"] == pytest.approx(2.0)
    assert x["to_row_end"] == pytest.approx((0 + 10) / 2)  # the bound at 20 ms; rows end 20, 30
    assert x["trip"] == pytest.approx(0.75)
    margins = [(start + 2 * p - (dispatch + compute + MS // 2)) / 1e6,
               (start + 3 * p - (dispatch + compute + MS)) / 1e6]
    assert x["margin"] == pytest.approx(np.mean(margins))
    assert x["margin"] == pytest.approx(x["reserve"] + x["cost_slack"] + x["to_row_end"]
                                        - x["trip"])
    assert m["spare_rows_hist"] == {"1": 1, "2": 1}  # k 1 for both: floor(margin / period)
    assert [int(v // 10) for v in margins] == [1, 2]
    assert rtc.measure(types.SimpleNamespace(answers=answers), keys, sent, trace)[
        "margin_parts_ms"] is None  # without the bound it ran with, nothing to take apart
    assert rtc.measure(types.SimpleNamespace(answers=answers), keys, sent, trace, (0, 0))[
        "margin_parts_ms"] is None  # admission off (expire_only): no bound at all


def _args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    overload.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.ros
def test_overload_rtc_tiny():
    """The RTC trace end to end: the RTC policy served, every request a prefix, the figures per
    point add up with the outcomes, no answer freezes more than its window, every chunk_start
    the prefix_start sent. expire_only runs without admission's bound, so its d is the window's
    end (docs/design.md §5.4)."""
    argv = ["--quick", "--rtc", "--duration", "0.3", "--loads", "1", "2",
            "--policies", "edf_admission", "expire_only", "--rtc-rows", "2", "8"]
    report = json.loads(json.dumps(overload.run(_args(argv)), allow_nan=False))
    assert report["model"] == "policy_rtc"
    r = report["rtc"]
    assert r["rtc_max_delay"] == 4 and r["action_period_ns"] == 10 * MS and "[2, 8]" in r["rows"]
    assert r["fit"]["window_after_send_max_ms"] == 50.0  # (4 rows + a period to the grid) x 10
    # the reserve covers the answer's way out, not a stall: one past it expires at row d
    assert report["admission_reserve_ns"] == report["calibration"]["recommended_rtc_reserve_ns"]
    assert report["nfe_ns"] == report["calibration"]["recommended_rtc_nfe_ns"]
    assert r["fit"]["fits"] == (r["fit"]["mean_request_bound_ms"] < 50.0)
    inference = 0
    for policy, by_load in report["policies"].items():
        for load, m in by_load.items():
            x, o = m["rtc"], m["outcomes"]
            assert x["inference"] == o["INFERENCE"], (policy, load)
            assert x["in_time"] + x["late"] == x["inference"]
            assert sum(x["frozen_rows_hist"].values()) == x["inference"]
            assert sum(x["spare_rows_hist"].values()) == x["inference"]
            assert all(0 <= int(d) <= 4 for d in x["frozen_rows_hist"])
            assert x["frozen_over_window"] == 0 and x["chunk_start_mismatch"] == 0
            assert 0 <= x["window_binding"] <= m["offered"]
            assert m["rtc_in_time_ratio"] == x["in_time_ratio"]
            if x["inference"]:
                spare = [int(k) for k, n in x["spare_rows_hist"].items() for _ in range(n)]
                assert x["spare_rows_p50"] == float(np.percentile(spare, 50, method="higher"))
                assert x["in_time_ratio"] == x["in_time"] / x["inference"]
            if policy == "expire_only":  # nfe_ns 0: no bound but the window
                assert set(x["frozen_rows_hist"]) <= {"2", "3", "4"}
            parts = x["margin_parts_ms"]
            if policy == "expire_only" or not x["inference"]:
                assert parts is None
            else:
                assert parts["reserve"] == report["admission_reserve_ns"] / 1e6
                assert parts["margin"] == pytest.approx(
                    parts["reserve"] + parts["cost_slack"] + parts["to_row_end"] - parts["trip"])
            inference += x["inference"]
    assert inference > 0
    assert {"edf_admission.rtc_in_time_ratio", "edf_admission.rtc_spare_rows_p50"} <= set(
        report["targets"])
    table = overload.table(report)
    assert "rtc_in_time" in table and "d-k p50/p90" in table and "action_period 10 ms" in table


def test_overload_rtc_is_in_bench_all():
    """scripts/bench_all.sh runs `overload --rtc` as overload-rtc: the EDF policies at 2x and 3x."""
    import shlex
    from pathlib import Path

    from flowedge_relay_tools.bench.__main__ import build_parser

    script = (Path(__file__).resolve().parents[1] / "scripts" / "bench_all.sh").read_text()
    assert "overload-rtc" in script.split("\nORDER=(", 1)[1].split(")", 1)[0].split()
    assert "[overload-rtc]=overload\n" in script.split("declare -A SUBCOMMAND=(", 1)[1]
    line = next(x for x in script.splitlines() if x.strip().startswith("[overload-rtc]=\""))
    args = build_parser().parse_args(["overload", *shlex.split(line.split("=", 1)[1].strip('"'))])
    assert args.rtc and args.policies == list(overload.ADMISSION_POLICIES)
    assert args.loads == [2.0, 3.0]
