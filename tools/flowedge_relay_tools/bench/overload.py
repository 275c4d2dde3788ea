# SPDX-License-Identifier: Apache-2.0
"""`bench overload`: does the relay keep its promises past capacity? Four policies, one trace.

The relay runs as deployed, as its own `flowedge-relayd` process (bench model, `--workers` lanes;
`--in-process` puts it in the bench process instead, sharing the client's GIL); a client node in
the bench process talks to it over DDS and reads its counters from flowedge/stats.
First a short inline calibration (`calibrate.inline`, same relay, same run) gives the mean and
the recommended `nfe_ns` / `admission_reserve_ns`; capacity (requests/s) = workers / (mean NFE of
the trace distribution x measured mean relay compute ns per NFE, plus the relay's median prefix
pass for a two-phase package, `--model vision`). Then the seeded trace
(`trace.py`) is replayed at 0.5, 1, 1.5, 2 and 3 x capacity for each policy, switching the policy
through the relay's live parameters, policies interleaved per load so a noisy neighbour hits them
alike:

  edf_admission   nfe_ns / admission_reserve_ns (and prefix_ns for a two-phase package) = the
                  inline recommendation (docs/design.md §5), cost_model static
  edf_adaptive    the same values, cost_model adaptive: admission uses max(nfe_ns, the measured
                  NFE tail of the last second) (docs/design.md §5.2)
  expire_only     nfe_ns = 0 (and prefix_ns = 0): everything is queued, expired at dispatch /
                  between steps
  queue_timeout   nfe_ns = 0 and queue_timeout_ms = T (Triton-style: reject at dispatch work
                  queued longer than T); T defaults to the median deadline slack minus the mean
                  service time

`--noise [BUSY/SLEEP]` runs a CPU-hog neighbour process (bench/noise.py, default busy 50 ms /
sleep 50 ms) from after the inline calibration to the end of the trace: the host gets busier
after calibration, which is what the adaptive cost model is for. It is recorded under `noise`.
`--noise-hogs 2` runs two of them (on a 2-core host both cores busy at normal priority, as
perception and planning keep a robot computer's cores busy). `--calibrate-under-noise` starts
them before the inline calibration instead, as a robot is calibrated with its load running.

`--realtime` starts the relay process in the real-time deployment mode (docs/robot-computer.md):
the request intake and the publisher at SCHED_FIFO 60 and 55 on `--rt-intake-cpus` (default the
first CPU this process may use), the workers at SCHED_FIFO 50 on `--rt-worker-cpus` (default the
last), memory locked (lock_memory), the priorities of relay.yaml's example; `--rt-dds` also
loads config/fastdds_realtime.xml (Fast DDS's reception, event and sender threads at SCHED_FIFO
58). What the relay's threads really got is read back from its `workers` diagnostics status
(rt.*, memory_locked_kb: /proc as the relay reads it) once it is up and after every point, and
printed beside each point (`applied`) with the mode and the hogs in the table's header; where the
OS refuses, the relay runs degraded and `applied` ends in REFUSED.

`--rtc` serves the RTC policy (models/policy_rtc unless --model names another RTC package) and
every request carries a real-time chunking prefix (bench/overload_rtc.py: its period, rows and
figures): whether each INFERENCE answer reaches the client by chunk_start + frozen_rows x
action_period (rtc_in_time), and how tight frozen_rows is (d-k: frozen rows minus the rows run
at receipt), per point, in the table and under each point's `rtc`.

"On time" is judged by the client: an INFERENCE answer received (client callback clock) no later
than the request's deadline (with --rtc the earlier of it and the RTC window). Per policy and load:

  on_time_goodput          on-time answers / offered requests
  goodput_vs_capacity      on-time answers per second / capacity, where capacity is taken from
                           the NFE cost under load: the NFE per second the lanes
                           would compute, never idle, at the cost the relay measured during this
                           point (NFEs done over busy lane time, from its stats;
                           capacity_nfe_per_s_under_load). With --in-process, and whenever the
                           stats do not cover the point, the inline calibration's (capacity_basis)
  nfe_goodput_vs_capacity  on-time NFE per second / that NFE per second: admission prefers what
                           still fits, short jobs among them, so counted in requests goodput can
                           pass 100% of capacity at overload; in NFE it cannot
  *_vs_calibrated_capacity the same two against the inline calibration's capacity (the load
                           axis), which moves with the host's speed at calibration time
  on_time_ratio_admitted   on-time answers / (accepted by the core - displaced - stale-cancelled)
  wasted_nfe_ratio         (NFE of work that ended EXPIRED or REJECTED_STALE + NFE of INFERENCE
                           answers received late) / all NFE computed
  outcomes                 answers per code, plus late_inference and lost (no answer)
  late_published_in_time   late answers whose header.stamp (the relay's publish) was before the
                           deadline: the time went between publisher and the client's callback
  late_receive_lag_ns      publish -> client callback of each late answer
  expired_details          each EXPIRED answer (up to 50): sent_at_ms into the trace, slack_ms,
                           nfe and nfe_done, queue_ms and compute_ms (the relay's), and
                           published_after_deadline_ms: where an admitted request lost its time
  latency_p50_ns / p99_ns  client publish -> client receive, INFERENCE answers
"""

