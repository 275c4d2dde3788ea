# SPDX-License-Identifier: Apache-2.0
"""`bench rtc` runs at a tiny size and reports what the table, the plot and the docs read.

Its figures are the closed-loop evaluation's; the targets themselves are asserted on a larger
seeded run in test/test_model.py (test_rtc_closed_loop_targets), not here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flowedge_relay_tools import rtc_rollout as rr
from flowedge_relay_tools.bench import perfdoc
from flowedge_relay_tools.bench import rtc as bench_rtc
from flowedge_relay_tools.bench.__main__ import SUBCOMMANDS, available

ROOT = Path(__file__).resolve().parents[1]


def _run(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    bench_rtc.add_arguments(parser)
    return bench_rtc.run(parser.parse_args(argv))


def test_quick_report_table_and_plot(tmp_path):
    report = _run(["--quick", "--delays", "0,3,4"])
    assert report["size"] == "quick" and report["episodes"] == bench_rtc.SIZES["quick"]
    assert report["digest"].startswith("sha256:") and report["rtc"]["max_delay"] == 4
    points = [(r["delay"], r["strategy"]) for r in report["results"]]
    assert points == [(d, s) for d in (0, 3, 4) for s in rr.STRATEGIES]
    for r in report["results"]:
        assert 0.0 <= r["success_rate"] <= 1.0 and r["episodes"] == report["episodes"]
        if r["delay"] == 4 and r["strategy"] != "synchronous":  # the old chunk has no row 4
            assert r["seam_jump_mean"] is None
        else:
            assert r["seam_jump_mean"] > 0
        if r["strategy"] in ("inpaint", "training_time"):
            assert r["frozen_mismatches"] == 0
    at0 = [r for r in report["results"] if r["delay"] == 0]
    assert len({(r["success_rate"], r["seam_jump_mean"]) for r in at0}) == 1  # d = 0: all alike
    assert set(report["targets"]) == {
        "success_vs_synchronous", "success_vs_naive", "seam_vs_naive", "inpaint_seam_between"
    }  # fmt: skip
    json.dumps(report, allow_nan=False)  # what --json writes
    text = bench_rtc.table(report)
    assert "seam_vs_naive" in text and "training_time" in text
    assert Path(bench_rtc.plot(report, str(tmp_path / "rtc.png"))).stat().st_size > 0
    assert "targets: d = 3 was not run" in bench_rtc.table(_run(["--quick", "--delays", "1"]))


def test_registered_and_in_bench_all():
    assert "rtc" in SUBCOMMANDS and "rtc" in available()
    script = (ROOT / "scripts" / "bench_all.sh").read_text()
    assert "rtc" in script.split("ORDER=(", 1)[1].split(")", 1)[0].split()
    assert "rtc" in perfdoc.ORDER
