#!/usr/bin/env bash
# Some grids of a campaign, each `sweep run` on its own output, on the lent one-H200 machine, from the project root:
#
#   SWEEP_GIT_SHA=<commit> bash benchmarks/device/grids.sh NAME PROFILE GRID...
#
# For a few grids of a campaign whose other grids need not run again (job.sh runs them all). Installs what the call
# carries (benchmarks/device/install.sh: .whl first; TE's parts over the calls before, as job.sh's), then runs each
# GRID into /tmp/sweep-results/NAME/<grid's file name> unless that folder has rows already (a warm machine keeps them),
# stopping at the call's deadline, and packs the rows into $OUT/NAME.tgz (Parquet partition folders do not come
# back as files). `sweep results` reads them on this side. Rows: benchmarks/history/.
set -uo pipefail
[ $# -ge 3 ] || { echo "usage: bash benchmarks/device/grids.sh NAME PROFILE GRID..." >&2; exit 2; }
name=$1 profile=$2
shift 2
source benchmarks/device/env.sh
OUT=${OUT:-/tmp/out} results=/tmp/sweep-results/$name
mkdir -p "$OUT" "$results"
deadline=$((${JOB_LIMIT_S:-570} + SECONDS))
bash benchmarks/device/install.sh || exit 1
python3 -c 'import ray, torchao, pydantic' 2>/dev/null || { echo "grids: carry .whl first"; exit 0; }
status=0
for grid in "$@"; do
  out=$results/$(basename "$grid" .yaml)
  if [ -n "$(find "$out" -name '*.parquet' -print -quit 2>/dev/null)" ]; then echo "== $grid: rows already in $out"; continue; fi
  left=$((deadline - SECONDS))
  [ $left -gt 30 ] || { echo "grids: no time left for $grid"; status=124; break; }
  echo "== $(date -u +%FT%TZ) sweep run $grid -> $out"
  timeout --signal=INT --kill-after=20 $left $SWEEP run "$grid" --cluster "$profile" --output "$out" --no-progress
  rc=$?
  echo "== $grid: exit $rc"
  [ $rc -eq 0 ] || [ $rc -eq 3 ] || status=$rc
done
tar czf "$OUT/$name.tgz" -C /tmp/sweep-results "$name"
exit $status
