# SPDX-License-Identifier: Apache-2.0
"""`bench rtc`: what real-time chunking buys, on the closed-loop detour task.

    flowedge_relay_bench rtc [--quick] [--episodes N] [--delays 0,1,2,3,4] [--json P] [--plot P.png]

The bundled training-time RTC policy (models/policy_rtc) drives seeded episodes of the
closed-loop detour task (flowedge_relay_tools.rtc_rollout): one action per period, a request
every EXECUTE_ROWS rows, inference taking d periods (d = 0..4 of 8 rows) during which the robot
keeps executing the old chunk, then the switch at row d. Compared on the same episodes and noise
seeds: synchronous (the robot waits for each chunk: the reference, the same at every d), naive
switching, inpaint and training-time RTC. Reported per d and strategy: success (goal reached,
no collision), the seam jump |new row d - old row d| (in action units, a period's displacement
x 10) and mode flips between consecutive chunks.

Targets at d = 3 (rtc_rollout.targets; test/test_model.py asserts them on its own episodes):
training-time RTC's success within 3 points of synchronous and at least naive switching's; its
seam jump at most a quarter of naive switching's; inpaint's seam jump between the two.

Deterministic for a given model and onnxruntime build: nothing here is timed.
"""

from __future__ import annotations

import argparse

import numpy as np

from flowedge_relay_tools import rtc_rollout as rr
from flowedge_relay_tools.bench.progress import Progress
from flowedge_relay_tools.bench.tables import format_rows
from flowedge_relay_tools.models import detour_task as task

DELAYS = (0, 1, 2, 3, 4)
SIZES = {"quick": 40, "full": 1000}  # episodes
STYLE = {
    "synchronous": {"color": "#4d4d4d", "marker": "o", "linestyle": "--"},
    "naive": {"color": "#b2182b", "marker": "s"},
    "inpaint": {"color": "#2166ac", "marker": "^"},
    "training_time": {"color": "#1b7837", "marker": "D"},
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help=f"{SIZES['quick']} episodes (CI)")
    parser.add_argument("--episodes", type=int, help=f"episodes (default {SIZES['full']})")
    parser.add_argument(
        "--delays",
        type=lambda s: [int(x) for x in s.split(",")],
        default=list(DELAYS),
        help="comma-separated inference delays in periods (default 0,1,2,3,4)",
    )
    parser.add_argument("--seed", type=int, default=2025, help="episode and noise seed")
    parser.add_argument("--model", default=None, help="an RTC package (default policy_rtc)")


def run(args: argparse.Namespace) -> dict:
    from flowedge_relay_tools.bench.host import host_info

    size = "quick" if args.quick else "full"
    episodes = args.episodes or SIZES[size]
    policy = rr.load_rtc_policy(args.model)
    sampler = rr.RtcSampler(policy.session, policy.time_convention)
    starts = task.closed_loop_starts(np.random.default_rng(args.seed), episodes)
    delays = sorted(set(args.delays))
    results: list[dict] = []
    with Progress("rtc", 1 + 3 * len(delays), unit=" runs") as bar:
        bar.update(label="synchronous")
        sync = rr.rollout(sampler, starts, "synchronous", 0, policy.spec.max_delay, args.seed)
        bar.advance()
        for d in delays:
            results.append({**sync.summary(), "delay": d})
            for strategy in rr.STRATEGIES[1:]:
                bar.update(label=f"d={d} {strategy}")
                out = rr.rollout(sampler, starts, strategy, d, policy.spec.max_delay, args.seed)
                results.append(out.summary())
                bar.advance()
    at = {r["strategy"]: r for r in results if r["delay"] == rr.TARGET_DELAY}
    rows = [
        {
            "d": r["delay"],
            "strategy": r["strategy"],
            "success": r["success_rate"],
            "collisions": r["collision_rate"],
            "seam jump mean": r["seam_jump_mean"],
            "seam jump p90": r["seam_jump_p90"],
            "mode flips / episode": r["mode_flips_per_episode"],
        }
        for r in results
    ]
    return {
        "size": size,
        "method": (
            f"closed-loop detour task, {episodes} seeded episodes per point, the same episodes "
            f"and noise seeds for every strategy; one action per period, a request every "
            f"{rr.EXECUTE_ROWS} rows, {rr.NFE} Euler NFE, inference taking d periods "
            f"({len(delays)} values); the seam jump in action units (a period's displacement "
            f"x {task.CL_ACTION_SCALE:g}), none where the old chunk has no row d"
        ),
        "caveat": "deterministic for a given model and onnxruntime build; nothing is timed",
        "host": host_info(),
        "model": policy.path,
        "digest": policy.digest,
        "rtc": {"mode": policy.spec.mode, "max_delay": policy.spec.max_delay},
        "episodes": episodes,
        "seed": args.seed,
        "delays": delays,
        "execute_rows": rr.EXECUTE_ROWS,
        "nfe": rr.NFE,
        "results": results,
        "rows": rows,
        "targets": rr.targets(at) if len(at) == len(rr.STRATEGIES) else {},
    }


def table(report: dict) -> str:
    lines = [format_rows(report["rows"]), ""]
    if not report["targets"]:
        lines.append(f"targets: d = {rr.TARGET_DELAY} was not run")
    for name, t in report["targets"].items():
        lines.append(
            f"d = {rr.TARGET_DELAY}, {name}: {t['target']}; measured {t['measured']}: "
            f"{'met' if t['met'] else 'MISSED'}"
        )
    return "\n".join(lines)


def plot(report: dict, path: str) -> str:
    from flowedge_relay_tools.bench import plots

    fig, axes = plots.subplots(ncols=3, width=4.6)
    axes = list(axes)
    panels = [
        ("success_rate", "success (goal, no collision)"),
        ("seam_jump_mean", "seam jump |new row d - old row d| (mean)"),
        ("mode_flips_per_episode", "mode flips per episode"),
    ]
    for ax, (key, label) in zip(axes, panels, strict=True):
        for strategy in rr.STRATEGIES:
            rs = [r for r in report["results"] if r["strategy"] == strategy and r[key] is not None]
            ax.plot(
                [r["delay"] for r in rs],
                [r[key] for r in rs],
                label=strategy.replace("_", "-"),
                **STYLE[strategy],
            )
        ax.set_xlabel("inference delay d (periods of 8-row chunks)")
        ax.set_ylabel(label)
        ax.axvline(rr.TARGET_DELAY, color="#999999", linewidth=0.8, linestyle=":")
    axes[0].legend(fontsize=8)
    return plots.save(
        fig,
        path,
        title="Real-time chunking on the closed-loop detour task (policy_rtc)",
        note=f"{report['episodes']} episodes per point, seed {report['seed']}; "
        f"digest {report['digest'][:19]}",
    )
