#!/usr/bin/env bash
# One device job on the lent H200 machine (kind nvidia-h200-x2), from the project root:
#
#   bash benchmarks/device/job.sh CAMPAIGN [PROFILE]      (PROFILE: benchmarks/profiles/h200x2.yaml)
#
# installs what the job carries (benchmarks/device/install.sh), and once everything the campaign needs is
# there, runs benchmarks/run.sh CAMPAIGN PROFILE into /tmp/sweep-results/CAMPAIGN and packs those rows into
# $OUT/CAMPAIGN.tgz (Parquet partition folders are named cluster=.../run=..., which do not come back as
# files). Until then it says which folder to carry next: call it again with that folder. The log is
# $OUT/CAMPAIGN.log. The campaign `multinode` runs twice: on PROFILE (one Ray node holding both GPUs),
# then on benchmarks/profiles/h200-2nodes.yaml over two Ray nodes of one GPU each, started here. The campaign
# `layouts` runs each grid on its own profile (benchmarks/device/layouts.sh; PROFILE is not used).
set -uo pipefail
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: bash benchmarks/device/job.sh CAMPAIGN [PROFILE]" >&2; exit 2; }
campaign=$(basename "$1")
profile=${2:-benchmarks/profiles/h200x2.yaml}
[ -d "benchmarks/campaigns/$campaign" ] || { echo "error: no campaign '$campaign' under benchmarks/campaigns/" >&2; exit 2; }
needs_te=0
grep -qE '^precisions:.*-te\b' "benchmarks/campaigns/$campaign"/*.yaml && needs_te=1
source benchmarks/device/lib.sh
job_begin "$campaign" $needs_te  # env, $OUT, $results, the log, installs, $deadline; exits 0 naming the next carry
# A campaign longer than one job (a tune: ~10 min a search) goes on from the rows an earlier job packed:
# unpacked here into .device-out/CAMPAIGN and carried (job_begin copied them in), every `sweep run` resumes.
[ -d ".device-out/$campaign" ] && export SWEEP_RUN_ARGS="${SWEEP_RUN_ARGS:-} --resume"

run() {  # run PROFILE: the campaign, stopped with SIGINT past the deadline
  local left=$((deadline - SECONDS))
  [ $left -gt 0 ] || { echo "job: no time left for $1"; return 124; }
  timeout --signal=INT --kill-after=20 $left bash benchmarks/run.sh "$campaign" "$1" "$results"
}

if [ "$campaign" = multinode ]; then
  run "$profile"
  ray_nodes_start 1
  run benchmarks/profiles/h200-2nodes.yaml
  status=$?
  ray_nodes_stop
  $SWEEP results compare "$results" --by cluster --baseline "$(awk '/^name:/ {print $2}' "$profile")" --format md
elif [ "$campaign" = layouts ]; then
  source benchmarks/device/layouts.sh  # each grid on its profile, as many as the machine's GPUs allow
  layouts
  status=$?
else
  run "$profile"
  status=$?
fi
pack "$results"
echo "job: rows in \$OUT/$campaign.tgz (sweep exit $status); to go on in the next job: mkdir -p .device-out &&" \
     "tar xzf $campaign.tgz -C .device-out, then carry .device-out"
exit $status
