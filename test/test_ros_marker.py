# SPDX-License-Identifier: Apache-2.0
"""The `ros` marker is honest: a test without it cannot start ROS, in this process or in a
process it starts (conftest.py), so `pytest -m "not ros"` is the part that needs no DDS."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import NO_ROS_DOMAIN
from rclpy.context import Context
from ros_helpers import ros_context


def test_an_unmarked_test_cannot_start_an_rclpy_context():
    with pytest.raises(pytest.fail.Exception, match="not marked ros"), ros_context():
        pass
    with pytest.raises(pytest.fail.Exception, match="not marked ros"):
        Context().init()


def test_a_process_an_unmarked_test_starts_cannot_start_ros_either():
    assert os.environ["ROS_DOMAIN_ID"] == NO_ROS_DOMAIN
    out = subprocess.run([sys.executable, "-c", "import rclpy; rclpy.init()"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "ROS_DOMAIN_ID" in out.stderr, out


@pytest.mark.ros
def test_a_ros_test_starts_ros():
    assert os.environ["ROS_DOMAIN_ID"] != NO_ROS_DOMAIN
    with ros_context() as ctx:
        assert ctx.ok()
