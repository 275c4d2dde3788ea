# SPDX-License-Identifier: Apache-2.0
"""Loading a flow-matching policy from ONNX and integrating it one NFE at a time.

The relay's unit of work is one NFE (function evaluation): one `InferenceSession` call that
computes the velocity v(x, t, observation), plus one solver update. Workers call `FlowSampler.nfe()`
once per scheduled step so the C core can cancel or expire the work between any two NFEs.

Model contract (checked by `load_model`, violations raise `IncompatibleModel`):
  inputs  `x` float32 [batch, action_horizon, action_dim], `t` float32 [batch, 1],
          `observation` float32 [batch, obs_dim]; output `velocity` float32 shaped like `x`.
  The batch dimension is symbolic (or 1); the relay runs batch 1, or up to batch_slots rows
  with batch slots (batch.py, docs/design.md §5.1), which needs it symbolic.

Time grid (a request's total NFE N fixes it, so a result never depends on how a run was split):
  euler     K = N intervals, dt = 1/K; NFE j evaluates v(x, j*dt) and sets x += dt * v.
  midpoint  K = ceil(N/2) intervals, dt = 1/K; interval k < N//2 spends two NFE
            (v1 = v(x, k*dt); v2 = v(x + dt/2 * v1, (k + 1/2)*dt); x += dt * v2);
            for odd N the last interval is one Euler NFE.
Initial noise x(0) = numpy.random.default_rng(noise_seed).standard_normal(float32), so
(observation, noise_seed, N, solver) -> bit-identical actions for a given model and runtime.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

SOLVERS = ("euler", "midpoint")
INPUT_X, INPUT_T, INPUT_OBS, OUTPUT_V = "x", "t", "observation", "velocity"
_MODELS_DIR = Path(__file__).resolve().parent / "models"

#: Per-NFE solver update kinds (solver_plan's `kinds`, precomputed per (solver, N)): an Euler
#: step, a midpoint's half step (the model input moves, the state stays), a midpoint's full step.
#: The native loop (csrc fer_exec) reads the same values.
KIND_EULER, KIND_MID_HALF, KIND_MID_FULL = 0, 1, 2


class ModelError(Exception):
    """The configured model cannot be used; the node reports it as an ERROR diagnostic."""


class MissingModel(ModelError):
    """No readable file at the path."""


class CorruptModel(ModelError):
    """The file exists but onnxruntime cannot load it."""


class IncompatibleModel(ModelError):
    """The model loads but does not have the relay's inputs, outputs or shapes."""


@dataclass(frozen=True)
class ModelInfo:
    """A validated model: its identity, its dims and the exact bytes that were hashed."""

    path: str
    digest: str  # "sha256:<hex>" of the file bytes
    obs_dim: int
    action_horizon: int
    action_dim: int
    model_bytes: bytes = field(repr=False, compare=False)

    @property
    def action_len(self) -> int:
        return self.action_horizon * self.action_dim


def default_model_path() -> str:
    """The bundled small policy (the relay's default `model_path`)."""
    return str(_MODELS_DIR / "policy_small.onnx")


