#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Every flowedge_relay_bench subcommand at full size, one after the other (`make bench` runs this):
#   out/bench/<name>.json, out/bench/<name>.png and out/bench/<name>.txt (the printed table),
# then docs/performance.md, docs/img/bench-*.png and the README's Performance section from them
# (python -m flowedge_relay_tools.bench.perfdoc), so no figure in the docs is typed by hand.
#
#   scripts/bench_all.sh                    # all of them (about 30 minutes on 2 cores); the
#                                           # run before is kept in out/bench.previous and its
#                                           # headline figures shown next to this run's
#   scripts/bench_all.sh overload overhead  # only these (the docs still list every JSON there)
#   BENCH_OUT=/tmp/b BENCH_DOCS=0 scripts/bench_all.sh   # elsewhere, docs untouched
#
# Measurements, not tests: a busy host shows in the numbers (each report records the load).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [ -z "${VIRTUAL_ENV:-}" ] || ! python -c "import flowedge_relay_msgs" 2>/dev/null; then
    set +u  # colcon's setup.bash reads unset variables
    # shellcheck source=/dev/null
    source scripts/env.sh
    set -u
fi
OUT=${BENCH_OUT:-out/bench}
# A figure counts when it reproduces: a full run first keeps the run before it in
# $OUT.previous, and the docs show the headline figures of both side by side.
PREV=${OUT%/}.previous
if [ "$#" -eq 0 ] && compgen -G "$OUT/*.json" > /dev/null; then
    rm -rf "$PREV"
    mv "$OUT" "$PREV"
fi
mkdir -p "$OUT"

# name and its full-size arguments; calibrate uses the bench model (~1 ms per NFE) like
# overload and overhead, so the three describe the same workload. calibrate-check runs the
# user's flow five times on the host as it is and five times next to a continuously spinning
# hog (about 12 minutes): each run calibrates in its own process, starts flowedge-relayd with
# the recommended values and offers 2x from a robot-like rclpy node. overload runs every policy
# (edf_admission and edf_adaptive side by side); overload-noise runs the EDF policies again with
# a CPU-hog neighbour (bench/noise.py, busy 50 ms / sleep 50 ms) during the trace. The
# overload-rt-* reports run the EDF policies at 2x and 3x in the real-time deployment mode
# (docs/robot-computer.md; the relay's threads at SCHED_FIFO, memory locked, Fast DDS's threads
# from config/fastdds_realtime.xml) next to one (1hog) or two (2hogs: both cores of a 2-core host)
# continuously spinning neighbours at normal priority, running from before the inline calibration
# (a robot is calibrated with its load on); overload-normal-* run the same without the mode, for
# the contrast. batching measures saturated capacity at batch_slots 1-16 per model and
# the 2x trace at B = 8 vs B = 1. rtc runs the closed-loop detour task at inference delays
# 0-4 (nothing timed: deterministic). overload-rtc serves the RTC policy (models/policy_rtc) and
# gives every request of the EDF policies' 2x and 3x trace a real-time chunking prefix
# (bench/overload_rtc.py): is each answer in by chunk_start + frozen_rows x period, and how tight
# is frozen_rows; overload-rtc-rt-1hog asks the same on a busy host, in the real-time mode with a
# continuously spinning neighbour from before the calibration. fairness runs one client flooding
# at 5x capacity against three at 0.2x, with fair_share off, on, and A weighted 2, against
# flowedge-relayd processes over DDS (calibrated inline, on time judged at receipt); fairness-sim
# runs the same on the C core in virtual time (deterministic per seed). pool-sim measures the pool's
# C mechanism (balance, re-homing, the not_owner drop); pool runs real flowedge-relayd members of
# one pool over DDS (about 4 minutes): kill -9, a join and a SIGSTOP under 2x load, answered
# exactly once, and the intake of 1, 2 and 4 members (each size's ceiling here and its CPU per
# request, so the decisions/s with one core per member).
RT_TRACE="--model bench --policies edf_admission edf_adaptive --loads 2 3 --noise continuous
          --calibrate-under-noise"
declare -A ARGS=(
    [model]=""
    [admission]=""
    [calibrate]="--model bench"
    [calibrate-check]="--model bench --hogs 0 1"
    [overload]=""
    [overload-noise]="--policies edf_admission edf_adaptive --noise"
    [overload-rt-1hog]="$RT_TRACE --realtime --rt-dds"
    [overload-normal-1hog]="$RT_TRACE"
    [overload-rt-2hogs]="$RT_TRACE --noise-hogs 2 --realtime --rt-dds"
    [overload-normal-2hogs]="$RT_TRACE --noise-hogs 2"
    [overload-rtc]="--rtc --policies edf_admission edf_adaptive --loads 2 3"
    [overload-rtc-rt-1hog]="--rtc --policies edf_admission edf_adaptive --loads 2 3 --noise continuous --calibrate-under-noise --realtime --rt-dds"
    [batching]=""
    [nfe-breakdown]=""
    [intake]=""
    [overhead]="--compare-loops"
    [swap]=""
    [rtc]=""
    [fairness]=""
    [fairness-sim]="--sim"
    [pool-sim]=""
    [pool]=""
)
# report name -> subcommand, where they differ
declare -A SUBCOMMAND=(
    [overload-noise]=overload
    [overload-rt-1hog]=overload
    [overload-normal-1hog]=overload
    [overload-rt-2hogs]=overload
    [overload-normal-2hogs]=overload
    [overload-rtc]=overload
    [overload-rtc-rt-1hog]=overload
    [fairness-sim]=fairness
)
ORDER=(model admission intake calibrate calibrate-check overload overload-noise overload-rt-1hog overload-normal-1hog
       overload-rt-2hogs overload-normal-2hogs overload-rtc overload-rtc-rt-1hog batching
       nfe-breakdown overhead swap rtc fairness fairness-sim pool-sim pool)
if [ "$#" -gt 0 ]; then ORDER=("$@"); fi

REGISTERED=" $(python -c 'from flowedge_relay_tools.bench.__main__ import available; print(*available())') "
failed=()
for name in "${ORDER[@]}"; do
    sub=${SUBCOMMAND[$name]:-$name}
    if [[ "$REGISTERED" != *" $sub "* ]]; then
        echo "bench_all: $sub is not a registered subcommand (yet); skipped" >&2
        continue
    fi
    plot=(--plot "$OUT/$name.png")
    if [ "$sub" = nfe-breakdown ] || [ "$sub" = intake ] || [ "$sub" = swap ] ||
       [ "$sub" = calibrate-check ] || [ "$sub" = pool-sim ]; then plot=(); fi  # tables, no plot
    echo "== flowedge_relay_bench $sub ${ARGS[$name]:-} --json $OUT/$name.json ${plot[*]}" >&2
    # shellcheck disable=SC2086
    if python -m flowedge_relay_tools.bench "$sub" ${ARGS[$name]:-} \
            --json "$OUT/$name.json" "${plot[@]}" | tee "$OUT/$name.txt"; then
        :
    else
        echo "bench_all: $name failed" >&2
        failed+=("$name")
    fi
done

if [ "${BENCH_DOCS:-1}" != "0" ]; then
    prev=()
    if [ -d "$PREV" ]; then prev=(--previous "$PREV"); fi
    python -m flowedge_relay_tools.bench.perfdoc "$OUT" --command "make bench" "${prev[@]}"
fi
if [ "${#failed[@]}" -gt 0 ]; then
    echo "bench_all: failed: ${failed[*]}" >&2
    exit 1
fi
