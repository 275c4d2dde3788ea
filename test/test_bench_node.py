# SPDX-License-Identifier: Apache-2.0
"""`bench calibrate`, `overload` and `overhead` at a tiny size: documented keys, JSON, plots.

Each runs the real relay node and a client over real DDS in this process. Only shapes and
sanity are checked, never a timing target: on a shared machine the bench is a measurement.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from rt_helpers import CPUS, fifo_refused

from flowedge_relay.core import Code
from flowedge_relay_tools.bench import calibrate, overhead, overload, realtime
from flowedge_relay_tools.bench.client import Answer
from flowedge_relay_tools.bench.progress import Progress
from flowedge_relay_tools.bench.trace import Trace, TraceSpec, capacity_rps

# The bench picks a private DDS domain of its own; in tests, use the run's domain (conftest).
os.environ.setdefault("FLOWEDGE_BENCH_DOMAIN_ID", os.environ["ROS_DOMAIN_ID"])

ROOT = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


def _args(module, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    return parser.parse_args(argv)


def _is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG and path.stat().st_size > 5000


def _roundtrip(report: dict) -> dict:
    return json.loads(json.dumps(report, allow_nan=False))  # strict JSON: no NaN / Infinity


def test_trace_is_seeded_and_scales_with_load():
    spec = TraceSpec(seed=3)
    a, b = Trace(spec).at_load(100.0, 2.0), Trace(spec).at_load(100.0, 2.0)
    assert a == b and 150 < len(a) < 250  # Poisson, about rate x duration
    double = Trace(spec).at_load(200.0, 2.0)
    assert [x.nfe for x in double[: len(a)]] == [x.nfe for x in a]  # same sequence, compressed
    assert all(spec.nfe_min <= x.nfe <= spec.nfe_max for x in double)
    assert all(40e6 <= x.slack_ns <= 160e6 for x in double)
    assert capacity_rps(2, 10, 1_000_000) == pytest.approx(200.0)


def test_progress_bar_writes_to_its_stream(tmp_path):
    log = tmp_path / "progress.txt"
    with log.open("w") as stream, Progress("t", 4, stream=stream, log_every_s=0) as bar:
        for _ in range(4):
            bar.advance(label="step")
    text = log.read_text()
    assert "[t]" in text and "100%" in text


@pytest.mark.ros
def test_calibrate_tiny(tmp_path):
    report = _roundtrip(calibrate.run(_args(calibrate, ["--quick", "--model", "bench",
                                                        "--requests", "8"])))  # fmt: skip
    for key in ("e2e_ns_per_nfe", "raw_ns_per_nfe", "relay_compute_ns_per_nfe"):
        p50, p99, p999, top = (report[f"{key}_{q}"] for q in ("p50", "p99", "p99_9", "max"))
        assert 0 < p50 <= p99 <= p999 <= top
    assert report["requests"] == 8
    assert report["recommended_nfe_ns"] >= report["e2e_ns_per_nfe_p99"] > 0
    assert report["recommended_nfe_ns"] % 1000 == 0
    assert report["recommended_admission_reserve_ns"] > 0
    # real-time chunking's reserve: the answer's way out alone, never the stall (§5.4)
    assert report["loaded_delivery_ns_max"] > 0
    way_out = max(report["fixed_overhead_ns_p99"], report["loaded_delivery_ns_max"])
    assert report["recommended_rtc_reserve_ns"] == math.ceil(way_out / 1000) * 1000
    # and its nfe_ns bounds whole requests per NFE, idle, saturated and at 3x: never a step
    per_request = max(report[f"{phase}compute_ns_per_nfe_p99"]
                      for phase in ("relay_", "loaded_", "overloaded_"))  # fmt: skip
    assert report["recommended_rtc_nfe_ns"] == math.ceil(per_request / 1000) * 1000 > 0
    assert "representative traces" in report["caveat"]
    assert "recommended nfe_ns" in calibrate.table(report)
    assert _is_png(Path(calibrate.plot(report, tmp_path / "calibrate.png")))
    assert report["two_phase"] is False and report["recommended_prefix_ns"] == 0
    assert "prefix_ns" not in calibrate.table(report)


@pytest.mark.ros
def test_calibrate_with_batch_slots_recommends_a_full_step():
    """`calibrate --batch-slots 2`: the relay runs with two slots, the saturated phase fills
    them, nfe_ns covers that phase's per-NFE cost, and the printed command sets batch_slots."""
    report = _roundtrip(calibrate.run(_args(calibrate, ["--quick", "--model", "bench",
                                                        "--requests", "8", "--batch-slots", "2"])))
    assert report["batch_slots"] == 2
    assert report["recommended_nfe_ns"] >= report["loaded_compute_ns_per_nfe_p99"] > 0
    # the overload phase ran (open loop, every request answered) and bounds nfe_ns too: the
    # step p99 saturated and at 3x, at the rounds' upper quartile
    assert report["overloaded_requests"] > 0 and report["overloaded_rate_rps"] > 0
    assert report["overloaded_step_ns_p99"] > 0 and report["loaded_step_ns_p99"] > 0
    assert report["step_ns"] == pytest.approx(calibrate.step_bound(report["rounds"]))
    assert report["recommended_nfe_ns"] >= report["step_ns"] >= min(
        max(r["step_saturated_ns_p99"], r["step_3x_ns_p99"]) for r in report["rounds"]) > 0
    # long enough to fill the relay's step ring, within its cap (quick: 0.3 s saturated)
    assert 0.3 <= report["overloaded_s"] <= calibrate.RING_FILL_CAP * 0.3
    assert "-p batch_slots:=2" in calibrate.table(report)


