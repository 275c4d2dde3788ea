"""The launch file, checked without a ROS install (launch/launch_ros are not on PyPI).

It cannot be executed here, so check what a real `ros2 launch` depends on: it parses, every
launch argument is declared with a description, it starts our executable under the contract's
node name and loads the package's relay.yaml, which setup.py installs.
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
    assert set(args) == {"config", "namespace", "nfe_ns"}


def test_launch_file_starts_the_relay_with_the_package_yaml():
    text = LAUNCH.read_text()
    assert '"flowedge-relayd"' in text and 'name="flowedge_relay"' in text
    assert re.search(r'"config",\s*"relay\.yaml"', text)
    assert "ParameterFile(" in text
    setup = (ROOT / "setup.py").read_text()
    assert "flowedge-relayd = flowedge_relay.cli:main" in setup
    assert 'glob("launch/*.launch.py")' in setup and 'glob("config/*.yaml")' in setup
    assert (ROOT / "config" / "relay.yaml").exists()
