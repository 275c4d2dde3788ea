# SPDX-License-Identifier: Apache-2.0
"""The producer side: build an InferenceRequest from a dict of numpy arrays.

Why: a robot-side producer should not hand-assemble Tensor messages (dtype codes, shapes without
the batch dimension, little-endian bytes) or guess the digest and dims. It learns what a relay
serves (the relay's latched `flowedge/model` topic carries the model digest, its inputs with
dtype and shape, and its action dims: `ServedModel.from_message`; or locally from
`policy.load`) and calls `build_request`:

    served = ServedModel.from_policy(policy.load("flowedge_relay/models/policy_vision"))
    req = build_request(served, {"image": img_u8, "state": pos_f32},
                        session_id="arm/1", sequence=7, remaining_nfe=10,
                        deadline_ns=now_ns + 50_000_000, noise_seed=7)

A model whose only input is the float vector `observation` (a single .onnx file) gets the
`observation` shorthand (observation_dim > 0, no tensors), exactly as before. Mismatches raise
ValueError here, on the producer, instead of being discarded silently by the relay.

A robot running the served policy asynchronously (real-time chunking, docs/design.md §5.4)
keeps its current chunk in a `ChunkSplicer` (rtc.py), sends the rows not yet executed with the
next request, and switches to each answer at its `frozen_rows`:
    splicer = ChunkSplicer(served.action_dim, period_ns)
    req = build_request(served, arrays, ..., prefix=splicer.prefix(now_ns),
                        action_period_ns=period_ns)
    splicer.splice(answer.actions, answer.frozen_rows, stamp_ns(answer.chunk_start))

A fleet sharing one relay names each robot with `client_id` (docs/design.md §7.1; empty = the
session_id). With the relay's `fair_share` on, a REJECTED_CAPACITY answer says why in its
`reject_reason`: REJECT_CAPACITY means the relay is full for everyone (retry later, with
retry_reason RETRY_AFTER_CAPACITY), REJECT_FAIR_SHARE means this client is over its weighted
share of a contended relay (others are being served: sending fewer requests, not retrying
faster, is what helps). `over_fair_share(answer)` tells the two apart.

Only an `INFERENCE` answer carries actions to execute. `INFERENCE_FAILED` (the model call raised,
or its actions came out NaN or infinite; docs/design.md §3) carries none: never act on it, keep
executing the current chunk (a splicer is left as it is) or stop safely. A retry of the same
sequence is allowed, with retry_reason RETRY_AFTER_EXPIRED (no reason of its own: the answer did
not arrive in a usable form); it helps after a transient error, not for an input the model
cannot handle (the same input gives the same NaN).

A robot that shares flowedge/actions with a fleet (a relay pool, docs/design.md §13) takes only
its own sessions' answers, filtered by the middleware, and never acts on an answer twice:
    answers = answer_subscription(node, ["arm/1"], on_answer)
`answers.duplicates` counts the second answers it dropped (a pool names the window where one
can happen; each answer says who sent it in relay_id and pool_epoch).
"""

from __future__ import annotations

import array
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from builtin_interfaces.msg import Duration
from flowedge_relay_msgs.msg import ActionMessage, InferenceRequest, Tensor
from flowedge_relay_msgs.msg import ServedModel as ServedModelMsg
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

from flowedge_relay.policy import DTYPE_CODES, DTYPES, Policy
from flowedge_relay.ros_compat import content_filtered_subscription
from flowedge_relay.rtc import ChunkSplicer
from flowedge_relay.timebase import ros_time

#: The relay's latched topic of what it serves (docs/design.md §9, §10).
MODEL_TOPIC = "flowedge/model"


def model_qos() -> QoSProfile:
    """flowedge/model's QoS, on both sides: reliable and transient local with depth 1, so a
    subscriber that starts late still gets what is served now, then each swap."""
    return QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL)


