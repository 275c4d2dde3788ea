# SPDX-License-Identifier: Apache-2.0
"""Every parameter of the relay node in one table (docs/design.md §9).

Each entry becomes a `declare_parameter` with a ParameterDescriptor: description, range (rclpy
enforces it on every set) and read_only where a change would need a restart (sizes of structures
allocated once, threads already started). `config/relay.yaml` carries the same defaults with a
comment each; test/test_parameters.py keeps the two in step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rcl_interfaces.msg import (
    FloatingPointRange,
    IntegerRange,
    ParameterDescriptor,
    ParameterType,
    SetParametersResult,
)
from rclpy.node import Node
from rclpy.parameter import Parameter

from flowedge_relay.client_weights import WEIGHT_MAX, WEIGHT_RULES, parse_client_weights
from flowedge_relay.model import SOLVERS
from flowedge_relay.realtime import MAX_CPU
from flowedge_relay.rtc import RTC_MODES

AGE_GATES = ("off", "retries", "all")
COST_MODELS = ("static", "adaptive")
QOS_HISTORIES = ("keep_all", "keep_last")
NFE_LOOPS = ("auto", "python")  # workers.NFE_LOOPS (not imported: workers pulls in onnxruntime)
MINUTE_NS = 60_000_000_000
HOUR_MS = 3_600_000
UINT32_MAX = 2**32 - 1
CPU_AFFINITIES = ("executor_cpu_affinity", "worker_cpu_affinity", "publisher_cpu_affinity")
#: read-only values check_value judges that rclpy's types and ranges let through: refused at start
START_CHECKED = ("request_topics", "execution_providers", "client_weights", "pool", "pool_spill",
                 *CPU_AFFINITIES)
#: set together with model_path while configured: the swapped-to model's calibration (§9)
SWAP_CALIBRATION = ("nfe_ns", "prefix_ns", "admission_reserve_ns")
POOL_NAME_MAX_BYTES = 64  # a name, compared in each announcement; not a payload


@dataclass(frozen=True)
class Spec:
    name: str
    default: object  # a Parameter.Type for an array parameter declared unset
    description: str
    low: float | None = None
    high: float | None = None
    read_only: bool = True
    choices: tuple[str, ...] = ()  # an enum: the strings it takes (check_value)

    def descriptor(self, declaring: bool = False) -> ParameterDescriptor:
        """The parameter's descriptor. An enum is declared (`declaring`) writable and with
        dynamic typing, so a value YAML typed as a bool or number reaches `declare_all` instead
        of rclpy's type error; a live enum keeps dynamic typing, so a live set reaches the
        node's check too (check_set), which refuses any non-string."""
        d = ParameterDescriptor(description=self.description,
                                read_only=self.read_only and not declaring)
        if self.choices:
            d.dynamic_typing = declaring or not self.read_only
            if not d.dynamic_typing:
                d.type = ParameterType.PARAMETER_STRING
        if self.low is not None:
            if isinstance(self.default, float):
                d.floating_point_range = [
                    FloatingPointRange(from_value=float(self.low), to_value=float(self.high))
                ]
            else:
                d.integer_range = [
                    IntegerRange(from_value=int(self.low), to_value=int(self.high), step=1)
                ]
        return d


