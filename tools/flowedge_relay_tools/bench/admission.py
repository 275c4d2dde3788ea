# SPDX-License-Identifier: Apache-2.0
"""`bench admission`: latency of one admission decision of the C core, in C alone and via CFFI.

    python -m flowedge_relay_tools.bench admission [--quick] [--json PATH] [--plot PATH.png]

For each queue depth (16, 64, 256, 1024) and worker count W (1, 2, 4) the same workload is run
twice:

- C alone: `fer_bench_admission` (tools/csrc/fer_bench.c) builds a core and times each
  `fer_core_submit` with CLOCK_MONOTONIC in C, so no Python is involved; once more with the
  fair share on (docs/design.md §7.1; every session its own client, all tracked), side by side:
  three rounds of each, interleaved, each side's quietest round (lowest p99) reported;
- through CFFI: the same workload through `flowedge_relay.core.Core.submit` (the wrapper the node
  calls: struct fill, observation copy, the C call with the GIL released, the Decision), timed
  with `time.perf_counter_ns` around each call, garbage collector paused.

Workload (identical in shape in both): nfe_ns = 1 us, every lane busy with 8 NFE, `depth`
queued requests of 1-8 NFE with feasible, distinct, finite deadlines, and each sample an
*admissible* request placed at a random EDF position, a new generation of its session (so it
also prunes the previous sample). That is the expensive path: the whole lane simulation runs.

A measurement, not a test: the host's load shows in the tails. The targets (C p99 <= 2 us at
depth 64 / W = 2; CFFI p99 <= 50 us at depth 1024; C p99 with the fair share on <= 1.2 x off at
every point) are printed, not asserted.
"""

from __future__ import annotations

import gc
import random
import time

import numpy as np

from flowedge_relay.core import AgeGate, Core, CoreConfig, Decision, Request
from flowedge_relay_tools.bench.tables import format_rows
from flowedge_relay_tools.native import check, ffi, lib

DEPTHS = (16, 64, 256, 1024)
WORKERS = (1, 2, 4)
NFE_NS = 1_000
NOW = 1_000_000_000_000
TARGETS = {"c_p99_ns_depth64_w2": 2_000, "cffi_p99_ns_depth1024": 50_000,
           "c_fair_p99_vs_off_max": 1.2}


def add_arguments(parser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="tiny size for CI: depths 16 and 64, W 1 and 2, few samples")
    parser.add_argument("--depths", type=lambda s: [int(x) for x in s.split(",")],
                        help="comma-separated queue depths (default 16,64,256,1024)")
    parser.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")],
                        help="comma-separated worker counts (default 1,2,4)")
    parser.add_argument("--samples", type=int, help="timed decisions per point in C "
                        "(default 20000; quick 400)")
    parser.add_argument("--cffi-samples", type=int, help="timed decisions per point via CFFI "
                        "(default 5000; quick 200)")
    parser.add_argument("--seed", type=int, default=1)


def _percentiles(lat: np.ndarray) -> dict:
    # method="higher": a reported percentile is always an observed sample, never interpolated.
    p50, p99, p999 = np.percentile(lat, [50, 99, 99.9], method="higher")
    return {"p50_ns": int(p50), "p99_ns": int(p99), "p999_ns": int(p999), "max_ns": int(lat.max())}


