# SPDX-License-Identifier: Apache-2.0
"""Every bundled policy (each model under flowedge_relay/models/, and the benchmarks' policy_bench
under tools/flowedge_relay_tools/models/) gives finite actions on its
whole input box: the box's corners, zeros, points that coincide (a goal on the obstacle, on the
robot), and random points. A NaN answer is INFERENCE_FAILED (docs/design.md §3), but a shipped
policy must not produce one for any input a producer may send.

The box: float inputs in [-BOX, BOX] (the detour tasks' positions: the robot in [-1, 1]^2, the
goal within 2 of it), uint8 inputs over their whole range."""

from __future__ import annotations

import itertools
import pathlib

import numpy as np
import pytest

from flowedge_relay import policy as P
from flowedge_relay_tools import models as tools_models
from flowedge_relay_tools import train_policy

MODELS = pathlib.Path(P.__file__).resolve().parent.parent / "models"
TOOLS_MODELS = pathlib.Path(tools_models.__file__).resolve().parent
BOX = 3.0
NFES = (1, 4)  # flow times 0; and 0, 0.25, 0.5, 0.75


def _bundled() -> list[pathlib.Path]:
    """Each policy the package ships: a single .onnx or a package folder (policy.yaml)."""
    found = sorted(MODELS.glob("*.onnx")) + sorted(p.parent for p in MODELS.glob("*/policy.yaml"))
    found += sorted(TOOLS_MODELS.glob("*.onnx"))
    assert len(found) >= 4, found  # policy_small, policy_bench, policy_rtc, policy_vision
    return found


def _float_points(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Corners (all of them up to 2^8, else random ones), zeros, every element equal, each pair
    of 2-D points made to coincide, and random points of [-BOX, BOX]^n."""
    points = []
    corners = itertools.product((-BOX, BOX), repeat=n) if n <= 8 else \
        (rng.choice((-BOX, BOX), n) for _ in range(256))
    points += [np.asarray(c, np.float32) for c in corners]
    points += [np.full(n, v, np.float32) for v in (0.0, 0.1, -0.1, 1.0, -1.0, BOX, -BOX)]
    for _ in range(8):
        base = rng.uniform(-BOX, BOX, n).astype(np.float32)
        for i, j in itertools.combinations(range(n // 2), 2):
            p = base.copy()
            p[2 * j: 2 * j + 2] = p[2 * i: 2 * i + 2]
            points.append(p)
        points.append(np.tile(base[:2], n // 2 + 1)[:n])
    points += list(rng.uniform(-BOX, BOX, (32, n)).astype(np.float32))
    return points


def _input_points(policy: P.Policy, rng: np.random.Generator) -> list[dict[str, np.ndarray]]:
    """Points of the whole box of every declared input, combined: each input's own sweep with
    the others at their first point, and the uint8 extremes against every float sweep."""
    sweeps: dict[str, list[np.ndarray]] = {}
    for decl in policy.inputs:
        shape = tuple(decl.shape)
        n = int(np.prod(shape))
        if np.dtype(decl.dtype) == np.uint8:
            sweep = [np.full(n, v, np.uint8) for v in (0, 255)]
            sweep += [rng.integers(0, 256, n, dtype=np.uint8) for _ in range(4)]
            sweep.append(np.where(np.arange(n) % 2 == 0, 255, 0).astype(np.uint8))
        else:
            sweep = _float_points(n, rng)
        sweeps[decl.name] = [p.reshape(shape).astype(decl.dtype) for p in sweep]
    names = list(sweeps)
    points = []
    for name in names:
        for value in sweeps[name]:
            point = {other: sweeps[other][0] for other in names}
            point[name] = value
            points.append(point)
    if len(names) > 1:  # the extremes of each input together with the others' extremes
        for combo in itertools.product(*(sweeps[n][:2] for n in names)):
            points.append(dict(zip(names, combo, strict=True)))
    return points


@pytest.mark.parametrize("path", _bundled(), ids=lambda p: p.name)
def test_bundled_policy_actions_are_finite_on_its_whole_input_box(path):
    policy = P.load(path)
    sampler = P.PolicySampler(policy, P.make_sessions(policy))
    rng = np.random.default_rng(20)
    points = _input_points(policy, rng)
    bad = []
    for k, arrays in enumerate(points):
        for nfe in NFES:
            actions = sampler.sample(arrays, noise_seed=k, total_nfe=nfe)
            if not np.isfinite(actions).all():
                bad.append({name: a.ravel()[:8].tolist() for name, a in arrays.items()})
    assert not bad, (f"{path.name}: {len(bad)} of {len(NFES) * len(points)} samples not "
                     f"finite, e.g. {bad[:3]}")


def test_policy_rtc_graph_is_its_export_code_over_its_weights():
    """The shipped policy_rtc graph (with the floor on its goal - obstacle norm) is what
    flowedge_relay_tools.train_policy exports from the shipped weights, byte for byte: the guard
    lives in the export code, so a retraining keeps it."""
    folder = MODELS / "policy_rtc"
    graph = train_policy.export_onnx(train_policy.RTC, train_policy.shipped_rtc_weights(folder),
                                     per_row_time=True)
    assert graph == (folder / "policy.onnx").read_bytes()
    assert P.load(folder).digest == P.package_digest(
        (folder / "policy.yaml").read_bytes(), [("velocity", graph)])