def file_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def session_options(intra_op_threads: int, intra_op_affinities: str = "") -> ort.SessionOptions:
    """The options of every session the relay makes (model.py and policy/session.py alike), so
    the Python sessions and the native loop's compute the same velocities.
    `intra_op_affinities`: realtime.intra_op_affinities' string, one CPU per pool thread; ""
    leaves the pool threads on the CPUs (and the scheduling class) of the creating thread."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = int(intra_op_threads)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    if intra_op_threads > 1:
        # Spinning pool threads would steal the cores other workers run on.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if intra_op_affinities:
            so.add_session_config_entry("session.intra_op_thread_affinities", intra_op_affinities)
    return so


def make_session(model: ModelInfo | str | os.PathLike, intra_op_threads: int = 1):
    """A fresh session with its own options (one per worker), from the bytes that were hashed."""
    if intra_op_threads < 1:
        raise ValueError("intra_op_threads must be >= 1")
    info = model if isinstance(model, ModelInfo) else load_model(model)
    return ort.InferenceSession(
        info.model_bytes, session_options(intra_op_threads), providers=["CPUExecutionProvider"]
    )


def _static_dim(dim: object) -> int | None:
    return dim if isinstance(dim, int) and dim > 0 else None


def _check_io(path: str, sess: ort.InferenceSession) -> tuple[int, int, int]:
    """(obs_dim, action_horizon, action_dim) from the declared shapes, or IncompatibleModel."""

    def bad(why: str) -> IncompatibleModel:
        return IncompatibleModel(f"{path}: {why}")

    inputs = {i.name: i for i in sess.get_inputs()}
    outputs = {o.name: o for o in sess.get_outputs()}
    if set(inputs) != {INPUT_X, INPUT_T, INPUT_OBS}:
        raise bad(f"inputs must be x, t, observation; model has {sorted(inputs)}")
    if OUTPUT_V not in outputs:
        raise bad(f"no output named velocity; model has {sorted(outputs)}")
    arrays = [inputs[INPUT_X], inputs[INPUT_T], inputs[INPUT_OBS], outputs[OUTPUT_V]]
    for arg in arrays:
        if arg.type != "tensor(float)":
            raise bad(f"{arg.name} must be tensor(float), not {arg.type}")
        if not arg.shape or (_static_dim(arg.shape[0]) not in (None, 1)):
            raise bad(f"{arg.name} needs a leading batch dimension, has shape {arg.shape}")
    x, t, obs, v = (a.shape for a in arrays)
    if len(x) != 3 or _static_dim(x[1]) is None or _static_dim(x[2]) is None:
        raise bad(f"x must be [batch, action_horizon, action_dim] with fixed dims, not {x}")
    if len(t) != 2 or t[1] != 1:
        raise bad(f"t must be [batch, 1], not {t}")
    if len(obs) != 2 or _static_dim(obs[1]) is None:
        raise bad(f"observation must be [batch, obs_dim] with a fixed obs_dim, not {obs}")
    if len(v) != 3 or v[1:] != x[1:]:
        raise bad(f"velocity must be shaped like x {x}, not {v}")
    return obs[1], x[1], x[2]


def load_model(path: str | os.PathLike) -> ModelInfo:
    """Read, hash, load and validate a policy; one NFE is run on zeros to prove the shapes."""
    path = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise MissingModel(f"{path}: cannot read model file ({exc.strerror or exc})") from exc
    try:
        sess = ort.InferenceSession(data, session_options(1), providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidProtobuf/... types
        raise CorruptModel(f"{path}: onnxruntime cannot load it: {exc}") from exc
    obs_dim, horizon, dim = _check_io(path, sess)
    feeds = {
        INPUT_X: np.zeros((1, horizon, dim), np.float32),
        INPUT_T: np.zeros((1, 1), np.float32),
        INPUT_OBS: np.zeros((1, obs_dim), np.float32),
    }
    try:
        (velocity,) = sess.run([OUTPUT_V], feeds)
    except Exception as exc:
        raise IncompatibleModel(f"{path}: a test evaluation failed: {exc}") from exc
    if velocity.shape != (1, horizon, dim) or velocity.dtype != np.float32:
        raise IncompatibleModel(
            f"{path}: velocity came back {velocity.dtype}{list(velocity.shape)}, "
            f"expected float32{[1, horizon, dim]}"
        )
    return ModelInfo(path, file_digest(data), obs_dim, horizon, dim, data)


def solver_plan(solver: str, total_nfe: int) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """Per-NFE evaluation times (float32), per-NFE update kinds, and dt of the fixed time grid."""
    if solver not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; choose one of {SOLVERS}")
    if total_nfe < 1:
        raise ValueError("total_nfe must be >= 1")
    if solver == "euler":
        k = total_nfe
        times = np.arange(k, dtype=np.float64) / k
        kinds = np.full(k, KIND_EULER, np.int8)
    else:
        k = math.ceil(total_nfe / 2)
        pairs = total_nfe // 2
        starts = np.arange(pairs, dtype=np.float64)
        times = np.empty(total_nfe, np.float64)
        times[0 : 2 * pairs : 2] = starts / k
        times[1 : 2 * pairs : 2] = (starts + 0.5) / k
        kinds = np.empty(total_nfe, np.int8)
        kinds[0 : 2 * pairs : 2] = KIND_MID_HALF
        kinds[1 : 2 * pairs : 2] = KIND_MID_FULL
        if total_nfe % 2:
            times[-1] = pairs / k
            kinds[-1] = KIND_EULER
    return times.astype(np.float32), kinds, np.float32(1.0 / k)


def integrator_plan(
    solver: str, sign: np.float32, total_nfe: int
) -> tuple[np.ndarray, np.ndarray, np.float32]:
    """solver_plan in the integrator's direction: evaluation times (1 - tau for sign -1), update
    kinds, and the signed dt. One function, so the batched rows (batch.py) and FlowIntegrator
    step with the same float32 values."""
    times, kinds, dt = solver_plan(solver, total_nfe)
    if sign < 0:  # 1_to_0: evaluate at 1 - tau and step backwards in t
        times = (np.float32(1.0) - times).astype(np.float32)
    return times, kinds, np.float32(dt * sign)


def half_step(dt: np.float32) -> np.float32:
    """The midpoint's half step, as FlowIntegrator computes it."""
    return np.float32(dt / 2)


