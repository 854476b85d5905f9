#!/usr/bin/env bash
# Device job 20 (kind nvidia-h200-x2, carry .whl): GPT-1.5B with sweep's default clip 1.0 and the compiled
# loss, per-block compile, bf16 and fp8 tensorwise side by side: separates clipping's cost from the loss compile.
JOB=job20-gpt-clip; source benchmarks/h200/common.sh
install_wheels || exit 1
sweep_grid gpt1.5b-torch benchmarks/h200/gpt1.5b-torch.yaml 150
