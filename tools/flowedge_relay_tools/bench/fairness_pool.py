# SPDX-License-Identifier: Apache-2.0
"""`bench fairness --pool N`: the four clients against a relay pool of N flowedge-relayd.

docs/design.md §7.1: each relay keeps its own shares; in a pool (§13) a client's share is of the
relay that decides its request (the owner of its session), not of the pool. The members start as
bench pool starts them (bench/pool.py: a namespace each, the pool's topics shared, pool_lease_ms
`--lease-ms`, default 1000 on a shared host), with fair_share on and the same calibrated
admission (an inline calibration of one relay with as many lanes as the pool, as bench pool
does, or `--nfe-ns`). Every client spreads its requests over sessions that each member owns
alike (the rendezvous hash the relays run), so every member sees all four clients: A flooding
at 5x the pool's capacity, B, C and D at 0.2x each, each split over the members.

Per member (by the answer's relay_id) and client: offered and admitted NFE/s, admitted over
offered, on time among admitted at receipt, fair-share and capacity rejections; and every request
answered exactly once, by one member. Figures, not assertions: a measurement on a shared host.
"""

from __future__ import annotations

import time

from flowedge_relay.core import Pool, PoolViewMember
from flowedge_relay_tools.bench import calibrate
from flowedge_relay_tools.bench.client import (
    collector_paused,
    model_path,
    relay_for_bench,
    warm_up,
)
from flowedge_relay_tools.bench.fairness_relay import SIZES, Tally
from flowedge_relay_tools.bench.host import host_info
from flowedge_relay_tools.bench.progress import Progress
from flowedge_relay_tools.harness import load_served, wait_for, wait_for_relay

SESSIONS_PER_MEMBER = 4  # of each client, so that its load spreads over every member


def sessions(members, clients, digest: str) -> dict[str, list[tuple[str, int]]]:
    """Per client, (session id, owner index): SESSIONS_PER_MEMBER owned by each member, by the
    C rendezvous hash the relays run (an observer's core.Pool), interleaved over the members."""
    observer = Pool("bench-observer")
    index = {Pool(m.relay_id).key: m.index for m in members}
    observer.set_view([PoolViewMember(k, (digest,)) for k in index])
    out = {}
    for name in clients:
        per: dict[int, list[str]] = {m.index: [] for m in members}
        k = 0
        while any(len(v) < SESSIONS_PER_MEMBER for v in per.values()):
            sid = f"fair-{name}-{k}"
            k += 1
            owner = index[observer.ranking(sid.encode(), digest, 0)[0]]
            if len(per[owner]) < SESSIONS_PER_MEMBER:
                per[owner].append(sid)
        out[name] = [(s, i) for group in zip(*per.values(), strict=True)
                     for s, i in zip(group, per, strict=True)]
    return out


