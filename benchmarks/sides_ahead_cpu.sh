#!/usr/bin/env bash
# Side processes started ahead against started by the rank, on this machine's CPU (benchmarks/RESULTS.md "Cold sweep",
# session 28), from the project root:
#
#   bash benchmarks/sides_ahead_cpu.sh [PAIRS]
#
# `sweep run` of gpt-tiny fp32 and bf16 (two sets of graphs, compiled ahead by one side process: SWEEP_PRECOMPILE_SIDES
# 1, as a 2-core host starts none by default) on one CPU rank, each run on its own empty compile cache, A B A B:
# prestarted_ranks 1 (the rank and its side process started ahead) then 0. Prints each run's wall and its trials.
set -euo pipefail
dir=$(mktemp -d /tmp/sides-ahead-XXXX)
sweep=${SWEEP:-.venv/bin/sweep}
cat >"$dir/grid.yaml" <<'GRID'
name: sides-ahead
models: [gpt-tiny]
precisions: [fp32, bf16]
batch_sizes: [2]
seq_len: 32
gpus: 1
compile: regional
steps: {warmup: 1, measure: 2}
GRID
for i in $(seq "${1:-2}"); do
  for ahead in 1 0; do
    printf 'name: ab\naccelerator: cpu\nray_address: local\nnodes: 1\ngpus_per_node: 1\ncpus_per_rank: 1\n' >"$dir/p.yaml"
    printf 'prestarted_ranks: %s\ncompile_cache: %s\nenv:\n  SWEEP_PRECOMPILE_SIDES: "1"\n' "$ahead" \
      "$dir/cache-$ahead-$i" >>"$dir/p.yaml"
    began=$(date +%s.%N)
    "$sweep" run "$dir/grid.yaml" --cluster "$dir/p.yaml" --output "$dir/out-$ahead-$i" --no-progress \
      --max-concurrent 1 >"$dir/log-$ahead-$i" 2>&1
    echo "prestarted_ranks $ahead, pair $i: wall $(python3 -c "import time; print(round(time.time() - $began, 1))") s"
    "$sweep" results query "$dir/out-$ahead-$i" "SELECT precision, round(trial_wall_s, 1) AS held,
      round(precompile_s, 1) AS side_wait, precompile_sides_ahead, imported_before_placement,
      round(process_start_s, 1) AS spawn, round(import_s, 1) AS import FROM results ORDER BY started_at"
  done
done
