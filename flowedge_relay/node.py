# SPDX-License-Identifier: Apache-2.0
"""The relay node `flowedge_relay`: a managed (lifecycle) node over a relay.Relay.

Shaped like ros2/demos' lifecycle_talker: the node owns the parameters, the topics, the timers
and the transitions, and each transition calls the Relay, which owns what is served (the C core,
the workers, the publisher thread; relay.py imports no rclpy). A request travels:

    flowedge/requests --(intake thread: intake.py, in C)--> validate -> Core.submit
        -> EDF queue -> worker threads (workers.py): dispatch, one NFE at a time
        -> outcome rings -> publisher thread (publisher.py, in C) -> flowedge/actions

Threads: the intake thread takes, checks and submits requests (in C, without the GIL; where that
cannot run, a request executor spins only the request callback group: Relay.on_request); the main
executor (spin.spin_relay) runs timers, parameter and lifecycle services. Every topic exists for
the node's lifetime, not only while configured: docs/design.md §9 says why for each.
"""

from __future__ import annotations

import threading
import time

from diagnostic_msgs.msg import DiagnosticArray
from flowedge_relay_msgs.msg import ActionMessage, InferenceRequest, RelayStats, ServedModel
from rcl_interfaces.msg import SetParametersResult
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.duration import Duration
from rclpy.lifecycle import LifecycleNodeMixin, LifecycleState, TransitionCallbackReturn
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.serialization import serialize_message

from flowedge_relay import parameters
from flowedge_relay.diagnostics import DiagnosticsBuilder, Snapshot
from flowedge_relay.intake import IntakePause
from flowedge_relay.model_topic import served_model_message
from flowedge_relay.pool import FINALIZED, UNCONFIGURED, RelayPool, Served
from flowedge_relay.producer import ACTIONS_TOPIC, MODEL_TOPIC, model_qos
from flowedge_relay.qos import reliable
from flowedge_relay.realtime import ThreadRoles
from flowedge_relay.relay import Host, IntakeCounters, Relay
from flowedge_relay.request_topics import RequestTopics
from flowedge_relay.ros_compat import destroy_lifecycle_node
from flowedge_relay.serving import thread_settings
from flowedge_relay.spin import spin_relay
from flowedge_relay.workers import DrillOnly

__all__ = ["ACTIONS_TOPIC", "IntakeCounters", "RelayNode", "host_of", "spin_relay"]

NODE_NAME = "flowedge_relay"
STATS_TOPIC = "flowedge/stats"
DIAGNOSTICS_TOPIC = "/diagnostics"
# At stop, how long the last answers (EXPIRED for admitted work the stop ends) may take to be
# acknowledged by reliable subscribers before the node, and with it the DDS writer, goes away:
# a writer deleted with answers unacknowledged loses them. Well inside launch's 5 s.
ANSWERS_ACK_WAIT_S = 1.0
#: set together while configured: a model swap (docs/design.md §9)
SWAP_CALIBRATION = ("nfe_ns", "prefix_ns", "admission_reserve_ns")


def host_of(node: Node, actions, **kw) -> Host:
    """The relay.Host of an rclpy node: its logger and clock, `actions` its flowedge/actions
    publisher (`kw`: drill, thread_roles)."""
    return Host(node.get_logger(), lambda: node.get_clock().now().nanoseconds, actions,
                sim_time=bool(node.get_parameter("use_sim_time").value), **kw)


