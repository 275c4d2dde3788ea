# SPDX-License-Identifier: Apache-2.0
"""The transport floor for `bench overhead`: a node that answers each request at once.

`flowedge_echo` subscribes to `flowedge/requests` and publishes, from the same callback, an
ActionMessage carrying only the request's key (code INFERENCE, no actions, no model work). Run
in its own process under a namespace (`--ros-args -r __ns:=/echo`), it gives the round trip that
any rclpy relay pays on this host: DDS both ways, both executors, message conversion. The bench
alternates requests between it and the relay, so `overhead - floor` is what the relay itself adds.
"""

from __future__ import annotations

import sys

from flowedge_relay_msgs.msg import ActionMessage, InferenceRequest
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

from flowedge_relay.ros_compat import initialized


class EchoNode(Node):
    """Answers every request with its key; nothing else."""

    def __init__(self) -> None:
        super().__init__("flowedge_echo")
        qos = QoSProfile(depth=100, history=HistoryPolicy.KEEP_LAST,
                         reliability=ReliabilityPolicy.RELIABLE)  # fmt: skip
        self._pub = self.create_publisher(ActionMessage, "flowedge/actions", qos)
        self.create_subscription(InferenceRequest, "flowedge/requests", self._on_request, qos)
        self.get_logger().info("relay up: echo (transport floor)")

    def _on_request(self, req: InferenceRequest) -> None:
        msg = ActionMessage(session_id=req.session_id, sequence=req.sequence,
                            generation=req.generation)  # fmt: skip
        msg.header.stamp = self.get_clock().now().to_msg()
        self._pub.publish(msg)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        with initialized(["flowedge_echo", *argv]):
            node = EchoNode()
            executor = SingleThreadedExecutor()
            executor.add_node(node)
            executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