from __future__ import annotations

import argparse
import contextlib
import math
import threading
import time

import numpy as np

from flowedge_relay.core import CODE_NAMES
from flowedge_relay.timebase import stamp_ns
from flowedge_relay_tools.bench import calibrate, latency, noise, realtime, targets
from flowedge_relay_tools.bench import overload_rtc as rtc_trace
from flowedge_relay_tools.bench.client import (
    INFERENCE,
    collector_paused,
    model_path,
    parse_relay_params,
    percentiles,
    relay_for_bench,
    saturate,
    set_policy,
    wait_idle,
    warm_up,
)
from flowedge_relay_tools.bench.host import host_info
from flowedge_relay_tools.bench.progress import Progress
from flowedge_relay_tools.bench.tables import VERDICT, format_rows, percent, target_met
from flowedge_relay_tools.bench.trace import Trace, TraceSpec
from flowedge_relay_tools.harness import MODEL_CHOICES

LOADS = (0.5, 1.0, 1.5, 2.0, 3.0)
POLICIES = ("edf_admission", "edf_adaptive", "expire_only", "queue_timeout")
ADMISSION_POLICIES = ("edf_admission", "edf_adaptive")
METRICS = (
    "on_time_goodput", "goodput_vs_capacity", "on_time_ratio_admitted", "wasted_nfe_ratio",
    "outcomes", "latency_p50_ns", "latency_p99_ns",
)  # fmt: skip
MAX_EXPIRED_DETAILS = 50  # EXPIRED answers described one by one in the JSON, per point
TARGETS = targets.OVERLOAD  # at 2x load, calibrated EDF admission (printed, never asserted)
# seconds per point, calibration requests, calibration seconds saturated
SIZES = {"quick": (0.4, 12, 0.3), "full": (8.0, 300, 3.0)}
REPORT_CODES = CODE_NAMES
#: --realtime: seconds of the host latency probe (bench/latency.py) before the trace
LATENCY_PROBE_S = 30.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="tiny size (CI)")
    parser.add_argument("--duration", type=float, help="seconds of trace per (policy, load) point")
    parser.add_argument("--model", help=f"{MODEL_CHOICES}, rtc (models/policy_rtc); default "
                                        "bench, rtc with --rtc")
    parser.add_argument("--workers", type=int, default=1, help="relay worker threads")
    parser.add_argument("--batch-slots", type=int, default=1,
                        help="relay batch_slots (docs/design.md §5.1); capacity is then counted "
                             "over workers x batch_slots lanes at the saturated NFE cost")
    parser.add_argument("--queue-capacity", type=int, default=64)
    parser.add_argument("--loads", type=float, nargs="+", default=list(LOADS))
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    parser.add_argument("--seed", type=int, default=TraceSpec.seed)
    parser.add_argument("--sessions", type=int, default=TraceSpec.sessions)
    parser.add_argument("--nfe-min", type=int,
                        help=f"default {TraceSpec.nfe_min}; {rtc_trace.NFE[0]} with --rtc")
    parser.add_argument("--nfe-max", type=int,
                        help=f"default {TraceSpec.nfe_max}; {rtc_trace.NFE[1]} with --rtc")
    parser.add_argument("--slack-min-ms", type=float, default=TraceSpec.slack_min_ms)
    parser.add_argument("--slack-max-ms", type=float, default=TraceSpec.slack_max_ms)
    parser.add_argument("--nfe-ns", type=int, help="override the inline calibration's nfe_ns")
    parser.add_argument("--admission-reserve-ns", type=int, help="override the reserve")
    parser.add_argument("--prefix-ns", type=int,
                        help="override the inline calibration's prefix_ns (two-phase models)")
    parser.add_argument("--queue-timeout-ms", type=int, help="T of the queue_timeout policy")
    parser.add_argument("--noise", nargs="?", const=noise.DEFAULT, metavar="BUSY/SLEEP",
                        help="run a CPU-hog neighbour during the trace: BUSY_MS/SLEEP_MS "
                             f"(default {noise.DEFAULT}) or continuous")
    parser.add_argument("--noise-hogs", type=int, default=1, metavar="N",
                        help="with --noise: run N neighbour processes (2 on a 2-core host: both "
                             "cores busy at normal priority)")
    parser.add_argument("--calibrate-under-noise", action="store_true",
                        help="with --noise: start the neighbours before the inline calibration, "
                             "as a robot computer is calibrated with its perception running "
                             "(default: after it, to show the host getting busier)")
    realtime.add_arguments(parser)
    parser.add_argument("--latency-probe-s", type=float, default=LATENCY_PROBE_S, metavar="S",
                        help="--realtime: after the inline calibration, measure the host's "
                             "wake-up latency on the workers' CPU for S seconds with the relay "
                             "saturated (bench/latency.py, like cyclictest) and admit with a "
                             "reserve of at least its longest late wake-up (default "
                             f"{LATENCY_PROBE_S:g}; 0: off)")
    parser.add_argument("--in-process", action="store_true",
                        help="run the relay inside the bench process (sharing its GIL) instead "
                             "of as its own flowedge-relayd process")
    parser.add_argument("--relay-param", action="append", default=[], metavar="NAME:=VALUE",
                        help="extra relay parameter (repeatable), e.g. worker_cpu_affinity:=[1]")
    parser.add_argument("--rtc", action="store_true",
                        help="real-time chunking trace: every request carries a prefix; reports "
                             "whether answers arrive by chunk_start + frozen_rows x period and "
                             "how tight frozen_rows is (bench/overload_rtc.py)")
    parser.add_argument("--rtc-rows", type=int, nargs=2, metavar=("LO", "HI"),
                        default=list(rtc_trace.DEFAULT_ROWS),
                        help="--rtc: prefix rows per request, seeded uniform in [LO, HI] "
                             "(default 8 8)")
    parser.add_argument("--rtc-period-ms", type=float, metavar="MS",
                        help="--rtc: action_period (default slack_min / rtc_max_delay)")


