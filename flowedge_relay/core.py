# SPDX-License-Identifier: Apache-2.0
"""Thin typed wrapper of the C scheduling core (``csrc/``, built by ``_build_core.py``).

The API is ``docs/core-api.md``; the rules are docs/design.md §4-8 and live in C. This module
only converts between Python values and C structs, and turns C status codes into exceptions in
one place, :func:`_check`.

Buffers: each calling role has its own preallocated cdata (the request struct for the request
thread, a work struct and observation / action buffers per lane and per worker, an outcome
array for the publisher), so the hot path allocates no C memory. Per-request payloads live in
the core's slots (allocated at create); ``payload_view(slot)`` is a numpy view of one, made once
per slot at create. The flip side is the thread contract of core-api.md: one request thread
calls ``submit`` (and writes the staging slot's payload), only worker ``w`` calls the methods of
its lanes (``worker_lanes(w)``: ``[w*B, (w+1)*B)`` with B = batch_slots) and its own
``worker_wait`` / ``dispatch_worker``, one publisher thread calls ``wait_outputs`` /
``pop_outcomes``. CFFI releases the GIL inside every C call, so a worker blocked in
``wait_for_work`` does not block the interpreter.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import numpy as np

try:
    import flowedge_relay._fer_core as _module
    from flowedge_relay._fer_core import ffi, lib
except ImportError as exc:  # pragma: no cover - exercised only without a build
    raise ImportError(
        "flowedge_relay._fer_core (the C scheduling core) is not built: run `make core` or "
        "`python -m flowedge_relay._build_core` from the repository root"
    ) from exc

SESSION_ID_MAX = lib.FER_SESSION_ID_MAX


# The vocabulary below is derived from csrc/fer.h (values) and mirrors ActionMessage's constants
# (test/test_core.py::test_vocabulary_matches_header_and_messages ties the three together).
RETRY_COUNT_BUCKETS = lib.FER_RETRY_COUNT_BUCKETS  # retry_count 1..7, the last bucket is 7+
RETRY_REASON_MAX = lib.FER_RETRY_REASONS - 1  # InferenceRequest.RETRY_AFTER_EXPIRED


class Code(enum.IntEnum):
    """Outcome codes, same values as ActionMessage."""

    INFERENCE = lib.FER_INFERENCE
    REJECTED_STALE = lib.FER_REJECTED_STALE
    REJECTED_DEADLINE = lib.FER_REJECTED_DEADLINE
    REJECTED_CAPACITY = lib.FER_REJECTED_CAPACITY
    EXPIRED = lib.FER_EXPIRED
    INFERENCE_FAILED = lib.FER_INFERENCE_FAILED

    @property
    def key(self) -> str:
        """The lower-case name: the key in diagnostics, stats and JSON ("rejected_stale")."""
        return self.name.lower()


class FailCause(enum.IntEnum):
    """Why work ended INFERENCE_FAILED (Core.fail): counted per cause, `failed.<key>`."""

    NON_FINITE = lib.FER_FAIL_NON_FINITE  # its actions held a NaN or an infinity
    RUNTIME_ERROR = lib.FER_FAIL_RUNTIME_ERROR  # its model call raised

    @property
    def key(self) -> str:
        return self.name.lower()


CODE_NAMES = tuple(code.name for code in Code)  # "INFERENCE", ... in code order
CODE_KEYS = tuple(code.key for code in Code)  # "inference", ... in code order


class Decision(enum.IntEnum):
    """What happened to a submitted request itself: an outcome code, or one of two more."""

    ACCEPTED = lib.FER_ACCEPTED
    REJECTED_STALE = lib.FER_REJECTED_STALE
    REJECTED_DEADLINE = lib.FER_REJECTED_DEADLINE
    REJECTED_CAPACITY = lib.FER_REJECTED_CAPACITY
    EXPIRED = lib.FER_EXPIRED
    COALESCED = lib.FER_COALESCED


class AgeGate(enum.IntEnum):
    OFF = lib.FER_AGE_GATE_OFF
    RETRIES = lib.FER_AGE_GATE_RETRIES
    ALL = lib.FER_AGE_GATE_ALL


class CostModel(enum.IntEnum):
    """docs/design.md §5.2: admit with the configured nfe_ns, or with max(nfe_ns, measured tail)."""

    STATIC = lib.FER_COST_STATIC
    ADAPTIVE = lib.FER_COST_ADAPTIVE


class Step(enum.IntEnum):
    CONTINUE = lib.FER_STEP_CONTINUE
    DONE = lib.FER_STEP_DONE
    STOP_STALE = lib.FER_STEP_STOP_STALE
    STOP_EXPIRED = lib.FER_STEP_STOP_EXPIRED


# ---- errors: the one place C status codes become exceptions --------------------------------------


class CoreError(Exception):
    """A C core call failed; ``code`` is the FER_E* status."""

    def __init__(self, code: int, message: str):
        super().__init__(f"{message} (fer status {code})")
        self.code = code


class InvalidArgument(CoreError, ValueError):
    """FER_EINVAL: bad configuration, lane index or request that validation should have caught."""


class OutOfMemory(CoreError, MemoryError):
    """FER_ENOMEM: allocation failed in create."""


class InvalidState(CoreError, RuntimeError):
    """FER_ESTATE: the call does not fit the lane's state (e.g. step on an idle lane)."""


class RingFull(CoreError):
    """FER_EFULL: a standalone ring refused a push (it counted the drop)."""


class SystemFailure(CoreError, OSError):
    """FER_ESYS: pthread initialisation failed."""


class NotSupported(CoreError):
    """FER_ENOTSUP: the middleware or a library does not offer what the call needs."""


_ERRORS = {
    lib.FER_EINVAL: InvalidArgument,
    lib.FER_ENOMEM: OutOfMemory,
    lib.FER_ESTATE: InvalidState,
    lib.FER_EFULL: RingFull,
    lib.FER_ESYS: SystemFailure,
    lib.FER_ENOTSUP: NotSupported,
}


def _check(rc: int) -> int:
    """Return rc if it is a success value (>= 0), else raise the matching CoreError subclass."""
    if rc < 0:
        raise _ERRORS.get(rc, CoreError)(rc, ffi.string(lib.fer_strerror(rc)).decode())
    return rc


check = _check  # for the other modules that call fer_* functions (native.py)


def library_path() -> str:
    """The file of the compiled core this process runs: the tools' C drivers bind their calls into
    the core to it (flowedge_relay_tools/native.py), so there is one core per process."""
    return _module.__file__


