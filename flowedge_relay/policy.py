"""Policy packages: named tensor inputs, two-phase (prefix + step) graphs, normalization.

Why: the policies robots run take several named inputs (uint8 camera images, float robot state,
int64 token ids) and are exported as two graphs, a prefix run once per request (a vision-language
encoder producing context tensors or a KV cache) and a step run once per NFE (the action expert).
This module is the relay-side description of such a policy and everything the data path needs:

  load(path)          one description (`Policy`) for a single `.onnx` file (model.load_model's
                      contract, unchanged) or a directory with `policy.yaml` (docs/design.md §10),
                      checked against the graphs' ONNX metadata and one test evaluation.
  intake(...)         validates `InferenceRequest.inputs` against the declared inputs and copies
                      each tensor once, normalizing on the way, into preallocated model buffers.
  make_session(...)   an InferenceSession on an explicit ordered list of execution providers;
                      an unavailable provider is an error, never a silent CPU fallback.
  PolicySampler       prefix() once per request, nfe() once per step (IOBinding, the context stays
                      bound, no per-NFE copies), actions() de-normalized and truncated.

Manifest (`policy.yaml`; docs/policy-packages.md has the full reference and the LeRobot mapping):

    format: flowedge_policy
    version: 1
    name: policy_vision
    inputs:                       # request tensors; `name` is the graph input's name
      - {name: image, dtype: uint8, shape: [1, 32, 32], normalization: {min: 0, max: 255}}
      - {name: state, dtype: float32, shape: [4], normalization: {mean: [...], std: [...]}}
    action: {dim: 2, horizon: 8, output_dim: 2, normalization: {mean: [...], std: [...]}}
    graphs: {prefix: prefix.onnx, step: step.onnx}     # or {velocity: policy.onnx}
    flow: {time: 0_to_1, solver: euler, x: x, t: t, velocity: velocity}

Normalization: mean/std gives (v - mean) / std; min/max gives 2 (v - min) / (max - min) - 1 (to
[-1, 1], LeRobot's MIN_MAX). Statistics broadcast against the input's shape ([C, 1, 1]: per
channel).
A normalized input reaches the graph as float32; an unnormalized one in its declared dtype.
Actions: the graph's x is [horizon, dim]; the relay returns the first output_dim columns, then
inverts the action normalization (its statistics broadcast against [output_dim]).

Digest (`sha256:<hex>`): sha256 over parts in this order: `policy.yaml`, then the graphs in role
order (velocity; or prefix, then step). Each part is fed as its name (`policy.yaml` or the role),
a NUL byte, its length as 8 bytes little-endian, then its bytes. A single `.onnx` file keeps
sha256 of the file bytes.

Time convention: `0_to_1` integrates from noise at t=0 to the action at t=1 (x += dt v, the
bundled policies); `1_to_0` from noise at t=1 down to t=0 (x -= dt v, the sign pi0-style exports
use). The grid is model.solver_plan's; for 1_to_0 the evaluation times are 1 - those.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from flowedge_relay.model import (
    SOLVERS,
    CorruptModel,
    FlowIntegrator,
    IncompatibleModel,
    MissingModel,
    ModelError,
    _session_options,
    load_model,
)

MANIFEST = "policy.yaml"
FORMAT = "flowedge_policy"
FORMAT_VERSION = 1
TIME_CONVENTIONS = ("0_to_1", "1_to_0")
DEFAULT_PROVIDERS = ("CPUExecutionProvider",)
DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
INPUT_NAME_MAX = 256

# Tensor.msg dtype constants -> (manifest name, little-endian numpy dtype, ONNX type string).
DTYPES: dict[int, tuple[str, np.dtype, str]] = {
    0: ("float32", np.dtype("<f4"), "tensor(float)"),
    1: ("uint8", np.dtype("u1"), "tensor(uint8)"),
    2: ("int64", np.dtype("<i8"), "tensor(int64)"),
    3: ("int32", np.dtype("<i4"), "tensor(int32)"),
    4: ("float16", np.dtype("<f2"), "tensor(float16)"),
    5: ("bool", np.dtype("?"), "tensor(bool)"),
}
DTYPE_CODES = {name: code for code, (name, _, _) in DTYPES.items()}
_ORT_NUMPY = {ort_t: np_t.newbyteorder("=") for _, np_t, ort_t in DTYPES.values()}
_ORT_NUMPY["tensor(double)"] = np.dtype(np.float64)
_FLOAT_CODES = frozenset((0, 4))

# intake() failure keys (diagnostics counter names), fixed so hostile input cannot grow them.
INPUT_MISSING = "input_missing"
INPUT_UNEXPECTED = "input_unexpected"
INPUT_DUPLICATE = "input_duplicate"
INPUT_DTYPE = "input_dtype"
INPUT_SHAPE = "input_shape"
INPUT_BYTES = "input_bytes"
INPUT_NOT_FINITE = "input_not_finite"
INPUT_BOOL_VALUE = "input_bool_value"
REQUEST_TOO_LARGE = "request_too_large"
INTAKE_REASONS = (
    INPUT_MISSING,
    INPUT_UNEXPECTED,
    INPUT_DUPLICATE,
    INPUT_DTYPE,
    INPUT_SHAPE,
    INPUT_BYTES,
    INPUT_NOT_FINITE,
    INPUT_BOOL_VALUE,
    REQUEST_TOO_LARGE,
)


class PolicyError(ModelError):
    """A policy package that cannot be served; the message names the field, expected and found."""


class ManifestError(PolicyError):
    """policy.yaml itself is malformed (missing or ill-typed field)."""


class GraphMismatch(PolicyError, IncompatibleModel):
    """The manifest and a graph's ONNX input/output metadata disagree."""


