"""config/relay.yaml and the parameter table agree; descriptors carry ranges and read_only."""

import pathlib

import yaml
from rclpy.parameter import Parameter

from flowedge_relay import parameters

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
