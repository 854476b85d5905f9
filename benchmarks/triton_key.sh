#!/usr/bin/env bash
# What Triton's cache key (triton.runtime.cache.triton_key: a hash of Triton's files, libtriton.so among them) costs
# a fresh process, on this machine's CPU: every compile's cache lookup asks for it once a process, and a preloaded
# rank process computes it ahead (trainer.preload.settle_imports). From the project root, with the venv:
#   bash benchmarks/triton_key.sh [TRITON_VERSION]      (default 3.6.0; downloads its wheel, ~190 MB)
# prints the import's and the key's seconds in three fresh processes (benchmarks/RESULTS.md "Cold sweep", session 45).
set -euo pipefail
version=${1:-3.6.0}
py=${PYTHON:-.venv/bin/python}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$py" -m pip download -q "triton==$version" --no-deps -d "$dir/wheel"
"$py" -m zipfile -e "$dir"/wheel/triton-*.whl "$dir/site"
du -m "$dir/site/triton/_C/libtriton.so" | awk '{print "libtriton.so: " $1 " MiB"}'
for _ in 1 2 3; do
  PYTHONPATH=$dir/site "$py" -c '
import time
began = time.perf_counter()
from triton.runtime.cache import triton_key
imported = time.perf_counter()
triton_key()
print(f"import {imported - began:.2f} s, triton_key {time.perf_counter() - imported:.3f} s")'
done
