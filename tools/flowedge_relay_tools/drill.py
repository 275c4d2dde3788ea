# SPDX-License-Identifier: Apache-2.0
"""`flowedge-relay-drill`: blind retries must never clone late work (docs/design.md §6).

The incident pattern behind section 6: a free worker idles while a request's queue age is already
past its deadline, and the client blindly retries the same completion three more times, each with
a fresh deadline. Idle capacity then multiplies work nobody can use. This drill reproduces it end
to end, in one process, over real DDS: a real RelayNode (request thread, EDF core, one worker
running the bundled ONNX policy, or with `--model vision` the two-phase policy package) and
`DrillClient`, a retry-aware producer node whose requests come from harness.build_request (for a
package: an image and a state built with producer.build_request).

Declared conditions (all times multiplied by --time-scale):

    budget 3000 ms per request; happy path 2500 ms of model work (5 NFE x 500 ms); a fault adding
    4000 ms (+800 ms to each NFE, through the relay's drill-only `fault_nfe_delay_ms` knob);
    the relay calibrated for the happy path (nfe_ns = 500 ms, reserve 5% of the budget; a
    two-phase model's prefix pass calibrated at prefix_ns = 50 ms, far above what it takes);
    admission rule "reject when age beats slack" from config/drill.yaml.

Three runs on the same relay, one request each (its own session, sequence 1):

    happy     no fault, uncapped client (4 attempts)     -> INFERENCE at about T+2500
    uncapped  fault, uncapped client (4 attempts)        -> see the timeline below
    capped    fault, capped client (1 attempt)           -> EXPIRED, nothing else

Expected timeline of the uncapped fault run (the drill prints what it observed):

    T+0     enqueue (attempt 1; admitted: 5 x 500 ms + reserve fits in 3000 ms)
    T+2500  where the happy path returns; here the worker is slow (1300 ms per NFE)
    T+3000  slack of attempt 1 hits zero; the client times out and retries (coalesced: the
            original is still running, so no second copy)
    T+3900  worker late: the running work stops at its first step boundary past the deadline
            (EXPIRED, 3 NFE spent, a calibration miss); the blind client retries at once with the
            same origin_stamp and a fresh deadline (now + 3000 ms)
    T+3901  that retry is REJECTED_DEADLINE without running an NFE (age 3900 ms >= slack 3000 ms),
            and so is the client's last attempt

The verdict passes when rejects (by the age gate) appear on the uncapped fault path only after
the slack is gone, the NFE spent on the id are not multiplied by the retries (at most one attempt
ran), the capped path is short (one attempt), and every attempt was answered once or coalesced.
The happy path is shown as the baseline, not judged (it is timing, not retry safety). With
`--age-gate off` the late retries are admitted and run again, and the verdict fails.

    flowedge-relay-drill                                  # full scale, about 15 s
    flowedge-relay-drill --time-scale 0.2 --json out/drill.json  # about 5 s
    flowedge-relay-drill --age-gate off                   # the counterfactual: must fail
    flowedge-relay-drill --model vision                   # the same on the two-phase package

The drill's relay joins the current ROS domain; run it on a domain no production relay uses
(ROS_DOMAIN_ID). Discovery is kept on this host unless ROS_AUTOMATIC_DISCOVERY_RANGE is set.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from flowedge_relay_msgs.msg import ActionMessage, InferenceRequest, RelayStats
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy

from flowedge_relay.core import CODE_NAMES
from flowedge_relay.signals import stoppable
from flowedge_relay.timebase import ros_time, stamp_ns
from flowedge_relay_tools.harness import MODEL_CHOICES, build_request, load_served, model_path

MS = 1_000_000
CONFIG_DIR = pathlib.Path(__file__).resolve().parents[2] / "config"
ADMISSION_KEYS = ("reject_if_retry_count_gte", "age_gate", "reject_if_queue_age_ms_gte")
DEFAULT_ADMISSION = {
    "reject_if_retry_count_gte": 1, "age_gate": "retries", "reject_if_queue_age_ms_gte": 0,
}
COALESCED = "COALESCED"
RETRY_REASON_NAMES = ("none", "timeout", "after_stale", "after_deadline", "after_capacity",
                      "after_expired")
RETRY_REASON_FOR = {  # a blind client states why it retries (docs/design.md §2)
    ActionMessage.REJECTED_STALE: InferenceRequest.RETRY_AFTER_STALE,
    ActionMessage.REJECTED_DEADLINE: InferenceRequest.RETRY_AFTER_DEADLINE,
    ActionMessage.REJECTED_CAPACITY: InferenceRequest.RETRY_AFTER_CAPACITY,
    ActionMessage.EXPIRED: InferenceRequest.RETRY_AFTER_EXPIRED,
}


# -- the declared conditions --------------------------------------------------------------------

@dataclass(frozen=True)
class Conditions:
    """The drill's declared conditions in nominal milliseconds, plus the time scale."""

    budget_ms: float = 3000.0  # deadline = send time + budget, for every attempt
    nfe: int = 5  # remaining_nfe of the request
    happy_ms: float = 2500.0  # model work of the whole request on the happy path
    fault_ms: float = 4000.0  # what the fault adds to the whole request (spread over its NFE)
    attempts: int = 4  # uncapped client: the first attempt and three blind retries
    capped_attempts: int = 1  # capped client
    reserve_fraction: float = 0.05  # admission_reserve_ns as a fraction of the budget
    prefix_ms: float = 50.0  # prefix_ns of a two-phase model (its pass takes far less)
    time_scale: float = 1.0

    def ns(self, nominal_ms: float) -> int:
        return int(round(nominal_ms * self.time_scale * MS))

    @property
    def nfe_ms(self) -> float:
        """Nominal cost of one NFE on the happy path (what the relay is calibrated for)."""
        return self.happy_ms / self.nfe

    @property
    def faulted_nfe_ms(self) -> float:
        return (self.happy_ms + self.fault_ms) / self.nfe

    @property
    def expected_worker_late_ms(self) -> float:
        """First step boundary at or past the deadline with the fault on (nominal ms)."""
        return math.ceil(self.budget_ms / self.faulted_nfe_ms - 1e-9) * self.faulted_nfe_ms

    def check(self) -> None:
        if not (self.budget_ms > 0 and self.nfe >= 1 and self.happy_ms > 0 and self.fault_ms >= 0
                and self.attempts >= 1 and self.capped_attempts >= 1 and self.time_scale > 0):
            raise ValueError(f"drill conditions out of range: {self}")
        if self.happy_ms + self.prefix_ms + self.budget_ms * self.reserve_fraction > self.budget_ms:
            raise ValueError("the happy path (and a prefix pass) must fit in the budget with the "
                             "reserve")


