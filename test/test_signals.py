# SPDX-License-Identifier: Apache-2.0
"""The shared stop handling (flowedge_relay/signals.py), in this process: whatever SIGINT
disposition was inherited, SIGINT/SIGTERM stop the entry points, and the previous handlers come
back afterwards. The entry points themselves are exercised as processes in test_cli.py and
test_drill.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from flowedge_relay.signals import stop_requested, stoppable


@pytest.fixture
def sigint_ignored():
    """The disposition a background job (`cmd &` in a non-interactive shell) starts with."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_stop_requested_sets_the_event_and_restores_the_handlers(sigint_ignored, signum):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with stop_requested() as stop:
        assert not stop.is_set()
        os.kill(os.getpid(), signum)  # raises nothing here: only the Event is set
        assert stop.wait(10)
    assert {s: signal.getsignal(s) for s in before} == before
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_stoppable_tool_returns_130_after_its_teardown(sigint_ignored, signum, capsys):
    torn_down = []

    @stoppable
    def tool() -> int:
        try:
            os.kill(os.getpid(), signum)
            time.sleep(10)  # interrupted by the signal's KeyboardInterrupt
            return 0
        finally:
            torn_down.append(True)

    assert tool() == 130
    assert torn_down == [True]
    assert "interrupted, stopped cleanly" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def test_a_second_sigint_during_the_stop_is_noted_and_does_not_abort_it(sigint_ignored, capfd):
    """Under `ros2 launch` one Ctrl-C brings two SIGINTs (the terminal's, to the process group,
    and launch's own): the second leaves the orderly stop the first began running."""
    with stop_requested() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.wait(10)
        os.kill(os.getpid(), signal.SIGINT)  # raises nothing and exits nothing
        time.sleep(0.05)  # the handler has run by now (it runs between bytecodes)
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # SIGTERM still escalates
    assert "SIGINT again: the stop under way goes on" in capfd.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def _stopped_process(first: int, inside: str, after: str) -> subprocess.CompletedProcess:
    """A Python process whose main holds stop_requested(keep=True), gets `first`, then runs
    `inside` (still in the block) and `after` (past it, as the interpreter heads for exit)."""
    code = (
        "import os, signal, threading, time\n"
        "from flowedge_relay.signals import stop_requested\n"
        "with stop_requested(keep=True) as stop:\n"
        f"    os.kill(os.getpid(), {int(first)})\n"
        "    assert stop.wait(10)\n"
        + "".join(f"    {line}\n" for line in inside.splitlines())
        + after
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("first", [signal.SIGINT, signal.SIGTERM])
def test_sigterm_during_the_stop_ends_the_process_at_once(first):
    """launch's escalation after sigterm_timeout: SIGTERM during the stop takes its default
    action, whatever the first signal was, even while the main thread waits in C code."""
    out = _stopped_process(first, (
        "threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()\n"
        "threading.Event().wait(30)  # a teardown that hangs"), "raise SystemExit(3)\n")
    assert out.returncode == -signal.SIGTERM, out


def test_kept_handlers_outlive_the_block_so_a_late_sigint_is_only_noted():
    """keep=True (a process's main): after the block, as the interpreter exits, a late SIGINT
    meets the relay's handler, not Python's KeyboardInterrupt (an exit by SIGINT, code -2)."""
    out = _stopped_process(signal.SIGINT, "pass",
                           "os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(0.1)\n")
    assert out.returncode == 0 and "SIGINT again" in out.stderr, out
