"""The memory model used: calibrated on --output's clean rows of the cluster (`sweep plan`, `sweep run`), OOM
retries that jump to the largest batch predicted to fit, and a max-batch search that starts at the predicted
limit. Pure logic and CLI, no Ray (every trial `sweep run` meets here is predicted not to fit)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from conftest import ROOT, invoke

from clusters import load_profile
from sweep.memory.predictor import NO_ROWS
from sweep.record import store
from sweep.record.rows import base_row
from sweep.search.policy import GridPlan, next_batch_after_oom
from sweep.spec.expand import expand
from sweep.spec.grid import OomPolicy, parse_grid

GiB = 2**30
LLAMA = {"models": ["llama3-8b"], "gpus": [2], "seq_len": [4096]}


def _trial(batch: int, precision: str = "bf16", cluster: str = "h200"):
    spec = parse_grid({**LLAMA, "batch_sizes": [batch], "precisions": [precision]}, "<t>").on(gpu=True)  # as a run
    (trial,) = expand(spec, cluster=cluster)
    return trial


def _write(
    out, trial, *, ratio: float, status: str = "ok", alloc_retries: int = 0, cluster: str = "h200", run_id: str = "r0"
):
    """A measured row as `sweep run` writes it, its peak `ratio` × the model's uncalibrated prediction."""
    row = base_row(trial, run_id=run_id, profile=load_profile(cluster), grid_name=None)
    row.update(status=status, peak_mem_gib=ratio * NO_ROWS.predict_trial(trial).raw / GiB, alloc_retries=alloc_retries)
    store.write_row(out, row)


def dead_h200_profile(tmp_path, gpus: int = 2, ratio: float = 1.2):
    """A GPU profile whose Ray address has nothing behind it (a trial started would exit 2), and an --output
    whose one clean row teaches `ratio` × the model: (profile path, output path)."""
    profile = tmp_path / f"h200-x{gpus}.yaml"
    profile.write_text(
        yaml.safe_dump(
            {
                "name": f"h200-x{gpus}",
                "accelerator": "h200",
                "ray_address": "127.0.0.1:9",
                "nodes": 1,
                "gpus_per_node": gpus,
            }
        )
    )
    out = tmp_path / "results"
    _write(out, _trial(2, cluster=f"h200-x{gpus}"), ratio=ratio, cluster=str(profile))
    return profile, out


def _plan(*args):
    return invoke("plan", *args, env={"COLUMNS": "250"})


PLAN = ("--cluster", "h200", "--model", "llama3-8b", "--gpus", "2", "--seq-len", "4096", "-b", "4")


def test_plan_on_an_empty_folder_says_it_is_uncalibrated(tmp_path):
    result = _plan(*PLAN, "--output", tmp_path / "none")
    assert result.exit_code == 0, result.output
    assert f"memory prediction uncalibrated: no clean rows of h200 in {tmp_path / 'none'}" in result.stdout
    assert "129 GiB / 141 GiB" in result.stdout and "predicted OOM" not in result.stdout
    assert "seq 4096, 2 ranks): 5, uncalibrated" in result.stdout


def test_plan_is_calibrated_on_the_clusters_clean_rows(tmp_path):
    """Two clean rows of batch 2 measured 1.2 × the model (one batch size: the ratio; tests/test_predict_affine.py
    has two): batch 4 (129 GiB raw) is then 154 GiB, past the H200's 141. A row with allocator retries, an OOM row,
    and a row of another cluster teach nothing."""
    out = tmp_path / "results"
    _write(out, _trial(2), ratio=1.2)
    _write(out, _trial(2), ratio=1.2, run_id="r1")
    _write(out, _trial(1), ratio=3.0, alloc_retries=4)
    _write(out, _trial(5), ratio=3.0, status="oom")
    _write(out, _trial(1, cluster="local"), ratio=3.0, cluster="local")
    _write(out, _trial(1, precision="fp8-torchao-tensorwise"), ratio=0.5)
    result = _plan(*PLAN, "--output", out)
    assert result.exit_code == 0, result.output
    assert (
        f"memory prediction calibrated on 3 rows of h200 in {out} (bf16 regional: 2, "
        "fp8-torchao-tensorwise regional: 1)"
    ) in result.stdout
    assert "154 GiB / 141 GiB" in result.stdout
    assert (
        "predicted OOM: 154 GiB > 141 GiB per h200 (sweep.memory.model, × 1.200, the median measured/predicted "
        "of 2 clean rows" in result.stdout
    )
    assert "seq 4096, 2 ranks): 3, calibrated on 2 rows" in result.stdout


