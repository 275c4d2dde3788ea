# SPDX-License-Identifier: Apache-2.0
"""`bench model`: what one NFE of each shipped policy costs, and what the worker loop adds.

Raw cost: `InferenceSession.run` on batch 1, per model, at 1 and 2 intra-op threads (p50 / p99 /
max ns). Worker overhead: the same NFEs driven by a real `WorkerPool` through the real C core
(dispatch, step after every NFE, finish) against a bare `session.run` loop on the same model,
as `worker_throughput_ratio` (target >= 0.95): the median ratio over back-to-back pairs of
equal-length bare and worker runs, so a noisy neighbour hurts both sides of a pair alike; plus
`worker_cpu_ratio`, the same comparison in thread CPU time per NFE (immune to load).

The bundled two-phase package (policy_vision) gets the same two views per graph: raw
`session.run` cost of its prefix graph and of its step graph, and `vision_worker_vs_bare`, the
worker path against a bare loop for EACH graph, like for like, in many short back-to-back pairs
(bare: R requests' graph runs in the worker's order, per request one timed prefix run, then its N
step runs; worker: R requests of 1 NFE, then R of N NFE, through a real WorkerPool and the C
core, on the same inputs). Short pairs, because this host's speed changes from second to second
(the same loop runs 1.5-3x slower for a few seconds, then recovers): a pair must be over before
the host changes under it:

* prefix: the worker's own timing of its prefix passes in the pair (the pool's prefix ring,
  `WorkerPool.prefix_percentiles` p50: exactly what admission prices as prefix_ns; under the
  native loop fer_pass_run_done times the ONNX Runtime run in C, like the native loop's NFEs)
  against the per-call p50 of bare `session.run` on the prefix graph;
* step: the difference of the two worker runs over R (N - 1) NFE against the bare step loop's
  ns per run;
* `vision_per_request_overhead_ns`, reported apart and charged to no graph: the loop's fixed
  work per request (dispatch, noise draw, join, prefix_done, finish), a 1-NFE request's wall time
  less one step and one prefix pass.

Same target for both graphs, >= 0.95, printed and never asserted. The bare loop and the worker
run pinned to the same CPU for the comparison (`_one_cpu`). While the worker runs, the
bench's own thread sleeps (it polls for outcomes every POLL_S and takes the end time from the
last outcome's finish_ns): a thread the worker wakes per outcome is placed on the worker's CPU
and preempts the very passes being timed, which is how the prefix ratio read 0.4-0.6 before.

This is a measurement, not a test: numbers depend on the host, its load and thermal state.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from flowedge_relay import policy as P
from flowedge_relay.core import Code, Core, CoreConfig, Decision, Request
from flowedge_relay.model import (
    INPUT_OBS,
    INPUT_T,
    INPUT_X,
    OUTPUT_V,
    ModelInfo,
    default_model_path,
    load_model,
    make_session,
)
from flowedge_relay.workers import SlotInputs, WorkerPool
from flowedge_relay_tools.bench.progress import Progress
from flowedge_relay_tools.harness import scene_inputs, served_model
from flowedge_relay_tools.models import bench_model_path
from flowedge_relay_tools.models import detour_task as task

TARGET_RATIO = 0.95
THREADS = (1, 2)
SIZES = {  # (raw samples small, raw samples bench, requests per trial, nfe per request, pairs)
    "quick": (300, 100, 2, 25, 2),
    "full": (3000, 1000, 4, 50, 15),
}
VISION_MISSED = (
    "  (missed: compare the pair ratios in the JSON; one low pair among high ones is the host "
    "taking the worker's CPU during that pair, all low ones are the worker. The prefix pass is "
    "one native ONNX Runtime call timed in C (fer_pass_run_done); the bench's own thread polls "
    "for outcomes every POLL_S instead of waking per outcome, so it does not preempt the worker "
    "it measures)"
)
VISION_SIZES = {  # (raw samples per graph, requests per trial, nfe per long request, pairs)
    "quick": (200, 20, 10, 2),
    "full": (3000, 20, 20, 60),
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
    return _run_ns(make_session(info, threads), [OUTPUT_V], _feeds(info), samples)


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
    c0, t0 = pool.thread_cpu_ns()[0], time.monotonic_ns()
    end = submit_all_and_wait(core, b"bench-%d" % trial, nfe, [obs[i] for i in range(requests)])
    wall, cpu = end - t0, pool.thread_cpu_ns()[0] - c0
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
                     queue_capacity=max(64, requests), max_nfe=max(64, nfe),
                     ring_capacity=max(256, 2 * requests))  # fmt: skip
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


class _VisionFeeds:
    """The two graphs' feeds for one detour scene: the package's normalized inputs, the
    prefix's outputs as the step's context, a noise x and t = 0.5 (what a worker binds)."""

    def __init__(self, policy: P.Policy) -> None:
        buffers = P.InputBuffers(policy)
        P.fill_buffers(policy, buffers, scene_inputs(served_model(policy), 0))
        prefix, step = policy.graphs["prefix"], policy.graphs["step"]
        self.prefix = {name: buffers[name] for name in prefix.inputs}
        self.prefix_outputs = list(prefix.outputs)
        sess = P.make_session(prefix.data)
        context = dict(zip(self.prefix_outputs, sess.run(self.prefix_outputs, self.prefix),
                           strict=True))  # fmt: skip
        a = policy.action
        x = np.random.default_rng(0).standard_normal((1, a.horizon, a.dim), dtype=np.float32)
        t = np.full(policy.t_shape, 0.5, np.float32)
        flow = {policy.x_name: x, policy.t_name: t}
        self.step = {n: flow.get(n, context.get(n)) if n in flow or n in context else buffers[n]
                     for n in step.inputs}  # fmt: skip
        self.step_outputs = [policy.v_name]


def _run_ns(sess, outputs: list[str], feeds: dict, samples: int) -> dict[str, float]:
    """Per-call ns of `session.run` after a warm-up: p50 / p99 / max."""
    for _ in range(max(20, samples // 20)):
        sess.run(outputs, feeds)
    durations = np.empty(samples, np.int64)
    clock = time.perf_counter_ns
    for i in range(samples):
        t0 = clock()
        sess.run(outputs, feeds)
        durations[i] = clock() - t0
    p50, p99 = np.percentile(durations, [50, 99])
    return {"p50_ns": float(p50), "p99_ns": float(p99), "max_ns": float(durations.max()),
            "samples": samples}  # fmt: skip


def vision_graph_cost(policy: P.Policy, feeds: _VisionFeeds, threads: int,
                      samples: int) -> dict[str, dict]:  # fmt: skip
    """Raw `session.run` cost of the prefix graph and of the step graph, batch 1."""
    return {
        "prefix": _run_ns(P.make_session(policy.graphs["prefix"].data, threads),
                          feeds.prefix_outputs, feeds.prefix, samples),
        "step": _run_ns(P.make_session(policy.graphs["step"].data, threads),
                        feeds.step_outputs, feeds.step, samples),
    }  # fmt: skip


def _bare_two_phase(sessions: dict, feeds: _VisionFeeds, requests: int,
                    nfe: int) -> tuple[float, float]:  # fmt: skip
    """(per-call p50 ns of the prefix runs, ns per step run) of bare `session.run` on the two
    graphs, in the order a worker runs them: per request one prefix run (timed), then its `nfe`
    step runs (timed together). Like for like: the prefix graph runs after the step graph, as in
    the worker, not back to back with itself, hot (which, on this host, is up to 2x faster)."""
    clock = time.perf_counter_ns
    prefix = np.empty(requests, np.int64)
    steps = 0
    for i in range(requests):
        t0 = clock()
        sessions["prefix"].run(feeds.prefix_outputs, feeds.prefix)
        t1 = clock()
        for _ in range(nfe):
            sessions["step"].run(feeds.step_outputs, feeds.step)
        steps += clock() - t1
        prefix[i] = t1 - t0
    return float(np.median(prefix)), steps / (requests * nfe)


def _worker_wall_ns(core: Core, requests: int, nfe: int, trial: int) -> int:
    """Wall ns from the first submit to the last outcome of `requests` requests of `nfe` NFE
    whose inputs are already in every slot's payload."""
    t0 = time.monotonic_ns()
    return submit_all_and_wait(core, b"vision-%d-%d" % (trial, nfe), nfe,
                                [np.zeros(0, np.float32)] * requests) - t0  # fmt: skip


