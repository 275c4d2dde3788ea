# SPDX-License-Identifier: Apache-2.0
"""`bench calibrate`'s reserve (the answer's way out plus the host's stalls, from rounds whose
spread it prints), `calibrate --realtime`, and `bench calibrate-check` (the user's flow: calibrate,
the relay with its values, a robot-like node at ~2x, with and without a hog) at a tiny size.

The arithmetic tests build samples by hand; the others run the real relay over real DDS and check
shapes and accounting, never a timing figure: on a shared machine a bench is a measurement.
"""

from __future__ import annotations

import argparse
import json
import math
import os

import numpy as np
import pytest
from rt_helpers import CPUS, fifo_refused

from flowedge_relay_tools.bench import calibrate, calibrate_check, perfdoc

# The bench picks a private DDS domain of its own; in tests, use the run's domain (conftest).
os.environ.setdefault("FLOWEDGE_BENCH_DOMAIN_ID", os.environ["ROS_DOMAIN_ID"])


def _args(module, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(argv)


def _roundtrip(report: dict) -> dict:
    return json.loads(json.dumps(report, allow_nan=False))  # strict JSON: no NaN / Infinity


def _us(ns: float) -> int:
    return math.ceil(ns / 1000) * 1000


def _round(delivery_ns: int, stalls: list[int], step: int = 1_000_000,
           seconds: float = 1.0, request_stall: int = 2_000_000) -> dict:  # fmt: skip
    """One round of the saturated and 3x phases: 100 requests of 10 NFE at 1 ms each, one of
    them `request_stall` late (a stall; its p99.9 over the 100 is 0.901 of it), every answer's
    way out `delivery_ns`, the relay's step p99 `step`, and a probe of `seconds` (1000 wake-ups
    a second) whose late wake-ups of 100 us or more are `stalls`."""
    compute = np.full(100, 10_000_000)
    compute[0] += request_stall
    out = np.full(100, delivery_ns)
    return {"loaded_step_ns_p99": step, "overloaded_step_ns_p99": step,
            "loaded_compute_ns": compute, "loaded_nfe_done": np.full(100, 10),
            "loaded_delivery_ns": out, "overloaded_delivery_ns": out,
            "probe": {"late_ns_p50": 50_000, "late_ns_p99": 200_000,
                      "late_ns_p99_9": max(stalls), "late_ns_max": max(stalls),
                      "samples": int(1000 * seconds), "over_1ms": 3, "steal_ms": 0.0,
                      "seconds": seconds, "cpu": "any", "priority": 0, "refused": "",
                      "stalls_ns": list(stalls)}}  # fmt: skip


def _samples(rounds: list[dict]) -> dict:
    idle = {"raw_nfe_ns": np.full(40, 1_000_000), "compute_ns": np.full(8, 10_000_000),
            "nfe_done": np.full(8, 10), "e2e_ns": np.full(8, 11_000_000)}  # fixed part: 1 ms
    pooled = {k: np.concatenate([r[k] for r in rounds]) for k in
              ("loaded_compute_ns", "loaded_nfe_done", "loaded_delivery_ns",
               "overloaded_delivery_ns")}  # fmt: skip
    worst = {k: max(r[k] for r in rounds)  # as measure() keeps them: the worst round's
             for k in ("loaded_step_ns_p99", "overloaded_step_ns_p99")}
    return {**idle, **pooled, **worst, "rounds": rounds}


def test_reserve_is_the_answers_way_out_plus_twice_the_rounds_median_stall():
    """The reserve's two parts: the way out at STATED_Q (never below the fixed part's p99), the
    rounds' median at normal scheduling and the worst round's in the real-time mode, and the stall
    (STALL_FACTOR x the rounds' median of each round's larger of a saturated request's and
    PROBE_WAKEUPS of the probe's at STATED_Q; every round pooled printed beside it); every
    round's own figures and their spread are reported, a value that hangs on which rounds ran
    is named, and what the values leave out is said (arithmetic only)."""
    rounds = [_round(3_000_000, [2_500_000, 9_000_000]), _round(3_000_000, [1_000_000, 4_000_000]),
              _round(7_000_000, [1_200_000, 5_000_000])]
    report = calibrate.summarize(_samples(rounds), 10)
    assert [r["way_out_ns"] for r in report["rounds"]] == [3_000_000, 3_000_000, 7_000_000]
    # normal scheduling: the round that met a stall on the way out is named, not recommended
    assert report["way_out_ns"] == 3_000_000 and report["way_out_ns_worst"] == 7_000_000
    assert report["loaded_stall_ns_max"] == pytest.approx(2_000_000)
    # each round (1 s, 1000 wake-ups): its probe's p99.9 is its longest (9, 4, 5 ms), twice
    # that above its requests' (1.8 ms: one of 100 ran 2 ms over); the stall is twice their
    # median, 20 ms (the rounds' time-share stalls, 8, 3 and 4 ms, are shorter at their median)
    assert [r["probe_p99_9_ns"] for r in report["rounds"]] == [9_000_000, 4_000_000, 5_000_000]
    assert [r["stall_ns"] for r in report["rounds"]] == [18_000_000, 8_000_000, 10_000_000]
    assert [r["probe_share_ns"] for r in report["rounds"]] == pytest.approx([8e6, 3e6, 4e6])
    assert report["stall_ns"] == pytest.approx(20_000_000) and report["stall_quantile"] == "p99.9"
    assert report["recommended_admission_reserve_ns"] == _us(3_000_000 + 20_000_000)
    # the probes pooled, printed (3 s, 3000 wake-ups): p99.9 is the 3rd longest (4 ms); 0.1% of
    # the time is 3 ms, and the host spent 3 ms past 6 ms (the 9 ms stall): 6 ms
    assert report["probe_stall_ns"] == pytest.approx(6_000_000)
    assert report["probe_stall_p99_9_ns"] == 4_000_000
    assert report["probe_stall_share_ns"] == pytest.approx(6_000_000)
    assert report["stall_ns_pooled"] == pytest.approx(6_000_000)
    # and the requests' (3 of 300 ran 2 ms over), each round's 1.8 ms (1 of 100) beside it
    assert report["loaded_stall_ns_pooled"] == pytest.approx(2_000_000)
    assert report["rounds"][0]["stall_saturated_ns"] == pytest.approx(1_802_000)
    assert report["host_latency"]["stalls_kept"] == 6 and "stalls_ns" not in report[
        "host_latency"]
    assert report["spread"]["way_out_ns"]["median"] == 3_000_000
    assert report["spread"]["way_out_ns"]["spread"] == pytest.approx(4 / 3)
    # of three rounds, the way out is 3 or 5 ms without one of them, the stall 20 or 28 ms
    assert report["not_reproduced"] == ["reserve_ns", "way_out_ns", "stall_ns"]
    # the probe's longest (9 ms) is within the stall the reserve holds, the worst round's way
    # out 4 ms past the median: said, with the slack it leaves unpromised
    text = calibrate.stall_text(report)
    assert "NOT PROMISED" in text and "4.0 ms longer" in text
    assert "2 x the rounds' median" in text
    assert "late wake-up (4000 us)" in text and "0.1% of the 3 s probed (6000 us)" in text
    assert "slack is under its NFE x nfe_ns + 27.0 ms" in text
    assert "2 x its probe's p99.9 late wake-up" in text
    assert "+-25%" in "\n".join(calibrate.spread_lines(report))
    assert "without 1 of its 3 rounds" in "\n".join(calibrate.spread_lines(report))
    # the real-time mode puts the probe's longest late wake-up in whole
    whole = calibrate.summarize(_samples(rounds), 10, whole_stall=True)
    assert whole["stall_ns"] == 9_000_000 and whole["stall_quantile"] == "max"
    assert whole["recommended_admission_reserve_ns"] == _us(7_000_000 + 9_000_000)
    assert "NOT PROMISED" not in calibrate.stall_text(whole)
    assert "its longest late wake-up" in calibrate.stall_text(whole)


def test_rounds_that_agree_reproduce():
    rounds = [_round(3_000_000, [1_000_000]) for _ in range(3)]
    report = calibrate.summarize(_samples(rounds), 10)
    assert report["not_reproduced"] == []
    assert all(s["spread"] == 0 and s["reproduced"] for s in report["spread"].values())
    assert not any("WARNING" in line for line in calibrate.spread_lines(report))


def test_stall_at_share_weighs_a_stall_by_its_length():
    """The stall past which the host spent at most a share of the probed time: one 40 ms stall
    in 35 s leaves 35 ms (0.1%) past 5 ms; 500 time slices of 4 ms in 35 s hold it near 4 ms;
    stalls that fit in the share leave nothing (arithmetic only)."""
    assert calibrate.stall_at_share([40_000_000, 200_000], 35.0, 0.001) == pytest.approx(5e6)
    many = calibrate.stall_at_share([4_000_000] * 500, 35.0, 0.001)
    assert many == pytest.approx(4e6 - 35e6 / 500)
    assert calibrate.stall_at_share([1_000_000] * 10, 35.0, 0.001) == 0.0
    assert calibrate.stall_at_share([], 35.0, 0.001) == 0.0
    # the answer is where the time past it equals the share: checked against its definition
    stalls = [9e6, 7e6, 6.5e6, 3e6, 1e6]
    x = calibrate.stall_at_share(stalls, 4.0, 0.001)
    assert sum(max(v - x, 0) for v in stalls) == pytest.approx(4e6)
    assert calibrate.pooled_tail([5, 9, 1, 7], 2000, 99.9) == 7  # 2 past p99.9: the 2nd longest
    assert calibrate.pooled_tail([5], 5000, 99.9) == 0.0  # the rest under what the probe kept


def test_nfe_ns_and_stall_reproduce_whichever_round_draws_the_outlier():
    """The step p99 comes one figure per round; nfe_ns takes the rounds' upper quartile, so a
    round that drew a neighbour's time slice in its steps (3 ms against 1 ms) shows in the
    rounds' spread, and the recommendation is the same whichever round drew it, or none did:
    it reproduced, and is not named as not reproducing; a 17.9 ms stall met in one round of a
    longer probe is named as not promised, not recommended (arithmetic only)."""
    def calibration(outlier: int | None) -> dict:
        rounds = [_round(3_000_000, [1_000_000] * 20 + ([17_900_000] if r == outlier else []),
                         step=3_000_000 if r == outlier else 1_000_000, seconds=6.0)
                  for r in range(8)]  # fmt: skip
        return calibrate.summarize(_samples(rounds), 10)

    first, last, none = calibration(0), calibration(7), calibration(None)
    assert first["loaded_step_ns_p99"] == 3_000_000  # the worst round's, printed
    assert first["step_ns"] == none["step_ns"] == 1_000_000
    for key in ("recommended_nfe_ns", "recommended_admission_reserve_ns"):
        assert first[key] == last[key] == none[key]
    # the round that drew them is off the rounds' median (its step 200%, its reserve from its
    # time-share stall), printed; the values do not hang on it
    assert not first["spread"]["nfe_ns"]["reproduced"] and none["spread"]["nfe_ns"]["reproduced"]
    assert not first["spread"]["reserve_ns"]["reproduced"]
    assert first["not_reproduced"] == none["not_reproduced"] == []
    assert first["stall_ns"] < 17_900_000 and "NOT PROMISED" in calibrate.stall_text(first)
    assert "p75" in "\n".join(calibrate.spread_lines(first))
    # the upper quartile: with every round's figure different, between the 6th and 7th of 8
    rounds = [{"step_saturated_ns_p99": v, "step_3x_ns_p99": 0.0} for v in range(1, 9)]
    assert calibrate.step_bound(rounds) == pytest.approx(6.25)
    # the stall: twice the median (between the 4th and 5th of 8), or the rounds' median
    # time-share stall where that is longer
    assert calibrate.stall_bound([{"stall_ns": v} for v in range(1, 9)]) == pytest.approx(9.0)
    assert calibrate.stall_bound([{"stall_ns": 1, "probe_share_ns": v}
                                  for v in range(1, 9)]) == pytest.approx(4.5)


def test_the_stall_does_not_follow_rounds_long_stalls_but_one_the_host_keeps_meeting():
    """The reserve's stall is twice the rounds' median of each round's count-based p99.9: a 100
    ms stall met in one round of eight (6 s each, the others' late wake-ups ten of 4 ms) moves
    every round pooled to 52 ms (the host spent 48 ms, 0.1% of 48 s, past it), and at the
    rounds' upper quartile three rounds of eight took it whole, so the stall a calibration
    recommended was whichever it drew; at the median it is 16 ms (each round's probe p99.9, 4
    ms, as two wake-ups) whichever rounds met it, in one or three of eight, or none, and the
    100 ms is named as not promised (met in three, said not to reproduce: without two calm
    rounds it would be in). Met in five rounds of eight it is the host's: the rounds' median
    time-share stall puts it in the reserve, and said not to reproduce, as two rounds fewer
    would leave it out (arithmetic only)."""
    def calibration(long_in: set[int]) -> dict:
        rounds = [_round(3_000_000, [4_000_000] * 10 + ([100_000_000] if r in long_in else []),
                         seconds=6.0) for r in range(8)]  # fmt: skip
        return calibrate.summarize(_samples(rounds), 10)

    none, first, last = calibration(set()), calibration({0}), calibration({7})
    three = calibration({1, 4, 6})
    assert (none["stall_ns"] == first["stall_ns"] == last["stall_ns"] == three["stall_ns"]
            == pytest.approx(2 * 2 * 4e6))
    for key in ("recommended_admission_reserve_ns", "recommended_nfe_ns"):
        assert none[key] == first[key] == last[key] == three[key]
    # pooled, the one long stall sets the time-share figure: the estimator the rounds replace
    assert none["stall_ns_pooled"] == pytest.approx(4e6)
    assert first["stall_ns_pooled"] == last["stall_ns_pooled"] == pytest.approx(52e6)
    assert first["rounds"][0]["probe_share_ns"] == pytest.approx(94e6)  # 6 ms of 6 s past it
    assert first["not_reproduced"] == last["not_reproduced"] == none["not_reproduced"] == []
    # met in three of eight, two calm rounds fewer would put it in: said not to reproduce
    assert three["not_reproduced"] == ["reserve_ns", "stall_ns"]
    text = calibrate.stall_text(first)
    assert "NOT PROMISED" in text and "84.0 ms longer" in text
    assert "NOT PROMISED" not in calibrate.stall_text(none)
    # met in five rounds of eight, it is the host's stall: the median time-share holds it
    often = calibration({0, 1, 4, 6, 7})
    assert often["stall_ns"] == pytest.approx(94e6)
    assert often["recommended_admission_reserve_ns"] == _us(3_000_000 + 94e6)
    assert often["not_reproduced"] == ["reserve_ns", "stall_ns"]


def test_a_rounds_stall_is_its_requests_or_two_of_its_probes_late_wake_ups():
    """A round's count-based stall is the larger of its saturated requests' p99.9 stall and
    PROBE_WAKEUPS of its probe's p99.9 late wake-up: the probe counts a thousand wake-ups a
    second, its p99.9 moves little, while the requests' p99.9 over a round is about its
    longest, a draw; a round whose requests met no long stall holds the reserve at two of the
    probe's, and one whose requests met a longer one than that sets it (arithmetic only)."""
    calm = _round(3_000_000, [4_000_000] * 10, seconds=6.0)  # requests 1.8 ms; probe 4 ms
    long = _round(3_000_000, [1_000_000] * 10, seconds=6.0, request_stall=12_000_000)
    report = calibrate.summarize(_samples([calm, long, calm]), 10)
    assert [r["stall_saturated_ns"] for r in report["rounds"]] == pytest.approx(
        [1_802_000, 10_812_000, 1_802_000])
    assert [r["stall_ns"] for r in report["rounds"]] == pytest.approx([8e6, 10_812_000, 8e6])
    assert report["stall_ns"] == pytest.approx(2 * 8e6)
    # without the probe the requests' alone count
    bare = [{k: v for k, v in r.items() if k != "probe"} for r in (calm, long, long)]
    assert calibrate.summarize(_samples(bare), 10)["stall_ns"] == pytest.approx(2 * 10_812_000)


def test_a_calibration_whose_values_hang_on_which_rounds_ran_says_so():
    """Not reproduced is what the recommendation would move more than REPRODUCE_TOL without a
    quarter of the rounds, whichever: four rounds of eight with a probe's p99.9 of 4 ms and four
    of 1 ms put the stall at twice the median, 10 ms, and 4 ms without two of the 4 ms rounds;
    seven of 4 ms and one of 1 ms spread as far (the rounds' figures 75% apart) yet the values
    stay 16 ms without any two: the first says so, the second does not (arithmetic only)."""
    def calibration(calm: int) -> dict:
        rounds = [_round(3_000_000, [1_000_000 if r < calm else 4_000_000] * 10, seconds=6.0)
                  for r in range(8)]  # fmt: skip
        return calibrate.summarize(_samples(rounds), 10)

    split, one = calibration(4), calibration(1)
    assert split["stall_ns"] == pytest.approx(2 * (2e6 + 8e6) / 2)
    assert split["not_reproduced"] == ["reserve_ns", "stall_ns"]
    assert "WARNING: reserve_ns, stall_ns did not reproduce" in "\n".join(
        calibrate.spread_lines(split))
    assert "without 2 of its 8 rounds" in "\n".join(calibrate.spread_lines(split))
    assert one["stall_ns"] == pytest.approx(16e6) and one["not_reproduced"] == []
    assert one["spread"]["stall_ns"]["spread"] == pytest.approx(0.75)
    assert not any("WARNING" in line for line in calibrate.spread_lines(one))
    # with one round there is nothing to leave out; with two, either one
    assert calibrate.unsteady([{"x": 1.0}], {"x": lambda rs: rs[0]["x"]}) == []
    two = [{"x": 1.0}, {"x": 2.0}]
    assert calibrate.unsteady(two, {"x": lambda rs: max(r["x"] for r in rs)}) == ["x"]


def test_calibrate_check_runs_calibrate_as_its_own_step_in_the_same_mode():
    plain = calibrate_check.calibrate_args(_args(calibrate_check, ["--quick"]), "c.json")
    assert plain[1:5] == ["-m", "flowedge_relay_tools.bench", "calibrate", "--model"]
    assert "--quick" in plain and "--realtime" not in plain
    rt = calibrate_check.calibrate_args(_args(calibrate_check, [
        "--realtime", "--rt-dds", "--rt-worker-cpus", "1"]), "c.json")  # fmt: skip
    assert "--realtime" in rt and "--rt-dds" in rt
    assert rt[rt.index("--rt-worker-cpus") + 1] == "1"
    # and the relay it checks runs in that mode too
    asked = calibrate_check.realtime.realtime_params(_args(calibrate_check, ["--realtime"]))
    assert asked["worker_rt_priority"] == 50 and asked["lock_memory"] is True


def _run(hogs: int, on_time: float, goodput: float, nfe_ns: int) -> dict:
    check = {"on_time_at_receipt": on_time, "on_time_as_published": 1.0,
             "expired_of_admitted": 0.0, "goodput": goodput}
    cal = {"recommended_nfe_ns": nfe_ns, "recommended_admission_reserve_ns": 10 * nfe_ns}
    return {"hogs": hogs, "check": check, "calibration": cal}


def test_calibrate_check_summary_judges_every_run_and_the_spread():
    """Every run must hold the target (the worst run counts); goodput has a target only on the
    host as it is, and next to the hogs the report says how far it fell; the calibrations'
    spread around their median is judged against +-25% (arithmetic only)."""
    runs = [_run(0, 1.0, 0.45, 1_000_000), _run(0, 0.9995, 0.40, 1_100_000),
            _run(1, 1.0, 0.30, 2_000_000), _run(1, 0.998, 0.20, 4_000_000)]
    s = calibrate_check.summarize(runs)
    quiet, busy = s["0"], s["1"]
    assert quiet["targets"]["on_time_at_receipt"]["met"] is True
    assert quiet["targets"]["goodput"]["met"] is True and quiet["goodput_min"] == 0.40
    assert busy["targets"]["on_time_at_receipt"]["met"] is False  # one run at 99.8%
    assert "goodput" not in busy["targets"]
    assert busy["goodput_fall_points"] == pytest.approx(0.425 - 0.25)
    assert quiet["nfe_ns"]["within_25pct"] and not busy["nfe_ns"]["within_25pct"]


def test_calibrate_check_is_in_make_bench_and_the_headline():
    """bench_all.sh runs calibrate-check with arguments its parser takes, both hog settings;
    perfdoc turns its report into headline rows, one per hog setting and the spread."""
    import shlex

    from test_perfdoc import bench_all_steps

    from flowedge_relay_tools.bench.__main__ import build_parser

    args, subcommand, order = bench_all_steps()
    assert "calibrate-check" in order and subcommand.get("calibrate-check") is None
    parsed = build_parser().parse_args(["calibrate-check", *shlex.split(args["calibrate-check"])])
    assert parsed.hogs == [0, 1] and parsed.model == "bench" and not parsed.realtime
    runs = [_run(0, 1.0, 0.45, 1_000_000), _run(1, 0.998, 0.20, 4_000_000)]
    rows = perfdoc.headline({"calibrate-check": {"summary": calibrate_check.summarize(runs)}})
    by = {r["measure"]: r for r in rows}
    quiet = by[perfdoc.CALIBRATE_CHECK_ROW.format(hogs="the host as it is")]
    assert quiet["target"] == ">= 99.9% / >= 35%" and quiet["met"] is True
    assert quiet["measured"] == "100.00% / 45.00%"
    busy = by[perfdoc.CALIBRATE_CHECK_ROW.format(hogs="next to 1 CPU hog")]
    assert busy["met"] is False and "25.0 points below" in busy["measured"]
    assert any(r["measure"].startswith("calibrate-check, next to 1 CPU hog: calibrated nfe_ns")
               for r in rows)


@pytest.mark.ros
def test_calibrate_reserve_parts_and_rounds_tiny():
    """`calibrate --quick`: two rounds, the probe at normal priority beside them, the reserve
    printed as its way-out and stall parts, the answers received by an ordinary subscriber."""
    report = _roundtrip(calibrate.run(_args(calibrate, ["--quick", "--model", "bench",
                                                        "--requests", "8"])))  # fmt: skip
    assert report["rounds_run"] == 2 and len(report["rounds"]) == 2
    assert report["host_latency"]["priority"] == 0 and report["host_latency"]["samples"] > 0
    assert report["way_out_ns"] >= report["fixed_overhead_ns_p99"] > 0
    # the stall part is the rounds' upper quartile; the probe's rounds pooled, at most its
    # longest, are printed beside it (a pooled figure may lie above or below the quartile)
    probe = report["host_latency"]
    assert report["stall_ns"] == calibrate.stall_bound(report["rounds"])
    assert report["stall_ns_pooled"] >= report["probe_stall_ns"]
    assert report["probe_stall_ns"] <= probe["late_ns_max"] and probe["stalls_kept"] >= 0
    assert report["recommended_admission_reserve_ns"] == _us(report["way_out_ns"]
                                                             + report["stall_ns"])
    assert report["mode"] == "normal scheduling" and report["realtime"] is None
    table = calibrate.table(report)
    assert "the answer's way out" in table and "per round (2)" in table
    slack = report["nfe_per_request"] * report["recommended_nfe_ns"] + report[
        "recommended_admission_reserve_ns"]  # the least slack a lone request is admitted with
    assert calibrate.lone_slack_ns(report) == slack
    assert f"admitted with a slack of at least {slack / 1e6:.1f} ms" in table
    assert "ordinary rclpy subscriber" in report["method"]


@pytest.mark.ros
def test_calibrate_realtime_mode_tiny():
    """`calibrate --realtime --rt-dds` calibrates the relay in the mode it will run in: its
    threads' settings read back, the probe on the workers' CPU above them, its longest late
    wake-up in the reserve."""
    worker = CPUS[-1]
    report = _roundtrip(calibrate.run(_args(calibrate, [
        "--quick", "--model", "bench", "--requests", "8", "--rounds", "1", "--realtime",
        "--rt-dds", "--rt-intake-cpus", str(CPUS[0]), "--rt-worker-cpus", str(worker)])))
    assert report["mode"].startswith("real-time") and "Fast DDS threads 58" in report["mode"]
    assert report["realtime"]["asked"]["worker_cpu_affinity"] == [worker]
    assert "rt.worker0" in report["realtime_applied"]
    probe = report["host_latency"]
    assert probe["cpu"] == worker and report["stall_quantile"] == "max"
    assert report["stall_ns"] >= probe["late_ns_max"]
    if fifo_refused() is None:
        assert probe["priority"] == 51 and report["client_mode"].startswith("SCHED_FIFO 45")
        assert report["realtime_applied"]["rt.worker0"].startswith("SCHED_FIFO 50")
    else:
        assert probe["refused"] and "REFUSED" in calibrate_check.realtime.applied_short(
            report["realtime_applied"])


@pytest.mark.ros
def test_calibrate_check_tiny_next_to_a_hog():
    """One run of the flow next to a hog: calibrate in its own process, the relay with its
    values, the node's trace; every admitted request answered once, every offered one
    accounted for, and the report's figures, table and JSON."""
    report = _roundtrip(calibrate_check.run(_args(calibrate_check, [
        "--quick", "--hogs", "1", "--duration", "0.5"])))
    (run,) = report["runs"]
    assert run["hogs"] == 1 and run["noise"]["ran_throughout"] and run["noise"]["processes"] == 1
    cal, check = run["calibration"], run["check"]
    assert cal["recommended_nfe_ns"] > 0 and cal["recommended_admission_reserve_ns"] > 0
    assert check["offered"] > 0 and check["lost"] == 0
    # the relay's own count of what it admitted (its stats) against the node's answers: every
    # admitted request answered once, INFERENCE (on time or late) or EXPIRED
    assert check["on_time"] + check["late_at_receipt"] + check["expired"] == check["admitted"]
    assert check["expired_on_arrival"] >= 0 and check["rejected"] >= 0
    assert check["published_late"] <= check["late_at_receipt"]
    summary = report["summary"]["1"]
    assert summary["runs"] == 1 and set(summary["targets"]) == {"on_time_at_receipt"}
    table = calibrate_check.table(report)
    assert "1 hog(s), 1 run(s)" in table and "calibrated nfe_ns" in table
