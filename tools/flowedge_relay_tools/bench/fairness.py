# SPDX-License-Identifier: Apache-2.0
"""`bench fairness`: one flooding client against three light ones, fair share off and on.

    python -m flowedge_relay_tools.bench fairness [--quick] [--nfe-ns NS] [--seconds S]
        [--batch-slots B] [--rtc] [--sim] [--json PATH] [--plot PATH.png]

By default against the real relay over DDS (bench/fairness_relay.py): `flowedge-relayd` in its
own process with the bench model and calibrated admission, an rclpy client node sending the four
clients' requests, each answer judged on time at receipt (client clock). Capacity is workers x
batch_slots x 1e9 / nfe_ns NFE per second (the NFE per second admission bounds; against the
relay, what the lanes really compute is reported beside it). Four clients with Poisson
arrivals, requests of 16-64 NFE (2-8 with --sim, `--nfe LO HI` to change: large enough that one
rclpy node sends 5x capacity on time), deadlines 10-20 x the mean NFE in NFE times (nfe_ns each)
after the send (50-100 at 2-8 NFE; `--slack LO HI`; with less the light clients' own bursts
exceed their share within the horizon more often): A offers 5x capacity (against the relay 5x
the larger of it and what the lanes compute, so that it floods), B, C and D 0.2x each.
Scenarios: fair_share off; on at equal weights; on with A weighted 2 (client_weights "A=2"); and
B, C, D each alone (their baseline).

`--sim` runs the real C core in virtual time instead: a discrete-event simulation drives it
through CFFI exactly as the workers do (submit on arrival, dispatch_worker at each step boundary,
one step per nfe_ns per row, finish), so what is measured is the admission rule, not the host:
every figure is deterministic for a seed (on time there holds by construction), and a loaded host
only makes it slower. `--rtc` gives every request a real-time chunking prefix whose window
(rtc_max_delay rows: 8 in the simulation, the served policy's against the relay, where it serves
policy_rtc) closes at 3/4 of its slack, the deadline that then counts; `--batch-slots` runs B
batch slots per worker (a step advances every row the worker holds), in both modes.

Per client and scenario: admitted NFE/s (NFE of the requests accepted and not displaced, per
second of the arrival window), on time among admitted (INFERENCE by its deadline / admitted),
fair-share rejections (REJECTED_CAPACITY with reject_reason fair_share: arrivals refused and
queued requests displaced), capacity rejections, and for B, C, D their admitted NFE/s as a share
of what they get alone. Targets (printed, judged in the report, not asserted): with fair_share
on, B, C and D each >= 95% of alone; on time among admitted >= 99.99% for every client; total NFE
goodput (on-time NFE/s of all clients) >= 97% of fair_share off.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

import numpy as np

from flowedge_relay.core import Code, Core, CoreConfig, Decision, RejectReason, Request, Step

CLIENTS = ("A", "B", "C", "D")
OFFER = {"A": 5.0, "B": 0.2, "C": 0.2, "D": 0.2}  # x capacity, in NFE
FLOOD = "A"
NFE_RANGE = (2, 8)
SLACK_NFE = (50, 100)  # deadline after arrival, in NFE times
TARGETS = {"light_vs_alone": 0.95, "on_time_among_admitted": 0.9999,
           "goodput_vs_off": 0.97}  # fmt: skip
OBS_DIM, ACTION_LEN = 1, 1


SIM_NFE_NS = 1_000_000


def add_arguments(parser) -> None:
    parser.add_argument("--sim", action="store_true",
                        help="the C core in virtual time (deterministic) instead of the relay")
    parser.add_argument("--quick", action="store_true",
                        help="tiny size: 1 s per scenario (2 s with --sim) instead of 20")
    parser.add_argument("--seconds", type=float, help="seconds of arrivals per scenario")
    parser.add_argument("--alone-seconds", type=float,
                        help="seconds of arrivals of each light client alone (relay; default "
                             "a scenario's: the same arrivals)")
    parser.add_argument("--blocks", type=int,
                        help="relay: blocks each setting's seconds are cut into, the settings "
                             "interleaved in one relay (default 4; 2 with --quick)")
    parser.add_argument("--pool", type=int,
                        help="relay: a pool of this many relays, fair_share on in each (shares "
                             "per relay, bench/fairness_pool.py)")
    parser.add_argument("--lease-ms", type=int,
                        help="with --pool: pool_lease_ms (default 1000)")
    parser.add_argument("--workers", type=int, default=2, help="worker threads (lanes)")
    parser.add_argument("--batch-slots", type=int, default=1,
                        help="batch slots per worker (docs/design.md §5.1)")
    parser.add_argument("--nfe-ns", type=int,
                        help="ns per NFE (one step): the relay's admission nfe_ns instead of "
                             f"the inline calibration's (--sim: default {SIM_NFE_NS})")
    parser.add_argument("--admission-reserve-ns", type=int,
                        help="the relay's admission_reserve_ns (default: the calibration's, 0 "
                             "with --nfe-ns)")
    parser.add_argument("--nfe", type=int, nargs=2, metavar=("LO", "HI"),
                        help="NFE per request, uniform integer (default 4 16; 2 8 with --sim)")
    parser.add_argument("--model", help="the relay's model (default bench; rtc with --rtc)")
    parser.add_argument("--queue-capacity", type=int, default=64, help="the relay's")
    parser.add_argument("--rtc", action="store_true",
                        help="every request carries a real-time chunking prefix (§5.4)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--slack", type=int, nargs=2, metavar=("LO", "HI"),
                        help="deadline after arrival, NFE times (default 10-20 x the mean NFE: "
                             "50 100 with --sim, 300 600 against the relay)")


@dataclass
class Tally:
    offered: int = 0
    offered_nfe: int = 0
    accepted: int = 0
    served: int = 0  # accepted and not displaced
    served_nfe: int = 0
    on_time: int = 0
    on_time_nfe: int = 0
    late: int = 0  # EXPIRED, or INFERENCE after its deadline
    fair_share: int = 0  # refused or displaced for the fair share
    capacity: int = 0
    deadline: int = 0
    displaced: int = 0
    frozen_rows: int = 0  # summed over INFERENCE answers (real-time chunking, §5.4)


@dataclass
class Sim:
    """One run: the core, the clock and what each client got."""

    core: Core
    nfe_ns: int
    workers: int
    slots: int
    tally: dict[str, Tally] = field(default_factory=dict)
    deadlines: dict[tuple[bytes, int], tuple[int, int]] = field(default_factory=dict)


def _arrivals(seed: int | str, clients, seconds: float, capacity_nfe_s: float, nfe_ns: int,
              slack_nfe: tuple[int, int],
              nfe_range: tuple[int, int] = NFE_RANGE,
              flood_nfe_s: float | None = None) -> list[tuple[int, str, int, int]]:
    """(t_ns, client, nfe, slack_ns) for each request, Poisson per client, each client's stream
    its own (the same alone and with the others); the flood's offer counted in `flood_nfe_s`
    where given (the relay: the larger of capacity and what its lanes compute)."""
    out = []
    mean_nfe = (nfe_range[0] + nfe_range[1]) / 2
    for name in clients:
        rng = random.Random(f"{seed}/{name}")
        unit = (flood_nfe_s or capacity_nfe_s) if name == FLOOD else capacity_nfe_s
        rate = OFFER[name] * unit / mean_nfe  # requests per second
        t = 0.0
        while True:
            t += rng.expovariate(rate)
            if t >= seconds:
                break
            nfe = rng.randint(*nfe_range)
            slack = rng.randint(*slack_nfe) * nfe_ns
            out.append((int(t * 1e9) + 1_000, name, nfe, slack))
    out.sort()
    return out


def _submit(sim: Sim, seq: int, t: int, name: str, nfe: int, slack: int, rtc: bool) -> None:
    tally = sim.tally[name]
    tally.offered += 1
    tally.offered_nfe += nfe
    deadline = due = t + slack
    fields = {}
    if rtc:  # 8 prefix rows from the arrival on; the window closes at 3/4 of the slack
        rows = 8
        fields = {"prefix_rows": rows, "prefix_start_ns": t, "prefix_start_ros_ns": t,
                  "action_period_ns": slack * 3 // (4 * rows)}
        due = t + rows * (slack * 3 // (4 * rows))  # the earlier deadline, which counts
    sid = f"{name}/{seq}".encode()
    req = Request(session_id=sid, sequence=seq, generation=0, retry_count=0, retry_reason=0,
                  origin_ns=t, deadline_ns=deadline, deadline_ros_ns=deadline,
                  remaining_nfe=nfe, noise_seed=seq, observation=np.zeros(OBS_DIM, np.float32),
                  client_id=name.encode(), **fields)
    d = sim.core.submit(req, t)
    if d == Decision.ACCEPTED:
        tally.accepted += 1
        sim.deadlines[(sid, seq)] = (due, nfe)


def _collect(sim: Sim) -> None:
    for o in sim.core.pop_outcomes(10_000):
        tally = sim.tally[o.client_id.decode()]
        key = (o.session_id, o.sequence)
        if o.code == Code.REJECTED_CAPACITY:
            tally.fair_share += o.reject_reason == RejectReason.FAIR_SHARE
            tally.capacity += o.reject_reason == RejectReason.CAPACITY
            if key in sim.deadlines:  # accepted before: displaced from the queue
                tally.displaced += 1
                tally.accepted -= 1
                del sim.deadlines[key]
            continue
        if o.code == Code.REJECTED_DEADLINE and key not in sim.deadlines:
            tally.deadline += 1
            continue
        deadline, nfe = sim.deadlines.pop(key)
        tally.served += 1
        tally.served_nfe += nfe
        tally.frozen_rows += o.frozen_rows
        if o.code == Code.INFERENCE and o.finish_ns <= deadline:
            tally.on_time += 1
            tally.on_time_nfe += nfe
        else:
            tally.late += 1


def simulate(clients, *, seconds: float, workers: int, slots: int, nfe_ns: int, fair: bool,
             weights: tuple = (), rtc: bool = False, seed: int = 1,
             slack_nfe: tuple[int, int] = SLACK_NFE,
             nfe_range: tuple[int, int] = NFE_RANGE) -> dict:
    """One scenario in virtual time; returns per-client figures."""
    lanes = workers * slots
    capacity = lanes * 1e9 / nfe_ns
    arrivals = _arrivals(seed, clients, seconds, capacity, nfe_ns, slack_nfe, nfe_range)
    core = Core(CoreConfig(workers=workers, batch_slots=slots, queue_capacity=256,
                           max_sessions=65536, max_nfe=max(16, nfe_range[1]), obs_dim=OBS_DIM,
                           action_len=ACTION_LEN, ring_capacity=65536, nfe_ns=nfe_ns,
                           admission_reserve_ns=0, fair_share=int(fair), max_clients=8,
                           client_weights=weights, rtc_max_delay=8 if rtc else 0))
    sim = Sim(core, nfe_ns, workers, slots, {name: Tally() for name in clients})
    events: list[tuple[int, int, int, object]] = []  # (t, order, kind, data)
    for i, (t, name, nfe, slack) in enumerate(arrivals):
        heapq.heappush(events, (t, 1, i, (name, nfe, slack)))
    busy: list[set[int]] = [set() for _ in range(workers)]  # lanes holding work, per worker
    order = len(arrivals)
    acts = np.zeros(ACTION_LEN, np.float32)
    try:
        while events:
            t, kind, seq, data = heapq.heappop(events)
            if kind == 1:
                name, nfe, slack = data
                _submit(sim, seq, t, name, nfe, slack, rtc)
                to_fill = [w for w in range(workers) if not busy[w]]  # idle workers take it now
            else:  # worker `data` ends a step at t: every row it holds advances one NFE
                w = data
                for lane in sorted(busy[w]):
                    step = core.step(lane, t, nfe_ns)
                    if step == Step.DONE:
                        core.finish(lane, t, acts)
                    if step != Step.CONTINUE:
                        busy[w].discard(lane)  # done, or stopped (the core answered)
                to_fill = [w]
            for w in to_fill:
                was_idle = not busy[w]
                while (work := core.dispatch_worker(w, t)) is not None:
                    busy[w].add(work.lane)
                if busy[w] and (was_idle or kind == 0):
                    order += 1
                    heapq.heappush(events, (t + nfe_ns, 0, order, w))
            _collect(sim)
        _collect(sim)
    finally:
        core.close()
    out = {}
    for name, k in sim.tally.items():
        out[name] = {
            "offered_nfe_per_s": k.offered_nfe / seconds,
            "admitted_nfe_per_s": k.served_nfe / seconds,
            "goodput_nfe_per_s": k.on_time_nfe / seconds,
            "on_time_among_admitted": k.on_time / k.served if k.served else 1.0,
            "admitted": k.served, "offered": k.offered, "late": k.late,
            "fair_share_rejections": k.fair_share, "capacity_rejections": k.capacity,
            "deadline_rejections": k.deadline, "displaced": k.displaced,
            "mean_frozen_rows": k.frozen_rows / k.on_time if k.on_time else 0.0,
        }  # fmt: skip
    return {"clients": out, "capacity_nfe_per_s": capacity,
            "goodput_nfe_per_s": sum(c["goodput_nfe_per_s"] for c in out.values())}


def run(args) -> dict:
    if args.pool:
        from flowedge_relay_tools.bench import fairness_pool

        nfe, slack = workload(args)
        report = fairness_pool.run(args, CLIENTS, nfe, slack, _relay_arrivals(args, nfe, slack))
        report.update({"rtc": False, "seed": args.seed, "offer_x_capacity": OFFER})
        return report
    if args.sim:
        report = _run_sim(args)
    else:
        from flowedge_relay_tools.bench import fairness_relay

        nfe, slack = workload(args)
        report = fairness_relay.run(args, CLIENTS, nfe, slack, _relay_arrivals(args, nfe, slack))
    nfe, slack = workload(args)
    report.update({"batch_slots": args.batch_slots, "rtc": args.rtc, "seed": args.seed,
                   "offer_x_capacity": OFFER, "slack_nfe": list(slack), "nfe_range": list(nfe),
                   "targets": TARGETS})  # fmt: skip
    _compare(report)
    report["targets_met"] = _targets(report)
    report["rows"] = _rows(report)
    head, notes = _notes(report)
    report["caveat"] = " ".join([head, *notes])  # the performance page's line above the table
    return report


def _relay_arrivals(args, nfe: tuple[int, int], slack: tuple[int, int]):
    """arrivals_of(clients, seconds, capacity, nfe_ns, flood_unit, block): block's own draw."""
    return lambda clients, seconds, capacity, nfe_ns, flood, block: _arrivals(
        f"{args.seed}/{block}", clients, seconds, capacity, nfe_ns, slack, nfe, flood)


