# SPDX-License-Identifier: Apache-2.0
"""Batch slots (docs/design.md §5.1): up to B requests of one worker integrated in lock step.

Why: one ONNX Runtime call over B rows costs far less than B calls of one row (for the bundled
policy_small about 37 us at 8 rows against 20 us at 1), so a worker that holds several requests
and advances each by one NFE per batched call computes several times more NFE per second. Only
the model call is batched: each row's solver update is exactly FlowIntegrator's arithmetic (the
same float32 products and sums, elementwise), so a row's result differs from the batch-1 result
only by what the model's own kernels do with more rows (float reassociation inside the graph;
BATCH_RTOL / BATCH_ATOL are the documented tolerance, test/test_batch.py checks it over random
batch compositions, joins and leaves). With one row held it is bit-identical.

Rows are compact: the requests a worker holds are rows 0..n-1 of every buffer, in join order
until a leave moves the last row into the freed one (`leave`, one copy per leave, never per NFE).
Every buffer is a contiguous numpy array [B, ...] in row order, so the batched call binds the
first n rows as they are (an IOBinding per row count, made at its first use and reused). The same
buffers are the native loop's (`attach`, native.NativeLoop over `row_buffers()`): there is one
set of row buffers, which `join` fills and `leave` compacts (with the native row table) whichever
loop steps them. A joining request's inputs are copied into its row once, at join (`join`);
nothing static is copied per NFE.

Per row the time grid, update multipliers and update kinds of its total NFE are laid out in
[B, max_nfe] tables at join, so a step gathers each row's t with one np.take (and, for the
midpoint solver, its dt or dt/2 and update kind with one more each; Euler's dt is fixed per row).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from flowedge_relay import native as _native
from flowedge_relay import policy as _policy
from flowedge_relay import rtc as _rtc
from flowedge_relay.core import Core, Step
from flowedge_relay.model import KIND_MID_HALF, ModelInfo, half_step, integrator_plan
from flowedge_relay.rtc import RtcSpec

#: Tolerance of a row's actions against the batch-1 result (|a - b| <= ATOL + RTOL |b|): the
#: batched model call may sum in another order (GEMM blocking by row count). Measured on the
#: bundled models at up to 64 NFE: differences of a few float32 ulps of the actions' scale.
BATCH_RTOL = 1e-4
BATCH_ATOL = 1e-5


@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]  # without batch
    dtype: np.dtype


@dataclass(frozen=True)
class RowSpec:
    """What a row holds for one model: the flow tensors' names and shapes, the request inputs
    the step graph reads per row, the prefix's inputs and outputs (two-phase), the actions."""

    horizon: int
    dim: int
    output_dim: int
    action_norm: _policy.Normalization | None
    x_name: str
    t_name: str
    v_name: str
    t_shape: tuple[int, ...]  # without batch
    step_inputs: tuple[_Tensor, ...]
    prefix_inputs: tuple[_Tensor, ...]
    context: tuple[_Tensor, ...]
    sign: np.float32
    solver: str
    #: real-time chunking as served (serving.rtc_of: the mode resolved from rtc_mode), or None
    rtc: RtcSpec | None = None
    time: str = "0_to_1"

    @classmethod
    def of(cls, model: ModelInfo | _policy.Policy, solver: str,
           rtc: RtcSpec | None = None) -> RowSpec:
        """Single .onnx (ModelInfo): x, t, observation, time 0_to_1; a package: its manifest."""
        if isinstance(model, ModelInfo):
            obs = _Tensor("observation", (model.obs_dim,), np.dtype(np.float32))
            return cls(model.action_horizon, model.action_dim, model.action_dim, None,
                       "x", "t", "velocity", (1,), (obs,), (), (), np.float32(1.0), solver, rtc)
        p = model
        specs = p.input
        tensor = {name: _Tensor(name, s.shape, s.model_dtype) for name, s in specs.items()}
        step_in = tuple(tensor[n] for n in p.step_graph.inputs if n in specs)
        prefix_in = tuple(tensor[n] for n in p.graphs["prefix"].inputs) if p.two_phase else ()
        context = tuple(_Tensor(c.name, tuple(c.shape[1:]), np.dtype(c.dtype)) for c in p.context)
        a = p.action
        return cls(a.horizon, a.dim, a.output_dim, a.normalization, p.x_name, p.t_name,
                   p.v_name, tuple(p.t_shape[1:]), step_in, prefix_in, context,
                   np.float32(1.0 if p.time == "0_to_1" else -1.0), p.solver, rtc, p.time)


