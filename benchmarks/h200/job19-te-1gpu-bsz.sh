#!/usr/bin/env bash
# Device job 19 (no carry; TE still in /tmp/site): the 4-layer TE configuration at micro-batch 4 and 8.
JOB=job19-te-1gpu-bsz; source benchmarks/h200/common.sh
python3 -c 'import transformer_engine.pytorch' || { echo "TE is gone (fresh machine): stage again"; exit 1; }
sweep_grid te-1gpu-bsz benchmarks/h200/te-1gpu-bsz.yaml 200