def test_rtc_nfe_ns_leaves_out_requests_cut_short_after_a_few_steps():
    """In the 3x phase most requests expire part way; one cut after a step carries the
    dispatch and expiry over that one step (20x an NFE per NFE). Real-time chunking's nfe_ns
    counts only the requests that ran half their NFE or more; every answer's way out still
    counts toward its reserve (arithmetic only)."""
    nfe, step = 80, 60_000

    def answer(code: int, done: int, compute: int, trip: int) -> Answer:
        return Answer(code, 1_000_000_000 + trip, 1_000_000_000, done, nfe - done, 0, compute)

    over = ([answer(Code.INFERENCE, nfe, nfe * step, 300_000)] * 3
            + [answer(Code.EXPIRED, 41, 41 * 70_000, 400_000),
               answer(Code.EXPIRED, 1, 1_200_000, 9_000_000)])  # fmt: skip
    got = calibrate.answer_samples("overloaded", over, min_nfe=math.ceil(nfe / 2))
    assert got["overloaded_nfe_done"].tolist() == [nfe] * 3 + [41]
    assert got["overloaded_delivery_ns"].max() == 9_000_000  # the cut one's trip counts
    idle = {"raw_nfe_ns": np.full(40, step), "compute_ns": np.full(8, nfe * step),
            "nfe_done": np.full(8, nfe), "e2e_ns": np.full(8, nfe * step + 1_000_000)}
    report = calibrate.summarize({**idle, **got}, nfe)
    assert report["recommended_rtc_nfe_ns"] == 70_000  # the 41-step request's, not 1.2 ms
    assert report["recommended_rtc_reserve_ns"] == 9_000_000
    # recorded apart: the answers that carried actions, and every answer
    assert report["way_out_3x_actions_ns_max"] == 300_000
    assert report["way_out_3x_every_answer_ns_max"] == 9_000_000


def test_history_frozen_hides_what_the_client_kept_from_the_collector():
    """A calibration's client keeps every answer; inside a phase the collector walks only what
    the phase made (gc.freeze), and the block's longest collection is reported."""
    kept = [[i] for i in range(50_000)]  # tracked containers, like the answers kept so far
    with calibrate.history_frozen() as seen:
        assert gc.get_freeze_count() >= len(kept)
        made = [[i] for i in range(1_000)]
        gc.collect()
    assert gc.get_freeze_count() == 0 and gc.isenabled()
    assert seen["longest_ns"] > 0 and len(made) == 1_000


def test_overload_phase_lasts_long_enough_to_fill_the_step_ring():
    """The overload phase's step p99 comes from the relay's ring of its last NFE_HISTORY steps:
    the phase lasts RING_FILL rings of steps at the saturated cost, never less than the
    saturated phase, never more than RING_FILL_CAP times it (arithmetic only)."""
    ring_s = calibrate.RING_FILL * calibrate.NFE_HISTORY * 1e-9
    assert calibrate.overload_seconds(3.0, 100_000) == 3.0  # fast steps: the ring fills anyway
    assert calibrate.overload_seconds(3.0, 1_300_000) == pytest.approx(ring_s * 1_300_000)
    assert calibrate.overload_seconds(3.0, 50_000_000) == calibrate.RING_FILL_CAP * 3.0


