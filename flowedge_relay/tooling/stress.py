"""Robustness campaigns on a real relay over real DDS (issue 8): hostile input, soak, faults.

    python -m flowedge_relay.tooling.stress malformed --messages 20000 --json out/malformed.json
    python -m flowedge_relay.tooling.stress malformed --rate 2500 --duration 30 \
        --json out/flood.json
    python -m flowedge_relay.tooling.stress soak --duration 600 --json out/soak.json \
        --plot out/soak.png
    python -m flowedge_relay.tooling.stress faults --json out/faults.json

A real `RelayNode` (request thread, main executor, workers, publisher thread;
`harness.running_relay`) and a client node run in this process, over DDS on this host. With
`--rate` the hostile requests come from a second process (`stress produce`, paced by wall clock)
so the producer does not share the relay's interpreter. The same scenario functions back
`test/test_robustness.py`, so the CI tests and the figures a reviewer reruns are one code path.

How "exactly once" is checked: every generated request has a unique index. The index is the
sequence number (BASE + index) or, for probes whose sequence is deliberately UINT64_MAX, part of
a session id of their own. Answers are counted per index in preallocated arrays, together with a
CRC of the session id the answer must carry, so the bookkeeping neither grows during the run (RSS
stays meaningful) nor misattributes an answer.

What the relay must do with each probe is what its builder made it (`Oracle`), never a second
opinion from the relay's own code: valid requests must be answered once (EXPIRED when built past
their deadline), requests broken in one named field must be discarded and counted under that
reason, and raw CDR, whose fate is unknown by construction, must be either dropped by the
middleware, discarded and counted, or answered once. Figures: `valid_lost`, `duplicates`,
`unexpected_answers`, `middleware_lost`, next to the per-reason counts and RSS.
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

from flowedge_relay.core import CODE_KEYS
from flowedge_relay.signals import stoppable
from flowedge_relay.timebase import stamp_ns
from flowedge_relay.tooling.harness import build_request, model_path

UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
INT32_MAX = 2**31 - 1
MIXES = ("flood", "mixed", "invalid", "expired")  # ProbeFactory.make
BASE_SEQ = 1 << 40  # probe i has sequence BASE_SEQ + i (unless it tests UINT64_MAX)
MB = 1024 * 1024


def rss_bytes() -> int:
    """Resident set size of this process (relay + client + DDS), from /proc."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def relay_threads_alive(relay) -> dict[str, bool]:
    """Liveness of every relay thread that must survive hostile input."""
    return relay.threads_alive()


def received(relay) -> int:
    """Requests the relay's callback has seen (valid or not)."""
    return relay.counters().received


def lost(relay) -> int:
    """Requests the middleware reported lost before the relay's callback."""
    return relay.counters().middleware_lost


def param(relay, name: str):
    return relay.get_parameter(name).value


def pace(relay, target: int, backlog: int = 300, timeout: float = 30.0) -> bool:
    """Keep at most `backlog` requests between the client and the relay's callback, so the
    relay's DDS history never fills: a producer in the relay's own process is delivered
    intra-process, and Fast DDS reports nothing it loses there (SECURITY.md)."""
    from flowedge_relay.tooling.harness import wait_for

    return wait_for(lambda: received(relay) >= target - backlog, timeout, 0.002)


# ---- hostile input -----------------------------------------------------------------------------

# What the builder knows about each probe it makes (the oracle; no validator involved).
NOT_SENT, VALID_ANY, VALID_EXPIRED, INVALID, RAW = 0, 1, 2, 3, 4
EXPIRED_CODE = 4  # ActionMessage.EXPIRED


@dataclass
class Probe:
    kind: str
    payload: object  # an InferenceRequest, or bytes published raw
    expect: int = VALID_ANY  # VALID_ANY, VALID_EXPIRED, INVALID or RAW
    reason: str = ""  # INVALID: the check the builder broke on purpose (validation.Reason value)
    session: str = ""  # the session_id its answer must carry (what the wire delivers)


class _Contract:
    """What a valid request must match: the relay's model, as a producer would be told it."""

    def __init__(self, digest: str, obs_dim: int, action_dim: int, action_horizon: int) -> None:
        self.digest, self.obs_dim = digest, obs_dim
        self.action_dim, self.action_horizon = action_dim, action_horizon

    def as_dict(self) -> dict:
        return {"digest": self.digest, "obs_dim": self.obs_dim, "action_dim": self.action_dim,
                "action_horizon": self.action_horizon}


