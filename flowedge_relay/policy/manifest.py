# SPDX-License-Identifier: Apache-2.0
"""Policy packages from disk: `policy.yaml` and its graphs, read, checked and hashed.

  load(path)          one description (`Policy`) for a single `.onnx` file (model.load_model's
                      contract, unchanged) or a directory with `policy.yaml` (docs/design.md §10),
                      checked against the graphs' ONNX metadata and one test evaluation.

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

Digest (`sha256:<hex>`): sha256 over parts in this order: `policy.yaml`, then the graphs in role
order (velocity; or prefix, then step). Each part is fed as its name (`policy.yaml` or the role),
a NUL byte, its length as 8 bytes little-endian, then its bytes. A single `.onnx` file keeps
sha256 of the file bytes.

Every error names the field, what was expected and what was found (docs/policy-packages.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from flowedge_relay.model import (
    SOLVERS,
    CorruptModel,
    IncompatibleModel,
    MissingModel,
    ModelError,
    load_model,
    session_options,
)
from flowedge_relay.policy.description import (
    DTYPE_CODES,
    DTYPES,
    ActionSpec,
    ContextSpec,
    Graph,
    InputSpec,
    Normalization,
    Policy,
)
from flowedge_relay.rtc import RtcSpec, parse_rtc

MANIFEST = "policy.yaml"
FORMAT = "flowedge_policy"
FORMAT_VERSION = 1
TIME_CONVENTIONS = ("0_to_1", "1_to_0")
INPUT_NAME_MAX = 256
#: the top-level keys of policy.yaml
MANIFEST_KEYS = ("format", "version", "name", "description", "inputs", "action", "graphs",
                 "flow", "source", "rtc")


class PolicyError(ModelError):
    """A policy package that cannot be served; the message names the field, expected and found."""


class ManifestError(PolicyError):
    """policy.yaml itself is malformed (missing or ill-typed field)."""


class GraphMismatch(PolicyError, IncompatibleModel):
    """The manifest and a graph's ONNX input/output metadata disagree."""


# ---------------------------------------------------------------- manifest fields


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


@dataclass(frozen=True)
class _Flow:
    """The manifest's `flow`: time convention, solver and the flow tensors' names."""

    time: str
    solver: str
    x: str
    t: str
    v: str
    #: rtc training_time: t is the flow time per action row, [batch, horizon]
    per_row_t: bool = False


def _parse_rtc(raw: dict, flow: _Flow, action: ActionSpec) -> RtcSpec | None:
    """The optional `rtc:` block (rtc.parse_rtc). The relay feeds training_time's per-row time
    through flow.t (the usual export: one time input, [batch, horizon]), and conditions in the
    answer's space, so it takes neither a separate time input nor action normalization or
    padding (docs/policy-packages.md)."""
    if raw.get("rtc") is None:
        return None
    spec = parse_rtc(raw["rtc"], "rtc", action.horizon)
    if spec.mode == "training_time":
        _expect(spec.time_input == flow.t, "rtc.time_input", f"flow.t ({flow.t!r})",
                spec.time_input)
    _expect(action.normalization is None and action.output_dim == action.dim, "rtc",
            "a policy without action normalization or padded action dims", "either")
    return spec


def _check_header(raw: dict) -> None:
    """Only known top-level keys, this format and version."""
    known = set(MANIFEST_KEYS)
    unknown = set(raw) - known
    _expect(not unknown, "policy.yaml", f"only the keys {sorted(known)}", sorted(unknown))
    _expect(raw.get("format") == FORMAT, "format", repr(FORMAT), raw.get("format"))
    _expect(
        raw.get("version") == FORMAT_VERSION, "version", str(FORMAT_VERSION), raw.get("version")
    )


def _parse_flow(raw: Any, inputs: tuple[InputSpec, ...]) -> _Flow:
    flow = raw or {}
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
    x_name, t_name = names["x"], names["t"]
    clash = {x_name, t_name} & {s.name for s in inputs}
    _expect(
        not clash, "inputs", f"names other than flow.x/flow.t ({x_name}, {t_name})", sorted(clash)
    )
    return _Flow(time_conv, solver, x_name, t_name, names["velocity"])


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


