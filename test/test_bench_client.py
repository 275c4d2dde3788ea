# SPDX-License-Identifier: Apache-2.0
"""The bench client's answer parser (flowedge_relay_tools/bench/client.py) against rclpy's
serialization."""

from __future__ import annotations

from flowedge_relay_msgs.msg import ActionMessage
from hypothesis import given, settings
from hypothesis import strategies as st
from rclpy.serialization import serialize_message

from flowedge_relay_tools.bench.client import Answer, parse_action

U64, U32 = st.integers(0, 2**64 - 1), st.integers(0, 2**32 - 1)
TEXT = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
               max_size=40)  # fmt: skip


@st.composite
def messages(draw) -> ActionMessage:
    m = ActionMessage()
    m.header.stamp.sec = draw(st.integers(0, 2**31 - 1))
    m.header.stamp.nanosec = draw(st.integers(0, 999_999_999))
    m.header.frame_id = draw(TEXT)
    m.code = draw(st.integers(0, 4))
    m.session_id = draw(TEXT)
    m.sequence, m.generation, m.retry_count = draw(U64), draw(U64), draw(U32)
    m.model_digest = draw(TEXT)
    m.observation_dim, m.action_dim, m.action_horizon = draw(U32), draw(U32), draw(U32)
    m.deadline.sec = draw(st.integers(0, 2**31 - 1))
    m.remaining_nfe, m.nfe_done = draw(U32), draw(U32)
    m.actions = draw(st.lists(st.floats(width=32, allow_nan=False), max_size=40))
    m.queue_ns, m.compute_ns = draw(U64), draw(U64)
    m.retry_reason = draw(st.integers(0, 255))
    m.client_id = draw(TEXT)  # variable length, before reject_reason
    m.reject_reason = draw(st.integers(0, 2))
    return m


@settings(max_examples=300, deadline=None)
@given(m=messages(), received=st.integers(0, 2**63 - 1))
def test_parse_action_reads_what_rclpy_wrote(m, received):
    key, ans = parse_action(serialize_message(m), received)
    assert key == (m.session_id, m.sequence)
    stamp = m.header.stamp.sec * 1_000_000_000 + m.header.stamp.nanosec
    assert ans == Answer(m.code, received, stamp, m.nfe_done, m.remaining_nfe, m.queue_ns,
                         m.compute_ns, m.model_digest.encode(),
                         reject_reason=m.reject_reason)  # fmt: skip
