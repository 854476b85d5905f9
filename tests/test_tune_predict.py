"""`search: fastest` with the memory model (sweep.memory.predictor): each level's fit starts at the predicted limit, no
candidate runs past the batch predicted to fit, a probe recorded as a predicted OOM teaches the search as an OOM
does, and on GPU ranks torchao FP8 is never probed with `compile: none` unless the grid lists it. Pure logic on
the simulated machine of tests/test_tune.py, and one run through the CLI that never reaches Ray."""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace

import yaml
from conftest import ROOT, verdicts_json
from test_predict_use import dead_h200_profile
from test_tune import GIB, Machine, grid, run

from sweep.search.fastest.plan import TunePlan


def _exact(machine: Machine):
    """The largest batch of a trial's config that fits `machine` (a memory model that is right): its peak is a
    line in the batch."""

    def predicted_max(t) -> int:
        at0, at1 = (machine.peak(replace(t, batch_size=b)) for b in (0, 1))
        return math.floor((machine.capacity_gib - at0) / (at1 - at0))

    return predicted_max


def _plan(
    machine: Machine, predicted_max=None, is_gpu: bool = False, vary=("batch_size",), budget: int = 20, **extra
) -> TunePlan:
    spec, trials = grid(tune={"vary": list(vary), "budget": budget}, **extra)
    return TunePlan(trials, spec, capacity_bytes=machine.capacity_gib * GIB, is_gpu=is_gpu, predicted_max=predicted_max)


def test_the_fit_starts_at_the_predicted_limit_and_checks_its_neighbour():
    machine = Machine()  # 4 GiB + 1 GiB a sample at ac none: batch 36 is the limit
    asked = run(_plan(machine, _exact(machine), vary=["batch_size"]), machine).asked
    assert [t.batch_size for t in asked[:2]] == [36, 37]
    blind = run(_plan(machine, vary=["batch_size"]), machine).asked
    assert blind[0].batch_size == 2  # without a prediction: from the grid's batch, growing


def test_no_candidate_runs_past_the_batch_predicted_to_fit():
    """compile: none adds 2 GiB a sample here, a memory no probe has measured when its first candidate is placed:
    placed by the measured peaks alone, it runs out of memory; placed under the prediction, it never does."""
    machine = Machine(compile_gib={"none": 2.0})
    extra = {"vary": ["batch_size", "compile"], "precisions": ["bf16"]}
    blind = run(_plan(machine, **extra), machine)
    assert any(r["status"] == "oom" and t.compile == "none" for t, (r, _) in zip(blind.asked, blind.rows, strict=True))
    guided = run(_plan(machine, _exact(machine), **extra), machine)
    none = [t for t in guided.asked if t.compile == "none"]
    assert none and all(machine.peak(t) <= machine.capacity_gib for t in none)
    assert not [r for r, _ in guided.rows if r["status"] == "oom" and r["trial_id"] in {t.trial_id for t in none}]


def test_a_predicted_oom_is_an_oom_to_the_fit_not_the_end_of_the_search():
    """The runner records a trial predicted not to fit as `unsupported` (`predicted OOM: ...`) without GPU time:
    the fit must go on below it, as after a real OOM, instead of stopping as after an unsupported recipe."""
    machine = Machine()

    def runner(t):
        if t.batch_size > 36:
            return {
                "trial_id": t.trial_id,
                "status": "unsupported",
                "trial_wall_s": 0.0,
                "error": "predicted OOM: 45 GiB > 40 GiB per rank",
            }, False
        return machine(t)

    plan = _plan(machine, lambda t: 40, vary=["batch_size"])
    out = run(plan, runner)
    statuses = [(t.batch_size, r["status"]) for t, (r, _) in zip(out.asked, out.rows, strict=True)]
    assert statuses[0] == (40, "unsupported") and any(s == "ok" for _, s in statuses)
    (verdict,) = verdicts_json(plan)
    assert verdict["best"] is not None and verdict["best"]["batch_size"] <= 36


def test_torchao_is_not_probed_eager_on_gpus_unless_the_grid_lists_it():
    machine = Machine()
    extra = {"vary": ["compile"], "precisions": ["fp8-torchao-tensorwise"]}
    on_gpu = run(_plan(machine, is_gpu=True, **extra), machine).asked
    assert {t.compile for t in on_gpu} == {"regional", "full"}
    on_cpu = run(_plan(machine, is_gpu=False, **extra), machine).asked  # emulated FP8: nothing to mislead about
    assert "none" in {t.compile for t in on_cpu}
    listed = run(_plan(machine, is_gpu=True, **{**extra, "compile": ["regional", "none"]}), machine).asked
    assert "none" in {t.compile for t in listed}
    bf16 = run(_plan(machine, is_gpu=True, vary=["compile"], precisions=["bf16"]), machine).asked
    assert "none" in {t.compile for t in bf16}


def test_a_tune_whose_every_probe_is_predicted_not_to_fit_runs_nothing(tmp_path, sweep_env):
    """Llama3-8B bf16 on one H200 at T 4096 with the 1.2 × the rows in --output teach: its training state alone
    (16 B a parameter, 128 GB) and bf16 weight copies are past the memory, so not even batch 1 fits. The tune
    through `sweep run` records its probes without GPU time (the profile's Ray address has nothing behind it, so
    a trial started would exit 2), each an OOM to its level's fit, and ends with nothing measured (exit 3)."""
    profile, out = dead_h200_profile(tmp_path, gpus=1)
    g = tmp_path / "g.yaml"
    g.write_text(
        yaml.safe_dump(
            {
                "models": ["llama3-8b"],
                "seq_len": [4096],
                "batch_sizes": [4],
                "gpus": [1],
                "search": "fastest",
                "tune": {"vary": ["batch_size", "ac"], "budget": 12},
            }
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "sweep", "run", g, "--cluster", profile, "--output", out, "--no-progress"],
        cwd=ROOT,
        env={**sweep_env(), "COLUMNS": "250"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    from sweep.record import store

    rows = [r for r in store.read_table(out).to_pylist() if r["run_id"] != "r0"]
    assert rows and all(r["status"] == "unsupported" and r["error"].startswith("predicted OOM:") for r in rows)
    assert {r["ac"] for r in rows} == {"none", "selective", "full"}  # each level fitted on: none stopped the search


def test_a_predicted_limit_that_thrashes_is_followed_by_the_batch_below_not_batch_1():
    """The prediction fits only with allocator retries (memory's edge): the fit's next probe is one batch lower, the
    largest clean one, not batch 1 as after a real OOM (one H200, bf16: 15 thrashed, the fit went to 1 and 3)."""
    machine = Machine(thrash_gib=34.0)  # 4 GiB + 1 a sample: 31 and up fit only with retries
    asked = run(_plan(machine, lambda t: 31, vary=["batch_size"], budget=6), machine).asked
    assert [t.batch_size for t in asked[:2]] == [31, 30]
