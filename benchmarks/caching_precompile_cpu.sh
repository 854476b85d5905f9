#!/usr/bin/env bash
# dynamo's experimental cache of traced frames (TORCH_CACHING_PRECOMPILE=1) against none, on this machine's CPU: one
# llama-tiny trial, one rank, `compile: regional`, run twice on one compile cache each way; prints the second run's
# compile report (its cache hits and misses, dynamo's compile phases) from the rank's log. From the project root:
#   bash benchmarks/caching_precompile_cpu.sh         (~4 min; benchmarks/RESULTS.md "Cold sweep", session 45)
set -euo pipefail
sweep=${SWEEP:-.venv/bin/sweep}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat > "$dir/grid.yaml" <<'YAML'
name: caching-precompile
models: [llama-tiny]
precisions: [bf16]
batch_sizes: [2]
compile: regional
seq_len: 128
gpus: 1
steps: {warmup: 2, measure: 5}
YAML
for on in 0 1; do
  cat > "$dir/profile-$on.yaml" <<YAML
name: local
accelerator: cpu
ray_address: local
nodes: 1
gpus_per_node: 1
cpus_per_rank: 1
compile_cache: $dir/cache-$on
env: {SWEEP_COMPILE_REPORT: "1", TORCH_CACHING_PRECOMPILE: "$on"}
YAML
  for run in 1 2; do
    rm -rf /tmp/ray/session_latest/logs/worker-*
    "$sweep" run "$dir/grid.yaml" --cluster "$dir/profile-$on.yaml" -o "$dir/rows-$on-$run" > "$dir/log" 2>&1
  done
  echo "TORCH_CACHING_PRECOMPILE=$on, second run:"
  grep -h -A1 "sweep compile report: {" /tmp/ray/session_latest/logs/worker-*.err | cut -c1-400
done
