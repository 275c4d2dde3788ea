# SPDX-License-Identifier: Apache-2.0
"""Spinning a relay node: its request thread, then the main executor until told to stop; and
stopping it in order."""

from __future__ import annotations

import threading

from rclpy.duration import Duration
from rclpy.executors import ExternalShutdownException

from flowedge_relay.executors import MainExecutor
from flowedge_relay.pool import FINALIZED

# At stop, how long the last answers (EXPIRED for admitted work the stop ends) may take to be
# acknowledged by reliable subscribers before the node, and with it the DDS writer, goes away:
# a writer deleted with answers unacknowledged loses them. Well inside launch's 5 s.
ANSWERS_ACK_WAIT_S = 1.0


def spin_relay(node, extra_nodes=(), context=None,
               stop: threading.Event | None = None) -> None:
    """Spin the relay (a node.RelayNode, and optional co-located nodes) until `stop` is set (cli,
    run_demo: a signal sets it), the relay is finalized (lifecycle shutdown: the transition's
    answer still goes out, the executor's shutdown waits for it) or the context shuts down (the
    harness)."""
    node.start_request_executor(context)
    groups, entities = node.main_executor_exclusions()
    executor = MainExecutor(groups, excluded_entities=entities, context=context or node.context)
    executor.add_node(node)
    for extra in extra_nodes:
        executor.add_node(extra)
    try:
        if stop is None:
            executor.spin()
        else:
            ctx = executor.context
            while not (stop.is_set() or node.finalized.is_set()) and ctx.ok():
                executor.spin_once(timeout_sec=0.1)
    except ExternalShutdownException:
        pass
    finally:
        executor.shutdown(timeout_sec=2.0)


def stop_in_order(relay, requests, actions, logger, pool=None) -> None:
    """Stop a relay node's intake (`requests`: request_topics.RequestTopics), then the relay's
    workers, then flush its outputs and wait for the `actions` publisher's answers to be
    acknowledged; then its relay `pool` (pool.RelayPool, or None) takes over what it never
    took. Whatever fails, every later stage still runs: the node's
    destroy_node closes the cores next, and nothing may still be running on them.

    rclpy's context shutdown destroys nodes while holding the context lock, and a spinning
    request thread waits on that same lock, so the request thread gets only a short join; it
    exits as soon as the context is gone."""
    if pool is not None:  # held work settles while the intake still reads the answers
        pool.settle_held()
    relay.stopping.set()
    requests.stop()
    try:
        requests.join(timeout=1.0)
    finally:
        try:
            relay.stop()
        finally:
            try:
                actions.wait_for_all_acked(Duration(seconds=ANSWERS_ACK_WAIT_S))
            except Exception as exc:  # the context already gone (the harness): nothing to wait
                logger.debug(f"answers not waited for at stop: {exc}")
            if pool is not None:
                pool.leave(FINALIZED)
