# SPDX-License-Identifier: Apache-2.0
"""package.xml declares what the package's Python code imports, and nothing it does not.

rosdep installs from package.xml, not from the imports, so a missing entry breaks a fresh
`rosdep install` on a robot while everything works on the machine that wrote the code, and a
stale one installs what nothing uses. Both Python packages are checked: flowedge_relay (the
imports of flowedge_relay/ and launch/ against package.xml) and flowedge_relay_tools (those of
tools/flowedge_relay_tools/ against tools/package.xml). The imports are read with ast (every
import, also those inside functions), then sorted into: the standard library, the package itself,
ROS packages (found in an ament index, shipped as `ros-*` wheels, or known not to be
installable here), and third-party Python packages (mapped to their rosdep keys, or listed with
the reason they are not from rosdep). Anything unsorted fails, so a new import gets decided.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import os
import pathlib
import sys
import xml.etree.ElementTree as ET

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
#: package -> (its package.xml, the folders of its Python code)
PACKAGES = {
    "flowedge_relay": (ROOT / "package.xml", [ROOT / "flowedge_relay", ROOT / "launch"]),
    "flowedge_relay_tools": (ROOT / "tools" / "package.xml",
                             [ROOT / "tools" / "flowedge_relay_tools"]),
}

# Python packages with a rosdep key: import name -> key.
ROSDEP_KEYS = {"numpy": "python3-numpy", "cffi": "python3-cffi", "yaml": "python3-yaml"}
# Python packages this package imports but does not declare, and why.
NOT_FROM_ROSDEP = {
    "onnxruntime": "installed by pip (setup.py install_requires); package.xml says so",
    "matplotlib": "optional: only the benchmark and soak plots import it",
    "onnx": "optional: only policy training (flowedge_relay_tools.train_policy) exports with it",
}
# ROS packages that are not installable on these machines (no wheel), so not found below.
ROS_NOT_INSTALLABLE_HERE = {"launch", "launch_ros"}
# Entries that declare what is imported (not build_depend, test_depend, buildtool_depend).
RUNTIME_TAGS = ("depend", "exec_depend")


def imported_modules(package: str = "flowedge_relay") -> dict[str, set[str]]:
    """Top-level module -> the files (relative paths) that import it, absolute imports only."""
    found: dict[str, set[str]] = {}
    for source in PACKAGES[package][1]:
        for path in sorted(source.rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def _ament_prefixes() -> list[pathlib.Path]:
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    return [pathlib.Path(p) for p in prefixes] + [pathlib.Path(sys.prefix)]


@functools.cache
def _distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def is_ros_package(module: str) -> bool:
    """Registered in an ament index here, or shipped as a ros-* wheel, or known uninstallable."""
    if module in ROS_NOT_INSTALLABLE_HERE:
        return True
    for prefix in _ament_prefixes():
        if (prefix / "share" / "ament_index" / "resource_index" / "packages" / module).exists():
            return True
    dists = _distributions().get(module, [])
    return any(d.lower().startswith("ros-") for d in dists)


def declared(package: str) -> set[str]:
    root = ET.parse(PACKAGES[package][0]).getroot()
    assert root.findtext("name") == package
    return {e.text.strip() for tag in RUNTIME_TAGS for e in root.findall(tag)}


def expected_entries(package: str) -> tuple[set[str], list[str]]:
    """(package.xml entries the imports call for, imports nobody has classified)."""
    entries: set[str] = set()
    unclassified = []
    for module, files in sorted(imported_modules(package).items()):
        if module in sys.stdlib_module_names or module == package or module == "__future__":
            continue
        if is_ros_package(module):
            entries.add(module)
        elif module in ROSDEP_KEYS:
            entries.add(ROSDEP_KEYS[module])
        elif module not in NOT_FROM_ROSDEP:
            unclassified.append(f"{module} (imported by {', '.join(sorted(files))})")
    return entries, unclassified


def test_the_scan_sees_the_imports_the_issue_named():
    """rcl_interfaces in parameters.py (the descriptors), ament_index_python in the launch
    file, rclpy in node.py."""
    found = imported_modules()
    assert "flowedge_relay/parameters.py" in found["rcl_interfaces"]
    assert "flowedge_relay/node.py" in found["rclpy"]
    assert "launch/relay.launch.py" in found["ament_index_python"]
    assert {"launch", "launch_ros", "rclpy", "numpy"} <= set(found)


def test_ros_packages_are_told_apart_from_python_packages():
    for ros in ("rclpy", "rcl_interfaces", "ament_index_python", "diagnostic_msgs",
                "builtin_interfaces", "flowedge_relay_msgs"):
        assert is_ros_package(ros), ros
    for python in ("numpy", "cffi", "yaml", "onnxruntime", "json"):
        assert not is_ros_package(python), python


def test_the_tools_package_depends_on_the_runtime_and_not_the_reverse():
    assert "flowedge_relay" in imported_modules("flowedge_relay_tools")
    assert "flowedge_relay_tools" not in imported_modules("flowedge_relay")
    assert "flowedge_relay" in declared("flowedge_relay_tools")


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_every_third_party_import_is_classified(package):
    _, unclassified = expected_entries(package)
    assert not unclassified, (
        "imports with no package.xml decision; map them in ROSDEP_KEYS or NOT_FROM_ROSDEP: "
        + "; ".join(unclassified)
    )


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_package_xml_declares_every_import(package):
    entries, _ = expected_entries(package)
    missing = entries - declared(package)
    assert not missing, f"imported but not in package.xml: {sorted(missing)}"


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_package_xml_declares_nothing_unused(package):
    entries, _ = expected_entries(package)
    unused = declared(package) - entries
    assert not unused, f"in package.xml, imported nowhere in the package: {sorted(unused)}"
