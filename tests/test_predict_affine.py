"""`sweep plan` on a folder whose clean rows measured one config at 2 batch sizes: the affine fit of that config
(sweep/memory/calibration.py) predicts its other batches, in the predicted column, the predicted OOM's reason and
the predicted max batch, where a ratio would have scaled the count's wrong slope."""

from __future__ import annotations

import yaml
from conftest import invoke

from clusters import load_profile
from sweep.memory.calibration import calibrate
from sweep.memory.capacity import size
from sweep.memory.model import GiB, Shape, breakdown
from sweep.memory.predictor import sample
from sweep.record import store
from sweep.record.rows import base_row
from sweep.spec.expand import expand
from sweep.spec.grid import parse_grid

SLOPE = 1.35  # measured bytes per counted activation byte: what eager TE FP8 kept on one H200 (9.75 / 7.2 GiB)
PLAN = ("plan", "--cluster", "h200", "--model", "llama3-8b", "--gpus", "2", "--seq-len", "4096")


def _trial(batch: int, loss: str = "full"):
    grid = {"models": ["llama3-8b"], "gpus": [2], "seq_len": [4096], "batch_sizes": [batch], "loss": [loss]}
    (trial,) = expand(parse_grid(grid, "<t>"), cluster="h200")
    return trial


def _measured(batch: int) -> float:
    """The counted state and copies, and SLOPE × the counted activations and logits, in bytes."""
    b = breakdown(Shape.of(_trial(batch)))
    return b.forward_end - b.batch_part + SLOPE * b.batch_part


def _folder(tmp_path, batches, loss: str = "full"):
    out = tmp_path / "results"
    rows = []
    for batch in batches:
        row = base_row(_trial(batch, loss), run_id="r0", profile=load_profile("h200"), grid_name=None)
        row.update(status="ok", peak_mem_gib=_measured(batch) / GiB, alloc_retries=0)
        store.write_row(out, row)
        rows.append(row)
    return out, rows


def test_plan_predicts_a_config_measured_at_two_batches_by_its_own_line(tmp_path):
    out, rows = _folder(tmp_path, [1, 2])
    result = invoke(*PLAN, "-b", 3, "-b", 4, "--output", out, env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    # batch 3 as the line through 1 and 2 says; the ratio of those rows would have said another figure
    ratio = calibrate([s for r in rows if (s := sample(r)) is not None]).ratio("bf16", "regional")
    assert ratio is not None and size(ratio * breakdown(Shape.of(_trial(3))).peak) != size(_measured(3))
    assert f"{size(_measured(3))} / 141 GiB" in result.stdout
    overhead = breakdown(Shape.of(_trial(1))).forward_end - breakdown(Shape.of(_trial(1))).batch_part
    assert (
        f"predicted OOM: {size(_measured(4))} > 141 GiB per h200 (sweep.memory.model, affine on 2 clean rows of its "
        f"config at 2 batch sizes: {size(overhead)} + {SLOPE:.3f} × its activations" in result.stdout
    )
    assert f"memory prediction calibrated on 2 rows of h200 in {out} (bf16 regional: 2); affine for 1 config" in (
        result.stdout
    )
    assert "seq 4096, 2 ranks): 3, affine on 2 rows of its config at 2 batch sizes" in result.stdout


def test_one_batch_size_is_calibrated_by_the_ratio(tmp_path):
    out, _ = _folder(tmp_path, [2])
    result = invoke(*PLAN, "-b", 4, "--output", out, env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "seq 4096, 2 ranks): " in result.stdout and ", calibrated on 1 row" in result.stdout
    assert "affine" not in result.stdout


def test_a_chunked_loss_row_calibrates_chunked_trials_not_full_ones(tmp_path):
    out, _ = _folder(tmp_path, [2], loss="chunked")
    full = invoke(*PLAN, "-b", 4, "--output", out, env={"COLUMNS": "250"})
    assert f"calibrated on 1 row of h200 in {out} (bf16 regional loss=chunked: 1)" in full.stdout
    assert "seq 4096, 2 ranks): 5, uncalibrated" in full.stdout  # the full loss: no row of its kind
    grid = tmp_path / "chunked.yaml"
    spec = {"models": ["llama3-8b"], "gpus": [2], "seq_len": [4096], "batch_sizes": [4], "loss": "chunked"}
    grid.write_text(yaml.safe_dump(spec))
    chunked = invoke("plan", grid, "--cluster", "h200", "--output", out, env={"COLUMNS": "250"})
    assert "ranks, loss=chunked): " in chunked.stdout and ", calibrated on 1 row" in chunked.stdout, chunked.stdout
