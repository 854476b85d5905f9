#!/usr/bin/env bash
# Device job 23 (carry .tefinal, after job 22 (.whl) and job-stage.sh .te1 ... .te5): install Transformer Engine,
# then Llama3-8B fp8-te-delayed bsz 2, 8 micro-batches, FP8 head, over reduce_dtype x grad_sync.
JOB=job23-te-comm; source benchmarks/h200/common.sh
bash .tefinal/te-install.sh || exit 1
versions
python3 -c 'import transformer_engine.pytorch as te; print("TE ok", te.__file__)' || exit 1
sweep_grid llama3-8b-te-comm benchmarks/h200/llama3-8b-te-comm.yaml 420
