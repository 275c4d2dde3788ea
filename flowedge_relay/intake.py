# SPDX-License-Identifier: Apache-2.0
"""The request intake in C: take, parse, validate and submit each request without the GIL.

csrc/fer_intake.h does the work on the relay's intake thread: it waits on the request
subscriptions (rcl's on-new-message callback rings an eventfd), takes each message's CDR bytes
through the rcl that rclpy loaded, checks it exactly as validation.py and policy intake do, copies
a package's tensors into the core's staging slot and submits it. A real-time intake thread then
never waits for the interpreter, and a producer's full publish rate is taken at C speed.

This module builds the C side's configuration from the loaded model, runs the loop on the calling
thread and reads its counters. The rclpy intake (node.py's request callback) stays as the
fallback, for use_sim_time and where this cannot run; both give the same decision for every
message (test/test_intake.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from flowedge_relay import policy as policy_mod
from flowedge_relay.core import Core, Decision, NotSupported, Pool, Request, check, ffi, lib
from flowedge_relay.rcl_abi import RclUnavailable, load_wire, take_functions
from flowedge_relay.timebase import (
    deadline_to_monotonic,
    instant_to_monotonic,
    origin_to_monotonic,
    stamp_ns,
)
from flowedge_relay.validation import ModelContract, Reason, Validator

#: the doorbell wait: how soon the intake thread sees a stop
WAIT_NS = 100_000_000
#: discard keys in the C intake's order (index = FER_REASON_*); validation.Reason's values
REASON_KEYS = tuple(ffi.string(lib.fer_intake_reason_name(i)).decode()
                    for i in range(lib.FER_REASONS))
#: NativeIntake.decide's key for a request a pool member leaves to its owner (docs/design.md §13):
#: dropped, or kept in standby as the owner's successor. Counted in Pool.counters(), never as a
#: discard.
NOT_OWNER, STANDBY = "not_owner", "standby"
#: NativeIntake.decide's key for a request this owner handed to its successor (pool_spill,
#: docs/design.md §13.5): the successor answers it; counted spilled_out in Pool.counters()
SPILLED = "spilled"
_NOT_DECIDED = min(lib.FER_INTAKE_NOT_OWNER, lib.FER_INTAKE_STANDBY)


class IntakeUnavailable(RuntimeError):
    """The C intake cannot serve this relay; the message says why (the rclpy intake does)."""


def _spec(spec: policy_mod.InputSpec, offset: int, out, keep: list) -> None:
    name = spec.name.encode()
    if len(name) > lib.FER_INTAKE_NAME_MAX or len(spec.shape) > lib.FER_INTAKE_NDIM_MAX:
        raise IntakeUnavailable(f"input {spec.name!r}: name or rank beyond what the C intake "
                                f"takes ({lib.FER_INTAKE_NAME_MAX} bytes, "
                                f"{lib.FER_INTAKE_NDIM_MAX} dimensions)")
    out.name[0:len(name)] = name
    out.name_len = len(name)
    out.dtype = spec.code
    out.ndim = len(spec.shape)
    for k, d in enumerate(spec.shape):
        out.shape[k] = d
    out.count = int(np.prod(spec.shape, dtype=np.int64))
    out.offset = offset
    if spec.normalization is not None:
        scale = np.ascontiguousarray(spec.normalization.scale, np.float32).reshape(-1)
        shift = np.ascontiguousarray(spec.normalization.offset, np.float32).reshape(-1)
        keep += [scale, shift]
        out.scale = ffi.from_buffer("float[]", scale)
        out.shift = ffi.from_buffer("float[]", shift)


def _config(model: ModelContract | None, max_nfe: int, max_request_bytes: int,
            prefix_offset: int | None):
    cfg = ffi.new("struct fer_intake_config *")
    keep: list[np.ndarray] = []
    cfg.max_nfe = max_nfe
    cfg.max_request_bytes = max_request_bytes
    if model is None:
        return cfg, keep  # model_ok 0: every request is model_unavailable
    digest = model.digest.encode()
    if len(digest) > lib.FER_INTAKE_DIGEST_MAX:
        raise IntakeUnavailable(f"model digest longer than {lib.FER_INTAKE_DIGEST_MAX} bytes")
    cfg.model_ok = 1
    cfg.digest[0:len(digest)] = digest
    cfg.digest_len = len(digest)
    cfg.observation_dim = model.observation_dim
    cfg.action_dim = model.action_dim
    cfg.action_horizon = model.action_horizon
    if model.policy is not None:
        inputs = model.policy.inputs
        if len(inputs) > lib.FER_INTAKE_INPUTS_MAX:
            raise IntakeUnavailable(f"{len(inputs)} declared inputs: the C intake takes "
                                    f"{lib.FER_INTAKE_INPUTS_MAX}")
        layout = policy_mod.payload_layout(model.policy)
        cfg.n_inputs = len(inputs)
        for i, spec in enumerate(inputs):
            _spec(spec, layout.offsets[spec.name], cfg.inputs[i], keep)
    if prefix_offset is not None:  # real-time chunking on: the prefix's rows lie there
        cfg.rtc = 1
        cfg.prefix_offset = prefix_offset
    return cfg, keep


class NativeIntake:
    """The C intake's decision for one core (csrc/fer_intake.h): what an IntakeLoop routed to it
    decides, and `decide` for one message's CDR bytes, for a thread that is the core's submit
    producer instead (tests, the bench)."""

    def __init__(self, core: Core, model: ModelContract | None, max_nfe: int,
                 max_request_bytes: int, prefix_offset: int | None = None,
                 pool: Pool | None = None) -> None:
        load_wire()  # the request's wire format, from the .msg's generated type support
        self._cfg, self._keep = _config(model, max_nfe, max_request_bytes, prefix_offset)
        out = ffi.new("struct fer_intake **")
        check(lib.fer_intake_create(core.ptr, self._cfg, out))
        self._in = ffi.gc(out[0], lib.fer_intake_destroy)
        self._core = core  # outlives the intake
        self._pool = pool  # likewise; None: no pool, today's intake
        if pool is not None:
            check(lib.fer_intake_set_pool(self._in, pool.ptr))
        self._counters = lib.fer_intake_counters(self._in)
        self._decision = ffi.new("int32_t *")

    @property
    def ptr(self):
        """The struct fer_intake * an IntakeLoop is routed to."""
        return self._in

    def decide(self, cdr: bytes, now_mono: int, now_ros: int) -> tuple[str | None, Decision | None]:
        """(discard key, None) or (None, the core's decision) for one serialized request; with a
        pool, (NOT_OWNER or STANDBY, None) for one another member owns."""
        reason = check(lib.fer_intake_decide(self._in, cdr, len(cdr), now_mono, now_ros,
                                             self._decision))
        if reason:
            return REASON_KEYS[reason], None
        decision = self._decision[0]
        if decision == lib.FER_SPILLED:
            return SPILLED, None
        if decision < _NOT_DECIDED:  # the core's decision: the path without a pool, unchanged
            return None, Decision(decision)
        return (NOT_OWNER if decision == lib.FER_INTAKE_NOT_OWNER else STANDBY), None

    def service_pool(self, now_mono: int, now_ros: int) -> int:
        """Run the pool's posted takeovers and standby expiry now; the requests re-decided. The
        intake loop does this on every pass; call it only from the thread that decides (tests,
        the bench)."""
        return check(lib.fer_intake_pool_service(self._in, now_mono, now_ros))

    # -- counters (any thread) -------------------------------------------------------------------

    @property
    def received(self) -> int:
        return int(self._counters.received)

    @property
    def deadlines_seen(self) -> int:
        return int(self._counters.deadlines_seen)

    def discarded(self) -> dict[str, int]:
        """Discards by reason key (every key, zeros included)."""
        counts = self._counters.discarded
        return {REASON_KEYS[i]: int(counts[i]) for i in range(1, lib.FER_REASONS)}


class IntakeLoop:
    """The intake thread's loop in C: it takes every request from the subscriptions and hands
    it to the NativeIntake it is routed to, so a model swap changes the core requests go to
    between two messages, on the one thread that takes them. `run` is the thread's body."""

    def __init__(self, max_request_bytes: int) -> None:
        out = ffi.new("struct fer_intake_loop **")
        check(lib.fer_intake_loop_create(max_request_bytes, out))
        self._loop = ffi.gc(out[0], lib.fer_intake_loop_destroy)
        self._route: NativeIntake | None = None  # kept alive while routed to
        self._pool: Pool | None = None

    def set_pool(self, pool: Pool | None) -> None:
        """The pool this loop serves (before run): its answers watch (run's `answers`), its
        takeovers and expiry, through the NativeIntake routed to (made with the same pool)."""
        self._pool = pool

    @staticmethod
    def functions():
        """rcl's take / set-callback / reset-error functions, or RclUnavailable."""
        return take_functions()

    @staticmethod
    def probe(subscriptions) -> None:
        """NotSupported unless the middleware lets the loop wait on these subscriptions
        (rcl_subscription_set_on_new_message_callback, unset again at once)."""
        fns = take_functions()
        for sub in subscriptions:
            with sub.handle:
                rc = fns.set_callback(ffi.cast("void *", sub.handle.pointer), ffi.NULL, ffi.NULL)
            if rc != lib.FER_RCL_OK:
                fns.reset_error()
                raise NotSupported(lib.FER_ENOTSUP, f"the middleware refused the on-new-message "
                                   f"callback (rcl status {rc})")

    def route(self, intake: NativeIntake | None) -> NativeIntake | None:
        """Decide what is taken from the next message on through `intake`; returns the one
        routed to before, which the caller keeps alive until the loop has moved on (it has once
        one more message was taken, or the loop stopped)."""
        before, self._route = self._route, intake
        check(lib.fer_intake_loop_route(self._loop, intake.ptr if intake else ffi.NULL))
        return before

    def run(self, subscriptions, functions=None, answers=()) -> None:
        """The intake thread: until stop(). `subscriptions` are rclpy Subscriptions; their handles
        are held (not destroyed) while the loop uses them. NotSupported if the middleware refuses
        the on-new-message callback. `answers`: with a pool (set_pool), subscriptions of
        flowedge/actions (ActionMessage; the loop takes their CDR bytes, no executor spins
        them), whose answers clear the pool's standby table."""
        fns = functions if functions is not None else take_functions()
        check(lib.fer_intake_loop_set_pool(self._loop, self._pool.ptr if self._pool else ffi.NULL,
                                           len(subscriptions)))
        handles = [s.handle for s in list(subscriptions) + list(answers)]
        for h in handles:
            h.__enter__()
        try:
            ptrs = ffi.new("void *[]", [ffi.cast("void *", h.pointer) for h in handles])
            check(lib.fer_intake_loop_run(self._loop, fns, ptrs, len(handles), WAIT_NS))
        finally:
            for h in reversed(handles):
                h.__exit__(None, None, None)

    def stop(self) -> None:
        lib.fer_intake_loop_stop(self._loop)

    def pause(self, paused: bool) -> None:
        """DRILLS AND TESTS ONLY: while paused, the loop takes nothing (see IntakePause)."""
        lib.fer_intake_loop_pause(self._loop, int(paused))

    def rearm(self) -> None:
        """Clear a stop, so that `run` can be called again."""
        lib.fer_intake_loop_rearm(self._loop)

    @property
    def take_errors(self) -> int:
        return int(lib.fer_intake_loop_counters(self._loop).take_errors)

    @property
    def unrouted(self) -> int:
        """Messages taken while routed nowhere (dropped: no model to decide them)."""
        return int(lib.fer_intake_loop_unrouted(self._loop))


class IntakePause:
    """DRILLS AND TESTS ONLY: while set, the relay's intake takes no request, as if its thread
    were held; requests wait in the middleware (docs/design.md §3: what it then drops is
    counted as middleware_lost). The threading.Event interface, also read by the C loop."""

    def __init__(self, native: IntakeLoop | None) -> None:
        self._event = threading.Event()
        self._native = native

    def set(self) -> None:
        self._event.set()
        if self._native is not None:
            self._native.pause(True)

    def clear(self) -> None:
        self._event.clear()
        if self._native is not None:
            self._native.pause(False)

    def is_set(self) -> bool:
        return self._event.is_set()


def pool_owns(pool: Pool, msg) -> bool:
    """The rclpy intake's pool check of an InferenceRequest, before validation, as the C intake
    makes it (docs/design.md §13): False (counted not_owner) when another member owns it. The
    session id's bytes as rclpy gives them back, the digest as sent, the origin stamp (an
    invalid one counts as unset, as in C). Only from the thread that decides requests."""
    origin = msg.origin_stamp
    valid = origin.sec >= 0 and origin.nanosec < 1_000_000_000
    return pool.owner_is_self(msg.session_id.encode("utf-8", "surrogatepass"),
                              msg.model_digest, stamp_ns(origin) if valid else 0)


class PythonIntake:
    """The rclpy intake's decision for one InferenceRequest: validation.py, the clocks, the core.

    The fallback of NativeIntake (use_sim_time, no rcl symbols) and its reference: both decide
    every message alike. `ros_now` reads the ROS clock, only once a request passed validation
    (a discard costs no clock read). Not thread-safe: the request thread's own.
    """

    def __init__(self, core: Core, validator: Validator, ros_now: Callable[[], int]) -> None:
        self.core, self.validator, self._ros_now = core, validator, ros_now
        self.received = 0
        self.deadlines_seen = 0
        self.last_refusal: Exception | None = None  # what the core said, for the node's log

    def decide(self, msg, now_mono: int,
               now_ros: int | None = None) -> tuple[Reason | None, Decision | None]:
        """(discard reason, None), or (None, the core's decision). A request the core refuses
        counts as core_refused and is returned as such (validation missed a case)."""
        self.received += 1
        reason, sid, obs = self.validator.check(msg)
        if reason is not None:
            return reason, None
        if now_ros is None:
            now_ros = self._ros_now()
        deadline_ros = stamp_ns(msg.deadline)
        if deadline_ros:
            self.deadlines_seen += 1
        rtc = {}
        if len(msg.prefix_actions):  # validated: whole rows, a positive period (§5.4)
            start = stamp_ns(msg.prefix_start)
            rtc = {"prefix_rows": len(msg.prefix_actions) // self.validator.model.action_dim,
                   "prefix_start_ns": instant_to_monotonic(start, now_ros, now_mono),
                   "prefix_start_ros_ns": start,
                   "action_period_ns": stamp_ns(msg.action_period)}  # fmt: skip
        request = Request(
            session_id=sid,
            sequence=msg.sequence,
            generation=msg.generation,
            retry_count=msg.retry_count,
            retry_reason=msg.retry_reason,
            origin_ns=origin_to_monotonic(stamp_ns(msg.origin_stamp), now_ros, now_mono),
            deadline_ns=deadline_to_monotonic(deadline_ros, now_ros, now_mono),
            deadline_ros_ns=deadline_ros,
            remaining_nfe=msg.remaining_nfe,
            noise_seed=msg.noise_seed,
            observation=obs,
            client_id=msg.client_id.encode("utf-8", "surrogatepass"),
            **rtc,
        )
        try:
            return None, self.core.submit(request, now_mono)
        except Exception as exc:  # one hostile message must never kill the request thread
            self.validator.discarded[Reason.CORE_REFUSED] += 1
            self.last_refusal = exc
            return Reason.CORE_REFUSED, None


__all__ = ["NOT_OWNER", "REASON_KEYS", "STANDBY", "WAIT_NS", "IntakeLoop", "IntakeUnavailable",
           "NativeIntake", "NotSupported", "PythonIntake", "RclUnavailable", "pool_owns"]
