# SPDX-License-Identifier: Apache-2.0
"""`bench fairness` against the real relay: flowedge-relayd in its own process, over DDS.

The scenarios of bench/fairness.py, judged where the promise is made: `flowedge-relayd` runs as
deployed (bench model, `--workers` lanes) and a BenchClient node in this process sends the four
clients' requests (`client_id` A, B, C, D; Poisson arrivals, NFE and deadline slack as in the
simulation), stamping each answer in its subscription callback. Admission is calibrated: a short
inline calibration (`calibrate.inline`, as `bench overload` does) on the first relay gives
`nfe_ns` and `admission_reserve_ns` (or `--nfe-ns`), and capacity is the NFE per second
admission bounds, workers x batch_slots x 1e9 / nfe_ns: the fair share divides that, and B, C and
D offer 0.2x of it. nfe_ns is a tail bound, on a busy 2-core host up to 10x the mean cost, and 5x
of it may be less than the lanes compute, which would not contend the relay at all: A floods at
5x the larger of capacity and what the lanes compute at the calibration's mean cost
(`calibrate.capacity`, overload's load axis; with `--nfe-ns`, capacity). Each run reports
`lanes_nfe_per_s`, the NFE per second of busy lane time from the relay's own stats, and the table
how many times that A offered. `fair_share` and `client_weights` are live, so every setting runs
in one relay process, interleaved in blocks (`--blocks`): each block runs fair_share off, on at
equal weights and on with `client_weights: ["A=2"]` (set through the relay's parameter service,
in the reverse order every other block) on the same arrivals, then B, C and D each alone (their
baseline), so that the goodput of on against off is judged at one lane speed; each block's ratio
is reported beside the overall one.

With `--rtc` the relay serves the real-time chunking policy (`--model rtc` unless another is
given: the bench model has no chunking) and every request carries a prefix of rtc_max_delay rows
(at most 8), prefix_start at the send, whose window closes at 3/4 of the request's slack (the
action period is slack x 3 / (4 x rows)), as in the simulation: that window is the deadline that
counts. Its NFE cost is a fraction of the bench model's, so the requests are larger
(`RTC_NFE_RANGE`) to keep 5x capacity a rate one rclpy node sends on time.

Per client, from the answers it received: admitted = INFERENCE or EXPIRED answers (the relay took
the request and kept it to its end; a displaced request is answered REJECTED_CAPACITY and counted
as a rejection, as in the simulation), on time = INFERENCE received by its deadline (client
clock; with --rtc the earlier of it and the prefix window), fair-share and capacity rejections
by the answer's reject_reason. Every request must be answered exactly once: each run checks the
answers against what was sent and the relay's own counters (`accounting`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from flowedge_relay_msgs.msg import ActionMessage

from flowedge_relay.core import Code
from flowedge_relay_tools.bench import calibrate
from flowedge_relay_tools.bench.client import (
    collector_paused,
    model_path,
    relay_for_bench,
    set_policy,
    wait_idle,
    warm_up,
)
from flowedge_relay_tools.bench.host import host_info
from flowedge_relay_tools.bench.progress import Progress

#: seconds of arrivals per scenario (and per client alone), inline calibration requests, seconds
SIZES = {"quick": (1.0, 12, 0.3), "full": (20.0, 300, 3.0)}
#: NFE per request: larger than the simulation's, so 5x capacity stays a rate one rclpy node
#: sends on time (~300-500 requests/s in all at two lanes of the bench model's ~0.5 ms NFE);
#: the simulation meets its targets at these sizes with two lanes (with one, a running request
#: of the flood, never displaced, delays the light clients' past what they get alone)
NFE_RANGE = (16, 64)
#: --rtc: policy_rtc's NFE costs a small fraction of the bench model's (tens of us), so 16x the
#: NFE per request keeps A's 5x of what its lanes compute a request rate one rclpy node sends on
#: time (a few hundred per second)
RTC_NFE_RANGE = (256, 1024)
RTC_ROWS = 8  # prefix rows per request, at most the served rtc_max_delay (the simulation's 8)
SETTINGS = {"on": (), "on_A_weight_2": ("A=2",)}  # fair_share on: client_weights


@dataclass
class Tally:
    """What one client sent and got back in one run."""

    offered: int = 0
    offered_nfe: int = 0
    admitted: int = 0  # INFERENCE or EXPIRED
    admitted_nfe: int = 0
    on_time: int = 0  # INFERENCE received by its deadline
    on_time_nfe: int = 0
    late: int = 0  # INFERENCE received after its deadline
    expired: int = 0
    expired_on_arrival: int = 0  # EXPIRED at arrival (§4 step 4: its deadline had passed)
    fair_share: int = 0  # REJECTED_CAPACITY, reject_reason fair_share (refused or displaced)
    capacity: int = 0  # REJECTED_CAPACITY, reject_reason capacity
    deadline: int = 0
    stale: int = 0
    lost: int = 0  # no answer
    frozen_rows: int = 0  # summed over on-time INFERENCE answers (real-time chunking)

    def count(self, nfe: int, ans, deadline_ns: int) -> None:
        self.offered += 1
        self.offered_nfe += nfe
        if ans is None:
            self.lost += 1
        elif ans.code == Code.EXPIRED and ans.nfe_done == 0 and ans.queue_ns == 0:
            self.expired_on_arrival += 1  # never admitted: decided as it arrived
        elif ans.code in (Code.INFERENCE, Code.EXPIRED):
            self.admitted += 1
            self.admitted_nfe += nfe
            if ans.code == Code.EXPIRED:
                self.expired += 1
            elif ans.received_ns <= deadline_ns:
                self.on_time += 1
                self.on_time_nfe += nfe
                self.frozen_rows += ans.frozen_rows
            else:
                self.late += 1
        elif ans.code == Code.REJECTED_CAPACITY:
            fair = ans.reject_reason == ActionMessage.REJECT_FAIR_SHARE
            self.fair_share += fair
            self.capacity += not fair
        elif ans.code == Code.REJECTED_DEADLINE:
            self.deadline += 1
        else:
            self.stale += 1

    def add(self, other: Tally) -> None:
        """Fold another run's counts into this one (one setting over several blocks)."""
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def figures(self, seconds: float) -> dict:
        return {
            "offered_nfe_per_s": self.offered_nfe / seconds,
            "admitted_nfe_per_s": self.admitted_nfe / seconds,
            "goodput_nfe_per_s": self.on_time_nfe / seconds,
            "on_time_among_admitted": self.on_time / self.admitted if self.admitted else 1.0,
            "offered": self.offered, "admitted": self.admitted, "on_time": self.on_time,
            "late": self.late + self.expired, "late_inference": self.late,
            "expired": self.expired, "fair_share_rejections": self.fair_share,
            "capacity_rejections": self.capacity, "deadline_rejections": self.deadline,
            "stale_rejections": self.stale, "expired_on_arrival": self.expired_on_arrival,
            "lost": self.lost,
            "mean_frozen_rows": self.frozen_rows / self.on_time if self.on_time else 0.0,
        }  # fmt: skip