@pytest.mark.ros
def test_calibrate_two_phase_package_recommends_prefix_ns(tmp_path):
    """`calibrate --model vision`: the relay (its own process) times every prefix pass; the
    report recommends prefix_ns from their tail, next to nfe_ns, with the raw prefix cost."""
    requests = 6
    report = _roundtrip(calibrate.run(_args(calibrate, ["--quick", "--model", "vision",
                                                        "--requests", str(requests)])))  # fmt: skip
    assert report["two_phase"] is True and report["model"] == "policy_vision"
    for key in ("e2e_ns_per_nfe", "raw_ns_per_nfe", "raw_ns_per_prefix"):
        p50, p99, p999, top = (report[f"{key}_{q}"] for q in ("p50", "p99", "p99_9", "max"))
        assert 0 < p50 <= p99 <= p999 <= top
    # every relay request ran its prefix pass before its answer: all in the relay's figures
    assert report["relay_prefix_samples"] >= requests
    assert 0 < report["relay_prefix_ns_p50"] <= report["relay_prefix_ns_p99"]
    assert report["loaded_prefix_samples"] >= report["relay_prefix_samples"]
    bound = max(report["relay_prefix_ns_p99"], report["loaded_prefix_ns_p99"])
    assert report["recommended_prefix_ns"] >= bound > 0
    assert report["recommended_prefix_ns"] % 1000 == 0
    assert report["recommended_nfe_ns"] >= report["e2e_ns_per_nfe_p99"] > 0
    table = calibrate.table(report)
    assert "recommended prefix_ns" in table
    assert f"prefix_ns:={report['recommended_prefix_ns']}" in table
    assert _is_png(Path(calibrate.plot(report, tmp_path / "calibrate.png")))


@pytest.mark.ros
def test_overload_tiny(tmp_path):
    report = _roundtrip(overload.run(_args(overload, ["--quick", "--duration", "0.3"])))
    assert set(report["policies"]) == {"edf_admission", "edf_adaptive", "expire_only",
                                       "queue_timeout"}  # fmt: skip
    assert report["relay"] == "flowedge-relayd process" and report["noise"] is None
    assert report["capacity_rps"] > 0 and report["nfe_ns"] > 0 and report["queue_timeout_ms"] > 0
    for policy, by_load in report["policies"].items():
        assert set(by_load) == {"0.5", "1.0", "1.5", "2.0", "3.0"}, policy
        for load, m in by_load.items():
            assert set(overload.METRICS) <= set(m), (policy, load)
            assert sum(m["outcomes"][c] for c in overload.REPORT_CODES) + m["outcomes"][
                "lost"] == m["offered"]  # fmt: skip
            assert m["outcomes"]["lost"] == 0 and m["extra_answers"] == 0  # exactly one answer
            assert 0 <= m["on_time_goodput"] <= 1 and 0 <= m["wasted_nfe_ratio"] <= 1
            assert m["goodput_vs_capacity"] >= 0
            # NFE-weighted goodput: on-time work over what the lanes could compute
            assert m["on_time_nfe"] >= m["on_time"]  # every on-time answer did >= 1 NFE
            assert m["nfe_goodput_vs_capacity"] >= 0
            assert m["latency_p50_ns"] <= m["latency_p99_ns"]
            # capacity from the NFE cost under load where the relay's stats cover the point
            assert m["capacity_basis"] in ("NFE cost under load (this point)",
                                           "inline calibration")  # fmt: skip
            if m["capacity_basis"].startswith("NFE cost"):
                assert m["nfe_goodput_vs_capacity"] == pytest.approx(
                    m["on_time_nfe"] / 0.3 / m["capacity_nfe_per_s_under_load"])
            assert m["capacity_rps_calibrated"] == report["capacity_rps"]
    # The same trace for every policy at a load.
    offered = {p: report["policies"][p]["2.0"]["offered"] for p in report["policies"]}
    assert len(set(offered.values())) == 1
    assert set(report["targets"]) == {f"{p}.{m}" for p in overload.ADMISSION_POLICIES
                                      for m in overload.TARGETS}  # fmt: skip
    # what adaptive admission assumed per NFE while its points ran, from flowedge/stats
    for m in report["policies"]["edf_adaptive"].values():
        assert m["cost_model"]["nfe_ns_in_use_max"] >= report["nfe_ns"]
    assert "edf_admission" in overload.table(report)
    assert _is_png(Path(overload.plot(report, tmp_path / "overload.png")))


