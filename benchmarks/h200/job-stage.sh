#!/usr/bin/env bash
# Device jobs 3-6 (carry .teN): stage one more part of TE's core wheel.
JOB=job-stage-$1; source benchmarks/h200/common.sh
stage_te_part "$1"
pack
