# SPDX-License-Identifier: Apache-2.0
"""The bench's relay and its light measuring client, talking over real DDS.

`relay_process(**params)` starts `flowedge-relayd` as its own process, as deployed, so nothing
of the bench shares the relay's GIL (overhead, overload, calibrate); `remote_relay(**params)` adds
a `RemoteRelay` that reads the relay's counters from flowedge/stats and sets its live parameters
through its parameter services. `bench_relay(**params)` starts a `RelayNode` in this process
instead (dedicated request thread, main executor, worker threads; see `harness.running_relay`):
the `--in-process` option of those benches, seen through a `LocalRelay`. A bench body measures
either through the one surface the two share (`BenchRelay`). `echo_process` is the transport
floor of bench/echo.py. Either way a `BenchClient` node spins on its own executor thread here.

The client stamps every request just before it
publishes it and every answer in its subscription callback (so client-side latency includes DDS
both ways and the client's executor), keyed by (session_id, sequence).

The pair runs in a private DDS domain (`bench_domain_id()`: `FLOWEDGE_BENCH_DOMAIN_ID`, else
derived from the process id, 200-229) with localhost-only discovery, so a relay or producer
elsewhere on the machine neither receives the bench's requests nor answers them.

All client times are `time.time_ns()` (CLOCK_REALTIME), which is also the ROS clock the relay
converts deadlines from (use_sim_time is off), so "on time" is `received_ns <= deadline`.
"""

from __future__ import annotations

import collections
import gc
import itertools
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import rclpy
from flowedge_relay_msgs.msg import ActionMessage, InferenceRequest
from rclpy.context import Context
from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

from flowedge_relay.core import Code
from flowedge_relay.executors import take_waiting
from flowedge_relay.model import ModelInfo, default_model_path
from flowedge_relay.policy import Policy
from flowedge_relay.timebase import ros_time, stamp_ns
from flowedge_relay_tools.harness import (
    ANSWER_DRAIN_MAX,
    build_request,
    load_served,
    model_path,
    relay_spinning,
    scene_inputs,
    served_model,
    spinning,
    wait_for,
    wait_for_relay,
)

INFERENCE = Code.INFERENCE
__all__ = ["model_path"]  # re-exported: the benches take --model through it


def percentiles(values, qs=(50, 99, 99.9)) -> list[float]:
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return [0.0 for _ in qs]
    return [float(v) for v in np.percentile(arr, qs)]


@dataclass(frozen=True)
class Answer:
    code: int
    received_ns: int  # client callback, CLOCK_REALTIME
    published_ns: int  # header.stamp: when the relay's publisher thread published it
    nfe_done: int
    remaining_nfe: int
    queue_ns: int
    compute_ns: int
    model_digest: bytes = b""  # the echo: the digest of the model that computed it
    frozen_rows: int = 0  # real-time chunking: rows of the answer that are the prefix's (d)
    chunk_start_ns: int = 0  # real-time chunking: the request's prefix_start, echoed
    reject_reason: int = 0  # REJECTED_CAPACITY: REJECT_CAPACITY or REJECT_FAIR_SHARE (§7.1)


_STAMP = struct.Struct("<iI")
_U32, _U64X2 = struct.Struct("<I"), struct.Struct("<QQ")
_DIMS_NFE = struct.Struct("<IIIiII")  # observation/action dims, horizon, deadline, remaining_nfe
_RTC_TAIL = struct.Struct("<IiI")  # frozen_rows, chunk_start (sec, nanosec)


def _aligned(pos: int, n: int) -> int:
    """pos rounded up to a multiple of n, counted from after the 4-byte encapsulation."""
    return 4 + ((pos - 4 + n - 1) & -n)


