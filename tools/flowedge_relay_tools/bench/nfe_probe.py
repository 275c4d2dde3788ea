# SPDX-License-Identifier: Apache-2.0
"""BENCH ONLY: the NFE probe `bench nfe-breakdown` plants in a relay's workers.

    FLOWEDGE_NFE_BREAKDOWN=DIR python -m flowedge_relay_tools.bench.nfe_probe --ros-args ...

runs `flowedge-relayd` (flowedge_relay.cli) with every worker probed through the runtime's
hook (workers.set_nfe_probe_factory): each worker splits every NFE's wall time (`NfeProbe`) and
writes it to DIR/nfe-breakdown-lane<i>.npy when it exits. The runtime itself never imports this
module; a relay started any other way has no probe.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import numpy as np

from flowedge_relay.workers import PROBE_CLOCKS, PROBE_POINTS, set_nfe_probe_factory

#: the directory the probed relay writes its workers' breakdowns to
BREAKDOWN_ENV = "FLOWEDGE_NFE_BREAKDOWN"
BREAKDOWN_ROWS = 200_000  # NFEs kept per worker (a ring), ~24 MB


class NfeProbe:
    """BENCH ONLY: where one worker's NFE time goes (flowedge_relay_bench nfe-breakdown).

    At each PROBE_POINTS instant it reads three clocks of the worker thread: CLOCK_MONOTONIC,
    its CPU time (CLOCK_THREAD_CPUTIME_ID) and its run-queue wait (field 2 of
    /proc/thread-self/schedstat: time runnable but not running, i.e. the OS gave the core to
    another thread). Between two instants, wall - cpu - runqueue wait is time the thread slept:
    in the ONNX Runtime run (one intra-op thread, nothing there sleeps) that is waiting for the
    GIL once the run returned, in core.step the GIL after the C call and the core mutex.
    About 3 us per instant. Satisfies workers.NfeProbeHook (the layout the native loop
    writes too: PROBE_POINTS x PROBE_CLOCKS per NFE).
    """

    def __init__(self, lane: int, out_dir: str, rows: int = BREAKDOWN_ROWS) -> None:
        self.lane, self.out_dir, self.rows = lane, out_dir, rows
        self.data = np.zeros((rows, len(PROBE_POINTS), len(PROBE_CLOCKS)), np.int64)
        self.counter = np.zeros(1, np.uint64)  # NFEs probed; the native loop writes it too
        self.fd = -1

    @property
    def n(self) -> int:
        return int(self.counter[0])

    def open(self) -> None:
        """In the worker thread: /proc/thread-self names the thread that opens it."""
        try:
            self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        except OSError:
            self.fd = -1  # no schedstat: run-queue wait reads 0, counted as sleep

    def mark(self, point: int) -> None:
        row = self.data[self.n % self.rows, point]
        row[0] = time.monotonic_ns()
        row[1] = time.thread_time_ns()
        row[2] = int(os.pread(self.fd, 64, 0).split()[1]) if self.fd >= 0 else 0

    def end(self) -> None:
        self.mark(4)
        self.counter[0] += 1

    def wrap_session(self, session):
        """The Python loop's step session, with marks 1 and 2 around each ONNX Runtime run."""
        return _ProbedSession(session, self)

    def save(self) -> str:
        """Rows in NFE order to <out_dir>/nfe-breakdown-lane<lane>.npy; returns the path."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        k = min(self.n, self.rows)
        first = self.n % self.rows if self.n > self.rows else 0
        rows = np.roll(self.data[:k], -first, axis=0)
        path = os.path.join(self.out_dir, f"nfe-breakdown-lane{self.lane}.npy")
        np.save(path, rows)
        return path


class _ProbedSession:
    """BENCH ONLY: the worker's InferenceSession with probe marks around each run."""

    def __init__(self, session, probe: NfeProbe) -> None:
        self._session, self._probe = session, probe

    def run_with_iobinding(self, binding, *args):
        self._probe.mark(1)
        result = self._session.run_with_iobinding(binding, *args)
        self._probe.mark(2)
        return result

    def __getattr__(self, name: str):
        return getattr(self._session, name)


def probe_factory(out_dir: str, rows: int = BREAKDOWN_ROWS) -> Callable[[int], NfeProbe]:
    """What workers.set_nfe_probe_factory takes: a probe per worker lane, saving into out_dir."""
    return lambda lane: NfeProbe(lane, out_dir, rows)


def main(argv: list[str] | None = None) -> int:
    """flowedge-relayd with every worker probed into $FLOWEDGE_NFE_BREAKDOWN."""
    from flowedge_relay import cli

    set_nfe_probe_factory(probe_factory(os.environ[BREAKDOWN_ENV]))
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