@dataclass(frozen=True)
class RowState:
    """One request's integration state, as a row of the native loop takes it in and gives it back
    (native.NativeLoop.load / store): the ODE state and the model's x input (float32, flat), the
    time grid of its total NFE (model.integrator_plan's times and kinds, with dt and dt/2), and
    how many of its NFE are done. FlowIntegrator.export_row gives views of its own buffers."""

    state: np.ndarray
    x: np.ndarray
    times: np.ndarray
    kinds: np.ndarray
    dt: np.float32
    half_dt: np.float32
    total: int
    next: int


class FlowIntegrator:
    """The solver half of every NFE, shared by FlowSampler and policy.PolicySampler.

    A request's total NFE fixes the time grid (cached per total), x(0) comes from the seed, and
    after each velocity evaluation `_advance` applies the Euler or midpoint update in place. The
    subclass owns the buffers (`_state`, the model's `_x_flat` input and `_v_flat` output, a
    `_tmp`) and evaluates the velocity at `_times[_next]`. `_sign` = -1 integrates t from 1 to 0.
    """

    _sign = np.float32(1.0)
    _state: np.ndarray
    _x_flat: np.ndarray
    _v_flat: np.ndarray
    _tmp: np.ndarray

    def _init_integrator(self, solver: str) -> None:
        if solver not in SOLVERS:
            raise ValueError(f"unknown solver {solver!r}; choose one of {SOLVERS}")
        self.solver = solver
        self._plans: dict[int, tuple[np.ndarray, np.ndarray, np.float32]] = {}
        self._times, self._kinds, self._dt = self._plan(1)
        self._half_dt = half_step(self._dt)
        self._next = self._total = 0

    def _plan(self, total_nfe: int) -> tuple[np.ndarray, np.ndarray, np.float32]:
        plan = self._plans.get(total_nfe)
        if plan is None:
            plan = self._plans[total_nfe] = integrator_plan(self.solver, self._sign, total_nfe)
        return plan

    def _begin(self, noise_seed: int, total_nfe: int) -> None:
        """x(0) from the seed and the time grid of total_nfe."""
        self._times, self._kinds, self._dt = self._plan(total_nfe)
        self._half_dt = half_step(self._dt)
        np.random.default_rng(noise_seed).standard_normal(dtype=np.float32, out=self._state)
        np.copyto(self._x_flat, self._state)
        self._next, self._total = 0, total_nfe

    def _time_of_next(self) -> np.float32:
        if self._next >= self._total:
            raise RuntimeError("no NFE left; call start() first")
        return self._times[self._next]

    def _advance(self) -> None:
        """The solver update after the velocity of NFE _next landed in _v_flat."""
        if self._kinds[self._next] == KIND_MID_HALF:  # the model input becomes the midpoint
            np.multiply(self._v_flat, self._half_dt, out=self._tmp)
            np.add(self._state, self._tmp, out=self._x_flat)
        else:
            np.multiply(self._v_flat, self._dt, out=self._tmp)
            np.add(self._state, self._tmp, out=self._state)
            np.copyto(self._x_flat, self._state)
        self._next += 1

    def export_row(self) -> RowState:
        """The request in progress as a row (views of this integrator's buffers, not copies)."""
        return RowState(self._state, self._x_flat, self._times, self._kinds, self._dt,
                        self._half_dt, self._total, self._next)

    def import_row(self, row: RowState) -> None:
        """A row's state, x and progress back into this integrator (after a native run stepped
        it); the row must be the request in progress, on this integrator's time grid."""
        if row.total != self._total or row.times is not self._times:
            raise ValueError("import_row: not the request in progress (another time grid)")
        np.copyto(self._state, row.state)
        np.copyto(self._x_flat, row.x)
        self._next = int(row.next)

    @property
    def remaining(self) -> int:
        return self._total - self._next

    @property
    def nfe_done(self) -> int:
        return self._next


