# SPDX-License-Identifier: Apache-2.0
# Sourced by bootstrap.sh and env.sh: which ROS 2 distro this shell builds and runs against.
# ROS_DISTRO picks it (jazzy, the default, or kilted), as a sourced ROS 2 install would set it;
# each distro has its own venv and colcon tree, so both can live side by side in one checkout.
FER_DISTRO=${ROS_DISTRO:-jazzy}
case "$FER_DISTRO" in
  jazzy|kilted) ;;
  *) echo "ROS_DISTRO=$FER_DISTRO is not supported here: use jazzy (default) or kilted" >&2
     return 1 2>/dev/null || exit 1 ;;
esac
FER_VENV=".venv/$FER_DISTRO"       # the pinned wheels of requirements/$FER_DISTRO.txt
FER_BUILD="build/$FER_DISTRO"      # colcon's build, install and log trees
FER_INSTALL="install/$FER_DISTRO"
FER_LOG="log/$FER_DISTRO"