def rtc_rows(client) -> int:
    """Prefix rows per request with --rtc: RTC_ROWS, at most the served rtc_max_delay (rows
    past it would not move the window); a model served without chunking cannot take one."""
    served = client.served
    if served.rtc_mode == "off" or served.rtc_max_delay <= 0:
        raise SystemExit("fairness --rtc: the model is served without real-time chunking; use "
                         "--model rtc (models/policy_rtc) or another RTC package")
    return min(RTC_ROWS, served.rtc_max_delay)


@dataclass
class Run:
    """One phase (or several folded): what each client got, and how the relay fared."""

    seconds: float
    tallies: dict[str, Tally]
    accounting: dict
    lag_max_ns: int
    lanes_nfe_per_s: float | None
    utilisation: float | None

    def add(self, other: Run) -> None:
        """Fold another phase of the same setting in: counts add up, the lanes' speed and how
        busy they were are weighted by seconds."""
        total = self.seconds + other.seconds
        for attr in ("lanes_nfe_per_s", "utilisation"):
            a, b = getattr(self, attr), getattr(other, attr)
            setattr(self, attr, None if a is None or b is None
                    else (a * self.seconds + b * other.seconds) / total)
        for name, t in other.tallies.items():
            self.tallies.setdefault(name, Tally()).add(t)
        for key, value in other.accounting.items():
            self.accounting[key] = (self.accounting[key] and value if key == "exactly_once"
                                    else self.accounting[key] + value)
        self.lag_max_ns = max(self.lag_max_ns, other.lag_max_ns)
        self.seconds = total

    def report(self) -> dict:
        return {"clients": {n: t.figures(self.seconds) for n, t in sorted(self.tallies.items())},
                "accounting": self.accounting, "send_lag_max_ms": self.lag_max_ns / 1e6,
                "lanes_nfe_per_s": self.lanes_nfe_per_s,
                "lane_utilisation_in_window": self.utilisation}