class ProviderUnavailable(ModelError):
    """A requested execution provider is not available in this onnxruntime build or host."""


# ---------------------------------------------------------------- description


@dataclass(frozen=True)
class Normalization:
    """An affine map y = v * scale + offset (float32), from mean/std or min/max statistics."""

    mode: str  # "mean_std" or "min_max"
    scale: np.ndarray = field(repr=False)
    offset: np.ndarray = field(repr=False)
    stats: dict[str, Any] = field(repr=False, compare=False)

    def apply(self, value: np.ndarray, out: np.ndarray) -> None:
        """out = normalized value (value may be any numeric dtype; one pass, no allocation)."""
        np.multiply(value, self.scale, out=out, casting="unsafe")
        np.add(out, self.offset, out=out)

    def invert(self, value: np.ndarray, out: np.ndarray) -> None:
        """out = de-normalized value."""
        np.subtract(value, self.offset, out=out)
        np.divide(out, self.scale, out=out)


@dataclass(frozen=True)
class InputSpec:
    """One declared request tensor."""

    name: str
    dtype: str  # manifest name, e.g. "uint8"
    shape: tuple[int, ...]  # without batch
    normalization: Normalization | None = None

    @property
    def code(self) -> int:
        return DTYPE_CODES[self.dtype]

    @property
    def wire_dtype(self) -> np.dtype:
        """The dtype of Tensor.data (little-endian)."""
        return DTYPES[self.code][1]

    @property
    def model_dtype(self) -> np.dtype:
        """What the graph sees: float32 when normalized, else the declared dtype."""
        if self.normalization is not None:
            return np.dtype(np.float32)
        return self.wire_dtype.newbyteorder("=")

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.wire_dtype.itemsize

    def describe(self) -> str:
        return f"{self.name}:{self.dtype}[{','.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class ActionSpec:
    """The action chunk: the graph's [horizon, dim], returned as [horizon, output_dim]."""

    dim: int
    horizon: int
    output_dim: int
    normalization: Normalization | None = None

    @property
    def model_len(self) -> int:
        return self.horizon * self.dim

    @property
    def output_len(self) -> int:
        return self.horizon * self.output_dim


@dataclass(frozen=True)
class ContextSpec:
    """One prefix output bound as a step input: its concrete shape (batch included) and dtype."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]


@dataclass(frozen=True)
class Graph:
    """One ONNX graph of a policy and the names it consumes and produces."""

    role: str  # "velocity", "prefix" or "step"
    file: str
    data: bytes = field(repr=False, compare=False)
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()


@dataclass(frozen=True)
class Policy:
    """What the relay serves: the same description for a single .onnx file and a package."""

    path: str
    kind: str  # "onnx" (single file), "velocity" (package, one graph), "two_phase"
    digest: str
    inputs: tuple[InputSpec, ...]
    action: ActionSpec
    graphs: dict[str, Graph] = field(repr=False)
    time: str = "0_to_1"
    solver: str = "euler"
    x_name: str = "x"
    t_name: str = "t"
    v_name: str = "velocity"
    t_shape: tuple[int, ...] = (1, 1)
    context: tuple[ContextSpec, ...] = ()
    name: str = ""

    @property
    def two_phase(self) -> bool:
        return "prefix" in self.graphs

    @property
    def step_graph(self) -> Graph:
        return self.graphs["step" if self.two_phase else "velocity"]

    @property
    def input(self) -> dict[str, InputSpec]:
        return {spec.name: spec for spec in self.inputs}

    @property
    def observation_dim(self) -> int:
        """The single-vector shorthand's length, or 0 when requests carry `inputs` tensors."""
        if self.kind == "onnx":
            return self.inputs[0].shape[0]
        return 0

    @property
    def action_dim(self) -> int:
        """What producers see (ActionMessage.action_dim): the output_dim columns."""
        return self.action.output_dim

    @property
    def action_horizon(self) -> int:
        return self.action.horizon

    # model.ModelInfo's names, so code written for a single .onnx file reads a Policy alike
    @property
    def obs_dim(self) -> int:
        return self.observation_dim

    @property
    def action_len(self) -> int:
        """Floats per returned action chunk: horizon x output_dim."""
        return self.action.output_len

    @property
    def kind_text(self) -> str:
        """What diagnostics call it: 'single graph' or 'two-phase' (and whether a package)."""
        if self.kind == "onnx":
            return "single graph"
        return "two-phase (package)" if self.two_phase else "single graph (package)"

    def describe_inputs(self) -> str:
        """'image:uint8[1,32,32]; state:float32[4]': the diagnostics value producers parse."""
        return "; ".join(spec.describe() for spec in self.inputs)


def vision_policy_path() -> str:
    """The bundled two-phase package (image and state inputs; train_policy.py --model vision)."""
    return str(Path(__file__).resolve().parent / "models" / "policy_vision")


# ---------------------------------------------------------------- execution providers