def test_goodput_is_counted_against_the_capacity_under_load():
    """Capacity from the relay's own stats: NFEs done over busy lane time (each message's
    utilisation covers the interval since the one before); goodput against it, and against the
    calibrated capacity next to it; the calibrated one alone when the stats do not cover it."""
    from flowedge_relay_tools.bench.client import RemoteRelay

    s = 1_000_000_000
    # (stamp, in_use, tail, nfe_total, p50, p99, utilisation): 200 NFE over 2 s, half busy
    rows = [(0, 0, 0, 100, 0, 0, 0.9), (s, 0, 0, 200, 0, 0, 0.5), (2 * s, 0, 0, 300, 0, 0, 0.5)]
    view = object.__new__(RemoteRelay)  # its stats history only, no ROS node behind it
    view.history, view._cv = rows, threading.Condition()
    assert RemoteRelay.capacity_between(view, 0, 2 * s) == pytest.approx(200.0)  # NFE per s
    assert RemoteRelay.capacity_between(view, s, s) is None  # one message: no interval
    m = {"on_time": 10, "on_time_nfe": 100}
    g = overload.goodput(m, 1.0, 40.0, 10.0, 200.0)
    assert g["nfe_goodput_vs_capacity"] == pytest.approx(0.5)  # 100 of 200 NFE/s
    assert g["goodput_vs_capacity"] == pytest.approx(0.5)  # 10 of 20 requests/s
    assert g["goodput_vs_calibrated_capacity"] == pytest.approx(0.25)  # 10 of 40
    assert g["nfe_goodput_vs_calibrated_capacity"] == pytest.approx(0.25)
    g = overload.goodput(m, 1.0, 40.0, 10.0, None)
    assert g["capacity_basis"] == "inline calibration"
    assert g["goodput_vs_capacity"] == g["goodput_vs_calibrated_capacity"]


@pytest.mark.ros
def test_overload_on_the_two_phase_package():
    """`overload --model vision`: requests carry image + state tensors, the admission policies
    run with the inline prefix_ns, the baselines with none; every request is answered.

    The relay runs as its own process, as deployed: calibration offers this cheap model ~20,000
    requests/s, and on Kilted (Fast DDS 3.2) a reader in the publisher's own process whose
    KEEP_ALL history fills stops receiving for good (README, Troubleshooting)."""
    argv = ["--quick", "--model", "vision", "--duration", "0.2", "--loads", "1",
            "--policies", "edf_admission", "expire_only"]
    report = _roundtrip(overload.run(_args(overload, argv)))
    assert report["two_phase"] is True and report["model"] == "policy_vision"
    assert report["prefix_ns"] == report["calibration"]["recommended_prefix_ns"] > 0
    assert "median prefix pass" in report["capacity_definition"]
    for policy in ("edf_admission", "expire_only"):
        m = report["policies"][policy]["1.0"]
        answered = sum(m["outcomes"][c] for c in overload.REPORT_CODES)
        assert answered == m["offered"] > 0 and m["outcomes"]["lost"] == 0, (policy, m)
        assert m["extra_answers"] == 0  # exactly one answer each
    assert f"prefix_ns={report['prefix_ns']}" in overload.table(report)
    params = overload.policy_params("expire_only", 1, 2, 3, prefix_ns=5)
    assert params["prefix_ns"] == 0 and params["nfe_ns"] == 0
    assert "prefix_ns" not in overload.policy_params("edf_admission", 1, 2, 3)


@pytest.mark.ros
def test_overload_noise_and_in_process(tmp_path):
    """--noise runs the CPU hog during the trace and records it; --in-process still works."""
    argv = ["--quick", "--duration", "0.3", "--loads", "2", "--policies", "edf_adaptive",
            "--noise", "20/20", "--in-process"]
    report = _roundtrip(overload.run(_args(overload, argv)))
    noise = report["noise"]
    assert noise["busy_ms"] == 20 and noise["sleep_ms"] == 20 and noise["duty_cycle"] == 0.5
    assert noise["cpu_seconds"] > 0 and "busy 20 ms / sleep 20 ms" in noise["description"]
    assert report["relay"] == "in-process"
    assert set(report["policies"]) == {"edf_adaptive"}
    assert "noise: one process" in overload.table(report)


