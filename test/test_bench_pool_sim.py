# SPDX-License-Identifier: Apache-2.0
"""`bench pool-sim` runs at a tiny size and reports the keys the docs read.

Only shapes and the simulation's exact facts are checked (a failure moves only the dead member's
sessions, a joiner takes sessions only for itself), never a timing target: those are measured.
"""

from __future__ import annotations

import argparse
import json

from flowedge_relay_tools.bench import pool_sim
from flowedge_relay_tools.bench.__main__ import SUBCOMMANDS


def test_quick_report_shape():
    parser = argparse.ArgumentParser()
    pool_sim.add_arguments(parser)
    report = pool_sim.run(parser.parse_args(["--quick", "--samples", "200"]))
    assert "pool-sim" in SUBCOMMANDS
    sims = report["simulation"]
    assert [(s["relays"], s["sessions"]) for s in sims] == [(16, 3200), (16, 200)]
    for s in sims:
        assert s["owned_min"] <= s["owned_mean"] <= s["owned_max"]
        assert s["failure_moved"] == s["failure_dead_owned"] > 0
        assert s["failure_moved_not_dead"] == 0 and s["join_moved_elsewhere"] == 0
        assert 0 < s["join_took"] < s["sessions"]
    assert report["failure_moves_only_dead"] is True
    cases = {(r["members"], r["case"]) for r in report["intake"]}
    for m in (4, 8):
        for case in ("not_owner drop", "not_owner drop, unseen sessions", "successor standby",
                     "decision: admitted",
                     "decision: expired", "timer alone"):
            assert (m, case) in cases
    for r in report["intake"]:
        assert 0 < r["ns_p50"] <= r["ns_p99"]
    assert set(report["drop_over_decision"]) == {"4", "8"}
    assert set(report["drop_over_decision_unseen_sessions"]) == {"4", "8"}
    assert "not_owner drop" in pool_sim.table(report)
    json.dumps(report, allow_nan=False)
