# SPDX-License-Identifier: Apache-2.0
"""The runtime stands apart from the tooling, and no module reaches into another's
privates: the import graph, the node's surface, and `obj._name` everywhere (the tests too).

The runtime is the package flowedge_relay (flowedge_relay/, with launch/); the tooling is the
package flowedge_relay_tools (tools/flowedge_relay_tools/: the demos, the drill, the stress
campaigns, the benchmarks, training). The runtime must never import the tooling (a robot installs
and runs the relay without it), and the tooling may use the runtime only through its public
names: no private module (`flowedge_relay._fer_core`), no private name, and the node only through
its public surface, never its private fields. More generally no module outside test/ reads or
writes another module's private names (`obj._name` whose value is not self or cls, getattr(obj,
"_name"), `from module import _name`); a module's own private names are fine. What is really
fine elsewhere is listed in ALLOWED, each with its reason. The tests hold to the same rule: they
test behaviour through public names, and what one really must reach is in TEST_ALLOWED, each
with its reason.

The relay itself (flowedge_relay/relay.py) imports no rclpy, directly or through the modules it
imports: what is served, the swap, the counters and the snapshot run and are tested without ROS.
"""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "flowedge_relay"
TOOLING = ROOT / "tools" / "flowedge_relay_tools"
RUNTIME_FILES = sorted(itertools.chain(PACKAGE.rglob("*.py"), (ROOT / "launch").rglob("*.py")))
TOOLING_FILES = sorted(TOOLING.rglob("*.py"))


def imports_of(source: str) -> set[str]:
    """The absolute module names `source` imports (a `from flowedge_relay import x` counts as
    flowedge_relay.x too, since x may be a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            if node.module == "flowedge_relay":
                names.update(f"flowedge_relay.{alias.name}" for alias in node.names)
    return names


def _is_tooling(module: str) -> bool:
    return module.split(".")[0] == "flowedge_relay_tools" or module.startswith(
        "flowedge_relay.tooling")


def test_the_runtime_never_imports_the_tooling():
    assert len(RUNTIME_FILES) > 10 and not (PACKAGE / "tooling").exists()
    offenders = {str(p.relative_to(ROOT)): sorted(m for m in imports_of(p.read_text())
                                                 if _is_tooling(m))
                 for p in RUNTIME_FILES}
    assert {k: v for k, v in offenders.items() if v} == {}


def private_runtime_modules(source: str) -> list[str]:
    """The runtime modules `source` imports whose path has a private part (`flowedge_relay._x`,
    `flowedge_relay.x._y`): the runtime's internals, which the tooling must not depend on."""
    return sorted(m for m in imports_of(source)
                  if m.split(".")[0] == "flowedge_relay"
                  and any(PRIVATE.match(part) for part in m.split(".")[1:]))


#: (tooling file, private runtime module) -> why it is fine
TOOLING_ALLOWED = {
    ("tools/flowedge_relay_tools/_build_bench.py", "flowedge_relay._build_core"):
        "the builder of the tools' C drivers includes the core's cdef (the types the drivers "
        "share with it) and compiles with its flags: a build step, not a use of the runtime's "
        "internals at run time",
}


def test_the_tooling_imports_only_public_runtime_modules():
    assert len(TOOLING_FILES) > 30
    found = {str(p.relative_to(ROOT)): [m for m in private_runtime_modules(p.read_text())
                                        if (str(p.relative_to(ROOT)), m) not in TOOLING_ALLOWED]
             for p in TOOLING_FILES}
    assert {k: v for k, v in found.items() if v} == {}
    # every allowance is still needed
    assert all(m in private_runtime_modules((ROOT / f).read_text()) for f, m in TOOLING_ALLOWED)
    # the check on what it must reject, and on what it must let through
    planted = ("from flowedge_relay._fer_core import lib\nimport flowedge_relay.policy._x\n"
               "from flowedge_relay import _build_core, model\n"
               "from flowedge_relay.core import ffi\n")
    assert private_runtime_modules(planted) == [
        "flowedge_relay._build_core", "flowedge_relay._fer_core", "flowedge_relay.policy._x"]


def test_tools_read_the_node_only_through_its_public_surface():
    private = re.compile(r"\b(relay|node)\._[a-z]\w*")
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in TOOLING_FILES
             for n, line in enumerate(p.read_text().splitlines(), 1) if private.search(line)]
    assert found == []


