"""ROS time in, monotonic nanoseconds out: the one place where clocks are converted.

Producers stamp deadlines and origins in ROS time (which may be simulated or jump with NTP); the
core schedules on CLOCK_MONOTONIC. Each arrival reads both clocks once and converts relative to
that pair, saturating instead of wrapping (DESIGN.md section 5).
"""

from __future__ import annotations

UINT64_MAX = 2**64 - 1
NO_DEADLINE = 0
# A deadline that had already passed at arrival maps to this (any value <= now works; 0 would
# mean "no deadline").
PASSED = 1


def stamp_ns(stamp) -> int:
    """builtin_interfaces/Time -> integer nanoseconds (0 stays 0 = unset)."""
    return stamp.sec * 1_000_000_000 + stamp.nanosec


def deadline_to_monotonic(deadline_ros_ns: int, now_ros_ns: int, now_mono_ns: int) -> int:
    """Absolute ROS-time deadline -> absolute monotonic deadline; 0 (none) stays 0."""
    if deadline_ros_ns == 0:
        return NO_DEADLINE
    if deadline_ros_ns <= now_ros_ns:
        return PASSED
    return min(now_mono_ns + (deadline_ros_ns - now_ros_ns), UINT64_MAX)


def origin_to_monotonic(origin_ros_ns: int, now_ros_ns: int, now_mono_ns: int) -> int:
    """When the producer first issued the request, on the monotonic clock.

    An unset origin (0) or one in the future (clock skew between hosts) means "now": age 0, so
    a bad stamp can never make a request look older than it is.
    """
    if origin_ros_ns == 0 or origin_ros_ns >= now_ros_ns:
        return now_mono_ns
    return max(now_mono_ns - (now_ros_ns - origin_ros_ns), 0)


def monotonic_to_ros(mono_ns: int, now_ros_ns: int, now_mono_ns: int) -> int:
    """Monotonic instant -> ROS time, saturating at 0 and UINT64_MAX."""
    return min(max(now_ros_ns + (mono_ns - now_mono_ns), 0), UINT64_MAX)