@pytest.mark.ros
def test_overload_realtime_mode_with_two_hogs():
    """--realtime starts the relay process with the mode's settings (intake, publisher and
    workers at SCHED_FIFO on their CPUs, memory locked, with --rt-dds Fast DDS's threads too);
    what its threads got, read back from its workers status, is in the report and the table
    beside each point, with the mode and the two hogs of --noise-hogs 2 in the header."""
    intake, worker = CPUS[0], CPUS[-1]
    argv = ["--quick", "--duration", "0.2", "--loads", "1", "--policies", "edf_admission",
            "--noise", "10/90", "--noise-hogs", "2", "--calibrate-under-noise", "--realtime",
            "--rt-dds", "--rt-intake-cpus", str(intake), "--rt-worker-cpus", str(worker),
            "--latency-probe-s", "0.5"]
    report = _roundtrip(overload.run(_args(overload, argv)))
    assert report["noise"]["processes"] == 2 and report["noise"]["cpu_seconds"] > 0
    assert report["calibrated_under_noise"]
    # the client runs as a robot's controller would, the probe measured the workers' CPU and
    # the reserve covers the longest late wake-up it saw
    latency = report["host_latency"]
    assert latency["cpu"] == worker and latency["samples"] > 100
    assert report["admission_reserve_ns"] >= latency["late_ns_max"]
    if fifo_refused() is None:
        assert report["client_mode"].startswith(f"SCHED_FIFO 45 on CPUs [{intake}]")
        assert latency["priority"] == 51
    else:
        assert report["client_mode"].startswith("normal scheduling") and latency["refused"]
    assert report["mode"].startswith("real-time") and "Fast DDS threads 58" in report["mode"]
    asked = report["realtime"]["asked"]
    assert (asked["executor_rt_priority"], asked["publisher_rt_priority"],
            asked["worker_rt_priority"], asked["lock_memory"]) == (60, 55, 50, True)
    assert asked["worker_cpu_affinity"] == [worker] and report["realtime"]["env"]
    point = report["policies"]["edf_admission"]["1.0"]
    assert point["offered"] > 0 and point["outcomes"]["lost"] == 0
    for applied in (report["realtime_applied"], point["realtime_applied"]):
        if fifo_refused() is None:  # granted here: what the relay read back is what was asked
            assert applied["rt.worker0"].startswith(f"SCHED_FIFO 50, CPUs {worker} (asked")
            assert applied["rt.request"].startswith(f"SCHED_FIFO 60, CPUs {intake} (asked")
            assert applied["rt.publisher"].startswith(f"SCHED_FIFO 55, CPUs {intake} (asked")
            assert "SCHED_FIFO 58 x" in applied["rt.threads"]  # Fast DDS's, from the profile
            assert applied["rt.refused"] == "none" and int(applied["memory_locked_kb"]) > 0
            cell = f"publisher F55@{intake} request F60@{intake} worker0 F50@{worker} mlock"
        else:  # refused: degraded, and said so
            cell = "REFUSED"
        assert cell in realtime.applied_short(applied)
    (row,) = report["rows"]
    assert row["applied"] == realtime.applied_short(point["realtime_applied"])
    table = overload.table(report)
    assert "mode: real-time" in table and "(2 hogs)" in table and row["applied"] in table
    assert f"host latency on CPU {worker}" in table and "since before the calibration" in table
    with pytest.raises(ValueError, match="in-process"):
        realtime.realtime_params(_args(overload, ["--realtime", "--in-process"]))


@pytest.mark.ros
def test_nfe_breakdown_tiny():
    from flowedge_relay_tools.bench import nfe_breakdown

    argv = ["--quick", "--variants", "baseline", "switch_200us"]
    report = _roundtrip(nfe_breakdown.run(_args(nfe_breakdown, argv)))
    assert [v["variant"] for v in report["variants"]] == ["baseline", "switch_200us"]
    for v in report["variants"]:
        for label in ("light", "over"):
            pt = v["points"][label]
            # a swamped host may calibrate so high that a tiny trace runs no NFE: shapes only
            assert pt["offered"] >= 0 and pt["nfes"] >= 0 and pt["load"] > 0
            if pt["nfes"]:
                for part in nfe_breakdown.PARTS:
                    assert 0 <= pt[part]["p50"] <= pt[part]["p99"], (part, label)
    text = nfe_breakdown.table(report)
    assert "baseline" in text and "switch_200us" in text
    if any(v["points"][label]["nfes"] for v in report["variants"] for label in ("light", "over")):
        assert "gil_wait_p99" in text  # the breakdown columns, once any NFE was measured


def test_noise_spec_parsing():
    from flowedge_relay_tools.bench import noise

    assert noise.parse("50/50") == (50.0, 50.0)
    assert noise.parse("continuous") == (1000.0, 0.0)
    for bad in ("50", "x/y", "0/10", "10/-1"):
        with pytest.raises(ValueError):
            noise.parse(bad)