#: how often the bench's own thread looks for outcomes while the worker runs: it must not wake
#: per outcome (a thread woken by the worker is placed on the worker's CPU and preempts the very
#: work being measured); the end time is the last outcome's own finish_ns, so it costs no accuracy
POLL_S = 0.005


def submit_all_and_wait(core: Core, session_id: bytes, nfe: int,
                         observations: list[np.ndarray]) -> int:  # fmt: skip
    """Submit one request of `nfe` NFE per observation (no deadline), then wait until every one
    has been answered with actions; returns the last one's finish time (CLOCK_MONOTONIC ns)."""
    for i, observation in enumerate(observations):
        now = time.monotonic_ns()
        req = Request(
            session_id=session_id, sequence=i, generation=1, retry_count=0, retry_reason=0,
            origin_ns=now, deadline_ns=0, deadline_ros_ns=0, remaining_nfe=nfe, noise_seed=i,
            observation=observation,
        )  # fmt: skip
        if core.submit(req, now) != Decision.ACCEPTED:
            raise RuntimeError("bench request was not accepted")
    done, end = 0, 0
    while done < len(observations):
        time.sleep(POLL_S)
        for out in core.pop_outcomes():
            if out.code != Code.INFERENCE:
                raise RuntimeError(f"bench request ended {out.code.name}")
            done, end = done + 1, max(end, out.finish_ns)
    return end


