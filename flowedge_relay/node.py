# SPDX-License-Identifier: Apache-2.0
"""The relay node `flowedge_relay`: a managed (lifecycle) node over a relay.Relay.

Shaped like ros2/demos' lifecycle_talker: the node owns the parameters, the topics, the timers
and the transitions, and each transition calls the Relay, which owns what is served (the C core,
the workers, the publisher thread; relay.py imports no rclpy). A request travels:

    flowedge/requests --(request thread: request_topics.py, intake in C)--> Core.submit
        -> EDF queue -> worker threads (workers.py) -> outcome rings
        -> publisher thread (publisher.py, in C) -> flowedge/actions

The main executor (spin.spin_relay) runs the timers, parameter and lifecycle services. Every
topic exists for the node's lifetime, not only while configured: docs/design.md §9 says why.
Tools (drill, stress, bench, tests) read what is served through `relay`.
"""

from __future__ import annotations

import threading
import time

from flowedge_relay_msgs.msg import ActionMessage, ServedModel
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.lifecycle import LifecycleNodeMixin, LifecycleState, TransitionCallbackReturn
from rclpy.node import Node
from rclpy.parameter import Parameter

from flowedge_relay import parameters
from flowedge_relay.diagnostics import StatusTopics
from flowedge_relay.model_topic import served_model_message
from flowedge_relay.pool import UNCONFIGURED, RelayPool, Served
from flowedge_relay.producer import ACTIONS_TOPIC, MODEL_TOPIC, model_qos
from flowedge_relay.qos import reliable
from flowedge_relay.realtime import ThreadRoles
from flowedge_relay.relay import Host, Relay
from flowedge_relay.request_topics import RequestTopics
from flowedge_relay.ros_compat import destroy_lifecycle_node
from flowedge_relay.serving import thread_settings
from flowedge_relay.spin import spin_relay, stop_in_order

__all__ = ["RelayNode", "spin_relay"]

NODE_NAME = "flowedge_relay"


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
    _stopped = False

    def __init__(self, *, drill: bool = False, **kwargs) -> None:
        """`drill`: started for a drill, the fault knobs exist (parameters.DRILL_SPECS and the
        Relay's fault hooks); a production relay has none of them."""
        #: set by the shutdown transition: the process then exits as on SIGINT (cli)
        self.finalized = threading.Event()
        Node.__init__(self, NODE_NAME, **kwargs)
        # The lifecycle services run in a group of their own, so a deactivate that waits for
        # admitted work to finish holds neither the timers nor the parameter services.
        LifecycleNodeMixin.__init__(self, callback_group=MutuallyExclusiveCallbackGroup())
        p = parameters.declare_all(self, drill)  # the Relay keeps them current (Relay.apply)
        # Real-time deployment (docs/robot-computer.md): each thread on the request path applies
        # its settings under its role; what the OS holds is read back for the workers status.
        self.thread_roles = ThreadRoles()
        if p["lock_memory"]:
            self.thread_roles.lock_memory(self.get_logger().warning)
        self.actions_publisher = self.create_publisher(
            ActionMessage, ACTIONS_TOPIC, reliable(p["action_qos_depth"]))
        self._model_pub = self.create_publisher(ServedModel, MODEL_TOPIC, model_qos())
        self.requests = RequestTopics(self, p)
        loop = self.requests.loop
        if p["pool"]:
            if loop is None:  # the ownership test is in the C intake
                raise parameters.ParameterError(
                    f"pool {p['pool']!r} needs the C request intake, which is off here "
                    f"({self.requests.note})")
            self.relay_pool = RelayPool(self, p, lambda: Served.by(self.relay, p))
            loop.set_pool(self.relay_pool.c)
        host = Host.of(self, self.actions_publisher, drill=drill, thread_roles=self.thread_roles)
        self.relay = Relay(p, host, loop, self.requests.note,
                           self.relay_pool.c if self.relay_pool else None)
        self.requests.bind(self.relay)
        self.status = StatusTopics(self, self.relay, lambda: self.lifecycle_state,
                                   lambda: self.relay_pool.values() if self.relay_pool else {})
        timers = MutuallyExclusiveCallbackGroup()
        self.create_timer(1.0, self.status.publish_diagnostics, callback_group=timers)
        self.create_timer(1.0 / p["stats_rate_hz"], self.status.publish_stats,
                          callback_group=timers)
        self.create_timer(0.1, self._poll_health, callback_group=timers)
        self.add_pre_set_parameters_callback(parameters.spell_all)
        self.add_on_set_parameters_callback(lambda params: parameters.check_set(
            params, self.relay.prepare_swap if self.lifecycle_state[1] in ("active", "inactive")
            else None))
        self.add_post_set_parameters_callback(self._apply_parameters)
        self._announce()
        self.get_logger().info(
            f"relay up: model={self.relay.serving.model_path} workers={p['workers']} "
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
        """Stop the workers and release the model (a pool member's held work first settles)."""
        if self.relay_pool is not None:
            self.relay_pool.settle_held(lambda: self._stopped)
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

    def _apply_parameters(self, params: list[Parameter]) -> None:
        """A live set accepted (parameters.check_set): into the relay, which switches to a
        prepared model swap (then announced), and pool_spill into the relay pool."""
        values = {param.name: self.get_parameter(param.name).value for param in params}
        if self.relay.apply(values, active=self.lifecycle_state[1] == "active"):
            self._announce()
        if "pool_spill" in values and self.relay_pool is not None:
            self.relay_pool.set_spill(values["pool_spill"])

    # -- the request thread and the health poll ------------------------------------------------

    def main_executor_exclusions(self) -> tuple[list, list]:
        """(callback groups, entities) the main executor must leave alone: the request group,
        which the request thread spins (the rclpy intake) or takes from in C (the native
        intake, whose MESSAGE_LOST events the health poll takes: executors.EventPoll)."""
        return [self.requests.group, *([self.relay_pool.group] if self.relay_pool else [])], []

    def start_request_executor(self, context=None) -> None:
        """Start the request thread: the C intake's loop, or (the rclpy intake) the request
        group spun on a dedicated single-threaded executor."""
        if self.relay_pool is not None:
            self.relay_pool.start(context or self.context)
        settings = thread_settings(self.relay.p, "executor")
        self.requests.start(
            context or self.context,
            lambda: self.thread_roles.apply("request", settings, self.get_logger().warning),
            answers=[self.relay_pool.answers] if self.relay_pool else ())

    def _poll_health(self) -> None:
        self.requests.poll_lost()
        self.relay.poll_health(time.monotonic_ns())

    # -- teardown ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop intake, then workers, then flush outputs; every thread joined (spin.stop_in_order
        says why the request thread's join is short). Call before the context shuts down.
        Idempotent."""
        if self._stopped or self.relay is None:
            return
        self._stopped = True
        stop_in_order(self.relay, self.requests, self.actions_publisher, self.get_logger(),
                      self.relay_pool)

    def destroy_node(self) -> None:
        self.stop()
        if self.relay is not None:
            self.relay.close()
        if self.relay_pool is not None:  # the loop and publishers that used it have stopped
            self.relay_pool.close()
        destroy_lifecycle_node(self)  # the node and its lifecycle state machine
