# SPDX-License-Identifier: Apache-2.0
"""`bench calibrate`: measure through the real relay node and recommend `nfe_ns` (and `prefix_ns`).

ADR 0015 leaves calibration to the deployment: `nfe_ns` must be a measured upper bound of one
NFE on this host. This subcommand starts the relay as deployed, as its own `flowedge-relayd`
process (admission off; `--in-process` runs a RelayNode in the bench process instead), and a
client node in the bench process, sends requests of `--nfe` NFE one at a time over DDS, and
measures per request:

  e2e          client publish -> client receives the ActionMessage (client clock)
  compute      the relay's own `compute_ns` (dispatch -> finish: the NFEs plus the worker loop)
  fixed        e2e - compute: DDS both ways, validation, admission, dispatch wake-up, publish

and, side by side (alternating blocks in the same run, same process), raw onnxruntime cost of one
NFE (the worker's sampler `nfe()`: one bound `run_with_iobinding` + the solver update) on its own
session(s).

A two-phase policy package (`--model vision` or a package directory) pays a prefix pass once per
request before its first NFE (`prefix_ns` in admission, docs/design.md §5). The relay's workers
time every prefix pass (what `prefix_done` reports to the core and the drift alarm judges); the
bench reads their p50 / p99 when each phase ends (from the pool in process, from the `workers`
status on /diagnostics for its own process), next to the raw cost of `prefix()` on its own
sessions. The per-NFE figures of such a model leave the prefix out: each request's e2e and
compute lose the relay's median prefix pass of that phase before they are divided by its NFE.

then keeps the lanes saturated for a few seconds (2W+2 requests outstanding) and records the
relay's compute ns per NFE under that load (loaded: the GIL and both cores are shared with the
request and publisher threads, so an NFE costs more than on an idle relay), and the p99 of the
relay's own per-step time (one NFE at B = 1, one batched step at B > 1): a request's mean per NFE
smooths the step tail away, and admission needs every step to fit. Last, as long again or long
enough for 1.5 x the relay's ring of 4096 steps at the saturated step cost (the p99 is read from
that ring; at most 4x as long; `overload_seconds`), it offers
OVERLOAD_X (3) times that saturated capacity open loop (deadline send + 100 ms; admission off, so
the queue's capacity and dispatch expiry shed the excess) and reads the per-step p99 again: under
overload the request and publisher paths carry every arrival, accepted or not, on the same two
cores as the workers. Measured at B = 8 on policy_bench: the step p99 was 2.2-2.6 ms saturated and
5.5 ms at 3x, and a static nfe_ns of the saturated figure kept 94.5% of admitted requests on time
at 2x (the 3x figure: 100%).

Recommendation (conservative starting point, ADR 0015, docs/design.md#decision-record):
  recommended_nfe_ns               = ceil(margin x max(p99 of e2e ns per NFE,
                                                       p99 of loaded compute ns per NFE,
                                                       p75 over the rounds of the step p99
                                                       saturated and at 3x)), in us
  recommended_admission_reserve_ns = ceil(margin x (way out + stall)), whole us, where
                                     way out = max(p99 of the fixed part, p99.9 of publish ->
                                               the subscriber's callback saturated and at 3x)
                                     stall   = max(STALL_FACTOR x the rounds' median of
                                               each round's max(p99.9 of a saturated request's
                                               stall, PROBE_WAKEUPS x the p99.9 of the latency
                                               probe's late wake-ups), the rounds' median of the
                                               stall past which the host spent at most 0.1% of
                                               the round's probed time); with --realtime the
                                               longest of each
  recommended_rtc_nfe_ns           = ceil(margin x max(p99 of relay compute ns per NFE of whole
                                                       requests, idle, saturated and at 3x (the
                                                       requests that ran half their NFE or more)))
  recommended_rtc_reserve_ns       = ceil(margin x max(p99 of the fixed part, the longest answer
                                                       delivery saturated and at 3x)), whole
                                     us: the reserve for real-time chunking, where a stall past it
                                     expires the work at the robot's switch row (design.md §5.4)
  recommended_prefix_ns            = ceil(margin x max(p99 of the relay's prefix passes,
                                                       the same p99 under saturation)), in us
                                     (two-phase models; 0 otherwise: prefix_ns is unused)
The e2e per-NFE figure already carries the fixed part spread over `--nfe` steps, so the two
overlap on purpose.

The saturated and 3x phases run in `--rounds` rounds (8; 2 with --quick), the latency probe
(bench/latency.py: at normal priority anywhere, or with --realtime on the workers' CPU one
priority above them) beside each phase. The per-NFE figures above that come from those phases
pool every round's requests; the relay's step p99, one figure per round, is taken at the
rounds' upper quartile (ROUNDS_Q), and the stall at STALL_FACTOR x the rounds' median of each
round's p99.9, not the worst round's nor every round's samples pooled (whose p99.9 follows the
one round that met a rare long stall): each round's own nfe_ns and
reserve are printed with their spread around the rounds' median, and a value that a quarter of
the rounds, left out, would move more than REPRODUCE_TOL is named as not reproduced (unsteady):
on a busy host a stall is met by chance, so the conservative value is recommended and said to
be one, never a round's draw, and the longest stall seen past it is named as not promised.
The answers reach an ordinary rclpy subscriber of a node that also publishes the requests, as a
robot's node does.
`--realtime [--rt-dds]` calibrates the relay in the real-time mode (bench/realtime.py), as
`overload --realtime` runs it.

Production calibration needs representative traces, thermal state, CPU affinity and a safety
margin; the report says so.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import math
import threading
import time
from collections.abc import Iterator

import numpy as np

from flowedge_relay.model import FlowSampler, ModelInfo, make_session
from flowedge_relay.policy import Policy, PolicySampler, fill_buffers, make_sessions
from flowedge_relay.workers import NFE_HISTORY
from flowedge_relay_tools.bench import latency, realtime, targets
from flowedge_relay_tools.bench.client import (
    INFERENCE,
    collector_paused,
    percentiles,
    relay_for_bench,
    round_trip,
    saturate,
    wait_idle,
    warm_up,
)
from flowedge_relay_tools.bench.host import host_info
from flowedge_relay_tools.bench.progress import Progress
from flowedge_relay_tools.bench.trace import capacity_rps
from flowedge_relay_tools.harness import (
    MODEL_CHOICES,
    load_served,
    model_path,
    scene_inputs,
    served_model,
)

QS = (50, 99, 99.9)
CAVEAT = (
    "A starting point, not a guarantee: production calibration needs representative traces "
    "(observation sizes, NFE counts, concurrency), the host's thermal state and power mode, the "
    "deployed CPU affinity / real-time priority, and a safety margin on top. Re-run it there."
)
OVERLOAD_X = 3.0  # the overload phase's arrival rate, in multiples of the saturated capacity
#: the overload phase lasts long enough for RING_FILL x NFE_HISTORY steps at the saturated step
#: cost (its p99 is read from the relay's ring of its last NFE_HISTORY steps), at most
#: RING_FILL_CAP x loaded_s: at B = 8 a policy_bench step is ~1.3 ms, so 3 s of overload filled
#: only about half the ring and the saturated phase's steps thinned the tail it reports
RING_FILL, RING_FILL_CAP = 1.5, 4.0
NOISY_TAIL_RATIO = 3.0  # raw NFE p99 / p50 above this: the host stalls; say so
#: the percentile the reserve covers of the answer's way out (publish -> the subscriber's
#: callback, saturated and at 3x) and, at normal scheduling, of the host's stalls (the latency
#: probe's late wake-ups); in the real-time mode the probe's longest goes in whole
STATED_Q = 99.9
#: a figure reproduces when every round is within this fraction of the rounds' median
REPRODUCE_TOL = targets.REPRODUCE_TOL
#: the relay's step p99 comes one figure per round and phase (read from its ring of recent
#: steps); nfe_ns takes the rounds' figures at this percentile (their upper quartile): on a busy
#: host whether a neighbour's time slice lands in ~1% of the steps is itself a draw, so the
#: worst round's is a draw too, while the upper quartile of several rounds moves little
ROUNDS_Q = 75.0
#: the reserve's stall part at normal scheduling: this many times the rounds' median of each
#: round's stall figure (the p99.9 stall its saturated requests met, or its probe's p99.9 late
#: wake-up). A round's p99.9 stall is a heavy-tailed draw: over 120 recorded rounds (15
#: calibrations, quiet and next to a hog) the rounds' upper quartile moved 30-100% between
#: calibrations of one host, while their median stayed within 6-17% of its own median, and twice
#: it was passed by 3 rounds in 120. A stall of tens of ms, about one a minute next to a hog, is
#: met by chance in a round or not; pooled or at the upper quartile it set the reserve, so it is
#: named as not promised instead (stall_text), with the slack it leaves unpromised
STALL_FACTOR = 2.0
#: a round's count-based stall at normal scheduling is at least this many of its probe's p99.9
#: late wake-ups: the probe counts thousands of wake-ups a round, so its p99.9 moves little
#: (3.0-4.7 ms next to a hog over 120 recorded rounds), while a round's requests' p99.9 is about
#: its longest of ~100, a draw; a request that runs for several ms on a shared core meets a
#: neighbour's time slice more than once, and over 35 recorded calibrations the requests' stall
#: was 1.6-2.4 probe p99.9s next to a hog (their median per calibration). Without it a round
#: whose requests met few stalls pulled the median, and with it the reserve, down by chance:
#: replayed on those calibrations, five of them next to a hog put the reserve up to 42% from
#: the five's median (24% with it), and a calm one on the host as it is 33% (16%)
PROBE_WAKEUPS = 2.0
PROBE_TAIL_KEYS = ("late_ns_p50", "late_ns_p99", "late_ns_p99_9", "late_ns_max")
# requests, nfe, raw NFEs, blocks, seconds saturated per round, rounds
SIZES = {"quick": (16, 4, 100, 2, 0.3, 2), "full": (800, 10, 4000, 8, 3.0, 8)}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="tiny sample sizes (CI)")
    parser.add_argument("--model", default="small", help=MODEL_CHOICES)
    parser.add_argument("--requests", type=int, help="requests through the relay")
    parser.add_argument("--nfe", type=int, help="NFE per request (use your typical count)")
    parser.add_argument("--workers", type=int, default=1, help="relay worker threads")
    parser.add_argument("--batch-slots", type=int, default=1,
                        help="relay batch_slots (docs/design.md §5.1): the saturated phase then "
                             "fills every slot, so loaded_* figures and the recommended nfe_ns "
                             "are per batched step of that many rows")
    parser.add_argument("--margin", type=float, default=1.0, help="multiplier on the p99/p99.9")
    parser.add_argument("--in-process", action="store_true",
                        help="run the relay inside the bench process (sharing its GIL) instead "
                             "of as its own flowedge-relayd process")
    parser.add_argument("--rounds", type=int,
                        help="rounds of the saturated and 3x phases (default 8; 2 with --quick): "
                             "the recommendation pools their requests' per-NFE figures, takes "
                             "the relay's step p99 at the rounds' upper quartile, the stall at "
                             "twice the rounds' median "
                             "and prints their spread")
    parser.add_argument("--no-latency-probe", action="store_true",
                        help="leave out the host latency probe (bench/latency.py) beside the "
                             "saturated and 3x phases; the reserve then holds no stall but what "
                             "a saturated request met")
    realtime.add_arguments(parser)


def _us_ceil(ns: float) -> int:
    return int(math.ceil(ns / 1000.0)) * 1000


class RawSampler:
    """The worker's sampler on sessions of its own, timed per call: the raw onnxruntime cost of
    one NFE (and of one prefix pass), with no relay around it. A single .onnx file runs
    FlowSampler, a package PolicySampler on a detour scene, as the workers do."""

    def __init__(self, model: ModelInfo | Policy) -> None:
        self.package = isinstance(model, Policy)
        self.two_phase = self.package and model.two_phase
        if self.package:
            self.sampler = PolicySampler(model, make_sessions(model))
            fill_buffers(model, self.sampler.buffers, scene_inputs(served_model(model), 0))
        else:
            self.sampler = FlowSampler(make_session(model, 1), model, "euler")
            self._obs = np.zeros(model.obs_dim, np.float32)

    def _start(self, seed: int, nfe: int) -> None:
        if self.package:
            self.sampler.start(seed, nfe)
        else:
            self.sampler.start(self._obs, seed, nfe)

    def nfe_ns(self, n: int) -> np.ndarray:
        """Per-NFE ns of nfe() back to back (a fresh request every 16 NFE, its prefix untimed)."""
        out = np.empty(n, np.int64)
        clock = time.perf_counter_ns
        for i in range(n):
            if i % 16 == 0:
                self._start(i, 16)
                if self.package:
                    self.sampler.prefix()
            t0 = clock()
            self.sampler.nfe()
            out[i] = clock() - t0
        return out

    def prefix_ns(self, n: int) -> np.ndarray:
        """Per-pass ns of prefix(), a fresh request each time (two-phase models only)."""
        out = np.empty(n, np.int64)
        clock = time.perf_counter_ns
        for i in range(n):
            self._start(i, 1)
            t0 = clock()
            self.sampler.prefix()
            out[i] = clock() - t0
        return out


def relay_samples(
    client, n: int, nfe: int, bar: Progress | None = None,
    session: str = "bench-calibrate", timeout: float = 10.0,
) -> dict[str, list]:  # fmt: skip
    """n sequential requests of nfe NFE (no deadline) through the relay; per-request ns."""
    e2e, compute, queue, out, nfe_done = [], [], [], [], []
    for _ in range(n):
        took, ans = round_trip(client, session, nfe, timeout, noise_seed=len(e2e))
        e2e.append(took)
        compute.append(ans.compute_ns)
        queue.append(ans.queue_ns)
        out.append(ans.received_ns - ans.published_ns)
        nfe_done.append(ans.nfe_done)
        if bar is not None:
            bar.advance()
    return {"e2e_ns": e2e, "compute_ns": compute, "queue_ns": queue, "delivery_ns": out,
            "nfe_done": nfe_done}  # fmt: skip


def measure(relay, client, requests: int, nfe: int, raw_nfe: int, blocks: int,
            bar: Progress | None = None, loaded_s: float = 0.0,
            overload_x: float = OVERLOAD_X, rounds: int = 1,
            probe: tuple[int | None, int] | None = None) -> dict:  # fmt: skip
    """Relay requests and raw NFEs (and raw prefix passes) in alternating blocks, then
    (loaded_s > 0) `rounds` rounds of: the lanes kept saturated for loaded_s seconds and
    (overload_x > 0) overload_x times that capacity offered open loop for overload_seconds(),
    the relay's step p99 read at the end of each, the host latency probe beside each (`probe`:
    (CPU or None, priority), _probing); returns the sample arrays (the rounds' pooled, the step
    p99 of the worst round, and each round's own under `rounds`) and, for a two-phase model, the
    relay's prefix-pass percentiles at the end of each phase."""
    raw = RawSampler(relay.model)
    raw.nfe_ns(20)  # warm-up
    relay_acc: dict[str, list] = {}
    raw_parts, prefix_parts = [], []
    blocks = max(1, min(blocks, requests))
    for b in range(blocks):
        if bar is not None:
            bar.update(label=f"block {b + 1}/{blocks}")
        raw_parts.append(raw.nfe_ns(max(1, raw_nfe // blocks)))
        if raw.two_phase:  # one raw prefix pass per raw request of `nfe` NFE
            prefix_parts.append(raw.prefix_ns(max(1, raw_nfe // blocks // nfe)))
        n = requests // blocks + (1 if b < requests % blocks else 0)
        with history_frozen():
            part = relay_samples(client, n, nfe, bar)
        for key, values in part.items():
            relay_acc.setdefault(key, []).extend(values)
    samples = {k: np.asarray(v, np.int64) for k, v in relay_acc.items()}
    samples["raw_nfe_ns"] = np.concatenate(raw_parts)
    if raw.two_phase:
        samples["raw_prefix_ns"] = np.concatenate(prefix_parts)
        samples["relay_prefix"] = relay.prefix_percentiles()
    if loaded_s > 0:
        # An NFE costs more when the request and publisher threads are busy too (the GIL, two
        # cores): admission must be calibrated for the load it will face, not an idle relay.
        # Measured in `rounds` rounds, each a saturated and an overload phase, so that a stall
        # met (or missed) by chance shows as spread between rounds instead of as the figure.
        got = []
        for r in range(max(1, rounds)):
            with history_frozen() as collected:
                got.append(_loaded_round(relay, client, nfe, loaded_s, overload_x, bar, probe,
                                         f"round {r + 1}/{rounds}: "))  # fmt: skip
            got[-1]["client_gc_ns_max"] = collected["longest_ns"]
        for key in ("loaded_compute_ns", "loaded_nfe_done", "loaded_delivery_ns",
                    "loaded_action_delivery_ns", "overloaded_compute_ns",
                    "overloaded_nfe_done", "overloaded_delivery_ns",
                    "overloaded_action_delivery_ns"):
            if key in got[0]:
                samples[key] = np.concatenate([r[key] for r in got])
        for key in ("loaded_step_ns_p99", "overloaded_step_ns_p99"):  # the worst round's
            if key in got[0]:
                samples[key] = max(r[key] for r in got)
        if overload_x > 0:
            samples["overloaded_requests"] = sum(r["overloaded_requests"] for r in got)
            samples["overloaded_rate_rps"] = max(r["overloaded_rate_rps"] for r in got)
            samples["overloaded_s"] = max(r["overloaded_s"] for r in got)
        samples["rounds"] = got
        if raw.two_phase:
            samples["loaded_relay_prefix"] = relay.prefix_percentiles()
    return samples


@contextlib.contextmanager
def history_frozen() -> Iterator[dict]:
    """The collector on, but blind to what this process kept before the block (gc.freeze);
    yields {"longest_ns": the longest collection in the block}, filled at its end.

    This client keeps every answer of the calibration, so a full collection late in it walks
    tens of thousands of objects (tens of ms here) while its callbacks wait, and the answers'
    way out would carry a pause that a robot's node, which does not keep its history, never
    has. Frozen, a collection walks only the block's own objects, as a robot node's would."""
    found = {"longest_ns": 0}
    began = [0]

    def timed(phase: str, _info: dict) -> None:
        now = time.perf_counter_ns()
        if phase == "start":
            began[0] = now
        else:
            found["longest_ns"] = max(found["longest_ns"], now - began[0])

    gc.collect()
    gc.freeze()
    gc.callbacks.append(timed)
    try:
        yield found
    finally:
        gc.callbacks.remove(timed)
        gc.unfreeze()


@contextlib.contextmanager
def _probing(probe: tuple[int | None, int] | None, seconds: float) -> Iterator[dict]:
    """The host latency probe (bench/latency.py) on probe = (CPU or None, priority; 0 is normal
    scheduling) for `seconds` next to the block; the dict it yields gets its summary ({} with
    no probe)."""
    found: dict = {}
    if probe is None:
        yield found
        return
    thread = threading.Thread(target=lambda: found.update(
        latency.probe(probe[0], probe[1], seconds, stalls=True)),
        name="bench-calibrate-probe")  # fmt: skip
    thread.start()
    try:
        yield found
    finally:
        thread.join()


def _merge_probes(parts: list[dict]) -> dict:
    """Probe summaries as one (a round's phases, or every round): the largest tail, summed
    counts, and every late wake-up kept (`stalls_ns`) pooled."""
    parts = [p for p in parts if p]
    if not parts:
        return {}
    out = {k: max(p[k] for p in parts) for k in PROBE_TAIL_KEYS}
    out.update({k: sum(p[k] for p in parts) for k in ("samples", "over_1ms", "steal_ms",
                                                       "seconds")})
    out["stalls_ns"] = [v for p in parts for v in p.get("stalls_ns", ())]
    out.update(cpu=parts[0]["cpu"], priority=parts[0]["priority"], refused=parts[0]["refused"])
    return out


def _loaded_round(relay, client, nfe: int, loaded_s: float, overload_x: float,
                  bar: Progress | None, probe: tuple[int | None, int] | None,
                  label: str) -> dict:  # fmt: skip
    """One round: the lanes saturated for loaded_s, then overload_x times that capacity offered
    open loop for overload_seconds(), the relay's step p99 read at the end of each, the latency
    probe beside each (probe not None). Each answer's way out (its publish -> this client's
    callback) is kept, every answer of both phases."""
    if bar is not None:
        bar.update(label=f"{label}saturated {loaded_s:g} s")
    lanes = relay.lanes  # W x B with batch slots
    steps: list[tuple[float, float, int]] = []
    # read at the last moment every lane is still busy: the relay's own per-step timing,
    # whose tail a request's mean per NFE (over its nfe steps) smooths away
    with _probing(probe, loaded_s) as probed:
        answers = saturate(client, lanes, nfe, loaded_s, "bench-calibrate-load",
                           at_end=lambda: steps.append(relay.nfe_percentiles()))
    out: dict = {"loaded_step_ns_p99": steps[0][1] if steps else 0.0}
    out.update(answer_samples("loaded", answers))
    probes = [probed]
    if overload_x > 0:
        per_nfe = (sum(a.compute_ns for a in answers)
                   / max(1, sum(a.nfe_done for a in answers)))  # fmt: skip
        rate = overload_x * lanes * 1e9 / (nfe * max(per_nfe, 1.0))
        over_s = overload_seconds(loaded_s, per_nfe)
        if bar is not None:
            bar.update(label=f"{label}{overload_x:g}x capacity for {over_s:.1f} s")
        with _probing(probe, over_s) as probed:
            out["overloaded_step_ns_p99"], out["overloaded_requests"], over = (
                overloaded_steps(relay, client, rate, over_s, nfe))
        probes.append(probed)
        ran = answer_samples("overloaded", [a for a in over if a.nfe_done],
                             min_nfe=math.ceil(nfe / 2))
        every = answer_samples("overloaded", over)  # every answer's way out, expired ones too
        ran["overloaded_delivery_ns"] = every["overloaded_delivery_ns"]
        ran["overloaded_action_delivery_ns"] = every["overloaded_action_delivery_ns"]
        out.update(ran)
        out.update(overloaded_rate_rps=rate, overloaded_s=over_s)
    out["probe"] = _merge_probes(probes)
    return out


def inline(relay, client, mean_nfe: float, requests: int, loaded_s: float) -> dict:
    """The short calibration a bench runs on its own relay before its trace (overload,
    nfe-breakdown): `requests` requests of the trace's mean NFE alternating with ten times as
    many raw NFEs in four blocks, then `loaded_s` saturated and the overload phase; summarized."""
    nfe = max(1, round(mean_nfe))
    return summarize(measure(relay, client, requests, nfe, 10 * requests, 4, loaded_s=loaded_s),
                     nfe)


def capacity(cal: dict, mean_nfe: float, workers: int = 1,
             slots: int = 1) -> tuple[float, float, float]:
    """What W x B lanes complete, from an inline calibration, for requests of `mean_nfe` NFE:
    (requests/s, ns per NFE, service ns per request). At B = 1 an NFE costs the sequential relay
    compute; at B > 1 a lone request runs one-row steps, so the saturated (full-batch) cost per
    lane NFE counts; a two-phase package adds its median prefix pass once per request."""
    ns_per_nfe = cal["relay_compute_ns_per_nfe_mean" if slots == 1
                     else "loaded_compute_ns_per_nfe_mean"]
    service_ns = mean_nfe * ns_per_nfe + cal.get("relay_prefix_ns_p50", 0.0)
    return capacity_rps(workers * slots, mean_nfe, service_ns / mean_nfe), ns_per_nfe, service_ns


def overload_seconds(loaded_s: float, step_ns: float) -> float:
    """How long the overload phase offers its load: loaded_s, or long enough for RING_FILL x
    NFE_HISTORY steps of step_ns (each row's NFE cost at saturation is one step), so that the
    step p99 read at its end is over this phase's steps only; at most RING_FILL_CAP x loaded_s."""
    fill_s = RING_FILL * NFE_HISTORY * step_ns * 1e-9
    return max(loaded_s, min(fill_s, RING_FILL_CAP * loaded_s))


def answer_samples(phase: str, answers: list, min_nfe: int = 1) -> dict[str, np.ndarray]:
    """Per answer of a phase: its way out (relay publish, the header stamp -> the client's
    callback) and, for the answers that ran at least min_nfe NFEs, its compute and NFE done.
    Under overload most requests expire part way (admission is off); one cut short after a few
    steps carries the dispatch, the expiry and any stall around those few, so its compute per
    NFE is a per-request cost over a small count (in the 3x phase up to 20x an NFE's), not what
    an NFE of an admitted request costs."""
    column = lambda xs, f: np.asarray([f(a) for a in xs], np.int64)  # noqa: E731
    ran = [a for a in answers if a.nfe_done >= min_nfe]
    return {f"{phase}_compute_ns": column(ran, lambda a: a.compute_ns),
            f"{phase}_nfe_done": column(ran, lambda a: a.nfe_done),
            f"{phase}_delivery_ns": column(answers, lambda a: a.received_ns - a.published_ns),
            f"{phase}_action_delivery_ns": column(
                [a for a in answers if a.code == INFERENCE],
                lambda a: a.received_ns - a.published_ns)}


def overloaded_steps(relay, client, rate_rps: float, seconds: float, nfe: int,
                     slack_ns: int = 100_000_000) -> tuple[float, int, list]:  # fmt: skip
    """Offer rate_rps requests of nfe NFE (deadline: send time + slack_ns) for `seconds`, open
    loop. Admission is off, so the queue's capacity and dispatch expiry shed what the lanes
    cannot take: every lane computes while the request and publisher paths carry an overload's
    arrivals, as they will when admission matters. Returns the p99 of the relay's own per-step
    time, read when the sending stops, the requests sent and their answers; waits for every
    answer."""
    keys: list[tuple[str, int]] = []
    gap_ns = 1e9 / rate_rps
    with collector_paused():
        start = time.monotonic_ns()
        n = int(seconds * 1e9 / gap_ns)
        for i in range(n):
            delay = start + int(i * gap_ns) - time.monotonic_ns()
            if delay > 0:
                time.sleep(delay * 1e-9)
            req = client.request(f"bench-calibrate-overload-{i % 4}", client.next_sequence(),
                                 nfe, noise_seed=i)  # fmt: skip
            client.send(req, slack_ns=slack_ns)
            keys.append((req.session_id, req.sequence))
        _, step_p99, _ = relay.nfe_percentiles()
        client.wait_keys(keys, slack_ns * 1e-9 + 10.0)
    wait_idle(relay)
    return step_p99, len(keys), [client.answers[k] for k in keys if k in client.answers]


def _per_nfe(total_ns: np.ndarray, nfe_done: np.ndarray, prefix_ns: float) -> np.ndarray:
    """ns per NFE of whole requests, their prefix pass (the relay's median) taken out."""
    return np.maximum(total_ns - prefix_ns, 0) / np.maximum(nfe_done, 1)


def _stall_max(samples: dict, q: float = 100.0) -> float:
    """The longest (q: that percentile of how long) a saturated request's compute ran over its
    NFEs at the median per-NFE cost: the largest stall (preemption, a hypervisor's steal, the
    kernel's share for normal tasks) one request met while the relay was busy. A reserve below
    it lets an admitted request that meets such a stall end late."""
    compute, nfe_done = samples.get("loaded_compute_ns"), samples.get("loaded_nfe_done")
    if compute is None or len(compute) == 0:
        return 0.0
    per_nfe = float(np.median(compute / np.maximum(nfe_done, 1)))
    return float(max(np.percentile(compute - nfe_done * per_nfe, q), 0.0))


def stall_at_share(stalls_ns, seconds: float, share: float) -> float:
    """The shortest stall X such that the host spent at most `share` of the probed `seconds`
    stalled past X: sum((L - X)+) over the probe's late wake-ups L. An admitted request is late
    when a stall runs past what its reserve holds, and the requests a stall makes late are about
    those the relay would have finished while it ran past that: their share of the requests is
    the time's share, so a stall's weight is its length, not one sample of many (a 40 ms steal
    is one late wake-up of a probe that wakes every ms, and 40 ms of requests)."""
    values = np.sort(np.asarray(stalls_ns, np.float64))[::-1]
    budget = round(share * seconds * 1e9)  # whole ns, as the stalls are
    total = 0.0
    for k, value in enumerate(values, 1):
        total += value
        # with the k longest past X: sum = total - k X, down to the next one
        x = (total - budget) / k
        if x >= (values[k] if k < len(values) else 0.0):
            return max(x, 0.0)
    return 0.0


def pooled_tail(stalls_ns, samples: int, q: float) -> float:
    """The q percentile of a probe's late wake-ups, pooled over its parts, from those it kept
    (every one of latency.STALL_KEEP_NS or more): the k-th longest, k the samples past q; 0
    when fewer were kept (the tail is under STALL_KEEP_NS)."""
    k = max(1, round(samples * (100.0 - q) / 100.0))
    values = np.sort(np.asarray(stalls_ns, np.float64))[::-1]
    return float(values[k - 1]) if len(values) >= k else 0.0


def probe_parts(probe: dict) -> tuple[float, float]:
    """A probe's (pooled or one round's) two measures of the stall at STATED_Q: its STATED_Q late
    wake-up, and the stall past which the host spent at most 1 - STATED_Q of the probed time
    (stall_at_share); (0, 0) without a probe."""
    if not probe:
        return 0.0, 0.0
    stalls = probe.get("stalls_ns")
    if stalls is None:  # a probe that kept none: its own summary's tail
        return float(probe.get("late_ns_p99_9", 0.0)), 0.0
    share = (100.0 - STATED_Q) / 100.0
    return (pooled_tail(stalls, int(probe.get("samples", 0)), STATED_Q),
            stall_at_share(stalls, float(probe.get("seconds", 0.0)), share))


def probe_stall(probe: dict, whole: bool) -> float:
    """What the reserve's stall part takes from a probe (pooled or one round's): its longest
    (whole: the real-time mode), else the larger of its two measures at STATED_Q (probe_parts)."""
    if whole:
        return float(probe.get("late_ns_max", 0.0)) if probe else 0.0
    return max(probe_parts(probe))


def step_bound(rounds: list[dict[str, float]]) -> float:
    """The relay's step p99 for nfe_ns: each round's larger of saturated and 3x, at ROUNDS_Q
    over the rounds (the upper quartile: conservative, and not one round's draw)."""
    values = [max(r["step_saturated_ns_p99"], r["step_3x_ns_p99"]) for r in rounds]
    return float(np.percentile(values, ROUNDS_Q)) if values else 0.0


def stall_bound(rounds: list[dict[str, float]]) -> float:
    """The reserve's stall part at normal scheduling: STALL_FACTOR x the rounds' median of each
    round's stall figure (the larger of its saturated requests' stall and PROBE_WAKEUPS of its
    probe's late wake-ups, at STATED_Q), or the rounds' median time-share stall where that is
    longer. Pooled, or at the rounds' upper quartile, one or two rounds' stall of tens of ms
    set it, and the reserve followed the draw; the median does not move for fewer than half
    the rounds (a stall met in more is the host's, and the time-share puts it in whole), and
    the factor covers the round-to-round spread of the count-based p99.9 (STALL_FACTOR)."""
    if not rounds:
        return 0.0
    counted = STALL_FACTOR * float(np.median([r["stall_ns"] for r in rounds]))
    return max(counted, float(np.median([r.get("probe_share_ns", 0.0) for r in rounds])))


def _round_figures(r: dict, prefix_ns: float, whole_stall: bool) -> dict[str, float]:
    """One round's own figures, in ns: what nfe_ns and the reserve would be from it alone."""
    per_nfe = _per_nfe(r["loaded_compute_ns"], r["loaded_nfe_done"], prefix_ns)
    out = np.concatenate([r[k] for k in ("loaded_delivery_ns", "overloaded_delivery_ns")
                          if k in r])  # fmt: skip
    probe = r.get("probe") or {}
    probe_p99_9, probe_share = probe_parts(probe)
    f = {
        "step_saturated_ns_p99": float(r["loaded_step_ns_p99"]),
        "step_3x_ns_p99": float(r.get("overloaded_step_ns_p99", 0.0)),
        "compute_saturated_ns_per_nfe_p99": percentiles(per_nfe, (99,))[0],
        "stall_saturated_ns": _stall_max(r, 100.0 if whole_stall else STATED_Q),
        "way_out_ns": percentiles(out, (STATED_Q,))[0],
        "probe_late_ns": probe_stall(probe, whole_stall),
        "probe_p99_9_ns": probe_p99_9,  # probe_late_ns's parts at normal scheduling
        "probe_share_ns": probe_share,
        "probe_late_ns_max": float(probe.get("late_ns_max", 0.0)),
        "client_gc_ns_max": float(r.get("client_gc_ns_max", 0.0)),  # for the record
    }
    f["nfe_ns"] = max(f["step_saturated_ns_p99"], f["step_3x_ns_p99"],
                      f["compute_saturated_ns_per_nfe_p99"])
    # at normal scheduling the round's count-based figures, the probe's as PROBE_WAKEUPS late
    # wake-ups (the time-share weighs one long stall by its length, and whether a round meets
    # one is a draw: it counts through the rounds' median, stall_bound); the reserve is what
    # stall_bound makes of this round alone
    f["stall_ns"] = max(f["stall_saturated_ns"], f["probe_late_ns"] if whole_stall
                        else PROBE_WAKEUPS * f["probe_p99_9_ns"])
    f["reserve_ns"] = f["way_out_ns"] + (f["stall_ns"] if whole_stall else stall_bound([f]))
    return f


def _way_out(rounds: list[dict[str, float]], pooled_ns: float, whole_stall: bool) -> float:
    """The answer's way out at STATED_Q. At normal scheduling, the rounds' median: a round whose
    tail is far above the others met a stall on the way out (a neighbour's time slice over the
    subscriber), and a stall is held at its percentile and its excess named, as the stall part
    is (§11), not recommended as a draw. In the real-time mode the worst round's, whole."""
    if not rounds:
        return pooled_ns
    values = [r["way_out_ns"] for r in rounds]
    return float(max(values) if whole_stall else np.median(values))


def unsteady(rounds: list[dict[str, float]], bounds: dict) -> list[str]:
    """The figures (bounds: name -> the recommended value from a list of rounds) that did not
    reproduce within the calibration: leaving out a quarter of the rounds (at least one), any
    of them, moves the recommended value more than REPRODUCE_TOL. Rounds that merely spread do
    not count (a stall met in one round of eight comes in most calibrations on a busy host, and
    the values are built not to follow it); values that hang on which rounds ran do: the rounds
    split into calm and stalled ones, or the host changed part way. With one round there is
    nothing to leave out."""
    out: list[str] = []
    if len(rounds) < 2:
        return out
    left = max(1, len(rounds) // 4)
    for name, bound in bounds.items():
        full = bound(rounds)
        if full <= 0:
            continue
        moved = max(abs(bound([r for i, r in enumerate(rounds) if i not in drop]) - full)
                    for drop in itertools.combinations(range(len(rounds)), left))
        if moved > REPRODUCE_TOL * full:
            out.append(name)
    return out


def spread(rounds: list[dict[str, float]]) -> dict[str, dict]:
    """Per figure over the rounds: median, min, max, the largest deviation from the median as a
    fraction of it, and whether every round is within REPRODUCE_TOL of the median."""
    out = {}
    for key in rounds[0] if rounds else ():
        values = np.asarray([r[key] for r in rounds], np.float64)
        med = float(np.median(values))
        dev = float(np.max(np.abs(values - med)) / med) if med > 0 else 0.0
        out[key] = {"median": med, "min": float(values.min()), "max": float(values.max()),
                    "spread": dev, "reproduced": dev <= REPRODUCE_TOL}  # fmt: skip
    return out


def summarize(samples: dict, nfe: int, margin: float = 1.0, whole_stall: bool = False) -> dict:
    """Percentiles and the recommendation (every value in ns). whole_stall: the latency probe's
    longest late wake-up goes into the reserve (the real-time mode), else its STATED_Q."""
    two_phase = "relay_prefix" in samples
    pre = samples.get("relay_prefix", (0.0, 0.0, 0))
    loaded_pre = samples.get("loaded_relay_prefix", pre)
    series = {
        "raw_ns_per_nfe": samples["raw_nfe_ns"],
        "relay_compute_ns_per_nfe": _per_nfe(samples["compute_ns"], samples["nfe_done"], pre[0]),
        "e2e_ns_per_nfe": _per_nfe(samples["e2e_ns"], samples["nfe_done"], pre[0]),
        "fixed_overhead_ns": samples["e2e_ns"] - samples["compute_ns"],
        "e2e_ns": samples["e2e_ns"],
    }
    if two_phase:
        series["raw_ns_per_prefix"] = samples["raw_prefix_ns"]
    for phase in ("loaded", "overloaded"):  # saturated; 3x offered (half its NFE or more)
        if f"{phase}_compute_ns" in samples:
            series[f"{phase}_compute_ns_per_nfe"] = _per_nfe(
                samples[f"{phase}_compute_ns"], samples[f"{phase}_nfe_done"], loaded_pre[0])
    report: dict[str, object] = {"two_phase": two_phase}
    for name, values in series.items():
        p50, p99, p999 = percentiles(values, QS)
        report[f"{name}_p50"] = p50
        report[f"{name}_p99"] = p99
        report[f"{name}_p99_9"] = p999
        report[f"{name}_max"] = float(np.max(values)) if len(values) else 0.0
        report[f"{name}_mean"] = float(np.mean(values)) if len(values) else 0.0
    for key in ("loaded_step_ns_p99", "overloaded_step_ns_p99", "overloaded_rate_rps",
                "overloaded_s"):
        report[key] = float(samples.get(key, 0.0))
    report["overloaded_requests"] = int(samples.get("overloaded_requests", 0))
    # each round's figures, and the reserve in its two parts: the
    # answer's way to the subscriber (from the end of its last NFE, what the fixed part's p99
    # covers idle, and publish -> callback at STATED_Q saturated and at 3x) and the stall a
    # request can meet on the way (the longest a saturated request met; the latency probe's)
    rounds = [_round_figures(r, loaded_pre[0], whole_stall) for r in samples.get("rounds", ())]
    report["rounds"] = rounds
    # the relay's step p99 at the rounds' upper quartile (without rounds: the phases' own)
    report["step_ns"] = (step_bound(rounds) if rounds else
                         max(report["loaded_step_ns_p99"], report["overloaded_step_ns_p99"]))
    bound = max(report["e2e_ns_per_nfe_p99"], report.get("loaded_compute_ns_per_nfe_p99", 0.0),
                report["step_ns"])
    report["recommended_nfe_ns"] = _us_ceil(margin * bound)
    report["loaded_stall_ns_max"] = _stall_max(samples)
    report["spread"] = spread(rounds)
    worst = lambda key: max((r[key] for r in rounds), default=0.0)  # noqa: E731
    # the stall at STATED_Q, of the requests and of the probed time (normal scheduling: a
    # neighbour's time slice comes and goes, and its longest is a draw), STALL_FACTOR x the
    # rounds' median of each round's figure (stall_bound); or whole (the real-time mode: the host's
    # own, rare and short, the longest of every round). The rounds pooled, for the record: the
    # requests' stall and the probe's two measures, printed apart
    probes = [r["probe"] for r in samples.get("rounds", ()) if r.get("probe")]
    pooled_probe = _merge_probes(probes) if probes else {}
    out = [samples[k] for k in ("loaded_delivery_ns", "overloaded_delivery_ns")
           if len(samples.get(k, ()))]  # fmt: skip
    pooled_out = percentiles(np.concatenate(out), (STATED_Q,))[0] if out else 0.0
    report["way_out_ns"] = max(report["fixed_overhead_ns_p99"],
                               _way_out(rounds, pooled_out, whole_stall))
    report["way_out_ns_worst"] = max(report["way_out_ns"], worst("way_out_ns"))
    report["probe_stall_ns"] = probe_stall(pooled_probe, whole_stall)
    if pooled_probe:
        report["probe_stall_p99_9_ns"], report["probe_stall_share_ns"] = probe_parts(
            pooled_probe)
    report["loaded_stall_ns_pooled"] = _stall_max(samples, 100.0 if whole_stall else STATED_Q)
    report["stall_ns_pooled"] = max(report["loaded_stall_ns_pooled"], report["probe_stall_ns"])
    report["stall_ns"] = (stall_bound(rounds) if rounds and not whole_stall
                          else report["stall_ns_pooled"])
    report["probe_late_ns_max"] = worst("probe_late_ns_max")
    report["client_gc_ns_max"] = worst("client_gc_ns_max")
    report["stall_quantile"] = "max" if whole_stall else f"p{STATED_Q:g}"
    report["recommended_admission_reserve_ns"] = _us_ceil(
        margin * (report["way_out_ns"] + report["stall_ns"]))
    # did the calibration reproduce within itself: would the values move without any one round
    # (the pooled figures held as they are)
    floor_nfe = max(report["e2e_ns_per_nfe_p99"], report.get("loaded_compute_ns_per_nfe_p99", 0))
    way = lambda rs: max(report["fixed_overhead_ns_p99"],  # noqa: E731
                         _way_out(rs, pooled_out, whole_stall))
    stall = ((lambda rs: max(r["stall_ns"] for r in rs)) if whole_stall  # noqa: E731
             else stall_bound)
    report["not_reproduced"] = unsteady(rounds, {
        "nfe_ns": lambda rs: max(floor_nfe, step_bound(rs)),
        "reserve_ns": lambda rs: way(rs) + stall(rs), "way_out_ns": way, "stall_ns": stall})
    # the pooled probe's summary, its late wake-ups counted rather than listed
    report["host_latency"] = ({k: v for k, v in pooled_probe.items() if k != "stalls_ns"}
                              | {"stalls_kept": len(pooled_probe["stalls_ns"])}
                              if pooled_probe else None)  # fmt: skip
    # §5.4: with real-time chunking, work past its bound expires at the robot's switch row
    # instead of reaching it late, while every action period the bound adds freezes one row
    # more: nfe_ns bounds the p99 request per NFE (idle, saturated, at 3x), not the p99 step,
    # and the reserve covers the answer's way out (the fixed part, and the longest publish ->
    # callback under load), not a stall
    per_request = ("relay_compute_ns_per_nfe", "loaded_compute_ns_per_nfe",
                   "overloaded_compute_ns_per_nfe")  # idle, saturated, 3x offered
    report["recommended_rtc_nfe_ns"] = _us_ceil(margin * max(
        report[f"{name}_p99"] for name in per_request if name in series))
    # the way out per phase and per kind of answer: the answers that carried actions apart
    # (for the record) from every answer, refusals and expiries included, which come in bursts
    # when the 3x phase's queue sheds (admission is off there); the longest of every answer,
    # saturated and at 3x, is the real-time chunking reserve
    for phase, name in (("loaded", "saturated"), ("overloaded", "3x")):
        for kind, what in (("delivery", "every_answer"), ("action_delivery", "actions")):
            v = samples.get(f"{phase}_{kind}_ns", ())
            report[f"way_out_{name}_{what}_ns_max"] = float(np.max(v)) if len(v) else 0.0
            report[f"way_out_{name}_{what}_ns_p99_9"] = (
                percentiles(v, (STATED_Q,))[0] if len(v) else 0.0)
    report["loaded_delivery_ns_max"] = max(report["way_out_saturated_every_answer_ns_max"],
                                           report["way_out_3x_every_answer_ns_max"])
    report["recommended_rtc_reserve_ns"] = _us_ceil(
        margin * max(report["fixed_overhead_ns_p99"], report["loaded_delivery_ns_max"]))
    report["recommended_prefix_ns"] = 0
    if two_phase:
        # the relay's workers time each prefix pass; p50/p99 over its recent passes per phase
        report["relay_prefix_ns_p50"], report["relay_prefix_ns_p99"] = pre[0], pre[1]
        report["relay_prefix_samples"] = pre[2]
        if "loaded_relay_prefix" in samples:
            report["loaded_prefix_ns_p50"] = loaded_pre[0]
            report["loaded_prefix_ns_p99"] = loaded_pre[1]
            report["loaded_prefix_samples"] = loaded_pre[2]
        prefix_bound = max(pre[1], report.get("loaded_prefix_ns_p99", 0.0))
        report["recommended_prefix_ns"] = _us_ceil(margin * prefix_bound)
    # A tail far above the median means stalls (other processes, throttling), not the model.
    tail = report["raw_ns_per_nfe_p99"] / max(report["raw_ns_per_nfe_p50"], 1.0)
    report["raw_tail_ratio"] = tail
    report["noisy_host"] = bool(tail > NOISY_TAIL_RATIO)
    report["nfe_per_request"] = nfe
    report["requests"] = int(len(samples["e2e_ns"]))
    report["raw_nfe_samples"] = int(len(samples["raw_nfe_ns"]))
    if two_phase:
        report["raw_prefix_samples"] = int(len(samples["raw_prefix_ns"]))
    report["margin"] = margin
    return report


def run(args: argparse.Namespace) -> dict:
    host = host_info()  # load average before this run adds its own
    requests, nfe, raw_nfe, blocks, loaded_s, rounds = SIZES["quick" if args.quick else "full"]
    requests = args.requests or requests
    nfe = args.nfe or nfe
    rounds = args.rounds or rounds
    path = model_path(args.model)
    info = load_served(path)
    params = dict(model_path=path, workers=args.workers, max_nfe=max(64, nfe),
                  batch_slots=args.batch_slots, **realtime.realtime_params(args))
    # the probe where the relay's workers run: at normal scheduling anywhere, at normal
    # priority, where a neighbour's time slice is what holds a worker off; in the real-time
    # mode on the workers' CPU one priority above them, as overload --realtime runs it
    probe = (None if args.no_latency_probe else
             (args.rt_worker_cpus[0], realtime.RT_PRIORITIES["worker"] + 1) if args.realtime
             else (None, 0))  # fmt: skip
    with Progress("calibrate", requests, unit=" req") as bar:
        bar.update(label="starting relay")
        # the answers reach an ordinary rclpy subscriber, as a robot's node receives them
        with (relay_for_bench(args.in_process, env=realtime.realtime_env(args), plain=True,
                              **params) as (relay, client),
              realtime.realtime_client(args) as client_mode):  # fmt: skip
            applied = realtime.applied_settings(relay)
            warm_up(client)
            samples = measure(relay, client, requests, nfe, raw_nfe, blocks, bar, loaded_s,
                              rounds=rounds, probe=probe)  # fmt: skip
            nfe_p50, nfe_p99, _ = relay.nfe_percentiles()
    report = summarize(samples, nfe, args.margin, whole_stall=args.realtime)
    report.update(
        mode=realtime.mode(args),
        client_mode=client_mode,
        realtime_applied=applied,
        realtime=({"asked": realtime.realtime_params(args),
                   "env": realtime.realtime_env(args) or {}} if args.realtime else None),
        rounds_run=rounds if loaded_s > 0 else 0,
        model=path.rstrip("/").rsplit("/", 1)[-1],
        model_digest=info.digest,
        workers=args.workers,
        batch_slots=args.batch_slots,
        size="quick" if args.quick else "full",
        host=host,
        worker_nfe_p50_ns=nfe_p50,  # the pool's own per-NFE timing (sampler.nfe() only)
        worker_nfe_p99_ns=nfe_p99,
        method=(
            f"{report['requests']} sequential requests of {nfe} NFE through the real relay over "
            f"DDS (admission off, {args.workers} worker(s), relay "
            f"{'in the bench process' if args.in_process else 'as its own process'}), "
            "alternating with "
            f"{report['raw_nfe_samples']} raw sampler nfe() calls on a separate session"
            + (f" and {report['raw_prefix_samples']} raw prefix() passes; per-NFE figures "
               "without the relay's median prefix pass" if report["two_phase"] else "")
            + (f"; then {rounds} round(s) of {loaded_s:g} s with every lane saturated and up to "
               f"{report.get('overloaded_s', loaded_s):.1f} s with "
               f"{OVERLOAD_X:g}x that capacity offered open loop "
               f"({report['overloaded_requests']} requests in all), the relay's step p99 read "
               "at the end of each, the answers received by an ordinary rclpy subscriber in a "
               "node that also publishes the requests"
               + ("" if probe is None else ", the host latency probe running beside each phase")
               if loaded_s > 0 else "")
        ),
        caveat=CAVEAT,
        rows=_rows(report),
    )
    report["samples"] = {
        "e2e_ns_per_nfe": _per_nfe(
            samples["e2e_ns"], samples["nfe_done"], report.get("relay_prefix_ns_p50", 0.0)
        ).tolist(),
        "relay_compute_ns_per_nfe": _per_nfe(
            samples["compute_ns"], samples["nfe_done"], report.get("relay_prefix_ns_p50", 0.0)
        ).tolist(),
        "raw_ns_per_nfe": samples["raw_nfe_ns"].tolist(),
    }
    if report["two_phase"]:
        report["samples"]["raw_ns_per_prefix"] = samples["raw_prefix_ns"].tolist()
    return report


def _rows(r: dict) -> list[dict]:
    names = [
        ("raw onnxruntime ns/NFE", "raw_ns_per_nfe"),
        ("relay compute ns/NFE", "relay_compute_ns_per_nfe"),
        ("end-to-end ns/NFE", "e2e_ns_per_nfe"),
        ("fixed part (e2e - compute)", "fixed_overhead_ns"),
        ("relay compute ns/NFE, saturated", "loaded_compute_ns_per_nfe"),
        ("relay compute ns/NFE, 3x offered", "overloaded_compute_ns_per_nfe"),
        ("raw onnxruntime ns/prefix pass", "raw_ns_per_prefix"),
        ("relay prefix pass (worker-timed)", "relay_prefix_ns"),
        ("relay prefix pass, saturated", "loaded_prefix_ns"),
    ]
    names = [(label, key) for label, key in names if f"{key}_p50" in r]

    def us(key: str) -> float | None:  # the relay reports p50 and p99 of its prefix passes only
        return round(r[key] / 1e3, 1) if key in r else None

    return [
        {
            "measure": label,
            "p50_us": us(f"{key}_p50"),
            "p99_us": us(f"{key}_p99"),
            "p99.9_us": us(f"{key}_p99_9"),
            "max_us": us(f"{key}_max"),
        }
        for label, key in names
    ]


def table(report: dict) -> str:
    from flowedge_relay_tools.bench.tables import format_rows

    lines = [
        f"calibrate: {report['method']}",
        format_rows(report["rows"]),
        f"recommended nfe_ns               = {report['recommended_nfe_ns']:>10d}"
        f"  (max of the p99 of e2e and of saturated compute ns per NFE, every round's requests "
        f"pooled, and the relay's step p99 saturated and at {OVERLOAD_X:g}x at the rounds' "
        f"p{ROUNDS_Q:g}, x margin {report['margin']:g})",
        f"  relay step p99: {report.get('step_ns', 0.0) / 1e3:.0f} us at the rounds' "
        f"p{ROUNDS_Q:g}; the worst round's saturated "
        f"{report.get('loaded_step_ns_p99', 0.0) / 1e3:.0f} us, at "
        f"{OVERLOAD_X:g}x capacity ({report.get('overloaded_rate_rps', 0.0):.0f} requests/s, "
        f"{report.get('overloaded_requests', 0)} sent) "
        f"{report.get('overloaded_step_ns_p99', 0.0) / 1e3:.0f} us",
        f"recommended admission_reserve_ns = {report['recommended_admission_reserve_ns']:>10d}"
        f"  = (the answer's way out {report['way_out_ns'] / 1e3:.0f} us + stall "
        f"{report['stall_ns'] / 1e3:.0f} us) x margin",
        f"  the answer's way out: the larger of the fixed part's p99 (idle, both ways) and "
        f"publish -> an rclpy subscriber's callback at p{STATED_Q:g}, saturated and at "
        f"{OVERLOAD_X:g}x (every round's answers)",
        "  stall: " + stall_text(report),
        f"  so a lone request of {report['nfe_per_request']} NFE is admitted with a slack of at "
        f"least {lone_slack_ns(report) / 1e6:.1f} ms (NFE x nfe_ns + the reserve); work queued "
        "ahead of it adds its own",
        *spread_lines(report),
        f"  with real-time chunking (prefix requests): nfe_ns = {report['recommended_rtc_nfe_ns']}"
        f" (the p99 request's compute per NFE, idle, saturated and at {OVERLOAD_X:g}x), "
        f"admission_reserve_ns = {report['recommended_rtc_reserve_ns']} (the answer's way out: "
        f"the p99 fixed part or the longest publish -> callback under load, "
        f"{report.get('loaded_delivery_ns_max', 0.0) / 1e3:.0f} us); work past that bound "
        "expires at the row the robot switches at, and every action period the bound adds "
        "freezes one row more (docs/design.md §5.4)",
    ]
    command = (f"  flowedge-relayd --nfe-ns {report['recommended_nfe_ns']} "
               f"--admission-reserve-ns {report['recommended_admission_reserve_ns']}")
    if report["two_phase"]:
        lines.append(
            f"recommended prefix_ns            = {report['recommended_prefix_ns']:>10d}"
            "  (max p99 of the relay's prefix passes, idle and saturated, x margin)"
        )
    ros_args = [f"prefix_ns:={report['recommended_prefix_ns']}"] if report["two_phase"] else []
    if report.get("batch_slots", 1) > 1:  # nfe_ns is then per batched step of that many rows
        ros_args.append(f"batch_slots:={report['batch_slots']}")
    if ros_args:
        command += " --ros-args" + "".join(f" -p {a}" for a in ros_args)
    lines += [command, "caveat: " + report["caveat"]]
    if report["noisy_host"]:
        lines.append(
            f"WARNING: raw NFE p99 is {report['raw_tail_ratio']:.1f}x its p50: this host stalls "
            "(other load, throttling); the tail, and so the recommendation, measures the stalls. "
            "Calibrate on a quiet host with the deployed CPU affinity."
        )
    return "\n".join(lines)


def lone_slack_ns(report: dict) -> int:
    """The least slack with which the recommended values admit a lone request of the
    calibration's NFE count: below it nothing of that size is promised on this host."""
    return (report["nfe_per_request"] * report["recommended_nfe_ns"]
            + report["recommended_admission_reserve_ns"])


def stall_text(report: dict) -> str:
    """What the reserve's stall part covers, and which requests it cannot promise."""
    probe = report.get("host_latency") or {}
    q = report["stall_quantile"]
    us = lambda key: f"{report.get(key, 0.0) / 1e3:.0f} us"  # noqa: E731
    share = f"the stall past which the host spent at most {100 - STATED_Q:g}% of the"
    if q == "max":
        request = f"the longest stall a saturated request met ({us('loaded_stall_ns_max')})"
    else:
        request = (f"the {q} stall a saturated request met ({us('loaded_stall_ns_pooled')}, "
                   f"longest {us('loaded_stall_ns_max')})")
    if probe:
        where = ("at normal priority" if not probe["priority"]
                 else f"on CPU {probe['cpu']} at SCHED_FIFO {probe['priority']}")
        probed = (f"the host latency probe's {where} beside the saturated and {OVERLOAD_X:g}x "
                  "phases: " + ("its longest late wake-up" if q == "max" else
                                f"its {q} late wake-up ({us('probe_stall_p99_9_ns')}) and "
                                f"{share} {probe['seconds']:.0f} s probed "
                                f"({us('probe_stall_share_ns')})"))
    if q != "max" and report.get("rounds"):  # STALL_FACTOR x the rounds' median
        text = (f"{STALL_FACTOR:g} x the rounds' median of each round's larger of the {q} stall "
                "its saturated requests met" + (f" and {PROBE_WAKEUPS:g} x its probe's {q} late "
                                                f"wake-up, or the "
                                                f"rounds' median of {share} round's probed time "
                                                "where longer" if probe else "")
                + f": whether a round meets a long stall is a draw, and pooled one alone would "
                f"set the {q}; every round pooled, for the record: "
                + request + (f"; {probed}" if probe else " (no latency probe)"))
    else:
        text = f"the larger of {request}" + (f" and {probed}" if probe else " (no latency probe)")
    if not probe:
        return text
    text += (f" (p50 "
             f"{probe['late_ns_p50'] / 1e3:.0f} us, p{STATED_Q:g} "
             f"{probe['late_ns_p99_9'] / 1e3:.0f} us, max {probe['late_ns_max'] / 1e6:.1f} ms, "
             f"{probe['over_1ms']} over 1 ms, steal {probe['steal_ms']:.0f} ms)")
    if probe.get("refused"):
        text += f"; {probe['refused']}"
    beyond = (max(report["probe_late_ns_max"] - report["stall_ns"],
                  report["loaded_stall_ns_max"] - report["stall_ns"], 0.0)
              + report.get("way_out_ns_worst", 0.0) - report["way_out_ns"])
    if beyond > 0:
        text += (f". NOT PROMISED on this host: the values cover the host's stalls at "
                 f"{q} (on the way out: the rounds' median), and the longest, with the worst "
                 f"round's way out, was {beyond / 1e6:.1f} ms longer; "
                 f"a request whose slack is under its NFE x nfe_ns + "
                 f"{(report['recommended_admission_reserve_ns'] + beyond) / 1e6:.1f} ms (more with "
                 "work queued ahead of it) can end late when it meets one")
    return text


def spread_lines(report: dict) -> list[str]:
    """Each round's nfe_ns and reserve, their spread, and what did not reproduce (unsteady)."""
    rounds, sp = report.get("rounds") or [], report.get("spread") or {}
    if not rounds:
        return []
    cell = lambda key: " / ".join(f"{r[key] / 1e3:.0f}" for r in rounds)  # noqa: E731
    whole = report.get("stall_quantile") == "max"
    stall = ("the longest of every round's requests and probe" if whole
             else f"{STALL_FACTOR:g} x the rounds' median of each round's")
    lines = [f"  per round ({len(rounds)}), us: nfe_ns {cell('nfe_ns')} (spread "
             f"{sp['nfe_ns']['spread']:.0%}); reserve {cell('reserve_ns')} (spread "
             f"{sp['reserve_ns']['spread']:.0%}) = way out {cell('way_out_ns')} + "
             + ("" if whole else f"{STALL_FACTOR:g} x ") + f"stall "
             f"{cell('stall_ns')}" + ("" if whole else " (or the round's time-share stall, "
                                       f"{cell('probe_share_ns')}, where longer)")
             + "; recommended: nfe_ns from every round's requests pooled and the "
             f"step p99 at the rounds' p{ROUNDS_Q:g}, the stall {stall}; the way out from the "
             "rounds' median ("
             + ("the worst round's in the real-time mode)" if whole
                else "a round above it met a stall, named below as not promised)")]
    if report.get("not_reproduced"):
        lines.append(
            f"WARNING: {', '.join(report['not_reproduced'])} did not reproduce within this "
            f"calibration: without {max(1, len(rounds) // 4)} of its {len(rounds)} rounds "
            f"(whichever) the value moves more than +-{REPRODUCE_TOL:.0%}, so which rounds "
            "met the host's stalls decided it (the rounds above); the conservative value "
            f"(the requests' per-NFE figures of all rounds pooled, the step p99 "
            f"at the rounds' p{ROUNDS_Q:g}, "
            + ("" if whole else f"the stall {STALL_FACTOR:g} x the rounds' median, ")
            + ("the stall the longest of all; " if whole else
               "the longest stall past it named as not promised; ")
            + "for the way out, the median with the worst round's excess named as not "
            "promised) is recommended, not a round's draw; a busy host's stalls come and go, "
            "so calibrate "
            + ("with the robot's load running as deployed, and longer (--rounds)"
               if whole else
               "in the deployed mode (--realtime) with the robot's load running"))
    return lines


def plot(report: dict, path: str) -> str:
    from flowedge_relay_tools.bench import plots

    fig, ax = plots.subplots(width=7.0, height=4.2)
    s = report["samples"]
    plots.ecdf(ax, np.asarray(s["raw_ns_per_nfe"]) / 1e3, "raw onnxruntime (per NFE)")
    plots.ecdf(ax, np.asarray(s["relay_compute_ns_per_nfe"]) / 1e3, "relay compute / NFE")
    plots.ecdf(ax, np.asarray(s["e2e_ns_per_nfe"]) / 1e3, "end-to-end / NFE (client)")
    rec_us = report["recommended_nfe_ns"] / 1e3
    ax.axvline(rec_us, color="k", ls="--", lw=1, label=f"recommended nfe_ns = {rec_us:.0f} us")
    if report["two_phase"]:
        plots.ecdf(ax, np.asarray(s["raw_ns_per_prefix"]) / 1e3, "raw onnxruntime (per prefix)")
        pre_us = report["recommended_prefix_ns"] / 1e3
        ax.axvline(pre_us, color="k", ls=":", lw=1,
                   label=f"recommended prefix_ns = {pre_us:.0f} us")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlabel("microseconds per NFE or prefix pass (log)")
    ax.set_ylabel("fraction of samples")
    ax.legend(fontsize=8, loc="lower right")
    return plots.save(
        fig, path,
        title=f"calibrate: {report['model']}, {report['workers']} worker(s), "
              f"{report['requests']} x {report['nfe_per_request']} NFE",
        note="measured through the real relay over DDS; " + "production needs its own calibration",
    )  # fmt: skip
