# SPDX-License-Identifier: Apache-2.0
"""Policy packages: manifest and graph checks, digest, tensor intake, providers, two-phase sampling.

The packages here are tiny real ONNX graphs built with the onnx helper API and run by the real
onnxruntime; their velocity is chosen so the integrated result is known in closed form.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from flowedge_relay_msgs.msg import Tensor
from onnx import TensorProto, helper, numpy_helper

from flowedge_relay import policy as P
from flowedge_relay.model import (
    CorruptModel,
    FlowSampler,
    IncompatibleModel,
    MissingModel,
    ModelError,
    default_model_path,
    load_model,
)
from flowedge_relay.model import make_session as legacy_session

F, U8, I64 = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT64
H, D, OUT = 3, 4, 2  # action horizon, padded dim, output_dim


def _save(path: Path, nodes, inputs, outputs, inits=()) -> bytes:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    data = model.SerializeToString()
    path.write_bytes(data)
    return data


def _vi(name: str, elem: int, shape) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(shape))


def _prefix(path: Path, image=(F, ["batch", 1, 2, 2]), ctx=(F, ["batch", 4]), ctx_name="ctx"):
    """ctx = Cast(Flatten(image)): the context is the (normalized) image itself."""
    nodes = [
        helper.make_node("Flatten", ["image"], ["flat"], axis=1),
        helper.make_node("Cast", ["flat"], [ctx_name], to=ctx[0]),
    ]
    return _save(path, nodes, [_vi("image", *image)], [_vi(ctx_name, *ctx)])


def _step(path: Path, extra, x=("batch", H, D), v=None, t=("batch", 1), names=("x", "t")):
    """velocity = t + k * mean(ctx) + 0 * sum(other inputs), broadcast over x.

    `extra` lists the (name, elem, shape) inputs besides x and t; an input named `ctx` adds
    k * mean(ctx) with k = 1 (so a context of all -1 gives v = t - 1).
    """
    xn, tn = names
    nodes = [
        helper.make_node("Mul", [xn, "zero"], ["xz"]),
        helper.make_node("Reshape", [tn, "shape3"], ["t3"]),
        helper.make_node("Add", ["xz", "t3"], ["v0"]),
    ]
    last = "v0"
    for i, (name, _elem, _shape) in enumerate(extra):
        k = "one" if name == "ctx" else "zero"
        nodes += [
            helper.make_node("Cast", [name], [f"c{i}"], to=F),
            helper.make_node("ReduceMean", [f"c{i}"], [f"m{i}"], keepdims=0),
            helper.make_node("Mul", [f"m{i}", k], [f"k{i}"]),
            helper.make_node("Add", [last, f"k{i}"], [f"v{i + 1}"]),
        ]
        last = f"v{i + 1}"
    nodes.append(helper.make_node("Identity", [last], ["velocity"]))
    inits = [
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array([-1, 1, 1], np.int64), "shape3"),
    ]
    inputs = [_vi(xn, F, x), _vi(tn, F, t)] + [_vi(n, e, s) for n, e, s in extra]
    return _save(path, nodes, inputs, [_vi("velocity", F, v or x)], inits)


def _manifest(**over) -> dict:
    doc = {
        "format": "flowedge_policy",
        "version": 1,
        "name": "tiny",
        "inputs": [
            {
                "name": "image",
                "dtype": "uint8",
                "shape": [1, 2, 2],
                "normalization": {"min": 0, "max": 255},
            },
            {"name": "state", "dtype": "float32", "shape": [3]},
        ],
        "action": {
            "dim": D,
            "horizon": H,
            "output_dim": OUT,
            "normalization": {"mean": [1.0, -2.0], "std": [2.0, 0.5]},
        },
        "graphs": {"prefix": "prefix.onnx", "step": "step.onnx"},
        "flow": {"time": "0_to_1", "solver": "euler"},
    }
    doc.update(over)
    return doc


STEP_EXTRA = [("ctx", F, ["batch", 4]), ("state", F, ["batch", 3])]


def write_tiny_package(tmp: Path, manifest: dict | None = None, prefix=None,
                       step=None) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "policy.yaml").write_text(yaml.safe_dump(manifest or _manifest(), sort_keys=False))
    (prefix or _prefix)(tmp / "prefix.onnx")
    (step or (lambda p: _step(p, STEP_EXTRA)))(tmp / "step.onnx")
    return tmp


@pytest.fixture
def tiny(tmp_path) -> P.Policy:
    return P.load(write_tiny_package(tmp_path / "pkg"))


# ---------------------------------------------------------------- load: both kinds alike


def test_single_onnx_keeps_todays_contract_and_results():
    """A .onnx path: model.load_model's digest and dims; PolicySampler == FlowSampler bitwise."""
    pol = P.load(default_model_path())
    info = load_model(default_model_path())
    assert (pol.kind, pol.digest, pol.two_phase) == ("onnx", info.digest, False)
    assert pol.describe_inputs() == "observation:float32[4]"
    assert (pol.observation_dim, pol.action_horizon, pol.action_dim) == (4, 8, 2)
    obs = np.array([0.1, -0.2, 1.1, 0.9], np.float32)
    sampler = P.PolicySampler(pol, P.make_sessions(pol))
    ours = sampler.sample({"observation": obs}, 42, 10)
    legacy = FlowSampler(legacy_session(info), info).sample(obs, 42, 10)
    assert ours.tobytes() == legacy.tobytes()
    mid = P.PolicySampler(pol, P.make_sessions(pol), "midpoint").sample({"observation": obs}, 42, 9)
    legacy_mid = FlowSampler(legacy_session(info), info, "midpoint").sample(obs, 42, 9)
    assert mid.tobytes() == legacy_mid.tobytes()


