# SPDX-License-Identifier: Apache-2.0
"""Everything that differs between the ROS 2 distros the relay runs on, in one place.

Jazzy (LTS) ships rclpy 7 and rcl 9.2; Kilted ships rclpy 9 and rcl 10.1. The relay's code is
written once against the helpers here, which behave the same on both. Each difference has a test
in test/test_ros_compat.py that pins what the installed distro does, so an upgrade that changes
it fails there, naming this module, rather than somewhere deep in a relay test.

Differences, and where they are handled:
- `rclpy.init()` returns None on rclpy 7 and a context manager on rclpy 9: `initialized()`.
- `Executor.shutdown()` takes `(timeout_sec)` on rclpy 7 and `(timeout_sec, *, wait_for_threads)`
  on rclpy 9, whose MultiThreadedExecutor also shuts its thread pool down there (rclpy 7 leaves
  the pool to the interpreter's exit): `shutdown_executor()` does both the same way everywhere.

The same gap on both, filled here:
- rclpy's LifecycleNodeMixin never destroys its state machine, which holds the node's handle:
  after `destroy_node` the node stays in the graph, with its services, until the garbage
  collector frees it (a later node of the same name then shares the graph with a ghost, whose
  services answer `wait_for_service`). `destroy_lifecycle_node()` destroys it too.

The same on both, checked and used directly:
- MultiThreadedExecutor hands a callback still queued in its pool to the pool again on every
  spin (rclpy issue 1452), and keeps the private fields `executors.MainExecutor` relies on.
- `SubscriptionEventCallbacks(message_lost=...)` and `UnsupportedEventTypeError`.
- rcl's serialized publish, which `csrc/fer_publish.c` binds from the librcl rclpy loaded: the
  same signature and `rcl_serialized_message_t` in rcl 9.2 and 10.1 (test/test_publish.py).
- `rclpy.lifecycle`: `LifecycleNodeMixin(callback_group=...)` (the relay's lifecycle services in
  a group of their own), `TransitionCallbackReturn`, the `~/change_state` / `~/get_state`
  services and `~/transition_event`; parameter descriptors, the on-set (validate) and post-set
  parameters callbacks (a model swap loads in the first and switches in the second).

What is identical on both is used directly and listed here only so a reader knows it was
checked. Nothing here decides by version number: a colcon workspace on a system install has no
package metadata to read, so each helper works on either behaviour as it finds it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import rclpy
from rclpy.context import Context
from rclpy.executors import Executor

#: the distros this package is built and tested against, the default first
SUPPORTED_DISTROS = ("jazzy", "kilted")


def distro() -> str:
    """The ROS 2 distro this process runs on, as the environment names it (ROS_DISTRO is set by
    a sourced ROS 2 install and by scripts/env.sh); 'unknown' if nothing says."""
    return os.environ.get("ROS_DISTRO", "") or "unknown"


@contextmanager
def initialized(args: list[str] | None = None, *, context: Context | None = None,
                domain_id: int | None = None,
                signal_handler_options=None) -> Iterator[Context]:
    """`rclpy.init(...)` for the block's duration, then `try_shutdown`, on every distro.

    rclpy 9's init returns a context manager that does exactly this; rclpy 7's returns None, so
    `with rclpy.init(...)` fails there. Yields the context that was initialised."""
    ctx = context if context is not None else rclpy.get_default_context()
    rclpy.init(args=args, context=context, domain_id=domain_id,
               signal_handler_options=signal_handler_options)
    try:
        yield ctx
    finally:
        rclpy.try_shutdown(context=context)


def shutdown_executor(executor: Executor, timeout_sec: float | None = None,
                      wait_for_threads: bool = True) -> bool:
    """Shut `executor` down and, for a MultiThreadedExecutor, its thread pool too.

    rclpy 9's MultiThreadedExecutor.shutdown takes `wait_for_threads` and shuts its pool down;
    rclpy 7's takes no such argument and leaves the pool's threads for the interpreter's exit.
    Here the pool (where there is one) is shut down first, then the base Executor.shutdown runs,
    so both distros end in the same state. Returns what Executor.shutdown returns."""
    pool = getattr(executor, "_executor", None)  # MultiThreadedExecutor's ThreadPoolExecutor
    if pool is not None:
        pool.shutdown(wait=wait_for_threads)
    return Executor.shutdown(executor, timeout_sec)



def destroy_lifecycle_node(node) -> None:
    """`node.destroy_node()` for a node with rclpy's LifecycleNodeMixin, then its lifecycle state
    machine, so the node leaves the graph now (see the module docstring)."""
    from rclpy.node import Node

    Node.destroy_node(node)
    machine = getattr(node, "_state_machine", None)  # LifecycleNodeMixin's, rclpy 7 and 9
    if machine is not None:
        machine.destroy_when_not_in_use()
