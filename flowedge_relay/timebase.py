# SPDX-License-Identifier: Apache-2.0
"""ROS time in, monotonic nanoseconds out: the one place where clocks and stamps are converted.

Producers stamp deadlines and origins in ROS time (which may be simulated or jump with NTP); the
core schedules on CLOCK_MONOTONIC. Each arrival reads both clocks once and converts relative to
that pair, saturating instead of wrapping (docs/design.md §5).
"""

from __future__ import annotations

from builtin_interfaces.msg import Time

NS_PER_S = 1_000_000_000
UINT64_MAX = 2**64 - 1
# builtin_interfaces/Time holds int32 seconds: the latest instant a stamp can carry.
ROS_TIME_MAX_NS = (2**31 - 1) * NS_PER_S + NS_PER_S - 1
NO_DEADLINE = 0
# A deadline that had already passed at arrival maps to this (any value <= now works; 0 would
# mean "no deadline").
PASSED = 1


def stamp_ns(stamp) -> int:
    """builtin_interfaces/Time -> integer nanoseconds (0 stays 0 = unset)."""
    return stamp.sec * NS_PER_S + stamp.nanosec


def ros_time(ns: int) -> Time:
    """Integer nanoseconds -> builtin_interfaces/Time, saturating, never wrapping: ns <= 0 gives
    the zero stamp (which messages read as unset / no deadline) and ns past the int32 seconds a
    stamp can hold gives the latest stamp."""
    ns = min(max(ns, 0), ROS_TIME_MAX_NS)
    return Time(sec=ns // NS_PER_S, nanosec=ns % NS_PER_S)


def deadline_to_monotonic(deadline_ros_ns: int, now_ros_ns: int, now_mono_ns: int) -> int:
    """Absolute ROS-time deadline -> absolute monotonic deadline; 0 (none) stays 0."""
    if deadline_ros_ns == 0:
        return NO_DEADLINE
    if deadline_ros_ns <= now_ros_ns:
        return PASSED
    return min(now_mono_ns + (deadline_ros_ns - now_ros_ns), UINT64_MAX)


def instant_to_monotonic(t_ros_ns: int, now_ros_ns: int, now_mono_ns: int) -> int:
    """Any ROS-time instant, past or future (a chunk's prefix_start), on the monotonic clock,
    saturating at 1 and UINT64_MAX (0 is kept for "unset")."""
    return min(max(now_mono_ns + (t_ros_ns - max(now_ros_ns, 0)), 1), UINT64_MAX)


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