# ---- data ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CoreConfig:
    workers: int = 1
    queue_capacity: int = 64
    max_sessions: int = 256
    max_nfe: int = 64
    obs_dim: int = 4
    action_len: int = 16
    ring_capacity: int = 256
    nfe_ns: int = 0
    admission_reserve_ns: int = 0
    reject_if_retry_count_gte: int = 1
    age_gate: AgeGate = AgeGate.RETRIES
    reject_if_queue_age_ns_gte: int = 0
    queue_timeout_ns: int = 0
    session_idle_ns: int = 10_000_000_000
    cost_model: CostModel = CostModel.STATIC
    cost_window_ns: int = 0  # 0 = 1 s
    cost_quantile_ppm: int = 0  # 0 = 900000 (p90)
    two_phase: int = 0  # 1: every request pays prefix_ns once before its first NFE (§5, §10)
    payload_bytes: int = 0  # bytes of per-request payload in each slot; 0 = none
    prefix_ns: int = 0  # calibrated ns of one prefix pass; used only when two_phase
    batch_slots: int = 1  # B lanes per worker (docs/design.md §5.1): W x B lanes in all
    cede_ns: int = 0  # §5.3: workers pause this long after each cede_every_ns of compute
    cede_every_ns: int = 0  # (admission prices the pauses); 0 = they never do
    rtc_max_delay: int = 0  # §5.4: most frozen rows; 0 = real-time chunking off
    fair_share: int = 0  # §7.1: 1 = keep each client within its weighted share (live)
    max_clients: int = 0  # §7.1: tracked clients (0 = 64)
    # §7.1: ("pattern", weight) rules, glob on client_id, the first match wins (default 1)
    client_weights: tuple[tuple[str, int], ...] = ()


@dataclass
class Request:
    session_id: bytes
    sequence: int
    generation: int
    retry_count: int
    retry_reason: int
    origin_ns: int
    deadline_ns: int
    deadline_ros_ns: int
    remaining_nfe: int
    noise_seed: int
    observation: np.ndarray
    # §5.4 real-time chunking: the robot executes prefix_rows rows of its current chunk from
    # prefix_start_ns (monotonic) on, one per action_period_ns; 0 rows = a plain request
    prefix_rows: int = 0
    prefix_start_ns: int = 0
    prefix_start_ros_ns: int = 0
    action_period_ns: int = 0
    client_id: bytes = b""  # §7.1: whose request; empty = the session's


@dataclass(frozen=True)
class Work:
    """A dispatched request. ``observation`` is the lane's own buffer: valid until the lane's
    next dispatch (copy it to keep it longer)."""

    lane: int
    slot: int
    session_id: bytes
    sequence: int
    generation: int
    remaining_nfe: int
    noise_seed: int
    deadline_ns: int
    observation: np.ndarray
    frozen_rows: int = 0  # §5.4: leading chunk rows copied from the prefix, fixed at dispatch


@dataclass(frozen=True)
class Outcome:
    code: Code
    session_id: bytes
    sequence: int
    generation: int
    retry_count: int
    retry_reason: int
    deadline_ros_ns: int
    remaining_nfe: int
    nfe_done: int
    queue_ns: int
    compute_ns: int
    arrival_ns: int
    finish_ns: int
    lane: int
    actions: np.ndarray | None
    frozen_rows: int = 0  # §5.4: INFERENCE only
    chunk_start_ros_ns: int = 0  # §5.4: the request's prefix start, echoed; 0 = none
    client_id: bytes = b""  # §7.1: the client charged (the session_id when none was sent)
    reject_reason: int = 0  # §7.1: REJECT_* of a REJECTED_CAPACITY, else REJECT_NONE


class RejectReason(enum.IntEnum):
    """Why a REJECTED_CAPACITY (ActionMessage.REJECT_*, docs/design.md §7.1)."""

    NONE = lib.FER_REJECT_NONE
    CAPACITY = lib.FER_REJECT_CAPACITY
    FAIR_SHARE = lib.FER_REJECT_FAIR_SHARE


@dataclass(frozen=True)
class ClientState:
    """One tracked client (fair_share on, docs/design.md §7.1)."""

    client_id: bytes
    weight: int
    committed_nfe: int  # remaining NFE of its queued and running requests
    admitted_nfe: int  # NFE of its accepted requests (counter)
    fair_share_rejections: int  # arrivals refused and queued work displaced for the share
    last_active_ns: int


@dataclass(frozen=True)
class Stats:
    submitted: int
    accepted: int
    outcomes: list[int]
    coalesced: int
    rejected_late_retries: int
    retries_by_count: list[int]
    retries_by_reason: list[int]
    calibration_misses: int
    rejection_outputs_dropped: int
    action_outputs_dropped: int
    nfe_total: int
    nfe_wasted: int
    displaced: int
    sessions_evicted: int
    sessions_evicted_early: int
    queue_depth: int
    sessions: int
    lanes_busy: int
    lanes_alive: int
    oldest_queued_arrival_ns: int
    busy_ns: int
    rejected_inactive: int = 0  # REJECTED_CAPACITY while the relay was not accepting (§9)
    fair_share_rejected: int = 0  # §7.1: arrivals refused as over their client's share
    fair_share_displaced: int = 0  # §7.1: queued requests displaced for an under-share one
    clients_evicted: int = 0  # §7.1: idle clients forgotten to make room
    clients: int = 0  # §7.1: tracked clients (gauge)
    failed: list[int] = field(default_factory=lambda: [0] * len(FailCause))  # per FailCause


@dataclass(frozen=True)
class CostStats:
    """The cost model at one instant (fer.h struct fer_cost_stats): the measured NFE tail over
    the window (the larger of the NFE quantile and the busiest block's mean span per step, a
    block being a worker's whole requests, 16 to 128 steps) next to the configured nfe_ns and
    the value admission uses."""

    cost_model: CostModel
    quantile_ppm: int
    window_ns: int
    configured_ns: int
    observed_tail_ns: int
    window_max_ns: int
    window_samples: int
    in_use_ns: int
    samples_total: int
    # the same for prefix passes (two-phase models); defaults so single-graph callers can omit them
    prefix_configured_ns: int = 0
    prefix_observed_tail_ns: int = 0
    prefix_in_use_ns: int = 0
    prefix_samples_total: int = 0
    # the two statistics observed_tail_ns is the larger of
    quantile_tail_ns: int = 0
    block_mean_ns: int = 0


@dataclass(frozen=True)
class QueuedItem:
    slot: int
    session_id: bytes
    sequence: int
    generation: int
    deadline_ns: int
    arrival_ns: int
    arrival_seq: int
    remaining_nfe: int
    tested: bool


@dataclass(frozen=True)
class LaneState:
    lane: int
    alive: bool
    busy: bool
    slot: int
    session_id: bytes
    sequence: int
    generation: int
    remaining_nfe: int
    nfe_done: int
    deadline_ns: int
    dispatch_ns: int
    cancelled: bool
    prefix_pending: bool = False  # two-phase work whose prefix pass is not reported yet