def parse_action(raw: bytes, received_ns: int) -> tuple[tuple[str, int], Answer]:
    """((session_id, sequence), Answer) straight from an ActionMessage's CDR bytes (XCDR1
    little endian, as rmw_fastrtps_cpp sends it), reading only what the bench keeps (the RTC
    fields and reject_reason 0 where the message definition predates them): a few us
    where deserializing the whole message (actions list, digest) takes ~26 us, which at 2x
    overload is 1,700 messages/s in the client that measures the relay."""
    sec, nanosec = _STAMP.unpack_from(raw, 4)
    pos = 12 + 4 + _U32.unpack_from(raw, 12)[0]  # header.frame_id
    code = raw[pos]
    pos = _aligned(pos + 1, 4)
    n = _U32.unpack_from(raw, pos)[0]
    session_id = raw[pos + 4:pos + 3 + n].decode("utf-8", "surrogatepass")
    pos = _aligned(pos + 4 + n, 8)
    sequence, _generation = _U64X2.unpack_from(raw, pos)
    pos += 20  # sequence, generation, retry_count
    n = _U32.unpack_from(raw, pos)[0]  # model_digest, with its NUL
    digest = raw[pos + 4:pos + 3 + n]
    pos += 4 + n
    pos = _aligned(pos, 4)
    remaining_nfe = _DIMS_NFE.unpack_from(raw, pos)[5]
    pos += _DIMS_NFE.size
    pos += 4 + 4 * _U32.unpack_from(raw, pos)[0]  # actions
    nfe_done = _U32.unpack_from(raw, pos)[0]
    pos = _aligned(pos + 4, 8)
    queue_ns, compute_ns = _U64X2.unpack_from(raw, pos)
    pos = _aligned(pos + 16 + 1, 4)  # after retry_reason
    rtc = len(raw) >= pos + _RTC_TAIL.size
    frozen, start_sec, start_nsec = _RTC_TAIL.unpack_from(raw, pos) if rtc else (0, 0, 0)
    pos += _RTC_TAIL.size  # client_id (a string), then reject_reason
    reason = 0
    if len(raw) >= pos + 4:
        pos += 4 + _U32.unpack_from(raw, pos)[0]
        reason = raw[pos] if len(raw) > pos else 0
    ans = Answer(code, received_ns, sec * 1_000_000_000 + nanosec, nfe_done, remaining_nfe,
                 queue_ns, compute_ns, digest, frozen,
                 start_sec * 1_000_000_000 + start_nsec, reason)  # fmt: skip
    return (session_id, sequence), ans


