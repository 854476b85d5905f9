"""One trial contract from grid to rank, and one trial as its own unit (`trainer.train`)."""

from __future__ import annotations

import contextlib

import pytest
from conftest import tiny_trial

from sweep.execution.scheduler import rank_jobs
from sweep.spec.grid import Trial, parse_grid
from trainer.models.specs import REGISTRY, ModelSpec
from trainer.options import OPTION_DEFAULTS, TrainingOptions


@pytest.mark.parametrize(
    "field, value",
    [
        ("grad_accum", 0),
        ("grad_clip", -1.0),
        ("grad_clip", float("nan")),
        ("fp8_lm_head", "yes"),
        ("reduce_dtype", "fp16"),
        ("grad_sync", "never"),
    ],
)
def test_a_bad_training_option_is_refused_naming_it(field, value):
    """The options' one declaration checks them wherever they are built: a grid, a Trial, a rank's options."""
    with pytest.raises(ValueError, match=f"^{field}: "):
        TrainingOptions(**{field: value})
    with pytest.raises(ValueError, match=f"^{field}: "):
        Trial(
            cluster="local",
            model=REGISTRY["gpt-tiny"],
            precision="bf16",
            compile="none",
            ac="none",
            batch_size=1,
            seq_len=32,
            gpus=1,
            warmup_steps=1,
            measure_steps=1,
            **{field: value},
        )


def test_the_grid_axes_are_the_training_options_with_their_defaults():
    grid = parse_grid({"models": ["gpt-tiny"], "batch_sizes": [1]})
    assert {name: getattr(grid, name) for name in OPTION_DEFAULTS} == {k: [v] for k, v in OPTION_DEFAULTS.items()}


def test_rank_jobs_carry_the_trial_and_number_ranks_per_node():
    trial = tiny_trial(
        cluster="c",
        model=REGISTRY["llama-tiny"],
        compile="regional",
        ac="full",
        batch_size=3,
        seq_len=64,
        gpus=3,
        warmup_steps=2,
        measure_steps=5,
        grad_accum=4,
        grad_clip=0.5,
        reduce_dtype="bf16",
        grad_sync="step",
        memory_cap_bytes=2**30,
    )
    nodes = [
        {"ip": "10.0.0.1", "port": 4242, "node_id": "a"},
        {"ip": "10.0.0.1", "port": 1, "node_id": "a"},
        {"ip": "10.0.0.2", "port": 2, "node_id": "b"},
    ]
    jobs = rank_jobs(trial, nodes, device_type="cuda", pg_timeout_s=30.0)
    assert [(j.rank, j.local_rank, j.world_size) for j in jobs] == [(0, 0, 3), (1, 1, 3), (2, 0, 3)]
    assert {(j.master_addr, j.master_port, j.device_type, j.pg_timeout_s) for j in jobs} == {
        ("10.0.0.1", 4242, "cuda", 30.0)
    }
    config = jobs[0].trial
    assert all(j.trial == config for j in jobs)
    assert config.options == TrainingOptions(grad_accum=4, grad_clip=0.5, reduce_dtype="bf16", grad_sync="step")
    assert (
        config.precision,
        config.compile,
        config.ac,
        config.batch_size,
        config.seq_len,
        config.warmup_steps,
        config.measure_steps,
        config.memory_cap_bytes,
    ) == ("bf16", "regional", "full", 3, 64, 2, 5, 2**30)
    assert REGISTRY["llama-tiny"].model_validate_json(config.model_spec_json) == REGISTRY["llama-tiny"]


# -- one trial as a unit: trainer.train.run_trial, several in one process ----------------------------


@contextlib.contextmanager
def _one_rank_group():
    """A process group of this process alone (gloo, an in-memory store), as the worker's for world_size 1."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from trainer.train import Rank

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same arithmetic in this process and in a fresh one
    try:
        yield Rank(device=torch.device("cpu"), mesh=init_device_mesh("cpu", (1,)))
    finally:
        torch.set_num_threads(threads)
        dist.destroy_process_group()


def _fresh_process(configs: list, queue) -> None:
    from trainer.train import run_trial

    with _one_rank_group() as rank:
        for config in configs:
            queue.put(run_trial(config, rank))


@pytest.mark.integration
def test_two_trials_run_one_after_the_other_in_one_process(rank_jobs, run_ranks):
    """The building block of a worker that runs many trials: a bf16 Llama trial with gradient accumulation
    under a memory cap, then an fp32 GPT trial, through trainer.train in this process. Both measure, and
    the second trains exactly as it does in a process where nothing ran before it."""
    from trainer.train import run_trial

    (first,) = rank_jobs(
        REGISTRY["llama-tiny"], "bf16", grad_accum=2, grad_clip=0.5, memory_cap_bytes=2 * 2**30, measure_steps=3
    )
    (second,) = rank_jobs(REGISTRY["gpt-tiny"], "fp32", batch_size=3, measure_steps=5)
    with _one_rank_group() as rank:
        results = [run_trial(first.trial, rank), run_trial(second.trial, rank)]
    for job, result in zip((first, second), results):
        assert len(result.step_times) == job.trial.measure_steps and all(t > 0 for t in result.step_times)
        assert len(result.losses) == job.trial.warmup_steps + job.trial.measure_steps
        assert result.losses[-1] < result.losses[0], result.losses
        assert (
            result.n_params
            == result.params_local
            == ModelSpec.model_validate_json(job.trial.model_spec_json).n_params()
        )
    (fresh,) = run_ranks(_fresh_process, [[second.trial]], timeout=120)
    assert results[1].losses == fresh.losses
    assert (results[1].n_params, results[1].params_local) == (fresh.n_params, fresh.params_local)


def test_a_trials_auto_max_reaches_the_ranks_schedule(rank_jobs):
    """A tune's final runs `auto` steps at most `auto_max` (sweep.search.fastest.cost.final_auto_max), from its Trial
    through its rank's job to the trainer's schedule: at the measurement rule's own minimum (5) it measures exactly 5,
    where `auto` alone measures at least 6 (a median's interval needs 6 steps); warm-up stops at 3 at most, at 2 where
    the first two steps already agree within 10 % (its rule's minimum: a CPU step that compiles nothing may)."""
    from trainer.train import run_trial

    (capped,) = rank_jobs(REGISTRY["gpt-tiny"], "fp32", warmup_steps="auto", measure_steps="auto", auto_max=(3, 5))
    assert capped.trial.auto_max == (3, 5)
    with _one_rank_group() as rank:
        result = run_trial(capped.trial, rank)
    assert len(result.step_times) == 5 and result.warmup_steps in (2, 3), (result.warmup_steps, result.step_times)
