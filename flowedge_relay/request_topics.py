# SPDX-License-Identifier: Apache-2.0
"""The relay node's request topics: the subscriptions, the C intake loop over them (or the rclpy
callback where it cannot run), MESSAGE_LOST counting and the request thread.

Only the request thread takes from the request subscriptions: it runs the C intake's loop
(without the GIL), or spins the request callback group on an executor of its own, whose callback
hands each request to relay.Relay.on_request. The main executor leaves the group alone
(spin.spin_relay).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from flowedge_relay_msgs.msg import InferenceRequest
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.event_handler import SubscriptionEventCallbacks, UnsupportedEventTypeError
from rclpy.serialization import serialize_message

from flowedge_relay.core import NotSupported
from flowedge_relay.executors import EventPoll, RequestExecutor, spin_until, take_waiting
from flowedge_relay.intake import IntakeLoop, RclUnavailable
from flowedge_relay.qos import request_qos
from flowedge_relay.relay import Relay

# Requests taken straight from a subscription per executor wake-up. One trip through rclpy's
# executor (wait set, task, dispatch) costs ~250 us here, 10-100x the callback itself, so the
# request thread drains what is already waiting; bounded so QoS events and stop stay prompt.
REQUEST_DRAIN_MAX = 64


class RequestTopics:
    """The subscriptions to every topic in `request_topics` on `node`, for the node's lifetime
    (an unconfigured relay counts what arrives: docs/design.md §9), and the intake over them.
    `loop` is the C intake's loop, or None and `note` says why not; `bind` names the Relay the
    requests go to, before `start`."""

    def __init__(self, node, p: dict) -> None:
        self._node = node
        #: protects the core's single submit producer (ring 0): only the request thread runs it
        self.group = MutuallyExclusiveCallbackGroup()
        self.lost_reported = True  # False where the RMW cannot report MESSAGE_LOST
        self._relay: Relay | None = None
        qos = request_qos(p["request_qos_history"], p["request_qos_depth"])
        self.subscriptions = [self._subscribe(topic, qos) for topic in p["request_topics"]]
        self.loop, self.note = self._make_loop(p)
        #: the MESSAGE_LOST events, taken by poll_lost when the C intake takes the requests
        #: (executors.EventPoll says why no executor waits on them)
        self._lost_events = EventPoll(
            [h for sub in self.subscriptions for h in sub.event_handlers], node.context)
        #: set once the request thread is in its loop: from then on a request is taken as it
        #: arrives (before, it waits in the middleware; the harness waits for this)
        self.taking = threading.Event()
        self._thread: threading.Thread | None = None

    def bind(self, relay: Relay) -> None:
        self._relay = relay
        relay.lost_reported = self.lost_reported

    def _subscribe(self, topic: str, qos):
        """One request subscription, with a MESSAGE_LOST handler where the RMW supports it.

        The handler is in the request group (the request thread runs it with the rclpy intake;
        with the C intake poll_lost takes its events) and owns the counter. Fast DDS reports
        samples its reader will never get (a reliable writer dropped them unacknowledged, a
        best-effort gap); it cannot report a KEEP_LAST reader overwriting its own unread
        samples, which is why keep_all is the default.
        """
        node, subs = self._node, []

        def on_message(msg: InferenceRequest) -> None:
            relay = self._relay
            relay.on_request(msg)
            take_waiting(subs[0], relay.on_request, REQUEST_DRAIN_MAX, relay.stopping)

        def on_lost(info) -> None:
            self._relay.count_lost(info.total_count_change)

        kw = {"callback_group": self.group}
        try:
            sub = node.create_subscription(InferenceRequest, topic, on_message, qos, **kw,
                                           event_callbacks=SubscriptionEventCallbacks(
                                               message_lost=on_lost))
        except UnsupportedEventTypeError:
            self.lost_reported = False
            node.get_logger().warning(
                "this RMW cannot report lost messages: middleware_lost stays 0 (SECURITY.md)")
            sub = node.create_subscription(InferenceRequest, topic, on_message, qos, **kw)
        subs.append(sub)
        return sub

    def _make_loop(self, p: dict) -> tuple[IntakeLoop | None, str]:
        """The C intake's loop, or None and why not (the rclpy callback decides then)."""
        if p["intake_loop"] == "python":
            return None, "intake_loop: python requested"
        if self._node.get_parameter("use_sim_time").value:
            return None, "use_sim_time: requests must be judged against the node's clock"
        try:
            IntakeLoop.functions()
            IntakeLoop.probe(self.subscriptions)
        except (NotSupported, RclUnavailable) as exc:
            return None, f"not in C: {exc}"
        return IntakeLoop(p["max_request_bytes"]), ""

    def poll_lost(self) -> None:
        """Take the MESSAGE_LOST events the C intake leaves waiting (the health poll)."""
        if self.loop is not None:
            self._lost_events.poll()

    def start(self, context, settings: Callable[[], None], answers=()) -> None:
        """Start the request thread: `settings` applies its real-time role, then it runs the C
        intake's loop (with a relay pool's `answers` subscription) or spins the request group."""
        loop, relay = self.loop, self._relay
        if loop is None:
            executor = RequestExecutor([self._node], [self.group], context=context)

        def run() -> None:
            settings()
            self.taking.set()
            if loop is None:
                spin_until(executor, relay.stopping)
                return
            try:
                loop.run(self.subscriptions, answers=answers)
            except Exception as exc:  # the middleware refused the callback after all: say so
                self._node.get_logger().error(f"the C request intake stopped: {exc!r}")

        thread = threading.Thread(target=run, name="flowedge-requests", daemon=True)
        thread.start()
        # published only once started: stop() on another thread (a relay torn down as it comes
        # up) joins it, and joining a thread not yet started raises, which skipped the rest of
        # stop() and closed the core under running workers
        self._thread = thread

    def stop(self) -> None:
        """Stop taking (the C loop; the executor's spin ends on the relay's stopping event)."""
        if self.loop is not None:
            self.loop.stop()

    @property
    def alive(self) -> bool:
        return bool(self._thread and self._thread.is_alive())

    def join(self, timeout: float) -> bool:
        """Wait up to `timeout` s for the request thread to end; whether it has (or never ran)."""
        if self._thread is not None:
            self._thread.join(timeout=timeout)
        return not self.alive

    def handle(self, msg: InferenceRequest) -> None:
        """One request through the intake this relay runs, for tools that time it without DDS
        (bench intake); the C intake gets its CDR bytes. Only while the request thread is not
        running (before start, or after stop): it is the core's single submit producer."""
        if self.loop is None:
            self._relay.on_request(msg)
        else:
            self._relay.handle_serialized(serialize_message(msg))
