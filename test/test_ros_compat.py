# SPDX-License-Identifier: Apache-2.0
"""What differs between Jazzy (rclpy 7) and Kilted (rclpy 9), one test per difference.

Each test pins what the installed distro does (scripts/env.sh sets ROS_DISTRO), so the suite run
under either distro fails here, naming flowedge_relay/ros_compat.py, when an rclpy upgrade
changes one of the behaviours the relay depends on.
"""

from __future__ import annotations

import inspect
import threading
import time

import pytest
import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.context import Context
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.executors import MultiThreadedExecutor
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from ros_helpers import ros_context, wait_for
from std_msgs.msg import String

from flowedge_relay import ros_compat

DISTRO = ros_compat.distro()
RCLPY_9 = DISTRO == "kilted"
KNOWN = pytest.mark.skipif(DISTRO not in ros_compat.SUPPORTED_DISTROS,
                           reason=f"ROS_DISTRO={DISTRO!r}: run through make test")


@pytest.mark.ros
@KNOWN
def test_rclpy_init_returns_a_context_manager_only_on_rclpy_9():
    ctx = Context()
    returned = rclpy.init(context=ctx)
    try:
        assert hasattr(returned, "__exit__") == RCLPY_9, (
            f"rclpy.init() on {DISTRO} returned {returned!r}: ros_compat.initialized() assumes "
            "rclpy 7 returns None and rclpy 9 a context manager")
    finally:
        ctx.try_shutdown()


@pytest.mark.ros
def test_initialized_brings_a_context_up_for_the_block_and_shuts_it_down():
    ctx = Context()
    with ros_compat.initialized(["compat_test"], context=ctx) as got:
        assert got is ctx and ctx.ok()
    assert not ctx.ok()
    with pytest.raises(RuntimeError), ros_compat.initialized(context=ctx):
        raise RuntimeError("a failing block still shuts the context down")
    assert not ctx.ok()


@KNOWN
def test_executor_shutdown_takes_wait_for_threads_only_on_rclpy_9():
    params = inspect.signature(MultiThreadedExecutor.shutdown).parameters
    assert ("wait_for_threads" in params) == RCLPY_9, (
        f"MultiThreadedExecutor.shutdown{inspect.signature(MultiThreadedExecutor.shutdown)} on "
        f"{DISTRO}: ros_compat.shutdown_executor() must follow")


@pytest.mark.ros
def test_shutdown_executor_stops_the_pool_and_the_executor_on_either_distro():
    with ros_context() as ctx:
        executor = MultiThreadedExecutor(num_threads=2, context=ctx)
        assert ros_compat.shutdown_executor(executor, timeout_sec=1.0) is True
        with pytest.raises(RuntimeError):  # the pool is shut down: it takes no more work
            executor._executor.submit(lambda: None)
        # and the executor itself: spinning now returns at once instead of waiting
        start = time.monotonic()
        executor.spin_once(timeout_sec=2.0)
        assert time.monotonic() - start < 1.0


@pytest.mark.ros
@KNOWN
def test_rclpy_hands_a_queued_callback_to_its_pool_again_on_every_spin():
    """rclpy issue 1452, present in rclpy 7 and 9: the reason executors.MainExecutor overrides
    _spin_once_impl. If this fails, rclpy fixed it and the override may go."""
    release = threading.Event()
    started = threading.Semaphore(0)

    def blocking() -> None:
        started.release()
        release.wait(30)

    with ros_context() as ctx:
        node = rclpy.create_node("compat_resubmit", context=ctx)
        executor = MultiThreadedExecutor(num_threads=2, context=ctx)
        submitted: list[object] = []
        pool_submit = executor._executor.submit

        def counting_submit(fn, *args, **kwargs):
            submitted.append(fn)
            return pool_submit(fn, *args, **kwargs)

        executor._executor.submit = counting_submit
        executor.add_node(node)
        timers = [node.create_timer(0.01, blocking,
                                    callback_group=MutuallyExclusiveCallbackGroup())
                  for _ in range(2)]
        try:
            assert wait_for(lambda: (executor.spin_once(timeout_sec=0.05),
                                     len(submitted) >= 2)[1], 10)
            assert started.acquire(timeout=10) and started.acquire(timeout=10)
            timers.append(node.create_timer(0.01, lambda: None,
                                            callback_group=MutuallyExclusiveCallbackGroup()))
            # spins, not seconds: a loaded host runs fewer spins in a given time, and each
            # spin (its timer due every 10 ms, inside the spin's 50 ms wait) hands it over again
            for _ in range(200):
                executor.spin_once(timeout_sec=0.05)
                if len(submitted) > 10:
                    break
            # the third callback waits in the pool's queue (both threads are held) and is
            # handed over again and again
            assert len(submitted) > 10, (
                f"rclpy on {DISTRO} handed the queued callback over {len(submitted) - 2} times: "
                "rclpy issue 1452 looks fixed; executors.MainExecutor's override may be dropped")
        finally:
            release.set()
            ros_compat.shutdown_executor(executor, timeout_sec=5.0)
            for timer in timers:
                timer.cancel()
            node.destroy_node()