def test_two_phase_package_description(tiny):
    assert tiny.kind == "two_phase" and tiny.two_phase
    assert tiny.describe_inputs() == "image:uint8[1,2,2]; state:float32[3]"
    assert (tiny.observation_dim, tiny.action_horizon, tiny.action_dim) == (0, H, OUT)
    assert tiny.action.dim == D and tiny.action.output_len == H * OUT
    assert [(c.name, c.dtype, c.shape) for c in tiny.context] == [("ctx", np.float32, (1, 4))]
    assert tiny.graphs["prefix"].inputs == ("image",)
    assert set(tiny.graphs["step"].inputs) == {"x", "t", "ctx", "state"}
    assert tiny.input["image"].model_dtype == np.float32  # normalized
    assert tiny.input["state"].model_dtype == np.float32 and tiny.input["state"].nbytes == 12


def test_digest_is_the_documented_formula(tmp_path, tiny):
    root = Path(tiny.path)
    h = hashlib.sha256()
    for name, file in (
        ("policy.yaml", "policy.yaml"),
        ("prefix", "prefix.onnx"),
        ("step", "step.onnx"),
    ):
        data = (root / file).read_bytes()
        h.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    assert tiny.digest == "sha256:" + h.hexdigest()
    # Any change to the manifest or to a graph changes it.
    other = write_tiny_package(tmp_path / "other", _manifest(name="tiny2"))
    assert P.load(other).digest != tiny.digest
    third = write_tiny_package(tmp_path / "third", step=lambda p: _step(p, STEP_EXTRA[::-1]))
    assert P.load(third).digest != tiny.digest


def test_velocity_package(tmp_path):
    """graphs: {velocity}: one graph v(x, t, inputs...) with the flow tensors renamed."""
    man = _manifest(
        inputs=[{"name": "state", "dtype": "int64", "shape": [5]}],
        graphs={"velocity": "v.onnx"},
        flow={"time": "1_to_0", "solver": "midpoint", "x": "x_t", "t": "timestep"},
    )
    root = tmp_path / "vel"
    root.mkdir()
    (root / "policy.yaml").write_text(yaml.safe_dump(man))
    _step(root / "v.onnx", [("state", I64, ["batch", 5])], t=("batch",), names=("x_t", "timestep"))
    pol = P.load(root)
    assert (pol.kind, pol.time, pol.solver, pol.t_shape) == ("velocity", "1_to_0", "midpoint", (1,))
    assert not pol.two_phase and pol.context == ()
    out = P.PolicySampler(pol, P.make_sessions(pol)).sample({"state": np.arange(5)}, 1, 4)
    assert out.shape == (H * OUT,) and np.isfinite(out).all()


# ---------------------------------------------------------------- load errors: field/expected/found


