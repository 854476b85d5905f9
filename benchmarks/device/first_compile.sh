#!/usr/bin/env bash
# benchmarks/device/first_compile_probe.py on the lent GPU machine, from the project root (carry .whl):
#   [PRECISIONS="bf16 tensorwise"] [REPS=N] [PROFILE=1] bash benchmarks/device/first_compile.sh [VARIANT ...]
# fills an inductor cache with each precision's graphs (PRECISIONS: bf16 by default), then runs each warm-up VARIANT
# (default: none cuda-inductor) in its own process, in rotation, REPS times (default 2); one JSON line each in
# $OUT/first-compile.jsonl. PROFILE=1 runs the first round under cProfile ($OUT/profile-VARIANT-PRECISION.txt; its
# step times then carry the profiler's overhead). cpu-inductor took 47-61 s a warm-up on an H100 host (session 45).
set -uo pipefail
OUT=${OUT:-/tmp/out}
export OUT
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, torchao; print("torch", torch.__version__, "torchao", torchao.__version__)'
cache=/tmp/first-compile-cc
variants=${*:-none cuda-inductor}
rm -rf $cache
for p in ${PRECISIONS:-bf16}; do python3 benchmarks/device/first_compile_probe.py none $p $cache | sed 's/^/prime /'; done
for rep in $(seq ${REPS:-2}); do
  for p in ${PRECISIONS:-bf16}; do
    for v in $variants; do
      PROBE_PROFILE=$([ "$rep" = 1 ] && [ "${PROFILE:-0}" = 1 ] && echo 1) \
        python3 benchmarks/device/first_compile_probe.py $v $p $cache | tee -a "$OUT/first-compile.jsonl"
    done
  done
done
