"""Test-side helpers for driving the C core directly (no DDS)."""

from __future__ import annotations

import time

from flowedge_relay.core import Core

MS = 1_000_000
HANG_GUARD_S = 30.0  # a test that waits longer than this for outcomes fails instead of hanging


def collect(core: Core, n: int) -> list:
    """Pop outcomes until n have arrived (fails after HANG_GUARD_S)."""
    got: list = []
    guard = time.monotonic() + HANG_GUARD_S
    while len(got) < n:
        assert time.monotonic() < guard, f"only {len(got)} of {n} outcomes arrived: {got}"
        core.wait_outputs(20 * MS)
        got.extend(core.pop_outcomes())
    return got
