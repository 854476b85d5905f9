"""benchmarks/cold_sweep_check.py on folders of rows whose seconds are known: the GPU-s held check compares the
same trials of the two trees, and fails a run that lacks some (the job's deadline stopped it), naming them; the
TFLOP/s check holds each trial within 1 % of the base's, either way, and shows both medians' intervals."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

from clusters import load_profile
from sweep.record import store
from sweep.record.rows import base_row
from sweep.spec.expand import expand
from sweep.spec.grid import parse_grid


def _write(out, walls: dict[int, float], tflops: float = 500.0) -> None:
    """One ok row per batch size: `walls[batch]` seconds held, 2 of them in measured steps, at `tflops`."""
    grid = {"models": ["llama3-8b"], "gpus": [1], "batch_sizes": sorted(walls)}
    for index, trial in enumerate(expand(parse_grid(grid, "<t>"), cluster="h200")):
        row = base_row(trial, run_id=out.name, profile=load_profile("h200"), grid_name=None)
        wall = walls[trial.batch_size]
        row.update(status="ok", trial_wall_s=wall, steps_time_s=2.0, step_time_s=0.25, warmup_steps=0)
        row.update(tflops_per_gpu=tflops, step_time_ci_pct=0.8, group_trial_index=index)
        store.write_row(out, row)


def _check(tmp_path, base: dict[int, float], current: dict[int, float], tflops: float = 500.0) -> list[str]:
    """The checker's lines over a base and a current warm run (the current at `tflops`, the base at 500)."""
    _write(tmp_path / "base-warm", base)
    _write(tmp_path / "current-warm", current, tflops)
    done = subprocess.run(
        [sys.executable, "benchmarks/cold_sweep_check.py", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr
    return done.stdout.splitlines()


def _held_line(tmp_path, base: dict[int, float], current: dict[int, float]) -> str:
    (line,) = [line for line in _check(tmp_path, base, current) if "GPU-s held" in line]
    return line


def test_gpu_seconds_of_the_same_trials_pass_at_half_the_base(tmp_path):
    line = _held_line(tmp_path, {4: 10.0, 6: 10.0}, {4: 5.0, 6: 4.0})
    assert line.startswith("ok   warm: GPU-s held 9.0 against base 20.0 (0.45x"), line


def test_a_run_that_lacks_a_trial_fails_and_is_compared_on_the_trials_both_ran(tmp_path):
    # the current run's last trial never ran: 4.0 of 20.0 would read 0.20x; over batch 4 alone it is 0.40x
    line = _held_line(tmp_path, {4: 10.0, 6: 10.0}, {4: 4.0})
    assert line.startswith("FAIL warm: GPU-s held 4.0 against base 10.0 (0.40x"), line
    assert line.endswith("on the trials both runs attempted (1 of 2): current lacks bf16 batch 6"), line


def test_a_trial_more_than_1_percent_slower_or_faster_fails_and_shows_both_medians_intervals(tmp_path):
    lines = _check(tmp_path, {4: 10.0}, {4: 4.0}, tflops=494.0)
    (line,) = [line for line in lines if "TFLOP/s against base" in line]
    assert line == (
        "FAIL warm: bf16 batch 4 494.0 TFLOP/s against base 500.0 (-1.20 %; within 1 %; "
        "medians' 95 % intervals ±0.80 % current, ±0.80 % base)"
    ), line
    for tflops, verdict in ((506.0, "FAIL "), (504.0, "ok   ")):  # +1.2 % and +0.8 %: faster counts as a miss too
        lines = _check(tmp_path / str(tflops), {4: 10.0}, {4: 4.0}, tflops=tflops)
        assert [line[:5] for line in lines if "TFLOP/s against base" in line] == [verdict], lines
