"""SIGINT and SIGTERM stop every entry point the same way, whatever dispositions it inherited.

A process started by a non-interactive shell (`flowedge-relayd ... &`, `make test > log &`)
inherits SIGINT *ignored*, and Python keeps SIG_IGN instead of installing its Ctrl-C handler; the
default SIGTERM kills without any cleanup. So every entry point (flowedge-relayd, the demo, the
drill, stress, the bench) enters `stop_on_signals()`: both signals raise KeyboardInterrupt in the
main thread, and each entry point's own teardown (executors, node threads, nodes, context) runs in
order. rclpy's signal handlers stay off (SignalHandlerOptions.NO, or a private context): they
would shut the context down under our threads (see cli.main).

A second signal while the first one's teardown runs does not interrupt that teardown halfway
(which would print a traceback and leave threads behind); it ends the process at once, for the
case where teardown itself hangs (`ros2 launch` escalates SIGINT -> SIGTERM).
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
def stop_on_signals() -> Iterator[None]:
    """Within the block, SIGINT/SIGTERM raise KeyboardInterrupt once; the previous handlers are
    restored on exit (entry points are also called in-process by tests).

    Outside the main thread (where Python cannot install handlers) this changes nothing.
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
        raise KeyboardInterrupt

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)


def stoppable(main: Callable[..., int]) -> Callable[..., int]:
    """Decorator for a tool's main() (drill, stress, bench): it runs under stop_on_signals(),
    and a stop request ends it, after its own teardown, with 130 and a one-line note instead of
    a traceback (an interrupted tool has no complete report to give)."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs) -> int:
        try:
            with stop_on_signals():
                return main(*args, **kwargs)
        except KeyboardInterrupt:
            print(f"{main.__module__}: interrupted, stopped cleanly (no report)",
                  file=sys.stderr, flush=True)
            return 130

    return wrapper
