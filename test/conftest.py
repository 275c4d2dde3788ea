"""Shared pytest setup: keep DDS on this machine and in a domain of its own per test run, and
keep ROS out of the tests not marked `ros` (`pytest -m "not ros"` runs the fast part)."""

import os

import pytest

# A test run must not see (or be seen by) another run or a relay on the same host: pick a domain
# from the process id unless the caller chose one. Set before rclpy is imported anywhere.
os.environ.setdefault("ROS_DOMAIN_ID", str(100 + os.getpid() % 100))
os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")

# The C scheduling core (flowedge_relay._fer_core) is built in place if missing or stale, before
# any test module imports flowedge_relay.core.
import _core_build  # noqa: E402

_core_build.ensure_built()

#: what a test not marked ros gets as ROS_DOMAIN_ID: rcl_init refuses it, so a process the test
#: starts cannot start ROS either
NO_ROS_DOMAIN = "not_a_ros_test"


@pytest.fixture(autouse=True)
def _ros_only_in_ros_tests(request, monkeypatch):
    """A test that starts ROS (an rclpy context, a relay, DDS pub/sub, a process that does) is
    marked `ros` (pytest.ini); in any other test an rclpy context fails the test, and so does
    rcl_init in a process it starts (ROS_DOMAIN_ID is not a number there)."""
    if request.node.get_closest_marker("ros") is not None:
        return
    from rclpy.context import Context

    def refuse(context, *args, **kwargs):
        pytest.fail(f"{request.node.nodeid} starts a ROS context but is not marked ros",
                    pytrace=False)

    monkeypatch.setenv("ROS_DOMAIN_ID", NO_ROS_DOMAIN)
    monkeypatch.setattr(Context, "init", refuse)