SPECS: tuple[Spec, ...] = (
    # Model and compute
    Spec(
        "model_path",
        "",
        "ONNX policy file or policy package directory (policy.yaml); empty = the bundled "
        "policy_small.onnx. Set while configured: a model swap (loaded and warmed beside the "
        "model it replaces, refused with the loader's message if it cannot be served)",
        read_only=False,
    ),
    Spec(
        "autostart",
        True,
        "configure and activate at start (false: wait unconfigured for a lifecycle manager: "
        "ros2 lifecycle set, nav2's lifecycle_manager or launch_ros lifecycle events)",
    ),
    Spec("solver", "euler", "ODE solver for the flow: euler (1 NFE/step) or midpoint (2 NFE/step)",
         choices=SOLVERS),
    Spec(
        "rtc_mode",
        "auto",
        "real-time chunking (docs/design.md §5.4): auto = what the policy declares (policy.yaml "
        "rtc:), else off; training_time (a policy trained for it); inpaint (any flow policy on "
        "the euler solver, a package or a single .onnx file); "
        "off: a request with prefix_actions is discarded as prefix_unsupported",
        choices=RTC_MODES,
    ),
    Spec("workers", 1, "worker threads = EDF lanes, each with its own ONNX Runtime session", 1, 64),
    Spec(
        "batch_slots",
        1,
        "requests each worker holds and advances together, one batched model call per step "
        "(docs/design.md §5.1); admission then simulates workers x batch_slots lanes and nfe_ns "
        "is the cost of one batched step with batch_slots rows",
        1,
        64,
    ),
    Spec("intra_op_threads", 1, "ONNX Runtime intra-op threads per worker session", 1, 64),
    Spec("max_nfe", 64, "largest remaining_nfe accepted; above it a request is invalid", 1, 4096),
    Spec(
        "nfe_loop",
        "auto",
        "auto: each worker runs its NFEs in C through ONNX Runtime's C API, without the GIL, "
        "where it can (CPU provider, the onnxruntime wheel's library loads), else in Python; "
        "python: always the Python loop (the workers diagnostic says which runs)",
        choices=NFE_LOOPS,
    ),
    Spec(
        "execution_providers",
        ["CPUExecutionProvider"],
        "ONNX Runtime execution providers, in order; one that is not available is the model "
        "ERROR (listing those that are), never a silent fall back to CPU",
    ),
    Spec(
        "max_request_bytes",
        16 * 1024 * 1024,
        "largest total tensor payload (InferenceRequest.inputs data) of one request, bytes; "
        "above it the request is discarded as request_too_large",
        1,
        2**31 - 1,
    ),
    # Capacity
    Spec("queue_capacity", 64, "queued (not running) requests held by the EDF queue", 1, 65536),
    Spec("max_sessions", 256, "producer sessions tracked; idle ones are evicted", 1, 65536),
    Spec("session_idle_ms", 10_000, "a session with no work unseen this long is idle", 0, HOUR_MS),
    # Fair share per client (docs/design.md §7.1)
    Spec(
        "fair_share",
        False,
        "keep each client (InferenceRequest.client_id, else its session_id) within its "
        "weighted share of the lanes when the relay is contended: a request of a client within "
        "its share may displace queued work of clients over theirs (answered REJECTED_CAPACITY, "
        "reject_reason fair_share); false = admission does not ask whose request it is; live: "
        "a set applies from the next admission decision",
        read_only=False,
    ),
    Spec(
        "client_weights",
        Parameter.Type.STRING_ARRAY,
        'weights of clients as "pattern=weight" (glob on client_id, the first match wins, '
        f"weight 1..{WEIGHT_MAX}, at most {WEIGHT_RULES} rules); unset = every client weight 1; "
        "live: a set re-weighs every tracked client from the next decision",
        read_only=False,
    ),
    Spec("max_clients", 64, "clients tracked with fair_share; the least recently active idle "
         "one is evicted (counted) to make room", 1, 4096),
    # Calibrated admission (ADR 0015, docs/design.md#decision-record): live
    Spec(
        "nfe_ns",
        0,
        "measured upper bound of one NFE on this host in ns; 0 = admission test off",
        0,
        MINUTE_NS,
        read_only=False,
    ),
    Spec(
        "admission_reserve_ns",
        0,
        "fixed safety reserve added to every finish time in the admission test, ns",
        0,
        MINUTE_NS,
        read_only=False,
    ),
    Spec(
        "prefix_ns",
        0,
        "measured upper bound of a two-phase model's prefix pass in ns, paid once per request "
        "before its first NFE (docs/design.md §5); ignored for single-graph models",
        0,
        MINUTE_NS,
        read_only=False,
    ),
    # Cost model (docs/design.md §5.2): live
    Spec(
        "cost_model",
        "static",
        "static: admit with nfe_ns as given; adaptive: with max(nfe_ns, measured NFE tail)",
        read_only=False,
        choices=COST_MODELS,
    ),
    Spec(
        "cost_window_ms",
        1000,
        "window of the measured NFE tail (drift alarm, adaptive admission), ms",
        4,
        HOUR_MS,
        read_only=False,
    ),
    Spec(
        "cost_quantile",
        0.9,
        "which quantile of the NFEs measured in the window is the tail (1.0 = the maximum); "
        "the busiest block's mean busy span per step (a worker's whole requests) can raise it",
        0.5,
        1.0,
        read_only=False,
    ),
    # Retries and queue age (docs/design.md §6): live
    Spec(
        "reject_if_retry_count_gte",
        1,
        "a request with retry_count >= this is a retry for the age gate",
        0,
        UINT32_MAX,
        read_only=False,
    ),
    Spec(
        "age_gate",
        "retries",
        "who gets 'age >= slack -> REJECTED_DEADLINE': off, retries or all",
        read_only=False,
        choices=AGE_GATES,
    ),
    Spec(
        "reject_if_queue_age_ms_gte",
        0,
        "reject any request at least this old (now - origin_stamp), ms; 0 = off",
        0,
        HOUR_MS,
        read_only=False,
    ),
    Spec(
        "queue_timeout_ms",
        0,
        "Triton-style policy: reject at dispatch work queued longer than this, ms; 0 = off",
        0,
        HOUR_MS,
        read_only=False,
    ),
    # ROS interface
    Spec("request_topics", ["flowedge/requests"], "topics carrying InferenceRequest"),
    Spec(
        "request_qos_history",
        "keep_all",
        "request subscriptions' history: keep_all (a reader that falls behind never overwrites "
        "unread requests; loss upstream is reported as middleware_lost) or keep_last "
        "(request_qos_depth; overwritten requests are lost without a trace)",
        choices=QOS_HISTORIES,
    ),
    Spec("request_qos_depth", 1000, "history depth of each request subscription (keep_last)", 1,
         100_000),
    Spec("action_qos_depth", 1000, "history depth of the flowedge/actions publisher", 1, 100_000),
    Spec(
        "intake_loop",
        "auto",
        "auto: the request intake takes, checks and submits each request in C, without the "
        "GIL, unless use_sim_time is on or rcl cannot be found; python: always the rclpy "
        "callback (the admission diagnostic says which runs)",
        choices=NFE_LOOPS,
    ),
    Spec("stats_rate_hz", 10.0, "publish rate of flowedge/stats (RelayStats)", 0.1, 100.0),
    # Output path (docs/design.md §8)
    Spec("output_ring_capacity", 1024, "slots per SPSC outcome ring (rounded up to 2^n)", 2, 65536),
    Spec(
        "action_output_wait_ms",
        50,
        "how long a worker waits for ring space before dropping an INFERENCE outcome",
        0,
        10_000,
    ),
    Spec(
        "publisher_loop",
        "auto",
        "auto: the publisher thread serializes and publishes answers in C, without the GIL, "
        "unless use_sim_time is on or rcl cannot be found; python: always the rclpy loop (the "
        "workers diagnostic says which runs)",
        choices=NFE_LOOPS,
    ),
    # Real-time deployment (docs/robot-computer.md): opt-in; where the OS refuses a setting
    # the relay runs degraded and the workers status says so at WARN
    Spec(
        "executor_cpu_affinity",
        Parameter.Type.INTEGER_ARRAY,
        "CPUs for the request intake thread (the request executor); unset = no pinning",
    ),
    Spec(
        "executor_rt_priority",
        0,
        "SCHED_FIFO priority of the request intake thread; 0 = normal scheduling",
        0,
        99,
    ),
    Spec(
        "worker_cpu_affinity",
        Parameter.Type.INTEGER_ARRAY,
        "CPUs for worker threads: worker w and its intra_op_threads - 1 ONNX Runtime pool "
        "threads take entries w*k .. w*k+k-1 (k = intra_op_threads, indices mod the list's "
        "length; at k = 1 worker w gets entry w mod n); unset = no pinning",
    ),
    Spec(
        "worker_rt_priority",
        0,
        "SCHED_FIFO priority of worker threads (their ONNX Runtime pool threads inherit it); "
        "0 = normal scheduling",
        0,
        99,
    ),
    Spec(
        "worker_rt_cede_us",
        500,
        "with worker_rt_priority: a worker pauses this long after each worker_rt_cede_every_us "
        "of compute, handing normal tasks the CPU share the kernel reserves for them in slices "
        "instead of one ~50 ms stop a second (docs/design.md §5.3); admission prices the "
        "pauses; 0 = never pause",
        0,
        1_000_000,
    ),
    Spec(
        "worker_rt_cede_every_us",
        7_500,
        "with worker_rt_priority and worker_rt_cede_us: compute between two pauses, us",
        1,
        1_000_000,
    ),
    Spec(
        "publisher_cpu_affinity",
        Parameter.Type.INTEGER_ARRAY,
        "CPUs for the publisher thread (outcome rings -> flowedge/actions); unset = no pinning",
    ),
    Spec(
        "publisher_rt_priority",
        0,
        "SCHED_FIFO priority of the publisher thread; 0 = normal scheduling",
        0,
        99,
    ),
    Spec(
        "lock_memory",
        False,
        "mlockall(MCL_CURRENT | MCL_FUTURE) at start, so no page of the relay is paged out or "
        "faulted in on the request path (needs CAP_IPC_LOCK or a large enough RLIMIT_MEMLOCK)",
    ),
    Spec("worker_stall_ms", 2000, "a worker holding work with no step this long is stalled", 1,
         HOUR_MS),
    # Relay pool (docs/design.md §13)
    Spec(
        "pool",
        "",
        "name of the relay pool this relay joins on its request topics (flowedge/pool, "
        "docs/design.md §13): each session is decided by one live member, a dead member's "
        "requests by the next; empty = a single relay, no pool topic",
    ),
    Spec(
        "pool_lease_ms",
        500,
        "liveliness lease of the pool announcements, ms: a member silent this long is dead to "
        "the pool, and its sessions are taken over within this + 100 ms; the same in a pool",
        50,
        10_000,
    ),
    Spec(
        "pool_spill",
        False,
        "hand a request this pool member owns and would answer REJECTED_CAPACITY to the next "
        "member of its session's ranking when that member's announced bound fits the request's "
        "slack; it answers instead (docs/design.md §13.5)",
        read_only=False,
    ),
    Spec(
        "pool_standby_entries",
        4096,
        "requests of other members' sessions a pool member keeps as their successor, for a "
        "takeover (the oldest is evicted, counted)",
        1,
        1_048_576,
    ),
    Spec(
        "pool_standby_bytes",
        16 * 1024 * 1024,
        "bytes of those requests a pool member keeps (the oldest is evicted, counted)",
        1,
        2**31 - 1,
    ),
)

