# SPDX-License-Identifier: Apache-2.0
"""A log-line throttle that costs one integer compare when it drops the line."""

from __future__ import annotations


class Throttle:
    """Lets a log line through at most once per period, for one integer compare otherwise.

    rclpy's `throttle_duration_sec` walks the caller's stack frames (and realpath()s their
    files) *before* it decides to drop the line: about 300 us per call here, more than
    deciding a valid request. A flood of invalid input must not pay that per message.
    """

    __slots__ = ("period_ns", "next_ns", "suppressed")

    def __init__(self, period_ns: int) -> None:
        self.period_ns = period_ns
        self.next_ns = 0
        self.suppressed = 0  # lines dropped since the last one let through

    def ready(self, now_ns: int) -> bool:
        if now_ns < self.next_ns:
            self.suppressed += 1
            return False
        self.next_ns = now_ns + self.period_ns
        return True
