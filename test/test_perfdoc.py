# SPDX-License-Identifier: Apache-2.0
"""perfdoc: the README block and docs/performance.md come from bench JSON, and two consecutive
runs are reported side by side (a figure counts when it reproduces). The README block is a few
headline rows stated for their host, without commit or date; the page keeps every row, the
machine lines and how to reproduce them."""

from __future__ import annotations

import json
from pathlib import Path

from flowedge_relay_tools.bench import perfdoc


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


def test_the_readme_states_the_host_without_its_load_commit_or_trademark_signs():
    machine = ("Intel(R) Xeon(R) Processor, 2 cores, Linux 6.18, Python 3.11.7 (load average "
               "0.5, 0.4, 0.3), commit abc1234, 2026-01-01 00:00 UTC")
    assert perfdoc.short_host(machine) == "Intel Xeon Processor, 2 cores, Linux 6.18, Python 3.11.7"


def test_committed_readme_block_is_generated_from_the_committed_page():
    """Nobody typed the README's figures: they are docs/performance.md's, picked by README_ROWS,
    and the block stays at the README's prose width outside its table."""
    rows, machines = perfdoc.parse_page((perfdoc.ROOT / "docs" / "performance.md").read_text())
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
    t = perfdoc.overload_target
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


def _point(on_time: float, nfe_goodput: float, wasted: float, applied: dict | None = None) -> dict:
    return {"on_time_ratio_admitted": on_time, "goodput_vs_capacity": 1.1,
            "nfe_goodput_vs_capacity": nfe_goodput, "wasted_nfe_ratio": wasted,
            "realtime_applied": applied or {}}  # fmt: skip


RT_APPLIED = {"rt.worker0": "SCHED_FIFO 50, CPUs 1 (asked SCHED_FIFO 50, CPUs 1; tid 7)",
              "rt.refused": "none", "memory_locked_kb": "1000"}


def _intake(ceilings: dict[str, float], first_loss: dict[str, float | None]) -> dict:
    return {"dds": [{"mix": mix, "ceiling_answered_per_s": c,
                     "first_loss_offered_per_s": first_loss[mix]}
                    for mix, c in ceilings.items()]}  # fmt: skip


def _full_run() -> dict[str, dict]:
    """Synthetic reports of every bench the headline reads (the shapes the benches write)."""
    def edf(point: dict, *policies: str) -> dict:
        return {"policies": {p: {"2.0": point, "3.0": point} for p in policies}}

    good = _point(1.0, 0.97, 0.0, RT_APPLIED)
    return {
        "overload": edf(good, "edf_admission", "edf_adaptive", "expire_only", "queue_timeout"),
        "overload-noise": edf(good, "edf_admission", "edf_adaptive"),
        "overload-rt-1hog": edf(good, *perfdoc.EDF_POLICIES),
        "overload-normal-1hog": edf(_point(0.97, 0.9, 0.02), *perfdoc.EDF_POLICIES),
        "overload-rt-2hogs": edf(good, *perfdoc.EDF_POLICIES),
        "overload-normal-2hogs": edf(_point(0.95, 0.8, 0.03), *perfdoc.EDF_POLICIES),
        "intake": _intake({m: 12_000.0 for m in perfdoc.INTAKE_MIXES},
                          {m: 15_000.0 for m in perfdoc.INTAKE_MIXES}),
        "batching": {"results": [
            {"model": "policy_small.onnx", "batch_slots": b, "nfe_per_s": n, "speedup_vs_b1": s,
             "step_ns_p99": 100_000.0} for b, n, s in ((1, 100.0, 1.0), (8, 450.0, 4.5))]},
        "nfe-breakdown": {"loads": {"over": 2.0, "light": 0.3},
                          "variants": [{"variant": "baseline", "p99_over_vs_light": 0.9}]},
        "overhead": _overhead(2_800_000, 2_000_000, 0.99, "c"),
    }  # fmt: skip


