# SPDX-License-Identifier: Apache-2.0
"""config/*.yaml apply to their nodes under any namespace.

A YAML block keyed `flowedge_relay:` matches only /flowedge_relay; a relay launched under a
namespace would silently run on its defaults. The shipped files key every block
`/**/<node name>`. Checked two ways: rcl's own YAML parser deciding what a node under a
namespace receives (an rclpy node that declares whatever overrides it is given), and the real
`flowedge-relayd` process under namespaces, read back through its parameter service.
"""

from __future__ import annotations

import pathlib
import re

import pytest
import rclpy
import yaml
from rclpy.context import Context
from rclpy.node import Node
from relayd import observer, relayds

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = ROOT / "config"
RELAY_YAML = CONFIG / "relay.yaml"


def _overrides(node_name: str, namespace: str, *params_files: pathlib.Path) -> dict:
    """What rcl hands a node named node_name in namespace from these files (rclpy, no DDS)."""
    args = ["t", "--ros-args", "-r", f"__ns:={namespace}"]
    for f in params_files:
        args += ["--params-file", str(f)]
    ctx = Context()
    rclpy.init(args=args, context=ctx)
    try:
        node = Node(node_name, context=ctx, automatically_declare_parameters_from_overrides=True,
                    start_parameter_services=False, enable_rosout=False)
        try:
            values = {name: p.value for name, p in node.get_parameters_by_prefix("").items()}
        finally:
            node.destroy_node()
    finally:
        ctx.try_shutdown()
    values.pop("use_sim_time", None)
    values.pop("start_type_description_service", None)
    return values


def _with_value(text: str, name: str, value: object) -> str:
    """The shipped YAML text with one parameter's value changed in place (structure kept)."""
    new, n = re.subn(rf"^(\s+{name}:\s*)\S+", rf"\g<1>{value}", text, count=1, flags=re.M)
    assert n == 1, name
    return new


@pytest.mark.parametrize("name", ["relay.yaml", "demo.yaml", "demo_rtc.yaml", "drill.yaml"])
def test_every_shipped_block_names_its_node_in_any_namespace(name):
    doc = yaml.safe_load((CONFIG / name).read_text())
    for key, block in doc.items():
        assert re.fullmatch(r"/\*\*/[A-Za-z_][A-Za-z0-9_]*", key), (name, key)
        assert set(block) == {"ros__parameters"}, (name, key)


@pytest.mark.ros
def test_a_bare_node_key_misses_a_namespaced_node(tmp_path):
    """The failure this guards against, shown with rcl's parser: so the checks below can fail."""
    bare = tmp_path / "bare.yaml"
    bare.write_text("flowedge_relay:\n  ros__parameters:\n    queue_capacity: 77\n")
    assert _overrides("flowedge_relay", "/", bare) == {"queue_capacity": 77}
    assert _overrides("flowedge_relay", "/arm_left", bare) == {}


@pytest.mark.ros
@pytest.mark.parametrize("namespace", ["/", "/arm_left", "/robot1/arm_left"])
def test_rcl_gives_each_node_its_own_block_under_any_namespace(namespace):
    relay_yaml = yaml.safe_load(RELAY_YAML.read_text())["/**/flowedge_relay"]["ros__parameters"]
    assert _overrides("flowedge_relay", namespace, RELAY_YAML) == relay_yaml

    demo = yaml.safe_load((CONFIG / "demo.yaml").read_text())
    relay_part = demo["/**/flowedge_relay"]["ros__parameters"]
    producer_part = demo["/**/flowedge_relay_demo_producer"]["ros__parameters"]
    # run_demo hands the file to the whole process: each node takes its block, not the other's
    assert _overrides("flowedge_relay", namespace, CONFIG / "demo.yaml") == relay_part
    assert _overrides("flowedge_relay_demo_producer", namespace,
                      CONFIG / "demo.yaml") == producer_part

    drill = yaml.safe_load((CONFIG / "drill.yaml").read_text())["/**/flowedge_relay"]
    # the drill's documented use: relay.yaml, then drill.yaml on top (the later file wins)
    combined = _overrides("flowedge_relay", namespace, RELAY_YAML, CONFIG / "drill.yaml")
    assert combined == {**relay_yaml, **drill["ros__parameters"]}