def workload(args) -> tuple[tuple[int, int], tuple[int, int]]:
    """(NFE range, slack range in NFE times) of the requests: --nfe, else the mode's default;
    --slack, else 10-20 x the mean NFE (the simulation's 50-100 at its 2-8 NFE)."""
    from flowedge_relay_tools.bench.fairness_relay import NFE_RANGE as RELAY_NFE
    from flowedge_relay_tools.bench.fairness_relay import RTC_NFE_RANGE

    nfe = (tuple(args.nfe) if args.nfe else NFE_RANGE if args.sim
           else RTC_NFE_RANGE if args.rtc else RELAY_NFE)
    scale = (nfe[0] + nfe[1]) / (NFE_RANGE[0] + NFE_RANGE[1])
    slack = tuple(args.slack) if args.slack else tuple(round(x * scale) for x in SLACK_NFE)
    return nfe, slack


def _run_sim(args) -> dict:
    seconds = args.seconds or (2.0 if args.quick else 20.0)
    workers, nfe_ns = args.workers, args.nfe_ns or SIM_NFE_NS
    nfe, slack = workload(args)
    common = dict(seconds=seconds, workers=workers, slots=args.batch_slots, nfe_ns=nfe_ns,
                  rtc=args.rtc, seed=args.seed, slack_nfe=slack, nfe_range=nfe)  # fmt: skip
    scenarios = {
        "off": simulate(CLIENTS, fair=False, **common),
        "on": simulate(CLIENTS, fair=True, **common),
        "on_A_weight_2": simulate(CLIENTS, fair=True, weights=(("A", 2),), **common),
    }
    # each light client alone, on the same arrivals (one random stream per client)
    alone = {name: simulate((name,), fair=True, **common)["clients"][name]
             for name in CLIENTS[1:]}
    return {
        "method": ("the real C core in virtual time (discrete-event simulation through CFFI, "
                   "steps of exactly nfe_ns): deterministic per seed, the host's load does not "
                   "show"),
        "capacity_definition": "workers x batch_slots x 1e9 / nfe_ns NFE per second",
        "seconds": seconds, "workers": workers, "nfe_ns": nfe_ns, "scenarios": scenarios,
        "alone": alone,
    }  # fmt: skip