BENCH = TOOLING / "bench"


def bench_import_graph() -> dict[str, set[str]]:
    """bench module -> the bench modules it imports (at the top or inside a function)."""
    names = {p.stem for p in BENCH.glob("*.py")}
    graph = {}
    for path in sorted(BENCH.glob("*.py")):
        found = set()
        for module in imports_of(path.read_text()):
            parts = module.split(".")
            if parts[:2] == ["flowedge_relay_tools", "bench"] and len(parts) > 2:
                found.add(parts[2])
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):  # from flowedge_relay_tools.bench import calibrate, noise
            if isinstance(node, ast.ImportFrom) and node.module == "flowedge_relay_tools.bench":
                found.update(a.name for a in node.names if a.name in names)
        graph[path.stem] = found - {path.stem}
    return graph


def test_the_benches_import_each_other_without_a_cycle():
    """The figures the benches share live in targets.py and host.py, which import no bench
    module; perfdoc reads the benches' JSON and states their targets, and no bench imports it
    (calibrate, overload and perfdoc once imported each other in a circle)."""
    graph = bench_import_graph()
    assert {"calibrate", "overload"} <= graph["calibrate_check"]
    assert find_cycle(graph) is None
    assert graph["targets"] == graph["host"] == set()
    assert [m for m, deps in graph.items() if "perfdoc" in deps] == []
    assert {"targets", "host"} <= graph["overload"] and "targets" in graph["perfdoc"]


# ---- the C core's include graph ------------------------------------------------------------------

CSRC = ROOT / "csrc"
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)
_GRAPH_LINE = re.compile(r"^ \*\s+((?:fer\w* )+)-> ((?:fer\w* ?)+)$", re.MULTILINE)


def _node(name: str) -> str:
    """fer_cost.c and fer_cost.h are one node: a header needing the types of a file that includes
    it (fer_cost.c needed fer_internal.h, which needs fer_cost.h) is the cycle that counts."""
    return name.rsplit(".", 1)[0]


def include_graph(files: dict[str, str]) -> dict[str, set[str]]:
    """Node -> the nodes its files' quoted #includes name (a file's own header left out)."""
    graph: dict[str, set[str]] = {}
    for name, text in files.items():
        edges = graph.setdefault(_node(name), set())
        edges.update(_node(i) for i in _INCLUDE.findall(text) if _node(i) != _node(name))
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a path that starts and ends at the same node, or None (depth-first)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def _csrc() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(CSRC.glob("*.[ch]"))}


def test_the_cycle_check_finds_a_planted_cycle():
    # The old shape: fer_cost.c included fer_internal.h, which includes fer_cost.h.
    old = {"fer_internal.h": '#include "fer.h"\n#include "fer_cost.h"\n',
           "fer_cost.h": "#include <stdint.h>\n", "fer_cost.c": '#include "fer_internal.h"\n',
           "fer.h": ""}
    assert find_cycle(include_graph(old)) == ["fer_cost", "fer_internal", "fer_cost"]
    longer = {"a.c": '#include "a.h"\n#include "b.h"\n', "b.c": '  #  include "c.h"\n',
              "c.c": '#include "d.h"\n', "d.h": '#include "b.h"\n'}
    assert find_cycle(include_graph(longer)) == ["b", "c", "d", "b"]
    # The same files without the back edge: a chain, no cycle.
    assert find_cycle(include_graph({**longer, "d.h": "#include <stdint.h>\n"})) is None


def test_the_core_includes_form_no_cycle():
    graph = include_graph(_csrc())
    assert len(graph) > 20 and graph["fer_cost"] == {"fer", "fer_sat"}
    assert find_cycle(graph) is None


def test_fer_internal_h_draws_the_include_graph_as_it_is():
    drawn: dict[str, set[str]] = {}
    for sources, targets in _GRAPH_LINE.findall((CSRC / "fer_internal.h").read_text()):
        for node in sources.split():
            drawn.setdefault(node, set()).update(targets.split())
    actual = {node: edges for node, edges in include_graph(_csrc()).items() if edges}
    assert drawn == actual