@pytest.mark.ros
def test_later_blocks_win_so_per_node_blocks_go_after_the_wildcard(tmp_path):
    """The rule the README's two-relay file relies on (rcl applies matching blocks in order)."""
    wildcard = "/**/flowedge_relay:\n  ros__parameters:\n    queue_capacity: 50\n"
    own = "/arm_left/flowedge_relay:\n  ros__parameters:\n    queue_capacity: 77\n"
    after = tmp_path / "after.yaml"
    after.write_text(wildcard + own)
    before = tmp_path / "before.yaml"
    before.write_text(own + wildcard)
    assert _overrides("flowedge_relay", "/arm_left", after)["queue_capacity"] == 77
    assert _overrides("flowedge_relay", "/arm_right", after)["queue_capacity"] == 50
    assert _overrides("flowedge_relay", "/arm_left", before)["queue_capacity"] == 50


@pytest.mark.ros
def test_relayd_under_namespaces_takes_the_shipped_yaml_and_per_node_blocks(tmp_path):
    """Two real relays, one params file built as the README says: the shipped relay.yaml (its
    wildcard block, with max_sessions changed) followed by one block per arm."""
    shipped = _with_value(RELAY_YAML.read_text(), "max_sessions", 99)
    two_arms = tmp_path / "two_arms.yaml"
    two_arms.write_text(
        shipped
        + "\n/arm_left/flowedge_relay:\n  ros__parameters:\n    queue_capacity: 77\n"
        + "\n/robot1/arm_right/flowedge_relay:\n  ros__parameters:\n"
        + "    queue_capacity: 88\n    age_gate: all\n"
    )
    # only the relay's own small model and one worker each: two relays share 2 cores here
    common = ["--params-file", str(two_arms)]
    names = ["queue_capacity", "max_sessions", "age_gate", "workers"]
    with relayds(tmp_path,
                 ["--ros-args", "-r", "__ns:=/arm_left", *common],
                 ["--ros-args", "-r", "__ns:=/robot1/arm_right", *common]), observer() as obs:
        left = obs.get_parameters("/arm_left/flowedge_relay", names)
        right = obs.get_parameters("/robot1/arm_right/flowedge_relay", names)
    assert left == {"queue_capacity": 77, "max_sessions": 99, "age_gate": "retries",
                    "workers": 1}
    assert right == {"queue_capacity": 88, "max_sessions": 99, "age_gate": "all", "workers": 1}


@pytest.mark.ros
def test_relayd_under_a_namespace_takes_a_params_file(tmp_path):
    """The issue's reproduction: one's own file, keyed the documented way, queue_capacity 77."""
    mine = tmp_path / "my.yaml"
    mine.write_text("/**/flowedge_relay:\n  ros__parameters:\n    queue_capacity: 77\n")
    with relayds(tmp_path, ["--ros-args", "-r", "__ns:=/arm_left", "--params-file", str(mine)]), \
            observer() as obs:
        got = obs.get_parameters("/arm_left/flowedge_relay", ["queue_capacity"])
    assert got == {"queue_capacity": 77}


@pytest.mark.ros
def test_the_readme_two_arm_example_gives_each_arm_its_values(tmp_path):
    """The YAML shown in README "Parameter files and namespaces", through rcl's parser."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("**Parameter files and namespaces.**", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", section, flags=re.S).group(1)
    arms = tmp_path / "arms.yaml"
    arms.write_text(block)
    left = _overrides("flowedge_relay", "/arm_left", arms)
    right = _overrides("flowedge_relay", "/arm_right", arms)
    assert left == {"workers": 2, "nfe_ns": 250000}
    assert right == {"workers": 2, "nfe_ns": 400000, "queue_capacity": 32}
    assert "ros2 param get /arm_right/flowedge_relay queue_capacity        # 32" in section
