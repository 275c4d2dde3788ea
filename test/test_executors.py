"""The two executors of one node: the request group on its own thread, everything else on main.

RequestExecutor relies on one rclpy behaviour, public but worth pinning: the wait set is built
from `Executor.get_nodes()`. If an rclpy upgrade stops doing that, the request thread receives
nothing; these tests then fail with a message that says where to look.
"""

from __future__ import annotations

import threading
import time

import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from std_msgs.msg import String

from flowedge_relay.executors import MainExecutor, RequestExecutor, spin_until

CHANGED = (
    "rclpy no longer builds its wait set from Executor.get_nodes(), or no longer asks "
    "can_execute(): RequestExecutor (flowedge_relay/executors.py) must follow that change"
)


def wait_for(predicate, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_request_group_runs_only_on_the_request_thread_and_the_rest_on_main():
    context = rclpy.Context()
    rclpy.init(context=context)
    try:
        node = Node("executor_split", context=context)
        group = MutuallyExclusiveCallbackGroup()
        seen: dict[str, set[str]] = {"sub": set(), "timer": set()}
        count = [0]

        def on_msg(_msg: String) -> None:
            seen["sub"].add(threading.current_thread().name)
            count[0] += 1

        node.create_subscription(String, "split", on_msg, 50, callback_group=group)
        node.create_timer(0.05, lambda: seen["timer"].add(threading.current_thread().name))
        pub = node.create_publisher(String, "split", 50)

        main = MainExecutor([group], context=context)
        main.add_node(node)
        request = RequestExecutor([node], [group], context=context)
        stop = threading.Event()
        req_thread = threading.Thread(target=spin_until, args=(request, stop), name="requests")
        main_thread = threading.Thread(target=main.spin, name="main-spin")
        req_thread.start()
        main_thread.start()
        try:
            assert node.executor is main, "the node must stay owned by the main executor"
            def publish_and_check() -> bool:
                pub.publish(String(data="x"))  # until matched and 20 got through
                return count[0] >= 20

            assert wait_for(publish_and_check, 20.0), f"{CHANGED} (received {count[0]})"
            assert wait_for(lambda: len(seen["timer"]) > 0, 5.0)
        finally:
            stop.set()
            req_thread.join(5.0)
            main.shutdown(timeout_sec=2.0)
            main_thread.join(5.0)
            node.destroy_node()
        assert seen["sub"] == {"requests"}, f"{CHANGED}: subscription ran on {seen['sub']}"
        assert "requests" not in seen["timer"], "the request thread ran a timer"
    finally:
        rclpy.shutdown(context=context)
