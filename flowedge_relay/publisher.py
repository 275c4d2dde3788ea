# SPDX-License-Identifier: Apache-2.0
"""The relay's publisher thread: every outcome ring -> flowedge/actions, in C where it can be.

The C loop (csrc/fer_publish.h) waits on the core's doorbell, pops the outcomes, writes each
ActionMessage's CDR bytes and hands them to `rcl_publish_serialized_message`, all without the
GIL: an answer no longer waits for the interpreter (the request thread, the stats timer) between
its worker's finish and DDS. The functions come from the librcl / librcutils rclpy itself loaded.

The Python loop (build an ActionMessage, publish it through rclpy) is kept for what the C loop
cannot do: a node on simulated time (header.stamp is the node's clock; the C loop stamps
CLOCK_REALTIME, which is the ROS clock only with use_sim_time off) and a process where rcl's
symbols cannot be found. Both send the same message (test/test_publish.py).
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
from flowedge_relay_msgs.msg import ActionMessage

from flowedge_relay.core import Code, check, ffi, lib
from flowedge_relay.rcl_abi import RclUnavailable, publish_functions
from flowedge_relay.timebase import ros_time

LATENCY_WINDOW = lib.FER_LATENCY_WINDOW  # INFERENCE latencies kept for p50/p99 (a fixed ring)
WAIT_NS = 20_000_000  # the loop's doorbell wait: how soon it sees a pause or stop
#: the `now` of the last pass at stop: every held outcome is due then, unless answered
#: elsewhere (docs/design.md §13.2, held outcomes at stop)
AT_STOP = (1 << 64) - 1


class OutputPause:
    """DRILLS AND TESTS ONLY: while set, the publisher thread leaves the outcome rings alone, as
    if the action consumer stopped (docs/design.md §8: full rings drop and count). The
    threading.Event interface the drills use, also read by the C loop."""

    def __init__(self, native) -> None:
        self._event = threading.Event()
        self._native = native

    def set(self) -> None:
        self._event.set()
        if self._native is not None:
            self._native.pause = 1

    def clear(self) -> None:
        self._event.clear()
        if self._native is not None:
            self._native.pause = 0

    def is_set(self) -> bool:
        return self._event.is_set()


class ActionPublisher:
    """The outcome rings' one consumer: `run` is the publisher thread's body until `stop`.

    `host` is the relay's Host (relay.Host: logger, clock, whether it is simulated). `model`
    gives the message's digest and dims (None: no model, rejections only). `native`
    False, a simulated clock or no rcl symbols select the Python loop; `loop` says which runs
    and `note` why not the C one.
    """

    def __init__(self, host, core, publisher, model, native: bool = True, pool=None) -> None:
        self._host, self._core, self._pub, self._model = host, core, publisher, model
        self._pool = pool  # a relay pool's core.Pool: answers carry its relay_id and epoch
        self._held: dict[int, object] = {}  # the Python loop's held outcomes, by pool slot
        self._stopping = threading.Event()
        self._native = None
        self.note = ""
        if not native:
            self.note = "publisher_loop: python requested"
        elif host.sim_time:
            self.note = "use_sim_time: header.stamp must be the node's clock"
        else:
            try:
                self._fns = publish_functions()
                self._native = self._create(core, model)
                if pool is not None:
                    check(lib.fer_publisher_set_pool(self._native, pool.ptr))
            except RclUnavailable as exc:
                self.note = f"rcl not found: {exc}"
        self.loop = "native" if self._native is not None else "python"
        self.pause = OutputPause(self._native)
        if self._native is not None:
            window = ffi.buffer(self._native.latency_ms)
            self._latency_ms = np.frombuffer(window, np.float64)
        else:
            self._latency_ms = np.zeros(LATENCY_WINDOW)
            self._latency_count = 0

    @staticmethod
    def _create(core, model):
        digest = model.digest.encode() if model is not None else b""
        dims = (model.obs_dim, model.action_dim, model.action_horizon) if model else (0, 0, 0)
        out = ffi.new("struct fer_publisher **")
        check(lib.fer_publisher_create(core.ptr, digest, len(digest), *dims, out))
        return ffi.gc(out[0], lib.fer_publisher_destroy)

    # -- what other threads read -----------------------------------------------------------------

    def latencies_ms(self) -> np.ndarray:
        """The latency window's samples (finish - arrival of INFERENCE answers, ms): a view that
        the publisher thread may refresh while the caller reads it (each sample is one aligned
        8-byte store, so a reader sees old or new values, never torn ones)."""
        count = self._native.latency_count if self._native is not None else self._latency_count
        return self._latency_ms[: min(count, LATENCY_WINDOW)]

    @property
    def failed(self) -> int:
        """Publishes rcl refused (the C loop counts them; the Python loop logs them)."""
        return int(self._native.failed) if self._native is not None else 0

    # -- the publisher thread ----------------------------------------------------------------------

    def stop(self) -> None:
        """Drain once more and return (call before the core's shutdown wakes the thread)."""
        self._stopping.set()
        if self._native is not None:
            self._native.stop = 1

    def run(self) -> None:
        """The publisher thread's body: until stop(), then one more drain."""
        if self._native is not None:
            # the handle stays valid (not destroyed) while it is in use
            with self._pub.handle:
                publish, reset = self._fns
                check(lib.fer_publish_run(self._native, publish, ffi.cast(
                    "void *", self._pub.handle.pointer), reset, WAIT_NS))
            if self._native.failed and not self._stopping.is_set():
                self._host.logger.error(
                    f"{self._native.failed} outcomes could not be published "
                    f"(rcl status {self._native.last_error})")
            return
        self._run_python()

    def _run_python(self) -> None:
        while True:
            stopping = self._stopping.is_set()
            if self.pause.is_set() and not stopping:
                time.sleep(0.01)
                continue
            self._core.wait_outputs(WAIT_NS)
            while outcomes := self._core.pop_outcomes(256):
                # a pool member's own stall, as the C loop checks it (fer_publisher_set_pool)
                mark = self._pool.stall_check(time.monotonic_ns()) if self._pool else 0
                for outcome in outcomes:
                    if self._pool and outcome.arrival_ns < mark:
                        # the others may have taken it over: held until an answer or due
                        if (slot := self._pool.hold(outcome, mark)) >= 0:
                            self._held[slot] = outcome
                        continue
                    self._publish_one(outcome)
            if self._held:  # at stop every one is due but an answered one, as in C
                self._release_held(AT_STOP if stopping else time.monotonic_ns())
            if stopping:
                return
            if self._core.is_shut_down:  # waits return at once now: poll for stop, as in C
                time.sleep(0.001)

    def _release_held(self, now: int) -> None:
        """Held outcomes (fer_pool_hold): dropped once another member answered them, published
        when due at `now` (monotonic ns; AT_STOP: all are), as EXPIRED if the deadline has
        passed (never a late INFERENCE)."""
        for slot, o in list(self._held.items()):
            state = self._pool.held(slot, now)
            if state == lib.FER_POOL_HOLD_WAIT:
                continue
            del self._held[slot]
            if state != lib.FER_POOL_HOLD_DUE:
                continue
            if o.code == Code.INFERENCE and 0 < o.deadline_ros_ns <= time.time_ns():
                o = dataclasses.replace(o, code=Code.EXPIRED, actions=None)
            self._publish_one(o)

    def _publish_one(self, o) -> None:
        msg = action_message(o, self._host.now_ns(), self._model,
                             self._pool)
        if o.code == Code.INFERENCE and o.actions is not None:
            self._latency_ms[self._latency_count % LATENCY_WINDOW] = (
                max(o.finish_ns - o.arrival_ns, 0) / 1e6
            )
            self._latency_count += 1
        try:
            self._pub.publish(msg)
        except Exception as exc:  # context shut down under us: nothing left to publish to
            if not self._stopping.is_set():
                self._host.logger.error(f"publishing an outcome failed: {exc}")


def action_message(o, stamp_ns: int, model, pool=None) -> ActionMessage:
    """The ActionMessage of outcome `o` (a core.Outcome) stamped stamp_ns (ROS time), with the
    digest and dims of `model` (None: left zero) and a pool's relay_id and epoch (`pool`, a
    core.Pool; None: "" and 0). fer_action_cdr writes the same message."""
    msg = ActionMessage()
    msg.header.stamp = ros_time(stamp_ns)
    msg.code = int(o.code)
    msg.session_id = o.session_id.decode("utf-8", "surrogatepass")
    msg.sequence = o.sequence
    msg.generation = o.generation
    msg.retry_count = o.retry_count
    msg.retry_reason = o.retry_reason
    if model is not None:
        msg.model_digest = model.digest
        msg.observation_dim = model.obs_dim
        msg.action_dim = model.action_dim
        msg.action_horizon = model.action_horizon
    msg.deadline = ros_time(o.deadline_ros_ns)
    msg.remaining_nfe = o.remaining_nfe
    msg.nfe_done = o.nfe_done
    msg.queue_ns = o.queue_ns
    msg.compute_ns = o.compute_ns
    msg.frozen_rows = o.frozen_rows
    msg.chunk_start = ros_time(o.chunk_start_ros_ns)
    msg.client_id = o.client_id.decode("utf-8", "surrogatepass")
    msg.reject_reason = o.reject_reason
    if pool is not None:
        msg.relay_id = pool.relay_id
        msg.pool_epoch = pool.epoch
    if o.code == Code.INFERENCE and o.actions is not None:
        msg.actions = o.actions.tolist()
    return msg
