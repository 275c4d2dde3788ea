# SPDX-License-Identifier: Apache-2.0
"""The documentation resolves inside the repository: a clone is all a reader has.

Checks every relative Markdown link (and its #anchor) in README.md, SECURITY.md, CONTRIBUTING.md
and docs/*.md, every anchor and section number of docs/design.md cited anywhere in the tree, the
tests docs/design.md cites for its invariants, that its status table says "implemented" or what
is missing, and that no file points at the shared folder next to the repository, where the
contract used to live.
"""

from __future__ import annotations

import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"
PAGES = sorted([ROOT / "README.md", ROOT / "SECURITY.md", ROOT / "CONTRIBUTING.md",
                *(ROOT / "docs").glob("*.md")])
SKIP_DIRS = {".git", ".venv", "build", "install", "log", "out", "__pycache__", ".hypothesis",
             ".pytest_cache", ".ruff_cache"}
SHARED = "../" + "shared/"  # spelled in two parts so this file does not match itself

LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.M)
FENCE = re.compile(r"^\s*(```|~~~).*?^\s*\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
EXPLICIT_ID = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
DESIGN_ANCHOR = re.compile(r"docs/design\.md#([A-Za-z0-9_-]+)")
DESIGN_SECTION = re.compile(r"docs/design\.md §(\d+)(?:\.(\d+))?")
CITED_TEST = re.compile(r"`(test/[\w/]+\.py)(?:::(\w+))?`")


def prose(text: str) -> str:
    """Markdown without fenced blocks and inline code, where link syntax is not a link."""
    return INLINE_CODE.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's heading anchor: link text only, lower case, punctuation dropped, spaces -> '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(h) for h in HEADING.findall(text)} | set(EXPLICIT_ID.findall(text))


def links(page: pathlib.Path) -> list[str]:
    text = prose(page.read_text(encoding="utf-8"))
    return LINK.findall(text) + REF_DEF.findall(text)


def repository_text_files() -> list[pathlib.Path]:
    """Every text file of the working tree outside build output and tool caches."""
    found = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts):
            continue
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data[:4096]:
            continue  # binary: models, images, built extensions
        found.append(path)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
            continue  # http:, https:, mailto: ...
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repository")
        elif not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target}: no heading or id '{fragment}' in {dest.name}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_pages_have_links_to_check():
    """The link test above must see links, or it checks nothing (a regex regression)."""
    readme = links(ROOT / "README.md")
    assert "docs/design.md" in readme and "docs/core-api.md" in readme


def test_nothing_points_outside_the_repository_for_its_contract():
    offenders = [str(p.relative_to(ROOT)) for p in repository_text_files()
                 if SHARED in p.read_text(encoding="utf-8", errors="replace")]
    assert not offenders, f"these files reference {SHARED}: {offenders}"


def test_design_anchors_and_sections_cited_anywhere_exist():
    targets = anchors(DESIGN)
    design = DESIGN.read_text(encoding="utf-8")
    sections = set(re.findall(r"^##+ (\d+(?:\.\d+)?)\.? ", design, re.M))
    assert {str(n) for n in range(1, 13)} <= sections, "sections 1-12 keep their numbers"
    assert "decision-record" in targets and "invariants" in targets
    bad = []
    for path in repository_text_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        bad += [f"{path.relative_to(ROOT)}: #{a}" for a in DESIGN_ANCHOR.findall(text)
                if a not in targets]
        bad += [f"{path.relative_to(ROOT)}: §{n}{'.' + sub if sub else ''}"
                for n, sub in DESIGN_SECTION.findall(text)
                if (f"{n}.{sub}" if sub else n) not in sections]
    assert not bad, f"references to docs/design.md that do not exist: {bad}"


def test_tests_cited_by_the_design_exist():
    cited = CITED_TEST.findall(DESIGN.read_text(encoding="utf-8"))
    assert len(cited) > 20, "the invariants table cites its tests"
    missing = []
    for file, name in cited:
        path = ROOT / file
        if not path.is_file():
            missing.append(file)
        elif name and not re.search(rf"^def {name}\(", path.read_text(encoding="utf-8"), re.M):
            missing.append(f"{file}::{name}")
    assert not missing, f"docs/design.md cites tests that do not exist: {missing}"


def test_design_status_says_implemented_or_what_is_missing():
    """The status table is a contract, not a changelog: one word, or what is still missing."""
    design = DESIGN.read_text(encoding="utf-8")
    table = design.split("| part | status |", 1)[1].split("\n\n", 1)[0]
    statuses = [row.rstrip(" |").rsplit(" | ", 1)[1] for row in table.strip().splitlines()[1:]]
    assert len(statuses) > 5
    bad = [s for s in statuses
           if s != "implemented" and not re.fullmatch(r"not implemented: [^|]+", s)]
    assert not bad, f"status cells that are neither: {bad}"


def test_design_opens_with_an_overview_a_newcomer_reads_first():
    """docs/design.md opens with the promise, the outcomes, the order of decisions and the
    threads in at most 150 lines; the numbered detail follows it."""
    lines = (ROOT / "docs" / "design.md").read_text().splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("## ")]
    assert lines[heads[0]] == "## Overview"
    end = heads[1]
    assert end <= 150, f"the overview runs to line {end}"
    overview = "\n".join(lines[:end])
    for part in ("**The promise.**", "**The outcomes**", "**The order of decisions",
                 "**The threads**", "INFERENCE_FAILED", "fer-request"):
        assert part in overview, part
    assert heads.index(next(i for i in heads if lines[i].startswith("## 1. "))) > 1
