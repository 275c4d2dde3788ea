# SPDX-License-Identifier: Apache-2.0
"""Shared pytest setup: keep DDS on this machine and in a domain of its own per test run, and
keep ROS out of the tests not marked `ros` (`pytest -m "not ros"` runs the fast part)."""

import fcntl
import os
import tempfile

import pytest

#: the lock file of the domain this run holds, open until the process exits
_DOMAIN_LOCKS: list = []


def _claim_domain(first: int = 100, count: int = 100) -> int:
    """A ROS domain id in [first, first + count) that no other test run on this host holds: an
    flock on a file per id, held until this process exits. Two runs side by side with the same
    pid % count (it happened) shared a domain, and each relay answered the other's requests."""
    start = os.getpid() % count
    for k in range(count):
        domain = first + (start + k) % count
        lock = open(os.path.join(tempfile.gettempdir(), f"flowedge-ros-domain-{domain}.lock"), "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        _DOMAIN_LOCKS.append(lock)
        return domain
    return first + start


# A test run must not see (or be seen by) another run or a relay on the same host: claim a
# domain of its own unless the caller chose one. Set before rclpy is imported anywhere.
if "ROS_DOMAIN_ID" not in os.environ:
    os.environ["ROS_DOMAIN_ID"] = str(_claim_domain())
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
