# SPDX-License-Identifier: Apache-2.0
"""`bench intake`: what a request costs the relay's intake, and how many per second it answers.

    flowedge_relay_bench intake [--quick] [--json PATH] [--no-dds] [--rates R ...] [--mixes M ...]

Two measurements, both on the real node:

- per message, the two intakes side by side: the C intake (csrc/fer_intake.h: parse, validate,
  submit, on the CDR bytes the subscription delivers) and the rclpy one (rclpy's CDR-to-Python
  conversion, `take_us`, then the request callback), for each discard reason (the flood's
  300-character Unicode session ids, 5,000-character digests, 4,096-float observations, NaN,
  NFE 0 or 2^32-1, absurd dims; bytes that are no InferenceRequest at all, which rclpy drops
  before its callback) and each decided outcome (EXPIRED, REJECTED_STALE, REJECTED_DEADLINE,
  REJECTED_CAPACITY, ACCEPTED). The outcome each case really produced is read back from the
  relay's counters, not assumed.
- over DDS: a relay process (as deployed) and a client that is not the limit
  (bench/loadgen.py: requests published on schedule and answers tallied in C), offered
  a rising rate of valid requests of one mix (expired on arrival, rejected by admission,
  admitted, or all three): per step, what was answered exactly once, what went unanswered and
  what the relay counted lost. The ceiling is the highest rate answered in full; the first loss
  says where the rate stops being survivable.

A measurement, not a test: a busy host shows.
"""

from __future__ import annotations

import argparse
import gc
import math
import time

import numpy as np

from flowedge_relay.core import CODE_KEYS
from flowedge_relay_tools.bench.progress import Progress
from flowedge_relay_tools.bench.tables import format_rows

UINT32_MAX = 2**32 - 1
OUTCOMES = CODE_KEYS
INTAKES = ("c", "rclpy")
MIXES = {"expired": ["expired"], "rejected": ["rejected"], "admitted": ["admitted"],
         "mixed": ["expired", "rejected", "admitted"]}
RATES = (5_000, 10_000, 15_000, 20_000, 25_000, 30_000, 40_000)
QUICK_RATES = (1_000, 3_000)
CODE_NAMES = dict(enumerate(CODE_KEYS))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sizes (CI)")
    parser.add_argument("--samples", type=int, default=None,
                        help="messages per per-message case (default 3000; quick 300)")
    parser.add_argument("--no-dds", action="store_true", help="per-message costs only")
    parser.add_argument("--mixes", nargs="+", choices=sorted(MIXES), default=None,
                        help="over-DDS mixes (default: all four)")
    parser.add_argument("--rates", nargs="+", type=float, default=None,
                        help="offered rates of the over-DDS ramp, requests/s "
                             f"(default {' '.join(map(str, RATES))})")
    parser.add_argument("--seconds", type=float, default=None,
                        help="seconds per ramp step (default 3; quick 0.3)")


# -- per message -----------------------------------------------------------------------------


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
        ("client_id_300_unicode", "client_id_too_long", {"client_id": sid300}),
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
        ("prefix_to_model_without_rtc", "prefix_unsupported",
         {"prefix_actions": [0.5] * m.action_dim}),
    ]


def _time_calls(call, items) -> np.ndarray:
    lat = np.empty(len(items), np.int64)
    clock = time.perf_counter_ns
    gc.collect()
    gc.disable()
    try:
        for k, item in enumerate(items):
            t0 = clock()
            call(item)
            lat[k] = clock() - t0
    finally:
        gc.enable()
    return lat


def _observed(node, before) -> dict[str, int]:
    """What the core and the intake counted since `before` (a (stats, discarded) pair)."""
    st0, disc0 = before
    st = node.relay.core.stats()
    out = {name: st.outcomes[i] - st0.outcomes[i] for i, name in enumerate(OUTCOMES)}
    out["accepted"] = st.accepted - st0.accepted
    for reason, count in node.relay.counters().discarded.items():
        if count - disc0[reason]:
            out[f"discarded.{reason}"] = count - disc0[reason]
    return {k: v for k, v in out.items() if v}


def _mark(node):
    return node.relay.core.stats(), node.relay.counters().discarded


def _stats(lat: np.ndarray) -> dict:
    us = lat / 1e3
    return {"us_mean": round(float(us.mean()), 2), "us_p50": round(float(np.percentile(us, 50)), 2),
            "us_p99": round(float(np.percentile(us, 99)), 2)}


