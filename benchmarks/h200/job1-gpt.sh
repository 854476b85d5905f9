#!/usr/bin/env bash
# Device job 1 (kind nvidia-h200-x2, carry .whl): install ray/torchao/pydantic, then seed 002's GPT-1.5B
# on one H200 each, bf16 and torchao float8 tensorwise side by side (one per GPU).
JOB=job1-gpt; source benchmarks/h200/common.sh
install_wheels || exit 1
versions
sweep_grid gpt1.5b-torch benchmarks/h200/gpt1.5b-torch.yaml 420
