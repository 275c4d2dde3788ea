# SPDX-License-Identifier: Apache-2.0
"""`bench swap`: what a model swap costs the producers of a relay under steady load.

    flowedge_relay_bench swap [--quick] [--swaps N] [--load F] [--json PATH]

The relay (`flowedge-relayd`, its own process, as deployed) serves the bundled small policy. The
bench first measures, saturating it, each policy's capacity and NFE p99 (small, then the bench
policy), and so the `nfe_ns` each is admitted with (p99 x --margin). Then a producer sends at
--load x the slower policy's capacity, one request every 1/rate s on schedule (open loop), of
--nfe NFE, every other one with a deadline --slack-ms after sending, the rest without, each built
for the model the relay's latched `flowedge/model` last announced, as a producer that follows it
does. Every --every-s seconds the bench sets `model_path` to the other policy with that policy's
`nfe_ns`, in one atomic set (`ros2 param set` does one at a time), --swaps times.

Per swap: how long the set took (load and warm beside the serving model, then the switch), how
long until the producer saw the announcement, and the pause, measured as the longest gap between
two consecutive answers in the window from the set to --every-s / 2 after it, next to the
longest gap in the same length of steady traffic just before the set. Over the run: requests
answered exactly once, lost (sent and neither answered nor counted as discarded), answered
twice, discarded as `model_digest_mismatch` (built for the old model, arriving after the
switch), answers whose digest echo is not the digest they were sent with, and the answers with a
deadline that were admitted and late.

A measurement, not a test (test/test_swap.py checks the contract): a busy host shows.
"""

from __future__ import annotations

import argparse
import math
import threading
import time

from flowedge_relay_msgs.msg import ServedModel as ServedModelMsg
from rclpy.parameter import Parameter

from flowedge_relay.core import CODE_KEYS
from flowedge_relay.model import default_model_path
from flowedge_relay.producer import ServedModel, follow_served_model
from flowedge_relay_tools.bench.client import (
    INFERENCE,
    BenchClient,
    RemoteRelay,
    collector_paused,
    remote_relay,
    saturate,
    warm_up,
)
from flowedge_relay_tools.bench.progress import Progress
from flowedge_relay_tools.bench.tables import format_rows
from flowedge_relay_tools.harness import load_served
from flowedge_relay_tools.models import bench_model_path
from flowedge_relay_tools.waiting import wait_for

MODELS = {"small": default_model_path(), "bench": bench_model_path()}
SESSIONS = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="two swaps, short phases (CI)")
    parser.add_argument("--swaps", type=int, default=None, help="swaps (default 6; quick 2)")
    parser.add_argument("--every-s", type=float, default=None,
                        help="seconds between swaps (default 4; quick 2)")
    parser.add_argument("--load", type=float, default=0.9,
                        help="offered load, x the slower policy's measured capacity")
    parser.add_argument("--nfe", type=int, default=4, help="NFE per request")
    parser.add_argument("--slack-ms", type=float, default=200.0,
                        help="deadline of every other request, ms after sending")
    parser.add_argument("--margin", type=float, default=1.3,
                        help="nfe_ns = measured saturated NFE p99 x this")


class Announcements:
    """The relay's latched flowedge/model, as a producer follows it: each announcement with the
    time this process received it."""

    def __init__(self, client: BenchClient) -> None:
        self._cv = threading.Condition()
        self.seen: list[tuple[int, ServedModel | None]] = []
        follow_served_model(client.node, self._on_model)

    def _on_model(self, msg: ServedModelMsg) -> None:
        with self._cv:
            self.seen.append((time.time_ns(), ServedModel.from_message(msg)))
            self._cv.notify_all()

    def wait_digest(self, digest: str, timeout: float = 30.0) -> int:
        """When the announcement of `digest` was received (waiting for it)."""
        end = time.monotonic() + timeout
        with self._cv:
            while True:
                for at, model in reversed(self.seen):
                    if model is not None and model.digest == digest:
                        return at
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{digest} never announced on flowedge/model")
                self._cv.wait(left)

    def latest(self) -> ServedModel | None:
        with self._cv:
            return self.seen[-1][1] if self.seen else None


