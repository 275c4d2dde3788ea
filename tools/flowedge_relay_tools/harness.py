# SPDX-License-Identifier: Apache-2.0
"""Run a real relay and real client nodes in one process: for tests, the drill and the benches.

Everything here is real: a private rclpy context, real DDS topics, the RelayNode exactly as
`flowedge-relayd` runs it (dedicated request thread + main executor + worker threads).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node

from flowedge_relay.executors import take_waiting
from flowedge_relay.timebase import ros_time
from flowedge_relay_tools.waiting import wait_for

if TYPE_CHECKING:
    from flowedge_relay.producer import ServedModel


@contextmanager
def ros_context() -> Iterator[Context]:
    """A private rclpy context, shut down on exit, so tests do not share global state.

    Destroyed too (its DDS participant with it, once the nodes in it are): a participant that
    outlives its test until the garbage collector finds it still announces that test's nodes,
    and a later relay of the same name would share the graph with its ghost (a service client
    would find the ghost's server and send to it).
    """
    ctx = Context()
    rclpy.init(context=ctx)
    try:
        yield ctx
    finally:
        ctx.try_shutdown()
        ctx.destroy()


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


def wait_for_subscribers(publisher, count: int = 1, timeout: float = 10.0) -> None:
    """DDS discovery is asynchronous: publishing before it completes loses messages."""
    if not wait_for(lambda: publisher.get_subscription_count() >= count, timeout):
        raise TimeoutError(f"no subscriber matched {publisher.topic_name} within {timeout} s")


def wait_for_relay(requests_pub, answers_sub, timeout: float = 10.0) -> None:
    """A client and a relay see each other both ways: requests reach it, answers come back."""
    wait_for_subscribers(requests_pub, timeout=timeout)
    if not wait_for(lambda: answers_sub.get_publisher_count() >= 1, timeout):
        raise TimeoutError(f"no publisher matched {answers_sub.topic_name} within {timeout} s")


# -- requests for whatever a relay serves ----------------------------------------------------

MODEL_CHOICES = ("small (the relay's default), bench (~1 ms per NFE), vision (the bundled "
                 "two-phase package), rtc (the real-time chunking package) or a path (.onnx "
                 "file or package directory)")


def model_path(choice: str) -> str:
    """`small`, `bench`, `vision`, `rtc` or a path (an .onnx file or a policy package
    directory)."""
    from flowedge_relay.model import default_model_path
    from flowedge_relay.policy import rtc_policy_path, vision_policy_path
    from flowedge_relay_tools.models import bench_model_path

    named = {"small": default_model_path, "bench": bench_model_path, "vision": vision_policy_path,
             "rtc": rtc_policy_path}
    return named[choice]() if choice in named else choice


def load_served(path: str):
    """What a RelayNode's relay.model holds for `path`: model.ModelInfo for a single .onnx file, the
    policy.Policy for a package (both have digest, obs_dim, action_dim, action_horizon)."""
    from pathlib import Path

    from flowedge_relay import policy
    from flowedge_relay.model import load_model

    return policy.load(path) if Path(path).is_dir() else load_model(path)


def served_model(model) -> ServedModel:
    """What a producer needs of `model`: a ServedModel as it is, a policy.Policy (either kind),
    or anything with digest, obs_dim, action_dim and action_horizon (model.ModelInfo, stress's
    contract), which is a single-vector model."""
    from flowedge_relay.policy import Policy
    from flowedge_relay.producer import InputDecl, ServedModel

    if isinstance(model, ServedModel):
        return model
    if isinstance(model, Policy):
        return ServedModel.from_policy(model)
    return ServedModel(
        model.digest, (InputDecl("observation", "float32", (model.obs_dim,)),),
        model.action_dim, model.action_horizon, model.obs_dim,
    )  # fmt: skip


def scene_inputs(served: ServedModel, seed: int) -> dict[str, np.ndarray]:
    """The inputs of one seeded detour-task scene (models/detour_task.py), as `served` takes them.

    Why: tools and demos should send what the bundled policies were trained on, so their answers
    are meaningful: the observation vector for the single-vector policies, the rendered image and
    the robot state for the vision package. An input of another package gets seeded values of its
    declared dtype and shape (valid for the relay's intake, meaningless to the policy).
    """
    from flowedge_relay_tools.models import detour_task as task

    rng = np.random.default_rng(seed)
    obs = task.sample_observations(rng, 1)
    known = {
        ("observation", "float32", (task.OBS_DIM,)): lambda: obs[0],
        ("image", "uint8", (task.IMAGE_CHANNELS, task.IMAGE_SIZE, task.IMAGE_SIZE)):
            lambda: task.render_observation(obs)[0],
        ("state", "float32", (2,)): lambda: obs[0, :2],
    }  # fmt: skip
    arrays = {}
    for d in served.inputs:
        make = known.get((d.name, d.dtype, d.shape))
        if make is not None:
            arrays[d.name] = np.asarray(make(), d.wire_dtype)
        elif d.dtype in ("float32", "float16"):
            arrays[d.name] = rng.standard_normal(d.shape).astype(d.wire_dtype)
        elif d.dtype == "uint8":
            arrays[d.name] = rng.integers(0, 256, d.shape, dtype=np.uint8)
        else:  # token ids, masks: zeros are valid for every integer and bool dtype
            arrays[d.name] = np.zeros(d.shape, d.wire_dtype)
    return arrays


def build_request(model, now_ns: int, *, arrays: Mapping[str, np.ndarray] | None = None,
                  **fields):  # fmt: skip
    """A valid request for `model` (see served_model) stamped at `now_ns` (ROS time), built by
    producer.build_request: the observation shorthand for a single-vector model ([0.1, ...] by
    default), tensors for a package (scene 0 of scene_inputs by default; `arrays`, by input name,
    overrides). Message fields override afterwards (also `inputs` and invalid values, on
    purpose); `deadline_ms` is relative to now_ns. Shared by the harness, the bench client, the
    demo, the drill and the stress producers."""
    from flowedge_relay import producer

    served = served_model(model)
    if arrays is None:
        arrays = _default_inputs(served)
    deadline_ms = fields.pop("deadline_ms", None)
    req = producer.build_request(
        served, arrays, session_id="s", sequence=1, generation=1, remaining_nfe=4,
        noise_seed=1, origin_ns=now_ns,
    )  # fmt: skip
    if deadline_ms is not None:
        req.deadline = ros_time(now_ns + int(deadline_ms * 1e6))
    for key, value in fields.items():
        setattr(req, key, value)
    return req


_DEFAULT_INPUTS: dict[ServedModel, dict[str, np.ndarray]] = {}


def _default_inputs(served: ServedModel) -> dict[str, np.ndarray]:
    arrays = _DEFAULT_INPUTS.get(served)
    if arrays is None:
        if len(_DEFAULT_INPUTS) >= 64:  # campaigns with many model contracts stay bounded
            _DEFAULT_INPUTS.clear()
        if served.observation_dim > 0:
            arrays = {served.inputs[0].name: np.full(served.observation_dim, 0.1, np.float32)}
        else:
            arrays = scene_inputs(served, 0)
        _DEFAULT_INPUTS[served] = arrays
    return arrays


# -- a real relay node and a real client node, for node-level tests ---------------------------

#: answers a client takes per subscription callback (RelayHarness, bench.client.BenchClient)
ANSWER_DRAIN_MAX = 64


class RelayHarness:
    """A RelayNode spinning as in production (request thread + main executor) and a client node
    that publishes InferenceRequests and collects ActionMessages and diagnostics over DDS."""

    def __init__(self, ctx: Context, node, client: Node) -> None:
        from diagnostic_msgs.msg import DiagnosticArray
        from flowedge_relay_msgs.msg import ActionMessage, InferenceRequest

        from flowedge_relay.model import load_model

        self.ctx = ctx
        self.node = node
        self.client = client
        self.model = node.relay.model or load_model(_default_model())
        self.actions: list = []
        self.diagnostics: list = []
        self.diagnostics_seen = 0
        # Long runs (flowedge_relay_tools.stress soak) keep the client bounded: answers go only to
        # on_answer when keep_answers is False, and only the newest max_diagnostics arrays stay.
        self.keep_answers = True
        self.on_answer: Callable[[object], None] | None = None
        self.max_diagnostics: int | None = None
        self._lock = threading.Lock()
        qos = _reliable_qos()
        self.pub = client.create_publisher(InferenceRequest, "flowedge/requests", qos)
        self._actions_sub = client.create_subscription(ActionMessage, "flowedge/actions",
                                                       self._on_action, qos)
        client.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)

    def _on_action(self, msg) -> None:
        """One answer, then those already waiting without an executor trip each: one rclpy
        executor wake-up costs ~300 us here, and at a few thousand answers/s a client paying it
        per answer falls behind the relay's action history (action_qos_depth) and loses some."""
        self._record(msg)
        take_waiting(self._actions_sub, self._record, ANSWER_DRAIN_MAX)

    def _record(self, msg) -> None:
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
def relay_spinning(ctx: Context, client_name: str, drill: bool = False,
                   **params) -> Iterator[tuple[object, Node]]:  # fmt: skip
    """A RelayNode spinning as in production (request thread + main executor) plus a client
    node in `ctx`; on exit both are torn down in order: relay threads, context, nodes. With
    `drill`, or a fault parameter among `params`, the relay is started for a drill (its fault
    knobs exist)."""
    from rclpy.parameter import Parameter

    from flowedge_relay.node import RelayNode, spin_relay

    overrides = [Parameter(k, value=v) for k, v in params.items()]
    drill = drill or any(name.startswith("fault_") for name in params)
    node = RelayNode(context=ctx, parameter_overrides=overrides, drill=drill)
    client = rclpy.create_node(client_name, context=ctx)
    spin_thread = threading.Thread(
        target=spin_relay, args=(node,), kwargs={"context": ctx}, daemon=True
    )
    try:
        spin_thread.start()
        yield node, client
    finally:
        node.stop()
        ctx.try_shutdown()
        if spin_thread.is_alive():
            spin_thread.join(timeout=10)
        node.destroy_node()
        client.destroy_node()


@contextmanager
def running_relay(drill: bool = False, **params) -> Iterator[RelayHarness]:
    """Start a RelayNode with the given parameter overrides plus a client (started for a drill
    as relay_spinning says); tear both down."""
    with ros_context() as ctx, relay_spinning(ctx, "relay_test_client", drill, **params) as (
        node,
        client,
    ):
        harness = RelayHarness(ctx, node, client)
        with spinning(client, context=ctx):
            # the subscription matches at construction, the request thread starts later: a
            # request sent in between waits in the middleware and its deadline runs meanwhile.
            # Both directions: an answer published before the relay's writer has matched the
            # client's reader is dropped, and a test waiting for it stalls.
            wait_for_subscribers(harness.pub)
            wait_for_subscribers(node.actions_publisher)
            if not node.requests.taking.wait(30):
                raise TimeoutError("the relay did not start taking requests within 30 s")
            yield harness