# -- the retry-aware client -----------------------------------------------------------------------

@dataclass(frozen=True)
class Trial:
    """One request of one client variant and how blindly its client retries it."""

    variant: str
    session_id: str
    sequence: int
    nfe: int
    budget_ns: int  # 0 = no deadline
    timeout_ns: int  # per attempt: no answer this long -> retry (RETRY_TIMEOUT)
    attempts: int  # the first attempt included
    give_up_ns: int  # after the last attempt, how long to wait for an outstanding answer


@dataclass
class TrialRecord:
    """What the client saw: its events (in order) and the answers for its id."""

    trial: Trial
    t0_mono: int = 0
    origin_ros: int = 0
    attempts_sent: int = 0
    deadline_ros: int = 0  # of the latest attempt
    answers: list = field(default_factory=list)  # ActionMessage for (session_id, sequence)
    events: list[dict] = field(default_factory=list)
    nfe_from_answers: int = 0
    finished_ms: float = 0.0


class DrillClient(Node):
    """A blind, retry-aware producer (the client of the incident).

    It retries on a timeout or on any answer other than INFERENCE, up to `attempts`
    attempts in all, keeping session_id, sequence, generation and origin_stamp, incrementing
    retry_count, stating retry_reason, and asking for a fresh deadline (now + budget) each
    time: exactly the client that looks harmless and multiplies late work. `run_trial` is
    called from one thread (it blocks); answers and relay stats arrive on the executor that
    spins this node.
    """

    def __init__(self, model, probe: Callable[[], dict] | None = None, **kwargs) -> None:
        super().__init__("flowedge_relay_drill_client", **kwargs)
        self.model = model
        #: extra fields for every event (the drill reads lanes_busy from its in-process relay)
        self.probe = probe
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        self.pub = self.create_publisher(InferenceRequest, "flowedge/requests", qos)
        self.actions_sub = self.create_subscription(
            ActionMessage, "flowedge/actions", self._on_action, qos
        )
        self.create_subscription(RelayStats, "flowedge/stats", self._on_stats, 10)
        self._answers: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self.received: Counter = Counter()  # answers per (session_id, sequence)
        #: lane_utilisation of the newest RelayStats: reported in every event, never used
        self.utilisation = float("nan")

    # -- callbacks (executor thread) -----------------------------------------------------

    def _on_action(self, msg) -> None:
        with self._lock:
            self.received[(msg.session_id, msg.sequence)] += 1
        self._answers.put((time.monotonic_ns(), self.get_clock().now().nanoseconds, msg))

    def _on_stats(self, msg) -> None:
        self.utilisation = msg.lane_utilisation

    # -- the blind retry loop (caller's thread) ------------------------------------------

    def answers_received(self, session_id: str, sequence: int) -> int:
        with self._lock:
            return self.received[(session_id, sequence)]

    def run_trial(self, trial: Trial) -> TrialRecord:
        rec = TrialRecord(trial)
        rec.t0_mono = time.monotonic_ns()
        reason = InferenceRequest.RETRY_NONE
        while True:
            self._send(rec, reason)
            answer = self._next_answer(rec, time.monotonic_ns() + trial.timeout_ns)
            if answer is None:
                last = rec.attempts_sent >= trial.attempts
                note = ("no answer in time; no attempts left, waiting for the outstanding answer"
                        if last else "no answer in time; blind retry")
                self._event(rec, "timeout", deadline_ros=rec.deadline_ros, note=note)
                if last:
                    if self._next_answer(rec, time.monotonic_ns() + trial.give_up_ns) is None:
                        self._event(rec, "give_up", note="no answer at all")
                    break
                reason = InferenceRequest.RETRY_TIMEOUT
                continue
            if answer.code == ActionMessage.INFERENCE or rec.attempts_sent >= trial.attempts:
                break
            reason = RETRY_REASON_FOR.get(answer.code, InferenceRequest.RETRY_TIMEOUT)
        rec.finished_ms = (time.monotonic_ns() - rec.t0_mono) / MS
        return rec

    def drain(self, rec: TrialRecord, timeout_s: float = 0.0) -> None:
        """Record answers for this id that arrived after the client stopped listening."""
        self._next_answer(rec, time.monotonic_ns() + int(timeout_s * 1e9), late=True)

    def _send(self, rec: TrialRecord, reason: int) -> None:
        t, m = rec.trial, self.model
        now = self.get_clock().now().nanoseconds
        if rec.attempts_sent == 0:
            rec.origin_ros = now  # origin_stamp: the first issue, kept by every retry
        deadline = now + t.budget_ns if t.budget_ns else 0
        req = build_request(
            m, rec.origin_ros, session_id=t.session_id, sequence=t.sequence, generation=1,
            retry_count=rec.attempts_sent, retry_reason=reason, deadline=ros_time(deadline),
            remaining_nfe=t.nfe, noise_seed=t.sequence,
        )  # origin_stamp: the first issue's
        rec.attempts_sent += 1
        rec.deadline_ros = deadline
        self.pub.publish(req)
        self._event(rec, "send", now_ros=now, deadline_ros=deadline,
                    attempt=rec.attempts_sent, retry_count=req.retry_count,
                    retry_reason=RETRY_REASON_NAMES[reason])

    def _next_answer(self, rec: TrialRecord, until_mono: int, late: bool = False):
        """The next answer for this trial's id before until_mono (others are dropped)."""
        t = rec.trial
        while True:
            left = until_mono - time.monotonic_ns()
            try:
                mono, now_ros, msg = self._answers.get(timeout=max(left, 0) / 1e9)
            except queue.Empty:
                return None
            if (msg.session_id, msg.sequence) != (t.session_id, t.sequence):
                continue
            rec.answers.append(msg)
            rec.nfe_from_answers += msg.nfe_done
            code = CODE_NAMES[msg.code] if msg.code < len(CODE_NAMES) else str(msg.code)
            self._event(
                rec, "late_answer" if late else "answer", mono=mono, now_ros=now_ros,
                deadline_ros=stamp_ns(msg.deadline),
                retry_count=msg.retry_count, decision=code, nfe_done=msg.nfe_done,
                retry_reason=RETRY_REASON_NAMES[msg.retry_reason]
                if msg.retry_reason < len(RETRY_REASON_NAMES) else str(msg.retry_reason),
            )
            if not late:
                return msg

    def _event(self, rec: TrialRecord, kind: str, *, mono: int | None = None,
               now_ros: int | None = None, deadline_ros: int | None = None,
               attempt: int | None = None, retry_count: int | None = None,
               retry_reason: str | None = None, decision: str | None = None,
               nfe_done: int | None = None, note: str = "") -> None:
        mono = time.monotonic_ns() if mono is None else mono
        now_ros = self.get_clock().now().nanoseconds if now_ros is None else now_ros
        extra = self.probe() if self.probe else {}
        rec.events.append({
            "variant": rec.trial.variant,
            "t_ms": round((mono - rec.t0_mono) / MS, 3),
            "event": kind,
            "session_id": rec.trial.session_id,
            "sequence": rec.trial.sequence,
            "attempt": attempt,
            "retry_count": retry_count,
            "retry_reason": retry_reason,
            "queue_age_ms": round((now_ros - rec.origin_ros) / MS, 3),
            "deadline_slack_ms": (round((deadline_ros - now_ros) / MS, 3)
                                  if deadline_ros else None),
            "worker_utilisation": None if math.isnan(self.utilisation)
            else round(self.utilisation, 4),
            "decision": decision,
            "nfe_done": nfe_done,
            "nfe_spent_on_id": rec.nfe_from_answers,
            **extra,
            "note": note,
        })