@contextmanager
def pinned_to(cpu: int) -> Iterator[None]:
    """Pins the calling thread to `cpu` for the block, then gives it back its CPUs."""
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)


@contextmanager
def _one_cpu() -> Iterator[list[int]]:
    """Pins the calling thread to one CPU for the block and yields [that CPU] for the worker:
    the bare loop and the worker then run on the same core, so a pair compares code, not two
    cores (on this host one vCPU can run the same loop 2x slower than the other for seconds)."""
    cpu = max(os.sched_getaffinity(0))
    with pinned_to(cpu):
        yield [cpu]


def _median_kept(values) -> float | None:
    """Median of the values that are not NaN (pairs a stalled host spoiled); None if none."""
    a = np.asarray(values, float)
    a = a[~np.isnan(a)]
    return float(np.median(a)) if a.size else None


def vision_worker_vs_bare(policy: P.Policy, feeds: _VisionFeeds, requests: int, nfe: int,
                          pairs: int, bar: Progress) -> dict:  # fmt: skip
    """Worker path vs bare loop for each graph of a two-phase package, in back-to-back pairs
    (one thread each); per graph the median pair ratio bare ns / worker ns (>= 0.95 wanted).
    Prefix: the worker-timed passes of the pair (p50) vs bare per-call p50; step: per NFE from
    the worker's wall times vs the bare loop; the per-request fixed work apart (module doc)."""
    sessions = P.make_sessions(policy)
    _bare_two_phase(sessions, feeds, 5, 5)  # warm-up
    layout = P.payload_layout(policy)
    cfg = CoreConfig(workers=1, obs_dim=0, action_len=policy.action_len,
                     queue_capacity=max(64, requests), max_nfe=max(64, nfe),
                     ring_capacity=max(256, 2 * requests), two_phase=1,
                     payload_bytes=layout.nbytes)  # fmt: skip
    rows: dict[str, list[float]] = {k: [] for k in ("bare_prefix", "bare_step", "worker_prefix",
                                                    "worker_step", "overhead")}  # fmt: skip
    arrays = scene_inputs(served_model(policy), 0)
    with Core(cfg) as core:
        slots = SlotInputs(policy, core.payload_view)
        for slot in range(core.slots):  # every slot holds the scene: submits copy nothing
            P.fill_buffers(policy, slots[slot], arrays)
        with _one_cpu() as cpu, WorkerPool(core, policy, workers=1, slot_inputs=slots,
                                           cpu_affinity=cpu) as pool:  # fmt: skip
            _worker_wall_ns(core, 2, 2, trial=999)  # warm-up
            for k in range(pairs):
                bar.update(label=f"vision worker vs bare, pair {k + 1}/{pairs}")
                bare_p, bare_s = _bare_two_phase(sessions, feeds, requests, nfe)
                passes = pool.prefix_count()
                short = _worker_wall_ns(core, requests, 1, k)
                long = _worker_wall_ns(core, requests, nfe, k)
                # a long trial no slower than the short one means the host stalled the short
                # one: no step figure from that pair (NaN, left out of the median, counted)
                step = (long - short) / (requests * (nfe - 1)) if long > short else np.nan
                prefix = max(pool.prefix_percentiles(last=pool.prefix_count() - passes)[0], 1.0)
                rows["bare_prefix"].append(bare_p)
                rows["bare_step"].append(bare_s)
                rows["worker_step"].append(step)
                rows["worker_prefix"].append(prefix)
                rows["overhead"].append(short / requests - step - prefix
                                        if long > short else np.nan)  # fmt: skip
                bar.advance()
            nfe_p50, nfe_p99, _ = pool.nfe_percentiles()
            pre_p50, pre_p99, _ = pool.prefix_percentiles()
            prefix_loop = pool.worker_info()[0].get("nfe_loop", "")
    out: dict[str, object] = {"requests_per_trial": requests, "nfe_per_long_request": nfe,
                              "pairs": pairs, "nfe_loop": prefix_loop,
                              "per_request_overhead_ns": _median_kept(rows["overhead"]),
                              "per_request_overhead_pairs_ns": [
                                  round(float(o), 1) for o in rows["overhead"]
                                  if not np.isnan(o)]}  # fmt: skip
    for graph in ("prefix", "step"):
        bare, worker = np.asarray(rows[f"bare_{graph}"]), np.asarray(rows[f"worker_{graph}"])
        ratios = bare / worker
        kept = ~np.isnan(ratios)
        ratio = _median_kept(ratios)
        out[graph] = {
            "bare_ns": float(np.median(bare)),
            "worker_ns": _median_kept(worker),
            "pair_ratios": [round(float(r), 4) for r in ratios[kept]],
            "pairs_discarded": int((~kept).sum()),  # stalled host: long trial <= short one
            "ratio": ratio,
            "met": ratio is not None and ratio >= TARGET_RATIO,
        }
    out["worker_timed"] = {"prefix_p50_ns": pre_p50, "prefix_p99_ns": pre_p99,
                           "nfe_p50_ns": nfe_p50, "nfe_p99_ns": nfe_p99}  # fmt: skip
    return out