def replay(relay, client, arrivals, seconds: float, drain_s: float, rows: int = 0) -> Run:
    """Send (t_ns, client, nfe, slack_ns) arrivals on schedule, wait for every answer, then
    count per client and check the run's accounting against the relay's counters. `rows` > 0:
    each request carries a prefix of that many rows from its send, its window closing at 3/4 of
    its slack (the deadline that counts, as bench/fairness.py's simulation has it)."""
    prefix = np.zeros((rows, client.served.action_dim), np.float32) if rows else None
    wait_idle(relay, timeout=drain_s)
    before, extra_before = relay.stats(), client.extra_answers
    sent: list[tuple[tuple[str, int], str, int, int]] = []  # key, client, nfe, deadline
    lag_max, t0 = 0, time.time_ns()
    with collector_paused():
        start = time.monotonic_ns() + 20_000_000
        window = time.time_ns() + 20_000_000  # the arrivals' window, wall clock
        for i, (t_ns, name, nfe, slack_ns) in enumerate(arrivals):
            period = slack_ns * 3 // (4 * rows) if rows else 0
            req = client.request(f"fair-{name}", client.next_sequence(), nfe, noise_seed=i,
                                 client_id=name, prefix=prefix, action_period_ns=period)
            delay = start + t_ns - time.monotonic_ns()
            if delay > 0:
                time.sleep(delay * 1e-9)
            lag_max = max(lag_max, time.monotonic_ns() - start - t_ns)
            # grid 1 ns: prefix_start is the send time itself
            at = client.send(req, slack_ns=slack_ns, grid_ns=1 if rows else 0)
            due = at + (rows * period if rows else slack_ns)
            sent.append(((req.session_id, req.sequence), name, nfe, due))
        client.wait_keys([s[0] for s in sent], drain_s)
    wait_idle(relay, timeout=drain_s)
    after = relay.stats()
    lanes_nfe_per_s = relay.capacity_between(t0, time.time_ns())
    # busy while the arrivals are offered: what a work-conserving rule keeps at 1 whatever the
    # lanes' speed (the drain after the window is left out)
    utilisation = relay.utilisation_between(window, window + int(seconds * 1e9))
    tallies: dict[str, Tally] = {}
    for key, name, nfe, deadline in sent:
        tallies.setdefault(name, Tally()).count(nfe, client.answers.get(key), deadline)
    delta = lambda name: getattr(after, name) - getattr(before, name)  # noqa: E731
    admitted = sum(t.admitted for t in tallies.values())
    lost = sum(t.lost for t in tallies.values())
    accounting = {
        "sent": len(sent), "answered": len(sent) - lost, "lost": lost,
        "extra_answers": client.extra_answers - extra_before,
        "relay_decided": delta("decided"), "relay_accepted": delta("accepted"),
        "relay_displaced": delta("displaced"), "client_admitted": admitted,
    }  # fmt: skip
    accounting["exactly_once"] = (
        lost == 0 and accounting["extra_answers"] == 0
        and accounting["relay_decided"] == len(sent)
        and accounting["relay_accepted"] - accounting["relay_displaced"] == admitted)
    return Run(seconds, tallies, accounting, lag_max, lanes_nfe_per_s, utilisation)


