# SPDX-License-Identifier: Apache-2.0
"""The real-time chunking demo producer: a simulated robot that keeps moving while it asks.

`make run RUN_ARGS="--rtc"` serves the bundled training-time RTC policy (models/policy_rtc) and
runs this node instead of the mixed-outcome demo producer. Each robot session drives the
closed-loop detour task (models/detour_task.py: reach the goal around the obstacle) the way a
robot runs a chunked policy asynchronously (docs/design.md §5.4):
  - a timer executes one action per `action_period_ms` from the current chunk
    (rtc.ChunkSplicer.action_at); the position moves by it;
  - after `execute_rows` actions of a chunk it sends the next request: the observation now, and
    the chunk's rows not yet executed as the prefix (ChunkSplicer.prefix), while it goes on
    executing them;
  - an INFERENCE answer is spliced in at its `frozen_rows` (ChunkSplicer.splice): the rows the
    robot ran meanwhile are the prefix's own, the new chunk takes over at row d;
  - an episode ends at the goal (success) or after `max_actions`; the next starts at once, with
    a plain request for its first chunk.
It prints one line per second: episodes and successes, the answers and their d, how many
answers came later than the row the robot switched at (late: the promise broken, expected 0),
actions the robot had to hold for want of a chunk (dry), and the mean seam jump at row d.
"""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
from flowedge_relay_msgs.msg import ActionMessage, InferenceRequest
from flowedge_relay_msgs.msg import ServedModel as ServedModelMsg
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy

from flowedge_relay.producer import (
    ChunkSplicer,
    ServedModel,
    build_request,
    follow_served_model,
)
from flowedge_relay.timebase import stamp_ns
from flowedge_relay_tools.demo_producer import read_only_params
from flowedge_relay_tools.models import detour_task as task


class _Robot:
    """One session's episode: where it is, what it executes, what it waits for."""

    def __init__(self, name: str, dim: int, period_ns: int) -> None:
        self.name, self.sequence = name, 0
        self.splicer = ChunkSplicer(dim, period_ns)
        self.position = np.zeros((1, 2))
        self.goal = self.obstacle = np.zeros((1, 2))
        self.actions = 0  # executed this episode
        self.since_chunk = 0  # executed from the current chunk
        self.waiting: int | None = None  # sequence of the request in flight
        self.started = False  # the episode's first chunk arrived

    def observation(self) -> np.ndarray:
        return task.closed_loop_observation(self.position, self.goal, self.obstacle)[0]