def _cases(node, n: int, rng, run_case) -> None:
    """Every case once on `node` (not spinning: this thread is its submit producer), through
    run_case(kind, case, expected outcome, messages, prepare=(), settle_s=0): `prepare` goes
    first, untimed, with settle_s after its first message."""
    from rclpy.parameter import Parameter

    from flowedge_relay_tools.bench.client import LocalRelay, wait_idle
    from flowedge_relay_tools.stress import Contract, RequestBuilder

    relay = LocalRelay(node)

    b = RequestBuilder(Contract.of(node.relay.model))

    def req(i: int, **fields):
        return _roundtrip(b.request(**{"sequence": i, "remaining_nfe": 1, "noise_seed": i,
                                       **fields}))

    for case, reason, fields in _discard_cases(b, rng):
        run_case("discard", case, f"discarded.{reason}",
                 [req(0, **{"session_id": "d", **fields})] * n)
    run_case("discard", "not_an_inference_request", "discarded.request_malformed",
             [b"\x00\x01\x00\x00" + bytes(range(60))] * n)
    seq = iter(range(1, 10**9))
    run_case("decision", "deadline_passed", "expired",
             [req(next(seq), session_id=f"e{i % 8}", deadline_ms=-1) for i in range(n)])
    # the newer generation first, then older ones: REJECTED_STALE
    newer = req(next(seq), session_id="st", generation=10)
    run_case("decision", "older_generation", "rejected_stale",
             [req(next(seq), session_id="st", generation=1) for _ in range(n)], prepare=[newer])
    wait_idle(relay, 60.0)
    # one NFE "costs" a minute: a deadline 10 s away (that cannot pass while the messages are
    # built) is out of reach
    node.set_parameters([Parameter("nfe_ns", value=60_000_000_000)])
    run_case("decision", "deadline_unreachable", "rejected_deadline",
             [req(next(seq), session_id=f"d{i % 8}", deadline_ms=10_000) for i in range(n)])
    node.set_parameters([Parameter("nfe_ns", value=0)])
    wait_idle(relay, 60.0)
    run_case("decision", "accepted_then_run", "accepted",
             [req(next(seq), session_id=f"a{i % 8}") for i in range(n)])
    wait_idle(relay, 60.0)
    # one request holds the worker (max_nfe NFE x 0.5 s, released below by clearing the delay,
    # read per NFE), the queue fills: later ones find no room
    node.set_parameters([Parameter("fault_nfe_delay_ms", value=500.0)])
    hold = [req(next(seq), session_id="hold", remaining_nfe=node.relay.validator.max_nfe)]
    fill = [req(next(seq), session_id=f"f{i % 8}")
            for i in range(node.get_parameter("queue_capacity").value)]
    run_case("decision", "queue_full", "rejected_capacity",
             [req(next(seq), session_id=f"c{i % 8}") for i in range(n)], prepare=hold + fill,
             settle_s=0.2)
    node.set_parameters([Parameter("fault_nfe_delay_ms", value=0.0)])
    wait_idle(relay, 60.0)


def intake_costs(n: int, intake: str, bar: Progress | None = None) -> list[dict]:
    """us per message through one intake (`c` or `rclpy`), by discard reason and by outcome."""
    import random

    from rclpy.parameter import Parameter
    from rclpy.serialization import serialize_message

    from flowedge_relay.node import RelayNode
    from flowedge_relay_tools.harness import ros_context

    rows = []
    with ros_context() as ctx:
        node = RelayNode(context=ctx, drill=True, parameter_overrides=[
            Parameter("workers", value=1), Parameter("queue_capacity", value=2 * n + 64),
            Parameter("intake_loop", value="auto" if intake == "c" else "python")])
        try:
            if node.relay.intake_loop != ("native" if intake == "c" else "python"):
                raise RuntimeError(
                    f"the {intake} intake is not available: {node.relay.intake_note}")
            if intake == "c":
                call = node.relay.handle_serialized
                wire = lambda m: m if isinstance(m, bytes) else serialize_message(m)  # noqa: E731
            else:
                call = node.requests.handle
                wire = lambda m: m  # noqa: E731

            def run_case(kind, case, expected, msgs, prepare=(), settle_s=0.0) -> None:
                if intake == "rclpy" and isinstance(msgs[0], bytes):
                    return  # rclpy's take drops bytes that are no message before its callback
                for k, m in enumerate(prepare):
                    call(wire(m))
                    if k == 0:
                        time.sleep(settle_s)  # the first one reaches its worker
                items = [wire(m) for m in msgs]
                before = _mark(node)
                lat = _time_calls(call, items)
                observed = _observed(node, before)
                row = {"kind": kind, "case": case, "outcome": expected, "intake": intake,
                       "n": int(lat.size), **_stats(lat), "observed": observed,
                       "as_expected": observed.get(expected, 0) == int(lat.size)}
                if intake == "rclpy":
                    row["take_us"], row["bytes"] = (round(v, 2) if isinstance(v, float) else v
                                                    for v in _take_us(msgs[0], n))
                rows.append(row)
                if bar:
                    bar.advance(label=f"{intake}: {case}")

            _cases(node, n, random.Random(1), run_case)
        finally:
            node.destroy_node()
    return rows


# -- decisions per second over DDS -----------------------------------------------------------


