# SPDX-License-Identifier: Apache-2.0
"""`bench fairness` at its quick size: the real C core in virtual time, so its figures are
deterministic for a seed and the fair-share targets can be checked, not only the report's
shape (docs/design.md §7.1)."""

from __future__ import annotations

import argparse
import json

from flowedge_relay.tooling.bench import fairness


def _run(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    fairness.add_arguments(parser)
    return fairness.run(parser.parse_args(argv))


def test_quick_run_shows_the_flood_starving_the_light_clients_only_without_the_share(tmp_path):
    report = _run(["--quick"])
    off, on = report["scenarios"]["off"]["clients"], report["scenarios"]["on"]["clients"]
    for name in ("B", "C", "D"):
        assert off[name]["vs_alone"] < 0.5  # A took most of their service
        assert on[name]["vs_alone"] >= fairness.TARGETS["light_vs_alone"]
        assert on[name]["fair_share_rejections"] <= 2
    assert on["A"]["fair_share_rejections"] > 0 and off["A"]["fair_share_rejections"] == 0
    assert report["targets_met"]["on"] == {k: True for k in fairness.TARGETS}
    for scenario in report["scenarios"].values():  # every admitted request ended on time
        assert all(c["on_time_among_admitted"] == 1.0 for c in scenario["clients"].values())
    assert "fair-share rejections" in fairness.table(report)
    json.dumps(report, allow_nan=False)
    assert fairness.plot(report, str(tmp_path / "f.png")).endswith("f.png")


def test_batch_slots_and_prefix_requests_keep_the_share():
    """B > 1 (a step advances every row a worker holds) and real-time chunking prefixes."""
    report = _run(["--quick", "--batch-slots", "2", "--rtc"])
    assert report["batch_slots"] == 2 and report["rtc"]
    assert report["targets_met"]["on"] == {k: True for k in fairness.TARGETS}
    assert all(c["mean_frozen_rows"] >= 1 for c in report["scenarios"]["on"]["clients"].values())


def test_registered_and_in_bench_all():
    from flowedge_relay.tooling.bench.__main__ import SUBCOMMANDS
    from flowedge_relay.tooling.bench.perfdoc import ORDER, ROOT

    assert SUBCOMMANDS["fairness"][0] == fairness.__name__
    assert "fairness" in ORDER
    assert "fairness" in (ROOT / "scripts" / "bench_all.sh").read_text()
