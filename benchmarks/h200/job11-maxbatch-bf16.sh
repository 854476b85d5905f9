#!/usr/bin/env bash
# Device job 11 (kind nvidia-h200-x2, carry .whl): issues 3/4/5 after the one-rank and lr fixes.
#  1. GPT-1.5B one-GPU trials, bf16 and torchao fp8 side by side (two at a time, one per GPU);
#  2. sweep max-batch for Llama3-8B bf16 over both GPUs (2-rank trials), then the same under an 80 GiB cap.
JOB=job11-maxbatch-bf16; source benchmarks/h200/common.sh
install_wheels || exit 1
versions
sweep_grid gpt1.5b-concurrent benchmarks/h200/gpt1.5b-torch.yaml 200
LLAMA="--model llama3-8b --gpus 2 --seq-len 4096 --compile regional --warmup 2 --measure 4"
max_batch maxbatch-bf16 200 $LLAMA --precision bf16 --start 2
max_batch maxbatch-bf16-80g 110 $LLAMA --precision bf16 --start 1 --memory-cap 80GiB
