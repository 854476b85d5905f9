#!/usr/bin/env bash
# Device job 22 (kind nvidia-h200-x2, carry .whl): install ray/torchao/pydantic, then torch layers (bf16,
# torchao FP8) on Llama3-8B over 2 H200s with a bf16 reduce-scatter once per step.
JOB=job22-torch-comm; source benchmarks/h200/common.sh
install_wheels || exit 1
versions
sweep_grid llama3-8b-torch-comm benchmarks/h200/llama3-8b-torch-comm.yaml 360
