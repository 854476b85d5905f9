#!/usr/bin/env bash
# Device job 16 (carry .tefinal, after job-stage.sh .te2 ... .te5): install Transformer Engine, then Llama3-8B
# from TE layers over 2 H200s, fp8 delayed, with 8 micro-batches per optimizer step as seed 000 (and 1),
# FP8 head on and off; then seed 000's own 4-KV-head model.
JOB=job16-te-llama; source benchmarks/h200/common.sh
bash .tefinal/te-install.sh || exit 1
versions
python3 -c 'import transformer_engine.pytorch as te; print("TE ok", te.__file__)' || exit 1
sweep_grid llama3-8b-te-accum benchmarks/h200/llama3-8b-te-accum.yaml 260
sweep_grid llama3-8b-te-seed000 benchmarks/h200/llama3-8b-te-seed000.yaml 100