def check_providers(requested: Sequence[str]) -> tuple[str, ...]:
    """The requested providers, in order, if all are available; else ProviderUnavailable."""
    requested = tuple(requested)
    available = ort.get_available_providers()
    if not requested:
        raise ProviderUnavailable(
            f"execution_providers: expected at least one provider, found []; available: {available}"
        )
    missing = [p for p in requested if p not in available]
    if missing:
        raise ProviderUnavailable(
            f"execution_providers: {missing} not available in onnxruntime {ort.__version__} "
            f"on this host; available: {available} (no fall back to CPU: calibration would no "
            "longer be true)"
        )
    return requested


def make_session(
    data: bytes,
    intra_op_threads: int = 1,
    execution_providers: Sequence[str] = DEFAULT_PROVIDERS,
    label: str = "graph",
    intra_op_affinities: str = "",
) -> ort.InferenceSession:
    """A session on exactly the requested providers, in order; never a silent CPU fallback.

    onnxruntime itself drops a listed provider whose libraries fail to load (a CUDA build without
    cuDNN) with only a warning; the providers the session really got are checked too.
    `intra_op_affinities` pins the session's pool threads (realtime.intra_op_affinities).
    """
    if intra_op_threads < 1:
        raise ValueError("intra_op_threads must be >= 1")
    providers = check_providers(execution_providers)
    try:
        sess = ort.InferenceSession(
            data, _session_options(intra_op_threads, intra_op_affinities),
            providers=list(providers),
        )
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidProtobuf/... types
        raise CorruptModel(f"{label}: onnxruntime cannot load it: {exc}") from exc
    got = sess.get_providers()
    dropped = [p for p in providers if p not in got]
    if dropped:
        raise ProviderUnavailable(
            f"execution_providers: {dropped} failed to initialise for {label} (session has "
            f"{got}); available: {ort.get_available_providers()}"
        )
    return sess


def make_sessions(
    policy: Policy,
    intra_op_threads: int = 1,
    execution_providers: Sequence[str] = DEFAULT_PROVIDERS,
    intra_op_affinities: str = "",
) -> dict[str, ort.InferenceSession]:
    """One session per graph of the policy (one set per worker), from the hashed bytes."""
    return {
        role: make_session(g.data, intra_op_threads, execution_providers, f"{policy.path}:{role}",
                           intra_op_affinities)
        for role, g in policy.graphs.items()
    }


# ---------------------------------------------------------------- manifest parsing


def _expect(cond: bool, where: str, expected: str, found: Any) -> None:
    if not cond:
        raise ManifestError(f"{where}: expected {expected}, found {found!r}")


def _positive_int(value: Any, where: str) -> int:
    _expect(
        isinstance(value, int) and not isinstance(value, bool) and value > 0,
        where,
        "a positive integer",
        value,
    )
    return value


def _stat_array(value: Any, where: str, shape: tuple[int, ...]) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ManifestError(
            f"{where}: expected a number or nested list of numbers, found {value!r}"
        ) from None
    _expect(bool(np.isfinite(arr).all()), where, "finite numbers", value)
    try:
        ok = np.broadcast_shapes(arr.shape, shape) == shape
    except ValueError:
        ok = False
    _expect(ok, f"{where} shape", f"one that broadcasts to {list(shape)}", list(arr.shape))
    return arr


def _normalization(raw: Any, where: str, shape: tuple[int, ...]) -> Normalization | None:
    if raw is None:
        return None
    _expect(isinstance(raw, dict), where, "a mapping with mean/std or min/max", raw)
    keys = set(raw) - {"mode"}
    mode = raw.get("mode") or ("mean_std" if "mean" in raw else "min_max" if "min" in raw else None)
    if mode == "mean_std":
        _expect(keys == {"mean", "std"}, where, "keys mean and std", sorted(raw))
        mean = _stat_array(raw["mean"], f"{where}.mean", shape)
        std = _stat_array(raw["std"], f"{where}.std", shape)
        _expect(bool((std > 0).all()), f"{where}.std", "values > 0", raw["std"])
        scale, offset = 1.0 / std, -mean / std
    elif mode == "min_max":
        _expect(keys == {"min", "max"}, where, "keys min and max", sorted(raw))
        lo = _stat_array(raw["min"], f"{where}.min", shape)
        hi = _stat_array(raw["max"], f"{where}.max", shape)
        _expect(bool((hi > lo).all()), f"{where}.max", "values > min", raw["max"])
        scale = 2.0 / (hi - lo)
        offset = -2.0 * lo / (hi - lo) - 1.0
    else:
        raise ManifestError(f"{where}.mode: expected mean_std or min_max, found {mode!r}")
    full = lambda a: np.array(np.broadcast_to(a, shape), dtype=np.float32, order="C")  # noqa: E731
    return Normalization(mode, full(scale), full(offset), dict(raw))


def _shape(value: Any, where: str) -> tuple[int, ...]:
    _expect(
        isinstance(value, list),
        where,
        "a list of positive integers (without the batch dimension; [] for one scalar)",
        value,
    )
    return tuple(_positive_int(d, f"{where}[{i}]") for i, d in enumerate(value))


