# SPDX-License-Identifier: Apache-2.0
"""The relay node `flowedge_relay`: a managed (lifecycle) node, ROS 2 in and out, the C core and
the workers in between.

A request travels top to bottom through this file:

    flowedge/requests --(intake thread: intake.py, in C)--> validate -> Core.submit
        -> EDF queue -> worker threads (workers.py): dispatch, one NFE at a time
        -> outcome rings -> publisher thread (publisher.py, in C) -> flowedge/actions

Threads: the intake thread takes, checks and submits requests (in C, without the GIL; where that
cannot run, a request executor spins only the request callback group: _on_request); the main
executor runs timers, parameter and lifecycle services; W workers run the model; one publisher
thread drains the outcome rings. What serves one model (its core, workers, intakes, publisher) is
a serving.Serving: the lifecycle's configure builds it, cleanup ends it, and a model swap builds
the next one beside it (docs/design.md §9). See docs/design.md §4-9 and docs/core-api.md.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from diagnostic_msgs.msg import DiagnosticArray
from flowedge_relay_msgs.msg import (
    ActionMessage,
    InferenceRequest,
    RelayStats,
    ServedModel,
    Tensor,
)
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.duration import Duration
from rclpy.event_handler import SubscriptionEventCallbacks, UnsupportedEventTypeError
from rclpy.executors import ExternalShutdownException
from rclpy.lifecycle import LifecycleNodeMixin, LifecycleState, TransitionCallbackReturn
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.serialization import serialize_message

from flowedge_relay import parameters
from flowedge_relay.core import AgeGate, Decision, NotSupported, Stats
from flowedge_relay.diagnostics import DiagnosticsBuilder, Snapshot
from flowedge_relay.executors import (
    EventPoll,
    MainExecutor,
    RequestExecutor,
    spin_until,
    take_waiting,
)
from flowedge_relay.intake import IntakeLoop, IntakePause, RclUnavailable
from flowedge_relay.model import ModelError
from flowedge_relay.pool import FINALIZED, UNCONFIGURED, RelayPool, Served
from flowedge_relay.producer import MODEL_TOPIC, model_qos
from flowedge_relay.realtime import ThreadRoles
from flowedge_relay.ros_compat import destroy_lifecycle_node
from flowedge_relay.serving import Serving, cost_fields, load_policy, thread_settings
from flowedge_relay.timebase import UINT64_MAX, ros_time
from flowedge_relay.validation import Reason
from flowedge_relay.workers import DrillOnly, p50_p99

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
# At stop, how long the last answers (EXPIRED for admitted work the stop ends) may take to be
# acknowledged by reliable subscribers before the node, and with it the DDS writer, goes away:
# a writer deleted with answers unacknowledged loses them. Well inside launch's 5 s.
ANSWERS_ACK_WAIT_S = 1.0


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


#: A retired core's gauges are not summed into the relay's totals (the counters are).
_GAUGES = frozenset({"queue_depth", "sessions", "lanes_busy", "lanes_alive",
                     "oldest_queued_arrival_ns", "clients"})
#: How long past a core's drain bound a drain is waited for before it is given up (a stalled
#: worker): the drain bound is the lane simulation's, at the cost in use.
DRAIN_MARGIN_NS = 5_000_000_000
DRAIN_POLL_S = 0.002


def _plus(live: Stats, retired: Stats | None) -> Stats:
    """live's counters plus a retired core's (the totals since start); live's gauges."""
    if retired is None:
        return live
    values = {}
    for name in live.__dataclass_fields__:
        a, b = getattr(live, name), getattr(retired, name)
        if name in _GAUGES:
            values[name] = a
        elif isinstance(a, list):
            values[name] = [x + y for x, y in zip(a, b, strict=True)]
        else:
            values[name] = a + b
    return Stats(**values)


