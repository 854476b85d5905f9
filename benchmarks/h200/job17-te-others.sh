#!/usr/bin/env bash
# Device job 17 (no carry; TE still in /tmp/site): bf16-te and fp8-te-current on Llama3-8B over 2 H200s with
# 8 micro-batches per step; the 4-layer probe configuration on one H200 per trial; then the TE model tests.
JOB=job17-te-others; source benchmarks/h200/common.sh
python3 -c 'import transformer_engine.pytorch' || { echo "TE is gone (fresh machine): stage again"; exit 1; }
sweep_grid llama3-8b-te-others benchmarks/h200/llama3-8b-te-others.yaml 200
sweep_grid te-1gpu-head benchmarks/h200/te-1gpu-head.yaml 150
echo "== $(date -u +%FT%TZ) GPU tests"
timeout 90 python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_models.py 2>&1 | tail -15
