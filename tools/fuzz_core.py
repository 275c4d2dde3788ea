# SPDX-License-Identifier: Apache-2.0
"""Fuzz the C scheduling core directly: random operation sequences through CFFI.

    python tools/fuzz_core.py --seconds 60                 # plain build, seeded, reports JSON
    python tools/fuzz_core.py --seconds 60 --sanitize      # ASan + UBSan build of csrc/, same ops
    python tools/fuzz_core.py --seed 1234 --cases 1        # replay one case (printed on failure)

Needs nothing beyond the project's venv (no libFuzzer, no atheris): a seeded generator drives
every public core call with hostile arguments (bad lanes, calls out of order, remaining_nfe 0 and
above max, retry_reason out of range, session ids of 0 and 64 bytes, times near 0 and UINT64_MAX,
deadlines passed, saturating and absent, tiny rings that overflow) and checks after every call:

* the call returned a documented value (a success value, or FER_EINVAL / FER_ESTATE);
* gauges stay in bounds (queue_depth <= queue_capacity, sessions <= max_sessions,
  lanes_busy <= lanes_alive <= workers x batch_slots), counters never decrease;
* snapshots agree with the gauges;
* two-phase configurations: prefix_done answers a documented value, and step is refused while a
  prefix is pending; the staging slot changes exactly when a submit is ACCEPTED and is never a
  queued or running slot; the payload bytes written into the staging slot before an accepted
  submit are the bytes found in that slot when it is dispatched;
* real-time chunking (§5.4): prefixes of every size, start and period, valid or not; an
  outcome's frozen_rows is 0 unless INFERENCE and never above rtc_max_delay;

and at the end of each case, after driving every lane to completion and draining every ring,
the exactly-once ledger: per (session_id, sequence), outcomes popped + outcomes dropped (counted)
== submissions that were not coalesced, and never more. Under --sanitize, ASan and UBSan (with
-fno-sanitize-recover) turn any memory error or undefined behaviour into an abort with a report.

A failure prints the seed of the case; `--seed S --cases 1 -v` replays it op by op.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
U64 = 2**64 - 1
U32 = 2**32 - 1
SANITIZE_DIR = ROOT / "build" / "fer_sanitize"


def load_core(path: str | None = None):
    """(ffi, lib) of the built core, or of the extension at `path` (the sanitizer build)."""
    if path is None:
        from flowedge_relay._fer_core import ffi, lib

        return ffi, lib
    spec = importlib.util.spec_from_file_location("flowedge_relay._fer_core", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.ffi, mod.lib


class Finding(AssertionError):
    """An invariant the core broke (the message names the op and the case seed)."""


class Case:
    """One random configuration and one random operation sequence against a fresh core."""

    def __init__(self, ffi, lib, seed: int, ops: int, verbose: bool = False) -> None:
        self.ffi, self.lib, self.seed, self.ops, self.verbose = ffi, lib, seed, ops, verbose
        r = self.r = random.Random(seed)
        self.cfg = dict(
            workers=r.randint(1, 3), queue_capacity=r.randint(1, 6), max_sessions=r.randint(1, 5),
            max_nfe=r.choice([1, 3, 8]), obs_dim=r.choice([0, 1, 3]),
            action_len=r.choice([0, 1, 4]), ring_capacity=r.choice([1, 2, 3, 4, 64]),
            reject_if_retry_count_gte=r.choice([0, 1, 2, U32]), age_gate=r.randint(0, 2),
            nfe_ns=r.choice([0, 0, 1, 50, 10**6, U64 // 2, U64]),
            admission_reserve_ns=r.choice([0, 0, 7, U64]),
            reject_if_queue_age_ns_gte=r.choice([0, 0, 100, U64]),
            queue_timeout_ns=r.choice([0, 0, 300, U64]),
            session_idle_ns=r.choice([0, 500, U64]),
            two_phase=r.choice([0, 0, 1, 1]) if r.random() < 0.98 else r.choice([2, U32]),
            payload_bytes=r.choice([0, 0, 1, 8, 63, 200]),
            prefix_ns=r.choice([0, 0, 1, 50, 10**6, U64]),
            # batch slots (docs/design.md §5.1): W x B lanes; 0 means 1, above 64 is refused
            batch_slots=r.choice([0, 1, 1, 2, 3]) if r.random() < 0.98 else r.choice([65, U32]),
            # real-time chunking (§5.4): 0 = off, above FER_RTC_MAX_ROWS is refused
            rtc_max_delay=r.choice([0, 0, 1, 8]) if r.random() < 0.98 else r.choice([4097, U32]),
        )
        self.nlanes = self.cfg["workers"] * max(self.cfg["batch_slots"], 1)
        self.now = r.choice([0, 1, 1_000, 10**18, U64 - 10_000, U64 - 1])
        self.sessions = [b"", b"a", b"b", b"c", bytes(range(64)), b"\xff" * 64, b"d\x00e"]
        self.expected = Counter()  # (sid, seq) -> submissions that must each get one outcome
        self.got = Counter()  # (sid, seq) -> outcomes popped
        self.last = {}
        self.trace: list[str] = []
        self.calls = 0
        self.coverage = Counter()  # decisions, step results, outcome codes seen
        self.stamps = 0  # payloads written into the staging slot so far
        self.slot_stamp: dict[int, bytes] = {}  # slot -> payload bytes of its accepted request

    # -- plumbing ------------------------------------------------------------------------------
    def fail(self, what: str) -> None:
        tail = "\n  ".join(self.trace[-12:])
        raise Finding(f"seed {self.seed}: {what}\n  last ops:\n  {tail}")

    def note(self, text: str) -> None:
        self.trace.append(text)
        if len(self.trace) > 64:
            del self.trace[:32]
        if self.verbose:
            print(text)

    def rc_ok(self, name: str, rc: int, allowed=()) -> int:
        self.calls += 1
        lib = self.lib
        if rc < 0 and rc not in (lib.FER_EINVAL, lib.FER_ESTATE, *allowed):
            self.fail(f"{name} returned undocumented status {rc}")
        return rc

    def tick(self) -> None:
        r = self.r
        roll = r.random()  # mostly small steps; rarely a jump, very rarely to the end of time
        step = (r.choice([0, 0, 1, 10, 50, 100, 1_000, 10**6]) if roll < 0.97
                else 10**9 if roll < 0.995 else U64)
        self.now = min(self.now + step, U64)

    def lane(self) -> int:
        r = self.r
        return r.randrange(self.nlanes) if r.random() < 0.9 else r.choice(
            [self.nlanes, 64 * 64, U32])

    # -- the run -------------------------------------------------------------------------------
    def run(self) -> dict:
        ffi, lib = self.ffi, self.lib
        cfg = ffi.new("struct fer_config *")
        for k, v in self.cfg.items():
            setattr(cfg, k, v)
        out = ffi.new("struct fer_core **")
        rc = self.rc_ok("create", lib.fer_core_create(cfg, out))
        if rc != lib.FER_OK:
            return {"created": False}
        self.core = out[0]
        W, A = self.nlanes, max(self.cfg["action_len"], 1)  # W: lanes
        obs_n = max(self.cfg["obs_dim"], 1)
        self.req = ffi.new("struct fer_request *")
        self.req_obs = ffi.new("float[]", obs_n)
        self.req.observation = self.req_obs
        self.work = ffi.new("struct fer_work *")
        self.work_obs = ffi.new("float[]", obs_n)
        self.work.observation = self.work_obs
        self.actions = ffi.new("float[]", A)
        self.pop_out = ffi.new("struct fer_outcome[]", 8)
        self.pop_act = ffi.new("float[]", 8 * A)
        self.stats = ffi.new("struct fer_stats *")
        self.qsnap = ffi.new("struct fer_queued_item[]", self.cfg["queue_capacity"])
        self.lsnap = ffi.new("struct fer_lane_state[]", W)
        self.nslots = self.cfg["queue_capacity"] + W + 1
        ops = [
            (30, self.op_submit), (12, self.op_dispatch), (20, self.op_step), (6, self.op_prefix),
            (8, self.op_finish), (2, self.op_fail), (10, self.op_pop), (2, self.op_calibrate),
            (2, self.op_policy), (3, self.op_snapshots), (2, self.op_misc), (1, self.op_disable),
        ]
        weights = [w for w, _ in ops]
        funcs = [f for _, f in ops]
        try:
            for _ in range(self.ops):
                if self.r.random() < 0.5:
                    self.tick()
                self.r.choices(funcs, weights)[0]()
                self.check_stats()
            self.drain()
            self.check_ledger()
        finally:
            lib.fer_core_shutdown(self.core)
            lib.fer_core_destroy(self.core)
        return {"created": True, "calls": self.calls, "coverage": self.coverage}

    # -- operations ----------------------------------------------------------------------------
    def op_submit(self) -> None:
        r, lib, q = self.r, self.lib, self.req
        sid = r.choice(self.sessions)
        if r.random() < 0.03:
            sid = b"x" * r.choice([65, 200])  # too long: the wrapper refuses; the C must too
        n = min(len(sid), 64)
        self.ffi.memmove(q.session_id, sid[:n], n)
        q.session_id_len = len(sid) if len(sid) <= 64 else r.choice([65, U32])
        q.sequence = r.choice([0, 1, 2, 3, r.randrange(U64), U64])
        q.generation = r.choice([0, 1, 1, 2, 3, U64 - 1, U64])
        q.retry_count = r.choice([0, 0, 1, 2, 7, 8, U32])
        q.retry_reason = r.choice([0, 1, 2, 3, 4, 5]) if r.random() < 0.95 else r.choice([6, U32])
        q.remaining_nfe = r.choice([1, 2, self.cfg["max_nfe"]]) if r.random() < 0.95 else (
            r.choice([0, self.cfg["max_nfe"] + 1, U32]))
        now = self.now
        q.origin_ns = r.choice([0, now, max(now - 100, 0), min(now + 100, U64), U64])
        q.deadline_ns = r.choice([0, 0, 1, now, min(now + 1, U64), min(now + 200, U64),
                                  min(now + 10**7, U64), U64])
        q.deadline_ros_ns = r.randrange(U64)
        q.noise_seed = r.randrange(U64)
        q.prefix_rows = r.choice([0, 0, 0, 1, 3, 4096]) if r.random() < 0.97 else r.choice(
            [4097, U32])
        q.prefix_start_ns = r.choice([0, now, max(now - 100, 0), min(now + 10**6, U64), U64])
        q.prefix_start_ros_ns = r.randrange(U64)
        q.action_period_ns = r.choice([1, 100, 10**6, U64]) if r.random() < 0.95 else 0
        for k in range(self.cfg["obs_dim"]):
            self.req_obs[k] = r.choice([0.0, -1.5, 3.4e38])
        staged = self.rc_ok("staging_slot", lib.fer_core_staging_slot(self.core))
        if not 0 <= staged < self.nslots:
            self.fail(f"staging slot {staged} out of 0..{self.nslots - 1}")
        stamp = self.write_payload(staged)
        rc = self.rc_ok("submit", lib.fer_core_submit(self.core, q, now))
        after = lib.fer_core_staging_slot(self.core)
        if (after != staged) != (rc == lib.FER_ACCEPTED):
            self.fail(f"staging slot {staged} -> {after} after decision {rc}")
        if rc == lib.FER_ACCEPTED:
            self.slot_stamp[staged] = stamp
        key = (bytes(self.ffi.buffer(q.session_id, min(q.session_id_len, 64))), q.sequence)
        self.coverage[f"submit={rc}"] += 1
        self.note(f"submit {key} gen={q.generation} nfe={q.remaining_nfe} "
                  f"dl={q.deadline_ns} rr={q.retry_reason} rc={rc}")
        if rc >= 0 and rc != lib.FER_COALESCED:
            if rc > lib.FER_COALESCED:
                self.fail(f"submit returned unknown decision {rc}")
            self.expected[key] += 1
        prefix_ok = q.prefix_rows == 0 or (self.cfg["rtc_max_delay"] > 0 and
                                           q.action_period_ns > 0 and q.prefix_rows <= 4096)
        if rc == lib.FER_EINVAL and q.session_id_len <= 64 and q.retry_reason < 6 and (
                1 <= q.remaining_nfe <= self.cfg["max_nfe"]) and prefix_ok:
            self.fail("submit refused a request that satisfies every documented precondition")

    def write_payload(self, slot: int) -> bytes:
        """A fresh stamp into slot's payload, as the request thread does before submit."""
        n = self.cfg["payload_bytes"]
        self.stamps += 1
        data = (self.stamps.to_bytes(8, "little") * (n // 8 + 1))[:n]
        if n:
            self.ffi.memmove(self.lib.fer_core_payload(self.core, slot), data, n)
        return data

    def check_payload(self, slot: int) -> None:
        n = self.cfg["payload_bytes"]
        if n and slot in self.slot_stamp:
            got = bytes(self.ffi.buffer(self.lib.fer_core_payload(self.core, slot), n))
            if got != self.slot_stamp[slot]:
                self.fail(f"payload of slot {slot} changed between submit and dispatch")

    def op_dispatch(self) -> None:
        if self.r.random() < 0.3:  # a worker filling a free batch slot (§5.1)
            c = self.cfg
            worker = self.r.randrange(c["workers"]) if self.r.random() < 0.9 else self.r.choice(
                [c["workers"], 64, U32])
            rc = self.rc_ok("dispatch_worker", self.lib.fer_core_dispatch_worker(
                self.core, worker, self.now, self.work))
            self.note(f"dispatch_worker worker={worker} rc={rc}")
            b = max(c["batch_slots"], 1)
            if rc == 1 and not worker * b <= self.work.lane < (worker + 1) * b:
                self.fail(f"dispatch_worker used lane {self.work.lane} of another worker")
            if rc == 1:
                self.check_payload(self.work.slot)
            if self.rc_ok("queued", self.lib.fer_core_queued(self.core)) > c["queue_capacity"]:
                self.fail("queued above queue_capacity")
            return
        lane = self.lane()
        rc = self.rc_ok("dispatch", self.lib.fer_core_dispatch(self.core, lane, self.now,
                                                               self.work))
        self.note(f"dispatch lane={lane} rc={rc}")
        if rc == 1 and (self.work.lane != lane or self.work.remaining_nfe == 0):
            self.fail(f"dispatch filled a bad work item (lane {self.work.lane})")
        if rc == 1:
            self.check_payload(self.work.slot)

    def op_prefix(self) -> None:
        lane = self.lane()
        if self.r.random() < 0.8:  # mostly a lane whose prefix is pending
            m = self.lib.fer_core_lanes_snapshot(self.core, self.lsnap, self.nlanes)
            pending = [i for i in range(m) if self.lsnap[i].busy and self.lsnap[i].prefix_pending]
            lane = self.r.choice(pending) if pending else lane
        measured = self.r.choice([0, 1, 1000, U64])
        rc = self.rc_ok("prefix_done", self.lib.fer_core_prefix_done(self.core, lane, self.now,
                                                                     measured))
        self.note(f"prefix_done lane={lane} rc={rc}")
        self.coverage[f"prefix_done={rc}"] += 1
        if rc > 3 or rc == self.lib.FER_STEP_DONE:
            self.fail(f"prefix_done returned unknown result {rc}")

    def op_step(self) -> None:
        lane = self.lane()
        if self.r.random() < 0.8:  # mostly a lane that holds work, so steps get somewhere
            m = self.lib.fer_core_lanes_snapshot(self.core, self.lsnap, self.nlanes)
            busy = [i for i in range(m) if self.lsnap[i].busy and self.lsnap[i].remaining_nfe]
            lane = self.r.choice(busy) if busy else lane
        measured = self.r.choice([0, 1, 1000, U64])
        self.lib.fer_core_lanes_snapshot(self.core, self.lsnap, self.nlanes)
        pending = lane < self.nlanes and self.lsnap[lane].prefix_pending
        rc = self.rc_ok("step", self.lib.fer_core_step(self.core, lane, self.now, measured))
        self.note(f"step lane={lane} rc={rc}")
        if pending and rc != self.lib.FER_ESTATE:
            self.fail(f"step ran before the prefix was reported (rc {rc})")
        self.coverage[f"step={rc}"] += 1
        if rc > 3:
            self.fail(f"step returned unknown result {rc}")

    def op_finish(self) -> None:
        lane = self.lane()
        for k in range(self.cfg["action_len"]):
            self.actions[k] = self.r.choice([0.0, 1.0, float("nan")])
        rc = self.rc_ok("finish", self.lib.fer_core_finish(self.core, lane, self.now,
                                                           self.actions))
        self.note(f"finish lane={lane} rc={rc}")

    def op_fail(self) -> None:
        """INFERENCE_FAILED at any point of a lane's work (a model call that raised, actions
        that are not finite), or an out-of-range cause that must be refused."""
        lane = self.lane()
        cause = self.r.choice([0, 1, 1, 2])
        rc = self.rc_ok("fail", self.lib.fer_core_fail(self.core, lane, self.now, cause))
        self.note(f"fail lane={lane} cause={cause} rc={rc}")
        self.coverage[f"fail={rc}"] += 1
        if cause >= self.lib.FER_FAIL_CAUSES and rc != self.lib.FER_EINVAL:
            self.fail(f"fail accepted cause {cause} (rc {rc})")
        if rc >= 0 and rc != self.lib.FER_INFERENCE_FAILED:
            self.fail(f"fail returned {rc}, not INFERENCE_FAILED")

    def op_pop(self) -> None:
        n = self.r.choice([0, 1, 3, 8])
        rc = self.rc_ok("pop", self.lib.fer_core_pop_outcomes(self.core, self.pop_out,
                                                              self.pop_act, n))
        if rc > n:
            self.fail(f"pop_outcomes returned {rc} > max_n {n}")
        self.record(rc)

    def record(self, n: int) -> None:
        for i in range(n):
            o = self.pop_out[i]
            if o.session_id_len > 64 or o.code >= self.lib.FER_NUM_CODES:
                self.fail(f"popped a corrupt record: len {o.session_id_len} code {o.code}")
            if bool(o.has_actions) != (o.code == 0):
                self.fail(f"has_actions {o.has_actions} with code {o.code}")
            if o.frozen_rows > (self.cfg["rtc_max_delay"] if o.code == 0 else 0):
                self.fail(f"frozen_rows {o.frozen_rows} with code {o.code}, "
                          f"rtc_max_delay {self.cfg['rtc_max_delay']}")
            key = (bytes(self.ffi.buffer(o.session_id, o.session_id_len)), o.sequence)
            self.got[key] += 1
            self.coverage[f"outcome={o.code}"] += 1
            self.note(f"  outcome {key} code={o.code} lane={o.lane}")
            if self.got[key] > self.expected[key]:
                self.fail(f"more outcomes than submissions for {key}: "
                          f"{self.got[key]} > {self.expected[key]}")

    def op_calibrate(self) -> None:
        r = self.r
        self.rc_ok("set_calibration", self.lib.fer_core_set_calibration(
            self.core, r.choice([0, 1, 50, 10**6, U64]), r.choice([0, 7, U64]),
            r.choice([0, 0, 30, 10**6, U64])))

    def op_policy(self) -> None:
        r = self.r
        gate = r.choice([0, 1, 2, 3, U32])
        rc = self.rc_ok("set_policy", self.lib.fer_core_set_policy(
            self.core, r.choice([0, 1, 2, U32]), gate, r.choice([0, 100, U64]),
            r.choice([0, 300, U64])))
        if gate > 2 and rc != self.lib.FER_EINVAL:
            self.fail(f"set_policy accepted age_gate {gate}")

    def op_snapshots(self) -> None:
        lib = self.lib
        n = self.rc_ok("queue_snapshot", lib.fer_core_queue_snapshot(
            self.core, self.qsnap, self.cfg["queue_capacity"]))
        m = self.rc_ok("lanes_snapshot", lib.fer_core_lanes_snapshot(
            self.core, self.lsnap, self.nlanes))
        lib.fer_core_stats(self.core, self.stats)
        if n != self.stats.queue_depth:
            self.fail(f"queue_snapshot has {n} items, queue_depth {self.stats.queue_depth}")
        busy = sum(1 for i in range(m) if self.lsnap[i].busy)
        if busy != self.stats.lanes_busy:
            self.fail(f"lanes_snapshot busy {busy} != lanes_busy {self.stats.lanes_busy}")
        prev = None
        for i in range(n):
            it = self.qsnap[i]
            key = (it.deadline_ns == 0, it.deadline_ns, it.arrival_seq)
            if prev is not None and key < prev:
                self.fail("queue_snapshot is not in EDF order")
            prev = key
        held = {self.qsnap[i].slot for i in range(n)} | {
            self.lsnap[i].slot for i in range(m) if self.lsnap[i].busy}
        staged = lib.fer_core_staging_slot(self.core)
        if staged in held or len(held) != n + busy:
            self.fail(f"staging slot {staged} or a held slot is shared: {sorted(held)}")
        gen = self.ffi.new("uint64_t *")
        sid = self.r.choice(self.sessions)
        self.rc_ok("session_generation", lib.fer_core_session_generation(
            self.core, sid, len(sid), gen))

    def op_misc(self) -> None:
        lib, lane = self.lib, self.lane()
        self.rc_ok("output_space", lib.fer_core_output_space(self.core, lane))
        self.rc_ok("wait_for_work", lib.fer_core_wait_for_work(self.core, lane, 0))
        self.rc_ok("wait_outputs", lib.fer_core_wait_outputs(self.core, 0))
        cfg = self.ffi.new("struct fer_config *")
        self.rc_ok("get_config", lib.fer_core_get_config(self.core, cfg))
        slot = self.r.choice([0, self.nslots - 1, self.nslots, U32])
        ptr = lib.fer_core_payload(self.core, slot)
        if (ptr == self.ffi.NULL) != (self.cfg["payload_bytes"] == 0 or slot >= self.nslots):
            self.fail(f"payload({slot}) = {ptr} with payload_bytes {self.cfg['payload_bytes']}")
        if ptr != self.ffi.NULL and int(self.ffi.cast("uintptr_t", ptr)) % 64:
            self.fail(f"payload of slot {slot} is not cache-line aligned")
        self.rc_ok("staging_slot(NULL)", lib.fer_core_staging_slot(self.ffi.NULL))

    def op_disable(self) -> None:
        lane = self.lane()
        rc = self.rc_ok("disable_lane", self.lib.fer_core_disable_lane(self.core, lane, self.now))
        self.note(f"disable lane={lane} rc={rc}")

    # -- invariants ----------------------------------------------------------------------------
    def check_stats(self) -> None:
        s = self.stats
        self.rc_ok("stats", self.lib.fer_core_stats(self.core, s))
        c = self.cfg
        if s.queue_depth > c["queue_capacity"]:
            self.fail(f"queue_depth {s.queue_depth} > capacity {c['queue_capacity']}")
        if s.sessions > c["max_sessions"]:
            self.fail(f"sessions {s.sessions} > max_sessions {c['max_sessions']}")
        if not s.lanes_busy <= s.lanes_alive <= self.nlanes:
            self.fail(f"lanes busy {s.lanes_busy} alive {s.lanes_alive} lanes {self.nlanes}")
        if s.accepted > s.submitted:
            self.fail("accepted > submitted")
        now = {
            "submitted": s.submitted, "accepted": s.accepted, "coalesced": s.coalesced,
            "nfe_total": s.nfe_total, "outcomes": sum(s.outcomes),
            "drops": s.rejection_outputs_dropped + s.action_outputs_dropped,
            "evicted": s.sessions_evicted, "misses": s.calibration_misses,
        }
        for k, v in now.items():
            if v < self.last.get(k, 0):
                self.fail(f"counter {k} decreased: {self.last[k]} -> {v}")
        self.last = now

    def drain(self) -> None:
        """Run every live lane's work to an end, dispatch the rest, pop every outcome."""
        lib = self.lib
        for _ in range(10_000):
            progressed = False
            lib.fer_core_lanes_snapshot(self.core, self.lsnap, self.nlanes)
            for lane in range(self.nlanes):
                st = self.lsnap[lane]
                if not st.alive:
                    continue
                if st.busy:
                    # remaining 0: the last step said DONE and finish is due
                    rc = (lib.FER_STEP_DONE if st.remaining_nfe == 0
                          else lib.fer_core_prefix_done(self.core, lane, self.now, 1)
                          if st.prefix_pending
                          else lib.fer_core_step(self.core, lane, self.now, 1))
                    if rc == lib.FER_STEP_DONE:
                        while not lib.fer_core_output_space(self.core, lane):
                            self.record(lib.fer_core_pop_outcomes(self.core, self.pop_out,
                                                                  self.pop_act, 8))
                        rc = lib.fer_core_finish(self.core, lane, self.now, self.actions)
                    if rc < 0:
                        self.fail(f"drain: step/finish on busy lane {lane} returned {rc}")
                    progressed = True
                elif lib.fer_core_dispatch(self.core, lane, self.now, self.work) == 1:
                    self.check_payload(self.work.slot)
                    progressed = True
            popped = lib.fer_core_pop_outcomes(self.core, self.pop_out, self.pop_act, 8)
            self.record(popped)
            lib.fer_core_stats(self.core, self.stats)
            if not progressed and popped == 0 and (
                    self.stats.queue_depth == 0 or self.stats.lanes_alive == 0):
                break
        else:
            self.fail("drain did not converge")
        if self.stats.lanes_alive == 0 and self.stats.queue_depth:
            # nobody can ever run it; documented: work stays queued (no lane to dispatch)
            for i in range(lib.fer_core_queue_snapshot(self.core, self.qsnap,
                                                       self.cfg["queue_capacity"])):
                it = self.qsnap[i]
                key = (bytes(self.ffi.buffer(it.session_id, it.session_id_len)), it.sequence)
                self.expected[key] -= 1

    def check_ledger(self) -> None:
        s = self.stats
        self.lib.fer_core_stats(self.core, s)
        drops = s.rejection_outputs_dropped + s.action_outputs_dropped
        missing = sum((self.expected - self.got).values())
        extra = sum((self.got - self.expected).values())
        if extra:
            self.fail(f"{extra} outcomes beyond one per submission")
        if missing != drops:
            self.fail(f"{missing} submissions without an outcome but {drops} drops counted")
        if sum(s.outcomes) != sum(self.got.values()) + drops:
            self.fail(f"stats.outcomes {sum(s.outcomes)} != popped {sum(self.got.values())} "
                      f"+ dropped {drops}")


def fuzz(seconds: float = 10.0, cases: int | None = None, seed: int | None = None,
         ops: int = 300, core_path: str | None = None, verbose: bool = False) -> dict:
    """Run cases until `seconds` pass (or `cases` ran); raise Finding on the first failure."""
    ffi, lib = load_core(core_path)
    master = random.Random(seed if seed is not None else time.time_ns())
    first = seed if (cases == 1 and seed is not None) else None
    t0, n, calls, coverage = time.monotonic(), 0, 0, Counter()
    while (cases is None or n < cases) and (cases is not None or time.monotonic() - t0 < seconds):
        case_seed = first if first is not None else master.randrange(2**63)
        result = Case(ffi, lib, case_seed, ops, verbose).run()
        calls += result.get("calls", 0)
        coverage.update(result.get("coverage", {}))
        n += 1
    return {"cases": n, "core_calls": calls, "ops_per_case": ops,
            "seconds": round(time.monotonic() - t0, 2), "seed": seed,
            "build": "asan+ubsan" if core_path else "plain",
            "coverage": dict(sorted(coverage.items()))}


def build_sanitized() -> str:
    """Build csrc/ with ASan + UBSan into build/fer_sanitize (not over the normal module)."""
    env = dict(os.environ, FER_SANITIZE="1", FER_OUTPUT_DIR=str(SANITIZE_DIR),
               FER_BUILD_DIR=str(SANITIZE_DIR / "tmp"))
    subprocess.run([sys.executable, "-m", "flowedge_relay._build_core"], cwd=ROOT, env=env,
                   check=True, stdout=subprocess.DEVNULL)
    return str(next(SANITIZE_DIR.glob("_fer_core*.so")))


def sanitizer_env() -> dict:
    """LD_PRELOAD the compiler's ASan and UBSan runtimes into a plain python."""
    libs = []
    for name in ("libasan.so", "libubsan.so"):
        path = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True,
                              text=True, check=True).stdout.strip()
        libs.append(path)
    return dict(os.environ, LD_PRELOAD=":".join(libs),
                ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1",
                UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--cases", type=int, default=None)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--ops", type=int, default=300, help="operations per case")
    ap.add_argument("--sanitize", action="store_true", help="ASan + UBSan build of the core")
    ap.add_argument("--core", default=None, help=argparse.SUPPRESS)  # set by --sanitize re-exec
    ap.add_argument("--json", default=None)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.sanitize and args.core is None:
        core = build_sanitized()
        cmd = [sys.executable, __file__, "--core", core, *(argv if argv is not None
                                                          else sys.argv[1:])]
        return subprocess.run([c for c in cmd if c != "--sanitize"], env=sanitizer_env()).returncode
    try:
        result = fuzz(args.seconds, args.cases, args.seed, args.ops, args.core, args.verbose)
    except Finding as exc:
        print(f"FINDING: {exc}", file=sys.stderr)
        return 1
    if args.core:
        with open("/proc/self/maps") as maps:
            result["sanitizer_runtime_loaded"] = "libasan" in maps.read()
    print(json.dumps(result))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