@pytest.mark.parametrize(
    "policy, failed, ok, predicted, expected",
    [
        ("halve", 16, set(), 4, 4),  # 16 -> 4 at once, not 16 -> 8 -> 4
        ("halve", 16, set(), 12, 12),  # not 8, where 12 fits
        ("bisect", 16, {4}, 11, 11),
        ("bisect", 16, {4}, 3, 10),  # under what is known to fit: wrong, bisect as before
        ("halve", 16, set(), 16, 8),  # said 16 fits and it did not: halve as before
        ("halve", 16, set(), 0, 8),  # nothing predicted to fit: as before, down to the floor
        ("halve", 16, set(), None, 8),  # nothing predicted (CPU ranks, no memory known)
        ("next", 16, set(), 4, 15),  # `next` walks one batch at a time whatever is predicted
        ("none", 16, set(), 4, None),
    ],
)
def test_an_oom_retry_jumps_to_the_largest_batch_predicted_to_fit(policy, failed, ok, predicted, expected):
    assert (
        next_batch_after_oom(OomPolicy(policy=policy), failed, ok=ok, tried={failed}, predicted=predicted) == expected
    )


def test_the_jump_keeps_the_policys_floor_and_the_grids_own_batches():
    assert next_batch_after_oom(OomPolicy(policy="halve", min_batch=6), 16, ok=set(), tried={16}, predicted=4) is None
    # batch 4 is a trial of the grid itself: not run twice
    assert next_batch_after_oom(OomPolicy(policy="halve"), 16, ok=set(), tried={16, 4}, predicted=4) is None


def test_grid_plan_asks_the_prediction_for_the_failed_trials_config():
    trial = _trial(16)
    asked = []
    plan = GridPlan([trial], OomPolicy(policy="halve"), predicted_max=lambda t: asked.append(t) or 5)
    (retry,) = plan.on_result(trial, "unsupported", row={"error": "predicted OOM: 368 GiB > 141 GiB per h200"})
    assert retry.batch_size == 5 and retry.parent_trial_id == trial.trial_id and asked == [trial]


def test_run_retries_a_predicted_oom_at_the_predicted_batch_without_ray(tmp_path, sweep_env):
    """A GPU profile whose Ray address has nothing behind it: had sweep started a trial, it would have exited 2.
    --output holds clean rows at batches 1, 2 and 3 that measured 1.2 × the model, so the calibrated largest
    batch that fits is 3. Batch 16 is predicted not to fit; its `halve` retry goes to 3 at once (not 8, then 4,
    both predicted not to fit either), and --resume finds 3 recorded: the run writes the one row for 16."""
    profile = tmp_path / "two-h200.yaml"
    profile.write_text(
        yaml.safe_dump(
            {"name": "two-h200", "accelerator": "h200", "ray_address": "127.0.0.1:9", "nodes": 1, "gpus_per_node": 2}
        )
    )
    out = tmp_path / "results"
    for batch in (1, 2, 3):
        _write(out, _trial(batch, cluster="two-h200"), ratio=1.2, cluster=str(profile))
    grid = tmp_path / "g.yaml"
    grid.write_text(yaml.safe_dump({**LLAMA, "batch_sizes": [16], "on_oom": {"policy": "halve"}}))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sweep",
            "run",
            grid,
            "--cluster",
            profile,
            "--output",
            out,
            "--resume",
            "--no-progress",
        ],
        cwd=ROOT,
        env=sweep_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [r for r in store.read_table(out).to_pylist() if r["run_id"] != "r0"]
    assert [(r["batch_size"], r["status"]) for r in rows] == [(16, "unsupported")]
    assert "affine on 3 clean rows of its config at 3 batch sizes: " in rows[0]["error"]
    assert "+ 1.200 × its activations" in rows[0]["error"]  # 1.2 × the model: its slope, and 1.2 × its overhead
    assert "1 attempt (1 reused from earlier runs)" in proc.stdout


def test_a_max_batch_search_starts_at_the_predicted_limit():
    from sweep.search.max_batch import MaxBatchPlan

    seed = _trial(1)
    plan = MaxBatchPlan([seed], capacity_bytes=141 * GiB, predicted_max=lambda t: 5)
    (first,) = plan.initial()
    assert first.batch_size == 5
    (second,) = plan.on_result(first, "ok", row={"peak_mem_gib": 130.0})
    assert second.batch_size == 6  # its neighbour: is 5 the limit?
    assert plan.on_result(second, "oom") == []
    assert MaxBatchPlan([seed], capacity_bytes=141 * GiB).initial()[0].batch_size == 1  # nothing predicted: start


def test_a_probe_predicted_not_to_fit_is_an_oom_to_the_search():
    """Calibrated, the neighbour of the predicted limit is predicted not to fit: recorded without GPU time, and
    the verdict stands on it rather than the search stopping as after an unsupported recipe."""
    from sweep.search.max_batch import MaxBatchPlan

    plan = MaxBatchPlan([_trial(1)], capacity_bytes=141 * GiB, predicted_max=lambda t: 5)
    (first,) = plan.initial()
    (second,) = plan.on_result(first, "ok", row={"peak_mem_gib": 130.0})
    assert plan.on_result(second, "unsupported", row={"error": "predicted OOM: 150 GiB > 141 GiB per h200"}) == []
    (verdict,) = plan.verdicts()
    assert (verdict.max_batch, verdict.first_failing_batch, verdict.aborted) == (5, 6, None)


