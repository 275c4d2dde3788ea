# SPDX-License-Identifier: Apache-2.0
"""What each of the workspace's two Python packages installs: a robot installs flowedge_relay
and gets the relay, with no benchmark, no bench model and no demo task; those are
flowedge_relay_tools' (tools/), as are the bench, drill and demo executables.

The file lists come from setuptools itself: each setup.py is run with `setup()` captured, and
its build_py command (the step that copies packages and package data into site-packages) says
what it would install. Nothing is built, so the C core's CFFI step is left out of those lists;
the C each package compiles comes from its own CFFI builder (setup.py's cffi_modules, run as
setup.py runs it), and what the relay's built core module exports from the module itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import runpy
from pathlib import Path

import pytest
import setuptools

ROOT = Path(__file__).resolve().parent.parent
RUNTIME, TOOLS = ROOT, ROOT / "tools"
#: what belongs to the tooling, wherever it would be installed
TOOLING_FILES = ("bench/", "stress/", "drill.py", "demo_producer.py", "run_demo.py",
                 "rtc_demo_producer.py", "train_policy.py", "policy_bench.", "detour_task.py")
#: the C of the tooling: the benchmark drivers and the intake bench's client (load generator)
BENCH_C_FILE = re.compile(r"fer_(bench|loadgen)\.[ch]$")
BENCH_C_NAME = re.compile(r"\b(fer_bench_\w+|fer_load_\w+|fer_tally_\w+|FER_LOAD_\w+)")
C_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)


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


def c_build(folder: Path) -> tuple[list[Path], str]:
    """The C files folder/setup.py's CFFI module compiles and the cdef it declares, from the
    builder its cffi_modules names (SOURCES and HEADERS, as both builders keep them)."""
    (entry,) = setup_arguments(folder)["cffi_modules"]
    with contextlib.chdir(folder):
        builder = runpy.run_path(entry.partition(":")[0])
    csrc = builder["CSRC"]
    return ([csrc / s for s in builder["SOURCES"]],
            "\n".join((csrc / h).read_text() for h in builder["HEADERS"]))


def bench_c_names(c_text: str) -> set[str]:
    """The benchmark drivers' and load generator's names that C text declares or calls (comments
    left out: a comment may say where they went)."""
    return set(BENCH_C_NAME.findall(C_COMMENT.sub("", c_text)))


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


def test_the_runtime_compiles_no_bench_c_code():
    sources, cdef = c_build(RUNTIME)
    assert {"fer_core.c", "fer_intake.c", "fer_take.c"} <= {p.name for p in sources}
    assert [p.name for p in (ROOT / "csrc").iterdir() if BENCH_C_FILE.search(p.name)] == []
    assert [p.name for p in sources if BENCH_C_FILE.search(p.name)] == []
    assert bench_c_names(cdef) == set()
    assert bench_c_names("".join(p.read_text() for p in sources)) == set()


def test_the_tools_package_compiles_it():
    """The checks above run on the package that must hold the bench C: they find it."""
    sources, cdef = c_build(TOOLS)
    assert sorted(p.name for p in sources) == ["fer_bench.c", "fer_loadgen.c"]
    assert all(BENCH_C_FILE.search(p.name) for p in sources)
    assert {"fer_bench_admission", "fer_bench_ring_produce", "fer_bench_intake_decide",
            "fer_load_publish", "fer_tally_create", "FER_LOAD_DUE"} <= bench_c_names(cdef)


def test_the_runtime_core_exports_no_bench_symbol():
    """The built modules: the relay's core module neither offers a bench name to Python (its lib)
    nor exports one to C (its dynamic symbols); the tools' module offers each, and its calls into
    the core are the relay's module's own functions."""
    from flowedge_relay.core import lib, library_path
    from flowedge_relay_tools.native import lib as tools_lib

    names = {n for n in dir(tools_lib) if BENCH_C_NAME.fullmatch(n)}
    assert len(names) >= 15, names
    core_module = ctypes.CDLL(library_path())  # the loaded module again, not a second copy
    assert hasattr(core_module, "fer_core_create")  # the probe finds an exported function
    assert sorted(n for n in names if n in dir(lib) or hasattr(core_module, n)) == []
    assert [n for n in dir(lib) if "bench" in n or "tally" in n] == []
