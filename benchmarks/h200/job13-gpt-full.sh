#!/usr/bin/env bash
# Device job 13 (kind nvidia-h200-x2, carry .whl): GPT-1.5B with whole-model compile, as seed 002's probe,
# bf16 and torchao fp8 side by side (one per GPU).
JOB=job13-gpt-full; source benchmarks/h200/common.sh
install_wheels || exit 1
sweep_grid gpt1.5b-full benchmarks/h200/gpt1.5b-full.yaml 170
