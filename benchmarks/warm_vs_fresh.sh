#!/usr/bin/env bash
# Warm rank groups against a fresh group per trial, on one machine in one go (RESULTS.md "warm groups"):
#
#   bash benchmarks/warm_vs_fresh.sh PROFILE OUTPUT [warm|fresh|both|maxbatch|all]
#
# the warm-groups campaign with --fresh-actors (OUTPUT/fresh) and warm (OUTPUT/warm), then the max-batch
# search for Llama3-8B bf16 on 2 GPUs (OUTPUT/maxbatch). Each `sweep run` ends with its GPU-time line
# (measured steps, warm-up, compile, start-up, OOM attempts). PART runs one piece (a lent machine's command
# limit is 10 minutes; `both` is fresh then warm, one after the other on one machine: the fresh run fills
# the node's compile cache, which the warm run then finds, as a user's second sweep does); `sweep results compare OUTPUT/warm ...` is not how to compare them: both runs have
# the same configs, so export each and put the tables side by side (RESULTS.md does).
set -uo pipefail
profile=$1 output=$2 part=${3:-all}
here=$(dirname "$0")
campaign=${CAMPAIGN:-warm-groups}  # or warm-vs-fresh-long: its noisiest configs with twice the measured steps
read -ra sweep <<< "${SWEEP:-sweep}"
case $part in all|both|fresh) SWEEP_RUN_ARGS=--fresh-actors bash "$here/run.sh" "$campaign" "$profile" "$output/fresh" ;; esac
case $part in all|both|warm) bash "$here/run.sh" "$campaign" "$profile" "$output/warm" ;; esac
if [ "$part" = all ] || [ "$part" = maxbatch ]; then
  "${sweep[@]}" max-batch --model llama3-8b --precision bf16 --gpus 2 --seq-len 4096 --compile regional \
    --cluster "$profile" --output "$output/maxbatch" --no-progress
fi
