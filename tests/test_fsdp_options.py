"""The FSDP2 gradient options on 2 real gloo ranks (one process each, the real RankWorker, no Ray):
`reduce_dtype` sets the dtype of every gradient reduce-scatter, and `grad_sync: step` leaves only the last
micro-batch's backward to reduce. Each rank counts the reduce-scatters FSDP2 issues by wrapping the
torch.distributed function it calls (the call still goes through) - what a profiler trace would show."""

from __future__ import annotations

import pytest

from trainer.models.specs import REGISTRY

ACCUM, WARMUP, MEASURE = 3, 1, 2


def _rank(jobs: list, queue) -> None:
    import torch.distributed as dist

    from trainer.worker import RankWorker

    # torch 2.13's FSDP2 calls reduce_scatter_single; older releases reduce_scatter_tensor
    name = "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"
    real, dtypes = getattr(dist, name), []

    def counted(*args, **kwargs):
        dtypes.append(str((kwargs.get("input") if "input" in kwargs else args[1]).dtype))
        return real(*args, **kwargs)

    setattr(dist, name, counted)
    for job in jobs:
        dtypes.clear()
        result = RankWorker().run(job)
        queue.put(((job.trial.options.reduce_dtype, job.trial.options.grad_sync), job.rank, result, list(dtypes)))


@pytest.fixture(scope="module")
def runs(rank_jobs, run_ranks):
    """(reduce_dtype, grad_sync) -> rank -> {'loss_last', 'dtypes'}: three 2-rank trials, one after another."""
    trials = [
        rank_jobs(
            REGISTRY["llama-tiny"],
            "bf16",
            world_size=2,
            warmup_steps=WARMUP,
            measure_steps=MEASURE,
            grad_accum=ACCUM,
            grad_clip=0.0,
            reduce_dtype=reduce,
            grad_sync=sync,
        )
        for reduce, sync in [("fp32", "micro_batch"), ("fp32", "step"), ("bf16", "step")]
    ]
    out: dict = {}
    for options, rank, result, dtypes in run_ranks(_rank, [[t[r] for t in trials] for r in range(2)]):
        assert result.status == "ok", result.traceback
        out.setdefault(options, {})[rank] = {"loss_last": result.loss_last, "dtypes": dtypes}
    return out


@pytest.mark.integration
def test_grad_sync_step_reduces_once_per_step(runs):
    steps = WARMUP + MEASURE
    per_micro = runs[("fp32", "micro_batch")][0]["dtypes"]
    once = runs[("fp32", "step")][0]["dtypes"]
    # llama-tiny is sharded in n_layers + 1 groups (each block and the root); each reduces once per backward
    groups = REGISTRY["llama-tiny"].n_layers + 1
    assert len(per_micro) == steps * ACCUM * groups
    assert len(once) == steps * groups


@pytest.mark.integration
def test_reduce_dtype_is_the_reduce_scatter_dtype(runs):
    assert set(runs[("fp32", "step")][0]["dtypes"]) == {"torch.float32"}
    assert set(runs[("bf16", "step")][1]["dtypes"]) == {"torch.bfloat16"}


@pytest.mark.integration
def test_the_options_change_communication_not_the_math(runs):
    """The same micro-batches and the same sum of gradients: the losses agree (bf16 rounding aside)."""
    reference = runs[("fp32", "micro_batch")][0]["loss_last"]
    assert runs[("fp32", "step")][0]["loss_last"] == pytest.approx(reference, rel=1e-4)
    assert runs[("bf16", "step")][0]["loss_last"] == pytest.approx(reference, rel=2e-2)
