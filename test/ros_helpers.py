# SPDX-License-Identifier: Apache-2.0
"""Test-side names for the in-process relay harness (tools/flowedge_relay_tools/harness.py)."""

from flowedge_relay_tools.harness import (  # noqa: F401
    RelayHarness,
    ros_context,
    running_relay,
    spinning,
    status_values,
    wait_for,
    wait_for_subscribers,
)
