"""Max-batch verdicts that thrash: under an 80 GiB cap a Qwen-7B-sized fp8 trial at batch 2 ran at 351
TFLOP/s with 40 allocator retries (671 uncapped). It fits, but only by freeing the cache and retrying:
the verdicts show the allocator's retries at the largest and the fastest batch and say so."""

from __future__ import annotations

import csv
import io
import json

from conftest import invoke

from sweep.record.schema import TRAINING_DEFAULTS
from sweep.record.store import write_row

BASE = {
    "run_id": "r1",
    "attempt": 1,
    "cluster": "h200",
    "accelerator": "h200",
    "world_size": 2,
    "model": "qwen-7b",
    "compile": "regional",
    "ac": "none",
    "seq_len": 4096,
    "memory_cap_gib": 80.0,
    **TRAINING_DEFAULTS,
}
# (precision, batch, status, TFLOP/s, allocator retries)
ROWS = [
    ("fp8-torchao", 1, "ok", 340.0, 0),
    ("fp8-torchao", 2, "ok", 351.0, 40),
    ("fp8-torchao", 4, "oom", None, None),
    ("bf16", 1, "ok", 420.0, 3),
    ("bf16", 2, "ok", 400.0, 12),
    ("bf16", 4, "oom", None, None),
    ("fp8-te", 1, "ok", 450.0, 0),
    ("fp8-te", 2, "ok", 470.0, 0),
    ("fp8-te", 4, "oom", None, None),
]


def _write(tmp_path) -> None:
    for i, (precision, batch, status, tflops, retries) in enumerate(ROWS):
        write_row(
            tmp_path,
            {
                **BASE,
                "trial_id": f"t{i}",
                "precision": precision,
                "batch_size": batch,
                "status": status,
                "tflops_per_gpu": tflops,
                "alloc_retries": retries,
            },
        )


def _invoke(*args) -> str:
    res = invoke("results", *args)
    assert res.exit_code == 0, res.output
    return res.stdout


def test_results_max_batch_shows_retries_and_says_it_thrashes(tmp_path):
    _write(tmp_path)
    lines = [line for line in _invoke("max-batch", tmp_path, "-f", "md").splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    got = {
        r["precision"]: r
        for r in (dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:])
    }

    def cells(p):
        return (
            got[p]["max ok batch"],
            got[p]["fastest batch"],
            got[p]["alloc retries @max"],
            got[p]["alloc retries @fastest"],
            got[p]["allocator"],
        )

    assert cells("fp8-torchao") == ("2", "2", "40", "40", "batch 2 fits, but the allocator thrashes (40 retries)")
    assert cells("bf16") == (
        "2",
        "1",
        "12",
        "3",
        "batch 2 fits, but the allocator thrashes (12 retries); batch 1 fits, but the allocator thrashes (3 retries)",
    )
    assert cells("fp8-te") == ("2", "2", "0", "0", "")
    table = {r["precision"]: r for r in csv.DictReader(io.StringIO(_invoke("max-batch", tmp_path, "-f", "csv")))}
    assert (table["bf16"]["alloc_retries_at_max"], table["bf16"]["alloc_retries_at_fastest"]) == ("12", "3")
    assert "fits, but the allocator thrashes (40 retries)" in _invoke("max-batch", tmp_path)  # the terminal table


def test_no_allocator_column_when_nothing_thrashes(tmp_path):
    _write(tmp_path)
    text = _invoke("max-batch", tmp_path, "-f", "md", "--where", "precision=fp8-te")
    assert "alloc retries @max" in text and "allocator |" not in text and "thrashes" not in text


def test_search_verdicts_show_retries_and_say_it_thrashes(tmp_path, capsys):
    """The table `sweep max-batch` prints after its search. On CPU ranks the allocator reports no retries,
    so a real CPU search cannot thrash: the verdicts and rows are given as the search hands them over."""
    from sweep.commands._outcome import write_verdicts
    from sweep.search.max_batch_verdict import MaxBatchVerdict

    def verdict(search_id: str, precision: str, largest: int, fastest: int) -> MaxBatchVerdict:
        return MaxBatchVerdict(
            search_id=search_id,
            model="qwen-7b",
            precision=precision,
            compile="regional",
            ac="none",
            seq_len=4096,
            gpus=2,
            options="",
            max_batch=largest,
            first_failing_batch=4,
            fastest_batch=fastest,
            probes=3,
            probe_batches=(1, 2, 4),
            aborted=None,
        )

    rows = [
        {
            "search_id": sid,
            "batch_size": batch,
            "status": status,
            "alloc_retries": retries,
            "tflops_per_gpu": tflops,
            "trial_wall_s": 10.0,
        }
        for sid, rows_ in (("s-fp8", ROWS[:3]), ("s-bf16", ROWS[3:6]), ("s-te", ROWS[6:]))
        for _, batch, status, tflops, retries in rows_
    ]
    verdicts = [verdict("s-fp8", "fp8-torchao", 2, 2), verdict("s-bf16", "bf16", 2, 1), verdict("s-te", "fp8-te", 2, 2)]
    write_verdicts(tmp_path, "run1", verdicts, rows)
    out = " ".join(capsys.readouterr().out.split())
    assert "alloc retries @max" in out and "alloc retries @fastest" in out
    assert "batch 2 fits, but the allocator thrashes (40 retries)" in out
    assert "batch 1 fits, but the allocator thrashes (3 retries)" in out
    saved = {v["precision"]: v for v in json.loads((tmp_path / "_search" / "run1.json").read_text())}
    assert (saved["bf16"]["alloc_retries_at_max"], saved["bf16"]["alloc_retries_at_fastest"]) == (12, 3)
    assert (saved["fp8-te"]["alloc_retries_at_max"], saved["fp8-te"]["allocator"]) == (0, "")
