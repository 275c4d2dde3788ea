# SPDX-License-Identifier: Apache-2.0
"""`bench batching`: what batch slots (docs/design.md §5.1) buy, measured through the relay.

For each bundled model (small, bench) one relay per `batch_slots` B (1, 2, 4, 8, 16) runs as its
own `flowedge-relayd` process, all of them at once under /b1, /b2, ... and warmed up; then
`--rounds` rounds give each B in turn `--seconds` / rounds of saturation (calibrate's `saturate`:
2 W B + 2 no-deadline requests of `--nfe` NFE outstanding, so every slot is always taken), the
order reversed every other round. Rates come from the relay's nfe_total counter over its own
flowedge/stats stamps, step figures from its last snapshot; a point is the median over its
segments and its ratios to B = 1 the medians of the ratios within a round, so each B is compared
with B = 1 at the same moment of a host whose speed drifts over seconds, and every relay's
workers run on the same CPU (`worker_cpu_affinity`, the last allowed one), so on the same vCPU.
(`--in-process`: one relay at a time in the bench process, each point measured once, as before.)
Per point:

  nfe_per_s       NFE the relay computed per second while saturated (its nfe_total counter)
  step_ns_p99     p99 cost of one batched step over the recent steps (the relay's worker
                  figure: a step's duration, each row's NFE cost; at B = 1 one NFE), read
                  when the sending stops, while every slot is still busy (read after the drain,
                  the ring held the drain's ever fewer rows)

Requests are long so the figure is compute capacity, not the per-request path: each request also
costs the relay its intake, decision and publication and the bench client its send and receive
(together about 1 ms of CPU per request on the 2-core development host). The NFE per request is
per model (`NFE_PER_REQUEST`, `--nfe` sets one value for all; the JSON records what ran, and
why): policy_bench 64 (its steps cost hundreds of us, a few hundred requests/s at most);
policy_small 4096 (the most `max_nfe` allows), since with the native loop its B = 8 point
measured the request rate rather than compute at 64 NFE (about 900 requests/s, 58k NFE/s) and
still partly at 1024 (about 200 requests/s, 190-200k NFE/s); 4096: 223k, against 238k for the
worker loop alone (same host, same hour).
  speedup_vs_b1   nfe_per_s / nfe_per_s at B = 1 for the same model
  step_ns_p50     median cost of one batched step (B rows) while saturated
  step_ceiling_vs_b1  B x step_ns_p50 at B = 1 / step_ns_p50 at B: the speedup the model's own
                  batched call allows (each row's NFE in a B-row step against B one-row steps),
                  whatever the relay does around it. On this host (AVX2) ONNX Runtime's GEMM
                  takes policy_small's rows six at a time: 7 rows cost about as much as 12, so
                  an 8-row call costs two row blocks and B x the one-row call / the B-row call
                  is about 4 at B = 8 (model_call_ns_by_rows shows the steps); the native loop
                  made the one-row step nearly the bare call, so the relay's B = 8 speedup sits
                  at that ceiling, not above it.
  alone_nfe_per_s, alone_speedup_vs_b1
                  the same for the relay's worker code alone (WorkerAlone: a C core and a
                  WorkerPool in the bench process, fed through Core.submit, no relay process,
                  no DDS), one segment right after each relay segment, on the same CPU: what
                  batch slots buy the worker itself, so the relay's speedup can be read against
                  it (the relay adds work per request, not per step). Relays side by side only.
  model_call_ns, model_speedup_vs_b1
                  the model's own call alone (ModelAlone: the worker's ONNX Runtime Run over B
                  rows back to back, nothing around it), one short segment right after each
                  worker-alone segment on the same CPU: its median ns and B x (one-row call) /
                  (B-row call), the ceiling of any batching around this call on this host.
                  Relays side by side only; `model_call_ns_by_rows` (top level, per model) is
                  the same call at every row count 1..16 after the rounds, and
                  `model_call_vs_one_row_by_rows` each one against a one-row call just before.

Under the targets the table prints, per model, what its B = 8 target asks of a step
(`row_cost_notes`): k x at B = 8 needs each of the 7 added rows within (8/k - 1) one-row steps,
next to what an added row cost at B = 8 and at the largest B.

Then the overload bench's trace (bench/overload.py, reused as is) at 2x capacity, calibrated EDF
admission and the adaptive cost model side by side, with B = 8 next to B = 1 (`--overload-slots`),
each with its own inline calibration: capacity at B > 1 counts W x B lanes at the saturated cost
per lane NFE. `overload.<B>.<load>` has the overload bench's per-load keys for edf_admission;
`overload_by_policy.<policy>.<B>.<load>` the same for every policy run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time

import numpy as np

from flowedge_relay import native
from flowedge_relay.core import Core, CoreConfig
from flowedge_relay.model import load_model
from flowedge_relay.workers import WorkerPool
from flowedge_relay_tools.bench import overload, targets
from flowedge_relay_tools.bench.client import (
    model_path,
    relay_for_bench,
    remote_relay,
    saturate,
    wait_idle,
    warm_up,
)
from flowedge_relay_tools.bench.host import host_info
from flowedge_relay_tools.bench.model import pinned_to, submit_all_and_wait
from flowedge_relay_tools.bench.progress import Progress
from flowedge_relay_tools.bench.tables import VERDICT, format_rows, percent, target_met

MODELS = ("small", "bench")
SLOTS = (1, 2, 4, 8, 16)
TARGETS = targets.BATCHING_SPEEDUP  # capacity at B = 8 vs B = 1 (printed only)
OVERLOAD_POLICIES = ("edf_admission", "edf_adaptive")  # the overload runs, side by side
#: NFE per saturating request by model (other models: DEFAULT_NFE); see the module docstring
NFE_PER_REQUEST = {"small": 4096, "bench": 64}
DEFAULT_NFE = 64
NFE_WHY = ("long requests so capacity is NFE-bound, not request-bound (the per-request path, "
           "about 1 ms of CPU per request with the client on this host, caps requests/s): "
           "policy_small at B = 8 measured the request rate at 64 NFE and partly at 1024")
RAMP_NS = 100_000_000  # a segment's first 100 ms (the slots filling) are not measured
STATS_GRACE_NS = 50_000_000  # flowedge/stats snapshots up to 50 ms after the sending stops:
                             # the queued requests keep every slot busy past that
ALONE_QUEUE = 256  # the worker-alone core's queue and rings: every wave submitted at once
ALONE_SHARE = 0.5  # a worker-alone segment lasts about this share of a relay segment
MODEL_SHARE = 0.25  # a model-call segment lasts about this share of a relay segment
MODEL_ROWS = 16  # the model call's cost by rows is measured at every row count 1..16
# saturated seconds per point, overload seconds of trace
SIZES = {"quick": (0.5, 0.4), "full": (5.0, 8.0)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="tiny size (CI smoke)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), help="small, bench or paths")
    parser.add_argument("--slots", type=int, nargs="+", default=list(SLOTS),
                        help="batch_slots values to measure (1 is always added)")
    parser.add_argument("--workers", type=int, default=1, help="relay worker threads")
    parser.add_argument("--nfe", type=int, default=None,
                        help="NFE per saturating request for every model (default: per model, "
                             "NFE_PER_REQUEST: capacity in NFE/s, not the per-request path)")
    parser.add_argument("--seconds", type=float, help="saturated seconds per point")
    parser.add_argument("--rounds", type=int, default=5,
                        help="rounds the saturated seconds are cut into, every B in each "
                             "(relays side by side; not with --in-process)")
    parser.add_argument("--overload-model", default="bench", help="model of the overload runs")
    parser.add_argument("--overload-slots", type=int, nargs="*", default=[1, 8],
                        help="batch_slots of the overload runs (none: skip them)")
    parser.add_argument("--overload-load", type=float, default=2.0)
    parser.add_argument("--overload-policies", nargs="+", default=list(OVERLOAD_POLICIES),
                        choices=OVERLOAD_POLICIES, help="EDF policies of the overload runs")
    parser.add_argument("--duration", type=float, help="overload seconds of trace")
    parser.add_argument("--in-process", action="store_true",
                        help="run the relay inside the bench process instead of its own process")


def capacity_point(in_process: bool, model: str, slots: int, workers: int, nfe: int,
                   seconds: float) -> dict:
    """One saturated point: a fresh relay with batch_slots = slots, NFE per second and the p99
    step cost."""
    path = model_path(model)
    lanes = workers * slots
    with relay_for_bench(in_process, model_path=path, workers=workers, batch_slots=slots,
                         queue_capacity=max(64, 4 * lanes), max_nfe=max(64, nfe)) as (relay,
                                                                                     client):
        warm_up(client)
        saturate(client, lanes, nfe, min(seconds, 0.3), "bench-batching-warm")
        wait_idle(relay)
        before, t0 = relay.stats(), time.monotonic_ns()
        steps: list[tuple[float, float, int]] = []  # the step ring while every slot is busy
        answers = saturate(client, lanes, nfe, seconds, "bench-batching",
                           at_end=lambda: steps.append(relay.nfe_percentiles()))
        after, t1 = relay.stats(), time.monotonic_ns()
        step_p50, step_p99, _ = steps[0]
    elapsed = (t1 - t0) * 1e-9
    nfe_done = after.nfe_total - before.nfe_total
    return {
        "model": path.rsplit("/", 1)[-1],
        "batch_slots": slots,
        "workers": workers,
        "nfe_per_request": nfe,
        "nfe_per_s": nfe_done / elapsed if elapsed > 0 else 0.0,
        "step_ns_p50": float(step_p50),
        "step_ns_p99": float(step_p99),
        "requests": len(answers),
        "seconds": elapsed,
    }


class WorkerAlone:
    """The relay's worker code alone at one batch_slots: a C core and a WorkerPool in the bench
    process (the native loop where it runs, as in the relay), fed through Core.submit, with no
    relay process around it: no DDS, request thread, publisher or stats timer. Its speedup is
    what batch slots buy the worker itself, so the relay's own speedup can be read against it
    (the relay adds work per request, not per step; with long requests the two should agree).

    A segment submits `waves` x W x B requests of `nfe` NFE at once (no deadline) and times
    them from the first submit to the last finish: every slot stays taken until the last wave
    ends together. `size(seconds)` picks waves so that a segment lasts about `seconds`."""

    def __init__(self, stack: contextlib.ExitStack, path: str, slots: int, workers: int,
                 nfe: int, cpu: int) -> None:
        info = load_model(path)
        self.lanes, self.nfe, self.waves, self._trial = workers * slots, nfe, 1, 0
        self._obs = np.zeros(info.obs_dim, np.float32)
        self.core = stack.enter_context(Core(CoreConfig(
            workers=workers, batch_slots=slots, obs_dim=info.obs_dim,
            action_len=info.action_len, queue_capacity=ALONE_QUEUE, max_nfe=max(64, nfe),
            ring_capacity=ALONE_QUEUE)))  # fmt: skip
        stack.enter_context(WorkerPool(self.core, info, workers=workers, cpu_affinity=[cpu]))

    def size(self, seconds: float) -> None:
        """Time one wave (also the warm-up), then choose the waves of a `seconds` segment."""
        wave_s = self.lanes * self.nfe / self.segment()
        self.waves = int(np.clip(round(seconds / wave_s), 1, ALONE_QUEUE // self.lanes))

    def segment(self) -> float:
        """NFE per second of one segment."""
        self._trial += 1
        n = self.waves * self.lanes
        t0 = time.monotonic_ns()
        end = submit_all_and_wait(self.core, b"alone-%d" % self._trial, self.nfe,
                                  [self._obs] * n)
        return n * self.nfe / ((end - t0) * 1e-9)


class ModelAlone:
    """The model's own batched call with nothing around it: a fer_exec made as the worker makes
    its own (same session options, same OrtValues), its ONNX Runtime Run timed back to back over
    n rows (native.NativeLoop.time_runs: no solver update, no core, the GIL released), on the
    relays' CPU. B x (one-row call) / (B-row call) is then the most any step-level batching
    around this call can buy, whatever the relay does: the relay's speedup is read against it."""

    def __init__(self, stack: contextlib.ExitStack, path: str, max_rows: int, cpu: int) -> None:
        info = load_model(path)
        spec = native.step_spec(info)
        bufs = native.RowBuffers.zeros(spec, max_rows)
        rng = np.random.default_rng(12)  # inputs as a request's: x noise, t in [0, 1), obs
        bufs.x[...] = rng.standard_normal(bufs.x.shape, np.float32)
        bufs.t[...] = rng.random(bufs.t.shape, np.float32)
        for arr in bufs.statics.values():
            if arr.dtype == np.float32:
                arr[...] = rng.standard_normal(arr.shape, np.float32)
        self.loop = native.NativeLoop(info.model_bytes, spec, 1, max_rows, buffers=bufs)
        stack.callback(self.loop.close)
        self.cpu, self.max_rows = cpu, max_rows
        self._per_call: dict[int, float] = {}  # rows -> last median ns, to size a segment

    def call_ns(self, rows: int, seconds: float) -> float:
        """Median ns of one call over `rows` rows, from about `seconds` of back-to-back calls
        made on the relays' CPU (the calling thread is pinned there for the segment)."""
        runs = int(np.clip(seconds * 1e9 / self._per_call.get(rows, 50_000.0), 50, 200_000))
        with pinned_to(self.cpu):
            ns = self.loop.time_runs(rows, runs)
        self._per_call[rows] = float(np.median(ns))
        return self._per_call[rows]

    def by_rows(self, rounds: int, seconds: float) -> dict[str, dict[str, float]]:
        """Every row count n in 1..max_rows, `rounds` rounds (the order reversed every other
        round), each n timed for `seconds` right after a one-row segment of the same length, so
        the pair sees one host speed: {"ns": n -> median over the rounds of the n-row call's
        median ns, "vs_one_row": n -> median over the rounds of (n-row call / the one-row call
        of its pair)}. The step shape of ONNX Runtime's batched call (its GEMM kernel takes rows
        a block at a time, so cost rises in steps, not per row) shows in both."""
        rows = list(range(1, self.max_rows + 1))
        got: dict[int, list[float]] = {n: [] for n in rows}
        ratio: dict[int, list[float]] = {n: [] for n in rows}
        for r in range(rounds):
            for n in rows if r % 2 == 0 else rows[::-1]:
                one = self.call_ns(1, seconds)
                got[n].append(self.call_ns(n, seconds))
                ratio[n].append(got[n][-1] / one)
        return {"ns": {str(n): float(np.median(v)) for n, v in got.items()},
                "vs_one_row": {str(n): float(np.median(v)) for n, v in ratio.items()}}


