# SPDX-License-Identifier: Apache-2.0
"""A demo producer: several robot sessions asking the relay for actions, and what comes back.

It is the newcomer's first look at the relay, so it produces every outcome on purpose, each by a
construction that does not depend on timing (docs/design.md §4 gives the order of decisions):
  - once an INFERENCE answer proves that a session's generation g was accepted, one late frame
    of that session still carrying g - 1 (a slow sensor pipeline)  -> REJECTED_STALE (step 3)
  - deadlines that have already passed when sent                     -> EXPIRED (step 4)
  - deadlines shorter than the requested NFE can take at the relay's nfe_ns, even if the
    request arrived at once (impossible_nfe x nfe_ns > impossible_ms) -> REJECTED_DEADLINE
  - a burst of no-deadline work many times the queue's capacity (no-deadline work never
    displaces anything)                                              -> REJECTED_CAPACITY
  - generous and no-deadline requests                                -> INFERENCE
Every kind of deadline occurs in every cycle of KIND_CYCLE requests (shuffled within a cycle);
the first burst comes after first_burst_s, then every burst_every_s. A rejected first attempt
is sometimes retried with retry_count + 1 (same sequence, origin). It prints a one-line summary
each second: sent, admitted by the relay, answered, per outcome code, p99 latency of INFERENCE
answers, relay queue depth.

It drives whatever the relay serves, learnt from the relay's latched `flowedge/model`
(producer.ServedModel.from_message), and follows a model swap: each request carries one of 16
seeded detour scenes (harness.scene_inputs), built by producer.build_request through
harness.build_request: the observation vector for a single .onnx policy, the rendered image and
the robot state for the two-phase package (`make run RUN_ARGS="--model vision"`). While the
relay serves nothing (unconfigured) it waits.
"""

from __future__ import annotations

import random
import time
from collections import Counter, deque
from dataclasses import dataclass

import numpy as np
from flowedge_relay_msgs.msg import ActionMessage, InferenceRequest, RelayStats
from flowedge_relay_msgs.msg import ServedModel as ServedModelMsg
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy

from flowedge_relay.core import Code
from flowedge_relay.producer import ServedModel, follow_served_model
from flowedge_relay.timebase import ros_time
from flowedge_relay_tools.harness import build_request, scene_inputs

# the summary line's short names: inference, stale, deadline, capacity, expired
CODE_NAMES = {code.value: code.key.removeprefix("rejected_") for code in Code}
RETRY_REASON = {
    ActionMessage.REJECTED_STALE: InferenceRequest.RETRY_AFTER_STALE,
    ActionMessage.REJECTED_DEADLINE: InferenceRequest.RETRY_AFTER_DEADLINE,
    ActionMessage.REJECTED_CAPACITY: InferenceRequest.RETRY_AFTER_CAPACITY,
    ActionMessage.EXPIRED: InferenceRequest.RETRY_AFTER_EXPIRED,
}
BURST_SESSION = "burst"
SCENES = 16  # seeded detour scenes the requests cycle through
PENDING_LIMIT = 10_000  # requests awaiting an answer that the producer remembers
# One cycle of deadline kinds: every kind occurs in every 20 requests, in shuffled order.
KIND_CYCLE = ["generous"] * 11 + ["tight"] * 3 + ["impossible"] * 2 + ["passed"] * 2 + ["none"] * 2


@dataclass
class _Pending:
    request: InferenceRequest
    sent_ns: int


def read_only_params(node: Node):
    """`param(name, default, text)`: declares one read-only parameter of `node`, its value."""

    def param(name, default, text):
        return node.declare_parameter(
            name, default, ParameterDescriptor(description=text, read_only=True)
        ).value

    return param


