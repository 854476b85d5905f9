#!/usr/bin/env bash
# Device job (kind nvidia-h200-x2, carry .whl): Llama3-8B bf16 and torchao fp8 over 2 ranks, first on one
# Ray node holding both GPUs (embedded Ray), then on two Ray nodes of one GPU each started here, joined
# with `ray_address: auto`. Rows of both land in $RES/multinode (cluster=h200x2 / cluster=h200-2nodes);
# `sweep results compare $RES/multinode --by cluster --baseline h200x2` puts them side by side.
JOB=multinode; source benchmarks/h200/common.sh
install_wheels
versions
PROFILE=benchmarks/h200/profile-h200x2.yaml sweep_grid multinode benchmarks/h200/multinode.yaml 300

export RAY_AUTH_MODE=disabled
CUDA_VISIBLE_DEVICES=0 /tmp/site/bin/ray start --head --port 6380 --num-gpus 1 --num-cpus 8 --include-dashboard=false
CUDA_VISIBLE_DEVICES=1 /tmp/site/bin/ray start --address 127.0.0.1:6380 --num-gpus 1 --num-cpus 8
/tmp/site/bin/ray status
PROFILE=benchmarks/h200/profile-h200-2nodes.yaml sweep_grid multinode benchmarks/h200/multinode.yaml 300
/tmp/site/bin/ray stop --force
