# SPDX-License-Identifier: Apache-2.0
"""A load of InferenceRequests published, and their answers tallied, in C
(tools/csrc/fer_loadgen.h, through flowedge_relay_tools.native).

An rclpy client takes ~30 us to build and publish a request and ~60 us to take an answer, so a
Python client, not the relay, would set the rate `bench intake` finds. Here one thread publishes
on schedule and another takes and tallies every answer, both in C without the GIL, through the
rcl of this process's rclpy (the same ABI slice the relay's C intake and publisher use).
`relay_under_load` starts a relay process and a generator matched to it (`bench intake`, and the
real-time test's overload under two hogs).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import rclpy
from flowedge_relay_msgs.msg import ActionMessage, InferenceRequest
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

from flowedge_relay.model import default_model_path
from flowedge_relay.rcl_abi import serialized_publish_functions, take_functions
from flowedge_relay_tools.bench.client import (
    RELAY_MODULE,
    NodeProcess,
    RemoteRelay,
    private_context,
    relay_ros_args,
)
from flowedge_relay_tools.harness import load_served, spinning, wait_for_relay
from flowedge_relay_tools.native import check, ffi, lib

KINDS = {"expired": lib.FER_LOAD_EXPIRED, "rejected": lib.FER_LOAD_REJECTED,
         "admitted": lib.FER_LOAD_ADMITTED, "due": lib.FER_LOAD_DUE}
#: what each kind is built to be answered with (ActionMessage codes) on a relay whose queue has
#: room: `due` may get any decision but REJECTED_STALE (it fits when sent, or not, or runs late)
EXPECTED_CODES = {"expired": {4}, "rejected": {2}, "admitted": {0, 3}, "due": {0, 2, 3, 4}}
BUFFER_BYTES = 65536
WAIT_NS = 20_000_000


@dataclass
class LoadResult:
    """What one load got back: per request, how many answers and the last code."""

    sent: int
    publish_failed: int
    answers: np.ndarray  # answers per request (uint8)
    codes: np.ndarray  # the code of the last answer per request
    first_answer_ns: np.ndarray  # CLOCK_MONOTONIC of each request's first answer (0: none)
    first_send_ns: int
    last_send_ns: int
    behind_max_ns: int
    stray: int

    @property
    def answered_once(self) -> int:
        return int((self.answers == 1).sum())

    @property
    def unanswered(self) -> int:
        return int((self.answers == 0).sum())

    @property
    def duplicated(self) -> int:
        return int((self.answers > 1).sum())

    def answered_per_s(self) -> float:
        """Answers over the span from the first send to the last first answer."""
        got = self.first_answer_ns[self.answers > 0]
        if got.size < 2:
            return 0.0
        span = float(got.max() - self.first_send_ns)
        return got.size / (span / 1e9) if span > 0 else 0.0

    def offered_per_s(self) -> float:
        span = self.last_send_ns - self.first_send_ns
        return (self.sent - 1) / (span / 1e9) if span > 0 and self.sent > 1 else 0.0


class LoadGenerator:
    """A publisher on flowedge/requests and an answer reader on flowedge/actions (raw, never
    spun by an executor: only the C tally takes from it), for loads against one relay."""

    def __init__(self, node: Node, model, depth: int = 10_000) -> None:
        qos = QoSProfile(depth=depth, history=HistoryPolicy.KEEP_LAST,
                         reliability=ReliabilityPolicy.RELIABLE)
        self.pub = node.create_publisher(InferenceRequest, "flowedge/requests", qos)
        self.sub = node.create_subscription(ActionMessage, "flowedge/actions", lambda _m: None,
                                            qos, raw=True)
        self.model = model
        self._observation = np.full(max(model.obs_dim, 1), 0.1, np.float32)
        self._buf = ffi.new("uint8_t[]", BUFFER_BYTES)
        self._next_sequence = 1

    def load(self, kinds: list[str], rate_per_s: float, count: int, *, sessions: int = 8,
             rejected_nfe: int = 1, rejected_slack_ns: int = 10_000_000_000, due_nfe: int = 1,
             due_slack_ns: int = 1_000_000_000):  # fmt: skip
        """A struct fer_load for `count` requests cycling through `kinds`; fresh sequences."""
        m = self.model
        load = ffi.new("struct fer_load *")
        digest = m.digest.encode()
        load.digest[0:len(digest)] = digest
        load.digest_len = len(digest)
        load.observation_dim, load.action_dim, load.action_horizon = (
            m.obs_dim, m.action_dim, m.action_horizon)
        load.observation = ffi.from_buffer("float[]", self._observation)
        load.base_sequence = self._next_sequence
        self._next_sequence += count
        load.count, load.sessions, load.rate_per_s = count, sessions, rate_per_s
        for k, kind in enumerate(kinds):
            load.pattern[k] = KINDS[kind]
        load.n_pattern = len(kinds)
        load.rejected_nfe, load.rejected_slack_ns = rejected_nfe, rejected_slack_ns
        load.due_nfe, load.due_slack_ns = due_nfe, due_slack_ns
        return load

    def request_bytes(self, load, i: int, now_ros: int) -> bytes:
        """The i-th request of `load` as the publisher sends it (tests read it back)."""
        n = lib.fer_load_request_cdr(load, i, now_ros, self._buf, BUFFER_BYTES)
        return bytes(ffi.buffer(self._buf, n))

    def run(self, load, drain_s: float = 5.0) -> LoadResult:
        """Publish the load on schedule while the tally takes the answers; then wait up to
        `drain_s` for the last answers."""
        count = load.count
        out = ffi.new("struct fer_tally **")
        check(lib.fer_tally_create(load.base_sequence, count, out))
        tally = ffi.gc(out[0], lib.fer_tally_destroy)
        take = take_functions()
        errors: list[BaseException] = []

        def taker() -> None:
            try:
                with self.sub.handle:
                    sub = ffi.cast("void *", self.sub.handle.pointer)
                    check(lib.fer_tally_run(tally, take, sub, WAIT_NS))
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        thread = threading.Thread(target=taker, name="flowedge-bench-tally", daemon=True)
        thread.start()
        answers = np.frombuffer(ffi.buffer(lib.fer_tally_answers(tally), count), np.uint8)
        result = ffi.new("struct fer_load_result *")
        publish, reset = serialized_publish_functions()
        try:
            with self.pub.handle:
                pub = ffi.cast("void *", self.pub.handle.pointer)
                check(lib.fer_load_publish(load, publish, pub, reset, self._buf, BUFFER_BYTES,
                                           result))
            end = time.monotonic() + drain_s
            while time.monotonic() < end and int((answers > 0).sum()) < result.sent:
                time.sleep(0.02)
            time.sleep(0.1)  # a duplicate would be here by now
        finally:
            lib.fer_tally_stop(tally)
            thread.join(10)
        if errors:
            raise errors[0]
        first = np.frombuffer(ffi.buffer(lib.fer_tally_first_ns(tally), 8 * count), np.uint64)
        codes = np.frombuffer(ffi.buffer(lib.fer_tally_codes(tally), count), np.uint8)
        return LoadResult(
            sent=int(result.sent), publish_failed=int(result.publish_failed),
            answers=answers.copy(), codes=codes.copy(), first_answer_ns=first.copy(),
            first_send_ns=int(result.first_ns), last_send_ns=int(result.last_ns),
            behind_max_ns=int(result.behind_max_ns), stray=int(lib.fer_tally_stray(tally)))


@contextmanager
def relay_under_load(wrapper: Sequence[str] = (), env: dict[str, str] | None = None,
                     **params) -> Iterator[tuple[RemoteRelay, LoadGenerator, NodeProcess]]:
    """`flowedge-relayd` in its own process (as deployed) with these parameters, a RemoteRelay
    view of it (flowedge/stats, /diagnostics, its parameters) and a LoadGenerator matched to it
    and warmed up; the process (under `wrapper`, with `env` added: NodeProcess) gets SIGINT on
    exit."""
    info = load_served(params.get("model_path", default_model_path()))
    proc = NodeProcess(RELAY_MODULE, relay_ros_args(params), env=env, wrapper=wrapper)
    try:
        with private_context() as ctx:
            watch = rclpy.create_node("flowedge_bench_watch", context=ctx)
            gen = LoadGenerator(rclpy.create_node("flowedge_bench_load", context=ctx), info)
            with spinning(watch, context=ctx):
                relay = RemoteRelay(watch, info, int(params.get("workers", 1)))
                wait_for_relay(gen.pub, gen.sub)
                gen.run(gen.load(["admitted"], 100.0, 20), drain_s=5.0)  # warm up
                yield relay, gen, proc
    finally:
        proc.stop()