def test_a_max_batch_verdict_prints_predicted_against_measured_peak(tmp_path, sweep_env):
    """Llama3-8B on one H200 at T 4096: 134 GiB uncalibrated, 160 GiB with the 1.2 the rows in --output teach,
    so not even batch 1 is predicted to fit: the search's one probe is recorded without GPU time (the profile's
    Ray address has nothing behind it) and the verdict says what was predicted of it."""
    profile, out = dead_h200_profile(tmp_path)
    grid = tmp_path / "g.yaml"
    grid.write_text(
        yaml.safe_dump({"models": ["llama3-8b"], "seq_len": [4096], "batch_sizes": [1], "search": "max_batch"})
    )
    proc = subprocess.run(
        [sys.executable, "-m", "sweep", "run", grid, "--cluster", profile, "--output", out, "--no-progress"],
        cwd=ROOT,
        env={**sweep_env(), "COLUMNS": "250"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 3, proc.stderr  # nothing measured
    assert (
        "predicted (calibrated on 1 row) / measured peak, llama3-8b bf16 (compile regional, 1 rank): batch 1 160 GiB / "
        "predicted OOM" in proc.stdout
    ), proc.stdout


def test_probe_peaks_compare_the_prediction_the_run_began_with_against_the_measured_peak():
    from sweep.memory.predictor import Predictor, peak_line

    predictor = Predictor(profile=load_profile("h200"))
    ok = {
        **base_row(_trial(4), run_id="r", profile=load_profile("h200"), grid_name=None),
        "status": "ok",
        "peak_mem_gib": NO_ROWS.predict_trial(_trial(4)).raw / GiB / 1.25,
    }
    oom = {**base_row(_trial(5), run_id="r", profile=load_profile("h200"), grid_name=None), "status": "oom"}
    predictor.learn(ok)  # refines what later trials are predicted with, not what this search's probes were
    line = peak_line(
        {"model": "llama3-8b", "precision": "bf16", "compile": "regional", "gpus": 2}, predictor.probe_peaks([ok, oom])
    )
    from sweep.memory.capacity import size

    assert line == (
        "predicted (uncalibrated) / measured peak, llama3-8b bf16 (compile regional, 2 ranks): "
        f"batch 4 129 GiB / 103 GiB (+25.0 %) · batch 5 {size(NO_ROWS.predict_trial(_trial(5)).raw)} / oom"
    )
    assert predictor.calibration.ratio("bf16", "regional") == pytest.approx(0.8)
    # a run that began on a folder with a clean row of the kind: its probes' predictions rest on it, and say so
    from sweep.memory.calibration import calibrate
    from sweep.memory.predictor import sample

    calibrated = Predictor(profile=load_profile("h200"), prior=calibrate([sample(ok)]))
    (peak,) = calibrated.probe_peaks([ok])
    assert peak.basis == "calibrated on 1 row" and peak.predicted == pytest.approx(ok["peak_mem_gib"] * GiB)
    assert peak_line({"model": "llama3-8b", "precision": "bf16", "compile": "regional", "gpus": 2}, [peak]).startswith(
        "predicted (calibrated on 1 row) / measured peak, "
    )


HELD_OUT = {
    "arch": "llama",
    "name": "held-out-2.5b",
    "n_layers": 20,
    "d_embd": 2560,
    "n_heads": 20,
    "n_kv_heads": 4,
    "ffn_hidden": 8960,
    "vocab_size": 151936,
}  # benchmarks/campaigns/cold-sweep's model


def test_an_uncalibrated_retry_goes_to_the_models_estimate_not_to_its_margin(tmp_path):
    """On a fresh machine nothing calibrates the model, so a trial is refused only past the memory by the margin;
    a retry placed at the margin's limit runs where the model itself says it does not fit (one H200, bf16 batch
    24 of the cold-sweep model: the retry went to 12 and ran out of memory; 10 fit). The retry goes to the
    model's own estimate."""
    from sweep.memory.predictor import Predictor
    from sweep.service import make_plan

    profile = load_profile(str(ROOT / "benchmarks" / "profiles" / "h200x1.yaml"))
    spec = parse_grid(
        {
            "models": [HELD_OUT],
            "precisions": ["bf16"],
            "batch_sizes": [24],
            "seq_len": 4096,
            "on_oom": {"policy": "halve"},
        }
    )
    (trial,) = expand(spec, cluster=profile.name)
    predictor = Predictor.load(profile, tmp_path / "empty")
    estimate, refused_past = predictor.max_batch(trial, point=True), predictor.max_batch(trial)
    assert estimate < refused_past < 24  # the margin lets batches past the estimate run
    plan = make_plan(spec, [trial], profile, predictor=predictor)
    (retry,) = plan.on_result(trial, "unsupported", row={"error": "predicted OOM: 290 GiB > 140 GiB per h200"})
    assert retry.batch_size == estimate
