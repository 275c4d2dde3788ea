# SPDX-License-Identifier: Apache-2.0
"""The relay without ROS: what is served, a model swap, the totals since start, the snapshot.

`Relay` owns the served model (a serving.Serving: its core, intakes, workers and publisher
thread), builds the next one beside it for a swap (docs/design.md §9), folds what a retired one
counted into the totals, and reads the snapshot diagnostics and stats report. It imports no
rclpy (test/test_layout.py holds that): the lifecycle node (node.py) owns the parameters,
topics, timers and transitions, and hands the relay a `Host` with what it needs from around it
(a logger, the ROS clock, the flowedge/actions publisher). A test without DDS gives a plain
`Host` (logging, time.time_ns, a sink with `publish`) and drives the relay directly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flowedge_relay.core import AgeGate, Decision, Stats
from flowedge_relay.diagnostics import Snapshot
from flowedge_relay.intake import IntakeLoop, IntakePause
from flowedge_relay.model import ModelError
from flowedge_relay.publisher import OutputPause
from flowedge_relay.realtime import ThreadRoles
from flowedge_relay.serving import Serving, cost_fields, load_policy
from flowedge_relay.throttle import Throttle
from flowedge_relay.timebase import UINT64_MAX
from flowedge_relay.validation import Reason
from flowedge_relay.workers import DrillOnly, p50_p99

MS = 1_000_000
DISCARD_LOG_PERIOD_NS = 5_000_000_000  # at most one "discarding invalid request" line per 5 s
#: How long past a core's drain bound a drain is waited for before it is given up (a stalled
#: worker): the drain bound is the lane simulation's, at the cost in use.
DRAIN_MARGIN_NS = 5_000_000_000
DRAIN_POLL_S = 0.002
#: A retired core's gauges are not summed into the relay's totals (the counters are).
GAUGES = frozenset({"queue_depth", "sessions", "lanes_busy", "lanes_alive",
                    "oldest_queued_arrival_ns", "clients"})


@dataclass(frozen=True)
class Host:
    """What a Relay needs from the process around it. The node gives its logger, its clock and
    its flowedge/actions publisher (`actions`: `publish(msg)`; the C loop publishes through its
    `handle`); without DDS, a logging.Logger, time.time_ns and any object with `publish`."""

    logger: Any  # debug / info / warning / error (str)
    now_ns: Callable[[], int]  # ROS time now: header stamps, request clocks
    actions: Any
    sim_time: bool = False  # the ROS clock is simulated: the C publisher loop cannot stamp it
    drill: bool = False  # started for a drill: worker crashes and the pause hooks exist
    thread_roles: ThreadRoles = field(default_factory=ThreadRoles)

    @staticmethod
    def plain(actions: Any, name: str = "flowedge_relay", **kw: Any) -> Host:
        """A Host without ROS: Python logging and the wall clock as ROS time."""
        return Host(logging.getLogger(name), time.time_ns, actions, **kw)

    @staticmethod
    def of(node: Any, actions: Any, **kw: Any) -> Host:
        """The Host of an rclpy node: its logger and its clock (ROS time, simulated or not)."""
        return Host(node.get_logger(), lambda: node.get_clock().now().nanoseconds, actions,
                    sim_time=bool(node.get_parameter("use_sim_time").value), **kw)


@dataclass(frozen=True)
class IntakeCounters:
    """What arrived on the request topics, as Relay.counters() reads it."""

    received: int  # messages the request callback saw
    deadlines_seen: int  # of those, valid ones that carried a deadline
    middleware_lost: int  # reported lost by the middleware before the callback (MESSAGE_LOST)
    middleware_lost_reported: bool  # False where the RMW cannot report such loss
    discarded: dict[str, int]  # invalid input, by reason key


class BusyWindow:
    """Lane utilisation since the previous call: busy lane-time over elapsed x alive lanes."""

    def __init__(self) -> None:
        self.then = time.monotonic_ns()
        self.busy_then = 0

    def update(self, now: int, busy_ns: int, lanes: int) -> float:
        elapsed = (now - self.then) * max(lanes, 1)
        value = min(max(busy_ns - self.busy_then, 0) / elapsed, 1.0) if elapsed > 0 else 0.0
        self.then, self.busy_then = now, busy_ns
        return value


def plus(live: Stats, retired: Stats | None) -> Stats:
    """live's counters plus a retired core's (the totals since start); live's gauges."""
    if retired is None:
        return live
    values = {}
    for name in live.__dataclass_fields__:
        a, b = getattr(live, name), getattr(retired, name)
        if name in GAUGES:
            values[name] = a
        elif isinstance(a, list):
            values[name] = [x + y for x, y in zip(a, b, strict=True)]
        else:
            values[name] = a + b
    return Stats(**values)


