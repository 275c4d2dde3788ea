# SPDX-License-Identifier: Apache-2.0
"""`bench nfe-breakdown`: where a worker NFE's wall time goes, at light load and at overload, and
what the cheapest candidate fixes change (measure, don't guess).

For each variant the relay runs as its own `flowedge-relayd` process with the bench-only probe
on (bench/nfe_probe.py through the runtime's workers.set_nfe_probe_factory hook: every worker
thread reads its monotonic clock, its CPU time and its run-queue wait at five instants of every
NFE; nfe_probe.NfeProbe). A short inline calibration gives
capacity and the static `nfe_ns`, then the overload trace (trace.py) runs at `--light` and at
`--over` x capacity with edf_admission. Per NFE, between the instants:

  nfe             one NFE (model run + solver update): what the relay measures and admission
                  must bound
  ort_cpu         CPU time of the worker thread inside the ONNX Runtime run (compute with one
                  intra-op thread, plus the binding's few microseconds)
  ort_runq        time inside the run the thread was runnable but another thread had the core
  gil_wait        the rest of the run's wall time: the thread slept, i.e. (one intra-op thread,
                  nothing in ORT sleeps) it waited for the GIL once ORT returned (0 by
                  construction in the native loop, which never takes the GIL: what remains
                  there is measurement noise)
  py_before       from the NFE's start to the run (setting t, the call; Python or C)
  solver          the solver update after the run (two numpy ops and their GIL waits, or the
                  C loop of the native NFE loop)
  step            core.step (the C call, the core mutex, re-taking the GIL after it in Python)

and the makeup of the slowest 1% of NFEs at overload (mean of each part over them). The probe
reads the same instants in both NFE loops (nfe_probe.NfeProbe in Python, fer_exec.c's probe in the
native loop), so the parts compare one to one. Variants:

  python_loop     nfe_loop python: the worker's NFE loop in Python (the relay before the C loop)
  baseline        the relay as configured by default: the native NFE loop (C, ONNX Runtime's C
                  API, no GIL; nfe_loop auto)
  switch_200us    sys.setswitchinterval(200e-6) in the relay process (default 5 ms): a thread
                  that wants the GIL gets it after 200 us instead of up to 5 ms
  split_cpus      executor_cpu_affinity [0], worker_cpu_affinity [1]: the request thread and
                  the worker on different cores (the relay's existing parameters)
  split_cpus+switch_200us  both

The figure of merit is worker NFE p99 at `--over` divided by its p99 at `--light` (target
<= 1.5). A measurement on a shared host: the report records the load average.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from flowedge_relay.workers import PROBE_POINTS
from flowedge_relay_tools.bench import calibrate, nfe_probe, targets
from flowedge_relay_tools.bench.client import model_path, remote_relay, set_policy, warm_up
from flowedge_relay_tools.bench.host import host_info
from flowedge_relay_tools.bench.overload import replay
from flowedge_relay_tools.bench.progress import Progress
from flowedge_relay_tools.bench.tables import format_rows, percent
from flowedge_relay_tools.bench.trace import Trace, TraceSpec

VARIANTS: dict[str, dict] = {
    "python_loop": {"params": {"nfe_loop": "python"}},
    "baseline": {},
    "switch_200us": {"switch_interval_s": 200e-6},
    "split_cpus": {"params": {"executor_cpu_affinity": [0], "worker_cpu_affinity": [1]}},
    "split_cpus+switch_200us": {"switch_interval_s": 200e-6,
                                "params": {"executor_cpu_affinity": [0],
                                           "worker_cpu_affinity": [1]}},
}  # fmt: skip
PARTS = ("nfe", "ort_cpu", "ort_runq", "gil_wait", "py_before", "solver", "step")
TARGET_RATIO = targets.NFE_BREAKDOWN_RATIO
# seconds per point, calibration requests, calibration seconds saturated
SIZES = {"quick": (0.4, 12, 0.2), "full": (6.0, 200, 2.0)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="tiny size (CI)")
    parser.add_argument("--duration", type=float, help="seconds of trace per load point")
    parser.add_argument("--model", default="bench", help="small, bench or an ONNX path")
    parser.add_argument("--light", type=float, default=0.3, help="light load, x capacity")
    parser.add_argument("--over", type=float, default=2.0, help="overload, x capacity")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS),
                        default=list(VARIANTS))
    parser.add_argument("--seed", type=int, default=TraceSpec.seed)


def parts(rows: np.ndarray) -> dict[str, np.ndarray]:
    """Per-NFE durations (ns) of each part from probe rows [n, point, (mono, cpu, runq)]."""
    p = {name: i for i, name in enumerate(PROBE_POINTS)}
    mono, cpu, rq = rows[:, :, 0], rows[:, :, 1], rows[:, :, 2]

    def span(clock: np.ndarray, a: str, b: str) -> np.ndarray:
        return clock[:, p[b]] - clock[:, p[a]]

    run_wall = span(mono, "run_start", "run_end")
    run_cpu = span(cpu, "run_start", "run_end")
    run_rq = span(rq, "run_start", "run_end")
    return {
        "nfe": span(mono, "nfe_start", "nfe_end"),
        "ort_cpu": run_cpu,
        "ort_runq": run_rq,
        "gil_wait": np.maximum(run_wall - run_cpu - run_rq, 0),
        "py_before": span(mono, "nfe_start", "run_start"),
        "solver": span(mono, "run_end", "nfe_end"),
        "step": span(mono, "nfe_end", "step_end"),
        "nfe_runq": span(rq, "nfe_start", "nfe_end"),
    }


def summarize(rows: np.ndarray) -> dict:
    """p50 / p99 / mean of each part, and the mean makeup of the slowest 1% of NFEs."""
    if len(rows) == 0:
        return {"nfes": 0}
    d = parts(rows)
    out: dict[str, object] = {"nfes": int(len(rows))}
    for name in PARTS:
        v = d[name].astype(np.float64)
        out[name] = {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)),
                     "mean": float(v.mean())}  # fmt: skip
    tail = d["nfe"] >= np.percentile(d["nfe"], 99)
    out["slowest_1pct"] = {name: float(d[name][tail].mean()) for name in PARTS + ("nfe_runq",)}
    return out


def _load_rows(directory: str) -> np.ndarray:
    files = sorted(Path(directory).glob("nfe-breakdown-lane*.npy"))
    if not files:
        raise RuntimeError(f"the relay wrote no NFE breakdown into {directory}")
    return np.concatenate([np.load(f) for f in files])


def run_variant(name: str, args, spec: TraceSpec, duration: float, sizes, bar) -> dict:
    variant = VARIANTS[name]
    _, cal_requests, cal_loaded_s = sizes
    params = dict(model_path=model_path(args.model), workers=1, queue_capacity=64,
                  max_nfe=max(64, spec.nfe_max), **variant.get("params", {}))  # fmt: skip
    trace = Trace(spec)
    windows, points = {}, {}
    with tempfile.TemporaryDirectory(prefix="flowedge-breakdown-") as tmp:
        with remote_relay(env={nfe_probe.BREAKDOWN_ENV: tmp}, relay_module=nfe_probe.__name__,
                          switch_interval_s=variant.get("switch_interval_s"),
                          **params) as (relay, client):  # fmt: skip
            warm_up(client)
            bar.update(label=f"{name}: calibration")
            cal = calibrate.inline(relay, client, spec.mean_nfe, cal_requests, cal_loaded_s)
            capacity = calibrate.capacity(cal, spec.mean_nfe)[0]
            set_policy(relay, nfe_ns=cal["recommended_nfe_ns"],
                       admission_reserve_ns=cal["recommended_admission_reserve_ns"],
                       queue_timeout_ms=0, cost_model="static")  # fmt: skip
            drain = spec.slack_max_ms / 1e3 + 2.0
            for label, load in (("light", args.light), ("over", args.over)):
                bar.update(label=f"{name}: {label} ({load:g}x)")
                arrivals = trace.at_load(load * capacity, duration)
                start = time.monotonic_ns()
                m = replay(relay, client, arrivals, drain_timeout_s=drain)
                windows[label] = (start, time.monotonic_ns())
                points[label] = {"load": load, "offered": m["offered"],
                                 "on_time_ratio_admitted": m["on_time_ratio_admitted"],
                                 "wasted_nfe_ratio": m["wasted_nfe_ratio"]}  # fmt: skip
                bar.advance()
        rows = _load_rows(tmp)  # written by the relay's workers as it exited
    starts = rows[:, 0, 0]
    for label, (a, b) in windows.items():
        points[label].update(summarize(rows[(starts >= a) & (starts <= b)]))
    light, over = points["light"], points["over"]
    ratio = (over["nfe"]["p99"] / light["nfe"]["p99"]
             if over.get("nfes") and light.get("nfes") else None)  # fmt: skip
    return {"variant": name, "switch_interval_s": variant.get("switch_interval_s"),
            "relay_params": variant.get("params", {}),
            "nfe_loop": "python" if params.get("nfe_loop") == "python" else "native",
            "capacity_rps": capacity,
            "nfe_ns": cal["recommended_nfe_ns"], "points": points,
            "p99_over_vs_light": ratio,
            "target_met": None if ratio is None else ratio <= TARGET_RATIO}  # fmt: skip


def run(args: argparse.Namespace) -> dict:
    host = host_info()
    sizes = SIZES["quick" if args.quick else "full"]
    duration = args.duration or sizes[0]
    spec = TraceSpec(seed=args.seed)
    results = []
    with Progress("nfe-breakdown", 2 * len(args.variants), unit=" points") as bar:
        for name in args.variants:
            results.append(run_variant(name, args, spec, duration, sizes, bar))
    report = {
        "size": "quick" if args.quick else "full",
        "host": host,
        "model": model_path(args.model).rsplit("/", 1)[-1],
        "duration_s_per_point": duration,
        "loads": {"light": args.light, "over": args.over},
        "trace": spec.describe(),
        "target": f"worker NFE p99 at {args.over:g}x <= {TARGET_RATIO:g} x its p99 at "
                  f"{args.light:g}x",
        "method": "relay as its own flowedge-relayd process, bench-only probe "
                  f"({nfe_probe.BREAKDOWN_ENV}); edf_admission at the inline calibration; "
                  "parts are described in tools/flowedge_relay_tools/bench/nfe_breakdown.py",
        "variants": results,
        "pid": os.getpid(),
    }  # fmt: skip
    report["rows"] = _rows(report)
    return report


def _us(v: float) -> float:
    return round(v / 1e3, 1)


def _rows(report: dict) -> list[dict]:
    rows = []
    for v in report["variants"]:
        for label in ("light", "over"):
            pt = v["points"][label]
            if not pt.get("nfes"):  # every request rejected or expired before its first NFE
                rows.append({"variant": v["variant"], "load": f"{pt['load']:g}x", "nfes": 0})
                continue
            tail = pt["slowest_1pct"]
            rows.append({
                "variant": v["variant"], "load": f"{pt['load']:g}x", "nfes": pt["nfes"],
                "nfe_p50_us": _us(pt["nfe"]["p50"]), "nfe_p99_us": _us(pt["nfe"]["p99"]),
                "ort_cpu_p99": _us(pt["ort_cpu"]["p99"]),
                "ort_runq_p99": _us(pt["ort_runq"]["p99"]),
                "gil_wait_p99": _us(pt["gil_wait"]["p99"]),
                "solver_p99": _us(pt["solver"]["p99"]), "step_p99": _us(pt["step"]["p99"]),
                "slowest1%: cpu/runq/gil/other_us": "/".join(str(round(x / 1e3)) for x in (
                    tail["ort_cpu"], tail["nfe_runq"], tail["gil_wait"],
                    max(tail["nfe"] - tail["ort_cpu"] - tail["nfe_runq"] - tail["gil_wait"], 0)
                )),
                "p99_over/light": (f"{v['p99_over_vs_light']:.2f}" if label == "over"
                                   and v["p99_over_vs_light"] is not None else ""),
                "on_time_adm": percent(pt["on_time_ratio_admitted"]),
            })  # fmt: skip
    return rows


def table(report: dict) -> str:
    lines = [
        f"nfe-breakdown: {report['model']}, {report['duration_s_per_point']:g} s of trace per "
        f"point, light {report['loads']['light']:g}x / over {report['loads']['over']:g}x "
        "capacity; microseconds",
        format_rows(report["rows"]),
        f"target: {report['target']}",
        "cpu = worker CPU time in the ORT run; runq = runnable, another thread had the core "
        "(whole NFE); gil = slept in the run after ORT returned (GIL); other = Python before "
        "the run, solver update and their GIL waits",
    ]
    return "\n".join(lines)