_STATS_SCALARS = [f for f in Stats.__dataclass_fields__ if f not in
                  ("outcomes", "retries_by_count", "retries_by_reason", "failed")]
_POP_CHUNK = 256


def _float_buffer(n: int):
    """A C float[n] (at least one element) and a numpy view of its first n floats."""
    buf = ffi.new("float[]", max(n, 1))
    return buf, np.frombuffer(ffi.buffer(buf), dtype=np.float32)[:n]


def _work(w, observation: np.ndarray) -> Work:
    """A Work from a filled struct fer_work (observation: the buffer it was filled into)."""
    return Work(lane=w.lane, slot=w.slot,
                session_id=ffi.unpack(w.session_id, w.session_id_len),
                sequence=w.sequence, generation=w.generation,
                remaining_nfe=w.remaining_nfe, noise_seed=w.noise_seed,
                deadline_ns=w.deadline_ns, observation=observation, frozen_rows=w.frozen_rows)


class Core:
    """One scheduling core. Close it (or use it as a context manager) after its threads stop."""

    def __init__(self, config: CoreConfig):
        cfg = ffi.new("struct fer_config *")
        for name in CoreConfig.__dataclass_fields__:
            if name == "client_weights":
                continue
            value = getattr(config, name)
            if not isinstance(value, int) or value < 0:
                raise InvalidArgument(lib.FER_EINVAL, f"config.{name} must be an int >= 0")
            try:
                setattr(cfg, name, int(value))
            except OverflowError as exc:
                raise InvalidArgument(lib.FER_EINVAL, f"config.{name} out of range") from exc
        out = ffi.new("struct fer_core **")
        _check(lib.fer_core_create(cfg, out))
        self._core = out[0]
        self.config = config
        try:
            self.set_client_weights(config.client_weights)
        except CoreError:
            self.close()
            raise
        self.workers = config.workers
        #: B lanes per worker (0 means 1, as in the core); lanes = W x B, worker w owns
        #: lanes [w*B, (w+1)*B)
        self.batch_slots = config.batch_slots or 1
        self.lanes = self.workers * self.batch_slots
        self.obs_dim = config.obs_dim
        self.action_len = config.action_len
        # request thread
        self._req = ffi.new("struct fer_request *")
        self._req_obs, _ = _float_buffer(config.obs_dim)
        self._req.observation = self._req_obs
        # worker lanes (per lane: dispatch, finish), and per worker (dispatch_worker)
        self._work = [ffi.new("struct fer_work *") for _ in range(self.lanes)]
        self._work_obs = [_float_buffer(config.obs_dim) for _ in range(self.lanes)]
        for w, (buf, _) in zip(self._work, self._work_obs, strict=True):
            w.observation = buf
        self._act = [_float_buffer(config.action_len) for _ in range(self.lanes)]
        self._wwork = [ffi.new("struct fer_work *") for _ in range(config.workers)]
        self._wwork_obs = [_float_buffer(config.obs_dim) for _ in range(config.workers)]
        for w, (buf, _) in zip(self._wwork, self._wwork_obs, strict=True):
            w.observation = buf
        # publisher
        self._out = ffi.new("struct fer_outcome[]", _POP_CHUNK)
        self._out_act, self._out_act_np = _float_buffer(_POP_CHUNK * config.action_len)
        # payloads: one view per slot over the core's own memory (fixed at create)
        self.slots = config.queue_capacity + self.lanes + 1
        self._payloads = self._payload_views(config.payload_bytes)

    def _payload_views(self, nbytes: int) -> list[np.ndarray]:
        """A uint8[nbytes] view of every slot's payload (empty arrays when nbytes == 0), so the
        request thread and the workers never build one on the hot path."""
        if nbytes == 0:
            empty = np.zeros(0, np.uint8)
            empty.flags.writeable = False
            return [empty] * self.slots
        views = []
        for slot in range(self.slots):
            ptr = lib.fer_core_payload(self._core, slot)
            if ptr == ffi.NULL:  # pragma: no cover - the core and this module disagree on slots
                raise CoreError(lib.FER_ESTATE, f"no payload for slot {slot}")
            views.append(np.frombuffer(ffi.buffer(ffi.cast("uint8_t *", ptr), nbytes), np.uint8))
        if lib.fer_core_payload(self._core, self.slots) != ffi.NULL:  # pragma: no cover
            raise CoreError(lib.FER_ESTATE, "the core has more slots than expected")
        return views

    # ---- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Free the core. Payload views handed out before must no longer be used."""
        core, self._core = getattr(self, "_core", None), None
        self._payloads = []
        if core is not None:
            lib.fer_core_destroy(core)

    def __enter__(self) -> Core:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()

    def shutdown(self) -> None:
        """Wake every wait_for_work / wait_outputs waiter; later waits return at once."""
        _check(lib.fer_core_shutdown(self.ptr))
        self.is_shut_down = True

    #: True once shutdown() was called: waits no longer block (a loop must not spin on them)
    is_shut_down = False

    @property
    def ptr(self):
        """The C ``struct fer_core *`` (for the native loop and the C publisher, which call the
        core from C); InvalidState once the core is closed."""
        if self._core is None:
            raise InvalidState(lib.FER_ESTATE, "core is closed")
        return self._core

    # ---- lifecycle and model swap (any thread; fer.h says what each means) --------------------

    def set_accepting(self, accepting: bool) -> None:
        """False: every valid arrival is REJECTED_CAPACITY at once (an inactive relay)."""
        _check(lib.fer_core_set_accepting(self.ptr, int(accepting)))

    def set_fair_share(self, on: bool) -> None:
        """§7.1, live: the next decision keeps each client within its share (or stops to);
        the clients are tracked either way, so work admitted before counts at once."""
        _check(lib.fer_core_set_fair_share(self.ptr, int(on)))

    def set_client_weights(self, rules) -> None:
        """§7.1, live: ("pattern", weight) rules replace the old ones whole, and every tracked
        client takes its weight under them; InvalidArgument (the old rules kept) for a pattern
        over SESSION_ID_MAX bytes, a weight out of range or too many rules."""
        rules = tuple(rules)
        if len(rules) > lib.FER_WEIGHT_RULES:
            raise InvalidArgument(lib.FER_EINVAL, f"client_weights: at most "
                                  f"{lib.FER_WEIGHT_RULES} rules, got {len(rules)}")
        buf = ffi.new("struct fer_client_weight[]", max(len(rules), 1))
        for i, (pattern, weight) in enumerate(rules):
            item = buf[i]
            raw = pattern.encode()
            if len(raw) > SESSION_ID_MAX:
                raise InvalidArgument(lib.FER_EINVAL, f"client_weights pattern {pattern!r} "
                                      f"longer than {SESSION_ID_MAX} bytes")
            ffi.memmove(item.pattern, raw, len(raw))
            item.len = len(raw)
            item.weight = int(weight) if 0 <= int(weight) < 2**32 else 0
        _check(lib.fer_core_set_client_weights(self.ptr, buf, len(rules)))

    def hold_dispatch(self, held: bool) -> None:
        """True: no worker dispatches until released (a swapped-in core while the old drains)."""
        _check(lib.fer_core_hold_dispatch(self.ptr, int(held)))

    def reserve_lanes_until(self, until_ns: int) -> None:
        """Admission counts every lane busy until until_ns (0: no reserve)."""
        _check(lib.fer_core_reserve_lanes_until(self.ptr, until_ns))

    def drain_bound(self, now: int) -> int:
        """When everything the core holds will be done (csrc/fer.h: the lane simulation, capped
        by the deadlines); `now` when idle, UINT64_MAX when no bound is known."""
        return int(lib.fer_core_drain_bound(self.ptr, now))

    # ---- request thread ------------------------------------------------------------------------

    def submit(self, req: Request, now: int) -> Decision:
        r = self._req
        sid = req.session_id
        if len(sid) > SESSION_ID_MAX:
            raise InvalidArgument(lib.FER_EINVAL, "session_id longer than SESSION_ID_MAX")
        obs = req.observation
        if obs.dtype != np.float32 or obs.shape != (self.obs_dim,):
            raise InvalidArgument(lib.FER_EINVAL, f"observation must be float32[{self.obs_dim}]")
        ffi.memmove(r.session_id, sid, len(sid))
        r.session_id_len = len(sid)
        r.sequence = req.sequence
        r.generation = req.generation
        r.retry_count = req.retry_count
        r.retry_reason = req.retry_reason
        r.origin_ns = req.origin_ns
        r.deadline_ns = req.deadline_ns
        r.deadline_ros_ns = req.deadline_ros_ns
        r.remaining_nfe = req.remaining_nfe
        r.noise_seed = req.noise_seed
        r.prefix_rows = req.prefix_rows
        r.prefix_start_ns = req.prefix_start_ns
        r.prefix_start_ros_ns = req.prefix_start_ros_ns
        r.action_period_ns = req.action_period_ns
        cid = req.client_id
        if len(cid) > SESSION_ID_MAX:
            raise InvalidArgument(lib.FER_EINVAL, "client_id longer than SESSION_ID_MAX")
        ffi.memmove(r.client_id, cid, len(cid))
        r.client_id_len = len(cid)
        if self.obs_dim:
            ffi.memmove(self._req_obs, np.ascontiguousarray(obs), 4 * self.obs_dim)
        return Decision(_check(lib.fer_core_submit(self.ptr, r, now)))

    def staging_slot(self) -> int:
        """The slot the next accepted submit occupies: write its payload there first. It changes
        only when a submit is ACCEPTED."""
        return _check(lib.fer_core_staging_slot(self.ptr))

    def payload_view(self, slot: int) -> np.ndarray:
        """uint8[payload_bytes] view of `slot`'s payload in the core's memory (empty when
        payload_bytes is 0). The core never touches it; a worker may read it from dispatch until
        its lane's finish or STOP_* step / prefix_done. Valid until close()."""
        _ = self.ptr  # InvalidState once the core is closed
        if not 0 <= slot < self.slots:
            raise InvalidArgument(lib.FER_EINVAL, f"slot {slot} not in 0..{self.slots - 1}")
        return self._payloads[slot]

    # ---- worker thread for a lane --------------------------------------------------------------

    def wait_for_work(self, lane: int, timeout_ns: int) -> bool:
        """Wait up to timeout_ns for queued work; True if the queue is non-empty (False after
        shutdown)."""
        return bool(_check(lib.fer_core_wait_for_work(self.ptr, lane, timeout_ns)))

    def dispatch(self, lane: int, now: int) -> Work | None:
        w = self._work[lane] if 0 <= lane < self.lanes else ffi.NULL
        if not _check(lib.fer_core_dispatch(self.ptr, lane, now, w)):
            return None
        return _work(w, self._work_obs[lane][1])

    # ---- worker thread w as a whole (batch slots, docs/design.md §5.1) ---------------------------

    def worker_lanes(self, worker: int) -> range:
        """The lanes (batch slots) worker `worker` owns."""
        b = self.batch_slots
        return range(worker * b, (worker + 1) * b)

    def worker_wait(self, worker: int, timeout_ns: int) -> bool:
        """Wait up to timeout_ns until work is queued and the worker has a free lane."""
        return bool(_check(lib.fer_core_worker_wait(self.ptr, worker, timeout_ns)))

    def dispatch_worker(self, worker: int, now: int) -> Work | None:
        """Non-blocking: the EDF head onto the worker's lowest free lane (``Work.lane``), or
        None when it has no free lane or nothing can run. ``observation`` is the worker's own
        buffer, valid until its next dispatch_worker."""
        w = self._wwork[worker] if 0 <= worker < self.workers else ffi.NULL
        if not _check(lib.fer_core_dispatch_worker(self.ptr, worker, now, w)):
            return None
        return _work(w, self._wwork_obs[worker][1])

    def queued(self) -> int:
        """The queue length as of a recent instant, read without the core mutex (a hint)."""
        return _check(lib.fer_core_queued(self.ptr))

    def prefix_done(self, lane: int, now: int, measured_ns: int) -> Step:
        """After the prefix pass of the lane's work (two_phase): CONTINUE, or STOP_STALE /
        STOP_EXPIRED with the outcome emitted and the lane freed, as step does."""
        return Step(_check(lib.fer_core_prefix_done(self.ptr, lane, now, measured_ns)))

    def step(self, lane: int, now: int, nfe_ns_measured: int) -> Step:
        return Step(_check(lib.fer_core_step(self.ptr, lane, now, nfe_ns_measured)))

    def paused(self, lane: int, pause_ns: int) -> None:
        """The lane's worker paced itself for pause_ns before its next step (design.md §5.3):
        the cost in use prices that pause, so the step's busy span (§5.2) leaves it out."""
        _check(lib.fer_core_paused(self.ptr, lane, pause_ns))

    def output_space(self, lane: int) -> bool:
        return bool(_check(lib.fer_core_output_space(self.ptr, lane)))

    def finish(self, lane: int, now: int, actions: np.ndarray) -> Code:
        if not 0 <= lane < self.lanes:
            _check(lib.FER_EINVAL)
        buf, _ = self._act[lane]
        if actions.dtype != np.float32 or actions.size != self.action_len:
            raise InvalidArgument(lib.FER_EINVAL, f"actions must be float32[{self.action_len}]")
        if self.action_len:
            ffi.memmove(buf, np.ascontiguousarray(actions), 4 * self.action_len)
        return Code(_check(lib.fer_core_finish(self.ptr, lane, now, buf)))

    def fail(self, lane: int, now: int, cause: FailCause) -> Code:
        """The lane's work ends INFERENCE_FAILED with no actions, counted under `cause`."""
        return Code(_check(lib.fer_core_fail(self.ptr, lane, now, int(cause))))

    def disable_lane(self, lane: int, now: int) -> None:
        _check(lib.fer_core_disable_lane(self.ptr, lane, now))

    # ---- publisher thread ------------------------------------------------------------------------

    def wait_outputs(self, timeout_ns: int) -> None:
        _check(lib.fer_core_wait_outputs(self.ptr, timeout_ns))

    def pop_outcomes(self, max_n: int = 256) -> list[Outcome]:
        core = self.ptr
        out, al, result = self._out, self.action_len, []
        while len(result) < max_n:
            want = min(_POP_CHUNK, max_n - len(result))
            n = _check(lib.fer_core_pop_outcomes(core, out, self._out_act, want))
            for i in range(n):
                o = out[i]
                actions = (self._out_act_np[i * al:(i + 1) * al].copy()
                           if o.has_actions else None)
                result.append(Outcome(
                    code=Code(o.code), session_id=ffi.unpack(o.session_id, o.session_id_len),
                    sequence=o.sequence, generation=o.generation, retry_count=o.retry_count,
                    retry_reason=o.retry_reason, deadline_ros_ns=o.deadline_ros_ns,
                    remaining_nfe=o.remaining_nfe, nfe_done=o.nfe_done, queue_ns=o.queue_ns,
                    compute_ns=o.compute_ns, arrival_ns=o.arrival_ns, finish_ns=o.finish_ns,
                    lane=o.lane, actions=actions, frozen_rows=o.frozen_rows,
                    chunk_start_ros_ns=o.chunk_start_ros_ns,
                    client_id=ffi.unpack(o.client_id, o.client_id_len),
                    reject_reason=o.reject_reason))
            if n < want:
                break
        return result

    # ---- any thread -----------------------------------------------------------------------------

    def set_calibration(self, nfe_ns: int, admission_reserve_ns: int, prefix_ns: int = 0) -> None:
        _check(lib.fer_core_set_calibration(self.ptr, nfe_ns, admission_reserve_ns,
                                            prefix_ns))

    def set_policy(self, reject_if_retry_count_gte: int, age_gate: AgeGate,
                   reject_if_queue_age_ns_gte: int, queue_timeout_ns: int) -> None:
        _check(lib.fer_core_set_policy(self.ptr, reject_if_retry_count_gte, int(age_gate),
                                       reject_if_queue_age_ns_gte, queue_timeout_ns))

    def set_cost_model(self, cost_model: CostModel, window_ns: int = 0,
                       quantile_ppm: int = 0) -> None:
        """Switch static / adaptive live; a new window forgets the samples (0 = defaults)."""
        _check(lib.fer_core_set_cost_model(self.ptr, int(cost_model), window_ns,
                                           quantile_ppm))

    def cost_stats(self, now: int) -> CostStats:
        """The measured NFE tail and the per-NFE cost admission uses at `now`."""
        k = ffi.new("struct fer_cost_stats *")
        _check(lib.fer_core_cost_stats(self.ptr, now, k))
        return CostStats(
            cost_model=CostModel(k.cost_model), quantile_ppm=k.quantile_ppm,
            window_ns=k.window_ns, configured_ns=k.configured_ns,
            observed_tail_ns=k.observed_tail_ns, window_max_ns=k.window_max_ns,
            window_samples=k.window_samples, in_use_ns=k.in_use_ns,
            samples_total=k.samples_total, prefix_configured_ns=k.prefix_configured_ns,
            prefix_observed_tail_ns=k.prefix_observed_tail_ns,
            prefix_in_use_ns=k.prefix_in_use_ns, prefix_samples_total=k.prefix_samples_total,
            quantile_tail_ns=k.quantile_tail_ns, block_mean_ns=k.block_mean_ns,
        )  # fmt: skip

    def stats(self) -> Stats:
        s = ffi.new("struct fer_stats *")
        _check(lib.fer_core_stats(self.ptr, s))
        return Stats(outcomes=list(s.outcomes), retries_by_count=list(s.retries_by_count),
                     retries_by_reason=list(s.retries_by_reason), failed=list(s.failed),
                     **{name: getattr(s, name) for name in _STATS_SCALARS})

    def clients_snapshot(self) -> list[ClientState]:
        """The tracked clients (tracked with fair_share off too), in table order."""
        n = self.config.max_clients or 64
        buf = ffi.new("struct fer_client_state[]", n)
        got = _check(lib.fer_core_clients_snapshot(self.ptr, buf, n))
        return [ClientState(client_id=ffi.unpack(c.client_id, c.client_id_len), weight=c.weight,
                            committed_nfe=c.committed_nfe, admitted_nfe=c.admitted_nfe,
                            fair_share_rejections=c.fair_share_rejections,
                            last_active_ns=c.last_active_ns)
                for c in buf[0:got]]

    def queue_snapshot(self) -> list[QueuedItem]:
        buf = ffi.new("struct fer_queued_item[]", self.config.queue_capacity)
        n = _check(lib.fer_core_queue_snapshot(self.ptr, buf, self.config.queue_capacity))
        return [QueuedItem(slot=q.slot, session_id=ffi.unpack(q.session_id, q.session_id_len),
                           sequence=q.sequence, generation=q.generation,
                           deadline_ns=q.deadline_ns, arrival_ns=q.arrival_ns,
                           arrival_seq=q.arrival_seq, remaining_nfe=q.remaining_nfe,
                           tested=bool(q.tested))
                for q in buf[0:n]]

    def lanes_snapshot(self) -> list[LaneState]:
        buf = ffi.new("struct fer_lane_state[]", self.lanes)
        n = _check(lib.fer_core_lanes_snapshot(self.ptr, buf, self.lanes))
        return [LaneState(lane=x.lane, alive=bool(x.alive), busy=bool(x.busy), slot=x.slot,
                          session_id=ffi.unpack(x.session_id, x.session_id_len),
                          sequence=x.sequence, generation=x.generation,
                          remaining_nfe=x.remaining_nfe, nfe_done=x.nfe_done,
                          deadline_ns=x.deadline_ns, dispatch_ns=x.dispatch_ns,
                          cancelled=bool(x.cancelled), prefix_pending=bool(x.prefix_pending))
                for x in buf[0:n]]

    def session_generation(self, session_id: bytes) -> int | None:
        gen = ffi.new("uint64_t *")
        found = _check(lib.fer_core_session_generation(self.ptr, session_id,
                                                       len(session_id), gen))
        return gen[0] if found else None


