# SPDX-License-Identifier: Apache-2.0
"""`bench fairness` at its quick size. With --sim the real C core in virtual time, so its figures
are deterministic for a seed and the fair-share targets can be checked, not only the report's
shape (docs/design.md §7.1). Against the real relay (the default) only the accounting and the
report's shape are checked, never a timing figure: the bench is a measurement on a shared host."""

from __future__ import annotations

import argparse
import json

import pytest

from flowedge_relay_tools.bench import fairness


def _run(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    fairness.add_arguments(parser)
    return fairness.run(parser.parse_args(argv))


def test_quick_run_shows_the_flood_starving_the_light_clients_only_without_the_share(tmp_path):
    report = _run(["--sim", "--quick"])
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
    report = _run(["--sim", "--quick", "--batch-slots", "2", "--rtc"])
    assert report["batch_slots"] == 2 and report["rtc"]
    assert report["targets_met"]["on"] == {k: True for k in fairness.TARGETS}
    assert all(c["mean_frozen_rows"] >= 1 for c in report["scenarios"]["on"]["clients"].values())


def test_registered_and_in_bench_all():
    """`make bench` runs the real relay at full size (fairness) and the simulation beside it."""
    from flowedge_relay_tools.bench.__main__ import SUBCOMMANDS
    from flowedge_relay_tools.bench.perfdoc import ORDER, ROOT

    assert SUBCOMMANDS["fairness"][0] == fairness.__name__
    script = (ROOT / "scripts" / "bench_all.sh").read_text()
    order = script.split("\nORDER=(", 1)[1].split(")", 1)[0].split()
    assert {"fairness", "fairness-sim"} <= set(order) and {"fairness", "fairness-sim"} <= set(ORDER)
    assert '[fairness]=""' in script  # no --sim: the relay
    assert '[fairness-sim]="--sim"' in script and "[fairness-sim]=fairness" in script


@pytest.mark.ros  # starts flowedge-relayd processes and a client node (conftest.py)
def test_quick_real_relay_run_answers_every_request_exactly_once(tmp_path):
    """One relay process, fair_share off, on and A weighted 2 set live through its parameter
    service and interleaved in blocks, four clients over DDS: every request sent is answered
    once, the relay decided each once, and what the clients count as admitted is what the relay
    accepted and did not displace; each block reports its goodput on against off."""
    report = _run(["--quick", "--nfe-ns", "1000000"])
    assert report["relay"] == "flowedge-relayd process" and report["nfe_ns"] == 1_000_000
    _answered_exactly_once(report)
    assert len(report["block_goodput"]) == report["blocks"] == 2
    assert all(set(b["vs_off"]) == {"on", "on_A_weight_2"} for b in report["block_goodput"])
    # fair_share off (set live between phases): no answer names the share as its reason
    off = report["scenarios"]["off"]["clients"]
    assert all(c["fair_share_rejections"] == 0 for c in off.values())
    assert "every request answered exactly once" in fairness.table(report)
    json.dumps(report, allow_nan=False)
    assert fairness.plot(report, str(tmp_path / "f.png")).endswith("f.png")


@pytest.mark.ros  # starts flowedge-relayd processes and a client node (conftest.py)
def test_quick_real_relay_run_with_batch_slots_and_prefix_requests():
    """The same against relays with two batch slots on one worker, serving the real-time
    chunking policy, every request carrying a prefix (its window the deadline that counts):
    exactly once, and every on-time chunk froze at least one row (d >= 1: the relay's finish
    bound lies after the send, where the prefix starts)."""
    report = _run(["--quick", "--nfe-ns", "1000000", "--workers", "1", "--batch-slots", "2",
                   "--rtc", "--nfe", "16", "64"])  # fmt: skip
    assert (report["batch_slots"], report["workers"], report["rtc"]) == (2, 1, True)
    assert report["model"].endswith("policy_rtc") and report["rtc_rows"] == 4  # its max delay
    _answered_exactly_once(report)
    served = [c for s in report["scenarios"].values() for c in s["clients"].values()
              if c["on_time"]]  # fmt: skip
    assert served and all(c["mean_frozen_rows"] >= 1 for c in served)
    json.dumps(report, allow_nan=False)


def _answered_exactly_once(report: dict) -> None:
    """Every request sent answered once, decided once by the relay, counted under one outcome,
    and what the clients count as admitted is what the relay accepted and did not displace."""
    assert set(report["accounting"]) == {"off", "on", "on_A_weight_2", "B alone", "C alone",
                                         "D alone"}  # fmt: skip
    for name, acc in report["accounting"].items():
        assert acc["sent"] > 0 and acc["lost"] == 0 and acc["extra_answers"] == 0, name
        assert acc["relay_decided"] == acc["sent"], name
        assert acc["relay_accepted"] - acc["relay_displaced"] == acc["client_admitted"], name
    assert report["exactly_once"]
    for scenario in report["scenarios"].values():
        assert set(scenario["clients"]) == set(fairness.CLIENTS)
        for c in scenario["clients"].values():  # every answer counted under one outcome
            assert c["offered"] == (c["admitted"] + c["fair_share_rejections"]
                                    + c["capacity_rejections"] + c["deadline_rejections"]
                                    + c["stale_rejections"] + c["expired_on_arrival"]
                                    + c["lost"])
            assert c["admitted"] == c["on_time"] + c["late"]


@pytest.mark.ros  # starts a pool of flowedge-relayd processes and a client node (conftest.py)
def test_quick_pool_run_reports_shares_per_relay_and_answers_every_request_once(tmp_path):
    """A pool of two relays, fair_share on in each, the four clients' sessions spread so that
    both members own some of every client's: every request is answered once, by the member
    owning its session, and each member reports every client's share of what it admitted. The
    lease is long enough that no stall of a loaded host passes for a member's death (a takeover
    would move sessions between members, §13)."""
    report = _run(["--quick", "--nfe-ns", "1000000", "--pool", "2", "--lease-ms", "5000"])
    assert report["pool"] == 2 and report["lease_ms"] == 5000
    assert report["exactly_once"], report["accounting"]
    assert report["accounting"]["answered_by_another_member"] == 0
    assert set(report["members"]) == {"r0", "r1"}
    for figures in report["members"].values():
        assert set(figures) == set(fairness.CLIENTS)
        assert sum(f["share_of_member"] for f in figures.values()) == pytest.approx(1.0)
    assert "shares per relay" in fairness.table(report)
    json.dumps(report, allow_nan=False)
    assert fairness.plot(report, str(tmp_path / "p.png")).endswith("p.png")