def follow_served_model(node, callback):
    """Subscribe `node` to flowedge/model: `callback` gets each flowedge_relay_msgs ServedModel
    (ServedModel.from_message reads it). Returns the subscription."""
    return node.create_subscription(ServedModelMsg, MODEL_TOPIC, callback, model_qos())

NANOSEC_PER_SEC = 1_000_000_000
_DECL = re.compile(r"^\s*([^:;\s]+)\s*:\s*([a-z0-9]+)\s*\[\s*([0-9,\s]*)\]\s*$")


@dataclass(frozen=True)
class InputDecl:
    """One input a relay serves: name, dtype (manifest name, e.g. "uint8"), shape without batch."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def wire_dtype(self) -> np.dtype:
        return DTYPES[DTYPE_CODES[self.dtype]][1]


@dataclass(frozen=True)
class ServedModel:
    """What a relay serves, as a producer needs it."""

    digest: str
    inputs: tuple[InputDecl, ...]
    action_dim: int
    action_horizon: int
    observation_dim: int = 0  # > 0: the single-vector `observation` shorthand
    #: real-time chunking as served: "training_time", "inpaint" or "off" (no prefix taken)
    rtc_mode: str = "off"
    rtc_max_delay: int = 0

    @classmethod
    def from_policy(cls, policy: Policy) -> ServedModel:
        return cls(
            digest=policy.digest,
            inputs=tuple(InputDecl(s.name, s.dtype, s.shape) for s in policy.inputs),
            action_dim=policy.action_dim,
            action_horizon=policy.action_horizon,
            observation_dim=policy.observation_dim,
            rtc_mode=policy.rtc.mode if policy.rtc else "off",  # rtc_mode auto
            rtc_max_delay=policy.rtc.max_delay if policy.rtc else 0,
        )

    @classmethod
    def from_message(cls, msg) -> ServedModel | None:
        """From the relay's latched `flowedge/model` (a flowedge_relay_msgs ServedModel); None
        while the relay serves nothing (unconfigured: an empty digest). Subscribe with reliable,
        transient-local QoS to get the current one at once, and a new one at each model swap."""
        if not msg.model_digest:
            return None
        inputs = tuple(
            InputDecl(t.name, DTYPES[t.dtype][0], tuple(int(d) for d in t.shape))
            for t in msg.inputs
        )
        return cls(msg.model_digest, inputs, int(msg.action_dim), int(msg.action_horizon),
                   int(msg.observation_dim), msg.rtc_mode or "off", int(msg.rtc_max_delay))

    @classmethod
    def from_description(
        cls,
        digest: str,
        inputs: str,
        action_dim: int,
        action_horizon: int,
        observation_dim: int = 0,
    ) -> ServedModel:
        """From advertised values; `inputs` is Policy.describe_inputs()'s text."""
        return cls(
            digest, parse_inputs(inputs), int(action_dim), int(action_horizon), int(observation_dim)
        )


def parse_inputs(text: str) -> tuple[InputDecl, ...]:
    """'image:uint8[2,32,32]; state:float32[2]' -> InputDecls (Policy.describe_inputs' format)."""
    decls = []
    for part in text.split(";"):
        m = _DECL.match(part)
        if not m or m.group(2) not in DTYPE_CODES:
            raise ValueError(f"cannot parse input declaration {part!r} (name:dtype[d,...])")
        shape = tuple(int(d) for d in m.group(3).split(",") if d.strip())
        decls.append(InputDecl(m.group(1), m.group(2), shape))
    return tuple(decls)


def encode_tensor(decl: InputDecl, value: np.ndarray) -> Tensor:
    """One Tensor message: the declared dtype (a same-kind cast at most) and shape, LE C order."""
    arr = np.asarray(value)
    want = decl.wire_dtype
    if arr.shape != decl.shape:
        raise ValueError(
            f"input {decl.name!r}: expected shape {list(decl.shape)}, got {list(arr.shape)}"
        )
    if arr.dtype != want and not np.can_cast(arr.dtype, want, casting="same_kind"):
        raise ValueError(
            f"input {decl.name!r}: expected {decl.dtype}, got {arr.dtype} (no safe cast)"
        )
    data = np.ascontiguousarray(arr, dtype=want).tobytes()
    return Tensor(name=decl.name, dtype=DTYPE_CODES[decl.dtype], shape=list(decl.shape), data=data)


