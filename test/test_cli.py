"""`flowedge-relayd` and `make run` as real processes: they serve, show every outcome, and stop
cleanly on SIGINT/SIGTERM, also when started the way a background job starts them (SIGINT
ignored: a non-interactive shell's `cmd &`, `make test > log &`), without alarming output."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What a background job inherits: SIGINT ignored (bash's `trap "" INT` is kept across exec).
SIGINT_IGNORED = ["bash", "-c", 'trap "" INT; exec "$@"', "bash"]
# Output a clean run must not contain (rclpy prints "The following exception was never
# retrieved: ..." for a failed executor task at exit).
ALARMING = re.compile(r"Traceback|never retrieved|Exception")
CODES = ("inference", "stale", "deadline", "capacity", "expired")


class _Process:
    """A `python -m MODULE` child whose merged output is read on a thread, so every wait here
    is bounded even if the child hangs silently."""

    def __init__(self, module: str, *args: str, ignore_sigint: bool = False) -> None:
        prefix = SIGINT_IGNORED if ignore_sigint else []
        self.proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", module, *args],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def wait_line(self, predicate, timeout: float) -> str:
        """The first line (from now on) satisfying predicate; fails after timeout or at EOF."""
        end = time.monotonic() + timeout
        while (left := end - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise AssertionError("process ended first; output:\n" + self.output())
            self.lines.append(line)
            if predicate(line):
                return line
        raise AssertionError(f"not seen within {timeout} s; output:\n" + self.output())

    def finish(self, timeout: float) -> str:
        """Wait for exit (killing it after timeout); the whole output."""
        try:
            self.proc.wait(timeout)
            hung = False
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            hung = True
        while (line := self._queue.get(timeout=10)) is not None:
            self.lines.append(line)
        assert not hung, f"still running {timeout} s later; output:\n" + self.output()
        return self.output()

    def output(self) -> str:
        return "".join(self.lines)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _assert_clean_exit(proc: _Process, out: str) -> None:
    assert proc.proc.returncode == 0, out
    alarming = [line for line in out.splitlines() if ALARMING.search(line)]
    assert alarming == [], out


def _summary_fields(line: str) -> dict[str, str]:
    return dict(field.split("=", 1) for field in line.replace("|", " ").split() if "=" in field)


def test_the_background_condition_is_real():
    """The helper really starts a process with SIGINT ignored, as `cmd &` would."""
    out = subprocess.run(
        [*SIGINT_IGNORED, sys.executable, "-c",
         "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"],
        capture_output=True, text=True, timeout=30,
    )
    assert out.stdout.strip() == "True", out


@pytest.mark.parametrize(
    "signum,ignore_sigint",
    [(signal.SIGINT, False), (signal.SIGINT, True), (signal.SIGTERM, True)],
    ids=["sigint", "sigint-started-ignored", "sigterm-started-ignored"],
)
@pytest.mark.ros
def test_relay_stops_cleanly_on_signal(signum, ignore_sigint):
    proc = _Process("flowedge_relay.cli", "--nfe-ns", "300000", "--ros-args", "-p", "workers:=2",
                    ignore_sigint=ignore_sigint)
    try:
        up = proc.wait_line(lambda line: "relay up" in line, timeout=60)
        assert "nfe_ns=300000" in up
        proc.proc.send_signal(signum)
        out = proc.finish(timeout=30)
    finally:
        proc.kill()
    _assert_clean_exit(proc, out)


def test_help_lists_the_adr_flags():
    out = subprocess.run(
        [sys.executable, "-m", "flowedge_relay.cli", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 0
    assert "--nfe-ns" in out.stdout and "--admission-reserve-ns" in out.stdout


@pytest.mark.ros
@pytest.mark.parametrize("run_args", [[], ["--model", "vision"]], ids=["default", "vision"])
def test_make_run_demo_shows_every_outcome_and_stops_cleanly(run_args):
    """What `make run` starts: relay + demo producer. The producer constructs every outcome on
    purpose (demo_producer.py), so the test waits until each code has been counted, however
    long a loaded host takes (bounded), then stops it the way Ctrl-C does. It starts with
    SIGINT ignored, as under `make test > log &`. `make run RUN_ARGS="--model vision"`: the
    relay serves the two-phase package and the producer sends it image + state tensors."""
    proc = _Process("flowedge_relay.tooling.run_demo", *run_args, ignore_sigint=True)
    try:
        last = proc.wait_line(
            lambda line: line.startswith("t=")
            and all(int(_summary_fields(line)[code]) > 0 for code in CODES),
            timeout=120,
        )
        proc.proc.send_signal(signal.SIGINT)
        out = proc.finish(timeout=30)
    finally:
        proc.kill()
    _assert_clean_exit(proc, out)
    assert "demo stopped cleanly" in out
    fields = _summary_fields(last)
    assert int(fields["answered"]) > 0 and int(fields["admitted"]) > 0
    if run_args:  # the package was served (a request it could not take would be discarded)
        assert "serving policy package 'policy_vision' (two-phase" in out
        assert "discarding invalid request" not in out


@pytest.mark.ros
def test_make_run_rtc_drives_robots_through_real_time_chunking():
    """`make run RUN_ARGS="--rtc"`: the relay serves policy_rtc and the simulated robots splice
    its answers at frozen_rows (rtc_demo_producer.py). The test waits until robots have reached
    goals on spliced chunks (answers with d >= 1), however long a loaded host takes (bounded)."""
    pattern = re.compile(r"episodes (\d+) \(reached (\d+)\) \| answers (\d+) .*"
                         r"frozen_rows (.*?) \| late")

    def progressed(line: str) -> bool:
        m = pattern.search(line)
        if m is None:
            return False
        frozen = dict(kv.split(":") for kv in m.group(4).split() if ":" in kv)
        return int(m.group(2)) >= 2 and any(int(d) >= 1 for d in frozen)

    proc = _Process("flowedge_relay.tooling.run_demo", "--rtc", ignore_sigint=True)
    try:
        proc.wait_line(progressed, timeout=120)
        proc.proc.send_signal(signal.SIGINT)
        out = proc.finish(timeout=30)
    finally:
        proc.kill()
    _assert_clean_exit(proc, out)
    assert "demo stopped cleanly" in out and "policy_rtc" in out
    assert "discarding invalid request" not in out


@pytest.mark.ros
def test_demo_duration_stops_by_itself_when_started_in_the_background():
    """`make run RUN_ARGS="--duration N"` stops by itself even with SIGINT ignored at start."""
    proc = _Process("flowedge_relay.tooling.run_demo", "--duration", "2", ignore_sigint=True)
    try:
        out = proc.finish(timeout=90)
    finally:
        proc.kill()
    _assert_clean_exit(proc, out)
    assert "demo stopped cleanly" in out