def policy_params(policy: str, nfe_ns: int, reserve_ns: int, timeout_ms: int,
                   prefix_ns: int | None = None) -> dict:  # fmt: skip
    """The relay's live parameters for one policy; prefix_ns only for a two-phase model (None:
    a single-graph model, whose parameters stay exactly as they were)."""
    admit = prefix_ns is not None and policy in ADMISSION_POLICIES
    prefix = {} if prefix_ns is None else {"prefix_ns": prefix_ns if admit else 0}
    static = {"cost_model": "static", **prefix}
    if policy == "edf_admission":
        return {"nfe_ns": nfe_ns, "admission_reserve_ns": reserve_ns, "queue_timeout_ms": 0,
                **static}  # fmt: skip
    if policy == "edf_adaptive":
        return {"nfe_ns": nfe_ns, "admission_reserve_ns": reserve_ns, "queue_timeout_ms": 0,
                "cost_model": "adaptive", **prefix}  # fmt: skip
    if policy == "expire_only":
        return {"nfe_ns": 0, "admission_reserve_ns": 0, "queue_timeout_ms": 0, **static}
    return {"nfe_ns": 0, "admission_reserve_ns": 0, "queue_timeout_ms": timeout_ms, **static}


def replay(relay, client, arrivals, *, drain_timeout_s: float, on_tick=None,
           rtc: rtc_trace.RtcTrace | None = None, bound: tuple[int, int] | None = None) -> dict:
    """Publish the arrivals on schedule, wait for every answer (or the timeout), then measure.
    With `rtc`, request i carries its prefix, prefix_start on the period grid at its send;
    `bound` (nfe_ns, admission_reserve_ns) takes its margin apart."""
    before = relay.stats()
    n = len(arrivals)
    keys, deadlines, lag = [], [], np.zeros(n, np.int64)
    rtc_sent: list[tuple[int, int, int]] = []  # (prefix_start, rows, the trace's deadline)
    grid = rtc.period_ns if rtc is not None else 0
    with collector_paused():
        start = time.monotonic_ns() + 20_000_000
        for i, a in enumerate(arrivals):
            extra = ({} if rtc is None else
                     {"prefix": rtc.prefix(i), "action_period_ns": rtc.period_ns})  # fmt: skip
            req = client.request(a.session, client.next_sequence(), a.nfe,
                                 noise_seed=a.noise_seed, **extra)  # fmt: skip
            target = start + a.offset_ns
            delay = target - time.monotonic_ns()
            if delay > 0:
                time.sleep(delay * 1e-9)
            lag[i] = time.monotonic_ns() - target
            sent = client.send(req, slack_ns=a.slack_ns, grid_ns=grid)
            keys.append((req.session_id, req.sequence))
            deadline = sent + a.slack_ns
            if rtc is not None:  # the relay's deadline: the earlier of the two
                rows = int(rtc.rows[i])
                chunk_start = stamp_ns(req.prefix_start)
                rtc_sent.append((chunk_start, rows, deadline))
                deadline = min(deadline, rtc.window_ns(chunk_start, rows))
            deadlines.append(deadline)
            if on_tick is not None and i % 16 == 0:
                on_tick((time.monotonic_ns() - start) * 1e-9)
        client.wait_keys(keys, drain_timeout_s)
    wait_idle(relay, timeout=drain_timeout_s)
    after = relay.stats()
    m = _measure(client, keys, deadlines, lag, before, after)
    if rtc is not None:
        m["rtc"] = rtc_trace.measure(client, keys, rtc_sent, rtc, bound)
        m["rtc_in_time_ratio"] = m["rtc"]["in_time_ratio"]  # flat, for the targets
        m["rtc_spare_rows_p50"] = m["rtc"]["spare_rows_p50"]
    return m


