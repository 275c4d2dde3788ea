"""`flowedge-relayd` as a real process: starts, serves, and stops cleanly on SIGINT."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "flowedge_relay.cli", *args],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _wait_line(proc: subprocess.Popen, needle: str, timeout: float) -> list[str]:
    lines: list[str] = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"{needle!r} not seen; output:\n{''.join(lines)}")


def test_sigint_stops_the_relay_cleanly():
    proc = _start("--nfe-ns", "300000", "--ros-args", "-p", "workers:=2")
    try:
        lines = _wait_line(proc, "relay up", timeout=30)
        assert any("nfe_ns=300000" in line for line in lines)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "Traceback" not in out


def test_help_lists_the_adr_flags():
    out = subprocess.run(
        [sys.executable, "-m", "flowedge_relay.cli", "--help"],
        cwd=ROOT, capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 0
    assert "--nfe-ns" in out.stdout and "--admission-reserve-ns" in out.stdout


def test_make_run_demo_shows_outcomes_and_stops_cleanly():
    """What `make run` starts: relay + demo producer; every outcome code shows within seconds."""
    out = subprocess.run(
        [sys.executable, "-m", "flowedge_relay.run_demo", "--duration", "6",
         "--ros-args", "-p", "flowedge_relay_demo_producer:burst_every_s:=2.0"],
        cwd=ROOT, capture_output=True, text=True, timeout=90,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "demo stopped cleanly" in out.stdout
    assert "Traceback" not in out.stdout + out.stderr
    summaries = [line for line in out.stdout.splitlines() if line.startswith("t=")]
    assert len(summaries) >= 3
    last = dict(
        field.split("=", 1) for field in summaries[-1].replace("|", " ").split() if "=" in field
    )
    for code in ("inference", "stale", "deadline", "capacity", "expired"):
        assert int(last[code]) > 0, (code, summaries[-1])
    assert int(last["answered"]) > 0 and int(last["admitted"]) > 0