def test_every_readme_row_is_a_headline_row_of_a_full_run():
    """README_ROWS names rows headline() writes (a run without one leaves it out of the README,
    so a misspelt name would go unnoticed there)."""
    rows = perfdoc.headline(_full_run())
    assert {m for m, _ in perfdoc.README_ROWS} <= {r["measure"] for r in rows}
    block = perfdoc.readme_block(perfdoc.shown(rows), ["test cpu, 2 cores"])
    assert len(perfdoc.readme_rows(perfdoc.shown(rows))) == len(perfdoc.README_ROWS)
    assert "| valid requests/s the intake answers exactly once, per mix" in block
    assert all(len(line) <= perfdoc.WIDTH for line in block.splitlines() if line[:1] != "|")
    assert len(block.splitlines()) <= 15


def test_realtime_rows_put_each_mode_point_next_to_the_same_point_without_it():
    """Per noise variant, policy and load: the mode's row, then normal scheduling's, both
    against the real-time targets, the mode's figures with what its threads held."""
    reports = _full_run()
    reports["overload-rt-2hogs"]["policies"]["edf_adaptive"]["3.0"] = _point(0.9998, 0.97, 0.0)
    rows = [r for r in perfdoc.headline(reports) if "hog" in r["measure"]]
    assert len(rows) == 2 * 2 * 2 * 2  # variants x policies x loads x modes
    assert rows[0]["measure"] == ("2x capacity, 1 continuous hog, edf_admission, real-time mode: "
                                  + perfdoc.OVERLOAD_FIGURES)  # fmt: skip
    assert rows[1]["measure"] == rows[0]["measure"].replace("real-time mode", "normal scheduling")
    assert {r["target"] for r in rows} == {">= 99.99% / - / >= 95% / <= 0.5%"}
    assert rows[0]["measured"] == "100.00% / 110.00% / 97.00% / 0.00% (worker0 F50@1 mlock)"
    met = {r["measure"].split(":")[0]: r["met"] for r in rows}
    assert met["2x capacity, 2 continuous hogs, edf_adaptive, real-time mode"] is True
    assert met["3x capacity, 2 continuous hogs, edf_adaptive, real-time mode"] is False  # 99.98%
    assert not any(v for k, v in met.items() if "normal scheduling" in k)  # 95%/90%, 2-3% waste
    # a run without the mode's reports has none of these rows
    assert not [r for r in perfdoc.headline({"overhead": reports["overhead"]}) if "hog" in
                r["measure"]]


def _rtc_point(in_time: float, spare_p50: int, expired: int) -> dict:
    return {"admitted": 200, "outcomes": {"INFERENCE": 200 - expired, "EXPIRED": expired},
            "rtc": {"in_time_ratio": in_time, "spare_rows_p50": float(spare_p50)}}


def test_rtc_rows_hold_both_targets_at_2x_on_each_host():
    """Real-time chunking per variant, policy and load: in time at the robot, d - k's median and
    what expired; met at 2x only when every answer was in time and the median is at most 1."""
    reports = {name: {"policies": {p: {"2.0": _rtc_point(1.0, 1, 2), "3.0": _rtc_point(1.0, 2, 0)}
                                   for p in perfdoc.EDF_POLICIES}}
               for name, _ in perfdoc.RTC_VARIANTS}  # fmt: skip
    reports["overload-rtc-rt-1hog"]["policies"]["edf_adaptive"]["2.0"] = _rtc_point(0.999, 0, 0)
    rows = [r for r in perfdoc.headline(reports) if "real-time chunking" in r["measure"]]
    assert len(rows) == 2 * 2 * 2  # variants x policies x loads
    assert rows[0]["measure"] == ("real-time chunking, 2x capacity, edf_admission: in time at the "
                                  "robot / d - k median / expired of admitted")
    assert rows[0]["measured"] == "100.00% / 1 / 1.00%" and rows[0]["target"] == "100% / <= 1 / -"
    met = {r["measure"].split(":")[0]: r["met"] for r in rows}
    assert met["real-time chunking, 2x capacity, edf_admission"] is True
    assert met["real-time chunking, 3x capacity, edf_admission"] is None  # no target at 3x
    assert met["real-time chunking, 2x capacity, real-time mode + 1 continuous hog, "
               "edf_adaptive"] is False  # one answer in a thousand late


