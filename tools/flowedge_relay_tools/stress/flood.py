# SPDX-License-Identifier: Apache-2.0
"""The hostile-input campaign over real DDS: probes in, every answer booked, exactly once.

`run_malformed` sends from this process, flow-controlled by the relay's intake (`pace`);
`run_flood` (`malformed --rate`) has a producer process (`stress produce`, `produce` here) publish
at a fixed rate paced by wall clock, so the producer does not share the relay's interpreter.
Both book every answer per probe index (`FloodBook`) and report through report.campaign_report;
`malformed_ok` is their pass criteria.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np

from flowedge_relay.core import CODE_KEYS
from flowedge_relay_tools.stress.probes import (
    BASE_SEQ,
    NOT_SENT,
    RAW,
    VALID_ANY,
    VALID_EXPIRED,
    Contract,
    Oracle,
    Probe,
    ProbeFactory,
    RequestBuilder,
    probe_index,
)
from flowedge_relay_tools.stress.report import (
    MB,
    RelayMark,
    campaign_report,
    received,
    rss_bytes,
)


def pace(relay, target: int, backlog: int = 300, timeout: float = 30.0) -> bool:
    """Keep at most `backlog` requests between the client and the relay's callback, so the
    relay's DDS history never fills: a producer in the relay's own process is delivered
    intra-process, and Fast DDS reports nothing it loses there (SECURITY.md)."""
    from flowedge_relay_tools.harness import wait_for

    return wait_for(lambda: received(relay) >= target - backlog, timeout, 0.002)


class FloodBook:
    """Answers per probe index, recorded as they come (preallocated); judged against the
    Oracle afterwards, so the producer may be another process."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.count = np.zeros(n, np.int32)
        self.crc = np.zeros(n, np.uint32)  # of the first answer's session_id
        self.code = np.full(n, -1, np.int8)  # of the first answer
        self.unattributed = 0  # answers whose key names no probe
        self.codes = np.zeros(len(CODE_KEYS), np.int64)
        self._lock = threading.Lock()

    def on_answer(self, msg) -> None:
        i = probe_index(msg.session_id, msg.sequence, self.n)
        with self._lock:
            if 0 <= msg.code < 5:
                self.codes[msg.code] += 1
            if i is None:
                self.unattributed += 1
                return
            if self.count[i] == 0:
                self.crc[i] = zlib.crc32(msg.session_id.encode("utf-8", "surrogatepass"))
                self.code[i] = msg.code
            self.count[i] += 1

    def answered(self) -> int:
        return int(self.count.sum()) + self.unattributed


def run_malformed(h, messages: int = 2000, seed: int = 1, warmup: int = 300,
                  huge: bool = True, progress=None, backlog: int = 300,
                  mix: str = "mixed") -> dict:
    """The hostile-input campaign, producer in this process, flow-controlled by the relay's
    intake (at most `backlog` unread); returns figures (report.py)."""

    node = h.node
    factory = ProbeFactory(h, seed, node.relay.validator.max_nfe, huge=huge)
    total = warmup + messages
    oracle = Oracle(total + 1)
    book = FloodBook(total + 1)
    h.keep_answers = False
    h.on_answer = book.on_answer
    h.max_diagnostics = 20
    mark = RelayMark.of(node)
    typed = 0
    hangs = 0
    rss_warm = rss_bytes()
    rss_samples = []
    t0 = time.monotonic()
    for i in range(total):
        if i == warmup:
            pace(node, mark.received + typed, backlog=0)
            rss_warm = rss_bytes()
        p = factory.make(i, mix)
        oracle.record(i, p)  # before sending: a passed deadline is answered within microseconds
        typed += p.expect != RAW
        h.pub.publish(p.payload)
        if i % 50 == 49:
            if not pace(node, mark.received + typed, backlog):
                hangs += 1
            if i % 1000 == 999:
                rss_samples.append([round(time.monotonic() - t0, 2), rss_bytes()])
                if progress:
                    progress(f"malformed: {i + 1}/{total} sent, rss {rss_bytes() / MB:.1f} MB")
    # marker: a plain valid request after everything must be answered
    marker = total
    oracle.record(marker, Probe("marker", None, VALID_ANY, session="marker"))
    h.send(factory.valid(marker, session="marker", past=False))
    if not _settle(node, book, oracle, marker, 60.0):
        hangs += 1
    time.sleep(0.5)  # any duplicate answer would arrive by now
    return campaign_report(
        h, mark, oracle, book, mix=mix,
        head={"messages_tried": total + 1, "warmup_messages": warmup, "seed": seed},
        hangs=hangs, rss_warm=rss_warm, rss_end=rss_bytes(),
        tail={"rss_samples": rss_samples, "seconds": round(time.monotonic() - t0, 2)})


