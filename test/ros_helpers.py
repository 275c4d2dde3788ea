"""Helpers for tests that run real rclpy nodes over real DDS (no mocks)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import rclpy
from rclpy.context import Context
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node


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
