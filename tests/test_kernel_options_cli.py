"""The kernel options through `sweep run` as a user runs them: real Ray, two gloo ranks, FSDP2, compiled blocks.

A grid asks for SDPA's flash kernel and inductor's GEMM autotuning; the rows record both options, the attention
kernel the profiled steps ran, and losses that agree with the default compile mode's (the same arithmetic).
"""

from __future__ import annotations

import pytest
from conftest import tiny_grid

from sweep.record import store

BF16_TOLERANCE = 2e-2  # other kernels for the same bf16 arithmetic (tests/test_fsdp_options.py's)


@pytest.mark.integration
def test_a_grid_of_kernel_options_runs_and_records_them(ray_session, cli, write_grid, tmp_path):
    grid = tiny_grid(
        models=["llama-tiny"],
        precisions=["bf16"],
        compile="regional",
        gpus=2,
        attention="flash",
        compile_mode=["default", "max-autotune-no-cudagraphs"],
        profile=True,
    )
    out = tmp_path / "out"
    result = cli("run", write_grid(grid), "--cluster", "local", "--output", out, "--no-progress")
    assert result.exit_code == 0, result.output
    rows = {r["compile_mode"]: r for r in store.read_table(out).to_pylist()}
    assert set(rows) == {"default", "max-autotune-no-cudagraphs"}
    for row in rows.values():
        assert row["status"] == "ok", row["error"]
        assert row["attention"] == "flash" and row["fp8_attention"] is False and row["fp8_pow2_scales"] is False
        assert row["attention_kernel"] == "flash"  # CPU's flash SDPA kernel, seen in the profiled steps
        assert row["compile_time_s"] > 0 and row["loss_last"] < row["loss_first"]
    tuned, default = rows["max-autotune-no-cudagraphs"], rows["default"]
    assert tuned["loss_curve"] == pytest.approx(default["loss_curve"], rel=BF16_TOLERANCE)
    shown = cli("results", "show", out, env={"COLUMNS": "250"})
    assert shown.exit_code == 0 and "compile mode" in shown.stdout, shown.output
