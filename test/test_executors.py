# SPDX-License-Identifier: Apache-2.0
"""The relay's two executors: who runs what, and a teardown that leaves nothing behind.

RequestExecutor relies on one rclpy behaviour, public but worth pinning: the wait set is built
from `Executor.get_nodes()`. If an rclpy upgrade stops doing that, the request thread receives
nothing; the split test then fails with a message that says where to look.

rclpy's MultiThreadedExecutor.shutdown destroys its guard condition before waiting for its
thread pool; a callback handed to the pool just before Ctrl-C then fails on that guard and rclpy
prints "The following exception was never retrieved: cannot use Destroyable because destruction
was requested" at exit. The teardown test holds the pool's threads busy on
purpose, so a handler is certainly still queued when shutdown starts.

rclpy's MultiThreadedExecutor hands a callback still queued in its pool to the pool again on
every spin, without waiting (rclpy issue 1452): a busy loop holding the GIL that starved the
relay's other threads under load (`make run RUN_ARGS="--model vision"`). The queued-callback test
holds every pool thread busy on purpose, so one callback certainly waits in the queue.
"""

from __future__ import annotations

import gc
import threading
import time

import pytest
import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.event_handler import SubscriptionEventCallbacks
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
from ros_helpers import ros_context, wait_for
from std_msgs.msg import String

from flowedge_relay.executors import MainExecutor, RequestExecutor, spin_until

pytestmark = pytest.mark.ros  # every test here starts ROS (conftest.py)

CHANGED = (
    "rclpy no longer builds its wait set from Executor.get_nodes(), or no longer asks "
    "can_execute(): RequestExecutor (flowedge_relay/executors.py) must follow that change"
)


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


def test_main_executor_shutdown_lets_queued_callbacks_finish_cleanly(capfd):
    release = threading.Event()
    started = threading.Semaphore(0)

    def blocking_callback() -> None:
        started.release()
        release.wait(30)

    with ros_context() as ctx:
        node = rclpy.create_node("executor_teardown", context=ctx)
        group = ReentrantCallbackGroup()
        timers = [node.create_timer(0.001, blocking_callback, callback_group=group)
                  for _ in range(3)]
        executor = MainExecutor([], num_threads=2, context=ctx)
        executor.add_node(node)

        def three_handed_over() -> bool:
            executor.spin_once(timeout_sec=0.05)
            return len(executor._futures) >= 3

        # three ready timers, two pool threads: two handlers run (blocked), the third is queued
        assert wait_for(three_handed_over, 10)
        assert started.acquire(timeout=10) and started.acquire(timeout=10)
        handlers = list(executor._futures)
        assert sum(not h.done() for h in handlers) == 3
        shutdown = threading.Thread(target=executor.shutdown, kwargs={"timeout_sec": 5.0})
        shutdown.start()
        shutdown.join(0.2)
        assert shutdown.is_alive()  # it waits for the pool, the queued handler included
        release.set()
        shutdown.join(30)
        assert not shutdown.is_alive()
        assert all(h.done() for h in handlers)
        errors = [h.exception() for h in handlers]
        assert errors == [None, None, None]
        for timer in timers:
            timer.cancel()
        node.destroy_node()
        handlers.clear()
        executor = None
        gc.collect()
    assert "never retrieved" not in capfd.readouterr().err


def test_main_executor_hands_a_queued_callback_to_its_pool_once_and_waits_for_it():
    release = threading.Event()
    started = threading.Semaphore(0)
    ran = threading.Event()

    def blocking_callback() -> None:
        started.release()
        release.wait(30)

    with ros_context() as ctx:
        node = rclpy.create_node("executor_queued", context=ctx)
        # one group each: only the pool's two threads, both held, keep the third from running
        timers = [node.create_timer(0.01, blocking_callback,
                                    callback_group=MutuallyExclusiveCallbackGroup())
                  for _ in range(2)]
        executor = MainExecutor([], num_threads=2, context=ctx)
        executor.add_node(node)
        submitted: list[object] = []
        pool_submit = executor._executor.submit

        def counting_submit(fn, *args, **kwargs):
            submitted.append(fn)
            return pool_submit(fn, *args, **kwargs)

        executor._executor.submit = counting_submit

        def spin_until(condition) -> bool:
            return wait_for(lambda: (executor.spin_once(timeout_sec=0.05), condition())[1], 10)

        try:
            assert spin_until(lambda: len(submitted) >= 2)
            assert started.acquire(timeout=10) and started.acquire(timeout=10)
            timers.append(node.create_timer(0.01, ran.set,
                                            callback_group=MutuallyExclusiveCallbackGroup()))
            assert spin_until(lambda: len(submitted) >= 3)
            # the third callback waits in the pool's queue: for one second of spinning, each
            # spin waits for the pool (timeout 0.05 s) instead of handing it over again
            spins, end = 0, time.monotonic() + 1.0
            while time.monotonic() < end:
                executor.spin_once(timeout_sec=0.05)
                spins += 1
            assert len(submitted) == 3, (
                f"a queued callback was handed to the pool {len(submitted) - 2} times: the "
                "rclpy busy loop that MainExecutor._spin_once_impl exists to avoid"
            )
            assert spins <= 40, f"{spins} spins in 1 s: the spinning thread did not wait"
            assert not ran.is_set()
            release.set()
            assert spin_until(ran.is_set)
        finally:
            release.set()
            executor.shutdown(timeout_sec=5.0)
            for timer in timers:
                timer.cancel()
            node.destroy_node()


