# SPDX-License-Identifier: Apache-2.0
"""rcl's C functions, from the librcl and librcutils that rclpy itself loaded.

The C publisher (csrc/fer_publish.c) and the C request intake (csrc/fer_intake.c) call rcl
directly, without the GIL, on the handles rclpy created; they must call the very library rclpy
loaded, never a second copy. csrc/fer_rcl.h declares what is used: the same signatures in rcl 9.2
(Jazzy) and 10.1 (Kilted).
"""

from __future__ import annotations

import ctypes
import functools
import os

from flowedge_relay.core import ffi


class RclUnavailable(RuntimeError):
    """rcl's functions cannot be found in this process: use the rclpy path."""


@functools.cache
def loaded_library(name: str) -> ctypes.CDLL:
    """The copy of shared library `name` (e.g. librcl.so) this process already loaded.

    dlopen with RTLD_NOLOAD returns the mapped copy by its soname and never loads a second one.
    It replaces a scan of /proc/self/maps, which took the request thread 8-18 s to read at a
    relay's start on a 2-vCPU VM while other threads were mapping memory: requests sent
    meanwhile waited, and their deadlines ran out."""
    try:
        return ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError as exc:
        raise RclUnavailable(f"{name} is not loaded in this process") from exc


def _function(library: str, name: str, c_type: str):
    try:
        address = ctypes.cast(getattr(loaded_library(library), name), ctypes.c_void_p).value
    except AttributeError as exc:
        raise RclUnavailable(f"{name}: {exc}") from exc
    return ffi.cast(c_type, address)


def publish_functions() -> tuple[object, object]:
    """(rcl_publish_serialized_message, rcutils_reset_error) for fer_publish_run."""
    return (_function("librcl.so", "rcl_publish_serialized_message", "fer_rcl_publish_fn"),
            _function("librcutils.so", "rcutils_reset_error", "fer_rcl_reset_error_fn"))


def take_functions():
    """A struct fer_rcl_take (take, set_callback, reset_error) for a take loop (fer_take.h)."""
    fns = ffi.new("struct fer_rcl_take *")
    fns.take = _function("librcl.so", "rcl_take_serialized_message", "fer_rcl_take_fn")
    fns.set_callback = _function("librcl.so", "rcl_subscription_set_on_new_message_callback",
                                 "fer_rcl_set_callback_fn")
    fns.reset_error = _function("librcutils.so", "rcutils_reset_error", "fer_rcl_reset_error_fn")
    return fns
