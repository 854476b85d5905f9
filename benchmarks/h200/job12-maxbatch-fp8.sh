#!/usr/bin/env bash
# Device job 12 (kind nvidia-h200-x2, run right after job 11 on the warm machine): sweep max-batch for
# Llama3-8B with torchao float8 tensorwise over both GPUs, then under an 80 GiB cap.
JOB=job12-maxbatch-fp8; source benchmarks/h200/common.sh
[ -d /tmp/site/ray ] || { install_wheels || exit 1; }
LLAMA="--model llama3-8b --gpus 2 --seq-len 4096 --compile regional --warmup 2 --measure 4"
max_batch maxbatch-fp8 330 $LLAMA --precision fp8-torchao-tensorwise --start 3
max_batch maxbatch-fp8-80g 170 $LLAMA --precision fp8-torchao-tensorwise --start 1 --memory-cap 80GiB
