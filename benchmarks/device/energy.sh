#!/usr/bin/env bash
# The energy-one-gpu campaign on the lent one-H200 machine (kind nvidia-h200), from the project root:
#
#   bash benchmarks/device/energy.sh [PROFILE]      (PROFILE: benchmarks/profiles/h200x1.yaml)
#
# carries .whl (benchmarks/device/prepare.sh wheels: ray, torchao, pydantic and nvidia-ml-py, whose pynvml reads
# the energy counter), then .whl-results (duckdb: the checker and tables) and TE's parts, as job.sh does. Runs the
# campaign twice, into /tmp/sweep-results/energy-one-gpu/repeat-1 and repeat-2 (two runs of the same trials:
# separate folders, so --resume in a later job goes on with each repeat instead of taking one for the other),
# then benchmarks/energy_check.py over both and the export table, and packs the rows into $OUT/energy-one-gpu.tgz.
# A job stops in time to pack; call it again carrying .device-out (see job.sh) and it resumes.
set -uo pipefail
campaign=energy-one-gpu
profile=${1:-benchmarks/profiles/h200x1.yaml}
source benchmarks/device/lib.sh
job_begin $campaign 1
python3 -c 'import pynvml' 2>/dev/null || {
  echo "job: nvidia-ml-py is not installed: carry a .whl made by benchmarks/device/prepare.sh wheels (the energy" \
       "columns would all be null)"; exit 1; }
status=0
for repeat in 1 2; do
  left=$((deadline - SECONDS))
  [ $left -gt 30 ] || { echo "job: no time left for repeat $repeat"; status=124; break; }
  SWEEP_RUN_ARGS="${SWEEP_RUN_ARGS:-} --resume" timeout --signal=INT --kill-after=20 $left \
    bash benchmarks/run.sh "$campaign" "$profile" "$results/repeat-$repeat" || status=$?
done
python3 benchmarks/energy_check.py "$results" || { [ $status -ne 0 ] || status=1; }
$SWEEP results export "$results" --format md
$SWEEP results compare "$results" --format md
pack "$results"
echo "job: rows in \$OUT/$campaign.tgz (exit $status); to go on in the next job: mkdir -p .device-out &&" \
     "tar xzf $campaign.tgz -C .device-out, then carry .device-out"
exit $status
