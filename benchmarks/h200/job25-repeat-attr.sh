#!/usr/bin/env bash
# Device job 25 (fresh machine, carry .whl): install ray/torchao/pydantic; torch bf16 with each gradient option
# alone; the probe configurations (no accumulation) with a bf16 reduce-scatter.
JOB=job25-repeat-attr; source benchmarks/h200/common.sh
install_wheels || exit 1
versions
sweep_grid job25-torch-attr benchmarks/h200/job25-torch-attr.yaml 110
sweep_grid job25-torch-step benchmarks/h200/job25-torch-step.yaml 110
sweep_grid job25-no-accum benchmarks/h200/job25-no-accum.yaml 90
sweep_grid job25-no-accum-fp8 benchmarks/h200/job25-no-accum-fp8.yaml 90
