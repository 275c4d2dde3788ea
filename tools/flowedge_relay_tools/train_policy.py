#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Train the shipped flow-matching policies in pure numpy and export them to ONNX.

Why a script and not downloaded weights: the relay must be runnable and testable offline, and
the shipped models must be reproducible. Everything is seeded, so a rerun on the same machine
(same numpy/BLAS build) writes byte-identical .onnx and .json files.

Flow matching (rectified flow / conditional OT path): x0 ~ N(0, I), x1 = a demonstration chunk,
x_t = (1 - t) x0 + t x1, and the network v(x_t, t, observation) regresses the target x1 - x0.
The task is `flowedge_relay_tools.models.detour_task` (two valid modes around an obstacle).

Two architectures, one trainer (SiLU MLP on [x, time features, observation]):
  policy_small  3 hidden layers of 256: the relay's default, tens of microseconds per NFE.
  policy_bench  one 768-wide layer, then one 768x768 residual block applied 8 times with shared
                weights: about 1 ms per NFE on one core while the file stays ~2.5 MB.

A third, policy_vision, is a two-phase policy package (flowedge_relay/policy/, docs/design.md
section 10): inputs `image` (uint8 [2, 32, 32], detour_task.render_observation: goal spot and
obstacle drawn around the robot) and `state` (float32 [2], the robot's position); a prefix graph
(image -> per-channel spatial keypoints -> SiLU layer: context tensors `keypoints` [4] and
`scene` [64]) and a step graph (the action expert: v(x, t, scene, keypoints, state), 2 SiLU
layers of 256). Actions are trained normalized (mean/std of the demonstrations) and padded from
2 to 4 columns (`output_dim: 2`), so de-normalization and truncation are exercised for real.

A fourth, policy_rtc, is a package for training-time real-time chunking (flowedge_relay/rtc.py,
docs/policy-packages.md): one velocity graph whose time input `t` is per action row
[batch, 8], trained on the closed-loop detour task (detour_task.closed_loop_*) with the delay d
drawn uniformly in 0..4 per sample: rows < d are the clean demonstration at time 1 and carry no
loss. The graph rotates its vectors into the frame of the obstacle -> goal line and the velocity
back (the task does not depend on the heading); the exported weights are an EMA.

Cost: about 1.5 min (small, 6000 Adam steps) + 2.5 min (bench, 1200 steps) on 2 idle cores;
policy_vision 4000 steps: 8.5 min on 2 cores shared with other jobs (less when idle);
policy_rtc 16000 steps: about 3 min idle, 6.5 min on 2 shared cores.
Each model's JSON sidecar records the task, dims, recipe (seed included), the final training
loss and a task evaluation of the exported file run through `flowedge_relay.model` (policy_rtc:
the closed-loop rollouts of tools/flowedge_relay_tools/rtc_rollout.py at d = 3).

`--reexport` (policy_rtc) trains nothing: it exports the shipped graph's weights again with
this file's export code (a graph change that keeps the weights) and updates the digest.

Usage: python -m flowedge_relay_tools.train_policy [--model small|bench|vision|rtc|all]
       [--out-dir DIR] [--steps N] [--reexport]
By default policy_bench goes to flowedge_relay_tools/models/ (only the benchmarks use it) and the
others to flowedge_relay/models/ (the runtime ships them)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import flowedge_relay.models
import flowedge_relay_tools.models
from flowedge_relay_tools.models import detour_task as task

#: where each model goes by default: the runtime's shipped policies, and the benchmarks' own
RUNTIME_MODELS = Path(flowedge_relay.models.__file__).resolve().parent
TOOLS_MODELS = Path(flowedge_relay_tools.models.__file__).resolve().parent

ACTION_LEN = task.ACTION_HORIZON * task.ACTION_DIM
TIME_FREQS = (np.pi * np.array([1.0, 2.0, 4.0, 8.0])).astype(np.float32)
IN_DIM = ACTION_LEN + 1 + 2 * TIME_FREQS.size + task.OBS_DIM
OPSET = 17


@dataclass(frozen=True)
class Recipe:
    """Architecture and training schedule of one shipped model."""

    name: str
    width: int
    dense_layers: int  # hidden dense layers after the input layer
    shared_repeats: int  # applications of the one weight-shared residual block
    steps: int
    batch: int
    lr: float
    seed: int


RECIPES = {
    "small": Recipe("policy_small", 256, 2, 0, steps=6000, batch=512, lr=2e-3, seed=20240611),
    "bench": Recipe("policy_bench", 768, 0, 8, steps=1200, batch=256, lr=2e-3, seed=20240612),
}


# ---------------------------------------------------------------- network (numpy, float32)


ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.999, 1e-8


def _progress(r, step: int, loss: float, t0: float) -> None:
    """One progress line, rewritten in place on stderr (both trainers)."""
    print(f"\r{r.name}: step {step}/{r.steps} loss {loss:.4f} ({time.monotonic() - t0:.0f} s)",
          end="", file=sys.stderr, flush=True)


def _adam_step(p: dict, grads: dict, m: dict, v2: dict, step: int, r) -> None:
    """One Adam step in place, both trainers': the gradient clipped to norm 1, the rate warmed up
    over the first tenth (at most 200 steps) and decayed on a cosine to 5%."""
    b1, b2, eps, warm = ADAM_B1, ADAM_B2, ADAM_EPS, min(200, r.steps // 10)
    norm = np.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
    clip = min(1.0, 1.0 / max(norm, 1e-12))
    lr = r.lr * min(1.0, step / warm) * (0.05 + 0.95 * 0.5 * (1 + np.cos(np.pi * step / r.steps)))
    for k in p:
        g = grads[k] * clip
        m[k] = b1 * m[k] + (1 - b1) * g
        v2[k] = b2 * v2[k] + (1 - b2) * g * g
        mhat = m[k] / (1 - b1**step)
        vhat = v2[k] / (1 - b2**step)
        p[k] = (p[k] - lr * mhat / (np.sqrt(vhat) + eps)).astype(np.float32)


def features(x: np.ndarray, t: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """[x, t, sin(f t), cos(f t), observation]: the same concat the ONNX graph builds."""
    ft = t * TIME_FREQS[None, :]
    return np.concatenate([x, t, np.sin(ft), np.cos(ft), obs], axis=1).astype(np.float32)


def init_params(
    r: Recipe, rng: np.random.Generator, in_dim: int = IN_DIM
) -> dict[str, np.ndarray]:
    def dense(fan_in: int, fan_out: int, scale: float = 1.0) -> np.ndarray:
        std = scale / np.sqrt(fan_in)
        return (rng.standard_normal((fan_in, fan_out)) * std).astype(np.float32)

    p = {"in.W": dense(in_dim, r.width), "in.b": np.zeros(r.width, np.float32)}
    for i in range(r.dense_layers):
        p[f"h{i}.W"] = dense(r.width, r.width)
        p[f"h{i}.b"] = np.zeros(r.width, np.float32)
    if r.shared_repeats:
        p["shared.W"] = dense(r.width, r.width, 1.0 / np.sqrt(r.shared_repeats))
        p["shared.b"] = np.zeros(r.width, np.float32)
    p["out.W"] = dense(r.width, ACTION_LEN, 0.1)
    p["out.b"] = np.zeros(ACTION_LEN, np.float32)
    return p


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return (0.5 * (1.0 + np.tanh(0.5 * z))).astype(np.float32)


def forward(r: Recipe, p: dict[str, np.ndarray], inp: np.ndarray):
    """Output and the cache backward() needs: (layer, input, pre-activation, sigmoid)."""
    cache = []
    h = inp
    names = ["in"] + [f"h{i}" for i in range(r.dense_layers)]
    for name in names:
        z = h @ p[f"{name}.W"] + p[f"{name}.b"]
        s = _sigmoid(z)
        cache.append((name, h, z, s))
        h = z * s
    for _ in range(r.shared_repeats):
        z = h @ p["shared.W"] + p["shared.b"]
        s = _sigmoid(z)
        cache.append(("shared", h, z, s))
        h = h + z * s
    out = h @ p["out.W"] + p["out.b"]
    return out, cache, h


def backward(p, cache, h_last, g_out):
    grads = {k: np.zeros_like(v) for k, v in p.items()}
    grads["out.W"] = h_last.T @ g_out
    grads["out.b"] = g_out.sum(axis=0)
    g_h = g_out @ p["out.W"].T
    for name, h_in, z, s in reversed(cache):
        dz = g_h * (s * (1.0 + z * (1.0 - s)))
        grads[f"{name}.W"] += h_in.T @ dz
        grads[f"{name}.b"] += dz.sum(axis=0)
        if name == "in":
            break
        back = dz @ p[f"{name}.W"].T
        g_h = g_h + back if name == "shared" else back
    return grads


def flow_batch(rng: np.random.Generator, n: int):
    """One flow-matching batch: network input and regression target."""
    obs = task.sample_observations(rng, n)
    x1 = task.demonstrations(rng, obs)
    x0 = rng.standard_normal(x1.shape, dtype=np.float32)
    t = rng.uniform(0.0, 1.0, size=(n, 1)).astype(np.float32)
    xt = (1.0 - t) * x0 + t * x1
    return features(xt, t, obs), x1 - x0


def train(
    r: Recipe, log_every: int = 250, batch_fn=None, in_dim: int = IN_DIM, ema: float = 0.0
) -> tuple[dict[str, np.ndarray], float]:
    """Adam with warm-up and cosine decay; returns the params and the mean loss of the last 10%.

    batch_fn(rng, n) -> (input, target, mask) replaces flow_batch; the loss then covers only the
    elements where mask is 1 (policy_rtc: the rows that are not frozen). ema > 0 returns the
    exponential moving average of the params with that decay instead of the last ones (a
    smoother velocity field: samples land nearer the demonstrations)."""
    rng = np.random.default_rng(r.seed)
    p = init_params(r, rng, in_dim)
    avg = {k: v.copy() for k, v in p.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v2 = {k: np.zeros_like(v) for k, v in p.items()}
    tail: list[float] = []
    t0 = time.monotonic()
    for step in range(1, r.steps + 1):
        if batch_fn is None:
            inp, target = flow_batch(rng, r.batch)
            out, cache, h_last = forward(r, p, inp)
            err = out - target
            loss = float(np.mean(err * err))
            grads = backward(p, cache, h_last, (2.0 / err.size) * err)
        else:
            inp, target, mask = batch_fn(rng, r.batch)
            out, cache, h_last = forward(r, p, inp)
            err = (out - target) * mask
            count = float(mask.sum())
            loss = float(np.sum(err * err)) / count
            grads = backward(p, cache, h_last, (2.0 / count) * err)
        _adam_step(p, grads, m, v2, step, r)
        if ema:
            for k in p:
                avg[k] = (ema * avg[k] + (1.0 - ema) * p[k]).astype(np.float32)
        if step > r.steps * 0.9:
            tail.append(loss)
        if step % log_every == 0 or step == r.steps:
            _progress(r, step, loss, t0)
    print(file=sys.stderr)
    return (avg if ema else p), float(np.mean(tail))


# ---------------------------------------------------------------- ONNX export


def export_onnx(r: Recipe, p: dict[str, np.ndarray], per_row_time: bool = False) -> bytes:
    """The same network as forward(), as an opset-17 graph with a dynamic `batch` dimension.

    per_row_time (policy_rtc): t is [batch, horizon], one flow time per action row, its features
    as rtc_features() builds them, and the observation is the closed-loop one."""
    nodes: list[onnx.NodeProto] = []
    inits = [numpy_helper.from_array(v, k) for k, v in p.items()]
    freqs_shape = (1, 1, -1) if per_row_time else (1, -1)
    inits.append(numpy_helper.from_array(TIME_FREQS.reshape(freqs_shape), "time_freqs"))

    def node(op: str, ins: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def silu_layer(h: str, layer: str, tag: str) -> str:
        z = node("Add", [node("MatMul", [h, f"{layer}.W"], f"{tag}/mm"), f"{layer}.b"], f"{tag}/z")
        return node("Mul", [z, node("Sigmoid", [z], f"{tag}/sig")], f"{tag}/act")

    x_flat = node("Flatten", ["x"], "x_flat", axis=1)
    if per_row_time:  # [batch, H] -> [batch, H, 1] x [1, 1, F] -> sin/cos flattened row-major
        inits.append(numpy_helper.from_array(np.array([2], np.int64), "row_axis"))
        ft = node("Mul", [node("Unsqueeze", ["t", "row_axis"], "t_rows"), "time_freqs"], "t_freq")
        sin = node("Flatten", [node("Sin", [ft], "t_sin3")], "t_sin", axis=1)
        cos = node("Flatten", [node("Cos", [ft], "t_cos3")], "t_cos", axis=1)
        for name, value in [("relative", RELATIVE), ("axis", AXIS), ("to_frame", TO_FRAME),
                            ("from_frame", FROM_FRAME), ("sum_axis", np.array([1], np.int64)),
                            ("pairs", np.array([-1, 2, 2], np.int64)),
                            ("rows", np.array([-1, task.ACTION_HORIZON, 2], np.int64)),
                            ("axis_norm_floor", np.array(AXIS_NORM_FLOOR, np.float32))]:
            inits.append(numpy_helper.from_array(value, name))
        axis = node("MatMul", ["observation", "axis"], "axis_vec")
        norm = node("Sqrt", [node("ReduceSum", [node("Mul", [axis, axis], "axis_sq"), "sum_axis"],
                                  "axis_ss", keepdims=1)], "axis_norm")
        # a goal on the obstacle has no axis: the floor keeps the frame finite (zero) there and
        # leaves every norm >= AXIS_NORM_FLOOR, so every other velocity, bit for bit as before
        norm = node("Max", [norm, "axis_norm_floor"], "axis_norm_safe")
        unit = node("Div", [axis, norm], "axis_unit")
        to_frame = node("Reshape", [node("MatMul", [unit, "to_frame"], "to_frame4"), "pairs"],
                        "to_frame_m")
        from_frame = node("Reshape", [node("MatMul", [unit, "from_frame"], "from_frame4"),
                                      "pairs"], "from_frame_m")
        x_flat = node("Flatten", [node("MatMul", ["x", to_frame], "x_frame")], "x_frame_flat",
                      axis=1)
        rel = node("Reshape", [node("MatMul", ["observation", "relative"], "rel"), "pairs"],
                   "rel_pairs")
        obs = node("Flatten", [node("MatMul", [rel, to_frame], "rel_frame")], "rel_flat", axis=1)
    else:
        ft = node("Mul", ["t", "time_freqs"], "t_freq")
        sin, cos = node("Sin", [ft], "t_sin"), node("Cos", [ft], "t_cos")
        obs = "observation"
    h = node("Concat", [x_flat, "t", sin, cos, obs], "features", axis=1)
    h = silu_layer(h, "in", "in")
    for i in range(r.dense_layers):
        h = silu_layer(h, f"h{i}", f"h{i}")
    for k in range(r.shared_repeats):
        h = node("Add", [h, silu_layer(h, "shared", f"shared{k}")], f"shared{k}/res")
    out = node("Add", [node("MatMul", [h, "out.W"], "out/mm"), "out.b"], "out/z")
    if per_row_time:  # the velocity back from the frame to the world
        rows = node("Reshape", [out, "rows"], "out_rows")
        node("MatMul", [rows, from_frame], "velocity")
    else:
        node("Reshape", [out, node("Shape", ["x"], "x_shape")], "velocity")

    hd = [task.ACTION_HORIZON, task.ACTION_DIM]
    obs_dim = task.CL_OBS_DIM if per_row_time else task.OBS_DIM
    graph = helper.make_graph(
        nodes,
        r.name,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", *hd]),
            helper.make_tensor_value_info(
                "t", TensorProto.FLOAT, ["batch", task.ACTION_HORIZON if per_row_time else 1]
            ),
            helper.make_tensor_value_info("observation", TensorProto.FLOAT, ["batch", obs_dim]),
        ],
        [helper.make_tensor_value_info("velocity", TensorProto.FLOAT, ["batch", *hd])],
        inits,
    )
    if per_row_time:
        doc = "Velocity field v(x, t per action row, observation). " + task.CLOSED_LOOP_DESCRIPTION
    else:
        doc = f"Flow-matching velocity field v(x, t, observation). {task.DESCRIPTION}"
    return _model(graph, doc)


# ---------------------------------------------------------------- checks and main


def evaluate(path: Path, p: dict[str, np.ndarray], r: Recipe, nfe: int = 10, n: int = 400) -> dict:
    """Exported graph == numpy network, and task scores of actions sampled through the relay."""
    from flowedge_relay.model import FlowSampler, load_model, make_session

    info = load_model(path)
    sess = make_session(info, 1)
    rng = np.random.default_rng(7)
    inp_x = rng.standard_normal((64, ACTION_LEN), dtype=np.float32)
    inp_t = rng.uniform(0, 1, (64, 1)).astype(np.float32)
    obs = task.sample_observations(rng, 64)
    (onnx_v,) = sess.run(
        ["velocity"],
        {
            "x": inp_x.reshape(64, info.action_horizon, info.action_dim),
            "t": inp_t,
            "observation": obs,
        },
    )
    np_v, _, _ = forward(r, p, features(inp_x, inp_t, obs))
    max_diff = float(np.abs(onnx_v.reshape(64, -1) - np_v).max())
    assert max_diff < 1e-3, f"ONNX export differs from the numpy network by {max_diff}"
    sampler = FlowSampler(sess, info, "euler")
    obs = task.sample_observations(np.random.default_rng(11), n)
    actions = np.stack([sampler.sample(o, 1000 + i, nfe) for i, o in enumerate(obs)])
    scores = task.score(obs, actions).summary()
    return {"eval_nfe": nfe, "eval_samples": n, **{k: round(v, 4) for k, v in scores.items()}}


def build(r: Recipe, out_dir: Path) -> dict:
    params, final_loss = train(r)
    data = export_onnx(r, params)
    onnx_path = out_dir / f"{r.name}.onnx"
    hd = [task.ACTION_HORIZON, task.ACTION_DIM]
    onnx_path.write_bytes(data)
    sidecar = {
        "model": r.name,
        "file": onnx_path.name,
        "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
        "task": task.DESCRIPTION,
        "obs_dim": task.OBS_DIM,
        "action_horizon": task.ACTION_HORIZON,
        "action_dim": task.ACTION_DIM,
        "inputs": {"x": ["batch", *hd], "t": ["batch", 1], "observation": ["batch", task.OBS_DIM]},
        "output": {"velocity": ["batch", *hd]},
        "objective": "rectified flow: x_t = (1-t) x0 + t x1, x0 ~ N(0, I), target x1 - x0",
        "recipe": asdict(r),
        "final_loss": round(final_loss, 6),
        "evaluation": evaluate(onnx_path, params, r),
    }
    (out_dir / f"{r.name}.json").write_text(json.dumps(sidecar, indent=2) + "\n")
    print(f"{r.name}: {len(data)} bytes {sidecar['digest']}", file=sys.stderr)
    print(f"  final loss {final_loss:.4f}; {sidecar['evaluation']}", file=sys.stderr)
    return sidecar


# ---------------------------------------------------------------- policy_vision (two-phase)


@dataclass(frozen=True)
class VisionRecipe:
    """Architecture and schedule of the two-phase vision package."""

    name: str
    scene_width: int  # prefix: keypoints -> SiLU layer -> `scene` context
    width: int  # step: SiLU MLP width
    dense_layers: int  # step: hidden layers after the input layer
    model_action_dim: int  # padded action columns the graph integrates
    pool: int  # rendered training observations
    steps: int
    batch: int
    lr: float
    seed: int


VISION = VisionRecipe(
    "policy_vision", 64, 256, 1, 4, pool=20000, steps=4000, batch=256, lr=2e-3, seed=20240613
)
STATE_DIM = 2  # robot position [current_x, current_y]
KEYPOINTS = 2 * task.IMAGE_CHANNELS


def vision_inputs(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What a producer sends for observations: (uint8 image [n, 2, 32, 32], float32 state)."""
    return task.render_observation(obs), np.ascontiguousarray(obs[:, :2], dtype=np.float32)


def keypoints(image_norm: np.ndarray) -> np.ndarray:
    """Per-channel intensity centroid in world units, [n, 4]: the prefix graph's first stage.

    image_norm is the min/max-normalized image in [-1, 1]; weights are image_norm + 1.
    """
    gx, gy = task.image_grid()
    w = image_norm + np.float32(1.0)
    total = w.sum(axis=(2, 3)) + np.float32(1e-6)
    kx = (w * gx).sum(axis=(2, 3)) / total
    ky = (w * gy).sum(axis=(2, 3)) / total
    return np.stack([kx, ky], axis=2).reshape(len(w), -1).astype(np.float32)


def action_stats(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-column mean/std of demonstration waypoints (rounded: the manifest holds these)."""
    rng = np.random.default_rng(seed)
    demos = task.demonstrations(rng, task.sample_observations(rng, 20000))
    cols = demos.reshape(-1, task.ACTION_DIM)
    cols = cols.astype(np.float64)
    return np.round(cols.mean(axis=0), 6), np.round(cols.std(axis=0), 6)


STATE_MEAN, STATE_STD = np.zeros(STATE_DIM), np.full(STATE_DIM, 0.57735)  # U[-1, 1]


def vision_init(r: VisionRecipe, rng: np.random.Generator) -> dict[str, np.ndarray]:
    def dense(fan_in: int, fan_out: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((fan_in, fan_out)) * scale / np.sqrt(fan_in)).astype(np.float32)

    x_len = task.ACTION_HORIZON * r.model_action_dim
    in_dim = x_len + 1 + 2 * TIME_FREQS.size + r.scene_width + KEYPOINTS + STATE_DIM
    p = {
        "enc.W": dense(KEYPOINTS, r.scene_width),
        "enc.b": np.zeros(r.scene_width, np.float32),
        "in.W": dense(in_dim, r.width),
        "in.b": np.zeros(r.width, np.float32),
    }
    for i in range(r.dense_layers):
        p[f"h{i}.W"] = dense(r.width, r.width)
        p[f"h{i}.b"] = np.zeros(r.width, np.float32)
    p["out.W"] = dense(r.width, x_len, 0.1)
    p["out.b"] = np.zeros(x_len, np.float32)
    return p


def vision_prefix(p: dict[str, np.ndarray], kp: np.ndarray):
    z = kp @ p["enc.W"] + p["enc.b"]
    s = _sigmoid(z)
    return z * s, (z, s)


def vision_step(r: VisionRecipe, p, x, t, scene, kp, state_n):
    """The step network as the graph builds it; returns (out, cache, last hidden)."""
    ft = t * TIME_FREQS[None, :]
    inp = np.concatenate([x, t, np.sin(ft), np.cos(ft), scene, kp, state_n], axis=1)
    cache, h = [], inp.astype(np.float32)
    for name in ["in"] + [f"h{i}" for i in range(r.dense_layers)]:
        z = h @ p[f"{name}.W"] + p[f"{name}.b"]
        s = _sigmoid(z)
        cache.append((name, h, z, s))
        h = z * s
    return h @ p["out.W"] + p["out.b"], cache, h


class VisionData:
    """A fixed pool of rendered observations (rendering per batch would dominate the cost);
    demonstrations, noise and times stay fresh every batch."""

    def __init__(self, rng: np.random.Generator, n: int) -> None:
        self.obs = task.sample_observations(rng, n)
        image, state = vision_inputs(self.obs)
        self.kp = keypoints(image.astype(np.float32) * np.float32(2 / 255) - np.float32(1))
        self.state_n = ((state - STATE_MEAN) / STATE_STD).astype(np.float32)


def vision_batch(r: VisionRecipe, rng: np.random.Generator, data: VisionData, a_mean, a_std):
    n = r.batch
    idx = rng.integers(0, len(data.obs), n)
    obs, kp, state_n = data.obs[idx], data.kp[idx], data.state_n[idx]
    x1 = task.demonstrations(rng, obs).reshape(n, task.ACTION_HORIZON, task.ACTION_DIM)
    x1n = np.zeros((n, task.ACTION_HORIZON, r.model_action_dim), np.float32)
    x1n[:, :, : task.ACTION_DIM] = (x1 - a_mean) / a_std
    x1n = x1n.reshape(n, -1)
    x0 = rng.standard_normal(x1n.shape, dtype=np.float32)
    t = rng.uniform(0.0, 1.0, size=(n, 1)).astype(np.float32)
    return (1.0 - t) * x0 + t * x1n, t, kp, state_n, x1n - x0


def train_vision(r: VisionRecipe, a_mean, a_std, log_every: int = 250):
    """Adam (as train()) on the prefix and step networks jointly, end to end."""
    rng = np.random.default_rng(r.seed)
    p = vision_init(r, rng)
    data = VisionData(rng, r.pool)
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v2 = {k: np.zeros_like(v) for k, v in p.items()}
    x_len = task.ACTION_HORIZON * r.model_action_dim
    scene_at = x_len + 1 + 2 * TIME_FREQS.size
    tail: list[float] = []
    t0 = time.monotonic()
    for step in range(1, r.steps + 1):
        xt, t, kp, state_n, target = vision_batch(r, rng, data, a_mean, a_std)
        scene, (ze, se) = vision_prefix(p, kp)
        out, cache, h_last = vision_step(r, p, xt, t, scene, kp, state_n)
        err = out - target
        loss = float(np.mean(err * err))
        g_out = (2.0 / err.size) * err
        grads = {k: np.zeros_like(v) for k, v in p.items()}
        grads["out.W"] = h_last.T @ g_out
        grads["out.b"] = g_out.sum(axis=0)
        g_h = g_out @ p["out.W"].T
        for name, h_in, z, s in reversed(cache):
            dz = g_h * (s * (1.0 + z * (1.0 - s)))
            grads[f"{name}.W"] = h_in.T @ dz
            grads[f"{name}.b"] = dz.sum(axis=0)
            g_h = dz @ p[f"{name}.W"].T
        g_scene = g_h[:, scene_at : scene_at + r.scene_width]
        dze = g_scene * (se * (1.0 + ze * (1.0 - se)))
        grads["enc.W"] = kp.T @ dze
        grads["enc.b"] = dze.sum(axis=0)
        _adam_step(p, grads, m, v2, step, r)
        if step > r.steps * 0.9:
            tail.append(loss)
        if step % log_every == 0 or step == r.steps:
            _progress(r, step, loss, t0)
    print(file=sys.stderr)
    return p, float(np.mean(tail))


def _model(graph: onnx.GraphProto, doc: str) -> bytes:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="flowedge_relay/tools/train_policy.py",
        producer_version="1",
        doc_string=doc,
    )
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


def export_vision(r: VisionRecipe, p: dict[str, np.ndarray]) -> tuple[bytes, bytes]:
    """(prefix.onnx, step.onnx): the same networks as vision_prefix / vision_step."""
    gx, gy = task.image_grid()
    size, ch = task.IMAGE_SIZE, task.IMAGE_CHANNELS
    nodes: list[onnx.NodeProto] = []

    def node(op: str, ins: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    prefix_inits = [
        numpy_helper.from_array(gx.reshape(1, 1, size, size), "grid_x"),
        numpy_helper.from_array(gy.reshape(1, 1, size, size), "grid_y"),
        numpy_helper.from_array(np.array([2, 3], np.int64), "hw_axes"),
        numpy_helper.from_array(np.array([1.0], np.float32), "one"),
        numpy_helper.from_array(np.array([1e-6], np.float32), "eps"),
        numpy_helper.from_array(np.array([0, KEYPOINTS], np.int64), "kp_shape"),
        numpy_helper.from_array(p["enc.W"], "enc.W"),
        numpy_helper.from_array(p["enc.b"], "enc.b"),
    ]
    w = node("Add", ["image", "one"], "weights")
    total = node("Add", [node("ReduceSum", [w, "hw_axes"], "w_sum", keepdims=0), "eps"], "w_tot")
    kx = node(
        "Div",
        [node("ReduceSum", [node("Mul", [w, "grid_x"], "wx"), "hw_axes"], "sx", keepdims=0), total],
        "kx",
    )
    ky = node(
        "Div",
        [node("ReduceSum", [node("Mul", [w, "grid_y"], "wy"), "hw_axes"], "sy", keepdims=0), total],
        "ky",
    )
    kxy = node(
        "Concat",
        [node("Unsqueeze", [kx, "hw_axes_2"], "kx3"), node("Unsqueeze", [ky, "hw_axes_2"], "ky3")],
        "kxy",
        axis=2,
    )
    prefix_inits.append(numpy_helper.from_array(np.array([2], np.int64), "hw_axes_2"))
    node("Reshape", [kxy, "kp_shape"], "keypoints", allowzero=0)
    z = node("Add", [node("MatMul", ["keypoints", "enc.W"], "enc/mm"), "enc.b"], "enc/z")
    node("Mul", [z, node("Sigmoid", [z], "enc/sig")], "scene")
    prefix = _model(
        helper.make_graph(
            nodes,
            f"{r.name}_prefix",
            [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", ch, size, size])],
            [
                helper.make_tensor_value_info("keypoints", TensorProto.FLOAT, ["batch", KEYPOINTS]),
                helper.make_tensor_value_info("scene", TensorProto.FLOAT, ["batch", r.scene_width]),
            ],
            prefix_inits,
        ),
        "Prefix: image -> per-channel keypoints and a scene embedding (context tensors). "
        + task.DESCRIPTION,
    )

    nodes = []
    hd = [task.ACTION_HORIZON, r.model_action_dim]
    step_inits = [numpy_helper.from_array(v, k) for k, v in p.items() if not k.startswith("enc")]
    step_inits.append(numpy_helper.from_array(TIME_FREQS.reshape(1, -1), "time_freqs"))
    x_flat = node("Flatten", ["x"], "x_flat", axis=1)
    ft = node("Mul", ["t", "time_freqs"], "t_freq")
    sin, cos = node("Sin", [ft], "t_sin"), node("Cos", [ft], "t_cos")
    h = node("Concat", [x_flat, "t", sin, cos, "scene", "keypoints", "state"], "features", axis=1)
    for layer in ["in"] + [f"h{i}" for i in range(r.dense_layers)]:
        zz = node(
            "Add", [node("MatMul", [h, f"{layer}.W"], f"{layer}/mm"), f"{layer}.b"], f"{layer}/z"
        )
        h = node("Mul", [zz, node("Sigmoid", [zz], f"{layer}/sig")], f"{layer}/act")
    out = node("Add", [node("MatMul", [h, "out.W"], "out/mm"), "out.b"], "out/z")
    node("Reshape", [out, node("Shape", ["x"], "x_shape")], "velocity")
    step = _model(
        helper.make_graph(
            nodes,
            f"{r.name}_step",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", *hd]),
                helper.make_tensor_value_info("t", TensorProto.FLOAT, ["batch", 1]),
                helper.make_tensor_value_info("scene", TensorProto.FLOAT, ["batch", r.scene_width]),
                helper.make_tensor_value_info("keypoints", TensorProto.FLOAT, ["batch", KEYPOINTS]),
                helper.make_tensor_value_info("state", TensorProto.FLOAT, ["batch", STATE_DIM]),
            ],
            [helper.make_tensor_value_info("velocity", TensorProto.FLOAT, ["batch", *hd])],
            step_inits,
        ),
        "Step (action expert): velocity v(x, t, scene, keypoints, state). " + task.DESCRIPTION,
    )
    return prefix, step


def vision_manifest(r: VisionRecipe, a_mean: np.ndarray, a_std: np.ndarray) -> bytes:
    """policy.yaml of the package (docs/design.md §10), written deterministically."""
    import yaml

    size, ch = task.IMAGE_SIZE, task.IMAGE_CHANNELS
    doc = {
        "format": "flowedge_policy",
        "version": 1,
        "name": r.name,
        "description": (
            "Detour task from a robot-centred top-down image (channel 0 goal spot, channel 1 "
            "obstacle; detour_task.render_observation) and the robot position. Actions: "
            f"{task.ACTION_HORIZON} waypoints (x, y) relative to the robot."
        ),
        "inputs": [
            {
                "name": "image",
                "dtype": "uint8",
                "shape": [ch, size, size],
                "normalization": {"min": 0, "max": 255},
            },
            {
                "name": "state",
                "dtype": "float32",
                "shape": [STATE_DIM],
                "normalization": {
                    "mean": STATE_MEAN.tolist(),
                    "std": STATE_STD.tolist(),
                },
            },
        ],
        "action": {
            "dim": r.model_action_dim,
            "horizon": task.ACTION_HORIZON,
            "output_dim": task.ACTION_DIM,
            "normalization": {"mean": a_mean.tolist(), "std": a_std.tolist()},
        },
        "graphs": {"prefix": "prefix.onnx", "step": "step.onnx"},
        "flow": {"time": "0_to_1", "solver": "euler", "x": "x", "t": "t", "velocity": "velocity"},
    }
    return yaml.safe_dump(doc, sort_keys=False, width=100, default_flow_style=None).encode()


def evaluate_vision(out_dir: Path, p, r: VisionRecipe, nfe: int = 10, n: int = 400) -> dict:
    """Exported graphs == numpy networks, and task scores sampled through policy.PolicySampler."""
    from flowedge_relay import policy as pol

    package = pol.load(out_dir)
    sessions = pol.make_sessions(package)
    rng = np.random.default_rng(7)
    obs = task.sample_observations(rng, 64)
    image, state = vision_inputs(obs)
    image_n = image.astype(np.float32) * np.float32(2 / 255) - np.float32(1)
    kp_onnx, scene_onnx = sessions["prefix"].run(["keypoints", "scene"], {"image": image_n})
    kp = keypoints(image_n)
    scene, _ = vision_prefix(p, kp)
    x = rng.standard_normal((64, task.ACTION_HORIZON * r.model_action_dim), dtype=np.float32)
    t = rng.uniform(0, 1, (64, 1)).astype(np.float32)
    state_n = ((state - STATE_MEAN) / STATE_STD).astype(np.float32)
    (v_onnx,) = sessions["step"].run(
        ["velocity"],
        {
            "x": x.reshape(64, task.ACTION_HORIZON, -1),
            "t": t,
            "scene": scene,
            "keypoints": kp,
            "state": state_n,
        },
    )
    v_np, _, _ = vision_step(r, p, x, t, scene, kp, state_n)
    max_diff = max(
        float(np.abs(kp_onnx - kp).max()),
        float(np.abs(scene_onnx - scene).max()),
        float(np.abs(v_onnx.reshape(64, -1) - v_np).max()),
    )
    assert max_diff < 1e-3, f"ONNX export differs from the numpy networks by {max_diff}"
    sampler = pol.PolicySampler(package, sessions)
    obs = task.sample_observations(np.random.default_rng(11), n)
    image, state = vision_inputs(obs)
    actions = np.stack(
        [sampler.sample({"image": image[i], "state": state[i]}, 1000 + i, nfe) for i in range(n)]
    )
    scores = task.score(obs, actions).summary()
    return {"eval_nfe": nfe, "eval_samples": n, **{k: round(v, 4) for k, v in scores.items()}}


def write_training_json(out_dir: Path, sidecar: dict) -> dict:
    """A package's sidecar (training.json next to its graphs), summarized on stderr."""
    (out_dir / "training.json").write_text(json.dumps(sidecar, indent=2) + "\n")
    print(f"{sidecar['model']}: {sidecar['digest']}", file=sys.stderr)
    print(f"  final loss {sidecar['final_loss']:.4f}; {sidecar['evaluation']}", file=sys.stderr)
    return sidecar


def build_vision(r: VisionRecipe, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    a_mean, a_std = action_stats(r.seed + 1)
    params, final_loss = train_vision(r, a_mean.astype(np.float32), a_std.astype(np.float32))
    prefix, step = export_vision(r, params)
    manifest = vision_manifest(r, a_mean, a_std)
    (out_dir / "prefix.onnx").write_bytes(prefix)
    (out_dir / "step.onnx").write_bytes(step)
    (out_dir / "policy.yaml").write_bytes(manifest)
    from flowedge_relay.policy import package_digest

    digest = package_digest(manifest, [("prefix", prefix), ("step", step)])
    sidecar = {
        "model": r.name,
        "digest": digest,
        "task": task.DESCRIPTION,
        "objective": "rectified flow on normalized, zero-padded actions; prefix and step "
        "trained jointly end to end",
        "recipe": asdict(r),
        "final_loss": round(final_loss, 6),
        "evaluation": evaluate_vision(out_dir, params, r),
    }
    return write_training_json(out_dir, sidecar)


# ---------------------------------------------------------------- policy_rtc (training-time RTC)

RTC = Recipe("policy_rtc", 256, 2, 0, steps=16000, batch=512, lr=2e-3, seed=20240614)
RTC_MAX_DELAY = 4  # the largest d trained, of ACTION_HORIZON rows (the manifest's rtc.max_delay)
RTC_EVAL_DELAY = 3
RTC_EMA = 0.999  # the exported weights: their moving average over about the last 1000 steps
# [current, goal, obstacle] @ RELATIVE = [goal - current, obstacle - current], @ AXIS = goal -
# obstacle: what the robot has to do depends on what is around it, not on where it is.
RELATIVE = np.array(
    [[-1, 0, -1, 0], [0, -1, 0, -1], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]],
    np.float32,
)
AXIS = np.array([[0, 0], [0, 0], [1, 0], [0, 1], [-1, 0], [0, -1]], np.float32)
# unit axis (a_x, a_y) @ TO_FRAME = [[a_x, -a_y], [a_y, a_x]] (row vectors world -> frame),
# @ FROM_FRAME = its transpose (frame -> world)
TO_FRAME = np.array([[1, 0, 0, 1], [0, -1, 1, 0]], np.float32)
FROM_FRAME = np.array([[1, 0, 0, 1], [0, 1, -1, 0]], np.float32)
# the smallest goal - obstacle norm divided by (rtc_frames, the graph's axis_norm_safe): a goal on
# the obstacle would divide by 0 and give NaN velocities
AXIS_NORM_FLOOR = np.float32(1e-6)
RTC_IN_DIM = ACTION_LEN + task.ACTION_HORIZON * (1 + 2 * TIME_FREQS.size) + RELATIVE.shape[1]


def rtc_frames(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(world -> frame, frame -> world) rotations [n, 2, 2] for row vectors: the frame has the
    obstacle -> goal line as its x axis, so the network learns the task once, not per heading
    (the graph builds the same matrices and rotates x in and the velocity out)."""
    axis = obs @ AXIS
    unit = axis / np.maximum(np.sqrt((axis * axis).sum(axis=1, keepdims=True)), AXIS_NORM_FLOOR)
    return (unit @ TO_FRAME).reshape(-1, 2, 2), (unit @ FROM_FRAME).reshape(-1, 2, 2)


def rotate_rows(v: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Each (x, y) row of v [n, k * 2] times m [n, 2, 2]."""
    return (v.reshape(len(v), -1, 2) @ m).reshape(len(v), -1).astype(np.float32)


def rtc_features(x: np.ndarray, t_rows: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """[x, t per row, sin(f t) and cos(f t) per row and frequency, goal - current, obstacle -
    current], vectors in the frame of rtc_frames: the graph's concat (export_onnx with
    per_row_time). The network's output is the velocity in that frame."""
    to_frame, _ = rtc_frames(obs)
    ft = (t_rows[:, :, None] * TIME_FREQS[None, None, :]).reshape(len(x), -1)
    rel = rotate_rows(obs @ RELATIVE, to_frame)
    x_frame = rotate_rows(x, to_frame)
    return np.concatenate([x_frame, t_rows, np.sin(ft), np.cos(ft), rel], axis=1).astype(
        np.float32
    )


def rtc_batch(rng: np.random.Generator, n: int):
    """A training-time RTC batch on closed-loop demonstrations: d uniform in 0..RTC_MAX_DELAY per
    sample; its first d rows are the clean action at time 1 (what a frozen prefix looks like to
    the graph) and carry no loss; the other rows are on the flow path at the sample's time."""
    obs, x1 = task.closed_loop_demonstrations(rng, n)
    x0 = rng.standard_normal(x1.shape, dtype=np.float32)
    t = rng.uniform(0.0, 1.0, size=(n, 1)).astype(np.float32)
    d = rng.integers(0, RTC_MAX_DELAY + 1, size=n)
    frozen = np.arange(task.ACTION_HORIZON)[None, :] < d[:, None]
    t_rows = np.where(frozen, np.float32(1.0), t).astype(np.float32)
    t_el = np.repeat(t_rows, task.ACTION_DIM, axis=1)
    xt = np.where(np.repeat(frozen, task.ACTION_DIM, axis=1), x1, (1.0 - t_el) * x0 + t_el * x1)
    mask = np.repeat(~frozen, task.ACTION_DIM, axis=1).astype(np.float32)
    target = rotate_rows(x1 - x0, rtc_frames(obs)[0])  # rotations keep each row's error
    return rtc_features(xt.astype(np.float32), t_rows, obs), target, mask


def rtc_manifest(r: Recipe) -> bytes:
    """policy.yaml of policy_rtc: one velocity graph whose time input is per row, the rtc block."""
    import yaml

    doc = {
        "format": "flowedge_policy",
        "version": 1,
        "name": r.name,
        "description": (
            "Closed-loop detour task (detour_task.closed_loop_*): observation [current, goal, "
            f"obstacle]; actions: {task.ACTION_HORIZON} rows, each action period's displacement "
            f"(dx, dy) x {task.CL_ACTION_SCALE:g}. Trained for training-time real-time chunking: "
            "t is the flow time per action row."
        ),
        "inputs": [{"name": "observation", "dtype": "float32", "shape": [task.CL_OBS_DIM]}],
        "action": {"dim": task.ACTION_DIM, "horizon": task.ACTION_HORIZON},
        "graphs": {"velocity": "policy.onnx"},
        "flow": {"time": "0_to_1", "solver": "euler", "x": "x", "t": "t", "velocity": "velocity"},
        "rtc": {"mode": "training_time", "time_input": "t", "max_delay": RTC_MAX_DELAY},
    }
    return yaml.safe_dump(doc, sort_keys=False, width=100, default_flow_style=None).encode()


def evaluate_rtc(out_dir: Path, p: dict[str, np.ndarray], r: Recipe, n: int = 300) -> dict:
    """Exported graph == numpy network, then the closed-loop rollouts of every strategy at
    d = RTC_EVAL_DELAY (flowedge_relay_tools.rtc_rollout, as the test and the bench run them)."""
    from flowedge_relay_tools import rtc_rollout as rr

    pol = rr.load_rtc_policy(out_dir)
    rng = np.random.default_rng(7)
    obs, _ = task.closed_loop_demonstrations(rng, 64)
    x = rng.standard_normal((64, ACTION_LEN), dtype=np.float32)
    t_rows = rng.uniform(0, 1, (64, task.ACTION_HORIZON)).astype(np.float32)
    t_rows[:, :2] = 1.0
    (onnx_v,) = pol.session.run(
        ["velocity"],
        {"x": x.reshape(64, task.ACTION_HORIZON, -1), "t": t_rows, "observation": obs},
    )
    np_v, _, _ = forward(r, p, rtc_features(x, t_rows, obs))
    np_v = rotate_rows(np_v, rtc_frames(obs)[1])
    max_diff = float(np.abs(onnx_v.reshape(64, -1) - np_v).max())
    assert max_diff < 1e-3, f"ONNX export differs from the numpy network by {max_diff}"
    sampler = rr.RtcSampler(pol.session, pol.time_convention)
    starts = task.closed_loop_starts(np.random.default_rng(11), n)
    rows = [
        rr.rollout(sampler, starts, s, RTC_EVAL_DELAY, pol.spec.max_delay, seed=1000).summary()
        for s in rr.STRATEGIES
    ]
    keep = ("success_rate", "collision_rate", "seam_jump_mean", "mode_flips_per_episode")
    return {
        "eval_nfe": rr.NFE,
        "episodes": n,
        "delay": RTC_EVAL_DELAY,
        "execute_rows": rr.EXECUTE_ROWS,
        **{row["strategy"]: {k: round(row[k], 4) for k in keep} for row in rows},
    }


def build_rtc(r: Recipe, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    params, final_loss = train(r, batch_fn=rtc_batch, in_dim=RTC_IN_DIM, ema=RTC_EMA)
    graph = export_onnx(r, params, per_row_time=True)
    manifest = rtc_manifest(r)
    (out_dir / "policy.onnx").write_bytes(graph)
    (out_dir / "policy.yaml").write_bytes(manifest)
    from flowedge_relay.policy import package_digest

    digest = package_digest(manifest, [("velocity", graph)])
    sidecar = {
        "model": r.name,
        "digest": digest,
        "task": task.CLOSED_LOOP_DESCRIPTION,
        "objective": "rectified flow on closed-loop demonstrations with training-time action "
        f"conditioning: d uniform in 0..{RTC_MAX_DELAY} per sample, rows < d clean at t = 1 and "
        "out of the loss, the other rows x_t = (1-t) x0 + t x1, target x1 - x0",
        "recipe": {**asdict(r), "max_delay": RTC_MAX_DELAY},
        "final_loss": round(final_loss, 6),
        "evaluation": evaluate_rtc(out_dir, params, r),
    }
    return write_training_json(out_dir, sidecar)


def shipped_rtc_weights(out_dir: Path) -> dict[str, np.ndarray]:
    """The trained weights in policy_rtc's policy.onnx, by name in export order (every
    initializer but the graph's constants)."""
    graph = onnx.load(str(out_dir / "policy.onnx")).graph
    weights = {"in", "out", *(f"h{i}" for i in range(RTC.dense_layers))}
    return {i.name: numpy_helper.to_array(i) for i in graph.initializer
            if i.name.split(".")[0] in weights}


def reexport_rtc(out_dir: Path) -> dict:
    """policy_rtc's graph again from its shipped weights (no training), and its new digest in the
    sidecar; the evaluation stands where the graph computes the same velocities."""
    from flowedge_relay.policy import package_digest

    graph = export_onnx(RTC, shipped_rtc_weights(out_dir), per_row_time=True)
    manifest = rtc_manifest(RTC)
    (out_dir / "policy.onnx").write_bytes(graph)
    (out_dir / "policy.yaml").write_bytes(manifest)
    sidecar = json.loads((out_dir / "training.json").read_text())
    sidecar["digest"] = package_digest(manifest, [("velocity", graph)])
    return write_training_json(out_dir, sidecar)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["small", "bench", "vision", "rtc", "all"], default="all")
    ap.add_argument("--out-dir", type=Path, default=None,
                    help="write every model here (default: policy_bench to "
                         f"{TOOLS_MODELS}, the others to {RUNTIME_MODELS})")
    ap.add_argument("--steps", type=int, default=0, help="override training steps (experiments)")
    ap.add_argument("--reexport", action="store_true",
                    help="policy_rtc: export the shipped weights again, no training")
    args = ap.parse_args(argv)

    def out_dir(key: str) -> Path:
        folder = args.out_dir or (TOOLS_MODELS if key == "bench" else RUNTIME_MODELS)
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    if args.reexport:
        if args.model != "rtc":
            ap.error("--reexport applies to --model rtc")
        reexport_rtc(out_dir("rtc") / RTC.name)
        return 0
    for key in ["small", "bench", "vision", "rtc"] if args.model == "all" else [args.model]:
        if key == "rtc":
            rr = Recipe(**{**asdict(RTC), "steps": args.steps}) if args.steps else RTC
            build_rtc(rr, out_dir(key) / rr.name)
            continue
        if key == "vision":
            vr = VISION
            if args.steps:
                vr = VisionRecipe(**{**asdict(vr), "steps": args.steps})
            build_vision(vr, out_dir(key) / vr.name)
            continue
        r = RECIPES[key]
        if args.steps:
            r = Recipe(**{**asdict(r), "steps": args.steps})
        build(r, out_dir(key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