#: Fault injection, declared only on a relay started for a drill (`flowedge-relayd --drill`,
#: RelayNode(drill=True)): a production relay has no knob anyone on the bus could turn to slow
#: it down.
DRILL_SPECS: tuple[Spec, ...] = (
    Spec(
        "fault_nfe_delay_ms",
        0.0,
        "DRILLS ONLY: extra delay added to every NFE, ms; 0 = off",
        0.0,
        60_000.0,
        read_only=False,
    ),
)

BY_NAME = {spec.name: spec for spec in (*SPECS, *DRILL_SPECS)}


class ParameterError(ValueError):
    """A parameter value the relay refuses at start; flowedge-relayd prints it as one line."""


# How ROS reads an unquoted scalar: rcl's YAML parser (`-p name:=value`, params files, launch)
# types these spellings as bools (PyYAML, for `ros2 param set`, all but y and n), and both read
# canonical digits as numbers; anything else stays a string.
YAML_TRUE = frozenset({"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", "y", "Y"})
YAML_FALSE = frozenset({"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF", "n",
                        "N"})
#: the enum-like string parameters
ENUMS = tuple(spec for spec in SPECS if spec.choices)


def yaml_reading(text: str) -> object:
    """What an unquoted `text` arrives as: a bool, an int, a float, or the string itself."""
    if text in YAML_TRUE or text in YAML_FALSE:
        return text in YAML_TRUE
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _same(a: object, b: object) -> bool:
    return type(a) is type(b) and a == b  # True == 1 in Python, not in YAML


