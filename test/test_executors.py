"""The relay's executors tear down without leaving failed callback tasks behind.

rclpy's MultiThreadedExecutor.shutdown destroys its guard condition before waiting for its
thread pool; a callback handed to the pool just before Ctrl-C then fails on that guard and rclpy
prints "The following exception was never retrieved: cannot use Destroyable because destruction
was requested" at exit (issue 14, item 7). Here the pool's threads are held busy on purpose, so
a handler is certainly still queued when shutdown starts.
"""

from __future__ import annotations

import gc
import threading

import rclpy
from rclpy.callback_groups import ReentrantCallbackGroup
from ros_helpers import ros_context, wait_for

from flowedge_relay.executors import MainExecutor


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