def _compare(report: dict) -> None:
    """B, C, D against themselves alone; every scenario's goodput against fair_share off."""
    alone = report["alone"]
    for result in report["scenarios"].values():
        for name in CLIENTS[1:]:
            base = alone[name]["admitted_nfe_per_s"]
            result["clients"][name]["vs_alone"] = (
                result["clients"][name]["admitted_nfe_per_s"] / base if base else 1.0)
    off = report["scenarios"]["off"]
    for result in report["scenarios"].values():
        result["goodput_vs_off"] = (result["goodput_nfe_per_s"] / off["goodput_nfe_per_s"]
                                    if off["goodput_nfe_per_s"] else 1.0)
        if result.get("goodput_vs_lanes") and off.get("goodput_vs_lanes"):  # the real relay
            result["goodput_vs_off_at_lane_speed"] = (result["goodput_vs_lanes"]
                                                      / off["goodput_vs_lanes"])


def _targets(report: dict) -> dict:
    """Each target, judged for every fair_share-on scenario."""
    met = {}
    for name in ("on", "on_A_weight_2"):
        s = report["scenarios"][name]
        met[name] = {
            "light_vs_alone": all(s["clients"][c]["vs_alone"] >= TARGETS["light_vs_alone"]
                                  for c in CLIENTS[1:]),
            "on_time_among_admitted": all(
                c["on_time_among_admitted"] >= TARGETS["on_time_among_admitted"]
                for c in s["clients"].values()),
            "goodput_vs_off": s["goodput_vs_off"] >= TARGETS["goodput_vs_off"],
        }
    return met


