"""The relay node `flowedge_relay`: ROS 2 in and out, the C core and the workers in between.

A request travels top to bottom through this file:

    flowedge/requests --(intake thread: intake.py, in C)--> validate -> Core.submit
        -> EDF queue -> worker threads (workers.py): dispatch, one NFE at a time
        -> outcome rings -> publisher thread (publisher.py, in C) -> flowedge/actions

Threads: the intake thread takes, checks and submits requests (in C, without the GIL; where that
cannot run, a request executor spins only the request callback group: _on_request); the main
executor runs timers and parameter services; W workers run the model; one publisher thread
drains the outcome rings. See docs/design.md §4-9 and docs/core-api.md.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from diagnostic_msgs.msg import DiagnosticArray
from flowedge_relay_msgs.msg import ActionMessage, InferenceRequest, RelayStats
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.event_handler import SubscriptionEventCallbacks, UnsupportedEventTypeError
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.serialization import serialize_message

from flowedge_relay import parameters
from flowedge_relay import policy as policy_mod
from flowedge_relay.core import AgeGate, Core, CoreConfig, CostModel, Decision, NotSupported
from flowedge_relay.diagnostics import (
    DiagnosticsBuilder,
    Snapshot,
    model_description,
    stats_message,
)
from flowedge_relay.executors import MainExecutor, RequestExecutor, spin_until, take_waiting
from flowedge_relay.intake import (
    IntakePause,
    IntakeUnavailable,
    NativeIntake,
    PythonIntake,
    RclUnavailable,
)
from flowedge_relay.model import ModelError, ModelInfo, default_model_path
from flowedge_relay.publisher import ActionPublisher
from flowedge_relay.realtime import ThreadRoles, ThreadSettings
from flowedge_relay.validation import ModelContract, Reason, Validator
from flowedge_relay.workers import SlotInputs, WorkerPool, p50_p99

NODE_NAME = "flowedge_relay"
ACTIONS_TOPIC = "flowedge/actions"
STATS_TOPIC = "flowedge/stats"
DIAGNOSTICS_TOPIC = "/diagnostics"
MS = 1_000_000
DISCARD_LOG_PERIOD_NS = 5_000_000_000  # at most one "discarding invalid request" line per 5 s
# Requests taken straight from a subscription per executor wake-up. One trip through rclpy's
# executor (wait set, task, dispatch) costs ~250 us here, 10-100x the callback itself, so the
# request thread drains what is already waiting; bounded so QoS events and stop stay prompt.
REQUEST_DRAIN_MAX = 64


@dataclass(frozen=True)
class IntakeCounters:
    """What arrived on the request topics, as RelayNode.counters() reads it."""

    received: int  # messages the request callback saw
    deadlines_seen: int  # of those, valid ones that carried a deadline
    middleware_lost: int  # reported lost by the middleware before the callback (MESSAGE_LOST)
    middleware_lost_reported: bool  # False where the RMW cannot report such loss
    discarded: dict[str, int]  # invalid input, by reason key


def _reliable(depth: int) -> QoSProfile:
    return QoSProfile(
        depth=depth, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE
    )


def _request_qos(history: str, depth: int) -> QoSProfile:
    """keep_all: a reader that falls behind keeps every unread request (Fast DDS holds up to
    its resource limit, 5000 samples by default) and withholds acknowledgements, so a
    reliable writer either waits or drops on its side, which Fast DDS reports to this reader
    as MESSAGE_LOST. keep_last: the oldest unread request is overwritten, and nothing reports
    it (measured: README "Robustness")."""
    if history == "keep_all":
        return QoSProfile(
            depth=depth, history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE
        )
    return _reliable(depth)


class _Throttle:
    """Lets a log line through at most once per period, for one integer compare otherwise.

    rclpy's `throttle_duration_sec` walks the caller's stack frames (and realpath()s their
    files) *before* it decides to drop the line: about 300 us per call here, more than
    deciding a valid request. A flood of invalid input must not pay that per message.
    """

    __slots__ = ("period_ns", "next_ns", "suppressed")

    def __init__(self, period_ns: int) -> None:
        self.period_ns = period_ns
        self.next_ns = 0
        self.suppressed = 0

    def ready(self, now_ns: int) -> bool:
        if now_ns < self.next_ns:
            self.suppressed += 1
            return False
        self.next_ns = now_ns + self.period_ns
        return True


class _BusyWindow:
    """Lane utilisation since the previous call: busy lane-time over elapsed x alive lanes."""

    def __init__(self) -> None:
        self.then = time.monotonic_ns()
        self.busy_then = 0

    def update(self, now: int, busy_ns: int, lanes: int) -> float:
        elapsed = (now - self.then) * max(lanes, 1)
        value = min(max(busy_ns - self.busy_then, 0) / elapsed, 1.0) if elapsed > 0 else 0.0
        self.then, self.busy_then = now, busy_ns
        return value


def _cost_fields(p: dict) -> dict[str, int]:
    """The cost-model parameters (docs/design.md §5.2) as the core's config fields."""
    return {
        "cost_model": CostModel[p["cost_model"].upper()],
        "cost_window_ns": p["cost_window_ms"] * MS,
        "cost_quantile_ppm": round(p["cost_quantile"] * 1_000_000),
    }


