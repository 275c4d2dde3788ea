# SPDX-License-Identifier: Apache-2.0
"""Test-side names for the in-process relay harness (flowedge_relay/tooling/harness.py)."""

from flowedge_relay.tooling.harness import (  # noqa: F401
    RelayHarness,
    ros_context,
    running_relay,
    spinning,
    status_values,
    wait_for,
    wait_for_subscribers,
)