def _rows(report: dict) -> list[dict]:
    rows = []
    for scenario, s in report["scenarios"].items():
        for name, c in s["clients"].items():
            rows.append({
                "scenario": scenario, "client": name,
                "offered NFE/s": f"{c['offered_nfe_per_s']:.0f}",
                "admitted NFE/s": f"{c['admitted_nfe_per_s']:.0f}",
                "vs alone": f"{100 * c['vs_alone']:.1f}%" if "vs_alone" in c else "-",
                "on time among admitted": f"{100 * c['on_time_among_admitted']:.3f}%",
                "late/expired": c["late"],
                "fair-share rejections": c["fair_share_rejections"],
                "capacity rejections": c["capacity_rejections"],
                "deadline rejections": c["deadline_rejections"],
                "goodput vs off": _goodput_cell(s) if name == "A" else "",
            })  # fmt: skip
    for name, c in report["alone"].items():
        rows.append({"scenario": "alone", "client": name,
                     "offered NFE/s": f"{c['offered_nfe_per_s']:.0f}",
                     "admitted NFE/s": f"{c['admitted_nfe_per_s']:.0f}", "vs alone": "100.0%",
                     "on time among admitted": f"{100 * c['on_time_among_admitted']:.3f}%",
                     "late/expired": c["late"],
                     "fair-share rejections": c["fair_share_rejections"],
                     "capacity rejections": c["capacity_rejections"],
                     "deadline rejections": c["deadline_rejections"],
                     "goodput vs off": ""})  # fmt: skip
    return rows


