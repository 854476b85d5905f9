#!/usr/bin/env bash
# Device job 18 (no carry; TE still in /tmp/site): TE fp8 on Llama3-8B at micro-batch 3 and 4.
JOB=job18-te-bsz; source benchmarks/h200/common.sh
python3 -c 'import transformer_engine.pytorch' || { echo "TE is gone (fresh machine): stage again"; exit 1; }
sweep_grid llama3-8b-te-bsz benchmarks/h200/llama3-8b-te-bsz.yaml 330
