"""The memory model used: calibrated on --output's clean rows of the cluster (`sweep plan`, `sweep run`), OOM
retries that jump to the largest batch predicted to fit, and a max-batch search that starts at the predicted
limit. Pure logic and CLI, no Ray (every trial `sweep run` meets here is predicted not to fit)."""

from __future__ import annotations

import subprocess
import sys

import yaml
from typer.testing import CliRunner

from clusters import load_profile
from sweep import store
from sweep.capacity import predict
from sweep.cli import app
from sweep.grid import expand, parse_grid
from sweep.rows import base_row

from conftest import ROOT

GiB = 2**30
LLAMA = {"models": ["llama3-8b"], "gpus": [2], "seq_len": [4096]}


def _trial(batch: int, precision: str = "bf16", cluster: str = "h200"):
    (trial,) = expand(parse_grid({**LLAMA, "batch_sizes": [batch], "precisions": [precision]}, "<t>"), cluster=cluster)
    return trial


def _write(out, trial, *, ratio: float, status: str = "ok", alloc_retries: int = 0, cluster: str = "h200"):
    """A measured row as `sweep run` writes it, its peak `ratio` × the model's uncalibrated prediction."""
    row = base_row(trial, run_id="r0", profile=load_profile(cluster), grid_name=None)
    row.update(status=status, peak_mem_gib=ratio * predict(trial).raw / GiB, alloc_retries=alloc_retries)
    store.write_row(out, row)


def _plan(*args):
    return CliRunner().invoke(app, ["plan", *map(str, args)], env={"COLUMNS": "250"})


PLAN = ("--cluster", "h200", "--model", "llama3-8b", "--gpus", "2", "--seq-len", "4096", "-b", "4")


def test_plan_on_an_empty_folder_says_it_is_uncalibrated(tmp_path):
    result = _plan(*PLAN, "--output", tmp_path / "none")
    assert result.exit_code == 0, result.output
    assert f"memory prediction uncalibrated: no clean rows of h200 in {tmp_path / 'none'}" in result.stdout
    assert "129 GiB / 141 GiB" in result.stdout and "predicted OOM" not in result.stdout
    assert "seq 4096, 2 ranks): 5, uncalibrated" in result.stdout


def test_plan_is_calibrated_on_the_clusters_clean_rows(tmp_path):
    """Two clean rows measured 1.2 × the model: batch 4 (129 GiB raw) is then 154 GiB, past the H200's 141.
    A row with allocator retries, an OOM row, and a row of another cluster teach nothing."""
    out = tmp_path / "results"
    _write(out, _trial(2), ratio=1.2)
    _write(out, _trial(3), ratio=1.2)
    _write(out, _trial(1), ratio=3.0, alloc_retries=4)
    _write(out, _trial(5), ratio=3.0, status="oom")
    _write(out, _trial(1, cluster="local"), ratio=3.0, cluster="local")
    _write(out, _trial(1, precision="fp8-torchao-tensorwise"), ratio=0.5)
    result = _plan(*PLAN, "--output", out)
    assert result.exit_code == 0, result.output
    assert (f"memory prediction calibrated on 3 rows of h200 in {out} (bf16 regional: 2, "
            "fp8-torchao-tensorwise regional: 1)") in result.stdout
    assert "154 GiB / 141 GiB" in result.stdout
    assert "predicted OOM: 154 GiB > 141 GiB per h200 (sweep.memory_model, × 1.200, the median measured/predicted " \
           "of 2 clean rows" in result.stdout
    assert "seq 4096, 2 ranks): 3, calibrated on 2 rows" in result.stdout