class FlowSampler(FlowIntegrator):
    """Integrates one request at a time on one session; owns every buffer of the hot path.

    Not thread-safe: one sampler per worker thread. `start` costs one noise draw; each `nfe`
    is one bound `run_with_iobinding` plus two in-place numpy ops, with no allocation.
    """

    def __init__(self, session: ort.InferenceSession, info: ModelInfo, solver: str = "euler"):
        self._init_integrator(solver)
        self.info, self.session = info, session
        shape = (1, info.action_horizon, info.action_dim)
        self._x_in = np.zeros(shape, np.float32)  # what the model sees
        self._state = np.zeros(info.action_len, np.float32)  # x of the ODE (midpoint keeps it)
        self._v = np.zeros(shape, np.float32)
        self._tmp = np.zeros(info.action_len, np.float32)
        self._t = np.zeros((1, 1), np.float32)
        self._obs = np.zeros((1, info.obs_dim), np.float32)
        self._x_flat, self._v_flat = self._x_in.reshape(-1), self._v.reshape(-1)
        binding = session.io_binding()
        for name, buf in ((INPUT_X, self._x_in), (INPUT_T, self._t), (INPUT_OBS, self._obs)):
            binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(buf))
        binding.bind_ortvalue_output(OUTPUT_V, ort.OrtValue.ortvalue_from_numpy(self._v))
        self._binding = binding

    def start(self, observation: np.ndarray, noise_seed: int, total_nfe: int) -> None:
        """Begin a request: x(0) from the seed, the time grid from total_nfe."""
        np.copyto(self._obs[0], observation, casting="same_kind")
        self._begin(noise_seed, total_nfe)

    def nfe(self) -> None:
        """Exactly one function evaluation and its solver update."""
        self._t[0, 0] = self._time_of_next()
        self.session.run_with_iobinding(self._binding)
        self._advance()

    def actions(self) -> np.ndarray:
        """The current state, float32 [action_len] (a view: copy it to keep it)."""
        return self._state

    def sample(self, observation: np.ndarray, noise_seed: int, total_nfe: int) -> np.ndarray:
        """All NFE of one request at once; returns a copy of the actions."""
        self.start(observation, noise_seed, total_nfe)
        for _ in range(total_nfe):
            self.nfe()
        return self._state.copy()