@pytest.mark.parametrize(
    "over, match",
    [
        (
            {"format": "policy_package"},
            r"format: expected 'flowedge_policy', found 'policy_package'",
        ),
        ({"version": 2}, r"version: expected 1, found 2"),
        ({"inputs": []}, r"inputs: expected a non-empty list, found \[\]"),
        (
            {"inputs": [{"name": "image", "dtype": "float64", "shape": [1, 2, 2]}]},
            r"inputs\[0\]\.dtype: expected one of .*'uint8'.*, found 'float64'",
        ),
        (
            {"inputs": [{"name": "image", "dtype": "uint8", "shape": [1, -2, 2]}]},
            r"inputs\[0\]\.shape\[1\]: expected a positive integer, found -2",
        ),
        (
            {"action": {"dim": 2, "horizon": 3, "output_dim": 4}},
            r"action\.output_dim: expected <= action\.dim \(2\), found 4",
        ),
        (
            {"action": {"dim": 4, "horizon": 3, "normalization": {"mean": [0] * 3, "std": 1}}},
            r"action\.normalization\.mean shape: expected one that broadcasts to \[4\], "
            r"found \[3\]",
        ),
        (
            {"action": {"dim": 4, "horizon": 3, "normalization": {"mean": 0, "std": 0}}},
            r"action\.normalization\.std: expected values > 0, found 0",
        ),
        ({"flow": {"time": "forward"}}, r"flow\.time: expected one of .*, found 'forward'"),
        ({"flow": {"solver": "rk4"}}, r"flow\.solver: expected one of .*, found 'rk4'"),
        ({"graphs": {"prefix": "prefix.onnx"}}, r"graphs: expected either .*, found \['prefix'\]"),
        ({"graphs": {"velocity": "../x.onnx"}}, r"graphs\.velocity: expected a file inside"),
        ({"actions": {}}, r"policy\.yaml: expected only the keys .*, found \['actions'\]"),
    ],
)
def test_manifest_errors(tmp_path, over, match):
    with pytest.raises(P.ManifestError, match=match) as err:
        P.load(write_tiny_package(tmp_path / "pkg", _manifest(**over)))
    assert isinstance(err.value, ModelError)


@pytest.mark.parametrize(
    "prefix, step, match",
    [
        (  # a normalized uint8 image reaches the graph as float32, never as uint8
            lambda p: _prefix(p, image=(U8, ["batch", 1, 2, 2])),
            None,
            r"input 'image' \(normalized: float32\) dtype \(manifest inputs\[0\]\): expected "
            r"tensor\(float\), found tensor\(uint8\)",
        ),
        (None, None, None),  # the default tiny package loads
        (
            lambda p: _prefix(p, image=(F, ["batch", 1, 3, 2])),
            None,
            r"graphs\.prefix \(prefix\.onnx\): input 'image' \(normalized: float32\) shape "
            r"\(manifest inputs\[0\]\): expected \[batch, 1, 2, 2\], found \['batch', 1, 3, 2\]",
        ),
        (
            None,
            lambda p: _step(
                p, [("ctx", F, ["batch", 4]), ("state", TensorProto.DOUBLE, ["batch", 3])]
            ),
            r"graphs\.step \(step\.onnx\): input 'state' dtype \(manifest inputs\[1\]\): "
            r"expected tensor\(float\), found tensor\(double\)",
        ),
        (
            None,
            lambda p: _step(p, [*STEP_EXTRA, ("lang_tokens", I64, ["batch", 7])]),
            r"input 'lang_tokens': expected flow\.x, flow\.t, a prefix output \['ctx'\] or a "
            r"declared input \['image', 'state'\], found 'lang_tokens'",
        ),
        (
            None,
            lambda p: _step(p, [("ctx", I64, ["batch", 4]), ("state", F, ["batch", 3])]),
            r"context 'ctx' dtype: expected tensor\(float\) \(the prefix output\), "
            r"found tensor\(int64\)",
        ),
        (
            None,
            lambda p: _step(p, [("ctx", F, ["batch", 5]), ("state", F, ["batch", 3])]),
            r"context 'ctx' shape: expected \['batch', 4\] \(the prefix output\), "
            r"found \['batch', 5\]",
        ),
        (
            None,
            lambda p: _step(p, [("state", F, ["batch", 3])]),
            r"graphs\.prefix \(prefix\.onnx\): outputs: expected every prefix output to be a step "
            r"input, found \['ctx'\] unused",
        ),
        (
            None,
            lambda p: _step(p, [("ctx", F, ["batch", 4])]),
            r"inputs: expected every declared input to be a prefix or step input, "
            r"found \['state'\]",
        ),
        (
            None,
            lambda p: _step(p, STEP_EXTRA, x=("batch", H, 3)),
            r"input 'x' shape \(manifest action\.horizon, action\.dim\): expected \[batch, 3, 4\], "
            r"found \['batch', 3, 3\]",
        ),
        (
            None,
            lambda p: _step(p, STEP_EXTRA, t=("batch", 2)),
            r"input 't' \(flow\.t\): expected tensor\(float\) \[batch, 1\] or \[batch\]",
        ),
        (
            None,
            lambda p: _step(p, STEP_EXTRA, names=("x_t", "t")),
            r"input 'x' \(flow\.x\): expected an input named by flow\.x, "
            r"found \['ctx', 'state', 't', 'x_t'\]",
        ),
    ],
)
def test_graph_mismatch_names_field_expected_found(tmp_path, prefix, step, match):
    root = write_tiny_package(tmp_path / "pkg", prefix=prefix, step=step)
    if match is None:
        assert P.load(root).kind == "two_phase"
        return
    with pytest.raises(P.GraphMismatch, match=match) as err:
        P.load(root)
    assert isinstance(err.value, ModelError) and isinstance(err.value, IncompatibleModel)