# -- the drill ------------------------------------------------------------------------------------

def load_admission(path: str | os.PathLike | None) -> dict:
    """The drill's admission block from a relay-style YAML (config/drill.yaml by default)."""
    import yaml

    if path is None:
        path = CONFIG_DIR / "drill.yaml"
        if not path.exists():
            try:
                from ament_index_python.packages import get_package_share_directory

                path = pathlib.Path(get_package_share_directory("flowedge_relay"),
                                    "config", "drill.yaml")
            except Exception:
                return dict(DEFAULT_ADMISSION)
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    # the blocks rcl applies to the drill's relay (/flowedge_relay), in file order: later wins
    block: dict = {}
    for key, value in data.items():
        if key in ("/**", "/**/flowedge_relay", "flowedge_relay", "/flowedge_relay"):
            block.update((value or {}).get("ros__parameters") or {})
    unknown = sorted(set(block) - set(ADMISSION_KEYS))
    if unknown:
        raise ValueError(f"{path}: the drill's block holds only {ADMISSION_KEYS}, not {unknown}")
    return {**DEFAULT_ADMISSION, **block}


def relay_parameters(cond: Conditions, admission: dict, model: str | None = None,
                     two_phase: bool = False) -> dict:  # fmt: skip
    """The in-process relay's parameters: calibrated for the happy path (and the prefix pass of
    a two-phase model), admission from YAML; `model` a model_path (None: the default)."""
    age_cap = int(admission["reject_if_queue_age_ms_gte"])
    served = {} if model is None else {"model_path": model}
    if two_phase:
        served["prefix_ns"] = cond.ns(cond.prefix_ms)
    return {
        **served,
        "workers": 1,
        "nfe_ns": cond.ns(cond.nfe_ms),
        "admission_reserve_ns": cond.ns(cond.budget_ms * cond.reserve_fraction),
        "reject_if_retry_count_gte": int(admission["reject_if_retry_count_gte"]),
        "age_gate": str(admission["age_gate"]),
        "reject_if_queue_age_ms_gte": max(int(round(age_cap * cond.time_scale)), 1)
        if age_cap else 0,
        "fault_nfe_delay_ms": 0.0,
    }