class BenchClient:
    """Publishes requests, records send and receive times (no other work in its callbacks)."""

    #: the relay's own process where relay_process started it (its log lines, its pid)
    process: NodeProcess | None = None

    def __init__(self, node: Node, model: ModelInfo | Policy, qos_depth: int = 10_000,
                 plain: bool = False) -> None:  # fmt: skip
        self.node, self.model = node, model
        qos = QoSProfile(
            depth=qos_depth, history=HistoryPolicy.KEEP_LAST,
            reliability=ReliabilityPolicy.RELIABLE,
        )  # fmt: skip
        self.pub = node.create_publisher(InferenceRequest, "flowedge/requests", qos)
        # raw: the callback gets the CDR bytes and parse_action reads the few fields it needs;
        # plain: an ordinary subscription, one executor trip and a whole ActionMessage per
        # answer, as a robot's node receives them (calibrate, calibrate-check)
        self.sub = node.create_subscription(
            ActionMessage, "flowedge/actions", self._on_message if plain else self._on_action,
            qos, raw=not plain,
        )  # fmt: skip
        self._seq = itertools.count(1)
        self.sent: dict[tuple[str, int], int] = {}
        self.answers: dict[tuple[str, int], Answer] = {}
        self.extra_answers = 0  # a second answer for one key: would break "exactly one"
        self._cv = threading.Condition()
        self.serve(model)

    def serve(self, model) -> None:
        """Build requests for `model` from now on (harness.served_model: a Policy, ModelInfo or
        producer.ServedModel): its digest, and 16 detour scenes cycled by sequence, an
        observation vector or a package's tensors."""
        self._served = served_model(model)
        self._inputs = [scene_inputs(self._served, 12345 + i) for i in range(16)]

    @property
    def digest(self) -> str:
        """The digest the requests are built with."""
        return self._served.digest

    @property
    def served(self):
        """The producer.ServedModel the requests are built for (shape, rtc_mode, max delay)."""
        return self._served

    def _on_action(self, msg: bytes) -> None:
        """Record the answer, then the answers already waiting, without an executor trip each
        (ANSWER_DRAIN_MAX at most, as the relay drains its requests): at 2x overload with
        B = 8 the client receives ~1,800 answers/s on the relay's two cores, and one rclpy
        executor trip per answer let them queue for up to 100 ms before their receive time."""
        self._record(msg)
        take_waiting(self.sub, self._record, ANSWER_DRAIN_MAX)

    def _on_message(self, msg: ActionMessage) -> None:
        """An ordinary subscriber's callback: the deserialized message, stamped on arrival."""
        received = time.time_ns()
        ans = Answer(msg.code, received, stamp_ns(msg.header.stamp), msg.nfe_done,
                     msg.remaining_nfe, msg.queue_ns, msg.compute_ns,
                     msg.model_digest.encode(), msg.frozen_rows, stamp_ns(msg.chunk_start),
                     msg.reject_reason)
        self._store((msg.session_id, msg.sequence), ans)

    def _record(self, raw: bytes) -> None:
        self._store(*parse_action(raw, time.time_ns()))

    def _store(self, key: tuple[str, int], ans: Answer) -> None:
        with self._cv:
            if key in self.answers:
                self.extra_answers += 1
            self.answers[key] = ans
            self._cv.notify_all()

    def next_sequence(self) -> int:
        """Sequences unique across the whole run, so (session_id, sequence) keys never repeat."""
        return next(self._seq)

    def request(
        self, session: str, sequence: int, nfe: int, *, generation: int = 1,
        deadline_ns: int = 0, noise_seed: int = 0, prefix: np.ndarray | None = None,
        action_period_ns: int = 0, client_id: str = "",
    ) -> InferenceRequest:  # fmt: skip
        """A request of the served model; with `prefix` (rows not yet executed) and
        `action_period_ns` a real-time chunking one, built by producer.build_request (which
        checks it against the served model), its prefix_start set by send(); `client_id` names
        the robot it is from (the fair share's unit, docs/design.md §7.1)."""
        arrays = self._inputs[sequence % len(self._inputs)]
        if prefix is not None:
            from flowedge_relay import producer

            req = producer.build_request(
                self._served, arrays, session_id=session, sequence=sequence,
                generation=generation, remaining_nfe=nfe, noise_seed=noise_seed,
                prefix=(prefix, 0), action_period_ns=action_period_ns,
            )  # fmt: skip
        else:
            req = build_request(
                self._served, 0, arrays=arrays, session_id=session, sequence=sequence,
                generation=generation, remaining_nfe=nfe, noise_seed=noise_seed,
            )  # fmt: skip
        if deadline_ns:
            req.deadline = ros_time(deadline_ns)
        req.client_id = client_id
        return req

    def send(self, req: InferenceRequest, slack_ns: int = 0, grid_ns: int = 0) -> int:
        """Publish now; with slack_ns the deadline is set to send time + slack; with grid_ns
        the prefix_start is the first multiple of grid_ns (ROS time) at or after the send time:
        the robot's next row boundary, from the same clock reading. Returns send ns."""
        now = time.time_ns()
        req.origin_stamp = ros_time(now)
        if slack_ns:
            req.deadline = ros_time(now + slack_ns)
        if grid_ns:
            req.prefix_start = ros_time(-(-now // grid_ns) * grid_ns)
        self.sent[(req.session_id, req.sequence)] = now
        self.pub.publish(req)
        return now

    def answer(self, key: tuple[str, int], timeout: float) -> Answer | None:
        end = time.monotonic() + timeout
        with self._cv:
            while key not in self.answers:
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self._cv.wait(left)
            return self.answers[key]

    def wait_keys(self, keys, timeout: float) -> bool:
        keys = list(keys)
        end = time.monotonic() + timeout
        with self._cv:
            while True:
                if all(k in self.answers for k in keys):
                    return True
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.05))

    def count_answered(self, keys) -> int:
        with self._cv:
            return sum(1 for k in keys if k in self.answers)


def round_trip(client: BenchClient, session: str, nfe: int, timeout: float = 10.0,
               noise_seed: int = 0) -> tuple[int, Answer]:
    """One request of `nfe` NFE (no deadline), sent now and answered: (end-to-end ns from the
    client's publish to its receive, the answer). No answer within `timeout` is a TimeoutError,
    an answer other than INFERENCE a RuntimeError (calibrate, overhead: sequential requests)."""
    req = client.request(session, client.next_sequence(), nfe, noise_seed=noise_seed)
    sent = client.send(req)
    ans = client.answer((req.session_id, req.sequence), timeout)
    if ans is None:
        raise TimeoutError(f"{session}: no answer from the relay within {timeout} s")
    if ans.code != INFERENCE:
        raise RuntimeError(f"{session}: request ended with code {ans.code}")
    return ans.received_ns - sent, ans


