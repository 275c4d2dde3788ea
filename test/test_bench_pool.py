# SPDX-License-Identifier: Apache-2.0
"""`bench pool --quick` against real flowedge-relayd processes: its books are exact.

The quick run starts a pool of three relays (and one of two for the intake), kills, freezes and
joins members under load, and floods the intake. Its targets are measurements, never asserted;
what is asserted is the accounting the report is built from: every request sent is counted once
as answered once, answered more than once or missing, each answer once; every member's own
counters balance (what it took, it decided as owner or dropped as not_owner, and what it took
over, or held after its own stall and found unanswered when due, it decided); in the intake
every member took every request, exactly one member decided each, and the others dropped it.
"""

from __future__ import annotations

import argparse
import json

import pytest

from flowedge_relay_tools.bench import pool
from flowedge_relay_tools.bench.__main__ import SUBCOMMANDS

pytestmark = pytest.mark.ros


def test_quick_pool_bench_accounting_is_exact(tmp_path):
    parser = argparse.ArgumentParser()
    pool.add_arguments(parser)
    # a fixed nfe_ns instead of the inline calibration: the books, not the figures, are checked
    args = parser.parse_args(["--quick", "--nfe-ns", "3000000", "--intake-members", "1", "2"])
    report = pool.run(args)
    assert "pool" in SUBCOMMANDS
    for name in ("kill", "join", "freeze"):
        s = report[name]
        assert s["sent"] > 0, name
        assert s["answered_once"] + s["duplicated"] + s["missing"] == s["sent"], name
        assert s["answers"] == s["answered_once"] + s["duplicate_answers"], name
        assert s["duplicate_answers"] >= 2 * s["duplicated"], name
        assert 0 <= s["duplicates_tagged"] <= s["duplicated"], name
        o = s["outcomes"]
        first = sum(o.get(k, 0) for k in ("on_time", "late", "expired", "expired_unstarted",
                                          "taken_over_expired", "rejected_capacity",
                                          "rejected_deadline", "other"))
        assert first == s["sent"] - s["missing"], (name, o)
        assert s["books_balance"], f"{name}: {json.dumps(s['members'])}"
    k = report["kill"]
    assert sum(k[p]["sent"] for p in ("before", "during", "after")) == k["sent"]
    assert len(k["members"]) == 2  # the survivors
    assert report["join"]["sessions"] == 3 * 2 and report["join"]["moved_share"] <= 1
    sizes = report["intake"]
    assert [z["members"] for z in sizes] == [2, 1]
    for z in sizes:
        assert z["steps"] and z["steps"][0]["rate"] == pool.SIZES["quick"].intake_rates[0]
        full = [r for r in z["steps"] if not r["short"]]
        assert z["ceiling_rate"] == max((r["rate"] for r in full), default=0.0), z
        for r in z["steps"]:
            assert r["short"] == pool.shortfalls(r)
            assert r["sent"] > 0 and r["books_balance"], r
            if not r["middleware_lost"]:
                assert set(r["received"].values()) == {r["sent"]}, r
            assert r["pool_decided"] == sum(r["decided"].values())
            # one owner decision per request, plus one per request a member took over or held
            # after its own stall and decided when due (a member the host starved for a lease is
            # taken over, even here)
            assert sum(r["not_owner"].values()) + r["pool_decided"] == sum(
                r["received"].values()) + r["taken_over_requests"] + r["held_requests_decided"], r
            assert r["answered_once"] + r["duplicated"] + r["unanswered"] == r["sent"], r
            # each member's process did the work: CPU time read from /proc, over the step
            assert set(r["cpu_s"]) == set(r["decided"]), r
            cores = report["host_cores"]["allowed"]
            assert all(0 < v <= cores * r["wall_s"] for v in r["cpu_s"].values()), r
            assert 0 < r["generator_cpu_s"], r
    assert report["host_cores"]["allowed"] >= 1
    assert set(report["drop_over_decision"]) == {"4"}
    for key in ("off", "on"):  # (f): an owner past its capacity, spill off then on
        s = report["spill"][key]
        assert s["sent"] > 0 and s["answered_once"] + s["duplicated"] + s["missing"] == s["sent"]
        assert s["answered_by_owner"] + s["answered_by_others"] == s["sent"] - s["missing"]
    assert report["spill"]["off"]["spilled_out"] == 0
    text = pool.table(report)
    for part in ("(a) kill -9", "(b) join", "(c) SIGSTOP", "(d) 2 member(s)", "(f) spill on"):
        assert part in text
    json.dumps(report, allow_nan=False)
    png = pool.plot(report, str(tmp_path / "pool.png"))
    assert (tmp_path / "pool.png").stat().st_size > 0 and png.endswith(".png")
    # --intake-only's report: (d) and pool-sim's drop, nothing of (a)-(c) or (f)
    alone = {**report, "kill": None, "join": None, "freeze": None, "spill": None}
    alone["rows"] = pool.report_rows(alone)
    assert all(row["measure"].startswith("(d)") for row in alone["rows"])
    assert "(d) step by step" in pool.table(alone)
    pool.plot(alone, str(tmp_path / "intake.png"))
    assert (tmp_path / "intake.png").stat().st_size > 0
