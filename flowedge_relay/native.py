# SPDX-License-Identifier: Apache-2.0
"""The native NFE loop (csrc/fer_exec.h): a worker's steps without the GIL.

Why: under overload the slowest NFEs were waiting for the GIL after ONNX Runtime returned (and in
the Python around the run) while the request thread, the publisher and the timers held it
(docs/performance.md, nfe-breakdown). `NativeLoop.run` is one C call, with the GIL released for
all of it, that runs the step graph through ONNX Runtime's C API, applies the solver update and
calls `fer_core_step` after every NFE, until the core says the work ends (done, stale, expired),
the stop flag is raised, or (ONE_STEP) after each step.

The prefix pass of a two-phase policy is native too (`PrefixPass`, csrc fer_pass: one ONNX
Runtime call over the joining rows, GIL released, its context outputs written straight into the
row buffers the step loop reads). `Serve` (csrc/fer_serve.h) runs a worker's whole request cycle
over the same rows: wait, join (the noise drawn in C, bit for bit numpy's default_rng; the time
grid of model.integrator_plan; the inputs), prefix pass, steps, answer, leave; the worker returns
to Python only to stop. `load` and `store` serve the samplers' own native use (bench, tests): a
request's row in from a FlowIntegrator (state, plan, static inputs) and its state back out.

ONNX Runtime's C library is the onnxruntime wheel's own `libonnxruntime.so.*` (`default_library`),
dlopen()ed by the C side; without it `NativeLoop` raises `NativeUnavailable` and the worker keeps
the Python loop. Same library version and session options as the Python sessions: the velocities,
and so the actions, are bit-identical (test/test_native.py).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from flowedge_relay import policy as _policy
from flowedge_relay import rtc
from flowedge_relay.core import Core, Step, check, ffi, lib
from flowedge_relay.model import INPUT_OBS, INPUT_T, INPUT_X, OUTPUT_V, FlowIntegrator, ModelInfo

__all__ = ["INPUT_OBS", "NativeError", "NativeLoop", "NativeUnavailable", "PrefixPass", "Report",
           "RowBuffers", "Serve", "StepSpec", "TensorSpec", "default_library", "step_spec"]
#: why fer_exec_run returned
ROWS_ENDED, STOPPED, YIELDED = lib.FER_EXEC_ROWS_ENDED, lib.FER_EXEC_STOPPED, lib.FER_EXEC_YIELDED
JOINABLE = lib.FER_EXEC_JOINABLE
#: why fer_serve_run returned besides STOPPED: an idle wait ended with nothing to do
IDLE = lib.FER_SERVE_IDLE
SOLVER_CODES = {"euler": lib.FER_SERVE_EULER, "midpoint": lib.FER_SERVE_MIDPOINT}
#: fer_exec_run flags: return after every step / at a boundary where a free row could join
ONE_STEP, JOIN = lib.FER_EXEC_ONE_STEP, lib.FER_EXEC_JOIN
_ORT_TYPES = {
    np.dtype(np.float32): lib.FER_EXEC_FLOAT, np.dtype(np.uint8): lib.FER_EXEC_UINT8,
    np.dtype(np.int8): lib.FER_EXEC_INT8, np.dtype(np.int32): lib.FER_EXEC_INT32,
    np.dtype(np.int64): lib.FER_EXEC_INT64, np.dtype(np.bool_): lib.FER_EXEC_BOOL,
    np.dtype(np.float64): lib.FER_EXEC_DOUBLE,
}  # fmt: skip
_ERRORS = {lib.FER_EXEC_ELIB: "ONNX Runtime library", lib.FER_EXEC_EORT: "ONNX Runtime"}


def _create(create, out_type: str, library: str, model, cfg, what: str):
    """fer_exec_create / fer_pass_create: the handle, or NativeUnavailable with ONNX Runtime's
    (or the status's) reason."""
    out = ffi.new(out_type)
    err = ffi.new("char[]", lib.FER_EXEC_ERROR_MAX)
    rc = create(library.encode(), model, len(model), cfg, out, err, lib.FER_EXEC_ERROR_MAX)
    if rc != 0:
        why = ffi.string(err).decode(errors="replace") or ffi.string(lib.fer_strerror(rc)).decode()
        raise NativeUnavailable(f"{what}: {why} (status {rc})")
    return out[0]


def _run_failed(rc: int, last_error, handle, what: str) -> None:
    """A negative status of a run on `handle` as NativeError: ONNX Runtime's message for
    FER_EXEC_EORT (`last_error(handle)`), else the status's own."""
    why = (ffi.string(last_error(handle)).decode(errors="replace") if rc == lib.FER_EXEC_EORT
           else ffi.string(lib.fer_strerror(rc)).decode())
    raise NativeError(f"{_ERRORS.get(rc, what)}: {why} (status {rc})")


class NativeUnavailable(RuntimeError):
    """The native loop cannot run here (library missing, unsupported model); use the Python loop."""


class NativeError(RuntimeError):
    """fer_exec_run failed (an ONNX Runtime error, or a row the core did not expect)."""


class ModelRunError(NativeError):
    """A model call inside fer_serve_run raised (ONNX Runtime's status): the serve already
    answered the rows of that call INFERENCE_FAILED and let them go; the worker counts it."""


def default_library() -> str:
    """The onnxruntime wheel's C library (it exports OrtGetApiBase), or "" if it has none."""
    try:
        import onnxruntime
    except ImportError:  # pragma: no cover - onnxruntime is a hard dependency
        return ""
    capi = Path(onnxruntime.__file__).resolve().parent / "capi"
    found = sorted(capi.glob("libonnxruntime.so*"), key=lambda p: len(p.name), reverse=True)
    return str(found[0]) if found else ""


@dataclass(frozen=True)
class TensorSpec:
    """One graph input or output, per row (the batch axis left out)."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class StepSpec:
    """What the graph run once per NFE takes and gives: x, t, the static inputs and v."""

    x: TensorSpec
    t: TensorSpec
    v_name: str
    statics: tuple[TensorSpec, ...]
    time: str = "0_to_1"  # the flow's time convention (real-time chunking's clean time)


def step_spec(model: ModelInfo | _policy.Policy) -> StepSpec:
    """The per-NFE graph of a single .onnx model or of a policy package (its step graph)."""
    f32 = np.dtype(np.float32)
    if isinstance(model, ModelInfo) or model.kind == "onnx":
        horizon = model.action_horizon
        dim = model.action_dim if isinstance(model, ModelInfo) else model.action.dim
        return StepSpec(TensorSpec(INPUT_X, f32, (horizon, dim)), TensorSpec(INPUT_T, f32, (1,)),
                        OUTPUT_V, (TensorSpec(INPUT_OBS, f32, (model.obs_dim,)),))  # fmt: skip
    a, declared = model.action, model.input
    context = {c.name: c for c in model.context}
    statics = []
    for name in model.step_graph.inputs:
        if name in (model.x_name, model.t_name):
            continue
        if name in declared:
            s = declared[name]
            statics.append(TensorSpec(name, np.dtype(s.model_dtype), tuple(s.shape)))
        else:
            c = context[name]
            statics.append(TensorSpec(name, np.dtype(c.dtype), tuple(c.shape[1:])))
    t_row = tuple(model.t_shape[1:])
    if int(np.prod(t_row, dtype=np.int64)) not in (1, a.horizon):
        raise NativeUnavailable(f"t shape {list(model.t_shape)}: one time per row or per "
                                "action row expected")  # fmt: skip
    return StepSpec(TensorSpec(model.x_name, f32, (a.horizon, a.dim)),
                    TensorSpec(model.t_name, f32, t_row), model.v_name, tuple(statics),
                    model.time)  # fmt: skip


#: rtc.RtcSpec.mode -> FER_EXEC_RTC_* (csrc/fer_exec.h)
RTC_CODES = {None: lib.FER_EXEC_RTC_OFF, "training_time": lib.FER_EXEC_RTC_TRAINING_TIME,
             "inpaint": lib.FER_EXEC_RTC_INPAINT}


def _ptr(ctype: str, arr: np.ndarray):
    return ffi.cast(ctype, arr.ctypes.data)


class Cede:
    """One worker's pacing (docs/design.md §5.3): before a step, once `every_ns` of compute have
    passed since it last paused (or last sat idle for `ns`), it sleeps `ns`. Both loops keep
    `state` = [start of the current stretch of compute, lane time ceded: ns x rows held]
    (uint64, csrc/fer_exec.h's cede_state), so a worker paces the same on either. The lanes are
    held while it pauses, so their busy time (utilisation, capacity under load) counts it."""

    def __init__(self, ns: int = 0, every_ns: int = 0) -> None:
        if ns < 0 or every_ns < 0 or (ns > 0 and every_ns == 0):
            raise ValueError(f"cede: {ns} ns every {every_ns} ns: both >= 0, every > 0 with a cede")
        self.ns, self.every_ns = int(ns), int(every_ns)
        self.state = np.zeros(2, np.uint64)

    @property
    def ceded_ns(self) -> int:
        """Lane time ceded so far: ns x rows held."""
        return int(self.state[1])

    def before_step(self, last_step_end_ns: int, rows: int) -> bool:
        """The Python loop's side of fer_exec.c's cede(): the same rule, in Python. True when
        it paused (the caller tells the core, as fer_exec.c does: Core.paused)."""
        if self.ns == 0:
            return False
        now = time.monotonic_ns()
        if self.state[0] == 0 or now - last_step_end_ns >= self.ns:
            self.state[0] = now
        if now - int(self.state[0]) < self.every_ns:
            return False
        time.sleep(self.ns * 1e-9)
        after = time.monotonic_ns()
        self.state[1] += np.uint64((after - now) * rows)
        self.state[0] = after
        return True


class Report:
    """Where one worker's native runs write what they measured (fer_exec_report).

    `nfe_ring` is the worker's step-duration ring (int64, any length; one entry per step, which
    at one row is one per NFE); `counters` holds [nfe_count, last_progress_ns, step_count] as
    uint64, written by C while the run goes on (atomic stores), read by the supervisor and the
    diagnostics. `step_rows` (int32, the ring's length, optional) gets each step's row count.
    `probe` (bench only) is a workers.NfeProbeHook (set_nfe_probe_factory). `cede` is the
    worker's Cede (docs/design.md §5.3), whose state the runs keep.
    """

    def __init__(self, nfe_ring: np.ndarray, counters: np.ndarray, probe=None,
                 step_rows: np.ndarray | None = None, cede: Cede | None = None) -> None:
        if nfe_ring.dtype != np.int64 or not nfe_ring.flags.c_contiguous or nfe_ring.size < 1:
            raise ValueError("nfe_ring: expected a contiguous int64 array")
        if counters.dtype != np.uint64 or counters.ndim != 1 or counters.size < 3:
            raise ValueError("counters: expected uint64[>= 3]")
        if step_rows is not None and (step_rows.dtype != np.int32 or step_rows.shape
                                      != nfe_ring.shape or not step_rows.flags.c_contiguous):
            raise ValueError("step_rows: expected a contiguous int32 array like nfe_ring")
        self._keep = (nfe_ring, counters, probe, step_rows, cede)
        r = self.c = ffi.new("struct fer_exec_report *")
        if cede is not None and cede.ns > 0:
            r.cede_ns, r.cede_every_ns = cede.ns, cede.every_ns
            r.cede_state = _ptr("uint64_t *", cede.state)
        r.nfe_ring = _ptr("int64_t *", nfe_ring)
        r.ring_len = nfe_ring.size
        r.nfe_count = _ptr("uint64_t *", counters)
        r.last_progress_ns = _ptr("uint64_t *", counters[1:])
        r.step_count = _ptr("uint64_t *", counters[2:])
        if step_rows is not None:
            r.step_rows = _ptr("int32_t *", step_rows)
        r.probe_fd = -1
        if probe is not None:
            r.probe = _ptr("int64_t *", probe.data)
            r.probe_rows = probe.rows
            r.probe_count = _ptr("uint64_t *", probe.counter)
            r.probe_fd = probe.fd


@dataclass(frozen=True)
class RowBuffers:
    """The [max_rows, ...] row buffers a native loop steps, owned by its caller (batch.BatchRows:
    one set of row buffers for both loops). Contiguous, row r of each at r x its row size."""

    x: np.ndarray  # float32 [max_rows, *x]: what the model sees
    t: np.ndarray  # float32 [max_rows, *t]
    v: np.ndarray  # float32 like x: the model's output
    state: np.ndarray  # float32 [max_rows, x size]: the ODE state
    statics: Mapping[str, np.ndarray]  # per step input besides x and t: [max_rows, *shape]

    @classmethod
    def zeros(cls, spec: StepSpec, max_rows: int) -> RowBuffers:
        x = np.zeros((max_rows, *spec.x.shape), np.float32)
        return cls(x, np.zeros((max_rows, *spec.t.shape), np.float32), np.zeros_like(x),
                   np.zeros((max_rows, x[0].size), np.float32),
                   {s.name: np.zeros((max_rows, *s.shape), s.dtype) for s in spec.statics})


class NativeLoop:
    """One worker's native step loop over up to `max_rows` rows (a C fer_exec over row buffers).

    `buffers` are the caller's (batch.BatchRows passes its own, so the rows it joins, compacts and
    reads are the rows C steps); without them the loop makes its own (`load` / `store` fill and
    read them from a sampler). `rows` is the C row table (struct fer_exec_row[max_rows]): the
    caller sets a row up before the run that steps it. `intra_op_affinities` pins the session's
    pool threads (realtime.intra_op_affinities; "" = they inherit the creating thread's CPUs).
    Not thread-safe: one per worker thread. `close()` frees it.
    """

    def __init__(
        self,
        model_bytes: bytes,
        spec: StepSpec,
        intra_op_threads: int = 1,
        max_rows: int = 1,
        library: str | None = None,
        buffers: RowBuffers | None = None,
        intra_op_affinities: str = "",
        rtc_mode: str | None = None,
    ) -> None:
        self.spec, self.max_rows = spec, max_rows
        self.library = default_library() if library is None else library
        if not self.library:
            raise NativeUnavailable("the onnxruntime package has no libonnxruntime.so")
        if spec.x.dtype != np.float32 or spec.t.dtype != np.float32:
            raise NativeUnavailable("x and t must be float32")
        b = RowBuffers.zeros(spec, max_rows) if buffers is None else buffers
        for name, arr in (("x", b.x), ("t", b.t), ("v", b.v), ("state", b.state),
                          *b.statics.items()):
            if not arr.flags.c_contiguous or arr.shape[0] != max_rows:
                raise ValueError(f"row buffer {name}: expected contiguous [{max_rows}, ...]")
        self.x, self.t, self.v, self.state = b.x, b.t, b.v, b.state
        self.statics = {s.name: b.statics[s.name] for s in spec.statics}
        cfg = ffi.new("struct fer_exec_config *")
        cfg.max_rows, cfg.intra_op_threads = max_rows, intra_op_threads
        cfg.n_static = len(spec.statics)
        if cfg.n_static > lib.FER_EXEC_MAX_STATIC:
            raise NativeUnavailable(f"{cfg.n_static} step inputs; at most "
                                    f"{lib.FER_EXEC_MAX_STATIC} besides x and t")  # fmt: skip
        self._tensor(cfg.x, spec.x, self.x)
        self._tensor(cfg.t, spec.t, self.t)
        self._tensor(cfg.v, TensorSpec(spec.v_name, spec.x.dtype, spec.x.shape), self.v)
        for i, s in enumerate(spec.statics):
            self._tensor(cfg.statics[i], s, self.statics[s.name])
        cfg.state = _ptr("float *", self.state)
        # real-time chunking (docs/design.md §5.4): how a row's frozen rows condition it
        cfg.rtc_mode = RTC_CODES[rtc_mode]
        cfg.action_dim = spec.x.shape[-1]
        cfg.clean_time = float(rtc.clean_time(spec.time))
        affinities = ffi.new("char[]", intra_op_affinities.encode())  # alive through create
        cfg.intra_op_affinities = affinities
        self._model = ffi.from_buffer(model_bytes)
        self._exec = _create(lib.fer_exec_create, "struct fer_exec **", self.library,
                             self._model, cfg, "native NFE loop")  # fmt: skip
        self.ort_version = ffi.string(lib.fer_exec_ort_version(self._exec)).decode()
        self.rows = ffi.new("struct fer_exec_row[]", max_rows)
        self._plans: dict[int, tuple[np.ndarray, object, np.ndarray, object]] = {}

    @staticmethod
    def _tensor(c, spec: TensorSpec, buf: np.ndarray) -> None:
        name = spec.name.encode()
        if len(name) >= lib.FER_EXEC_NAME_MAX or len(spec.shape) > lib.FER_EXEC_MAX_DIMS:
            raise NativeUnavailable(f"tensor {spec.name!r}: name or rank too large")
        dtype = _ORT_TYPES.get(np.dtype(spec.dtype))
        if dtype is None:
            raise NativeUnavailable(f"tensor {spec.name!r}: dtype {spec.dtype} not supported")
        ffi.memmove(c.name, name, len(name))
        c.dtype, c.ndim = dtype, len(spec.shape)
        for i, d in enumerate(spec.shape):
            c.dims[i] = d
        c.row_bytes = buf[0].nbytes
        c.data = ffi.cast("void *", buf.ctypes.data)

    def close(self) -> None:
        exec_, self._exec = getattr(self, "_exec", None), None
        if exec_ is not None:
            lib.fer_exec_destroy(exec_)

    def __del__(self) -> None:
        self.close()

    # ---- one request per row -------------------------------------------------------------------

    def _plan_ptrs(self, times: np.ndarray, kinds: np.ndarray):
        """C pointers to a cached plan's arrays (made once per plan, kept alive here)."""
        hit = self._plans.get(id(times))
        if hit is None or hit[0] is not times or hit[2] is not kinds:
            hit = (times, _ptr("float *", times), kinds, _ptr("int8_t *", kinds))
            self._plans[id(times)] = hit
        return hit[1], hit[3]

    def set_row(self, row: int, lane: int, total: int, dt: float, half_dt: float,
                times: np.ndarray, kinds: np.ndarray, done: int = 0) -> None:
        """Row `row` steps lane `lane`'s request from NFE `done` of its plan (times, kinds: the
        model.integrator_plan arrays, kept alive by the caller); its buffers are set already."""
        if times.dtype != np.float32 or kinds.dtype != np.int8 or not times.flags.c_contiguous:
            raise ValueError("integrator plan: expected contiguous float32 times, int8 kinds")
        r = self.rows[row]
        r.lane, r.next, r.total, r.result = lane, done, total, int(Step.CONTINUE)
        r.dt, r.half_dt = float(dt), float(half_dt)
        r.times, r.kinds = self._plan_ptrs(times, kinds)
        r.frozen = 0

    def set_frozen(self, row: int, frozen: int, prefix: np.ndarray, x0: np.ndarray,
                   land: np.ndarray) -> None:
        """Real-time chunking for row `row` (struct fer_exec_row): `frozen` rows held to `prefix`;
        `x0` and `land` (inpaint) its initial noise and landing times. Contiguous float32 arrays
        the caller keeps alive and in place while the row is stepped."""
        for arr in (prefix, x0, land):
            if arr.dtype != np.float32 or not arr.flags.c_contiguous:
                raise ValueError("real-time chunking rows: expected contiguous float32 arrays")
        r = self.rows[row]
        r.frozen = frozen
        r.prefix, r.x0, r.land = (_ptr("float *", a) for a in (prefix, x0, land))

    def move_row(self, dst: int, src: int) -> None:
        """Row src's table entry into row dst (the caller moves the buffers' rows likewise)."""
        ffi.memmove(ffi.addressof(self.rows, dst), ffi.addressof(self.rows, src),
                    ffi.sizeof("struct fer_exec_row"))

    def load(self, row: int, lane: int, integ: FlowIntegrator,
             statics: Mapping[str, np.ndarray]) -> None:
        """Row `row` runs lane `lane`'s request: the integrator's state (after its start()) and
        plan, and the request's static inputs (each reshaped to its per-row shape)."""
        s = integ.export_row()
        np.copyto(self.state[row], s.state)
        np.copyto(self.x[row].reshape(-1), s.x)
        for name, buf in self.statics.items():
            np.copyto(buf[row], statics[name].reshape(buf.shape[1:]), casting="same_kind")
        self.set_row(row, lane, s.total, s.dt, s.half_dt, s.times, s.kinds, s.next)

    def store(self, row: int, integ: FlowIntegrator) -> None:
        """The row's state back into the integrator (its actions() then reads the result)."""
        integ.import_row(replace(integ.export_row(), state=self.state[row],
                                 x=self.x[row].reshape(-1), next=self.rows[row].next))

    def result(self, row: int) -> Step:
        return Step(self.rows[row].result)

    def run(self, core: Core, n_rows: int, stop_flag, report: Report, fault_delay_ns=ffi.NULL,
            flags: int = 0) -> int:
        """Steps rows[0..n_rows) until one ends (ROWS_ENDED), *stop_flag (STOPPED), with
        ONE_STEP one step (YIELDED), with JOIN a boundary where a free row could take queued work
        (JOINABLE). The GIL is released for the whole call. `stop_flag` is a
        cdata uint32_t * (e.g. a `ffi.new("uint32_t[]", n)` element address), `fault_delay_ns`
        a cdata uint64_t * read before every step's sleep (drills), or NULL."""
        if self._exec is None:
            raise NativeError("native loop is closed")
        rc = lib.fer_exec_run(self._exec, core.ptr, self.rows, n_rows, stop_flag,
                              fault_delay_ns, flags, report.c)  # fmt: skip
        if rc < 0:
            _run_failed(rc, lib.fer_exec_last_error, self._exec, "fer_exec_run")
        return rc

    def time_runs(self, n_rows: int, runs: int) -> np.ndarray:
        """BENCH ONLY: `runs` back-to-back ONNX Runtime calls over the first n_rows rows as the
        buffers hold them (no solver update, no core), each one's wall ns: the model's own cost
        of a step of n_rows rows, with the GIL released (fer_exec_time_runs)."""
        if self._exec is None:
            raise NativeError("native loop is closed")
        ns = np.zeros(runs, np.uint64)
        rc = lib.fer_exec_time_runs(self._exec, n_rows, runs, _ptr("uint64_t *", ns))
        if rc < 0:
            _run_failed(rc, lib.fer_exec_last_error, self._exec, "fer_exec_time_runs")
        return ns


class PrefixPass:
    """A two-phase package's prefix graph over row buffers (a C fer_pass): `run(first, count)` is
    one ONNX Runtime call over rows [first, first + count) with the GIL released, reading the
    request tensors `inputs` and writing the context tensors `outputs` in place (the step loop's
    static inputs). Same library and session options as the Python session: bit-identical
    contexts. Not thread-safe: one per worker thread. `close()` frees it."""

    def __init__(
        self,
        model_bytes: bytes,
        inputs: Mapping[str, np.ndarray],
        outputs: Mapping[str, np.ndarray],
        intra_op_threads: int = 1,
        max_rows: int = 1,
        library: str | None = None,
        intra_op_affinities: str = "",
    ) -> None:
        self.max_rows = max_rows
        self.library = default_library() if library is None else library
        if not self.library:
            raise NativeUnavailable("the onnxruntime package has no libonnxruntime.so")
        if not 1 <= max_rows <= lib.FER_PASS_MAX_ROWS:
            raise NativeUnavailable(f"{max_rows} rows: the native prefix pass takes at most "
                                    f"{lib.FER_PASS_MAX_ROWS}")  # fmt: skip
        if not (1 <= len(inputs) <= lib.FER_PASS_MAX_TENSORS
                and 1 <= len(outputs) <= lib.FER_PASS_MAX_TENSORS):
            raise NativeUnavailable(f"prefix graph with {len(inputs)} inputs, {len(outputs)} "
                                    f"outputs: 1..{lib.FER_PASS_MAX_TENSORS} each")  # fmt: skip
        cfg = ffi.new("struct fer_pass_config *")
        cfg.max_rows, cfg.intra_op_threads = max_rows, intra_op_threads
        cfg.n_inputs, cfg.n_outputs = len(inputs), len(outputs)
        for group, tensors in ((cfg.inputs, inputs), (cfg.outputs, outputs)):
            for i, (name, buf) in enumerate(tensors.items()):
                if not buf.flags.c_contiguous or buf.shape[0] != max_rows:
                    raise ValueError(f"row buffer {name}: expected contiguous [{max_rows}, ...]")
                NativeLoop._tensor(group[i], TensorSpec(name, buf.dtype, buf.shape[1:]), buf)
        self._keep = (dict(inputs), dict(outputs))
        affinities = ffi.new("char[]", intra_op_affinities.encode())  # alive through create
        cfg.intra_op_affinities = affinities
        self._model = ffi.from_buffer(model_bytes)
        self._pass = _create(lib.fer_pass_create, "struct fer_pass **", self.library,
                             self._model, cfg, "native prefix pass")  # fmt: skip
        # run_done's arguments and results, made once (nothing allocated per boundary)
        self._lanes = np.zeros(max_rows, np.uint32)
        self._results = np.zeros(max_rows, np.int32)
        self._times = np.zeros(2, np.uint64)
        self._c_args = (ffi.from_buffer("uint32_t[]", self._lanes),
                        ffi.from_buffer("int32_t[]", self._results),
                        ffi.from_buffer("uint64_t[]", self._times))  # fmt: skip

    def run_done(self, core: Core, lanes: np.ndarray, first: int) -> tuple[int, int, np.ndarray]:
        """The joiners' boundary in one C call (GIL released once): the pass over rows
        [first, first + len(lanes)), timed in C around the ONNX Runtime run, then
        `Core.prefix_done(lane, end, end - start)` for each joiner's lane. Returns (end ns,
        pass ns, the joiners' Step results: a view valid until the next call)."""
        if self._pass is None:
            raise NativeError("native prefix pass is closed")
        count = len(lanes)
        self._lanes[:count] = lanes
        c_lanes, c_results, c_times = self._c_args
        rc = lib.fer_pass_run_done(self._pass, core.ptr, c_lanes, first, count, c_results,
                                   c_times)  # fmt: skip
        if rc < 0:
            _run_failed(rc, lib.fer_pass_last_error, self._pass, "fer_pass_run_done")
        results = self._results[:count]
        for r in results:  # a lane with no such work: the core's own error
            if r < 0:
                check(int(r))
        return int(self._times[0]), int(self._times[1]), results

    def run(self, first: int, count: int) -> None:
        """The prefix graph over rows [first, first + count): their outputs land in place."""
        if self._pass is None:
            raise NativeError("native prefix pass is closed")
        rc = lib.fer_pass_run(self._pass, first, count)
        if rc < 0:
            _run_failed(rc, lib.fer_pass_last_error, self._pass, "fer_pass_run")

    def close(self) -> None:
        pass_, self._pass = getattr(self, "_pass", None), None
        if pass_ is not None:
            lib.fer_pass_destroy(pass_)

    def __del__(self) -> None:
        self.close()


@dataclass(frozen=True)
class ServeRows:
    """What fer_serve must know of a worker's rows (batch.BatchRows.serve_rows builds it): the
    buffers a leave compacts, where a joiner's inputs come from, how the state becomes actions."""

    solver: str
    sign: int  # +1: t from 0 to 1; -1: from 1 to 0
    observation: np.ndarray | None  # float32 [max_rows, obs_dim]: dispatch writes straight here
    moves: tuple[np.ndarray, ...]  # [max_rows, ...] buffers (x, state, static inputs)
    copies: tuple[tuple[np.ndarray, int], ...]  # (row buffer, payload offset): payload -> row
    action_index: np.ndarray  # uint32 [action_len]: the state value of each action float
    action_offset: np.ndarray | None  # float32 [action_len]: de-normalization, or None
    action_scale: np.ndarray | None
    rtc_mode: str | None = None  # real-time chunking as served (the loop's), or None
    prefix_offset: int = 0  # where a request's prefix rows lie in its slot payload


class Serve:
    """One worker's whole request cycle in C (csrc/fer_serve.h): wait, join (noise, time grid,
    inputs), the two-phase prefix pass, the steps of `loop`, the answer and the leave, with the
    GIL released for the whole `run`. It returns only to stop, after an idle wait, or on an
    error, so a request never waits for the interpreter between its dispatch and its answer.

    `counters` is the worker's uint64 array [nfe_count, last_progress_ns, steps, rows_held,
    prefix_count] (the Report's first three), `prefix_ring` its int64 prefix-duration ring.
    Not thread-safe: one per worker thread, with its loop and pass. `close()` frees it.
    """

    def __init__(self, loop: NativeLoop, prefix: PrefixPass | None, rows: ServeRows, *,
                 worker: int, max_nfe: int, obs_dim: int, counters: np.ndarray,
                 prefix_ring: np.ndarray, output_wait_ns: int, wait_timeout_ns: int) -> None:
        if counters.dtype != np.uint64 or counters.shape != (5,):
            raise ValueError("counters: expected uint64[5]")
        if prefix_ring.dtype != np.int64 or not prefix_ring.flags.c_contiguous:
            raise ValueError("prefix_ring: expected a contiguous int64 array")
        n = loop.max_rows
        bufs = (*rows.moves, *(b for b, _ in rows.copies),
                *(() if rows.observation is None else (rows.observation,)))
        for buf in bufs:
            if not buf.flags.c_contiguous or buf.shape[0] != n:
                raise ValueError(f"row buffer: expected contiguous [{n}, ...]")
        if len(rows.moves) > lib.FER_SERVE_MAX_MOVES or len(rows.copies) > lib.FER_SERVE_MAX_COPIES:
            raise NativeUnavailable(f"{len(rows.moves)} row buffers, {len(rows.copies)} payload "
                                    "tensors: more than fer_serve takes")  # fmt: skip
        index = np.ascontiguousarray(rows.action_index, np.uint32)
        norm = [None if a is None else np.ascontiguousarray(a, np.float32)
                for a in (rows.action_offset, rows.action_scale)]  # fmt: skip
        c = self._cfg = ffi.new("struct fer_serve_config *")
        c.worker, c.max_rows, c.max_nfe = worker, n, max_nfe
        c.solver, c.sign = SOLVER_CODES[rows.solver], rows.sign
        c.x_len, c.obs_dim = loop.state.shape[1], obs_dim
        c.x, c.state = _ptr("float *", loop.x), _ptr("float *", loop.state)
        if rows.observation is not None:
            if rows.observation.dtype != np.float32 or rows.observation[0].size != obs_dim:
                raise ValueError(f"observation rows: expected float32 [{n}, {obs_dim}]")
            c.observation = _ptr("float *", rows.observation)
        c.n_moves, c.n_copies, c.n_actions = len(rows.moves), len(rows.copies), index.size
        for i, buf in enumerate(rows.moves):
            c.moves[i].data, c.moves[i].row_bytes = _ptr("void *", buf), buf[0].nbytes
        for i, (buf, offset) in enumerate(rows.copies):
            c.copies[i].to.data, c.copies[i].to.row_bytes = _ptr("void *", buf), buf[0].nbytes
            c.copies[i].payload_offset = offset
        c.action_index = _ptr("uint32_t *", index)
        if norm[0] is not None:
            c.action_offset, c.action_scale = _ptr("float *", norm[0]), _ptr("float *", norm[1])
        c.output_wait_ns, c.wait_timeout_ns = output_wait_ns, wait_timeout_ns
        c.rows_held = _ptr("uint64_t *", counters[3:])
        c.prefix_count = _ptr("uint64_t *", counters[4:])
        c.prefix_ring, c.prefix_ring_len = _ptr("int64_t *", prefix_ring), prefix_ring.size
        c.rtc_mode, c.prefix_offset = RTC_CODES[rows.rtc_mode], rows.prefix_offset
        c.clean_time = float(rtc.clean_time(loop.spec.time))
        self._keep = (loop, prefix, rows, index, norm, counters, prefix_ring)
        out = ffi.new("struct fer_serve **")
        check(lib.fer_serve_create(c, loop._exec, ffi.NULL if prefix is None else prefix._pass,
                                   loop.rows, out))  # fmt: skip
        self._serve = out[0]

    @property
    def rows(self) -> int:
        """Requests held now."""
        return int(lib.fer_serve_rows(self._serve)) if self._serve is not None else 0

    def run(self, core: Core, stop_flag, report: Report, fault_delay_ns=ffi.NULL) -> int:
        """Serve until `*stop_flag` (STOPPED) or an idle wait of wait_timeout_ns (IDLE); a model
        call that raised raises ModelRunError (ONNX Runtime's message; its rows were answered
        INFERENCE_FAILED), other errors the core's exception."""
        if self._serve is None:
            raise NativeError("serve is closed")
        rc = lib.fer_serve_run(self._serve, core.ptr, stop_flag, fault_delay_ns, report.c)
        if rc == lib.FER_EXEC_EORT:  # the step graph's or the prefix graph's run failed
            loop, prefix = self._keep[0], self._keep[1]
            why = [ffi.string(lib.fer_exec_last_error(loop._exec))]
            if prefix is not None:
                why.append(ffi.string(lib.fer_pass_last_error(prefix._pass)))
            text = "; ".join(w.decode(errors="replace") for w in why if w)
            raise ModelRunError(f"ONNX Runtime: {text} (status {rc})")
        return check(rc)

    def close(self) -> None:
        serve, self._serve = getattr(self, "_serve", None), None
        if serve is not None:
            lib.fer_serve_destroy(serve)

    def __del__(self) -> None:
        self.close()
