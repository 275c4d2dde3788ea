# SPDX-License-Identifier: Apache-2.0
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
    assert set(values) <= {s.name for s in parameters.SPECS}, "no drill knob in production"


def test_live_parameters_are_exactly_the_tunable_ones():
    live = {s.name for s in parameters.SPECS if not s.read_only}
    assert live == {
        "nfe_ns", "admission_reserve_ns", "prefix_ns", "reject_if_retry_count_gte", "age_gate",
        "reject_if_queue_age_ms_gte", "queue_timeout_ms",
        "cost_model", "cost_window_ms", "cost_quantile",
        "model_path",  # a model swap (docs/design.md §9)
        "pool_spill",  # spill on capacity in a pool, on or off while it runs
        "fair_share", "client_weights",  # docs/design.md §7.1: from the next decision
    }


@pytest.mark.ros
def test_a_running_relay_refuses_a_set_that_only_a_restart_would_apply():
    """What the table says holds on the node: a read-only parameter (`workers`: the threads
    are started) is refused on `ros2 param set`, saying so, and keeps its value; a live one
    (`nfe_ns`) is taken and reaches the core. Every declared descriptor says what the table
    says (an enum's too, after its declaration with dynamic typing)."""
    from flowedge_relay.node import RelayNode

    with ros_context() as ctx:
        node = RelayNode(context=ctx, drill=True,
                         parameter_overrides=[Parameter("workers", value=1)])
        try:
            for spec in (*parameters.SPECS, *parameters.DRILL_SPECS):
                assert node.describe_parameter(spec.name).read_only == spec.read_only, spec.name
            for name, value in (("workers", 3), ("queue_capacity", 8), ("stats_rate_hz", 1.0)):
                (result,) = node.set_parameters([Parameter(name, value=value)])
                assert not result.successful and "read-only" in result.reason, name
            assert node.get_parameter("workers").value == 1 and node.relay.core.lanes == 1
            (result,) = node.set_parameters([Parameter("nfe_ns", value=7_000_000)])
            assert result.successful and node.relay.snapshot().cost.in_use_ns == 7_000_000  # static
        finally:
            node.destroy_node()


def test_numeric_parameters_have_ranges():
    for spec in (*parameters.SPECS, *parameters.DRILL_SPECS):
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


# -- enum-like string parameters written the way YAML reads otherwise --------------------------

#: what a user may write for a string parameter that YAML, unquoted, reads as a bool or a number
#: (rcl's parser: -p, params files, launch; PyYAML: ros2 param set), and a quoted digit
YAML_TYPED = ("on", "off", "yes", "no", "true", "false", "True", "OFF", "null", "0", "1", "2.5",
              "'1'")
FREE_TEXT = {"model_path", "pool"}  # string parameters without a fixed set of values


def _written(spec) -> list[str]:
    return sorted({*YAML_TYPED, *spec.choices})


FALSE_SPELLINGS = {"off", "no", "false", "False", "OFF"}  # of YAML_TYPED, those read as false


def _expected(spec, text: str) -> str | None:
    """The value a relay holds for `text`: the choice it names (quoted or not); for any
    spelling YAML reads as false, `off` where that is a choice (false, no and off arrive alike);
    else None (refused)."""
    plain = text.strip("'")
    if plain in spec.choices:
        return plain
    return "off" if text in FALSE_SPELLINGS and "off" in spec.choices else None


def test_every_string_parameter_with_fixed_values_declares_them():
    """The enums below come from SPECS: a string parameter with a fixed set of values that did
    not declare its choices would be missing from them (and take YAML's bools unchecked)."""
    strings = {s.name for s in parameters.SPECS if isinstance(s.default, str)}
    assert {s.name for s in parameters.ENUMS} == strings - FREE_TEXT
    for spec in parameters.ENUMS:
        assert spec.default in spec.choices
        assert parameters.check_value(spec.name, "sometimes")
        assert all(parameters.check_value(spec.name, c) is None for c in spec.choices)


def test_yaml_reading_is_what_ros_sends_for_ros2_param_set():
    """yaml_reading against rclpy's own guess (what `ros2 param set` sends), over what a user
    writes for every enum."""
    from rclpy.parameter import get_parameter_value, parameter_value_to_python

    for spec in parameters.ENUMS:
        for text in _written(spec):
            if text in ("null", "'1'"):
                continue  # PyYAML: None and '1', which rclpy sends as strings
            sent = parameter_value_to_python(get_parameter_value(text))
            got = parameters.yaml_reading(text)
            assert type(got) is type(sent) and got == sent, text


