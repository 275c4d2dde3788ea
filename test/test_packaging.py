# SPDX-License-Identifier: Apache-2.0
"""What each of the workspace's two Python packages installs: a robot installs flowedge_relay
and gets the relay, with no benchmark, no bench model and no demo task; those are
flowedge_relay_tools' (tools/), as are the bench, drill and demo executables.

The file lists come from setuptools itself: each setup.py is run with `setup()` captured, and
its build_py command (the step that copies packages and package data into site-packages) says
what it would install. Nothing is built, so the C core's CFFI step is left out.
"""

from __future__ import annotations

import contextlib
import os
import runpy
from pathlib import Path

import pytest
import setuptools

ROOT = Path(__file__).resolve().parent.parent
RUNTIME, TOOLS = ROOT, ROOT / "tools"
#: what belongs to the tooling, wherever it would be installed
TOOLING_FILES = ("bench/", "stress/", "drill.py", "demo_producer.py", "run_demo.py",
                 "rtc_demo_producer.py", "train_policy.py", "policy_bench.", "detour_task.py")


def setup_arguments(folder: Path) -> dict:
    """The keyword arguments folder/setup.py passes to setuptools.setup()."""
    captured: dict = {}
    real = setuptools.setup
    setuptools.setup = lambda **kwargs: captured.update(kwargs)
    try:
        with contextlib.chdir(folder):
            runpy.run_path("setup.py", run_name="__main__")
    finally:
        setuptools.setup = real
    assert captured, f"{folder}/setup.py called no setup()"
    return captured


def installed_files(folder: Path) -> list[str]:
    """The files folder/setup.py installs into site-packages (modules and package data), relative
    to it, as setuptools' build_py computes them."""
    kwargs = {k: v for k, v in setup_arguments(folder).items()
              if k not in ("cffi_modules", "setup_requires")}
    with contextlib.chdir(folder):
        dist = setuptools.Distribution(kwargs)
        dist.script_name = "setup.py"
        build_py = dist.get_command_obj("build_py")
        build_py.ensure_finalized()
        return sorted(os.path.relpath(f, build_py.build_lib)
                      for f in build_py.get_outputs(include_bytecode=False))


def executables(folder: Path) -> set[str]:
    scripts = setup_arguments(folder)["entry_points"]["console_scripts"]
    return {line.split("=")[0].strip() for line in scripts}


def tooling(files: list[str]) -> list[str]:
    return [f for f in files if any(part in f for part in TOOLING_FILES)]


@pytest.fixture(scope="module")
def runtime_files() -> list[str]:
    return installed_files(RUNTIME)


@pytest.fixture(scope="module")
def tools_files() -> list[str]:
    return installed_files(TOOLS)


def test_the_runtime_installs_no_bench_code_bench_model_or_demo_task(runtime_files):
    assert "flowedge_relay/node.py" in runtime_files
    assert "flowedge_relay/models/policy_small.onnx" in runtime_files
    assert tooling(runtime_files) == []
    assert not [f for f in runtime_files if not f.startswith("flowedge_relay/")]


def test_the_tools_package_installs_them(tools_files):
    """The check above run on the package that must hold them: it finds each kind."""
    found = tooling(tools_files)
    for part in TOOLING_FILES:
        assert any(part in f for f in found), part
    assert "flowedge_relay_tools/models/policy_bench.onnx" in tools_files
    assert "flowedge_relay_tools/models/detour_task.py" in tools_files
    assert not [f for f in tools_files if not f.startswith("flowedge_relay_tools/")]


def test_each_executable_is_installed_by_its_package():
    assert executables(RUNTIME) == {"flowedge-relayd"}
    assert executables(TOOLS) == {"flowedge_relay_bench", "flowedge-relay-drill",
                                  "flowedge-relay-demo-producer"}
