#!/usr/bin/env bash
# Run one benchmark campaign on a cluster: every grid of benchmarks/campaigns/CAMPAIGN/ through `sweep run`,
# all into one result folder, then print the table `sweep results export` makes of that folder.
#
#   bash benchmarks/run.sh CAMPAIGN PROFILE [OUTPUT]
#
# CAMPAIGN  a folder name under benchmarks/campaigns/ (benchmarks/README.md says what each one answers)
# PROFILE   a cluster profile: a name from clusters/ or a YAML path (benchmarks/profiles/h200x2.yaml is the
#           machine RESULTS.md was measured on)
# OUTPUT    the result folder (default results/CAMPAIGN); rows of an earlier run there are kept and counted
#
# The command is `sweep`; set SWEEP to change it (SWEEP="python3 -m sweep" where sweep is not installed).
# SWEEP_RUN_ARGS are added to every `sweep run` (e.g. --fresh-actors).
# A grid that measured nothing (sweep's exit status 3: every attempt oom, error, timeout or unsupported) does
# not stop the campaign: the next grid runs, and the campaign exits 3 after printing the table. Any other
# failure (a user error, Ctrl-C) stops it with sweep's status.
set -uo pipefail

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: bash benchmarks/run.sh CAMPAIGN PROFILE [OUTPUT]" >&2
  exit 2
fi
campaigns=$(dirname "$0")/campaigns
campaign=$(basename "$1")  # benchmarks/campaigns/NAME/ works too
profile=$2
output=${3:-results/$campaign}
if [ ! -d "$campaigns/$campaign" ]; then
  echo "error: no campaign '$campaign'; the campaigns are: $(ls "$campaigns" | tr '\n' ' ')" >&2
  exit 2
fi
read -ra sweep <<< "${SWEEP:-sweep}"
read -ra run_args <<< "${SWEEP_RUN_ARGS:-}"

status=0
for grid in "$campaigns/$campaign"/*.yaml; do
  echo "== $(date -u +%FT%TZ) ${sweep[*]} run $grid --cluster $profile --output $output" >&2
  "${sweep[@]}" run "$grid" --cluster "$profile" --output "$output" "${run_args[@]}"
  rc=$?
  if [ $rc -eq 3 ]; then
    echo "== $grid measured nothing (exit 3); going on with the next grid" >&2
    status=3
  elif [ $rc -ne 0 ]; then
    echo "== $grid: sweep exited $rc; campaign stopped (rows written so far are in $output)" >&2
    exit $rc
  fi
done

echo "== $(date -u +%FT%TZ) ${sweep[*]} results export $output --format md" >&2
"${sweep[@]}" results export "$output" --format md || exit $?
exit $status