def capacity_rounds(model: str, slots: list[int], workers: int, nfe: int, seconds: float,
                    rounds: int, bar: Progress | None = None) -> tuple[list[dict], dict]:
    """Every `slots` point of one model side by side: one relay process per B, all started
    first (under /b1, /b2, ...), then `rounds` rounds of seconds / rounds of saturation each,
    B by B (the order reversed every other round). A point's figures are medians over its
    segments, and speedup_vs_b1 / step_ceiling_vs_b1 are medians of the ratios within a round:
    the host's speed drifts by 1.5-3x over seconds, and one point measured after another saw
    another host (the step ceiling of B = 2 once came out 1.2). Right after each relay segment
    the same B's WorkerAlone runs one segment on the same CPU (alone_*: its medians and
    per-round ratios the same way), then the model's own call over B rows (ModelAlone: model_*,
    the same way). Returns the points and the model call by row count (ModelAlone.by_rows, after
    the rounds)."""
    path = model_path(model)
    seg = seconds / rounds
    # every relay's workers on the same CPU: one vCPU of this host can run the same loop 1.5x
    # slower than the other for seconds, and B = 1 on the slow one would flatter every ratio
    # (it did: B = 1's one-row step read 15.5 us in one run, 10.3 in the others)
    cpu = max(os.sched_getaffinity(0))
    with contextlib.ExitStack() as stack:
        relays, alone = {}, {}
        for b in slots:
            if bar:
                bar.update(label=f"{model}: starting the relay with batch_slots={b}")
            relay, client = stack.enter_context(remote_relay(
                namespace=f"/b{b}", model_path=path, workers=workers, batch_slots=b,
                queue_capacity=max(64, 4 * workers * b), max_nfe=max(64, nfe),
                worker_cpu_affinity=[cpu]))
            warm_up(client)
            saturate(client, workers * b, nfe, min(seg, 0.3), "bench-batching-warm")
            relays[b] = (relay, client)
            alone[b] = WorkerAlone(stack, path, b, workers, nfe, cpu)
            alone[b].size(seg * ALONE_SHARE)
        model_alone = ModelAlone(stack, path, max(MODEL_ROWS, *slots), cpu)
        segs: dict[int, list[tuple[float, float, float, int]]] = {b: [] for b in slots}
        alone_rates: dict[int, list[float]] = {b: [] for b in slots}
        model_ns: dict[int, list[float]] = {b: [] for b in slots}
        for r in range(rounds):
            for b in slots if r % 2 == 0 else slots[::-1]:
                relay, client = relays[b]
                wait_idle(relay)
                ends: list[int] = []
                start = time.time_ns() + RAMP_NS
                answers = saturate(client, workers * b, nfe, seg, "bench-batching",
                                   at_end=lambda e=ends: e.append(time.time_ns()))  # fmt: skip
                work = relay.work_between(start, ends[0] + STATS_GRACE_NS)
                if work is None:
                    raise RuntimeError(f"batch_slots={b}: no stats from the relay in a segment")
                segs[b].append((*work, len(answers)))
                alone_rates[b].append(alone[b].segment())  # the same worker code, no relay
                model_ns[b].append(model_alone.call_ns(b, seg * MODEL_SHARE))  # the call alone
                if bar:
                    bar.advance(1 / rounds, label=f"{model} batch_slots={b} round {r + 1}")
        if bar:
            bar.update(label=f"{model}: the model call alone at 1..{model_alone.max_rows} rows")
        by_rows = model_alone.by_rows(rounds, seg * MODEL_SHARE / 8)
    med = lambda v: float(np.median(v))  # noqa: E731
    base, alone_base, model_base = segs[1], alone_rates[1], model_ns[1]
    return [{
        "model": path.rsplit("/", 1)[-1],
        "batch_slots": b,
        "workers": workers,
        "nfe_per_request": nfe,
        "nfe_per_s": med([x[0] for x in segs[b]]),
        "step_ns_p50": med([x[1] for x in segs[b]]),
        "step_ns_p99": med([x[2] for x in segs[b]]),
        "requests": int(sum(x[3] for x in segs[b])),
        "seconds": seconds,
        "rounds": rounds,
        "speedup_vs_b1": med([x[0] / y[0] for x, y in zip(segs[b], base, strict=True)]),
        "step_ceiling_vs_b1": med([b * y[1] / x[1] for x, y in zip(segs[b], base, strict=True)]),
        "nfe_per_s_by_round": [x[0] for x in segs[b]],
        "step_ns_p50_by_round": [x[1] for x in segs[b]],
        "alone_nfe_per_s": med(alone_rates[b]),
        "alone_speedup_vs_b1": med([x / y for x, y in zip(alone_rates[b], alone_base,
                                                          strict=True)]),
        "alone_nfe_per_s_by_round": alone_rates[b],
        "model_call_ns": med(model_ns[b]),
        "model_speedup_vs_b1": med([b * y / x for x, y in zip(model_ns[b], model_base,
                                                              strict=True)]),
        "model_call_ns_by_round": model_ns[b],
    } for b in slots], by_rows


