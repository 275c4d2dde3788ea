"""Launch the FlowEdge Relay node with its YAML parameters.

Usage (under a ROS 2 Jazzy or Kilted install, after `colcon build` and sourcing the workspace):

    ros2 launch flowedge_relay relay.launch.py
    ros2 launch flowedge_relay relay.launch.py namespace:=arm_left nfe_ns:=250000
    ros2 launch flowedge_relay relay.launch.py config:=/path/to/my_relay.yaml

The package's relay.yaml is keyed `/**/flowedge_relay`, so it applies under any namespace; a
file of your own should be keyed the same way, or by full name (`/arm_left/flowedge_relay`).
`nfe_ns` given here overrides the YAML (0 keeps admission off; see ADR 0015,
docs/design.md#decision-record); left empty, the YAML's value stands.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterFile

from launch import LaunchContext, LaunchDescription


def relay_node(context: LaunchContext, *args, **kwargs) -> list[Node]:
    """One relay Node; the nfe_ns override joins its parameters only when the argument is set.

    Resolved here, at launch time, because whether to add an override depends on the value.
    """
    parameters = [ParameterFile(LaunchConfiguration("config"), allow_substs=True)]
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
        Node(
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
        OpaqueFunction(function=relay_node),
    ])
