# SPDX-License-Identifier: Apache-2.0
"""What the relay serves, described: a policy's named inputs, its action chunk and its graphs.

One description (`Policy`) for a single `.onnx` file and for a policy package directory alike
(policy/manifest.py builds both), so the data path never asks which it has.

Normalization: mean/std gives (v - mean) / std; min/max gives 2 (v - min) / (max - min) - 1 (to
[-1, 1], LeRobot's MIN_MAX). Statistics broadcast against the input's shape ([C, 1, 1]: per
channel).
A normalized input reaches the graph as float32; an unnormalized one in its declared dtype.
Actions: the graph's x is [horizon, dim]; the relay returns the first output_dim columns, then
inverts the action normalization (its statistics broadcast against [output_dim]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flowedge_relay.rtc import RtcSpec

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
    #: the manifest's rtc: block (real-time chunking, docs/design.md §5.4); None: not declared
    rtc: RtcSpec | None = None

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


def rtc_policy_path() -> str:
    """The bundled training-time real-time chunking package (train_policy.py --model rtc)."""
    return str(Path(__file__).resolve().parent.parent / "models" / "policy_rtc")


def vision_policy_path() -> str:
    """The bundled two-phase package (image and state inputs; train_policy.py --model vision)."""
    return str(Path(__file__).resolve().parent.parent / "models" / "policy_vision")
