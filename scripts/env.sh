# SPDX-License-Identifier: Apache-2.0
# Source me (". scripts/env.sh") for a shell with the venv, the built messages and the package,
# for the distro ROS_DISTRO names (jazzy by default, or kilted; scripts/distro.sh).
_fer_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$_fer_root/scripts/distro.sh" || return 1
. "$_fer_root/$FER_VENV/bin/activate"
. "$_fer_root/$FER_INSTALL/setup.bash"
# the source trees of both Python packages: flowedge_relay (.) and flowedge_relay_tools (tools/)
export PYTHONPATH="$_fer_root:$_fer_root/tools${PYTHONPATH:+:$PYTHONPATH}"
# The packages' executables (flowedge-relayd; flowedge_relay_bench, flowedge-relay-drill, ...)
# live where `ros2 run` looks for them; put them on PATH too, since ros2cli is not installable here.
export PATH="$_fer_root/$FER_INSTALL/flowedge_relay/lib/flowedge_relay:$PATH"
export PATH="$_fer_root/$FER_INSTALL/flowedge_relay_tools/lib/flowedge_relay_tools:$PATH"
# Keep DDS traffic on this machine: tests and demos must not talk to other hosts.
export ROS_AUTOMATIC_DISCOVERY_RANGE=${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}
export ROS_DISTRO=$FER_DISTRO
unset _fer_root
