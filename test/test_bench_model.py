# SPDX-License-Identifier: Apache-2.0
"""`bench model` runs at its tiny size and reports the keys the README and CI read.

Only shapes and sanity are checked, never a timing target: the bench is a measurement.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from flowedge_relay_tools.bench import model as bench_model

ROOT = Path(__file__).resolve().parents[1]


def _check_report(report: dict) -> None:
    assert set(report["nfe_cost"]) == {"policy_small", "policy_bench"}
    for cost in report["nfe_cost"].values():
        assert cost["digest"].startswith("sha256:")
        for threads in (1, 2):
            c = cost[f"threads_{threads}"]
            assert 0 < c["p50_ns"] <= c["p99_ns"] <= c["max_ns"] and c["samples"] > 0
    assert len(report["rows"]) == 4
    wt = report["worker_throughput"]
    assert wt["bare_nfe_per_s"] > 0 and wt["worker_nfe_per_s"] > 0
    assert report["worker_throughput_ratio"] == wt["ratio"] > 0
    assert report["worker_cpu_ratio"] == wt["cpu_ratio"] > 0
    assert wt["bare_cpu_ns_per_nfe"] > 0 and wt["worker_cpu_ns_per_nfe"] > 0
    assert report["worker_throughput_target"] == 0.95
    assert set(report["targets"]["worker_throughput_ratio"]) == {"target", "met"}
    # the two-phase package: raw cost per graph and worker vs bare for EACH graph
    vision = report["vision"]
    assert vision["digest"].startswith("sha256:")
    for threads in (1, 2):
        for graph in ("prefix", "step"):
            c = vision["graph_cost"][f"threads_{threads}"][graph]
            assert 0 < c["p50_ns"] <= c["p99_ns"] <= c["max_ns"] and c["samples"] > 0
    assert [(r["graph"], r["intra_op_threads"]) for r in vision["rows"]] == [
        ("prefix", 1), ("prefix", 2), ("step", 1), ("step", 2)]
    wvb = vision["worker_vs_bare"]
    for graph in ("prefix", "step"):
        g = wvb[graph]
        # a pair whose long trial was no slower than its short one (a stalled host) is left out
        # of the step figures and counted; every other pair gives a ratio
        assert len(g["pair_ratios"]) + g["pairs_discarded"] == wvb["pairs"]
        assert g["bare_ns"] > 0
        if g["pair_ratios"]:
            assert g["worker_ns"] > 0 and g["ratio"] > 0
        else:
            assert g["worker_ns"] is None and g["ratio"] is None and not g["met"]
        assert report[f"vision_{graph}_worker_ratio"] == g["ratio"]
        assert report["targets"][f"vision_{graph}_worker_ratio"]["met"] == g["met"]
    assert wvb["worker_timed"]["prefix_p50_ns"] > 0 and wvb["worker_timed"]["nfe_p50_ns"] > 0
    # the loop's per-request fixed work, reported apart from the graphs
    assert report["vision_per_request_overhead_ns"] == wvb["per_request_overhead_ns"]
    assert len(wvb["per_request_overhead_pairs_ns"]) == len(wvb["step"]["pair_ratios"])
    assert wvb["prefix"]["pairs_discarded"] == 0  # the prefix figure needs no subtraction
    assert wvb["nfe_loop"] in ("native", "python")


def test_bench_model_module_quick(tmp_path):
    parser = argparse.ArgumentParser()
    bench_model.add_arguments(parser)
    report = bench_model.run(parser.parse_args(["--quick", "--throughput-model", "small"]))
    assert report["size"] == "quick"
    _check_report(report)
    json.dumps(report)  # JSON-serialisable as is
    table = bench_model.table(report)
    assert "worker_throughput_ratio" in table
    assert "vision_prefix_worker_ratio" in table and "vision_step_worker_ratio" in table
    assert "vision_per_request_overhead_ns" in table
    assert Path(bench_model.plot(report, str(tmp_path / "model.png"))).stat().st_size > 0


def test_bench_model_cli_writes_json(tmp_path):
    out = tmp_path / "model.json"
    cli = [sys.executable, "-m", "flowedge_relay_tools.bench", "model", "--quick"]
    proc = subprocess.run(
        [*cli, "--json", str(out), "--plot", str(tmp_path / "model.png")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert (tmp_path / "model.png").stat().st_size > 0
    _check_report(data)
    assert "worker_throughput_ratio" in proc.stdout  # the table
