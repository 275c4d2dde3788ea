"""`bench intake`: what one request costs the relay's request thread, discarded or decided.

    flowedge_relay_bench intake [--quick] [--json PATH]

Two measurements, both on the real node:

- callback: real `InferenceRequest` objects (serialized and deserialized as the subscription
  delivers them) handed to `RelayNode._on_request`, the subscription's callback, one by one;
  us per message for each discard reason (the issue-14 flood: 300-character Unicode session
  ids, 5,000-character digests, 4,096-float observations, NaN/Inf, NFE 0 or 2^32-1, absurd
  dims) and for each decided outcome (EXPIRED, REJECTED_STALE, REJECTED_DEADLINE,
  REJECTED_CAPACITY, ACCEPTED), side by side. The outcome each case really produced is read
  back from the core's counters, not assumed. `take_us` is rclpy's CDR-to-Python conversion of
  that message (what the executor pays before the callback). A decision's cost includes the
  GIL it shares with the publisher thread, which answers it at the same time.
- over DDS: a producer process (`python -m flowedge_relay.tooling.stress produce`) publishes as fast
  as it can to a relay spinning as in production; the relay's receive rate per mix (all
  invalid, all valid-and-expired, the issue-14 flood), and what the middleware reported lost.

A measurement, not a test: a busy host shows. The claim it backs (issue 14): discarding an
invalid request costs less than deciding a valid one, so invalid input is no cheap denial of
service, and the request thread's ceiling is set by rclpy's executor, not by validation.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import subprocess
import time

import numpy as np

from flowedge_relay.core import CODE_KEYS
from flowedge_relay.tooling.bench.progress import Progress
from flowedge_relay.tooling.bench.tables import format_rows

UINT32_MAX = 2**32 - 1
OUTCOMES = CODE_KEYS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes (CI)")
    parser.add_argument("--samples", type=int, default=None,
                        help="messages per callback case (default 3000; quick 300)")
    parser.add_argument("--dds-messages", type=int, default=None,
                        help="messages per over-DDS run (default 20000; quick 2000)")
    parser.add_argument("--dds-rate", type=float, default=20_000.0,
                        help="offered rate of the over-DDS runs, msg/s (above the ceiling)")
    parser.add_argument("--no-dds", action="store_true", help="callback costs only")


# -- callback costs --------------------------------------------------------------------------


def _roundtrip(msg):
    """The message as the subscription hands it over (float32[] as array.array, etc.)."""
    from flowedge_relay_msgs.msg import InferenceRequest
    from rclpy.serialization import deserialize_message, serialize_message

    return deserialize_message(serialize_message(msg), InferenceRequest)


def _take_us(msg, n: int) -> tuple[float, int]:
    from flowedge_relay_msgs.msg import InferenceRequest
    from rclpy.serialization import deserialize_message, serialize_message

    data = serialize_message(msg)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        deserialize_message(data, InferenceRequest)
    return (time.perf_counter_ns() - t0) / n / 1e3, len(data)


def _discard_cases(builder, rng) -> list[tuple[str, str, dict]]:
    """(case, discard reason, fields) for one broken field each."""
    from builtin_interfaces.msg import Time
    from flowedge_relay_msgs.msg import Tensor

    m = builder.model
    sid300 = "".join(chr(rng.randrange(0x100, 0xD7FF)) for _ in range(300))
    return [
        ("session_id_empty", "session_id_empty", {"session_id": ""}),
        ("session_id_300_unicode", "session_id_too_long", {"session_id": sid300}),
        ("digest_5000_chars", "model_digest_mismatch", {"model_digest": "sha256:" + "e" * 4993}),
        ("dims_u32_max", "dims_mismatch", {"observation_dim": UINT32_MAX}),
        ("observation_4096_floats", "observation_length",
         {"observation": [0.5] * 4096}),
        ("observation_nan", "observation_not_finite",
         {"observation": [math.nan] + [0.1] * (m.obs_dim - 1)}),
        ("remaining_nfe_0", "remaining_nfe_zero", {"remaining_nfe": 0}),
        ("remaining_nfe_u32_max", "remaining_nfe_above_max", {"remaining_nfe": UINT32_MAX}),
        ("retry_reason_200", "retry_reason_unknown", {"retry_reason": 200, "retry_count": 1}),
        ("deadline_negative", "time_invalid", {"deadline": Time(sec=-5, nanosec=0)}),
        ("tensor_to_single_vector_model", "input_unexpected",
         {"inputs": [Tensor(name="image", dtype=Tensor.UINT8, shape=[4], data=[0, 1, 2, 3])]}),
    ]


def _time_calls(relay, msgs) -> np.ndarray:
    lat = np.empty(len(msgs), np.int64)
    on_request = relay.handle_request
    clock = time.perf_counter_ns
    gc.collect()
    gc.disable()
    try:
        for k, msg in enumerate(msgs):
            t0 = clock()
            on_request(msg)
            lat[k] = clock() - t0
    finally:
        gc.enable()
    return lat


def _observed(relay, before) -> dict[str, int]:
    """What the core and validator counted since `before` (a (stats, discarded) pair)."""
    st0, disc0 = before
    st = relay.core.stats()
    out = {name: st.outcomes[i] - st0.outcomes[i] for i, name in enumerate(OUTCOMES)}
    out["accepted"] = st.accepted - st0.accepted
    for reason, count in relay.validator.discarded.items():
        if count - disc0[reason]:
            out[f"discarded.{reason.value}"] = count - disc0[reason]
    return {k: v for k, v in out.items() if v}


def _mark(relay):
    return relay.core.stats(), dict(relay.validator.discarded)


def _row(kind: str, case: str, expected: str, lat: np.ndarray, take: tuple[float, int],
         observed: dict[str, int]) -> dict:
    us = lat / 1e3
    return {
        "kind": kind,
        "case": case,
        "outcome": expected,
        "take_us": round(take[0], 2),
        "callback_us_mean": round(float(us.mean()), 2),
        "callback_us_p50": round(float(np.percentile(us, 50)), 2),
        "callback_us_p99": round(float(np.percentile(us, 99)), 2),
        "bytes": take[1],
        "n": int(lat.size),
        "observed": observed,
        "as_expected": observed.get(expected, 0) == int(lat.size),
    }


def callback_costs(n: int, bar: Progress | None = None) -> list[dict]:
    """us per message through RelayNode._on_request, by discard reason and by outcome."""
    import random

    from rclpy.parameter import Parameter

    from flowedge_relay.node import RelayNode
    from flowedge_relay.tooling.bench.client import wait_idle
    from flowedge_relay.tooling.harness import ros_context
    from flowedge_relay.tooling.stress import Contract, RequestBuilder

    rows = []
    rng = random.Random(1)
    with ros_context() as ctx:
        # Not spinning: this thread is the request thread (the core's single submitter).
        relay = RelayNode(context=ctx, parameter_overrides=[
            Parameter("workers", value=1), Parameter("queue_capacity", value=2 * n + 64)])
        try:
            m = relay.model
            b = RequestBuilder(Contract.of(m))

            def req(i: int, **fields):
                return _roundtrip(b.request(**{"sequence": i, "remaining_nfe": 1,
                                               "noise_seed": i, **fields}))

            for case, reason, fields in _discard_cases(b, rng):
                msg = req(0, **{"session_id": "d", **fields})
                before = _mark(relay)
                lat = _time_calls(relay, [msg] * n)
                rows.append(_row("discard", case, f"discarded.{reason}", lat,
                                 _take_us(msg, n), _observed(relay, before)))
                if bar:
                    bar.advance(label=case)

            def decide(case: str, outcome: str, msgs) -> None:
                before = _mark(relay)
                lat = _time_calls(relay, msgs)
                rows.append(_row("decision", case, outcome, lat, _take_us(msgs[0], n),
                                 _observed(relay, before)))
                if bar:
                    bar.advance(label=case)

            seq = iter(range(1, 10**9))
            decide("deadline_passed", "expired",
                   [req(next(seq), session_id=f"e{i % 8}", deadline_ms=-1) for i in range(n)])
            # the newer generation first, then older ones: REJECTED_STALE
            relay.handle_request(req(next(seq), session_id="st", generation=10))
            decide("older_generation", "rejected_stale",
                   [req(next(seq), session_id="st", generation=1) for _ in range(n)])
            wait_idle(relay, 60.0)
            # one NFE "costs" a minute: a deadline 10 s away (that cannot pass while the
            # messages are built) is out of reach
            relay.set_parameters([Parameter("nfe_ns", value=60_000_000_000)])
            decide("deadline_unreachable", "rejected_deadline",
                   [req(next(seq), session_id=f"d{i % 8}", deadline_ms=10_000)
                    for i in range(n)])
            relay.set_parameters([Parameter("nfe_ns", value=0)])
            wait_idle(relay, 60.0)
            decide("accepted_then_run", "accepted",
                   [req(next(seq), session_id=f"a{i % 8}") for i in range(n)])
            wait_idle(relay, 60.0)
            # one request holds the worker (64 NFE x 0.5 s, released below by clearing the
            # delay, read per NFE), the queue fills: later ones find no room
            relay.set_parameters([Parameter("fault_nfe_delay_ms", value=500.0)])
            relay.handle_request(req(next(seq), session_id="hold",
                                  remaining_nfe=relay.validator.max_nfe))
            time.sleep(0.2)
            for i in range(relay.get_parameter("queue_capacity").value):
                relay.handle_request(req(next(seq), session_id=f"f{i % 8}"))
            decide("queue_full", "rejected_capacity",
                   [req(next(seq), session_id=f"c{i % 8}") for i in range(n)])
            relay.set_parameters([Parameter("fault_nfe_delay_ms", value=0.0)])
            wait_idle(relay, 60.0)
        finally:
            relay.destroy_node()
    return rows


# -- receive rate over DDS -------------------------------------------------------------------


def dds_rate(mix: str, messages: int, rate: float) -> dict:
    """A producer process floods `mix` at `rate`; the relay's callback rate and what the
    middleware reported lost, measured in the relay's process."""
    import tempfile
    from pathlib import Path

    from flowedge_relay.tooling.harness import running_relay
    from flowedge_relay.tooling.stress import Contract, producer_command, received

    with running_relay(workers=1) as h, tempfile.TemporaryDirectory() as tmp:
        relay = h.relay
        h.keep_answers = False
        r0, lost0 = received(relay), relay.counters().middleware_lost
        proc = subprocess.Popen(
            producer_command(Contract.of(h.model), rate=rate, count=messages, mix=mix,
                             oracle=str(Path(tmp) / "oracle.npz"),
                             max_nfe=relay.validator.max_nfe),
            stdout=subprocess.PIPE, text=True)
        samples = []  # (t, received, lost)
        t_end = time.monotonic() + 120
        while time.monotonic() < t_end:
            got = received(relay) - r0
            lost = relay.counters().middleware_lost - lost0
            samples.append((time.monotonic(), got, lost))
            if got + lost >= messages or (proc.poll() is not None and len(samples) > 40
                                          and samples[-40][1:] == (got, lost)):
                break
            time.sleep(0.05)
        out, _ = proc.communicate(timeout=120)
        produced = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    t = np.array([s[0] for s in samples])
    got = np.array([s[1] for s in samples])
    lo, hi = 0.1 * got[-1], 0.9 * got[-1]  # the steady middle of the run
    i0, i1 = int(np.searchsorted(got, lo)), int(np.searchsorted(got, hi))
    rate_rx = (got[i1] - got[i0]) / (t[i1] - t[i0]) if i1 > i0 and t[i1] > t[i0] else 0.0
    sent = int(produced.get("sent", messages))  # a publish the producer's history refused
    return {                                      # failed there, with an error: not sent
        "mix": mix,
        "offered_per_s": produced.get("achieved_rate_per_s", 0.0),
        "sent": sent,
        "publish_failures": int(produced.get("publish_failures", 0)),
        "received": int(got[-1]),
        "middleware_lost": int(samples[-1][2]),
        "received_per_s": round(float(rate_rx), 1),
        "us_per_message": round(1e6 / rate_rx, 1) if rate_rx else None,
        "unaccounted": sent - int(got[-1]) - int(samples[-1][2]),
    }


