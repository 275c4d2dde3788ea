# SPDX-License-Identifier: Apache-2.0
"""ONNX Runtime sessions for a policy's graphs, on an explicit ordered list of providers.

An unavailable provider is an error (`ProviderUnavailable`), never a silent CPU fallback: the
calibration a deployment made on one provider would no longer be true on another.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnxruntime as ort

from flowedge_relay.model import CorruptModel, ModelError, session_options
from flowedge_relay.policy.description import Policy

DEFAULT_PROVIDERS = ("CPUExecutionProvider",)


class ProviderUnavailable(ModelError):
    """A requested execution provider is not available in this onnxruntime build or host."""


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
            data, session_options(intra_op_threads, intra_op_affinities),
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