def vision_report(size: str, bar: Progress) -> dict:
    """The two-phase package's per-graph raw cost and worker-vs-bare ratios."""
    samples, requests, nfe, pairs = VISION_SIZES[size]
    policy = P.load(P.vision_policy_path())
    feeds = _VisionFeeds(policy)
    cost = {}
    for threads in THREADS:
        bar.update(label=f"raw prefix/step cost policy_vision intra_op_threads={threads}")
        cost[f"threads_{threads}"] = vision_graph_cost(policy, feeds, threads, samples)
        bar.advance()
    wvb = vision_worker_vs_bare(policy, feeds, requests, nfe, pairs, bar)
    rows = [
        {
            "graph": graph,
            "intra_op_threads": threads,
            "p50_us": round(cost[f"threads_{threads}"][graph]["p50_ns"] / 1e3, 1),
            "p99_us": round(cost[f"threads_{threads}"][graph]["p99_ns"] / 1e3, 1),
            "max_us": round(cost[f"threads_{threads}"][graph]["max_ns"] / 1e3, 1),
        }
        for graph in ("prefix", "step")
        for threads in THREADS
    ]
    return {"digest": policy.digest, "graph_cost": cost, "rows": rows, "worker_vs_bare": wvb}


def run(args: argparse.Namespace) -> dict:
    n_small, n_bench, requests, nfe, pairs = SIZES["quick" if args.quick else "full"]
    models = {"policy_small": load_model(default_model_path()),
              "policy_bench": load_model(bench_model_path())}  # fmt: skip
    cost: dict[str, dict] = {}
    size = "quick" if args.quick else "full"
    vision_steps = len(THREADS) + VISION_SIZES[size][3]
    with Progress("model", total=len(models) * len(THREADS) + pairs + vision_steps) as bar:
        for name, info in models.items():
            samples = n_small if name == "policy_small" else n_bench
            cost[name] = {"digest": info.digest}
            for threads in THREADS:
                bar.update(label=f"raw NFE cost {name} intra_op_threads={threads}")
                cost[name][f"threads_{threads}"] = raw_nfe_cost(info, threads, samples)
                bar.advance()
        info = models["policy_bench" if args.throughput_model == "bench" else "policy_small"]
        throughput = worker_throughput(info, requests, nfe, pairs, bar)
        vision = vision_report(size, bar)
    wvb = vision["worker_vs_bare"]
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
        "size": size,
        "nfe_cost": cost,
        "rows": rows,
        "worker_throughput": throughput,
        "worker_throughput_ratio": throughput["ratio"],
        "worker_cpu_ratio": throughput["cpu_ratio"],
        "worker_throughput_target": TARGET_RATIO,
        "vision": vision,
        "vision_prefix_worker_ratio": wvb["prefix"]["ratio"],
        "vision_step_worker_ratio": wvb["step"]["ratio"],
        "vision_per_request_overhead_ns": wvb["per_request_overhead_ns"],
        "targets": {
            "worker_throughput_ratio": {
                "target": TARGET_RATIO,
                "met": throughput["ratio"] >= TARGET_RATIO,
            },
            "vision_prefix_worker_ratio": {"target": TARGET_RATIO, "met": wvb["prefix"]["met"]},
            "vision_step_worker_ratio": {"target": TARGET_RATIO, "met": wvb["step"]["met"]},
        },
        "note": "raw session.run on batch 1; numbers depend on host load and thermal state",
    }


