# SPDX-License-Identifier: Apache-2.0
"""The relay's QoS profiles for its own topics (the model and pool topics' are in producer.py
and pool.py, next to their readers)."""

from __future__ import annotations

from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy


def reliable(depth: int) -> QoSProfile:
    """Reliable, keep last `depth`: flowedge/actions (action_qos_depth)."""
    return QoSProfile(
        depth=depth, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE
    )


def request_qos(history: str, depth: int) -> QoSProfile:
    """The request subscriptions' profile (request_qos_history, request_qos_depth).

    keep_all: a reader that falls behind keeps every unread request (Fast DDS holds up to
    its resource limit, 5000 samples by default) and withholds acknowledgements, so a
    reliable writer either waits or drops on its side, which Fast DDS reports to this reader
    as MESSAGE_LOST. keep_last: the oldest unread request is overwritten, and nothing reports
    it (measured: README "Robustness")."""
    if history == "keep_all":
        return QoSProfile(
            depth=depth, history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE
        )
    return reliable(depth)
