# SPDX-License-Identifier: Apache-2.0
"""`bench batching` at a tiny size: documented keys, strict JSON, table, plot, registration and
the docs rows. Shapes and sanity only, never a timing target (a shared host measures noise)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import pytest

from flowedge_relay_tools.bench import batching, overload, perfdoc

os.environ.setdefault("FLOWEDGE_BENCH_DOMAIN_ID", os.environ["ROS_DOMAIN_ID"])
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.ros
def test_batching_tiny(tmp_path):
    parser = argparse.ArgumentParser()
    batching.add_arguments(parser)
    args = parser.parse_args(["--quick", "--models", "small", "--slots", "2", "--seconds", "0.2",
                              "--overload-slots", "2", "--duration", "0.3", "--in-process"])
    report = json.loads(json.dumps(batching.run(args), allow_nan=False))
    results = report["results"]
    assert [(r["model"], r["batch_slots"]) for r in results] == [
        ("policy_small.onnx", 1), ("policy_small.onnx", 2)]
    for r in results:
        assert r["nfe_per_s"] > 0 and r["step_ns_p99"] > 0 and r["requests"] > 0
        assert set(r) >= {"model", "batch_slots", "nfe_per_s", "step_ns_p99", "speedup_vs_b1"}
    assert results[0]["speedup_vs_b1"] == 1.0 and results[1]["speedup_vs_b1"] > 0
    assert results[0]["step_ceiling_vs_b1"] == 1.0  # B x step p50 at B = 1 / step p50 at B
    assert results[1]["step_ceiling_vs_b1"] == pytest.approx(
        2 * results[0]["step_ns_p50"] / results[1]["step_ns_p50"])
    point = report["overload"]["2"]["2.0"]  # the overload bench's per-load keys
    assert set(overload.METRICS) <= set(point) and point["offered"] > 0
    by_policy = report["overload_by_policy"]
    assert set(by_policy) == {"edf_admission", "edf_adaptive"}
    assert by_policy["edf_admission"]["2"]["2.0"] == point
    assert set(overload.METRICS) <= set(by_policy["edf_adaptive"]["2"]["2.0"])
    assert "edf_adaptive.B2.2.0x.on_time_ratio_admitted" in report["targets"]
    text = batching.table(report)
    assert "speedup_vs_b1" in text and "overload trace" in text
    png = Path(batching.plot(report, tmp_path / "batching.png"))
    assert png.read_bytes()[:8] == PNG
    rows = perfdoc.batching_rows(report)
    assert any("batch_slots 2" in r["measure"] and "edf_adaptive" in r["measure"] for r in rows)


@pytest.mark.ros
def test_batching_relays_side_by_side_in_rounds():
    """As deployed (one flowedge-relayd per B, under /b1 and /b2 at once): each point's figures
    are medians over its segments, its speedup the median of the per-round ratios."""
    parser = argparse.ArgumentParser()
    batching.add_arguments(parser)
    args = parser.parse_args(["--quick", "--models", "small", "--slots", "2", "--seconds", "1.2",
                              "--rounds", "2", "--overload-slots"])
    report = json.loads(json.dumps(batching.run(args), allow_nan=False))
    one, two = report["results"]
    assert (one["batch_slots"], two["batch_slots"]) == (1, 2)
    for r in (one, two):
        assert r["rounds"] == 2 and len(r["nfe_per_s_by_round"]) == 2 and r["requests"] > 0
        assert r["nfe_per_s"] == pytest.approx(sum(r["nfe_per_s_by_round"]) / 2)
        assert 0 < r["step_ns_p50"] <= r["step_ns_p99"]
    ratios = [b / a for a, b in zip(one["nfe_per_s_by_round"], two["nfe_per_s_by_round"],
                                    strict=True)]
    assert one["speedup_vs_b1"] == 1.0
    assert two["speedup_vs_b1"] == pytest.approx(sum(ratios) / 2)
    # the worker code alone, one segment per relay segment, its ratios taken the same way
    for r in (one, two):
        assert len(r["alone_nfe_per_s_by_round"]) == 2 and min(r["alone_nfe_per_s_by_round"]) > 0
    alone = [b / a for a, b in zip(one["alone_nfe_per_s_by_round"],
                                   two["alone_nfe_per_s_by_round"], strict=True)]
    assert one["alone_speedup_vs_b1"] == 1.0
    assert two["alone_speedup_vs_b1"] == pytest.approx(sum(alone) / 2)
    # the model call alone, one segment after each worker-alone one, ratios the same way; then
    # its cost at every row count 1..16
    for r in (one, two):
        assert len(r["model_call_ns_by_round"]) == 2 and min(r["model_call_ns_by_round"]) > 0
    model = [2 * a / b for a, b in zip(one["model_call_ns_by_round"],
                                       two["model_call_ns_by_round"], strict=True)]
    assert one["model_speedup_vs_b1"] == 1.0
    assert two["model_speedup_vs_b1"] == pytest.approx(sum(model) / 2)
    by_rows = report["model_call_ns_by_rows"]["policy_small.onnx"]
    assert list(by_rows) == [str(n) for n in range(1, 17)] and min(by_rows.values()) > 0
    vs_one = report["model_call_vs_one_row_by_rows"]["policy_small.onnx"]
    assert list(vs_one) == list(by_rows) and min(vs_one.values()) > 0
    assert report["targets"] == {} and report["overload"] == {}
    assert "alone_speedup" in batching.table(report) and "model_alone" in batching.table(report)


def test_registered_and_in_bench_all():
    from flowedge_relay_tools.bench.__main__ import build_parser

    args = build_parser().parse_args(["batching", "--quick", "--json", "x.json", "--plot", "x.png"])
    assert args.subcommand == "batching" and args.json == "x.json"
    script = (Path(__file__).resolve().parents[1] / "scripts" / "bench_all.sh").read_text()
    assert "batching" in script.split("ORDER=(", 1)[1].split(")", 1)[0]
    assert "batching" in perfdoc.ORDER


def test_b8_target_names_the_worker_code_alone():
    """The B = 8 capacity target line and the docs row carry the worker-alone and model-alone
    speedups beside the relay's (pure functions over a report's results: no measurement)."""
    results = [{"model": "policy_small.onnx", "batch_slots": b, "nfe_per_s": n,
                "speedup_vs_b1": s, "alone_speedup_vs_b1": a, "model_speedup_vs_b1": m,
                "step_ns_p99": 50_000.0, "nfe_per_request": 4096}
               for b, n, s, a, m in ((1, 100.0, 1.0, 1.0, 1.0), (8, 380.0, 3.8, 3.9, 4.1))]
    report = {"results": results, "overload": {}}
    target = batching.targets_met(report)["small.capacity_b8_vs_b1"]
    assert target == {"target": ">= 4", "value": 3.8, "met": False, "alone": 3.9, "model": 4.1}
    for r in results:
        r["requests"] = 10
    text = batching.table({**report, "targets": batching.targets_met(report), "relay": "process",
                           "workers": 1, "nfe_per_request": {"policy_small.onnx": 4096},
                           "seconds_per_point": 5.0})  # fmt: skip
    assert "worker code alone 3.90x; model call alone 4.10x" in text
    (row,) = perfdoc.batching_rows(report)
    assert row["met"] is False and "3.80x" in row["measured"]
    assert "worker code alone 3.90x" in row["measured"]
    assert "model call alone 4.10x" in row["measured"]


def test_row_cost_note_says_what_the_b8_target_asks_of_a_step():
    """4x at B = 8 needs the 8-row step within two one-row steps: each of the 7 added rows
    within a seventh of the one-row step. The note sets that beside what an added row cost at
    B = 8 and at the largest B (arithmetic over the step medians of a report)."""
    results = [{"model": "policy_small.onnx", "batch_slots": b, "step_ns_p50": p}
               for b, p in ((1, 21_000.0), (8, 56_000.0), (16, 96_000.0))]
    report = {"results": results, "overload": {}}
    assert batching.added_row_ns(report, "policy_small.onnx") == {
        1: [21_000.0], 8: [5_000.0], 16: [5_000.0]}
    note = batching.row_cost_notes(report)["policy_small.onnx"]
    assert "needs each added row <= 3.0 us" in note  # 21 us / 7
    assert "5.0 us at B = 8, 5.0 us at B = 16" in note
    # with rounds, each round's figures come from that round's points, then the median
    for r, by_round in zip(results, ([20_000.0, 30_000.0, 28_000.0],
                                     [48_000.0, 100_000.0, 63_000.0],
                                     [80_000.0, 150_000.0, 118_000.0]), strict=True):
        r["step_ns_p50_by_round"] = by_round
    added = batching.added_row_ns(report, "policy_small.onnx")
    assert added[8] == [4_000.0, 10_000.0, 5_000.0] and added[16] == [4_000.0, 8_000.0, 6_000.0]
    note = batching.row_cost_notes(report)["policy_small.onnx"]
    assert "needs each added row <= 4.0 us" in note  # median of 20, 30, 28 us / 7
    assert "5.0 us at B = 8, 6.0 us at B = 16" in note
