"""benchmarks/memory_gpu_check.py on a folder of rows whose peaks follow a known line: each row predicted from the
rows of its config at other batches, raw, by the ratio and by the affine fit."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

from clusters import load_profile
from sweep.memory.model import GiB, Shape, breakdown
from sweep.record import store
from sweep.record.rows import base_row
from sweep.spec.expand import expand
from sweep.spec.grid import parse_grid

SLOPE, OVERHEAD = 1.35, 40 * GiB


def _trial(batch: int, seq: int = 4096):
    grid = {"models": ["llama3-8b"], "gpus": [2], "seq_len": [seq], "batch_sizes": [batch]}
    (trial,) = expand(parse_grid(grid, "<t>"), cluster="h200")
    return trial


def test_each_row_is_predicted_from_its_configs_other_batches(tmp_path):
    out = tmp_path / "rows"
    trials = [_trial(1), _trial(2), _trial(3), _trial(3, seq=2048)]
    for i, trial in enumerate(trials):
        row = base_row(trial, run_id=f"r{i}", profile=load_profile("h200"), grid_name=None)
        peak = OVERHEAD + SLOPE * breakdown(Shape.of(trial)).batch_part
        row.update(status="ok", peak_mem_gib=peak / GiB, alloc_retries=0)
        store.write_row(out, row)
    proc = subprocess.run(
        [sys.executable, "benchmarks/memory_gpu_check.py", "--no-history", out],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("| llama3-8b |")]
    assert len(lines) == 4
    # seq 4096: on the line through the two other batches (the ratio cannot be: the count's slope is not 1.35)
    for line in lines[:3]:
        cells = [c.strip() for c in line.split("|")]
        assert cells[11] in ("+0.0 %", "-0.0 %") and cells[12] == "affine 2/2", line
        assert cells[10] not in ("+0.0 %", "-0.0 %"), line
    # seq 2048 is another config: the ratio of the seq 4096 rows
    assert lines[3].split("|")[12].strip() == "ratio"
    assert "rows an affine fit predicts (3):" in proc.stdout
    assert "  - now: 3 of 3 within ±10 %" in proc.stdout
