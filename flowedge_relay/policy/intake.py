# SPDX-License-Identifier: Apache-2.0
"""Wire intake of request tensors: checked against the declared inputs, copied once.

`intake` validates `InferenceRequest.inputs` (Tensor messages) and copies each tensor once,
normalizing on the way, into preallocated model buffers (`InputBuffers`). `payload_layout` says
where those buffers lie in one core slot's payload, so the request thread writes a request
straight into its slot and the worker binds the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from flowedge_relay.policy.description import Policy

DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
_FLOAT_CODES = frozenset((0, 4))  # float32, float16: their values must be finite

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
    #: real-time chunking on: where a request's prefix rows lie (float32 [horizon x action_dim],
    #: the answer's space, docs/design.md §5.4); None when off
    prefix_offset: int | None = None


def _aligned(size: int) -> int:
    return -(-max(size, 1) // PAYLOAD_ALIGN) * PAYLOAD_ALIGN


def payload_layout(policy: Policy, rtc: bool = False) -> PayloadLayout:
    """Inputs in declaration order, each at a PAYLOAD_ALIGN-aligned offset; with `rtc`, room
    for a full-horizon prefix after them. A single .onnx file's observation travels in the
    core's observation rows, not in the payload: its layout holds the prefix alone."""
    offsets, sizes, off = {}, {}, 0
    for s in policy.inputs if policy.kind != "onnx" else ():
        size = math.prod(s.shape) * s.model_dtype.itemsize
        offsets[s.name], sizes[s.name] = off, size
        off += _aligned(size)
    if not rtc:
        return PayloadLayout(offsets, sizes, off)
    prefix = policy.action.horizon * policy.action.output_dim * 4
    return PayloadLayout(offsets, sizes, off + _aligned(prefix), off)


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
