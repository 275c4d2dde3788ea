# SPDX-License-Identifier: Apache-2.0
"""The worker threads: each runs the policy one NFE at a time on work the C core dispatches.

Why dedicated threads and not executor callbacks: a worker blocks in ONNX Runtime for a whole NFE
and must check cancellation and the deadline between NFEs; the core (not this module) decides
those, so the loop here only asks after every NFE (`Core.step`) and stops when told.

Worker w owns the core's lanes [w*B, (w+1)*B) (B = `batch_slots`, docs/design.md §5.1; lane w
at B = 1), its own `InferenceSession`s (intra-op threads configurable, inter-op 1, on the
configured execution providers, created inside the thread after its real-time settings are
applied, so the sessions' pool threads inherit its class; each pool thread is pinned to a CPU
of its own where the worker is given them: realtime.ThreadRoles.pool_affinities) and is the
only producer of the core's ring w + 1.
One loop serves every B (`_loop_rows`): the requests it holds are rows of a batch.BatchRows (one
row at B = 1):

    worker_wait (nothing held) -> step boundary: dispatch_worker into free slots, the joiners'
    prefix passes (two-phase) -> steps over the rows -> rows that ended leave (DONE: wait for
    ring space, finish) -> next boundary

Where it can (`nfe_loop` auto, CPU provider only, the onnxruntime wheel's C library loadable),
the whole cycle runs in C: `_loop_serve` hands the rows to a native.Serve (csrc/fer_serve.h, over
the same buffers and native.NativeLoop), whose one call (GIL released) waits for work, joins it
into free rows (the noise drawn in C, bit for bit numpy's; the time grid; the inputs), runs the
joiners' prefix pass, the steps (each one batched model call, every row's solver update and
`Core.step`) and answers the rows that end, returning to Python only when the lane's flag is
raised (stop, an injected crash), after an idle wait, or on an error. So a request never waits
for the GIL between its dispatch and its answer. Otherwise `_loop_rows` does the same in Python,
one batched ONNX Runtime call per step. Each worker says which loop it runs
(`worker_info()["nfe_loop"]`, on the workers diagnostic), and why.

A single .onnx model's rows hold the dispatched observation. A policy package's rows are filled
from the dispatched slot's payload: the request thread normalized the request's tensors straight
into that slot (SlotInputs), and the join copies them into the row once. A two-phase package runs
its joiners' prefix graph at the boundary, as one call over their rows (native.PrefixPass inside
the serve; Python ONNX Runtime in the Python loop), and reports each with `Core.prefix_done`,
which may stop the work (stale, expired) before the first NFE.

Outcomes of stopped work (REJECTED_STALE, EXPIRED) are emitted by the core inside `step`; rows
leave independently, never disturbing the others.

Shutdown (`stop`): a flag, `Core.shutdown()` to wake waiters, join every thread. Work in flight
stops at its next NFE boundary; after its thread has exited the pool calls `disable_lane` for
each of its lanes, so the request gets an EXPIRED outcome (the node publishes it if it drains the
rings after `stop()`), instead of vanishing, and the last lane answers what is still queued
(EXPIRED too, the core being shut down). A crashed worker is handled the same way by
`poll_health`, once, after the thread is gone, so ring lane + 1 never has two producers.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from flowedge_relay import native as _native
from flowedge_relay import policy as _policy
from flowedge_relay.batch import BatchRows, RowSpec
from flowedge_relay.core import Core, FailCause, Step, ffi
from flowedge_relay.model import SOLVERS, ModelInfo
from flowedge_relay.realtime import ThreadRoles, ThreadSettings
from flowedge_relay.rtc import RtcSpec

NFE_HISTORY = 4096  # measured NFE durations kept per worker (a ring)
#: model calls that raise in a row, with no step that ran between them, before the worker gives
#: up as before a failure code existed: its thread exits, its lanes are removed (workers ERROR).
#: Fewer: each call's requests are answered INFERENCE_FAILED and the worker serves on.
RUNTIME_ERRORS_IN_A_ROW = 3
NFE_LOOPS = ("auto", "python")  # auto: native where it can run, else python
#: instants of one NFE in a probe row: before sampler.nfe(), around the ONNX Runtime run inside
#: it, after it (solver update done), after core.step
PROBE_POINTS = ("nfe_start", "run_start", "run_end", "nfe_end", "step_end")
PROBE_CLOCKS = ("monotonic_ns", "thread_cpu_ns", "runqueue_wait_ns")


class DrillOnly(RuntimeError):
    """A fault knob asked of a relay (or pool) not started for a drill."""


class NfeProbeHook(Protocol):
    """BENCH ONLY: what a worker does with a measurement probe (`set_nfe_probe_factory`;
    flowedge_relay_tools.bench.nfe_probe.NfeProbe is one). Per NFE the probe records the instants
    PROBE_POINTS on the clocks PROBE_CLOCKS into `data`, a ring the native loop writes too
    (csrc fer_exec: native.Report passes data, rows, counter and fd to C)."""

    data: np.ndarray  # int64 [rows, len(PROBE_POINTS), len(PROBE_CLOCKS)]
    rows: int
    counter: np.ndarray  # uint64 [1]: NFEs probed
    fd: int  # the worker thread's /proc/thread-self/schedstat once open(), else -1

    def open(self) -> None:
        """In the worker thread, before its first NFE."""

    def mark(self, point: int) -> None:
        """Instant PROBE_POINTS[point] of the current NFE (Python loop)."""

    def end(self) -> None:
        """The last instant of the current NFE; the next NFE starts a new row."""

    def wrap_session(self, session):
        """The Python loop's step session, marking the instants around each ONNX Runtime run."""

    def save(self) -> str:
        """When the worker exits: keep what was recorded; returns where (logged)."""