VARIANTS = (  # name, fault on, uncapped
    ("happy", False, True),
    ("uncapped", True, True),
    ("capped", True, False),
)


def run_drill(cond: Conditions, admission: dict, log: Callable[[str], None] = print,
              model: str = "small") -> dict:  # fmt: skip
    """Run the three variants against one in-process relay serving `model` (small, bench,
    vision or a path); return the report (events, verdict)."""
    cond.check()
    from flowedge_relay_tools.harness import (
        running_relay,
        spinning,
        status_values,
        wait_for,
        wait_for_relay,
    )

    path = model_path(model)
    params = relay_parameters(cond, admission, path, getattr(load_served(path), "two_phase", False))
    log(f"flowedge-relay-drill: time scale {cond.time_scale:g}; relay {params}")
    records: dict[str, TrialRecord] = {}
    relay_counts: dict[str, dict] = {}
    with running_relay(**params) as h:
        core = h.node.relay.core
        client = DrillClient(h.model, context=h.ctx,
                             probe=lambda: {"lanes_busy": core.stats().lanes_busy})
        try:
            with spinning(client, context=h.ctx):
                wait_for_relay(client.pub, client.actions_sub)
                # Warm-up: one short request with no deadline, so the DDS path is hot.
                warm = client.run_trial(Trial("warmup", "flowedge-drill-warmup", 1, 1, 0,
                                              10_000 * MS, 1, 10_000 * MS))
                if not warm.answers:
                    raise TimeoutError("the relay did not answer the warm-up request")
                for name, fault, uncapped in VARIANTS:
                    delay_ms = (cond.faulted_nfe_ms if fault else cond.nfe_ms) * cond.time_scale
                    _set(h.node, "fault_nfe_delay_ms", float(delay_ms))
                    wait_for(lambda: _idle(core), 30)
                    before = core.stats()
                    trial = Trial(
                        variant=name, session_id=f"flowedge-drill-{name}", sequence=1,
                        nfe=cond.nfe, budget_ns=cond.ns(cond.budget_ms),
                        timeout_ns=cond.ns(cond.budget_ms),
                        attempts=cond.attempts if uncapped else cond.capped_attempts,
                        give_up_ns=cond.ns(2 * (cond.happy_ms + cond.fault_ms)),
                    )
                    log(f"-- {name}: fault {'on' if fault else 'off'} (NFE {delay_ms:.1f} ms), "
                        f"client {trial.attempts} attempt(s)")
                    rec = client.run_trial(trial)
                    # Everything the relay decided for this id has reached the client.
                    wait_for(lambda: _idle(core), 30)
                    emitted = sum(core.stats().outcomes) - sum(before.outcomes)
                    wait_for(lambda t=trial, n=emitted: client.answers_received(
                        t.session_id, t.sequence) >= n, 10)
                    client.drain(rec, timeout_s=0.05)
                    after = core.stats()
                    records[name] = rec
                    relay_counts[name] = _delta(before, after)
                _set(h.node, "fault_nfe_delay_ms", 0.0)
                status = h.latest_status("admission", timeout=3.0)
                diagnostics = {k: v for k, v in status_values(status).items()
                               if k.startswith(("duplicate_retries", "rejected_late", "retries.",
                                                "nfe_", "calibration"))} if status else {}
        finally:
            client.destroy_node()
    return build_report(cond, params, records, relay_counts, diagnostics)


