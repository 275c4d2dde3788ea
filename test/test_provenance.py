# SPDX-License-Identifier: Apache-2.0
"""Provenance a newcomer can follow: the licence file package.xml names, an SPDX line on every
source file, and no reference to an internal issue tracker a reader of the repository cannot
open (the reason goes in the sentence instead)."""

import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
SPDX = "SPDX-License-Identifier: Apache-2.0"
SOURCE_SUFFIXES = {".py", ".c", ".h", ".sh", ".msg", ".yaml", ".xml", ".cfg", ".ini", ".toml"}
SOURCE_NAMES = {"Makefile", "CMakeLists.txt", "run"}
TEXT_SUFFIXES = SOURCE_SUFFIXES | {".md", ".txt"}
#: "issue" or "issues" and a number (with or without "#"), or "#" and a number alone: an
#: internal tracker's numbers (the samples below are spliced so they match only there). An upstream
#: project's issue named with its project ("rclpy issue 1452") can be opened, and stays.
INTERNAL_ISSUE = re.compile(r"(?<!rclpy )\bissues? #?\d+|(?<![\w&/])#\d{1,4}(?![\w-])",
                            re.IGNORECASE)


def _tracked() -> list[pathlib.Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    return [ROOT / f for f in out if (ROOT / f).is_file()]


#: a policy package's files are data its digest covers: a header would change what it serves
PACKAGE_FILES = ("flowedge_relay/models/policy_",)


def _is_source(path: pathlib.Path) -> bool:
    if str(path.relative_to(ROOT)).startswith(PACKAGE_FILES):
        return False
    return path.suffix in SOURCE_SUFFIXES or path.name in SOURCE_NAMES


def test_the_licence_is_the_one_package_xml_names():
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    for xml in ("package.xml", "msg/package.xml"):
        assert "<license>Apache-2.0</license>" in (ROOT / xml).read_text(), xml


def test_every_source_file_carries_its_spdx_line():
    missing = [str(p.relative_to(ROOT)) for p in _tracked() if _is_source(p)
               and SPDX not in "\n".join(p.read_text().splitlines()[:3])]
    assert not missing, f"add '{SPDX}' in the first lines of: {missing}"


def test_no_internal_issue_numbers():
    found = []
    for path in _tracked():
        if path.suffix not in TEXT_SUFFIXES and path.name not in SOURCE_NAMES:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if INTERNAL_ISSUE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:80]}")
    assert not found, "say the reason instead of an issue number:\n" + "\n".join(found)


def test_the_checks_catch_what_they_look_for():
    assert INTERNAL_ISSUE.search("the native loop (issu" + "e " + "#" + "15)")
    assert INTERNAL_ISSUE.search("before #" + "15) it ran in Python")
    assert INTERNAL_ISSUE.search("as in issu" + "es 12")
    assert not INTERNAL_ISSUE.search("rclpy issue 1452, a busy loop")
    assert not INTERNAL_ISSUE.search("[§3](docs/design.md#3-outcomes), colour #1f77b4")
    assert _is_source(ROOT / "csrc" / "fer.h") and not _is_source(ROOT / "README.md")
    assert not _is_source(ROOT / "flowedge_relay" / "models" / "policy_rtc" / "policy.yaml")
