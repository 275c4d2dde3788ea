#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The C scheduling core under AddressSanitizer + UndefinedBehaviorSanitizer (`make sanitize`).
#
# Builds csrc/ with FER_SANITIZE=1 (-fsanitize=address,undefined -fno-omit-frame-pointer,
# -fno-sanitize-recover=undefined: any UB report fails) into a copy of the package under
# build/sanitize/tree, so the normal in-place module is untouched, then runs the core's tests
# there, the bundled models included: the worker's request cycle (fer_serve, fer_exec, fer_pass)
# runs the real ONNX Runtime library (not instrumented) from instrumented code, through
# test_serve.py and test_batch.py's random joins and leaves and test_batch_rtc.py's real-time
# chunking rows, the C intake over hostile and prefix-bearing messages (test_intake.py), a relay
# pool's ranking, standby, answers watch and takeover (test_pool_core.py), the
# publisher's C loop (fer_publish)
# over real rcl and DDS through test_publish.py, and the core's priority-inheriting locks under
# SCHED_FIFO through test_realtime_locks.py. The interpreter is not instrumented, so the ASan
# runtime is LD_PRELOADed (it must come first) and leak detection is off (CPython keeps its arenas
# until exit).
#
#   scripts/sanitize_core.sh                          # about a minute on 2 cores
#   FER_PROPERTY_EXAMPLES=2000 scripts/sanitize_core.sh -x   # more cases; extra args go to pytest
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    . scripts/distro.sh
    if [ -x "$FER_VENV/bin/python" ]; then PY=$ROOT/$FER_VENV/bin/python; else PY=python3; fi
fi
STAGE=$ROOT/build/sanitize/tree
TESTS=(_core_build.py reference_model.py test_core.py test_admission.py test_core_properties.py
       test_edf_simulation.py test_ring.py test_bench_admission.py test_cost.py
       test_exec_args.py test_batch_core.py test_noise.py core_helpers.py test_serve.py test_batch.py
       ros_helpers.py test_publish.py test_realtime_locks.py test_core_rtc.py test_batch_rtc.py
       test_intake.py pool_reference.py test_pool_core.py)

rm -rf "$STAGE"
mkdir -p "$STAGE/test" "$STAGE/flowedge_relay"
# Python sources of the package (no built module, no caches), the C sources, the core's tests;
# and the tools package with its C drivers (test_ring.py and the admission bench call them).
tar -C "$ROOT" --exclude='__pycache__' --exclude='*.so' -cf - flowedge_relay csrc \
    tools/flowedge_relay_tools tools/csrc | tar -C "$STAGE" -xf -
for t in "${TESTS[@]}"; do cp "test/$t" "$STAGE/test/"; done
cat > "$STAGE/test/conftest.py" <<'PYEOF'
"""Sanitizer run: make sure the instrumented module of this tree is the one under test."""
import pathlib

import flowedge_relay._fer_core as core_module
import flowedge_relay_tools.native  # loads the drivers, bound to the core module above
import flowedge_relay_tools._fer_bench as drivers_module

TREE = pathlib.Path(__file__).resolve().parent.parent
assert pathlib.Path(core_module.__file__).resolve().is_relative_to(TREE), core_module.__file__
assert pathlib.Path(drivers_module.__file__).resolve().is_relative_to(TREE), drivers_module.__file__
assert "libasan" in pathlib.Path("/proc/self/maps").read_text(), "ASan runtime not loaded"
PYEOF
cat > "$STAGE/pytest.ini" <<'INIEOF'
[pytest]
testpaths = test
pythonpath = . tools test
addopts = -ra --durations=5
markers =
    ros: starts ROS 2 / DDS (see the repository's pytest.ini)
INIEOF

echo "sanitize: building the core with -fsanitize=address,undefined" >&2
FER_SANITIZE=1 FER_BUILD_DIR="$ROOT/build/sanitize/tmp" "$PY" "$STAGE/flowedge_relay/_build_core.py"
FER_SANITIZE=1 FER_BUILD_DIR="$ROOT/build/sanitize/tmp" PYTHONPATH="$STAGE:$STAGE/tools${PYTHONPATH:+:$PYTHONPATH}" \
    "$PY" -m flowedge_relay_tools._build_bench

LIBASAN=$(gcc -print-file-name=libasan.so)
LIBUBSAN=$(gcc -print-file-name=libubsan.so)
# Reports go to files: pytest captures stderr, and a sanitizer abort would take it along.
REPORTS=$ROOT/build/sanitize/reports
rm -rf "$REPORTS"
mkdir -p "$REPORTS"
cd "$STAGE"
status=0
LD_PRELOAD="$LIBASAN:$LIBUBSAN" \
ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:log_path=$REPORTS/asan" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$REPORTS/ubsan" \
FER_PROPERTY_EXAMPLES="${FER_PROPERTY_EXAMPLES:-300}" \
    "$PY" -m pytest -q -p no:cacheprovider "$@" || status=$?
if compgen -G "$REPORTS/*" > /dev/null; then
    echo "sanitize: sanitizer reports:" >&2
    cat "$REPORTS"/* >&2
    status=1
fi
if [ "$status" -eq 0 ]; then
    echo "sanitize: OK (core tests passed under ASan + UBSan, no reports)" >&2
fi
exit "$status"
