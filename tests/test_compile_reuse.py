"""Compile once per graph (`dynamic_batch`): a trial that differs from the one before it only in batch size runs
the code that trial compiled, with a fresh model, optimizer and data, and trains exactly as a fresh process.

Real inductor on CPU (the backend the ranks use; it needs the C++ compiler the machine has): in one process with
`trainer.train.run_trial`, and through `sweep run` on a warm group of 2 CPU ranks (FSDP2 over gloo).
"""

from __future__ import annotations

import pytest
from test_train import _fresh_process, _one_rank_group  # noqa: E402

from sweep.record import store
from trainer.models.specs import REGISTRY


def test_dynamic_batch_folds_away_without_compile():
    """`dynamic_batch: [true, false]` is two trials where a trial compiles, one where nothing is traced."""
    from sweep.spec.expand import expand
    from sweep.spec.grid import parse_grid

    grid = parse_grid(
        {"models": ["gpt-tiny"], "batch_sizes": [2], "compile": ["none", "regional"], "dynamic_batch": [True, False]}
    )
    assert sorted((t.compile, t.dynamic_batch) for t in expand(grid, cluster="local")) == [
        ("none", True),
        ("regional", False),
        ("regional", True),
    ]


def test_torchao_rowwise_keeps_static_shapes():
    """A torchao rowwise trial compiles for each batch (measured slower with a symbolic batch); bf16 and torchao
    tensorwise (its amax in static-length stages, trainer/precision/symbolic_amax.py) keep the option."""
    from sweep.spec.expand import expand
    from sweep.spec.grid import parse_grid

    grid = parse_grid(
        {
            "models": ["gpt-tiny"],
            "batch_sizes": [2],
            "compile": ["regional"],
            "precisions": ["bf16", "fp8-torchao-tensorwise", "fp8-torchao-rowwise", "fp8-torchao-rowwise-gw-hp"],
        }
    )
    assert sorted((t.precision, t.dynamic_batch) for t in expand(grid, cluster="local")) == [
        ("bf16", True),
        ("fp8-torchao-rowwise", False),
        ("fp8-torchao-rowwise-gw-hp", False),
        ("fp8-torchao-tensorwise", True),
    ]


def _trial(rank_jobs, batch: int, **fields):
    (job,) = rank_jobs(REGISTRY["gpt-tiny"], "fp32", compile="regional", batch_size=batch, measure_steps=3, **fields)
    return job.trial


def _run_counting(config, rank) -> tuple[list[float], int, int]:
    """The trial's losses, the graphs dynamo compiled during it and the recompiles it logged."""
    from torch._dynamo.utils import counters

    from trainer.train import run_trial

    counters.clear()
    losses = run_trial(config, rank).losses
    return losses, counters["stats"]["unique_graphs"], sum(counters["recompiles"].values())


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_new_batch_size_reuses_the_compiled_graphs_with_the_losses_of_a_fresh_process(rank_jobs, run_ranks):
    """Batches 2, then 4, then 3 in one process, each trial with its own model: the first compiles the block and
    the loss (2 graphs), the later ones compile nothing and recompile nothing. With `dynamic_batch: false` (the
    behaviour before it) the batch-4 trial compiles both again. Each trial's losses equal, bitwise, those of a
    fresh process running it with static shapes: same seeds, one thread in both, and on CPU the symbolic batch
    changes no kernel's arithmetic (rows are independent; every reduction runs over a static dimension)."""
    batches = (2, 4, 3)
    with _one_rank_group() as rank:
        runs = [_run_counting(_trial(rank_jobs, batch), rank) for batch in batches]
        _, static_graphs, _ = _run_counting(_trial(rank_jobs, 4, dynamic_batch=False), rank)
    assert [(graphs, recompiles) for _, graphs, recompiles in runs] == [(2, 0), (0, 0), (0, 0)]
    assert static_graphs == 2
    fresh = run_ranks(
        _fresh_process, [[_trial(rank_jobs, batch, dynamic_batch=False)] for batch in batches[1:]], timeout=240
    )
    seq_len = _trial(rank_jobs, 2).seq_len
    fresh_losses = {m.tokens_per_step // seq_len: m.losses for m in fresh}  # one rank, no accumulation: the batch
    assert {batch: losses for batch, (losses, _, _) in zip(batches, runs) if batch != 2} == fresh_losses


GRID = """
models: [gpt-tiny]
precisions: [fp32, bf16]
batch_sizes: [2, 3]   # a larger batch after a smaller; 4 then 3 has the one-process test above
compile: regional
dynamic_batch: true   # the default, written as docs/grids.md shows it
seq_len: 32
gpus: 2
steps: {warmup: 1, measure: 3}
"""


@pytest.mark.integration
@pytest.mark.timeout(500)
def test_a_warm_group_compiles_once_per_graph_for_every_batch_size(ray_session, cli, write_grid, tmp_path):
    """Through `sweep run` on one warm group of 2 ranks (FSDP2), where the two precisions alternate at each batch
    size (the group runs the smallest first): each precision's first trial pays the compile, its later batch
    size reuses it, so its compile_time_s (first step beyond a steady one) is a small part of the first's; the
    group gives back what each trial held (no process retired) and every trial trains as in fresh processes."""
    warm, fresh = tmp_path / "warm", tmp_path / "fresh"
    for out, *options in ((warm, "--max-concurrent", 1), (fresh, "--fresh-actors")):
        result = cli("run", write_grid(GRID), "--cluster", "local", "--output", out, "--no-progress", *options)
        assert result.exit_code == 0, result.output
    rows = sorted(store.read_table(warm).to_pylist(), key=lambda r: r["started_at"])
    assert [(r["status"], r["group_trial_index"], r["dynamic_batch"]) for r in rows] == [
        ("ok", i, True) for i in range(4)
    ], [r["error"] for r in rows]
    for precision in ("fp32", "bf16"):
        first, *later = [r for r in rows if r["precision"] == precision]
        assert len(later) == 1 and all(r["compile_time_s"] < 0.2 * first["compile_time_s"] for r in later), [
            (r["precision"], r["batch_size"], r["compile_time_s"]) for r in rows
        ]
    losses = lambda table: {(r["precision"], r["batch_size"]): r["loss_curve"] for r in table}  # noqa: E731
    assert losses(rows) == losses(store.read_table(fresh).to_pylist())