def test_the_rclpy_internals_main_executor_shutdown_reads_are_still_there():
    """MainExecutor.shutdown reads four private fields of rclpy's MultiThreadedExecutor (there
    is no public way to drain its pool first), and MainExecutor._spin_once_impl overrides a
    private method; this says so plainly when an upgrade moves them."""
    from rclpy.executors import MultiThreadedExecutor

    with ros_context() as ctx:
        executor = MultiThreadedExecutor(num_threads=1, context=ctx)
        try:
            missing = [name for name in ("_executor", "_tasks_lock", "_tasks", "_futures",
                                         "_spin_once_impl")
                       if not hasattr(executor, name)]
        finally:
            executor.shutdown(timeout_sec=1.0)
    assert not missing, (
        f"rclpy's MultiThreadedExecutor no longer has {missing}: MainExecutor.shutdown "
        "(flowedge_relay/executors.py) must be adapted to the new rclpy"
    )


def _main_checks_during_burst(exclude_group: bool, messages: int = 100) -> tuple[int, int]:
    """(MainExecutor.entity_checks while `messages` arrive 2 ms apart at a subscription with a
    MESSAGE_LOST handler, messages taken): the relay's arrangement with the C intake, the
    subscription's group excluded (exclude_group), or only the subscription itself (before).
    A plain thread takes the messages, as the C intake does, with no executor."""
    with ros_context() as ctx:
        node = Node("executor_burst", context=ctx)
        group = MutuallyExclusiveCallbackGroup()
        taken = [0]
        qos = QoSProfile(depth=10, history=HistoryPolicy.KEEP_ALL,
                         reliability=ReliabilityPolicy.RELIABLE)
        sub = node.create_subscription(
            String, "burst", lambda _m: None, qos, callback_group=group,
            event_callbacks=SubscriptionEventCallbacks(message_lost=lambda _i: None))
        pub = node.create_publisher(String, "burst", qos)
        if exclude_group:
            main = MainExecutor([group], context=ctx)
        else:
            main = MainExecutor([], excluded_entities=[sub], context=ctx)
        main.add_node(node)
        stop = threading.Event()

        def intake() -> None:
            while not stop.is_set():
                with sub.handle:
                    got = sub.handle.take_message(String, False)
                if got is None:
                    time.sleep(0.0005)
                else:
                    taken[0] += 1

        threads = [threading.Thread(target=intake),
                   threading.Thread(target=spin_until, args=(main, stop))]
        for t in threads:
            t.start()
        try:
            assert wait_for(lambda: pub.get_subscription_count() > 0, 10.0)
            time.sleep(0.3)  # the main executor's first wait set is built: count from here
            before = main.entity_checks
            for _ in range(messages):
                pub.publish(String(data="x"))
                time.sleep(0.002)  # one at a time, as a robot's requests come
            assert wait_for(lambda: taken[0] >= messages, 30.0), f"taken {taken[0]}"
            checks = main.entity_checks - before
        finally:
            stop.set()
            for t in threads:
                t.join(5.0)
            node.destroy_node()
        return checks, taken[0]


def test_with_the_c_intake_the_main_executor_does_not_wake_for_requests():
    """The relay's main executor leaves the request group alone with the C intake, event
    handlers included (EventPoll takes MESSAGE_LOST): rmw_fastrtps wakes a wait set holding a
    subscription's event on each of its messages, and the main executor then rebuilt its wait
    set per request, taking a CPU from the intake thread (the C intake's overhead tail). The
    witness is the arrangement before: it woke (checked its entities) for the messages."""
    checks, taken = _main_checks_during_burst(exclude_group=True)
    witness, _ = _main_checks_during_burst(exclude_group=False)
    assert taken >= 100
    # without requests it still wakes each spin_until period (0.1 s): 15 entities a time
    assert checks < 500, f"the main executor looked at its entities {checks} times"
    assert witness >= 1000, (
        f"with the event handler in its wait set the main executor looked at entities only "
        f"{witness} times for 100 messages: this RMW no longer wakes event waiters per message"
    )
