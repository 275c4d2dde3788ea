# SPDX-License-Identifier: Apache-2.0
"""`bench swap` runs at a small size against a relay process and reports what it claims.

Only accounting and shapes are checked, never the pause itself: the bench is a measurement
(test/test_swap.py checks the contract)."""

from __future__ import annotations

import argparse
import json

import pytest

from flowedge_relay_tools.bench import swap

pytestmark = pytest.mark.ros  # the bench starts a relay process and a client (conftest.py)


def test_each_swap_is_measured_and_every_request_is_accounted_for():
    parser = argparse.ArgumentParser()
    swap.add_arguments(parser)
    report = swap.run(parser.parse_args(["--quick", "--load", "0.5"]))
    assert [r["swap to"] for r in report["rows"]] == ["bench", "small"]
    for row in report["rows"]:
        assert row["set ms"] > 0 and row["longest answer gap ms"] > 0
        assert row["steady gap before ms"] > 0
    assert report["sent"] > 100
    assert report["lost"] == 0 and report["answered_twice"] == 0
    assert report["answered"] + report["discarded_model_digest_mismatch"] == report["sent"]
    assert report["echo_not_the_digest_sent"] == 0
    assert report["codes"]["inference"] > 0
    for policy in report["policies"].values():
        assert policy["capacity_rps"] > 0 and policy["nfe_ns"] > 0
    assert "longest answer gap ms" in swap.table(report)
    json.dumps(report, allow_nan=False)  # what --json writes