def swap_to(relay: RemoteRelay, path: str, **calibration: int) -> None:
    """One atomic parameter set: model_path and the calibration it is admitted with."""
    params = [Parameter("model_path", value=path)]
    params += [Parameter(k, value=v) for k, v in calibration.items()]
    (result,) = relay.set_parameters(params, atomically=True)
    if not result.successful:
        raise RuntimeError(f"the relay refused the swap to {path}: {result.reason}")


def measure(relay: RemoteRelay, client: BenchClient, seconds: float, nfe: int) -> dict:
    """Saturated capacity (requests/s at `nfe` NFE) and NFE p99 of the model served now."""
    warm_up(client)
    figures = {}

    def at_end() -> None:
        figures["nfe_ns_p99"] = relay.stats().nfe_ns_p99

    start = time.monotonic()
    answers = saturate(client, relay.workers, nfe, seconds, "bench-capacity", at_end)
    elapsed = time.monotonic() - start
    figures["capacity_rps"] = len(answers) / elapsed
    return figures


class Producer(threading.Thread):
    """Sends on schedule at `rate` per second, each request built for what was announced last;
    remembers each key's digest, send time and deadline."""

    def __init__(self, client: BenchClient, seen: Announcements, rate: float, nfe: int,
                 slack_ns: int) -> None:
        super().__init__(name="swap-producer", daemon=True)
        self.client, self.seen, self.rate, self.nfe, self.slack_ns = (
            client, seen, rate, nfe, slack_ns)
        self.stop = threading.Event()
        self.sent: dict[tuple[str, int], tuple[str, int]] = {}  # key -> (digest, deadline ns)

    def run(self) -> None:
        period = 1.0 / self.rate
        next_at = time.monotonic()
        i = 0
        while not self.stop.is_set():
            model = self.seen.latest()
            if model is not None and model.digest != self.client.digest:
                self.client.serve(model)
            seq = self.client.next_sequence()
            req = self.client.request(f"swap-{i % SESSIONS}", seq, self.nfe, noise_seed=seq)
            slack = self.slack_ns if i % 2 == 0 else 0
            sent_ns = self.client.send(req, slack_ns=slack)
            self.sent[(req.session_id, seq)] = (self.client.digest,
                                                sent_ns + slack if slack else 0)
            i += 1
            next_at += period
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)


def longest_gap_ms(times: list[int], start: int, end: int) -> float:
    """The longest time between two consecutive answers received in [start, end] (with the
    window's edges as answers: a window with no answer at all is one gap)."""
    inside = [start, *sorted(t for t in times if start <= t <= end), end]
    return max(b - a for a, b in zip(inside, inside[1:], strict=False)) / 1e6


def run(args: argparse.Namespace) -> dict:
    swaps = args.swaps or (2 if args.quick else 6)
    every_s = args.every_s or (2.0 if args.quick else 4.0)
    measure_s = 1.0 if args.quick else 3.0
    with Progress("swap", 4 + swaps) as bar, \
            remote_relay(model_path=MODELS["small"], nfe_ns=0) as (relay, client):
        seen = Announcements(client)
        # capacity and NFE p99 of each policy, admission off while measuring
        bar.update(label="capacity: small")
        figures = {"small": measure(relay, client, measure_s, args.nfe)}
        bar.advance()
        bar.update(label="capacity: bench")
        swap_to(relay, MODELS["bench"])
        client.serve(load_served(MODELS["bench"]))
        figures["bench"] = measure(relay, client, measure_s, args.nfe)
        bar.advance()
        for name, f in figures.items():
            f["nfe_ns"] = int(math.ceil(f["nfe_ns_p99"] * args.margin))
            f["digest"] = load_served(MODELS[name]).digest
        rate = args.load * min(f["capacity_rps"] for f in figures.values())
        swap_to(relay, MODELS["small"], nfe_ns=figures["small"]["nfe_ns"])
        seen.wait_digest(figures["small"]["digest"])
        bar.advance()

        before = relay.stats()
        producer = Producer(client, seen, rate, args.nfe, int(args.slack_ms * 1e6))
        points = []
        with collector_paused():
            producer.start()
            time.sleep(every_s)
            name = "small"
            for k in range(swaps):
                name = "bench" if name == "small" else "small"
                bar.update(label=f"swap {k + 1}/{swaps} to {name}")
                t0 = time.time_ns()
                swap_to(relay, MODELS[name], nfe_ns=figures[name]["nfe_ns"])
                t1 = time.time_ns()
                points.append({"to": name, "set_start_ns": t0, "set_end_ns": t1,
                               "announced_ns": seen.wait_digest(figures[name]["digest"])})
                time.sleep(every_s)
                bar.advance()
            producer.stop.set()
            producer.join(10.0)
            wait_for(lambda: _settled(client, relay, producer, before), 30.0, 0.05)
        after = relay.stats()
        bar.advance()
    return report(args, figures, rate, every_s, points, producer, client, before, after)