class DemoProducer(Node):
    """Publishes mixed InferenceRequests to flowedge/requests and summarises the answers."""

    def __init__(self, **kwargs) -> None:
        super().__init__("flowedge_relay_demo_producer", **kwargs)

        param = read_only_params(self)
        self.rate_hz = param("rate_hz", 40.0, "requests per second in steady state")
        self.sessions = param("sessions", 3, "producer sessions (robots) to simulate")
        self.nfe = param("nfe", 8, "remaining_nfe of each request")
        self.generation_every = param(
            "generation_every", 12, "requests of a session between two generation advances")
        self.impossible_nfe = param(
            "impossible_nfe", 64, "remaining_nfe of an impossible request (<= relay max_nfe)")
        self.impossible_ms = param(
            "impossible_ms", 60.0,
            "deadline of an impossible request, ms from sending: below impossible_nfe x nfe_ns")
        self.first_burst_s = param("first_burst_s", 1.0, "seconds before the first burst")
        self.burst_every_s = param("burst_every_s", 5.0, "seconds between bursts; 0 = none")
        self.burst_size = param("burst_size", 120, "requests in a burst (>> queue_capacity)")
        self.burst_nfe = param("burst_nfe", 64, "remaining_nfe of burst requests (long jobs)")
        self.retry_probability = param("retry_probability", 0.3, "chance to retry a rejection")
        self.quiet = param("quiet", False, "do not print the per-second summary")
        self.seed = param("seed", 7, "random seed of the traffic mix")

        self.rng = random.Random(self.seed)
        self.model: ServedModel | None = None  # what the relay serves (flowedge/model)
        self.scenes: list[dict[str, np.ndarray]] = []
        follow_served_model(self, self._on_model)
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        self.pub = self.create_publisher(InferenceRequest, "flowedge/requests", qos)
        self.create_subscription(ActionMessage, "flowedge/actions", self._on_action, qos)
        self.create_subscription(RelayStats, "flowedge/stats", self._on_stats, 10)
        self.sequence = {f"robot-{i}": 0 for i in range(self.sessions)}
        self.sequence[BURST_SESSION] = 0
        self.generation = dict.fromkeys(self.sequence, 1)
        self.late_frame_sent = dict.fromkeys(self.sequence, 1)  # newest g whose g - 1 was sent
        self.kinds: list[str] = []
        self.pending: dict[tuple[str, int, int], _Pending] = {}
        self.sent = 0
        self.answered = Counter()
        self.latencies_ms: deque[float] = deque(maxlen=2000)  # bounded: runs until Ctrl-C
        self.queue_depth = 0
        self.admitted = 0
        self.started = time.monotonic()
        # the first burst after first_burst_s, then one every burst_every_s
        self.last_burst = self.started - self.burst_every_s + self.first_burst_s
        self.create_timer(1.0 / self.rate_hz, self._tick)
        self.create_timer(1.0, self._summary)

    # -- sending -------------------------------------------------------------------------------

    def _tick(self) -> None:
        if self.model is None:
            return
        if self.burst_every_s > 0 and time.monotonic() - self.last_burst >= self.burst_every_s:
            self.last_burst = time.monotonic()
            # One extra session floods the queue with no-deadline work (never admission-tested):
            # what does not fit gets REJECTED_CAPACITY.
            for _ in range(self.burst_size):
                self._send_new(deadline_kind="none", session=BURST_SESSION)
        self._send_new()

    def _next_kind(self) -> str:
        if not self.kinds:
            self.kinds = list(KIND_CYCLE)
            self.rng.shuffle(self.kinds)
        return self.kinds.pop()

    def _send_new(self, deadline_kind: str | None = None, session: str | None = None,
                  generation: int | None = None) -> None:
        if session is None:
            session = self.rng.choice([s for s in self.sequence if s != BURST_SESSION])
            if self.sequence[session] % self.generation_every == self.generation_every - 1:
                self.generation[session] += 1  # newer observation: older work is stale now
        self.sequence[session] += 1
        now_ns = self.get_clock().now().nanoseconds
        kind = deadline_kind or self._next_kind()
        deadline_ns = {
            "generous": now_ns + 500_000_000,
            "tight": now_ns + 60_000_000,
            "impossible": now_ns + int(self.impossible_ms * 1e6),
            "passed": now_ns - 1_000_000,
            "none": 0,
        }[kind]
        if kind == "impossible":
            nfe = self.impossible_nfe
        else:
            nfe = self.burst_nfe if session == BURST_SESSION else self.nfe
        req = build_request(
            self.model, now_ns, arrays=self.scenes[self.rng.randrange(SCENES)],
            session_id=session, sequence=self.sequence[session],
            generation=self.generation[session] if generation is None else generation,
            deadline=ros_time(deadline_ns), remaining_nfe=nfe,
            noise_seed=self.rng.getrandbits(63),
        )  # fmt: skip
        self._publish(req)

    def _send_late_frame(self, session: str, accepted_generation: int) -> None:
        """A frame from a slow sensor pipeline: generation g - 1 after g was accepted.

        The relay rejects it REJECTED_STALE at arrival (docs/design.md §4 step 3), whatever
        the timing: the INFERENCE answer to generation g proves that g was accepted.
        """
        self.late_frame_sent[session] = accepted_generation
        self._send_new(deadline_kind="generous", session=session,
                       generation=accepted_generation - 1)

    def _publish(self, req: InferenceRequest) -> None:
        if len(self.pending) >= PENDING_LIMIT:
            self.pending.pop(next(iter(self.pending)))  # forget the oldest: bounded memory
        self.pending[(req.session_id, req.sequence, req.retry_count)] = _Pending(
            req, time.monotonic_ns()
        )
        self.pub.publish(req)
        self.sent += 1

    # -- receiving -----------------------------------------------------------------------------

    def _on_model(self, msg: ServedModelMsg) -> None:
        model = ServedModel.from_message(msg)
        if model == self.model:
            return
        self.model = model
        if model is None:
            self.get_logger().info("the relay serves no model (unconfigured): waiting")
            return
        self.scenes = [scene_inputs(model, self.seed + i) for i in range(SCENES)]
        self.get_logger().info(f"the relay serves {msg.model_kind} {model.digest[:19]}: "
                               f"requests follow it")

    def _on_action(self, msg: ActionMessage) -> None:
        self.answered[CODE_NAMES.get(msg.code, str(msg.code))] += 1
        pending = self.pending.pop((msg.session_id, msg.sequence, msg.retry_count), None)
        if pending is None:
            return
        if msg.code == ActionMessage.INFERENCE:
            self.latencies_ms.append((time.monotonic_ns() - pending.sent_ns) / 1e6)
            session = msg.session_id
            if (
                session in self.late_frame_sent
                and session != BURST_SESSION
                and msg.generation > self.late_frame_sent[session]
            ):
                self._send_late_frame(session, msg.generation)
        elif (
            msg.retry_count == 0
            and msg.code in RETRY_REASON
            and self.model is not None
            and pending.request.model_digest == self.model.digest  # not after a swap
            and self.rng.random() < self.retry_probability
        ):
            retry = pending.request
            retry.retry_count += 1
            retry.retry_reason = RETRY_REASON[msg.code]
            self._publish(retry)

    def _on_stats(self, msg: RelayStats) -> None:
        self.queue_depth = msg.queue_depth
        self.admitted = msg.accepted

    def _summary(self) -> None:
        if self.quiet:
            return
        lat = list(self.latencies_ms)
        p99 = float(np.percentile(lat, 99)) if lat else 0.0
        codes = " ".join(f"{name}={self.answered[name]}" for name in CODE_NAMES.values())
        print(
            f"t={time.monotonic() - self.started:5.1f}s sent={self.sent} "
            f"admitted={self.admitted} answered={sum(self.answered.values())} | {codes} | "
            f"p99 latency {p99:.1f} ms | queue {self.queue_depth}",
            flush=True,
        )


def main(args: list[str] | None = None) -> None:
    """`flowedge-relay-demo-producer`: the producer alone, against a relay running elsewhere."""
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    from flowedge_relay.executors import spin_until
    from flowedge_relay.ros_compat import initialized
    from flowedge_relay.signals import stop_requested

    with stop_requested(keep=True) as stop:  # SIGINT/SIGTERM stop it cleanly, however started
        try:
            with initialized(args, signal_handler_options=SignalHandlerOptions.NO):
                producer = DemoProducer()
                try:
                    executor = SingleThreadedExecutor()
                    executor.add_node(producer)
                    spin_until(executor, stop)
                finally:
                    producer.destroy_node()
        except ExternalShutdownException:
            pass


if __name__ == "__main__":
    main()
