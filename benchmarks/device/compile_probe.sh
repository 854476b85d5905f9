#!/usr/bin/env bash
# Where a cold compile's seconds go, and what an inductor knob saves of them (issue 28), on the lent one-H200
# machine (kind nvidia-h200), from the project root, carrying .whl:
#
#   [PROBE_ARGS=--profile] bash benchmarks/device/compile_probe.sh [VARIANT ...]
#
# Each VARIANT (kernels_probe.py's PRECISION[:KNOB,...]) runs in its own process on its own empty compile cache
# (inductor's and Triton's), so each pays a cold compile as a first sweep of a new model does; the held-out model of
# benchmarks/campaigns/cold-sweep at batch 4, T 4096, `compile: regional`, 3 warm-up + 10 measured steps. Records
# (compile_time_s, step time, compile_phases, release) in $OUT/compile-probe.jsonl.
set -uo pipefail
source benchmarks/device/lib.sh
JOB_NEEDS_RESULTS=0 job_begin compile-probe 0  # no rows: no results wheels needed
[ $# -gt 0 ] || set -- bf16 bf16:ind.triton.autotune_pointwise=False fp8-torchao-rowwise \
  fp8-torchao-rowwise:ind.triton.autotune_pointwise=False
i=0
for variant in "$@"; do
  i=$((i + 1))
  left=$((deadline - SECONDS))
  [ $left -gt 40 ] || { echo "job: no time left for $variant"; break; }
  cache=/tmp/cc-probe-$i
  rm -rf "$cache"
  echo "== $(date -u +%FT%TZ) $variant (cache $cache, load $(cut -d' ' -f1-3 /proc/loadavg))"
  TORCHINDUCTOR_CACHE_DIR=$cache TRITON_CACHE_DIR=$cache/triton MASTER_PORT=$((29600 + i)) \
    timeout $left python3 benchmarks/device/kernels_probe.py --model held-out --batch 4 --warmup 3 --measure 10 \
    --out "$OUT/compile-probe.jsonl" ${PROBE_ARGS:-} "$variant"
done
echo "job: records in \$OUT/compile-probe.jsonl"