def _overload_args(args: argparse.Namespace, slots: int) -> argparse.Namespace:
    """The overload bench's own arguments (its defaults) for one point: one load, the EDF
    policies (static calibrated admission and the adaptive cost model), this batch_slots."""
    parser = argparse.ArgumentParser()
    overload.add_arguments(parser)
    ns = parser.parse_args([])
    ns.quick, ns.model, ns.workers, ns.batch_slots = args.quick, args.overload_model, \
        args.workers, slots
    ns.loads, ns.policies, ns.in_process = [args.overload_load], list(args.overload_policies), \
        args.in_process
    ns.duration = args.duration
    ns.queue_capacity = max(ns.queue_capacity, 4 * args.workers * slots)
    return ns


def run(args: argparse.Namespace) -> dict:
    host = host_info()
    seconds, _ = SIZES["quick" if args.quick else "full"]
    seconds = args.seconds or seconds
    slots = sorted({1, *args.slots})
    points = len(args.models) * len(slots)
    results: list[dict] = []
    model_calls: dict[str, dict[str, float]] = {}
    model_ratios: dict[str, dict[str, float]] = {}
    nfe_of = {m: args.nfe or NFE_PER_REQUEST.get(m, DEFAULT_NFE) for m in args.models}
    with Progress("batching", points, unit=" points") as bar:
        for model in args.models:
            if not args.in_process:
                points, by_rows = capacity_rounds(model, slots, args.workers, nfe_of[model],
                                                  seconds, args.rounds, bar)  # fmt: skip
                results += points
                name = model_path(model).rsplit("/", 1)[-1]
                model_calls[name], model_ratios[name] = by_rows["ns"], by_rows["vs_one_row"]
                continue
            base, step1 = None, 0.0
            for b in slots:
                bar.update(label=f"{model} batch_slots={b}")
                p = capacity_point(args.in_process, model, b, args.workers, nfe_of[model],
                                   seconds)
                base = p["nfe_per_s"] if b == 1 else base
                p["speedup_vs_b1"] = p["nfe_per_s"] / base if base else None
                if b == 1:
                    step1 = p["step_ns_p50"]
                # what the model's own batched call allows: B one-row steps vs one B-row step
                p["step_ceiling_vs_b1"] = (b * step1 / p["step_ns_p50"]
                                           if p["step_ns_p50"] > 0 else None)
                results.append(p)
                bar.advance()
    by_policy: dict[str, dict[str, dict]] = {p: {} for p in args.overload_policies}
    load_key = f"{args.overload_load:.1f}"
    for b in args.overload_slots:
        rep = overload.run(_overload_args(args, b))
        for policy in args.overload_policies:
            point = dict(rep["policies"][policy][load_key])
            point.update(capacity_rps=rep["capacity_rps"], nfe_ns=rep["nfe_ns"],
                         admission_reserve_ns=rep["admission_reserve_ns"])
            by_policy[policy][str(b)] = {load_key: point}
    report = {
        "size": "quick" if args.quick else "full",
        "host": host,
        "workers": args.workers,
        "nfe_per_request": {model_path(m).rsplit("/", 1)[-1]: n for m, n in nfe_of.items()},
        "nfe_per_request_why": "--nfe" if args.nfe else NFE_WHY,
        "seconds_per_point": seconds,
        "relay": "in-process" if args.in_process else "flowedge-relayd process",
        "results": results,
        # ModelAlone.by_rows: the model's own call by row count, ns, and against the one-row call
        # timed just before it (relays side by side only)
        "model_call_ns_by_rows": model_calls,
        "model_call_vs_one_row_by_rows": model_ratios,
        # `overload`: calibrated edf_admission (the keys); every policy run is in
        # `overload_by_policy.<policy>.<B>.<load>`
        "overload": by_policy.get("edf_admission", {}),
        "overload_by_policy": by_policy,
        "overload_model": args.overload_model,
    }
    report["targets"] = targets_met(report)
    report["rows"] = _rows(report)
    return report


