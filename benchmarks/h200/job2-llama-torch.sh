#!/usr/bin/env bash
# Device job 2 (carry .te1): stage TE part 1, then Llama3-8B over 2 H200s with torch layers:
# bf16 bsz 2 and torchao float8 tensorwise bsz 3 (per-block compile).
JOB=job2-llama-torch; source benchmarks/h200/common.sh
stage_te_part .te1
sweep_grid llama3-8b-bf16 benchmarks/h200/llama3-8b-bf16.yaml 260
sweep_grid llama3-8b-fp8-torchao benchmarks/h200/llama3-8b-fp8-torchao.yaml 280