def test_a_hog_that_died_is_reported():
    """cpu_hog says whether every neighbour ran until the block ended: a bench or test that
    claims two busy cores can check it had them."""
    from flowedge_relay_tools.bench import noise

    with noise.cpu_hog("5/5", processes=2) as alive:
        time.sleep(0.2)
    assert alive["ran_throughout"] and len(alive["pids"]) == 2
    with noise.cpu_hog("5/5", processes=2) as one_died:
        os.kill(one_died["pids"][1], signal.SIGKILL)
        time.sleep(0.2)
    assert not one_died["ran_throughout"]


@pytest.mark.ros
def test_overhead_tiny(tmp_path):
    report = _roundtrip(overhead.run(_args(overhead, ["--quick", "--requests", "12",
                                                      "--seconds", "0.3"])))  # fmt: skip
    assert report["light_requests"] == 12
    assert 0 < report["overhead_p50_ns"] <= report["overhead_p99_ns"]
    assert report["relay_throughput_ratio"] > 0 and math.isfinite(report["relay_throughput_ratio"])
    assert report["bare_nfe_per_s"] > 0 and report["relay_nfe_per_s"] > 0
    # the relay ran as its own process, next to the echo node that gives the transport floor
    assert report["relay"].startswith("own process")
    assert 0 < report["transport_floor_p50_ns"] <= report["transport_floor_p99_ns"]
    assert len(report["samples"]["floor_ns"]) == 12
    floor50 = report["transport_floor_p50_ns"]
    assert report["relay_added_p50_ns"] == report["overhead_p50_ns"] - floor50
    assert 0 < report["lane_compute_share"] <= 1.05 and report["worker_speed_vs_bare"] > 0
    worst = report["worst_1pct"]  # the slowest request (1% of 12), split into its parts
    assert worst["requests"] == 1 and worst["overhead_median_ns"] == max(
        report["samples"]["overhead_ns"])
    parts = ("queue", "delivery", "ingress_and_publish")
    assert sum(worst[f"{p}_median_ns"] for p in parts) == pytest.approx(
        worst["overhead_median_ns"])
    assert "relay_throughput_ratio" in overhead.table(report) and "slowest 1%" in overhead.table(
        report)
    assert _is_png(Path(overhead.plot(report, tmp_path / "overhead.png")))
    assert report["publisher_loop_comparison"] == {}  # only with --compare-loops


@pytest.mark.ros
def test_overhead_compare_loops_puts_both_publisher_loops_side_by_side():
    report = _roundtrip(overhead.run(_args(overhead, ["--quick", "--requests", "6", "--seconds",
                                                      "0.2", "--trials", "1",
                                                      "--compare-loops"])))  # fmt: skip
    assert set(report["nfe_loop_comparison"]) == {"auto", "python"}
    pubs = report["publisher_loop_comparison"]
    assert set(pubs) == {"auto", "python"}
    for c in pubs.values():
        assert 0 < c["overhead_p50_ns"] <= c["overhead_p99_ns"]
        assert c["overhead_p99_vs_floor"] == c["overhead_p99_ns"] / c["transport_floor_p99_ns"]
    # the main light load is the configured relay's (publisher_loop auto)
    assert pubs["auto"]["overhead_p99_ns"] == report["overhead_p99_ns"]
    assert "publisher_loop python" in overhead.table(report)


def test_registered_with_json_and_plot_options():
    from flowedge_relay_tools.bench.__main__ import build_parser

    parser = build_parser()
    for name in ("calibrate", "overload", "overhead"):
        args = parser.parse_args([name, "--quick", "--json", "x.json", "--plot", "x.png"])
        assert args.subcommand == name and args.json == "x.json" and args.plot == "x.png"


@pytest.mark.ros
def test_cli_writes_json_and_plot(tmp_path):
    out, png = tmp_path / "overhead.json", tmp_path / "overhead.png"
    proc = subprocess.run(
        [sys.executable, "-m", "flowedge_relay_tools.bench", "overhead", "--quick",
         "--requests", "6",
         "--seconds", "0.2", "--json", str(out), "--plot", str(png)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "relay_throughput_ratio" in proc.stdout  # the readable table
    assert "[overhead]" in proc.stderr  # the progress bar
    report = json.loads(out.read_text())
    for key in ("overhead_p50_ns", "overhead_p99_ns", "relay_throughput_ratio"):
        assert report[key] > 0
    assert _is_png(png)
