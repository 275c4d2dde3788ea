"""Launch the FlowEdge Relay node with its YAML parameters.

Usage (under a ROS 2 Jazzy or Kilted install, after `colcon build` and sourcing the workspace):

    ros2 launch flowedge_relay relay.launch.py
    ros2 launch flowedge_relay relay.launch.py namespace:=arm_left nfe_ns:=250000
    ros2 launch flowedge_relay relay.launch.py config:=/path/to/my_relay.yaml

`nfe_ns` given here overrides the YAML (0 keeps admission off; see ADR 0015).
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch.actions import DeclareLaunchArgument
from launch.conditions import IfCondition
from launch.substitutions import LaunchConfiguration, PythonExpression
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterFile, ParameterValue

from launch import LaunchDescription


def generate_launch_description():
    default_config = os.path.join(
        get_package_share_directory("flowedge_relay"), "config", "relay.yaml"
    )
    config = LaunchConfiguration("config")
    namespace = LaunchConfiguration("namespace")
    nfe_ns = LaunchConfiguration("nfe_ns")

    relay_args = dict(
        package="flowedge_relay",
        executable="flowedge-relayd",
        name="flowedge_relay",
        namespace=namespace,
        output="screen",
        emulate_tty=True,
    )
    has_nfe = PythonExpression(["'", nfe_ns, "' != ''"])
    no_nfe = PythonExpression(["'", nfe_ns, "' == ''"])
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
        Node(
            **relay_args,
            parameters=[
                ParameterFile(config, allow_substs=True),
                {"nfe_ns": ParameterValue(nfe_ns, value_type=int)},
            ],
            condition=IfCondition(has_nfe),
        ),
        Node(
            **relay_args,
            parameters=[ParameterFile(config, allow_substs=True)],
            condition=IfCondition(no_nfe),
        ),
    ])
