"""The shared stop handling (flowedge_relay/signals.py), in this process: whatever SIGINT
disposition was inherited, SIGINT/SIGTERM stop the entry points, and the previous handlers come
back afterwards. The entry points themselves are exercised as processes in test_cli.py and
test_drill.py."""

from __future__ import annotations

import os
import signal
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
