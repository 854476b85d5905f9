#!/usr/bin/env bash
# Compiling ahead (trainer.precompile) against compiling each trial as reached, on the lent one-H200 machine (kind
# nvidia-h200), from the project root, carrying .whl:
#
#   [PROBE_VARIANTS=--ahead] bash benchmarks/device/precompile_probe.sh [PRECISION:BATCH ...]
#
# Each variant (--ahead, --no-ahead) runs benchmarks/device/precompile_probe.py in its own process on its own empty
# compile cache (inductor's and Triton's): a fresh rank running the held-out model's trials one after the other.
# Records in $OUT/precompile-probe.jsonl.
set -uo pipefail
source benchmarks/device/lib.sh
JOB_NEEDS_RESULTS=0 job_begin precompile-probe 0  # no rows: no results wheels needed
nproc
i=0
for variant in ${PROBE_VARIANTS:---ahead --no-ahead}; do
  i=$((i + 1))
  left=$((deadline - SECONDS))
  [ $left -gt 40 ] || { echo "job: no time left for $variant"; break; }
  cache=/tmp/cc-precompile-$i
  rm -rf "$cache"
  echo "== $(date -u +%FT%TZ) $variant (cache $cache, load $(cut -d' ' -f1-3 /proc/loadavg))"
  TORCHINDUCTOR_CACHE_DIR=$cache TRITON_CACHE_DIR=$cache/triton TORCHINDUCTOR_FX_GRAPH_CACHE=1 \
    TORCHINDUCTOR_AUTOGRAD_CACHE=1 MASTER_PORT=$((29700 + i)) \
    timeout $left python3 benchmarks/device/precompile_probe.py $variant --out "$OUT/precompile-probe.jsonl" "$@"
done
echo "job: records in \$OUT/precompile-probe.jsonl"