@contextmanager
def collector_paused() -> Iterator[None]:
    """No garbage collection in this process for the block (a trace's seconds), one before.

    The client keeps every answer of a trace; as those dicts grow, each full collection walks
    them all while holding the GIL (~9 ms for 16k answers here, more on a slow vCPU), and the
    client's send and receive stamps would carry those pauses as if they were the relay's. The
    client's per-message objects are freed by reference counting; only cycles wait for the end.
    """
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def bench_domain_id() -> int:
    """FLOWEDGE_BENCH_DOMAIN_ID if set, else 200 + pid % 30 (test runs use 100-199)."""
    return int(os.environ.get("FLOWEDGE_BENCH_DOMAIN_ID", 200 + os.getpid() % 30))


@contextmanager
def private_context() -> Iterator[Context]:
    """An rclpy context in the bench's own domain, localhost only; shut down on exit."""
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    ctx = Context()
    rclpy.init(context=ctx, domain_id=bench_domain_id())
    try:
        yield ctx
    finally:
        ctx.try_shutdown()


def saturate(client, workers: int, nfe: int, seconds: float, session: str,
             at_end: Callable[[], None] | None = None) -> list[Answer]:
    """Keep 2W+2 no-deadline requests of nfe NFE outstanding for `seconds`; the answers, in
    order. The lanes never idle, so this is the relay under sustained load. `at_end` is called
    once when the sending stops, before the outstanding requests drain (the last moment the
    lanes are all still busy: read figures of the saturated relay there)."""
    outstanding: list[tuple[str, int]] = []
    answers: list[Answer] = []
    window = 2 * workers + 2
    end = time.monotonic() + seconds
    while time.monotonic() < end or outstanding:
        if at_end is not None and time.monotonic() >= end:
            at_end()
            at_end = None
        while len(outstanding) < window and time.monotonic() < end:
            req = client.request(session, client.next_sequence(), nfe)
            client.send(req)
            outstanding.append((req.session_id, req.sequence))
        ans = client.answer(outstanding[0], 10.0)
        if ans is None or ans.code != INFERENCE:
            raise RuntimeError(f"saturation request failed: {ans}")
        outstanding.pop(0)
        answers.append(ans)
    return answers


def wait_idle(relay: BenchRelay, timeout: float = 10.0) -> bool:
    """The relay's queue is empty and no lane is busy."""

    def idle() -> bool:
        s = relay.stats()
        return s.queue_depth == 0 and s.lanes_busy == 0

    return wait_for(idle, timeout, period=0.005)


@contextmanager
def bench_relay(plain: bool = False, **params) -> Iterator[tuple[object, BenchClient]]:
    """A RelayNode with these parameter overrides and a BenchClient (`plain`: an ordinary
    subscriber, BenchClient), torn down in order."""
    with private_context() as ctx, relay_spinning(ctx, "flowedge_bench_client", **params) as (
        node,
        client_node,
    ):
        if node.relay.model is None:
            raise RuntimeError(f"relay could not load its model: {node.relay.model_error}")
        client = BenchClient(client_node, node.relay.model, plain=plain)
        with spinning(client_node, context=ctx):
            wait_for_relay(client.pub, client.sub)
            yield node, client


class NodeProcess:
    """A node's `python -m MODULE --ros-args ...` as its own process, in the bench's domain:
    up once it logs "relay up"; stdout drained on a thread (kept for errors); SIGINT stops it.

    `switch_interval_s` runs the module after `sys.setswitchinterval(...)` (a bench-only knob:
    the GIL hand-over interval of the relay process); `env` adds environment variables;
    `wrapper` runs it under a command that execs it (`prlimit ... --`, `setpriv ... --`); `args`
    go before --ros-args (`--drill`)."""

    def __init__(self, module: str, ros_args: list[str], timeout: float = 60.0,
                 env: dict[str, str] | None = None,
                 switch_interval_s: float | None = None,
                 wrapper: Sequence[str] = (), args: Sequence[str] = ()) -> None:  # fmt: skip
        # SIGINT starts ignored in a background job (`cmd &`), and a Python started with it
        # ignored never raises KeyboardInterrupt: the prelude restores it, so stop() works
        # however the bench was started.
        prelude = "import runpy, signal, sys; signal.signal(signal.SIGINT, " \
                  "signal.default_int_handler); "
        if switch_interval_s is not None:
            prelude += f"sys.setswitchinterval({switch_interval_s!r}); "
        prelude += f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
        cmd = [*wrapper, sys.executable, "-c", prelude, *args, "--ros-args", *ros_args]
        self.module = module
        env = {**os.environ, "ROS_DOMAIN_ID": str(bench_domain_id()), "PYTHONUNBUFFERED": "1",
               "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST", **(env or {})}  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env)  # fmt: skip
        self.lines: list[str] = []
        self._up = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._up.wait(timeout) or self.proc.poll() is not None:
            self.stop()
            raise RuntimeError(f"{module} did not come up:\n" + "".join(self.lines[-20:]))

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if "relay up" in line:
                self._up.set()
        self._up.set()  # process ended: do not wait out the timeout

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
        return self.proc.returncode