def _settle(node, book: FloodBook, oracle: Oracle, marker: int, timeout: float) -> bool:
    """Wait for the marker's answer and every valid answer, or, should some never come, for
    the relay to go quiet (nothing received, answered, queued or running for 2 s). False
    only when the marker (sent last) is never answered: the relay hangs."""
    valid = (oracle.expect == VALID_ANY) | (oracle.expect == VALID_EXPIRED)
    n_valid = int(valid.sum())
    end = time.monotonic() + timeout
    last, still_since = None, time.monotonic()
    while time.monotonic() < end:
        if int((book.count[valid] > 0).sum()) >= n_valid:
            return True
        st = node.relay.core.stats()
        now = (received(node), book.answered(), st.queue_depth, st.lanes_busy)
        if now != last:
            last, still_since = now, time.monotonic()
        elif st.queue_depth == 0 and st.lanes_busy == 0 and time.monotonic() - still_since > 2:
            break
        time.sleep(0.02)
    return bool(book.count[marker] >= 1)


def producer_command(contract: Contract, *, rate: float, count: int, mix: str, oracle: str,
                     depth: int = 5000, seed: int = 1, max_nfe: int = 64) -> list[str]:
    """`python -m flowedge_relay_tools.stress produce ...`: a producer process that publishes
    `count` probes of `mix` at `rate` to a relay serving `contract` and writes the oracle to
    `oracle` (.npz); on stdout, a JSON line when published and a summary JSON line at the end."""
    return [sys.executable, "-m", "flowedge_relay_tools.stress", "produce",
            "--seed", str(seed), "--rate", str(rate), "--count", str(count), "--mix", mix,
            "--contract", json.dumps(contract.as_dict()), "--max-nfe", str(max_nfe),
            "--depth", str(depth), "--oracle", oracle]


def run_flood(h, rate: float, duration_s: float, seed: int = 1, mix: str = "flood",
              progress=None, producer_depth: int = 5000, settle_s: float = 60.0) -> dict:
    """The hostile-input campaign at a fixed offered rate, paced by wall clock: a producer
    process (`producer_command`) builds and publishes the probes and writes the oracle; this
    process runs the relay and books every answer."""
    import subprocess
    import tempfile

    node = h.node
    n = int(rate * duration_s) + 1
    book = FloodBook(n + 1)
    h.keep_answers, h.on_answer, h.max_diagnostics = False, book.on_answer, 5
    mark = RelayMark.of(node)
    with tempfile.TemporaryDirectory() as tmp:
        oracle_path = str(Path(tmp) / "oracle.npz")
        cmd = producer_command(Contract.of(h.model), rate=rate, count=n, mix=mix,
                               oracle=oracle_path, depth=producer_depth, seed=seed,
                               max_nfe=node.relay.validator.max_nfe)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        rss_warm, rss_max, samples = 0, 0, []
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < duration_s + 120:
            time.sleep(1.0)
            rss = rss_bytes()
            rss_max = max(rss_max, rss)
            if not rss_warm and time.monotonic() - t0 >= min(5.0, duration_s / 4):
                rss_warm = rss
            samples.append([round(time.monotonic() - t0, 1), rss, mark.received_since(node),
                            mark.lost_since(node)])
            if progress and len(samples) % 5 == 0:
                progress(f"flood {samples[-1][0]:5.0f} s: relay received {samples[-1][2]}, "
                         f"middleware lost {samples[-1][3]}, answers {book.answered()}, "
                         f"rss {rss / MB:.1f} MB")
        hung = proc.poll() is None
        if hung:
            proc.kill()
        out, _ = proc.communicate()
        produced = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        oracle = Oracle.load(oracle_path) if Path(oracle_path).exists() else Oracle(n)
    oracle_full = Oracle(n + 1)
    oracle_full.expect[:n], oracle_full.sid_crc[:n] = oracle.expect, oracle.sid_crc
    oracle_full.kinds, oracle_full.reasons = oracle.kinds, oracle.reasons
    oracle = oracle_full
    # settle: the relay has taken (or the middleware has reported lost) everything it will
    def arrived() -> int:
        return mark.received_since(node) + mark.lost_since(node)

    last, still_since = -1, time.monotonic()
    end = time.monotonic() + settle_s
    while time.monotonic() < end:
        now_arrived = arrived()
        if now_arrived != last:
            last, still_since = now_arrived, time.monotonic()
        elif time.monotonic() - still_since > 2.0:
            break
        time.sleep(0.1)
    marker = n
    oracle.record(marker, Probe("marker", None, VALID_ANY, session="marker"))
    h.send(h.request(session_id="marker", sequence=BASE_SEQ + marker))
    sent = int((oracle.expect != NOT_SENT).sum())  # the marker included, as everywhere below
    hangs = int(hung) + (not _settle(node, book, oracle, marker, 60.0))
    time.sleep(0.5)
    fig = campaign_report(
        h, mark, oracle, book, mix=mix,
        head={"seed": seed, "offered_rate_per_s": rate, "duration_s": duration_s, "sent": sent,
              "publish_failures": produced.get("publish_failures", -1),
              "achieved_rate_per_s": produced.get("achieved_rate_per_s", 0.0),
              "producer_all_acked": produced.get("all_acked", False)},
        hangs=hangs, rss_warm=rss_warm, rss_end=rss_bytes(), rss_max=rss_max,
        tail={"samples": samples})
    fig["accounting_closes"] = fig["relay_received"] + fig["middleware_lost"] == sent - fig[
        "undeliverable_raw"] and fig["invalid_counts_match_builder"]
    return fig