def test_missing_and_corrupt_graphs(tmp_path):
    root = write_tiny_package(tmp_path / "pkg")
    (root / "step.onnx").unlink()
    with pytest.raises(MissingModel, match=r"graphs\.step: cannot read step\.onnx"):
        P.load(root)
    (root / "step.onnx").write_bytes(b"not onnx" * 10)
    with pytest.raises(CorruptModel, match=r"graphs\.step: onnxruntime cannot load step\.onnx"):
        P.load(root)
    with pytest.raises(MissingModel, match="without policy.yaml"):
        P.load(tmp_path)
    (root / "policy.yaml").write_text("inputs: [unclosed")
    with pytest.raises(P.ManifestError, match="not valid YAML"):
        P.load(root)


# ---------------------------------------------------------------- intake: validation and one copy


def _tensor(name: str, arr: np.ndarray, code: int | None = None) -> Tensor:
    codes = {np.float32: 0, np.uint8: 1, np.int64: 2, np.int32: 3, np.float16: 4, np.bool_: 5}
    return Tensor(
        name=name,
        dtype=codes[arr.dtype.type] if code is None else code,
        shape=list(arr.shape),
        data=arr.tobytes(),
    )


def _good(image=None, state=None) -> list[Tensor]:
    image = np.array([[[0, 255], [51, 102]]], np.uint8) if image is None else image
    state = np.array([1.5, -2.0, 0.25], np.float32) if state is None else state
    return [_tensor("image", image), _tensor("state", state)]


def test_intake_copies_once_with_normalization(tiny):
    bufs = P.InputBuffers(tiny)
    before = {k: v.ctypes.data for k, v in bufs.arrays.items()}
    assert P.intake(list(reversed(_good())), tiny, bufs) is None  # order does not matter
    np.testing.assert_allclose(bufs["image"][0], [[[-1.0, 1.0], [-0.6, -0.2]]], atol=1e-6)
    assert bufs["state"][0].tolist() == [1.5, -2.0, 0.25]
    assert {k: v.ctypes.data for k, v in bufs.arrays.items()} == before  # written in place
    assert bufs["image"].dtype == np.float32 and bufs["image"].shape == (1, 1, 2, 2)