def _rows(report: dict) -> list[dict]:
    """The capacity table (also what docs/performance.md shows)."""
    return [{
        "model": r["model"], "B": r["batch_slots"], "nfe_per_s": round(r["nfe_per_s"]),
        "speedup_vs_b1": "-" if r["speedup_vs_b1"] is None else f"{r['speedup_vs_b1']:.2f}x",
        "step_p50_us": round(r.get("step_ns_p50", 0.0) / 1e3, 1),
        "step_p99_us": round(r["step_ns_p99"] / 1e3, 1),
        "step_ceiling": "-" if r.get("step_ceiling_vs_b1") is None
        else f"{r['step_ceiling_vs_b1']:.2f}x",
        "alone_speedup": "-" if r.get("alone_speedup_vs_b1") is None
        else f"{r['alone_speedup_vs_b1']:.2f}x",
        "model_alone": "-" if r.get("model_speedup_vs_b1") is None
        else f"{r['model_speedup_vs_b1']:.2f}x",
        "requests": r["requests"],
    } for r in report["results"]]  # fmt: skip


def targets_met(report: dict) -> dict:
    out = {}
    for model, bound in TARGETS.items():
        got = [r for r in report["results"]
               if r["model"].startswith(f"policy_{model}") and r["batch_slots"] == 8]
        if got:
            v = got[0]["speedup_vs_b1"]
            out[f"{model}.capacity_b8_vs_b1"] = {"target": f">= {bound:g}", "value": v,
                                                 "met": None if v is None else v >= bound,
                                                 "alone": got[0].get("alone_speedup_vs_b1"),
                                                 "model": got[0].get("model_speedup_vs_b1")}
    for policy, by_b in _by_policy(report).items():
        for b, by_load in by_b.items():
            for load, m in by_load.items():
                for metric, (op, bound) in overload.TARGETS.items():
                    if metric not in ("on_time_ratio_admitted", "goodput_vs_capacity"):
                        continue
                    v = m.get(metric)
                    out[f"{policy}.B{b}.{load}x.{metric}"] = {"target": f"{op} {bound:g}",
                                                              "value": v,
                                                              "met": target_met(v, op, bound)}
    return out