class BatchRows:
    """Up to `slots` requests in rows 0..n-1, advanced together by `run()`.

    Not thread-safe: one per worker thread. The worker loop (workers.WorkerPool._step_rows)
    either runs the attached native loop over the rows (`native`, which steps and tells the core
    in C) or calls run() once per step and then tells the core about each row; then it lets rows
    leave. A BatchRows is stepped by one of the two for its whole life.
    """

    def __init__(
        self,
        spec: RowSpec,
        sessions: Mapping[str, ort.InferenceSession],
        slots: int,
        max_nfe: int,
    ) -> None:
        if slots < 1:
            raise ValueError("slots must be >= 1")
        self.spec, self.slots, self.max_nfe = spec, slots, max_nfe
        b, hd = slots, spec.horizon * spec.dim
        #: the step graph's session (run once per step; a bench probe may wrap it, workers.py)
        self.step_session = sessions.get("step") or sessions.get("velocity")
        self._prefix_sess = sessions.get("prefix")
        # flow state, one row per held request
        self.x_in = np.zeros((b, spec.horizon, spec.dim), np.float32)  # what the model sees
        self.state = np.zeros((b, hd), np.float32)  # x of the ODE (midpoint keeps it)
        self.v = np.zeros((b, spec.horizon, spec.dim), np.float32)
        self._x_flat, self._v_flat = self.x_in.reshape(b, hd), self.v.reshape(b, hd)
        self._tmp = np.zeros((b, hd), np.float32)
        self.t = np.zeros((b, *spec.t_shape), np.float32)
        # t is one value per row, or (a graph trained for training-time RTC, §5.4) one per
        # action row: the solver's time is then broadcast over them before every NFE
        self._t_rows = int(np.prod(spec.t_shape)) != 1
        if self._t_rows and spec.t_shape != (spec.horizon,):
            raise ValueError(f"t must hold one value per row or per action row, not "
                             f"{spec.t_shape}")
        self._t_flat = np.zeros(b, np.float32) if self._t_rows else self.t.reshape(b)
        # real-time chunking, per row: d frozen rows, the prefix (answer space = model space:
        # the loader refuses action normalization and padding), x(0) for inpaint
        self._rtc = _RowsRtc(spec, b, max_nfe) if spec.rtc is not None else None
        self.inputs = {s.name: np.zeros((b, *s.shape), s.dtype) for s in spec.step_inputs}
        self.prefix_in = {s.name: np.zeros((b, *s.shape), s.dtype) for s in spec.prefix_inputs}
        self.context = {c.name: np.zeros((b, *c.shape), c.dtype) for c in spec.context}
        # per-row solver plan tables and progress
        self._grid_t = np.zeros((b, max_nfe), np.float32)
        self._grid_mult = np.zeros((b, max_nfe), np.float32)  # dt, or dt/2 for a midpoint half
        self._grid_full = np.zeros((b, max_nfe), np.bool_)  # the update moves the state
        self._gt, self._gm = self._grid_t.reshape(-1), self._grid_mult.reshape(-1)
        self._gf = self._grid_full.reshape(-1)
        self._idx = np.zeros(b, np.intp)  # row * max_nfe + next
        self._mult = np.zeros((b, 1), np.float32)  # euler: the row's dt, set at join
        self._full = np.zeros((b, 1), np.bool_)
        self._euler = spec.solver == "euler"
        self._row_views: dict[int, tuple] = {}
        self.total = np.zeros(b, np.int64)
        self.lane = np.full(b, -1, np.int64)  # the core lane each row runs on
        self.slot = np.full(b, -1, np.int64)  # the core slot (payload) each row came from
        self.n = 0
        #: per total NFE: times, multipliers, full-update mask (Python), kinds, dt, dt/2 (native)
        self._plans: dict[int, tuple] = {}
        self.native: _native.NativeLoop | None = None
        self.native_prefix: _native.PrefixPass | None = None  # attach_prefix
        self._step_bindings: dict[int, tuple[ort.IOBinding, list]] = {}
        self._prefix_bindings: dict[tuple[int, int], tuple[ort.IOBinding, list]] = {}
        self._out = np.zeros((spec.horizon, spec.output_dim), np.float32)
        self._out_flat = self._out.reshape(-1)

    # ---- joining and leaving (step boundaries) ------------------------------------------------

    def _plan(self, total: int) -> tuple:
        plan = self._plans.get(total)
        if plan is None:
            times, kinds, dt = integrator_plan(self.spec.solver, self.spec.sign, total)
            half = kinds == KIND_MID_HALF
            mult = np.where(half, half_step(dt), dt).astype(np.float32)
            plan = self._plans[total] = (times, mult, ~half, kinds, dt, half_step(dt))
        return plan

    def row_buffers(self) -> _native.RowBuffers:
        """The rows as a native loop steps them: x, t, v, state, and the step graph's other
        inputs (the request inputs and, two-phase, the prefix's context)."""
        return _native.RowBuffers(self.x_in, self.t, self.v, self.state,
                                  {**self.inputs, **self.context})

    def attach(self, native: _native.NativeLoop) -> None:
        """Step these rows natively from now on: `native` runs over row_buffers() (same arrays)
        with max_rows = slots; no row may be held yet."""
        if native.max_rows != self.slots or native.x is not self.x_in or self.n:
            raise ValueError("attach a native loop made over row_buffers(), before any join")
        self.native = native

    def serve_rows(self, layout: _policy.PayloadLayout | None) -> _native.ServeRows:
        """These rows as fer_serve fills and compacts them (native.Serve: the whole request
        cycle in C, the same bytes as join / leave / actions here): the observation rows of a
        single .onnx model (a layout without tensors, or None), or where each of a package's
        request tensors lies in a slot's payload (`layout`, SlotInputs'); where a prefix lies
        (real-time chunking); the actions' state indices and de-normalization. After a Serve
        takes the rows, n, lane and slot here stay as they were (0 rows): the serve holds the
        truth."""
        s = self.spec
        if layout is None or not layout.offsets:  # a single .onnx file: dispatch writes the row
            observation, copies = self.inputs["observation"], ()
        else:
            observation, copies = None, []
            for name, rows in (*self.inputs.items(), *self.prefix_in.items()):
                if layout.sizes[name] != rows[0].nbytes:
                    raise ValueError(f"payload tensor {name!r}: {layout.sizes[name]} bytes, "
                                     f"a row holds {rows[0].nbytes}")  # fmt: skip
                copies.append((rows, layout.offsets[name]))
        h, d, od = s.horizon, s.dim, s.output_dim
        index = (np.arange(h)[:, None] * d + np.arange(od)[None, :]).reshape(-1)
        offset = scale = None
        if s.action_norm is not None:
            offset = np.broadcast_to(s.action_norm.offset, (h, od)).reshape(-1)
            scale = np.broadcast_to(s.action_norm.scale, (h, od)).reshape(-1)
        moves = (self.x_in, self.state, *self.inputs.values(), *self.context.values())
        rtc = s.rtc.mode if s.rtc is not None else None
        if rtc is not None and (layout is None or layout.prefix_offset is None):
            raise ValueError("real-time chunking rows need a payload layout with the prefix")
        return _native.ServeRows(s.solver, 1 if s.sign > 0 else -1, observation, moves,
                                 tuple(copies), index, offset, scale, rtc,
                                 layout.prefix_offset if rtc else 0)  # fmt: skip

    def attach_prefix(self, prefix: _native.PrefixPass) -> None:
        """Run the prefix graph natively from now on: `prefix` is a native.PrefixPass over
        `prefix_in` (inputs) and `context` (outputs), these very arrays, with max_rows = slots."""
        if prefix.max_rows != self.slots or self._prefix_sess is None:
            raise ValueError("attach a prefix pass over prefix_in and context, max_rows = slots")
        self.native_prefix = prefix

    def join(self, lane: int, slot: int, noise_seed: int, total_nfe: int,
             inputs: np.ndarray | _policy.InputBuffers, frozen_rows: int = 0,
             prefix: np.ndarray | None = None) -> int:
        """Take a request into row n: its x(0) from the seed, its time grid, its inputs (an
        observation for a single .onnx, a slot's InputBuffers for a package) copied once, and
        with real-time chunking its frozen rows and their prefix (float32, >= d x dim)."""
        if self.n >= self.slots:
            raise RuntimeError("every batch slot is taken")
        if not 1 <= total_nfe <= self.max_nfe:
            raise ValueError(f"total_nfe {total_nfe} not in 1..{self.max_nfe}")
        r = self.n
        times, mult, full, kinds, dt, half_dt = self._plan(total_nfe)
        self._grid_t[r, :total_nfe] = times
        self._grid_mult[r, :total_nfe] = mult
        self._grid_full[r, :total_nfe] = full
        self.total[r] = total_nfe
        self._idx[r] = r * self.max_nfe
        self._mult[r, 0] = mult[0]  # euler: dt for every NFE (midpoint re-reads it per step)
        np.random.default_rng(noise_seed).standard_normal(dtype=np.float32, out=self.state[r])
        np.copyto(self._x_flat[r], self.state[r])
        if self._rtc is not None:
            self._rtc.join(r, frozen_rows, prefix, self.state[r], times)
        elif frozen_rows:
            raise ValueError("frozen rows on rows without real-time chunking")
        if isinstance(inputs, _policy.InputBuffers):
            for name, rows in self.inputs.items():
                np.copyto(rows[r], inputs.arrays[name][0])
            for name, rows in self.prefix_in.items():
                np.copyto(rows[r], inputs.arrays[name][0])
        else:
            np.copyto(self.inputs["observation"][r], inputs, casting="same_kind")
        self.lane[r], self.slot[r] = lane, slot
        if self.native is not None:
            self.native.set_row(r, lane, total_nfe, dt, half_dt, times, kinds)
            if frozen_rows:
                self._rtc.point(self.native, r)  # type: ignore[union-attr]
        self.n += 1
        return r

    def leave(self, r: int) -> None:
        """Row r leaves (done, stale, expired): the last row moves into it, so rows stay
        0..n-1. The other rows' values are untouched (only their position may change)."""
        last = self.n - 1
        if not 0 <= r <= last:
            raise IndexError(f"row {r} not held (n = {self.n})")
        if r != last:
            done = self._idx[last] - last * self.max_nfe  # NFEs the moving row has computed
            for arr in (self.x_in, self.state, self._grid_t, self._grid_mult, self._grid_full,
                        self.total, self.lane, self.slot, self._mult,
                        *self.inputs.values(), *self.context.values()):
                arr[r] = arr[last]
            if self._rtc is not None:
                self._rtc.move(r, last)
            if self.native is not None:
                self.native.move_row(r, last)
                if self._rtc is not None and self._rtc.d[r]:
                    self._rtc.point(self.native, r)  # the moved row's own buffers
            self._idx[r] = r * self.max_nfe + done
        self.lane[last] = self.slot[last] = -1
        self.n = last

    # ---- compute ----------------------------------------------------------------------------

    def _bind(self, sess: ort.InferenceSession, inputs: dict[str, np.ndarray],
              outputs: dict[str, np.ndarray]) -> tuple[ort.IOBinding, list]:
        binding, keep = sess.io_binding(), []
        for name, arr in inputs.items():
            value = ort.OrtValue.ortvalue_from_numpy(arr)
            binding.bind_ortvalue_input(name, value)
            keep.append(value)
        for name, arr in outputs.items():
            value = ort.OrtValue.ortvalue_from_numpy(arr)
            binding.bind_ortvalue_output(name, value)
            keep.append(value)
        return binding, keep

    def _step_binding(self, n: int) -> ort.IOBinding:
        made = self._step_bindings.get(n)
        if made is None:
            s = self.spec
            ins = {s.x_name: self.x_in[:n], s.t_name: self.t[:n]}
            ins.update({name: rows[:n] for name, rows in self.inputs.items()})
            ins.update({name: rows[:n] for name, rows in self.context.items()})
            made = self._step_bindings[n] = self._bind(self.step_session, ins,
                                                       {s.v_name: self.v[:n]})
        return made[0]

    def prefix(self, first: int, count: int) -> None:
        """The prefix graph over rows [first, first + count) (the requests that just joined),
        in one call: its outputs land in those rows' context, bound for every later step. Native
        (one C call, GIL released) once a PrefixPass is attached, else Python ONNX Runtime."""
        if self._prefix_sess is None or count <= 0:
            return
        if self.native_prefix is not None:
            self.native_prefix.run(first, count)
            return
        key = (first, count)
        made = self._prefix_bindings.get(key)
        if made is None:
            end = first + count
            made = self._prefix_bindings[key] = self._bind(
                self._prefix_sess,
                {name: rows[first:end] for name, rows in self.prefix_in.items()},
                {name: rows[first:end] for name, rows in self.context.items()},
            )
        self._prefix_sess.run_with_iobinding(made[0])

    def prefix_done(self, core: Core, first: int, count: int) -> tuple[int, int, list]:
        """The joiners' boundary: the prefix pass over rows [first, first + count), then
        `Core.prefix_done` for each of their lanes with the pass's time. Returns (end ns, pass
        ns, the joiners' Step results in row order). Native: one C call (GIL released once, the
        pass timed in C around the run); else the Python pass, timed around it."""
        if self.native_prefix is not None:
            return self.native_prefix.run_done(core, self.lane[first:first + count], first)
        t0 = time.monotonic_ns()
        self.prefix(first, count)
        t1 = time.monotonic_ns()
        return t1, t1 - t0, [core.prefix_done(int(lane), t1, t1 - t0)
                             for lane in self.lane[first:first + count]]  # fmt: skip

    def _views(self, n: int) -> tuple:
        """The first n rows of every per-step buffer, sliced once per row count."""
        views = self._row_views.get(n)
        if views is None:
            views = self._row_views[n] = (
                self._idx[:n], self._t_flat[:n], self._v_flat[:n], self._tmp[:n],
                self.state[:n], self._x_flat[:n], self._mult[:n], self._full[:n],
                self._step_binding(n),
            )
        return views

    def run(self) -> None:
        """One NFE for every held row: one batched model call, then each row's solver update
        (FlowIntegrator._advance's arithmetic, elementwise over the rows)."""
        n = self.n
        if n == 0:
            return
        idx, t, v, tmp, state, x, mult, full, binding = self._views(n)
        np.take(self._gt, idx, out=t)
        if self._t_rows:
            np.copyto(self.t[:n], t[:, None])
        rtc = self._rtc
        if rtc is not None:
            rtc.before_nfe(n, t, state, x, self.t)
        self.step_session.run_with_iobinding(binding)
        if self._euler:  # every update moves the state by the row's dt: Euler's three ops
            np.multiply(v, mult, out=tmp)
            np.add(state, tmp, out=state)
            np.copyto(x, state)
        else:  # midpoint: per row dt or dt/2, and whether the state moves
            np.take(self._gm, idx, out=mult[:, 0])
            np.take(self._gf, idx, out=full[:, 0])
            np.multiply(v, mult, out=tmp)
            np.add(state, tmp, out=x)  # full: the new state; half: the midpoint input
            np.copyto(state, x, where=full)
        if rtc is not None:
            rtc.after_nfe(n, idx, state, x)
        idx += 1

    def result(self, r: int) -> Step:
        """Row r's last core step result in the native loop (CONTINUE before its first)."""
        return self.native.result(r)  # type: ignore[union-attr]

    def remaining(self, r: int) -> int:
        if self.native is not None:
            row = self.native.rows[r]
            return int(row.total - row.next)
        return int(self.total[r] - (self._idx[r] - r * self.max_nfe))

    def actions(self, r: int) -> np.ndarray:
        """Row r's actions, float32 [horizon * output_dim] (a view: copy it to keep it); the
        same arithmetic as FlowSampler.actions / PolicySampler.actions."""
        s = self.spec
        if self._rtc is not None:  # the frozen rows become the prefix, bit for bit
            self._rtc.hold(r, self.state[r])
        if s.action_norm is None and s.output_dim == s.dim:
            return self.state[r]
        cols = self.state[r].reshape(s.horizon, s.dim)[:, : s.output_dim]
        if s.action_norm is not None:
            s.action_norm.invert(cols, self._out)
        else:
            np.copyto(self._out, cols)
        return self._out_flat