class Ring:
    """A standalone SPSC outcome ring (the core owns workers + 1 of these internally).

    Exactly one thread may push and one thread may pop at a time; the buffers here are per role.
    """

    def __init__(self, capacity: int, action_len: int):
        out = ffi.new("struct fer_ring **")
        _check(lib.fer_ring_create(capacity, action_len, out))
        self._ring = out[0]
        self.action_len = action_len
        self._push_rec = ffi.new("struct fer_outcome *")
        self._push_act, _ = _float_buffer(action_len)
        self._pop_rec = ffi.new("struct fer_outcome *")
        self._pop_act, self._pop_act_np = _float_buffer(action_len)

    @property
    def ptr(self):
        """The C ``struct fer_ring *`` (for the tools' fer_bench_ring_* drivers)."""
        return self._ring

    def close(self) -> None:
        ring, self._ring = getattr(self, "_ring", None), None
        if ring is not None:
            lib.fer_ring_destroy(ring)

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()

    @property
    def capacity(self) -> int:
        return lib.fer_ring_capacity(self._ring)

    def push(self, sequence: int, actions: np.ndarray | None = None, code: Code = Code.INFERENCE,
             session_id: bytes = b"") -> bool:
        """Producer: True if committed, False if the ring was full (the drop is counted)."""
        rec = self._push_rec
        rec.sequence = sequence
        rec.code = int(code)
        ffi.memmove(rec.session_id, session_id, len(session_id))
        rec.session_id_len = len(session_id)
        rec.has_actions = actions is not None
        if actions is not None and self.action_len:
            ffi.memmove(self._push_act, np.ascontiguousarray(actions, dtype=np.float32),
                        4 * self.action_len)
        rc = lib.fer_ring_push(self._ring, rec, self._push_act)
        if rc == lib.FER_EFULL:
            return False
        _check(rc)
        return True

    def pop(self) -> tuple[int, np.ndarray | None] | None:
        """Consumer: (sequence, actions or None) of the oldest record, or None if empty."""
        if not lib.fer_ring_pop(self._ring, self._pop_rec, self._pop_act):
            return None
        rec = self._pop_rec
        return rec.sequence, (self._pop_act_np.copy() if rec.has_actions else None)

    def wait(self, timeout_ns: int) -> bool:
        return bool(lib.fer_ring_wait(self._ring, timeout_ns))

    def count(self) -> int:
        return lib.fer_ring_count(self._ring)

    def free_slots(self) -> int:
        return lib.fer_ring_free_slots(self._ring)

    def dropped(self) -> int:
        return lib.fer_ring_dropped(self._ring)