def table(report: dict) -> str:
    from flowedge_relay_tools.bench.tables import format_rows

    wt = report["worker_throughput"]
    v = report["vision"]
    vw = v["worker_vs_bare"]
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
        "policy_vision (two-phase): raw onnxruntime cost per graph (session.run, batch 1)",
        format_rows(v["rows"]),
        f"worker path vs bare session.run per graph ({vw['pairs']} pairs of "
        f"{vw['requests_per_trial']} requests of 1 and of {vw['nfe_per_long_request']} NFE, "
        f"{vw['nfe_loop']} loop; prefix: worker-timed passes p50 vs bare per-call p50; step: "
        "per NFE from wall times vs the bare loop):",
        *(f"  {g:<6} worker {_us(vw[g]['worker_ns'])} us, bare {_us(vw[g]['bare_ns'])} us per "
          f"run ({vw[g].get('pairs_discarded', 0)} pairs left out: long trial no slower than "
          "short)" for g in ("prefix", "step")),
        f"  the worker's own timing over all pairs: prefix pass p50 "
        f"{vw['worker_timed']['prefix_p50_ns'] / 1e3:.1f} us, nfe() p50 "
        f"{vw['worker_timed']['nfe_p50_ns'] / 1e3:.1f} us",
        f"  vision_per_request_overhead_ns {_us(report['vision_per_request_overhead_ns'])} "
        "us (the loop's fixed work per request: dispatch, noise draw, join, prefix_done, finish; "
        "a 1-NFE request's wall time less one step and one prefix pass; charged to no graph)",
        "target (printed, not asserted):",
        f"  worker_throughput_ratio {report['worker_throughput_ratio']:.3f} (median pair ratio; "
        f"target >= {TARGET_RATIO}) {met}",
        *(f"  vision_{g}_worker_ratio {_ratio(vw[g]['ratio'])} (median pair ratio; target >= "
          f"{TARGET_RATIO}) {'met' if vw[g]['met'] else 'MISSED'}" for g in ("prefix", "step")),
        *([VISION_MISSED] if not (vw["prefix"]["met"] and vw["step"]["met"]) else []),
    ])  # fmt: skip


def _us(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e3:.1f}"


def _ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.3f}"


def plot(report: dict, path: str) -> str:
    from flowedge_relay_tools.bench import plots

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