@contextmanager
def client_of(proc: NodeProcess, info: ModelInfo | Policy, namespace: str = "",
              plain: bool = False) -> Iterator[BenchClient]:  # fmt: skip
    """A BenchClient (own context, bench domain) matched to `proc`'s topics; on exit the client
    goes, then the process gets SIGINT and must exit 0."""
    try:
        with private_context() as ctx:
            node = rclpy.create_node("flowedge_bench_client", namespace=namespace or None,
                                     context=ctx)  # fmt: skip
            try:
                client = BenchClient(node, info, plain=plain)
                with spinning(node, context=ctx):
                    wait_for_relay(client.pub, client.sub)
                    yield client
            finally:
                node.destroy_node()
    finally:
        if proc.stop() != 0:
            raise RuntimeError(f"{proc.module} exited with {proc.proc.returncode}:\n"
                               + "".join(proc.lines[-20:]))  # fmt: skip


def parse_relay_params(items: list[str]) -> dict[str, object]:
    """NAME:=VALUE strings (as after `ros2 run ... -p`) to parameter overrides (YAML values)."""
    import yaml

    out = {}
    for item in items:
        name, sep, value = item.partition(":=")
        if not sep or not name:
            raise SystemExit(f"--relay-param wants NAME:=VALUE, got {item!r}")
        out[name] = yaml.safe_load(value)
    return out


def _ros_value(v: object) -> str:
    """A parameter value as `-p name:=value` wants it (YAML; lists as [a, b])."""
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_ros_value(x) for x in v) + "]"
    return str(v)


def relay_ros_args(params: dict[str, object], namespace: str = "") -> list[str]:
    """The `--ros-args` of a relay process with these parameter overrides (under `namespace`)."""
    args = [a for k, v in params.items() for a in ("-p", f"{k}:={_ros_value(v)}")]
    return args + ["-r", f"__ns:={namespace}"] if namespace else args


#: the module `relay_process` runs: flowedge-relayd
RELAY_MODULE = "flowedge_relay.cli"


@contextmanager
def relay_process(env: dict[str, str] | None = None, switch_interval_s: float | None = None,
                  namespace: str = "", wrapper: Sequence[str] = (),
                  relay_module: str = RELAY_MODULE, plain: bool = False,
                  **params) -> Iterator[tuple[ModelInfo | Policy, BenchClient]]:  # fmt: skip
    """`flowedge-relayd` in its own process (as deployed) with these parameters, and a
    BenchClient in this one (its `process` is the relay's NodeProcess); under `namespace`
    (e.g. /b8) both, so relays can run side by side; under `wrapper` (NodeProcess).
    `relay_module` runs the relay through another entry point (bench/nfe_probe.py: probed). A
    fault parameter (fault_*) starts it for a drill (--drill)."""
    info = load_served(params.get("model_path", default_model_path()))
    drill = ["--drill"] if any(name.startswith("fault_") for name in params) else []
    proc = NodeProcess(relay_module, relay_ros_args(params, namespace), env=env,
                       switch_interval_s=switch_interval_s, wrapper=wrapper,
                       args=drill)  # fmt: skip
    with client_of(proc, info, namespace=namespace, plain=plain) as client:
        client.process = proc
        yield info, client


