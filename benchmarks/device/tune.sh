#!/usr/bin/env bash
# One `sweep tune` on the lent H200 machine, from the project root (kind nvidia-h200-x2, carrying .whl):
#
#   SWEEP_GIT_SHA=<commit> bash benchmarks/device/tune.sh NAME [sweep tune options, --resume to go on]
#
# Until the machine has what the search needs it says which folder to carry next, as job.sh does: .whl, and
# for a Transformer Engine precision .te1 ... .te5, .tefinal (a fresh machine starts again from .whl).
# writes rows into /tmp/sweep-results/NAME, which stays while the machine is warm (a call within its idle
# window resumes a search the last one's limit cut), and packs them without the profiler's traces into
# $OUT/NAME.tgz (and the traces into $OUT/NAME-traces.tgz); the log is $OUT/NAME.log. Stops sweep with SIGINT
# (it tears down and keeps its rows) so that it ends within JOB_LIMIT_S (540) of this script's start, leaving the
# device command's 600 s limit room to pack; the rows are packed every minute too, so a call cut anyway keeps them
# (session 10 lost a TE search's rows: 560 s of sweep, counted after the TE install, ran past 600).
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bash benchmarks/device/tune.sh NAME [sweep tune options]" >&2; exit 2; }
name=$1
shift
source benchmarks/device/env.sh
OUT=${OUT:-/tmp/out}
results=/tmp/sweep-results/$name
mkdir -p "$OUT" "$results"
exec > >(tee -a "$OUT/$name.log") 2>&1
# A search cut on a machine released since (session 11: the next call came 64 s after a long one, past the 30 s
# idle window) goes on from its rows on a fresh one: unpack NAME.tgz into .device-out/ here, carry .device-out
# with .whl in the first call, and pass --resume.
source benchmarks/device/lib.sh
carry_in "$results"
bash benchmarks/device/install.sh || exit 1
needs_te=0
[[ " $* " =~ [[:space:]](fp8-te-[a-z]+|bf16-te)[[:space:]] ]] && needs_te=1
next=$(next_carry 0 $needs_te)
[ -z "$next" ] || { echo "tune: cannot run yet; call this again carrying $next"; exit 0; }
date -u +%FT%TZ
# the packer: on TERM it finishes the tar it is in (a trap runs once the foreground command ends) and exits,
# so no orphaned tar writes the archive while the last pack below does
(trap 'exit 0' TERM; while :; do sleep 60 & wait $!; pack "$results"; done) &
packer=$!
timeout --signal=INT --kill-after=20 "$(( ${JOB_LIMIT_S:-540} - SECONDS - 20 ))" \
  $SWEEP tune "$@" --output "$results" --no-progress
status=$?
kill $packer 2>/dev/null
wait $packer 2>/dev/null  # (at most the tar it was in)
pack "$results"
echo "tune: rows in \$OUT/$name.tgz (sweep exit $status)"
exit $status
