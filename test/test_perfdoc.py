"""perfdoc: the README block and docs/performance.md come from bench JSON, and two consecutive
runs are reported side by side (a figure counts when it reproduces). The README block is a few
headline rows stated for their host, without commit or date; the page keeps every row, the
machine lines and how to reproduce them."""

from __future__ import annotations

import json
from pathlib import Path

from flowedge_relay.tooling.bench import perfdoc


def _overhead(p99_ns: int, floor_ns: int, ratio: float, commit: str) -> dict:
    return {
        "host": {"cpu": "test cpu", "cores": 2, "loadavg_at_start": [0.1], "kernel": "k",
                 "python": "3", "onnxruntime": "1", "commit": commit, "date_utc": "d"},
        "overhead_p50_ns": p99_ns // 2, "overhead_p99_ns": p99_ns,
        "transport_floor_p50_ns": floor_ns // 2, "transport_floor_p99_ns": floor_ns,
        "relay_throughput_ratio": ratio,
    }  # fmt: skip


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "README.md").write_text(f"intro\n{perfdoc.BEGIN}\nold\n{perfdoc.END}\nafter\n")
    return root


def _run(tmp_path: Path, name: str, report: dict) -> Path:
    out = tmp_path / name
    out.mkdir()
    (out / "overhead.json").write_text(json.dumps(report))
    return out


def _block(readme: str) -> str:
    return readme.split(perfdoc.BEGIN, 1)[1].split(perfdoc.END, 1)[0]


def _two_runs(tmp_path: Path) -> Path:
    """A repository whose docs perfdoc generated from two runs (the previous one slower)."""
    root = _root(tmp_path)
    prev = _run(tmp_path, "prev", _overhead(3_000_000, 2_000_000, 0.97, "aaa111"))
    out = _run(tmp_path, "out", _overhead(2_800_000, 2_000_000, 0.99, "bbb222"))
    perfdoc.generate(out, root, previous=prev)
    return root


def test_two_runs_side_by_side(tmp_path):
    root = _two_runs(tmp_path)
    readme = (root / "README.md").read_text()
    assert readme.startswith("intro\n") and readme.endswith("after\n") and "old" not in readme
    block = _block(readme)
    assert "previous run" in block and "test cpu, 2 cores, Linux k" in block
    assert "aaa111" not in block and "bbb222" not in block and "load average" not in block
    ratio_row = next(line for line in block.splitlines() if "rclpy echo round-trip p99" in line)
    assert ratio_row.index("1.40") < ratio_row.index("1.50")  # this run, then the previous
    # which targets reproduced: 1.40 and 1.50 <= 1.5 both times
    assert ratio_row.rstrip(" |").endswith("both runs")
    page = (root / "docs" / "performance.md").read_text()
    assert "aaa111" in page and "bbb222" in page and "0.970" in page  # the page keeps both runs
    row = next(line for line in page.splitlines() if line.startswith("| relay_throughput_ratio"))
    assert row.index("0.990") < row.index("0.970")
    p99_row = next(line for line in page.splitlines() if "overhead at light load" in line)
    assert p99_row.rstrip(" |").endswith("neither")  # 2.8 and 3.0 ms > 2 ms both times
    assert "overhead at light load" not in block  # not a headline row
    assert "## Reproducing" in page and "make bench" in page


def test_readme_block_is_the_page_read_back(tmp_path):
    """--readme-only rebuilds the README block from docs/performance.md alone, to the byte."""
    root = _two_runs(tmp_path)
    generated = (root / "README.md").read_text()
    (root / "README.md").write_text(f"intro\n{perfdoc.BEGIN}\nold\n{perfdoc.END}\nafter\n")
    assert perfdoc.main(["--root", str(root), "--readme-only"]) == 0
    assert (root / "README.md").read_text() == generated


def test_committed_readme_block_is_generated_from_the_committed_page():
    """Nobody typed the README's figures: they are docs/performance.md's, picked by README_ROWS,
    and the block stays at the README's prose width outside its table."""
    rows, machines = perfdoc.parse_page((perfdoc.ROOT / "docs" / "performance.md").read_text())
    assert {m for m, _ in perfdoc.README_ROWS} <= {r["measure"] for r in rows}
    block = perfdoc.readme_block(rows, machines)
    assert block in (perfdoc.ROOT / "README.md").read_text()
    assert all(len(line) <= perfdoc.WIDTH for line in block.splitlines() if line[:1] != "|")
    assert len(block.splitlines()) <= 15


def test_target_met_says_which_run_held():
    prev = perfdoc.headline({"overhead": _overhead(3_100_000, 2_000_000, 0.90, "a")})
    this = perfdoc.headline({"overhead": _overhead(1_900_000, 2_000_000, 0.99, "b")})
    met = {r["measure"]: r["target met"] for r in perfdoc.side_by_side(this, prev)}
    assert met["relay overhead p99 / transport floor p99 (same run)"] == "this run only"
    assert met["relay_throughput_ratio (relay vs bare onnxruntime)"] == "this run only"
    assert met["transport floor (rclpy echo round trip), p50 / p99"] == "-"
    met = {r["measure"]: r["target met"] for r in perfdoc.side_by_side(prev, this)}
    assert met["relay overhead at light load, p50 / p99"] == "previous run only"


def test_overload_targets():
    m = {"on_time_ratio_admitted": 0.99995, "goodput_vs_capacity": 0.95,
         "nfe_goodput_vs_capacity": 0.86, "wasted_nfe_ratio": 0.001}
    t = perfdoc._overload_target
    assert t("edf_admission", "2.0", False, m) == (">= 99.99% / >= 90% / >= 85% / <= 0.5%", True)
    assert t("edf_admission", "3.0", False, m) == ("-", None)  # static: 2x without noise only
    assert t("edf_admission", "2.0", True, m) == ("-", None)
    assert t("edf_adaptive", "3.0", True, m) == (">= 99.99%", True)
    assert t("edf_adaptive", "2.0", True, {**m, "wasted_nfe_ratio": 0.006})[1] is False
    assert t("edf_adaptive", "3.0", False, {**m, "on_time_ratio_admitted": 0.9998})[1] is False
    assert t("queue_timeout", "2.0", False, m) == ("-", None)


def test_one_run_without_previous(tmp_path):
    root = _root(tmp_path)
    out = _run(tmp_path, "out", _overhead(2_800_000, 2_000_000, 0.99, "bbb222"))
    perfdoc.generate(out, root, previous=tmp_path / "missing")
    block = _block((root / "README.md").read_text())
    assert "previous run" not in block and "1.40" in block and "bbb222" not in block
    ratio_row = next(line for line in block.splitlines() if "rclpy echo round-trip p99" in line)
    assert ratio_row.rstrip(" |").endswith("yes")