#: (file, reach) -> why it is fine. A reach is written `obj._name` (getattr forms too).
ALLOWED = {
    ("flowedge_relay/ros_compat.py", "executor._executor"):
        "rclpy's MultiThreadedExecutor keeps its thread pool private and rclpy 7 never shuts it "
        "down; shutdown_executor must (ros_compat.py documents it, test_ros_compat.py pins it)",
    ("flowedge_relay/ros_compat.py", "node._state_machine"):
        "rclpy's LifecycleNodeMixin never destroys its state machine, so a destroyed node stays "
        "in the graph; destroy_lifecycle_node must (ros_compat.py, test_ros_compat.py)",
}
#: every Python file outside test/ (and outside build output): both packages, their setup.py,
#: launch/, scripts/ and the core fuzzer (tools/fuzz_core.py)
CHECKED = sorted(itertools.chain(PACKAGE.rglob("*.py"), (ROOT / "tools").rglob("*.py"),
                                 (ROOT / "launch").rglob("*.py"), (ROOT / "scripts").rglob("*.py"),
                                 [ROOT / "setup.py"]))
PRIVATE = re.compile(r"^_(?!_)")  # one leading underscore, not a dunder
ACCESSORS = {"getattr", "setattr", "hasattr", "delattr"}


def _own_names(tree: ast.AST) -> set[str]:
    """The private names a module defines itself: functions, classes, module and class level
    names, and attributes it assigns through self or cls."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
              and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            own.add(node.attr)
    return own


def private_reach(source: str, name: str) -> list[str]:
    """`name:line: obj._attr` for every reach into another module's private names in source."""
    tree = ast.parse(source, name)
    own = _own_names(tree)
    found = []
    for node in ast.walk(tree):
        target, attr = None, None
        if isinstance(node, ast.Attribute):
            target, attr = node.value, node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ACCESSORS and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            target, attr = node.args[0], node.args[1].value
        elif isinstance(node, ast.ImportFrom):
            found += [f"{name}:{node.lineno}: from {node.module} import {a.name}"
                      for a in node.names if PRIVATE.match(a.name)]
            continue
        if attr is None or not PRIVATE.match(attr) or attr in own:
            continue
        if isinstance(target, ast.Name) and target.id in ("self", "cls"):
            continue
        found.append(f"{name}:{node.lineno}: {ast.unparse(target)}.{attr}")
    return found


def _reaches() -> list[str]:
    found = []
    for path in CHECKED:
        rel = str(path.relative_to(ROOT))
        found += private_reach(path.read_text(), rel)
    return found


def _allowed(reach: str) -> bool:
    file, _, rest = reach.partition(":")
    return (file, rest.split(": ", 1)[1]) in ALLOWED


def test_no_module_reaches_into_another_modules_private_names():
    assert len(CHECKED) > 50
    assert [r for r in _reaches() if not _allowed(r)] == []


def test_every_allowed_reach_is_still_there():
    """An exception whose code went away is removed from ALLOWED, not kept as a licence."""
    seen = {(r.partition(":")[0], r.split(": ", 1)[1]) for r in _reaches()}
    assert set(ALLOWED) <= seen


PLANTED = """\
import os
from flowedge_relay.model import _hidden


class Mine:
    _level = 1

    def __init__(self, other):
        self._own = other._theirs
        cls = type(self)
        self.size = cls._level + other._own + len(other.__dict__)
        getattr(other, "_secret", None)
        os._exit(0)
"""


def test_the_rule_finds_a_planted_reach(tmp_path):
    """Through self or cls, a name the module defines itself, a dunder: fine; another object's
    private attribute, a getattr of one, a private import: found (os._exit is allowed nowhere)."""
    planted = tmp_path / "planted.py"
    planted.write_text(PLANTED)
    assert private_reach(planted.read_text(), "planted.py") == [
        "planted.py:2: from flowedge_relay.model import _hidden",
        "planted.py:9: other._theirs",
        "planted.py:12: other._secret",
        "planted.py:13: os._exit",
    ]
    assert not _allowed("planted.py:13: os._exit")


# ---- the tests reach no private name either ------------------------------------------------------