def contract_of(model) -> _Contract:
    """The contract of a loaded model (ModelInfo or Policy), as a producer would be told it."""
    return _Contract(model.digest, model.obs_dim, model.action_dim, model.action_horizon)


class RequestBuilder:
    """Builds valid InferenceRequests for a model contract; harness.RelayHarness.request's
    twin for a producer process that has no harness (ROS time = system time here)."""

    def __init__(self, model: _Contract) -> None:
        self.model = model

    def request(self, **fields):
        return build_request(self.model, time.time_ns(), **fields)


def _unicode(r: random.Random, n: int) -> str:
    """n arbitrary code points (no surrogates, no NUL: rclpy refuses lone surrogates and a
    NUL would truncate the id on the wire)."""
    out = []
    for _ in range(n):
        c = r.randrange(1, 0x10FFFF - 0x800)
        out.append(chr(c + 0x800 if c >= 0xD800 else c))
    return "".join(out)


class ProbeFactory:
    """Seeded generator of hostile, hostile-but-valid, raw-CDR and plain valid requests.

    Each probe carries what its builder made it: valid (to be answered exactly once; EXPIRED
    when its deadline had passed when it was built), invalid in one named field (to be
    discarded and counted under that reason), or raw CDR whose fate nobody can know (it may not
    even deserialize). That is the campaign's oracle: nothing is predicted by running a copy of
    the relay's own validator, so a validator that wrongly discarded valid input would show as
    valid requests lost.
    """

    def __init__(self, h, seed: int, max_nfe: int, huge: bool = True) -> None:
        from flowedge_relay_msgs.msg import InferenceRequest
        from rclpy.serialization import serialize_message

        self.h, self.rng, self.max_nfe, self.huge = h, random.Random(seed), max_nfe, huge
        self.Req = InferenceRequest
        self._ser = serialize_message
        m = h.model
        self.obs_dim = m.obs_dim
        own = {"observation_dim": m.obs_dim, "action_dim": m.action_dim,
               "action_horizon": m.action_horizon}

        def wrong_dim(r):
            field_ = r.choice(list(own))
            return {field_: r.choice([v for v in (0, 1, 3, 9, 1024, UINT32_MAX)
                                      if v != own[field_]])}

        # (kind, fields(r, i)); INVALID_REASON says which check each one breaks
        self.hostile_invalid = [
            ("session_id_empty", lambda r, i: {"session_id": ""}),
            # an embedded NUL ends a ROS string on the wire: this id arrives empty
            ("session_id_nul_first", lambda r, i: {"session_id": "\x00hidden"}),
            ("session_id_65_bytes", lambda r, i: {"session_id": "x" * 65}),
            ("session_id_multibyte_too_long", lambda r, i: {"session_id": "\u00e9" * 33}),
            ("session_id_huge", lambda r, i: {"session_id": "h" * r.choice([1000, 100_000])}),
            ("digest_garbage", lambda r, i: {"model_digest": r.choice([
                "", "sha256:", "sha256:" + "0" * 64, "md5:abc", "\u202e\u0001x" * 8,
                "sha256:" + "f" * 10_000, "".join(chr(r.randrange(1, 0xD7FF)) for _ in range(40)),
            ])}),
            ("dims_wrong", lambda r, i: wrong_dim(r)),
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
        # The issue-14 flood: what a broken or hostile producer sends at a high rate.
        self.flood_invalid = [
            ("flood_session_id_unicode", lambda r, i: {"session_id": _unicode(
                r, r.randint(65, 300))}),
            ("flood_digest_5000", lambda r, i: {"model_digest": "sha256:" + "e" * 4993}),
            ("flood_observation_long", lambda r, i: {"observation": self._floats(
                r.randint(self.obs_dim + 1, 4096))}),
            ("observation_nan_inf", lambda r, i: {"observation": self._poison(r)}),
            ("remaining_nfe_zero", lambda r, i: {"remaining_nfe": 0}),
            ("flood_remaining_nfe_u32_max", lambda r, i: {"remaining_nfe": UINT32_MAX}),
            ("dims_wrong", lambda r, i: wrong_dim(r)),
        ]
        now_s = time.time_ns() // 1_000_000_000
        # (kind, fields); the ones in PAST_DEADLINE must be answered EXPIRED
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
    def _floats(n: int):
        import array

        return array.array("f", bytes(4 * n))

    @staticmethod
    def _sid(i: int, n: int) -> str:
        s = f"b{i}-"
        return s + "y" * (n - len(s))

    def valid(self, i: int, session: str | None = None, past: bool | None = None, **fields):
        """A valid request; `past=True` gives it a deadline already gone (must be EXPIRED)."""
        h, r = self.h, self.rng
        deadline = r.choice([None, None, 2_000, 10_000, -1]) if past is None else (
            -1 if past else r.choice([None, 2_000, 10_000]))
        req = h.request(
            session_id=session or f"v{i % 8}", sequence=BASE_SEQ + i, generation=1,
            remaining_nfe=r.randint(1, 4), noise_seed=i, deadline_ms=deadline,
            observation=[r.uniform(-1, 1) for _ in range(self.obs_dim)],
        )
        for k, v in fields.items():
            setattr(req, k, v)
        return req

    def _valid_probe(self, kind: str, req) -> Probe:
        past = kind == "deadline_past" or (req.deadline.sec or req.deadline.nanosec) and (
            stamp_ns(req.deadline) < time.time_ns())
        return Probe(kind, req, VALID_EXPIRED if past else VALID_ANY,
                     session=req.session_id.split("\x00")[0])

    def _invalid_probe(self, i: int, kind: str, fields) -> Probe:
        req = self.valid(i, session=f"u{i}", past=False, **fields(self.rng, i))
        return Probe(kind, req, INVALID, reason=INVALID_REASON[kind])

    def make(self, i: int, mix: str = "mixed") -> Probe:
        """Probe i. mixed: 35% plain valid, 35% hostile invalid, 15% hostile but valid, 15% raw
        CDR. flood (issue 14): 90% invalid (the flood kinds), 10% valid, 3 in 10 of those
        already past their deadline. invalid: only the flood kinds. expired: only valid
        requests past their deadline (the cheapest decision)."""
        r = self.rng
        roll = r.random()
        if mix == "invalid":
            kind, fields = r.choice(self.flood_invalid)
            return self._invalid_probe(i, kind, fields)
        if mix == "expired":
            return self._valid_probe("valid_past_deadline", self.valid(i, past=True))
        if mix == "flood":
            if roll < 0.9:
                kind, fields = r.choice(self.flood_invalid)
                return self._invalid_probe(i, kind, fields)
            past = r.random() < 0.3
            return self._valid_probe("valid_past_deadline" if past else "valid",
                                     self.valid(i, past=past))
        if roll < 0.35:
            return self._valid_probe("valid", self.valid(i))
        if roll < 0.70:
            kind, fields = r.choice(self.hostile_invalid)
            if kind in ("session_id_huge", "observation_huge") and not self.huge:
                kind, fields = self.hostile_invalid[0]
            return self._invalid_probe(i, kind, fields)
        if roll < 0.85:
            kind, fields = r.choice(self.hostile_valid)
            return self._valid_probe(kind, self.valid(i, session=f"q{i}", **fields(r, i)))
        return self._raw(i)

    def _raw(self, i: int) -> Probe:
        """Hand-made CDR: invalid UTF-8, truncation, lying length prefixes, bit flips. Its fate
        is unknown by construction (dropped by the middleware, discarded, or answered)."""
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
        return Probe(f"raw_{kind}", bytes(good), RAW)


# The check each invalid kind breaks, by construction (validation.Reason values).
INVALID_REASON = {
    "session_id_empty": "session_id_empty",
    "session_id_nul_first": "session_id_empty",
    "session_id_65_bytes": "session_id_too_long",
    "session_id_multibyte_too_long": "session_id_too_long",
    "session_id_huge": "session_id_too_long",
    "flood_session_id_unicode": "session_id_too_long",
    "digest_garbage": "model_digest_mismatch",
    "flood_digest_5000": "model_digest_mismatch",
    "dims_wrong": "dims_mismatch",
    "observation_length": "observation_length",
    "observation_huge": "observation_length",
    "flood_observation_long": "observation_length",
    "observation_nan_inf": "observation_not_finite",
    "remaining_nfe_zero": "remaining_nfe_zero",
    "remaining_nfe_huge": "remaining_nfe_above_max",
    "flood_remaining_nfe_u32_max": "remaining_nfe_above_max",
    "retry_reason_unknown": "retry_reason_unknown",
    "deadline_negative": "time_invalid",
    "deadline_nanosec_overflow": "time_invalid",
    "origin_negative": "time_invalid",
}


class Oracle:
    """Per probe index, what its builder made (preallocated: no growth during a run)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.expect = np.zeros(n, np.int8)  # NOT_SENT / VALID_ANY / VALID_EXPIRED / INVALID / RAW
        self.sid_crc = np.zeros(n, np.uint32)
        self.kinds: Counter = Counter()
        self.reasons: Counter = Counter()  # invalid probes by the reason they must be counted as

    def record(self, i: int, p: Probe) -> None:
        self.kinds[p.kind] += 1
        self.expect[i] = p.expect
        if p.expect == INVALID:
            self.reasons[p.reason] += 1
        elif p.expect in (VALID_ANY, VALID_EXPIRED):
            self.sid_crc[i] = zlib.crc32(p.session.encode("utf-8", "surrogatepass"))

    def save(self, path: str) -> None:
        np.savez(path, expect=self.expect, sid_crc=self.sid_crc,
                 kinds=json.dumps(self.kinds), reasons=json.dumps(self.reasons))

    @classmethod
    def load(cls, path: str) -> Oracle:
        data = np.load(path)
        o = cls(int(data["expect"].size))
        o.expect[:], o.sid_crc[:] = data["expect"], data["sid_crc"]
        o.kinds = Counter(json.loads(str(data["kinds"])))
        o.reasons = Counter(json.loads(str(data["reasons"])))
        return o


class FloodBook:
    """Answers per probe index, recorded as they come (preallocated); judged against the
    Oracle afterwards, so the producer may be another process."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.count = np.zeros(n, np.int32)
        self.crc = np.zeros(n, np.uint32)  # of the first answer's session_id
        self.code = np.full(n, -1, np.int8)  # of the first answer
        self.unattributed = 0  # answers whose key names no probe
        self.codes = np.zeros(5, np.int64)
        self._lock = threading.Lock()

    def index_of(self, session_id: str, sequence: int) -> int | None:
        if BASE_SEQ <= sequence < BASE_SEQ + self.n:
            return sequence - BASE_SEQ
        if sequence == UINT64_MAX and session_id[:1] == "q" and session_id[1:].isdigit():
            i = int(session_id[1:])
            return i if i < self.n else None
        return None

    def on_answer(self, msg) -> None:
        i = self.index_of(msg.session_id, msg.sequence)
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


def judge(oracle: Oracle, book: FloodBook) -> dict:
    """Exactly-once against what the builder made (see Oracle)."""
    e, c = oracle.expect, book.count
    valid = (e == VALID_ANY) | (e == VALID_EXPIRED)
    answered_valid = valid & (c > 0)
    wrong_session = answered_valid & (book.crc != oracle.sid_crc)
    expired = e == VALID_EXPIRED
    return {
        "valid_sent": int(valid.sum()),
        "valid_past_deadline_sent": int(expired.sum()),
        "valid_answered_exactly_once": int((valid & (c == 1) & ~wrong_session).sum()),
        "valid_lost": int((valid & (c == 0)).sum()),
        "duplicates": int((valid & (c > 1)).sum() + (((e == RAW) & (c > 1)).sum())),
        "unexpected_answers": int(c[(e == INVALID) | (e == NOT_SENT)].sum())
        + book.unattributed + int(wrong_session.sum()),
        "past_deadline_not_expired": int((expired & (c > 0) & (book.code != EXPIRED_CODE)).sum()),
        "raw_sent": int((e == RAW).sum()),
        "raw_answered": int(((e == RAW) & (c > 0)).sum()),
    }


def _close_accounting(fig: dict, oracle: Oracle, got_reasons: dict[str, int]) -> None:
    """Every message the relay received is answered or counted, per reason; raw CDR that the
    middleware delivered accounts for any excess over what the builder broke on purpose."""
    typed_sent = int(((oracle.expect != NOT_SENT) & (oracle.expect != RAW)).sum())
    raw_delivered = fig["relay_received"] - typed_sent
    excess = {k: got_reasons.get(k, 0) - oracle.reasons.get(k, 0)
              for k in set(got_reasons) | set(oracle.reasons)}
    fig["invalid_built_by_reason"] = dict(sorted(oracle.reasons.items()))
    fig["invalid_counted_by_reason"] = {k: v for k, v in sorted(got_reasons.items()) if v}
    fig["raw_delivered"] = raw_delivered
    fig["undeliverable_raw"] = fig["raw_sent"] - raw_delivered
    fig["invalid_counts_match_builder"] = all(v >= 0 for v in excess.values()) and (
        sum(excess.values()) == raw_delivered - fig["raw_answered"])


def _relay_figures(h, got_reasons: dict[str, int]) -> dict:
    from flowedge_relay.tooling.harness import status_values

    relay = h.relay
    stats = relay.core.stats()
    status = h.latest_status("admission")
    diag = status_values(status) if status else {}
    alive = relay_threads_alive(relay)
    return {
        "diagnostics_invalid_discarded": int(diag.get("invalid_discarded", -1)),
        "diagnostics_by_reason": {k[len("invalid."):]: int(v) for k, v in diag.items()
                                  if k.startswith("invalid.") and v != "0"},
        "diagnostics_middleware_lost": diag.get("middleware_lost", ""),
        "core_refused": got_reasons.get("core_refused", 0),
        "coalesced": stats.coalesced,
        "output_drops": stats.rejection_outputs_dropped + stats.action_outputs_dropped,
        "threads_alive": alive,
        "crashes": sum(1 for a in alive.values() if not a) + got_reasons.get("core_refused", 0),
    }


def run_malformed(h, messages: int = 2000, seed: int = 1, warmup: int = 300,
                  huge: bool = True, progress=None, backlog: int = 300,
                  mix: str = "mixed") -> dict:
    """The hostile-input campaign, producer in this process, flow-controlled by the relay's
    intake (at most `backlog` unread); returns figures (see module doc)."""

    relay = h.relay
    factory = ProbeFactory(h, seed, relay.validator.max_nfe, huge=huge)
    total = warmup + messages
    oracle = Oracle(total + 1)
    book = FloodBook(total + 1)
    h.keep_answers = False
    h.on_answer = book.on_answer
    h.max_diagnostics = 20
    received0, lost0 = received(relay), lost(relay)
    discarded0 = relay.counters().discarded
    typed = 0
    hangs = 0
    rss_warm = rss_bytes()
    rss_samples = []
    t0 = time.monotonic()
    for i in range(total):
        if i == warmup:
            pace(relay, received0 + typed, backlog=0)
            rss_warm = rss_bytes()
        p = factory.make(i, mix)
        oracle.record(i, p)  # before sending: a passed deadline is answered within microseconds
        typed += p.expect != RAW
        h.pub.publish(p.payload)
        if i % 50 == 49:
            if not pace(relay, received0 + typed, backlog):
                hangs += 1
            if i % 1000 == 999:
                rss_samples.append([round(time.monotonic() - t0, 2), rss_bytes()])
                if progress:
                    progress(f"malformed: {i + 1}/{total} sent, rss {rss_bytes() / MB:.1f} MB")
    # marker: a plain valid request after everything must be answered
    marker = total
    oracle.record(marker, Probe("marker", None, VALID_ANY, session="marker"))
    h.send(factory.valid(marker, session="marker", past=False))
    if not _settle(relay, book, oracle, marker, 60.0):
        hangs += 1
    time.sleep(0.5)  # any duplicate answer would arrive by now
    rss_end = rss_bytes()
    got_reasons = {r: c - discarded0[r] for r, c in relay.counters().discarded.items()}
    fig = {
        "mix": mix,
        "messages_tried": total + 1,
        "warmup_messages": warmup,
        "seed": seed,
        "kinds": dict(sorted(oracle.kinds.items())),
        "relay_received": received(relay) - received0,
        "middleware_lost": lost(relay) - lost0,
        **judge(oracle, book),
        "answers_by_code": _codes(book),
        **_relay_figures(h, got_reasons),
        "hangs": hangs,
        "rss_warm_mb": round(rss_warm / MB, 2),
        "rss_end_mb": round(rss_end / MB, 2),
        "rss_growth_mb": round((rss_end - rss_warm) / MB, 2),
        "rss_samples": rss_samples,
        "seconds": round(time.monotonic() - t0, 2),
    }
    _close_accounting(fig, oracle, got_reasons)
    return fig


def _settle(relay, book: FloodBook, oracle: Oracle, marker: int, timeout: float) -> bool:
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
        st = relay.core.stats()
        now = (received(relay), book.answered(), st.queue_depth, st.lanes_busy)
        if now != last:
            last, still_since = now, time.monotonic()
        elif st.queue_depth == 0 and st.lanes_busy == 0 and time.monotonic() - still_since > 2:
            break
        time.sleep(0.02)
    return bool(book.count[marker] >= 1)


def _codes(book: FloodBook) -> dict[str, int]:
    return dict(zip(CODE_KEYS, map(int, book.codes), strict=True))


def run_flood(h, rate: float, duration_s: float, seed: int = 1, mix: str = "flood",
              progress=None, producer_depth: int = 5000, settle_s: float = 60.0) -> dict:
    """The hostile-input campaign at a fixed offered rate, paced by wall clock: a producer
    process (`python -m flowedge_relay.tooling.stress produce`) builds and publishes the probes and
    writes the oracle; this process runs the relay and books every answer."""
    import subprocess
    import tempfile


    relay = h.relay
    n = int(rate * duration_s) + 1
    book = FloodBook(n + 1)
    h.keep_answers, h.on_answer, h.max_diagnostics = False, book.on_answer, 5
    received0, lost0 = received(relay), lost(relay)
    discarded0 = relay.counters().discarded
    contract = _Contract(h.model.digest, h.model.obs_dim, h.model.action_dim,
                         h.model.action_horizon)
    with tempfile.TemporaryDirectory() as tmp:
        oracle_path = str(Path(tmp) / "oracle.npz")
        cmd = [sys.executable, "-m", "flowedge_relay.tooling.stress", "produce",
               "--seed", str(seed),
               "--rate", str(rate), "--count", str(n), "--mix", mix,
               "--contract", json.dumps(contract.as_dict()), "--max-nfe",
               str(relay.validator.max_nfe), "--depth", str(producer_depth),
               "--oracle", oracle_path]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        rss_warm, rss_max, samples = 0, 0, []
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < duration_s + 120:
            time.sleep(1.0)
            rss = rss_bytes()
            rss_max = max(rss_max, rss)
            if not rss_warm and time.monotonic() - t0 >= min(5.0, duration_s / 4):
                rss_warm = rss
            samples.append([round(time.monotonic() - t0, 1), rss,
                            received(relay) - received0, lost(relay) - lost0])
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
        return received(relay) - received0 + lost(relay) - lost0

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
    hangs = int(hung) + (not _settle(relay, book, oracle, marker, 60.0))
    time.sleep(0.5)
    got_reasons = {r: c - discarded0[r] for r, c in relay.counters().discarded.items()}
    rss_end = rss_bytes()
    fig = {
        "mix": mix,
        "seed": seed,
        "offered_rate_per_s": rate,
        "duration_s": duration_s,
        "sent": sent,
        "publish_failures": produced.get("publish_failures", -1),
        "achieved_rate_per_s": produced.get("achieved_rate_per_s", 0.0),
        "producer_all_acked": produced.get("all_acked", False),
        "kinds": dict(sorted(oracle.kinds.items())),
        "relay_received": received(relay) - received0,
        "middleware_lost": lost(relay) - lost0,
        **judge(oracle, book),
        "answers_by_code": _codes(book),
        **_relay_figures(h, got_reasons),
        "hangs": hangs,
        "rss_warm_mb": round(rss_warm / MB, 2),
        "rss_max_mb": round(rss_max / MB, 2),
        "rss_end_mb": round(rss_end / MB, 2),
        "rss_growth_mb": round((rss_end - rss_warm) / MB, 2) if rss_warm else None,
        "samples": samples,
    }
    _close_accounting(fig, oracle, got_reasons)
    fig["accounting_closes"] = fig["relay_received"] + fig["middleware_lost"] == sent - fig[
        "undeliverable_raw"] and fig["invalid_counts_match_builder"]
    return fig


def produce(args) -> int:
    """The flood producer process: build probe i, publish it at t0 + i / rate, record what
    was built (the oracle), wait until the relay acknowledged everything, print a summary."""
    from flowedge_relay_msgs.msg import InferenceRequest
    from rclpy.duration import Duration
    from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

    from flowedge_relay.tooling.harness import ros_context, wait_for_subscribers

    c = json.loads(args.contract)
    builder = RequestBuilder(_Contract(c["digest"], c["obs_dim"], c["action_dim"],
                                       c["action_horizon"]))
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


# ---- soak --------------------------------------------------------------------------------------


def measure_capacity(h, seconds: float = 4.0, nfe_mix=(1, 8), sessions: int = 8) -> dict:
    """Saturate the relay with no-deadline requests; answers/s is the capacity at this mix."""
    from flowedge_relay.tooling.harness import wait_for

    relay = h.relay
    rng = random.Random(7)
    inflight_target = max(4, min(param(relay, "queue_capacity") // 2, 32))
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

    from flowedge_relay.tooling.harness import wait_for

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
        "workers": param(relay, "workers"),
        "queue_capacity": param(relay, "queue_capacity"),
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
        "invalid_discarded": sum(relay.counters().discarded.values()),
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
    names = CODE_KEYS
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
        "invalid_discarded": sum(relay.counters().discarded.values()),
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
    from flowedge_relay.tooling.bench.plots import plt  # Agg backend; says what to install

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
    from flowedge_relay.tooling.harness import wait_for

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
    """NFEs much slower than the calibrated nfe_ns: admitted work misses, counted, WARN. The
    deadlines (300 ms) leave room for a slow delivery on a loaded host, far less than the six
    requests' 720 ms of real work: admission (2 ms per NFE) takes them, and they miss."""
    from flowedge_relay.tooling.harness import status_values

    keys = []
    for i in range(6):
        h.send(h.request(session_id=f"slow{i}", sequence=i, remaining_nfe=3, deadline_ms=300))
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
    from flowedge_relay.tooling.harness import wait_for

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
    from flowedge_relay.tooling.harness import status_values

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
    capacity = param(relay, "queue_capacity") + param(relay, "workers")
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
        "invalid_discarded": sum(relay.counters().discarded.values()),
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
        "max_sessions": param(h.relay, "max_sessions"),
        "sessions_gauge": st.sessions,
        "sessions_evicted": st.sessions_evicted,
        "codes": dict(sorted(Counter(a.code for a in h.answers()).items())),
    }


@stoppable  # SIGINT/SIGTERM stop it cleanly however it was started (exit 130)
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flowedge_relay.tooling.stress", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("malformed", help="hostile-input campaign over real DDS")
    m.add_argument("--messages", type=int, default=20_000)
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--workers", type=int, default=1)
    m.add_argument("--no-huge", action="store_true", help="leave out 100 kB ids / 800 kB arrays")
    m.add_argument("--request-qos-depth", type=int, default=1000)
    m.add_argument("--request-qos-history", choices=("keep_all", "keep_last"),
                   default="keep_all")
    m.add_argument("--rate", type=float, default=None,
                   help="messages/s, paced by wall clock, from a producer process (with "
                        "--duration); without it the producer shares this process and is "
                        "flow-controlled by the relay's intake (--messages)")
    m.add_argument("--duration", type=float, default=30.0, help="seconds at --rate")
    m.add_argument("--mix", choices=("flood", "mixed"), default=None,
                   help="flood: 90%% invalid as in issue 14 (default with --rate); mixed: "
                        "35%% valid, 35%% invalid, 15%% hostile-but-valid, 15%% raw CDR")
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
    pr = sub.add_parser("produce", help="(internal) the producer process of malformed --rate")
    pr.add_argument("--seed", type=int, default=1)
    pr.add_argument("--rate", type=float, required=True)
    pr.add_argument("--count", type=int, required=True)
    pr.add_argument("--mix", choices=MIXES, default="flood")
    pr.add_argument("--contract", required=True, help="JSON: digest, obs_dim, action_dim, "
                                                      "action_horizon")
    pr.add_argument("--max-nfe", type=int, default=64)
    pr.add_argument("--depth", type=int, default=5000, help="publisher KEEP_LAST depth")
    pr.add_argument("--topic", default="flowedge/requests")
    pr.add_argument("--oracle", required=True, help="where to write what was built (.npz)")
    for p in (m, s, f):
        p.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    if args.cmd == "produce":
        os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
        return produce(args)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")

    from flowedge_relay.tooling.harness import running_relay

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.cmd == "malformed":
        with running_relay(workers=args.workers, request_qos_depth=args.request_qos_depth,
                           request_qos_history=args.request_qos_history) as h:
            if args.rate:
                fig = run_flood(h, args.rate, args.duration, args.seed, mix=args.mix or "flood",
                                progress=say)
            else:
                fig = run_malformed(h, args.messages, args.seed, huge=not args.no_huge,
                                    progress=say, mix=args.mix or "mixed")
        failures = malformed_ok(fig)
    elif args.cmd == "soak":
        path = model_path(args.model)
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

    from flowedge_relay.tooling.harness import running_relay

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