# ---- initial noise -------------------------------------------------------------------------------


def noise_fill(seed: int, out: np.ndarray) -> np.ndarray:
    """Fill ``out`` as ``np.random.default_rng(seed).standard_normal(dtype=np.float32, out=out)``
    does, bit for bit, and return it.

    Why: a request's initial noise is exactly that numpy draw (docs/policy-packages.md), and
    numpy costs a Generator per request and the GIL; ``csrc/fer_noise.c`` draws the same floats
    in C (GIL released). ``out``: a C-contiguous, writable float32 array of any shape (filled in C
    order); ``seed``: 0 .. 2**64 - 1.
    """
    if not 0 <= seed < 2**64:
        raise InvalidArgument(lib.FER_EINVAL, f"noise seed {seed} is outside [0, 2**64)")
    if out.dtype != np.float32 or not out.flags.c_contiguous or not out.flags.writeable:
        raise InvalidArgument(lib.FER_EINVAL, "out must be a C-contiguous, writable float32 array")
    _check(lib.fer_noise_fill(seed, ffi.from_buffer("float[]", out, require_writable=True),
                              out.size))
    return out


# ---- relay pool (csrc/fer_pool.h, docs/design.md §13) -------------------------------------------


class PoolRole(enum.IntEnum):
    """What this member is for one request (fer_pool_role)."""

    OWNER = lib.FER_POOL_OWNER  # decide it
    SUCCESSOR = lib.FER_POOL_SUCCESSOR  # second in its ranking: keep it in standby
    OTHER = lib.FER_POOL_OTHER  # neither: drop it
    UNOWNED = lib.FER_POOL_UNOWNED  # no member of the view covers it: decide it here
    HELD = lib.FER_POOL_HELD  # its own after its own stall: held until answered or due
    STALE_SUCCESSOR = lib.FER_POOL_STALE_SUCCESSOR  # after its own stall: a copy, held on takeover