def _check_flow(c: _Checker, action: ActionSpec, flow: _Flow) -> tuple[int, ...]:
    """The flow tensors x, t and the velocity in graph `c`; returns t's shape for batch 1."""
    x, t, v = flow.x, flow.t, flow.v
    hd = (action.horizon, action.dim)
    if x not in c.inputs:
        raise c.fail(f"input {x!r} (flow.x)", "an input named by flow.x", sorted(c.inputs))
    c.tensor(c.inputs[x], f"input {x!r}", "tensor(float)", hd, "action.horizon, action.dim")
    if t not in c.inputs:
        raise c.fail(f"input {t!r} (flow.t)", "an input named by flow.t", sorted(c.inputs))
    targ = c.inputs[t]
    tshape = list(targ.shape or [])
    if flow.per_row_t:
        c.tensor(targ, f"input {t!r}", "tensor(float)", (action.horizon,),
                 "flow.t = rtc.time_input: the time per action row, [batch, action.horizon]")
        return (1, action.horizon)
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
        sess = ort.InferenceSession(data, session_options(1), providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise CorruptModel(f"{pkg}: graphs.{role}: onnxruntime cannot load {file}: {exc}") from exc
    return data, sess


@dataclass
class _Checked:
    """What the graph checks established: the graphs, the step graph's session and checker, t's
    shape, the context tensors (two-phase) and zero feeds for the declared inputs (and the
    context the prefix computed from them)."""

    graphs: dict[str, Graph]
    step_sess: ort.InferenceSession
    step: _Checker
    t_shape: tuple[int, ...]
    context: tuple[ContextSpec, ...]
    feeds: dict[str, np.ndarray]


def _check_velocity(pkg: str, files: dict[str, str], loaded: dict, inputs: tuple[InputSpec, ...],
                    action: ActionSpec, flow: _Flow) -> _Checked:
    """One graph: exactly x, t and the declared inputs in, the velocity out."""
    declared = {s.name: (i, s) for i, s in enumerate(inputs)}
    data, sess = loaded["velocity"]
    c = _Checker(pkg, "velocity", files["velocity"], sess)
    t_shape = _check_flow(c, action, flow)
    expected = {flow.x, flow.t, *declared}
    if set(c.inputs) != expected:
        raise c.fail(
            "inputs",
            f"exactly {sorted(expected)} (flow.x, flow.t and inputs[])",
            sorted(c.inputs),
        )
    for i, spec in declared.values():
        _check_declared(c, spec, i)
    graphs = {"velocity": Graph("velocity", files["velocity"], data, tuple(c.inputs), (flow.v,))}
    return _Checked(graphs, sess, c, t_shape, (), _zero_feeds(inputs))


def _check_two_phase(pkg: str, files: dict[str, str], loaded: dict,
                     inputs: tuple[InputSpec, ...], action: ActionSpec,
                     flow: _Flow) -> _Checked:
    """A prefix and a step graph: the prefix reads declared inputs, every output of it is a
    step input (the context), the step reads x, t, the context and declared inputs; then the
    prefix runs once on zeros to learn the context's concrete shapes."""
    declared = {s.name: (i, s) for i, s in enumerate(inputs)}
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
    t_shape = _check_flow(sc, action, flow)
    ctx_names = _check_context(pkg, pc, sc, declared, flow)
    feeds = _zero_feeds(inputs)
    context = _evaluate_prefix(pc, psess, ctx_names, feeds)
    graphs = {
        "prefix": Graph(
            "prefix", files["prefix"], pdata, tuple(pc.inputs), tuple(sorted(ctx_names))
        ),
        "step": Graph("step", files["step"], sdata, tuple(sc.inputs), (flow.v,)),
    }
    return _Checked(graphs, ssess, sc, t_shape, context, feeds)


def _check_context(pkg: str, pc: _Checker, sc: _Checker, declared: dict, flow: _Flow) -> set[str]:
    """The prefix's outputs (the context) against the step's inputs; returns their names."""
    x_name, t_name = flow.x, flow.t
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
            raise sc.fail(f"context {name!r} dtype", f"{out.type} (the prefix output)", inp.type)
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
    return ctx_names


def _evaluate_prefix(pc: _Checker, psess: ort.InferenceSession, ctx_names: set[str],
                     feeds: dict[str, np.ndarray]) -> tuple[ContextSpec, ...]:
    """The prefix on zeros: each context tensor's concrete shape at batch 1 (its values join
    `feeds` for the step's test evaluation)."""
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
    return tuple(specs)


def _zero_feeds(inputs: tuple[InputSpec, ...]) -> dict[str, np.ndarray]:
    return {s.name: np.zeros((1, *s.shape), s.model_dtype) for s in inputs}


def _evaluate_step(checked: _Checked, action: ActionSpec, flow: _Flow) -> None:
    """One step run on zeros: the velocity comes back float32 [1, horizon, dim]."""
    feeds = checked.feeds
    feeds[flow.x] = np.zeros((1, action.horizon, action.dim), np.float32)
    feeds[flow.t] = np.zeros(checked.t_shape, np.float32)
    step_c = checked.step
    try:
        (velocity,) = checked.step_sess.run([flow.v], {n: feeds[n] for n in step_c.inputs})
    except Exception as exc:
        raise GraphMismatch(f"{step_c.where}: a test evaluation on zeros failed: {exc}") from exc
    if velocity.shape != (1, action.horizon, action.dim) or velocity.dtype != np.float32:
        raise step_c.fail(
            f"output {flow.v!r} of the test evaluation",
            f"float32{[1, action.horizon, action.dim]}",
            f"{velocity.dtype}{list(velocity.shape)}",
        )


# ---------------------------------------------------------------- loading


def load_package(path: str | os.PathLike) -> Policy:
    """Read, check and hash a policy package directory (policy.yaml + graphs), step by step:
    the manifest's fields, the graphs against them, one test evaluation, the digest."""
    root = Path(path)
    pkg = str(root)
    manifest_bytes, raw = _read_manifest(root)
    _check_header(raw)
    inputs = _parse_inputs(raw.get("inputs"))
    action = _parse_action(raw.get("action"))
    flow = _parse_flow(raw.get("flow"), inputs)
    rtc = _parse_rtc(raw, flow, action)
    if rtc is not None and rtc.mode == "training_time":
        flow = dataclasses.replace(flow, per_row_t=True)
    files = _graph_files(root, raw.get("graphs"))
    loaded = {role: _load_graph(root, pkg, role, f) for role, f in files.items()}
    check = _check_velocity if "velocity" in files else _check_two_phase
    checked = check(pkg, files, loaded, inputs, action, flow)
    _evaluate_step(checked, action, flow)
    graphs = checked.graphs
    digest = package_digest(manifest_bytes, [(g.role, g.data) for g in graphs.values()])
    return Policy(
        path=pkg,
        kind="two_phase" if "prefix" in graphs else "velocity",
        digest=digest,
        inputs=inputs,
        action=action,
        graphs=graphs,
        time=flow.time,
        solver=flow.solver,
        x_name=flow.x,
        t_name=flow.t,
        v_name=flow.v,
        t_shape=checked.t_shape,
        context=checked.context,
        name=str(raw.get("name", root.name)),
        rtc=rtc,
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
