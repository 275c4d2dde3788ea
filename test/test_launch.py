# SPDX-License-Identifier: Apache-2.0
"""The launch file, checked without a ROS install (launch/launch_ros are not on PyPI).

It cannot be executed here, so check what a real `ros2 launch` depends on: it parses, every
launch argument is declared with a description, it starts our executable under the contract's
node name as a launch_ros LifecycleNode and loads the package's relay.yaml, which setup.py
installs; and it declares the relay once, adding the optional nfe_ns override only when the
argument is given and passing the autostart argument on as the node's parameter.
"""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent
LAUNCH = ROOT / "launch" / "relay.launch.py"


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [
        n for n in ast.walk(tree)
        if isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", "")) == name
    ]


def _kw(call: ast.Call, key: str):
    for kw in call.keywords:
        if kw.arg == key:
            return kw.value
    return None


def test_launch_file_declares_described_arguments():
    tree = ast.parse(LAUNCH.read_text())
    assert ast.get_docstring(tree) and "Usage" in ast.get_docstring(tree)
    args = {}
    for call in _calls(tree, "DeclareLaunchArgument"):
        name = call.args[0].value
        desc = _kw(call, "description")
        assert desc is not None and len(desc.value) > 10, name
        args[name] = desc.value
    assert set(args) == {"config", "namespace", "nfe_ns", "autostart"}


def test_launch_file_starts_the_relay_with_the_package_yaml():
    text = LAUNCH.read_text()
    assert '"flowedge-relayd"' in text and 'name="flowedge_relay"' in text
    assert re.search(r'"config",\s*"relay\.yaml"', text)
    assert "ParameterFile(" in text
    setup = (ROOT / "setup.py").read_text()
    assert "flowedge-relayd = flowedge_relay.cli:main" in setup
    assert 'glob("launch/*.launch.py")' in setup and 'glob("config/*.yaml")' in setup
    assert (ROOT / "config" / "relay.yaml").exists()


def _function_defs(tree: ast.AST) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_launch_file_declares_exactly_one_node():
    """One Node, not one per combination of optional arguments."""
    tree = ast.parse(LAUNCH.read_text())
    nodes = _calls(tree, "LifecycleNode")
    assert len(nodes) == 1, f"{len(nodes)} LifecycleNode(...) calls"
    assert not _calls(tree, "Node"), "a plain Node cannot be driven by lifecycle events"
    node = nodes[0]
    assert _kw(node, "condition") is None  # it always starts
    assert not _calls(tree, "PythonExpression") and not _calls(tree, "IfCondition")
    assert _kw(node, "namespace") is not None


def test_nfe_ns_override_is_added_only_when_given():
    """The override dict is appended under an `if` on the resolved nfe_ns, inside the function an
    OpaqueFunction runs at launch time; the YAML (ParameterFile) is always in the list, first."""
    tree = ast.parse(LAUNCH.read_text())
    opaque = _calls(tree, "OpaqueFunction")
    assert len(opaque) == 1
    fn_name = _kw(opaque[0], "function").id
    fn = _function_defs(tree)[fn_name]
    node = _calls(fn, "LifecycleNode")
    assert node, "the Node is built inside the OpaqueFunction's function"
    # the parameter list starts with the YAML ...
    assigns = [n for n in ast.walk(fn) if isinstance(n, ast.Assign)
               and isinstance(n.value, ast.List) and _calls(n.value, "ParameterFile")]
    assert len(assigns) == 1
    params_name = assigns[0].targets[0].id
    assert isinstance(_kw(node[0], "parameters"), ast.Name)
    assert _kw(node[0], "parameters").id == params_name
    # ... and nfe_ns joins it only inside an `if` that tests the performed launch configuration
    appends = [c for c in _calls(fn, "append")
               if isinstance(c.func.value, ast.Name) and c.func.value.id == params_name]
    assert len(appends) == 1
    guarded = [
        n for n in ast.walk(fn) if isinstance(n, ast.If)
        and any(c is appends[0] for c in ast.walk(n))
    ]
    assert guarded, "the nfe_ns override must be conditional"
    override = appends[0].args[0]
    assert isinstance(override, ast.Dict) and override.keys[0].value == "nfe_ns"
    performed = [c for c in _calls(fn, "perform")
                 if _calls(c.func.value, "LaunchConfiguration")
                 and c.func.value.args[0].value == "nfe_ns"]
    assert performed, "nfe_ns is read from the launch context, not string-built"


def test_autostart_argument_becomes_the_node_parameter():
    """The managed relay configures and activates itself only when autostart says so; launch's
    own ChangeState events and ros2 lifecycle drive it otherwise. The argument
    is parsed strictly at launch time and lands in the parameter list after the YAML."""
    tree = ast.parse(LAUNCH.read_text())
    fn = _function_defs(tree)["relay_node"]
    params = [n.value for n in ast.walk(fn) if isinstance(n, ast.Assign)
              and isinstance(n.value, ast.List) and _calls(n.value, "ParameterFile")][0]
    assert isinstance(params.elts[0], ast.Call) and params.elts[0].func.id == "ParameterFile"
    autostart = [e for e in params.elts if isinstance(e, ast.Dict)
                 and e.keys[0].value == "autostart"]
    assert len(autostart) == 1
    parser = _function_defs(tree)[autostart[0].values[0].func.id]
    performed = [c for c in _calls(parser, "perform")
                 if c.func.value.args[0].value == "autostart"]
    assert performed and _calls(parser, "ValueError")
    default = [c for c in _calls(tree, "DeclareLaunchArgument") if c.args[0].value == "autostart"]
    assert _kw(default[0], "default_value").value == "true"