def _set(relay, name: str, value) -> None:
    from rclpy.parameter import Parameter

    result = relay.set_parameters([Parameter(name, value=value)])[0]
    if not result.successful:
        raise RuntimeError(f"setting {name}={value!r} failed: {result.reason}")


def _idle(core) -> bool:
    s = core.stats()
    return s.lanes_busy == 0 and s.queue_depth == 0


def _delta(before, after) -> dict:
    return {
        "submitted": after.submitted - before.submitted,
        "accepted": after.accepted - before.accepted,
        "nfe_spent": after.nfe_total - before.nfe_total,
        "nfe_wasted": after.nfe_wasted - before.nfe_wasted,
        "coalesced": after.coalesced - before.coalesced,
        "rejected_late_retries": after.rejected_late_retries - before.rejected_late_retries,
        "calibration_misses": after.calibration_misses - before.calibration_misses,
        "outcomes": {CODE_NAMES[i]: a - b for i, (a, b) in
                     enumerate(zip(after.outcomes, before.outcomes, strict=True)) if a - b},
        "retries_by_count": {str(i): a - b for i, (a, b) in
                             enumerate(zip(after.retries_by_count, before.retries_by_count,
                                           strict=True)) if i and a - b},
    }


# -- verdict and report ---------------------------------------------------------------------------

