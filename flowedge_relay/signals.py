# SPDX-License-Identifier: Apache-2.0
"""SIGINT and SIGTERM stop every entry point the same way, whatever dispositions it inherited.

A process started by a non-interactive shell (`flowedge-relayd ... &`, `make test > log &`)
inherits SIGINT *ignored*, and Python keeps SIG_IGN instead of installing its Ctrl-C handler; the
default SIGTERM kills without any cleanup. So every entry point installs its handlers here, for
both signals, explicitly. rclpy's own handlers stay off (SignalHandlerOptions.NO, or a private
context): they would shut the context down under the relay's threads (see cli.main).

Two forms:
  - `stop_requested()` (flowedge-relayd, the demo, the standalone demo producer): the signal only
    sets an Event that their spin loop watches. Nothing is raised at an arbitrary point, so a
    signal that arrives while the node is still starting (threads half started, an executor half
    built) or already stopping cannot break startup or teardown: they stop in order and exit 0.
  - `stoppable` (drill, stress, bench): their work is arbitrary blocking code, so the signal
    raises KeyboardInterrupt in the main thread (as Ctrl-C does by default), their context
    managers tear down in order, and the tool exits 130 with a one-line note.

Once a stop is under way (in both forms):
  - SIGINT again is ignored, with a one-line note: a terminal's Ctrl-C reaches the whole process
    group, and `ros2 launch` forwards one SIGINT more, so a relay under launch gets two for one
    Ctrl-C; the second must not abort the orderly stop the first began.
  - SIGTERM takes its default action, at once (killed by SIGTERM, no cleanup): the escalation for
    a teardown that hangs, the one launch sends after `sigterm_timeout` (SIGKILL after it). It is
    the kernel's default action, so it works even while the main thread waits in C code.
A process entry point (flowedge-relayd, the demo, the demo producer) keeps its handlers until the
process ends (`keep=True`): restored, Python's own SIGINT handler would turn a late SIGINT during
the interpreter's exit into a KeyboardInterrupt and an exit by SIGINT.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def _handlers(on_first: Callable[[int], None], keep: bool = False) -> Iterator[None]:
    """Install on_first for the first SIGINT/SIGTERM (then: SIGINT noted and ignored, SIGTERM
    its default action); on exit restore the previous handlers, unless `keep`.

    Entry points are also called in-process by tests, hence the restore. Outside the main
    thread (where Python cannot install handlers) nothing is installed.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}

    def again(signum: int, frame) -> None:
        # os.write, not print: a print here could re-enter a write of the main thread's to the
        # same stream, and raise in the middle of the stop it must not disturb
        os.write(sys.stderr.fileno(), REPEATED_SIGINT_NOTE.encode())

    def handler(signum: int, frame) -> None:
        signal.signal(signal.SIGINT, again)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        on_first(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
    try:
        yield
    finally:
        if not keep:
            for signum, old in previous.items():
                signal.signal(signum, old if old is not None else signal.SIG_DFL)


REPEATED_SIGINT_NOTE = "\nSIGINT again: the stop under way goes on (SIGTERM ends it at once)\n"


@contextmanager
def stop_requested(keep: bool = False) -> Iterator[threading.Event]:
    """Within the block, SIGINT/SIGTERM set the yielded Event (and raise nothing). `keep`: the
    caller is the process's main and ends it after the block; the handlers stay installed."""
    stop = threading.Event()
    with _handlers(lambda signum: stop.set(), keep):
        yield stop


def _interrupt(signum: int) -> None:
    raise KeyboardInterrupt


def stoppable(main: Callable[..., int]) -> Callable[..., int]:
    """Decorator for a tool's main() (drill, stress, bench): SIGINT/SIGTERM raise
    KeyboardInterrupt; after the tool's own teardown it returns 130 with a one-line note
    instead of a traceback (an interrupted tool has no complete report to give)."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs) -> int:
        try:
            with _handlers(_interrupt):
                return main(*args, **kwargs)
        except KeyboardInterrupt:
            spec = main.__globals__.get("__spec__")  # under `python -m`, __module__ is __main__
            name = spec.name if spec is not None else main.__module__
            print(f"{name}: interrupted, stopped cleanly (no report)", file=sys.stderr,
                  flush=True)
            return 130

    return wrapper