def run(args, clients, nfe_range: tuple[int, int], slack_nfe: tuple[int, int],
        arrivals_of) -> dict:  # fmt: skip
    """The fair share on in every member of an N-relay pool; per member and client what it
    admitted. `arrivals_of` as bench/fairness_relay.run's."""
    from flowedge_relay_tools.bench import pool as pool_bench

    host = host_info()
    seconds, cal_requests, cal_s = SIZES["quick" if args.quick else "full"]
    seconds = args.seconds or seconds
    n, workers = args.pool, args.workers or 2
    lanes = n * workers * args.batch_slots
    lease_ms = args.lease_ms or 1000
    mean_nfe = (nfe_range[0] + nfe_range[1]) / 2
    path = model_path(args.model or "bench")
    info = load_served(path)
    cal = None
    with Progress("fairness pool", 3, unit=" steps") as bar:
        if args.nfe_ns:
            nfe_ns, reserve = args.nfe_ns, args.admission_reserve_ns or 0
            computed = lanes * 1e9 / nfe_ns
        else:
            bar.update(label=f"inline calibration, {lanes} lanes")
            with relay_for_bench(False, model_path=path, workers=n * workers,
                                 batch_slots=args.batch_slots,
                                 max_nfe=max(64, nfe_range[1])) as (relay, client):
                warm_up(client)
                cal = calibrate.inline(relay, client, mean_nfe, cal_requests, cal_s)
            nfe_ns = cal["recommended_nfe_ns"]
            reserve = (args.admission_reserve_ns if args.admission_reserve_ns is not None
                       else cal["recommended_admission_reserve_ns"])  # fmt: skip
            computed = calibrate.capacity(cal, mean_nfe, n * workers, args.batch_slots)[0] \
                * mean_nfe  # NFE/s the pool's lanes compute at the calibration's mean cost
        bar.advance()
        capacity = lanes * 1e9 / nfe_ns  # the pool's: what admission bounds in all members
        # as against one relay (bench/fairness_relay.py): A floods at 5x the larger of capacity
        # and what the lanes compute, so that a tail-bound nfe_ns still leaves the pool contended
        flood_unit = max(capacity, computed)
        params = dict(model_path=path, workers=workers, batch_slots=args.batch_slots,
                      queue_capacity=args.queue_capacity, max_nfe=max(64, nfe_range[1]),
                      nfe_ns=nfe_ns, admission_reserve_ns=reserve, cost_model="static",
                      pool_lease_ms=lease_ms, fair_share=True,
                      stats_rate_hz=pool_bench.STATS_HZ)  # fmt: skip
        drain = slack_nfe[1] * nfe_ns * 1e-9 + 5.0
        bar.update(label=f"starting a pool of {n}")
        with pool_bench.pool_of("/fairpool", "fairpool", list(range(n)), params,
                                lease_ms) as (members, _watch, node):
            client = pool_bench.PoolClient(node, info)
            wait_for_relay(client.pub, client.sub)
            wait_for(lambda: client.pub.get_subscription_count() >= n, 30)
            warm_up(client)
            owned = sessions(members, clients, client.digest)
            relay_of = {m.relay_id: m.index for m in members}
            bar.advance()
            bar.update(label="four clients against the pool")
            arrivals = arrivals_of(clients, seconds, capacity, nfe_ns, flood_unit, 0)
            sent, lag_max = [], 0
            turn = dict.fromkeys(clients, 0)
            with collector_paused():
                start = time.monotonic_ns() + 20_000_000
                for i, (t_ns, name, nfe, slack_ns) in enumerate(arrivals):
                    sid, owner = owned[name][turn[name] % len(owned[name])]
                    turn[name] += 1
                    req = client.request(sid, client.next_sequence(), nfe, noise_seed=i,
                                         client_id=name)
                    delay = start + t_ns - time.monotonic_ns()
                    if delay > 0:
                        time.sleep(delay * 1e-9)
                    lag_max = max(lag_max, time.monotonic_ns() - start - t_ns)
                    at = client.send(req, slack_ns=slack_ns)
                    sent.append(((req.session_id, req.sequence), name, nfe, at + slack_ns, owner))
                client.wait_keys([s[0] for s in sent], drain)
            log = client.answers_to([s[0] for s in sent])
            bar.advance()
    tallies: dict[int, dict[str, Tally]] = {i: {} for i in range(n)}
    offered: dict[int, dict[str, float]] = {i: dict.fromkeys(clients, 0.0) for i in range(n)}
    once = wrong_member = unanswered = 0
    for key, name, nfe, deadline, owner in sent:
        got = log.get(key, [])
        once += len(got) == 1
        unanswered += not got
        by = relay_of.get(got[0].relay_id, owner) if got else owner
        wrong_member += by != owner
        offered[owner][name] += nfe / seconds
        tallies[by].setdefault(name, Tally()).count(nfe, client.answers.get(key), deadline)
    per_member = {}
    for i in range(n):
        figures = {c: t.figures(seconds) for c, t in sorted(tallies[i].items())}
        for c, f in figures.items():
            f["admitted_vs_offered"] = (f["admitted_nfe_per_s"] / offered[i][c]
                                        if offered[i][c] else None)
        total = sum(f["admitted_nfe_per_s"] for f in figures.values())
        for f in figures.values():
            f["share_of_member"] = f["admitted_nfe_per_s"] / total if total else 0.0
        per_member[f"r{i}"] = figures
    report = {
        "pool": n, "host": host, "lease_ms": lease_ms, "workers": workers,
        "batch_slots": args.batch_slots, "seconds": seconds, "nfe_ns": nfe_ns,
        "admission_reserve_ns": reserve, "capacity_nfe_per_s": capacity,
        "flood_unit_nfe_per_s": flood_unit,
        "nfe_range": list(nfe_range), "slack_nfe": list(slack_nfe),
        "sessions_per_member": SESSIONS_PER_MEMBER, "send_lag_max_ms": lag_max / 1e6,
        "calibration": ({k: v for k, v in cal.items() if not isinstance(v, list | dict)}
                        if cal else "given (--nfe-ns)"),
        "members": per_member,
        "accounting": {"sent": len(sent), "answered_once": once, "unanswered": unanswered,
                       "answered_more_than_once": len(sent) - once - unanswered,
                       # a member stalled past the lease is taken over (§13): its sessions'
                       # requests are then answered by another member
                       "answered_by_another_member": wrong_member},
        "exactly_once": once == len(sent),
        "method": (f"a pool of {n} flowedge-relayd (lease {lease_ms} ms, {workers} worker(s) "
                   "each, fair_share on, the same calibrated admission) over DDS; every client's "
                   f"requests spread over {SESSIONS_PER_MEMBER} sessions each member owns; per "
                   "member (the answer's relay_id) what each client offered it and it admitted, "
                   "on time at receipt"),
    }  # fmt: skip
    report["rows"] = rows(report)
    return report