def _annotate_decisions(rec: TrialRecord, coalesced: int) -> int:
    """Give every send event the decision for that attempt; return how many got no answer."""
    own = {a.retry_count: CODE_NAMES[a.code] for a in rec.answers if a.code < len(CODE_NAMES)}
    silent = 0
    for e in rec.events:
        if e["event"] == "send":
            decision = own.get(e["retry_count"])
            if decision is None:
                silent += 1
                decision = COALESCED if silent <= coalesced else "UNANSWERED"
            e["decision"] = decision
    return silent


def _first(events: list[dict], pred) -> dict | None:
    return next((e for e in events if pred(e)), None)


def build_report(cond: Conditions, params: dict, records: dict[str, TrialRecord],
                 relay_counts: dict[str, dict], diagnostics: dict) -> dict:
    budget = cond.budget_ms * cond.time_scale
    variants, events = {}, []
    for name, rec in records.items():
        counts = relay_counts[name]
        silent = _annotate_decisions(rec, counts["coalesced"])
        answered_once = (len(rec.answers) + counts["coalesced"] == rec.attempts_sent
                         and silent == counts["coalesced"])
        original = _first(rec.events, lambda e: e["event"] == "answer" and e["retry_count"] == 0)
        variants[name] = {
            "session_id": rec.trial.session_id,
            "attempts_sent": rec.attempts_sent,
            "decisions": [e["decision"] for e in rec.events if e["event"] == "send"],
            "answers": len(rec.answers),
            "final": rec.events[-1]["decision"] if rec.events else None,
            "finished_ms": round(rec.finished_ms, 3),
            "nfe_spent_on_id": counts["nfe_spent"],
            "nfe_from_answers": rec.nfe_from_answers,
            "nfe_of_first_attempt": original["nfe_done"] if original else 0,
            "attempts_that_ran": sum(1 for a in rec.answers if a.nfe_done > 0),
            "every_attempt_answered_once_or_coalesced": answered_once,
            "relay": counts,
        }
        events.extend(rec.events)

    checks, reasons = {}, []

    def check(key: str, ok: bool, text: str) -> None:
        checks[key] = bool(ok)
        reasons.append(f"{'ok' if ok else 'FAIL'}: {text}")

    happy, unc, cap = (variants.get(k, {}) for k in ("happy", "uncapped", "capped"))
    unc_events = records["uncapped"].events if "uncapped" in records else []
    rejects = [e for e in unc_events if e["event"] in ("answer", "late_answer")
               and e["decision"] == "REJECTED_DEADLINE" and e["retry_count"]]
    rejected_sends = [e for e in unc_events if e["event"] == "send" and e["retry_count"]
                      and e["decision"] == "REJECTED_DEADLINE"]
    gated = unc.get("relay", {}).get("rejected_late_retries", 0)
    check("rejects_after_slack_gone",
          unc.get("attempts_sent", 0) > 1 and bool(rejects) and gated >= 1
          and all(e["t_ms"] >= budget for e in rejects)
          and all(e["queue_age_ms"] >= e["deadline_slack_ms"] for e in rejected_sends),
          f"uncapped fault path: {len(rejects)} retr{'y' if len(rejects) == 1 else 'ies'} "
          f"REJECTED_DEADLINE ({gated} by the age gate), first at "
          f"T+{rejects[0]['t_ms'] if rejects else '-'} ms (slack of the original gone at "
          f"T+{budget:g}, age >= slack at every rejected retry); attempts {unc.get('decisions')}")
    nfe_unc, ran = unc.get("nfe_spent_on_id", -1), unc.get("attempts_that_ran", -1)
    check("nfe_not_multiplied",
          0 <= nfe_unc <= cond.nfe and ran <= 1 and nfe_unc == unc.get("nfe_from_answers"),
          f"NFE spent on the uncapped id: {nfe_unc} by {ran} of {unc.get('attempts_sent')} "
          f"attempts (one request needs {cond.nfe}; capped id {cap.get('nfe_spent_on_id')}; "
          f"answers report {unc.get('nfe_from_answers')})")
    check("capped_path_short",
          cap.get("attempts_sent") == 1 and cap.get("answers") == 1
          and cap.get("nfe_spent_on_id", cond.nfe + 1) <= cond.nfe
          and cap.get("finished_ms", math.inf) < 2 * budget,
          f"capped path: {cap.get('decisions')} -> {cap.get('final')} after "
          f"{cap.get('finished_ms')} ms, {cap.get('nfe_spent_on_id')} NFE")
    check("every_attempt_answered_once_or_coalesced",
          all(v["every_attempt_answered_once_or_coalesced"] for v in variants.values()),
          "every attempt got exactly one answer or was coalesced into its running original: "
          + ", ".join(f"{k} {v['answers']} answers + {v['relay']['coalesced']} coalesced "
                      f"= {v['attempts_sent']} attempts" for k, v in variants.items()))
    first_reject = rejects[0] if rejects else None
    if first_reject is not None:
        reasons.append(
            f"info: worker utilisation at the first rejected retry: "
            f"{_pct(first_reject['worker_utilisation'])} on flowedge/stats, "
            f"{first_reject.get('lanes_busy')} lane(s) busy (reported, never used to decide)")
    # The happy path is the baseline, shown but not judged: it is timing, not retry safety (on a
    # loaded host at a small --time-scale, jitter alone can make it miss its deadline).
    reasons.append(
        f"info: happy path {happy.get('decisions')} after {happy.get('finished_ms')} ms, "
        f"{happy.get('nfe_spent_on_id')} NFE (expected INFERENCE on the first attempt)")
    verdict = "pass" if all(checks.values()) else "fail"
    return {
        "drill": "blind-retry",
        "conditions": {**asdict(cond), "nfe_ms": cond.nfe_ms,
                       "faulted_nfe_ms": cond.faulted_nfe_ms},
        "relay_parameters": params,
        "timeline": timeline(cond, records),
        "variants": variants,
        "events": events,
        "diagnostics": diagnostics,
        "verdict": verdict,
        "reasons": reasons,
        "checks": checks,
    }


