"""config/relay.yaml and the parameter table agree; descriptors carry ranges and read_only."""

import pathlib

import pytest
import yaml
from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException
from rclpy.parameter import Parameter
from ros_helpers import ros_context

from flowedge_relay import parameters, realtime

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_relay_yaml_holds_every_default():
    doc = yaml.safe_load((ROOT / "config" / "relay.yaml").read_text())
    values = doc["/**/flowedge_relay"]["ros__parameters"]
    for spec in parameters.SPECS:
        if isinstance(spec.default, Parameter.Type):
            assert spec.name not in values  # arrays declared unset stay commented out
            assert f"# {spec.name}:" in (ROOT / "config" / "relay.yaml").read_text()
            continue
        assert values[spec.name] == spec.default, spec.name
    assert set(values) <= set(parameters.BY_NAME)


def test_live_parameters_are_exactly_the_tunable_ones():
    live = {s.name for s in parameters.SPECS if not s.read_only}
    assert live == {
        "nfe_ns", "admission_reserve_ns", "prefix_ns", "reject_if_retry_count_gte", "age_gate",
        "reject_if_queue_age_ms_gte", "queue_timeout_ms", "fault_nfe_delay_ms",
        "cost_model", "cost_window_ms", "cost_quantile",
        "model_path",  # a model swap (docs/design.md §9)
    }


def test_numeric_parameters_have_ranges():
    for spec in parameters.SPECS:
        d = spec.descriptor()
        if isinstance(spec.default, bool | Parameter.Type) or not isinstance(
            spec.default, int | float
        ):
            continue
        assert d.integer_range or d.floating_point_range, spec.name
        assert d.description


def test_enum_values_are_checked():
    assert parameters.check_value("age_gate", "sometimes")
    assert parameters.check_value("age_gate", "all") is None
    assert parameters.check_value("solver", "rk4")
    assert parameters.check_value("cost_model", "sometimes")
    assert parameters.check_value("cost_model", "adaptive") is None
    assert parameters.check_value("request_topics", [])


REAL_TIME = {
    "executor_rt_priority": 0, "worker_rt_priority": 0, "publisher_rt_priority": 0,
    "executor_cpu_affinity": Parameter.Type.INTEGER_ARRAY,
    "worker_cpu_affinity": Parameter.Type.INTEGER_ARRAY,
    "publisher_cpu_affinity": Parameter.Type.INTEGER_ARRAY,
    "lock_memory": False,
}


def test_real_time_parameters_are_read_only_off_by_default_with_ranges():
    """docs/robot-computer.md: every thread on the path has a class and a CPU set, off by
    default; threads already started cannot change them, so all are read-only."""
    for name, default in REAL_TIME.items():
        spec = parameters.BY_NAME[name]
        assert spec.default == default and spec.read_only, name
        d = spec.descriptor()
        assert d.read_only and d.description, name
        if name.endswith("_rt_priority"):
            (r,) = d.integer_range
            assert (r.from_value, r.to_value) == (0, 99), name
    assert set(parameters.CPU_AFFINITIES) == {n for n in REAL_TIME if n.endswith("_affinity")}


def test_cpu_affinities_are_checked():
    for name in parameters.CPU_AFFINITIES:
        assert parameters.check_value(name, []) is None
        assert parameters.check_value(name, [0, realtime.MAX_CPU]) is None
        assert "0..1023" in parameters.check_value(name, [-1])
        assert parameters.check_value(name, [realtime.MAX_CPU + 1])


@pytest.mark.parametrize("override, error", [
    (Parameter("publisher_rt_priority", value=100), InvalidParameterValueException),
    (Parameter("worker_rt_priority", value=-1), InvalidParameterValueException),
    (Parameter("lock_memory", value="yes"), InvalidParameterTypeException),
    (Parameter("executor_cpu_affinity", value=[0.5]), InvalidParameterTypeException),
    (Parameter("publisher_cpu_affinity", value=[-1]), ValueError),
])  # fmt: skip
@pytest.mark.ros
def test_the_relay_refuses_bad_real_time_values_at_start(override, error):
    """A real RelayNode: rclpy enforces the ranges and types, the node the CPU ids."""
    from flowedge_relay.node import RelayNode

    with ros_context() as ctx, pytest.raises(error):
        RelayNode(context=ctx, parameter_overrides=[override]).destroy_node()


def test_client_weights_are_parsed_and_checked():
    """docs/design.md §7.1: "pattern=weight" rules, in order; a bad one is refused naming it."""
    assert parameters.parse_client_weights(["arm-*=2", "a=b=3", "x=1000000"]) == (
        ("arm-*", 2), ("a=b", 3), ("x", 1_000_000))
    assert parameters.parse_client_weights([]) == ()
    for bad in (["arm"], ["=2"], ["a=0"], ["a=x"], ["a=1000001"], ["p" * 65 + "=1"],
                ["a=1"] * 33):
        assert parameters.check_value("client_weights", bad), bad
    assert parameters.check_value("client_weights", ["r*=2"]) is None
