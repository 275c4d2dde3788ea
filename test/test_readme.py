# SPDX-License-Identifier: Apache-2.0
"""The README stays a front door: short, at a readable width, free of measurement history, and
every command it shows exists (a reader copies them into a shell).

History (figures with their runs, commits, dates, issue numbers) lives in git and in the
generated docs/performance.md; the checks below keep it out of the first page a robotics engineer
opens, and out of docs/design.md, which states what holds. CONTRIBUTING.md's commands are checked
like the README's. Each checker is also run on a small string it must reject, so none can pass
vacuously.
"""

from __future__ import annotations

import glob
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from flowedge_relay_tools.bench.__main__ import SUBCOMMANDS

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DESIGN = ROOT / "docs" / "design.md"
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
MAX_LINES = 300
WIDTH = 100
SHELL_FENCES = ("", "bash", "sh", "shell", "console")

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
COMMIT = re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")
DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
ISSUE = re.compile(r"\bissues?\s+#?\d+|(?<![\w&/])#\d+\b", re.I)
RUN_COUNT = re.compile(r"\b\d+ of (?:the )?\d+ runs\b|\b\d+ (?:`make bench` )?runs\b")
HISTORY = re.compile(r"\b(?:an earlier session|earlier we tried|we tried)\b", re.I)
# build output and scratch folders a README may name without their being in a clone
GENERATED = {"build", "install", "log", "out"}
TOP_DIRS = sorted(p.name for p in ROOT.iterdir()
                  if p.is_dir() and not p.name.startswith(".") and p.name not in GENERATED)
REPO_PATH = re.compile(rf"(?<![\w./$-])((?:{'|'.join(map(re.escape, TOP_DIRS))})/[\w./*<>-]*)")


def history_problems(text: str) -> list[str]:
    """Commit hashes, dates, issue references, run counts and "we tried" narratives."""
    return [f"{kind}: {m.group(0)!r}"
            for kind, pattern in (("commit", COMMIT), ("date", DATE), ("issue", ISSUE),
                                  ("run count", RUN_COUNT), ("history", HISTORY))
            for m in pattern.finditer(text)]  # fmt: skip


def wide_lines(text: str) -> list[str]:
    """Prose lines over WIDTH characters (tables and fenced blocks may be wider)."""
    wide, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and not line.startswith("|") and len(line) > WIDTH:
            wide.append(f"line {n}: {len(line)} characters")
    return wide


def make_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*)\s*:(?!=)", (ROOT / "Makefile").read_text(), re.M))


#: the workspace's Python packages: name -> the folder of its setup.py
PACKAGE_DIRS = {"flowedge_relay": ROOT, "flowedge_relay_tools": ROOT / "tools"}


def console_scripts(package: str | None = None) -> set[str]:
    """The executables the packages' setup.py install (`ros2 run <package> <name>` runs the
    same): those of one package, or of both."""
    dirs = [PACKAGE_DIRS[package]] if package else PACKAGE_DIRS.values()
    return {name for d in dirs
            for name in re.findall(r"\"([\w-]+)\s*=\s*[\w.]+:\w+\"",
                                   (d / "setup.py").read_text())}


def module_exists(name: str) -> bool:
    for base in PACKAGE_DIRS.values():
        path = base / name.replace(".", "/")
        if path.with_suffix(".py").is_file() or (path / "__init__.py").is_file():
            return True
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def shell_commands(text: str) -> list[list[str]]:
    """The commands of the README's shell blocks: continuation lines joined, comments dropped,
    `&&` / `;` / `|` chains split, leading `VAR=value` assignments removed."""
    commands = []
    for lang, body in FENCE.findall(text):
        if lang not in SHELL_FENCES:
            continue
        for line in body.replace("\\\n", " ").splitlines():
            try:
                words = shlex.split(line, comments=True)
            except ValueError:  # an apostrophe in a diagram, not a command
                continue
            command: list[str] = []
            for word in [*words, ";"]:
                if word in ("&&", "||", ";", "|"):
                    while command and re.match(r"^\w+=", command[0]):
                        command.pop(0)
                    if command:
                        commands.append(command)
                    command = []
                else:
                    command.append(word)
    return commands