class Relay:
    """Serves one model at a time (a swap: two, the old one draining), from configure to cleanup.

    `p` is the parameter values (the node keeps them current: `apply`). `intake_loop` is the C
    intake's loop (the node made it over its subscriptions) or None: the rclpy callback hands
    each request to `on_request`. `pool` is a relay pool's C side (core.Pool) or None.

    Thread ownership: `serving` and the retired totals are written by the lifecycle and
    parameter callbacks (one reference replaced whole); the throttles and the Python intake's
    counters by the request thread; `middleware_lost` by the MESSAGE_LOST handler. Any other
    thread only reads them: each is a Python int or reference, so a reader sees a value that was
    current, never a torn one. `core_use` orders a core's close after any reader of it.
    """

    serving: Serving | None = None

    def __init__(self, p: dict, host: Host, intake_loop: IntakeLoop | None = None,
                 intake_note: str = "", pool=None) -> None:
        self.p, self.host = p, host
        self.loop, self.intake_note, self.pool_c = intake_loop, intake_note, pool
        #: the timers read the serving core; a swap's retirement and close() close cores: one
        #: holds this while the other runs
        self.core_use = threading.Lock()
        self.stopping = threading.Event()  # set first at stop: the intake takes no more
        self._swap_lock = threading.Lock()  # one model swap at a time
        self._stopped = self._closed = False
        self._draining: list[Serving] = []
        self._pending: Serving | None = None
        self._retired_stats: Stats | None = None
        self._retired_intake: dict = {"received": 0, "deadlines_seen": 0, "discarded": {}}
        self.middleware_lost = 0  # requests the middleware reported lost before the callback
        self.lost_reported = True  # False where the RMW cannot report MESSAGE_LOST
        self._discard_log = Throttle(DISCARD_LOG_PERIOD_NS)
        self._refused_log = Throttle(DISCARD_LOG_PERIOD_NS)
        self._native_logged = self._native_refused_logged = 0
        self.dead_lanes: list[int] = []
        self.stalled_lanes: list[int] = []
        # one utilisation window per consumer, so the 10 Hz stats and 1 Hz diagnostics each
        # report their own period
        self._util_windows = {"stats": BusyWindow(), "diagnostics": BusyWindow()}
        #: DRILLS ONLY (fault_pause_intake): while set, the intake takes no request
        self.pause_intake = IntakePause(intake_loop)
        self.replace(self.unconfigured(""))

    # -- what is served ----------------------------------------------------------------------

    @property
    def intake_loop(self) -> str:
        """Which intake decides requests: native (C) or python (the rclpy callback)."""
        return "native" if self.loop is not None else "python"

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def discarded_suppressed(self) -> int:
        """Discard log lines held back since the last one (at most one per 5 s is written)."""
        return self._discard_log.suppressed

    def unconfigured(self, error: str) -> Serving:
        """What an unconfigured relay serves: no model, every request model_unavailable;
        `error` says why configure failed ("" before any configure)."""
        return Serving(self, self.p, None, model_path=self.p["model_path"], model_error=error)

    def load(self, model_path: str, calibration: dict | None = None,
             hold: bool = False) -> Serving:
        """A Serving of the model at model_path, built, warmed and its threads started, not
        accepting yet; ModelError naming why it cannot be served."""
        policy = load_policy(model_path, self.p["execution_providers"])
        serving = Serving(self, self.p, policy, model_path=model_path, calibration=calibration,
                          accepting=False, hold=hold)
        if self.loop is not None and serving.native_intake is None:
            serving.stop()
            serving.close()
            raise ModelError(f"the C request intake cannot take this model's requests "
                             f"({serving.intake_note}); set intake_loop: python to serve it")
        serving.start()
        return serving

    def _route(self, serving: Serving) -> None:
        """The switch point: from the next request on, `serving` decides (the C intake loop's
        route, or the rclpy callback's, one reference each)."""
        self.serving = serving
        if self.loop is not None:
            self.loop.route(serving.native_intake)

    def replace(self, new: Serving) -> None:
        """Serve `new` from now on (started here if it was not); the one before, which holds
        no work (unconfigured, or inactive and drained), is retired at once."""
        old = self.serving
        if new.started_ns == 0:
            new.start()
        self._route(new)
        if old is not None:
            self._retire(old)

    def _retire(self, old: Serving) -> None:
        """Stop a serving the intake no longer routes to and fold its counts into the totals."""
        old.stop()
        with self.core_use:
            self._retired_stats = plus(old.core.stats(), self._retired_stats)
            intake = self._intake_counts(old)
            base = self._retired_intake
            base["received"] += intake["received"]
            base["deadlines_seen"] += intake["deadlines_seen"]
            for key, count in intake["discarded"].items():
                base["discarded"][key] = base["discarded"].get(key, 0) + count
            old.close()

    def wait_idle(self, serving: Serving) -> bool:
        """Wait until `serving` holds no work, at most DRAIN_MARGIN_NS past its drain bound (the
        first one known: with admission off and nothing measured yet, work without a deadline
        has none until its first NFE is measured)."""
        give_up = None
        while not serving.idle():
            now = time.monotonic_ns()
            if give_up is None:
                bound = serving.core.drain_bound(now)
                give_up = bound + DRAIN_MARGIN_NS if bound < UINT64_MAX else None
            if self.stopping.is_set() or (give_up is not None and now > give_up):
                self.host.logger.error("admitted work did not drain by its bound; going on")
                return False
            time.sleep(DRAIN_POLL_S)
        return True

    # -- the lifecycle's work (the node's transitions call these) --------------------------------

    def configure(self) -> str | None:
        """Load and check the model, build the core, start and warm the workers; the reason it
        cannot be served (then still unconfigured, the model status naming it), or None."""
        try:
            serving = self.load(self.p["model_path"])
        except ModelError as exc:
            self.host.logger.error(f"model failed to load: {exc}")
            self.replace(self.unconfigured(str(exc)))
            return str(exc)
        self.replace(serving)
        self._log_serving()
        return None

    def set_accepting(self, accepting: bool) -> None:
        """Admit requests (activate) or answer new arrivals REJECTED_CAPACITY (deactivate)."""
        self.serving.core.set_accepting(accepting)

    def drain(self) -> None:
        """Return once nothing holds work (a swap's old model first), each bounded by its
        drain bound."""
        for draining in list(self._draining):
            self.wait_idle(draining)
        self.wait_idle(self.serving)

    def cleanup(self) -> None:
        """Stop the workers and release the model."""
        self.replace(self.unconfigured(""))

    def _log_serving(self) -> None:
        s, log = self.serving, self.host.logger
        if s.package:
            log.info(f"serving policy package {s.policy.name!r} ({s.policy.kind_text}): inputs "
                     f"{s.policy.describe_inputs()}, actions {s.policy.action_horizon} x "
                     f"{s.policy.action_dim}, solver {s.policy.solver} (from the manifest), "
                     f"providers {list(s.execution_providers)}")
        log.info(f"model configured: {s.model_path} ({s.policy.digest})")

    # -- live values and the model swap (docs/design.md §9) ------------------------------------

    def prepare_swap(self, model_path: str, calibration: dict) -> str | None:
        """A set of model_path while configured: load and warm the new model beside the one that
        serves (its workers held); the reason it cannot be served, or None. `apply` switches."""
        if not self._swap_lock.acquire(blocking=False):
            return "a model swap is in progress"
        try:
            if self._draining:
                return "the previous model swap is still draining"
            try:
                self._pending = self.load(model_path, calibration, hold=True)
            except ModelError as exc:
                return f"model_path {model_path!r} cannot be served: {exc}"
            return None
        finally:
            self._swap_lock.release()

    def apply(self, values: dict[str, object], active: bool) -> bool:
        """Take accepted live values: cached, pushed into the core and workers, and a prepared
        swap switched to (`active`: the new model admits at once). True when it switched."""
        self.p.update(values)
        names, get = set(values), self.p.__getitem__
        pending, self._pending = self._pending, None
        if pending is not None:
            self.switch(pending, active)  # the new core already has the set's calibration
        core, pool = self.serving.core, self.serving.pool
        if names & {"nfe_ns", "admission_reserve_ns", "prefix_ns"} and pending is None:
            core.set_calibration(get("nfe_ns"), get("admission_reserve_ns"), get("prefix_ns"))
        if names & {"reject_if_retry_count_gte", "age_gate", "reject_if_queue_age_ms_gte",
                    "queue_timeout_ms"}:
            core.set_policy(get("reject_if_retry_count_gte"), AgeGate[get("age_gate").upper()],
                            get("reject_if_queue_age_ms_gte") * MS, get("queue_timeout_ms") * MS)
        if names & {"cost_model", "cost_window_ms", "cost_quantile"}:
            k = cost_fields(self.p)
            core.set_cost_model(k["cost_model"], k["cost_window_ns"], k["cost_quantile_ppm"])
        if names & {"fair_share", "client_weights"}:
            self.serving.apply_fair_share(self.p)
        if "fault_nfe_delay_ms" in names and pool is not None:
            pool.fault_nfe_delay_ns = int(get("fault_nfe_delay_ms") * MS)
        return pending is not None

    def switch(self, new: Serving, active: bool) -> None:
        """The swap's one atomic point: `new` admits from the next request on (its lanes
        reserved until the old model's drain bound, its workers held until the old one is
        idle); the old one finishes what it admitted, then is released."""
        old = self.serving
        now = time.monotonic_ns()
        bound = old.core.drain_bound(now)
        new.core.reserve_lanes_until(bound if bound > now else 0)
        new.core.set_accepting(active)
        self._draining.append(old)
        self._route(new)
        self.host.logger.info(f"model swapped: now serving {new.model_path} "
                              f"({new.policy.digest})")
        threading.Thread(target=self._finish_swap, args=(old, new),
                         name="flowedge-swap", daemon=True).start()

    @property
    def swap_draining(self) -> bool:
        """A swap's old model is still finishing what it admitted."""
        return bool(self._draining)

    def _finish_swap(self, old: Serving, new: Serving) -> None:
        self.wait_idle(old)
        new.core.hold_dispatch(False)
        new.core.reserve_lanes_until(0)
        if not self.stopping.is_set():
            self._retire(old)
            self._draining.remove(old)

    # -- the rclpy intake (request thread only) ------------------------------------------------

    def on_request(self, msg) -> None:
        """One InferenceRequest through the Python intake: validate, convert clocks, hand to the
        C core. No model work, no blocking.

        A discard is one validation pass, one counter and one integer compare (no log call,
        no allocation), so invalid input costs less than deciding a valid request
        (`flowedge_relay_bench intake` measures both).
        """
        while self.pause_intake.is_set() and not self.stopping.is_set():
            time.sleep(0.01)  # drills and tests: the request thread is held
        now_mono = time.monotonic_ns()
        serving = self.serving  # one reference: a swap switches between two requests
        reason, decision = serving.python_intake.decide(msg, now_mono)
        if reason is not None:
            if reason is Reason.CORE_REFUSED:
                if self._refused_log.ready(now_mono):
                    self.host.logger.error(
                        f"the core refused a validated request "
                        f"({serving.python_intake.last_refusal!r}): validation misses a case")
            elif self._discard_log.ready(now_mono):
                self._log_discard(reason.value)
            return
        if decision == Decision.ACCEPTED and serving.yield_after_accept:
            # Hand the GIL to a Python-loop worker waking for this request now, instead of after
            # the rest of the executor's Python bookkeeping (~0.4 ms here): sleep(0) releases it.
            time.sleep(0)

    def handle_serialized(self, cdr: bytes) -> None:
        """One request's CDR bytes through the C intake (native only; not while it runs)."""
        self.serving.native_intake.decide(cdr, time.monotonic_ns(), time.time_ns())

    def count_lost(self, count: int) -> None:
        """Requests the middleware reported lost (MESSAGE_LOST), from its one handler."""
        self.middleware_lost += count

    def _log_discard(self, reason: str, suppressed: int | None = None) -> None:
        if suppressed is None:
            suppressed, self._discard_log.suppressed = self._discard_log.suppressed, 0
        more = f" (+{suppressed} more since the last such line)" if suppressed else ""
        self.host.logger.warning(
            f"discarding invalid request ({reason}){more}; counts in /diagnostics")

    def _log_native_discards(self, now_mono: int) -> None:
        """The native intake counts discards in C; log them here, as rate-limited as the rclpy
        intake's line."""
        counts = self.counters().discarded
        total = sum(counts.values())
        new = total - self._native_logged
        if new <= 0 or not self._discard_log.ready(now_mono):
            return
        self._native_logged = total
        refused = counts[Reason.CORE_REFUSED.value]
        if refused > self._native_refused_logged:
            self._native_refused_logged = refused
            self.host.logger.error("the core refused a validated request: validation misses a case")
        self._log_discard(max(counts, key=counts.get), suppressed=new - 1)

    # -- health, counters, snapshot ------------------------------------------------------------

    def poll_health(self, now: int) -> None:
        """Log what the C intake discarded; read which worker lanes died or stalled."""
        if self.loop is not None:
            self._log_native_discards(now)
        pool = self.serving.pool
        if pool is None:
            self.dead_lanes, self.stalled_lanes = [], []
            return
        health = pool.poll_health(now)
        self.dead_lanes = sorted(health.dead)
        self.stalled_lanes = sorted(health.stalled)

    @staticmethod
    def _intake_counts(s: Serving) -> dict:
        """What one serving's intakes counted (both: only one takes from the subscriptions)."""
        discarded = {r.value: c for r, c in s.validator.discarded.items()}
        received, deadlines = s.python_intake.received, s.python_intake.deadlines_seen
        if s.native_intake is not None:
            for key, count in s.native_intake.discarded().items():
                discarded[key] += count
            received += s.native_intake.received
            deadlines += s.native_intake.deadlines_seen
        return {"received": received, "deadlines_seen": deadlines, "discarded": discarded}

    def counters(self) -> IntakeCounters:
        """The intake counters since start (a swap's old model and cleaned-up ones included)."""
        now = self._intake_counts(self.serving)
        base = self._retired_intake
        discarded = {k: v + base["discarded"].get(k, 0) for k, v in now["discarded"].items()}
        return IntakeCounters(
            received=now["received"] + base["received"],
            deadlines_seen=now["deadlines_seen"] + base["deadlines_seen"],
            middleware_lost=self.middleware_lost,
            middleware_lost_reported=self.lost_reported,
            discarded=discarded,
        )

    def stats(self) -> Stats:
        """The core's counters since start (retired cores' included) and the serving gauges."""
        return plus(self.serving.core.stats(), self._retired_stats)

    def threads_alive(self) -> dict[str, bool]:
        """Whether the publisher thread and each worker (by lane) of the served model run."""
        s = self.serving
        alive = {"publisher": s.publisher_alive}
        for info in s.pool.worker_info() if s.pool else []:
            alive[f"worker{info['lane']}"] = bool(info["alive"])
        return alive

    def served(self) -> tuple[tuple[str, ...], int]:
        """(digests served, queue depth) for a pool announcement, read under `core_use`."""
        with self.core_use:
            s = self.serving
            depth = 0 if self._closed or s is None else s.core.stats().queue_depth
            return ((s.policy.digest,) if s and s.policy else ()), depth

    def snapshot(self, window: str = "external", lifecycle: tuple[int, str] = (0, ""),
                 pool: dict | None = None) -> Snapshot:
        """Everything diagnostics and stats report; `window` names whose utilisation period,
        `lifecycle` the node's state and `pool` the relay pool's status."""
        now = time.monotonic_ns()
        s, p = self.serving, self.p
        stats = self.stats()
        intake = self.counters()
        workers = s.pool
        p50, p99, samples = workers.nfe_percentiles() if workers else (0.0, 0.0, 0)
        # a worker's pauses (design.md §5.3) hold its lanes: busy time, as the NFEs are
        busy = stats.busy_ns + (workers.inflight_ns(now) + workers.ceded_ns() if workers else 0)
        meter = self._util_windows.setdefault(window, BusyWindow())
        utilisation = meter.update(now, busy, stats.lanes_alive)
        lat50, lat99 = p50_p99(s.output.latencies_ms())
        two_phase = s.policy is not None and s.policy.two_phase
        pre50, pre99, pre_n = (workers.prefix_percentiles() if workers and two_phase
                               else (0.0, 0.0, 0))
        batch = workers.batch_stats() if workers else {}
        # /proc read back: for the 1 Hz diagnostics and tools, not the 10 Hz stats
        realtime, refused = self.host.thread_roles.report() if window != "stats" else ({}, [])
        return Snapshot(
            now_ns=now, received=intake.received, deadlines_seen=intake.deadlines_seen,
            middleware_lost=intake.middleware_lost,
            middleware_lost_reported=intake.middleware_lost_reported,
            discarded=intake.discarded, core=stats, nfe_ns=p["nfe_ns"],
            admission_reserve_ns=p["admission_reserve_ns"],
            nfe_p50_ns=p50, nfe_p99_ns=p99, nfe_samples=samples, workers=p["workers"],
            dead_lanes=self.dead_lanes, stalled_lanes=self.stalled_lanes,
            model_ok=s.model is not None, model_error=s.model_error, model_path=s.model_path,
            model_digest=s.model.digest if s.model else "",
            latency_p50_ms=lat50, latency_p99_ms=lat99, utilisation=utilisation,
            cost=s.core.cost_stats(now), model=s.model_values, two_phase=two_phase,
            prefix_ns=p["prefix_ns"], prefix_p50_ns=pre50, prefix_p99_ns=pre99,
            prefix_samples=pre_n, extra=self.loop_values(), batch_slots=p["batch_slots"],
            slots_in_use=list(batch.get("slots_in_use", [])),
            mean_rows_per_step=float(batch.get("mean_rows_per_step", 0.0)),
            step_ns_by_rows=dict(batch.get("step_ns_by_rows", {})),
            realtime=realtime, realtime_refused=refused,
            lifecycle_id=lifecycle[0], lifecycle_label=lifecycle[1],
            fair_share=bool(p["fair_share"]),
            clients=s.core.clients_snapshot() if p["fair_share"] else [],
            pool=pool or {},
        )

    def open_snapshot(self, window: str, lifecycle: Callable[[], tuple[int, str]],
                      pool: Callable[[], dict] | None = None) -> Snapshot | None:
        """snapshot() for a timer: None once close() began (a timer that fired while the node
        was being destroyed), never a closed core mid-read. `lifecycle` and `pool` are read
        only while the relay is open, as the node's state machine is destroyed after it."""
        with self.core_use:
            if self._closed:
                return None
            return self.snapshot(window, lifecycle(), pool() if pool else None)

    def loop_values(self) -> dict[str, object]:
        """Which NFE loop the workers run, which loops publish and take requests (native /
        python), and why a python one does: the workers status on /diagnostics."""
        s = self.serving
        infos = s.pool.worker_info() if s.pool else []
        loops = sorted({str(i["nfe_loop"]) for i in infos if i["nfe_loop"]})
        notes = sorted({str(i["nfe_loop_note"]) for i in infos if i["nfe_loop_note"]})
        values: dict[str, object] = {"nfe_loop": ",".join(loops) or "none"}
        if notes:
            values["nfe_loop_note"] = "; ".join(notes)
        values["publisher_loop"] = s.output.loop
        values["intake_loop"] = self.intake_loop
        if self.intake_note:
            values["intake_loop_note"] = self.intake_note
        if s.output.note:
            values["publisher_loop_note"] = s.output.note
        if s.output.failed:
            values["publish_failures"] = s.output.failed
        return values

    # -- what tools read (drill, stress, bench, tests) -----------------------------------------

    core = property(lambda self: self.serving.core)
    pool = property(lambda self: self.serving.pool)  # the workers (workers.WorkerPool) or None
    model = property(lambda self: self.serving.model)
    validator = property(lambda self: self.serving.validator)
    model_error = property(lambda self: self.serving.model_error)

    def _drill_only(self, what: str) -> None:
        if not self.host.drill:
            raise DrillOnly(f"{what} exists only on a relay started for a drill "
                            "(flowedge-relayd --drill, RelayNode(drill=True))")

    @property
    def fault_pause_intake(self) -> IntakePause:
        """DRILLS ONLY: while set, the intake takes no request."""
        self._drill_only("fault_pause_intake")
        return self.pause_intake

    @property
    def fault_pause_output(self) -> OutputPause:
        """DRILLS ONLY: while set, the publisher thread stops draining the outcome rings, as if
        the action consumer stopped (docs/design.md §8: full rings drop and count)."""
        self._drill_only("fault_pause_output")
        return self.serving.output.pause

    def inject_worker_crash(self, lane: int) -> None:
        """DRILLS ONLY: worker `lane` of the served model raises at its next step boundary."""
        self._drill_only("inject_worker_crash")
        self.serving.pool.inject_worker_crash(lane)

    # -- teardown ------------------------------------------------------------------------------

    def _all(self) -> list[Serving]:
        return [*self._draining, *filter(None, [self._pending, self.serving])]

    def stop(self) -> None:
        """Stop every serving's workers and flush its outputs (admitted work it will not finish
        is answered EXPIRED); every thread joined. Call after the intake stopped. Idempotent."""
        self.stopping.set()
        if self._stopped:
            return
        self._stopped = True
        for s in self._all():
            s.stop()

    def close(self) -> None:
        """Release every core (after stop: nothing may run on them). Idempotent."""
        with self.core_use:  # after a timer that is reading the core, before the next
            self._closed = True
            for s in self._all():
                s.close()