@pytest.mark.ros
def test_main_executor_reads_rclpy_internals_that_both_distros_have():
    with ros_context() as ctx:
        executor = MultiThreadedExecutor(num_threads=1, context=ctx)
        try:
            missing = [name for name in ("_executor", "_tasks_lock", "_tasks", "_futures",
                                         "_spin_once_impl", "wait_for_ready_callbacks")
                       if not hasattr(executor, name)]
        finally:
            ros_compat.shutdown_executor(executor, timeout_sec=1.0)
    assert not missing, f"rclpy on {DISTRO} lacks {missing}: executors.MainExecutor must adapt"


@pytest.mark.ros
def test_the_message_lost_event_is_supported_by_the_middleware():
    """The relay counts middleware loss through this event (docs/design.md §3)."""
    with ros_context() as ctx:
        node = rclpy.create_node("compat_lost", context=ctx)
        try:
            qos = QoSProfile(depth=10, history=HistoryPolicy.KEEP_ALL,
                             reliability=ReliabilityPolicy.RELIABLE)
            node.create_subscription(
                String, "compat_lost", lambda _m: None, qos,
                event_callbacks=SubscriptionEventCallbacks(message_lost=lambda _i: None))
        finally:
            node.destroy_node()


def test_lifecycle_and_parameter_callbacks_exist_on_this_distro():
    from rclpy.lifecycle import LifecycleNode, State, TransitionCallbackReturn
    from rclpy.node import Node

    assert {"on_configure", "on_activate", "on_deactivate", "on_cleanup", "on_shutdown"} <= set(
        dir(LifecycleNode))
    assert TransitionCallbackReturn.SUCCESS and State
    assert hasattr(Node, "add_post_set_parameters_callback")
    assert hasattr(Node, "add_on_set_parameters_callback")
    # the relay gives its lifecycle services a callback group of their own (node.py)
    from rclpy.lifecycle.node import LifecycleNodeMixin

    assert "callback_group" in inspect.signature(LifecycleNodeMixin.__init__).parameters


def _graph_names(timeout: float = 3.0) -> set[str]:
    """Node names another participant sees, after discovery has had `timeout` s."""
    with ros_context() as ctx:
        probe = rclpy.create_node("compat_graph_probe", context=ctx)
        time.sleep(timeout)
        names = {name for name, _ in probe.get_node_names_and_namespaces()}
        probe.destroy_node()
    return names - {"compat_graph_probe"}


@pytest.mark.ros
def test_a_destroyed_lifecycle_node_stays_in_the_graph_unless_its_state_machine_goes_too():
    """The gap destroy_lifecycle_node() fills: with only destroy_node (and the node kept
    referenced, as a spinning relay's callbacks keep it) the node is still announced; with the
    helper it is gone. If the first half fails, rclpy destroys the state machine itself now."""
    from rclpy.lifecycle import LifecycleNode

    kept = []
    with ros_context() as ctx:
        node = LifecycleNode("compat_lifecycle_plain", context=ctx)
        node.destroy_node()
        kept.append(node)
    with ros_context() as ctx:
        node = LifecycleNode("compat_lifecycle_helper", context=ctx)
        ros_compat.destroy_lifecycle_node(node)
        kept.append(node)
    names = _graph_names()
    assert "compat_lifecycle_plain" in names
    assert "compat_lifecycle_helper" not in names


@pytest.mark.ros
@KNOWN
def test_content_filter_options_only_on_rclpy_9_and_either_way_the_middleware_filters():
    """Kilted's rclpy takes content_filter_options at create_subscription; Jazzy's does not, and
    ros_compat sets the filter through its rcl. Both: Fast DDS then filters (a foreign session's
    message never reaches the callback)."""
    import importlib.util

    from rclpy.node import Node

    has_options = importlib.util.find_spec("rclpy.subscription_content_filter_options")
    assert (has_options is not None) == RCLPY_9, (
        f"rclpy on {DISTRO}: ContentFilterOptions {'present' if has_options else 'absent'}; "
        "ros_compat.content_filtered_subscription picks its path by that")
    from flowedge_relay_msgs.msg import ActionMessage

    qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
    with ros_context() as ctx:
        node = Node("cft_probe", context=ctx)
        got: list[str] = []
        sub, filtered = ros_compat.content_filtered_subscription(
            node, ActionMessage, "cft_probe", lambda m: got.append(m.session_id), qos,
            "session_id = %0", ["'mine'"])
        pub = node.create_publisher(ActionMessage, "cft_probe", qos)
        assert wait_for(lambda: pub.get_subscription_count() >= 1, 10)
        for session in ("theirs", "mine"):
            pub.publish(ActionMessage(session_id=session))
        executor = rclpy.executors.SingleThreadedExecutor(context=ctx)
        executor.add_node(node)
        end = time.monotonic() + 5
        while time.monotonic() < end and not got:
            executor.spin_once(timeout_sec=0.1)
        executor.spin_once(timeout_sec=0.3)
        executor.shutdown()
        node.destroy_node()
    if rclpy.get_rmw_implementation_identifier() == "rmw_fastrtps_cpp":
        assert filtered and got == ["mine"]
    else:
        assert got[-1] == "mine"
