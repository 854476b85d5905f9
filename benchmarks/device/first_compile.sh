#!/usr/bin/env bash
# benchmarks/device/first_compile_probe.py on the lent GPU machine, from the project root (carry .whl):
#   bash benchmarks/device/first_compile.sh
# fills one inductor cache with each precision's graphs, then runs every warm-up variant in its own process, in
# rotation, REPS times (default 3); one JSON line each in $OUT/first-compile.jsonl.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c 'import torch, torchao; print("torch", torch.__version__, "torchao", torchao.__version__)'
cache=/tmp/first-compile-cc
rm -rf $cache
for p in bf16 tensorwise; do python3 benchmarks/device/first_compile_probe.py none $p $cache | sed 's/^/prime /'; done
for rep in $(seq ${REPS:-3}); do
  for p in bf16 tensorwise; do
    for v in none cpu-aot cpu-inductor cuda-inductor; do
      python3 benchmarks/device/first_compile_probe.py $v $p $cache | tee -a "$OUT/first-compile.jsonl"
    done
  done
done
