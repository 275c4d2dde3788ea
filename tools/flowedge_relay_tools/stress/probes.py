# SPDX-License-Identifier: Apache-2.0
"""The hostile-input probes and their oracle: what each request was built to be.

Every generated request has a unique index. The index is the sequence number (BASE_SEQ + index)
or, for probes whose sequence is deliberately UINT64_MAX, part of a session id of their own
(`probe_index`). What the relay must do with each probe is what its builder made it (`Oracle`),
never a second opinion from the relay's own code: valid requests must be answered once (EXPIRED
when built past their deadline), requests broken in one named field must be discarded and
counted under that reason, and raw CDR, whose fate is unknown by construction, must be either
dropped by the middleware, discarded and counted, or answered once.
"""

from __future__ import annotations

import json
import math
import random
import struct
import time
import zlib
from collections import Counter
from dataclasses import dataclass

import numpy as np

from flowedge_relay.timebase import stamp_ns
from flowedge_relay_tools.harness import build_request

UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
INT32_MAX = 2**31 - 1
MIXES = ("flood", "mixed", "invalid", "expired")  # ProbeFactory.make
BASE_SEQ = 1 << 40  # probe i has sequence BASE_SEQ + i (unless it tests UINT64_MAX)

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


class Contract:
    """What a valid request must match: the relay's model, as a producer would be told it."""

    def __init__(self, digest: str, obs_dim: int, action_dim: int, action_horizon: int) -> None:
        self.digest, self.obs_dim = digest, obs_dim
        self.action_dim, self.action_horizon = action_dim, action_horizon

    @classmethod
    def of(cls, model) -> Contract:
        """The contract of anything with digest and dims (a ModelInfo, a Policy, a harness's
        model)."""
        return cls(model.digest, model.obs_dim, model.action_dim, model.action_horizon)

    @classmethod
    def from_dict(cls, d: dict) -> Contract:
        return cls(d["digest"], d["obs_dim"], d["action_dim"], d["action_horizon"])

    def as_dict(self) -> dict:
        return {"digest": self.digest, "obs_dim": self.obs_dim, "action_dim": self.action_dim,
                "action_horizon": self.action_horizon}


class RequestBuilder:
    """Builds valid InferenceRequests for a model contract; harness.RelayHarness.request's
    twin for a producer process that has no harness (ROS time = system time here)."""

    def __init__(self, model: Contract) -> None:
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
            # a real-time chunking prefix to a model served without it (any length)
            ("prefix_without_rtc", lambda r, i: {"prefix_actions": [0.5] * r.choice(
                [1, m.action_dim, m.action_dim * m.action_horizon, 100_000])}),
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
        CDR. flood: 90% invalid (the flood kinds), 10% valid, 3 in 10 of those
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
    "prefix_without_rtc": "prefix_unsupported",
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


def probe_index(session_id: str, sequence: int, n: int) -> int | None:
    """The index of the probe an answer's key names (see the module doc), or None."""
    if BASE_SEQ <= sequence < BASE_SEQ + n:
        return sequence - BASE_SEQ
    if sequence == UINT64_MAX and session_id[:1] == "q" and session_id[1:].isdigit():
        i = int(session_id[1:])
        return i if i < n else None
    return None