def _by_policy(report: dict) -> dict[str, dict]:
    """policy -> B -> load -> point (reports from before overload_by_policy: edf_admission)."""
    return report.get("overload_by_policy") or {"edf_admission": report["overload"]}


def _nfe_text(report: dict) -> str:
    return ", ".join(f"{m} {n}" for m, n in report["nfe_per_request"].items())


def table(report: dict) -> str:
    rows = _rows(report)
    lines = [
        f"batching: saturated capacity through the relay ({report['relay']}), "
        f"{report['workers']} worker(s), NFE per request {_nfe_text(report)}, "
        f"{report['seconds_per_point']:g} s per point",
        format_rows(rows),
    ]
    if report["overload"]:
        orow = []
        for policy, by_b in _by_policy(report).items():
            for b, by_load in by_b.items():
                for load, m in by_load.items():
                    orow.append({
                        "policy": policy, "B": b, "load": load,
                        "capacity_rps": round(m["capacity_rps"], 1),
                        "nfe_ns": m["nfe_ns"], "offered": m["offered"],
                        "on_time_admitted": percent(m["on_time_ratio_admitted"]),
                        "vs_capacity": percent(m["goodput_vs_capacity"]),
                        "wasted_nfe": percent(m["wasted_nfe_ratio"]),
                    })  # fmt: skip
        lines += [f"overload trace ({report['overload_model']}):",
                  format_rows(orow)]
    lines.append("targets (printed, not asserted):")
    for name, t in report["targets"].items():
        verdict = VERDICT[t["met"]]
        v = t["value"]
        value = "-" if v is None else (f"{v:.2f}x" if "capacity" in name and "b8" in name
                                       else f"{v:.4%}")
        alone = "" if t.get("alone") is None else f"; worker code alone {t['alone']:.2f}x"
        alone += "" if t.get("model") is None else f"; model call alone {t['model']:.2f}x"
        lines.append(f"  {name:<48} {value:>10} (target {t['target']}) {verdict}{alone}")
    lines += [f"  {m}: {note}" for m, note in row_cost_notes(report).items()]
    return "\n".join(lines)


