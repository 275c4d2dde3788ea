# SPDX-License-Identifier: Apache-2.0
"""Test-side helpers for `flowedge-relayd` as a real process, seen through its ROS interfaces.

The relay runs as deployed (`python -m flowedge_relay.cli ...`, its own process and DDS
participant); tests read it back only through what any ROS tool sees: the parameter services
and /diagnostics. Stopped with SIGTERM (the CLI turns it into a clean stop), since SIGINT may
start ignored when the suite runs as a background job.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from core_helpers import wait_for
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import ParameterType
from rcl_interfaces.srv import GetParameters
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node

from flowedge_relay_tools.harness import ros_context

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _start(log: pathlib.Path, args: list[str], prefix: list[str] = (),
           env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(log, "w", encoding="utf-8") as out:  # a file: a full pipe never blocks the relay
        return subprocess.Popen(
            [*prefix, sys.executable, "-m", "flowedge_relay.cli", *args],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )


def _wait_up(proc: subprocess.Popen, log: pathlib.Path, timeout: float) -> None:
    wait_for(lambda: "relay up" in log.read_text(encoding="utf-8") or proc.poll() is not None,
             timeout, 0.1)
    if "relay up" not in log.read_text(encoding="utf-8"):
        raise AssertionError(f"relay not up (exit {proc.poll()}):\n{log.read_text()}")


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextmanager
def relayds(tmp_path: pathlib.Path, *arg_lists: list[str], ready_timeout: float = 90.0,
            prefixes: list[list[str]] | None = None,
            env: dict[str, str] | None = None) -> Iterator[list[subprocess.Popen]]:
    """flowedge-relayd once per argument list, started together, each up ("relay up" logged)
    before the block runs; all stopped on exit. Logs: tmp_path/relay<i>.log. `prefixes`: a
    command each runs under (`ip netns exec <ns>`); `env`: added to the environment."""
    procs: list[subprocess.Popen] = []
    try:
        logs = [tmp_path / f"relay{i}.log" for i in range(len(arg_lists))]
        prefixes = prefixes or [[] for _ in arg_lists]
        for log, args, prefix in zip(logs, arg_lists, prefixes, strict=True):
            procs.append(_start(log, list(args), prefix, env))
        for proc, log in zip(procs, logs, strict=True):
            _wait_up(proc, log, ready_timeout)
        yield procs
    finally:
        _stop(procs)


_VALUE_FIELD = {
    ParameterType.PARAMETER_BOOL: "bool_value",
    ParameterType.PARAMETER_INTEGER: "integer_value",
    ParameterType.PARAMETER_DOUBLE: "double_value",
    ParameterType.PARAMETER_STRING: "string_value",
    ParameterType.PARAMETER_STRING_ARRAY: "string_array_value",
}


class Observer:
    """A plain rclpy node in a private context: the relay's parameter service and /diagnostics."""

    def __init__(self, node: Node, executor: SingleThreadedExecutor) -> None:
        self.node = node
        self.executor = executor
        self.status_names: set[str] = set()
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 50)

    def _on_diagnostics(self, msg: DiagnosticArray) -> None:
        self.status_names.update(s.name for s in msg.status)

    def get_parameters(self, node_fqn: str, names: list[str], timeout: float = 30.0) -> dict:
        """Values of `names` from node_fqn's real GetParameters service (None where unset)."""
        client = self.node.create_client(GetParameters, f"{node_fqn}/get_parameters")
        try:
            if not client.wait_for_service(timeout_sec=timeout):
                raise AssertionError(f"{node_fqn}/get_parameters not available")
            future = client.call_async(GetParameters.Request(names=names))
            self.executor.spin_until_future_complete(future, timeout_sec=timeout)
            if not future.done():
                raise AssertionError(f"{node_fqn}/get_parameters did not answer")
            values = future.result().values
        finally:
            self.node.destroy_client(client)
        out = {}
        for name, value in zip(names, values, strict=True):
            field = _VALUE_FIELD.get(value.type)
            out[name] = None if field is None else getattr(value, field)
            if isinstance(out[name], list | tuple) or hasattr(out[name], "tolist"):
                out[name] = list(out[name])
        return out

    def wait_status_names(self, prefix: str, count: int, timeout: float = 30.0) -> set[str]:
        """The /diagnostics status names starting with prefix, once `count` of them were seen."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            seen = {n for n in self.status_names if n.startswith(prefix)}
            if len(seen) >= count:
                return seen
            self.executor.spin_once(timeout_sec=0.2)
        raise AssertionError(f"{count} statuses {prefix!r}* not seen; saw {self.status_names}")


@contextmanager
def observer(name: str = "flowedge_test_observer") -> Iterator[Observer]:
    """An Observer spun by the caller's own calls (no background thread to outlive the test)."""
    with ros_context() as ctx:
        node = Node(name, context=ctx)
        executor = SingleThreadedExecutor(context=ctx)
        executor.add_node(node)
        try:
            yield Observer(node, executor)
        finally:
            executor.shutdown(timeout_sec=2.0)
            node.destroy_node()
