"""Loss beside speed: `results compare` shows each side's last loss, `show` and `export` the loss
from first to last step. An FP8 recipe 30 % faster whose loss does not fall is no result."""

from __future__ import annotations

import csv
import io

from conftest import invoke

from sweep.record.schema import TRAINING_DEFAULTS
from sweep.record.store import write_row

# (trial, precision, run, TFLOP/s, first loss, last loss): fp8-torchao is faster and does not train
ROWS = [
    ("a", "bf16", 1, 500.0, 11.77, 7.5),
    ("b", "bf16", 2, 510.0, 11.77, 7.25),
    ("c", "fp8-te", 1, 600.0, 11.77, 7.375),
    ("d", "fp8-torchao", 1, 650.0, 11.77, 11.9),
]


BASE = {
    "attempt": 1,
    "cluster": "h200",
    "accelerator": "h200",
    "world_size": 2,
    "model": "llama3-8b",
    "compile": "regional",
    "ac": "none",
    "batch_size": 2,
    "seq_len": 4096,
    **TRAINING_DEFAULTS,
}


def _write(tmp_path) -> None:
    for trial_id, precision, run, tflops, first, last in ROWS:
        write_row(
            tmp_path,
            {
                **BASE,
                "run_id": f"r{run}",
                "trial_id": trial_id,
                "precision": precision,
                "status": "ok",
                "tflops_per_gpu": tflops,
                "loss_first": first,
                "loss_last": last,
            },
        )
    write_row(
        tmp_path, {**BASE, "run_id": "r1", "trial_id": "e", "precision": "fp8-te", "batch_size": 8, "status": "oom"}
    )


def _invoke(*args) -> str:
    res = invoke("results", *args)
    assert res.exit_code == 0, res.output
    return res.stdout


def _md_rows(text: str) -> list[dict]:
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


def test_compare_shows_each_sides_last_loss(tmp_path):
    _write(tmp_path)
    got = {r["precision"]: r for r in _md_rows(_invoke("compare", tmp_path, "-f", "md", "--where", "batch_size=2"))}
    # bf16's two runs aggregate to their median, as its TFLOP/s do
    assert (got["fp8-torchao"]["vs bf16"], got["fp8-torchao"]["last loss"], got["fp8-torchao"]["bf16 last loss"]) == (
        "1.29× (+28.7 %)",
        "11.90",
        "7.375",
    )
    assert (got["fp8-te"]["last loss"], got["fp8-te"]["bf16 last loss"]) == ("7.375", "7.375")
    table = list(csv.DictReader(io.StringIO(_invoke("compare", tmp_path, "-f", "csv"))))
    by = {(r["precision"], r["batch_size"]): r for r in table}
    assert (by[("fp8-torchao", "2")]["loss_last"], by[("fp8-torchao", "2")]["base_loss_last"]) == ("11.9", "7.375")
    assert by[("fp8-te", "8")]["loss_last"] == ""  # an OOM has no loss: empty, never zero
    assert "last loss" in _invoke("compare", tmp_path)  # the terminal table too


def test_show_and_export_carry_the_loss(tmp_path):
    _write(tmp_path)
    exported = {(r["precision"], r["batch"]): r for r in _md_rows(_invoke("export", tmp_path))}
    assert exported[("bf16", "2")]["loss first → last"] == "11.77 → 7.375"  # medians over the two runs
    assert exported[("fp8-torchao", "2")]["loss first → last"] == "11.77 → 11.90"
    assert exported[("fp8-te", "8")]["loss first → last"] == "—"
    rows = list(csv.DictReader(io.StringIO(_invoke("export", tmp_path, "-f", "csv"))))
    assert {(r["precision"], r["loss_first"], r["loss_last"]) for r in rows if r["batch_size"] == "2"} == {
        ("bf16", "11.77", "7.375"),
        ("fp8-te", "11.77", "7.375"),
        ("fp8-torchao", "11.77", "11.9"),
    }
    shown = _invoke("show", tmp_path, "--where", "precision=fp8-torchao")
    assert "loss first → last" in shown and "11.77 → 11.90" in shown