def pool_hash(data: bytes | str) -> int:
    """64-bit FNV-1a of `data` (a str is UTF-8 encoded): how a model digest enters the view."""
    raw = data.encode() if isinstance(data, str) else data
    return int(lib.fer_pool_hash(raw, len(raw)))


def pool_key(relay_id: str) -> int:
    """A member's key: the splitmix64 finaliser of the FNV-1a of its relay_id."""
    return int(lib.fer_pool_mix64(pool_hash(relay_id)))


#: each handover box's bytes (csrc/fer_pool.h: out and in, docs/design.md §13.5)
SPILL_BYTES = 4 << 20


@dataclass(frozen=True)
class PoolViewMember:
    """One live, active member as the membership layer knows it. Times are ROS ns (0 =
    unbounded): the member counts for a request iff owning_from_ns <= origin_stamp <
    owning_until_ns. digests: the model digests it serves (empty = every digest)."""

    key: int
    digests: tuple[str, ...] = ()
    owning_from_ns: int = 0
    owning_until_ns: int = 0
    #: its announced bound, for spill (docs/design.md §13.5); workers 0 = not a spill target
    workers: int = 0
    nfe_ns: int = 0
    admission_reserve_ns: int = 0
    queue_depth: int = 0
    relay_id: str = ""


@dataclass(frozen=True)
class PoolCounters:
    """struct fer_pool_counters: counters, and the gauges standby_*, pool_members, pool_epoch,
    owned_sessions (an estimate over FER_POOL_OWNED_SLOTS slots), key."""

    not_owner: int
    unowned: int
    standby_stored: int
    standby_answered: int
    standby_expired: int
    standby_evicted: int
    answers_seen: int
    answers_malformed: int
    answers_early: int
    takeovers: int
    taken_over_requests: int
    surrendered: int
    standby_bytes: int
    standby_bytes_capacity: int
    standby_entries: int
    standby_capacity: int
    pool_members: int
    pool_epoch: int
    owned_sessions: int
    key: int
    stalls_detected: int  # own stalls found by the stall check (any thread)
    surrender_before_ns: int  # gauge: the own-stall watermark, monotonic ns (0 = none)
    spilled_out: int = 0  # handed to the successor instead of answered (§13.5)
    spilled_in: int = 0  # handovers to this member, decided here
    spill_ignored: int = 0  # handovers naming another member
    spill_dropped: int = 0  # handovers not decided (malformed, or from before an own stall)
    spill_back: int = 0  # spilled requests answered here on the target's death
    spill_returned: int = 0  # handovers to this member given back (its in box was full)
    spill_taken_back: int = 0  # its own handovers given back by the target, decided here
    held: int = 0  # outcomes and requests held after an own stall, not dropped (§13.2)
    held_released: int = 0  # of those, due with nobody's answer: published or decided here
    hold_full: int = 0  # outcomes dropped (surrendered) with every hold slot in use
    held_requests_decided: int = 0  # of held_released, requests decided here (taken not_owner)


