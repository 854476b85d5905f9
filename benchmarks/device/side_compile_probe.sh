#!/usr/bin/env bash
# One side process's compile taken apart (benchmarks/device/side_compile_probe.py), on the lent one-GPU machine,
# from the project root, carrying .whl:
#
#   bash benchmarks/device/side_compile_probe.sh [group]
#
# Each on its own empty compile cache: a rowwise set cut as a side process cuts it, the same again in a fresh process,
# the whole rowwise trial after it (does it benchmark its kernels again?); the grid's four sets at once, as a rank's
# four side processes compile them; the same with bf16's and tensorwise's at niceness 10; rowwise batch 6's set alone
# under cProfile (`group`: the four sets at once alone, after another job on the same machine). Records in
# $OUT/side-compile-probe.jsonl.
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
rw=fp8-torchao-rowwise tw=fp8-torchao-tensorwise
rm -rf /tmp/cc-side-*
if [ "${1:-all}" = group ]; then
  probe /tmp/cc-side-2 bf16:4+$tw:4+$rw:4+$rw:6
else
  probe /tmp/cc-side-1 $rw:4 $rw:4 $rw:4:full
  probe /tmp/cc-side-2 bf16:4+$tw:4+$rw:4+$rw:6
  probe /tmp/cc-side-3 bf16:4:nice+$tw:4:nice+$rw:4+$rw:6
  probe /tmp/cc-side-4 --profile $rw:6
fi
echo "job: records in \$OUT/side-compile-probe.jsonl"
