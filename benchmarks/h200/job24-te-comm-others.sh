#!/usr/bin/env bash
# Device job 24 (right after job 23, TE installed): the other TE recipes and bsz 3 with the communication
# options, and the 4-layer one-GPU model with 4 micro-batches per step.
JOB=job24-te-comm-others; source benchmarks/h200/common.sh
sweep_grid llama3-8b-te-comm-others benchmarks/h200/llama3-8b-te-comm-others.yaml 200
sweep_grid llama3-8b-te-comm-bsz3 benchmarks/h200/llama3-8b-te-comm-bsz3.yaml 200
sweep_grid te-1gpu-accum benchmarks/h200/te-1gpu-accum.yaml 150