def rows(report: dict) -> list[dict]:
    out = []
    for member, figures in report["members"].items():
        for name, f in figures.items():
            vs = f["admitted_vs_offered"]
            out.append({
                "member": member, "client": name,
                "admitted NFE/s": f"{f['admitted_nfe_per_s']:.0f}",
                "admitted / offered": "-" if vs is None else f"{100 * vs:.1f}%",
                "share of member": f"{100 * f['share_of_member']:.1f}%",
                "on time among admitted": f"{100 * f['on_time_among_admitted']:.3f}%",
                "fair-share rejections": f["fair_share_rejections"],
                "capacity rejections": f["capacity_rejections"],
            })  # fmt: skip
    return out


def table(report: dict) -> str:
    from flowedge_relay_tools.bench.tables import format_rows

    head = (f"fairness in a pool of {report['pool']} (shares per relay): "
            f"{report['workers']} workers each, nfe_ns {report['nfe_ns']}, pool capacity "
            f"{report['capacity_nfe_per_s']:.0f} NFE/s, {report['seconds']:g} s of arrivals, "
            f"lease {report['lease_ms']} ms; A offers 5x "
            f"{report['flood_unit_nfe_per_s']:.0f} NFE/s "
            "(the larger of capacity and what the lanes compute), B, C, D 0.2x of capacity each, "
            "split over the members")
    acc = report["accounting"]
    tail = (f"every request answered exactly once: {'yes' if report['exactly_once'] else 'NO'} "
            f"({acc['answered_once']} of {acc['sent']}; answered by a member other than the "
            f"owner: {acc['answered_by_another_member']})")
    return "\n".join([head, format_rows(report["rows"]), tail])


def plot(report: dict, path: str) -> str:
    from flowedge_relay_tools.bench import plots

    return plots.save(admitted_bars(plots, report["members"]), path,
                      title="fair share per relay in a pool: A floods at 5x",
                      note="the real relays over DDS, on time at receipt")


def admitted_bars(plots, groups: dict[str, dict[str, dict]]):
    """A figure of each client's admitted NFE/s (log scale), one group of bars per key of
    `groups` (a setting, or a pool member): {group: {client: figures}}."""
    clients = sorted({c for g in groups.values() for c in g})
    fig, ax = plots.subplots(width=7.0)
    width = 0.8 / len(clients)
    for i, client in enumerate(clients):
        values = [g.get(client, {}).get("admitted_nfe_per_s", 0.0) for g in groups.values()]
        ax.bar([x + i * width for x in range(len(groups))], values, width, label=client)
    ax.set_xticks([x + (len(clients) - 1) / 2 * width for x in range(len(groups))],
                  list(groups))
    ax.set_ylabel("admitted NFE/s")
    ax.set_yscale("log")
    ax.legend(title="client")
    return fig
