# Source me (". scripts/env.sh") for a shell with the venv, the built messages and the package.
_fer_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
. "$_fer_root/.venv/bin/activate"
. "$_fer_root/install/setup.bash"
export PYTHONPATH="$_fer_root${PYTHONPATH:+:$PYTHONPATH}"
# The package's executables (flowedge-relayd, flowedge_relay_bench, ...) live where `ros2 run`
# looks for them; put them on PATH too, since ros2cli is not installable here.
export PATH="$_fer_root/install/flowedge_relay/lib/flowedge_relay:$PATH"
# Keep DDS traffic on this machine: tests and demos must not talk to other hosts.
export ROS_AUTOMATIC_DISCOVERY_RANGE=${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}
unset _fer_root