_probe_factory: Callable[[int], NfeProbeHook] | None = None


def set_nfe_probe_factory(factory: Callable[[int], NfeProbeHook] | None) -> None:
    """BENCH ONLY, the measurement hook: every WorkerPool made after this gives worker `lane` the
    probe `factory(lane)` (bench nfe-breakdown runs the relay through bench/nfe_probe.py, which
    sets it). None, the default: no probe, nothing allocated or read on the hot path."""
    global _probe_factory
    _probe_factory = factory


class SlotInputs:
    """A policy's input buffers laid over each core slot's payload, made once per slot.

    Why: the request thread writes a request's tensors into the staging slot's payload (one
    copy, normalized) and the worker that dispatches the slot reads them from the same memory
    (BatchRows.join copies them into the request's row once). The views and their OrtValues
    are built the first time a slot is seen and then reused, so a request allocates nothing
    here. `payload_view(slot)` is Core.payload_view (or any uint8 buffer per slot, for tests).
    A single .onnx file's observation is in the core's observation rows instead: its slots hold
    only a real-time chunking prefix (`prefix`), and it has no input buffers.
    """

    def __init__(
        self, policy: _policy.Policy, payload_view: Callable[[int], np.ndarray],
        rtc: RtcSpec | None = None,
    ) -> None:
        self.policy = policy
        #: real-time chunking as served: each payload then also holds a request's prefix rows
        self.rtc = rtc
        self.layout = _policy.payload_layout(policy, rtc=rtc is not None)
        self._payload_view = payload_view
        self._by_slot: dict[int, _policy.InputBuffers] = {}

    @property
    def payload_bytes(self) -> int:
        return self.layout.nbytes

    def __getitem__(self, slot: int) -> _policy.InputBuffers:
        buffers = self._by_slot.get(slot)
        if buffers is None:  # first use of this slot (the request thread, before its submit)
            if self.policy.kind == "onnx":
                raise ValueError("a single .onnx file's slots hold no input buffers")
            buffers = _policy.InputBuffers.over_payload(
                self.policy, self._payload_view(slot), self.layout
            )
            self._by_slot[slot] = buffers
        return buffers

    def prefix(self, slot: int) -> np.ndarray:
        """float32 [horizon x action_dim] view of `slot`'s prefix rows (real-time chunking on)."""
        off = self.layout.prefix_offset
        if off is None:
            raise ValueError("real-time chunking is off: the payload holds no prefix")
        a = self.policy.action
        return self._payload_view(slot)[off: off + 4 * a.horizon * a.output_dim].view(np.float32)

    def prepare(self, slots: Sequence[int] | range) -> None:
        """Build the views of these slots now instead of at their first request."""
        if self.policy.kind == "onnx":  # no input buffers: the prefix view is made per use
            return
        for slot in slots:
            self[slot]


class InjectedWorkerCrash(RuntimeError):
    """Raised inside a worker by `WorkerPool.inject_worker_crash` (drills and tests only)."""


@dataclass(frozen=True)
class PoolHealth:
    dead: list[int]  # lanes whose thread exited unexpectedly (each disabled in the core once)
    stalled: list[int]  # lanes holding work with no step for longer than stall_ns


class _Counter:
    """A _Worker attribute that is element `index` of its uint64 `counters`, read as an int."""

    def __init__(self, index: int, doc: str) -> None:
        self.index, self.__doc__ = index, doc

    def __get__(self, w, owner=None):
        return self if w is None else int(w.counters[self.index])

    def __set__(self, w, value: int) -> None:
        w.counters[self.index] = value


