"""`steps: {warmup: auto, measure: auto}` through the real CLI: 2 CPU ranks (real FSDP2 over gloo) on the
session's Ray stop on the same step, and the rows carry the counts run and the median's confidence interval."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import invoke

from sweep.record import store
from sweep.record.schema import TRAINING_DEFAULTS, VERSION_KEY, to_table
from sweep.results.render import sig

# a bounded timeout: ranks that disagreed on the last step would wait in a collective until it
GRID = {
    "models": ["llama-tiny"],
    "precisions": ["bf16"],
    "batch_sizes": [2],
    "seq_len": 32,
    "gpus": 2,
    "compile": "none",
    "timeout_s": 120,
}


TOKENS_PER_STEP = 1 * 2 * 32 * 2  # grad_accum x batch x seq_len x ranks: every rank trains its own micro-batches


def run(folder: Path, steps: dict) -> tuple[list[dict], list[str]]:
    """The rows written, and the run's warnings about an `auto` measurement short of its target."""
    grid = folder / "grid.yaml"
    grid.write_text(yaml.safe_dump({**GRID, "steps": steps}))
    out = folder / "out"
    result = invoke("run", grid, "--cluster", "local", "--output", out, "--no-progress")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:") and "step time" in line]
    return ds.dataset(out, format="parquet").to_table().to_pylist(), warnings


def assert_loss_curve(row: dict) -> None:
    """Every step's loss from step 1 (warm-up included), at the tokens trained when it was computed."""
    steps = row["warmup_steps"] + row["measure_steps"]
    assert row["loss_curve_tokens"] == [i * TOKENS_PER_STEP for i in range(steps)]
    assert len(row["loss_curve"]) == steps and all(math.isfinite(loss) for loss in row["loss_curve"])
    assert row["loss_curve"][-1] < row["loss_curve"][0]  # the curve of a model that trains


@pytest.mark.integration
def test_auto_steps_stop_together_and_rows_carry_the_counts_and_ci(ray_session, tmp_path):
    (row,), warnings = run(tmp_path, {"warmup": "auto", "measure": "auto", "measure_max": 7})
    assert row["status"] == "ok", row["error"]  # no rank left waiting in a collective
    assert 2 <= row["warmup_steps"] <= 50  # two steps in agreement at least
    assert 6 <= row["measure_steps"] <= 7  # the first confidence interval needs 6; the grid allows 7 at most
    ci = row["step_time_ci_pct"]
    assert ci is not None and ci >= 0
    assert row["steps_time_s"] > 0 and row["step_time_p10_s"] <= row["step_time_s"] <= row["step_time_p90_s"]
    # on 2 CPU ranks of a shared machine the ±1 % target is rarely met (the issue saw ±12-27 % after 50 + 100
    # steps): then the row says so and the run warns once, naming the trial and its interval
    assert row["ci_target_met"] is (ci <= 1.0)
    if row["ci_target_met"]:
        assert warnings == []
    else:
        (line,) = warnings
        assert line.startswith(
            f"warning: llama-tiny bf16 bsz 2 (trial {row['trial_id'][:8]}): step time "
            f"±{sig(ci, 3)} % after {row['warmup_steps']}+{row['measure_steps']} steps (target ±1 %)"
        )
        assert f"set steps.measure_max: {4 * row['measure_steps']}" in line
    assert_loss_curve(row)
    assert_step_times(row)


def assert_step_times(row: dict) -> None:
    """Every step's time, warm-up first: as many as both phases ran, the measured ones those steps_time_s sums."""
    times = row["step_times_s"]
    assert len(times) == row["warmup_steps"] + row["measure_steps"] and all(t > 0 for t in times)
    assert sum(times[row["warmup_steps"] :]) == pytest.approx(row["steps_time_s"])


