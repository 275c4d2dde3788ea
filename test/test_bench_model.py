"""`bench model` runs at its tiny size and reports the keys the README and CI read.

Only shapes and sanity are checked, never a timing target: the bench is a measurement.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from flowedge_relay.bench import model as bench_model

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


def test_bench_model_module_quick(tmp_path):
    parser = argparse.ArgumentParser()
    bench_model.add_arguments(parser)
    report = bench_model.run(parser.parse_args(["--quick", "--throughput-model", "small"]))
    assert report["size"] == "quick"
    _check_report(report)
    json.dumps(report)  # JSON-serialisable as is
    assert "worker_throughput_ratio" in bench_model.table(report)
    assert Path(bench_model.plot(report, str(tmp_path / "model.png"))).stat().st_size > 0


@pytest.mark.skipif(
    not (ROOT / "flowedge_relay" / "bench" / "__main__.py").exists(),
    reason="bench subcommand registry (flowedge_relay/bench/__main__.py) not present yet",
)
def test_bench_model_cli_writes_json(tmp_path):
    out = tmp_path / "model.json"
    proc = subprocess.run(
        [sys.executable, "-m", "flowedge_relay.bench", "model", "--quick", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    report = data.get("model", data)  # the registry may nest reports by subcommand
    _check_report(report)