def _measure(client, keys, deadlines, lag, before, after) -> dict:
    outcomes = {name: 0 for name in REPORT_CODES}
    outcomes.update(late_inference=0, lost=0)
    on_time, on_time_nfe, late_nfe, latency = 0, 0, 0, []
    late_published_in_time, late_receive_lag = 0, []  # where each late answer lost its time
    expired = []  # what each EXPIRED request had been through (the relay's calibration misses)
    first_sent = client.sent[keys[0]] if keys else 0
    for key, deadline in zip(keys, deadlines, strict=True):
        ans = client.answers.get(key)
        if ans is None:
            outcomes["lost"] += 1
            continue
        outcomes[REPORT_CODES[ans.code]] += 1
        if REPORT_CODES[ans.code] == "EXPIRED" and len(expired) < MAX_EXPIRED_DETAILS:
            sent = client.sent[key]
            expired.append({
                "sent_at_ms": (sent - first_sent) / 1e6, "slack_ms": (deadline - sent) / 1e6,
                "nfe": ans.nfe_done + ans.remaining_nfe, "nfe_done": ans.nfe_done,
                "queue_ms": ans.queue_ns / 1e6, "compute_ms": ans.compute_ns / 1e6,
                "published_after_deadline_ms": (ans.published_ns - deadline) / 1e6,
            })  # fmt: skip
        if ans.code == INFERENCE:
            latency.append(ans.received_ns - client.sent[key])
            if ans.received_ns <= deadline:
                on_time += 1
                on_time_nfe += ans.nfe_done
            else:
                outcomes["late_inference"] += 1
                late_nfe += ans.nfe_done
                late_published_in_time += ans.published_ns <= deadline
                late_receive_lag.append(ans.received_ns - ans.published_ns)
    delta = lambda name: getattr(after, name) - getattr(before, name)  # noqa: E731
    admitted = delta("accepted")
    cancelled = delta("displaced") + outcomes["REJECTED_STALE"]
    nfe_total, nfe_wasted = delta("nfe_total"), delta("nfe_wasted")
    p50, p99 = percentiles(latency, (50, 99))
    lag_p99, lag_max = (percentiles(lag, (99, 100)) if len(lag) else (0.0, 0.0))
    offered = len(keys)
    return {
        "offered": offered,
        "on_time": on_time,
        "on_time_nfe": on_time_nfe,
        "admitted": admitted,
        "cancelled": cancelled,
        "on_time_goodput": on_time / offered if offered else None,
        "on_time_ratio_admitted": (
            on_time / (admitted - cancelled) if admitted - cancelled > 0 else None
        ),
        "wasted_nfe_ratio": (nfe_wasted + late_nfe) / nfe_total if nfe_total else 0.0,
        "nfe_total": nfe_total,
        "nfe_wasted_relay": nfe_wasted,
        "nfe_late_inference": late_nfe,
        "calibration_misses": delta("calibration_misses"),
        # late answers the relay published before their deadline (the time was lost between
        # the publisher and the client's callback: DDS, the client's executor, a host stall),
        # and publish -> client callback of every late answer
        "late_published_in_time": late_published_in_time,
        "late_receive_lag_ns": late_receive_lag,
        "expired_details": expired,
        "outcomes": outcomes,
        "latency_p50_ns": p50,
        "latency_p99_ns": p99,
        "send_lag_p99_ns": lag_p99,
        "send_lag_max_ns": lag_max,
        "extra_answers": client.extra_answers,
    }


