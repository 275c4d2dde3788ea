"""rcl's C functions, from the librcl and librcutils that rclpy itself loaded.

The C publisher (csrc/fer_publish.c) and the C request intake (csrc/fer_intake.c) call rcl
directly, without the GIL, on the handles rclpy created; they must call the very library rclpy
loaded, never a second copy. csrc/fer_rcl.h declares what is used: the same signatures in rcl 9.2
(Jazzy) and 10.1 (Kilted).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from flowedge_relay.core import ffi


class RclUnavailable(RuntimeError):
    """rcl's functions cannot be found in this process: use the rclpy path."""


def loaded_library(name: str) -> str:
    """The path of shared library `name` (e.g. librcl.so) as this process mapped it."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split(maxsplit=5)[-1]
        if path.endswith("/" + name):
            return path
    raise RclUnavailable(f"{name} is not loaded in this process")


def _function(library: str, name: str, c_type: str):
    try:
        address = ctypes.cast(getattr(ctypes.CDLL(loaded_library(library)), name),
                              ctypes.c_void_p).value
    except (OSError, AttributeError) as exc:
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