def timeline(cond: Conditions, records: dict[str, TrialRecord]) -> list[dict]:
    """The declared milestones, expected (scaled) and observed per variant (ms after T+0)."""
    s = cond.time_scale

    def at(name: str, pred) -> float | None:
        rec = records.get(name)
        e = _first(rec.events, pred) if rec else None
        return e["t_ms"] if e else None

    answered = ("answer", "late_answer")
    rows = [
        ("enqueue (attempt 1 sent)", 0.0, lambda e: e["event"] == "send"),
        ("happy return (INFERENCE)", cond.happy_ms,
         lambda e: e["event"] in answered and e["decision"] == "INFERENCE"),
        ("slack hits zero (client timeout)", cond.budget_ms, lambda e: e["event"] == "timeout"),
        ("worker late (EXPIRED at a step boundary)", cond.expected_worker_late_ms,
         lambda e: e["event"] in answered and e["decision"] == "EXPIRED"),
        ("retry rejected (REJECTED_DEADLINE)", cond.expected_worker_late_ms + 1,
         lambda e: e["event"] in answered and e["decision"] == "REJECTED_DEADLINE"
         and e["retry_count"]),
    ]
    return [
        {"milestone": label, "expected_ms": round(ms * s, 3),
         **{name: at(name, pred) for name, _, _ in VARIANTS}}
        for label, ms, pred in rows
    ]


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _num(x, width: int = 8) -> str:
    return f"{'-':>{width}}" if x is None or x == "" else f"{x:>{width}.1f}"