class RelayNode(Node):
    """Deadline-aware EDF inference relay (docs/design.md)."""

    # Defaults that let stop()/destroy_node() run whatever point __init__ reached.
    core: Core | None = None
    pool: WorkerPool | None = None
    _stopped = False
    _core_closed = False
    _request_thread: threading.Thread | None = None
    _publisher_thread: threading.Thread | None = None
    _output: ActionPublisher | None = None

    def __init__(self, **kwargs) -> None:
        # the timers read the core; destroy_node closes it: one holds this while the other runs
        self._core_use = threading.Lock()
        self._intake_stop = threading.Event()  # stops the request thread (first)
        super().__init__(NODE_NAME, **kwargs)
        p = parameters.declare_all(self)
        for name in ("solver", "nfe_loop", "publisher_loop", "intake_loop", "age_gate",
                     "request_topics", "request_qos_history", "cost_model", "execution_providers",
                     *parameters.CPU_AFFINITIES):
            problem = parameters.check_value(name, p[name])
            if problem:
                raise ValueError(problem)
        self._p = p
        # Real-time deployment (docs/robot-computer.md): each thread on the request path applies
        # its settings under its role; what the OS holds is read back for the workers status.
        self.thread_roles = ThreadRoles()
        if p["lock_memory"]:
            self.thread_roles.lock_memory(self.get_logger().warning)
        # Thread ownership of the node's shared fields (the C side's are in fer_internal.h).
        # Written only by the request thread (the rclpy intake's callback): the Python intake's
        # counters, the throttles and validator.discarded; the native intake's counters by the
        # intake thread (fer_intake.h). _middleware_lost by the request group's MESSAGE_LOST
        # handler. Written only by the publisher thread: the latency window (publisher.py). Any
        # other thread (timers, tools through counters()) only reads them: each is a Python int,
        # one float slot replaced whole under the GIL or one aligned C word, so a reader sees a
        # value that was current, never a torn one (diagnostics are 1 Hz reports).
        self._middleware_lost = 0  # requests the middleware reported lost before the callback
        self._lost_reported = True  # False where the RMW cannot report MESSAGE_LOST
        self._discard_log = _Throttle(DISCARD_LOG_PERIOD_NS)
        self._refused_log = _Throttle(DISCARD_LOG_PERIOD_NS)

        # Model: a failure is an ERROR diagnostic, not a crash loop; requests are then discarded
        # as model_unavailable and the node stays up to say why. `policy` describes what is
        # served (a single .onnx file or a policy package, docs/design.md §10); `model` is
        # what the rest of the relay reads dims from (ModelInfo for a single file, else the
        # Policy, which has the same names).
        self.model_path = p["model_path"] or default_model_path()
        self.execution_providers = tuple(p["execution_providers"])
        self.policy: policy_mod.Policy | None = None
        self.model: ModelInfo | policy_mod.Policy | None = None
        self.model_error = ""
        try:
            policy_mod.check_providers(self.execution_providers)
            self.policy = policy_mod.load(self.model_path)
            self.model = _model_of(self.policy)
        except ModelError as exc:  # policy.ProviderUnavailable is one too
            self.policy, self.model_error = None, str(exc)
            self.get_logger().error(f"model failed to load: {exc}")
        package = self.policy is not None and self.policy.kind != "onnx"
        two_phase = package and self.policy.two_phase
        payload_bytes = policy_mod.payload_layout(self.policy).nbytes if package else 0
        # Two-phase / payload fields only where they are used: a single .onnx file configures
        # the core exactly as before.
        package_fields = (
            {"two_phase": int(two_phase), "payload_bytes": payload_bytes} if package else {}
        )

        self.core = Core(
            CoreConfig(
                workers=p["workers"],
                batch_slots=p["batch_slots"],
                queue_capacity=p["queue_capacity"],
                max_sessions=p["max_sessions"],
                max_nfe=p["max_nfe"],
                obs_dim=self.model.obs_dim if self.model else 1,
                action_len=self.model.action_len if self.model else 1,
                ring_capacity=p["output_ring_capacity"],
                nfe_ns=p["nfe_ns"],
                admission_reserve_ns=p["admission_reserve_ns"],
                prefix_ns=p["prefix_ns"],
                reject_if_retry_count_gte=p["reject_if_retry_count_gte"],
                age_gate=AgeGate[p["age_gate"].upper()],
                reject_if_queue_age_ns_gte=p["reject_if_queue_age_ms_gte"] * MS,
                queue_timeout_ns=p["queue_timeout_ms"] * MS,
                session_idle_ns=p["session_idle_ms"] * MS,
                **_cost_fields(p),
                **package_fields,
            )
        )
        # A package's request tensors go straight into the core's staging slot (one copy).
        self.slot_inputs = None
        if package:
            self.slot_inputs = SlotInputs(self.policy, self.core.payload_view)
            self.slot_inputs.prepare(range(self.core.slots))  # views + OrtValues, once per slot
        contract = ModelContract.of(self.policy) if self.policy is not None else None
        self.validator = Validator(
            contract, p["max_nfe"],
            intake_target=self._staging_inputs if package else None,
            max_request_bytes=p["max_request_bytes"],
        )
        self._python_intake = PythonIntake(self.core, self.validator,
                                           lambda: self.get_clock().now().nanoseconds)
        self._native_intake, self.intake_note = self._make_native_intake(contract)
        self._native_discards_logged = 0
        self._native_refused_logged = 0
        self.pool = None
        self._yield_after_accept = False
        if self.model is not None:
            self.pool = WorkerPool(
                self.core,
                self.policy if package else self.model,
                workers=p["workers"],
                intra_op_threads=p["intra_op_threads"],
                solver=p["solver"],
                execution_providers=self.execution_providers,
                slot_inputs=self.slot_inputs,
                cpu_affinity=p["worker_cpu_affinity"],
                rt_priority=p["worker_rt_priority"],
                output_wait_ns=p["action_output_wait_ms"] * MS,
                stall_ns=p["worker_stall_ms"] * MS,
                fault_nfe_delay_ns=int(p["fault_nfe_delay_ms"] * MS),
                nfe_loop=p["nfe_loop"],
                logger=self.get_logger(),
                thread_roles=self.thread_roles,
            )
            self.pool.start()
            # A worker on the Python loop needs the GIL to take an accepted request (a native
            # one serves it in C): only then does the request thread hand it over at once.
            self._yield_after_accept = any(
                info["nfe_loop"] == "python" for info in self.pool.worker_info())
        else:
            # No model, no workers: the lanes are gone, so calibrated admission cannot promise.
            for lane in range(self.core.lanes):
                self.core.disable_lane(lane, time.monotonic_ns())

        # Callback groups. request_group protects the core's single submit producer (ring 0):
        # only the request executor thread runs it. Everything else (timers, parameter services)
        # is in the default group on the main executor.
        self.request_group = MutuallyExclusiveCallbackGroup()
        request_qos = _request_qos(p["request_qos_history"], p["request_qos_depth"])
        self._request_subs = [
            self._subscribe_requests(topic, request_qos) for topic in p["request_topics"]
        ]
        if self._native_intake is not None and not self._native_callback_supported():
            self._native_intake = None
        #: DRILLS AND TESTS ONLY: while set, the intake takes no request (intake.IntakePause).
        self.fault_pause_intake = IntakePause(self._native_intake)
        self._actions_pub = self.create_publisher(
            ActionMessage, ACTIONS_TOPIC, _reliable(p["action_qos_depth"])
        )
        self._stats_pub = self.create_publisher(RelayStats, STATS_TOPIC, 10)
        self._diag_pub = self.create_publisher(DiagnosticArray, DIAGNOSTICS_TOPIC, 10)
        self._diagnostics = DiagnosticsBuilder(self.get_fully_qualified_name().lstrip("/"))
        self._model_values = (
            model_description(self.policy, self.execution_providers)
            if self.policy is not None else {}
        )
        self._dead_lanes: list[int] = []
        self._stalled_lanes: list[int] = []
        # one utilisation window per consumer, so the 10 Hz stats and 1 Hz diagnostics each
        # report their own period
        self._util_windows = {"stats": _BusyWindow(), "diagnostics": _BusyWindow()}
        self.create_timer(1.0, self._publish_diagnostics)
        self.create_timer(1.0 / p["stats_rate_hz"], self._publish_stats)
        self.create_timer(0.1, self._poll_health)
        self.add_on_set_parameters_callback(self._validate_parameters)
        self.add_post_set_parameters_callback(self._apply_parameters)

        self._output = ActionPublisher(self, self.core, self._actions_pub, self.model,
                                       native=p["publisher_loop"] != "python")  # fmt: skip
        #: DRILLS AND TESTS ONLY: while set, the publisher thread stops draining the outcome rings,
        #: as if the action consumer stopped (docs/design.md §8: full rings drop and count).
        self.fault_pause_output = self._output.pause
        self._publisher_thread = threading.Thread(
            target=self._run_publisher, name="flowedge-publisher", daemon=True
        )
        self._publisher_thread.start()
        self._request_thread: threading.Thread | None = None
        if self.policy is not None and package:
            self.get_logger().info(
                f"serving policy package {self.policy.name!r} ({self.policy.kind_text}): inputs "
                f"{self.policy.describe_inputs()}, actions {self.policy.action_horizon} x "
                f"{self.policy.action_dim}, solver {self.policy.solver} (from the manifest), "
                f"providers {list(self.execution_providers)}"
            )
        self.get_logger().info(
            f"relay up: model={self.model_path} workers={p['workers']} "
            f"queue_capacity={p['queue_capacity']} nfe_ns={p['nfe_ns']} "
            f"(admission {'on' if p['nfe_ns'] else 'off'}) topics={list(p['request_topics'])}"
        )

    # -- request path (request executor thread only) -------------------------------------------

    def _subscribe_requests(self, topic: str, qos: QoSProfile):
        """One request subscription, with a MESSAGE_LOST handler where the RMW supports it.

        The handler is in the request group, so the request thread runs it and owns the
        counter. Fast DDS reports samples its reader will never get (a reliable writer dropped
        them unacknowledged, a best-effort gap); it cannot report a KEEP_LAST reader
        overwriting its own unread samples, which is why keep_all is the default.
        """
        subs = []

        def on_message(msg: InferenceRequest) -> None:
            self._on_request(msg)
            self._drain(subs[0])

        events = SubscriptionEventCallbacks(message_lost=self._on_message_lost)
        try:
            sub = self.create_subscription(
                InferenceRequest, topic, on_message, qos,
                callback_group=self.request_group, event_callbacks=events,
            )
        except UnsupportedEventTypeError:
            self._lost_reported = False
            self.get_logger().warning(
                "this RMW cannot report lost messages: middleware_lost stays 0 (SECURITY.md)"
            )
            sub = self.create_subscription(
                InferenceRequest, topic, on_message, qos, callback_group=self.request_group
            )
        subs.append(sub)
        return sub

    def _drain(self, sub) -> None:
        """Hand requests already waiting on `sub` to _on_request without an executor trip each
        (REQUEST_DRAIN_MAX at most). Only the request thread takes from request subscriptions."""
        take_waiting(sub, self._on_request, REQUEST_DRAIN_MAX, self._intake_stop)

    def _on_message_lost(self, info) -> None:
        self._middleware_lost += info.total_count_change

    def _on_request(self, msg: InferenceRequest) -> None:
        """The rclpy intake: validate, convert clocks, hand to the C core. No model work, no
        blocking.

        A discard is one validation pass, one counter and one integer compare (no log call,
        no allocation), so invalid input costs less than deciding a valid request
        (`flowedge_relay_bench intake` measures both).
        """
        while self.fault_pause_intake.is_set() and not self._intake_stop.is_set():
            time.sleep(0.01)  # drills and tests: the request thread is held
        now_mono = time.monotonic_ns()
        reason, decision = self._python_intake.decide(msg, now_mono)
        if reason is not None:
            if reason is Reason.CORE_REFUSED:
                if self._refused_log.ready(now_mono):
                    self.get_logger().error(
                        f"the core refused a validated request "
                        f"({self._python_intake.last_refusal!r}): validation misses a case")
            elif self._discard_log.ready(now_mono):
                self._log_discard(reason.value)
            return
        if decision == Decision.ACCEPTED and self._yield_after_accept:
            # Hand the GIL to a Python-loop worker waking for this request now, instead of after
            # the rest of the executor's Python bookkeeping (~0.4 ms here): sleep(0) releases it.
            time.sleep(0)

    def _staging_inputs(self) -> policy_mod.InputBuffers:
        """Where the validator copies a package request's tensors: the core's staging slot,
        the slot the next submit enqueues (request thread only)."""
        return self.slot_inputs[self.core.staging_slot()]

    def _log_discard(self, reason: str, suppressed: int | None = None) -> None:
        if suppressed is None:
            suppressed, self._discard_log.suppressed = self._discard_log.suppressed, 0
        more = f" (+{suppressed} more since the last such line)" if suppressed else ""
        self.get_logger().warning(
            f"discarding invalid request ({reason}){more}; counts in /diagnostics"
        )

    # -- the native intake -------------------------------------------------------------------

    def _make_native_intake(self, contract) -> tuple[NativeIntake | None, str]:
        """The C intake, or None and why not (the rclpy callback decides then)."""
        if self._p["intake_loop"] == "python":
            return None, "intake_loop: python requested"
        if self.get_parameter("use_sim_time").value:
            return None, "use_sim_time: requests must be judged against the node's clock"
        try:
            NativeIntake.functions()
            return NativeIntake(self.core, contract, self._p["max_nfe"],
                                self._p["max_request_bytes"]), ""
        except (IntakeUnavailable, RclUnavailable) as exc:
            return None, f"not in C: {exc}"

    def _native_callback_supported(self) -> bool:
        """Whether the middleware offers the on-new-message callback the C intake waits on
        (rcl_subscription_set_on_new_message_callback; unset again at once)."""
        try:
            NativeIntake.probe(self._request_subs)
            return True
        except (NotSupported, RclUnavailable) as exc:
            self.intake_note = f"not in C: {exc}"
            return False

    @property
    def intake_loop(self) -> str:
        """Which intake decides requests: native (C) or python (the rclpy callback)."""
        return "native" if self._native_intake is not None else "python"

    def main_executor_exclusions(self) -> tuple[list, list]:
        """(callback groups, entities) the main executor must leave alone: the request group
        for the rclpy intake (its own thread spins it); for the native intake only the request
        subscriptions, whose MESSAGE_LOST handlers the main executor then runs."""
        if self._native_intake is not None:
            return [], list(self._request_subs)
        return [self.request_group], []

    def _log_native_discards(self, now_mono: int) -> None:
        """The native intake counts discards in C; log them here, as rate-limited as the rclpy
        intake's line (main executor)."""
        counts = self._native_intake.discarded()
        total = sum(counts.values())
        new = total - self._native_discards_logged
        if new <= 0 or not self._discard_log.ready(now_mono):
            return
        self._native_discards_logged = total
        refused = counts[Reason.CORE_REFUSED.value]
        if refused > self._native_refused_logged:
            self._native_refused_logged = refused
            self.get_logger().error(
                "the core refused a validated request: validation misses a case")
        reason = max(counts, key=counts.get)
        self._log_discard(reason, suppressed=new - 1)

    def start_request_executor(self, context=None) -> None:
        """Start the request intake's thread: the C intake's loop, or (the rclpy intake) the
        request group spun on a dedicated single-threaded executor."""
        native = self._native_intake
        if native is None:
            executor = RequestExecutor([self], [self.request_group],
                                       context=context or self.context)

        def run() -> None:
            self.thread_roles.apply("request", _thread_settings(self._p, "executor"),
                                    self.get_logger().warning)  # fmt: skip
            if native is None:
                spin_until(executor, self._intake_stop)
                return
            try:
                native.run(self._request_subs)
            except Exception as exc:  # the middleware refused the callback after all: say so
                self.get_logger().error(f"the C request intake stopped: {exc!r}")

        thread = threading.Thread(target=run, name="flowedge-requests", daemon=True)
        thread.start()
        # published only once started: stop() on another thread (a relay torn down as it comes
        # up) joins it, and joining a thread not yet started raises, which skipped the rest of
        # stop() and closed the core under running workers
        self._request_thread = thread

    def _run_publisher(self) -> None:
        """The publisher thread: its real-time settings, then the outcome rings until stop."""
        self.thread_roles.apply("publisher", _thread_settings(self._p, "publisher"),
                                self.get_logger().warning)  # fmt: skip
        self._output.run()

    # -- health, diagnostics and stats (main executor) -----------------------------------------

    def _poll_health(self) -> None:
        now = time.monotonic_ns()
        if self._native_intake is not None:
            self._log_native_discards(now)
        if self.pool is None:
            return
        health = self.pool.poll_health(now)
        self._dead_lanes = sorted(health.dead)
        self._stalled_lanes = sorted(health.stalled)

    def snapshot(self, window: str = "external") -> Snapshot:
        """Everything diagnostics and stats report; `window` names whose utilisation period."""
        now = time.monotonic_ns()
        stats = self.core.stats()
        intake = self.counters()
        p50, p99, samples = self.pool.nfe_percentiles() if self.pool else (0.0, 0.0, 0)
        busy = stats.busy_ns + (self.pool.inflight_ns(now) if self.pool else 0)
        meter = self._util_windows.setdefault(window, _BusyWindow())
        utilisation = meter.update(now, busy, stats.lanes_alive)
        lat50, lat99 = p50_p99(self._output.latencies_ms())
        two_phase = self.policy is not None and self.policy.two_phase
        pre50, pre99, pre_n = (
            self.pool.prefix_percentiles() if self.pool and two_phase else (0.0, 0.0, 0)
        )
        batch = self.pool.batch_stats() if self.pool else {}
        # /proc read back: for the 1 Hz diagnostics and tools, not the 10 Hz stats
        realtime, refused = self.thread_roles.report() if window != "stats" else ({}, [])
        return Snapshot(
            now_ns=now,
            received=intake.received,
            deadlines_seen=intake.deadlines_seen,
            middleware_lost=intake.middleware_lost,
            middleware_lost_reported=intake.middleware_lost_reported,
            discarded=intake.discarded,
            core=stats,
            nfe_ns=self.get_parameter("nfe_ns").value,
            admission_reserve_ns=self.get_parameter("admission_reserve_ns").value,
            nfe_p50_ns=p50,
            nfe_p99_ns=p99,
            nfe_samples=samples,
            workers=self._p["workers"],
            dead_lanes=self._dead_lanes,
            stalled_lanes=self._stalled_lanes,
            model_ok=self.model is not None,
            model_error=self.model_error,
            model_path=self.model_path,
            model_digest=self.model.digest if self.model else "",
            latency_p50_ms=lat50,
            latency_p99_ms=lat99,
            utilisation=utilisation,
            cost=self.core.cost_stats(now),
            model=self._model_values,
            two_phase=two_phase,
            prefix_ns=self._p["prefix_ns"],
            prefix_p50_ns=pre50,
            prefix_p99_ns=pre99,
            prefix_samples=pre_n,
            extra=self._loop_values(),
            batch_slots=self._p["batch_slots"],
            slots_in_use=list(batch.get("slots_in_use", [])),
            mean_rows_per_step=float(batch.get("mean_rows_per_step", 0.0)),
            step_ns_by_rows=dict(batch.get("step_ns_by_rows", {})),
            realtime=realtime,
            realtime_refused=refused,
        )

    def _loop_values(self) -> dict[str, object]:
        """Which NFE loop the workers run and which loop publishes (native / python), and why
        a python one does."""
        infos = self.pool.worker_info() if self.pool else []
        loops = sorted({str(i["nfe_loop"]) for i in infos if i["nfe_loop"]})
        notes = sorted({str(i["nfe_loop_note"]) for i in infos if i["nfe_loop_note"]})
        values: dict[str, object] = {"nfe_loop": ",".join(loops) or "none"}
        if notes:
            values["nfe_loop_note"] = "; ".join(notes)
        values["publisher_loop"] = self._output.loop
        values["intake_loop"] = self.intake_loop
        if self.intake_note:
            values["intake_loop_note"] = self.intake_note
        if self._output.note:
            values["publisher_loop_note"] = self._output.note
        if self._output.failed:
            values["publish_failures"] = self._output.failed
        return values

    def _publish_diagnostics(self) -> None:
        with self._core_use:
            if self._core_closed:  # a timer that fired while the node was being destroyed
                return
            stamp = self.get_clock().now().to_msg()
            self._diag_pub.publish(self._diagnostics.build(self.snapshot("diagnostics"), stamp))

    def _publish_stats(self) -> None:
        with self._core_use:
            if self._core_closed:
                return
            stamp = self.get_clock().now().to_msg()
            snap = self.snapshot("stats")
            self._diagnostics.observe(snap)  # a cost drift between diagnostics is still seen
            self._stats_pub.publish(stats_message(snap, stamp))

    # -- live parameters -----------------------------------------------------------------------

    def _validate_parameters(self, params: list[Parameter]) -> SetParametersResult:
        """Reject values rclpy's ranges cannot express (enums); ranges are enforced by rclpy."""
        for param in params:
            problem = parameters.check_value(param.name, param.value)
            if problem:
                return SetParametersResult(successful=False, reason=problem)
        return SetParametersResult(successful=True)

    def _apply_parameters(self, params: list[Parameter]) -> None:
        """Push accepted live values into the core and workers (cached values follow)."""
        names = {param.name for param in params}
        get = lambda name: self.get_parameter(name).value  # noqa: E731
        if names & {"nfe_ns", "admission_reserve_ns", "prefix_ns"}:
            self.core.set_calibration(get("nfe_ns"), get("admission_reserve_ns"), get("prefix_ns"))
        if names & {"reject_if_retry_count_gte", "age_gate", "reject_if_queue_age_ms_gte",
                    "queue_timeout_ms"}:
            self.core.set_policy(
                get("reject_if_retry_count_gte"),
                AgeGate[get("age_gate").upper()],
                get("reject_if_queue_age_ms_gte") * MS,
                get("queue_timeout_ms") * MS,
            )
        if names & {"cost_model", "cost_window_ms", "cost_quantile"}:
            k = _cost_fields({n: get(n) for n in ("cost_model", "cost_window_ms",
                                                  "cost_quantile")})
            self.core.set_cost_model(k["cost_model"], k["cost_window_ns"],
                                     k["cost_quantile_ppm"])
        if "fault_nfe_delay_ms" in names and self.pool is not None:
            self.pool.fault_nfe_delay_ns = int(get("fault_nfe_delay_ms") * MS)
        for name in names:
            self._p[name] = get(name)

    # -- what tools may read (drill, stress, bench, tests): the node's public surface ----------

    def counters(self) -> IntakeCounters:
        """A snapshot of the intake counters, both intakes summed (only one takes from the
        subscriptions; see the ownership note in __init__)."""
        py, native = self._python_intake, self._native_intake
        discarded = {r.value: c for r, c in self.validator.discarded.items()}
        received, deadlines = py.received, py.deadlines_seen
        if native is not None:
            for key, count in native.discarded().items():
                discarded[key] += count
            received += native.received
            deadlines += native.deadlines_seen
        return IntakeCounters(
            received=received,
            deadlines_seen=deadlines,
            middleware_lost=self._middleware_lost,
            middleware_lost_reported=self._lost_reported,
            discarded=discarded,
        )

    def threads_alive(self) -> dict[str, bool]:
        """Whether each of the relay's own threads is running (workers by lane)."""
        alive = {
            "request": bool(self._request_thread and self._request_thread.is_alive()),
            "publisher": bool(self._publisher_thread and self._publisher_thread.is_alive()),
        }
        for info in self.pool.worker_info() if self.pool else []:
            alive[f"worker{info['lane']}"] = bool(info["alive"])
        return alive

    def handle_request(self, msg: InferenceRequest) -> None:
        """One request through the intake this relay runs, for tools that time it without DDS
        (bench intake): the C intake gets the message's CDR bytes.

        The intake thread is the core's single submit producer: call this only while it is not
        running (before start_request_executor, or after stop()).
        """
        if self._native_intake is None:
            self._on_request(msg)
            return
        self.handle_serialized(serialize_message(msg))

    def handle_serialized(self, cdr: bytes) -> None:
        """One request's CDR bytes through the C intake (as handle_request; native only)."""
        self._native_intake.decide(cdr, time.monotonic_ns(), time.time_ns())

    # -- teardown ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop intake, then workers, then flush outputs; every thread joined. Idempotent.

        Call before shutting the context down. rclpy's context shutdown destroys nodes while
        holding the context lock, and a spinning request thread waits on that same lock, so
        when destroy_node() runs from there the request thread is given only a short join; it
        exits as soon as the context is gone.
        """
        if self._stopped:
            return
        self._stopped = True
        self._intake_stop.set()
        if self._native_intake is not None:
            self._native_intake.stop()
        # nested: whatever fails, every later stage still runs (a later stop() is a no-op, and
        # destroy_node then closes the core: nothing may still be running on it)
        try:
            if self._request_thread is not None:
                self._request_thread.join(timeout=1.0)
        finally:
            try:
                if self.pool is not None:
                    self.pool.stop()
            finally:
                if self._output is not None:
                    self._output.stop()
                if self.core is not None:
                    self.core.shutdown()
                if self._publisher_thread is not None:
                    self._publisher_thread.join(timeout=5.0)

    def destroy_node(self) -> None:
        self.stop()
        with self._core_use:  # after a timer callback that is reading the core, before the next
            self._core_closed = True
            if self.core is not None:
                self.core.close()  # idempotent
        super().destroy_node()


def _thread_settings(p: dict, prefix: str) -> ThreadSettings:
    """A thread role's settings from its `<prefix>_cpu_affinity` / `<prefix>_rt_priority`."""
    return ThreadSettings(tuple(p[f"{prefix}_cpu_affinity"]), p[f"{prefix}_rt_priority"])


def _model_of(p: policy_mod.Policy) -> ModelInfo | policy_mod.Policy:
    """ModelInfo for a single .onnx file (what its path always used), else the Policy."""
    if p.kind != "onnx":
        return p
    return ModelInfo(p.path, p.digest, p.obs_dim, p.action_horizon, p.action.dim,
                     p.graphs["velocity"].data)


def spin_relay(node: RelayNode, extra_nodes=(), context=None,
               stop: threading.Event | None = None) -> None:
    """Spin the relay (and optional co-located nodes) until `stop` is set (cli, run_demo: a
    signal sets it) or the context shuts down (the harness)."""
    node.start_request_executor(context)
    groups, entities = node.main_executor_exclusions()
    executor = MainExecutor(groups, excluded_entities=entities, context=context or node.context)
    executor.add_node(node)
    for extra in extra_nodes:
        executor.add_node(extra)
    try:
        if stop is None:
            executor.spin()
        else:
            ctx = executor.context
            while not stop.is_set() and ctx.ok():
                executor.spin_once(timeout_sec=0.1)
    except ExternalShutdownException:
        pass
    finally:
        executor.shutdown(timeout_sec=2.0)
