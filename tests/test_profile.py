"""Where the time goes: `profile: true` / `--profile` records a trace of a few steps after the measured ones.

The summary's arithmetic is tested on hand-made intervals (no profiler); one real 2-rank run through the CLI
checks the row, the trace beside it, and that the measurement is the grid's.
"""

from __future__ import annotations

import gzip
import json

import pyarrow.dataset as ds
import pytest

from sweep.record import store
from trainer.profiling import OPTIMIZER, STEP, Span, classify, kernel_kind, op_kind, shares, summarize

SHARES = ("gemm_pct", "attention_pct", "comm_exposed_pct", "optimizer_pct", "other_pct")


def test_only_communication_no_computation_overlaps_is_exposed():
    # 0-4 a GEMM, 2-8 an all-gather on its own stream, 8-10 idle: the overlapped 2-4 is the GEMM's
    got = shares([(0, 4, "gemm"), (2, 8, "comm")], (0, 10))
    assert got == pytest.approx(
        {"gemm_pct": 40, "attention_pct": 0, "comm_exposed_pct": 40, "optimizer_pct": 0, "other_pct": 20}
    )


def test_communication_under_computation_is_not_exposed_and_shares_add_up():
    intervals = [
        (1, 9, "comm"),
        (0, 3, "gemm"),
        (3, 5, "attention"),
        (5, 9.5, "other"),
        (12, 15, "optimizer"),
        (11, 13, "gemm"),
        (20, 30, "gemm"),
    ]  # the last one ends past the window: only its part counts
    got = shares(intervals, (0, 25))
    assert got["comm_exposed_pct"] == 0
    assert got == pytest.approx(
        {
            "gemm_pct": (3 + 2 + 5) / 25 * 100,
            "attention_pct": 2 / 25 * 100,
            "comm_exposed_pct": 0,
            "optimizer_pct": 2 / 25 * 100,
            "other_pct": (4.5 + 1.5 + 5) / 25 * 100,
        }
    )
    assert sum(got.values()) == pytest.approx(100)


def test_kernels_by_name_and_by_the_phase_that_launched_them():
    assert [
        kernel_kind(n)
        for n in (
            "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64",
            "nvjet_tst_192x192_64x3_2x1_v_bz_coopB_TNN",
            "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm>",
            "ncclDevKernel_AllGather_RING_LL(...)",
            "void pytorch_flash::flash_fwd_kernel<...>",
            "fmha_cutlassF_bf16_aligned_64x64_rf_sm80",
            "void at::native::vectorized_elementwise_kernel<4, ...>",
            "Cijk_Alik_Bljk_BBS_BH_MT256x256x64",
        )
    ] == ["gemm", "gemm", "gemm", "comm", "attention", "attention", "other", "gemm"]
    optimizer = [(100.0, 200.0)]
    spans = [
        Span("multi_tensor_apply_kernel", 300, 310, lane=7, issued=150),  # launched by the optimizer step
        Span("ncclDevKernel_AllReduce", 310, 320, lane=9, issued=160),  # the clip's all-reduce: communication
        Span("ampere_bf16_s16816gemm", 50, 60, lane=7, issued=120),
    ]  # issued in the optimizer phase
    assert [kind for *_, kind in classify(spans, kernel_kind, optimizer)] == ["optimizer", "comm", "optimizer"]
    assert [
        kind for *_, kind in classify([Span("sm90_gemm", 300, 310, lane=7, issued=90)], kernel_kind, optimizer)
    ] == ["gemm"]