def measure_c(depth: int, workers: int, samples: int, seed: int, fair_share: bool = False) -> dict:
    warmup = max(50, samples // 10)
    lat = np.zeros(samples + warmup, dtype=np.uint64)
    check(lib.fer_bench_admission(depth, workers, samples + warmup, seed, int(fair_share),
                                  ffi.cast("uint64_t *", lat.ctypes.data)))
    return _percentiles(lat[warmup:])


ROUNDS = 3  # fair share off / on, interleaved; each keeps its round with the lowest p99


def measure_c_side_by_side(depth: int, workers: int, samples: int, seed: int) -> tuple[dict, dict]:
    """C alone with the fair share off and on (docs/design.md §7.1), ROUNDS rounds interleaved
    (off, on, off, on, ...) so a noisy neighbour hits both alike; each side keeps its quietest
    round (lowest p99): a busy host only ever adds to a latency."""
    off, on = [], []
    for _ in range(ROUNDS):
        off.append(measure_c(depth, workers, samples, seed))
        on.append(measure_c(depth, workers, samples, seed, fair_share=True))
    return min(off, key=lambda r: r["p99_ns"]), min(on, key=lambda r: r["p99_ns"])


def measure_cffi(depth: int, workers: int, samples: int, seed: int) -> dict:
    rng = random.Random(seed)
    obs = np.zeros(4, np.float32)
    cfg = CoreConfig(workers=workers, queue_capacity=depth + 1, max_sessions=depth + workers + 1,
                     max_nfe=64, obs_dim=4, action_len=0, ring_capacity=64, nfe_ns=NFE_NS,
                     age_gate=AgeGate.RETRIES)

    def request(sid: bytes, seq: int, gen: int, nfe: int, deadline: int) -> Request:
        return Request(session_id=sid, sequence=seq, generation=gen, retry_count=0,
                       retry_reason=0, origin_ns=NOW, deadline_ns=deadline, deadline_ros_ns=0,
                       remaining_nfe=nfe, noise_seed=0, observation=obs)

    warmup = max(50, samples // 10)
    lat = np.zeros(samples + warmup, dtype=np.uint64)
    with Core(cfg) as core:
        for lane in range(workers):
            assert core.submit(request(b"run-%d" % lane, 0, 0, 8, NOW + 500_000),
                               NOW) == Decision.ACCEPTED
            assert core.dispatch(lane, NOW) is not None
        for i in range(depth):
            assert core.submit(request(b"q-%d" % i, 0, 0, rng.randint(1, 8),
                                       NOW + 1_000_000 + i * 10_000), NOW) == Decision.ACCEPTED
        # The request objects are built before timing: the node builds its Request anyway.
        xs = [request(b"x-0", i, i + 1, rng.randint(1, 8),
                      NOW + 1_000_000 + rng.randint(0, depth) * 10_000 + 5_000)
              for i in range(samples + warmup)]
        clock = time.perf_counter_ns
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            for i, x in enumerate(xs):
                t0 = clock()
                d = core.submit(x, NOW)
                t1 = clock()
                if d != Decision.ACCEPTED:
                    raise RuntimeError(f"workload broken: sample {i} got {d!r}")
                lat[i] = t1 - t0
                core.pop_outcomes(8)  # untimed: the previous x's REJECTED_STALE
        finally:
            if gc_was_enabled:
                gc.enable()
    return _percentiles(lat[warmup:])


def run(args) -> dict:
    quick = args.quick
    depths = args.depths or ([16, 64] if quick else list(DEPTHS))
    workers = args.workers or ([1, 2] if quick else list(WORKERS))
    c_samples = args.samples or (400 if quick else 20_000)
    cffi_samples = args.cffi_samples or (200 if quick else 5_000)
    try:
        from flowedge_relay_tools.bench.host import host_info

        host = host_info()
    except Exception:  # noqa: BLE001 - host facts are a nicety, never a reason to fail
        host = None
    results = []
    for depth in depths:
        for w in workers:
            c, fair = measure_c_side_by_side(depth, w, c_samples, args.seed)
            f = measure_cffi(depth, w, cffi_samples, args.seed)
            results.append({
                "depth": depth, "workers": w,
                "c_p50_ns": c["p50_ns"], "c_p99_ns": c["p99_ns"], "c_p999_ns": c["p999_ns"],
                "c_max_ns": c["max_ns"], "c_samples": c_samples,
                "c_fair_p50_ns": fair["p50_ns"], "c_fair_p99_ns": fair["p99_ns"],
                "c_fair_p999_ns": fair["p999_ns"], "c_fair_max_ns": fair["max_ns"],
                "cffi_p50_ns": f["p50_ns"], "cffi_p99_ns": f["p99_ns"],
                "cffi_p999_ns": f["p999_ns"], "cffi_max_ns": f["max_ns"],
                "cffi_samples": cffi_samples,
            })

    def find(depth, w=None):
        return [r for r in results if r["depth"] == depth and (w is None or r["workers"] == w)]

    c64 = find(64, 2)
    f1024 = find(1024)
    targets = {
        "c_p99_ns_depth64_w2": {
            "target": TARGETS["c_p99_ns_depth64_w2"],
            "measured": c64[0]["c_p99_ns"] if c64 else None,
            "met": (c64[0]["c_p99_ns"] <= TARGETS["c_p99_ns_depth64_w2"]) if c64 else None,
        },
        # docs/design.md §7.1: the fair share costs the C decision at most 20% at p99
        "c_fair_p99_vs_off_max": {
            "target": TARGETS["c_fair_p99_vs_off_max"],
            "measured": max(r["c_fair_p99_ns"] / r["c_p99_ns"] for r in results),
            "met": all(r["c_fair_p99_ns"] <= TARGETS["c_fair_p99_vs_off_max"] * r["c_p99_ns"]
                       for r in results),
        },
        "cffi_p99_ns_depth1024": {
            "target": TARGETS["cffi_p99_ns_depth1024"],
            "measured": max(r["cffi_p99_ns"] for r in f1024) if f1024 else None,
            "met": all(r["cffi_p99_ns"] <= TARGETS["cffi_p99_ns_depth1024"] for r in f1024)
            if f1024 else None,
        },
    }
    rows = [{"depth": r["depth"], "W": r["workers"],
             "C p50 ns": r["c_p50_ns"], "C p99 ns": r["c_p99_ns"], "C p99.9 ns": r["c_p999_ns"],
             "C fair_share p99 ns": r["c_fair_p99_ns"],
             "fair/off p99": f"{r['c_fair_p99_ns'] / r['c_p99_ns']:.2f}x",
             "CFFI p50 ns": r["cffi_p50_ns"], "CFFI p99 ns": r["cffi_p99_ns"],
             "CFFI p99.9 ns": r["cffi_p999_ns"]} for r in results]
    return {
        "size": "quick" if quick else "full",
        "method": ("one admissible fer_core_submit per sample (full lane simulation, prunes the "
                   "previous sample), every lane busy, nfe_ns 1 us; C alone timed in C "
                   "(CLOCK_MONOTONIC), CFFI timed around Core.submit (perf_counter_ns, GC "
                   "paused); first 10% of samples discarded as warm-up"),
        "caveat": "a measurement on a shared host: tails include whatever else ran",
        "host": host,
        "seed": args.seed,
        "nfe_ns": NFE_NS,
        "results": results,
        "rows": rows,
        "targets": targets,
    }


def table(report: dict) -> str:
    lines = [format_rows(report["rows"]), ""]
    for name, t in report["targets"].items():
        met = {True: "met", False: "MISSED", None: "not measured at this size"}[t["met"]]
        unit = "x" if "_vs_" in name else " ns"  # a ratio, or a latency
        measured = "-" if t["measured"] is None else (
            f"{t['measured']:.2f}{unit}" if unit == "x" else f"{t['measured']}{unit}")
        lines.append(f"{name}: target <= {t['target']}{unit}, measured {measured}: {met}")
    return "\n".join(lines)


def plot(report: dict, path: str) -> str:
    from flowedge_relay_tools.bench import plots

    fig, ax = plots.subplots()
    for w in sorted({r["workers"] for r in report["results"]}):
        rs = [r for r in report["results"] if r["workers"] == w]
        depths = [r["depth"] for r in rs]
        ax.plot(depths, [r["c_p99_ns"] / 1e3 for r in rs], marker="o", label=f"C alone, W={w}")
        ax.plot(depths, [r["cffi_p99_ns"] / 1e3 for r in rs], marker="s", linestyle="--",
                label=f"via CFFI, W={w}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("queue depth")
    ax.set_ylabel("admission decision p99 (us)")
    ax.legend(fontsize=7)
    return plots.save(fig, path, title="C core admission latency",
                      note=f"{report['size']} size; shared host")
