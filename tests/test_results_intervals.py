"""`steps: auto` that stops short of its target says so: the row's ci_target_met (trainer.stopping), `sweep run`'s
warning line (sweep.results.intervals), and the interval beside the step time in `results show` and `export`."""

from __future__ import annotations

import csv
import io
from datetime import datetime, timezone

from test_loss_at import _rich_rows

from sweep.record.schema import TRAINING_DEFAULTS
from sweep.record.store import write_row
from sweep.results.intervals import ci_note, missed_target_warnings
from trainer.stopping import MEASURE_TARGET_PCT, Measure, ci_target_met


def test_the_target_is_the_auto_rules_and_a_fixed_count_has_none():
    assert Measure().target_pct == MEASURE_TARGET_PCT == 1.0
    assert ci_target_met("auto", 0.8) is True and ci_target_met("auto", 1.0) is True
    assert ci_target_met("auto", 12.3) is False
    assert ci_target_met("auto", None) is False  # stopped at the time cap after 5 steps: no interval at all
    assert ci_target_met(10, 0.5) is None and ci_target_met(10, 30.0) is None


ROW = {
    "status": "ok",
    "model": "gpt-tiny",
    "precision": "bf16",
    "batch_size": 2,
    "trial_id": "0123456789abcdef",
    "warmup_steps": 50,
    "measure_steps": 100,
}


def test_one_warning_per_attempt_that_missed_naming_it_and_what_to_change():
    rows = [
        {**ROW, "step_time_ci_pct": 12.34, "ci_target_met": False},
        {**ROW, "trial_id": "met", "step_time_ci_pct": 0.7, "ci_target_met": True},
        {**ROW, "trial_id": "fixed", "step_time_ci_pct": 30.0, "ci_target_met": None},
        {**ROW, "trial_id": "oom", "status": "oom", "ci_target_met": None},
    ]
    (line,) = missed_target_warnings(rows)
    assert line.startswith("gpt-tiny bf16 bsz 2 (trial 01234567): step time ±12.3 % after 50+100 steps (target ±1 %): ")
    assert "set steps.measure to a count: 400" in line and "larger batch" in line
    (capped,) = missed_target_warnings([{**ROW, "measure_steps": 8, "step_time_ci_pct": 2.1, "ci_target_met": False}])
    assert "set steps.measure_max: 32" in capped  # auto's own maximum still allows 4x the steps
    assert (
        "no interval after 50+5 steps"
        in missed_target_warnings([{**ROW, "measure_steps": 5, "step_time_ci_pct": None, "ci_target_met": False}])[0]
    )
    assert ci_note(rows).startswith("!: steps: auto stopped at its limit") and ci_note(rows[1:]) == ""


def test_more_attempts_short_of_the_target_than_a_few_are_one_line_naming_the_widest():
    """On GPUs a grid's steps are `auto` unless it says otherwise: a sweep whose steps alternate can miss on half its
    trials, and the run says so once (the table marks each) instead of once per trial."""
    rows = [
        {**ROW, "trial_id": f"t{i}", "measure_steps": 8, "step_time_ci_pct": ci, "ci_target_met": False}
        for i, ci in enumerate([1.15, 1.57, 1.3, 1.2])
    ] + [{**ROW, "trial_id": "met", "step_time_ci_pct": 0.7, "ci_target_met": True}]
    (line,) = missed_target_warnings(rows)
    assert line.startswith("4 of 5 attempts stopped short of the ±1 % target (marked !); the widest: gpt-tiny bf16 ")
    assert "(trial t1): step time ±1.57 % after 50+8 steps: steps: auto stopped at its limit" in line
    assert line.endswith("set steps.measure_max: 32 (4× the steps about halve it)")
    assert len(missed_target_warnings(rows[1:])) == 3  # a few: one line each


BASE = {
    "run_id": "r",
    "attempt": 1,
    "cluster": "local",
    "accelerator": "cpu",
    "world_size": 2,
    "model": "gpt-tiny",
    "precision": "bf16",
    "compile": "none",
    "ac": "none",
    "seq_len": 128,
    "status": "ok",
    "tflops_per_gpu": 0.01,
    "step_time_s": 0.03149,
    **TRAINING_DEFAULTS,
}
# (trial, batch, interval %, target met): batch 1's two attempts, one short of the target
ATTEMPTS = [("a", 1, 0.8, True), ("b", 1, 12.34, False), ("c", 2, 0.5, True), ("d", 4, 3.0, None), ("e", 8, None, None)]


def _write(folder) -> None:
    for minute, (trial_id, batch, ci, met) in enumerate(ATTEMPTS):
        write_row(
            folder,
            {
                **BASE,
                "trial_id": trial_id,
                "batch_size": batch,
                "step_time_ci_pct": ci,
                "ci_target_met": met,
                "started_at": datetime(2026, 12, 1, 0, minute, tzinfo=timezone.utc),
            },
        )


def _md(text: str) -> list[dict]:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def test_show_prints_each_interval_beside_the_step_and_marks_a_miss(cli, tmp_path):
    _write(tmp_path)
    res = cli("results", "show", tmp_path)
    assert res.exit_code == 0, res.output
    header, rows = _rich_rows(res.stdout)
    assert header[header.index("step (s)") + 1] == "step ±CI"  # beside the step time
    # in the order shown: by config, then by start (a before b)
    assert [r[header.index("step ±CI")] for r in rows] == ["±0.800 %", "±12.3 % !", "±0.500 %", "±3.00 %", "—"]
    assert "!: steps: auto stopped at its limit" in " ".join(res.stdout.split())


def test_export_prints_the_widest_interval_of_a_config_and_marks_a_miss(cli, tmp_path):
    _write(tmp_path)
    res = cli("results", "export", tmp_path)
    assert res.exit_code == 0, res.output
    got = {r["batch"]: r["step ±CI"] for r in _md(res.stdout)}
    assert got == {"1": "±12.3 % !", "2": "±0.500 %", "4": "±3.00 %", "8": "—"}
    assert "!: steps: auto stopped at its limit" in next(
        line for line in res.stdout.splitlines() if line.startswith("_")
    )
    table = {
        r["batch_size"]: r for r in csv.DictReader(io.StringIO(cli("results", "export", tmp_path, "-f", "csv").stdout))
    }
    assert (table["1"]["step_time_ci_pct"], table["1"]["ci_target_met"]) == ("12.34", "False")
    assert (table["2"]["ci_target_met"], table["4"]["ci_target_met"]) == ("True", "")
    # rows without intervals (fixed counts under 6 steps, rows before schema 1.5): no column, no note
    res = cli("results", "export", tmp_path, "--where", "batch_size=8")
    assert "step ±CI" not in res.stdout and "!:" not in res.stdout