def dds_ramp(mixes, rates, seconds: float, bar: Progress | None = None) -> list[dict]:
    """Each mix at each offered rate against one relay process; per step the answers tallied
    in C and what the relay counted lost (its flowedge/stats)."""
    from flowedge_relay_tools.bench.loadgen import EXPECTED_CODES, relay_under_load

    # admission on, one NFE "costing" a minute: a rejected request (due in 10 s) cannot fit,
    # however late it arrives, and no answer's code depends on the host's speed
    out = []
    with relay_under_load(workers=1, nfe_ns=60_000_000_000) as (relay, gen, _):
        for mix in mixes:
            steps = []
            for rate in rates:
                before = relay.stats()
                r = gen.run(gen.load(MIXES[mix], rate, max(1, int(rate * seconds))),
                            drain_s=3.0 + seconds)
                time.sleep(0.3)  # the relay's counters of the step's last messages
                after = relay.stats()
                answered = r.codes[r.answers > 0]
                expected = set().union(*(EXPECTED_CODES[k] for k in MIXES[mix]))
                steps.append({
                    "offered_per_s": round(r.offered_per_s(), 1),
                    "sent": r.sent,
                    "publish_failed": r.publish_failed,
                    "answered_once": r.answered_once,
                    "unanswered": r.unanswered,
                    "duplicated": r.duplicated,
                    "answered_per_s": round(r.answered_per_s(), 1),
                    "relay_received": after.received - before.received,
                    "relay_middleware_lost": after.middleware_lost - before.middleware_lost,
                    "relay_outputs_dropped": after.outputs_dropped - before.outputs_dropped,
                    "codes": {CODE_NAMES[int(c)]: int((answered == c).sum())
                              for c in np.unique(answered)},
                    "unexpected_codes": int(sum((answered == c).sum()
                                                for c in np.unique(answered)
                                                if int(c) not in expected)),
                    "sender_behind_max_ms": round(r.behind_max_ns / 1e6, 1),
                })
                if bar:
                    bar.advance(label=f"over DDS: {mix} at {rate:g}/s")
            out.append(_ceiling(mix, steps))
    return out


def _ceiling(mix: str, steps: list[dict]) -> dict:
    """The highest rate answered in full (every request exactly once), and the first loss."""
    whole = [s for s in steps if s["unanswered"] == 0 and s["duplicated"] == 0
             and s["publish_failed"] == 0]
    lossy = [s for s in steps if s["unanswered"]]
    return {
        "mix": mix,
        "steps": steps,
        "ceiling_answered_per_s": max((s["answered_per_s"] for s in whole), default=0.0),
        "first_loss_offered_per_s": lossy[0]["offered_per_s"] if lossy else None,
        # unanswered requests the relay did count: the middleware's loss, full answer rings
        "unanswered_counted_by_relay": sum(min(s["unanswered"], s["relay_middleware_lost"]
                                               + s["relay_outputs_dropped"]) for s in steps),
        "unanswered": sum(s["unanswered"] for s in steps),
    }


def run(args: argparse.Namespace) -> dict:
    n = args.samples or (300 if args.quick else 3000)
    mixes = () if args.no_dds else tuple(args.mixes or MIXES)
    rates = tuple(args.rates or (QUICK_RATES if args.quick else RATES))
    seconds = args.seconds or (0.3 if args.quick else 3.0)
    with Progress("intake", 2 * 17 + len(mixes) * len(rates)) as bar:
        rows = intake_costs(n, "c", bar) + intake_costs(n, "rclpy", bar)
        dds = dds_ramp(mixes, rates, seconds, bar) if mixes else []
    by_intake = {i: [r for r in rows if r["intake"] == i] for i in INTAKES}
    cheaper = {i: max(r["us_mean"] for r in rs if r["kind"] == "discard")
               < min(r["us_mean"] for r in rs if r["kind"] == "decision")
               for i, rs in by_intake.items()}
    return {
        "samples_per_case": n,
        "rows": rows,
        "dds": dds,
        "dds_seconds_per_step": seconds,
        "discard_cheaper_than_any_decision": cheaper,
        "all_cases_as_expected": all(r["as_expected"] for r in rows),
    }


def table(report: dict) -> str:
    rclpy_rows = {r["case"]: r for r in report["rows"] if r["intake"] == "rclpy"}
    side = []
    for r in (r for r in report["rows"] if r["intake"] == "c"):
        p = rclpy_rows.get(r["case"])
        side.append({
            "case": r["case"],
            "outcome": r["outcome"].removeprefix("discarded."),
            "C us/msg": r["us_mean"],
            "C p99": r["us_p99"],
            "rclpy take us": p["take_us"] if p else None,
            "rclpy callback us": p["us_mean"] if p else None,
            "rclpy p99": p["us_p99"] if p else None,
        })
    lines = [
        f"per message, {report['samples_per_case']} real messages per case (rclpy: take, then "
        "the callback; bytes that are no request never reach its callback):",
        format_rows(side),
        f"every case produced its outcome: {report['all_cases_as_expected']}; a discard costs "
        f"less than any decision: {report['discard_cheaper_than_any_decision']}",
    ]
    for d in report["dds"]:
        lines += ["", f"over DDS, mix {d['mix']}: answered in full up to "
                  f"{d['ceiling_answered_per_s']:.0f}/s; first unanswered request at "
                  f"{d['first_loss_offered_per_s'] or '-'} offered/s",
                  format_rows([{k: v for k, v in s.items() if k != "codes"}
                               for s in d["steps"]])]
    return "\n".join(lines)
