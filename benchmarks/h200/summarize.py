"""Print the rows of a sweep result folder as one line each (the figures benchmarks/RESULTS.md quotes).

    python3 benchmarks/h200/summarize.py RESULTS_DIR [--csv FILE]

Overhead = trial_wall_s (placement group placed -> last rank returned: actor start, imports, build,
init, compile, warm-up, measured steps, teardown) minus steps_time_s (the measured steps alone).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

COLS = ["model", "precision", "compile", "batch_size", "seq_len", "world_size", "grad_accum", "grad_clip",
        "fp8_lm_head", "reduce_dtype", "grad_sync", "status", "tflops_per_gpu", "mfu",
        "step_time_s", "step_time_p10_s", "step_time_p90_s", "tokens_per_s_per_gpu", "peak_mem_gib",
        "reserved_mem_gib", "alloc_retries", "loss_first", "loss_last", "init_time_s", "compile_time_s",
        "steps_time_s", "trial_wall_s", "n_params", "torch_version", "te_version", "torchao_version", "gpu_name",
        "driver_version", "cuda_version", "git_sha", "run_id", "started_at", "error"]


def rows(folder: Path) -> list[dict]:
    files = sorted(p for p in folder.rglob("*.parquet") if not p.name.startswith("."))
    if not files:
        return []
    tables = [pq.read_table(f) for f in files]
    table = pa.concat_tables(tables, promote_options="default")
    out = table.to_pylist()
    return sorted(out, key=lambda r: (str(r.get("started_at")), r["model"], r["precision"]))


def fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def main(argv: list[str]) -> None:
    folder = Path(argv[0])
    data = rows(folder)
    for r in data:
        over = (r["trial_wall_s"] - r["steps_time_s"]) if r.get("trial_wall_s") and r.get("steps_time_s") else None
        line = [f"{c}={fmt(r.get(c))}" for c in COLS[:24]] + [f"overhead_s={fmt(over)}"]
        if r.get("error"):
            line.append(f"error={str(r['error'])[:600]!r}")
        print(" ".join(line))
    if len(argv) > 2 and argv[1] == "--csv":
        with open(argv[2], "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLS, extrasaction="ignore")
            w.writeheader()
            w.writerows(data)


if __name__ == "__main__":
    main(sys.argv[1:])
