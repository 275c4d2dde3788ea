"""Robustness campaigns on a real relay over real DDS (issue 8): hostile input, soak, faults.

    python -m flowedge_relay.stress malformed --messages 20000 --json out/malformed.json
    python -m flowedge_relay.stress soak --duration 600 --json out/soak.json --plot out/soak.png
    python -m flowedge_relay.stress faults --json out/faults.json

Everything runs in one process: a real `RelayNode` (request thread, main executor, workers,
publisher thread; `harness.running_relay`) and a client node, over DDS on this host. The same
scenario functions back `test/test_robustness.py`, so the CI tests and the figures a reviewer
reruns are one code path.

How "exactly once" is checked: every generated request has a unique index. The index is the
sequence number (BASE + index) or, for probes whose sequence is deliberately UINT64_MAX, part of
a session id of their own. Answers are counted per index in preallocated arrays, together with a
CRC of the expected session id, so the bookkeeping neither grows during the run (RSS stays
meaningful) nor misattributes an answer.

What the relay must do with each probe is not guessed: the client serializes it, deserializes the
bytes exactly as the relay's subscription will (`rclpy.serialization`, the same type support), and
runs its own copy of the relay's `Validator` on the result. Undeserializable bytes must never
reach the callback, invalid ones must be discarded and counted under that reason, valid ones
must be answered once, whatever they look like.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import struct
import sys
import threading
import time
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flowedge_relay.signals import stoppable

UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
INT32_MAX = 2**31 - 1
BASE_SEQ = 1 << 40  # probe i has sequence BASE_SEQ + i (unless it tests UINT64_MAX)
UNDELIVERABLE = -1  # expected[i]: bytes that cannot be deserialized never reach the relay
ANSWER = 0  # expected[i]: valid, must be answered exactly once
MB = 1024 * 1024


def rss_bytes() -> int:
    """Resident set size of this process (relay + client + DDS), from /proc."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _time(ns: int):
    from builtin_interfaces.msg import Time

    return Time(sec=ns // 1_000_000_000, nanosec=ns % 1_000_000_000)


def relay_threads_alive(relay) -> dict[str, bool]:
    """Liveness of every relay thread that must survive hostile input."""
    alive = {
        "request": bool(relay._request_thread and relay._request_thread.is_alive()),
        "publisher": relay._publisher_thread.is_alive(),
    }
    if relay.pool is not None:
        for info in relay.pool.worker_info():
            alive[f"worker{info['lane']}"] = bool(info["alive"])
    return alive


def received(relay) -> int:
    """Requests the relay's callback has seen (valid or not)."""
    return relay._received


def pace(relay, target: int, backlog: int = 300, timeout: float = 30.0) -> bool:
    """Keep at most `backlog` requests between the client and the relay's callback, so the
    relay's DDS history (request_qos_depth) never overflows and loses samples."""
    from flowedge_relay.harness import wait_for

    return wait_for(lambda: received(relay) >= target - backlog, timeout, 0.002)


# ---- hostile input -----------------------------------------------------------------------------


@dataclass
class Probe:
    kind: str
    payload: object  # an InferenceRequest, or bytes published raw
    expect: int = ANSWER  # ANSWER, UNDELIVERABLE or 1 + index into REASONS
    session: str = ""  # expected session_id of the answer (after deserialization)
    sequence: int = 0


class ProbeFactory:
    """Seeded generator of hostile, hostile-but-valid, raw-CDR and plain valid requests."""

    def __init__(self, h, seed: int, max_nfe: int, huge: bool = True) -> None:
        from flowedge_relay_msgs.msg import InferenceRequest
        from rclpy.serialization import deserialize_message, serialize_message

        from flowedge_relay.validation import Reason, Validator

        self.h, self.rng, self.max_nfe, self.huge = h, random.Random(seed), max_nfe, huge
        self.Req = InferenceRequest
        self._ser, self._de = serialize_message, deserialize_message
        self.reasons = list(Reason)
        self.validator = Validator(h.relay.validator.model, h.relay.validator.max_nfe)
        m = h.model
        self.obs_dim = m.obs_dim
        self.hostile_invalid = [
            ("session_id_empty", lambda r, i: {"session_id": ""}),
            ("session_id_nul_first", lambda r, i: {"session_id": "\x00hidden"}),
            ("session_id_65_bytes", lambda r, i: {"session_id": "x" * 65}),
            ("session_id_multibyte_too_long", lambda r, i: {"session_id": "\u00e9" * 33}),
            ("session_id_huge", lambda r, i: {"session_id": "h" * r.choice([1000, 100_000])}),
            ("digest_garbage", lambda r, i: {"model_digest": r.choice([
                "", "sha256:", "sha256:" + "0" * 64, "md5:abc", "\u202e\u0000x" * 8,
                "sha256:" + "f" * 10_000, "".join(chr(r.randrange(1, 0xD7FF)) for _ in range(40)),
            ])}),
            ("dims_wrong", lambda r, i: {r.choice(["observation_dim", "action_dim",
                                                   "action_horizon"]):
                                         r.choice([0, 1, 3, 9, 1024, UINT32_MAX])}),
            ("observation_length", lambda r, i: {"observation": [0.5] * r.choice(
                [0, self.obs_dim - 1, self.obs_dim + 1, 4096])}),
            ("observation_huge", lambda r, i: {"observation": [0.0] * 200_000}),
            ("observation_nan_inf", lambda r, i: {"observation": self._poison(r)}),
            ("remaining_nfe_zero", lambda r, i: {"remaining_nfe": 0}),
            ("remaining_nfe_huge", lambda r, i: {"remaining_nfe": r.choice(
                [max_nfe + 1, 2**31, UINT32_MAX])}),
            ("retry_reason_unknown", lambda r, i: {"retry_reason": r.randrange(6, 256),
                                                   "retry_count": 1}),
            ("deadline_negative", lambda r, i: {"deadline": self._stamp(-r.randrange(1, 2**31),
                                                                        0)}),
            ("deadline_nanosec_overflow", lambda r, i: {"deadline": self._stamp(
                r.randrange(0, INT32_MAX), r.randrange(10**9, UINT32_MAX + 1))}),
            ("origin_negative", lambda r, i: {"origin_stamp": self._stamp(-2**31, 0)}),
        ]
        now_s = time.time_ns() // 1_000_000_000
        self.hostile_valid = [
            ("generation_u64_max", lambda r, i: {"generation": UINT64_MAX}),
            ("sequence_u64_max", lambda r, i: {"sequence": UINT64_MAX}),
            ("retry_count_u32_max", lambda r, i: {"retry_count": UINT32_MAX,
                                                  "retry_reason": r.randrange(0, 6)}),
            ("deadline_zero", lambda r, i: {"deadline": self._stamp(0, 0)}),
            ("deadline_past", lambda r, i: {"deadline": self._stamp(
                r.choice([0, 1, now_s - 5]), r.choice([1, 999_999_999]))}),
            ("deadline_end_of_time", lambda r, i: {"deadline": self._stamp(
                INT32_MAX, 999_999_999)}),
            ("origin_far_past_or_future", lambda r, i: {"origin_stamp": self._stamp(
                r.choice([0, 1, INT32_MAX]), r.choice([0, 999_999_999]))}),
            ("noise_seed_u64_max", lambda r, i: {"noise_seed": UINT64_MAX}),
            ("remaining_nfe_max", lambda r, i: {"remaining_nfe": max_nfe}),
            ("session_id_64_bytes", lambda r, i: {"session_id": self._sid(i, 64)}),
            ("session_id_unicode", lambda r, i: {"session_id": f"{i}" + r.choice([
                "\U0001f916\u202e\u200b", "\x01\x7f\n\t\x1b[2J", "\ufffd\ufeff",
                "\u0645\u0631\u062d\u0628\u0627", "%s%n{}\\"])}),
            ("session_id_embedded_nul", lambda r, i: {"session_id": f"nul{i}\x00tail"}),
            ("observation_extreme_finite", lambda r, i: {"observation": [
                r.choice([3.4e38, -3.4e38, 1e-45, -0.0, 0.0]) for _ in range(self.obs_dim)]}),
        ]

    # helpers
    def _stamp(self, sec: int, nanosec: int):
        from builtin_interfaces.msg import Time

        return Time(sec=sec, nanosec=nanosec)

    def _poison(self, r):
        obs = [0.1] * self.obs_dim
        obs[r.randrange(self.obs_dim)] = r.choice([math.nan, math.inf, -math.inf])
        return obs

    @staticmethod
    def _sid(i: int, n: int) -> str:
        s = f"b{i}-"
        return s + "y" * (n - len(s))

    def valid(self, i: int, session: str | None = None, **fields):
        h, r = self.h, self.rng
        deadline = r.choice([None, None, 2_000, 10_000, -1])
        req = h.request(
            session_id=session or f"v{i % 8}", sequence=BASE_SEQ + i, generation=1,
            remaining_nfe=r.randint(1, 4), noise_seed=i, deadline_ms=deadline,
            observation=[r.uniform(-1, 1) for _ in range(self.obs_dim)],
        )
        for k, v in fields.items():
            setattr(req, k, v)
        return req

    def make(self, i: int) -> Probe:
        """Probe i: 35% plain valid, 35% hostile invalid, 15% hostile but valid, 15% raw CDR."""
        r = self.rng
        roll = r.random()
        if roll < 0.35:
            return self._predict(Probe("valid", self.valid(i)))
        if roll < 0.70:
            kind, fields = r.choice(self.hostile_invalid)
            if kind in ("session_id_huge", "observation_huge") and not self.huge:
                kind, fields = self.hostile_invalid[0]
            return self._predict(Probe(kind, self.valid(i, session=f"u{i}", **fields(r, i))))
        if roll < 0.85:
            kind, fields = r.choice(self.hostile_valid)
            return self._predict(Probe(kind, self.valid(i, session=f"q{i}", **fields(r, i))))
        return self._raw(i)

    def _raw(self, i: int) -> Probe:
        """Hand-made CDR: invalid UTF-8, truncation, lying length prefixes, bit flips."""
        r = self.rng
        sid = f"r{i}"
        good = bytearray(self._ser(self.valid(i, session=sid)))
        at = good.find(sid.encode())  # string: uint32 length (incl. NUL), bytes, NUL
        end_of_seq = good.find(struct.pack("<Q", BASE_SEQ + i), at) + 8  # the key ends here
        kind = r.choice(["utf8_invalid", "truncated", "length_lies", "bit_flips", "garbage"])
        if kind == "utf8_invalid":
            bad = bytes(r.choice([0x80, 0xC0, 0xED, 0xF5, 0xFE, 0xFF]) for _ in range(len(sid)))
            good[at:at + len(sid)] = bad
        elif kind == "truncated":
            del good[r.randrange(0, len(good)):]
        elif kind == "length_lies":
            which = r.choice([at - 4, len(good) - 4 * self.obs_dim - 16])
            which = max(4, which - which % 4)
            good[which:which + 4] = struct.pack("<I", r.choice([0, 0x7FFFFFFF, UINT32_MAX]))
        elif kind == "bit_flips":
            for _ in range(r.randint(1, 8)):  # after the key, so the key survives
                pos = r.randrange(min(end_of_seq, len(good) - 1), len(good))
                good[pos] ^= 1 << r.randrange(8)
        else:
            good = bytearray(r.randbytes(r.randrange(0, 512)))
        return self._predict(Probe(f"raw_{kind}", bytes(good)))

    def _predict(self, p: Probe) -> Probe:
        """What the relay will see and must do: deserialize as it will, validate as it will."""
        data = p.payload if isinstance(p.payload, bytes) else self._ser(p.payload)
        try:
            msg = self._de(data, self.Req)
        except Exception:
            p.expect = UNDELIVERABLE
            return p
        reason, _, _ = self.validator.check(msg)
        p.session, p.sequence = msg.session_id, msg.sequence
        p.expect = ANSWER if reason is None else 1 + self.reasons.index(reason)
        return p


class AnswerBook:
    """Answers per request index in preallocated arrays (no growth during a run)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.count = np.zeros(n, np.int32)
        self.sid_crc = np.zeros(n, np.uint32)
        self.attempts = np.zeros(n, np.int32)
        self.unexpected = 0  # answers with no matching index / session
        self.codes = np.zeros(5, np.int64)
        self._lock = threading.Lock()

    def expect(self, i: int, session: str, attempts: int = 1) -> None:
        self.sid_crc[i] = zlib.crc32(session.encode("utf-8", "surrogatepass"))
        self.attempts[i] += attempts

    def index_of(self, session_id: str, sequence: int) -> int | None:
        if BASE_SEQ <= sequence < BASE_SEQ + self.n:
            return sequence - BASE_SEQ
        if sequence == UINT64_MAX and session_id[:1] == "q" and session_id[1:].isdigit():
            return int(session_id[1:])
        return None

    def on_answer(self, msg) -> None:
        i = self.index_of(msg.session_id, msg.sequence)
        crc = zlib.crc32(msg.session_id.encode("utf-8", "surrogatepass"))
        with self._lock:
            if msg.code < 5:
                self.codes[msg.code] += 1
            if i is None or i >= self.n or self.sid_crc[i] != crc or self.attempts[i] == 0:
                self.unexpected += 1
            else:
                self.count[i] += 1

    def total(self) -> int:
        return int(self.count.sum()) + self.unexpected


def run_malformed(h, messages: int = 2000, seed: int = 1, warmup: int = 300,
                  huge: bool = True, progress=None, backlog: int = 300) -> dict:
    """The hostile-input campaign on a running harness `h`; returns figures (see module doc)."""
    from flowedge_relay.harness import status_values

    relay = h.relay
    factory = ProbeFactory(h, seed, relay.validator.max_nfe, huge=huge)
    total = warmup + messages
    book = AnswerBook(total + 1)
    h.keep_answers = False
    h.on_answer = book.on_answer
    h.max_diagnostics = 20
    received0 = received(relay)
    discarded0 = {r: c for r, c in relay.validator.discarded.items()}
    expected_reasons: Counter = Counter()
    kinds: Counter = Counter()
    deliverable = 0
    hangs = 0
    rss_warm = rss_bytes()
    rss_samples = []
    t0 = time.monotonic()
    for i in range(total):
        if i == warmup:
            pace(relay, received0 + deliverable, backlog=0)
            rss_warm = rss_bytes()
        p = factory.make(i)
        kinds[p.kind] += 1
        if p.expect != UNDELIVERABLE:
            deliverable += 1
            if p.expect == ANSWER:
                book.expect(i, p.session)
            else:
                expected_reasons[factory.reasons[p.expect - 1].value] += 1
        h.pub.publish(p.payload)
        if i % 50 == 49:
            if not pace(relay, received0 + deliverable, backlog):
                hangs += 1
            if i % 1000 == 999:
                rss_samples.append([round(time.monotonic() - t0, 2), rss_bytes()])
                if progress:
                    progress(f"malformed: {i + 1}/{total} sent, rss {rss_bytes() / MB:.1f} MB")
    # marker: a plain valid request after everything must be answered
    marker = total
    book.expect(marker, "marker")
    h.send(factory.valid(marker, session="marker"))
    deliverable += 1
    from flowedge_relay.harness import wait_for

    want = int(book.attempts.sum())
    if not wait_for(lambda: book.count[marker] >= 1 and book.total() >= want, 60.0):
        hangs += 1
    time.sleep(0.5)  # any duplicate answer would arrive by now
    rss_end = rss_bytes()
    stats = relay.core.stats()
    status = h.latest_status("admission")
    diag = status_values(status) if status else {}
    got_reasons = {r.value: relay.validator.discarded[r] - discarded0[r]
                   for r in relay.validator.discarded}
    valid_idx = np.nonzero(book.attempts)[0]
    answered = book.count[valid_idx]
    alive = relay_threads_alive(relay)
    return {
        "messages_tried": total + 1,
        "warmup_messages": warmup,
        "seed": seed,
        "kinds": dict(sorted(kinds.items())),
        "deliverable": deliverable,
        "undeliverable_raw": total + 1 - deliverable,
        "relay_received": received(relay) - received0,
        "valid_requests": int(valid_idx.size),
        "valid_answered_exactly_once": int((answered == 1).sum()),
        "valid_unanswered": int((answered == 0).sum()),
        "valid_answered_twice_or_more": int((answered > 1).sum()),
        "unexpected_answers": book.unexpected,
        "answers_by_code": dict(zip(("inference", "rejected_stale", "rejected_deadline",
                                     "rejected_capacity", "expired"),
                                    map(int, book.codes), strict=True)),
        "invalid_expected_by_reason": dict(sorted(expected_reasons.items())),
        "invalid_counted_by_reason": {k: v for k, v in sorted(got_reasons.items()) if v},
        "diagnostics_invalid_discarded": int(diag.get("invalid_discarded", -1)),
        "diagnostics_by_reason": {k[len("invalid."):]: int(v) for k, v in diag.items()
                                  if k.startswith("invalid.") and v != "0"},
        "core_refused": got_reasons.get("core_refused", 0),
        "output_drops": stats.rejection_outputs_dropped + stats.action_outputs_dropped,
        "threads_alive": alive,
        "crashes": sum(1 for a in alive.values() if not a) + got_reasons.get("core_refused", 0),
        "hangs": hangs,
        "rss_warm_mb": round(rss_warm / MB, 2),
        "rss_end_mb": round(rss_end / MB, 2),
        "rss_growth_mb": round((rss_end - rss_warm) / MB, 2),
        "rss_samples": rss_samples,
        "seconds": round(time.monotonic() - t0, 2),
    }


def malformed_ok(fig: dict) -> list[str]:
    """The campaign's pass criteria; returns the failures (empty = pass)."""
    bad = []
    if fig["crashes"]:
        bad.append(f"crashes {fig['crashes']} (threads {fig['threads_alive']})")
    if fig["hangs"]:
        bad.append(f"hangs {fig['hangs']}")
    if fig["valid_unanswered"] or fig["valid_answered_twice_or_more"] or fig["unexpected_answers"]:
        bad.append("exactly-once violated: "
                   f"unanswered {fig['valid_unanswered']}, "
                   f"duplicates {fig['valid_answered_twice_or_more']}, "
                   f"unexpected {fig['unexpected_answers']}")
    if fig["invalid_expected_by_reason"] != fig["invalid_counted_by_reason"]:
        bad.append(f"per-reason counts differ: expected {fig['invalid_expected_by_reason']}, "
                   f"counted {fig['invalid_counted_by_reason']}")
    if fig["relay_received"] != fig["deliverable"]:
        bad.append(f"relay received {fig['relay_received']} of {fig['deliverable']} deliverable")
    return bad


# ---- soak --------------------------------------------------------------------------------------


def measure_capacity(h, seconds: float = 4.0, nfe_mix=(1, 8), sessions: int = 8) -> dict:
    """Saturate the relay with no-deadline requests; answers/s is the capacity at this mix."""
    from flowedge_relay.harness import wait_for

    relay = h.relay
    rng = random.Random(7)
    inflight_target = max(4, min(relay._p["queue_capacity"] // 2, 32))
    done = [0]

    def on_answer(msg):
        if msg.session_id.startswith("cal"):
            done[0] += 1

    h.keep_answers, h.on_answer = False, on_answer
    sent, i = 0, 0
    t_start, counted_from, done_from = time.monotonic(), None, 0
    while time.monotonic() - t_start < seconds:
        while sent - done[0] < inflight_target:
            h.send(h.request(session_id=f"cal{i % sessions}", sequence=i, generation=1,
                             remaining_nfe=rng.randint(*nfe_mix), noise_seed=i))
            sent += 1
            i += 1
        if counted_from is None and time.monotonic() - t_start > seconds / 4:
            counted_from, done_from = time.monotonic(), done[0]
        time.sleep(0.001)
    elapsed = time.monotonic() - (counted_from or t_start)
    rate = (done[0] - done_from) / max(elapsed, 1e-9)
    wait_for(lambda: done[0] >= sent, 30.0)
    p50, p99, _ = relay.pool.nfe_percentiles() if relay.pool else (0.0, 0.0, 0)
    return {"requests_per_s": round(rate, 1), "nfe_p50_ns": int(p50), "nfe_p99_ns": int(p99)}


class SoakTraffic:
    """Mixed traffic at a fixed rate: deadlines (none, generous, tight, passed), NFE 1-8,
    generation bumps and stale generations, coalescible duplicate retries, invalid input."""

    def __init__(self, h, book: AnswerBook, seed: int, sessions: int, max_nfe: int) -> None:
        self.h, self.book, self.rng = h, book, random.Random(seed)
        self.sessions = sessions
        self.generation = [1] * sessions
        self.max_nfe = max_nfe
        self.factory = ProbeFactory(h, seed + 1, max_nfe, huge=False)
        self.i = 0
        self.valid_sent = 0
        self.invalid_sent = 0
        self.retries_sent = 0

    def send_one(self) -> None:
        h, r, i = self.h, self.rng, self.i
        if i >= self.book.n:
            return
        self.i += 1
        roll = r.random()
        if roll < 0.05:  # invalid: counted, never answered
            kind, fields = r.choice([c for c in self.factory.hostile_invalid
                                     if c[0] not in ("session_id_huge", "observation_huge")])
            h.send(self.factory.valid(i, session=f"u{i}", **fields(r, i)))
            self.invalid_sent += 1
            return
        s = r.randrange(self.sessions)
        if r.random() < 0.03:
            self.generation[s] += 1
        gen = self.generation[s] - (1 if r.random() < 0.02 and self.generation[s] > 1 else 0)
        d = r.random()
        deadline = (None if d < 0.2 else r.uniform(200, 1000) if d < 0.8
                    else r.uniform(5, 30) if d < 0.95 else -10)
        session = f"soak{s}"
        req = h.request(session_id=session, sequence=BASE_SEQ + i, generation=gen,
                        remaining_nfe=r.randint(1, min(8, self.max_nfe)), noise_seed=i,
                        deadline_ms=deadline)
        retry = r.random() < 0.05  # a blind retry right behind it: coalesced if still queued
        attempts = 2 if retry else 1
        # book first: a passed deadline is answered within microseconds, maybe before send returns
        self.book.expect(i, session, attempts)
        h.send(req)
        if retry:
            req.retry_count, req.retry_reason = 1, 1
            h.send(req)
            self.retries_sent += 1
        self.valid_sent += attempts


def run_soak(h, duration_s: float, load: float = 0.8, seed: int = 3, sample_s: float = 1.0,
             sessions: int = 8, admission: bool = True, progress=None,
             progress_every_s: float = 10.0) -> dict:
    """Offer `load` x measured capacity of mixed traffic for `duration_s`; sample RSS, queue
    depth and outcome accounting every `sample_s`; check exactly-once-or-counted at the end."""
    from rclpy.parameter import Parameter

    from flowedge_relay.harness import wait_for

    relay = h.relay
    cap = measure_capacity(h)
    nfe_ns = 0
    if admission and cap["nfe_p99_ns"]:
        nfe_ns = int(max(3 * cap["nfe_p99_ns"], 200_000))
        relay.set_parameters([Parameter("nfe_ns", value=nfe_ns),
                              Parameter("admission_reserve_ns", value=2_000_000)])
    # capacity was measured at NFE 1-8 uniform, the soak's valid mix: offer load x that
    rate = max(load * cap["requests_per_s"], 1.0)
    n = int(rate * duration_s * 1.1) + 100
    book = AnswerBook(n)
    traffic = SoakTraffic(h, book, seed, sessions, relay.validator.max_nfe)
    h.keep_answers, h.on_answer, h.max_diagnostics = False, book.on_answer, 5
    stats0 = relay.core.stats()
    received0 = received(relay)
    samples = []
    t0 = time.monotonic()
    next_sample, next_progress = t0, t0 + progress_every_s
    sent_target = 0.0
    while True:
        now = time.monotonic()
        if now - t0 >= duration_s:
            break
        sent_target = (now - t0) * rate
        while traffic.i < sent_target and traffic.i < n:
            traffic.send_one()
        if now >= next_sample:
            samples.append(_soak_sample(relay, book, traffic, stats0, now - t0))
            next_sample += sample_s
        if progress and now >= next_progress:
            s = samples[-1]
            progress(f"soak {now - t0:5.0f}/{duration_s:.0f} s  sent {s['valid_sent']}  "
                     f"answered {s['answered']}  queue {s['queue_depth']}  "
                     f"rss {s['rss_mb']:.1f} MB  outcomes {s['outcomes']}")
            next_progress += progress_every_s
        time.sleep(0.002)
    # drain: every valid request either answered, coalesced into an answered one, or dropped
    want = traffic.valid_sent

    def settled() -> bool:
        st = relay.core.stats()
        return (book.total() + st.coalesced - stats0.coalesced >= want
                and st.queue_depth == 0 and st.lanes_busy == 0)

    drained = wait_for(settled, 60.0)
    time.sleep(0.5)
    samples.append(_soak_sample(relay, book, traffic, stats0, time.monotonic() - t0))
    st = relay.core.stats()
    coalesced = st.coalesced - stats0.coalesced
    drops = (st.rejection_outputs_dropped + st.action_outputs_dropped
             - stats0.rejection_outputs_dropped - stats0.action_outputs_dropped)
    idx = np.nonzero(book.attempts)[0]
    count, attempts = book.count[idx], book.attempts[idx]
    rss = np.array([s["rss_mb"] for s in samples])
    ts = np.array([s["t"] for s in samples])
    half = ts >= ts[-1] / 2
    slope = float(np.polyfit(ts[half], rss[half], 1)[0] * 60) if half.sum() >= 3 else 0.0
    warm = samples[min(len(samples) - 1, max(1, len(samples) // 5))]["rss_mb"]
    return {
        "duration_s": duration_s,
        "load": load,
        "capacity": cap,
        "offered_rate_per_s": round(rate, 1),
        "nfe_ns_configured": nfe_ns,
        "workers": relay._p["workers"],
        "queue_capacity": relay._p["queue_capacity"],
        "valid_sent": traffic.valid_sent,
        "retries_sent": traffic.retries_sent,
        "invalid_sent": traffic.invalid_sent,
        "relay_received": received(relay) - received0,
        "answered": book.total(),
        "coalesced": coalesced,
        "dropped": drops,
        "accounting_closes": book.total() + coalesced + drops == traffic.valid_sent,
        "drained": drained,
        "unanswered": int((count == 0).sum()),
        "answered_more_than_attempts": int((count > attempts).sum()),
        "single_attempt_answered_twice": int(((attempts == 1) & (count > 1)).sum()),
        "unexpected_answers": book.unexpected,
        "outcomes": samples[-1]["outcomes"],
        "calibration_misses": st.calibration_misses - stats0.calibration_misses,
        "invalid_discarded": relay.validator.total_discarded(),
        "queue_depth_max": max(s["queue_depth"] for s in samples),
        "rss_start_mb": samples[0]["rss_mb"],
        "rss_warm_mb": warm,
        "rss_end_mb": samples[-1]["rss_mb"],
        "rss_max_mb": float(rss.max()),
        "rss_slope_second_half_mb_per_min": round(slope, 3),
        "threads_alive": relay_threads_alive(relay),
        "samples": samples,
    }


def _soak_sample(relay, book, traffic, stats0, t: float) -> dict:
    st = relay.core.stats()
    names = ("inference", "rejected_stale", "rejected_deadline", "rejected_capacity", "expired")
    return {
        "t": round(t, 2),
        "rss_mb": round(rss_bytes() / MB, 2),
        "queue_depth": st.queue_depth,
        "lanes_busy": st.lanes_busy,
        "sessions": st.sessions,
        "valid_sent": traffic.valid_sent,
        "answered": book.total(),
        "coalesced": st.coalesced - stats0.coalesced,
        "dropped": st.rejection_outputs_dropped + st.action_outputs_dropped,
        "invalid_discarded": relay.validator.total_discarded(),
        "outcomes": {k: st.outcomes[j] - stats0.outcomes[j] for j, k in enumerate(names)},
    }


def soak_ok(fig: dict) -> list[str]:
    bad = []
    if not all(fig["threads_alive"].values()):
        bad.append(f"thread died: {fig['threads_alive']}")
    if not fig["drained"]:
        bad.append("did not drain within 60 s")
    if not fig["accounting_closes"]:
        bad.append(f"accounting: answered {fig['answered']} + coalesced {fig['coalesced']} + "
                   f"dropped {fig['dropped']} != sent {fig['valid_sent']}")
    if fig["dropped"] == 0 and fig["unanswered"]:
        bad.append(f"{fig['unanswered']} valid requests unanswered")
    if fig["answered_more_than_attempts"] or fig["single_attempt_answered_twice"]:
        bad.append("duplicate answers")
    if fig["unexpected_answers"]:
        bad.append(f"{fig['unexpected_answers']} unexpected answers")
    return bad


def plot_soak(fig: dict, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = fig["samples"]
    t = [x["t"] for x in s]
    f, (a1, a2, a3) = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    a1.plot(t, [x["rss_mb"] for x in s], color="#2166ac")
    a1.set_ylabel("RSS (MB)")
    a1.set_title(f"soak: {fig['duration_s']:.0f} s at {fig['load']:.0%} of capacity "
                 f"({fig['offered_rate_per_s']} req/s offered)")
    a2.plot(t, [x["queue_depth"] for x in s], color="#b2182b", label="queue depth")
    a2.plot(t, [x["sessions"] for x in s], color="#999999", lw=0.8, label="sessions")
    a2.set_ylabel("queued / sessions")
    a2.legend(loc="upper right", fontsize=8)
    for key, color in (("inference", "#1b7837"), ("rejected_deadline", "#e08214"),
                       ("rejected_capacity", "#762a83"), ("expired", "#b2182b"),
                       ("rejected_stale", "#999999")):
        a3.plot(t, [x["outcomes"][key] for x in s], label=key, color=color)
    a3.plot(t, [x["valid_sent"] for x in s], "k--", lw=0.8, label="valid sent")
    a3.set_ylabel("cumulative")
    a3.set_xlabel("time (s)")
    a3.legend(loc="upper left", fontsize=7)
    for a in (a1, a2, a3):
        a.grid(True, alpha=0.3)
    f.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    f.savefig(path, dpi=100)
    plt.close(f)
    return path


# ---- faults ------------------------------------------------------------------------------------


def fault_consumer_stops(h, n: int = 400) -> dict:
    """The output consumer stops draining: admission keeps deciding at full speed, full rings
    drop and count, nothing blocks; once it drains again, answers flow again."""
    from flowedge_relay.harness import wait_for

    relay = h.relay
    st0 = relay.core.stats()
    relay.fault_pause_output.set()
    time.sleep(0.05)
    t0 = time.monotonic()
    for start in range(0, n, 100):
        h.send(*[h.request(session_id=f"c{i % 4}", sequence=i, remaining_nfe=1,
                           deadline_ms=-1 if i % 2 else None) for i in range(start, start + 100)])
        pace(relay, received(relay) + 0, backlog=10_000)
    submitted = wait_for(lambda: relay.core.stats().submitted - st0.submitted >= n, 30.0)
    admit_s = time.monotonic() - t0
    idle = wait_for(lambda: relay.core.stats().queue_depth == 0
                    and relay.core.stats().lanes_busy == 0, 30.0)
    st = relay.core.stats()
    answers_while_paused = len(h.answers())
    relay.fault_pause_output.clear()
    rej_drop = st.rejection_outputs_dropped - st0.rejection_outputs_dropped
    act_drop = st.action_outputs_dropped - st0.action_outputs_dropped
    # the rings drain first (everything not dropped is answered), then new work flows again
    drained = wait_for(lambda: len(h.answers()) >= n - rej_drop - act_drop, 30.0)
    h.send(h.request(session_id="after", sequence=10**6))
    after = h.answer_for(10**6, timeout=30)
    st_after = relay.core.stats()
    time.sleep(0.3)
    keys = Counter((a.session_id, a.sequence) for a in h.answers())
    return {
        "requests": n,
        "all_submitted": submitted,
        "seconds_to_submit_all": round(admit_s, 3),
        "workers_went_idle": idle,
        "answers_while_paused": answers_while_paused,
        "rejection_outputs_dropped": rej_drop,
        "action_outputs_dropped": act_drop,
        "answers_after_resume": len(h.answers()),
        "rings_drained_after_resume": drained,
        "duplicate_answers": sum(1 for c in keys.values() if c > 1),
        "answered_after_resume": after is not None,
        "accounting_closes": len(h.answers()) - 1 + rej_drop + act_drop == n,
        "relay_received": received(relay),
        "submitted_after_resume": st_after.submitted - st0.submitted,
        "outcomes_after_resume": [a - b for a, b in zip(st_after.outcomes, st0.outcomes,
                                                        strict=True)],
        "threads_alive": relay_threads_alive(relay),
    }


def level(status) -> int:
    """DiagnosticStatus.level as an int (rclpy maps the `byte` type to bytes)."""
    lv = status.level
    return lv[0] if isinstance(lv, bytes) else int(lv)


def exactly_once(answers, sent_keys) -> dict:
    """Answers identified by (session_id, sequence) against the keys of the valid requests."""
    got = Counter((a.session_id, a.sequence) for a in answers)
    sent = Counter(sent_keys)
    return {
        "valid": sum(sent.values()),
        "unanswered": sum(1 for k in sent if got[k] == 0),
        "duplicates": sum(1 for k, c in got.items() if c > sent.get(k, 0) and k in sent),
        "unexpected": sum(c for k, c in got.items() if k not in sent),
    }


def fault_slow_worker(h) -> dict:
    """NFEs much slower than the calibrated nfe_ns: admitted work misses, counted, WARN."""
    from flowedge_relay.harness import status_values

    keys = []
    for i in range(6):
        h.send(h.request(session_id=f"slow{i}", sequence=i, remaining_nfe=3, deadline_ms=60))
        keys.append((f"slow{i}", i))
    h.wait_answers(len(keys), timeout=30)
    admission, workers = h.latest_status("admission"), h.latest_status("workers")
    time.sleep(0.3)
    st = h.relay.core.stats()
    return {
        **exactly_once(h.answers(), keys),
        "calibration_misses": st.calibration_misses,
        "expired": st.outcomes[4],
        "admission_level": level(admission),
        "admission_message": admission.message,
        "workers_level": level(workers),
        "workers_message": workers.message,
        "diag_calibration_misses": int(status_values(admission)["calibration_misses"]),
    }


def fault_worker_dies(h) -> dict:
    """Kill the worker holding a long request: its lane leaves admission, the in-flight
    request gets an outcome, ERROR diagnostics, the other lane keeps serving."""
    from flowedge_relay.harness import wait_for

    relay = h.relay
    h.send(h.request(session_id="long", sequence=1, remaining_nfe=40))
    wait_for(lambda: any(lane.busy for lane in relay.core.lanes_snapshot()), 10)
    lane = next(x.lane for x in relay.core.lanes_snapshot() if x.busy)
    alive_before = relay.core.stats().lanes_alive
    relay.pool.inject_worker_crash(lane)
    in_flight = h.answer_for(1, timeout=10)
    wait_for(lambda: relay.core.stats().lanes_alive == alive_before - 1, 10)
    workers = h.latest_status("workers")
    for i in range(2, 6):
        h.send(h.request(session_id="after", sequence=i, remaining_nfe=2))
    later = [h.answer_for(i, timeout=20) for i in range(2, 6)]
    time.sleep(0.2)
    return {
        **exactly_once(h.answers(), [("long", 1)] + [("after", i) for i in range(2, 6)]),
        "crashed_lane": lane,
        "lanes_alive_before": alive_before,
        "lanes_alive_after": relay.core.stats().lanes_alive,
        "in_flight_code": None if in_flight is None else in_flight.code,
        "in_flight_nfe_done": None if in_flight is None else in_flight.nfe_done,
        "workers_level": level(workers),
        "workers_message": workers.message,
        "later_codes": [None if a is None else a.code for a in later],
        "threads_alive": relay_threads_alive(relay),
    }


def fault_bad_model(h) -> dict:
    """Missing or corrupt model at start: ERROR, valid requests discarded, node stays up."""
    from flowedge_relay.harness import status_values

    for i in range(5):
        h.send(h.request(session_id="m", sequence=i))
    model = h.latest_status("model")
    admission = status_values(h.latest_status("admission"))
    time.sleep(0.3)
    h.send(h.request(session_id="m", sequence=99))
    again = h.latest_status("model")  # still publishing diagnostics after more input
    time.sleep(0.3)
    return {
        "model_level": level(model),
        "model_message": model.message,
        "answers": len(h.answers()),
        "discarded_model_unavailable": int(admission["invalid.model_unavailable"]),
        "diagnostics_still_published": again is not None,
        "request_thread_alive": relay_threads_alive(h.relay)["request"],
    }


def fault_burst(h, factor: int = 10, sessions: int = 8) -> dict:
    """A burst of `factor` x what the relay can hold (queue_capacity + workers), sent at once,
    mixed with duplicate retries and invalid input: exactly one answer per valid request."""
    relay = h.relay
    capacity = relay._p["queue_capacity"] + relay._p["workers"]
    n = factor * capacity
    keys, batch = [], []
    for i in range(n):
        sid = f"burst{i % sessions}"
        req = h.request(session_id=sid, sequence=i, remaining_nfe=1 + i % 4,
                        deadline_ms=None if i % 3 else 2_000 + i)
        batch.append(req)
        keys.append((sid, i))
        if i % 10 == 0:  # an invalid one: no answer, counted
            batch.append(h.request(session_id=sid, sequence=10**9 + i, remaining_nfe=0))
    st0 = relay.core.stats()
    t0 = time.monotonic()
    h.send(*batch)
    h.wait_answers(n, timeout=60)
    time.sleep(0.5)
    st = relay.core.stats()
    codes = Counter(a.code for a in h.answers())
    return {
        "burst": n,
        "capacity": capacity,
        "seconds": round(time.monotonic() - t0, 2),
        **exactly_once(h.answers(), keys),
        "codes": dict(sorted(codes.items())),
        "dropped": st.rejection_outputs_dropped + st.action_outputs_dropped
        - st0.rejection_outputs_dropped - st0.action_outputs_dropped,
        "invalid_discarded": relay.validator.total_discarded(),
    }


def fault_many_sessions(h, sessions: int = 200) -> dict:
    """Far more producer sessions than max_sessions: the table stays bounded, idle sessions are
    evicted, every request is still answered exactly once."""
    keys = []
    for start in range(0, sessions, 50):
        batch = []
        for i in range(start, min(start + 50, sessions)):
            batch.append(h.request(session_id=f"sess{i}", sequence=i, remaining_nfe=1))
            keys.append((f"sess{i}", i))
        h.send(*batch)
        time.sleep(0.02)
    h.wait_answers(sessions, timeout=60)
    time.sleep(0.3)
    st = h.relay.core.stats()
    return {
        **exactly_once(h.answers(), keys),
        "max_sessions": h.relay._p["max_sessions"],
        "sessions_gauge": st.sessions,
        "sessions_evicted": st.sessions_evicted,
        "codes": dict(sorted(Counter(a.code for a in h.answers()).items())),
    }


@stoppable  # SIGINT/SIGTERM stop it cleanly however it was started (exit 130)
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flowedge_relay.stress", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("malformed", help="hostile-input campaign over real DDS")
    m.add_argument("--messages", type=int, default=20_000)
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--workers", type=int, default=1)
    m.add_argument("--no-huge", action="store_true", help="leave out 100 kB ids / 800 kB arrays")
    m.add_argument("--request-qos-depth", type=int, default=1000)
    s = sub.add_parser("soak", help="mixed traffic at a fraction of measured capacity")
    s.add_argument("--duration", type=float, default=60.0, help="seconds (600 for the report)")
    s.add_argument("--load", type=float, default=0.8, help="fraction of measured capacity")
    s.add_argument("--model", default="bench", help="small, bench (~1 ms/NFE) or a path")
    s.add_argument("--workers", type=int, default=1)
    s.add_argument("--seed", type=int, default=3)
    s.add_argument("--no-admission", action="store_true", help="keep nfe_ns = 0")
    s.add_argument("--plot", default=None, help="PNG of RSS / queue depth / outcomes over time")
    s.add_argument("--progress-every", type=float, default=10.0)
    f = sub.add_parser("faults", help="the fault drills, with figures")
    f.add_argument("--workers", type=int, default=2)
    for p in (m, s, f):
        p.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")

    from flowedge_relay.harness import running_relay
    from flowedge_relay.model import bench_model_path, default_model_path

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.cmd == "malformed":
        with running_relay(workers=args.workers, request_qos_depth=args.request_qos_depth) as h:
            fig = run_malformed(h, args.messages, args.seed, huge=not args.no_huge,
                                progress=say)
        failures = malformed_ok(fig)
    elif args.cmd == "soak":
        path = {"small": default_model_path(), "bench": bench_model_path()}.get(args.model,
                                                                                args.model)
        with running_relay(workers=args.workers, model_path=path) as h:
            fig = run_soak(h, args.duration, args.load, args.seed,
                           admission=not args.no_admission, progress=say,
                           progress_every_s=args.progress_every)
        if args.plot:
            fig["plot"] = plot_soak(fig, args.plot)
        failures = soak_ok(fig)
    else:
        fig = run_faults(args.workers, progress=say)
        failures = [f"{name}: {why}" for name, r in fig.items() for why in r.get("failures", [])]
    fig["failures"] = failures
    brief = {k: v for k, v in fig.items() if k not in ("samples", "rss_samples")}
    print(json.dumps(brief, indent=2, default=str))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(fig, indent=2, default=str))
    say("PASS" if not failures else "FAIL: " + "; ".join(failures))
    return 0 if not failures else 1


def run_faults(workers: int = 2, progress=None) -> dict:
    """Every fault drill once, with its figures (the tests assert the same functions)."""
    import tempfile

    from flowedge_relay.harness import running_relay

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        corrupt = Path(tmp) / "corrupt.onnx"
        corrupt.write_bytes(b"\x08\x07garbage" * 100)
        drills = [
            ("consumer_stops_draining", fault_consumer_stops,
             dict(output_ring_capacity=16, action_output_wait_ms=5)),
            ("slow_worker", fault_slow_worker,
             dict(nfe_ns=2_000_000, fault_nfe_delay_ms=40.0)),
            ("worker_dies", fault_worker_dies, dict(workers=workers, fault_nfe_delay_ms=20.0)),
            ("model_missing", fault_bad_model, dict(model_path=str(Path(tmp) / "nope.onnx"))),
            ("model_corrupt", fault_bad_model, dict(model_path=str(corrupt))),
            ("burst_10x", fault_burst,
             dict(queue_capacity=32, nfe_ns=5_000_000, fault_nfe_delay_ms=2.0)),
            ("sessions_beyond_max", fault_many_sessions, dict(max_sessions=16)),
        ]
        for name, drill, params in drills:
            t0 = time.monotonic()
            with running_relay(**params) as h:
                out[name] = drill(h)
            out[name]["params"] = params
            if progress:
                progress(f"faults: {name} done in {time.monotonic() - t0:.1f} s")
    return out


if __name__ == "__main__":
    sys.exit(main())