@dataclass(frozen=True)
class RemoteStats:
    """The relay counters a bench needs, from one RelayStats message (names as core.Stats)."""

    stamp_ns: int
    accepted: int
    displaced: int
    nfe_total: int
    nfe_wasted: int
    calibration_misses: int
    queue_depth: int
    lanes_busy: int
    nfe_ns_p50: float
    nfe_ns_p99: float
    nfe_ns_observed_tail: int
    nfe_ns_in_use: int
    step_ns_p99_full: float = 0.0  # batch slots: p99 of a step with batch_slots rows
    received: int = 0  # requests the relay's intake took (valid or not)
    middleware_lost: int = 0  # requests the middleware reported lost before the intake
    outputs_dropped: int = 0  # answers dropped at a full outcome ring (rejection + action)
    invalid_discarded: int = 0  # requests discarded by validation (every reason)
    decided: int = 0  # outcomes the relay decided, every code (one per answered request)


class LocalRelay:
    """A RelayNode in this process (the benches' --in-process), seen as a bench sees any relay:
    `model`, `workers`, `lanes`, `stats()`, `nfe_percentiles()`, `prefix_percentiles()` and
    `set_parameters()`, the surface RemoteRelay offers too, so one bench body serves both."""

    def __init__(self, node) -> None:
        self.node = node
        self.model = node.relay.model
        self.workers = node.relay.core.workers
        self.lanes = node.relay.core.lanes

    def stats(self):
        return self.node.relay.core.stats()

    def nfe_percentiles(self) -> tuple[float, float, int]:
        return self.node.relay.pool.nfe_percentiles()

    def prefix_percentiles(self) -> tuple[float, float, int]:
        return self.node.relay.pool.prefix_percentiles()

    def set_parameters(self, params, atomically: bool = False) -> list:
        if atomically:
            return [self.node.set_parameters_atomically(params)]
        return self.node.set_parameters(params)


