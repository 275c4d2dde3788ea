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

In both, a second signal while the first one's stop is under way ends the process at once
(exit 128 + signal), for the case where teardown itself hangs (`ros2 launch` escalates SIGINT ->
SIGTERM).
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
def _handlers(on_first: Callable[[int], None]) -> Iterator[None]:
    """Install on_first for the first SIGINT/SIGTERM (then: exit at once); restore on exit.

    Entry points are also called in-process by tests, hence the restore. Outside the main
    thread (where Python cannot install handlers) nothing is installed.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    stopping = False

    def handler(signum: int, frame) -> None:
        nonlocal stopping
        if stopping:
            print(f"\n{signal.Signals(signum).name} again: exiting without cleanup",
                  file=sys.stderr, flush=True)
            os._exit(128 + signum)
        stopping = True
        on_first(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)


@contextmanager
def stop_requested() -> Iterator[threading.Event]:
    """Within the block, SIGINT/SIGTERM set the yielded Event (and raise nothing)."""
    stop = threading.Event()
    with _handlers(lambda signum: stop.set()):
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
