"""Shared pytest setup: keep DDS on this machine and in a domain of its own per test run."""

import os

# A test run must not see (or be seen by) another run or a relay on the same host: pick a domain
# from the process id unless the caller chose one. Set before rclpy is imported anywhere.
os.environ.setdefault("ROS_DOMAIN_ID", str(100 + os.getpid() % 100))
os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")

# The C scheduling core (flowedge_relay._fer_core) is built in place if missing or stale, before
# any test module imports flowedge_relay.core.
import _core_build  # noqa: E402

_core_build.ensure_built()
