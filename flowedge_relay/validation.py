# SPDX-License-Identifier: Apache-2.0
"""Request checks: what the relay refuses to schedule, and why (docs/design.md §3).

Invalid or model-incompatible input is discarded with no output, because the relay cannot safely
reflect untrusted identifiers back onto the bus. Every discard is counted per reason (a fixed set
of keys, so hostile input cannot grow the counters) and logged with rate limiting by the node.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from flowedge_relay import policy as _policy
from flowedge_relay.core import RETRY_REASON_MAX, SESSION_ID_MAX

SESSION_ID_MAX_BYTES = SESSION_ID_MAX  # the core's fixed session-id buffer (csrc/fer.h)
MODEL_DIGEST_MAX_CHARS = 80  # "sha256:" + 64 hex digits = 71
OBSERVATION_MAX_LEN = 65536  # anything longer is rejected before it is even compared
NANOSEC_PER_SEC = 1_000_000_000


class Reason(enum.Enum):
    """Why a request was discarded. The value is the diagnostics key."""

    MODEL_UNAVAILABLE = "model_unavailable"
    SESSION_ID_EMPTY = "session_id_empty"
    SESSION_ID_TOO_LONG = "session_id_too_long"
    DIGEST_MISMATCH = "model_digest_mismatch"
    DIMS_MISMATCH = "dims_mismatch"
    OBSERVATION_LENGTH = "observation_length"
    OBSERVATION_NOT_FINITE = "observation_not_finite"
    NFE_ZERO = "remaining_nfe_zero"
    NFE_ABOVE_MAX = "remaining_nfe_above_max"
    RETRY_REASON_UNKNOWN = "retry_reason_unknown"  # above RETRY_AFTER_EXPIRED: uint8 allows 255
    TIME_INVALID = "time_invalid"  # deadline/origin_stamp with sec < 0 or nanosec >= 1e9
    CORE_REFUSED = "core_refused"  # passed these checks but the C core refused it: a bug, ERROR
    # InferenceRequest.inputs (policy.intake's keys; docs/policy-packages.md "Requests")
    INPUT_MISSING = _policy.INPUT_MISSING
    INPUT_UNEXPECTED = _policy.INPUT_UNEXPECTED
    INPUT_DUPLICATE = _policy.INPUT_DUPLICATE
    INPUT_DTYPE = _policy.INPUT_DTYPE
    INPUT_SHAPE = _policy.INPUT_SHAPE
    INPUT_BYTES = _policy.INPUT_BYTES
    INPUT_NOT_FINITE = _policy.INPUT_NOT_FINITE
    INPUT_BOOL_VALUE = _policy.INPUT_BOOL_VALUE
    REQUEST_TOO_LARGE = _policy.REQUEST_TOO_LARGE
    # CDR bytes that are not an InferenceRequest: only the C intake sees raw bytes (intake.py)
    REQUEST_MALFORMED = "request_malformed"
    # real-time chunking's prefix_actions (docs/design.md §5.4)
    PREFIX_UNSUPPORTED = "prefix_unsupported"  # a prefix, and the rtc_mode resolves to off
    PREFIX_SHAPE = "prefix_shape"  # not whole rows of action_dim, or more than the horizon
    ACTION_PERIOD_INVALID = "action_period_invalid"  # a prefix without a positive period
    PREFIX_NOT_FINITE = "prefix_not_finite"
    # the fair share's client_id (docs/design.md §7.1): longer than SESSION_ID_MAX_BYTES
    CLIENT_ID_TOO_LONG = "client_id_too_long"


_INTAKE_REASON = {reason.value: reason for reason in Reason}


@dataclass(frozen=True)
class ModelContract:
    """What a request must match to be runnable on the loaded model.

    `policy` set: the model takes named tensors (a policy package): observation_dim is 0 and
    every request carries `inputs`, taken in by policy.intake.
    """

    digest: str
    observation_dim: int
    action_dim: int
    action_horizon: int
    policy: _policy.Policy | None = None

    @classmethod
    def of(cls, policy: _policy.Policy) -> ModelContract:
        """The contract of a loaded policy description (a single .onnx file or a package)."""
        return cls(
            policy.digest,
            policy.observation_dim,
            policy.action_dim,
            policy.action_horizon,
            policy if policy.kind != "onnx" else None,
        )


_EMPTY_OBS = np.zeros(0, np.float32)
_EMPTY_OBS.setflags(write=False)


class Validator:
    """Checks one InferenceRequest against the loaded model and the configured limits.

    Cheap checks run first so a flood of garbage costs as little as possible; the observation
    is converted to float32 only once and handed back so the caller does not copy it again.
    For a policy package the request's tensors are validated and copied, normalized, in the same
    pass (policy.intake) into the buffers `intake_target()` names (the core's staging slot), the
    only copy the request gets before the worker runs the model on it. A real-time chunking
    prefix (§5.4) is checked last and copied into `prefix_target()` (float32[horizon x
    action_dim] in the staging slot); without a prefix_target a prefix is prefix_unsupported.
    """

    def __init__(
        self,
        model: ModelContract | None,
        max_nfe: int,
        *,
        intake_target: Callable[[], _policy.InputBuffers] | None = None,
        max_request_bytes: int = _policy.DEFAULT_MAX_REQUEST_BYTES,
        prefix_target: Callable[[], np.ndarray] | None = None,
    ) -> None:
        self.model = model
        self.prefix_target = prefix_target
        self.max_nfe = max_nfe
        self.intake_target = intake_target
        self.max_request_bytes = max_request_bytes
        self.discarded: dict[Reason, int] = {reason: 0 for reason in Reason}
        if model is not None and model.policy is not None and intake_target is None:
            raise ValueError("a policy package needs an intake_target (where inputs are copied)")

    def check(self, msg) -> tuple[Reason | None, bytes, np.ndarray | None]:
        """Return (reason or None, session id bytes, float32 observation) for one request."""
        reason, sid, obs = self._check(msg)
        if reason is not None:
            self.discarded[reason] += 1
        return reason, sid, obs

    def _check(self, msg) -> tuple[Reason | None, bytes, np.ndarray | None]:
        model = self.model
        if model is None:
            return Reason.MODEL_UNAVAILABLE, b"", None
        session_id = msg.session_id
        if not session_id:
            return Reason.SESSION_ID_EMPTY, b"", None
        # A str of n code points is at least n UTF-8 bytes: refuse huge ids before encoding them.
        if len(session_id) > SESSION_ID_MAX_BYTES:
            return Reason.SESSION_ID_TOO_LONG, b"", None
        sid = session_id.encode("utf-8", "surrogatepass")
        if len(sid) > SESSION_ID_MAX_BYTES:
            return Reason.SESSION_ID_TOO_LONG, b"", None
        client_id = msg.client_id
        if len(client_id) > SESSION_ID_MAX_BYTES or \
                len(client_id.encode("utf-8", "surrogatepass")) > SESSION_ID_MAX_BYTES:
            return Reason.CLIENT_ID_TOO_LONG, sid, None
        digest = msg.model_digest
        if len(digest) > MODEL_DIGEST_MAX_CHARS or digest != model.digest:
            return Reason.DIGEST_MISMATCH, sid, None
        if (
            msg.observation_dim != model.observation_dim
            or msg.action_dim != model.action_dim
            or msg.action_horizon != model.action_horizon
        ):
            return Reason.DIMS_MISMATCH, sid, None
        nfe = msg.remaining_nfe
        if nfe == 0:
            return Reason.NFE_ZERO, sid, None
        if nfe > self.max_nfe:
            return Reason.NFE_ABOVE_MAX, sid, None
        if msg.retry_reason > RETRY_REASON_MAX:
            return Reason.RETRY_REASON_UNKNOWN, sid, None
        if not (_stamp_ok(msg.deadline) and _stamp_ok(msg.origin_stamp)):
            return Reason.TIME_INVALID, sid, None
        raw = msg.observation
        if len(raw) != model.observation_dim or len(raw) > OBSERVATION_MAX_LEN:
            return Reason.OBSERVATION_LENGTH, sid, None
        if model.policy is not None:
            key = _policy.intake(
                msg.inputs, model.policy, self.intake_target(), self.max_request_bytes
            )
            if key is not None:
                return _INTAKE_REASON[key], sid, None
            obs = _EMPTY_OBS
        elif len(msg.inputs):  # the single-vector model declares no tensors
            return Reason.INPUT_UNEXPECTED, sid, None
        else:
            obs = _float32(raw)
            if not np.isfinite(obs).all():
                return Reason.OBSERVATION_NOT_FINITE, sid, None
        if len(msg.prefix_actions):
            reason = self._take_prefix(msg, model)
            if reason is not None:
                return reason, sid, None
        return None, sid, obs

    def _take_prefix(self, msg, model: ModelContract) -> Reason | None:
        """The prefix's checks, in fer_intake.c's order, then its copy into the staging slot."""
        if self.prefix_target is None:
            return Reason.PREFIX_UNSUPPORTED
        n = len(msg.prefix_actions)
        if n % model.action_dim or n // model.action_dim > model.action_horizon:
            return Reason.PREFIX_SHAPE
        if not _stamp_ok(msg.prefix_start):
            return Reason.TIME_INVALID
        period = msg.action_period
        if not _stamp_ok(period) or (period.sec == 0 and period.nanosec == 0):
            return Reason.ACTION_PERIOD_INVALID
        prefix = _float32(msg.prefix_actions)
        if not np.isfinite(prefix).all():
            return Reason.PREFIX_NOT_FINITE
        np.copyto(self.prefix_target()[:n], prefix)
        return None

    def total_discarded(self) -> int:
        return sum(self.discarded.values())


def _stamp_ok(stamp) -> bool:
    """builtin_interfaces/Time: sec is int32 (a negative one has no uint64 nanosecond value);
    nanosec is defined in [0, 1e9)."""
    return stamp.sec >= 0 and stamp.nanosec < NANOSEC_PER_SEC


def _float32(raw) -> np.ndarray:
    """A float32[] field as a float32 array (a view when rclpy gave an array.array('f'))."""
    return np.frombuffer(raw, dtype=np.float32) if _is_float_buffer(raw) else np.asarray(
        raw, dtype=np.float32
    )


def _is_float_buffer(raw) -> bool:
    """rclpy hands float32[] over as array.array('f'): view it without a copy."""
    return getattr(raw, "typecode", None) == "f"