class RelayNode(LifecycleNodeMixin, Node):
    """Deadline-aware EDF inference relay (docs/design.md), a managed (lifecycle) node.

    unconfigured: every request is discarded as model_unavailable (no model); configure loads
    and warms the model (serving.Serving), activate admits, deactivate answers new arrivals
    REJECTED_CAPACITY while admitted work finishes, cleanup releases the model. With
    `autostart` (the default) the node configures and activates itself at start.
    """

    serving: Serving | None = None
    # what stop() and destroy_node() read, also of a node whose __init__ failed (rclpy 9's
    # context shutdown destroys every node it created, half-built ones too)
    _draining: list[Serving] | tuple = ()
    _pending_swap: Serving | None = None
    _stopped = False
    _core_closed = False
    _request_thread: threading.Thread | None = None
    _intake_loop: IntakeLoop | None = None
    #: the relay pool (pool.py; docs/design.md §13), None with `pool` empty
    relay_pool: RelayPool | None = None

    def __init__(self, *, drill: bool = False, **kwargs) -> None:
        #: started for a drill: the fault knobs exist (parameters.DRILL_SPECS, fault_pause_*,
        #: worker crashes); a production relay has none of them
        self.drill = drill
        # the timers read the serving core; a swap's retirement and destroy_node close cores:
        # one holds this while the other runs
        self._core_use = threading.Lock()
        self._intake_stop = threading.Event()  # stops the request thread (first)
        self._swap_lock = threading.Lock()  # one model swap at a time
        #: set by the shutdown transition: the process then exits as on SIGINT (cli)
        self.finalized = threading.Event()
        #: set once the request thread is in its loop: from then on a request is taken as it
        #: arrives (before, it waits in the middleware; the harness waits for this)
        self.taking_requests = threading.Event()
        Node.__init__(self, NODE_NAME, **kwargs)
        # The lifecycle services run in a group of their own, so a deactivate that waits for
        # admitted work to finish holds neither the timers nor the parameter services.
        LifecycleNodeMixin.__init__(self, callback_group=MutuallyExclusiveCallbackGroup())
        p = parameters.declare_all(self, drill)  # the enums checked there
        for name in ("request_topics", "execution_providers", "client_weights", "pool",
                     "pool_spill", *parameters.CPU_AFFINITIES):
            problem = parameters.check_value(name, p[name])
            if problem:
                raise parameters.ParameterError(problem)
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
        # handler. `serving` and the retired totals by the lifecycle and parameter callbacks
        # (the main executor), one reference replaced whole. Written only by the publisher
        # thread: the latency window (publisher.py). Any other thread only reads them: each is
        # a Python int or reference, one float slot replaced whole under the GIL or one aligned
        # C word, so a reader sees a value that was current, never a torn one.
        self._middleware_lost = 0  # requests the middleware reported lost before the callback
        self._lost_reported = True  # False where the RMW cannot report MESSAGE_LOST
        self._discard_log = _Throttle(DISCARD_LOG_PERIOD_NS)
        self._refused_log = _Throttle(DISCARD_LOG_PERIOD_NS)
        self._native_discards_logged = 0
        self._native_refused_logged = 0
        # what retired servings counted (a swap's old model, a cleaned-up one): the totals since
        # start are these plus the serving one's
        self._retired_stats: Stats | None = None
        self._retired_intake = {"received": 0, "deadlines_seen": 0, "discarded": {}}
        self._draining: list[Serving] = []
        self._pending_swap: Serving | None = None

        self.actions_publisher = self.create_publisher(
            ActionMessage, ACTIONS_TOPIC, _reliable(p["action_qos_depth"]))
        self._stats_pub = self.create_publisher(RelayStats, STATS_TOPIC, 10)
        self._diag_pub = self.create_publisher(DiagnosticArray, DIAGNOSTICS_TOPIC, 10)
        # latched: a producer that starts later still learns what is served
        self._model_pub = self.create_publisher(ServedModel, MODEL_TOPIC, model_qos())
        self._diagnostics = DiagnosticsBuilder(self.get_fully_qualified_name().lstrip("/"))

        # The intake: subscriptions for the node's lifetime (an unconfigured relay counts what
        # arrives as model_unavailable). request_group protects the core's single submit
        # producer (ring 0): only the request thread runs it.
        self.request_group = MutuallyExclusiveCallbackGroup()
        request_qos = _request_qos(p["request_qos_history"], p["request_qos_depth"])
        self._request_subs = [
            self._subscribe_requests(topic, request_qos) for topic in p["request_topics"]
        ]
        self._intake_loop, self.intake_note = self._make_intake_loop()
        #: the request subscriptions' MESSAGE_LOST events, taken by _poll_health when the C
        #: intake takes the requests (executors.EventPoll says why no executor waits on them)
        self._lost_events = EventPoll(
            [h for sub in self._request_subs for h in sub.event_handlers], self.context)
        if p["pool"]:
            if self._intake_loop is None:  # the ownership test is in the C intake
                raise parameters.ParameterError(
                    f"pool {p['pool']!r} needs the C request intake, which is off here "
                    f"({self.intake_note})")
            self.relay_pool = RelayPool(self, p, self.pool_served)
            self._intake_loop.set_pool(self.relay_pool.c)
        # set only through fault_pause_intake, which a drill relay alone has
        self._pause_intake = IntakePause(self._intake_loop)

        self._dead_lanes: list[int] = []
        self._stalled_lanes: list[int] = []
        # one utilisation window per consumer, so the 10 Hz stats and 1 Hz diagnostics each
        # report their own period
        self._util_windows = {"stats": _BusyWindow(), "diagnostics": _BusyWindow()}
        timers = MutuallyExclusiveCallbackGroup()
        self.create_timer(1.0, self._publish_diagnostics, callback_group=timers)
        self.create_timer(1.0 / p["stats_rate_hz"], self._publish_stats, callback_group=timers)
        self.create_timer(0.1, self._poll_health, callback_group=timers)
        self.add_pre_set_parameters_callback(self._spell_parameters)
        self.add_on_set_parameters_callback(self._validate_parameters)
        self.add_post_set_parameters_callback(self._apply_parameters)

        self._replace(self._unconfigured(""))
        self._announce()
        self.get_logger().info(
            f"relay up: model={self.model_path} workers={p['workers']} "
            f"queue_capacity={p['queue_capacity']} nfe_ns={p['nfe_ns']} "
            f"(admission {'on' if p['nfe_ns'] else 'off'}) topics={list(p['request_topics'])}"
            + ("" if p["autostart"] else "; autostart off: waiting unconfigured")
        )
        if p["autostart"] and self.trigger_configure() == TransitionCallbackReturn.SUCCESS:
            self.trigger_activate()

    # -- what is served ------------------------------------------------------------------------

    @property
    def core(self):
        return self.serving.core

    @property
    def pool(self):
        return self.serving.pool

    @property
    def model(self):
        return self.serving.model

    @property
    def policy(self):
        return self.serving.policy

    @property
    def validator(self):
        return self.serving.validator

    @property
    def model_path(self) -> str:
        return self.serving.model_path

    @property
    def model_error(self) -> str:
        return self.serving.model_error

    def _drill_only(self, what: str) -> None:
        if not self.drill:
            raise DrillOnly(f"{what} exists only on a relay started for a drill "
                            "(flowedge-relayd --drill, RelayNode(drill=True))")

    @property
    def fault_pause_intake(self) -> IntakePause:
        """DRILLS ONLY: while set, the intake takes no request (intake.IntakePause)."""
        self._drill_only("fault_pause_intake")
        return self._pause_intake

    @property
    def fault_pause_output(self):
        """DRILLS ONLY: while set, the publisher thread stops draining the outcome rings, as if
        the action consumer stopped (docs/design.md §8: full rings drop and count)."""
        self._drill_only("fault_pause_output")
        return self.serving.output.pause

    def inject_worker_crash(self, lane: int) -> None:
        """DRILLS ONLY: worker `lane` of the served model raises at its next step boundary."""
        self._drill_only("inject_worker_crash")
        self.serving.pool.inject_worker_crash(lane)

    @property
    def lifecycle_state(self) -> tuple[int, str]:
        """(lifecycle_msgs/State id, label) of the node now."""
        state_id, label = self._state_machine.current_state
        return int(state_id), str(label)

    def _unconfigured(self, error: str) -> Serving:
        """What an unconfigured relay serves: no model, every request model_unavailable;
        `error` says why configure failed ("" before any configure)."""
        return Serving(self, self._p, None, model_path=self._p["model_path"], model_error=error)

    def _load(self, model_path: str, calibration: dict | None = None,
              hold: bool = False) -> Serving:
        """A Serving of the model at model_path, built, warmed and its threads started, not
        accepting yet; ModelError naming why it cannot be served."""
        policy = load_policy(model_path, self._p["execution_providers"])
        serving = Serving(self, self._p, policy, model_path=model_path, calibration=calibration,
                          accepting=False, hold=hold)
        if self._intake_loop is not None and serving.native_intake is None:
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
        if self._intake_loop is not None:
            self._intake_loop.route(serving.native_intake)

    def _replace(self, new: Serving) -> None:
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
        with self._core_use:
            self._retired_stats = _plus(old.core.stats(), self._retired_stats)
            intake = self._intake_counts(old)
            self._retired_intake["received"] += intake["received"]
            self._retired_intake["deadlines_seen"] += intake["deadlines_seen"]
            for key, count in intake["discarded"].items():
                self._retired_intake["discarded"][key] = (
                    self._retired_intake["discarded"].get(key, 0) + count)
            old.close()

    def _wait_idle(self, serving: Serving) -> bool:
        """Wait until `serving` holds no work, at most DRAIN_MARGIN_NS past its drain bound (the
        first one known: with admission off and nothing measured yet, work without a deadline
        has none until its first NFE is measured)."""
        give_up = None
        while not serving.idle():
            now = time.monotonic_ns()
            if give_up is None:
                bound = serving.core.drain_bound(now)
                give_up = bound + DRAIN_MARGIN_NS if bound < UINT64_MAX else None
            if self._stopped or (give_up is not None and now > give_up):
                self.get_logger().error("admitted work did not drain by its bound; going on")
                return False
            time.sleep(DRAIN_POLL_S)
        return True

    def _announce(self) -> None:
        """What is served now, on the latched flowedge/model (nothing: empty digest)."""
        s = self.serving
        msg = ServedModel(stamp=ros_time(s.started_ns), model_path=s.model_path,
                          nfe_ns=s.p["nfe_ns"], prefix_ns=s.p["prefix_ns"],
                          admission_reserve_ns=s.p["admission_reserve_ns"])
        if s.policy is not None:
            v = s.model_values
            msg.model_digest = s.policy.digest
            msg.model_kind = str(v["model_kind"])
            msg.inputs = [Tensor(name=i.name, dtype=i.code, shape=list(i.shape))
                          for i in s.policy.inputs]
            msg.observation_dim = s.policy.observation_dim
            msg.action_dim = s.policy.action_dim
            msg.action_horizon = s.policy.action_horizon
            msg.solver = str(v["solver"])
            msg.time_convention = str(v["time_convention"])
            msg.execution_providers = list(s.execution_providers)
            msg.rtc_mode = str(v["rtc_mode"])
            msg.rtc_max_delay = int(v["rtc_max_delay"])
        self._model_pub.publish(msg)

    # -- lifecycle transitions (docs/design.md §9) ---------------------------------------------

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Load and check the model, build the core, start and warm the workers. A model that
        cannot be served: FAILURE, still unconfigured, the model status ERROR naming why."""
        try:
            serving = self._load(self._p["model_path"])
        except ModelError as exc:
            self.get_logger().error(f"model failed to load: {exc}")
            self._replace(self._unconfigured(str(exc)))
            return TransitionCallbackReturn.FAILURE
        self._replace(serving)
        self._announce()
        self._log_serving()
        if self.relay_pool is not None:
            self.relay_pool.configured()
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Requests are admitted from now on."""
        self.serving.core.set_accepting(True)
        if self.relay_pool is not None:
            self.relay_pool.activate()  # owns from its announced owning_from
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """New arrivals are answered REJECTED_CAPACITY; admitted work keeps its promise. Returns
        once the core holds no work (bounded by its drain bound). In a pool it first stops owning
        at its announced owning_until, deciding what it owns until then (pool.py)."""
        if self.relay_pool is not None:
            self.relay_pool.drain(lambda: self._stopped)
        self.serving.core.set_accepting(False)
        for draining in list(self._draining):  # a swap's old model first
            self._wait_idle(draining)
        self._wait_idle(self.serving)
        if self.relay_pool is not None:
            self.relay_pool.leave()
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Stop the workers and release the model."""
        self._replace(self._unconfigured(""))
        self._announce()
        if self.relay_pool is not None:
            self.relay_pool.leave(UNCONFIGURED)
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """As cleanup, from any state; then the process exits as on SIGINT (spin_relay)."""
        if self.serving is not None:
            self.serving.core.set_accepting(False)
        result = self.on_cleanup(state)
        self.finalized.set()
        return result

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.get_logger().error(f"lifecycle error in {state.label}: releasing the model")
        return self.on_cleanup(state)

    def _log_serving(self) -> None:
        s = self.serving
        if s.package:
            self.get_logger().info(
                f"serving policy package {s.policy.name!r} ({s.policy.kind_text}): inputs "
                f"{s.policy.describe_inputs()}, actions {s.policy.action_horizon} x "
                f"{s.policy.action_dim}, solver {s.policy.solver} (from the manifest), "
                f"providers {list(s.execution_providers)}"
            )
        self.get_logger().info(f"model configured: {s.model_path} ({s.policy.digest})")

    # -- model swap (docs/design.md §9) --------------------------------------------------------

    def _prepare_swap(self, params: list[Parameter]) -> str | None:
        """A set of model_path while configured: load and warm the new model beside the one that
        serves (its workers held); the reason it cannot be served, or None."""
        names = {param.name: param.value for param in params}
        if not self._swap_lock.acquire(blocking=False):
            return "a model swap is in progress"
        try:
            if self._draining:
                return "the previous model swap is still draining"
            calibration = {k: names[k] for k in ("nfe_ns", "prefix_ns", "admission_reserve_ns")
                           if k in names}
            try:
                self._pending_swap = self._load(names["model_path"], calibration, hold=True)
            except ModelError as exc:
                return f"model_path {names['model_path']!r} cannot be served: {exc}"
            return None
        finally:
            self._swap_lock.release()

    def _switch(self, new: Serving) -> None:
        """The swap's one atomic point: `new` admits from the next request on (its lanes
        reserved until the old model's drain bound, its workers held until the old one is
        idle); the old one finishes what it admitted, then is released."""
        old = self.serving
        now = time.monotonic_ns()
        bound = old.core.drain_bound(now)
        new.core.reserve_lanes_until(bound if bound > now else 0)
        new.core.set_accepting(self.lifecycle_state[1] == "active")
        self._draining.append(old)
        self._route(new)
        self._announce()
        self.get_logger().info(f"model swapped: now serving {new.model_path} ({new.policy.digest})")
        threading.Thread(target=self._finish_swap, args=(old, new),
                         name="flowedge-swap", daemon=True).start()

    def _finish_swap(self, old: Serving, new: Serving) -> None:
        self._wait_idle(old)
        new.core.hold_dispatch(False)
        new.core.reserve_lanes_until(0)
        if not self._stopped:
            self._retire(old)
            self._draining.remove(old)

    # -- request path (request thread only) ----------------------------------------------------

    def _subscribe_requests(self, topic: str, qos: QoSProfile):
        """One request subscription, with a MESSAGE_LOST handler where the RMW supports it.

        The handler is in the request group (the request thread runs it with the rclpy intake;
        with the C intake _poll_health takes its events) and owns the counter. Fast DDS reports
        samples its reader will never get (a reliable writer dropped them unacknowledged, a
        best-effort gap); it cannot report a KEEP_LAST reader overwriting its own unread
        samples, which is why keep_all is the default.
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
        while self._pause_intake.is_set() and not self._intake_stop.is_set():
            time.sleep(0.01)  # drills and tests: the request thread is held
        now_mono = time.monotonic_ns()
        serving = self.serving  # one reference: a swap switches between two requests
        reason, decision = serving.python_intake.decide(msg, now_mono)
        if reason is not None:
            if reason is Reason.CORE_REFUSED:
                if self._refused_log.ready(now_mono):
                    self.get_logger().error(
                        f"the core refused a validated request "
                        f"({serving.python_intake.last_refusal!r}): validation misses a case")
            elif self._discard_log.ready(now_mono):
                self._log_discard(reason.value)
            return
        if decision == Decision.ACCEPTED and serving.yield_after_accept:
            # Hand the GIL to a Python-loop worker waking for this request now, instead of after
            # the rest of the executor's Python bookkeeping (~0.4 ms here): sleep(0) releases it.
            time.sleep(0)

    def _log_discard(self, reason: str, suppressed: int | None = None) -> None:
        if suppressed is None:
            suppressed, self._discard_log.suppressed = self._discard_log.suppressed, 0
        more = f" (+{suppressed} more since the last such line)" if suppressed else ""
        self.get_logger().warning(
            f"discarding invalid request ({reason}){more}; counts in /diagnostics"
        )

    # -- the native intake -----------------------------------------------------------------------

    def _make_intake_loop(self) -> tuple[IntakeLoop | None, str]:
        """The C intake's loop, or None and why not (the rclpy callback decides then)."""
        if self._p["intake_loop"] == "python":
            return None, "intake_loop: python requested"
        if self.get_parameter("use_sim_time").value:
            return None, "use_sim_time: requests must be judged against the node's clock"
        try:
            IntakeLoop.functions()
            IntakeLoop.probe(self._request_subs)
        except (NotSupported, RclUnavailable) as exc:
            return None, f"not in C: {exc}"
        return IntakeLoop(self._p["max_request_bytes"]), ""

    @property
    def intake_loop(self) -> str:
        """Which intake decides requests: native (C) or python (the rclpy callback)."""
        return "native" if self._intake_loop is not None else "python"

    def main_executor_exclusions(self) -> tuple[list, list]:
        """(callback groups, entities) the main executor must leave alone: the request group,
        which the request thread spins (the rclpy intake) or takes from in C (the native
        intake, whose MESSAGE_LOST events _poll_health takes: executors.EventPoll)."""
        return [self.request_group, *([self.relay_pool.group] if self.relay_pool else [])], []

    def _log_native_discards(self, now_mono: int) -> None:
        """The native intake counts discards in C; log them here, as rate-limited as the rclpy
        intake's line (main executor)."""
        counts = self.counters().discarded
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
        loop = self._intake_loop
        if self.relay_pool is not None:
            self.relay_pool.start(context or self.context)
        if loop is None:
            executor = RequestExecutor([self], [self.request_group],
                                       context=context or self.context)

        def run() -> None:
            self.thread_roles.apply("request", thread_settings(self._p, "executor"),
                                    self.get_logger().warning)  # fmt: skip
            self.taking_requests.set()
            if loop is None:
                spin_until(executor, self._intake_stop)
                return
            try:
                loop.run(self._request_subs,
                         answers=[self.relay_pool.answers] if self.relay_pool else ())
            except Exception as exc:  # the middleware refused the callback after all: say so
                self.get_logger().error(f"the C request intake stopped: {exc!r}")

        thread = threading.Thread(target=run, name="flowedge-requests", daemon=True)
        thread.start()
        # published only once started: stop() on another thread (a relay torn down as it comes
        # up) joins it, and joining a thread not yet started raises, which skipped the rest of
        # stop() and closed the core under running workers
        self._request_thread = thread

    # -- health, diagnostics and stats (main executor) -----------------------------------------

    def _poll_health(self) -> None:
        now = time.monotonic_ns()
        if self._intake_loop is not None:
            self._lost_events.poll()
            self._log_native_discards(now)
        pool = self.serving.pool
        if pool is None:
            self._dead_lanes, self._stalled_lanes = [], []
            return
        health = pool.poll_health(now)
        self._dead_lanes = sorted(health.dead)
        self._stalled_lanes = sorted(health.stalled)

    def snapshot(self, window: str = "external") -> Snapshot:
        """Everything diagnostics and stats report; `window` names whose utilisation period."""
        now = time.monotonic_ns()
        s = self.serving
        stats = _plus(s.core.stats(), self._retired_stats)
        intake = self.counters()
        pool = s.pool
        p50, p99, samples = pool.nfe_percentiles() if pool else (0.0, 0.0, 0)
        # a worker's pauses (design.md §5.3) hold its lanes: busy time, as the NFEs are
        busy = stats.busy_ns + (pool.inflight_ns(now) + pool.ceded_ns() if pool else 0)
        meter = self._util_windows.setdefault(window, _BusyWindow())
        utilisation = meter.update(now, busy, stats.lanes_alive)
        lat50, lat99 = p50_p99(s.output.latencies_ms())
        two_phase = s.policy is not None and s.policy.two_phase
        pre50, pre99, pre_n = pool.prefix_percentiles() if pool and two_phase else (0.0, 0.0, 0)
        batch = pool.batch_stats() if pool else {}
        # /proc read back: for the 1 Hz diagnostics and tools, not the 10 Hz stats
        realtime, refused = self.thread_roles.report() if window != "stats" else ({}, [])
        state_id, label = self.lifecycle_state
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
            model_ok=s.model is not None,
            model_error=s.model_error,
            model_path=s.model_path,
            model_digest=s.model.digest if s.model else "",
            latency_p50_ms=lat50,
            latency_p99_ms=lat99,
            utilisation=utilisation,
            cost=s.core.cost_stats(now),
            model=s.model_values,
            two_phase=two_phase,
            prefix_ns=self._p["prefix_ns"],
            prefix_p50_ns=pre50,
            prefix_p99_ns=pre99,
            prefix_samples=pre_n,
            extra=self._loop_values(s),
            batch_slots=self._p["batch_slots"],
            slots_in_use=list(batch.get("slots_in_use", [])),
            mean_rows_per_step=float(batch.get("mean_rows_per_step", 0.0)),
            step_ns_by_rows=dict(batch.get("step_ns_by_rows", {})),
            realtime=realtime,
            realtime_refused=refused,
            lifecycle_id=state_id,
            lifecycle_label=label,
            fair_share=bool(self._p["fair_share"]),
            clients=s.core.clients_snapshot() if self._p["fair_share"] else [],
            pool=self.relay_pool.values() if self.relay_pool else {},
        )

    def pool_served(self) -> Served:
        """What this member announces to its pool (pool.py), read under the core's use lock."""
        with self._core_use:
            s = self.serving
            depth = 0 if self._core_closed or s is None else s.core.stats().queue_depth
            return Served(digests=(s.policy.digest,) if s and s.policy else (),
                          workers=self._p["workers"], nfe_ns=self._p["nfe_ns"],
                          admission_reserve_ns=self._p["admission_reserve_ns"],
                          queue_depth=depth)

    def _loop_values(self, s: Serving) -> dict[str, object]:
        """Which NFE loop the workers run, which loops publish and take requests (native /
        python), and why a python one does."""
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

    def _publish_diagnostics(self) -> None:
        with self._core_use:
            if self._core_closed:  # a timer that fired while the node was being destroyed
                return
            stamp = self.get_clock().now().to_msg()
            self._publish_timed(self._diag_pub,
                                self._diagnostics.build(self.snapshot("diagnostics"), stamp))

    def _publish_stats(self) -> None:
        with self._core_use:
            if self._core_closed:
                return
            stamp = self.get_clock().now().to_msg()
            snap = self.snapshot("stats")
            self._diagnostics.observe(snap)  # a cost drift between diagnostics is still seen
            self._publish_timed(self._stats_pub, self._diagnostics.stats(snap, stamp))

    def _publish_timed(self, publisher, msg) -> None:
        """A timer that fires while the context shuts down (SIGINT, a test's teardown) finds
        the publisher's context gone: that is the end of the period, not an error."""
        try:
            publisher.publish(msg)
        except Exception:
            if self.context.ok():
                raise

    # -- live parameters -----------------------------------------------------------------------

    def _spell_parameters(self, params: list[Parameter]) -> list[Parameter]:
        """`ros2 param set /flowedge_relay age_gate off` sends the bool false (YAML's reading):
        an enum's value goes on as the string it was written as, where one choice reads so."""
        return [Parameter(p.name, value=spelled) if (spelled := parameters.spelled(
            p.name, p.value)) is not p.value else p for p in params]

    def _validate_parameters(self, params: list[Parameter]) -> SetParametersResult:
        """Reject values rclpy's ranges cannot express (enums); ranges are enforced by rclpy. A
        model_path set while configured is a model swap: the new model is loaded and warmed
        here, and the set refused with the loader's message if it cannot be served."""
        for param in params:
            problem = parameters.check_value(param.name, param.value)
            if problem:
                return SetParametersResult(successful=False, reason=problem)
        if any(param.name == "model_path" for param in params) and \
                self.lifecycle_state[1] in ("active", "inactive"):
            problem = self._prepare_swap(params)
            if problem:
                return SetParametersResult(successful=False, reason=problem)
        return SetParametersResult(successful=True)

    def _apply_parameters(self, params: list[Parameter]) -> None:
        """Push accepted live values into the core and workers (cached values follow); switch
        to a model the validation loaded."""
        names = {param.name for param in params}
        get = lambda name: self.get_parameter(name).value  # noqa: E731
        for name in names:
            self._p[name] = get(name)
        pending, self._pending_swap = self._pending_swap, None
        if pending is not None:
            self._switch(pending)  # the new core already has the set's calibration
        core, pool = self.serving.core, self.serving.pool
        if names & {"nfe_ns", "admission_reserve_ns", "prefix_ns"} and pending is None:
            core.set_calibration(get("nfe_ns"), get("admission_reserve_ns"), get("prefix_ns"))
        if names & {"reject_if_retry_count_gte", "age_gate", "reject_if_queue_age_ms_gte",
                    "queue_timeout_ms"}:
            core.set_policy(
                get("reject_if_retry_count_gte"),
                AgeGate[get("age_gate").upper()],
                get("reject_if_queue_age_ms_gte") * MS,
                get("queue_timeout_ms") * MS,
            )
        if names & {"cost_model", "cost_window_ms", "cost_quantile"}:
            k = cost_fields({n: get(n) for n in ("cost_model", "cost_window_ms",
                                                 "cost_quantile")})
            core.set_cost_model(k["cost_model"], k["cost_window_ns"], k["cost_quantile_ppm"])
        if names & {"fair_share", "client_weights"}:
            self.serving.apply_fair_share(self._p)
        if "fault_nfe_delay_ms" in names and pool is not None:
            pool.fault_nfe_delay_ns = int(get("fault_nfe_delay_ms") * MS)
        if "pool_spill" in names and self.relay_pool is not None:
            self.relay_pool.set_spill(get("pool_spill"))

    # -- what tools may read (drill, stress, bench, tests): the node's public surface ----------

    def _intake_counts(self, s: Serving) -> dict:
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
        """A snapshot of the intake counters since start (see the ownership note in __init__)."""
        now = self._intake_counts(self.serving)
        base = self._retired_intake
        discarded = {k: v + base["discarded"].get(k, 0) for k, v in now["discarded"].items()}
        return IntakeCounters(
            received=now["received"] + base["received"],
            deadlines_seen=now["deadlines_seen"] + base["deadlines_seen"],
            middleware_lost=self._middleware_lost,
            middleware_lost_reported=self._lost_reported,
            discarded=discarded,
        )

    def threads_alive(self) -> dict[str, bool]:
        """Whether each of the relay's own threads is running (workers by lane)."""
        s = self.serving
        alive = {
            "request": bool(self._request_thread and self._request_thread.is_alive()),
            "publisher": s.publisher_alive,
        }
        for info in s.pool.worker_info() if s.pool else []:
            alive[f"worker{info['lane']}"] = bool(info["alive"])
        return alive

    def handle_request(self, msg: InferenceRequest) -> None:
        """One request through the intake this relay runs, for tools that time it without DDS
        (bench intake): the C intake gets the message's CDR bytes.

        The intake thread is the core's single submit producer: call this only while it is not
        running (before start_request_executor, or after stop()).
        """
        if self._intake_loop is None:
            self._on_request(msg)
            return
        self.handle_serialized(serialize_message(msg))

    def handle_serialized(self, cdr: bytes) -> None:
        """One request's CDR bytes through the C intake (as handle_request; native only)."""
        self.serving.native_intake.decide(cdr, time.monotonic_ns(), time.time_ns())

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
        if self._intake_loop is not None:
            self._intake_loop.stop()
        # nested: whatever fails, every later stage still runs (a later stop() is a no-op, and
        # destroy_node then closes the cores: nothing may still be running on them)
        try:
            if self._request_thread is not None:
                self._request_thread.join(timeout=1.0)
        finally:
            try:
                for s in [*self._draining, *filter(None, [self._pending_swap, self.serving])]:
                    s.stop()
            finally:
                self._wait_answers_acked()
                if self.relay_pool is not None:  # what it never took is taken over now
                    self.relay_pool.leave(FINALIZED)

    def _wait_answers_acked(self) -> None:
        try:
            self.actions_publisher.wait_for_all_acked(Duration(seconds=ANSWERS_ACK_WAIT_S))
        except Exception as exc:  # the context already gone (the harness): nothing to wait for
            self.get_logger().debug(f"answers not waited for at stop: {exc}")

    def destroy_node(self) -> None:
        self.stop()
        with self._core_use:  # after a timer callback that is reading the core, before the next
            self._core_closed = True
            for s in [*self._draining, *filter(None, [self._pending_swap, self.serving])]:
                s.close()  # idempotent
        if self.relay_pool is not None:  # the loop and publishers that used it have stopped
            self.relay_pool.close()
        destroy_lifecycle_node(self)  # the node and its lifecycle state machine


def spin_relay(node: RelayNode, extra_nodes=(), context=None,
               stop: threading.Event | None = None) -> None:
    """Spin the relay (and optional co-located nodes) until `stop` is set (cli, run_demo: a
    signal sets it), the relay is finalized (lifecycle shutdown: the transition's answer still
    goes out, the executor's shutdown waits for it) or the context shuts down (the harness)."""
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
            while not (stop.is_set() or node.finalized.is_set()) and ctx.ok():
                executor.spin_once(timeout_sec=0.1)
    except ExternalShutdownException:
        pass
    finally:
        executor.shutdown(timeout_sec=2.0)
