"""`sweep results export --format md` (and the md of max-batch and compare) ends with what the rows were
measured with: a table pasted in an issue without its stack cannot be reproduced. Rows are written with
``sweep.record.store.write_row`` as `sweep run` writes them; the rank-reported versions exist in ok rows only."""

from __future__ import annotations

import datetime as dt

from conftest import invoke, result_row

from sweep.record.store import write_row

T0 = dt.datetime(2025, 6, 2, 9, 0, tzinfo=dt.timezone.utc)
STACK = {
    "gpu_name": "NVIDIA H200",
    "driver_version": "570.124.06",
    "cuda_version": "cuda 12.8",
    "torch_version": "2.11.0+cu130",
    "torchao_version": "0.14.1",
    "te_version": "2.8.0",
    "ray_version": "2.50.0",
    "git_sha": "417e321abcde",
}


# Llama3-8B on two H200s, on `result_row`'s trial: no step measured, no end time (the footer reads neither).
_H200 = {
    "cluster": "h200",
    "accelerator": "h200",
    "world_size": 2,
    "model": "llama3-8b",
    "compile": "regional",
    "seq_len": 4096,
    "step_time_s": None,
    "step_time_p10_s": None,
    "step_time_p90_s": None,
    "tokens_per_s_per_gpu": None,
    "finished_at": None,
    "ray_version": STACK["ray_version"],
    "git_sha": STACK["git_sha"],
}


def _row(trial_id: str, precision: str, batch: int, minutes: int, status: str = "ok", **stack) -> dict:
    when = T0 + dt.timedelta(minutes=minutes)
    row = result_row(**_H200, trial_id=trial_id, precision=precision, batch_size=batch, status=status, started_at=when)
    if status == "ok":  # a rank reports its stack only when it ran to the end
        row.update(STACK, tflops_per_gpu=500.0 + batch, **stack)
    return row


def _export(tmp_path, *args: str) -> str:
    res = invoke("results", *args[:1], tmp_path, *args[1:])
    assert res.exit_code == 0, res.output
    return res.stdout


def _footer(text: str) -> list[str]:
    """The lines after the table."""
    lines = text.splitlines()
    last = max(i for i, line in enumerate(lines) if line.startswith("|"))
    return [line for line in lines[last + 1 :] if line]


def test_export_md_ends_with_the_stack_and_counts_what_differs(tmp_path):
    write_row(tmp_path, _row("a", "bf16", 1, 0))
    write_row(tmp_path, _row("b", "bf16", 2, 7))
    write_row(tmp_path, _row("c", "fp8-te", 1, 14, torch_version="2.10.0", te_version=None))
    write_row(tmp_path, _row("d", "fp8-te", 2, 21))
    write_row(tmp_path, _row("e", "fp8-te", 4, 95, status="oom"))  # no stack of its own: counts for ray and commit
    assert _footer(_export(tmp_path, "export", "--format", "md")) == [
        "Measured with (5 attempts, started 2025-06-02 09:00–10:35 UTC):",
        "- GPU: NVIDIA H200",
        "- driver: 570.124.06",
        "- CUDA/ROCm: cuda 12.8",
        "- torch: 2.11.0+cu130 (3 rows), 2.10.0 (1 row)",
        "- torchao: 0.14.1",
        "- Transformer Engine: 2.8.0 (3 rows), not installed (1 row)",
        "- ray: 2.50.0",
        "- sweep commit: 417e321abcde",
        "- FLOPs per token: sweep — 6·N + 12·L·H·D·T, N = every parameter, full T×T attention (PaLM app. B)",
    ]
    # --where narrows the footer with the table: the one 2.10.0 row is fp8-te batch 1
    footer = _footer(_export(tmp_path, "export", "--where", "batch_size>=2"))
    assert footer[0] == "Measured with (3 attempts, started 2025-06-02 09:07–10:35 UTC):"
    assert "- torch: 2.11.0+cu130" in footer and "- Transformer Engine: 2.8.0" in footer
    # the other markdown tables carry it too; CSV stays data only
    for args in (("max-batch", "-f", "md"), ("compare", "-f", "md")):
        assert _footer(_export(tmp_path, *args))[4] == "- torch: 2.11.0+cu130 (3 rows), 2.10.0 (1 row)", args
    csv = _export(tmp_path, "export", "--format", "csv")
    assert "Measured with" not in csv and len(csv.splitlines()) == 1 + 5


def test_rows_that_never_ran_say_so_and_days_are_named(tmp_path):
    write_row(tmp_path, _row("a", "bf16", 8, 0, status="oom"))
    write_row(tmp_path, _row("b", "bf16", 16, 60 * 24 + 5, status="oom"))
    footer = _footer(_export(tmp_path, "export"))
    assert footer[0] == "Measured with (2 attempts, started 2025-06-02 09:00 – 2025-06-03 09:05 UTC):"
    assert footer[1] == "- GPU: not recorded (no attempt ran to the end)"
    assert footer[-2] == "- sweep commit: 417e321abcde"