def run(args: argparse.Namespace) -> dict:
    host = host_info()  # load average before this run adds its own
    duration, cal_requests, cal_loaded_s = SIZES["quick" if args.quick else "full"]
    duration = args.duration or duration
    nfe_min, nfe_max = rtc_trace.NFE if args.rtc else (TraceSpec.nfe_min, TraceSpec.nfe_max)
    spec = TraceSpec(
        seed=args.seed, sessions=args.sessions, nfe_min=args.nfe_min or nfe_min,
        nfe_max=args.nfe_max or nfe_max, slack_min_ms=args.slack_min_ms,
        slack_max_ms=args.slack_max_ms,
    )  # fmt: skip
    trace = Trace(spec)
    loads = [float(x) for x in args.loads]
    path = model_path(args.model or ("rtc" if args.rtc else "bench"))
    slots = getattr(args, "batch_slots", 1)
    params = dict(model_path=path, workers=args.workers, queue_capacity=args.queue_capacity,
                  max_nfe=max(64, spec.nfe_max), batch_slots=slots)  # fmt: skip
    params.update(parse_relay_params(args.relay_param))
    params.update(realtime.realtime_params(args))
    env = realtime.realtime_env(args)
    points = len(loads) * len(args.policies)
    results: dict[str, dict[str, dict]] = {p: {} for p in args.policies}
    with Progress("overload", points + 1, unit=" points") as bar:
        bar.update(label="starting relay")
        with (relay_for_bench(args.in_process, env=env, **params) as (relay, client),
              realtime.realtime_client(args) as client_mode, contextlib.ExitStack() as hogs):
            warm_up(client)
            rtc = (rtc_trace.RtcTrace.build(spec, client.served, len(trace.nfe),
                                            tuple(args.rtc_rows), args.rtc_period_ms)
                   if args.rtc else None)  # fmt: skip
            applied = realtime.applied_settings(relay)
            hog = (noise.cpu_hog(args.noise, args.noise_hogs) if args.noise
                   else contextlib.nullcontext())  # fmt: skip
            if args.calibrate_under_noise:
                noise_info = hogs.enter_context(hog)
            bar.update(label="inline calibration")
            cal = calibrate.inline(relay, client, spec.mean_nfe, cal_requests, cal_loaded_s)
            capacity, ns_per_nfe, service_ns = calibrate.capacity(cal, spec.mean_nfe,
                                                                  args.workers, slots)
            two_phase = bool(cal["two_phase"])
            prefix_mean_ns = cal.get("relay_prefix_ns_p50", 0.0)  # once per request
            # real-time chunking's bound is the p99 request's and the answer's way out, not the
            # step tail and the stall: work past it expires at the switch row (§5.4), and each
            # period the bound adds freezes a row more
            nfe_key, reserve_key = (("recommended_rtc_nfe_ns", "recommended_rtc_reserve_ns")
                                    if rtc else ("recommended_nfe_ns",
                                                 "recommended_admission_reserve_ns"))  # fmt: skip
            nfe_ns = args.nfe_ns or cal[nfe_key]
            reserve = (args.admission_reserve_ns if args.admission_reserve_ns is not None
                       else cal[reserve_key])  # fmt: skip
            host_latency = None
            if args.realtime and args.latency_probe_s > 0:
                bar.update(label="host latency")
                host_latency = _host_latency(args, client, round(spec.mean_nfe))
                if args.admission_reserve_ns is None and not rtc:  # or the longest stall
                    reserve = max(reserve, math.ceil(host_latency["late_ns_max"] / 1e3) * 1_000)
            prefix_ns = None
            if two_phase:
                prefix_ns = (args.prefix_ns if args.prefix_ns is not None
                             else cal["recommended_prefix_ns"])  # fmt: skip
            mean_service_ms = service_ns / 1e6
            median_slack_ms = (spec.slack_min_ms + spec.slack_max_ms) / 2
            timeout_ms = args.queue_timeout_ms or max(1, round(median_slack_ms - mean_service_ms))
            bar.advance(label="trace")
            drain = spec.slack_max_ms / 1e3 + 2.0
            if not args.calibrate_under_noise:
                noise_info = hogs.enter_context(hog)
            _trace(args, relay, client, trace, loads, duration, capacity, spec, drain, bar,
                   results, _policy_params_for(nfe_ns, reserve, timeout_ms, prefix_ns), rtc)
            hogs.close()  # the noise's figures are final once it stopped
            nfe_p50, nfe_p99, _ = relay.nfe_percentiles()
    cal_public = {k: v for k, v in cal.items() if not isinstance(v, list | dict)}
    report = {
        "size": "quick" if args.quick else "full",
        "host": host,
        "model": path.rstrip("/").rsplit("/", 1)[-1],
        "two_phase": two_phase,
        "workers": args.workers,
        "batch_slots": slots,
        "queue_capacity": args.queue_capacity,
        "duration_s_per_point": duration,
        "loads": [f"{x:.1f}" for x in loads],
        "trace": spec.describe(),
        "calibration": cal_public,
        "ns_per_nfe_mean": ns_per_nfe,
        "capacity_rps": capacity,
        "capacity_definition": (
            (f"workers / (mean NFE {spec.mean_nfe:g} x mean relay compute ns per NFE "
             f"{ns_per_nfe:.0f} measured inline" if slots == 1 else
             f"workers x batch_slots ({args.workers * slots}) / (mean NFE {spec.mean_nfe:g} x "
             f"mean saturated compute ns per lane NFE {ns_per_nfe:.0f} measured inline")
            + (f" + median prefix pass {prefix_mean_ns:.0f} ns" if two_phase else "") + ")"
            + " sets the load axis; goodput is counted against each point's capacity under load"
            " (NFEs the relay computed over their busy lane time) where the relay's stats give it"
        ),
        "nfe_ns": nfe_ns,
        "prefix_ns": prefix_ns or 0,
        "admission_reserve_ns": reserve,
        "host_latency": host_latency,
        "queue_timeout_ms": timeout_ms,
        "worker_nfe_p50_ns": nfe_p50,
        "worker_nfe_p99_ns": nfe_p99,
        "policies": results,
        "relay": "in-process" if args.in_process else "flowedge-relayd process",
        "relay_params": parse_relay_params(args.relay_param),
        "noise": noise_info,
        "calibrated_under_noise": bool(args.noise and args.calibrate_under_noise),
        "mode": realtime.mode(args),
        "client_mode": client_mode,
        "realtime": ({"asked": realtime.realtime_params(args), "env": env or {}} if args.realtime
                     else None),
        "realtime_applied": applied,
        "rtc": rtc.describe() if rtc is not None else None,
    }
    if rtc is not None:
        report["rtc"]["fit"] = rtc_trace.fit(report)
    report["targets"] = _targets(report)
    report["rows"] = _rows(report)
    return report


