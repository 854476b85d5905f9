#!/usr/bin/env bash
# Device job 27 (right after job 26, TE installed): the TE headline options with a bf16 head; bf16-te on the
# 4-layer model with 8 micro-batches.
JOB=job27-extra; source benchmarks/h200/common.sh
sweep_grid job27-te-1gpu-accum8 benchmarks/h200/job27-te-1gpu-accum8.yaml 70
sweep_grid job27-te-bf16-head benchmarks/h200/job27-extra.yaml 110
