#!/usr/bin/env bash
# A fresh rank's start-up by phase, and the CUDA context made beside its imports (benchmarks/device/startup_probe.py),
# on the lent one-H200 machine (kind nvidia-h200), from the project root, carrying .whl:
#
#   [SAMPLES=3] bash benchmarks/device/startup_probe.sh
#
# Records in $OUT/startup-probe.jsonl.
set -uo pipefail
source benchmarks/device/lib.sh
JOB_NEEDS_RESULTS=0 job_begin startup-probe 0  # no rows: no results wheels needed
nproc
timeout $((deadline - SECONDS)) python3 benchmarks/device/startup_probe.py --samples "${SAMPLES:-3}" \
  --out "$OUT/startup-probe.jsonl"