class RemoteRelay:
    """A relay in another process, seen through its ROS interface only: counters from
    flowedge/stats, live parameters through its parameter services; the surface of LocalRelay,
    and what only a process apart can show (its cost and work over a window of stats)."""

    def __init__(self, node: Node, info: ModelInfo | Policy, workers: int,
                 relay_name: str = "flowedge_relay", batch_slots: int = 1) -> None:  # fmt: skip
        from diagnostic_msgs.msg import DiagnosticArray
        from flowedge_relay_msgs.msg import RelayStats
        from rclpy.parameter_client import AsyncParameterClient

        self.model, self.workers = info, workers
        self.batch_slots = batch_slots
        self.lanes = workers * batch_slots  # what saturating it takes (Core.lanes)
        self._cv = threading.Condition()
        self._latest = None
        # (stamp ns, nfe_ns_in_use, nfe_ns_observed_tail, nfe_total, nfe_ns_p50, nfe_ns_p99,
        # lane_utilisation since the previous message) of every stats message, ~10 Hz
        self.history: collections.deque = collections.deque(maxlen=200_000)
        # the relay's own status names start with its full name (several may share the topic)
        ns = node.get_namespace().strip("/")
        self._status_name = f"{ns}/{relay_name}" if ns else relay_name
        node.create_subscription(RelayStats, "flowedge/stats", self._on_stats, 10)
        # the `workers` status of /diagnostics (1 Hz): (stamp, level, message, values)
        self._workers_status: tuple[int, int, str, dict[str, str]] | None = None
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)
        self._params = AsyncParameterClient(node, relay_name)
        if not self._params.wait_for_services(timeout_sec=20.0):
            raise TimeoutError(f"no parameter services of {relay_name}")
        self.stats()  # the stats topic is matched

    def _on_stats(self, msg) -> None:
        stamp = stamp_ns(msg.stamp)
        with self._cv:
            self.history.append((stamp, msg.nfe_ns_in_use, msg.nfe_ns_observed_tail,
                                 msg.nfe_total, msg.nfe_ns_p50, msg.nfe_ns_p99,
                                 msg.lane_utilisation))
            self._latest = msg
            self._cv.notify_all()

    def _on_diagnostics(self, msg) -> None:
        for status in msg.status:
            if status.name == f"{self._status_name}: workers":
                values = {kv.key: kv.value for kv in status.values}
                with self._cv:
                    self._workers_status = (stamp_ns(msg.header.stamp), ord(status.level),
                                            status.message, values)  # fmt: skip
                    self._cv.notify_all()

    def workers_status(self, timeout: float = 5.0,
                       fresh: bool = True) -> tuple[int, str, dict[str, str]]:  # fmt: skip
        """(level, message, values) of the first `workers` diagnostics status stamped after this
        call (the relay stamps before its snapshot, so it covers everything that came before);
        with fresh False, the latest one (at most a second old) once there is one."""
        since = time.time_ns() if fresh else 0
        end = time.monotonic() + timeout
        with self._cv:
            while self._workers_status is None or self._workers_status[0] < since:
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError("no fresh workers status on /diagnostics from the relay")
                self._cv.wait(min(left, 0.05))
            return self._workers_status[1:]

    def prefix_percentiles(self, timeout: float = 5.0) -> tuple[float, float, int]:
        """(p50, p99, samples) of the relay's recent prefix passes, from a fresh `workers`
        status."""
        values = self.workers_status(timeout)[2]
        return (float(values.get("prefix_ns_p50", 0.0)), float(values.get("prefix_ns_p99", 0.0)),
                int(values.get("prefix_samples", 0)))  # fmt: skip

    def stats(self, timeout: float = 10.0) -> RemoteStats:
        """The first RelayStats snapshot taken after this call (so it counts what came before)."""
        since = time.time_ns()
        end = time.monotonic() + timeout
        with self._cv:
            while True:
                m = self._latest
                stamp = 0 if m is None else stamp_ns(m.stamp)
                if m is not None and stamp >= since:
                    break
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError("no fresh flowedge/stats from the relay")
                self._cv.wait(min(left, 0.05))
        return RemoteStats(
            stamp_ns=stamp, accepted=m.accepted, displaced=m.displaced, nfe_total=m.nfe_total,
            nfe_wasted=m.nfe_wasted, calibration_misses=m.calibration_misses,
            queue_depth=m.queue_depth, lanes_busy=m.lanes_busy, nfe_ns_p50=m.nfe_ns_p50,
            nfe_ns_p99=m.nfe_ns_p99, nfe_ns_observed_tail=m.nfe_ns_observed_tail,
            nfe_ns_in_use=m.nfe_ns_in_use, step_ns_p99_full=m.step_ns_p99_full,
            received=m.received, middleware_lost=m.middleware_lost,
            outputs_dropped=m.rejection_outputs_dropped + m.action_outputs_dropped,
            invalid_discarded=m.invalid_discarded,
            decided=m.inference + m.rejected_stale + m.rejected_deadline + m.rejected_capacity
            + m.expired,
        )  # fmt: skip

    def set_parameters(self, params, atomically: bool = False) -> list:
        """Set live parameters through the relay's parameter service: the results (one, if
        atomically: all or none, as `ros2 param load` does with one file)."""
        if atomically:
            future = self._params.set_parameters_atomically(params)
        else:
            future = self._params.set_parameters(params)
        end = time.monotonic() + 20.0
        while not future.done() and time.monotonic() < end:
            time.sleep(0.005)
        if not future.done():
            raise TimeoutError("the relay did not answer set_parameters")
        result = future.result()
        return [result.result] if atomically else list(result.results)

    def _window(self, start_ns: int, end_ns: int) -> list[tuple]:
        """The history rows stamped between two wall times."""
        with self._cv:
            return [r for r in self.history if start_ns <= r[0] <= end_ns]

    def cost_during(self, start_ns: int, end_ns: int) -> dict | None:
        """nfe_ns_in_use and the observed tail the relay reported between two wall times."""
        rows = self._window(start_ns, end_ns)
        if not rows:
            return None
        in_use = np.asarray([r[1] for r in rows], np.float64)
        tail = np.asarray([r[2] for r in rows], np.float64)
        return {"samples": len(rows), "nfe_ns_in_use_median": float(np.median(in_use)),
                "nfe_ns_in_use_max": float(in_use.max()),
                "observed_tail_median": float(np.median(tail)),
                "observed_tail_max": float(tail.max())}  # fmt: skip

    def work_between(self, start_ns: int, end_ns: int) -> tuple[float, float, float] | None:
        """(NFE per second, step p50 ns, step p99 ns) from the relay's own stats between two
        wall times: the nfe_total counter over the snapshots' own stamps (so neither the 10 Hz
        period nor this process's delays enter the rate), the step figures of the last one.
        None with fewer than two snapshots in the window."""
        rows = self._window(start_ns, end_ns)
        if len(rows) < 2 or rows[-1][0] <= rows[0][0]:
            return None
        rate = (rows[-1][3] - rows[0][3]) / ((rows[-1][0] - rows[0][0]) * 1e-9)
        return rate, float(rows[-1][4]), float(rows[-1][5])

    def capacity_between(self, start_ns: int, end_ns: int) -> float | None:
        """NFE per second the lanes would compute if never idle, at the cost they measured between
        two wall times: the NFEs done over the lane time they took (each stats message's
        lane_utilisation covers the interval since the one before, so busy lane time is the sum
        of utilisation x interval, in units of all lanes). None with too little in the window."""
        rows = self._window(start_ns, end_ns)
        if len(rows) < 2:
            return None
        busy_s = sum(b[6] * (b[0] - a[0]) * 1e-9 for a, b in itertools.pairwise(rows))
        nfe = rows[-1][3] - rows[0][3]
        return nfe / busy_s if busy_s > 0 and nfe > 0 else None

    def utilisation_between(self, start_ns: int, end_ns: int) -> float | None:
        """The lanes' mean busy fraction (all lanes together, 0..1) between two wall times, from
        the stats messages' lane_utilisation; None with too little in the window."""
        rows = self._window(start_ns, end_ns)
        if len(rows) < 2:
            return None
        busy_s = sum(b[6] * (b[0] - a[0]) for a, b in itertools.pairwise(rows))
        return busy_s / (rows[-1][0] - rows[0][0])

    def nfe_percentiles(self) -> tuple[float, float, int]:
        """(p50, p99, 0) of the relay's recent worker NFEs, as its stats report them."""
        s = self.stats()
        return s.nfe_ns_p50, s.nfe_ns_p99, 0


