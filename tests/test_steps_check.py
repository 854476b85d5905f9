"""benchmarks/steps_check.py on folders of rows whose step times are known: the replay of the default and `auto`
rules, and `--warmup`, which checks the `auto` warm-up alone against each row's own median."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

from clusters import load_profile
from sweep.record import store
from sweep.record.rows import base_row
from sweep.spec.expand import expand
from sweep.spec.grid import parse_grid

# fp8-torchao-tensorwise batch 6 on one H200 (session 18, d-steps.yaml): the compile, then steady steps that alternate
COMPILED = [14.218, 0.519, 0.549, 0.524, 0.547, 0.528, 0.542, 0.531, 0.543, 0.533, 0.543, 0.532, 0.544, 0.538, 0.54]
COMPILED += [0.538, 0.539, 0.538, 0.534, 0.537, 0.535, 0.536, 0.537, 0.538, 0.538, 0.538, 0.537, 0.537, 0.536, 0.537]
COMPILED += [0.536, 0.537, 0.538, 0.537, 0.537, 0.536, 0.539, 0.541, 0.542, 0.539]


def _write(out, steps: list[float], warmup: int, batch: int = 4) -> None:
    grid = {"models": ["llama3-8b"], "gpus": [1], "batch_sizes": [batch]}
    (trial,) = expand(parse_grid(grid, "<t>"), cluster="h200")
    row = base_row(trial, run_id=f"b{batch}", profile=load_profile("h200"), grid_name=None)
    row.update(status="ok", step_times_s=steps, warmup_steps=warmup, measure_steps=len(steps) - warmup)
    store.write_row(out, row)


def _run(*args) -> subprocess.CompletedProcess:
    command = [sys.executable, "benchmarks/steps_check.py", *map(str, args)]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_warmup_check_names_each_row_and_fails_a_warmup_that_keeps_slow_steps(tmp_path):
    good = tmp_path / "good"
    _write(good, COMPILED, warmup=10)
    done = _run("--warmup", good)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warm-up 3 steps (the row's 10)" in done.stdout and "1 rows: worst" in done.stdout
    # slow steps that each stay within 10 % of the one before: the warm-up ends among them, the median is off
    ramp = tmp_path / "ramp"
    _write(ramp, [14.2] + [1.5 - 0.05 * i for i in range(10)] + [1.0] * 6, warmup=11, batch=6)
    bad = _run("--warmup", ramp)
    assert bad.returncode == 1, bad.stdout + bad.stderr


def test_the_replay_without_a_cap_keeps_auto_opt_in_where_it_costs_more(tmp_path):
    out = tmp_path / "rows"
    _write(out, COMPILED, warmup=10)
    done = _run("--cap", "0", out)  # auto as it was before steps.measure_max
    assert done.returncode == 1, done.stdout + done.stderr  # auto's ±1 % needs more steps than 3 + 10 here
    assert "auto stays opt-in" in done.stdout


def test_the_replay_caps_auto_s_measured_steps_as_a_grid_s_auto_does(tmp_path):
    """By default `auto` measures at most steps.measure_max (8) steps, as a trial of `measure: auto` does: it stops
    here where the uncapped rule needs more steps than 3 + 10, inside ±1 % of the row's median; `--cap M` replays
    another cap."""
    out = tmp_path / "rows"
    _write(out, COMPILED, warmup=10)
    for args in ((), ("--cap", "8")):
        done = _run(*args, out)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "| 11 (3) steps," in done.stdout and "auto becomes the default" in done.stdout
    done = _run("--cap", "6", out)
    assert "| 9 (3) steps," in done.stdout, done.stdout


# bf16 batch 2 of a held-out 2.1 B model on one H100 (session 47, d-steps-80gb.yaml): ten noisy steps after the compile
NOISY_START = [2.9066, 0.2298, 0.2747, 0.3112, 0.224, 0.5267, 0.2324, 0.4532, 0.301, 0.2501, 0.2251, 0.2243, 0.2258]
NOISY_START += [0.225, 0.236, 0.225, 0.2248, 0.2251, 0.2264, 0.2282, 0.2252, 0.2261, 0.226, 0.2271, 0.2259, 0.2259]
NOISY_START += [0.2235, 0.2235, 0.2262, 0.2271, 0.2257, 0.2251, 0.2259, 0.2244, 0.2237, 0.2234, 0.2277, 0.2258]
NOISY_START += [0.2247, 0.2257]


def test_auto_may_cost_more_where_the_default_reads_a_wrong_median(tmp_path):
    """3 + 10 measures the noisy steps as if steady (+6.89 %); `auto` warms up longer and lands within 1 %: a cost the
    default saves with a wrong median does not keep auto opt-in."""
    out = tmp_path / "rows"
    _write(out, NOISY_START, warmup=10, batch=2)
    done = _run(out)
    assert "| +6.89 %, 3.48 s | 20 (12) steps, -0.11 %, 5.07 s |" in done.stdout, done.stdout
    assert done.returncode == 0 and "auto becomes the default" in done.stdout


def test_saved_step_times_replay_as_their_folder(tmp_path):
    """`--save` keeps a folder's step times as JSON lines (what benchmarks/history holds); both modes read them back
    to the verdict and the lines the folder gives."""
    folder, saved = tmp_path / "rows", tmp_path / "steps.jsonl"
    _write(folder, COMPILED, warmup=10)
    assert _run("--save", saved, folder).returncode == 0
    for mode in ((), ("--warmup",)):
        from_folder, from_saved = _run(*mode, folder), _run(*mode, saved)
        assert (from_saved.returncode, from_saved.stdout) == (from_folder.returncode, from_folder.stdout), mode
