#!/usr/bin/env bash
# Device job 7 (carry .tefinal): install Transformer Engine from the staged parts, then Llama3-8B from TE
# layers over 2 H200s, bsz 2: fp8 delayed, bf16, fp8 current.
JOB=job7-te-llama; source benchmarks/h200/common.sh
bash .tefinal/te-install.sh || exit 1
versions
python3 -c 'import transformer_engine.pytorch as te; print("TE ok", te.__file__)' || exit 1
sweep_grid llama3-8b-te benchmarks/h200/llama3-8b-te.yaml 480
