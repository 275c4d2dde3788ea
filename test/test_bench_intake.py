# SPDX-License-Identifier: Apache-2.0
"""`bench intake` runs at a tiny size through the real node and reports every case it claims.

Only shapes and outcomes are checked, never a timing target: the bench is a measurement.
"""

from __future__ import annotations

import argparse
import json

import pytest

from flowedge_relay.validation import Reason
from flowedge_relay_tools.bench import intake

pytestmark = pytest.mark.ros  # every test here starts ROS (conftest.py)


def _run(argv: list[str]) -> dict:
    parser = argparse.ArgumentParser()
    intake.add_arguments(parser)
    return intake.run(parser.parse_args(argv))


def test_every_discard_reason_and_decided_outcome_is_measured_on_both_intakes():
    report = _run(["--quick", "--samples", "40", "--no-dds"])
    # The bench drives the single-vector model: the tensor-intake and real-time chunking
    # reasons of a policy package (test/test_intake.py, test/test_policy_serving.py) are
    # measured only where they apply to it (input_unexpected, prefix_unsupported).
    package_only = {Reason.INPUT_MISSING, Reason.INPUT_DUPLICATE, Reason.INPUT_DTYPE,
                    Reason.INPUT_SHAPE, Reason.INPUT_BYTES, Reason.INPUT_NOT_FINITE,
                    Reason.INPUT_BOOL_VALUE, Reason.REQUEST_TOO_LARGE, Reason.PREFIX_SHAPE,
                    Reason.ACTION_PERIOD_INVALID, Reason.PREFIX_NOT_FINITE}
    reasons = {f"discarded.{r.value}" for r in set(Reason) - package_only} - {
        "discarded.model_unavailable", "discarded.core_refused"}
    for name, rclpy_sees in (("c", set()), ("rclpy", {"discarded.request_malformed"})):
        rows = [r for r in report["rows"] if r["intake"] == name]
        assert {r["outcome"] for r in rows if r["kind"] == "discard"} == reasons - rclpy_sees
        assert {r["outcome"] for r in rows if r["kind"] == "decision"} == {
            "expired", "rejected_stale", "rejected_deadline", "rejected_capacity", "accepted"}
    for row in report["rows"]:  # the counters say each case did what its label says
        assert row["as_expected"], row
        assert row["n"] == 40 and 0 < row["us_p50"] <= row["us_p99"]
    assert report["all_cases_as_expected"]
    text = intake.table(report)
    assert "session_id_300_unicode" in text and "rejected_capacity" in text
    json.dumps(report, allow_nan=False)  # what --json writes


def test_over_dds_every_request_is_answered_once_and_the_ceiling_is_reported():
    """A low rate of each mix through a relay process: every request answered exactly once with
    what its kind is built to get; the report names the ceiling and any first loss."""
    report = _run(["--quick", "--samples", "5", "--rates", "500", "--seconds", "0.4"])
    assert [d["mix"] for d in report["dds"]] == ["expired", "rejected", "admitted", "mixed"]
    for d in report["dds"]:
        (step,) = d["steps"]
        assert step["sent"] == 200 and step["publish_failed"] == 0
        assert step["answered_once"] == step["sent"], (d["mix"], step)
        assert step["unanswered"] == step["duplicated"] == step["unexpected_codes"] == 0
        assert step["relay_received"] == step["sent"]
        assert d["ceiling_answered_per_s"] > 0 and d["first_loss_offered_per_s"] is None
    codes = {d["mix"]: set(d["steps"][0]["codes"]) for d in report["dds"]}
    assert codes["expired"] == {"expired"} and "inference" in codes["admitted"]
    assert codes["mixed"] >= {"expired", "inference"}
    assert "answered in full up to" in intake.table(report)


def test_each_kind_of_the_load_generator_is_the_request_its_label_says():
    """The C load generator's requests read back by rclpy: each kind's deadline and NFE, in
    the pattern's order, with sequences and sessions as fer_loadgen.h says."""
    import rclpy
    from flowedge_relay_msgs.msg import InferenceRequest
    from rclpy.serialization import deserialize_message, serialize_message

    from flowedge_relay.model import default_model_path
    from flowedge_relay.timebase import stamp_ns
    from flowedge_relay_tools.bench.loadgen import LoadGenerator
    from flowedge_relay_tools.harness import load_served, ros_context

    now = 1_700_000_000_123_456_789
    with ros_context() as ctx:
        node = rclpy.create_node("flowedge_test_load", context=ctx)
        gen = LoadGenerator(node, load_served(default_model_path()))
        load = gen.load(["expired", "rejected", "admitted", "due"], 100.0, 8, sessions=3,
                        rejected_nfe=40, rejected_slack_ns=7_000_000, due_nfe=5,
                        due_slack_ns=30_000_000)  # fmt: skip
        raw = [gen.request_bytes(load, i, now) for i in range(8)]
        msgs = [deserialize_message(b, InferenceRequest) for b in raw]
        node.destroy_node()
    # the bench client writes its requests by hand (tools/csrc/fer_loadgen.c): rclpy reads them by
    # the .msg, and writes the same message to the same length, so no field is missing or extra
    assert [len(b) for b in raw] == [len(serialize_message(m)) for m in msgs]
    kinds = [(stamp_ns(m.deadline) - now if stamp_ns(m.deadline) else None, m.remaining_nfe)
             for m in msgs]  # fmt: skip
    assert kinds == [(-1_000_000, 1), (7_000_000, 40), (None, 1), (30_000_000, 5)] * 2
    assert [m.sequence for m in msgs] == [load.base_sequence + i for i in range(8)]
    assert [m.session_id for m in msgs] == [f"lg{i % 3}" for i in range(8)]
    assert all(stamp_ns(m.origin_stamp) == now for m in msgs)
