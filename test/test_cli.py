# SPDX-License-Identifier: Apache-2.0
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
    proc = _Process("flowedge_relay_tools.run_demo", *run_args, ignore_sigint=True)
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

    proc = _Process("flowedge_relay_tools.run_demo", "--rtc", ignore_sigint=True)
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
    proc = _Process("flowedge_relay_tools.run_demo", "--duration", "2", ignore_sigint=True)
    try:
        out = proc.finish(timeout=90)
    finally:
        proc.kill()
    _assert_clean_exit(proc, out)
    assert "demo stopped cleanly" in out


# A stand-in for `ros2 launch`: the relay's parent in one process group. It ignores SIGINT (launch
# handles its own) and gives the relay the default disposition, or an ignored one (argv[1]).
LAUNCH_PARENT = """
import signal, subprocess, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
child_sigint = signal.SIG_IGN if sys.argv[1] == "ignored" else signal.SIG_DFL
relay = subprocess.Popen([sys.executable, "-m", "flowedge_relay.cli", *sys.argv[2:]],
                         preexec_fn=lambda: signal.signal(signal.SIGINT, child_sigint))
sys.exit(relay.wait() % 256)
"""
HELD_NFE = 40  # at 100 ms each: the first request holds the only worker for 4 s


@pytest.mark.ros
@pytest.mark.parametrize("delay_ms,child_sigint", [(0, "default"), (50, "default"),
                                                   (200, "default"), (100, "ignored")])
def test_ctrl_c_under_launch_two_sigints_stop_cleanly_and_answer_every_admitted_request(
        tmp_path, delay_ms, child_sigint):
    """A terminal's Ctrl-C under `ros2 launch`: SIGINT to the whole process group, then launch's
    own SIGINT delay_ms later. The second does not abort the orderly stop the first began: the
    relay exits 0 within launch's 5 s, and every request admitted before (one running, three
    queued behind it, held there on purpose) is answered exactly once, EXPIRED, since it
    cannot finish."""
    from flowedge_relay_msgs.msg import ActionMessage as A
    from flowedge_relay_msgs.msg import InferenceRequest, RelayStats
    from relayd import observer
    from ros_helpers import wait_for_subscribers

    from flowedge_relay.model import default_model_path, load_model
    from flowedge_relay_tools.harness import build_request

    log = tmp_path / "relay.log"
    with observer("launch_ctrl_c_client") as obs, open(log, "w", encoding="utf-8") as out:
        node = obs.node
        answers: list = []
        stats: list = []
        node.create_subscription(A, "flowedge/actions", answers.append, 100)
        node.create_subscription(RelayStats, "flowedge/stats", stats.append, 10)
        pub = node.create_publisher(InferenceRequest, "flowedge/requests", 100)
        parent = subprocess.Popen(
            [sys.executable, "-c", LAUNCH_PARENT, child_sigint, "--drill", "--ros-args", "-p",
             "fault_nfe_delay_ms:=100.0", "-p", "stats_rate_hz:=20.0"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:

            def spin_until(condition, timeout: float) -> bool:
                end = time.monotonic() + timeout
                while not condition() and time.monotonic() < end:
                    obs.executor.spin_once(timeout_sec=0.05)
                return condition()

            assert spin_until(lambda: "relay up" in log.read_text() or parent.poll() is not None,
                              90), log.read_text()
            wait_for_subscribers(pub, timeout=30)
            assert spin_until(lambda: stats, 30)
            model = load_model(default_model_path())
            now = node.get_clock().now().nanoseconds
            pub.publish(build_request(model, now, session_id="held", sequence=0,
                                      remaining_nfe=HELD_NFE))
            for seq in (1, 2, 3):
                pub.publish(build_request(model, now, session_id=f"q{seq}", sequence=seq,
                                          remaining_nfe=2))
            # one running and three queued behind it, seen in the relay's own stats
            assert spin_until(lambda: stats[-1].accepted == 4 and stats[-1].queue_depth == 3, 30)
            t0 = time.monotonic()
            os.killpg(parent.pid, signal.SIGINT)  # the terminal's Ctrl-C
            time.sleep(delay_ms / 1000)
            os.killpg(parent.pid, signal.SIGINT)  # launch's own
            assert spin_until(lambda: parent.poll() is not None, 30)
            elapsed = time.monotonic() - t0
            spin_until(lambda: len(answers) >= 4, 5)
            spin_until(lambda: False, 0.3)  # room for an answer too many
        finally:
            if parent.poll() is None:
                os.killpg(parent.pid, signal.SIGKILL)
                parent.wait(10)
    text = log.read_text()
    assert parent.returncode == 0, text
    assert elapsed < 5.0, f"stopped in {elapsed:.1f} s"
    assert not ALARMING.search(text), text
    by_seq = {a.sequence: a for a in answers}
    assert sorted(a.sequence for a in answers) == [0, 1, 2, 3]  # exactly once each
    assert by_seq[0].code == A.EXPIRED and 1 <= by_seq[0].nfe_done < HELD_NFE
    assert [(by_seq[s].code, by_seq[s].nfe_done) for s in (1, 2, 3)] == [(A.EXPIRED, 0)] * 3


@pytest.mark.ros
def test_yaml_typed_enum_values_start_the_relay_or_are_refused_in_one_line():
    """`-p rtc_mode:=off` reaches the relay as the bool false: it starts with rtc_mode off. A
    value no choice reads as (`solver:=off`) ends it with exit 2 and one line naming the
    parameter and the fix, no traceback."""
    proc = _Process("flowedge_relay.cli", "--ros-args", "-p", "rtc_mode:=off", "-p",
                    "solver:=off")
    try:
        out = proc.finish(timeout=60)
    finally:
        proc.kill()
    assert proc.proc.returncode == 2, out
    assert out.splitlines() == [out.strip()] and out.startswith("flowedge-relayd: solver must"), out
    assert "quoted" in out and not ALARMING.search(out), out
    proc = _Process("flowedge_relay.cli", "--ros-args", "-p", "rtc_mode:=off")
    try:
        proc.wait_line(lambda line: "relay up" in line, timeout=60)
        proc.proc.send_signal(signal.SIGTERM)
        out = proc.finish(timeout=30)
    finally:
        proc.kill()
    _assert_clean_exit(proc, out)
