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
