"""The FSDP2 gradient options on 2 real gloo ranks (one process each, the real RankWorker, no Ray):
`reduce_dtype` sets the dtype of every gradient reduce-scatter, and `grad_sync: step` leaves only the last
micro-batch's backward to reduce. Each rank counts the reduce-scatters FSDP2 issues by wrapping the
torch.distributed function it calls (the call still goes through) - what a profiler trace would show."""

from __future__ import annotations

import multiprocessing as mp
import socket

import pytest

from trainer.models.specs import REGISTRY

ACCUM, WARMUP, MEASURE = 3, 1, 2


def _rank(rank: int, port: int, options: dict, results) -> None:
    import torch.distributed as dist

    from trainer.job import RankJob
    from trainer.worker import RankWorker

    # torch 2.13's FSDP2 calls reduce_scatter_single; older releases reduce_scatter_tensor
    name = "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"
    real, dtypes = getattr(dist, name), []

    def counted(*args, **kwargs):
        dtypes.append(str((kwargs.get("input") if "input" in kwargs else args[1]).dtype))
        return real(*args, **kwargs)

    setattr(dist, name, counted)
    job = RankJob(rank=rank, world_size=2, local_rank=rank, master_addr="127.0.0.1", master_port=port,
                  model_spec_json=REGISTRY["llama-tiny"].to_json(), precision="bf16", compile="none", ac="none",
                  batch_size=2, seq_len=32, warmup_steps=WARMUP, measure_steps=MEASURE, device_type="cpu",
                  grad_accum=ACCUM, grad_clip=0.0, **options)
    result = RankWorker().run(job)
    results.put((rank, result.get("status"), result.get("error"), result.get("loss_last"), dtypes))


def _train(port: int, **options) -> dict:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, options, results)) for r in range(2)]
    for p in procs:
        p.start()
    out = {}
    for _ in procs:
        rank, status, error, loss, dtypes = results.get(timeout=300)
        assert status == "ok", error
        out[rank] = {"loss_last": loss, "dtypes": dtypes}
    for p in procs:
        p.join(timeout=60)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs():
    return {(reduce, sync): _train(_free_port(), reduce_dtype=reduce, grad_sync=sync)
            for reduce, sync in [("fp32", "micro_batch"), ("fp32", "step"), ("bf16", "step")]}


def test_grad_sync_step_reduces_once_per_step(runs):
    steps = WARMUP + MEASURE
    per_micro = runs[("fp32", "micro_batch")][0]["dtypes"]
    once = runs[("fp32", "step")][0]["dtypes"]
    # llama-tiny is sharded in n_layers + 1 groups (each block and the root); each reduces once per backward
    groups = REGISTRY["llama-tiny"].n_layers + 1
    assert len(per_micro) == steps * ACCUM * groups
    assert len(once) == steps * groups


def test_reduce_dtype_is_the_reduce_scatter_dtype(runs):
    assert set(runs[("fp32", "step")][0]["dtypes"]) == {"torch.float32"}
    assert set(runs[("bf16", "step")][1]["dtypes"]) == {"torch.bfloat16"}


def test_the_options_change_communication_not_the_math(runs):
    """The same micro-batches and the same sum of gradients: the losses agree (bf16 rounding aside)."""
    reference = runs[("fp32", "micro_batch")][0]["loss_last"]
    assert runs[("fp32", "step")][0]["loss_last"] == pytest.approx(reference, rel=1e-4)
    assert runs[("bf16", "step")][0]["loss_last"] == pytest.approx(reference, rel=2e-2)
