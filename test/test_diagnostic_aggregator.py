# SPDX-License-Identifier: Apache-2.0
"""config/diagnostic_aggregator.yaml: well formed for diagnostic_aggregator, and it groups every
status a real relay publishes, at the root and under namespaces.

diagnostic_aggregator is not installable here (no wheel), so its rules are restated from the
ROS 2 sources (ros/diagnostics, diagnostic_aggregator: aggregator.cpp, analyzer_group.cpp,
generic_analyzer.cpp): the aggregator node is `analyzers`, its `path` is the base path; each
analyzer is a map with `type` and `path`; a GenericAnalyzer reads its match lists with
as_string_array() (so a single string is refused), `timeout` with as_double(), and fails to
load with none of startswith/contains/expected/regex. match() tests, in order: regex
(std::regex_match: the whole name), expected (equal), startswith (prefix), contains (substring).
The ROS 2 port does not read `name`.
"""

from __future__ import annotations

import pathlib
import re

import pytest
import yaml
from relayd import observer, relayds

ROOT = pathlib.Path(__file__).resolve().parent.parent
AGGREGATOR_YAML = ROOT / "config" / "diagnostic_aggregator.yaml"
TASKS = {"admission", "queue", "workers", "model", "output"}

GENERIC = "diagnostic_aggregator/GenericAnalyzer"
GROUP = "diagnostic_aggregator/AnalyzerGroup"
MATCH_KEYS = ("regex", "expected", "startswith", "contains")
GENERIC_KEYS = {"type", "path", *MATCH_KEYS, "remove_prefix", "find_and_remove_prefix",
                "timeout", "num_items", "discard_stale"}


def _analyzer_tree() -> dict:
    doc = yaml.safe_load(AGGREGATOR_YAML.read_text())
    assert set(doc) == {"analyzers"}, "the aggregator's node is named `analyzers`"
    params = doc["analyzers"]["ros__parameters"]
    assert isinstance(params["path"], str) and params["path"]
    return params


def generic_analyzers(params: dict, base: str) -> list[tuple[str, dict]]:
    """(output path, settings) of every GenericAnalyzer, through AnalyzerGroups."""
    out = []
    for key, value in params.items():
        if not isinstance(value, dict):
            continue
        assert "type" in value and isinstance(value.get("path"), str), key
        path = f"{base}/{value['path']}"
        if value["type"] == GROUP:
            out += generic_analyzers(value["analyzers"], path)
        else:
            assert value["type"] == GENERIC, (key, value["type"])
            out.append((path, value))
    return out


def generic_match(settings: dict, name: str) -> bool:
    """GenericAnalyzer::match, as in the ROS 2 sources (see the module docstring)."""
    return (
        any(re.fullmatch(r, name) for r in settings.get("regex", []))
        or any(name == e for e in settings.get("expected", []))
        or any(name.startswith(s) for s in settings.get("startswith", []))
        or any(c in name for c in settings.get("contains", []))
    )


def matching_paths(name: str) -> list[str]:
    params = _analyzer_tree()
    return [path for path, s in generic_analyzers(params, "/" + params["path"])
            if generic_match(s, name)]


def test_yaml_has_the_structure_the_aggregator_loads():
    analyzers = generic_analyzers(_analyzer_tree(), "")
    assert analyzers
    for path, settings in analyzers:
        assert set(settings) <= GENERIC_KEYS, (path, set(settings) - GENERIC_KEYS)
        present = [k for k in MATCH_KEYS if k in settings]
        assert present, f"{path}: no startswith/contains/expected/regex: it would not load"
        for key in present:
            values = settings[key]
            assert isinstance(values, list) and values, (path, key)
            assert all(isinstance(v, str) and v for v in values), (path, key)
        for pattern in settings.get("regex", []):
            re.compile(pattern)
        if "timeout" in settings:
            assert isinstance(settings["timeout"], float), "as_double(): write 5.0, not 5"
        if "num_items" in settings:
            assert isinstance(settings["num_items"], int)
        if "discard_stale" in settings:
            assert isinstance(settings["discard_stale"], bool)


def test_the_relay_analyzer_takes_no_one_elses_statuses():
    for name in ("camera_driver: frequency", "flowedge_relay_demo_producer: queue",
                 "arm_left/gripper: queue", "my_flowedge_relay: queue",
                 "flowedge_relay: calibration", "arm_left/flowedge_relay: queue extra"):
        assert matching_paths(name) == [], name


@pytest.mark.ros
def test_every_status_a_real_relay_publishes_is_grouped(tmp_path):
    """Status names taken from /diagnostics of real relays at the root and two levels down."""
    with relayds(tmp_path, [], ["--ros-args", "-r", "__ns:=/robot1/arm_left"]), \
            observer() as obs:
        root = obs.wait_status_names("flowedge_relay: ", len(TASKS))
        nested = obs.wait_status_names("robot1/arm_left/flowedge_relay: ", len(TASKS))
    assert {n.split(": ", 1)[1] for n in root} == TASKS
    assert {n.split(": ", 1)[1] for n in nested} == TASKS
    for name in sorted(root | nested):
        paths = matching_paths(name)
        assert paths, f"{name!r} would land in the aggregator's 'Other'"
        assert all(p.endswith("/FlowEdge Relay") for p in paths), (name, paths)


def test_readme_monitoring_plots_real_relay_stats_fields():
    from flowedge_relay_msgs.msg import RelayStats

    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Monitoring", 1)[1].split("\n## ", 1)[0]
    fields = re.findall(r"/flowedge/stats/(\w+)", section)
    assert len(fields) >= 5
    unknown = set(fields) - set(RelayStats.get_fields_and_field_types())
    assert not unknown, f"README plots fields RelayStats does not have: {sorted(unknown)}"
    for command in ("ros2 run diagnostic_aggregator aggregator_node",
                    "config/diagnostic_aggregator.yaml", "ros2 run rqt_robot_monitor",
                    "ros2 run rqt_runtime_monitor", "ros2 run rqt_plot rqt_plot"):
        assert command in section, command
