#!/usr/bin/env bash
# One `sweep tune` on the lent H200 machine, from the project root (kind nvidia-h200-x2, carrying .whl):
#
#   SWEEP_GIT_SHA=<commit> bash benchmarks/device/tune.sh NAME [sweep tune options, --resume to go on]
#
# writes rows into /tmp/sweep-results/NAME, which stays while the machine is warm (a call within its idle
# window resumes a search the last one's limit cut), and packs them without the profiler's traces into
# $OUT/NAME.tgz (and the traces into $OUT/NAME-traces.tgz); the log is $OUT/NAME.log. Stops sweep with SIGINT
# (it tears down and keeps its rows) before the device command's 600 s limit.
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash benchmarks/device/tune.sh NAME [sweep tune options]" >&2; exit 2; }
name=$1
shift
source benchmarks/device/env.sh
OUT=${OUT:-/tmp/out}
results=/tmp/sweep-results/$name
mkdir -p "$OUT" "$results"
exec > >(tee -a "$OUT/$name.log") 2>&1
bash benchmarks/device/install.sh || exit 1
date -u +%FT%TZ
timeout --signal=INT --kill-after=20 "${JOB_LIMIT_S:-560}" $SWEEP tune "$@" --output "$results" --no-progress
status=$?
tar czf "$OUT/$name.tgz" --exclude=_traces -C /tmp/sweep-results "$name"
traces=$(cd /tmp/sweep-results && find "$name" -type d -name _traces)
[ -z "$traces" ] || tar czf "$OUT/$name-traces.tgz" -C /tmp/sweep-results $traces
echo "tune: rows in \$OUT/$name.tgz (sweep exit $status)"
exit $status
