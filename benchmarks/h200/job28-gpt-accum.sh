#!/usr/bin/env bash
# Device job 28 (kind nvidia-h200-x2, carry .whl): GPT-1.5B on one H200 per trial, bsz 12, no clipping, one and
# two micro-batches per optimizer step, bf16 and torchao float8 tensorwise (two trials at a time, one per GPU).
JOB=job28-gpt-accum; source benchmarks/h200/common.sh
install_wheels || exit 1
versions
sweep_grid gpt1.5b-accum benchmarks/h200/gpt1.5b-accum.yaml 300