def _bad(case: str) -> list[Tensor]:
    good = _good()
    nan_state = np.array([0.0, np.nan, 1.0], np.float32)
    inf_state = np.array([0.0, np.inf, 1.0], np.float32)
    return {
        "missing": [good[0]],
        "unexpected": [*good, _tensor("lang_tokens", np.arange(3))],
        "duplicate": [good[0], good[0], good[1]],
        "dtype": [good[0], _tensor("state", np.array([1, 2, 3], np.int32))],
        "dtype_float16": [good[0], _tensor("state", np.array([1, 2, 3], np.float16))],
        "shape": [_tensor("image", np.zeros((1, 2, 3), np.uint8)), good[1]],
        "shape_rank": [_tensor("image", np.zeros((2, 2), np.uint8)), good[1]],
        "bytes": [good[0], Tensor(name="state", dtype=0, shape=[3], data=b"\0" * 11)],
        "nan": [good[0], _tensor("state", nan_state)],
        "inf": [good[0], _tensor("state", inf_state)],
        "too_large": [good[0], Tensor(name="state", dtype=0, shape=[3], data=b"\0" * 4096)],
        "flood": [*good, *([Tensor(name="state")] * 1000)],
    }[case]


@pytest.mark.parametrize(
    "case, key",
    [
        ("missing", "input_missing"),
        ("unexpected", "input_unexpected"),
        ("duplicate", "input_duplicate"),
        ("dtype", "input_dtype"),
        ("dtype_float16", "input_dtype"),
        ("shape", "input_shape"),
        ("shape_rank", "input_shape"),
        ("bytes", "input_bytes"),
        ("nan", "input_not_finite"),
        ("inf", "input_not_finite"),
        ("too_large", "request_too_large"),
        ("flood", "input_unexpected"),  # refused by count before any tensor is looked at
    ],
)
def test_intake_rejects_each_failure_with_its_key(tiny, case, key):
    assert key in P.INTAKE_REASONS
    assert P.intake(_bad(case), tiny, P.InputBuffers(tiny), max_request_bytes=1024) == key
    assert P.intake(_good(), tiny, P.InputBuffers(tiny), max_request_bytes=1024) is None


def test_intake_bool_and_float16(tmp_path):
    man = _manifest(
        inputs=[
            {"name": "mask", "dtype": "bool", "shape": [4]},
            {"name": "half", "dtype": "float16", "shape": [2]},
            {
                "name": "gain",
                "dtype": "float32",
                "shape": [],
                "normalization": {"mean": 1, "std": 2},
            },
        ],
        graphs={"velocity": "v.onnx"},
    )
    root = tmp_path / "b"
    root.mkdir()
    (root / "policy.yaml").write_text(yaml.safe_dump(man))
    _step(
        root / "v.onnx",
        [
            ("mask", TensorProto.BOOL, ["batch", 4]),
            ("half", TensorProto.FLOAT16, ["batch", 2]),
            ("gain", F, ["batch"]),
        ],
    )
    pol = P.load(root)
    bufs = P.InputBuffers(pol)
    mask = np.array([True, False, True, True])
    half = np.array([1.5, -2.0], np.float16)
    gain = _tensor("gain", np.array(5.0, np.float32))  # a scalar: shape [], 4 bytes
    assert P.intake([_tensor("mask", mask), _tensor("half", half), gain], pol, bufs) is None
    assert bufs["gain"].shape == (1,) and bufs["gain"][0] == 2.0  # (5 - 1) / 2
    assert bufs["mask"].dtype == np.bool_ and bufs["mask"][0].tolist() == mask.tolist()
    assert bufs["half"].dtype == np.float16 and bufs["half"][0].tolist() == [1.5, -2.0]
    bad_bool = Tensor(name="mask", dtype=5, shape=[4], data=b"\x01\x00\x02\x01")
    assert P.intake([bad_bool, _tensor("half", half), gain], pol, bufs) == "input_bool_value"
    bad_half = np.array([np.inf, 0], np.float16)
    assert P.intake([_tensor("mask", mask), _tensor("half", bad_half), gain], pol, bufs) == (
        "input_not_finite"
    )
    assert P.intake([_tensor("mask", mask), _tensor("half", half)], pol, bufs) == "input_missing"


# ---------------------------------------------------------------- execution providers


def test_unavailable_provider_is_an_error_naming_what_is_available(tiny):
    available = ort.get_available_providers()
    assert "CUDAExecutionProvider" not in available, "this test is for a CPU-only host"
    with pytest.raises(P.ProviderUnavailable) as err:
        P.make_sessions(tiny, 1, ["CUDAExecutionProvider", "CPUExecutionProvider"])
    msg = str(err.value)
    assert "['CUDAExecutionProvider'] not available" in msg
    assert f"available: {available}" in msg
    assert isinstance(err.value, ModelError)
    with pytest.raises(P.ProviderUnavailable, match="at least one provider"):
        P.check_providers([])
    sessions = P.make_sessions(tiny, 1, ["CPUExecutionProvider"])
    assert {r: s.get_providers() for r, s in sessions.items()} == {
        "prefix": ["CPUExecutionProvider"],
        "step": ["CPUExecutionProvider"],
    }