def test_cpu_operators_take_the_kind_of_the_operator_they_run_in():
    spans = [
        Span("aten::linear", 0, 10, lane=1),
        Span("aten::t", 0, 1, lane=1),
        Span("aten::addmm", 1, 10, lane=1),
        Span("c10d::allgather_", 10, 20, lane=1),
        Span("aten::empty", 11, 12, lane=1),
        Span("autograd::engine::evaluate_function: AddmmBackward0", 20, 30, lane=1),
        Span("aten::mm", 21, 25, lane=1),
        Span("aten::sum", 25, 30, lane=1),
        Span("gloo:all_gather", 5, 15, lane=2),
        Span("aten::scaled_dot_product_attention", 30, 35, lane=1),
        Span("aten::_foreach_add_", 40, 45, lane=1),
        Span("fsdp::all_gather_copy_in", 46, 48, lane=1),
    ]
    kinds = [kind for *_, kind in sorted(classify(spans, op_kind, [(40.0, 46.0)]))]
    assert kinds == [
        "gemm",
        "gemm",
        "gemm",
        "comm",
        "comm",
        "comm",
        "other",
        "gemm",
        "other",
        "attention",
        "optimizer",
        "other",
    ]  # FSDP's copy into the all-gather buffer is a copy, not communication
    # gloo's own thread works 5-15 while the main thread multiplies until 10: only 10-15 is exposed
    got = shares(classify(spans, op_kind, [(40.0, 46.0)]), (0, 50))
    assert got["comm_exposed_pct"] == pytest.approx(10 / 50 * 100)
    assert got["gemm_pct"] == pytest.approx((10 + 4) / 50 * 100)


def test_summary_of_a_gpu_trace_counts_the_wall_steps():
    """A Chrome trace as torch.profiler writes it: the window is the labelled steps, kernels find their phase
    through their launch's correlation id, idle time is other."""

    def x(cat, name, ts, dur, **args):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "tid": 1, "args": args}

    events = [
        x("user_annotation", STEP, 0, 100),
        x("user_annotation", OPTIMIZER, 60, 30),
        x("cuda_runtime", "cudaLaunchKernel", 5, 1, correlation=1),
        x("cuda_runtime", "cudaLaunchKernel", 65, 1, correlation=2),
        x("kernel", "sm90_xmma_gemm_bf16", 10, 40, correlation=1),
        x("kernel", "multi_tensor_apply_kernel", 70, 10, correlation=2),
        x("cpu_op", "aten::mm", 5, 2),
        {"ph": "M", "name": "process_name"},
    ]
    got = summarize({"traceEvents": events})
    assert got == pytest.approx(
        {"gemm_pct": 40, "attention_pct": 0, "comm_exposed_pct": 0, "optimizer_pct": 10, "other_pct": 50}
    )
    with pytest.raises(ValueError, match="sweep/step"):
        summarize({"traceEvents": events[1:]})


PROFILED = """
name: profiled
models: [gpt-tiny]
precisions: [fp32]
batch_sizes: [2]
compile: none
seq_len: 64
gpus: 2
steps: {warmup: 1, measure: 3}
"""


@pytest.mark.integration
def test_profile_run_writes_a_trace_beside_its_row(ray_session, cli, write_grid, tmp_path):
    out = tmp_path / "out"
    result = cli("run", write_grid(PROFILED), "--cluster", "local", "--output", out, "--no-progress", "--profile")
    assert result.exit_code == 0, result.output
    (row,) = store.read_table(out).to_pylist()
    assert row["status"] == "ok", row["error"]
    assert (row["warmup_steps"], row["measure_steps"]) == (1, 3)  # the profiled steps are not measured ones
    got = {k: row[f"profile_{k}"] for k in SHARES}
    assert all(v is not None and v >= 0 for v in got.values()), got
    assert sum(got.values()) == pytest.approx(100)
    # a training step multiplies and steps; two ranks wait for gloo's all-gathers (on gloo's own threads)
    assert got["gemm_pct"] > 0 and got["optimizer_pct"] > 0 and got["comm_exposed_pct"] > 0, got

    trace = out / row["trace_file"]
    assert row["trace_file"].startswith("cluster=local/") and trace.is_file()
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    labels = {e["name"] for e in events if e.get("cat") == "user_annotation"}
    assert {"sweep/step", "sweep/forward", "sweep/backward", "sweep/optimizer"} <= labels
    assert sum(e["name"] == "sweep/step" for e in events) == 3

    # the folder still reads as one dataset, the way the README says a user may read it
    assert ds.dataset(out, format="parquet", partitioning="hive").to_table().num_rows == 1
    shown = cli("results", "show", out)
    assert shown.exit_code == 0, shown.output


def test_a_trace_records_three_micro_batches_worth_of_whole_steps():
    from trainer.profiling import recorded_steps

    assert [recorded_steps(a) for a in (1, 2, 3, 4, 8)] == [3, 2, 1, 1, 1]
