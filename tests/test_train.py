"""One trial contract from grid to rank, and one trial as its own unit (`trainer.train`)."""

from __future__ import annotations

import pytest

from sweep.grid import Trial, parse_grid
from sweep.scheduler import rank_jobs
from trainer.models.specs import REGISTRY
from trainer.options import OPTION_DEFAULTS, TrainingOptions


@pytest.mark.parametrize("field, value", [("grad_accum", 0), ("grad_clip", -1.0), ("grad_clip", float("nan")),
                                          ("fp8_lm_head", "yes"), ("reduce_dtype", "fp16"), ("grad_sync", "never")])
def test_a_bad_training_option_is_refused_naming_it(field, value):
    """The options' one declaration checks them wherever they are built: a grid, a Trial, a rank's options."""
    with pytest.raises(ValueError, match=f"^{field}: "):
        TrainingOptions(**{field: value})
    with pytest.raises(ValueError, match=f"^{field}: "):
        Trial(cluster="local", model=REGISTRY["gpt-tiny"], precision="bf16", compile="none", ac="none", batch_size=1,
              seq_len=32, gpus=1, warmup_steps=1, measure_steps=1, **{field: value})


def test_the_grid_axes_are_the_training_options_with_their_defaults():
    grid = parse_grid({"models": ["gpt-tiny"], "batch_sizes": [1]})
    assert {name: getattr(grid, name) for name in OPTION_DEFAULTS} == {k: [v] for k, v in OPTION_DEFAULTS.items()}


def test_rank_jobs_carry_the_trial_and_number_ranks_per_node():
    trial = Trial(cluster="c", model=REGISTRY["llama-tiny"], precision="bf16", compile="regional", ac="full",
                  batch_size=3, seq_len=64, gpus=3, warmup_steps=2, measure_steps=5, grad_accum=4, grad_clip=0.5,
                  reduce_dtype="bf16", grad_sync="step", memory_cap_bytes=2**30)
    nodes = [{"ip": "10.0.0.1", "port": 4242, "node_id": "a"}, {"ip": "10.0.0.1", "port": 1, "node_id": "a"},
             {"ip": "10.0.0.2", "port": 2, "node_id": "b"}]
    jobs = rank_jobs(trial, nodes, device_type="cuda", pg_timeout_s=30.0)
    assert [(j.rank, j.local_rank, j.world_size) for j in jobs] == [(0, 0, 3), (1, 1, 3), (2, 0, 3)]
    assert {(j.master_addr, j.master_port, j.device_type, j.pg_timeout_s) for j in jobs} == {("10.0.0.1", 4242, "cuda", 30.0)}
    config = jobs[0].trial
    assert all(j.trial == config for j in jobs)
    assert config.options == TrainingOptions(grad_accum=4, grad_clip=0.5, reduce_dtype="bf16", grad_sync="step")
    assert (config.precision, config.compile, config.ac, config.batch_size, config.seq_len, config.warmup_steps,
            config.measure_steps, config.memory_cap_bytes) == ("bf16", "regional", "full", 3, 64, 2, 5, 2**30)
    assert REGISTRY["llama-tiny"].model_validate_json(config.model_spec_json) == REGISTRY["llama-tiny"]