def _parse_inputs(raw: Any) -> tuple[InputSpec, ...]:
    _expect(isinstance(raw, list) and len(raw) > 0, "inputs", "a non-empty list", raw)
    specs: list[InputSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"inputs[{i}]"
        _expect(isinstance(item, dict), where, "a mapping with name, dtype, shape", item)
        unknown = set(item) - {"name", "dtype", "shape", "normalization", "description"}
        _expect(
            not unknown,
            where,
            "only name, dtype, shape, normalization, description",
            sorted(unknown),
        )
        name = item.get("name")
        _expect(
            isinstance(name, str) and 0 < len(name) <= INPUT_NAME_MAX,
            f"{where}.name",
            "a non-empty string",
            name,
        )
        _expect(name not in seen, f"{where}.name", "a name not declared before", name)
        seen.add(name)
        dtype = item.get("dtype")
        _expect(dtype in DTYPE_CODES, f"{where}.dtype", f"one of {sorted(DTYPE_CODES)}", dtype)
        shape = _shape(item.get("shape"), f"{where}.shape")
        norm = _normalization(item.get("normalization"), f"{where}.normalization", shape)
        if norm is not None:
            _expect(dtype != "bool", f"{where}.normalization", "none for a bool input", norm.stats)
        specs.append(InputSpec(name, dtype, shape, norm))
    return tuple(specs)


def _parse_action(raw: Any) -> ActionSpec:
    _expect(isinstance(raw, dict), "action", "a mapping with dim and horizon", raw)
    unknown = set(raw) - {"dim", "horizon", "output_dim", "normalization", "description"}
    _expect(not unknown, "action", "only dim, horizon, output_dim, normalization", sorted(unknown))
    dim = _positive_int(raw.get("dim"), "action.dim")
    horizon = _positive_int(raw.get("horizon"), "action.horizon")
    out = _positive_int(raw.get("output_dim", dim), "action.output_dim")
    _expect(out <= dim, "action.output_dim", f"<= action.dim ({dim})", out)
    norm = _normalization(raw.get("normalization"), "action.normalization", (out,))
    return ActionSpec(dim, horizon, out, norm)


def _read_manifest(root: Path) -> tuple[bytes, dict]:
    import yaml

    path = root / MANIFEST
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise MissingModel(f"{path}: cannot read the manifest ({exc.strerror or exc})") from exc
    try:
        raw = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: expected a mapping at the top level, found {raw!r}")
    return data, raw


def _graph_files(root: Path, raw: Any) -> dict[str, str]:
    _expect(isinstance(raw, dict), "graphs", "a mapping: velocity, or prefix and step", raw)
    roles = set(raw)
    _expect(
        roles in ({"velocity"}, {"prefix", "step"}),
        "graphs",
        "either {velocity} or {prefix, step}",
        sorted(roles),
    )
    files = {}
    for role in ("velocity", "prefix", "step"):
        if role in raw:
            name = raw[role]
            _expect(isinstance(name, str) and name, f"graphs.{role}", "a file name", name)
            target = (root / name).resolve()
            _expect(
                target.is_relative_to(root.resolve()),
                f"graphs.{role}",
                "a file inside the package directory",
                name,
            )
            files[role] = name
    return files


def package_digest(manifest: bytes, graphs: Sequence[tuple[str, bytes]]) -> str:
    """sha256 over the manifest then the graphs in role order (module docstring: the format)."""
    h = hashlib.sha256()
    for name, data in [(MANIFEST, manifest), *graphs]:
        h.update(name.encode() + b"\0" + len(data).to_bytes(8, "little"))
        h.update(data)
    return "sha256:" + h.hexdigest()


# ---------------------------------------------------------------- graph checks


def _static(dim: Any) -> int | None:
    return dim if isinstance(dim, int) and dim > 0 else None


class _Checker:
    """Compares the manifest with one graph's metadata; every error names field/expected/found."""

    def __init__(self, pkg: str, role: str, file: str, sess: ort.InferenceSession) -> None:
        self.where = f"{pkg}: graphs.{role} ({file})"
        self.inputs = {i.name: i for i in sess.get_inputs()}
        self.outputs = {o.name: o for o in sess.get_outputs()}

    def fail(self, what: str, expected: str, found: Any) -> GraphMismatch:
        return GraphMismatch(f"{self.where}: {what}: expected {expected}, found {found}")

    def tensor(
        self, arg: Any, what: str, ort_type: str, shape: Sequence[int | None], field_: str
    ) -> None:
        """arg is [batch, *shape] of ort_type; None in shape accepts any size."""
        if arg.type != ort_type:
            raise self.fail(f"{what} dtype (manifest {field_})", ort_type, arg.type)
        got = list(arg.shape or [])
        if len(got) != len(shape) + 1 or _static(got[0]) not in (None, 1):
            raise self.fail(
                f"{what} shape (manifest {field_})", f"[batch, {', '.join(map(str, shape))}]", got
            )
        for want, have in zip(shape, got[1:], strict=True):
            if want is not None and _static(have) not in (None, want):
                raise self.fail(
                    f"{what} shape (manifest {field_})",
                    f"[batch, {', '.join(map(str, shape))}]",
                    got,
                )


def _check_flow(c: _Checker, action: ActionSpec, x: str, t: str, v: str) -> tuple[int, ...]:
    hd = (action.horizon, action.dim)
    if x not in c.inputs:
        raise c.fail(f"input {x!r} (flow.x)", "an input named by flow.x", sorted(c.inputs))
    c.tensor(c.inputs[x], f"input {x!r}", "tensor(float)", hd, "action.horizon, action.dim")
    if t not in c.inputs:
        raise c.fail(f"input {t!r} (flow.t)", "an input named by flow.t", sorted(c.inputs))
    targ = c.inputs[t]
    tshape = list(targ.shape or [])
    if (
        targ.type != "tensor(float)"
        or len(tshape) not in (1, 2)
        or (len(tshape) == 2 and _static(tshape[1]) not in (None, 1))
    ):
        raise c.fail(
            f"input {t!r} (flow.t)", "tensor(float) [batch, 1] or [batch]", f"{targ.type} {tshape}"
        )
    if v not in c.outputs:
        raise c.fail(
            f"output {v!r} (flow.velocity)", "an output named by flow.velocity", sorted(c.outputs)
        )
    c.tensor(c.outputs[v], f"output {v!r}", "tensor(float)", hd, "action.horizon, action.dim")
    return (1, 1) if len(tshape) == 2 else (1,)


def _check_declared(c: _Checker, spec: InputSpec, index: int) -> None:
    ort_type = "tensor(float)" if spec.normalization is not None else DTYPES[spec.code][2]
    c.tensor(
        c.inputs[spec.name],
        f"input {spec.name!r}" + (" (normalized: float32)" if spec.normalization else ""),
        ort_type,
        spec.shape,
        f"inputs[{index}]",
    )


def _load_graph(root: Path, pkg: str, role: str, file: str) -> tuple[bytes, ort.InferenceSession]:
    path = root / file
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise MissingModel(
            f"{pkg}: graphs.{role}: cannot read {file} ({exc.strerror or exc})"
        ) from exc
    try:
        sess = ort.InferenceSession(data, _session_options(1), providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise CorruptModel(f"{pkg}: graphs.{role}: onnxruntime cannot load {file}: {exc}") from exc
    return data, sess


def _zeros(arg: Any, dtype: np.dtype) -> np.ndarray:
    shape = [(_static(d) or 1) for d in (arg.shape or [])]
    return np.zeros(shape, dtype)


def load_package(path: str | os.PathLike) -> Policy:
    """Read, check and hash a policy package directory (policy.yaml + graphs)."""
    root = Path(path)
    pkg = str(root)
    manifest_bytes, raw = _read_manifest(root)
    known = {
        "format",
        "version",
        "name",
        "description",
        "inputs",
        "action",
        "graphs",
        "flow",
        "source",
    }
    unknown = set(raw) - known
    _expect(not unknown, "policy.yaml", f"only the keys {sorted(known)}", sorted(unknown))
    _expect(raw.get("format") == FORMAT, "format", repr(FORMAT), raw.get("format"))
    _expect(
        raw.get("version") == FORMAT_VERSION, "version", str(FORMAT_VERSION), raw.get("version")
    )
    inputs = _parse_inputs(raw.get("inputs"))
    action = _parse_action(raw.get("action"))
    flow = raw.get("flow") or {}
    _expect(isinstance(flow, dict), "flow", "a mapping", flow)
    unknown = set(flow) - {"time", "solver", "x", "t", "velocity"}
    _expect(not unknown, "flow", "only time, solver, x, t, velocity", sorted(unknown))
    time_conv = flow.get("time", "0_to_1")
    _expect(time_conv in TIME_CONVENTIONS, "flow.time", f"one of {TIME_CONVENTIONS}", time_conv)
    solver = flow.get("solver", "euler")
    _expect(solver in SOLVERS, "flow.solver", f"one of {SOLVERS}", solver)
    names = {k: flow.get(k, k) for k in ("x", "t", "velocity")}
    for key, value in names.items():
        _expect(isinstance(value, str) and value, f"flow.{key}", "a tensor name", value)
    x_name, t_name, v_name = names["x"], names["t"], names["velocity"]
    clash = {x_name, t_name} & {s.name for s in inputs}
    _expect(
        not clash, "inputs", f"names other than flow.x/flow.t ({x_name}, {t_name})", sorted(clash)
    )

    files = _graph_files(root, raw.get("graphs"))
    loaded = {role: _load_graph(root, pkg, role, f) for role, f in files.items()}
    declared = {s.name: (i, s) for i, s in enumerate(inputs)}
    feeds: dict[str, np.ndarray] = {s.name: np.zeros((1, *s.shape), s.model_dtype) for s in inputs}
    graphs: dict[str, Graph] = {}
    context: tuple[ContextSpec, ...] = ()

    if "velocity" in files:
        data, sess = loaded["velocity"]
        c = _Checker(pkg, "velocity", files["velocity"], sess)
        t_shape = _check_flow(c, action, x_name, t_name, v_name)
        expected = {x_name, t_name, *declared}
        if set(c.inputs) != expected:
            raise c.fail(
                "inputs",
                f"exactly {sorted(expected)} (flow.x, flow.t and inputs[])",
                sorted(c.inputs),
            )
        for i, spec in declared.values():
            _check_declared(c, spec, i)
        graphs["velocity"] = Graph("velocity", files["velocity"], data, tuple(c.inputs), (v_name,))
        step_sess, step_c = sess, c
    else:
        pdata, psess = loaded["prefix"]
        sdata, ssess = loaded["step"]
        pc = _Checker(pkg, "prefix", files["prefix"], psess)
        sc = _Checker(pkg, "step", files["step"], ssess)
        for name in pc.inputs:
            if name not in declared:
                raise pc.fail(
                    f"input {name!r}", f"one of the declared inputs {sorted(declared)}", repr(name)
                )
            _check_declared(pc, declared[name][1], declared[name][0])
        t_shape = _check_flow(sc, action, x_name, t_name, v_name)
        ctx_names = set(pc.outputs)
        clash = ctx_names & ({x_name, t_name} | set(declared))
        if clash:
            raise pc.fail(
                "outputs", "context names distinct from flow.x, flow.t and inputs[]", sorted(clash)
            )
        for name in sc.inputs:
            if name in (x_name, t_name):
                continue
            if name in declared:
                _check_declared(sc, declared[name][1], declared[name][0])
            elif name not in ctx_names:
                raise sc.fail(
                    f"input {name!r}",
                    f"flow.x, flow.t, a prefix output {sorted(ctx_names)} or a declared input "
                    f"{sorted(declared)}",
                    repr(name),
                )
        unused = sorted(ctx_names - set(sc.inputs))
        if unused:
            raise pc.fail("outputs", "every prefix output to be a step input", f"{unused} unused")
        for name in ctx_names:
            out, inp = pc.outputs[name], sc.inputs[name]
            if out.type != inp.type:
                raise sc.fail(
                    f"context {name!r} dtype", f"{out.type} (the prefix output)", inp.type
                )
            po, si = list(out.shape or []), list(inp.shape or [])
            if len(po) != len(si) or any(
                _static(a) and _static(b) and a != b for a, b in zip(po, si, strict=True)
            ):
                raise sc.fail(f"context {name!r} shape", f"{po} (the prefix output)", si)
        unused_inputs = sorted(set(declared) - set(pc.inputs) - set(sc.inputs))
        if unused_inputs:
            raise GraphMismatch(
                f"{pkg}: inputs: expected every declared input to be a prefix or step input, "
                f"found {unused_inputs} used by neither"
            )
        try:
            ctx_values = psess.run(sorted(ctx_names), {n: feeds[n] for n in pc.inputs})
        except Exception as exc:
            raise GraphMismatch(f"{pc.where}: a test evaluation on zeros failed: {exc}") from exc
        specs = []
        for name, value in zip(sorted(ctx_names), ctx_values, strict=True):
            if value.ndim == 0 or value.shape[0] != 1:
                raise pc.fail(
                    f"output {name!r}",
                    "a leading batch dimension of 1 for batch 1",
                    list(value.shape),
                )
            specs.append(ContextSpec(name, value.dtype, tuple(value.shape)))
            feeds[name] = value
        context = tuple(specs)
        graphs["prefix"] = Graph(
            "prefix", files["prefix"], pdata, tuple(pc.inputs), tuple(sorted(ctx_names))
        )
        graphs["step"] = Graph("step", files["step"], sdata, tuple(sc.inputs), (v_name,))
        step_sess, step_c = ssess, sc

    feeds[x_name] = np.zeros((1, action.horizon, action.dim), np.float32)
    feeds[t_name] = np.zeros(t_shape, np.float32)
    try:
        (velocity,) = step_sess.run([v_name], {n: feeds[n] for n in step_c.inputs})
    except Exception as exc:
        raise GraphMismatch(f"{step_c.where}: a test evaluation on zeros failed: {exc}") from exc
    if velocity.shape != (1, action.horizon, action.dim) or velocity.dtype != np.float32:
        raise step_c.fail(
            f"output {v_name!r} of the test evaluation",
            f"float32{[1, action.horizon, action.dim]}",
            f"{velocity.dtype}{list(velocity.shape)}",
        )
    digest = package_digest(manifest_bytes, [(g.role, g.data) for g in graphs.values()])
    return Policy(
        path=pkg,
        kind="two_phase" if "prefix" in graphs else "velocity",
        digest=digest,
        inputs=inputs,
        action=action,
        graphs=graphs,
        time=time_conv,
        solver=solver,
        x_name=x_name,
        t_name=t_name,
        v_name=v_name,
        t_shape=t_shape,
        context=context,
        name=str(raw.get("name", root.name)),
    )


def load(path: str | os.PathLike) -> Policy:
    """A `.onnx` file (model.load_model's contract) or a policy package directory, alike."""
    p = Path(path)
    if p.is_dir() and (p / MANIFEST).exists():
        return load_package(p)
    if p.is_dir():
        raise MissingModel(f"{p}: a directory without {MANIFEST} is not a policy package")
    info = load_model(p)
    return Policy(
        path=info.path,
        kind="onnx",
        digest=info.digest,
        inputs=(InputSpec("observation", "float32", (info.obs_dim,)),),
        action=ActionSpec(info.action_dim, info.action_horizon, info.action_dim),
        graphs={
            "velocity": Graph(
                "velocity", p.name, info.model_bytes, ("x", "t", "observation"), ("velocity",)
            )
        },
        name=p.stem,
    )


# ---------------------------------------------------------------- request intake (one copy)


class InputBuffers:
    """The model-side buffers of one request's inputs: [1, *shape] in the graph's dtype.

    Preallocated once (per worker, or per queue slot); intake() writes each tensor here exactly
    once, and a PolicySampler binds these arrays as graph inputs.
    """

    def __init__(self, policy: Policy) -> None:
        self.arrays: dict[str, np.ndarray] = {
            s.name: np.zeros((1, *s.shape), s.model_dtype) for s in policy.inputs
        }
        # Views of the same memory for IOBinding, made once so binding a request allocates nothing.
        self.ortvalues: dict[str, ort.OrtValue] = {
            name: ort.OrtValue.ortvalue_from_numpy(arr) for name, arr in self.arrays.items()
        }

    @classmethod
    def over_payload(
        cls, policy: Policy, payload: np.ndarray, layout: PayloadLayout | None = None
    ) -> InputBuffers:
        """Buffers that are views of `payload` (uint8, e.g. a core slot's), laid out by
        `payload_layout`: nothing is allocated but the views and their OrtValues, made once."""
        layout = layout or payload_layout(policy)
        if payload.dtype != np.uint8 or payload.ndim != 1 or payload.size < layout.nbytes:
            raise ValueError(
                f"payload: expected uint8[>= {layout.nbytes}], found {payload.dtype}{payload.shape}"
            )
        if not payload.flags.c_contiguous:
            raise ValueError("payload: expected a contiguous buffer")
        self = cls.__new__(cls)
        self.arrays = {}
        for s in policy.inputs:
            off, size = layout.offsets[s.name], layout.sizes[s.name]
            view = payload[off : off + size].view(s.model_dtype).reshape((1, *s.shape))
            if not view.flags.aligned:
                raise ValueError(f"payload: input {s.name!r} at offset {off} is misaligned")
            self.arrays[s.name] = view
        self.ortvalues = {
            name: ort.OrtValue.ortvalue_from_numpy(arr) for name, arr in self.arrays.items()
        }
        return self

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]


#: Alignment of each input inside a request payload (a cache line; any dtype's itemsize divides it).
PAYLOAD_ALIGN = 64


@dataclass(frozen=True)
class PayloadLayout:
    """Where each input's model buffer ([1, *shape], model dtype) lies in one request payload.

    Why: the C core stores a fixed-size byte payload per queue slot (CoreConfig.payload_bytes);
    the request thread normalizes a request's tensors straight into its slot and the worker binds
    the same bytes as graph inputs, so a request is copied once, message -> slot.
    """

    offsets: dict[str, int]
    sizes: dict[str, int]
    nbytes: int  # the payload size per slot (a multiple of PAYLOAD_ALIGN)


def payload_layout(policy: Policy) -> PayloadLayout:
    """Inputs in declaration order, each at a PAYLOAD_ALIGN-aligned offset."""
    offsets, sizes, off = {}, {}, 0
    for s in policy.inputs:
        size = math.prod(s.shape) * s.model_dtype.itemsize
        offsets[s.name], sizes[s.name] = off, size
        off += -(-max(size, 1) // PAYLOAD_ALIGN) * PAYLOAD_ALIGN
    return PayloadLayout(offsets, sizes, off)


def request_bytes(msg: Any) -> int:
    """Payload bytes of a request's tensors and observation (what the size limit counts)."""
    return sum(len(t.data) for t in msg.inputs) + 4 * len(msg.observation)


def intake(
    tensors: Sequence[Any],
    policy: Policy,
    buffers: InputBuffers,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
) -> str | None:
    """Check Tensor messages against the declared inputs; copy each once into `buffers`.

    Returns None when every declared input arrived exactly once with the declared dtype, shape
    and byte length (finite values for float types), else the failure key (INTAKE_REASONS).
    On failure the buffers hold partial data and must not be run.
    """
    specs = policy.input
    if len(tensors) > 2 * len(specs) + 1:  # bound the work before touching each tensor
        return INPUT_UNEXPECTED
    total = 0
    for t in tensors:
        total += len(t.data)
    if total > max_request_bytes:
        return REQUEST_TOO_LARGE
    seen: set[str] = set()
    for t in tensors:
        spec = specs.get(t.name)
        if spec is None:
            return INPUT_UNEXPECTED
        if t.name in seen:
            return INPUT_DUPLICATE
        seen.add(t.name)
        if t.dtype != spec.code:
            return INPUT_DTYPE
        shape = t.shape
        if len(shape) != len(spec.shape) or tuple(shape) != spec.shape:
            return INPUT_SHAPE
        if len(t.data) != spec.nbytes:
            return INPUT_BYTES
        src = np.frombuffer(t.data, dtype=spec.wire_dtype).reshape(spec.shape)
        if spec.code in _FLOAT_CODES and not np.isfinite(src).all():
            return INPUT_NOT_FINITE
        if spec.code == 5 and src.view(np.uint8).max(initial=0) > 1:
            return INPUT_BOOL_VALUE
        dst = buffers.arrays[spec.name][0, ...]  # a view, also for a scalar input
        if spec.normalization is not None:
            spec.normalization.apply(src, dst)
        else:
            np.copyto(dst, src)
    if len(seen) != len(specs):
        return INPUT_MISSING
    return None


def fill_buffers(policy: Policy, buffers: InputBuffers, arrays: Mapping[str, np.ndarray]) -> None:
    """Local (non-message) path: normalize numpy arrays into buffers; for tools and tests."""
    for spec in policy.inputs:
        src = np.asarray(arrays[spec.name], dtype=spec.wire_dtype.newbyteorder("="))
        if src.shape != spec.shape:
            raise ValueError(f"input {spec.name}: expected shape {spec.shape}, got {src.shape}")
        dst = buffers.arrays[spec.name][0, ...]  # a view, also for a scalar input
        if spec.normalization is not None:
            spec.normalization.apply(src, dst)
        else:
            np.copyto(dst, src)


# ---------------------------------------------------------------- sampling


def _device_of(sess: ort.InferenceSession) -> tuple[str, int]:
    first = sess.get_providers()[0]
    if first in ("CUDAExecutionProvider", "TensorrtExecutionProvider"):
        return "cuda", 0
    return "cpu", 0


class PolicySampler(FlowIntegrator):
    """Integrates one request at a time on one set of sessions; owns the hot path's buffers.

    Not thread-safe: one sampler per worker thread. prefix() runs the prefix graph once into the
    context tensors, which stay bound as step inputs for every NFE (on the device when the step
    session runs on CUDA); nfe() is one bound step run plus in-place numpy updates.
    """

    def __init__(
        self,
        policy: Policy,
        sessions: Mapping[str, ort.InferenceSession],
        solver: str | None = None,
        buffers: InputBuffers | None = None,
    ) -> None:
        self._sign = np.float32(1.0 if policy.time == "0_to_1" else -1.0)
        self._init_integrator(solver or policy.solver)
        self.policy = policy
        self.sessions = dict(sessions)
        a = policy.action
        self._x_in = np.zeros((1, a.horizon, a.dim), np.float32)
        self._state = np.zeros(a.model_len, np.float32)
        self._v = np.zeros((1, a.horizon, a.dim), np.float32)
        self._tmp = np.zeros(a.model_len, np.float32)
        self._t = np.zeros(policy.t_shape, np.float32)
        self._t_flat = self._t.reshape(-1)
        self._x_flat, self._v_flat = self._x_in.reshape(-1), self._v.reshape(-1)
        self._out = np.zeros((a.horizon, a.output_dim), np.float32)
        self._out_flat = self._out.reshape(-1)
        self._state_hd = self._state.reshape(a.horizon, a.dim)
        step = policy.step_graph
        self._step_sess = self.sessions[step.role]
        device, device_id = _device_of(self._step_sess)
        self._context: dict[str, ort.OrtValue] = {}
        #: host arrays under the context OrtValues (CPU only): the native loop copies them
        self.context_arrays: dict[str, np.ndarray] = {}
        for c in policy.context:
            if device == "cpu":
                host = self.context_arrays[c.name] = np.zeros(c.shape, c.dtype)
                value = ort.OrtValue.ortvalue_from_numpy(host)
            else:
                value = ort.OrtValue.ortvalue_from_shape_and_type(
                    list(c.shape), c.dtype.type, device, device_id
                )
            self._context[c.name] = value
        sb = self._step_sess.io_binding()
        sb.bind_ortvalue_input(policy.x_name, ort.OrtValue.ortvalue_from_numpy(self._x_in))
        sb.bind_ortvalue_input(policy.t_name, ort.OrtValue.ortvalue_from_numpy(self._t))
        for name, value in self._context.items():
            sb.bind_ortvalue_input(name, value)
        sb.bind_ortvalue_output(policy.v_name, ort.OrtValue.ortvalue_from_numpy(self._v))
        self._step_binding = sb
        self._step_inputs = [n for n in step.inputs if n in policy.input]
        self._prefix_binding = None
        self._prefix_inputs: list[str] = []
        if policy.two_phase:
            psess = self.sessions["prefix"]
            pb = psess.io_binding()
            for name, value in self._context.items():
                pb.bind_ortvalue_output(name, value)
            self._prefix_binding, self._prefix_sess = pb, psess
            self._prefix_inputs = list(policy.graphs["prefix"].inputs)
        self.buffers: InputBuffers | None = None
        self.use_buffers(buffers or InputBuffers(policy))
        self._prefix_done = False

    def use_buffers(self, buffers: InputBuffers) -> None:
        """Bind a request's input buffers (once per request, not per NFE)."""
        if buffers is self.buffers:
            return
        for name in self._step_inputs:
            self._step_binding.bind_ortvalue_input(name, buffers.ortvalues[name])
        if self._prefix_binding is not None:
            for name in self._prefix_inputs:
                self._prefix_binding.bind_ortvalue_input(name, buffers.ortvalues[name])
        self.buffers = buffers

    @property
    def prefix_pending(self) -> bool:
        return self.policy.two_phase and not self._prefix_done

    def start(self, noise_seed: int, total_nfe: int, buffers: InputBuffers | None = None) -> None:
        """Begin a request whose inputs are in `buffers` (default: the bound ones)."""
        if buffers is not None:
            self.use_buffers(buffers)
        self._begin(noise_seed, total_nfe)
        self._prefix_done = not self.policy.two_phase

    def prefix(self) -> None:
        """The prefix graph, once per request: its outputs stay bound for every NFE."""
        if self._prefix_binding is not None and not self._prefix_done:
            self._prefix_sess.run_with_iobinding(self._prefix_binding)
        self._prefix_done = True

    def nfe(self) -> None:
        """Exactly one step-graph evaluation and its solver update."""
        t = self._time_of_next()
        if not self._prefix_done:
            raise RuntimeError("prefix() has not run for this request")
        self._t_flat[0] = t
        self._step_sess.run_with_iobinding(self._step_binding)
        self._advance()

    def context(self, name: str) -> np.ndarray:
        """A host copy of one context tensor (inspection and tests; never on the hot path)."""
        return self._context[name].numpy()

    def actions(self) -> np.ndarray:
        """float32 [horizon * output_dim]: truncated, then de-normalized (a view: copy to keep)."""
        a = self.policy.action
        cols = self._state_hd[:, : a.output_dim]
        if a.normalization is not None:
            a.normalization.invert(cols, self._out)
        else:
            np.copyto(self._out, cols)
        return self._out_flat

    def sample(
        self, arrays: Mapping[str, np.ndarray], noise_seed: int, total_nfe: int
    ) -> np.ndarray:
        """Local convenience: fill the bound buffers, run everything, return a copy."""
        assert self.buffers is not None
        fill_buffers(self.policy, self.buffers, arrays)
        self.start(noise_seed, total_nfe)
        self.prefix()
        for _ in range(total_nfe):
            self.nfe()
        return self.actions().copy()