def _params_file(tmp_path, name: str, text: str):
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"/**/flowedge_relay:\n  ros__parameters:\n    {name}: {text}\n")
    return path


@pytest.mark.ros
@pytest.mark.parametrize("source", ["-p", "params file"])
@pytest.mark.parametrize("spec", parameters.ENUMS, ids=lambda s: s.name)
def test_an_enum_given_at_start_takes_yamls_spellings(tmp_path, spec, source):
    """Through rcl's own YAML parser, as `-p name:=value`, a params file or launch give them:
    a choice YAML reads as a bool (`rtc_mode:=off`) is held as the string it was written as,
    with the string descriptor; anything else is refused by a ParameterError of one line that
    names the parameter and the fix, never rclpy's type error."""
    from flowedge_relay.node import RelayNode

    with ros_context() as ctx:
        for text in _written(spec):
            args = (["-p", f"{spec.name}:={text}"] if source == "-p"
                    else ["--params-file", str(_params_file(tmp_path, spec.name, text))])
            cli_args = ["--ros-args", "-p", "autostart:=false", *args]
            want = _expected(spec, text)
            if want is None:
                with pytest.raises(parameters.ParameterError) as refused:
                    RelayNode(context=ctx, cli_args=cli_args)
                message = str(refused.value)
                assert message.startswith(f"{spec.name} must be one of") and "\n" not in message
                if text.strip("'") in YAML_TYPED and text not in ("null", "'1'"):
                    assert "quoted" in message, message
                continue
            node = RelayNode(context=ctx, cli_args=cli_args)
            try:
                param = node.get_parameter(spec.name)
                described = node.describe_parameter(spec.name)
                assert (param.value, param.type_) == (want, Parameter.Type.STRING), text
                assert described.read_only == spec.read_only, text
            finally:
                node.destroy_node()


@pytest.mark.ros
def test_a_live_enum_set_as_ros2_param_set_sends_it_takes_yamls_spellings():
    """`ros2 param set /flowedge_relay age_gate off` sends the bool false (PyYAML's reading):
    through the relay's real parameter service, every live enum takes its choices however YAML
    types them, and refuses the rest with a one-line reason naming the parameter."""
    from rcl_interfaces.msg import Parameter as ParameterMsg
    from rcl_interfaces.srv import SetParameters
    from rclpy.parameter import get_parameter_value
    from ros_helpers import running_relay, wait_for

    live = [s for s in parameters.ENUMS if not s.read_only]
    assert live  # age_gate, cost_model
    with running_relay() as h:
        client = h.client.create_client(SetParameters, "/flowedge_relay/set_parameters")
        assert client.wait_for_service(timeout_sec=30)
        for spec in live:
            for text in [*_written(spec), spec.default]:
                request = SetParameters.Request(parameters=[ParameterMsg(
                    name=spec.name, value=get_parameter_value(text))])
                future = client.call_async(request)
                assert wait_for(future.done, 30)
                (result,) = future.result().results
                want = _expected(spec, text)
                held = h.node.get_parameter(spec.name).value
                if want is None:
                    assert not result.successful, text
                    assert result.reason.startswith(f"{spec.name} must be one of"), result.reason
                    assert "\n" not in result.reason
                else:
                    assert result.successful, (text, result.reason)
                    assert held == want, text


def test_client_weights_are_parsed_and_checked():
    """docs/design.md §7.1: "pattern=weight" rules, in order; a bad one is refused naming it."""
    assert parameters.parse_client_weights(["arm-*=2", "a=b=3", "x=1000000"]) == (
        ("arm-*", 2), ("a=b", 3), ("x", 1_000_000))
    assert parameters.parse_client_weights([]) == ()
    for bad in (["arm"], ["=2"], ["a=0"], ["a=x"], ["a=1000001"], ["p" * 65 + "=1"],
                ["a=1"] * 33):
        assert parameters.check_value("client_weights", bad), bad
    assert parameters.check_value("client_weights", ["r*=2"]) is None