def format_report(report: dict) -> str:
    lines = []
    for name in report["variants"]:
        v = report["variants"][name]
        lines.append(f"\n== {name}: {v['attempts_sent']} attempt(s), final {v['final']}, "
                     f"{v['nfe_spent_on_id']} NFE on {v['session_id']}")
        lines.append(f"{'T+ms':>9}  {'event':<12}{'try':>4}{'rc':>4}  {'reason':<15}"
                     f"{'age_ms':>9}{'slack_ms':>9}{'util':>6}{'busy':>5}  {'decision':<18}"
                     f"{'nfe':>4}{'nfe_id':>7}")
        for e in report["events"]:
            if e["variant"] != name:
                continue
            lines.append(
                f"{e['t_ms']:>9.1f}  {e['event']:<12}{e['attempt'] or '':>4}"
                f"{'' if e['retry_count'] is None else e['retry_count']:>4}  "
                f"{e['retry_reason'] or '':<15}{_num(e['queue_age_ms'], 9)}"
                f"{_num(e['deadline_slack_ms'], 9)}{_pct(e['worker_utilisation']):>6}"
                f"{e.get('lanes_busy', ''):>5}  "
                f"{e['decision'] or '':<18}{'' if e['nfe_done'] is None else e['nfe_done']:>4}"
                f"{e['nfe_spent_on_id']:>7}"
            )
    lines.append("\n== timeline (ms after T+0; expected = declared conditions x time scale)")
    lines.append(f"{'milestone':<42}{'expected':>9}{'happy':>9}{'uncapped':>9}{'capped':>9}")
    for row in report["timeline"]:
        lines.append(f"{row['milestone']:<42}{_num(row['expected_ms'], 9)}"
                     + "".join(_num(row[k], 9) for k in ("happy", "uncapped", "capped")))
    if report["diagnostics"]:
        lines.append("\n== /diagnostics admission counters")
        lines.append("  " + "  ".join(f"{k}={v}" for k, v in report["diagnostics"].items()))
    lines.append(f"\n== verdict: {report['verdict'].upper()}")
    lines.extend(f"  {r}" for r in report["reasons"])
    return "\n".join(lines)


# -- command line ---------------------------------------------------------------------------------

@stoppable  # SIGINT/SIGTERM stop it cleanly however it was started (exit 130)
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="flowedge-relay-drill",
        description="The blind-retry drill: retries must never clone late work "
                    "(docs/design.md §6).",
    )
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="multiply every drill time by this (the tests use 0.2; "
                             "much below 0.1, jitter dominates)")
    parser.add_argument("--json", metavar="PATH", help="write events, timeline and verdict here")
    parser.add_argument("--config", metavar="YAML",
                        help="admission block (default: config/drill.yaml)")
    parser.add_argument("--model", default="small", help=MODEL_CHOICES)
    parser.add_argument("--age-gate", choices=("off", "retries", "all"),
                        help="override the YAML's age_gate (off = the counterfactual run)")
    d = Conditions()
    parser.add_argument("--budget-ms", type=float, default=d.budget_ms)
    parser.add_argument("--nfe", type=int, default=d.nfe)
    parser.add_argument("--happy-ms", type=float, default=d.happy_ms,
                        help="model work of the whole request on the happy path")
    parser.add_argument("--fault-ms", type=float, default=d.fault_ms,
                        help="what the fault adds to the whole request")
    parser.add_argument("--attempts", type=int, default=d.attempts, help="uncapped client")
    parser.add_argument("--capped-attempts", type=int, default=d.capped_attempts)
    parser.add_argument("--prefix-ms", type=float, default=d.prefix_ms,
                        help="prefix_ns of a two-phase model (nominal ms)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    cond = Conditions(budget_ms=args.budget_ms, nfe=args.nfe, happy_ms=args.happy_ms,
                      fault_ms=args.fault_ms, attempts=args.attempts,
                      capped_attempts=args.capped_attempts, prefix_ms=args.prefix_ms,
                      time_scale=args.time_scale)
    try:
        cond.check()
        admission = load_admission(args.config)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    if args.age_gate:
        admission["age_gate"] = args.age_gate
    report = run_drill(cond, admission, log=lambda text: print(text, flush=True), model=args.model)
    print(format_report(report), flush=True)
    if args.json:
        path = pathlib.Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        print(f"\nwrote {path}")
    return 0 if report["verdict"] == "pass" else 1


if __name__ == "__main__":
    sys.exit(main())
