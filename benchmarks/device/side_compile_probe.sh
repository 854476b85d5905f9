#!/usr/bin/env bash
# One side process's compile taken apart (benchmarks/device/side_compile_probe.py), on the lent one-GPU machine,
# from the project root, carrying .whl:
#
#   bash benchmarks/device/side_compile_probe.sh
#
# On one empty compile cache: a rowwise set cut as a side process cuts it, the same again in a fresh process, the whole
# rowwise trial after it (does it benchmark its kernels again?), bf16's and tensorwise's sets; then, on a second empty
# cache, rowwise batch 6's set under cProfile. Records in $OUT/side-compile-probe.jsonl.
set -uo pipefail
source benchmarks/device/lib.sh
JOB_NEEDS_RESULTS=0 job_begin side-compile-probe 0  # no rows: no results wheels needed
probe() {  # probe CACHE ARGS...
  local cache=$1
  shift
  echo "== $(date -u +%FT%TZ) $* (cache $cache, load $(cut -d' ' -f1-3 /proc/loadavg))"
  TORCHINDUCTOR_CACHE_DIR=$cache TRITON_CACHE_DIR=$cache/triton TORCHINDUCTOR_FX_GRAPH_CACHE=1 \
    TORCHINDUCTOR_AUTOGRAD_CACHE=1 TORCHINDUCTOR_COMPILE_THREADS=$(nproc) \
    timeout $((deadline - SECONDS)) python3 benchmarks/device/side_compile_probe.py --out "$OUT/side-compile-probe.jsonl" "$@"
}
rm -rf /tmp/cc-side-1 /tmp/cc-side-2
probe /tmp/cc-side-1 fp8-torchao-rowwise:4 fp8-torchao-rowwise:4 fp8-torchao-rowwise:4:full bf16:4 fp8-torchao-tensorwise:4
probe /tmp/cc-side-2 --profile fp8-torchao-rowwise:6
echo "job: records in \$OUT/side-compile-probe.jsonl"
