"""`bench intake` runs at a tiny size through the real node and reports every case it claims.

Only shapes and outcomes are checked, never a timing target: the bench is a measurement.
"""

from __future__ import annotations

import argparse
import json

import pytest

from flowedge_relay.tooling.bench import intake
from flowedge_relay.validation import Reason

pytestmark = pytest.mark.ros  # every test here starts ROS (conftest.py)


def _run(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    intake.add_arguments(parser)
    return intake.run(parser.parse_args(argv))


def test_every_discard_reason_and_decided_outcome_is_measured_and_really_happened():
    report = _run(["--quick", "--samples", "40", "--no-dds"])
    discards = {r["outcome"] for r in report["rows"] if r["kind"] == "discard"}
    decisions = {r["outcome"] for r in report["rows"] if r["kind"] == "decision"}
    # The bench drives the single-vector model: the tensor-intake reasons of a policy package
    # (test/test_policy_serving.py) are measured only where they apply to it (input_unexpected).
    package_only = {Reason.INPUT_MISSING, Reason.INPUT_DUPLICATE, Reason.INPUT_DTYPE,
                    Reason.INPUT_SHAPE, Reason.INPUT_BYTES, Reason.INPUT_NOT_FINITE,
                    Reason.INPUT_BOOL_VALUE, Reason.REQUEST_TOO_LARGE}
    assert discards == {f"discarded.{r.value}" for r in set(Reason) - package_only} - {
        "discarded.model_unavailable", "discarded.core_refused"}
    assert decisions == {"expired", "rejected_stale", "rejected_deadline", "rejected_capacity",
                         "accepted"}
    for row in report["rows"]:  # the counters say each case did what its label says
        assert row["as_expected"], row
        assert row["n"] == 40 and 0 < row["callback_us_p50"] <= row["callback_us_p99"]
    assert report["all_cases_as_expected"]
    text = intake.table(report)
    assert "session_id_300_unicode" in text and "rejected_capacity" in text
    json.dumps(report, allow_nan=False)  # what --json writes


def test_over_dds_every_message_is_received_or_reported_lost():
    report = _run(["--quick", "--samples", "5", "--dds-messages", "600"])
    assert [d["mix"] for d in report["dds"]] == ["invalid", "expired", "flood"]
    for d in report["dds"]:
        assert d["received"] + d["middleware_lost"] == d["sent"] and d["unaccounted"] == 0
        assert d["sent"] + d["publish_failures"] == 600
