# SPDX-License-Identifier: Apache-2.0
"""Launch K relays of one relay pool on this host (docs/design.md §13, README "Serving a fleet").

Usage (under a ROS 2 Jazzy or Kilted install, after `colcon build` and sourcing the workspace):

    ros2 launch flowedge_relay pool.launch.py                        # 2 relays of pool "fleet"
    ros2 launch flowedge_relay pool.launch.py count:=3 pool:=arm_cell nfe_ns:=250000
    ros2 launch flowedge_relay pool.launch.py namespace:=cell_a lease_ms:=300

Each relay is the managed node `flowedge_relay` in a namespace of its own (`<namespace>/relay_<i>`:
its parameters, lifecycle services and flowedge/stats stay apart), with the pool's topics
remapped to `<namespace>/flowedge/...`, shared by all: requests, actions, pool and model.
Producers publish to `<namespace>/flowedge/requests` and subscribe to
`<namespace>/flowedge/actions` exactly as with one relay. On several hosts, run this file on
each with the same `pool` and `namespace` (DDS discovery finds the members; docs/robot-computer.md
says what it needs where multicast is off). Relays of one pool use the same `lease_ms`.

The package's relay.yaml (keyed `/**/flowedge_relay`) applies to every relay; `pool`, the lease
and `nfe_ns` given here override it.
"""

import os

from ament_index_python.packages import get_package_share_directory
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import LifecycleNode
from launch_ros.parameter_descriptions import ParameterFile

from launch import LaunchContext, LaunchDescription

#: the relative topics the members of a pool share (request_topics at its default)
POOL_TOPICS = ("flowedge/requests", "flowedge/actions", "flowedge/pool", "flowedge/pool/spill",
               "flowedge/model")


def _integer(context: LaunchContext, name: str, low: int, high: int) -> int:
    text = LaunchConfiguration(name).perform(context).strip()
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name}:={text!r}: expected an integer") from None
    if not low <= value <= high:
        raise ValueError(f"{name}:={value}: expected {low}..{high}")
    return value


def pool_relays(context: LaunchContext, *args, **kwargs) -> list[LifecycleNode]:
    """`count` relay LifecycleNodes of one pool, resolved at launch time (their number and
    namespaces depend on the arguments' values)."""
    count = _integer(context, "count", 1, 64)
    pool = LaunchConfiguration("pool").perform(context).strip()
    if not pool:
        raise ValueError("pool:='': a pool needs a name (relay.launch.py starts a single relay)")
    shared = "/" + LaunchConfiguration("namespace").perform(context).strip().strip("/")
    overrides = {"pool": pool, "pool_lease_ms": _integer(context, "lease_ms", 50, 10_000)}
    nfe_ns = LaunchConfiguration("nfe_ns").perform(context).strip()
    if nfe_ns:
        overrides["nfe_ns"] = _integer(context, "nfe_ns", 0, 60_000_000_000)
    remappings = [(topic, f"{shared.rstrip('/')}/{topic}") for topic in POOL_TOPICS]
    return [
        LifecycleNode(
            package="flowedge_relay",
            executable="flowedge-relayd",
            name="flowedge_relay",
            namespace=f"{shared.rstrip('/')}/relay_{i}",
            parameters=[ParameterFile(LaunchConfiguration("config"), allow_substs=True),
                        overrides],
            remappings=remappings,
            output="screen",
            emulate_tty=True,
        )
        for i in range(count)
    ]


#: (name, default, description) of each launch argument; "config" defaults to relay.yaml
ARGUMENTS = (
    ("count", "2", "how many relays of the pool to start on this host (1..64)"),
    ("pool", "fleet", "the pool's name: relays with the same name share the sessions"),
    ("namespace", "", "namespace of the pool's shared topics; relay i runs in <it>/relay_<i>"),
    ("lease_ms", "500", "pool_lease_ms: a member silent this long is taken over (50..10000)"),
    ("config", None, "YAML parameter file for every relay (default: the package's relay.yaml)"),
    ("nfe_ns", "", "measured NFE upper bound in ns; overrides the YAML; empty = use the YAML"),
)


def generate_launch_description() -> LaunchDescription:
    default_config = os.path.join(
        get_package_share_directory("flowedge_relay"), "config", "relay.yaml"
    )
    return LaunchDescription([
        *(DeclareLaunchArgument(name, default_value=default_config if default is None
                                else default, description=description)
          for name, default, description in ARGUMENTS),
        OpaqueFunction(function=pool_relays),
    ])