#: what a bench measures a relay through, in this process or its own
BenchRelay = LocalRelay | RemoteRelay


@contextmanager
def remote_relay(env: dict[str, str] | None = None, switch_interval_s: float | None = None,
                 namespace: str = "", wrapper: Sequence[str] = (),
                 relay_module: str = RELAY_MODULE, plain: bool = False,
                 **params) -> Iterator[tuple[RemoteRelay, BenchClient]]:  # fmt: skip
    """`flowedge-relayd` in its own process, a RemoteRelay view of it and a BenchClient (both
    under `namespace`, if given; the process under `wrapper`, NodeProcess)."""
    with relay_process(env=env, switch_interval_s=switch_interval_s, namespace=namespace,
                       wrapper=wrapper, relay_module=relay_module, plain=plain,
                       **params) as (info, client):  # fmt: skip
        yield RemoteRelay(client.node, info, int(params.get("workers", 1)),
                          batch_slots=int(params.get("batch_slots", 1))), client


@contextmanager
def relay_for_bench(in_process: bool, env: dict[str, str] | None = None, plain: bool = False,
                    **params) -> Iterator[tuple[BenchRelay, BenchClient]]:  # fmt: skip
    """(relay, client): a RemoteRelay of its own flowedge-relayd process (default, as deployed;
    `env` added to its environment) or, with in_process, a LocalRelay of a RelayNode in this
    process; `plain`: the client receives as an ordinary rclpy subscriber (BenchClient)."""
    if in_process:
        if env:
            raise ValueError("an environment for the relay needs it in its own process")
        with bench_relay(plain=plain, **params) as (node, client):
            yield LocalRelay(node), client
    else:
        with remote_relay(env=env, plain=plain, **params) as pair:
            yield pair


@contextmanager
def echo_process(info: ModelInfo | Policy) -> Iterator[BenchClient]:
    """The transport floor (bench/echo.py) in its own process under /echo, and its client."""
    proc = NodeProcess("flowedge_relay_tools.bench.echo", ["-r", "__ns:=/echo"])
    with client_of(proc, info, namespace="/echo") as client:
        yield client


def set_policy(relay, **values) -> None:
    """Set live relay parameters (nfe_ns, admission_reserve_ns, queue_timeout_ms, ...)."""
    from rclpy.parameter import Parameter

    results = relay.set_parameters([Parameter(k, value=v) for k, v in values.items()])
    bad = [r.reason for r in results if not r.successful]
    if bad:
        raise ValueError(f"relay refused parameters {values}: {bad}")


def warm_up(client: BenchClient, n: int = 5, nfe: int = 2, timeout: float = 10.0) -> None:
    """A few sequential requests so DDS, the workers and ONNX Runtime are warm."""
    for _ in range(n):
        req = client.request("bench-warmup", client.next_sequence(), nfe)
        client.send(req)
        if client.answer((req.session_id, req.sequence), timeout) is None:
            raise TimeoutError("no answer to a warm-up request: is the relay receiving?")