def added_row_ns(report: dict, model: str) -> dict[int, list[float]]:
    """B -> what each row beyond the first added to a step's median, (p50 at B - p50 at B = 1)
    / (B - 1), per round (within a round the points ran seconds apart on one CPU; across rounds
    the host's speed drifts), or from the points' medians where the report has no rounds. Key 1
    holds the one-row step p50s themselves, round by round."""
    pts = {r["batch_slots"]: r.get("step_ns_p50_by_round") or [r.get("step_ns_p50") or 0.0]
           for r in report["results"] if r["model"] == model}
    one = pts.get(1)
    if not one or not all(one):
        return {}
    out = {1: list(one)}
    for b, p in sorted(pts.items()):
        if b > 1 and len(p) == len(one) and all(p):
            out[b] = [(x - y) / (b - 1) for x, y in zip(p, one, strict=True)]
    return out


def row_cost_notes(report: dict) -> dict[str, str]:
    """Per model with a B = 8 point and a target: what the target asks of a step. With every
    slot taken, capacity is B rows per step, so k x at B = 8 needs the B = 8 step within 8 / k
    one-row steps: each of the 7 added rows within (8 / k - 1) / 7 of the one-row step. Next to
    it what an added row cost at B = 8 and at the largest B measured (the model's batched call
    near its asymptotic rate per row): when the two agree, the B = 8 call wastes nothing a bigger
    batch would save, and the target is out of reach of anything around the call. Medians over
    the rounds of per-round figures."""
    def us(values: list[float]) -> float:
        return float(np.median(values)) / 1e3

    out = {}
    for model in dict.fromkeys(r["model"] for r in report["results"]):  # in report order
        want = next((v for k, v in TARGETS.items() if model.startswith(f"policy_{k}")), 0)
        added = added_row_ns(report, model)
        if not want or 8 not in added:
            continue
        top = max(added)
        allowed = [(8 / want - 1) * t / 7 for t in added[1]]
        out[model] = (
            f"{want:g}x at B = 8 needs each added row <= {us(allowed):.1f} us "
            f"((8/{want:g} - 1) / 7 of the one-row step p50, {us(added[1]):.1f} us); an added "
            f"row cost {us(added[8]):.1f} us at B = 8, {us(added[top]):.1f} us at B = {top}")
    return out


