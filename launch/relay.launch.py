# SPDX-License-Identifier: Apache-2.0
"""Launch the FlowEdge Relay, a managed (lifecycle) node, with its YAML parameters.

Usage (under a ROS 2 Jazzy or Kilted install, after `colcon build` and sourcing the workspace):

    ros2 launch flowedge_relay relay.launch.py
    ros2 launch flowedge_relay relay.launch.py namespace:=arm_left nfe_ns:=250000
    ros2 launch flowedge_relay relay.launch.py config:=/path/to/my_relay.yaml
    ros2 launch flowedge_relay relay.launch.py autostart:=false   # a lifecycle manager drives it

With autostart true (the default) the relay configures and activates itself; with false it waits
unconfigured for `ros2 lifecycle set`, nav2's lifecycle_manager or a launch ChangeState event
(it is started as a launch_ros LifecycleNode, so those events reach it).

The package's relay.yaml is keyed `/**/flowedge_relay`, so it applies under any namespace; a
file of your own should be keyed the same way, or by full name (`/arm_left/flowedge_relay`).
`nfe_ns` given here overrides the YAML (0 keeps admission off; see ADR 0015,
docs/design.md#decision-record); left empty, the YAML's value stands.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode
from launch_ros.parameter_descriptions import ParameterFile

from launch import LaunchContext, LaunchDescription


def _autostart(context: LaunchContext) -> bool:
    text = LaunchConfiguration("autostart").perform(context).strip().lower()
    if text not in ("true", "false"):
        raise ValueError(f"autostart:={text!r}: expected true or false")
    return text == "true"


def relay_node(context: LaunchContext, *args, **kwargs) -> list[LifecycleNode]:
    """One relay LifecycleNode; the nfe_ns override joins its parameters only when it is set.

    Resolved here, at launch time, because whether to add an override depends on the value.
    autostart always overrides the YAML: the launch argument is where a launch file says it.
    """
    parameters = [ParameterFile(LaunchConfiguration("config"), allow_substs=True),
                  {"autostart": _autostart(context)}]
    nfe_ns = LaunchConfiguration("nfe_ns").perform(context).strip()
    if nfe_ns:
        try:
            value = int(nfe_ns)
        except ValueError:
            raise ValueError(
                f"nfe_ns:={nfe_ns!r}: expected an integer (ns), or leave it empty"
            ) from None
        parameters.append({"nfe_ns": value})
    return [
        LifecycleNode(
            package="flowedge_relay",
            executable="flowedge-relayd",
            name="flowedge_relay",
            namespace=LaunchConfiguration("namespace"),
            parameters=parameters,
            output="screen",
            emulate_tty=True,
        )
    ]


def generate_launch_description() -> LaunchDescription:
    default_config = os.path.join(
        get_package_share_directory("flowedge_relay"), "config", "relay.yaml"
    )
    return LaunchDescription([
        DeclareLaunchArgument(
            "config", default_value=default_config,
            description="YAML parameter file for the relay (default: the package's relay.yaml)",
        ),
        DeclareLaunchArgument(
            "namespace", default_value="",
            description="namespace for the relay; its relative topics (flowedge/...) follow it",
        ),
        DeclareLaunchArgument(
            "nfe_ns", default_value="",
            description="measured NFE upper bound in ns; overrides the YAML; empty = use the YAML",
        ),
        DeclareLaunchArgument(
            "autostart", default_value="true",
            description="true: configure and activate at start; false: wait for a manager",
        ),
        OpaqueFunction(function=relay_node),
    ])