def _host_latency(args: argparse.Namespace, client, nfe: int) -> dict:
    """--realtime: the wake-up latency on the workers' first CPU, one priority above them
    (bench/latency.py), for --latency-probe-s while the relay is kept saturated, as the trace
    will keep it. Its longest late wake-up is a stall an admitted request can meet."""
    found: dict = {}
    cpu, prio = args.rt_worker_cpus[0], realtime.RT_PRIORITIES["worker"] + 1
    thread = threading.Thread(target=lambda: found.update(
        latency.probe(cpu, prio, args.latency_probe_s)), name="bench-latency-probe")
    thread.start()
    saturate(client, args.workers, nfe, args.latency_probe_s + 0.5, "bench-latency")
    thread.join()
    return found


def _policy_params_for(nfe_ns: int, reserve_ns: int, timeout_ms: int, prefix_ns: int | None):
    return lambda policy: policy_params(policy, nfe_ns, reserve_ns, timeout_ms, prefix_ns)


def _trace(args, relay, client, trace, loads, duration, capacity, spec, drain, bar, results,
           params_of, rtc=None) -> None:  # fmt: skip
    """Every (load, policy) point, policies interleaved per load; fills results."""
    for li, load in enumerate(loads):
        arrivals = trace.at_load(load * capacity, duration)
        k = li % len(args.policies)
        for policy in args.policies[k:] + args.policies[:k]:
            done = bar.done
            bar.update(label=f"load {load:g} {policy} ({len(arrivals)} requests)")
            params = params_of(policy)
            set_policy(relay, **params)
            tick = lambda s, d=done: bar.update(done=d + min(s / duration, 1.0))  # noqa: E731
            t0 = time.time_ns()
            m = replay(relay, client, arrivals, drain_timeout_s=drain, on_tick=tick, rtc=rtc,
                       bound=(params["nfe_ns"], params["admission_reserve_ns"]))
            t1 = time.time_ns()
            m.update(goodput(m, duration, capacity, spec.mean_nfe,
                              relay.capacity_between(t0, t1)
                              if hasattr(relay, "capacity_between") else None))  # fmt: skip
            # Per-NFE cost the workers saw (last 4096 NFE): was the host quiet?
            m["worker_nfe_p50_ns"], m["worker_nfe_p99_ns"], _ = relay.nfe_percentiles()
            # what the relay's threads held during the point, as it reads them back
            m["realtime_applied"] = realtime.applied_settings(relay)
            # What admission assumed per NFE while the trace ran (adaptive: it follows the tail)
            # (stats published from the trace's start until its last answer)
            if hasattr(relay, "cost_during"):
                m["cost_model"] = relay.cost_during(t0, t1)
            results[policy][f"{load:.1f}"] = m
            bar.update(done=done + 1)


