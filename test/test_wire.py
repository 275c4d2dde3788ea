# SPDX-License-Identifier: Apache-2.0
"""The wire format of the C paths is the .msg files' (docs/design.md, "The wire format").

Every field of InferenceRequest, ActionMessage and PoolSpill goes through the C paths and is
compared with rclpy's own serialization. Nothing is listed by hand: the fields and their types
come from the message classes (get_fields_and_field_types), the values are generated per type,
and the C views are read by fer_wire.h's naming rule (a nested field's names joined by "_", a
string or sequence as a pointer and <name>_len). A field added to a .msg fails here until the C
paths carry it.

- the intake reads every InferenceRequest field rclpy wrote (fer_request_parse);
- a pool's answers watch reads every ActionMessage field (fer_answer_parse);
- the publisher's generated struct, serialized by the middleware (fer_action_cdr), reads back
  field for field as rclpy's serialization of the Python publisher's message, and no field
  that message sets is left unset;
- a pool's handover (PoolSpill, docs/design.md §13.5) is written through its plan
  (fer_spill_write) as rclpy reads it, and read back (fer_spill_parse) as rclpy wrote it.
"""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest
from flowedge_relay_msgs.msg import ActionMessage, InferenceRequest, PoolSpill
from rclpy.serialization import deserialize_message, serialize_message

from flowedge_relay.core import Code, Core, CoreConfig, Outcome, Pool, ffi, lib
from flowedge_relay.model import default_model_path, load_model
from flowedge_relay.publisher import ActionPublisher, action_message
from flowedge_relay.rcl_abi import load_serializer, load_wire

MODEL = load_model(default_model_path())
#: numpy dtypes of the .msg scalar types a sequence may hold
DTYPES = {"float": np.float32, "double": np.float64, "uint8": np.uint8, "octet": np.uint8,
          "int8": np.int8, "uint16": np.uint16, "int16": np.int16, "uint32": np.uint32,
          "int32": np.int32, "uint64": np.uint64, "int64": np.int64, "boolean": np.uint8}


def message_class(type_name: str):
    """flowedge_relay_msgs/Tensor -> the class."""
    package, name = type_name.split("/")
    return getattr(importlib.import_module(f"{package}.msg"), name)


def fields(cls) -> list[tuple[str, str]]:
    """(name, .msg type) of every field of a message class, in .msg order."""
    return list(cls.get_fields_and_field_types().items())


def element(type_name: str) -> str | None:
    """The element type of a sequence type, None for anything else."""
    if type_name.startswith("sequence<"):
        return type_name[len("sequence<"):-1].split(",")[0]
    return None


class Values:
    """Distinct, valid, non-default values for every field, by type."""

    def __init__(self) -> None:
        self.k = 0

    def next(self) -> int:
        self.k += 1
        return self.k

    def scalar(self, type_name: str):
        k = self.next()
        if type_name in ("float", "double"):
            return k + 0.5
        if type_name == "boolean":
            return True
        if type_name in ("uint8", "octet", "int8", "char"):
            return k % 100 + 1
        return k

    def string(self) -> str:
        return f"f{self.next()}-\u00fc"

    def message(self, cls):
        msg = cls()
        for name, type_name in fields(cls):
            setattr(msg, name, self.value(type_name))
        return msg

    def value(self, type_name: str):
        inner = element(type_name)
        if inner is not None:
            if "/" in inner:
                return [self.message(message_class(inner)) for _ in range(2)]
            if inner == "string":
                return [self.string(), self.string()]
            values = [self.scalar(inner) for _ in range(3)]
            return bytes(values) if inner in ("uint8", "octet") else values
        if "/" in type_name:
            return self.message(message_class(type_name))
        if type_name == "string":
            return self.string()
        return self.scalar(type_name)


def leaves(msg, prefix: str = "") -> list[tuple[str, str, object]]:
    """(view name, .msg type, value) of every leaf of msg: nested messages flattened."""
    out = []
    for name, type_name in fields(type(msg)):
        value = getattr(msg, name)
        if "/" in type_name and element(type_name) is None:
            out += leaves(value, f"{prefix}{name}_")
        else:
            out.append((f"{prefix}{name}", type_name, value))
    return out


def _bytes(ptr, n: int) -> bytes:
    return bytes(ffi.buffer(ptr, n)) if n else b""


