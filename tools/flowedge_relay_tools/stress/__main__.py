# SPDX-License-Identifier: Apache-2.0
"""`python -m flowedge_relay_tools.stress malformed|soak|faults ...`: the campaigns' command line
(flags and JSON keys as documented in the package docstring and the README); `produce` is the
internal producer process of `malformed --rate`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from flowedge_relay.signals import stoppable
from flowedge_relay_tools import stress
from flowedge_relay_tools.harness import model_path
from flowedge_relay_tools.stress.faults import run_faults
from flowedge_relay_tools.stress.flood import malformed_ok, produce, run_flood, run_malformed
from flowedge_relay_tools.stress.probes import MIXES
from flowedge_relay_tools.stress.soak import plot_soak, run_soak, soak_ok


@stoppable  # SIGINT/SIGTERM stop it cleanly however it was started (exit 130)
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flowedge_relay_tools.stress", description=stress.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("malformed", help="hostile-input campaign over real DDS")
    m.add_argument("--messages", type=int, default=20_000)
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--workers", type=int, default=1)
    m.add_argument("--no-huge", action="store_true", help="leave out 100 kB ids / 800 kB arrays")
    m.add_argument("--request-qos-depth", type=int, default=1000)
    m.add_argument("--request-qos-history", choices=("keep_all", "keep_last"),
                   default="keep_all")
    m.add_argument("--rate", type=float, default=None,
                   help="messages/s, paced by wall clock, from a producer process (with "
                        "--duration); without it the producer shares this process and is "
                        "flow-controlled by the relay's intake (--messages)")
    m.add_argument("--duration", type=float, default=30.0, help="seconds at --rate")
    m.add_argument("--mix", choices=("flood", "mixed"), default=None,
                   help="flood: 90%% invalid, the hostile mix (default with --rate); mixed: "
                        "35%% valid, 35%% invalid, 15%% hostile-but-valid, 15%% raw CDR")
    s = sub.add_parser("soak", help="mixed traffic at a fraction of measured capacity")
    s.add_argument("--duration", type=float, default=60.0, help="seconds (600 for the report)")
    s.add_argument("--load", type=float, default=0.8, help="fraction of measured capacity")
    s.add_argument("--model", default="bench", help="small, bench (~1 ms/NFE) or a path")
    s.add_argument("--workers", type=int, default=1)
    s.add_argument("--seed", type=int, default=3)
    s.add_argument("--no-admission", action="store_true", help="keep nfe_ns = 0")
    s.add_argument("--plot", default=None, help="PNG of RSS / queue depth / outcomes over time")
    s.add_argument("--progress-every", type=float, default=10.0)
    f = sub.add_parser("faults", help="the fault drills, with figures")
    f.add_argument("--workers", type=int, default=2)
    pr = sub.add_parser("produce", help="(internal) the producer process of malformed --rate")
    pr.add_argument("--seed", type=int, default=1)
    pr.add_argument("--rate", type=float, required=True)
    pr.add_argument("--count", type=int, required=True)
    pr.add_argument("--mix", choices=MIXES, default="flood")
    pr.add_argument("--contract", required=True, help="JSON: digest, obs_dim, action_dim, "
                                                      "action_horizon")
    pr.add_argument("--max-nfe", type=int, default=64)
    pr.add_argument("--depth", type=int, default=5000, help="publisher KEEP_LAST depth")
    pr.add_argument("--topic", default="flowedge/requests")
    pr.add_argument("--oracle", required=True, help="where to write what was built (.npz)")
    for p in (m, s, f):
        p.add_argument("--json", default=None, help="write the figures here")
    args = parser.parse_args(argv)
    if args.cmd == "produce":
        os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
        return produce(args)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")

    from flowedge_relay_tools.harness import running_relay

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.cmd == "malformed":
        with running_relay(workers=args.workers, request_qos_depth=args.request_qos_depth,
                           request_qos_history=args.request_qos_history) as h:
            if args.rate:
                fig = run_flood(h, args.rate, args.duration, args.seed, mix=args.mix or "flood",
                                progress=say)
            else:
                fig = run_malformed(h, args.messages, args.seed, huge=not args.no_huge,
                                    progress=say, mix=args.mix or "mixed")
        failures = malformed_ok(fig)
    elif args.cmd == "soak":
        path = model_path(args.model)
        with running_relay(workers=args.workers, model_path=path) as h:
            fig = run_soak(h, args.duration, args.load, args.seed,
                           admission=not args.no_admission, progress=say,
                           progress_every_s=args.progress_every)
        if args.plot:
            fig["plot"] = plot_soak(fig, args.plot)
        failures = soak_ok(fig)
    else:
        fig = run_faults(args.workers, progress=say)
        failures = [f"{name}: {why}" for name, r in fig.items() for why in r.get("failures", [])]
    fig["failures"] = failures
    brief = {k: v for k, v in fig.items() if k not in ("samples", "rss_samples")}
    print(json.dumps(brief, indent=2, default=str))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(fig, indent=2, default=str))
    say("PASS" if not failures else "FAIL: " + "; ".join(failures))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