def goodput(m: dict, duration: float, calibrated_rps: float, mean_nfe: float,
             nfe_per_s_under_load: float | None) -> dict:
    """Goodput against capacity, taken from the NFE cost under load, not idle: the NFE per
    second the lanes would compute, never idle, at the cost the relay measured during this very
    point (its own stats), when the relay runs as its own process. The inline
    calibration's capacity (the load axis) is kept next to it: the host's speed drifts between
    calibration and trace (sequential NFE cost 438-594 us over four runs, NFE p50 in the traces
    420-521 us), and goodput against it moved with the calibration, not the relay."""
    def against(nfe_per_s: float) -> tuple[float, float]:  # (per request, in NFE)
        return (m["on_time"] / duration / (nfe_per_s / mean_nfe),
                m["on_time_nfe"] / duration / nfe_per_s)

    out = {"capacity_rps_calibrated": calibrated_rps}
    out["goodput_vs_calibrated_capacity"], out["nfe_goodput_vs_calibrated_capacity"] = against(
        calibrated_rps * mean_nfe)
    if nfe_per_s_under_load:
        out.update(capacity_basis="NFE cost under load (this point)",
                   capacity_nfe_per_s_under_load=nfe_per_s_under_load)
        out["goodput_vs_capacity"], out["nfe_goodput_vs_capacity"] = against(nfe_per_s_under_load)
    else:
        out.update(capacity_basis="inline calibration",
                   goodput_vs_capacity=out["goodput_vs_calibrated_capacity"],
                   nfe_goodput_vs_capacity=out["nfe_goodput_vs_calibrated_capacity"])
    return out


def _targets(report: dict) -> dict:
    out = {}
    targets = {**TARGETS, **(rtc_trace.TARGETS if report.get("rtc") else {})}
    for policy in ADMISSION_POLICIES:
        point = report["policies"].get(policy, {}).get("2.0")
        if point is None:
            continue
        for metric, (op, bound) in targets.items():
            value = point.get(metric)
            out[f"{policy}.{metric}"] = {"target": f"{op} {bound:g}", "value": value,
                                         "met": target_met(value, op, bound)}
    return out


def _noise_text(info: dict | None) -> str:
    """The neighbours that ran, and how many (hogs)."""
    if not info:
        return "none (0 hogs)"
    n = info.get("processes", 1)
    return f"{info['description']} ({n} hog{'s' if n != 1 else ''})"


def _rows(report: dict) -> list[dict]:
    rows = []
    for policy, by_load in report["policies"].items():
        for load, m in by_load.items():
            o = m["outcomes"]
            rows.append({
                "policy": policy,
                "load": load,
                "offered": m["offered"],
                "goodput": percent(m["on_time_goodput"]),
                "vs_capacity": percent(m["goodput_vs_capacity"]),
                "nfe_vs_cap": percent(m.get("nfe_goodput_vs_capacity")),
                "on_time_admitted": percent(m["on_time_ratio_admitted"]),
                "wasted_nfe": percent(m["wasted_nfe_ratio"]),
                "inf": o["INFERENCE"],
                "late": o["late_inference"],
                "rej_dl": o["REJECTED_DEADLINE"],
                "rej_cap": o["REJECTED_CAPACITY"],
                "expired": o["EXPIRED"],
                "lost": o["lost"],
                "p50_ms": round(m["latency_p50_ns"] / 1e6, 1),
                "p99_ms": round(m["latency_p99_ns"] / 1e6, 1),
                "nfe_p99_us": round(m["worker_nfe_p99_ns"] / 1e3),
                "in_use_us": (round((m.get("cost_model") or {}).get("nfe_ns_in_use_max", 0) / 1e3)
                              if policy in ADMISSION_POLICIES else "-"),
                "applied": realtime.applied_short(m.get("realtime_applied") or {}),
                **rtc_trace.row_cells(m),
            })  # fmt: skip
    return rows


