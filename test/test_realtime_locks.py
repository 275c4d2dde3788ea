# SPDX-License-Identifier: Apache-2.0
"""The core's mutexes inherit priority (csrc/fer_lock.c), shown by construction.

A relay on a robot computer runs its workers and request intake at SCHED_FIFO while
normal-priority threads take the same mutexes. fer_rtprobe_pi (csrc/fer_rtprobe.c) builds the
classic inversion on one CPU: a low-priority SCHED_FIFO thread L (10) holds the lock, a medium one
M (20) becomes runnable and spins for SPIN_NS, and a high one H (30) asks for the lock. With all
three pinned to the same CPU under SCHED_FIFO the order of events is the scheduler's, not the
host's speed: M and H each start by a semaphore post from the thread they preempt, and L's
critical section is microseconds against M's 300 ms. With priority inheritance L is boosted above
M, unlocks, and H holds the lock before M's spin ends; with a plain mutex H waits for M.
"""

from __future__ import annotations

import errno
import os

import pytest

from flowedge_relay.core import ffi, lib

SPIN_NS = 300_000_000  # M's spin; L's critical section is a few microseconds


def _scenario(lock: int):
    """Run the probe on one allowed CPU; skip (with the reason) only if SCHED_FIFO is refused."""
    cpu = max(os.sched_getaffinity(0))
    out = ffi.new("struct fer_rtprobe_result *")
    rc = lib.fer_rtprobe_pi(lock, cpu, SPIN_NS, out)
    if rc == lib.FER_ESYS and out.os_error == errno.EPERM:
        pytest.skip("SCHED_FIFO threads refused (EPERM): needs CAP_SYS_NICE or an rtprio limit")
    assert rc == lib.FER_OK, (rc, os.strerror(out.os_error))
    assert out.watchdog == 0
    assert (out.cpu_l, out.cpu_m, out.cpu_h) == (cpu, cpu, cpu)
    # The scenario as built: L holds the lock, M preempts it and spins, H preempts M and asks.
    assert 0 < out.l_locked_ns <= out.m_start_ns <= out.h_asked_ns
    assert out.m_done_ns - out.m_start_ns >= SPIN_NS
    return out


@pytest.mark.parametrize("lock", [lib.FER_RTPROBE_CORE, lib.FER_RTPROBE_BELL],
                         ids=["core_mutex", "doorbell_mutex"])
def test_a_realtime_waiter_gets_the_core_lock_before_the_medium_spinner_ends(lock):
    out = _scenario(lock)
    assert out.h_asked_ns <= out.l_unlocked_ns <= out.h_acquired_ns < out.m_done_ns


def test_a_plain_mutex_makes_the_realtime_waiter_wait_for_the_medium_spinner():
    """The harness can fail: the same scenario on a default mutex is the inversion."""
    out = _scenario(lib.FER_RTPROBE_PLAIN)
    assert out.m_done_ns <= out.l_unlocked_ns <= out.h_acquired_ns


def test_the_probe_checks_its_arguments():
    out = ffi.new("struct fer_rtprobe_result *")
    assert lib.fer_rtprobe_pi(lib.FER_RTPROBE_PLAIN + 1, 0, SPIN_NS, out) == lib.FER_EINVAL
    assert lib.fer_rtprobe_pi(lib.FER_RTPROBE_CORE, 0, 0, out) == lib.FER_EINVAL
    assert lib.fer_rtprobe_pi(lib.FER_RTPROBE_CORE, 0, SPIN_NS, ffi.NULL) == lib.FER_EINVAL