def build_request(
    model: ServedModel,
    arrays: Mapping[str, np.ndarray],
    *,
    session_id: str,
    sequence: int,
    remaining_nfe: int,
    deadline_ns: int = 0,
    noise_seed: int = 0,
    generation: int = 0,
    origin_ns: int = 0,
    retry_count: int = 0,
    retry_reason: int = InferenceRequest.RETRY_NONE,
    prefix: tuple[np.ndarray, int] | None = None,
    action_period_ns: int = 0,
    client_id: str = "",
) -> InferenceRequest:
    """An InferenceRequest carrying exactly the model's declared inputs (ROS-time nanoseconds).

    Real-time chunking (docs/design.md §5.4): `prefix` = (the not yet executed rows of the
    current chunk, [rows, action_dim] or flat, and when its row 0 executes), as
    ChunkSplicer.prefix gives it, with the time per row; checked here against what is served."""
    names = [d.name for d in model.inputs]
    missing = [n for n in names if n not in arrays]
    extra = sorted(set(arrays) - set(names))
    if missing or extra:
        raise ValueError(
            f"inputs: the model declares {names}; missing {missing}, undeclared {extra}"
        )
    req = InferenceRequest(
        session_id=session_id,
        sequence=int(sequence),
        generation=int(generation),
        retry_count=int(retry_count),
        retry_reason=int(retry_reason),
        origin_stamp=ros_time(int(origin_ns)),
        deadline=ros_time(int(deadline_ns)),
        remaining_nfe=int(remaining_nfe),
        model_digest=model.digest,
        action_dim=model.action_dim,
        action_horizon=model.action_horizon,
        noise_seed=int(noise_seed),
        client_id=client_id,
    )
    if prefix is not None and len(prefix[0]):
        _set_prefix(req, model, prefix, action_period_ns)
    if model.observation_dim > 0:  # the single-vector shorthand
        (decl,) = model.inputs
        obs = encode_tensor(decl, arrays[decl.name])  # checks shape and dtype
        req.observation_dim = model.observation_dim
        req.observation = array.array("f", bytes(obs.data))
        return req
    req.inputs = [encode_tensor(d, arrays[d.name]) for d in model.inputs]
    return req


def over_fair_share(answer) -> bool:
    """Whether an ActionMessage refuses its request because the request's client is over its
    weighted share of a contended relay (docs/design.md §7.1), not because the relay is full."""
    return (answer.code == ActionMessage.REJECTED_CAPACITY
            and answer.reject_reason == ActionMessage.REJECT_FAIR_SHARE)


def _set_prefix(req: InferenceRequest, model: ServedModel, prefix: tuple[np.ndarray, int],
                action_period_ns: int) -> None:
    rows = np.ascontiguousarray(prefix[0], np.float32).reshape(-1)
    if model.rtc_mode == "off":
        raise ValueError("prefix: the relay serves this model without real-time chunking "
                         "(rtc_mode off): it would discard the request")
    if len(rows) % model.action_dim or len(rows) // model.action_dim > model.action_horizon:
        raise ValueError(f"prefix: {len(rows)} floats are not whole rows of action_dim "
                         f"{model.action_dim}, at most action_horizon {model.action_horizon}")
    if action_period_ns <= 0:
        raise ValueError(f"action_period_ns must be > 0 with a prefix, got {action_period_ns}")
    req.prefix_actions = array.array("f", rows.tobytes())
    req.prefix_start = ros_time(int(prefix[1]))
    req.action_period = Duration(sec=int(action_period_ns) // NANOSEC_PER_SEC,
                                 nanosec=int(action_period_ns) % NANOSEC_PER_SEC)


