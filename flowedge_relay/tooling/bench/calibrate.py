"""`bench calibrate`: measure ns per NFE through the real relay node and recommend `nfe_ns`.

ADR 0015 leaves calibration to the deployment: `nfe_ns` must be a measured upper bound of one
NFE on this host. This subcommand starts the relay as deployed, as its own `flowedge-relayd`
process (admission off; `--in-process` runs a RelayNode in the bench process instead), and a
client node in the bench process, sends requests of `--nfe` NFE one at a time over DDS, and
measures per request:

  e2e          client publish -> client receives the ActionMessage (client clock)
  compute      the relay's own `compute_ns` (dispatch -> finish: the NFEs plus the worker loop)
  fixed        e2e - compute: DDS both ways, validation, admission, dispatch wake-up, publish

and, side by side (alternating blocks in the same run, same process), raw onnxruntime cost of one
NFE (`FlowSampler.nfe()`: one bound `run_with_iobinding` + the solver update) on its own session.

then keeps the lanes saturated for a few seconds (2W+2 requests outstanding) and records the
relay's compute ns per NFE under that load (loaded: the GIL and both cores are shared with the
request and publisher threads, so an NFE costs more than on an idle relay).

Recommendation (conservative starting point, ADR 0015, docs/design.md#decision-record):
  recommended_nfe_ns               = ceil(margin x max(p99 of e2e ns per NFE,
                                                       p99 of loaded compute ns per NFE)), in us
  recommended_admission_reserve_ns = ceil(margin x p99 of the fixed part), whole microseconds
The e2e per-NFE figure already carries the fixed part spread over `--nfe` steps, so the two
overlap on purpose. Production calibration needs representative traces, thermal state, CPU
affinity and a safety margin; the report says so.
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from flowedge_relay.model import FlowSampler, load_model, make_session
from flowedge_relay.tooling.bench.client import (
    INFERENCE,
    model_path,
    percentiles,
    relay_for_bench,
    saturate,
    warm_up,
)
from flowedge_relay.tooling.bench.perfdoc import host_info
from flowedge_relay.tooling.bench.progress import Progress

QS = (50, 99, 99.9)
CAVEAT = (
    "A starting point, not a guarantee: production calibration needs representative traces "
    "(observation sizes, NFE counts, concurrency), the host's thermal state and power mode, the "
    "deployed CPU affinity / real-time priority, and a safety margin on top. Re-run it there."
)
NOISY_TAIL_RATIO = 3.0  # raw NFE p99 / p50 above this: the host stalls; say so
# requests, nfe, raw NFEs, blocks, seconds saturated
SIZES = {"quick": (16, 4, 100, 2, 0.3), "full": (800, 10, 4000, 8, 4.0)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="tiny sample sizes (CI)")
    parser.add_argument(
        "--model", default="small",
        help="small (the relay's default model), bench (~1 ms per NFE) or an ONNX path",
    )  # fmt: skip
    parser.add_argument("--requests", type=int, help="requests through the relay")
    parser.add_argument("--nfe", type=int, help="NFE per request (use your typical count)")
    parser.add_argument("--workers", type=int, default=1, help="relay worker threads")
    parser.add_argument("--margin", type=float, default=1.0, help="multiplier on the p99/p99.9")
    parser.add_argument("--in-process", action="store_true",
                        help="run the relay inside the bench process (sharing its GIL) instead "
                             "of as its own flowedge-relayd process")


def _us_ceil(ns: float) -> int:
    return int(math.ceil(ns / 1000.0)) * 1000


def raw_nfe_ns(sampler: FlowSampler, obs: np.ndarray, n: int) -> np.ndarray:
    """Per-NFE ns of FlowSampler.nfe() back to back (fresh start every 16 NFE)."""
    out = np.empty(n, np.int64)
    clock = time.perf_counter_ns
    for i in range(n):
        if i % 16 == 0:
            sampler.start(obs, i, 16)
        t0 = clock()
        sampler.nfe()
        out[i] = clock() - t0
    return out


def relay_samples(
    client, n: int, nfe: int, bar: Progress | None = None,
    session: str = "bench-calibrate", timeout: float = 10.0,
) -> dict[str, list]:  # fmt: skip
    """n sequential requests of nfe NFE (no deadline) through the relay; per-request ns."""
    e2e, compute, queue, out, nfe_done = [], [], [], [], []
    for _ in range(n):
        req = client.request(session, client.next_sequence(), nfe, noise_seed=len(e2e))
        sent = client.send(req)
        ans = client.answer((req.session_id, req.sequence), timeout)
        if ans is None:
            raise TimeoutError(f"no answer from the relay within {timeout} s")
        if ans.code != INFERENCE:
            raise RuntimeError(f"calibration request ended with code {ans.code}")
        e2e.append(ans.received_ns - sent)
        compute.append(ans.compute_ns)
        queue.append(ans.queue_ns)
        out.append(ans.received_ns - ans.published_ns)
        nfe_done.append(ans.nfe_done)
        if bar is not None:
            bar.advance()
    return {"e2e_ns": e2e, "compute_ns": compute, "queue_ns": queue, "delivery_ns": out,
            "nfe_done": nfe_done}  # fmt: skip


def measure(relay, client, requests: int, nfe: int, raw_nfe: int, blocks: int,
            bar: Progress | None = None, loaded_s: float = 0.0) -> dict:  # fmt: skip
    """Relay requests and raw NFEs in alternating blocks, then (loaded_s > 0) the lanes kept
    saturated for loaded_s seconds; returns the sample arrays."""
    info = relay.model
    sampler = FlowSampler(make_session(info, 1), info, "euler")
    obs = np.zeros(info.obs_dim, np.float32)
    raw_nfe_ns(sampler, obs, 20)  # warm-up
    relay_acc: dict[str, list] = {}
    raw_parts = []
    blocks = max(1, min(blocks, requests))
    for b in range(blocks):
        if bar is not None:
            bar.update(label=f"block {b + 1}/{blocks}")
        raw_parts.append(raw_nfe_ns(sampler, obs, max(1, raw_nfe // blocks)))
        n = requests // blocks + (1 if b < requests % blocks else 0)
        for key, values in relay_samples(client, n, nfe, bar).items():
            relay_acc.setdefault(key, []).extend(values)
    samples = {k: np.asarray(v, np.int64) for k, v in relay_acc.items()}
    samples["raw_nfe_ns"] = np.concatenate(raw_parts)
    if loaded_s > 0:
        # An NFE costs more when the request and publisher threads are busy too (the GIL, two
        # cores): admission must be calibrated for the load it will face, not an idle relay.
        if bar is not None:
            bar.update(label=f"saturated {loaded_s:g} s")
        lanes = getattr(relay.core, "lanes", relay.core.workers)  # W x B with batch slots
        answers = saturate(client, lanes, nfe, loaded_s, "bench-calibrate-load")
        samples["loaded_compute_ns"] = np.asarray([a.compute_ns for a in answers], np.int64)
        samples["loaded_nfe_done"] = np.asarray([a.nfe_done for a in answers], np.int64)
    return samples


def summarize(samples: dict, nfe: int, margin: float = 1.0) -> dict:
    """Percentiles and the recommendation (every value in ns)."""
    nfe_done = np.maximum(samples["nfe_done"], 1)
    series = {
        "raw_ns_per_nfe": samples["raw_nfe_ns"],
        "relay_compute_ns_per_nfe": samples["compute_ns"] / nfe_done,
        "e2e_ns_per_nfe": samples["e2e_ns"] / nfe_done,
        "fixed_overhead_ns": samples["e2e_ns"] - samples["compute_ns"],
        "e2e_ns": samples["e2e_ns"],
    }
    if "loaded_compute_ns" in samples:
        series["loaded_compute_ns_per_nfe"] = samples["loaded_compute_ns"] / np.maximum(
            samples["loaded_nfe_done"], 1
        )
    report: dict[str, object] = {}
    for name, values in series.items():
        p50, p99, p999 = percentiles(values, QS)
        report[f"{name}_p50"] = p50
        report[f"{name}_p99"] = p99
        report[f"{name}_p99_9"] = p999
        report[f"{name}_max"] = float(np.max(values)) if len(values) else 0.0
        report[f"{name}_mean"] = float(np.mean(values)) if len(values) else 0.0
    bound = max(report["e2e_ns_per_nfe_p99"], report.get("loaded_compute_ns_per_nfe_p99", 0.0))
    report["recommended_nfe_ns"] = _us_ceil(margin * bound)
    report["recommended_admission_reserve_ns"] = _us_ceil(margin * report["fixed_overhead_ns_p99"])
    # A tail far above the median means stalls (other processes, throttling), not the model.
    tail = report["raw_ns_per_nfe_p99"] / max(report["raw_ns_per_nfe_p50"], 1.0)
    report["raw_tail_ratio"] = tail
    report["noisy_host"] = bool(tail > NOISY_TAIL_RATIO)
    report["nfe_per_request"] = nfe
    report["requests"] = int(len(samples["e2e_ns"]))
    report["raw_nfe_samples"] = int(len(samples["raw_nfe_ns"]))
    report["margin"] = margin
    return report


def run(args: argparse.Namespace) -> dict:
    host = host_info()  # load average before this run adds its own
    requests, nfe, raw_nfe, blocks, loaded_s = SIZES["quick" if args.quick else "full"]
    requests = args.requests or requests
    nfe = args.nfe or nfe
    path = model_path(args.model)
    info = load_model(path)
    params = dict(model_path=path, workers=args.workers, max_nfe=max(64, nfe))
    with Progress("calibrate", requests, unit=" req") as bar:
        bar.update(label="starting relay")
        with relay_for_bench(args.in_process, **params) as (relay, client):
            warm_up(client)
            samples = measure(relay, client, requests, nfe, raw_nfe, blocks, bar, loaded_s)
            nfe_p50, nfe_p99, _ = relay.pool.nfe_percentiles()
    report = summarize(samples, nfe, args.margin)
    report.update(
        model=path.rsplit("/", 1)[-1],
        model_digest=info.digest,
        workers=args.workers,
        size="quick" if args.quick else "full",
        host=host,
        worker_nfe_p50_ns=nfe_p50,  # the pool's own per-NFE timing (sampler.nfe() only)
        worker_nfe_p99_ns=nfe_p99,
        method=(
            f"{report['requests']} sequential requests of {nfe} NFE through the real relay over "
            f"DDS (admission off, {args.workers} worker(s), relay "
            f"{'in the bench process' if args.in_process else 'as its own process'}), "
            "alternating with "
            f"{report['raw_nfe_samples']} raw FlowSampler.nfe() calls on a separate session"
        ),
        caveat=CAVEAT,
        rows=_rows(report),
    )
    report["samples"] = {
        "e2e_ns_per_nfe": (samples["e2e_ns"] / np.maximum(samples["nfe_done"], 1)).tolist(),
        "relay_compute_ns_per_nfe": (
            samples["compute_ns"] / np.maximum(samples["nfe_done"], 1)
        ).tolist(),
        "raw_ns_per_nfe": samples["raw_nfe_ns"].tolist(),
    }
    return report


def _rows(r: dict) -> list[dict]:
    names = [
        ("raw onnxruntime ns/NFE", "raw_ns_per_nfe"),
        ("relay compute ns/NFE", "relay_compute_ns_per_nfe"),
        ("end-to-end ns/NFE", "e2e_ns_per_nfe"),
        ("fixed part (e2e - compute)", "fixed_overhead_ns"),
        ("relay compute ns/NFE, saturated", "loaded_compute_ns_per_nfe"),
    ]
    names = [(label, key) for label, key in names if f"{key}_p50" in r]
    return [
        {
            "measure": label,
            "p50_us": round(r[f"{key}_p50"] / 1e3, 1),
            "p99_us": round(r[f"{key}_p99"] / 1e3, 1),
            "p99.9_us": round(r[f"{key}_p99_9"] / 1e3, 1),
            "max_us": round(r[f"{key}_max"] / 1e3, 1),
        }
        for label, key in names
    ]


def table(report: dict) -> str:
    from flowedge_relay.tooling.bench.tables import format_rows

    lines = [
        f"calibrate: {report['method']}",
        format_rows(report["rows"]),
        f"recommended nfe_ns               = {report['recommended_nfe_ns']:>10d}"
        f"  (max p99 of e2e and saturated compute ns per NFE x margin {report['margin']:g})",
        f"recommended admission_reserve_ns = {report['recommended_admission_reserve_ns']:>10d}"
        "  (p99 fixed part x margin)",
        f"  flowedge-relayd --nfe-ns {report['recommended_nfe_ns']} "
        f"--admission-reserve-ns {report['recommended_admission_reserve_ns']}",
        "caveat: " + report["caveat"],
    ]
    if report["noisy_host"]:
        lines.append(
            f"WARNING: raw NFE p99 is {report['raw_tail_ratio']:.1f}x its p50: this host stalls "
            "(other load, throttling); the tail, and so the recommendation, measures the stalls. "
            "Calibrate on a quiet host with the deployed CPU affinity."
        )
    return "\n".join(lines)


def plot(report: dict, path: str) -> str:
    from flowedge_relay.tooling.bench import plots

    fig, ax = plots.subplots(width=7.0, height=4.2)
    s = report["samples"]
    plots.ecdf(ax, np.asarray(s["raw_ns_per_nfe"]) / 1e3, "raw onnxruntime (per NFE)")
    plots.ecdf(ax, np.asarray(s["relay_compute_ns_per_nfe"]) / 1e3, "relay compute / NFE")
    plots.ecdf(ax, np.asarray(s["e2e_ns_per_nfe"]) / 1e3, "end-to-end / NFE (client)")
    rec_us = report["recommended_nfe_ns"] / 1e3
    ax.axvline(rec_us, color="k", ls="--", lw=1, label=f"recommended nfe_ns = {rec_us:.0f} us")
    ax.set_xscale("log")
    ax.set_xlabel("microseconds per NFE (log)")
    ax.set_ylabel("fraction of samples")
    ax.legend(fontsize=8, loc="lower right")
    return plots.save(
        fig, path,
        title=f"calibrate: {report['model']}, {report['workers']} worker(s), "
              f"{report['requests']} x {report['nfe_per_request']} NFE",
        note="measured through the real relay over DDS; " + "production needs its own calibration",
    )  # fmt: skip
