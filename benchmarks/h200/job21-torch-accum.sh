#!/usr/bin/env bash
# Device job 21 (kind nvidia-h200-x2, carry .whl): torch bf16 and torchao fp8 on Llama3-8B with 8 micro-batches
# per step. Rows go straight to $OUT so that whatever finishes comes back even if the device time runs out.
JOB=job21-torch-accum; RES=$OUT/sweep-results; source benchmarks/h200/common.sh
install_wheels || exit 1
sweep_grid llama3-8b-torch-accum benchmarks/h200/llama3-8b-torch-accum.yaml 170