def assert_view_holds(view, msg, where: str) -> None:
    """Every leaf of msg read back from a C view, by fer_wire.h's naming rule."""
    for name, type_name, value in leaves(msg):
        at = f"{where}.{name} ({type_name})"
        assert hasattr(view, name), f"{at}: the C view has no field for it"
        inner = element(type_name)
        if inner is not None and "/" in inner:
            assert getattr(view, f"{name}_len") == len(value), at
            kept = getattr(view, name)
            for i, item in enumerate(value[:len(kept)]):
                assert_view_holds(kept[i], item, f"{at}[{i}]")
        elif inner is not None:
            n = getattr(view, f"{name}_len")
            want = np.asarray(bytearray(value) if isinstance(value, bytes) else value,
                              DTYPES[inner]).tobytes()
            assert n == len(value), at
            assert _bytes(getattr(view, name), len(want)) == want, at
        elif type_name == "string":
            assert _bytes(getattr(view, name), getattr(view, f"{name}_len")) == value.encode(), at
        elif type_name in ("float", "double"):
            assert getattr(view, name) == pytest.approx(value), at
        else:
            assert getattr(view, name) == value, at


@pytest.fixture(scope="module", autouse=True)
def wire():
    load_wire()
    load_serializer()


def test_the_intake_reads_every_request_field_rclpy_serializes():
    msg = Values().message(InferenceRequest)
    msg.inputs = msg.inputs[:lib.FER_INTAKE_TENSORS_MAX]
    cdr = serialize_message(msg)  # the view points into these bytes: keep them alive
    view = ffi.new("struct fer_request_view *")
    assert lib.fer_request_parse(cdr, len(cdr), view) == 0
    assert_view_holds(view, msg, "InferenceRequest")
    # the intake's own sum over the tensors, and the ownership check's prefix of the message
    assert view.tensor_bytes == sum(len(t.data) for t in msg.inputs)
    head = ffi.new("struct fer_request_view *")
    assert lib.fer_request_parse_head(cdr, len(cdr), head) == 0
    for name in ("session_id", "sequence", "origin_stamp_sec", "origin_stamp_nanosec",
                 "deadline_sec", "deadline_nanosec", "model_digest"):
        assert getattr(head, f"{name}_len", None) == getattr(view, f"{name}_len", None)
        if not name.endswith(("_id", "digest")):
            assert getattr(head, name) == getattr(view, name), name


def assert_parsed_back(cls, view_type: str, parse) -> None:
    """A message of every field set, serialized by rclpy, reads back field for field in C."""
    msg = Values().message(cls)
    cdr = serialize_message(msg)
    view = ffi.new(f"struct {view_type} *")
    assert parse(cdr, len(cdr), view) == 0
    assert_view_holds(view, msg, cls.__name__)


def test_the_answers_watch_reads_every_answer_field_rclpy_serializes():
    assert_parsed_back(ActionMessage, "fer_answer_view", lib.fer_answer_parse)


def test_a_pool_reads_every_handover_field_rclpy_serializes():
    assert_parsed_back(PoolSpill, "fer_spill_view", lib.fer_spill_parse)


def fill_view(view, msg, keep: list) -> None:
    """A C view holding every leaf of msg, by fer_wire.h's naming rule (the reverse of
    assert_view_holds; keep holds the buffers the view points into)."""
    for name, type_name, value in leaves(msg):
        inner = element(type_name)
        assert inner is None or "/" not in inner, f"{name}: no view writes a message sequence"
        if inner is not None or type_name == "string":
            data = (value.encode() if type_name == "string"
                    else np.asarray(bytearray(value) if isinstance(value, bytes) else value,
                                    DTYPES[inner]).tobytes())
            buf = ffi.new("uint8_t[]", data or b"\0")
            keep.append(buf)
            setattr(view, name, buf)
            setattr(view, f"{name}_len", len(value) if inner is not None else len(data))
        else:
            setattr(view, name, value)


def test_a_pool_writes_every_handover_field_as_rclpy_reads_it():
    msg = Values().message(PoolSpill)
    keep: list = []
    view = ffi.new("struct fer_spill_view *")
    fill_view(view, msg, keep)
    n = lib.fer_spill_write(view, ffi.NULL, 0)  # sized first, as the pool's out box does
    want = serialize_message(msg)
    assert n == len(want)  # the same layout (padding bytes are not compared: Fast CDR's)
    buf = ffi.new("uint8_t[]", b"\xab" * n)
    assert lib.fer_spill_write(view, buf, n - 1) == n  # too small: sized, nothing past cap
    assert buf[n - 1] == 0xAB
    assert lib.fer_spill_write(view, buf, n) == n
    got = deserialize_message(bytes(buf), PoolSpill)
    for (name, _, value), (_, _, expected) in zip(leaves(got), leaves(msg), strict=True):
        assert np.array_equal(np.asarray(value), np.asarray(expected)), name
    # and what the C writer wrote, the C reader reads back whole
    view2 = ffi.new("struct fer_spill_view *")
    assert lib.fer_spill_parse(buf, n, view2) == 0
    assert_view_holds(view2, msg, "PoolSpill (written in C)")


