# SPDX-License-Identifier: Apache-2.0
"""ROS-time to monotonic conversion: saturating, never wrapping, never making work look older."""

from hypothesis import given
from hypothesis import strategies as st

from flowedge_relay.timebase import (
    NO_DEADLINE,
    PASSED,
    UINT64_MAX,
    deadline_to_monotonic,
    monotonic_to_ros,
    origin_to_monotonic,
)

NOW_ROS = 1_700_000_000_000_000_000
NOW_MONO = 5_000_000_000


def test_deadline_in_future_keeps_its_distance():
    assert deadline_to_monotonic(NOW_ROS + 250_000, NOW_ROS, NOW_MONO) == NOW_MONO + 250_000


def test_no_deadline_stays_none():
    assert deadline_to_monotonic(0, NOW_ROS, NOW_MONO) == NO_DEADLINE


def test_passed_deadline_is_in_the_past_but_not_none():
    for deadline in (1, NOW_ROS - 1, NOW_ROS):
        assert deadline_to_monotonic(deadline, NOW_ROS, NOW_MONO) == PASSED
    assert PASSED != NO_DEADLINE and PASSED <= NOW_MONO


def test_deadline_near_end_of_time_saturates():
    far = UINT64_MAX
    assert deadline_to_monotonic(far, NOW_ROS, UINT64_MAX - 10) == UINT64_MAX


def test_origin_unset_or_in_future_means_age_zero():
    assert origin_to_monotonic(0, NOW_ROS, NOW_MONO) == NOW_MONO
    assert origin_to_monotonic(NOW_ROS + 10**9, NOW_ROS, NOW_MONO) == NOW_MONO


def test_origin_older_than_monotonic_epoch_saturates_at_zero():
    assert origin_to_monotonic(1, NOW_ROS, NOW_MONO) == 0
    assert origin_to_monotonic(NOW_ROS - 300, NOW_ROS, NOW_MONO) == NOW_MONO - 300


@given(
    st.integers(0, UINT64_MAX), st.integers(1, UINT64_MAX), st.integers(1, UINT64_MAX)
)
def test_results_stay_in_uint64(stamp, now_ros, now_mono):
    for value in (
        deadline_to_monotonic(stamp, now_ros, now_mono),
        origin_to_monotonic(stamp, now_ros, now_mono),
        monotonic_to_ros(stamp, now_ros, now_mono),
    ):
        assert 0 <= value <= UINT64_MAX
    assert origin_to_monotonic(stamp, now_ros, now_mono) <= now_mono


def test_ros_time_saturates_and_round_trips():
    """The one nanoseconds -> builtin_interfaces/Time conversion (there were six copies with three
    behaviours before): negative is the zero stamp, past int32 seconds the latest stamp."""
    from flowedge_relay.timebase import ROS_TIME_MAX_NS, ros_time, stamp_ns

    for ns in (0, 1, 999_999_999, 1_000_000_000, 1_700_000_000_123_456_789, ROS_TIME_MAX_NS):
        assert stamp_ns(ros_time(ns)) == ns
    assert stamp_ns(ros_time(-5)) == 0
    assert stamp_ns(ros_time(2**64)) == ROS_TIME_MAX_NS
    latest = ros_time(2**64)
    assert (latest.sec, latest.nanosec) == (2**31 - 1, 999_999_999)
