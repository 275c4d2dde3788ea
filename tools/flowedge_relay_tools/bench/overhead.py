# SPDX-License-Identifier: Apache-2.0
"""`bench overhead`: what the relay adds on top of the model, at light load and at saturation.

The relay runs as deployed, as its own `flowedge-relayd` process (bench model, admission off);
a client node in the bench process talks to it over DDS. Next to it runs the transport floor,
`bench/echo.py`: an rclpy node in its own process that answers each request at once, with no
model work.

Light load: requests of `--nfe` NFE sent one at a time (the next one `--gap-ms` after the answer),
  each followed by one to the echo node, so both see the same moment of a noisy host.
  overhead = client end-to-end latency - the relay's compute_ns (dispatch -> finish), i.e.
  DDS in, validation, C admission, queueing and dispatch wake-up, outcome ring, publisher thread,
  DDS out and the client's executor. Broken down with the ActionMessage's queue_ns and
  header.stamp (publish time). The echo round trip is the part of that any rclpy node pays on
  this host; overhead - floor is what the relay itself adds.

Saturation: NFE per second delivered through the relay (answers received by the client, with
  2 x workers + 2 requests of `--sat-nfe` NFE always outstanding, no deadline) against a bare
  loop of `FlowSampler.nfe()` on the same number of threads, each with its own session.
  Trials alternate bare / relay in pairs; relay_throughput_ratio is the median of the pair
  ratios, so a noisy neighbour that slows one pair does not decide the result. The ratio is
  split into the worker's own NFE speed against bare (sum nfe_done / sum compute_ns) and the
  share of time the lanes compute, which says whether a loss is in the NFEs or between them.

`--compare-loops`: afterwards a second relay with `nfe_loop: python` (the worker's NFE loop in
  Python, as before the native loop) runs the same saturation trials against fresh bare trials, and
  `nfe_loop_comparison` in the JSON holds both loops' ratio, worker speed and lane share side by
  side (the main figures are the relay as configured: the native loop by default). Then a third
  relay with `publisher_loop: python` (answers built and published through rclpy, as before the
  C publisher loop) repeats the light load against its own echo floor:
  `publisher_loop_comparison` holds both loops' overhead p50 / p99, floor p99 and ratio.

Targets (printed, not asserted): overhead p99 <= 2 ms (the first target; the echo floor alone
misses it on this host), overhead p99 <= 1.5x the echo floor's p99 in the same run,
relay_throughput_ratio >= 0.95.
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np

from flowedge_relay.model import FlowSampler, make_session
from flowedge_relay_tools.bench import targets
from flowedge_relay_tools.bench.client import (
    echo_process,
    model_path,
    parse_relay_params,
    percentiles,
    relay_process,
    round_trip,
    saturate,
    warm_up,
)
from flowedge_relay_tools.bench.host import host_info
from flowedge_relay_tools.bench.progress import Progress

TARGET_OVERHEAD_P99_NS = targets.OVERHEAD_P99_NS
TARGET_OVERHEAD_VS_FLOOR = targets.OVERHEAD_VS_FLOOR  # overhead p99 / transport floor p99
TARGET_THROUGHPUT_RATIO = targets.THROUGHPUT_RATIO
SIZES = {"quick": (24, 0.4, 1), "full": (1000, 1.5, 10)}  # light requests, s per trial, pairs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="tiny size (CI)")
    parser.add_argument("--model", default="bench", help="small, bench or an ONNX path")
    parser.add_argument("--workers", type=int, default=1, help="relay workers = bare threads")
    parser.add_argument("--requests", type=int, help="light-load requests")
    parser.add_argument("--nfe", type=int, default=4, help="NFE per light-load request")
    parser.add_argument("--gap-ms", type=float, default=2.0, help="pause after each answer")
    parser.add_argument("--sat-nfe", type=int, default=16, help="NFE per saturation request")
    parser.add_argument("--seconds", type=float, help="seconds per throughput trial")
    parser.add_argument("--trials", type=int, help="throughput trials per side")
    parser.add_argument("--relay-param", action="append", default=[], metavar="NAME:=VALUE",
                        help="extra relay parameter (repeatable), e.g. worker_cpu_affinity:=[1]")
    parser.add_argument("--compare-loops", action="store_true",
                        help="also run the saturation trials on a relay with nfe_loop python")


def light_load(client, echo, n: int, nfe: int, gap_s: float, bar=None,
               timeout: float = 10.0) -> dict:
    """n requests to the relay, each followed by one to the echo node (the transport floor),
    one at a time with gap_s after each answer: both see the same moment of the host."""
    cols: dict[str, list[int]] = {k: [] for k in ("e2e", "compute", "queue", "delivery",
                                                  "floor", "floor_delivery")}  # fmt: skip
    for _ in range(n):
        e2e, ans = round_trip(client, "bench-overhead", nfe, timeout)
        cols["e2e"].append(e2e)
        cols["compute"].append(ans.compute_ns)
        cols["queue"].append(ans.queue_ns)
        cols["delivery"].append(ans.received_ns - ans.published_ns)
        time.sleep(gap_s)
        floor, ans = round_trip(echo, "bench-overhead", nfe, timeout)
        cols["floor"].append(floor)
        cols["floor_delivery"].append(ans.received_ns - ans.published_ns)
        time.sleep(gap_s)
        if bar is not None:
            bar.advance()
    return {k: np.asarray(v, np.int64) for k, v in cols.items()}


def bare_throughput(samplers, seconds: float) -> float:
    """NFE/s of len(samplers) threads each running FlowSampler.nfe() back to back."""
    counts = [0] * len(samplers)
    stop = threading.Event()
    obs = np.zeros(samplers[0].info.obs_dim, np.float32)

    def loop(i: int) -> None:
        s, n = samplers[i], 0
        while not stop.is_set():
            s.start(obs, n, 16)
            for _ in range(16):
                s.nfe()
            n += 16
        counts[i] = n

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(samplers))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def relay_throughput(client, workers: int, nfe: int, seconds: float) -> tuple[float, float]:
    """NFE/s answered to the client with 2W+2 requests always outstanding (no deadline), and
    W x the NFE/s of a lane while it computes (sum nfe_done / sum compute_ns): the workers' own
    speed, so the first over the second is the share of time the lanes spent computing."""
    answers = saturate(client, workers, nfe, seconds, "bench-throughput")
    if len(answers) < 2:
        return 0.0, 0.0
    # the window starts at the first answer (pipeline full) and ends at the last
    first, last = answers[0].received_ns, answers[-1].received_ns
    done_nfe = sum(a.nfe_done for a in answers[1:])
    compute_ns = sum(a.compute_ns for a in answers[1:])
    rate = done_nfe / ((last - first) * 1e-9) if last > first else 0.0
    compute_rate = workers * done_nfe / (compute_ns * 1e-9) if compute_ns else 0.0
    return rate, compute_rate


def throughput_trials(client, samplers, workers: int, sat_nfe: int, seconds: float,
                      trials: int, bar, label: str = "relay") -> dict:
    """Alternating bare / relay saturation trials; the pair ratios and their split."""
    bare, relay_rates, compute_rates = [], [], []
    for trial in range(trials):
        bar.update(label=f"throughput trial {trial + 1}/{trials}: bare onnxruntime")
        bare.append(bare_throughput(samplers, seconds))
        bar.advance(seconds, label=f"throughput trial {trial + 1}/{trials}: {label}")
        rate, compute_rate = relay_throughput(client, workers, sat_nfe, seconds)
        relay_rates.append(rate)
        compute_rates.append(compute_rate)
        bar.advance(seconds)
    pair_ratios = [r / b for r, b in zip(relay_rates, bare, strict=True) if b > 0]
    # ratio = (worker NFE speed vs bare) x (share of time the lanes compute): which one loses?
    speed = [c / b for c, b in zip(compute_rates, bare, strict=True) if b > 0]
    busy = [r / c for r, c in zip(relay_rates, compute_rates, strict=True) if c > 0]
    return {
        "bare_nfe_per_s": float(np.median(bare)),
        "relay_nfe_per_s": float(np.median(relay_rates)),
        "bare_nfe_per_s_trials": bare,
        "relay_nfe_per_s_trials": relay_rates,
        "relay_throughput_pair_ratios": [round(x, 4) for x in pair_ratios],
        "relay_throughput_ratio": float(np.median(pair_ratios)) if pair_ratios else 0.0,
        "relay_compute_nfe_per_s_trials": compute_rates,
        "worker_speed_vs_bare": float(np.median(speed)) if speed else 0.0,
        "lane_compute_share": float(np.median(busy)) if busy else 0.0,
    }


def run(args: argparse.Namespace) -> dict:
    host = host_info()  # load average before this run adds its own
    n_light, seconds, trials = SIZES["quick" if args.quick else "full"]
    n_light = args.requests or n_light
    seconds = args.seconds or seconds
    trials = args.trials or trials
    path = model_path(args.model)
    params = dict(model_path=path, workers=args.workers, max_nfe=max(64, args.nfe, args.sat_nfe))
    params.update(parse_relay_params(args.relay_param))
    total = (n_light + 2 * trials * seconds) * (2 if args.compare_loops else 1)
    comparison: dict[str, dict] = {}
    pub_comparison: dict[str, dict] = {}
    with Progress("overhead", total) as bar:
        bar.update(label="starting relay")
        with relay_process(**params) as (info, client), \
                echo_process(info) as echo:
            warm_up(client)
            warm_up(echo)
            bar.update(label=f"light load: {n_light} x {args.nfe} NFE, each + one echo")
            light = light_load(client, echo, n_light, args.nfe, args.gap_ms / 1e3, bar)
            main = light_figures(light)
            samplers = [FlowSampler(make_session(info, 1), info) for _ in range(args.workers)]
            bare_throughput(samplers, 0.1)  # warm-up
            tp = throughput_trials(client, samplers, args.workers, args.sat_nfe, seconds, trials,
                                   bar)  # fmt: skip
        loop = str(params.get("nfe_loop", "auto"))
        comparison[loop] = tp
        if args.compare_loops:
            other = "python" if loop != "python" else "auto"
            bar.update(label=f"starting relay with nfe_loop {other}")
            with relay_process(**{**params, "nfe_loop": other}) as (_, client2):
                warm_up(client2)
                comparison[other] = throughput_trials(
                    client2, samplers, args.workers, args.sat_nfe, seconds, trials, bar,
                    f"relay (nfe_loop {other})")
            # the publisher thread's loops side by side at light load: C (the relay above,
            # unless told otherwise) and rclpy's, each against the echo floor of its own moment
            pub = str(params.get("publisher_loop", "auto"))
            pub_other = "python" if pub != "python" else "auto"
            bar.update(label=f"starting relay with publisher_loop {pub_other}")
            with relay_process(**{**params, "publisher_loop": pub_other}) \
                    as (info3, client3), echo_process(info3) as echo3:  # fmt: skip
                warm_up(client3)
                warm_up(echo3)
                bar.update(label=f"light load, publisher_loop {pub_other}")
                light_other = light_load(client3, echo3, n_light, args.nfe, args.gap_ms / 1e3,
                                         bar)  # fmt: skip
            pub_comparison = {pub: main, pub_other: light_figures(light_other)}
    overhead = light["e2e"] - light["compute"]
    rest = overhead - light["queue"] - light["delivery"]
    o50, o99, o999 = main["overhead_p50_ns"], main["overhead_p99_ns"], percentiles(overhead,
                                                                                (99.9,))[0]
    f50, f99 = main["transport_floor_p50_ns"], main["transport_floor_p99_ns"]
    ratio = tp["relay_throughput_ratio"]
    parts = {}
    for name, values in (("e2e", light["e2e"]), ("compute", light["compute"]),
                         ("queue", light["queue"]), ("delivery", light["delivery"]),
                         ("ingress_and_publish", rest), ("transport_floor", light["floor"]),
                         ("floor_delivery", light["floor_delivery"])):  # fmt: skip
        p50, p99 = percentiles(values, (50, 99))
        parts[name] = {"p50_ns": p50, "p99_ns": p99, "max_ns": float(np.max(values))}
    where = "as its own flowedge-relayd process"
    vs_floor = main["overhead_p99_vs_floor"]  # overhead p99 vs the echo floor
    report = {
        "method": (
            f"relay {where}, {args.workers} worker(s), admission off; light load: "
            f"{len(overhead)} requests of {args.nfe} NFE one at a time, each followed by one to "
            f"an rclpy echo node in its own process (the transport floor); saturation: "
            f"{trials} alternating pairs of {seconds:g} s, bare onnxruntime loop vs 2W+2 "
            f"outstanding {args.sat_nfe}-NFE requests"
        ),
        "size": "quick" if args.quick else "full",
        "host": host,
        "model": path.rsplit("/", 1)[-1],
        "workers": args.workers,
        "relay": "own process (flowedge-relayd)",
        "relay_params": {k: v for k, v in params.items() if k != "model_path"},
        "light_requests": int(len(overhead)),
        "light_nfe": args.nfe,
        "overhead_p50_ns": o50,
        "overhead_p99_ns": o99,
        "overhead_p99_9_ns": o999,
        "overhead_max_ns": float(np.max(overhead)),
        "transport_floor_p50_ns": f50,
        "transport_floor_p99_ns": f99,
        "relay_added_p50_ns": o50 - f50,
        "relay_added_p99_ns": o99 - f99,
        "overhead_p99_vs_floor": vs_floor,
        "breakdown": parts,
        **tp,
        "nfe_loop": loop,
        "nfe_loop_comparison": {
            k: {key: v[key] for key in ("relay_throughput_ratio", "worker_speed_vs_bare",
                                        "lane_compute_share", "relay_nfe_per_s",
                                        "bare_nfe_per_s", "relay_throughput_pair_ratios")}
            for k, v in comparison.items()
        } if args.compare_loops else {},
        "publisher_loop_comparison": pub_comparison,
        "throughput_trials": trials,
        "seconds_per_trial": seconds,
        "sat_nfe": args.sat_nfe,
        "targets": {
            "overhead_p99_ns": {"target": f"<= {TARGET_OVERHEAD_P99_NS}", "value": o99,
                                "met": o99 <= TARGET_OVERHEAD_P99_NS},
            "overhead_p99_vs_floor": {
                "target": f"<= {TARGET_OVERHEAD_VS_FLOOR}",
                "value": vs_floor,
                "met": f99 > 0 and o99 <= TARGET_OVERHEAD_VS_FLOOR * f99,
            },
            "relay_throughput_ratio": {"target": f">= {TARGET_THROUGHPUT_RATIO}", "value": ratio,
                                       "met": ratio >= TARGET_THROUGHPUT_RATIO},
        },  # fmt: skip
        "samples": {"overhead_ns": overhead.tolist(), "floor_ns": light["floor"].tolist()},
        "worst_1pct": worst_share(overhead, {"queue": light["queue"],
                                             "delivery": light["delivery"],
                                             "ingress_and_publish": rest}),
    }
    report["rows"] = [
        {"measure": name.replace("_", " "), "p50_us": round(p["p50_ns"] / 1e3, 1),
         "p99_us": round(p["p99_ns"] / 1e3, 1), "max_us": round(p["max_ns"] / 1e3, 1)}
        for name, p in [("overhead (e2e - compute)", {"p50_ns": o50, "p99_ns": o99,
                                                      "max_ns": report["overhead_max_ns"]}),
                        *parts.items()]
    ]  # fmt: skip
    return report


def light_figures(light: dict) -> dict[str, float | None]:
    """Overhead and echo floor percentiles of one light-load run, and their p99 ratio."""
    o50, o99 = percentiles(light["e2e"] - light["compute"], (50, 99))
    f50, f99 = percentiles(light["floor"], (50, 99))
    return {"overhead_p50_ns": o50, "overhead_p99_ns": o99, "transport_floor_p50_ns": f50,
            "transport_floor_p99_ns": f99, "overhead_p99_vs_floor": o99 / f99 if f99 else None}


def _ratio(v: float | None) -> str:
    return "   -  " if v is None else f"{v:6.2f}"


def worst_share(overhead: np.ndarray, parts: dict[str, np.ndarray]) -> dict[str, float]:
    """Where the slowest 1% of requests (overhead at or above its p99) lost their time: the
    median of the overhead and of each part over them, in ns (medians, so one DDS stall of
    hundreds of ms does not speak for the rest)."""
    worst = overhead >= np.percentile(overhead, 99) if overhead.size else overhead.astype(bool)
    med = lambda v: float(np.median(np.asarray(v)[worst])) if worst.any() else 0.0  # noqa: E731
    return {"requests": int(worst.sum()), "overhead_median_ns": med(overhead),
            **{f"{name}_median_ns": med(values) for name, values in parts.items()}}


def table(report: dict) -> str:
    from flowedge_relay_tools.bench.tables import format_rows

    t = report["targets"]
    verdict = lambda m: "met" if t[m]["met"] else "MISSED"  # noqa: E731
    return "\n".join([
        f"overhead: {report['model']}, {report['workers']} worker(s); light load = "
        f"{report['light_requests']} sequential requests of {report['light_nfe']} NFE",
        format_rows(report["rows"]),
        f"transport floor (rclpy echo node in its own process, alternating with the relay): "
        f"p50 {report['transport_floor_p50_ns'] / 1e3:.0f} us, p99 "
        f"{report['transport_floor_p99_ns'] / 1e3:.0f} us; relay adds "
        f"{report['relay_added_p50_ns'] / 1e3:.0f} us at p50, "
        f"{report['relay_added_p99_ns'] / 1e3:.0f} us at p99 (difference of percentiles)",
        *([f"slowest 1% ({w['requests']} requests; medians): overhead "
           f"{w['overhead_median_ns'] / 1e3:.0f} us = " + ", ".join(
               f"{k[:-10].replace('_', ' ')} {v / 1e3:.0f} us" for k, v in w.items()
               if k.endswith("_median_ns") and k != "overhead_median_ns")]
          if (w := report.get("worst_1pct")) else []),
        f"throughput ({report['throughput_trials']} alternating bare/relay pairs of "
        f"{report['seconds_per_trial']:g} s): median relay {report['relay_nfe_per_s']:.0f} NFE/s"
        f" vs bare onnxruntime {report['bare_nfe_per_s']:.0f} NFE/s; ratio = median pair ratio",
        f"  split: worker NFE speed vs bare {report['worker_speed_vs_bare']:.3f} x share of time "
        f"lanes compute {report['lane_compute_share']:.3f} (medians); nfe_loop "
        f"{report.get('nfe_loop', 'auto')}",
        *[f"  nfe_loop {loop:6}: relay_throughput_ratio {c['relay_throughput_ratio']:.3f} = "
          f"worker speed {c['worker_speed_vs_bare']:.3f} x lane share "
          f"{c['lane_compute_share']:.3f} ({c['relay_nfe_per_s']:.0f} vs bare "
          f"{c['bare_nfe_per_s']:.0f} NFE/s)"
          for loop, c in report.get("nfe_loop_comparison", {}).items()],
        *[f"  publisher_loop {loop:6}: overhead p50 {c['overhead_p50_ns'] / 1e3:.0f} us, p99 "
          f"{c['overhead_p99_ns'] / 1e3:.0f} us vs echo floor p99 "
          f"{c['transport_floor_p99_ns'] / 1e3:.0f} us: {_ratio(c['overhead_p99_vs_floor'])}"
          for loop, c in report.get("publisher_loop_comparison", {}).items()],
        "targets (printed, not asserted):",
        f"  overhead_p99_ns        {report['overhead_p99_ns'] / 1e6:8.3f} ms (target <= 2 ms) "
        f"{verdict('overhead_p99_ns')}",
        f"  overhead p99 / floor p99 {_ratio(t['overhead_p99_vs_floor']['value'])} "
        f"(target <= {TARGET_OVERHEAD_VS_FLOOR}) {verdict('overhead_p99_vs_floor')}",
        f"  relay_throughput_ratio {report['relay_throughput_ratio']:8.3f}    (target >= 0.95) "
        f"{verdict('relay_throughput_ratio')}",
    ])  # fmt: skip


def plot(report: dict, path: str) -> str:
    from flowedge_relay_tools.bench import plots

    fig, (ax_cdf, ax_tp) = plots.subplots(ncols=2, width=5.2, height=3.8)
    plots.ecdf(ax_cdf, np.asarray(report["samples"]["overhead_ns"]) / 1e3, "e2e - compute")
    if "floor_ns" in report["samples"]:
        plots.ecdf(ax_cdf, np.asarray(report["samples"]["floor_ns"]) / 1e3,
                   "echo round trip (floor)")  # fmt: skip
    ax_cdf.axvline(TARGET_OVERHEAD_P99_NS / 1e3, color="k", ls="--", lw=1, label="2 ms target")
    ax_cdf.set_xscale("log")
    ax_cdf.set_xlabel("relay overhead per request, us (log)")
    ax_cdf.set_ylabel("fraction of requests")
    ax_cdf.legend(fontsize=8, loc="lower right")
    n = len(report["bare_nfe_per_s_trials"])
    x = np.arange(n)
    ax_tp.bar(x - 0.2, report["bare_nfe_per_s_trials"], 0.4, label="bare onnxruntime")
    ax_tp.bar(x + 0.2, report["relay_nfe_per_s_trials"], 0.4, label="through the relay")
    ax_tp.set_xticks(x, [str(i + 1) for i in range(n)])
    ax_tp.set_xlabel("pair (bare, relay)")
    ax_tp.set_ylabel("NFE per second")
    ax_tp.legend(fontsize=8, loc="lower right")
    ax_tp.set_title(f"median pair ratio {report['relay_throughput_ratio']:.3f}", fontsize=9)
    return plots.save(
        fig, path,
        title=f"overhead: {report['model']}, {report['workers']} worker(s)",
        note=f"light load: {report['light_requests']} x {report['light_nfe']} NFE one at a time, "
             f"each followed by one echo; relay {report.get('relay', 'in process')}; "
             f"saturation: {report['sat_nfe']} NFE requests, 2W+2 outstanding",
    )  # fmt: skip
