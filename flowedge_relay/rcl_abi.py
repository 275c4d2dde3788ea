# SPDX-License-Identifier: Apache-2.0
"""rcl's C functions, from the librcl and librcutils that rclpy itself loaded, and the generated
C type support of flowedge_relay_msgs.

The C publisher (csrc/fer_publish.c) and the C request intake (csrc/fer_intake.c) call rcl
directly, without the GIL, on the handles rclpy created; they must call the very library rclpy
loaded, never a second copy. csrc/fer_rcl.h declares what is used: the same signatures in rcl 9.2
(Jazzy) and 10.1 (Kilted). The wire format of both comes from the messages' own type support
(csrc/fer_wire.h): load_wire hands the C core the introspection handles colcon generated from the
.msg files, before any C path reads a message.
"""

from __future__ import annotations

import ctypes
import functools
import os

from flowedge_relay.core import check, ffi, lib

MSGS = "flowedge_relay_msgs"


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


@functools.cache
def _msgs_library(kind: str) -> ctypes.CDLL:
    """libflowedge_relay_msgs__<kind>.so: the copy already loaded, else the one colcon installed
    (found through the ament index, as rclpy finds the package)."""
    name = f"lib{MSGS}__{kind}.so"
    try:
        return ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        pass
    try:
        from ament_index_python.packages import PackageNotFoundError, get_package_prefix

        return ctypes.CDLL(os.path.join(get_package_prefix(MSGS), "lib", name))
    except (ImportError, PackageNotFoundError, OSError) as exc:
        raise RclUnavailable(f"{name}: {exc}") from exc


def type_support(kind: str, message: str) -> int:
    """The address of `message`'s rosidl_message_type_support_t for type support `kind`
    (rosidl_typesupport_c or rosidl_typesupport_introspection_c)."""
    symbol = f"{kind}__get_message_type_support_handle__{MSGS}__msg__{message}"
    try:
        getter = getattr(_msgs_library(kind), symbol)
    except AttributeError as exc:
        raise RclUnavailable(f"{symbol}: {exc}") from exc
    getter.restype = ctypes.c_void_p
    getter.argtypes = []
    return getter()


@functools.cache
def load_wire() -> None:
    """Compile the C core's plans of InferenceRequest, ActionMessage and PoolSpill from their
    introspection type support, once per process (before any C path reads a message or writes a
    handover). A message whose .msg no longer has a field the C views bind raises here, loudly,
    not at the first request."""
    for which, message in ((lib.FER_WIRE_REQUEST, "InferenceRequest"),
                           (lib.FER_WIRE_ANSWER, "ActionMessage"),
                           (lib.FER_WIRE_SPILL, "PoolSpill")):
        handle = type_support("rosidl_typesupport_introspection_c", message)
        check(lib.fer_wire_load(which, ffi.cast("void *", handle)))


@functools.cache
def load_serializer() -> None:
    """fer_action_cdr's serializer: rmw_serialize of the rmw rclpy loaded, with ActionMessage's
    rosidl_typesupport_c handle (what rclpy.serialization uses)."""
    # the rmw_implementation shim where rcl loads one, else the implementation it picks: the one
    # RMW_IMPLEMENTATION names, Fast DDS by default (as rmw_implementation chooses)
    serialize = None
    implementation = f"lib{os.environ.get('RMW_IMPLEMENTATION') or 'rmw_fastrtps_cpp'}.so"
    for library in ("librmw_implementation.so", implementation):
        try:
            serialize = _function(library, "rmw_serialize", "fer_rmw_serialize_fn")
            break
        except RclUnavailable:
            continue
    if serialize is None:
        raise RclUnavailable("rmw_serialize: no rmw library of this process exports it")
    check(lib.fer_wire_set_serializer(
        serialize,
        ffi.cast("void *", type_support("rosidl_typesupport_c", "ActionMessage")),
        _function("librcutils.so", "rcutils_reset_error", "void (*)(void)")))


def publish_functions() -> tuple[object, object]:
    """(rcl_publish, rcutils_reset_error) for fer_publish_run: it hands rcl the generated
    ActionMessage struct, which the middleware serializes."""
    load_wire()
    return (_function("librcl.so", "rcl_publish", "fer_rcl_publish_fn"),
            _function("librcutils.so", "rcutils_reset_error", "fer_rcl_reset_error_fn"))


def serialized_publish_functions() -> tuple[object, object]:
    """(rcl_publish_serialized_message, rcutils_reset_error): the intake bench's client publishes
    bytes it wrote (tools/csrc/fer_loadgen.c)."""
    return (_function("librcl.so", "rcl_publish_serialized_message", "fer_rcl_publish_fn"),
            _function("librcutils.so", "rcutils_reset_error", "fer_rcl_reset_error_fn"))


def take_functions():
    """A struct fer_rcl_take (take, set_callback, reset_error) for a take loop (fer_take.h)."""
    load_wire()
    fns = ffi.new("struct fer_rcl_take *")
    fns.take = _function("librcl.so", "rcl_take_serialized_message", "fer_rcl_take_fn")
    fns.set_callback = _function("librcl.so", "rcl_subscription_set_on_new_message_callback",
                                 "fer_rcl_set_callback_fn")
    fns.reset_error = _function("librcutils.so", "rcutils_reset_error", "fer_rcl_reset_error_fn")
    return fns