def _bench_subcommand(args: list[str]) -> list[str]:
    name = next((a for a in args if not a.startswith("-")), None)
    return [] if name is None or name in SUBCOMMANDS else [f"no bench subcommand {name!r}"]


def command_problems(text: str) -> list[str]:
    """What in the shell blocks does not exist: make targets, modules, the package's
    executables and bench subcommands, launch files, and repository paths named anywhere."""
    targets, scripts = make_targets(), console_scripts()
    problems = []
    for cmd, *args in shell_commands(text):
        if cmd == "make":
            problems += [f"no make target {t!r}" for t in args
                         if not t.startswith("-") and "=" not in t and t not in targets]
        elif cmd in ("python", "python3") and "-m" in args:
            module = args[args.index("-m") + 1]
            if not module_exists(module):
                problems.append(f"no module {module!r}")
            elif module == "flowedge_relay_tools.bench":
                problems += _bench_subcommand(args[args.index("-m") + 2:])
        elif cmd.startswith("flowedge"):
            if cmd not in scripts:
                problems.append(f"no executable {cmd!r} in either setup.py")
            elif cmd == "flowedge_relay_bench":
                problems += _bench_subcommand(args)
        elif cmd == "ros2" and args[:2] == ["launch", "flowedge_relay"]:
            if not (ROOT / "launch" / args[2]).is_file():
                problems.append(f"no launch file {args[2]!r}")
        elif (cmd == "ros2" and args[:1] == ["run"] and args[1] in PACKAGE_DIRS
              and args[2] not in console_scripts(args[1])):
            problems.append(f"no executable {args[2]!r} in {args[1]} for ros2 run")
    for path in REPO_PATH.findall(text):
        path = path.rstrip(".,:;")
        if "<" not in path and not glob.glob(str(ROOT / path)):
            problems.append(f"no path {path!r}")
    return problems


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= MAX_LINES


@pytest.mark.parametrize("page", [README, DESIGN], ids=lambda p: p.name)
def test_page_carries_no_measurement_history(page):
    assert history_problems(page.read_text()) == []


def test_history_checker_catches_each_kind():
    # the issue references are spliced, so this sample is not one itself (test_provenance)
    found = history_problems("fixed in 3161d11 on 2026-12-01 (issu" + "e 15, see #" + "12); 4x "
                             "in 6 of 23 runs, as an earlier session found")
    assert [p.split(":")[0] for p in found] == ["commit", "date", "issue", "issue", "run count",
                                                "history"]
    assert history_problems("nfe_ns:=2000000 sha256:<hex> the last two runs, §5.1, cp311") == []


def test_readme_prose_is_within_width():
    assert wide_lines(README.read_text()) == []
    sample = "x" * (WIDTH + 1) + "\n| " + "y" * 200 + " |\n```\n" + "z" * 200 + "\n```\n"
    assert wide_lines(sample) == ["line 1: 101 characters"]


@pytest.mark.parametrize("page", [README, CONTRIBUTING], ids=lambda p: p.name)
def test_every_command_shown_exists(page):
    text = page.read_text()
    shown = {command[0] for command in shell_commands(text)}
    assert {"make", "flowedge_relay_bench", "python"} <= shown
    assert command_problems(text) == []


def test_a_made_up_command_is_caught():
    made_up = """```bash
make frobnicate
ROS_DISTRO=kilted make test frobnicate
flowedge-relay-frobnicate --now
flowedge_relay_bench frobnicate --quick
python -m flowedge_relay.frobnicate
python -m flowedge_relay_tools.bench frobnicate
ros2 launch flowedge_relay frobnicate.launch.py
cd ~/ws && ros2 run flowedge_relay frobnicate
source scripts/frobnicate.sh
ros2 run flowedge_relay flowedge_relay_bench swap
python -m flowedge_relay.tooling.bench calibrate
```
"""
    assert len(command_problems(made_up)) == 11, command_problems(made_up)
    real = """```bash
ROS_DISTRO=kilted make test  # comment
flowedge_relay_bench calibrate --model vision --json out/c.json
python -m flowedge_relay_tools.stress faults && ros2 launch flowedge_relay relay.launch.py
ros2 run flowedge_relay flowedge-relayd --ros-args \\
  --params-file config/relay.yaml
ros2 run flowedge_relay_tools flowedge_relay_bench swap --quick
```
"""
    assert command_problems(real) == []