@dataclass
class _Worker:
    """One worker's state. Thread ownership (as csrc/fer_internal.h documents the core's):

    - written only by the worker thread itself: ready, nfe_ns / step_rows / steps (the
      measured-step ring), nfe_count, holding, slots_in_use, last_progress_ns, error, applied,
      nfe_loop; nfe_count, last_progress_ns and steps live in `counters` (uint64), which the
      native loop's C code stores to while it runs (atomic stores; a reader sees the old or the
      new value), as it writes nfe_ns and step_rows;
    - written only by the supervisor (the node's health timer, or stop() after the join):
      disabled, and thread (set once by start() before the thread runs);
    - written by tools and tests, read by the worker: crash_requested (a plain flag).
    Everyone else only reads. Each field is one Python object replaced whole under the GIL, so a
    reader sees a current or a slightly stale value, never a torn one; the decisions that need
    exactness (which request runs, its outcome) are made in the C core under its mutex. The one
    cross-thread rule that matters: disable_lane is called only after `thread` has exited, so
    ring lane + 1 keeps a single producer.
    """

    lane: int
    cpus: tuple[int, ...]  # the worker thread's CPU, then one per ONNX Runtime pool thread
    thread: threading.Thread | None = None
    ready: threading.Event = field(default_factory=threading.Event)
    nfe_ns: np.ndarray = field(default_factory=lambda: np.zeros(NFE_HISTORY, np.int64))
    # [nfe_count, last_progress_ns, steps, slots_in_use, prefix_count]: NFEs computed, the
    # dispatch or last step of the work it holds, steps measured (nfe_ns[i % NFE_HISTORY] is the
    # i-th step's duration, each of its step_rows[i % NFE_HISTORY] rows' NFE cost; at one row a
    # step is one NFE), rows held now, prefix passes measured (prefix_ns[i % NFE_HISTORY])
    counters: np.ndarray = field(default_factory=lambda: np.zeros(5, np.uint64))
    step_rows: np.ndarray = field(default_factory=lambda: np.zeros(NFE_HISTORY, np.int32))
    prefix_ns: np.ndarray = field(default_factory=lambda: np.zeros(NFE_HISTORY, np.int64))
    crash_requested: bool = False
    probe: NfeProbeHook | None = None  # bench only (set_nfe_probe_factory)
    error: BaseException | None = None
    disabled: bool = False  # lane disabled in the core (after the thread exited)
    applied: dict[str, object] = field(default_factory=dict)
    intra_op_affinities: str = ""  # its sessions' pool threads' CPUs (realtime.ThreadRoles)
    nfe_loop: str = ""  # "native" or "python" once the thread has its sessions
    nfe_loop_note: str = ""  # why python, when native was not possible
    cede: _native.Cede = field(default_factory=_native.Cede)  # its pacing (design.md §5.3)
    runtime_errors: int = 0  # model calls that raised since the last step that ran
    nfe_at_error: int = -1  # nfe_count when the last one raised (native: did a step run since?)

    # each an int view of one of `counters` (the native loop's C code stores to them too)
    nfe_count = _Counter(0, "NFEs computed")
    last_progress_ns = _Counter(1, "the dispatch or last step of the work it holds")
    steps = _Counter(2, "steps measured")
    slots_in_use = _Counter(3, "rows held now (dispatched requests that have not ended)")
    prefix_count = _Counter(4, "prefix passes measured (two-phase packages)")

    @property
    def holding(self) -> bool:
        return self.slots_in_use > 0

    # `lane` is the worker's index; its lanes are Core.worker_lanes(lane) (one per batch slot)
    report: _native.Report | None = None  # where the native loop writes the ring and counters
    serve: _native.Serve | None = None  # the request cycle in C (native loop), else None


def p50_p99(values: np.ndarray) -> tuple[float, float]:
    """np.percentile(values, [50, 99]) (its default linear method, the same floats) from one
    np.partition: the stats timer computes several of these ten times a second, holding the
    GIL, and np.percentile's own Python took most of that (a request or an outcome that
    arrived then waited for it)."""
    n = values.size
    if n == 0:
        return 0.0, 0.0
    spots = []
    for q in (0.5, 0.99):
        at = q * (n - 1)
        lo = int(math.floor(at))
        spots.append((lo, min(lo + 1, n - 1), at - lo))
    part = np.partition(values, sorted({i for lo, hi, _ in spots for i in (lo, hi)}))
    out = []
    for lo, hi, t in spots:  # numpy's _lerp: from the nearer end
        a, b = float(part[lo]), float(part[hi])
        out.append(b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t)
    return out[0], out[1]


def _percentiles(parts: list[np.ndarray]) -> tuple[float, float, int]:
    """(p50, p99, samples) over the concatenated rings; zeros when nothing was measured."""
    window = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    p50, p99 = p50_p99(window)
    return p50, p99, int(window.size)