def table(report: dict) -> str:
    t = report["trace"]
    lines = [
        f"overload: {report['model']}, {report['workers']} worker(s), queue_capacity "
        f"{report['queue_capacity']}, {report['duration_s_per_point']:g} s of trace per point",
        f"trace: seed {t['seed']}; {t['arrivals']}; sessions {t['session']}; NFE {t['nfe']}; "
        f"deadline {t['deadline']}",
        f"capacity {report['capacity_rps']:.1f} requests/s = {report['capacity_definition']}",
        f"edf_admission / edf_adaptive: nfe_ns={report['nfe_ns']} admission_reserve_ns="
        f"{report['admission_reserve_ns']}"
        + (f" prefix_ns={report['prefix_ns']}" if report.get("two_phase") else "")
        + " (inline calibration; edf_adaptive admits with "
        f"max(nfe_ns, measured NFE tail)); queue_timeout: "
        f"queue_timeout_ms={report['queue_timeout_ms']}",
        f"relay: {report.get('relay', '?')}; noise: {_noise_text(report.get('noise'))}"
        + (" (running since before the calibration)" if report.get("calibrated_under_noise")
           else ""),
        realtime.latency_text(report.get("host_latency")),
        *(rtc_trace.header(report) if report.get("rtc") else []),
        f"mode: {report.get('mode', 'normal scheduling')}; client: "
        f"{report.get('client_mode', 'normal scheduling')}; applied at start (read back from the "
        f"relay's workers status): {realtime.applied_short(report.get('realtime_applied') or {})}",
        format_rows(report["rows"]),
    ]
    if report["calibration"].get("noisy_host"):
        lines.append(
            f"WARNING: raw NFE p99 was {report['calibration']['raw_tail_ratio']:.1f}x its p50 "
            "during the inline calibration: this host stalls, and the calibration measured it"
        )
    lines += [
        "targets (EDF admission at 2x load; printed, not asserted):",
    ]
    for metric, t in report["targets"].items():
        rows = metric.rsplit(".", 1)[-1] in rtc_trace.ROW_METRICS
        value = ("-" if t["value"] is None else f"{t['value']:g} rows" if rows
                 else f"{t['value']:.4%}")  # fmt: skip
        lines.append(f"  {metric:<38} {value:>10} (target {t['target']}) {VERDICT[t['met']]}")
    return "\n".join(lines)


def plot(report: dict, path: str) -> str:
    from flowedge_relay_tools.bench import plots

    fig, axes = plots.subplots(ncols=3, width=4.6, height=3.8)
    ax_good, ax_waste, ax_ratio = axes
    loads = [float(x) for x in report["loads"]]
    for policy, by_load in report["policies"].items():
        style = plots.POLICY_STYLE.get(policy, {"label": policy})
        xs = [x for x in loads if f"{x:.1f}" in by_load]
        pts = [by_load[f"{x:.1f}"] for x in xs]
        ax_good.plot(xs, [100 * p["goodput_vs_capacity"] for p in pts], **style)
        ax_waste.plot(xs, [100 * p["wasted_nfe_ratio"] for p in pts], **style)
        ax_ratio.plot(
            xs, [100 * (p["on_time_ratio_admitted"] or 0) for p in pts], **style
        )
    ax_good.plot(loads, [100 * min(x, 1.0) for x in loads], "k:", lw=1, label="ideal")
    ax_good.set_ylabel("on-time goodput, % of capacity")
    ax_waste.set_ylabel("wasted NFE, % of NFE computed")
    ax_ratio.set_ylabel("on time among admitted, %")
    for ax in axes:
        ax.set_xlabel("offered load (x capacity)")
        ax.set_xticks(loads)
    ax_good.legend(fontsize=7, loc="lower right")
    return plots.save(
        fig, path,
        title=f"overload: {report['model']}, {report['workers']} worker(s), capacity "
              f"{report['capacity_rps']:.0f} req/s, {report['duration_s_per_point']:g} s per point",
        note=f"trace seed {report['trace']['seed']}, NFE {report['trace']['nfe']}, deadline "
             f"{report['trace']['deadline']}; nfe_ns={report['nfe_ns']}, "
             f"queue_timeout_ms={report['queue_timeout_ms']}",
    )  # fmt: skip