def _uneven_rank(jobs: list, queue) -> None:
    """One rank of a 2-rank gloo group timing a step that is uneven on rank 0 (8 or 64 matmuls, alternately:
    never stable, so rank 0's rules run to both caps) and even on rank 1 (always 16: its own rules would stop
    early). The steps are long enough and far enough apart (8x) that a scheduling stall on a loaded 2-core host
    cannot make two of rank 0's in a row agree within warm-up's 10 % (with 1 or 4 matmuls it did once, at step 47)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from trainer.stopping import Schedule
    from trainer.train import Rank, time_steps

    ((rank, port),) = jobs
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        x = torch.randn(256, 256)

        def step(i: int) -> torch.Tensor:
            for _ in range((8 if i % 2 else 64) if rank == 0 else 16):
                x @ x
            return torch.zeros(())

        schedule = Schedule("auto", "auto")
        time_steps(step, schedule, Rank(device=torch.device("cpu"), mesh=init_device_mesh("cpu", (2,)), rank=rank))
        queue.put((rank, len(schedule.warmup.times), len(schedule.measure.times)))
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
def test_every_rank_stops_where_rank_0_decides(run_ranks, free_ports):
    (port,) = free_ports(1)
    counts = dict(
        (rank, (warmup, measure)) for rank, warmup, measure in run_ranks(_uneven_rank, [[(0, port)], [(1, port)]])
    )
    assert counts == {0: (50, 100), 1: (50, 100)}


@pytest.mark.integration
def test_fixed_steps_run_exactly(ray_session, tmp_path):
    (row,), warnings = run(tmp_path, {"warmup": 1, "measure": 3})
    assert row["status"] == "ok", row["error"]
    assert (row["warmup_steps"], row["measure_steps"]) == (1, 3)
    assert row["step_time_ci_pct"] is None  # 3 steps make no 95 % interval of the median
    assert row["ci_target_met"] is None and warnings == []  # a fixed count sets no target to miss
    assert_loss_curve(row)
    assert_step_times(row)


def test_auto_is_not_the_default():
    from sweep.spec.grid import parse_grid

    steps = parse_grid(GRID).steps
    assert (steps.warmup, steps.measure) == (3, 10)
    assert steps.auto_max is None  # a fixed count is what it says


def test_auto_measures_at_most_measure_max_steps_in_every_trial():
    from sweep.spec.expand import expand
    from sweep.spec.grid import MEASURE_MAX_DEFAULT, parse_grid
    from trainer.stopping import Schedule

    def most(steps: dict) -> tuple[int, int] | None:
        (trial,) = expand(parse_grid({**GRID, "steps": steps}), cluster="local")
        return trial.auto_max

    assert MEASURE_MAX_DEFAULT == 8 and most({"warmup": "auto", "measure": "auto"}) == (50, 8)
    assert most({"warmup": 2, "measure": "auto", "measure_max": 30}) == (50, 30)
    assert most({"warmup": "auto", "measure": 10}) is None
    schedule = Schedule("auto", "auto", most({"warmup": "auto", "measure": "auto"}))
    for t in [1.0, 1.0] + [1.0, 1.1] * 10:  # steps that alternate 10 % apart never meet ±1 %
        if schedule.add(t) == "done":
            break
    assert (len(schedule.warmup.times), len(schedule.measure.times)) == (2, 8)


@pytest.mark.parametrize(
    "cluster, steps, shown",
    [
        ("h200", None, "warm-up auto, measured auto (at most 8)"),
        ("mi300x", {}, "warm-up auto, measured auto (at most 8)"),
        ("local", None, "warm-up 3, measured 10"),
        ("h200", {"measure": 20}, "warm-up auto, measured 20"),
        ("h200", {"warmup": 5}, "warm-up 5, measured auto (at most 8)"),
        ("local", {"measure_max": 16}, "warm-up 3, measured auto (at most 16)"),
        ("local", {"warmup": "auto", "measure": "auto"}, "warm-up auto, measured auto (at most 8)"),
    ],
)
def test_steps_a_grid_leaves_out_are_auto_on_gpus_and_counts_on_cpu_ranks(tmp_path, cluster, steps, shown):
    """`sweep plan` says the steps each trial runs, and the trials carry them: what the grid leaves out is `auto`
    on GPU profiles and 3 + 10 on CPU ranks; `measure_max` alone asks for `measure: auto`."""
    from sweep import service

    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump(GRID if steps is None else {**GRID, "steps": steps}))
    result = invoke("plan", grid, "--cluster", cluster)
    assert result.exit_code == 0, result.output
    assert f"steps a trial: {shown}\n" in result.output
    (trial,) = service.prepare(grid, cluster, None).trials
    warmup, measure = shown.removeprefix("warm-up ").split(" (")[0].split(", measured ")
    assert (str(trial.warmup_steps), str(trial.measure_steps)) == (warmup, measure)


@pytest.mark.parametrize(
    "steps, message",
    [
        ({"warmup": "autox"}, "steps.warmup: expected a whole number >= 0, or auto"),
        ({"measure": 0}, "steps.measure: expected a whole number >= 1, or auto"),
        ({"measure": "auto", "measure_max": 5}, "steps.measure_max: Input should be greater than or equal to 6"),
        ({"measure": 10, "measure_max": 20}, "measure_max applies to measure: auto; measure: 10 measures that many"),
    ],
)
def test_a_bad_steps_value_is_one_line(tmp_path, steps, message):
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({**GRID, "steps": steps}))
    result = invoke("plan", grid, "--cluster", "local")
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_rows_before_schema_1_5_read_without_a_ci(tmp_path):
    now = datetime(2026, 11, 29, tzinfo=timezone.utc)
    row = {
        "run_id": "r",
        "trial_id": "t",
        "status": "ok",
        "step_time_s": 0.5,
        "started_at": now,
        "finished_at": now,
        **TRAINING_DEFAULTS,
    }
    old = to_table([row]).drop_columns(["step_time_ci_pct"]).replace_schema_metadata({VERSION_KEY: b"1.4"})
    pq.write_table(old, tmp_path / "old.parquet")
    (back,) = store.read_table(tmp_path).to_pylist()
    assert back["step_time_ci_pct"] is None and back["step_time_s"] == 0.5


def test_steps_run_with_automatic_garbage_collection_off_and_collect_between_them():
    """A collection inside a timed step makes it a straggler: the trainer collects between steps instead. On a
    real one-rank gloo group (test_train's), as a worker of world size 1 times its steps."""
    import gc

    import torch
    from test_train import _one_rank_group

    from trainer.stopping import Schedule
    from trainer.train import time_steps

    class Cycle:  # garbage only the cycle collector frees
        def __init__(self):
            self.me = self

    seen = []

    def step(i: int) -> torch.Tensor:
        seen.append((gc.isenabled(), sum(type(o) is Cycle for o in gc.get_objects())))
        Cycle()
        return torch.zeros(())

    schedule = Schedule(1, 3)
    assert gc.isenabled()
    with _one_rank_group() as rank:
        losses = time_steps(step, schedule, rank)
    assert len(losses) == 4 and gc.isenabled()  # on again afterwards
    # off in every step, and the cycle each step left was collected before the next began
    assert seen == [(False, 0)] * 4
