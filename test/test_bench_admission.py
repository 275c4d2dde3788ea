# SPDX-License-Identifier: Apache-2.0
"""`bench admission` runs at a tiny size and reports the keys the issue and the docs read.

Only shapes and sanity are checked, never a timing target: the bench is a measurement.
"""

from __future__ import annotations

import argparse
import json

from flowedge_relay_tools.bench import admission


def _run(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    admission.add_arguments(parser)
    return admission.run(parser.parse_args(argv))


def test_quick_report_shape():
    report = _run(["--quick", "--samples", "200", "--cffi-samples", "100"])
    assert report["size"] == "quick"
    assert [(r["depth"], r["workers"]) for r in report["results"]] == \
        [(16, 1), (16, 2), (64, 1), (64, 2)]
    for r in report["results"]:
        for side in ("c", "cffi"):
            assert 0 < r[f"{side}_p50_ns"] <= r[f"{side}_p99_ns"] <= r[f"{side}_p999_ns"] \
                <= r[f"{side}_max_ns"]
    t = report["targets"]
    assert t["c_p99_ns_depth64_w2"]["measured"] == report["results"][3]["c_p99_ns"]
    assert t["cffi_p99_ns_depth1024"]["met"] is None          # depth 1024 not run when quick
    assert "c_p99_ns_depth64_w2" in admission.table(report)
    json.dumps(report, allow_nan=False)                       # what --json writes


def test_depth_1024_point_and_json_keys(tmp_path):
    # One depth-1024 point, written as --json does: the JSON has the `results` keys.
    from flowedge_relay_tools.bench.__main__ import SUBCOMMANDS

    assert "admission" in SUBCOMMANDS
    out = tmp_path / "admission.json"
    parser = argparse.ArgumentParser()
    admission.add_arguments(parser)
    parser.add_argument("--json")
    args = parser.parse_args(["--depths", "1024", "--workers", "4", "--samples", "100",
                              "--cffi-samples", "60", "--json", str(out)])
    report = admission.run(args)
    out.write_text(json.dumps(report))
    (row,) = json.loads(out.read_text())["results"]
    assert {"depth", "workers", "c_p99_ns", "cffi_p99_ns"} <= set(row)
    assert (row["depth"], row["workers"]) == (1024, 4)
    assert report["targets"]["cffi_p99_ns_depth1024"]["met"] in (True, False)
