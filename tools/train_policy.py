#!/usr/bin/env python3
"""Train the shipped flow-matching policies in pure numpy and export them to ONNX.

Why a script and not downloaded weights: the relay must be runnable and testable offline, and
the shipped models must be reproducible. Everything is seeded, so a rerun on the same machine
(same numpy/BLAS build) writes byte-identical .onnx and .json files.

Flow matching (rectified flow / conditional OT path): x0 ~ N(0, I), x1 = a demonstration chunk,
x_t = (1 - t) x0 + t x1, and the network v(x_t, t, observation) regresses the target x1 - x0.
The task is `flowedge_relay.models.detour_task` (two valid modes around an obstacle).

Two architectures, one trainer (SiLU MLP on [x, time features, observation]):
  policy_small  3 hidden layers of 256: the relay's default, tens of microseconds per NFE.
  policy_bench  one 768-wide layer, then one 768x768 residual block applied 8 times with shared
                weights: about 1 ms per NFE on one core while the file stays ~2.5 MB.

Cost: about 1.5 min (small, 6000 Adam steps) + 2.5 min (bench, 1200 steps) on 2 idle cores.
Each model's JSON sidecar records the task, dims, recipe (seed included), the final training
loss and a task evaluation of the exported file run through `flowedge_relay.model`.

Usage: python tools/train_policy.py [--model small|bench|all] [--out-dir DIR] [--steps N]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flowedge_relay.models import detour_task as task  # noqa: E402

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


def features(x: np.ndarray, t: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """[x, t, sin(f t), cos(f t), observation]: the same concat the ONNX graph builds."""
    ft = t * TIME_FREQS[None, :]
    return np.concatenate([x, t, np.sin(ft), np.cos(ft), obs], axis=1).astype(np.float32)


def init_params(r: Recipe, rng: np.random.Generator) -> dict[str, np.ndarray]:
    def dense(fan_in: int, fan_out: int, scale: float = 1.0) -> np.ndarray:
        std = scale / np.sqrt(fan_in)
        return (rng.standard_normal((fan_in, fan_out)) * std).astype(np.float32)

    p = {"in.W": dense(IN_DIM, r.width), "in.b": np.zeros(r.width, np.float32)}
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


def train(r: Recipe, log_every: int = 250) -> tuple[dict[str, np.ndarray], float]:
    """Adam with warm-up and cosine decay; returns the params and the mean loss of the last 10%."""
    rng = np.random.default_rng(r.seed)
    p = init_params(r, rng)
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v2 = {k: np.zeros_like(v) for k, v in p.items()}
    b1, b2, eps, warm = 0.9, 0.999, 1e-8, min(200, r.steps // 10)
    tail: list[float] = []
    t0 = time.monotonic()
    for step in range(1, r.steps + 1):
        inp, target = flow_batch(rng, r.batch)
        out, cache, h_last = forward(r, p, inp)
        err = out - target
        loss = float(np.mean(err * err))
        grads = backward(p, cache, h_last, (2.0 / err.size) * err)
        norm = np.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
        clip = min(1.0, 1.0 / max(norm, 1e-12))
        lr = (
            r.lr
            * min(1.0, step / warm)
            * (0.05 + 0.95 * 0.5 * (1 + np.cos(np.pi * step / r.steps)))
        )
        for k in p:
            g = grads[k] * clip
            m[k] = b1 * m[k] + (1 - b1) * g
            v2[k] = b2 * v2[k] + (1 - b2) * g * g
            mhat = m[k] / (1 - b1**step)
            vhat = v2[k] / (1 - b2**step)
            p[k] = (p[k] - lr * mhat / (np.sqrt(vhat) + eps)).astype(np.float32)
        if step > r.steps * 0.9:
            tail.append(loss)
        if step % log_every == 0 or step == r.steps:
            print(
                f"\r{r.name}: step {step}/{r.steps} loss {loss:.4f} "
                f"({time.monotonic() - t0:.0f} s)",
                end="",
                file=sys.stderr,
                flush=True,
            )
    print(file=sys.stderr)
    return p, float(np.mean(tail))


# ---------------------------------------------------------------- ONNX export


def export_onnx(r: Recipe, p: dict[str, np.ndarray]) -> bytes:
    """The same network as forward(), as an opset-17 graph with a dynamic `batch` dimension."""
    nodes: list[onnx.NodeProto] = []
    inits = [numpy_helper.from_array(v, k) for k, v in p.items()]
    inits.append(numpy_helper.from_array(TIME_FREQS.reshape(1, -1), "time_freqs"))

    def node(op: str, ins: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def silu_layer(h: str, layer: str, tag: str) -> str:
        z = node("Add", [node("MatMul", [h, f"{layer}.W"], f"{tag}/mm"), f"{layer}.b"], f"{tag}/z")
        return node("Mul", [z, node("Sigmoid", [z], f"{tag}/sig")], f"{tag}/act")

    x_flat = node("Flatten", ["x"], "x_flat", axis=1)
    ft = node("Mul", ["t", "time_freqs"], "t_freq")
    sin, cos = node("Sin", [ft], "t_sin"), node("Cos", [ft], "t_cos")
    h = node("Concat", [x_flat, "t", sin, cos, "observation"], "features", axis=1)
    h = silu_layer(h, "in", "in")
    for i in range(r.dense_layers):
        h = silu_layer(h, f"h{i}", f"h{i}")
    for k in range(r.shared_repeats):
        h = node("Add", [h, silu_layer(h, "shared", f"shared{k}")], f"shared{k}/res")
    out = node("Add", [node("MatMul", [h, "out.W"], "out/mm"), "out.b"], "out/z")
    node("Reshape", [out, node("Shape", ["x"], "x_shape")], "velocity")

    hd = [task.ACTION_HORIZON, task.ACTION_DIM]
    graph = helper.make_graph(
        nodes,
        r.name,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", *hd]),
            helper.make_tensor_value_info("t", TensorProto.FLOAT, ["batch", 1]),
            helper.make_tensor_value_info(
                "observation", TensorProto.FLOAT, ["batch", task.OBS_DIM]
            ),
        ],
        [helper.make_tensor_value_info("velocity", TensorProto.FLOAT, ["batch", *hd])],
        inits,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="flowedge_relay/tools/train_policy.py",
        producer_version="1",
        doc_string=f"Flow-matching velocity field v(x, t, observation). {task.DESCRIPTION}",
    )
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["small", "bench", "all"], default="all")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "flowedge_relay" / "models")
    ap.add_argument("--steps", type=int, default=0, help="override training steps (experiments)")
    args = ap.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for key in ["small", "bench"] if args.model == "all" else [args.model]:
        r = RECIPES[key]
        if args.steps:
            r = Recipe(**{**asdict(r), "steps": args.steps})
        build(r, args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
