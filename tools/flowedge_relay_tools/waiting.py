# SPDX-License-Identifier: Apache-2.0
"""Polling for a condition with a timeout: the one wait the tools and the tests share.

No ROS here, so code that drives the C core alone (and its tests) waits the same way as code
that talks to a relay over DDS (harness.py re-exports it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, period: float = 0.01) -> T:
    """Poll predicate every `period` s until it returns something true or `timeout` s pass;
    returns its last value (so a false one means the timeout passed)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(period)
    return predicate()
