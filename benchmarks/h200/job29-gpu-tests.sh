#!/usr/bin/env bash
# Device job 29 (carry .tefinal, after job 28's wheels and job-stage.sh .te1 ... .te5): install Transformer Engine
# and run the GPU tests of the precision recipes (TE and torchao, one rank each) on one H200.
JOB=job29-gpu-tests; source benchmarks/h200/common.sh
bash .tefinal/te-install.sh > /dev/null || exit 1
timeout 170 python3 -m pytest -q -m gpu tests/test_precision.py -p no:cacheprovider 2>&1 | tail -15
