#!/usr/bin/env bash
# Device job 14 (kind nvidia-h200-x2, carry .whl): GPT-1.5B on one H200 per trial without gradient clipping
# (as seed 002's probe), per-block and whole-model compile, bf16 and torchao float8 tensorwise.
JOB=job14-gpt-noclip; source benchmarks/h200/common.sh
install_wheels || exit 1
versions
sweep_grid gpt1.5b-noclip benchmarks/h200/gpt1.5b-noclip.yaml 400