def set_share(relay, weights: tuple[str, ...] | None) -> None:
    """fair_share off (None) or on with client_weights `weights`, live through the relay's
    parameter service, both in one atomic set: the next decision judges by them."""
    from rclpy.parameter import Parameter

    rules = list(weights or ()) or ["*=1"]  # every client weight 1: unset's meaning
    results = relay.set_parameters([
        Parameter("fair_share", value=weights is not None),
        Parameter("client_weights", Parameter.Type.STRING_ARRAY, rules),
    ], atomically=True)  # fmt: skip
    bad = [r.reason for r in results if not r.successful]
    if bad:
        raise ValueError(f"relay refused fair_share / client_weights {weights}: {bad}")


def phases(clients, block: int) -> list[tuple[str, tuple[str, ...] | None, tuple[str, ...]]]:
    """One block's phases, (name, weights or None for off, the clients that send): the three
    settings, reversed every other block so a drift in lane speed falls on each alike, then
    each light client alone (the share off: it changes nothing for one client)."""
    settings = [("off", None), *((k, w) for k, w in SETTINGS.items())]
    if block % 2:
        settings.reverse()
    return [*((k, w, tuple(clients)) for k, w in settings),
            *((f"{n} alone", None, (n,)) for n in clients[1:])]


def run(args, clients, nfe_range: tuple[int, int], slack_nfe: tuple[int, int],
        arrivals_of) -> dict:  # fmt: skip
    """The scenarios against one real relay; `arrivals_of(clients, seconds, capacity_nfe_per_s,
    nfe_ns, flood_unit_nfe_per_s, block)` draws the arrivals (bench/fairness.py), block's own.
    Every setting runs in `blocks` blocks of seconds / blocks each, interleaved in the one relay
    process (fair_share and client_weights set live between phases), so they share its lanes'
    speed. Returns the report's measured part."""
    host = host_info()
    seconds, cal_requests, cal_s = SIZES["quick" if args.quick else "full"]
    seconds = args.seconds or seconds
    blocks = args.blocks or (2 if args.quick else 4)
    block_s = seconds / blocks
    alone_s = args.alone_seconds or seconds  # the same arrivals as in the scenarios
    workers = args.workers or 2
    rows = 0
    mean_nfe = (nfe_range[0] + nfe_range[1]) / 2
    lanes = workers * args.batch_slots
    model = args.model or ("rtc" if args.rtc else "bench")  # the bench model has no chunking
    params = dict(model_path=model_path(model), workers=workers,
                  batch_slots=args.batch_slots, queue_capacity=args.queue_capacity,
                  max_nfe=max(64, nfe_range[1]))  # fmt: skip
    runs: dict[str, Run] = {}
    per_block: list[dict[str, Run]] = []
    cal = None
    names = [p[0] for p in phases(clients, 0)]
    with Progress("fairness", blocks * len(names), unit=" phases") as bar:
        bar.update(label="starting relay")
        with relay_for_bench(False, fair_share=False, **params) as (relay, client):
            warm_up(client)
            rows = rtc_rows(client) if args.rtc else 0
            if args.nfe_ns:
                nfe_ns, reserve = args.nfe_ns, args.admission_reserve_ns or 0
                computed = lanes * 1e9 / nfe_ns
            else:
                bar.update(label="inline calibration")
                cal = calibrate.inline(relay, client, mean_nfe, cal_requests, cal_s)
                nfe_ns = cal["recommended_nfe_ns"]
                reserve = (args.admission_reserve_ns if args.admission_reserve_ns is not None
                           else cal["recommended_admission_reserve_ns"])  # fmt: skip
                computed = calibrate.capacity(cal, mean_nfe, workers, args.batch_slots)[0] \
                    * mean_nfe  # NFE/s at the calibration's mean cost
            capacity = lanes * 1e9 / nfe_ns
            flood_unit = max(capacity, computed)
            drain = slack_nfe[1] * nfe_ns * 1e-9 + 5.0  # the longest slack, and then some
            set_policy(relay, nfe_ns=nfe_ns, admission_reserve_ns=reserve)
            for block in range(blocks):
                arrivals = arrivals_of(clients, block_s, capacity, nfe_ns, flood_unit, block)
                alone_arrivals = (arrivals if alone_s == seconds else arrivals_of(
                    clients, alone_s / blocks, capacity, nfe_ns, flood_unit, block))
                done: dict[str, Run] = {}
                for name, weights, senders in phases(clients, block):
                    bar.update(label=f"block {block + 1}/{blocks}: {name}")
                    set_share(relay, weights)
                    secs = block_s if len(senders) > 1 else alone_s / blocks
                    mine = [a for a in (arrivals if len(senders) > 1 else alone_arrivals)
                            if a[1] in senders]
                    done[name] = replay(relay, client, mine, secs, drain, rows)
                    bar.advance()
                per_block.append(done)
            set_share(relay, None)
    for done in per_block:
        for name, r in done.items():
            if name in runs:
                runs[name].add(r)
            else:  # a copy: the block's own figures stay as measured
                runs[name] = Run(r.seconds, {k: Tally(**vars(t)) for k, t in r.tallies.items()},
                                 dict(r.accounting), r.lag_max_ns, r.lanes_nfe_per_s,
                                 r.utilisation)
    scenarios = {k: runs[k].report() for k in ("off", *SETTINGS)}
    alone = {k.split()[0]: runs[k].report() for k in names if k.endswith(" alone")}
    for s in scenarios.values():
        s["capacity_nfe_per_s"] = capacity
        s["goodput_nfe_per_s"] = sum(c["goodput_nfe_per_s"] for c in s["clients"].values())
        s["goodput_vs_lanes"] = (s["goodput_nfe_per_s"] / s["lanes_nfe_per_s"]
                                 if s["lanes_nfe_per_s"] else None)
    accounting = {**{k: s["accounting"] for k, s in scenarios.items()},
                  **{f"{k} alone": s["accounting"] for k, s in alone.items()}}
    return {
        "method": ("the real relay over DDS: one flowedge-relayd process, every setting in "
                   f"{blocks} interleaved blocks (fair_share and client_weights set live "
                   "through its parameter service between phases, so every setting shares the "
                   "lanes' speed), an rclpy client node sending every client's requests; on "
                   "time = INFERENCE received by the deadline, client clock"),
        "capacity_definition": ("workers x batch_slots x 1e9 / nfe_ns NFE per second (what "
                                "admission bounds)"),
        "flood_unit_nfe_per_s": flood_unit, "calibrated_lanes_nfe_per_s": computed,
        "flood_vs_lanes": (scenarios["off"]["clients"]["A"]["offered_nfe_per_s"]
                           / scenarios["off"]["lanes_nfe_per_s"]
                           if scenarios["off"]["lanes_nfe_per_s"] else None),
        "host": host, "relay": "flowedge-relayd process", "model": params["model_path"],
        "seconds": seconds, "alone_seconds": alone_s, "blocks": blocks,
        "workers": workers, "nfe_ns": nfe_ns,
        "admission_reserve_ns": reserve, "nfe_range": list(nfe_range),
        "rtc_rows": rows,
        "calibration": ({k: v for k, v in cal.items() if not isinstance(v, list | dict)}
                        if cal else "given (--nfe-ns)"),
        "scenarios": scenarios, "alone": {k: s["clients"][k] for k, s in alone.items()},
        "block_goodput": [_block_goodput(done) for done in per_block],
        "accounting": accounting,
        "exactly_once": all(a["exactly_once"] for a in accounting.values()),
    }  # fmt: skip


def _block_goodput(done: dict[str, Run]) -> dict:
    """One block: each setting's goodput (on-time NFE/s of all clients) and its ratio to off's
    in the same block, the light clients' admitted NFE/s against alone in that block."""
    good = {k: sum(t.on_time_nfe for t in done[k].tallies.values()) / done[k].seconds
            for k in ("off", *SETTINGS)}
    out: dict = {"goodput_nfe_per_s": good}
    out["vs_off"] = {k: (good[k] / good["off"] if good["off"] else None) for k in SETTINGS}
    out["light_vs_alone"] = {}
    for k in ("off", *SETTINGS):
        row = {}
        for name, r in done.items():
            if not name.endswith(" alone"):
                continue
            c = name.split()[0]
            base = r.tallies[c].admitted_nfe / r.seconds if c in r.tallies else 0.0
            mine = done[k].tallies.get(c)
            row[c] = (mine.admitted_nfe / done[k].seconds / base) if base and mine else None
        out["light_vs_alone"][k] = row
    return out