# -- launch/pool.launch.py: K relays of one pool on one host ----------------------------------

POOL_LAUNCH = ROOT / "launch" / "pool.launch.py"


def test_pool_launch_file_declares_described_arguments(monkeypatch):
    tree = ast.parse(POOL_LAUNCH.read_text())
    assert ast.get_docstring(tree) and "Usage" in ast.get_docstring(tree)
    made = _stub_launch(monkeypatch)
    import runpy

    runpy.run_path(str(POOL_LAUNCH))["generate_launch_description"]()
    args = {a["args"][0]: a for a in made["args"]}
    assert args.keys() == {"count", "pool", "namespace", "lease_ms", "config", "nfe_ns"}
    assert all(len(a["description"]) > 10 for a in args.values())
    assert args["pool"]["default_value"] and args["lease_ms"]["default_value"] == "500"
    assert args["config"]["default_value"] == "/share/config/relay.yaml"


class _Config:
    """launch's LaunchConfiguration, reading the values a test gives."""

    values: dict[str, str] = {}

    def __init__(self, name: str) -> None:
        self.name = name

    def perform(self, context) -> str:
        return self.values[self.name]


def _stub_launch(monkeypatch) -> dict[str, list]:
    """launch and launch_ros as recorders (they are on no registry): what the file builds."""
    import sys
    import types

    made: dict[str, list] = {"nodes": [], "args": []}

    def recorder(kind):
        def make(*args, **kwargs):
            made[kind].append(kwargs | {"args": args})
            return kwargs | {"args": args}
        return make

    modules = {
        "launch": {"LaunchContext": object, "LaunchDescription": list},
        "launch.actions": {"DeclareLaunchArgument": recorder("args"),
                           "OpaqueFunction": lambda function: function},
        "launch.substitutions": {"LaunchConfiguration": _Config},
        "launch_ros": {}, "launch_ros.actions": {"LifecycleNode": recorder("nodes")},
        "launch_ros.parameter_descriptions": {
            "ParameterFile": lambda path, **kw: ("yaml", path.name)},
        "ament_index_python": {},
        "ament_index_python.packages": {"get_package_share_directory": lambda pkg: "/share"},
    }
    for name, attrs in modules.items():
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attrs))
    return made


def _run_pool_launch(monkeypatch, **values) -> list[dict]:
    import runpy

    made = _stub_launch(monkeypatch)
    defaults = {"count": "2", "pool": "fleet", "namespace": "", "lease_ms": "500",
                "config": "/share/config/relay.yaml", "nfe_ns": ""}
    _Config.values = defaults | values
    module = runpy.run_path(str(POOL_LAUNCH))
    (opaque,) = [a for a in module["generate_launch_description"]() if callable(a)]
    opaque(None)
    return made["nodes"]


def test_pool_launch_starts_count_relays_sharing_the_pool_topics(monkeypatch):
    """count relays, each the contract's node in its own namespace, the YAML first and the
    pool's name and lease over it, the five shared topics remapped to the pool's namespace
    (the remaps test/test_pool.py runs its relays with)."""
    from test_pool import TOPICS

    nodes = _run_pool_launch(monkeypatch, count="3", pool="cell", namespace="/a/", lease_ms="300")
    assert len(nodes) == 3
    assert [n["namespace"] for n in nodes] == ["/a/relay_0", "/a/relay_1", "/a/relay_2"]
    for n in nodes:
        assert n["executable"] == "flowedge-relayd" and n["name"] == "flowedge_relay"
        assert n["parameters"][0] == ("yaml", "config")  # the YAML first, then the overrides
        assert n["parameters"][1] == {"pool": "cell", "pool_lease_ms": 300}
        assert dict(n["remappings"]) == {t: f"/a/{t}" for t in TOPICS}
    nodes = _run_pool_launch(monkeypatch, nfe_ns="250000")
    assert [n["namespace"] for n in nodes] == ["/relay_0", "/relay_1"]
    assert nodes[0]["remappings"][0] == ("flowedge/requests", "/flowedge/requests")
    assert nodes[0]["parameters"][1]["nfe_ns"] == 250000


def test_pool_launch_refuses_a_pool_without_name_or_a_bad_count(monkeypatch):
    import pytest

    for values, said in (({"pool": ""}, "needs a name"), ({"count": "0"}, "count:=0"),
                         ({"count": "two"}, "expected an integer"),
                         ({"lease_ms": "20"}, "lease_ms:=20")):
        with pytest.raises(ValueError, match=said):
            _run_pool_launch(monkeypatch, **values)
