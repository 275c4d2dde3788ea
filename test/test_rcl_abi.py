# SPDX-License-Identifier: Apache-2.0
"""rcl's functions for the C intake and publisher come from the copy of rcl that rclpy loaded."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import rclpy  # noqa: F401  (loads librcl and librcutils, as a relay process has)

from flowedge_relay import rcl_abi


def _mapped_path(name: str) -> str:
    for line in Path("/proc/self/maps").read_text().splitlines():
        if line.endswith("/" + name):
            return line.split(maxsplit=5)[-1]
    raise AssertionError(f"{name} is not mapped")


@pytest.mark.parametrize("library, symbol", [("librcl.so", "rcl_take_serialized_message"),
                                             ("librcutils.so", "rcutils_reset_error")])
def test_functions_are_those_of_the_mapped_copy(library, symbol):
    """The same address as the symbol in the file /proc/self/maps shows mapped: not a second
    copy, which would keep its own (empty) state."""
    ours = ctypes.cast(getattr(rcl_abi.loaded_library(library), symbol), ctypes.c_void_p).value
    mapped = ctypes.CDLL(_mapped_path(library))
    assert ours == ctypes.cast(getattr(mapped, symbol), ctypes.c_void_p).value
    assert rcl_abi.take_functions().take != rcl_abi.ffi.NULL


def test_a_library_this_process_did_not_load_is_unavailable():
    with pytest.raises(rcl_abi.RclUnavailable, match="not loaded"):
        rcl_abi.loaded_library("libflowedge_never_loaded.so")
