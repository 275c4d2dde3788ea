# SPDX-License-Identifier: Apache-2.0
"""`flowedge-relayd`: the relay as a command, in the ROS form and the ADR 0015 form
(docs/design.md#decision-record).

    flowedge-relayd --ros-args -p nfe_ns:=250000 --params-file config/relay.yaml
    flowedge-relayd --nfe-ns 250000 --admission-reserve-ns 500000

The ADR flags win over --ros-args and YAML, and are reflected in the node's parameters, so
`ros2 param get /flowedge_relay nfe_ns` always tells the truth.
"""

from __future__ import annotations

import argparse
import gc
import sys
from typing import TYPE_CHECKING

# Only this light module before main() has installed the signal handlers: a signal during the
# seconds of importing rclpy and the model runtime must not be lost (with SIGINT inherited
# ignored it would be) or raise a traceback. rclpy and the node are imported inside.
from flowedge_relay.signals import stop_requested

if TYPE_CHECKING:
    from rclpy.parameter import Parameter


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def parse_adr_flags(argv: list[str]) -> tuple[list[Parameter], argparse.Namespace]:
    """Split the ADR flags off argv (program name excluded); return them as parameter overrides."""
    from rclpy.parameter import Parameter
    from rclpy.utilities import remove_ros_args

    parser = argparse.ArgumentParser(
        prog="flowedge-relayd",
        description="Deadline-aware EDF inference relay (ROS 2). Other options: --ros-args ...",
    )
    parser.add_argument("--nfe-ns", type=_non_negative, metavar="N",
                        help="measured upper bound of one NFE in ns; enables admission (ADR 0015)")
    parser.add_argument("--admission-reserve-ns", type=_non_negative, metavar="N",
                        help="fixed safety reserve in ns added to every admission finish time")
    parser.add_argument("--drill", action="store_true",
                        help="start for a fault drill: adds the fault_* parameters (never in "
                             "production)")
    args = parser.parse_args(remove_ros_args(args=["flowedge-relayd", *argv])[1:])
    overrides = []
    if args.nfe_ns is not None:
        overrides.append(Parameter("nfe_ns", value=args.nfe_ns))
    if args.admission_reserve_ns is not None:
        overrides.append(Parameter("admission_reserve_ns", value=args.admission_reserve_ns))
    return overrides, args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # rclpy's own SIGINT handler would shut the context down (destroying the node under the
    # context lock) while our threads still run; instead SIGINT/SIGTERM (whatever dispositions
    # were inherited) only set `stop`, and teardown runs in order: executors, node threads,
    # node, context. A signal during startup is honoured once the relay is up. The handlers
    # stay until the process ends: under `ros2 launch` one Ctrl-C brings two SIGINTs (the
    # terminal's to the group, launch's own), and the second, however late, is only noted.
    with stop_requested(keep=True) as stop:
        overrides, args = parse_adr_flags(argv)
        from rclpy.exceptions import (
            InvalidParameterTypeException,
            InvalidParameterValueException,
        )
        from rclpy.executors import ExternalShutdownException
        from rclpy.signals import SignalHandlerOptions

        from flowedge_relay.node import RelayNode, spin_relay
        from flowedge_relay.parameters import ParameterError
        from flowedge_relay.ros_compat import initialized

        try:
            with initialized(["flowedge-relayd", *argv],
                            signal_handler_options=SignalHandlerOptions.NO):
                try:
                    node = RelayNode(parameter_overrides=overrides, drill=args.drill)
                except (ParameterError, InvalidParameterTypeException,
                        InvalidParameterValueException) as exc:
                    # a value the relay cannot take: one line that names it, no traceback
                    print(f"flowedge-relayd: {exc}", file=sys.stderr, flush=True)
                    return 2
                # What start-up built (modules, the model, the node) moves to the collector's
                # permanent generation: a full collection holds the GIL, and so stops the
                # request thread, for as long as it walks objects (~6 ms for these, ~0 after).
                gc.freeze()
                try:
                    spin_relay(node, stop=stop)
                finally:
                    node.destroy_node()
        except ExternalShutdownException:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