def _goodput_cell(s: dict) -> str:
    """Goodput vs fair_share off; against the relay also at equal lane speed (in brackets)."""
    cell = f"{100 * s['goodput_vs_off']:.1f}%"
    at_speed = s.get("goodput_vs_off_at_lane_speed")
    return cell if at_speed is None else f"{cell} ({100 * at_speed:.1f}%)"


def _notes(report: dict) -> tuple[str, list[str]]:
    """The table's head line and the lines under it (also the report's caveat, which the
    performance page prints)."""
    relay = "relay" in report
    off = report["scenarios"]["off"]
    where = (f"real relay over DDS, {report['alone_seconds']:g} s alone, nfe_ns "
             f"{'calibrated inline' if isinstance(report['calibration'], dict) else 'given'}, "
             f"admission_reserve_ns {report['admission_reserve_ns']}; A offers 5x "
             f"{report['flood_unit_nfe_per_s']:.0f} NFE/s (the larger of capacity and the lanes "
             f"at the calibration's mean cost), {report['flood_vs_lanes'] or 0:.1f}x the "
             f"{off['lanes_nfe_per_s'] or 0:.0f} NFE/s the lanes computed busy with fair_share "
             "off" if relay else "virtual time")
    head = (f"fairness: {report['workers']} workers x {report['batch_slots']} batch slots, "
            f"nfe_ns {report['nfe_ns']}, capacity {off['capacity_nfe_per_s']:.0f} NFE/s, "
            f"{report['seconds']:g} s of arrivals ({where}), NFE {report['nfe_range']}, rtc "
            f"{'on' if report['rtc'] else 'off'}; A offers 5x, B, C, D 0.2x each")
    lines = []
    if relay:
        lag = ", ".join(f"{k} {s['send_lag_max_ms']:.0f}" for k, s in report["scenarios"].items())
        ratios = [b["vs_off"]["on"] for b in report["block_goodput"] if b["vs_off"]["on"]]
        took = {n: 1 - off["clients"][n]["vs_alone"] for n in CLIENTS[1:]}
        lines += [
            f"one relay process, the settings interleaved in {report['blocks']} blocks; goodput "
            "on / off per block: " + ", ".join(f"{100 * r:.1f}%" for r in ratios)
            + (f" (spread {100 * min(ratios):.1f}-{100 * max(ratios):.1f}%)" if ratios else ""),
            "goodput vs off (in brackets: each setting's goodput over the NFE/s its lanes "
            "computed busy, against off's)",
            "with fair_share off A took " + ", ".join(
                f"{100 * v:.0f}% of {n}'s" for n, v in took.items()) + " admitted NFE/s",
            f"the client's longest lag behind the arrival schedule, ms: {lag}",
            "lanes busy while the arrivals were offered (work conserved: near 100% in every "
            "setting, whatever the lanes' speed): " + ", ".join(
                f"{k} {100 * (s.get('lane_utilisation_in_window') or 0):.1f}%"
                for k, s in report["scenarios"].items()),
            "every request answered exactly once (answers and the relay's counters): "
            + ("yes" if report["exactly_once"] else f"NO {report['accounting']}"),
        ]  # fmt: skip
    met = "; ".join(f"{s}: " + ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in t.items())
                    for s, t in report["targets_met"].items())
    return head, [*lines, f"targets ({TARGETS}): {met}"]


def table(report: dict) -> str:
    from flowedge_relay_tools.bench.tables import format_rows

    if "pool" in report:
        from flowedge_relay_tools.bench import fairness_pool

        return fairness_pool.table(report)

    head, notes = _notes(report)
    return "\n".join([head, format_rows(report["rows"]), *notes])


def plot(report: dict, path: str) -> str:
    from flowedge_relay_tools.bench import plots

    if "pool" in report:
        from flowedge_relay_tools.bench import fairness_pool

        return fairness_pool.plot(report, path)

    from flowedge_relay_tools.bench.fairness_pool import admitted_bars

    groups = {**{k: s["clients"] for k, s in report["scenarios"].items()},
              "alone": report["alone"]}
    return plots.save(admitted_bars(plots, groups),
                      path, title="A floods at 5x capacity; B, C, D offer 0.2x each",
                      note=("the real relay over DDS, on time at receipt" if "relay" in report
                            else "the real C core in virtual time: deterministic per seed"))
