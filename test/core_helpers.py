"""Test-side helpers shared by every test file: the C core and its requests (no DDS), and the
one way tests wait for something (`wait_for`, also what ros_helpers and the tools use)."""

from __future__ import annotations

import time

import numpy as np

from flowedge_relay.core import Core, CoreConfig, Request
from flowedge_relay.tooling.waiting import wait_for

MS = 1_000_000
HANG_GUARD_S = 30.0  # a test that waits longer than this for outcomes fails instead of hanging
U64 = 2**64 - 1

__all__ = ["HANG_GUARD_S", "MS", "U64", "collect", "make_core", "request", "wait_for"]


def make_core(**config) -> Core:
    """A core on CoreConfig's defaults (1 worker, obs_dim 4, action_len 16) but for `config`."""
    return Core(CoreConfig(**config))


def request(sid: bytes = b"s", seq: int = 0, *, gen: int = 0, nfe: int = 1,
            seed: int | None = None, deadline: int = 0, ros_clock_offset: int | None = None,
            retry: int = 0, reason: int = 0, origin: int | None = None,
            obs: np.ndarray | None = None, obs_dim: int = 4) -> Request:
    """A core Request of session `sid`, sequence `seq`, generation `gen`, `nfe` NFE.

    noise seed: `seed`, else seq. origin: `origin`, else now (CLOCK_MONOTONIC). deadline:
    `deadline` (0: none) and on the ROS clock `ros_clock_offset` after it (saturating; None:
    no ROS deadline). observation: `obs`, a table of them (its row seq % rows), else
    zeros(obs_dim)."""
    if obs is None:
        obs = np.zeros(obs_dim, np.float32)
    elif obs.ndim == 2:
        obs = obs[seq % len(obs)].copy()
    ros = min(deadline + ros_clock_offset, U64) if deadline and ros_clock_offset is not None else 0
    return Request(session_id=sid, sequence=seq, generation=gen, retry_count=retry,
                   retry_reason=reason, origin_ns=time.monotonic_ns() if origin is None else origin,
                   deadline_ns=deadline, deadline_ros_ns=ros, remaining_nfe=nfe,
                   noise_seed=seq if seed is None else seed, observation=obs)


def collect(core: Core, n: int) -> list:
    """Pop outcomes until n have arrived (fails after HANG_GUARD_S)."""
    got: list = []
    guard = time.monotonic() + HANG_GUARD_S
    while len(got) < n:
        assert time.monotonic() < guard, f"only {len(got)} of {n} outcomes arrived: {got}"
        core.wait_outputs(20 * MS)
        got.extend(core.pop_outcomes())
    return got
