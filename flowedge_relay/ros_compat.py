# SPDX-License-Identifier: Apache-2.0
"""Everything that differs between the ROS 2 distros the relay runs on, in one place.

Jazzy (LTS) ships rclpy 7 and rcl 9.2; Kilted ships rclpy 9 and rcl 10.1. The relay's code is
written once against the helpers here, which behave the same on both. Each difference has a test
in test/test_ros_compat.py that pins what the installed distro does, so an upgrade that changes
it fails there, naming this module, rather than somewhere deep in a relay test.

Differences, and where they are handled:
- `rclpy.init()` returns None on rclpy 7 and a context manager on rclpy 9: `initialized()`.
- A content-filtered subscription: rclpy 9's `create_subscription` takes
  `content_filter_options` (`ContentFilterOptions`); rclpy 7's does not, but its rcl (9.2) and
  rmw_fastrtps set a filter on an existing subscription (`rcl_subscription_set_content_filter`):
  `content_filtered_subscription()` uses whichever the distro has, and says whether the
  middleware filters (False: the RMW cannot, and the caller filters itself).
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

import ctypes
import os
from collections.abc import Callable, Iterator, Sequence
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


class _StringArray(ctypes.Structure):
    """rcutils_string_array_t: size, data, then an rcutils_allocator_t (five pointers)."""

    _fields_ = [("size", ctypes.c_size_t), ("data", ctypes.c_void_p),
                ("allocator", ctypes.c_void_p * 5)]


class _ContentFilterOptions(ctypes.Structure):
    """rcl_subscription_content_filter_options_t (rcl 9.2 and 10.1): the rmw options, which are
    the expression and its parameters. Zero bytes are its zero-initialised value."""

    _fields_ = [("filter_expression", ctypes.c_char_p), ("expression_parameters", _StringArray)]


def _rcl_set_content_filter(subscription, expression: str, parameters: Sequence[str]) -> bool:
    """Set a content filter on an existing subscription through the librcl rclpy loaded; False
    where rcl or the RMW refuses (the subscription then receives everything)."""
    from flowedge_relay.rcl_abi import RclUnavailable, loaded_library

    try:
        rcl = loaded_library("librcl.so")
        init = rcl.rcl_subscription_content_filter_options_init
        set_filter = rcl.rcl_subscription_set_content_filter
        fini = rcl.rcl_subscription_content_filter_options_fini
        enabled = rcl.rcl_subscription_is_cft_enabled
    except (RclUnavailable, AttributeError):
        return False
    init.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                     ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(_ContentFilterOptions)]
    set_filter.argtypes = [ctypes.c_void_p, ctypes.POINTER(_ContentFilterOptions)]
    fini.argtypes = [ctypes.c_void_p, ctypes.POINTER(_ContentFilterOptions)]
    enabled.argtypes = [ctypes.c_void_p]
    enabled.restype = ctypes.c_bool
    reset = loaded_library("librcutils.so").rcutils_reset_error
    argv = (ctypes.c_char_p * max(len(parameters), 1))(*[p.encode() for p in parameters])
    options = _ContentFilterOptions()
    with subscription.handle:
        pointer = ctypes.c_void_p(subscription.handle.pointer)
        if init(pointer, expression.encode(), len(parameters), argv, ctypes.byref(options)) != 0:
            reset()
            return False
        try:
            ok = set_filter(pointer, ctypes.byref(options)) == 0
        finally:
            fini(pointer, ctypes.byref(options))
        if not ok:
            reset()
        return ok and bool(enabled(pointer))


def content_filtered_subscription(node, msg_type, topic: str, callback: Callable, qos,
                                  expression: str, parameters: Sequence[str],
                                  callback_group=None) -> tuple[object, bool]:
    """A subscription that receives only messages matching the DDS SQL `expression` (with %0..
    %n-1 taken from `parameters`), filtered by the middleware where it can. Returns (the
    subscription, whether the middleware filters); where it does not, every message arrives."""
    try:
        from rclpy.subscription_content_filter_options import ContentFilterOptions
    except ImportError:  # rclpy 7
        sub = node.create_subscription(msg_type, topic, callback, qos,
                                       callback_group=callback_group)
        return sub, _rcl_set_content_filter(sub, expression, parameters)
    options = ContentFilterOptions(filter_expression=expression,
                                   expression_parameters=list(parameters))
    sub = node.create_subscription(msg_type, topic, callback, qos, callback_group=callback_group,
                                   content_filter_options=options)
    return sub, bool(sub.is_cft_enabled)