def spelled(name: str, value: object) -> object:
    """An enum's value as it was written: `-p rtc_mode:=off` arrives as the bool false, and the
    one choice YAML reads as false is `off`. Anything else comes back unchanged (a string, or a
    bool or number no single choice reads as: check_value refuses it)."""
    spec = BY_NAME.get(name)
    if spec is None or not spec.choices or isinstance(value, str):
        return value
    matches = [c for c in spec.choices if _same(yaml_reading(c), value)]
    return matches[0] if len(matches) == 1 else value


def _typed(value: object) -> str:
    if isinstance(value, bool):
        return f"the bool {str(value).lower()}"
    kind = {int: "integer", float: "number"}.get(type(value), type(value).__name__)
    return f"the {kind} {value!r}"


def declare_all(node: Node, drill: bool = False) -> dict[str, object]:
    """Declare every parameter (and with `drill` the fault knobs, DRILL_SPECS) and return their
    values (unset arrays as empty lists). An enum that YAML typed as a bool or number is mapped
    back to its spelling (`spelled`) and set as the string it is, or refused (ParameterError);
    then it gets its own descriptor. Any other parameter is declared with its own descriptor at
    once: read_only holds from the start, so a live set of one that only a restart changes
    (`workers`, `queue_capacity`...) is refused, never accepted to no effect."""
    values = {}
    for spec in (*SPECS, *DRILL_SPECS) if drill else SPECS:
        value = node.declare_parameter(spec.name, spec.default,
                                       spec.descriptor(declaring=bool(spec.choices))).value
        if spec.choices:
            value = spelled(spec.name, value)
            problem = check_value(spec.name, value)
            if problem:
                raise ParameterError(problem)
            if not _same(node.get_parameter(spec.name).value, value):  # as a string, not a bool
                node.set_parameters([Parameter(spec.name, value=value)])
            node.set_descriptor(spec.name, spec.descriptor())
        values[spec.name] = [] if value is None else value
    for name in START_CHECKED:
        if problem := check_value(name, values[name]):
            raise ParameterError(problem)
    return values