def test_a_truncated_message_never_parses():
    for cls, view_type, parse in ((InferenceRequest, "struct fer_request_view *",
                                   lib.fer_request_parse),
                                  (ActionMessage, "struct fer_answer_view *",
                                   lib.fer_answer_parse),
                                  (PoolSpill, "struct fer_spill_view *", lib.fer_spill_parse)):
        msg = Values().message(cls)
        if cls is ActionMessage:
            msg.relay_id = ""
        cdr = serialize_message(msg)
        view = ffi.new(view_type)
        # an ActionMessage may end before relay_id (a relay from before pools): its last 12 bytes
        # (relay_id "", pool_epoch) and the padding before them may be missing
        last = len(cdr) - (15 if cls is ActionMessage else 0)
        for n in range(4, last):
            assert parse(cdr[:n], n, view) == -1, f"{cls.__name__} cut at {n} bytes parsed"


def outcome(code: Code) -> Outcome:
    """An outcome with a distinct, non-default value in every field (by the dataclass's types)."""
    values = Values()
    kwargs = {}
    for f in dataclasses.fields(Outcome):
        if f.name == "code":
            kwargs[f.name] = code
        elif f.name == "actions":
            kwargs[f.name] = (np.arange(MODEL.action_len, dtype=np.float32) + 0.25
                              if code == Code.INFERENCE else None)
        elif f.name.endswith("_id"):
            kwargs[f.name] = values.string().encode()
        elif f.name.endswith("_ros_ns"):
            kwargs[f.name] = values.next() * 1_000_000_007
        else:
            kwargs[f.name] = values.next()
    kwargs["lane"] = 0
    return Outcome(**kwargs)


def c_outcome(o: Outcome):
    """The struct fer_outcome of o: its fields by name (a bytes field and its _len)."""
    c = ffi.new("struct fer_outcome *")
    for f in dataclasses.fields(Outcome):
        value = getattr(o, f.name)
        if f.name == "actions":
            c.has_actions = value is not None
        elif isinstance(value, bytes):
            getattr(c, f.name)[0:len(value)] = value
            setattr(c, f"{f.name}_len", len(value))
        else:
            setattr(c, f.name, int(value))
    return c


@pytest.mark.parametrize("pooled", [False, True])
def test_the_publisher_writes_every_answer_field_as_rclpy_does(pooled):
    core = Core(CoreConfig(obs_dim=MODEL.obs_dim, action_len=MODEL.action_len))
    pub = ActionPublisher._create(core, MODEL)
    pool = Pool("relay-wire-0001") if pooled else None
    if pool is not None:
        pool.set_epoch(7)
        assert lib.fer_publisher_set_pool(pub, pool.ptr) == lib.FER_OK
    stamp = 1_700_000_123_456_789_012
    set_somewhere: set[str] = set()
    default = {name: value for name, _, value in leaves(ActionMessage())}
    for code in Code:
        o = outcome(code)
        buf = ffi.new("uint8_t[]", lib.fer_action_cdr_max(pub))
        act = ffi.NULL if o.actions is None else ffi.from_buffer("float[]", o.actions)
        n = lib.fer_action_cdr(pub, c_outcome(o), act, stamp, buf, len(buf))
        assert n > 0
        ours = bytes(ffi.buffer(buf, n))
        reference = action_message(o, stamp, MODEL, pool)
        got = deserialize_message(ours, ActionMessage)
        for (name, _, want), (_, _, value) in zip(leaves(reference), leaves(got), strict=True):
            assert np.array_equal(np.asarray(value), np.asarray(want)), f"{code.name}: {name}"
            if not np.array_equal(np.asarray(value), np.asarray(default[name])):
                set_somewhere.add(name)
        # the same layout (Fast CDR leaves alignment padding as it found it: not compared)
        assert len(ours) == len(serialize_message(reference)), code.name
    # every field the reference sets for some outcome, the C path set too (checked above); and
    # what neither sets is only what the contract leaves empty
    unset = set(default) - set_somewhere
    if pooled:
        assert unset == {"header_frame_id"}
    else:
        assert unset == {"header_frame_id", "relay_id", "pool_epoch"}