class Pool:
    """This relay's membership of a pool, in C (csrc/fer_pool.h): the view, the ownership of a
    request, the standby table of requests it is the successor for, and takeovers.

    One Pool lives as long as the node (it outlives a model swap's cores); the C intake
    (intake.NativeIntake(pool=...), intake.IntakeLoop.set_pool), the C publisher
    (publisher.ActionPublisher(pool=...)) and the rclpy intake (owner_is_self) use it.

    Any thread: set_view, set_epoch, add_surrendered, alive, stall_check, surrender, takeover,
    role, counters. owner_is_self
    counts, so it belongs to the thread that decides requests (the rclpy intake's).
    Errors are core.CoreError subclasses (InvalidArgument for a bad view, RingFull when
    FER_POOL_TAKEOVERS_MAX takeovers wait).
    """

    def __init__(self, relay_id: str, standby_entries: int = 4096,
                 standby_bytes: int = 16 << 20, lease_ns: int = 500_000_000,
                 spill_bytes: int = SPILL_BYTES) -> None:
        raw = relay_id.encode()
        if len(raw) > lib.FER_POOL_RELAY_ID_MAX:
            raise InvalidArgument(lib.FER_EINVAL, f"relay_id longer than "
                                  f"{lib.FER_POOL_RELAY_ID_MAX} bytes")
        cfg = ffi.new("struct fer_pool_config *")
        cfg.relay_id[0:len(raw)] = raw
        cfg.relay_id_len = len(raw)
        cfg.standby_entries = standby_entries
        cfg.standby_bytes = standby_bytes
        cfg.lease_ns = lease_ns
        cfg.spill_bytes = spill_bytes
        out = ffi.new("struct fer_pool **")
        _check(lib.fer_pool_create(cfg, out))
        self._pool = ffi.gc(out[0], lib.fer_pool_destroy)
        self.relay_id = relay_id
        self.key = pool_key(relay_id)
        self.lease_ns = lease_ns
        self._view = ffi.new("struct fer_pool_member[]", lib.FER_POOL_MEMBERS_MAX)
        self._counters = ffi.new("struct fer_pool_counters *")
        self._keys = ffi.new("uint64_t[2]")
        self.spill_bytes = spill_bytes
        self._spill_buf = None  # the sender thread's, made at its first spill_next

    @property
    def ptr(self):
        """The C struct fer_pool * (intake.py, publisher.py)."""
        return self._pool

    def set_view(self, members: list[PoolViewMember]) -> None:
        """The live, active members (this one included when it owns): every request from the
        next decision on is decided against them. InvalidArgument beyond FER_POOL_MEMBERS_MAX
        members, FER_POOL_DIGESTS_MAX digests each, or for a repeated key."""
        if len(members) > lib.FER_POOL_MEMBERS_MAX:
            raise InvalidArgument(lib.FER_EINVAL, f"{len(members)} members: the view holds "
                                  f"{lib.FER_POOL_MEMBERS_MAX}")
        for i, m in enumerate(members):
            if len(m.digests) > lib.FER_POOL_DIGESTS_MAX:
                raise InvalidArgument(lib.FER_EINVAL, f"member {m.key:#x} serves "
                                      f"{len(m.digests)} digests: at most "
                                      f"{lib.FER_POOL_DIGESTS_MAX} count")
            c = self._view[i]
            c.key = m.key
            c.owning_from_ns = m.owning_from_ns
            c.owning_until_ns = m.owning_until_ns
            c.n_digests = len(m.digests)
            for k, d in enumerate(m.digests):
                c.digests[k] = pool_hash(d)
            rid = m.relay_id.encode()[:lib.FER_POOL_RELAY_ID_MAX]
            c.relay_id[0:len(rid)] = rid
            c.relay_id_len = len(rid)
            c.workers, c.queue_depth = m.workers, m.queue_depth
            c.nfe_ns, c.admission_reserve_ns = m.nfe_ns, m.admission_reserve_ns
        _check(lib.fer_pool_set_view(self._pool, self._view, len(members)))

    def set_epoch(self, epoch: int) -> None:
        """The epoch answers carry (ActionMessage.pool_epoch) from the next one on."""
        _check(lib.fer_pool_set_epoch(self._pool, epoch))

    @property
    def epoch(self) -> int:
        """The epoch answers carry now."""
        return int(lib.fer_pool_epoch(self._pool))

    def add_surrendered(self, n: int) -> None:
        """Count n requests dropped after this member's own stall."""
        _check(lib.fer_pool_add_surrendered(self._pool, n))

    def alive(self, now_mono: int) -> None:
        """The membership announced at now_mono (the liveliness assertion the others check); the
        stall check runs first, so an announcement never hides a stall."""
        _check(lib.fer_pool_alive(self._pool, now_mono))

    def stall_check(self, now_mono: int) -> int:
        """Before acting on held work: silent for more than lease + FER_POOL_STALL_MARGIN_NS
        since the last announcement is this member's own stall (the others may have taken its
        work over), found once, and the watermark rises to now_mono. Returns the watermark
        (monotonic ns, 0 = none)."""
        return int(lib.fer_pool_stall_check(self._pool, now_mono))

    def surrender(self, now_mono: int) -> int:
        """Raise the watermark to now_mono: every output of a request that arrived before it is
        held (`hold`), and until its rejoin this member counts for no request
        stamped before 2 x lease from now. Returns the watermark."""
        _check(lib.fer_pool_surrender(self._pool, now_mono))
        return self.stall_check(now_mono)

    def hold(self, outcome: Outcome, mark: int) -> int:
        """Hold an outcome of a request that arrived before the watermark `mark` instead of
        dropping it (another member may not have taken it over: it may have stalled too): its
        slot (keep the outcome there until `held` frees it), or -1 when it is dropped, counted
        surrendered (an answer was seen already, or every slot is used)."""
        slot = ffi.new("int32_t *")
        rc = lib.fer_pool_hold(self._pool, outcome.session_id, len(outcome.session_id),
                               outcome.sequence, outcome.deadline_ros_ns, mark,
                               time.monotonic_ns(), slot)
        if rc == lib.FER_EINVAL:
            _check(rc)
        return int(slot[0]) if rc == lib.FER_POOL_HOLD_WAIT else -1

    def held(self, slot: int, now_mono: int) -> int:
        """A held slot's state: FER_POOL_HOLD_WAIT, _ANSWERED (drop it) or _DUE (publish it,
        EXPIRED if late); the last two free it."""
        return int(lib.fer_pool_held(self._pool, slot, now_mono))

    def holding(self) -> int:
        """Work held now (outcomes in hold slots and held standby entries; 0 = none): 0 once a
        stop ended every held item, as the pool's log at stop says."""
        return int(lib.fer_pool_holding(self._pool))

    def takeover(self, dead_key: int) -> None:
        """A member died (not drained): the intake thread re-decides every request this member
        kept as its successor, as arrivals (answered once: admitted, or EXPIRED / rejected).
        Set the view without that member first, so nothing is kept for it afterwards."""
        _check(lib.fer_pool_takeover(self._pool, dead_key))

    def role(self, session_id: bytes, digest: str, origin_ns: int) -> PoolRole:
        """This member's role for a request (session_id bytes, its model_digest, its
        origin_stamp in ROS ns, 0 = unset); counts nothing."""
        return PoolRole(_check(lib.fer_pool_role(self._pool, session_id, len(session_id),
                                                 pool_hash(digest), origin_ns, 0, ffi.NULL,
                                                 ffi.NULL)))

    def ranking(self, session_id: bytes, digest: str, origin_ns: int) -> tuple[int, int]:
        """(owner key, successor key) of a request; 0 = none."""
        _check(lib.fer_pool_role(self._pool, session_id, len(session_id), pool_hash(digest),
                                 origin_ns, 0, self._keys, self._keys + 1))
        return int(self._keys[0]), int(self._keys[1])

    def owner_is_self(self, session_id: bytes, digest: str, origin_ns: int) -> bool:
        """The rclpy intake's check, before validation: False (counted not_owner) when another
        member owns the request; True when this member owns it or no member covers it (counted
        unowned). The rclpy intake keeps no standby (it never has the CDR bytes)."""
        role = _check(lib.fer_pool_role(self._pool, session_id, len(session_id),
                                        pool_hash(digest), origin_ns, 1, ffi.NULL, ffi.NULL))
        return role in (lib.FER_POOL_OWNER, lib.FER_POOL_UNOWNED)

    # the deciding thread's calls (the C intake makes them itself; tests, the bench, the reference)

    def standby_put(self, cdr: bytes, owner_key: int, arrival_ns: int, deadline_ns: int,
                    now_ns: int) -> None:
        """Keep a request's CDR bytes as the successor of owner_key (deadline 0 = none)."""
        _check(lib.fer_pool_standby_put(self._pool, cdr, len(cdr), owner_key, arrival_ns,
                                        deadline_ns, now_ns))

    def answer(self, cdr: bytes) -> int:
        """One flowedge/actions message's CDR bytes: the standby entries it removed."""
        return _check(lib.fer_pool_answer(self._pool, cdr, len(cdr)))

    def expire(self, now_ns: int) -> int:
        """Drop the standby entries past deadline + lease (owner live) or + 4 x lease."""
        return _check(lib.fer_pool_expire(self._pool, now_ns))

    def standby(self) -> list[tuple[int, int, int]]:
        """The live standby entries, oldest first: (pool_hash(session_id), sequence, owner)."""
        n = lib.FER_POOL_STANDBY_SNAPSHOT_MAX
        a, b, c = (ffi.new("uint64_t[]", n) for _ in range(3))
        got = _check(lib.fer_pool_standby_snapshot(self._pool, a, b, c, n))
        return [(int(a[i]), int(b[i]), int(c[i])) for i in range(got)]

    # spill on capacity (docs/design.md §13.5)

    def set_spill(self, on: bool) -> None:
        """pool_spill: hand a would-be REJECTED_CAPACITY to the request's successor."""
        _check(lib.fer_pool_set_spill(self._pool, int(bool(on))))

    def spill_fits(self, target_key: int, remaining_nfe: int, deadline_ros: int, now_ros: int,
                   length: int) -> bool:
        """Whether a request may be handed to target_key now (its bound, the out box)."""
        return bool(lib.fer_pool_spill_fits(self._pool, target_key, remaining_nfe, deadline_ros,
                                            now_ros, length))

    def spill_next(self, timeout_ns: int) -> bytes | None:
        """The oldest handover's CDR bytes (msg/PoolSpill.msg) to publish, waiting up to
        timeout_ns (the GIL released); None on timeout."""
        if self._spill_buf is None:
            self._spill_buf = ffi.new("uint8_t[]", max(self.spill_bytes, 1))
        n = _check(lib.fer_pool_spill_next(self._pool, self._spill_buf, self.spill_bytes,
                                           timeout_ns))
        return bytes(ffi.buffer(self._spill_buf, n)) if n > 0 else None

    def spill_in(self, cdr: bytes, now_mono: int) -> int:
        """One handover taken from flowedge/pool/spill: 1 queued for the intake thread, 0 for
        another member, SPILL_GIVE_BACK for one to this member that its full in box cannot take
        (publish spill_give_back's bytes); RingFull for a give-back of this member's own
        handover while its in box is full (call again)."""
        return _check(lib.fer_pool_spill_in(self._pool, cdr, len(cdr), now_mono))

    def spill_give_back(self, cdr: bytes) -> bytes:
        """The give-back of a handover spill_in could not take: the same PoolSpill, addressed
        to the owner that made it, which answers the request itself (docs/design.md §13.5)."""
        cap = len(cdr) + lib.FER_POOL_RELAY_ID_MAX + 8
        buf = ffi.new("uint8_t[]", cap)
        n = _check(lib.fer_pool_spill_give_back(self._pool, cdr, len(cdr), buf, cap))
        return bytes(ffi.buffer(buf, n))

    def counters(self) -> PoolCounters:
        """A snapshot of the pool's counters and gauges."""
        c = self._counters
        _check(lib.fer_pool_counters(self._pool, c))
        return PoolCounters(**{f: int(getattr(c, f)) for f in PoolCounters.__dataclass_fields__})

    def close(self) -> None:
        """Free it; only after every intake, loop and publisher that used it is gone."""
        pool, self._pool = getattr(self, "_pool", None), None
        if pool is not None:
            ffi.release(pool)