TESTS = sorted((ROOT / "test").glob("*.py"))
#: `obj._name` (as private_reach writes it) a test may reach, in any test file -> why.
TEST_ALLOWED = {
    "from flowedge_relay import _build_core":
        "the session builds the C core in place with setup.py's own CFFI builder (conftest.py)",
    "executor._executor":
        "pins rclpy's private thread pool, which ros_compat.shutdown_executor shuts down",
    "executor._futures":
        "pins rclpy's private task list, which executors.MainExecutor's spin relies on",
    "pool._workers":
        "a worker's native loop state (serve, holding, probe): no public reader exists, and "
        "the tests check it is allocated, held and released as the C loop needs",
    "loop._exec":
        "the C serve loop's executor handle, handed to fer_serve_create by the test itself",
    "s._context":
        "the device buffer two graphs share: the test checks it is bound once, never copied",
    "ActionPublisher._create":
        "the C publisher without its thread: the tests drive fer_publish_run step by step",
    "validation.Validator._check":
        "plants a wrong validator to show the campaign's oracle is not graded by the relay",
    "view._cv":
        "a RemoteRelay's stats history without a ROS node behind it (the bench's arithmetic)",
}


def _test_reaches() -> list[str]:
    return [r for path in TESTS
            for r in private_reach(path.read_text(), str(path.relative_to(ROOT)))]


def test_no_test_reaches_into_another_modules_private_names():
    assert len(TESTS) > 50
    assert [r for r in _test_reaches() if r.split(": ", 1)[1] not in TEST_ALLOWED] == []


def test_every_allowed_test_reach_is_still_there():
    seen = {r.split(": ", 1)[1] for r in _test_reaches()}
    assert set(TEST_ALLOWED) <= seen


# ---- the node stays a thin lifecycle node --------------------------------------------------------

NODE_MAX_LINES = 270
#: what tools read of a running relay: the Relay's (relay.py), never repeated on the node
RELAY_READS = {"serving", "core", "pool", "model", "validator", "model_error", "counters",
               "snapshot", "threads_alive", "fault_pause_intake", "fault_pause_output",
               "inject_worker_crash"}


def class_names(source: str, cls: str) -> set[str]:
    """The names class `cls` in `source` defines: its methods and its class-level assignments."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            names = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
            names |= {t.id for n in node.body if isinstance(n, ast.Assign | ast.AnnAssign)
                      for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                      if isinstance(t, ast.Name)}
            return names
    raise AssertionError(f"no class {cls}")


def test_the_node_stays_a_thin_lifecycle_node():
    """node.py holds the lifecycle node as ros2/demos' lifecycle_talker shapes one: parameters,
    topics, timers, transitions. The work is in the modules that own it, and tools read what is
    served through the node's `relay`, so the node neither grows back nor repeats the Relay's
    read surface."""
    source = (PACKAGE / "node.py").read_text()
    assert len(source.splitlines()) <= NODE_MAX_LINES
    assert class_names(source, "RelayNode") & RELAY_READS == set()
    assert RELAY_READS <= class_names((PACKAGE / "relay.py").read_text(), "Relay")
    # the check sees a delegating property and a method alike
    planted = ("class RelayNode:\n    core = property(lambda self: 1)\n"
               "    def counters(self): ...\n")
    assert class_names(planted, "RelayNode") & RELAY_READS == {"core", "counters"}


# ---- the relay runs without ROS ------------------------------------------------------------------

def runtime_imports(module: str) -> dict[str, set[str]]:
    """module -> what it imports, for `module` and every flowedge_relay module it reaches."""
    graph: dict[str, set[str]] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        base = ROOT / name.replace(".", "/")
        path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if name in graph or not path.exists():
            continue
        graph[name] = imports_of(path.read_text())
        todo += [m for m in graph[name] if m.split(".")[0] == "flowedge_relay"]
    return graph


def ros_paths(graph: dict[str, set[str]]) -> list[str]:
    """`module -> rclpy...` for every rclpy import in `graph`."""
    return sorted(f"{name} -> {m}" for name, imports in graph.items() for m in imports
                  if m.split(".")[0] == "rclpy")


def test_the_relay_imports_no_rclpy():
    graph = runtime_imports("flowedge_relay.relay")
    assert {"flowedge_relay.serving", "flowedge_relay.workers", "flowedge_relay.core",
            "flowedge_relay.policy", "flowedge_relay.policy.sampler"} <= set(graph)
    assert ros_paths(graph) == []
    # the check finds what it must: the node reaches rclpy directly and through parameters
    node = ros_paths(runtime_imports("flowedge_relay.node"))
    assert "flowedge_relay.node -> rclpy.lifecycle" in node
    assert "flowedge_relay.parameters -> rclpy.node" in node
