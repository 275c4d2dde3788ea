# SPDX-License-Identifier: Apache-2.0
"""Health on /diagnostics and numbers on flowedge/stats, from one snapshot of the relay.

Shaped like ros/diagnostics' diagnostic_updater (name "node: task", a stable hardware_id, one
level per status, key/value pairs) but published directly, because diagnostic_updater is not
available as a wheel. One status per concern: admission, queue, workers, model, output.

Levels (docs/design.md §9): WARN for a relay that does not serve (unconfigured: the model status;
inactive: the admission status, valid requests answered REJECTED_CAPACITY), requests lost in the
middleware before the relay saw them, calibration misses, dropped outputs, admission off while
deadlines arrive, cost drift (the measured NFE tail above what admission assumes, docs/design.md
§5.2), or a real-time setting the OS refused (docs/robot-computer.md), for as long as it holds;
ERROR for a model that failed to load or a dead/stalled worker. A WARN caused by a counter
increase is held for `hold_s` seconds so a 1 Hz viewer cannot miss it.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from flowedge_relay.core import RETRY_COUNT_BUCKETS, Code, FailCause

OK = DiagnosticStatus.OK
WARN = DiagnosticStatus.WARN
ERROR = DiagnosticStatus.ERROR


@dataclass
class Snapshot:
    """Everything diagnostics and stats report, read once per period by the node."""

    now_ns: int
    received: int
    deadlines_seen: int
    discarded: dict[str, int]
    core: object  # core.Stats
    nfe_ns: int
    admission_reserve_ns: int
    nfe_p50_ns: float
    nfe_p99_ns: float
    nfe_samples: int
    workers: int
    dead_lanes: list[int]
    stalled_lanes: list[int]
    model_ok: bool
    model_error: str
    model_path: str
    model_digest: str
    latency_p50_ms: float
    latency_p99_ms: float
    utilisation: float
    extra: dict[str, object] = field(default_factory=dict)
    #: requests the middleware reported lost before the relay's callback (MESSAGE_LOST events)
    middleware_lost: int = 0
    #: False where the RMW cannot report lost messages (then middleware_lost says nothing)
    middleware_lost_reported: bool = True
    cost: object = None  # core.CostStats (docs/design.md §5.2); None = not measured
    #: what the relay serves (model_description): kind, inputs, action dims, providers
    model: dict[str, object] = field(default_factory=dict)
    two_phase: bool = False
    prefix_ns: int = 0  # configured prefix_ns (docs/design.md §5)
    prefix_p50_ns: float = 0.0
    prefix_p99_ns: float = 0.0
    prefix_samples: int = 0
    #: batch slots (docs/design.md §5.1): B, rows held per worker now, mean rows per batched
    #: step and the step cost by row count {rows: (p50_ns, p99_ns, samples)} over recent steps
    batch_slots: int = 1
    slots_in_use: list[int] = field(default_factory=list)
    mean_rows_per_step: float = 0.0
    step_ns_by_rows: dict[int, tuple[float, float, int]] = field(default_factory=dict)
    #: real-time deployment (realtime.ThreadRoles.report): the OS's read-back per thread role,
    #: the process's threads by class, memory locked; and each asked setting the OS does not
    #: hold now, with why (the workers status is WARN while there is one)
    realtime: dict[str, object] = field(default_factory=dict)
    realtime_refused: list[str] = field(default_factory=list)
    #: the lifecycle state (docs/design.md §9): lifecycle_msgs/State id and label
    lifecycle_id: int = 3
    lifecycle_label: str = "active"
    #: fair share (docs/design.md §7.1): whether it is on, and the tracked clients
    #: (core.ClientState; empty while it is off)
    fair_share: bool = False
    clients: list = field(default_factory=list)
    #: the relay pool (docs/design.md §13; pool.RelayPool.values): empty outside a pool
    pool: dict[str, object] = field(default_factory=dict)

    @property
    def oldest_queue_age_ms(self) -> float:
        arrival = self.core.oldest_queued_arrival_ns
        return 0.0 if arrival == 0 else max(self.now_ns - arrival, 0) / 1e6


class _Hold:
    """Remembers when a counter last grew, so WARN stays up for a while after an event."""

    def __init__(self, hold_ns: int) -> None:
        self.hold_ns = hold_ns
        self.last_value: dict[str, int] = {}
        self.last_growth_ns: dict[str, int] = {}

    def recent(self, key: str, value: int, now_ns: int) -> bool:
        previous = self.last_value.get(key, 0)
        self.last_value[key] = value
        if value > previous:
            self.last_growth_ns[key] = now_ns
        grew = self.last_growth_ns.get(key)
        return grew is not None and now_ns - grew <= self.hold_ns


def _cost_values(k) -> dict[str, object]:
    if k is None:
        return {}
    return {
        "cost_model": "adaptive" if k.cost_model else "static",
        "nfe_ns_observed_tail": k.observed_tail_ns,
        "nfe_ns_in_use": k.in_use_ns,
        "nfe_ns_quantile_tail": k.quantile_tail_ns,
        "nfe_ns_block_mean": k.block_mean_ns,
        "nfe_ns_window_max": k.window_max_ns,
        "cost_window_ms": k.window_ns / 1e6,
        "cost_quantile": k.quantile_ppm / 1e6,
        "cost_window_samples": k.window_samples,
    }


def model_description(policy, execution_providers, rtc=None) -> dict[str, object]:
    """The `model` status values a producer builds requests from (producer.ServedModel parses
    model_inputs; the format is policy.Policy.describe_inputs': 'image:uint8[2,32,32]; ...');
    `rtc` is real-time chunking as served (rtc.RtcSpec, None: off)."""
    return {
        "model_kind": policy.kind_text,
        "model_inputs": policy.describe_inputs(),
        "observation_dim": policy.observation_dim,
        "action_dim": policy.action_dim,
        "action_horizon": policy.action_horizon,
        "solver": policy.solver if policy.kind != "onnx" else "parameter",
        "time_convention": policy.time,
        "execution_providers": ",".join(execution_providers),
        "rtc_mode": rtc.mode if rtc is not None else "off",
        "rtc_max_delay": rtc.max_delay if rtc is not None else 0,
    }


def _prefix_values(s: Snapshot) -> dict[str, object]:
    """Prefix-pass figures of a two-phase model, next to the NFE ones (empty otherwise)."""
    if not s.two_phase:
        return {}
    k = s.cost
    return {
        "prefix_ns_configured": s.prefix_ns,
        "prefix_ns_observed_tail": k.prefix_observed_tail_ns if k else 0,
        "prefix_ns_in_use": k.prefix_in_use_ns if k else s.prefix_ns,
        "prefix_ns_p50": s.prefix_p50_ns,
        "prefix_ns_p99": s.prefix_p99_ns,
        "prefix_samples": s.prefix_samples,
    }


def _drift(s: Snapshot) -> str | None:
    """The drift alarm (docs/design.md §5.2), in both cost models: the measured NFE tail
    exceeds the per-NFE cost admission assumes, so admitted work can miss its deadline."""
    if s.nfe_ns <= 0:
        return None
    k = s.cost
    if k is not None:
        if k.window_samples and k.observed_tail_ns > k.in_use_ns:
            what = (f"NFE p{k.quantile_ppm / 1e4:g}" if k.quantile_tail_ns >= k.block_mean_ns
                    else "busy time per step (the busiest block of whole requests)")
            return (f"cost drift: measured {what} over the last "
                    f"{k.window_ns / 1e9:g} s is {k.observed_tail_ns} ns, above the "
                    f"{k.in_use_ns} ns admission assumes (configured nfe_ns {s.nfe_ns})")
        # a two-phase model's prefix pass has its own estimate (0 while none is in the window)
        if s.two_phase and k.prefix_observed_tail_ns > k.prefix_in_use_ns:
            return (f"cost drift: measured prefix p{k.quantile_ppm / 1e4:g} over the last "
                    f"{k.window_ns / 1e9:g} s is {k.prefix_observed_tail_ns} ns, above the "
                    f"{k.prefix_in_use_ns} ns admission assumes (configured prefix_ns "
                    f"{s.prefix_ns})")
        return None
    if s.nfe_samples and s.nfe_p99_ns > s.nfe_ns:  # no core cost model: the pool's history
        return (f"cost drift: measured NFE p99 {s.nfe_p99_ns:.0f} ns exceeds the configured "
                f"nfe_ns {s.nfe_ns}")
    return None


#: RelayStats' pool fields (docs/design.md §13), the pool status' keys of the same names; all 0
#: outside a pool
POOL_STATS = ("not_owner", "pool_members", "pool_epoch", "owned_sessions", "takeovers",
              "taken_over_requests", "standby_entries", "standby_capacity", "standby_evicted",
              "surrendered", "spilled_out", "spilled_in", "spill_taken_back", "held",
              "held_released", "hold_full", "held_requests_decided")

TOP_CLIENTS = 8  # clients listed on the queue status and in RelayStats, most committed first
STATS_RATE_WINDOW_NS = 1_000_000_000  # RelayStats' admitted NFE/s: over the last 1 to 2 s


def top_clients(clients: list) -> list:
    """The TOP_CLIENTS tracked clients using the most now (committed NFE, then admitted)."""
    return sorted(clients, key=lambda c: (-c.committed_nfe, -c.admitted_nfe,
                                          c.client_id))[:TOP_CLIENTS]


def share_in_use(clients: list) -> dict[bytes, float]:
    """Each client's share of the committed work (remaining NFE queued and running) now."""
    total = sum(c.committed_nfe for c in clients)
    return {c.client_id: (c.committed_nfe / total if total else 0.0) for c in clients}


class AdmittedRates:
    """Each tracked client's admitted NFE per second, from its admitted_nfe counter. The base
    sample is at least `window_ns` old (between one and two windows; window 0: the previous
    call), so a 10 Hz stats message shows a rate over a second, not over 0.1 s. Two samples per
    tracked client: bounded by max_clients. A client new since the base sample admitted all it
    has since then; one forgotten and tracked again starts from 0 (never a negative rate)."""

    def __init__(self, window_ns: int = 0) -> None:
        self._window_ns = window_ns
        self._base: tuple[int, dict[bytes, int]] | None = None  # (when, admitted NFE) per client
        self._next: tuple[int, dict[bytes, int]] | None = None

    def rates(self, clients: list, now_ns: int) -> dict[bytes, float]:
        sample = (now_ns, {k.client_id: k.admitted_nfe for k in clients})
        when, before = self._base or sample
        out = {}
        for k in clients:
            base = before.get(k.client_id, 0)
            done = k.admitted_nfe - base if k.admitted_nfe >= base else k.admitted_nfe
            out[k.client_id] = done * 1e9 / (now_ns - when) if now_ns > when else 0.0
        if self._base is None or self._window_ns == 0:
            self._base = self._next = sample
        elif self._next is not None and now_ns - self._next[0] >= self._window_ns:
            self._base, self._next = self._next, sample
        return out


def _kv(pairs: dict[str, object]) -> list[KeyValue]:
    return [KeyValue(key=k, value=f"{v:.3f}" if isinstance(v, float) else str(v))
            for k, v in pairs.items()]


class DiagnosticsBuilder:
    """Turns snapshots into DiagnosticArray messages; keeps only the WARN hold state."""

    def __init__(self, node_name: str, hold_s: float = 10.0) -> None:
        self.node_name = node_name
        self.hardware_id = f"flowedge_relay@{socket.gethostname()}"
        self._hold = _Hold(int(hold_s * 1e9))
        self._hold_ns = int(hold_s * 1e9)
        self._drift: tuple[int, str] | None = None  # (when, message) of the latest cost drift
        self._rates = AdmittedRates()  # since the previous diagnostics
        self._stats_rates = AdmittedRates(STATS_RATE_WINDOW_NS)

    def observe(self, s: Snapshot) -> None:
        """Note a cost drift in any snapshot (the node feeds its 10 Hz stats snapshots here too),
        so that a drift shorter than the 1 s window between two diagnostics is still reported,
        and held for hold_s like the other WARNs."""
        drift = _drift(s)
        if drift:
            self._drift = (s.now_ns, drift)

    def _status(self, task: str, level: int, message: str, values: dict) -> DiagnosticStatus:
        return DiagnosticStatus(
            level=level,
            name=f"{self.node_name}: {task}",
            message=message,
            hardware_id=self.hardware_id,
            values=_kv(values),
        )

    def build(self, s: Snapshot, stamp) -> DiagnosticArray:
        array = DiagnosticArray()
        array.header.stamp = stamp
        array.status = [
            self._admission(s),
            self._queue(s),
            self._workers(s),
            self._model(s),
            self._output(s),
        ]
        if s.pool:  # a single relay's statuses are unchanged
            array.status.append(self._pool(s))
        return array

    def _pool(self, s: Snapshot) -> DiagnosticStatus:
        """The pool status (docs/design.md §13): the view, this member's epoch and ownership,
        what it left to the owners (not_owner) and keeps for them (standby), the takeovers.
        WARN for a while after a takeover, a surrender or a standby eviction."""
        v = s.pool
        took = self._hold.recent("takeovers", int(v.get("takeovers", 0)), s.now_ns)
        surrendered = self._hold.recent("surrendered", int(v.get("surrendered", 0)), s.now_ns)
        evicted = self._hold.recent("standby_evicted", int(v.get("standby_evicted", 0)),
                                    s.now_ns)
        summary = (f"pool {v.get('pool')}: {v.get('pool_members', 0)} members, epoch "
                   f"{v.get('pool_epoch', 0)}"
                   + (", draining" if v.get("draining") else "")
                   + ("" if v.get("owning") else ", not owning"))
        if surrendered:
            level, msg = WARN, f"{summary}; work surrendered after this member's own stall"
        elif took:
            level, msg = WARN, f"{summary}; took over a lost member's sessions"
        elif evicted:
            level, msg = WARN, f"{summary}; standby full: requests kept for a takeover evicted"
        else:
            level, msg = OK, summary
        return self._status("pool", level, msg, v)

    def _admission(self, s: Snapshot) -> DiagnosticStatus:
        c = s.core
        lost = self._hold.recent("middleware_lost", s.middleware_lost, s.now_ns)
        misses = self._hold.recent("calibration_misses", c.calibration_misses, s.now_ns)
        failed = self._hold.recent("failed", sum(c.failed), s.now_ns)
        blind = s.nfe_ns == 0 and self._hold.recent("deadlines", s.deadlines_seen, s.now_ns)
        values = {
            "lifecycle_state": s.lifecycle_label,
            "rejected_inactive": c.rejected_inactive,
            "admission": "on" if s.nfe_ns > 0 else "off",
            "nfe_ns": s.nfe_ns,
            "admission_reserve_ns": s.admission_reserve_ns,
            "received": s.received,
            "middleware_lost": (s.middleware_lost if s.middleware_lost_reported
                                else "not reported by this RMW"),
            "accepted": c.accepted,
            "invalid_discarded": sum(s.discarded.values()),
            **{f"invalid.{k}": v for k, v in s.discarded.items()},
            **{f"outcome.{code.key}": c.outcomes[code] for code in Code},
            **{f"failed.{cause.key}": c.failed[cause] for cause in FailCause},
            "duplicate_retries_coalesced": c.coalesced,
            "rejected_late_retries": c.rejected_late_retries,
            **{f"retries.count_{i}{'+' if i == RETRY_COUNT_BUCKETS - 1 else ''}": n
               for i, n in enumerate(c.retries_by_count) if i > 0},
            **{f"retries.reason_{i}": n for i, n in enumerate(c.retries_by_reason) if i > 0},
            "calibration_misses": c.calibration_misses,
            "nfe_total": c.nfe_total,
            "nfe_wasted": c.nfe_wasted,
        }
        if s.lifecycle_label != "active" and s.model_ok:
            level, msg = WARN, (f"not serving ({s.lifecycle_label}): valid requests are "
                                "answered REJECTED_CAPACITY")
        elif lost:
            level, msg = WARN, "requests lost in the middleware before the relay saw them"
        elif failed:
            level, msg = WARN, "inference failed: answered INFERENCE_FAILED (failed.* says why)"
        elif misses:
            level, msg = WARN, "calibration misses: admitted work missed its deadline"
        elif blind:
            level, msg = WARN, "admission off (nfe_ns = 0) while requests carry deadlines"
        else:
            level, msg = OK, "admission on" if s.nfe_ns > 0 else "admission off"
        return self._status("admission", level, msg, values)

    def _queue(self, s: Snapshot) -> DiagnosticStatus:
        c = s.core
        values = {
            "queue_depth": c.queue_depth,
            "oldest_queue_age_ms": s.oldest_queue_age_ms,
            "displaced": c.displaced,
            "sessions": c.sessions,
            "sessions_evicted": c.sessions_evicted,
            **self._client_values(s),
        }
        return self._status("queue", OK, f"{c.queue_depth} queued", values)

    def _client_values(self, s: Snapshot) -> dict[str, object]:
        """§7.1: the fair share's counters and, per top client, its share of the committed work,
        NFE admitted per second since the previous diagnostics and its fair-share rejections."""
        if not s.fair_share:
            return {"fair_share": "off"}
        c = s.core
        values: dict[str, object] = {
            "fair_share": "on", "clients": c.clients, "clients_evicted": c.clients_evicted,
            "fair_share_rejected": c.fair_share_rejected,
            "fair_share_displaced": c.fair_share_displaced,
        }
        shares = share_in_use(s.clients)
        rates = self._rates.rates(s.clients, s.now_ns)
        for k in top_clients(s.clients):
            name = k.client_id.decode("utf-8", "replace")
            values[f"client.{name}.share_in_use"] = shares[k.client_id]
            values[f"client.{name}.admitted_nfe_per_s"] = rates[k.client_id]
            values[f"client.{name}.fair_share_rejections"] = k.fair_share_rejections
            values[f"client.{name}.weight"] = k.weight
        return values

    def stats(self, s: Snapshot, stamp):
        """The RelayStats of `s`, its clients' admitted NFE/s over the last 1 to 2 seconds."""
        return stats_message(s, stamp, self._stats_rates.rates(s.clients, s.now_ns))

    def _workers(self, s: Snapshot) -> DiagnosticStatus:
        values = {
            "workers": s.workers,
            "lanes_alive": s.core.lanes_alive,
            "lanes_busy": s.core.lanes_busy,
            "lane_utilisation": s.utilisation,
            "dead_lanes": ",".join(map(str, s.dead_lanes)) or "none",
            "stalled_lanes": ",".join(map(str, s.stalled_lanes)) or "none",
            "nfe_ns_p50": s.nfe_p50_ns,
            "nfe_ns_p99": s.nfe_p99_ns,
            "nfe_ns_configured": s.nfe_ns,
            "nfe_samples": s.nfe_samples,
            **_cost_values(s.cost),
            **_prefix_values(s),
            "latency_p50_ms": s.latency_p50_ms,
            "latency_p99_ms": s.latency_p99_ms,
            **_batch_values(s),
            **s.extra,
            **s.realtime,
        }
        if s.dead_lanes:
            level, msg = ERROR, f"worker(s) {values['dead_lanes']} died; lanes removed"
        elif s.stalled_lanes:
            level, msg = ERROR, f"worker(s) {values['stalled_lanes']} stalled"
        elif drift := self._recent_drift(s):
            level, msg = WARN, drift
        else:
            alive = s.core.lanes_alive // max(s.batch_slots, 1)  # B lanes per worker
            level, msg = OK, f"{alive} of {s.workers} workers running"
            if s.cost is not None and s.nfe_ns > 0 and s.cost.in_use_ns > s.nfe_ns:
                msg += (f"; adaptive cost model admits with {s.cost.in_use_ns} ns per NFE "
                        f"(configured {s.nfe_ns})")
        if s.realtime_refused:  # never silent, whatever else the status says
            level = max(level, WARN)
            msg += "; real-time settings refused, running degraded: " + "; ".join(
                s.realtime_refused)
        return self._status("workers", level, msg, values)

    def _recent_drift(self, s: Snapshot) -> str | None:
        self.observe(s)
        if self._drift is None or s.now_ns - self._drift[0] > self._hold_ns:
            return None
        age_s = (s.now_ns - self._drift[0]) / 1e9
        return self._drift[1] if age_s == 0 else f"{self._drift[1]} ({age_s:.1f} s ago)"

    def _model(self, s: Snapshot) -> DiagnosticStatus:
        values = {"model_path": s.model_path, "model_digest": s.model_digest,
                  "lifecycle_state": s.lifecycle_label}
        if not s.model_ok:
            values["error"] = s.model_error
            if not s.model_error:  # unconfigured by choice: waiting for a lifecycle manager
                return self._status("model", WARN, "not configured: no model loaded (lifecycle "
                                    f"state {s.lifecycle_label})", values)
            return self._status("model", ERROR, f"model failed to load: {s.model_error}", values)
        values.update(s.model)
        values.update(_prefix_values(s))
        kind = s.model.get("model_kind")
        return self._status("model", OK, f"model loaded ({kind})" if kind else "model loaded",
                            values)

    def _output(self, s: Snapshot) -> DiagnosticStatus:
        c = s.core
        drops = c.rejection_outputs_dropped + c.action_outputs_dropped
        values = {
            "rejection_outputs_dropped": c.rejection_outputs_dropped,
            "action_outputs_dropped": c.action_outputs_dropped,
        }
        if self._hold.recent("drops", drops, s.now_ns):
            return self._status("output", WARN, "outcomes dropped: output ring full", values)
        return self._status("output", OK, "no drops" if drops == 0 else "draining", values)


def _batch_values(s: Snapshot) -> dict[str, object]:
    """The workers status' batch-slot figures (docs/design.md §5.1)."""
    values: dict[str, object] = {
        "batch_slots": s.batch_slots,
        "slots_in_use": ",".join(map(str, s.slots_in_use)) or "none",
        "mean_rows_per_step": round(s.mean_rows_per_step, 3),
    }
    for rows, (p50, p99, n) in sorted(s.step_ns_by_rows.items()):
        values[f"step_ns_p50.rows_{rows}"] = p50
        values[f"step_ns_p99.rows_{rows}"] = p99
        values[f"steps.rows_{rows}"] = n
    return values


def _step_p99(s: Snapshot, rows: int) -> float:
    """p99 ns of the recent steps with `rows` rows; 0 where none ran."""
    return float(s.step_ns_by_rows.get(rows, (0.0, 0.0, 0))[1])


def top_client_shares(s: Snapshot, rates: dict[bytes, float]) -> list:
    """RelayStats.top_clients: the TOP_CLIENTS clients with the most committed work (§7.1)."""
    from flowedge_relay_msgs.msg import ClientShare

    shares = share_in_use(s.clients)
    return [ClientShare(client_id=k.client_id.decode("utf-8", "replace"),
                        share_in_use=shares[k.client_id],
                        admitted_nfe_per_s=float(rates.get(k.client_id, 0.0)),
                        fair_share_rejections=k.fair_share_rejections, weight=k.weight)
            for k in top_clients(s.clients)]


def stats_message(s: Snapshot, stamp, rates: dict[bytes, float] | None = None):
    """The RelayStats for rqt_plot: numeric fields, and the top clients (`rates`: their admitted
    NFE/s, 0 where not given)."""
    from flowedge_relay_msgs.msg import RelayStats

    c = s.core
    inference, stale, deadline, capacity, expired, failed = c.outcomes
    return RelayStats(
        stamp=stamp,
        received=s.received,
        accepted=c.accepted,
        invalid_discarded=sum(s.discarded.values()),
        duplicate_retries_coalesced=c.coalesced,
        rejected_late_retries=c.rejected_late_retries,
        inference=inference,
        rejected_stale=stale,
        rejected_deadline=deadline,
        rejected_capacity=capacity,
        expired=expired,
        calibration_misses=c.calibration_misses,
        rejection_outputs_dropped=c.rejection_outputs_dropped,
        action_outputs_dropped=c.action_outputs_dropped,
        nfe_total=c.nfe_total,
        nfe_wasted=c.nfe_wasted,
        queue_depth=c.queue_depth,
        oldest_queue_age_ms=s.oldest_queue_age_ms,
        lane_utilisation=s.utilisation,
        lanes_alive=c.lanes_alive,
        sessions=c.sessions,
        nfe_ns_p50=float(s.nfe_p50_ns),
        nfe_ns_p99=float(s.nfe_p99_ns),
        nfe_ns_configured=s.nfe_ns,
        admission_reserve_ns=s.admission_reserve_ns,
        latency_p50_ms=s.latency_p50_ms,
        latency_p99_ms=s.latency_p99_ms,
        middleware_lost=s.middleware_lost,
        nfe_ns_observed_tail=s.cost.observed_tail_ns if s.cost else 0,
        nfe_ns_in_use=s.cost.in_use_ns if s.cost else s.nfe_ns,
        cost_model_adaptive=int(bool(s.cost and s.cost.cost_model)),
        cost_window_ms=round(s.cost.window_ns / 1e6) if s.cost else 0,
        displaced=c.displaced,
        lanes_busy=c.lanes_busy,
        prefix_ns_configured=s.prefix_ns if s.two_phase else 0,
        prefix_ns_observed_tail=s.cost.prefix_observed_tail_ns if s.two_phase and s.cost else 0,
        prefix_ns_in_use=(s.cost.prefix_in_use_ns if s.cost else s.prefix_ns) if s.two_phase
        else 0,
        batch_slots=s.batch_slots,
        slots_in_use=int(sum(s.slots_in_use)),
        slots_in_use_max=int(max(s.slots_in_use, default=0)),
        mean_rows_per_step=float(s.mean_rows_per_step),
        step_ns_p99_full=_step_p99(s, s.batch_slots),
        step_ns_p99_one_row=_step_p99(s, 1),
        lifecycle_state=s.lifecycle_id,
        rejected_inactive=c.rejected_inactive,
        fair_share_rejected=c.fair_share_rejected,
        fair_share_displaced=c.fair_share_displaced,
        clients=c.clients,
        top_client_share=max(share_in_use(s.clients).values(), default=0.0),
        inference_failed=failed,
        failed_non_finite=c.failed[FailCause.NON_FINITE],
        failed_runtime_error=c.failed[FailCause.RUNTIME_ERROR],
        **{name: int(s.pool.get(name, 0)) for name in POOL_STATS},
        top_clients=top_client_shares(s, rates or {}),
    )


DIAGNOSTICS_TOPIC = "/diagnostics"
STATS_TOPIC = "flowedge/stats"


class StatusTopics:
    """/diagnostics and flowedge/stats of a relay node: the publishers, and the bodies of the
    node's timers that publish them (the node owns the timers and their rates).

    `relay` is the node's relay.Relay; `lifecycle` and `pool` read the node's state and its
    relay pool's status, only while the relay is open (Relay.open_snapshot)."""

    def __init__(self, node, relay, lifecycle, pool) -> None:
        from flowedge_relay_msgs.msg import RelayStats

        self._node, self._relay, self._lifecycle, self._pool = node, relay, lifecycle, pool
        self._stats_pub = node.create_publisher(RelayStats, STATS_TOPIC, 10)
        self._diag_pub = node.create_publisher(DiagnosticArray, DIAGNOSTICS_TOPIC, 10)
        self.builder = DiagnosticsBuilder(node.get_fully_qualified_name().lstrip("/"))

    def publish_diagnostics(self) -> None:
        if snap := self._relay.open_snapshot("diagnostics", self._lifecycle, self._pool):
            stamp = self._node.get_clock().now().to_msg()
            self._publish(self._diag_pub, self.builder.build(snap, stamp))

    def publish_stats(self) -> None:
        if snap := self._relay.open_snapshot("stats", self._lifecycle, self._pool):
            self.builder.observe(snap)  # a cost drift between diagnostics is still seen
            stamp = self._node.get_clock().now().to_msg()
            self._publish(self._stats_pub, self.builder.stats(snap, stamp))

    def publish_now(self) -> bool:
        """Publish both now, as the timers do; False once the relay is closed (destroy_node),
        when a timer publishes nothing either."""
        self.publish_stats()
        self.publish_diagnostics()
        return not self._relay.closed

    def _publish(self, publisher, msg) -> None:
        """A timer that fires while the context shuts down (SIGINT, a test's teardown) finds
        the publisher's context gone: that is the end of the period, not an error."""
        try:
            publisher.publish(msg)
        except Exception:
            if self._node.context.ok():
                raise
