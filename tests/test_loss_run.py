"""`loss: chunked` trained end to end: `sweep run` on a real local Ray, FSDP2 over 2 gloo CPU ranks, Parquet rows.
The head's weight is a parameter of FSDP2's root, gathered inside the root's forward where the models compute
the chunked loss (trainer/loss.py): its gradient is reduce-scattered as the plain head's, so the same steps train
to the same losses as the full loss."""

from __future__ import annotations

import pytest
from conftest import tiny_grid

from sweep.record import store

pytestmark = pytest.mark.integration


def test_a_chunked_loss_trains_to_the_full_loss_s_values_with_and_without_accumulation(
    ray_session, cli, write_grid, tmp_path
):
    """llama (untied head) and gpt (head tied to the embedding), one and two micro-batches a step: each chunked
    row's first and last losses equal the full row's after the same steps (the tolerance the integration tests
    give two runs of the same math)."""
    grid = write_grid(
        tiny_grid(
            models=["llama-tiny", "gpt-tiny"],
            gpus=2,
            grad_accum=[1, 2],
            loss=["full", "chunked"],
            steps={"warmup": 1, "measure": 3},
        )
    )
    out = tmp_path / "out"
    # one warm group runs all 8 (two at once would each start their own ranks: no faster on a 2-core host)
    result = cli("run", grid, "--cluster", "local", "--output", out, "--no-progress", "--max-concurrent", 1)
    assert result.exit_code == 0, result.output
    rows = {(r["model"], r["grad_accum"], r["loss"]): r for r in store.read_table(out).to_pylist()}
    assert len(rows) == 8
    for (model, accum, loss), row in rows.items():
        assert row["status"] == "ok", row["error"]
        assert row["loss_last"] < row["loss_first"], (model, accum, loss)
        if loss == "chunked":
            full = rows[(model, accum, "full")]
            assert row["loss_first"] == pytest.approx(full["loss_first"], rel=1e-3), (model, accum)
            assert row["loss_last"] == pytest.approx(full["loss_last"], rel=1e-3), (model, accum)
            # and what the steps learnt, within 2 %: they agreed within 0.03 %; with the head's gradient dropped
            # (a check of this check) gpt's, with two micro-batches, fell 15 % less
            drop = row["loss_first"] - row["loss_last"]
            assert drop == pytest.approx(full["loss_first"] - full["loss_last"], rel=0.02), (model, accum)