# ---------------------------------------------------------------- two-phase sampling


def _noise(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(H * D, dtype=np.float32).reshape(H, D)


@pytest.mark.parametrize("time_conv", ["0_to_1", "1_to_0"])
def test_time_convention_context_and_actions(tmp_path, time_conv):
    """v = t + mean(normalized image): Euler over N steps is closed-form, so the grid, the sign,
    the context binding, truncation and de-normalization are all checked exactly."""
    pol = P.load(write_tiny_package(tmp_path / "pkg", _manifest(flow={"time": time_conv})))
    sampler = P.PolicySampler(pol, P.make_sessions(pol))
    bufs = P.InputBuffers(pol)
    assert P.intake(_good(), pol, bufs) is None
    n = 8
    sampler.start(7, n, bufs)
    assert sampler.prefix_pending
    with pytest.raises(RuntimeError, match="prefix"):
        sampler.nfe()
    sampler.prefix()
    ctx = sampler.context("ctx")
    np.testing.assert_allclose(ctx, bufs["image"].reshape(1, 4))  # the prefix ran on our buffer
    for _ in range(n):
        sampler.nfe()
    assert sampler.remaining == 0 and sampler.nfe_done == n
    c = float(ctx.mean())
    j = np.arange(n, dtype=np.float64)
    if time_conv == "0_to_1":
        shift = np.sum((j / n + c) / n)
    else:
        shift = -np.sum((1 - j / n + c) / n)
    x = _noise(7)[:, :OUT] + shift
    want = x * np.array([2.0, 0.5]) + np.array([1.0, -2.0])
    got = sampler.actions()
    assert got.shape == (H * OUT,) and got.dtype == np.float32
    np.testing.assert_allclose(got.reshape(H, OUT), want, rtol=1e-5, atol=1e-5)


def test_two_phase_bit_identical_and_no_per_nfe_copies(tiny):
    arrays = {"image": np.array([[[0, 255], [51, 102]]], np.uint8), "state": np.ones(3, np.float32)}
    a = P.PolicySampler(tiny, P.make_sessions(tiny)).sample(arrays, 42, 10)
    b = P.PolicySampler(tiny, P.make_sessions(tiny, 2)).sample(arrays, 42, 10)
    s = P.PolicySampler(tiny, P.make_sessions(tiny))
    s.sample({"image": np.zeros((1, 2, 2), np.uint8), "state": np.zeros(3, np.float32)}, 1, 3)
    c = s.sample(arrays, 42, 10)  # a previous request leaves no trace
    assert a.tobytes() == b.tobytes() == c.tobytes()
    assert s.sample(arrays, 43, 10).tobytes() != a.tobytes()
    # The context is one device buffer bound to both graphs: the prefix writes it, each NFE
    # reads it in place (the OrtValue's address does not change across prefix and steps).
    value = s._context["ctx"]
    ptr = value.data_ptr()
    s.start(5, 4)
    s.prefix()
    for _ in range(4):
        s.nfe()
        assert s._context["ctx"] is value and value.data_ptr() == ptr
    with pytest.raises(RuntimeError, match="no NFE left"):
        s.nfe()


def test_sampler_rebinds_per_request_buffers(tiny):
    """Buffers filled at arrival (one per queued request) are bound at start, never copied."""
    s = P.PolicySampler(tiny, P.make_sessions(tiny))
    first, second = P.InputBuffers(tiny), P.InputBuffers(tiny)
    assert P.intake(_good(), tiny, first) is None
    zeros = np.zeros((1, 2, 2), np.uint8)
    assert P.intake(_good(image=zeros), tiny, second) is None
    s.start(3, 2, second)
    s.prefix()
    assert np.all(s.context("ctx") == -1.0)
    s.start(3, 2, first)
    s.prefix()
    np.testing.assert_allclose(s.context("ctx"), first["image"].reshape(1, 4))
