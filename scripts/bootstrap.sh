#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Sets up everything FlowEdge Relay needs from nothing but the machine's python3 (3.11):
#   1. checks the tools (python 3.11, a C compiler, cmake, make)
#   2. creates .venv/<distro> and installs the pinned wheels of requirements/<distro>.txt
#   3. rewrites the build container's Python paths in the wheels' CMake files (inside the venv)
#   4. builds flowedge_relay_msgs, flowedge_relay and flowedge_relay_tools (tools/) with colcon
#      into build/<distro>, install/<distro>
#   5. builds the C scheduling core and the tools' C drivers in place (CFFI) so the source tree
#      is importable
# The distro is ROS_DISTRO: jazzy (the default, LTS) or kilted (scripts/distro.sh). Each step is
# skipped when its inputs have not changed (stamps in .venv/<distro>/.stamps), so a second run
# finishes in seconds. Override the interpreter with PYTHON=/path/to/python3.11.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# shellcheck source=distro.sh
. scripts/distro.sh
venv="$root/$FER_VENV"
reqfile="requirements/$FER_DISTRO.txt"
stamps="$venv/.stamps"
PYTHON=${PYTHON:-python3}
t0=$(date +%s)

step() { printf '\033[1m[bootstrap]\033[0m %s\n' "$*"; }
die() { printf '\033[31m[bootstrap] error:\033[0m %s\n' "$*" >&2; exit 1; }
# digest of the given files' contents (missing files hash as empty)
digest() { { cat "$@" 2>/dev/null || true; } | sha256sum | cut -d" " -f1; }
fresh() { [ -f "$stamps/$1" ] && [ "$(cat "$stamps/$1")" = "$2" ]; }
stamp() { mkdir -p "$stamps"; echo "$2" > "$stamps/$1"; }

# 1. tools --------------------------------------------------------------------------------------
step "1/5 checking tools (ROS 2 $FER_DISTRO)"
command -v "$PYTHON" >/dev/null || die "'$PYTHON' not found; install Python 3.11 or set PYTHON=/path/to/python3.11"
pyver=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ "$pyver" = "3.11" ] || die "Python 3.11 is required (the ROS 2 wheels are cp311 only); '$PYTHON' is $pyver. Set PYTHON=/path/to/python3.11"
[ "$(uname -m)" = "x86_64" ] || die "the ROS 2 wheels on PyPI are manylinux x86_64 only; this machine is $(uname -m)"
command -v cc >/dev/null || command -v gcc >/dev/null || die "no C compiler (cc/gcc): install build-essential"
command -v cmake >/dev/null || die "cmake not found: install cmake (>= 3.16)"
command -v make >/dev/null || die "make not found: install make"
"$PYTHON" -c 'import sysconfig, os, sys; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")) else 1)' \
  || die "Python headers (Python.h) missing: install python3.11-dev"

# 2. venv + pinned wheels -----------------------------------------------------------------------
req=$(digest "$reqfile" requirements/common.txt)
if [ -x "$venv/bin/python" ] && fresh requirements "$req"; then
  step "2/5 $FER_VENV up to date"
else
  step "2/5 installing the pinned wheels of $reqfile into $FER_VENV (first run: a minute or two)"
  [ -x "$venv/bin/python" ] || "$PYTHON" -m venv "$venv"
  # --no-deps: the file is the whole closure, so nothing is resolved here; pip check proves it
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps -r "$reqfile" 2>&1 \
    | grep -v "is neither a file nor a directory" || true
  "$venv/bin/python" -m pip check --disable-pip-version-check >/dev/null \
    || die "$reqfile is not complete: $("$venv/bin/python" -m pip check 2>&1 | head -3)"
  "$venv/bin/python" -c 'import rclpy, numpy, onnxruntime, cffi' \
    || die "pip install finished but rclpy/numpy/onnxruntime/cffi do not import (see output above)"
  rm -f "$stamps/cmake-fixup"
  stamp requirements "$req"
fi

# 3. CMake path fix-up --------------------------------------------------------------------------
if fresh cmake-fixup "$req"; then
  step "3/5 CMake paths already fixed"
else
  step "3/5 rewriting the wheels' build-container paths in $FER_VENV/share/**/*.cmake"
  "$venv/bin/python" "$root/scripts/fix_cmake_paths.py" "$venv"
  stamp cmake-fixup "$req"
fi

# 4. colcon build -------------------------------------------------------------------------------
src=$(digest "$reqfile" msg/*.msg msg/CMakeLists.txt msg/package.xml package.xml setup.py \
  tools/package.xml tools/setup.py tools/setup.cfg tools/csrc/* tools/flowedge_relay_tools/_build_bench.py \
  csrc/*.c csrc/*.h flowedge_relay/_build_core.py launch/* config/*)
if [ -f "$FER_INSTALL/setup.bash" ] && fresh colcon "$src"; then
  step "4/5 colcon build up to date"
else
  step "4/5 colcon build (flowedge_relay_msgs, flowedge_relay, flowedge_relay_tools)"
  # shellcheck disable=SC1091
  . "$venv/bin/activate"
  export CMAKE_PREFIX_PATH="$venv" AMENT_PREFIX_PATH="$venv"
  colcon --log-base "$FER_LOG" build --base-paths . msg tools --symlink-install \
    --build-base "$FER_BUILD" --install-base "$FER_INSTALL" \
    --event-handlers console_cohesion- summary+ status- \
    --cmake-args -DBUILD_TESTING=OFF -DPython3_EXECUTABLE="$venv/bin/python" \
    || die "colcon build failed (logs under $FER_LOG/latest_build)"
  deactivate
  stamp colcon "$src"
fi

# 5. C core in place ----------------------------------------------------------------------------
# the core reads the messages' generated headers (csrc/fer_wire.h): a .msg change rebuilds it;
# the tools' C drivers (tools/csrc) are their own module, compiled against the core's headers
core=$(digest csrc/*.c csrc/*.h flowedge_relay/_build_core.py msg/*.msg \
  tools/csrc/* tools/flowedge_relay_tools/_build_bench.py)
if [ -f flowedge_relay/_build_core.py ]; then
  if ls flowedge_relay/_fer_core*.so tools/flowedge_relay_tools/_fer_bench*.so >/dev/null 2>&1 \
     && fresh core "$core"; then
    step "5/5 C core up to date"
  else
    step "5/5 building the C core and the tools' C drivers (CFFI) in place"
    FER_DISTRO=$FER_DISTRO "$venv/bin/python" -m flowedge_relay._build_core >/dev/null \
      || die "building the C core failed"
    FER_DISTRO=$FER_DISTRO PYTHONPATH="$root:$root/tools" \
      "$venv/bin/python" -m flowedge_relay_tools._build_bench >/dev/null \
      || die "building the tools' C drivers failed"
    stamp core "$core"
  fi
fi

step "ready for ROS 2 $FER_DISTRO in $(( $(date +%s) - t0 )) s  (source: . scripts/env.sh)"