#: The relay's answers (docs/design.md §2, §8).
ACTIONS_TOPIC = "flowedge/actions"
#: DDS SQL filters take at most 100 parameters (Fast DDS's default limit); a robot with more
#: sessions, or a session id the filter cannot quote, filters in Python instead.
FILTER_PARAMETERS_MAX = 100
#: (session_id, sequence) pairs remembered to drop a second answer: a pool's duplicate window is
#: a lease long, far shorter than this many answers to one robot.
SEEN_ANSWERS_MAX = 65_536


def answers_qos() -> QoSProfile:
    """The answer subscription's QoS: reliable, as the relay publishes them, deep enough for a
    burst of a fleet's answers."""
    return QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)


def session_filter(session_ids: Iterable[str]) -> tuple[str, list[str]] | None:
    """The DDS SQL filter `session_id = %0 OR ...` and its quoted parameters; None where the
    middleware cannot carry it (too many sessions, or an id with a quote)."""
    ids = list(dict.fromkeys(session_ids))
    if not ids or len(ids) > FILTER_PARAMETERS_MAX or any("'" in i for i in ids):
        return None
    return " OR ".join(f"session_id = %{i}" for i in range(len(ids))), [f"'{i}'" for i in ids]


class AnswerSubscription:
    """A robot's answers: its own sessions only, each (session_id, sequence) delivered once.

    `filtered_by` says where foreign sessions are dropped: "middleware" (a content-filtered
    subscription; Fast DDS on Jazzy and Kilted) or "python" (another RMW, or a filter the
    middleware cannot carry: the answers reach this process and are dropped here, counted in
    `foreign`). `duplicates` counts second answers dropped (the first is kept)."""

    def __init__(self, node, session_ids: Iterable[str], callback: Callable[[object], None],
                 qos: QoSProfile | None = None, *, topic: str = ACTIONS_TOPIC,
                 callback_group=None) -> None:
        self.session_ids = frozenset(session_ids)
        self.callback = callback
        self.duplicates = 0
        self.foreign = 0
        self._seen: OrderedDict[tuple[str, int], None] = OrderedDict()
        sql = session_filter(self.session_ids)
        filtered = False
        if sql is not None:
            self.subscription, filtered = content_filtered_subscription(
                node, ActionMessage, topic, self._on_answer, qos or answers_qos(), *sql,
                callback_group=callback_group)
        else:
            self.subscription = node.create_subscription(
                ActionMessage, topic, self._on_answer, qos or answers_qos(),
                callback_group=callback_group)
        self.filtered_by = "middleware" if filtered else "python"

    def _on_answer(self, msg) -> None:
        if msg.session_id not in self.session_ids:
            self.foreign += 1
            return
        key = (msg.session_id, msg.sequence)
        if key in self._seen:
            self.duplicates += 1
            return
        self._seen[key] = None
        if len(self._seen) > SEEN_ANSWERS_MAX:
            self._seen.popitem(last=False)
        self.callback(msg)


def answer_subscription(node, session_ids: Iterable[str], callback: Callable[[object], None],
                        qos: QoSProfile | None = None, **kwargs) -> AnswerSubscription:
    """Subscribe `node` to the answers of `session_ids` only (a content filter on session_id
    where the RMW supports one, else a Python filter), calling `callback` once per (session_id,
    sequence); see AnswerSubscription."""
    return AnswerSubscription(node, session_ids, callback, qos, **kwargs)


__all__ = ["ACTIONS_TOPIC", "MODEL_TOPIC", "AnswerSubscription", "ChunkSplicer", "InputDecl",
           "ServedModel", "answer_subscription", "answers_qos", "build_request", "encode_tensor",
           "follow_served_model", "model_qos", "over_fair_share", "parse_inputs",
           "session_filter"]