def plot(report: dict, path: str) -> str:
    from flowedge_relay_tools.bench import plots

    # the paired ratios where the report has them (else each row count's median over the
    # one-row median, which mixes host speeds)
    by_rows = report.get("model_call_vs_one_row_by_rows") or {
        m: {k: v / ns["1"] for k, v in ns.items()}
        for m, ns in (report.get("model_call_ns_by_rows") or {}).items()}
    fig, axes = plots.subplots(ncols=3 if by_rows else 2, width=4.6, height=3.8)
    ax_cap, ax_step = axes[0], axes[1]
    models = sorted({r["model"] for r in report["results"]})
    for model in models:
        pts = [r for r in report["results"] if r["model"] == model]
        xs = [r["batch_slots"] for r in pts]
        ax_cap.plot(xs, [r["nfe_per_s"] for r in pts], marker="o", label=model)
        ax_step.plot(xs, [r["step_ns_p99"] / 1e3 for r in pts], marker="o", label=model)
    ax_cap.set_ylabel("saturated capacity, NFE/s")
    ax_step.set_ylabel("p99 batched step, us")
    for ax in axes[:2]:
        ax.set_xlabel("batch_slots (B)")
        ax.set_xscale("log", base=2)
        ax.legend(fontsize=7)
    if by_rows:
        ax_rows = axes[2]
        for model in models:  # the same order, so the same colours, as the other panels
            ns = by_rows.get(model)
            if not ns:
                continue
            xs = sorted(int(k) for k in ns)
            ax_rows.plot(xs, [ns[str(x)] for x in xs], marker="o", label=model)
            ax_rows.set_xticks(xs[::2] if len(xs) > 8 else xs)
        xs = range(1, MODEL_ROWS + 1)
        ax_rows.plot(xs, [x / 4 for x in xs], linestyle=":", color="grey",
                     label="rows / 4 (4x the one-row rate)")
        ax_rows.set_xlabel("rows in one call")
        ax_rows.set_ylabel("model call alone, x the one-row call")
        ax_rows.legend(fontsize=7)
    return plots.save(
        fig, path,
        title=f"batching: capacity against batch_slots, {report['workers']} worker(s)",
        note=f"NFE per request {_nfe_text(report)}, {report['seconds_per_point']:g} s "
             f"saturated per point; relay: {report['relay']}",
    )  # fmt: skip
