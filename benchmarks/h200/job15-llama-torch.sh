#!/usr/bin/env bash
# Device job 15 (carry .te1; ray/torchao from job 14 in /tmp/site): stage TE part 1, then Llama3-8B over
# 2 H200s with torch layers again (the loss is now compiled with the model): bf16 bsz 2, fp8 tensorwise bsz 3.
JOB=job15-llama-torch; source benchmarks/h200/common.sh
python3 -c 'import ray, torchao' || { echo "wheels are gone (fresh machine): run job 14 first"; exit 1; }
stage_te_part .te1
sweep_grid llama3-8b-bf16 benchmarks/h200/llama3-8b-bf16.yaml 150
sweep_grid llama3-8b-fp8-torchao benchmarks/h200/llama3-8b-fp8-torchao.yaml 150