class WorkerPool:
    """W worker threads for one core and one model. Start it, stop it (or use `with`)."""

    def __init__(
        self,
        core: Core,
        model: ModelInfo | _policy.Policy,
        workers: int = 1,
        *,
        intra_op_threads: int = 1,
        solver: str = "euler",
        execution_providers: Sequence[str] = _policy.DEFAULT_PROVIDERS,
        slot_inputs: SlotInputs | None = None,
        cpu_affinity: Sequence[int] = (),
        rt_priority: int = 0,
        output_wait_ns: int = 5_000_000,
        stall_ns: int = 2_000_000_000,
        wait_timeout_ns: int = 100_000_000,
        fault_nfe_delay_ns: int = 0,
        drill: bool = False,
        cede_ns: int = 0,
        cede_every_ns: int = 0,
        nfe_loop: str = "auto",
        ort_library: str | None = None,
        logger=None,
        thread_roles: ThreadRoles | None = None,
    ):
        if workers < 1 or workers != core.workers:
            raise ValueError(f"workers={workers} must be >= 1 and match the core ({core.workers})")
        #: B requests per worker (docs/design.md §5.1), the core's batch_slots
        self.batch_slots = core.batch_slots
        if solver not in SOLVERS:
            raise ValueError(f"unknown solver {solver!r}; choose one of {SOLVERS}")
        if nfe_loop not in NFE_LOOPS:
            raise ValueError(f"unknown nfe_loop {nfe_loop!r}; choose one of {NFE_LOOPS}")
        #: "auto": each worker runs its NFEs in C (native.NativeLoop) where it can; "python": never
        self.nfe_loop = nfe_loop
        #: ONNX Runtime's C library for the native loop; None = the onnxruntime wheel's
        self.ort_library = ort_library
        if model.obs_dim != core.obs_dim or model.action_len != core.action_len:
            raise ValueError("model dims do not match the core's obs_dim / action_len")
        #: a policy package (named tensors in the slot payloads); None: a single .onnx file
        self.policy = model if isinstance(model, _policy.Policy) and model.kind != "onnx" else None
        if self.policy is not None and slot_inputs is None:
            raise ValueError("a policy package needs slot_inputs (the payload views per slot)")
        #: the payload views per slot: a package's inputs and prefix, a single file's prefix
        self.slot_inputs = slot_inputs
        #: real-time chunking as served (docs/design.md §5.4), or None
        self.rtc = slot_inputs.rtc if slot_inputs is not None else None
        self.execution_providers = tuple(execution_providers)
        self.core, self.model, self.solver = core, model, solver
        self.intra_op_threads, self.rt_priority = intra_op_threads, rt_priority
        self.output_wait_ns, self.stall_ns = output_wait_ns, stall_ns
        self.wait_timeout_ns = wait_timeout_ns
        #: started for a drill: the fault knobs work (fault_nfe_delay_ns, inject_worker_crash)
        self.drill = drill
        # DRILLS ONLY (fault_nfe_delay_ns): in C memory so the native loop reads it; NULL, which
        # the loop skips, in a pool not started for a drill
        self._fault = ffi.new("uint64_t[]", 1) if drill else ffi.NULL
        if fault_nfe_delay_ns:
            self.fault_nfe_delay_ns = int(fault_nfe_delay_ns)
        self.log = logger or logging.getLogger("flowedge_relay.workers")
        #: where each worker applies and records its real-time settings (role "worker<lane>")
        self.thread_roles = thread_roles if thread_roles is not None else ThreadRoles()
        # worker w and its k - 1 ONNX Runtime pool threads take entries w*k .. w*k+k-1 (mod n)
        cpus, k = list(cpu_affinity or ()), intra_op_threads
        self._workers = [
            _Worker(lane, tuple(cpus[(lane * k + j) % len(cpus)] for j in range(k))
                    if cpus else (), cede=_native.Cede(cede_ns, cede_every_ns))
            for lane in range(workers)
        ]
        if _probe_factory is not None:  # bench only (set_nfe_probe_factory)
            for w in self._workers:
                w.probe = _probe_factory(w.lane)
        self._stop = threading.Event()
        # One C flag per lane: raised by stop() and inject_worker_crash(); the native loop checks
        # its lane's before every NFE (it cannot see the Event), then Python finds out which.
        self._flags = ffi.new("uint32_t[]", workers)
        self._started = False

    def _drill_only(self, what: str) -> None:
        if not self.drill:
            raise DrillOnly(f"{what} exists only in a pool started for a drill (drill=True)")

    @property
    def fault_nfe_delay_ns(self) -> int:
        """DRILLS ONLY: a fixed extra sleep inside every NFE (counted in its duration); both
        loops read it before every NFE's sleep, so a change applies mid-request. 0 outside a
        drill."""
        return int(self._fault[0]) if self.drill else 0

    @fault_nfe_delay_ns.setter
    def fault_nfe_delay_ns(self, value: int) -> None:
        self._drill_only("fault_nfe_delay_ns")
        self._fault[0] = max(int(value), 0)

    # ---- lifetime --------------------------------------------------------------------------------

    def start(self, ready_timeout_s: float = 30.0) -> None:
        """Start every thread and wait until each has its session (or has failed)."""
        if self._started:
            raise RuntimeError("WorkerPool already started")
        self._started = True
        for w in self._workers:
            w.thread = threading.Thread(
                target=self._thread_main, args=(w,), name=f"flowedge-worker-{w.lane}", daemon=True
            )
            w.thread.start()
        for w in self._workers:
            w.ready.wait(ready_timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop and join every worker; in-flight and queued work gets EXPIRED via disable_lane.
        Idempotent."""
        self._stop.set()
        for lane in range(len(self._workers)):
            self._flags[lane] = 1
        self.core.shutdown()
        for w in self._workers:
            if w.thread is not None:
                w.thread.join(timeout_s)
                if w.thread.is_alive():
                    self.log.error(f"worker {w.lane} did not stop within {timeout_s} s")
        # every lane leaves, the idle ones too: held work is EXPIRED, and the last lane answers
        # what is still queued (EXPIRED after the core's shutdown): nothing admitted goes unanswered
        now = time.monotonic_ns()
        for w in self._workers:
            if w.thread is not None and not w.thread.is_alive():
                self._disable(w, now)

    def __enter__(self) -> WorkerPool:
        if not self._started:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- supervision (node timer) ----------------------------------------------------------------

    def poll_health(self, now: int) -> PoolHealth:
        """Disable (once) the lanes of exited threads; report dead and stalled lanes."""
        dead, stalled = [], []
        for w in self._workers:
            if w.thread is None:
                continue
            if not w.thread.is_alive():
                if self._stop.is_set() and w.error is None:
                    continue  # a clean stop, not a death
                if not w.disabled:
                    self._disable(w, now)
                dead.append(w.lane)
            elif w.holding and now - w.last_progress_ns > self.stall_ns:
                stalled.append(w.lane)
        return PoolHealth(dead=dead, stalled=stalled)

    def _disable(self, w: _Worker, now: int) -> None:
        if w.disabled:
            return
        w.disabled = True
        for lane in self.core.worker_lanes(w.lane):  # one lane per batch slot
            try:
                self.core.disable_lane(lane, now)
            except Exception as exc:  # a closed core during teardown: nothing left to tell
                self.log.error(f"disable_lane({lane}) failed: {exc}")
                return

    def prefix_percentiles(self, last: int | None = None) -> tuple[float, float, int]:
        """(p50_ns, p99_ns, samples) over the recent measured prefix passes of all workers (what
        admission prices as prefix_ns); with `last`, over each worker's `last` newest only."""
        rings = []
        for w in self._workers:
            count = w.prefix_count
            k = min(count, NFE_HISTORY, NFE_HISTORY if last is None else last)
            rings.append(w.prefix_ns[np.arange(count - k, count) % NFE_HISTORY])
        return _percentiles(rings)

    def prefix_count(self) -> int:
        """Prefix passes measured so far, all workers together."""
        return sum(w.prefix_count for w in self._workers)

    def nfe_percentiles(self) -> tuple[float, float, int]:
        """(p50_ns, p99_ns, samples) over the recent measured NFE durations of all workers."""
        return _percentiles([w.nfe_ns[: min(self._measured(w), NFE_HISTORY)]
                             for w in self._workers])

    def _measured(self, w: _Worker) -> int:
        """Entries written to w.nfe_ns: one per step (each row of a step cost its duration; at
        B = 1 a step is one NFE)."""
        return w.steps

    def inflight_ns(self, now: int) -> int:
        """Time the running NFEs have taken so far: the core counts an NFE's time only when it
        ends, so utilisation over a window shorter than one NFE needs this part too."""
        total = 0
        for w in self._workers:
            if w.holding and not w.disabled:  # every held row's lane is busy
                total += max(now - w.last_progress_ns, 0) * max(w.slots_in_use, 1)
        return total

    def ceded_ns(self) -> int:
        """Lane time the workers have ceded (docs/design.md §5.3): held, so busy."""
        return sum(w.cede.ceded_ns for w in self._workers)

    @property
    def nfe_count(self) -> int:
        return sum(w.nfe_count for w in self._workers)

    def batch_stats(self) -> dict[str, object]:
        """Batch slots (§5.1): slots in use per worker, mean rows per step over the recent steps,
        and the step cost (p50, p99 ns, samples) by row count over them. At B = 1 every step has
        one row."""
        in_use = [w.slots_in_use for w in self._workers]
        cost, rows = [], []
        for w in self._workers:
            k = min(self._measured(w), NFE_HISTORY)
            cost.append(w.nfe_ns[:k])
            rows.append(w.step_rows[:k])
        cost_all = np.concatenate(cost) if cost else np.zeros(0, np.int64)
        rows_all = np.concatenate(rows) if rows else np.zeros(0, np.int32)
        by_rows = {}
        counts = np.unique(rows_all)
        for r in counts:  # one row count (always at B = 1): the whole window, no mask
            p50, p99, n = _percentiles([cost_all if counts.size == 1 else cost_all[rows_all == r]])
            by_rows[int(r)] = (p50, p99, n)
        return {
            "batch_slots": self.batch_slots,
            "slots_in_use": in_use,
            "mean_rows_per_step": float(rows_all.mean()) if rows_all.size else 0.0,
            "step_ns_by_rows": by_rows,
        }

    def worker_info(self) -> list[dict[str, object]]:
        """Per worker: lane, alive, what scheduling was applied, NFE count, error."""
        return [
            {
                "lane": w.lane,
                "alive": bool(w.thread and w.thread.is_alive()),
                "applied": dict(w.applied),
                "nfe_count": w.nfe_count,
                "nfe_loop": w.nfe_loop,
                "nfe_loop_note": w.nfe_loop_note,
                "ceded_ns": w.cede.ceded_ns,
                "error": repr(w.error) if w.error else None,
            }
            for w in self._workers
        ]

    def thread_cpu_ns(self) -> list[int]:
        """CPU time each worker thread has used (0 for one not running): overhead accounting."""
        out = []
        for w in self._workers:
            try:
                clock = time.pthread_getcpuclockid(w.thread.ident)  # type: ignore[union-attr]
                out.append(time.clock_gettime_ns(clock))
            except (AttributeError, OSError, TypeError):
                out.append(0)
        return out

    def inject_worker_crash(self, lane: int) -> None:
        """DRILLS ONLY: worker `lane` raises at its next step boundary."""
        self._drill_only("inject_worker_crash")
        self._workers[lane].crash_requested = True
        self._flags[lane] = 1

    # ---- the worker thread -----------------------------------------------------------------

    def _thread_main(self, w: _Worker) -> None:
        try:
            role = self.thread_roles.apply(
                f"worker{w.lane}", ThreadSettings(w.cpus[:1], self.rt_priority), self.log.warning
            )
            w.applied = role.outcome()
            # after its own settings: the pool threads its sessions start inherit the class
            w.intra_op_affinities = self.thread_roles.pool_affinities(
                role, w.cpus[1:], self.log.warning)
            if w.probe is not None:
                w.probe.open()
            rows = self._make_rows(w)
            w.ready.set()
            self._loop_rows(w, rows)
        except BaseException as exc:  # the supervisor sees the dead thread and disables the lane
            w.error = exc
            if not isinstance(exc, InjectedWorkerCrash):
                self.log.error(f"worker {w.lane} died: {exc!r}")
        finally:
            w.ready.set()
            if w.probe is not None:
                self.log.info(f"NFE breakdown of worker {w.lane}: {w.probe.save()}")

    def _make_native(self, w: _Worker, rows: BatchRows) -> None:
        """Attach this worker's native loop to its rows, or say in w.nfe_loop_note why not."""
        w.nfe_loop = "python"
        if self.nfe_loop == "python":
            w.nfe_loop_note = "nfe_loop: python"
            return
        if self.execution_providers != _policy.DEFAULT_PROVIDERS:
            w.nfe_loop_note = (f"execution_providers {list(self.execution_providers)}: the "
                               "native loop runs CPUExecutionProvider only")  # fmt: skip
            return
        m = self.policy or self.model
        if self.policy is not None:
            data = self.policy.step_graph.data
        else:
            data = m.model_bytes if isinstance(m, ModelInfo) else m.graphs["velocity"].data
        try:
            nat = _native.NativeLoop(data, _native.step_spec(m), self.intra_op_threads,
                                     rows.slots, self.ort_library, rows.row_buffers(),
                                     w.intra_op_affinities,
                                     self.rtc.mode if self.rtc else None)  # fmt: skip
        except _native.NativeUnavailable as exc:
            w.nfe_loop_note = str(exc)
            self.log.warning(f"worker {w.lane}: {exc}; its NFE loop runs in Python")
            return
        prefix = None
        if self.policy is not None and self.policy.two_phase:
            try:
                prefix = _native.PrefixPass(
                    self.policy.graphs["prefix"].data, rows.prefix_in, rows.context,
                    self.intra_op_threads, rows.slots, self.ort_library,
                    w.intra_op_affinities)  # fmt: skip
            except _native.NativeUnavailable as exc:
                w.nfe_loop_note = f"native prefix pass: {exc}"
                self.log.warning(f"worker {w.lane}: {exc}; its NFE loop runs in Python")
                nat.close()
                return
        rows.attach(nat)
        if prefix is not None:
            rows.attach_prefix(prefix)
        w.report = _native.Report(w.nfe_ns, w.counters, w.probe, w.step_rows, w.cede)
        w.nfe_loop = "native"

    def _make_rows(self, w: _Worker) -> BatchRows:
        """This worker's sessions and batch rows (B of them), stepped natively where possible,
        warmed up at every row count (first runs, and each binding, are slow)."""
        m = self.policy if self.policy is not None else self.model
        if self.policy is None:
            info = m if isinstance(m, ModelInfo) else _model_info(m)
            sessions = {"velocity": _policy.make_session(
                info.model_bytes, self.intra_op_threads, self.execution_providers,
                f"{info.path}:velocity", w.intra_op_affinities)}  # fmt: skip
            spec = RowSpec.of(info, self.solver, self.rtc)
            warm = np.zeros(info.obs_dim, np.float32)
        else:
            sessions = _policy.make_sessions(
                self.policy, self.intra_op_threads, self.execution_providers,
                w.intra_op_affinities)  # fmt: skip
            spec = RowSpec.of(self.policy, self.policy.solver, self.rtc)
            warm = _policy.InputBuffers(self.policy)
        rows = BatchRows(spec, sessions, self.batch_slots, self.core.config.max_nfe)
        self._make_native(w, rows)
        lanes = self.core.worker_lanes(w.lane)  # nothing runs on them: only row set-up
        for k in range(1, self.batch_slots + 1):
            for i in range(k):
                rows.join(lanes[i], -1, 0, 1, warm)
            rows.prefix(0, k)
            if rows.native is None:  # the native loop ran its first runs when it was made
                rows.run()
            while rows.n:
                rows.leave(rows.n - 1)
        if rows.native is not None:  # from now on C serves the rows: Python never steps them
            layout = self.slot_inputs.layout if self.slot_inputs is not None else None
            w.serve = _native.Serve(
                rows.native, rows.native_prefix, rows.serve_rows(layout),
                worker=w.lane, max_nfe=self.core.config.max_nfe, obs_dim=self.core.obs_dim,
                counters=w.counters, prefix_ring=w.prefix_ns, output_wait_ns=self.output_wait_ns,
                wait_timeout_ns=self.wait_timeout_ns)  # fmt: skip
        elif w.probe is not None:  # the native loop probes in C
            rows.step_session = w.probe.wrap_session(rows.step_session)
        return rows

    def _loop_serve(self, w: _Worker) -> None:
        """The native worker loop: fer_serve_run (GIL released) serves requests until the lane's
        flag is up (stop() or an injected crash: the loop finds out which) or an idle wait ends,
        so Python runs only between requests when there is nothing to do."""
        serve, flag, stop = w.serve, self._flags + w.lane, self._stop
        while not stop.is_set():
            if w.crash_requested:
                raise InjectedWorkerCrash(f"worker {w.lane}: injected crash")
            try:
                serve.run(self.core, flag, w.report, self._fault)  # type: ignore[union-attr]
            except _native.ModelRunError as exc:  # its rows are answered INFERENCE_FAILED
                if w.nfe_count != w.nfe_at_error:
                    w.runtime_errors = 0  # a step ran since the last one
                self._runtime_error(w, exc)
        # stop: rows still held are left on their lanes; stop() disables them after the join

    def _loop_rows(self, w: _Worker, rows: BatchRows) -> None:
        """The Python worker loop: fill free slots at each step boundary, step the held rows."""
        if w.serve is not None:
            return self._loop_serve(w)
        core, index, stop = self.core, w.lane, self._stop
        while not stop.is_set():
            if w.crash_requested:
                raise InjectedWorkerCrash(f"worker {index}: injected crash")
            if rows.n == 0 and (
                not core.worker_wait(index, self.wait_timeout_ns) or stop.is_set()
            ):
                continue
            self._join_rows(w, rows)
            if rows.n == 0:
                w.slots_in_use = 0
                continue
            self._step_python(w, rows)
            w.slots_in_use = rows.n
        # stop: rows still held are left on their lanes; stop() disables them after the join

    def _join_rows(self, w: _Worker, rows: BatchRows) -> None:
        """A step boundary: free slots take queued work in EDF order at once; the joiners of a
        two-phase package run their prefix passes as one batched call (it pays: bare ONNX
        Runtime, policy_vision prefix, 4 rows in one call 17 us against 4 x 13 us one by one),
        their context rows then being step inputs, and the core decides per joiner whether its
        steps run."""
        core, package, slots = self.core, self.policy is not None, self.slot_inputs
        first = rows.n
        if rows.n < rows.slots and core.queued() > 0:
            now = time.monotonic_ns()
            while rows.n < rows.slots:
                work = core.dispatch_worker(w.lane, now)
                if work is None:
                    break
                rows.join(work.lane, work.slot, work.noise_seed, work.remaining_nfe,
                          slots[work.slot] if package else work.observation, work.frozen_rows,
                          slots.prefix(work.slot) if work.frozen_rows else None)
                w.last_progress_ns, w.slots_in_use = now, rows.n
        if rows.n == first or not (package and self.policy.two_phase):
            return
        try:
            t1, pass_ns, results = rows.prefix_done(core, first, rows.n - first)
        except Exception as exc:  # the joiners' prefix pass raised: they fail, the rest go on
            self._fail_rows(w, rows, first, exc)
            return
        w.prefix_ns[w.prefix_count % NFE_HISTORY] = pass_ns
        w.prefix_count += 1
        w.last_progress_ns = t1
        for r in range(rows.n - 1, first - 1, -1):  # descending: a leave moves a visited row
            if results[r - first] != Step.CONTINUE:
                rows.leave(r)  # stale or expired: the core emitted its outcome
        w.slots_in_use = rows.n

    def _step_python(self, w: _Worker, rows: BatchRows) -> None:
        """The fallback (nfe_loop python, other providers): one step, i.e. one batched model
        call with each row's solver update, then Core.step per row (the step's cost is each
        row's NFE cost: every slot advanced one NFE in it)."""
        core, n, probe = self.core, rows.n, w.probe
        if w.cede.before_step(w.last_progress_ns, n):
            core.paused(int(rows.lane[0]), w.cede.ns)  # priced apart from the step (§5.3)
        t0 = time.monotonic_ns()
        if probe is not None:
            probe.mark(0)
        try:
            rows.run()
        except Exception as exc:  # the step's model call raised: every row of it fails
            self._fail_rows(w, rows, 0, exc)
            return
        w.runtime_errors = 0
        if probe is not None:
            probe.mark(3)
        if self.fault_nfe_delay_ns:
            time.sleep(self.fault_nfe_delay_ns * 1e-9)
        t1 = time.monotonic_ns()
        cost = t1 - t0
        k = w.steps % NFE_HISTORY
        w.nfe_ns[k], w.step_rows[k] = cost, n
        w.steps += 1
        w.nfe_count += n
        for r in range(n - 1, -1, -1):  # descending: a leave moves a visited row
            self._settle(rows, r, core.step(int(rows.lane[r]), t1, cost))
        if probe is not None:
            probe.end()
        w.last_progress_ns = t1

    def _settle(self, rows: BatchRows, r: int, result: Step) -> None:
        """After row r's step: DONE finishes it, STOP_STALE / STOP_EXPIRED (the core emitted
        the outcome) drop it; either way the row leaves."""
        if result == Step.DONE:
            self._finish_lane(int(rows.lane[r]), rows.actions(r))
            rows.leave(r)
        elif result != Step.CONTINUE:
            rows.leave(r)

    def _fail_rows(self, w: _Worker, rows: BatchRows, first: int, exc: Exception) -> None:
        """Rows [first, n) were in a model call that raised: each is answered INFERENCE_FAILED
        (runtime_error) and leaves; then the worker counts the error."""
        now = time.monotonic_ns()
        for r in range(rows.n - 1, first - 1, -1):
            self.core.fail(int(rows.lane[r]), now, FailCause.RUNTIME_ERROR)
            rows.leave(r)
        w.slots_in_use = rows.n
        self._runtime_error(w, exc)

    def _runtime_error(self, w: _Worker, exc: Exception) -> None:
        """One more model call that raised: logged; RUNTIME_ERRORS_IN_A_ROW of them with no step
        between end the worker as an unexpected exception always did (the supervisor removes its
        lanes and reports it dead)."""
        w.runtime_errors += 1
        w.nfe_at_error = w.nfe_count
        self.log.error(f"worker {w.lane}: model call raised ({w.runtime_errors} in a row): "
                       f"{exc!r}; its requests are answered INFERENCE_FAILED")
        if w.runtime_errors >= RUNTIME_ERRORS_IN_A_ROW:
            raise RuntimeError(f"worker {w.lane}: {w.runtime_errors} model calls raised in a "
                               f"row; last: {exc!r}") from exc

    def _finish_lane(self, lane: int, actions: np.ndarray) -> None:
        """Wait a bounded time for ring space, then hand the actions to the core; actions that
        are not finite are never an answer: INFERENCE_FAILED (non_finite) instead."""
        core = self.core
        give_up = time.monotonic_ns() + self.output_wait_ns
        while not core.output_space(lane) and time.monotonic_ns() < give_up:
            time.sleep(50e-6)
        if not np.isfinite(actions).all():
            core.fail(lane, time.monotonic_ns(), FailCause.NON_FINITE)
        else:
            core.finish(lane, time.monotonic_ns(), actions)  # full ring: counted drop


def _model_info(p: _policy.Policy) -> ModelInfo:
    """model.ModelInfo of a single-file policy description (FlowSampler's argument)."""
    return ModelInfo(
        p.path, p.digest, p.obs_dim, p.action_horizon, p.action.dim,
        p.graphs["velocity"].data,
    )
