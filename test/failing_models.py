# SPDX-License-Identifier: Apache-2.0
"""ONNX graphs built here (onnx.helper) that fail on a chosen input and are finite otherwise:
what the INFERENCE_FAILED tests serve. observation[0] == NAN_AT gives a NaN velocity (a Where on
that row only, so a batch's other rows stay finite); observation[1] == RAISE_AT makes a Gather
index out of range, so the model call raises (for every row of that call)."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

NAN_AT = 42.0
RAISE_AT = 5.0
OBS_DIM, HORIZON, DIM = 4, 8, 2
OPSET = 17


def _const(name: str, value) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
        np.asarray(value), name))


def _poison(obs: str, out: str, prefix: str = "p") -> list[onnx.NodeProto]:
    """Nodes: out float [batch, 1] = NaN where obs[:, 0] == NAN_AT, else 0; a Gather on
    obs[:, 1] that raises where it is RAISE_AT (its value, times 0, is added too)."""
    n = prefix
    return [
        _const(f"{n}_starts0", np.array([0], np.int64)),
        _const(f"{n}_ends1", np.array([1], np.int64)),
        _const(f"{n}_ends2", np.array([2], np.int64)),
        _const(f"{n}_axis", np.array([1], np.int64)),
        helper.make_node("Slice", [obs, f"{n}_starts0", f"{n}_ends1", f"{n}_axis"], [f"{n}_c0"]),
        helper.make_node("Slice", [obs, f"{n}_ends1", f"{n}_ends2", f"{n}_axis"], [f"{n}_c1"]),
        _const(f"{n}_at", np.array(NAN_AT, np.float32)),
        helper.make_node("Equal", [f"{n}_c0", f"{n}_at"], [f"{n}_eq"]),
        _const(f"{n}_nan", np.array(np.nan, np.float32)),
        _const(f"{n}_zero", np.array(0.0, np.float32)),
        helper.make_node("Where", [f"{n}_eq", f"{n}_nan", f"{n}_zero"], [f"{n}_bad"]),
        # values 0 and 1 of observation[1] index a 2-element table; RAISE_AT is out of range
        _const(f"{n}_table", np.array([0.0, 0.0], np.float32)),
        helper.make_node("Cast", [f"{n}_c1"], [f"{n}_idx"], to=TensorProto.INT64),
        helper.make_node("Gather", [f"{n}_table", f"{n}_idx"], [f"{n}_g"]),  # [batch, 1]
        helper.make_node("Mul", [f"{n}_g", f"{n}_zero"], [f"{n}_g0"]),
        helper.make_node("Add", [f"{n}_bad", f"{n}_g0"], [out]),
    ]


def _velocity(x: str, t: str, poison: str) -> list[onnx.NodeProto]:
    """velocity = -x + t + poison (broadcast over the rows): a plain flow toward t."""
    return [
        _const("v_axes", np.array([2], np.int64)),
        helper.make_node("Unsqueeze", [poison, "v_axes"], ["v_p3"]),  # [batch, 1, 1]
        helper.make_node("Unsqueeze", [t, "v_axes"], ["v_t3"]),
        helper.make_node("Neg", [x], ["v_negx"]),
        helper.make_node("Add", ["v_negx", "v_t3"], ["v_a"]),
        helper.make_node("Add", ["v_a", "v_p3"], ["velocity"]),
    ]


def _model(nodes, inputs, outputs) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "failing", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _tensor(name: str, *dims) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", *dims])


def velocity_graph() -> onnx.ModelProto:
    """(x, t, observation) -> velocity: a single .onnx flow policy."""
    return _model(_poison("observation", "poison") + _velocity("x", "t", "poison"),
                  [_tensor("x", HORIZON, DIM), _tensor("t", 1), _tensor("observation", OBS_DIM)],
                  [_tensor("velocity", HORIZON, DIM)])


def write_single_file(folder: pathlib.Path) -> str:
    path = folder / "failing.onnx"
    onnx.save(velocity_graph(), str(path))
    return str(path)


_MANIFEST = """format: flowedge_policy
version: 1
name: failing_{kind}
description: 'test policy: NaN at observation[0] {nan}, raises at observation[1] {raise_}'
inputs:
- name: observation
  dtype: float32
  shape: [{obs}]
action: {{dim: {dim}, horizon: {horizon}}}
graphs: {graphs}
flow: {{time: 0_to_1, solver: euler, x: x, t: t, velocity: velocity}}
"""


def write_package(folder: pathlib.Path, two_phase: bool) -> str:
    """A policy package: one velocity graph, or a prefix (observation -> ctx, where the poison
    enters) and a step (x, t, ctx -> velocity, through which it reaches the actions)."""
    pkg = folder / ("failing_two_phase" if two_phase else "failing_package")
    pkg.mkdir()
    if two_phase:
        prefix = _model(_poison("observation", "poison") + [
            helper.make_node("Add", ["observation", "poison"], ["ctx"])],
            [_tensor("observation", OBS_DIM)], [_tensor("ctx", OBS_DIM)])
        step = _model([
            _const("s_axes", np.array([1], np.int64)),
            helper.make_node("ReduceSum", ["ctx", "s_axes"], ["s_sum"], keepdims=1),
            _const("s_zero", np.array(0.0, np.float32)),
            helper.make_node("Mul", ["s_sum", "s_zero"], ["poison"]),  # NaN stays NaN
        ] + _velocity("x", "t", "poison"),
            [_tensor("x", HORIZON, DIM), _tensor("t", 1), _tensor("ctx", OBS_DIM)],
            [_tensor("velocity", HORIZON, DIM)])
        onnx.save(prefix, str(pkg / "prefix.onnx"))
        onnx.save(step, str(pkg / "step.onnx"))
        graphs = "{prefix: prefix.onnx, step: step.onnx}"
    else:
        onnx.save(velocity_graph(), str(pkg / "policy.onnx"))
        graphs = "{velocity: policy.onnx}"
    (pkg / "policy.yaml").write_text(_MANIFEST.format(
        kind="two_phase" if two_phase else "package", nan=NAN_AT, raise_=RAISE_AT, obs=OBS_DIM,
        dim=DIM, horizon=HORIZON, graphs=graphs))
    return str(pkg)
