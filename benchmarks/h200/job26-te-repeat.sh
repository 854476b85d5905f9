#!/usr/bin/env bash
# Device job 26 (carry .tefinal, after job 25 and job-stage.sh .te1 ... .te5): install Transformer Engine and
# repeat the headline TE row (job 23: 871.9).
JOB=job26-te-repeat; source benchmarks/h200/common.sh
bash .tefinal/te-install.sh || exit 1
sweep_grid job26-te-repeat benchmarks/h200/job25-te-repeat.yaml 120
