# SPDX-License-Identifier: Apache-2.0
"""`make run`: the relay and the demo producer in one process, until Ctrl-C (or --duration).

Where `ros2 launch` is installed, `ros2 launch flowedge_relay relay.launch.py` starts the relay
alone; this module is the no-ROS-install equivalent plus a producer to talk to (manual
composition: both nodes share one process; the relay keeps its dedicated request thread).

`--model vision` (or small, bench, a path) sets the relay's `model_path`; the producer learns what
is served from the relay's `flowedge/model` and builds its requests for it (the vision package:
image + state tensors), also after `ros2 param set /flowedge_relay model_path ...` swaps it.

`--rtc` serves the bundled real-time chunking policy (models/policy_rtc) to simulated robots that
keep executing their chunk while they ask for the next (flowedge_relay_tools/rtc_demo_producer.py).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import threading

from flowedge_relay.signals import stop_requested

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "config"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make run", description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=0.0,
                        help="stop after this many seconds (0 = until Ctrl-C)")
    parser.add_argument("--params-file", help="YAML with parameters for both nodes (default "
                        "config/demo.yaml, with --rtc config/demo_rtc.yaml)")
    parser.add_argument("--model", help="what the relay serves (default: the YAML's, else the "
                        "relay's default): small, bench, vision (the two-phase package) or a path")
    parser.add_argument("--rtc", action="store_true", help="real-time chunking: the bundled "
                        "RTC policy and robots that execute while they ask (rtc_demo_producer)")
    args, ros_args = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.rtc:
        args.model = args.model or "rtc"
    args.params_file = args.params_file or str(CONFIG / ("demo_rtc.yaml" if args.rtc
                                                         else "demo.yaml"))
    model_args = []
    if args.model:
        from flowedge_relay_tools.harness import model_path

        model_args = ["-p", f"flowedge_relay:model_path:={model_path(args.model)}"]

    from flowedge_relay.ros_compat import distro

    print(f"FlowEdge Relay demo on ROS 2 {distro()}: relay + demo producer, parameters from "
          f"{args.params_file}" + (f", model {args.model}" if args.model else ""))
    print("Ctrl-C stops. One summary line per second:\n")
    # SIGINT/SIGTERM only set `stop` (no rclpy signal handler), installed before the slow
    # imports so that no signal is lost while they run: see cli.main.
    with stop_requested(keep=True) as stop:
        from rclpy.executors import ExternalShutdownException
        from rclpy.signals import SignalHandlerOptions

        from flowedge_relay.node import RelayNode, spin_relay
        from flowedge_relay.ros_compat import initialized
        from flowedge_relay_tools.demo_producer import DemoProducer
        from flowedge_relay_tools.rtc_demo_producer import RtcDemoProducer

        # --duration sets the same Event a signal sets, so it exercises the real teardown
        timer = threading.Timer(args.duration, stop.set)
        timer.daemon = True
        try:
            with initialized(["run_demo", "--ros-args", "--params-file", args.params_file,
                                  *model_args, *ros_args],
                            signal_handler_options=SignalHandlerOptions.NO):
                relay = RelayNode()
                try:
                    producer = RtcDemoProducer() if args.rtc else DemoProducer()
                    try:
                        if args.duration > 0:
                            timer.start()
                        spin_relay(relay, extra_nodes=[producer], stop=stop)
                    finally:
                        producer.destroy_node()
                finally:
                    relay.destroy_node()
        except ExternalShutdownException:
            pass
        finally:
            timer.cancel()
    print("\ndemo stopped cleanly")
    return 0


if __name__ == "__main__":
    sys.exit(main())
