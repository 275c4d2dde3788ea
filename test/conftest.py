"""Shared pytest setup: keep DDS on this machine and in a domain of its own per test run."""

import os

# A test run must not see (or be seen by) another run or a relay on the same host: pick a domain
# from the process id unless the caller chose one. Set before rclpy is imported anywhere.
os.environ.setdefault("ROS_DOMAIN_ID", str(100 + os.getpid() % 100))
os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
