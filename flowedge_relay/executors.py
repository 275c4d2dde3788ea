# SPDX-License-Identifier: Apache-2.0
"""Executors that run only some callback groups of their nodes.

rclpy has no per-callback-group executor assignment (rclcpp's add_callback_group), yet the request
path must spin on a thread that does nothing else: a SingleThreadedExecutor receives about 3,500
messages/s here while a shared MultiThreadedExecutor manages about 650 (see README). So the relay
node is added to two executors, each filtering entities by callback group: the request executor
runs only the request group, the main executor everything else.

MainExecutor also hands each ready callback to its thread pool once (see _spin_once_impl): rclpy
9's MultiThreadedExecutor hands a callback that waits in the pool's queue again and again
without ever waiting (rclpy issue 1452), a loop that holds the GIL and starves every other thread
of the process (the request thread, the workers, the publisher thread) whenever the pool falls
behind, e.g. on a loaded host.

`EventPoll` takes QoS events (the request subscriptions' MESSAGE_LOST) without any executor
waiting on them: rmw_fastrtps wakes a wait set that holds a subscription's event on every message
that subscription receives, so a main executor waiting on the request subscriptions' events woke
for every request, rebuilt its wait set in Python and took a CPU from the C intake thread just as
that thread had a request to decide.

`take_waiting` is what a subscription callback calls to take the messages already waiting behind
its own without an executor trip each (the relay's request callback, the bench client's answers).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future as PoolFuture
from concurrent.futures import wait as wait_for_pool
from contextlib import ExitStack

from rclpy.callback_groups import CallbackGroup
from rclpy.event_handler import EventHandler
from rclpy.exceptions import InvalidHandle
from rclpy.executors import (
    ConditionReachedException,
    ExternalShutdownException,
    MultiThreadedExecutor,
    ShutdownException,
    SingleThreadedExecutor,
    TimeoutException,
)
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.node import Node
from rclpy.task import Task

from flowedge_relay.ros_compat import shutdown_executor

#: the longest a spin waits for the pool to start a callback it already holds: bounds how late
#: the spinning thread sees a stop request while every pool thread is busy
POOL_WAIT_S = 0.1


class _GroupFilter:
    """Executor mixin: execute only entities in (or, with exclude, not in) the given groups,
    and never the excluded entities (rclpy builds its wait set from what can_execute allows, so
    an excluded subscription is not even waited on)."""

    def _set_groups(self, groups: Iterable[CallbackGroup], exclude: bool,
                    entities: Iterable[object] = ()) -> None:
        self._groups = frozenset(groups)
        self._exclude = exclude
        self._excluded_entities = frozenset(id(e) for e in entities)
        #: entities looked at while building wait sets: each wake of the executor, ready work
        #: or not, rebuilds its wait set and asks can_execute once per entity
        self.entity_checks = 0

    def can_execute(self, entity) -> bool:
        self.entity_checks += 1
        if (entity.callback_group in self._groups) == self._exclude:
            return False
        if id(entity) in self._excluded_entities:
            return False
        return super().can_execute(entity)


class RequestExecutor(_GroupFilter, SingleThreadedExecutor):
    """Spins only the given groups of the given nodes, on the one thread that calls spin().

    The nodes are never `add_node`-ed here: Executor.add_node sets node.executor, whose setter
    removes the node from the main executor. Instead the public `get_nodes()` (which rclpy's
    wait-set builder reads) answers this executor's own list, so one node can sit in the main
    executor (node.executor) and be read, filtered by group, by this one. Both executors only
    read the node's entity lists. Public API only (Executor.get_nodes / can_execute / wake);
    test/test_executors.py checks that rclpy still builds its wait set from get_nodes().
    """

    def __init__(
        self, nodes: Iterable[Node], groups: Iterable[CallbackGroup], *, context=None
    ) -> None:
        super().__init__(context=context)
        self._set_groups(groups, exclude=False)
        self._request_nodes = tuple(nodes)
        self.wake()  # rebuild the wait set with these nodes' entities

    def get_nodes(self) -> list[Node]:
        return list(self._request_nodes)


class MainExecutor(_GroupFilter, MultiThreadedExecutor):
    """Everything but the excluded groups and entities: timers, parameter services, co-located
    nodes (and, with the C intake, the request subscriptions' MESSAGE_LOST handlers, not the
    subscriptions themselves: the intake thread takes from them)."""

    def __init__(
        self, excluded: Iterable[CallbackGroup], *, excluded_entities: Iterable[object] = (),
        num_threads: int = 2, context=None
    ) -> None:
        super().__init__(num_threads=num_threads, context=context)
        self._set_groups(excluded, exclude=True, entities=excluded_entities)
        # callback task -> its work item in the pool, while that item has not finished
        self._in_pool: dict[Task, PoolFuture] = {}

    def _spin_once_impl(self, timeout_sec=None, wait_condition=lambda: False) -> None:
        """rclpy's MultiThreadedExecutor._spin_once_impl, less a busy loop (rclpy issue 1452).

        rclpy yields every callback task that is "not executing and not done" before it waits
        for new work, and a task the pool has not started yet is exactly that: each spin then
        returns at once with the same task and submits it again (Task.__call__ ignores the
        duplicates). While the pool is behind, the spinning thread loops through the wait-set
        code holding the GIL, adding ever more duplicate items to the pool's queue, and the
        request thread, the workers and the publisher thread barely run (measured with
        `make run RUN_ARGS="--model vision"` on 2 cores: ~5,000 spins/s, ~400 duplicates
        queued, requests reaching the relay at ~20/s of the ~45/s sent, answers seconds late).
        Here a task goes to the pool once; yielded again while that item is still queued or
        running, the spin waits (GIL released) for the pool to get to it, up to POOL_WAIT_S
        or timeout_sec. A coroutine task the pool ran but left pending is resubmitted as before.
        """
        try:
            handler, _, _ = self.wait_for_ready_callbacks(timeout_sec, None, wait_condition)
        except (ExternalShutdownException, ShutdownException, TimeoutException,
                ConditionReachedException):
            return
        queued = self._in_pool.get(handler)
        if queued is not None and not queued.done():
            limit = POOL_WAIT_S if timeout_sec is None or timeout_sec < 0 else timeout_sec
            wait_for_pool([queued], timeout=min(limit, POOL_WAIT_S))
        else:
            if queued is None:
                self._futures.append(handler)
            self._in_pool[handler] = self._executor.submit(handler)
        for future in self._futures[:]:
            if future.done():
                self._futures.remove(future)
                self._in_pool.pop(future, None)
                future.result()  # raise any exceptions, as rclpy does

    def shutdown(self, timeout_sec: float | None = None, *, wait_for_threads: bool = True) -> bool:
        """Let callbacks already handed to the thread pool finish, then shut down; call it
        once spin() has returned.

        rclpy's MultiThreadedExecutor.shutdown destroys the executor's guard condition before
        it waits for its pool, so a callback queued just before Ctrl-C fails on that guard
        ("cannot use Destroyable because destruction was requested") and, its future never
        read, prints "The following exception was never retrieved" at exit. Draining the pool
        first keeps the guard (and the nodes) alive for them; then every future is read here.
        """
        done = shutdown_executor(self, timeout_sec, wait_for_threads)
        with self._tasks_lock:
            tasks = [task for task, _, _ in self._tasks]
        futures, self._futures = self._futures, []
        for future in {*futures, *tasks}:
            if future.done() and (exc := future.exception()) is not None:
                # a callback that failed for a reason of its own (not our teardown): as spin()
                # would, raise it rather than hide it
                if not isinstance(exc, InvalidHandle) and self.context.ok():
                    raise exc
        return done


class EventPoll:
    """Takes the events of `handlers` when asked (non-blocking) and runs their callbacks on the
    caller's thread: for events that must be counted but need no prompt answer, so that no
    executor waits on them (see the module docstring)."""

    def __init__(self, handlers: Iterable[EventHandler], context) -> None:
        self._handlers = list(handlers)
        self._context = context

    def poll(self) -> int:
        """Run the callback of each handler whose event is pending; how many ran."""
        if not self._handlers or not self._context.ok():
            return 0
        taken = []
        try:
            # as rclpy's executor does: every handle stays in use (its destruction deferred) from
            # building the wait set to taking the events, so a node destroyed on another thread
            # meanwhile cannot free an event under the wait
            with ExitStack() as in_use:
                for handler in self._handlers:
                    in_use.enter_context(handler)
                in_use.enter_context(self._context.handle)
                wait_set = _rclpy.WaitSet(0, 0, 0, 0, 0, len(self._handlers),
                                          self._context.handle)
                for handler in self._handlers:
                    handler.add_to_wait_set(wait_set)
                wait_set.wait(0)
                for handler in self._handlers:
                    if handler.is_ready(wait_set) and (data := handler.take_data()):
                        taken.append((handler, data))
        except InvalidHandle:  # a subscription or the context destroyed under it (teardown)
            return 0
        for handler, data in taken:
            handler.callback(data)
        return len(taken)


def take_waiting(sub, on_message: Callable[[object], None], limit: int,
                 stop: threading.Event | None = None) -> None:
    """Hand up to `limit` messages already waiting on `sub` to `on_message`, without an executor
    trip each: under load a callback that drains its subscription saves the executor's wait-set
    rebuild per message. Stops at an empty queue, a subscription destroyed under it (teardown)
    or `stop`. Call it only from the callback of `sub` (the one thread that takes from it)."""
    handle, msg_type = sub.handle, sub.msg_type
    for _ in range(limit):
        if stop is not None and stop.is_set():
            return
        try:
            with handle:
                taken = handle.take_message(msg_type, sub.raw)
        except InvalidHandle:  # destroyed during teardown
            return
        if taken is None:
            return
        on_message(taken[0])


def spin_until(executor, stop: threading.Event, period_s: float = 0.1) -> None:
    """Thread target: spin until `stop` is set or the context shuts down.

    spin_once with a timeout rather than spin(): a thread blocked in spin() does not always
    wake when another thread shuts the executor down after the context is gone, and teardown
    must join every thread promptly.
    """
    context = executor.context
    try:
        while not stop.is_set() and context.ok():
            executor.spin_once(timeout_sec=period_s)
    except ExternalShutdownException:
        pass
    finally:
        executor.shutdown(timeout_sec=0)
