"""The runtime stands apart from the tooling (issue 13): the import graph and the node's surface.

The runtime is flowedge_relay/ without tooling/; it must never import the tooling (a robot runs
the relay without the benchmarks), and the tooling may read the node only through its public
surface, never its private fields.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "flowedge_relay"
TOOLING = PACKAGE / "tooling"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_the_runtime_never_imports_the_tooling():
    runtime = [p for p in PACKAGE.rglob("*.py") if TOOLING not in p.parents]
    assert len(runtime) > 10
    offenders = {str(p.relative_to(ROOT)): sorted(m for m in _imports(p)
                                                  if m.startswith("flowedge_relay.tooling"))
                 for p in runtime}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_tools_read_the_node_only_through_its_public_surface():
    private = re.compile(r"\b(relay|node)\._[a-z]\w*")
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in sorted(TOOLING.rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1) if private.search(line)]
    assert found == []


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
