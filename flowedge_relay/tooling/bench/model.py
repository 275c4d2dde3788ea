"""`bench model`: what one NFE of each shipped policy costs, and what the worker loop adds.

Raw cost: `InferenceSession.run` on batch 1, per model, at 1 and 2 intra-op threads (p50 / p99 /
max ns). Worker overhead: the same NFEs driven by a real `WorkerPool` through the real C core
(dispatch, step after every NFE, finish) against a bare `session.run` loop on the same model,
as `worker_throughput_ratio` (target >= 0.95): the median ratio over back-to-back pairs of
equal-length bare and worker runs, so a noisy neighbour hurts both sides of a pair alike; plus
`worker_cpu_ratio`, the same comparison in thread CPU time per NFE (immune to load).

This is a measurement, not a test: numbers depend on the host, its load and thermal state.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from flowedge_relay.core import Code, Core, CoreConfig, Decision, Request
from flowedge_relay.model import (
    INPUT_OBS,
    INPUT_T,
    INPUT_X,
    OUTPUT_V,
    ModelInfo,
    bench_model_path,
    default_model_path,
    load_model,
    make_session,
)
from flowedge_relay.models import detour_task as task
from flowedge_relay.tooling.bench.progress import Progress
from flowedge_relay.workers import WorkerPool

TARGET_RATIO = 0.95
THREADS = (1, 2)
SIZES = {  # (raw samples small, raw samples bench, requests per trial, nfe per request, pairs)
    "quick": (300, 100, 2, 25, 2),
    "full": (3000, 1000, 4, 50, 15),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small sample sizes (CI)")
    parser.add_argument(
        "--throughput-model",
        choices=["small", "bench"],
        default="bench",
        help="model for worker_throughput_ratio (default: bench, ~1 ms per NFE)",
    )


def _feeds(info: ModelInfo) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    obs = task.sample_observations(rng, 1)
    x = rng.standard_normal((1, info.action_horizon, info.action_dim), dtype=np.float32)
    return {INPUT_X: x, INPUT_T: np.full((1, 1), 0.5, np.float32), INPUT_OBS: obs}


def raw_nfe_cost(info: ModelInfo, threads: int, samples: int) -> dict[str, float]:
    """Per-call ns of `session.run` on batch 1 after a warm-up."""
    sess = make_session(info, threads)
    feeds, outs = _feeds(info), [OUTPUT_V]
    for _ in range(max(20, samples // 20)):
        sess.run(outs, feeds)
    durations = np.empty(samples, np.int64)
    clock = time.perf_counter_ns
    for i in range(samples):
        t0 = clock()
        sess.run(outs, feeds)
        durations[i] = clock() - t0
    p50, p99 = np.percentile(durations, [50, 99])
    return {
        "p50_ns": float(p50),
        "p99_ns": float(p99),
        "max_ns": float(durations.max()),
        "samples": samples,
    }


def _bare_loop(info: ModelInfo, sess, nfe: int) -> tuple[float, float]:
    """(NFE/s, CPU ns per NFE) of `session.run` back to back: no solver, no scheduling."""
    feeds, outs = _feeds(info), [OUTPUT_V]
    c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
    for _ in range(nfe):
        sess.run(outs, feeds)
    wall, cpu = time.perf_counter_ns() - t0, time.thread_time_ns() - c0
    return nfe / (wall * 1e-9), cpu / nfe


def _worker_loop(core: Core, pool: WorkerPool, requests: int, nfe: int, trial: int):
    """(NFE/s, worker CPU ns per NFE) through the pool: submit all, wait for every outcome."""
    obs = task.sample_observations(np.random.default_rng(trial), requests)
    c0, t0 = pool.thread_cpu_ns()[0], time.perf_counter_ns()
    for i in range(requests):
        now = time.monotonic_ns()
        req = Request(
            session_id=b"bench-%d" % trial, sequence=i, generation=1, retry_count=0,
            retry_reason=0, origin_ns=now, deadline_ns=0, deadline_ros_ns=0,
            remaining_nfe=nfe, noise_seed=i, observation=obs[i],
        )  # fmt: skip
        if core.submit(req, now) != Decision.ACCEPTED:
            raise RuntimeError("bench request was not accepted")
    done = 0
    while done < requests:
        core.wait_outputs(100_000_000)
        for out in core.pop_outcomes():
            if out.code != Code.INFERENCE:
                raise RuntimeError(f"bench request ended {out.code.name}")
            done += 1
    wall, cpu = time.perf_counter_ns() - t0, pool.thread_cpu_ns()[0] - c0
    return requests * nfe / (wall * 1e-9), cpu / (requests * nfe)


def worker_throughput(info: ModelInfo, requests: int, nfe: int, pairs: int, bar: Progress) -> dict:
    """Worker pool vs bare loop, one thread each, in back-to-back pairs.

    The shared host's load drifts over seconds, so each pair (bare run, then the same number of
    NFE through the pool) is compared on its own and the median pair ratio is reported.
    CPU time per NFE (the worker thread's own clock vs the bare loop's) is the load-independent
    view of the same overhead.
    """
    bare_sess = make_session(info, 1)
    _bare_loop(info, bare_sess, 20)
    cfg = CoreConfig(workers=1, obs_dim=info.obs_dim, action_len=info.action_len,
                     queue_capacity=max(64, requests), max_nfe=max(64, nfe))  # fmt: skip
    bare, worker, bare_cpu, worker_cpu = [], [], [], []
    with Core(cfg) as core, WorkerPool(core, info, workers=1, intra_op_threads=1) as pool:
        _worker_loop(core, pool, 2, 5, trial=999)  # warm-up (its own session id)
        for k in range(pairs):
            bar.update(label=f"throughput pair {k + 1}/{pairs}")
            rate, cpu = _bare_loop(info, bare_sess, requests * nfe)
            bare.append(rate)
            bare_cpu.append(cpu)
            rate, cpu = _worker_loop(core, pool, requests, nfe, k)
            worker.append(rate)
            worker_cpu.append(cpu)
            bar.advance()
        p50, p99, _ = pool.nfe_percentiles()
    ratios = np.asarray(worker) / np.asarray(bare)
    return {
        "model": info.path.rsplit("/", 1)[-1],
        "requests_per_trial": requests,
        "nfe_per_request": nfe,
        "pairs": pairs,
        "bare_nfe_per_s": float(np.median(bare)),
        "worker_nfe_per_s": float(np.median(worker)),
        "pair_ratios": [round(float(r), 4) for r in ratios],
        "ratio": float(np.median(ratios)),
        "ratio_of_best": float(max(worker) / max(bare)),  # timeit-style: least disturbed runs
        "bare_cpu_ns_per_nfe": float(np.median(bare_cpu)),
        "worker_cpu_ns_per_nfe": float(np.median(worker_cpu)),
        "cpu_ratio": float(np.median(bare_cpu) / np.median(worker_cpu)),
        "worker_nfe_p50_ns": p50,
        "worker_nfe_p99_ns": p99,
    }


def run(args: argparse.Namespace) -> dict:
    n_small, n_bench, requests, nfe, pairs = SIZES["quick" if args.quick else "full"]
    models = {"policy_small": load_model(default_model_path()),
              "policy_bench": load_model(bench_model_path())}  # fmt: skip
    cost: dict[str, dict] = {}
    with Progress("model", total=len(models) * len(THREADS) + pairs) as bar:
        for name, info in models.items():
            samples = n_small if name == "policy_small" else n_bench
            cost[name] = {"digest": info.digest}
            for threads in THREADS:
                bar.update(label=f"raw NFE cost {name} intra_op_threads={threads}")
                cost[name][f"threads_{threads}"] = raw_nfe_cost(info, threads, samples)
                bar.advance()
        info = models["policy_bench" if args.throughput_model == "bench" else "policy_small"]
        throughput = worker_throughput(info, requests, nfe, pairs, bar)
    rows = [
        {
            "model": name,
            "intra_op_threads": threads,
            "nfe_p50_us": round(c[f"threads_{threads}"]["p50_ns"] / 1e3, 1),
            "nfe_p99_us": round(c[f"threads_{threads}"]["p99_ns"] / 1e3, 1),
            "nfe_max_us": round(c[f"threads_{threads}"]["max_ns"] / 1e3, 1),
        }
        for name, c in cost.items()
        for threads in THREADS
    ]
    return {
        "size": "quick" if args.quick else "full",
        "nfe_cost": cost,
        "rows": rows,
        "worker_throughput": throughput,
        "worker_throughput_ratio": throughput["ratio"],
        "worker_cpu_ratio": throughput["cpu_ratio"],
        "worker_throughput_target": TARGET_RATIO,
        "targets": {
            "worker_throughput_ratio": {
                "target": TARGET_RATIO,
                "met": throughput["ratio"] >= TARGET_RATIO,
            }
        },
        "note": "raw session.run on batch 1; numbers depend on host load and thermal state",
    }


def table(report: dict) -> str:
    from flowedge_relay.tooling.bench.tables import format_rows

    wt = report["worker_throughput"]
    met = "met" if report["worker_throughput_ratio"] >= TARGET_RATIO else "MISSED"
    return "\n".join([
        "model: raw onnxruntime cost of one NFE (session.run, batch 1)",
        format_rows(report["rows"]),
        f"worker loop vs bare session.run ({wt['model']}, 1 thread each, {wt['pairs']} pairs of "
        f"{wt['requests_per_trial']} x {wt['nfe_per_request']} NFE): "
        f"worker {wt['worker_nfe_per_s']:.0f} NFE/s, bare {wt['bare_nfe_per_s']:.0f} NFE/s "
        f"(medians; ratio of the best runs {wt['ratio_of_best']:.3f})",
        f"  CPU per NFE: worker {wt['worker_cpu_ns_per_nfe'] / 1e3:.1f} us, bare "
        f"{wt['bare_cpu_ns_per_nfe'] / 1e3:.1f} us (worker_cpu_ratio {wt['cpu_ratio']:.4f})",
        "target (printed, not asserted):",
        f"  worker_throughput_ratio {report['worker_throughput_ratio']:.3f} (median pair ratio; "
        f"target >= {TARGET_RATIO}) {met}",
    ])  # fmt: skip


def plot(report: dict, path: str) -> str:
    from flowedge_relay.tooling.bench import plots

    fig, (ax_cost, ax_tp) = plots.subplots(ncols=2, width=5.2, height=3.8)
    rows = report["rows"]
    x = np.arange(len(rows))
    for offset, key, label in ((-0.2, "nfe_p50_us", "p50"), (0.2, "nfe_p99_us", "p99")):
        ax_cost.bar(x + offset, [r[key] for r in rows], 0.4, label=label)
    ax_cost.set_xticks(
        x, [f"{r['model'].removeprefix('policy_')}\n{r['intra_op_threads']} thr" for r in rows]
    )
    ax_cost.set_yscale("log")
    ax_cost.set_ylabel("one NFE, us (log)")
    ax_cost.legend(fontsize=8)
    wt = report["worker_throughput"]
    ratios = wt["pair_ratios"]
    ax_tp.plot(np.arange(1, len(ratios) + 1), ratios, "o-", label="worker / bare, per pair")
    ax_tp.axhline(wt["ratio"], color="C1", lw=1.5, label=f"median {wt['ratio']:.3f}")
    ax_tp.axhline(TARGET_RATIO, color="k", ls="--", lw=1, label=f"target {TARGET_RATIO}")
    ax_tp.set_xlabel("pair (bare run, then worker run)")
    ax_tp.set_ylabel("NFE/s ratio")
    ax_tp.legend(fontsize=8, loc="lower right")
    ax_tp.set_title(f"CPU-time ratio {wt['cpu_ratio']:.4f}", fontsize=9)
    return plots.save(
        fig, path,
        title="model: NFE cost of the shipped policies and worker-loop throughput",
        note=f"{report['size']} size; {wt['model']} for throughput; shared host, noisy",
    )  # fmt: skip