def produce(args) -> int:
    """The flood producer process: build probe i, publish it at t0 + i / rate, record what
    was built (the oracle), wait until the relay acknowledged everything, print a summary."""
    from flowedge_relay_msgs.msg import InferenceRequest
    from rclpy.duration import Duration
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

    from flowedge_relay_tools.harness import ros_context, wait_for_subscribers

    builder = RequestBuilder(Contract.from_dict(json.loads(args.contract)))
    factory = ProbeFactory(builder, args.seed, args.max_nfe, huge=False)
    oracle = Oracle(args.count)
    failures = 0
    with ros_context() as ctx:
        import rclpy

        node = rclpy.create_node("flowedge_flood_producer", context=ctx)
        qos = QoSProfile(depth=args.depth, history=HistoryPolicy.KEEP_LAST,
                         reliability=ReliabilityPolicy.RELIABLE)
        pub = node.create_publisher(InferenceRequest, args.topic, qos)
        wait_for_subscribers(pub)
        time.sleep(0.3)
        t0 = time.monotonic()
        for i in range(args.count):
            due = t0 + i / args.rate
            ahead = due - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
            p = factory.make(i, args.mix)
            oracle.record(i, p)
            try:
                pub.publish(p.payload)
            except Exception:  # a KEEP_ALL reader's back-pressure can time a publish out
                failures += 1
                oracle.expect[i] = NOT_SENT
        elapsed = time.monotonic() - t0
        print(json.dumps({"published": args.count - failures}), flush=True)
        acked = pub.wait_for_all_acked(Duration(seconds=60))
        oracle.save(args.oracle)
        node.destroy_node()
    print(json.dumps({"sent": args.count - failures, "publish_failures": failures,
                      "achieved_rate_per_s": round(args.count / max(elapsed, 1e-9), 1),
                      "all_acked": bool(acked)}), flush=True)
    return 0


def malformed_ok(fig: dict) -> list[str]:
    """The campaign's pass criteria; returns the failures (empty = pass)."""
    bad = []
    if fig["crashes"]:
        bad.append(f"crashes {fig['crashes']} (threads {fig['threads_alive']})")
    if fig["hangs"]:
        bad.append(f"hangs {fig['hangs']}")
    if fig["valid_lost"] or fig["duplicates"] or fig["unexpected_answers"]:
        bad.append("exactly-once violated: "
                   f"valid lost {fig['valid_lost']}, duplicates {fig['duplicates']}, "
                   f"unexpected {fig['unexpected_answers']}")
    if fig["past_deadline_not_expired"]:
        bad.append(f"{fig['past_deadline_not_expired']} requests past their deadline "
                   "answered other than EXPIRED")
    if fig["middleware_lost"]:
        bad.append(f"middleware lost {fig['middleware_lost']} requests")
    if not fig["invalid_counts_match_builder"]:
        bad.append(f"per-reason counts differ: built {fig['invalid_built_by_reason']}, "
                   f"counted {fig['invalid_counted_by_reason']}")
    if not 0 <= fig["raw_delivered"] <= fig["raw_sent"]:
        bad.append(f"relay received {fig['relay_received']}: {fig['raw_delivered']} beyond the "
                   f"typed probes, of {fig['raw_sent']} raw")
    if fig.get("accounting_closes") is False:
        bad.append("sent != received + middleware_lost + undeliverable")
    return bad
