# SPDX-License-Identifier: Apache-2.0
"""Spinning a relay node: its request thread, then the main executor until told to stop."""

from __future__ import annotations

import threading

from rclpy.executors import ExternalShutdownException

from flowedge_relay.executors import MainExecutor


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
