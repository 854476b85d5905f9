"""Predicted OOM before any GPU time: `sweep plan`'s predicted column and mark, `--no-predict` and the grid key,
on_oom after a predicted OOM, and `sweep run` recording such trials unsupported without starting Ray."""

from __future__ import annotations

import subprocess
import sys

import yaml
from conftest import ROOT, invoke

from sweep.record import store
from sweep.search.policy import GridPlan
from sweep.spec.expand import expand
from sweep.spec.grid import OomPolicy, parse_grid

# Llama3-8B on 2 H200s at T 4096: measured 128.6 GiB at batch 4, out of memory at 5 (benchmarks/history)
LLAMA = ("--cluster", "h200", "--model", "llama3-8b", "--gpus", "2", "--seq-len", "4096")


def _plan(*args):
    return invoke("plan", *args, env={"COLUMNS": "250"})


def test_plan_shows_the_predicted_peak_and_marks_what_will_not_fit():
    result = _plan(*LLAMA, "-b", 4, "-b", 8)
    assert result.exit_code == 0, result.output
    assert "129 GiB / 141 GiB" in result.stdout  # batch 4: 128.5 GiB predicted, 128.6 measured
    assert "(1) unsupported: predicted OOM: 208 GiB > 141 GiB per h200" in result.stdout
    assert "predicted max batch: llama3-8b bf16 (compile regional, ac none, seq 4096, 2 ranks): 5" in result.stdout


def test_no_predict_and_the_grid_key_run_it_anyway(tmp_path):
    assert "predicted OOM" not in _plan(*LLAMA, "-b", 8, "--no-predict").stdout
    grid = tmp_path / "g.yaml"
    grid.write_text(
        yaml.safe_dump(
            {"models": ["llama3-8b"], "batch_sizes": [8], "gpus": [2], "seq_len": [4096], "predict_memory": False}
        )
    )
    result = _plan(grid, "--cluster", "h200")
    assert result.exit_code == 0, result.output
    assert "predicted OOM" not in result.stdout and "no (" not in result.stdout


def test_cpu_ranks_are_predicted_under_a_cap_but_never_refused():
    # the state (3.03 MiB) fits 64 MiB; the activations of batch 4096 would not: shown, but it still runs (the cap
    # makes a real allocation fail: tests/test_oom.py), and without a cap nothing is shown
    result = _plan("--cluster", "local", "--model", "gpt-tiny", "-b", 4096, "--memory-cap", "64MiB")
    assert result.exit_code == 0, result.output
    assert "predicted OOM" not in result.stdout and "no (" not in result.stdout
    assert "GiB / 64 MiB" in result.stdout and "predicted max batch: gpt-tiny bf16" in result.stdout
    assert "memory prediction of CPU ranks (shown, not enforced" in result.stdout
    uncapped = _plan("--cluster", "local", "--model", "gpt-tiny", "-b", 4096)
    assert "predicted max batch" not in uncapped.stdout and "memory prediction" not in uncapped.stdout


def test_a_predicted_oom_is_retried_as_its_on_oom_says():
    spec = parse_grid({"models": ["llama3-8b"], "batch_sizes": [16], "on_oom": {"policy": "halve"}}, "<t>")
    (trial,) = expand(spec, cluster="h200")
    plan = GridPlan([trial], OomPolicy(policy="halve"))
    (retry,) = plan.on_result(trial, "unsupported", row={"error": "predicted OOM: 300 GiB > 141 GiB per h200"})
    assert retry.batch_size == 8 and retry.parent_trial_id == trial.trial_id
    assert plan.on_result(trial.child(batch_size=4), "unsupported", row={"error": "fp8 needs sm89"}) == []


def test_run_records_predicted_ooms_unsupported_without_ray(tmp_path, sweep_env):
    """A GPU profile whose Ray address has nothing behind it: had sweep started any trial, it would have failed
    to reach Ray (exit 2, no rows). Batch 16 is predicted not to fit; its `halve` retry jumps to the largest batch
    predicted to fit (5), under the policy's floor (8), so none follows (halving blindly, 8 was recorded too)."""
    profile = tmp_path / "two-h200.yaml"
    profile.write_text(
        yaml.safe_dump(
            {"name": "two-h200", "accelerator": "h200", "ray_address": "127.0.0.1:9", "nodes": 1, "gpus_per_node": 2}
        )
    )
    grid = tmp_path / "g.yaml"
    grid.write_text(
        yaml.safe_dump(
            {
                "models": ["llama3-8b"],
                "batch_sizes": [16],
                "gpus": [2],
                "seq_len": [4096],
                "on_oom": {"policy": "halve", "min_batch": 8},
            }
        )
    )
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "sweep", "run", grid, "--cluster", profile, "--output", out, "--no-progress"],
        cwd=ROOT,
        env=sweep_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3, proc.stderr  # nothing measured
    rows = sorted(store.read_table(out).to_pylist(), key=lambda r: -r["batch_size"])
    assert [(r["batch_size"], r["status"]) for r in rows] == [(16, "unsupported")]
    assert rows[0]["error"].startswith("predicted OOM: 368 GiB > 141 GiB per h200")