class _RowsRtc:
    """Real-time chunking's conditioning of BatchRows' rows (docs/design.md §5.4), with rtc.py's
    arithmetic row by row, as the evaluation (flowedge_relay_tools/rtc_rollout.py) applies it:
      training_time  before every NFE the frozen rows of the state (the model's x) are the
                     prefix, and the per-row time is clean on them, the solver's elsewhere;
      inpaint        after every update the frozen rows are the flow interpolation, at the time
                     the update landed at, between the row's x(0) and its prefix;
    and the answer's frozen rows are the prefix, bit for bit (`hold`). Rows with d = 0 run the
    unconditioned solver. Only rows with d > 0 are touched, one numpy call or two each."""

    def __init__(self, spec: RowSpec, b: int, max_nfe: int) -> None:
        assert spec.rtc is not None
        self.mode, self.time, self.dim = spec.rtc.mode, spec.time, spec.dim
        hd = spec.horizon * spec.dim
        self.d = np.zeros(b, np.int64)
        self.prefix = np.zeros((b, hd), np.float32)
        self.x0 = np.zeros((b, hd), np.float32)
        self.land = np.zeros((b, max_nfe), np.float32)  # inpaint: where NFE j's update lands
        self._tmp = np.zeros(hd, np.float32)
        self._max_nfe = max_nfe

    def join(self, r: int, d: int, prefix: np.ndarray | None, x0: np.ndarray,
             times: np.ndarray) -> None:
        self.d[r] = d
        if not d:
            return
        n = d * self.dim
        if prefix is None or len(prefix) < n:
            raise ValueError(f"{d} frozen rows need a prefix of at least {n} floats")
        np.copyto(self.prefix[r, :n], prefix[:n])
        np.copyto(self.x0[r], x0)
        self.land[r, : len(times)] = _rtc.landing_times(times, self.time)

    def point(self, native: _native.NativeLoop, r: int) -> None:
        """Row r of a native loop conditioned from these buffers' row r."""
        native.set_frozen(r, int(self.d[r]), self.prefix[r], self.x0[r], self.land[r])

    def move(self, r: int, last: int) -> None:
        for arr in (self.d, self.prefix, self.x0, self.land):
            arr[r] = arr[last]

    def before_nfe(self, n: int, t_solver: np.ndarray, state: np.ndarray, x: np.ndarray,
                   t_rows: np.ndarray) -> None:
        if self.mode != "training_time":
            return
        for r in np.flatnonzero(self.d[:n]):
            d = int(self.d[r])
            _rtc.condition_training_time(state[r], t_rows[r], t_solver[r], self.prefix[r], d,
                                         self.dim, self.time)  # fmt: skip
            np.copyto(x[r, : d * self.dim], state[r, : d * self.dim])

    def after_nfe(self, n: int, idx: np.ndarray, state: np.ndarray, x: np.ndarray) -> None:
        if self.mode != "inpaint":
            return
        for r in np.flatnonzero(self.d[:n]):
            d, j = int(self.d[r]), int(idx[r] - r * self._max_nfe)
            _rtc.inpaint(state[r], self.land[r, j], self.x0[r], self.prefix[r], d, self.dim,
                         self.time, self._tmp)  # fmt: skip
            np.copyto(x[r, : d * self.dim], state[r, : d * self.dim])

    def hold(self, r: int, state: np.ndarray) -> None:
        _rtc.hold_prefix(state, self.prefix[r], int(self.d[r]), self.dim)