def run(args: argparse.Namespace) -> dict:
    n = args.samples or (300 if args.quick else 3000)
    dds_n = args.dds_messages or (2000 if args.quick else 20_000)
    mixes = () if args.no_dds else ("invalid", "expired", "flood")
    with Progress("intake", 15 + len(mixes)) as bar:
        rows = callback_costs(n, bar)
        dds = []
        for mix in mixes:
            bar.update(label=f"over DDS: {mix}")
            dds.append(dds_rate(mix, dds_n, args.dds_rate))
            bar.advance()
    discards = [r["callback_us_mean"] for r in rows if r["kind"] == "discard"]
    decisions = [r["callback_us_mean"] for r in rows if r["kind"] == "decision"]
    return {
        "samples_per_case": n,
        "rows": rows,
        "dds": dds,
        "discard_us_max": max(discards),
        "decision_us_min": min(decisions),
        "discard_cheaper_than_any_decision": max(discards) < min(decisions),
        "all_cases_as_expected": all(r["as_expected"] for r in rows),
    }


def table(report: dict) -> str:
    discard = [r for r in report["rows"] if r["kind"] == "discard"]
    decision = [r for r in report["rows"] if r["kind"] == "decision"]
    side = []
    for k in range(max(len(discard), len(decision))):
        d = discard[k] if k < len(discard) else None
        v = decision[k] if k < len(decision) else None
        side.append({
            "discard (reason)": d["outcome"].split(".", 1)[1] if d else "",
            "case": d["case"] if d else "",
            "us/msg": d["callback_us_mean"] if d else None,
            "p99": d["callback_us_p99"] if d else None,
            "take us": d["take_us"] if d else None,
            "| decision (outcome)": ("| " + v["outcome"]) if v else "|",
            "case ": v["case"] if v else "",
            "us/msg ": v["callback_us_mean"] if v else None,
            "p99 ": v["callback_us_p99"] if v else None,
            "take us ": v["take_us"] if v else None,
        })
    lines = [
        f"callback (RelayNode._on_request), {report['samples_per_case']} real messages per case:",
        format_rows(side),
        f"slowest discard {report['discard_us_max']} us < cheapest decision "
        f"{report['decision_us_min']} us: {report['discard_cheaper_than_any_decision']}; "
        f"every case produced its outcome: {report['all_cases_as_expected']}",
    ]
    if report["dds"]:
        lines += ["", "over DDS (producer process -> relay's request thread):",
                  format_rows(report["dds"])]
    return "\n".join(lines)