def defaults(drill: bool = False) -> dict[str, object]:
    """Every parameter's default, as declare_all returns them with nothing overridden: the
    values a relay.Relay built without a node (a test without DDS) starts from."""
    values = {}
    for spec in (*SPECS, *DRILL_SPECS) if drill else SPECS:
        d = spec.default
        values[spec.name] = [] if isinstance(d, Parameter.Type) else (
            list(d) if isinstance(d, list) else d)
    return values


def check_value(name: str, value: object) -> str | None:
    """Extra validation rclpy ranges cannot express; returns the reason or None when valid."""
    spec = BY_NAME.get(name)
    if spec is not None and spec.choices:
        one_of = f"{name} must be one of {', '.join(spec.choices)}"
        if not isinstance(value, str):
            return (f"{one_of}; got {_typed(value)}, which is how YAML reads an unquoted "
                    f"{'on, off, yes, no, true or false' if isinstance(value, bool) else 'number'}"
                    f": write one of the values, quoted (-p \"{name}:='{spec.default}'\", or "
                    f"{name}: '{spec.default}' in a params file)")
        if value not in spec.choices:
            return f"{one_of}, got {value!r}"
    if name == "execution_providers" and (not value or any(not p for p in value)):
        return "execution_providers must name at least one provider"
    if name == "request_topics" and (not value or any(not t for t in value)):
        return "request_topics must name at least one non-empty topic"
    if name == "client_weights":
        try:
            parse_client_weights(value)
        except ValueError as exc:
            return str(exc)
    if name == "pool" and isinstance(value, str) and len(value.encode()) > POOL_NAME_MAX_BYTES:
        return f"pool: a name of at most {POOL_NAME_MAX_BYTES} bytes, got {len(value.encode())}"
    if name in CPU_AFFINITIES and any(not 0 <= c <= MAX_CPU for c in value or ()):
        return f"{name}: CPU ids must be in 0..{MAX_CPU}, got {list(value)}"
    return None


# -- a live set, in the node's three set-parameters callbacks --------------------------------------

def spell_all(params: list[Parameter]) -> list[Parameter]:
    """The pre-set callback: `ros2 param set /flowedge_relay age_gate off` sends the bool false
    (YAML's reading), so an enum's value goes on as the string it was written as (`spelled`)."""
    return [Parameter(p.name, value=spelled_value) if (spelled_value := spelled(
        p.name, p.value)) is not p.value else p for p in params]


def check_set(params: list[Parameter],
              prepare_swap: Callable[[str, dict], str | None] | None) -> SetParametersResult:
    """The on-set callback: refuse what rclpy's ranges cannot express (enums; rclpy enforces
    ranges and read_only). With `prepare_swap` (the relay is configured) a model_path set is a
    model swap: the new model is loaded and warmed now, the set refused with the loader's
    message if it cannot be served."""
    for param in params:
        if problem := check_value(param.name, param.value):
            return SetParametersResult(successful=False, reason=problem)
    values = {param.name: param.value for param in params}
    if "model_path" in values and prepare_swap is not None:
        calibration = {k: values[k] for k in SWAP_CALIBRATION if k in values}
        if problem := prepare_swap(values["model_path"], calibration):
            return SetParametersResult(successful=False, reason=problem)
    return SetParametersResult(successful=True)
