# SPDX-License-Identifier: Apache-2.0
"""Test-side helpers shared by every test file: the C core and its requests (no DDS), and the
one way tests wait for something (`wait_for`, also what ros_helpers and the tools use)."""

from __future__ import annotations

import time

import numpy as np

from flowedge_relay.core import Core, CoreConfig, Request
from flowedge_relay_tools.waiting import wait_for

MS = 1_000_000
HANG_GUARD_S = 30.0  # a test that waits longer than this for outcomes fails instead of hanging
U64 = 2**64 - 1

__all__ = ["HANG_GUARD_S", "MS", "TENSOR_CHANGES", "U64", "broken_tensors", "collect",
           "make_core", "request", "wait_for"]


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


#: What broken_tensors can do to a request of the vision package (image, state), by name.
TENSOR_CHANGES = ("shape", "missing", "extra", "duplicate", "dtype", "bytes", "not_finite",
                  "many", "too_large", "observation")


def broken_tensors(req, change: str):
    """The vision package's request `req` (inputs image, state) broken one way, in place: each
    change is a different discard reason of docs/design.md §3 (TENSOR_CHANGES)."""
    from flowedge_relay_msgs.msg import Tensor

    image, state = req.inputs
    if change == "shape":
        image.shape = [2, 16, 64]
    elif change == "missing":
        req.inputs = [image]
    elif change == "extra":
        req.inputs = [image, state, Tensor(name="depth", dtype=0, shape=[1], data=b"\0" * 4)]
    elif change == "duplicate":
        req.inputs = [image, state, state]
    elif change == "dtype":
        state.dtype = Tensor.INT32
    elif change == "bytes":
        state.data = state.data[:4]
    elif change == "not_finite":
        state.data = np.array([0.0, np.inf], np.float32).tobytes()
    elif change == "many":
        req.inputs = [image] * 6
    elif change == "too_large":
        image.data = bytes(len(image.data)) * 1024
    elif change == "observation":
        req.observation = [0.5]
    else:
        raise ValueError(f"unknown change {change!r}")
    return req