class RelayNode(LifecycleNodeMixin, Node):
    """Deadline-aware EDF inference relay (docs/design.md), a managed (lifecycle) node.

    unconfigured: every request is discarded as model_unavailable (no model); configure loads
    and warms the model, activate admits, deactivate answers new arrivals REJECTED_CAPACITY
    while admitted work finishes, cleanup releases the model. With `autostart` (the default)
    the node configures and activates itself at start.
    """

    # what stop() and destroy_node() read, also of a node whose __init__ failed (rclpy 9's
    # context shutdown destroys every node it created, half-built ones too)
    relay: Relay | None = None
    relay_pool: RelayPool | None = None  #: the relay pool (pool.py; design.md §13) or None
    actions_publisher = None
    _stopped = False

    def __init__(self, *, drill: bool = False, **kwargs) -> None:
        #: started for a drill: the fault knobs exist (parameters.DRILL_SPECS, fault_pause_*,
        #: worker crashes); a production relay has none of them
        self.drill = drill
        #: set by the shutdown transition: the process then exits as on SIGINT (cli)
        self.finalized = threading.Event()
        Node.__init__(self, NODE_NAME, **kwargs)
        # The lifecycle services run in a group of their own, so a deactivate that waits for
        # admitted work to finish holds neither the timers nor the parameter services.
        LifecycleNodeMixin.__init__(self, callback_group=MutuallyExclusiveCallbackGroup())
        self._p = p = parameters.declare_all(self, drill)  # the enums checked there; the
        # Relay keeps these values current (Relay.apply)
        for name in ("request_topics", "execution_providers", "client_weights", "pool",
                     "pool_spill", *parameters.CPU_AFFINITIES):
            if problem := parameters.check_value(name, p[name]):
                raise parameters.ParameterError(problem)
        # Real-time deployment (docs/robot-computer.md): each thread on the request path applies
        # its settings under its role; what the OS holds is read back for the workers status.
        self.thread_roles = ThreadRoles()
        if p["lock_memory"]:
            self.thread_roles.lock_memory(self.get_logger().warning)
        self.actions_publisher = self.create_publisher(
            ActionMessage, ACTIONS_TOPIC, reliable(p["action_qos_depth"]))
        self._stats_pub = self.create_publisher(RelayStats, STATS_TOPIC, 10)
        self._diag_pub = self.create_publisher(DiagnosticArray, DIAGNOSTICS_TOPIC, 10)
        self._model_pub = self.create_publisher(ServedModel, MODEL_TOPIC, model_qos())
        self._diagnostics = DiagnosticsBuilder(self.get_fully_qualified_name().lstrip("/"))
        self.requests = RequestTopics(self, p)
        loop, self.intake_note = self.requests.loop, self.requests.note
        self.request_group = self.requests.group  # the request thread's alone
        #: set once the request thread is in its loop (the harness waits for this)
        self.taking_requests = self.requests.taking
        if p["pool"]:
            if loop is None:  # the ownership test is in the C intake
                raise parameters.ParameterError(
                    f"pool {p['pool']!r} needs the C request intake, which is off here "
                    f"({self.intake_note})")
            self.relay_pool = RelayPool(self, p, self.pool_served)
            loop.set_pool(self.relay_pool.c)
        host = host_of(self, self.actions_publisher, drill=drill, thread_roles=self.thread_roles)
        self.relay = Relay(p, host, loop, self.intake_note,
                           self.relay_pool.c if self.relay_pool else None)
        self.requests.bind(self.relay)
        timers = MutuallyExclusiveCallbackGroup()
        self.create_timer(1.0, self._publish_diagnostics, callback_group=timers)
        self.create_timer(1.0 / p["stats_rate_hz"], self._publish_stats, callback_group=timers)
        self.create_timer(0.1, self._poll_health, callback_group=timers)
        self.add_pre_set_parameters_callback(self._spell_parameters)
        self.add_on_set_parameters_callback(self._validate_parameters)
        self.add_post_set_parameters_callback(self._apply_parameters)
        self._announce()
        self.get_logger().info(
            f"relay up: model={self.model_path} workers={p['workers']} "
            f"queue_capacity={p['queue_capacity']} nfe_ns={p['nfe_ns']} "
            f"(admission {'on' if p['nfe_ns'] else 'off'}) topics={list(p['request_topics'])}"
            + ("" if p["autostart"] else "; autostart off: waiting unconfigured"))
        if p["autostart"] and self.trigger_configure() == TransitionCallbackReturn.SUCCESS:
            self.trigger_activate()

    # -- lifecycle transitions (docs/design.md §9) ---------------------------------------------

    def on_configure(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Load and check the model, build the core, start and warm the workers. A model that
        cannot be served: FAILURE, still unconfigured, the model status ERROR naming why."""
        if self.relay.configure() is not None:
            return TransitionCallbackReturn.FAILURE
        self._announce()
        if self.relay_pool is not None:
            self.relay_pool.configured()
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Requests are admitted from now on."""
        self.relay.set_accepting(True)
        if self.relay_pool is not None:
            self.relay_pool.activate()  # owns from its announced owning_from
        return super().on_activate(state)

    def on_deactivate(self, state: LifecycleState) -> TransitionCallbackReturn:
        """New arrivals are answered REJECTED_CAPACITY; admitted work keeps its promise. Returns
        once the core holds no work (bounded by its drain bound). In a pool it first stops owning
        at its announced owning_until, deciding what it owns until then (pool.py)."""
        if self.relay_pool is not None:
            self.relay_pool.drain(lambda: self._stopped)
        self.relay.set_accepting(False)
        self.relay.drain()
        if self.relay_pool is not None:
            self.relay_pool.leave()
        return super().on_deactivate(state)

    def on_cleanup(self, state: LifecycleState) -> TransitionCallbackReturn:
        """Stop the workers and release the model."""
        self.relay.cleanup()
        self._announce()
        if self.relay_pool is not None:
            self.relay_pool.leave(UNCONFIGURED)
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state: LifecycleState) -> TransitionCallbackReturn:
        """As cleanup, from any state; then the process exits as on SIGINT (spin_relay)."""
        self.relay.set_accepting(False)
        result = self.on_cleanup(state)
        self.finalized.set()
        return result

    def on_error(self, state: LifecycleState) -> TransitionCallbackReturn:
        self.get_logger().error(f"lifecycle error in {state.label}: releasing the model")
        return self.on_cleanup(state)

    @property
    def lifecycle_state(self) -> tuple[int, str]:
        """(lifecycle_msgs/State id, label) of the node now."""
        state_id, label = self._state_machine.current_state
        return int(state_id), str(label)

    def _announce(self) -> None:
        """What is served now, on the latched flowedge/model (nothing: empty digest)."""
        self._model_pub.publish(served_model_message(self.relay.serving))

    # -- live parameters -----------------------------------------------------------------------

    def _spell_parameters(self, params: list[Parameter]) -> list[Parameter]:
        """`ros2 param set /flowedge_relay age_gate off` sends the bool false (YAML's reading):
        an enum's value goes on as the string it was written as, where one choice reads so."""
        return [Parameter(p.name, value=spelled) if (spelled := parameters.spelled(
            p.name, p.value)) is not p.value else p for p in params]

    def _validate_parameters(self, params: list[Parameter]) -> SetParametersResult:
        """Reject values rclpy's ranges cannot express (enums); ranges and read_only are
        enforced by rclpy. A model_path set while configured is a model swap: the new model is
        loaded and warmed here, and the set refused with the loader's message if it cannot be
        served."""
        for param in params:
            if problem := parameters.check_value(param.name, param.value):
                return SetParametersResult(successful=False, reason=problem)
        values = {param.name: param.value for param in params}
        if "model_path" in values and self.lifecycle_state[1] in ("active", "inactive"):
            calibration = {k: values[k] for k in SWAP_CALIBRATION if k in values}
            if problem := self.relay.prepare_swap(values["model_path"], calibration):
                return SetParametersResult(successful=False, reason=problem)
        return SetParametersResult(successful=True)

    def _apply_parameters(self, params: list[Parameter]) -> None:
        """Push accepted live values into the relay; announce a model a swap switched to."""
        values = {param.name: self.get_parameter(param.name).value for param in params}
        if self.relay.apply(values, active=self.lifecycle_state[1] == "active"):
            self._announce()
        if "pool_spill" in values and self.relay_pool is not None:
            self.relay_pool.set_spill(values["pool_spill"])

    # -- the request intake ----------------------------------------------------------------------

    def main_executor_exclusions(self) -> tuple[list, list]:
        """(callback groups, entities) the main executor must leave alone: the request group,
        which the request thread spins (the rclpy intake) or takes from in C (the native
        intake, whose MESSAGE_LOST events _poll_health takes: executors.EventPoll)."""
        return [self.request_group, *([self.relay_pool.group] if self.relay_pool else [])], []

    def start_request_executor(self, context=None) -> None:
        """Start the request intake's thread: the C intake's loop, or (the rclpy intake) the
        request group spun on a dedicated single-threaded executor."""
        if self.relay_pool is not None:
            self.relay_pool.start(context or self.context)
        settings = thread_settings(self.relay.p, "executor")
        self.requests.start(
            context or self.context,
            lambda: self.thread_roles.apply("request", settings, self.get_logger().warning),
            answers=[self.relay_pool.answers] if self.relay_pool else ())

    # -- health, diagnostics and stats (main executor) -----------------------------------------

    def _poll_health(self) -> None:
        self.requests.poll_lost()
        self.relay.poll_health(time.monotonic_ns())

    def _lifecycle(self) -> tuple[int, str]:
        return self.lifecycle_state

    def _pool_values(self) -> dict:
        return self.relay_pool.values() if self.relay_pool else {}

    def _publish_diagnostics(self) -> None:
        if snap := self.relay.open_snapshot("diagnostics", self._lifecycle, self._pool_values):
            stamp = self.get_clock().now().to_msg()
            self._publish_timed(self._diag_pub, self._diagnostics.build(snap, stamp))

    def _publish_stats(self) -> None:
        if snap := self.relay.open_snapshot("stats", self._lifecycle, self._pool_values):
            self._diagnostics.observe(snap)  # a cost drift between diagnostics is still seen
            stamp = self.get_clock().now().to_msg()
            self._publish_timed(self._stats_pub, self._diagnostics.stats(snap, stamp))

    def _publish_timed(self, publisher, msg) -> None:
        """A timer that fires while the context shuts down (SIGINT, a test's teardown) finds
        the publisher's context gone: that is the end of the period, not an error."""
        try:
            publisher.publish(msg)
        except Exception:
            if self.context.ok():
                raise

    def publish_status(self) -> bool:
        """Publish /diagnostics and flowedge/stats now, as their timers do; False once the
        node's relay is closed (destroy_node), when a timer publishes nothing either."""
        self._publish_stats()
        self._publish_diagnostics()
        return not self.relay.closed

    def pool_served(self) -> Served:
        """What this member announces to its pool (pool.py), read under the core's use lock;
        nothing served yet while the node is being built (the membership announces at once)."""
        digests, depth = self.relay.served() if self.relay is not None else ((), 0)
        p = self._p
        return Served(digests=digests, workers=p["workers"], nfe_ns=p["nfe_ns"],
                      admission_reserve_ns=p["admission_reserve_ns"], queue_depth=depth)

    # -- what tools may read (drill, stress, bench, tests): the node's public surface ----------

    serving = property(lambda self: self.relay.serving)
    core = property(lambda self: self.relay.serving.core)
    pool = property(lambda self: self.relay.serving.pool)  # the workers (workers.WorkerPool)
    model = property(lambda self: self.relay.serving.model)
    policy = property(lambda self: self.relay.serving.policy)
    validator = property(lambda self: self.relay.serving.validator)
    model_path = property(lambda self: self.relay.serving.model_path)
    model_error = property(lambda self: self.relay.serving.model_error)
    intake_loop = property(lambda self: self.relay.intake_loop)  # native (C) or python

    def snapshot(self, window: str = "external") -> Snapshot:
        """Everything diagnostics and stats report; `window` names whose utilisation period."""
        return self.relay.snapshot(window, self.lifecycle_state, self._pool_values())

    def counters(self) -> IntakeCounters:
        """The intake counters since start (relay.Relay.counters)."""
        return self.relay.counters()

    def threads_alive(self) -> dict[str, bool]:
        """Whether each of the relay's own threads is running (workers by lane)."""
        return {"request": self.requests.alive, **self.relay.threads_alive()}

    def join_request_thread(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the request thread to end; whether it has (or never ran)."""
        return self.requests.join(timeout)

    def handle_request(self, msg: InferenceRequest) -> None:
        """One request through the intake this relay runs, for tools that time it without DDS
        (bench intake): the C intake gets the message's CDR bytes.

        The intake thread is the core's single submit producer: call this only while it is not
        running (before start_request_executor, or after stop()).
        """
        if self.relay.loop is None:
            self.relay.on_request(msg)
            return
        self.handle_serialized(serialize_message(msg))

    def handle_serialized(self, cdr: bytes) -> None:
        """One request's CDR bytes through the C intake (as handle_request; native only)."""
        self.relay.handle_serialized(cdr)

    def _drill_only(self, what: str) -> None:
        if not self.drill:
            raise DrillOnly(f"{what} exists only on a relay started for a drill "
                            "(flowedge-relayd --drill, RelayNode(drill=True))")

    @property
    def fault_pause_intake(self) -> IntakePause:
        """DRILLS ONLY: while set, the intake takes no request (intake.IntakePause)."""
        self._drill_only("fault_pause_intake")
        return self.relay.pause_intake

    @property
    def fault_pause_output(self):
        """DRILLS ONLY: while set, the publisher thread stops draining the outcome rings, as if
        the action consumer stopped (docs/design.md §8: full rings drop and count)."""
        self._drill_only("fault_pause_output")
        return self.relay.serving.output.pause

    def inject_worker_crash(self, lane: int) -> None:
        """DRILLS ONLY: worker `lane` of the served model raises at its next step boundary."""
        self._drill_only("inject_worker_crash")
        self.relay.serving.pool.inject_worker_crash(lane)

    # -- teardown ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop intake, then workers, then flush outputs; every thread joined. Idempotent.

        Call before shutting the context down. rclpy's context shutdown destroys nodes while
        holding the context lock, and a spinning request thread waits on that same lock, so
        when destroy_node() runs from there the request thread is given only a short join; it
        exits as soon as the context is gone.
        """
        if self._stopped or self.relay is None:
            return
        self._stopped = True
        self.relay.stopping.set()
        self.requests.stop()
        # nested: whatever fails, every later stage still runs (a later stop() is a no-op, and
        # destroy_node then closes the cores: nothing may still be running on them)
        try:
            self.join_request_thread(timeout=1.0)
        finally:
            try:
                self.relay.stop()
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
        if self.relay is not None:
            self.relay.close()
        if self.relay_pool is not None:  # the loop and publishers that used it have stopped
            self.relay_pool.close()
        destroy_lifecycle_node(self)  # the node and its lifecycle state machine