def _settled(client: BenchClient, relay: RemoteRelay, producer: Producer, before) -> bool:
    """Every request sent is answered or counted discarded by the relay."""
    discarded = relay.stats().invalid_discarded - before.invalid_discarded
    return client.count_answered(producer.sent) + discarded >= len(producer.sent)


def report(args, figures, rate, every_s, points, producer, client, before, after) -> dict:
    answers = {k: client.answers[k] for k in producer.sent if k in client.answers}
    times = [a.received_ns for a in answers.values()]
    window = int(every_s / 2 * 1e9)
    rows = []
    for p in points:
        end = p["set_end_ns"] + window
        span = end - p["set_start_ns"]
        rows.append({
            "swap to": p["to"],
            "set ms": round((p["set_end_ns"] - p["set_start_ns"]) / 1e6, 1),
            "announced after set start ms": round((p["announced_ns"] - p["set_start_ns"]) / 1e6, 1),
            "longest answer gap ms": round(longest_gap_ms(times, p["set_start_ns"], end), 1),
            "steady gap before ms": round(
                longest_gap_ms(times, p["set_start_ns"] - span, p["set_start_ns"]), 1),
        })  # fmt: skip
    codes = dict.fromkeys(CODE_KEYS, 0)
    late = echo_wrong = 0
    for key, a in answers.items():
        digest, deadline = producer.sent[key]
        codes[CODE_KEYS[a.code]] += 1
        echo_wrong += a.model_digest.decode() != digest
        late += a.code == INFERENCE and deadline and a.received_ns > deadline
    discarded = after.invalid_discarded - before.invalid_discarded
    sent = len(producer.sent)
    return {
        "method": __doc__.split("\n\n")[2].replace("\n", " "),
        "policies": figures,
        "offered_rps": rate,
        "load": args.load,
        "nfe": args.nfe,
        "slack_ms": args.slack_ms,
        "every_s": every_s,
        "rows": rows,
        "sent": sent,
        "answered": len(answers),
        "answered_twice": client.extra_answers,
        "discarded_model_digest_mismatch": discarded,
        "lost": sent - len(answers) - discarded,
        "echo_not_the_digest_sent": echo_wrong,
        "late_admitted_with_deadline": late,
        "codes": codes,
        "pause_ms_max": max((r["longest answer gap ms"] for r in rows), default=0.0),
        "steady_gap_ms_max": max((r["steady gap before ms"] for r in rows), default=0.0),
    }


def table(report: dict) -> str:
    pol = report["policies"]
    head = (f"offered {report['offered_rps']:.0f} requests/s ({report['load']:g} x the slower "
            f"policy's capacity; small {pol['small']['capacity_rps']:.0f}/s, nfe_ns "
            f"{pol['small']['nfe_ns']}; bench {pol['bench']['capacity_rps']:.0f}/s, nfe_ns "
            f"{pol['bench']['nfe_ns']}), {report['nfe']} NFE, every other request with a "
            f"{report['slack_ms']:g} ms deadline")
    tail = (f"sent {report['sent']}: answered {report['answered']}, lost {report['lost']}, "
            f"answered twice {report['answered_twice']}, model_digest_mismatch "
            f"{report['discarded_model_digest_mismatch']}, echo not the digest sent "
            f"{report['echo_not_the_digest_sent']}, admitted late "
            f"{report['late_admitted_with_deadline']}; outcomes {report['codes']}")
    return "\n".join([head, format_rows(report["rows"]), tail])