class RtcDemoProducer(Node):
    """Robots running the detour task asynchronously through the relay's real-time chunking."""

    def __init__(self, **kwargs) -> None:
        super().__init__("flowedge_relay_rtc_demo_producer", **kwargs)

        param = read_only_params(self)
        self.sessions = param("sessions", 4, "robots (producer sessions) to simulate")
        self.period_ns = int(param("action_period_ms", 50.0, "time per action row, ms") * 1e6)
        self.execute_rows = param("execute_rows", 4, "actions of a chunk run before asking again")
        self.max_actions = param("max_actions", 36, "actions per episode at most")
        self.nfe = param("nfe", 10, "remaining_nfe of each request")
        self.quiet = param("quiet", False, "do not print the per-second summary")
        self.rng = np.random.default_rng(param("seed", 7, "random seed of the episodes"))
        self.model: ServedModel | None = None
        self.robots: list[_Robot] = []
        follow_served_model(self, self._on_model)
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        self.pub = self.create_publisher(InferenceRequest, "flowedge/requests", qos)
        self.create_subscription(ActionMessage, "flowedge/actions", self._on_action, qos)
        self.counts: Counter[str] = Counter()
        self.frozen: Counter[int] = Counter()
        self.seams: list[float] = []
        self.create_timer(self.period_ns * 1e-9, self._tick)
        self.create_timer(1.0, self._summary)

    def _now(self) -> int:
        return self.get_clock().now().nanoseconds

    # -- the robots ---------------------------------------------------------------------------

    def _on_model(self, msg: ServedModelMsg) -> None:
        self.model = ServedModel.from_message(msg)
        if self.model is None or self.robots:
            return
        if self.model.rtc_mode == "off":
            self.get_logger().error("the relay serves this model without real-time chunking "
                                    "(rtc_mode off): serve models/policy_rtc (--rtc)")
            return
        self.robots = [_Robot(f"robot-{i}", self.model.action_dim, self.period_ns)
                       for i in range(self.sessions)]
        for robot in self.robots:
            self._new_episode(robot)

    def _new_episode(self, robot: _Robot) -> None:
        start = task.closed_loop_starts(self.rng, 1).astype(np.float64)
        robot.position, robot.goal, robot.obstacle = start[:, :2], start[:, 2:4], start[:, 4:6]
        robot.actions = robot.since_chunk = 0
        robot.started = False
        robot.splicer.start(np.zeros((0, self.model.action_dim), np.float32), self._now())
        self._ask(robot, with_prefix=False)

    def _ask(self, robot: _Robot, with_prefix: bool) -> None:
        now = self._now()
        robot.sequence += 1
        prefix = robot.splicer.prefix(now) if with_prefix else None
        req = build_request(self.model, {"observation": robot.observation()},
                            session_id=robot.name, sequence=robot.sequence,
                            remaining_nfe=self.nfe, deadline_ns=now + 2_000_000_000,
                            noise_seed=int(self.rng.integers(2**31)), origin_ns=now,
                            prefix=prefix, action_period_ns=self.period_ns)  # fmt: skip
        robot.waiting = robot.sequence
        self.pub.publish(req)
        self.counts["sent"] += 1

    def _tick(self) -> None:
        now = self._now()
        for robot in self.robots:
            if not robot.started:
                continue
            action = robot.splicer.action_at(now)
            if action is None:  # the chunk ran out before the next one came: the robot holds
                self.counts["dry"] += 1
            else:
                robot.position = task.closed_loop_positions(robot.position, action[None])[:, 0]
                robot.actions += 1
                robot.since_chunk += 1
            if np.linalg.norm(robot.position - robot.goal) < task.GOAL_TOLERANCE:
                self.counts["success"] += 1
                self._end(robot)
            elif robot.actions >= self.max_actions:
                self._end(robot)
            elif robot.since_chunk >= self.execute_rows and robot.waiting is None:
                self._ask(robot, with_prefix=True)

    def _end(self, robot: _Robot) -> None:
        self.counts["episodes"] += 1
        self._new_episode(robot)

    def _on_action(self, msg: ActionMessage) -> None:
        robot = next((r for r in self.robots if r.name == msg.session_id), None)
        if robot is None or msg.sequence != robot.waiting:
            return  # another producer's, or an episode that ended meanwhile
        robot.waiting = None
        if msg.code != ActionMessage.INFERENCE:
            self.counts["refused"] += 1  # the robot keeps executing what it has
            if not robot.started:
                self._ask(robot, with_prefix=False)
            return
        actions = np.asarray(msg.actions, np.float32)
        start, d = stamp_ns(msg.chunk_start), int(msg.frozen_rows)
        self.counts["answers"] += 1
        if not robot.started:  # the episode's first chunk: the robot waited for it
            robot.splicer.start(actions, self._now())
            robot.started = True
            robot.since_chunk = 0
            return
        self.frozen[d] += 1
        if self._now() > start + d * self.period_ns:
            self.counts["late"] += 1  # the robot had passed row d already
        old = robot.splicer.chunk
        first = (start - robot.splicer.start_ns) // self.period_ns
        # a chunk that starts before the one the robot runs (a request sent without a prefix
        # while the robot was waiting, answered on a loaded host after it started) has no seam
        if 0 <= first + d < len(old) and d < len(actions) // self.model.action_dim:
            dim = self.model.action_dim
            self.seams.append(float(np.linalg.norm(actions[d * dim:(d + 1) * dim]
                                                   - old[first + d])))  # fmt: skip
        robot.splicer.splice(actions, d, start)
        robot.since_chunk = max(0, robot.splicer.row_due(self._now()))

    def _summary(self) -> None:
        if self.quiet or not self.robots:
            return
        c = self.counts
        d = " ".join(f"{k}:{v}" for k, v in sorted(self.frozen.items())) or "-"
        seam = f"{np.mean(self.seams[-200:]):.3f}" if self.seams else "-"
        print(f"[{time.strftime('%H:%M:%S')}] episodes {c['episodes']} (reached {c['success']})"
              f" | answers {c['answers']} refused {c['refused']} | frozen_rows {d} | late "
              f"{c['late']} dry {c['dry']} | seam {seam}", flush=True)


def main(args: list[str] | None = None) -> None:
    import rclpy
    from rclpy.executors import ExternalShutdownException

    rclpy.init(args=args)
    node = RtcDemoProducer()
    try:
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    main()
