"""Run a real relay and real client nodes in one process: for tests, the drill and the benches.

Everything here is real: a private rclpy context, real DDS topics, the RelayNode exactly as
`flowedge-relayd` runs it (dedicated request thread + main executor + worker threads).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node

from flowedge_relay.timebase import ros_time


@contextmanager
def ros_context() -> Iterator[Context]:
    """A private rclpy context, shut down on exit, so tests do not share global state."""
    ctx = Context()
    rclpy.init(context=ctx)
    try:
        yield ctx
    finally:
        ctx.try_shutdown()


@contextmanager
def spinning(*nodes: Node, context: Context) -> Iterator[SingleThreadedExecutor]:
    """Spin the nodes on one executor in a background thread until the block exits."""
    executor = SingleThreadedExecutor(context=context)
    for node in nodes:
        executor.add_node(node)
    thread = threading.Thread(target=executor.spin, name="test-spin", daemon=True)
    thread.start()
    try:
        yield executor
    finally:
        executor.shutdown(timeout_sec=2.0)
        thread.join(timeout=5.0)


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, period: float = 0.01) -> bool:
    """Poll predicate until it holds or timeout seconds pass; returns its last value."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(period)
    return predicate()


def wait_for_subscribers(publisher, count: int = 1, timeout: float = 10.0) -> None:
    """DDS discovery is asynchronous: publishing before it completes loses messages."""
    if not wait_for(lambda: publisher.get_subscription_count() >= count, timeout):
        raise TimeoutError(f"no subscriber matched {publisher.topic_name} within {timeout} s")


# -- a real relay node and a real client node, for node-level tests ---------------------------

def build_request(model, now_ns: int, **fields):
    """A valid single-vector request for `model` (digest and dims) stamped at `now_ns` (ROS
    time); fields override, `deadline_ms` is relative to now_ns. Shared by the harness and the
    producer processes of the stress campaigns."""
    from flowedge_relay_msgs.msg import InferenceRequest

    deadline_ms = fields.pop("deadline_ms", None)
    req = InferenceRequest(
        session_id="s", sequence=1, generation=1, remaining_nfe=4,
        model_digest=model.digest, observation_dim=model.obs_dim, action_dim=model.action_dim,
        action_horizon=model.action_horizon, observation=[0.1] * model.obs_dim, noise_seed=1,
    )
    req.origin_stamp = ros_time(now_ns)
    if deadline_ms is not None:
        req.deadline = ros_time(now_ns + int(deadline_ms * 1e6))
    for key, value in fields.items():
        setattr(req, key, value)
    return req


class RelayHarness:
    """A RelayNode spinning as in production (request thread + main executor) and a client node
    that publishes InferenceRequests and collects ActionMessages and diagnostics over DDS."""

    def __init__(self, ctx: Context, relay, client: Node) -> None:
        from diagnostic_msgs.msg import DiagnosticArray
        from flowedge_relay_msgs.msg import ActionMessage, InferenceRequest

        from flowedge_relay.model import load_model

        self.ctx = ctx
        self.relay = relay
        self.client = client
        self.model = relay.model or load_model(_default_model())
        self.actions: list = []
        self.diagnostics: list = []
        self.diagnostics_seen = 0
        # Long runs (flowedge_relay.tooling.stress soak) keep the client bounded: answers go only to
        # on_answer when keep_answers is False, and only the newest max_diagnostics arrays stay.
        self.keep_answers = True
        self.on_answer: Callable[[object], None] | None = None
        self.max_diagnostics: int | None = None
        self._lock = threading.Lock()
        qos = _reliable_qos()
        self.pub = client.create_publisher(InferenceRequest, "flowedge/requests", qos)
        client.create_subscription(ActionMessage, "flowedge/actions", self._on_action, qos)
        client.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)

    def _on_action(self, msg) -> None:
        if self.on_answer is not None:
            self.on_answer(msg)
        if self.keep_answers:
            with self._lock:
                self.actions.append(msg)

    def _on_diagnostics(self, msg) -> None:
        with self._lock:
            self.diagnostics.append(msg)
            self.diagnostics_seen += 1
            if self.max_diagnostics is not None and len(self.diagnostics) > self.max_diagnostics:
                del self.diagnostics[0]

    def request(self, **fields):
        """A valid request for the loaded model; fields override (deadline_ms: from now)."""
        return build_request(self.model, self.client.get_clock().now().nanoseconds, **fields)

    def send(self, *requests) -> None:
        for req in requests:
            self.pub.publish(req)

    def answers(self) -> list:
        with self._lock:
            return list(self.actions)

    def wait_answers(self, n: int, timeout: float = 20.0) -> list:
        wait_for(lambda: len(self.actions) >= n, timeout)
        return self.answers()

    def answer_for(self, sequence: int, timeout: float = 20.0):
        found = []

        def look() -> bool:
            found[:] = [a for a in self.answers() if a.sequence == sequence]
            return bool(found)

        wait_for(look, timeout)
        return found[0] if found else None

    def latest_status(self, task: str, timeout: float = 5.0):
        """The newest /diagnostics status named '<node>: task' (waits for a fresh array)."""
        start = self.diagnostics_seen
        wait_for(lambda: self.diagnostics_seen > start, timeout)
        with self._lock:
            arrays = list(self.diagnostics)
        for array in reversed(arrays):
            for status in array.status:
                if status.name.endswith(f": {task}"):
                    return status
        return None


def _reliable_qos():
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    return QoSProfile(depth=5000, reliability=ReliabilityPolicy.RELIABLE)


def _default_model() -> str:
    from flowedge_relay.model import default_model_path

    return default_model_path()


def status_values(status) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}


@contextmanager
def relay_spinning(ctx: Context, client_name: str, **params) -> Iterator[tuple[object, Node]]:
    """A RelayNode spinning as in production (request thread + main executor) plus a client
    node in `ctx`; on exit both are torn down in order: relay threads, context, nodes."""
    from rclpy.parameter import Parameter

    from flowedge_relay.node import RelayNode, spin_relay

    overrides = [Parameter(k, value=v) for k, v in params.items()]
    relay = RelayNode(context=ctx, parameter_overrides=overrides)
    client = rclpy.create_node(client_name, context=ctx)
    spin_thread = threading.Thread(
        target=spin_relay, args=(relay,), kwargs={"context": ctx}, daemon=True
    )
    try:
        spin_thread.start()
        yield relay, client
    finally:
        relay.stop()
        ctx.try_shutdown()
        if spin_thread.is_alive():
            spin_thread.join(timeout=10)
        relay.destroy_node()
        client.destroy_node()


@contextmanager
def running_relay(**params) -> Iterator[RelayHarness]:
    """Start a RelayNode with the given parameter overrides plus a client; tear both down."""
    with ros_context() as ctx, relay_spinning(ctx, "relay_test_client", **params) as (
        relay,
        client,
    ):
        harness = RelayHarness(ctx, relay, client)
        with spinning(client, context=ctx):
            wait_for_subscribers(harness.pub)
            yield harness
