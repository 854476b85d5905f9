"""A CPU rank's predicted peak against what its rows measured, as a user gets it: `sweep run` a tiny grid under a
memory cap (real Ray, real FSDP2 on 2 gloo ranks), then `sweep plan` of the same grid on the same output.

The grid's first trial (batch 2) runs on fresh rank processes, whose first step also sets up what a process sets up
once (oneDNN's kernels: 35 MiB more than on a warm process, measured): it is no clean row
(sweep.memory.predictor.cpu_sample) and is not asserted on; the three warm rows are, each within ±10 %."""

from __future__ import annotations

import re

import pytest
from conftest import invoke, tiny_grid
from test_cli_options import WIDE_VOCAB  # one layer, a 4,096-token vocabulary: the loss's 12 B per logit lead

from sweep.record import store

pytestmark = pytest.mark.integration

CAP = "256MiB"
_CELL = re.compile(r"│ (?P<trial>[0-9a-f]{8}) .*?│ (?P<value>[\d.]+) (?P<unit>KiB|MiB|GiB) / 256 MiB")


def _mib(value: str, unit: str) -> float:
    return float(value) * {"KiB": 1 / 1024, "MiB": 1.0, "GiB": 1024.0}[unit]


def test_plan_predicts_each_clean_cpu_row_within_ten_percent(ray_session, tmp_path):
    grid = tmp_path / "grid.yaml"
    grid.write_text(tiny_grid(models=[WIDE_VOCAB], precisions=["fp32"], seq_len=128, batch_sizes=[2, 4, 8, 16], gpus=2))
    out = tmp_path / "out"
    # one rank group: its first trial alone runs on fresh processes (two groups would each start fresh)
    ran = invoke(
        "run", grid, "--cluster", "local", "--memory-cap", CAP, "--output", out, "--no-progress", "--max-concurrent", 1
    )
    assert ran.exit_code == 0, ran.output
    rows = store.read_table(out).to_pylist()
    assert {r["status"] for r in rows} == {"ok"} and len(rows) == 4
    clean = {r["trial_id"][:8]: r for r in rows if r["actor_reused"]}
    assert sorted(r["batch_size"] for r in clean.values()) == [4, 8, 16]

    plan = invoke("plan", grid, "--cluster", "local", "--memory-cap", CAP, "--output", out, env={"COLUMNS": "250"})
    assert plan.exit_code == 0, plan.output
    predicted = {m["trial"]: _mib(m["value"], m["unit"]) for m in _CELL.finditer(plan.stdout)}
    assert set(clean) <= set(predicted), plan.stdout
    for trial, row in clean.items():
        measured = row["peak_mem_gib"] * 1024
        assert predicted[trial] == pytest.approx(measured, rel=0.10), (row["batch_size"], predicted[trial], measured)
    assert "no (" not in plan.stdout  # shown against the cap, never refused
    assert "memory prediction of CPU ranks" in plan.stdout and "calibrated on 3 rows of local" in plan.stdout
    assert "a fresh process's first trial peaked" in plan.stdout  # batch 2's row, said beside the figure
    best = re.search(
        r"predicted max batch: wide-vocab fp32 \(.*\): (\d+), calibrated on 3 rows of its config", plan.stdout
    )
    assert best is not None, plan.stdout
    assert int(best.group(1)) >= 16  # batch 16 ran under the cap: the fit says it fits too
