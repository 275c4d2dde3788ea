# SPDX-License-Identifier: Apache-2.0
"""`flowedge_relay_bench`: the relay's benchmarks, one subcommand each.

    flowedge_relay_bench <subcommand> [options] [--json PATH] [--plot PATH.png]
    python -m flowedge_relay_tools.bench <subcommand> ...

Every subcommand is a module in this package registered in SUBCOMMANDS below, with
`add_arguments(parser)` and `run(args) -> dict` (JSON-serialisable report), and optionally
`table(report) -> str` (the readable table printed on stdout; else the report's `rows`) and
`plot(report, path) -> str` (a PNG, for `--plot`). Progress goes to stderr (bench/progress.py).
To add one: write the module, add one line to SUBCOMMANDS.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from pathlib import Path

from flowedge_relay.signals import stoppable

# name -> (module, one-line help). A module that is not there (yet) is simply not offered.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "calibrate": ("flowedge_relay_tools.bench.calibrate",
                  "end-to-end vs raw ns per NFE through the real node; recommended nfe_ns"),
    "calibrate-check": ("flowedge_relay_tools.bench.calibrate_check",
                        "the user's flow: calibrate, the relay with its values, ~2x from a "
                        "robot-like rclpy node; on time at receipt, with and without a CPU hog"),
    "overload": ("flowedge_relay_tools.bench.overload",
                 "seeded trace at 0.5-3x capacity: EDF admission (static, adaptive) vs "
                 "expire-only vs queue timeout"),
    "overhead": ("flowedge_relay_tools.bench.overhead",
                 "relay latency minus compute at light load; throughput vs bare onnxruntime"),
    "model": ("flowedge_relay_tools.bench.model",
              "raw NFE cost of the shipped policies; worker loop vs bare session.run"),
    "admission": ("flowedge_relay_tools.bench.admission", "the C core's admission path"),
    "intake": ("flowedge_relay_tools.bench.intake",
               "us per request in the request callback: discard by reason vs decision by outcome"),
    "batching": ("flowedge_relay_tools.bench.batching",
                 "saturated NFE/s at batch_slots 1-16 per model; overload at 2x with B = 8 vs 1"),
    "nfe-breakdown": ("flowedge_relay_tools.bench.nfe_breakdown",
                      "worker NFE time split (ORT / GIL / solver / step), light vs overload, "
                      "with candidate fixes"),
    "swap": ("flowedge_relay_tools.bench.swap",
             "a model swap under steady load: the pause, and nothing lost or duplicated"),
    "fairness": ("flowedge_relay_tools.bench.fairness",
                 "one client flooding at 5x capacity against three at 0.2x: fair share off, "
                 "on, and with weights, against the relay over DDS (--sim: the C core in "
                 "virtual time)"),
    "pool-sim": ("flowedge_relay_tools.bench.pool_sim",
                 "a relay pool's C mechanism: session balance and re-homing over 64 members, "
                 "the intake's not_owner drop against a full decision"),
    "pool": ("flowedge_relay_tools.bench.pool",
             "a relay pool of real flowedge-relayd processes over DDS: kill -9, join and "
             "SIGSTOP under 2x load, answered exactly once; the intake of 1, 2 and 4 members: "
             "ceiling here, CPU per request, decisions/s per core"),
    "rtc": ("flowedge_relay_tools.bench.rtc",
            "real-time chunking on the closed-loop detour task: success, seam jump and mode "
            "flips of synchronous, naive, inpaint and training-time RTC at delays 0-4"),
}  # fmt: skip


def available() -> dict[str, tuple[str, str]]:
    return {
        name: entry
        for name, entry in SUBCOMMANDS.items()
        if importlib.util.find_spec(entry[0]) is not None
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flowedge_relay_bench",
        description="FlowEdge Relay benchmarks (measurements, not tests: a busy host shows).",
    )
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")
    for name, (module_name, help_text) in available().items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        importlib.import_module(module_name).add_arguments(p)
        p.add_argument("--json", metavar="PATH", help="write the report as JSON here")
        p.add_argument("--plot", metavar="PATH.png", help="write the plot (PNG) here")
    return parser


def _print_table(module, report: dict) -> None:
    if hasattr(module, "table"):
        print(module.table(report))
        return
    rows = report.get("rows")
    if isinstance(rows, list) and rows and isinstance(rows[0], dict):
        from flowedge_relay_tools.bench.tables import format_rows

        print(format_rows(rows))
    else:
        print(json.dumps(report, indent=2, default=str))


@stoppable  # SIGINT/SIGTERM stop it cleanly however it was started (exit 130)
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    module = importlib.import_module(SUBCOMMANDS[args.subcommand][0])
    report = module.run(args)
    _print_table(module, report)
    if args.json:
        path = Path(args.json)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1, allow_nan=False, default=str) + "\n")
        print(f"wrote {path}", file=sys.stderr)
    if args.plot:
        if not hasattr(module, "plot"):
            print(f"{args.subcommand}: no plot for this subcommand", file=sys.stderr)
            return 2
        print(f"wrote {module.plot(report, args.plot)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