def test_bench_all_runs_each_rtc_report_the_headline_reads():
    """Both RTC reports run `bench overload --rtc` over the EDF policies at 2x and 3x; the busy
    host's in the real-time mode with a hog from before the calibration, the quiet one without."""
    import shlex

    from flowedge_relay_tools.bench.__main__ import build_parser

    args, subcommand, order = bench_all_steps()
    for name, note in perfdoc.RTC_VARIANTS:
        assert name in order and subcommand[name] == "overload", name
        a = build_parser().parse_args(["overload", *shlex.split(args[name])])
        assert a.rtc and a.policies == list(perfdoc.EDF_POLICIES) and a.loads == [2.0, 3.0]
        busy = "hog" in note
        assert (a.realtime, a.rt_dds, a.noise, a.calibrate_under_noise) == (
            (True, True, "continuous", True) if busy else (False, False, None, False))


def test_intake_ceiling_row_reads_every_mix():
    (row,) = perfdoc.intake_rows(_intake(
        {"expired": 12_500.4, "rejected": 11_000.0, "admitted": 9_800.0, "mixed": 10_400.0},
        {"expired": None, "rejected": 40_000.0, "admitted": 15_000.0, "mixed": 20_000.0}))
    assert row["measure"] == perfdoc.INTAKE_CEILING and row["target"] == ">= 10,000/s each"
    assert row["measured"] == ("12500 / 11000 / 9800 / 10400 requests/s (first unanswered "
                               "request at - / 40000 / 15000 / 20000 offered/s)")
    assert row["met"] is False  # admitted: 9,800
    (row,) = perfdoc.intake_rows(_intake({m: 10_000.0 for m in perfdoc.INTAKE_MIXES},
                                          {m: None for m in perfdoc.INTAKE_MIXES}))
    assert row["met"] is True
    assert perfdoc.intake_rows({"rows": []}) == []  # per-message costs only (--no-dds)


def bench_all_steps() -> tuple[dict[str, str], dict[str, str], list[str]]:
    """scripts/bench_all.sh's ARGS (with $RT_TRACE expanded), SUBCOMMAND and ORDER."""
    import re

    script = (perfdoc.ROOT / "scripts" / "bench_all.sh").read_text()
    trace = re.search(r'^RT_TRACE="([^"]*)"', script, re.M).group(1)

    def table(name: str) -> dict[str, str]:
        body = script.split(f"declare -A {name}=(", 1)[1].split("\n)", 1)[0]
        return {k: v.strip('"').replace("$RT_TRACE", trace)
                for k, v in re.findall(r"^\s*\[([\w-]+)\]=(\S.*)$", body, re.M)}  # fmt: skip

    order = script.split("\nORDER=(", 1)[1].split(")", 1)[0].split()
    return table("ARGS"), table("SUBCOMMAND"), order


def test_bench_all_runs_each_realtime_report_the_headline_reads():
    """Every report of RT_VARIANTS is in bench_all.sh's ORDER, runs `bench overload` with
    arguments its parser takes, the EDF policies at 2x and 3x: the mode's with --realtime, the
    other the same without it, two hogs where the variant says so."""
    import shlex

    from flowedge_relay_tools.bench.__main__ import build_parser

    args, subcommand, order = bench_all_steps()
    parser = build_parser()
    for variant, by_mode in perfdoc.RT_VARIANTS:
        parsed = {}
        for mode, name in by_mode.items():
            assert name in order and subcommand[name] == "overload", name
            parsed[mode] = vars(parser.parse_args(["overload", *shlex.split(args[name])]))
            assert parsed[mode]["policies"] == list(perfdoc.EDF_POLICIES)
            assert parsed[mode]["loads"] == [2.0, 3.0] and parsed[mode]["model"] == "bench"
            assert parsed[mode]["noise"] == "continuous"
            assert parsed[mode]["noise_hogs"] == int(variant[0])
        on, off = parsed["real-time mode"], parsed["normal scheduling"]
        assert on["realtime"] and on["rt_dds"] and not off["realtime"]
        assert {k: v for k, v in on.items() if not k.startswith(("realtime", "rt_"))} == {
            k: v for k, v in off.items() if not k.startswith(("realtime", "rt_"))}
