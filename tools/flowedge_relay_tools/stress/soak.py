# SPDX-License-Identifier: Apache-2.0
"""The soak: mixed traffic at a fraction of the relay's measured capacity, for minutes.

Deadlines (none, generous, tight, passed), NFE 1-8, generation bumps and stale generations,
coalescible duplicate retries and invalid input, at `load` x the capacity `measure_capacity`
found; RSS, queue depth and outcomes sampled every second; at the end every valid request must
be answered, coalesced into an answered one, or dropped and counted (`soak_ok`).
"""

from __future__ import annotations

import random
import threading
import time
import zlib
from pathlib import Path

import numpy as np

from flowedge_relay.core import CODE_KEYS
from flowedge_relay_tools.stress.probes import BASE_SEQ, ProbeFactory, probe_index
from flowedge_relay_tools.stress.report import (
    MB,
    param,
    received,
    relay_threads_alive,
    rss_bytes,
)


class AnswerBook:
    """Answers per request index in preallocated arrays (no growth during a run)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.count = np.zeros(n, np.int32)
        self.sid_crc = np.zeros(n, np.uint32)
        self.attempts = np.zeros(n, np.int32)
        self.unexpected = 0  # answers with no matching index / session
        self.codes = np.zeros(len(CODE_KEYS), np.int64)
        self._lock = threading.Lock()

    def expect(self, i: int, session: str, attempts: int = 1) -> None:
        self.sid_crc[i] = zlib.crc32(session.encode("utf-8", "surrogatepass"))
        self.attempts[i] += attempts

    def on_answer(self, msg) -> None:
        i = probe_index(msg.session_id, msg.sequence, self.n)
        crc = zlib.crc32(msg.session_id.encode("utf-8", "surrogatepass"))
        with self._lock:
            if msg.code < 5:
                self.codes[msg.code] += 1
            if i is None or self.sid_crc[i] != crc or self.attempts[i] == 0:
                self.unexpected += 1
            else:
                self.count[i] += 1

    def total(self) -> int:
        return int(self.count.sum()) + self.unexpected



def measure_capacity(h, seconds: float = 4.0, nfe_mix=(1, 8), sessions: int = 8) -> dict:
    """Saturate the relay with no-deadline requests; answers/s is the capacity at this mix."""
    from flowedge_relay_tools.harness import wait_for

    node = h.node
    rng = random.Random(7)
    inflight_target = max(4, min(param(node, "queue_capacity") // 2, 32))
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
    if rate <= 0:
        raise RuntimeError(f"no answers while measuring capacity ({done[0]} of {sent} answered)")
    p50, p99, _ = node.relay.pool.nfe_percentiles() if node.relay.pool else (0.0, 0.0, 0)
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

    from flowedge_relay_tools.harness import wait_for

    node = h.node
    cap = measure_capacity(h)
    nfe_ns = 0
    if admission and cap["nfe_p99_ns"]:
        nfe_ns = int(max(3 * cap["nfe_p99_ns"], 200_000))
        node.set_parameters([Parameter("nfe_ns", value=nfe_ns),
                             Parameter("admission_reserve_ns", value=2_000_000)])
    # capacity was measured at NFE 1-8 uniform, the soak's valid mix: offer load x that
    rate = max(load * cap["requests_per_s"], 1.0)
    n = int(rate * duration_s * 1.1) + 100
    book = AnswerBook(n)
    traffic = SoakTraffic(h, book, seed, sessions, node.relay.validator.max_nfe)
    h.keep_answers, h.on_answer, h.max_diagnostics = False, book.on_answer, 5
    stats0 = node.relay.core.stats()
    received0 = received(node)
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
            samples.append(_soak_sample(node, book, traffic, stats0, now - t0))
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
        st = node.relay.core.stats()
        return (book.total() + st.coalesced - stats0.coalesced >= want
                and st.queue_depth == 0 and st.lanes_busy == 0)

    drained = wait_for(settled, 60.0)
    time.sleep(0.5)
    samples.append(_soak_sample(node, book, traffic, stats0, time.monotonic() - t0))
    st = node.relay.core.stats()
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
        "workers": param(node, "workers"),
        "queue_capacity": param(node, "queue_capacity"),
        "valid_sent": traffic.valid_sent,
        "retries_sent": traffic.retries_sent,
        "invalid_sent": traffic.invalid_sent,
        "relay_received": received(node) - received0,
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
        "invalid_discarded": sum(node.relay.counters().discarded.values()),
        "queue_depth_max": max(s["queue_depth"] for s in samples),
        "rss_start_mb": samples[0]["rss_mb"],
        "rss_warm_mb": warm,
        "rss_end_mb": samples[-1]["rss_mb"],
        "rss_max_mb": float(rss.max()),
        "rss_slope_second_half_mb_per_min": round(slope, 3),
        "threads_alive": relay_threads_alive(node),
        "samples": samples,
    }


def _soak_sample(node, book, traffic, stats0, t: float) -> dict:
    st = node.relay.core.stats()
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
        "invalid_discarded": sum(node.relay.counters().discarded.values()),
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
    from flowedge_relay_tools.bench.plots import plt  # Agg backend; says what to install

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
