#!/usr/bin/env bash
# Device job 8 (no carry; TE still in /tmp/site): TE layers on one H200 per trial (two at a time):
# Llama3-8B dims with 4 layers (the probes' configuration) and llama3-70b-proxy; then the GPU tests.
JOB=job8-te-1gpu; source benchmarks/h200/common.sh
python3 -c 'import transformer_engine.pytorch' || { echo "TE is gone (fresh machine): stage again"; exit 1; }
sweep_grid te-1gpu benchmarks/h200/te-1gpu.yaml 330
echo "== $(date -u +%FT%TZ) GPU tests"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_models.py tests/test_precision.py 2>&1 | tail -40
