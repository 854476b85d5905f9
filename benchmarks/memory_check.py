"""Predicted against measured peak memory on the GPU rows in benchmarks/history/ (sweep/memory/model.py).

    PYTHONPATH=$PWD python benchmarks/memory_check.py            # the table (markdown)
    PYTHONPATH=$PWD python benchmarks/memory_check.py --summary  # per model, precision, compile and ranks

Every clean ok row (status ok, no allocator retries) that names its model, precision, batch, sequence, ranks,
compile and peak_mem_gib, once per distinct configuration and figure. The energy rows of session 14 name no
model: they are Llama3-8B dims with 4 layers at T 4096 on one H200 (benchmarks/RESULTS.md). Calibrated errors
are leave-one-out: each row's ratio is the median of the other rows of its precision and compile mode (the
calibration before session 19; how the affine fit per config does on the same rows: benchmarks/memory_gpu_check.py).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path

from sweep.memory.calibration import Sample, leave_one_out
from sweep.memory.model import GiB, Shape, predicted_bytes
from trainer.models.specs import REGISTRY, ModelSpec

HISTORY = Path(__file__).parent / "history"
ENERGY_ROWS = "rows-2026-12-01-s14-energy-one-gpu.csv"
# names in early rows that are not registry names
ALIASES = {"llama3-8b-4l": REGISTRY["llama3-8b"].model_copy(update={"n_layers": 4, "name": "llama3-8b-4l"})}


def _spec(row: dict) -> ModelSpec | None:
    if row.get("model_spec"):
        return ModelSpec(**json.loads(row["model_spec"]))
    return REGISTRY.get(row["model"]) or ALIASES.get(row["model"])


def _clean(row: dict) -> bool:
    return (
        row.get("status") == "ok"
        and bool(row.get("peak_mem_gib"))
        and row.get("alloc_retries") in (None, "", "0", "0.0")
    )


def rows() -> list[tuple[ModelSpec, dict]]:
    """(spec, row) for every distinct clean row with all that a prediction needs."""
    seen, out = set(), []
    for path in sorted(HISTORY.glob("*.csv")):
        for row in csv.DictReader(path.open()):
            if path.name == ENERGY_ROWS:
                row = {**row, "model": "llama3-8b-4l", "seq_len": "4096", "world_size": "1"}
            need = ("model", "precision", "batch_size", "seq_len", "world_size", "compile")
            if not _clean(row) or any(not row.get(k) for k in need) or (spec := _spec(row)) is None:
                continue
            row.setdefault("ac", "none")
            row["grad_accum"] = row.get("grad_accum") or "1"
            key = (
                spec.label,
                *(row[k] for k in need[1:]),
                row["ac"],
                row["grad_accum"],
                round(float(row["peak_mem_gib"]), 2),
            )
            if key not in seen:
                seen.add(key)
                out.append((spec, row))
    return out


def shape(spec: ModelSpec, row: dict) -> Shape:
    return Shape.of_spec(
        spec,
        precision=row["precision"],
        batch_size=int(row["batch_size"]),
        seq_len=int(row["seq_len"]),
        ranks=int(row["world_size"]),
        ac=row["ac"] or "none",
        grad_accum=int(float(row["grad_accum"])),
    )


def table() -> tuple[list[list[str]], list[float], list[float]]:
    found = rows()
    samples = [
        Sample(
            precision=r["precision"],
            compile=r["compile"],
            predicted=predicted_bytes(shape(s, r)),
            measured=float(r["peak_mem_gib"]) * GiB,
        )
        for s, r in found
    ]
    loo = leave_one_out(samples)
    lines, raw_err, cal_err = [], [], []
    for (spec, r), x, cal in zip(found, samples, loo):
        raw = 100 * (x.predicted / x.measured - 1)
        raw_err.append(raw)
        cal_text = "-"
        if cal is not None:
            cal_err.append(100 * (cal / x.measured - 1))
            cal_text = f"{cal / GiB:.1f} ({cal_err[-1]:+.1f} %)"
        lines.append(
            [
                spec.label,
                r["precision"],
                r["compile"],
                r["batch_size"],
                r["seq_len"],
                r["world_size"],
                r["grad_accum"],
                f"{x.measured / GiB:.1f}",
                f"{x.predicted / GiB:.1f} ({raw:+.1f} %)",
                cal_text,
            ]
        )
    return lines, raw_err, cal_err


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary", action="store_true", help="error ranges per model, precision, compile, ranks")
    args = parser.parse_args()
    lines, raw_err, cal_err = table()
    if args.summary:
        _summary(lines)
    else:
        head = [
            "model",
            "precision",
            "compile",
            "batch",
            "seq",
            "ranks",
            "accum",
            "measured GiB",
            "predicted raw GiB (error)",
            "calibrated, leave-one-out GiB (error)",
        ]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for line in lines:
            print("| " + " | ".join(line) + " |")
    within = sum(abs(e) <= 10 for e in cal_err)
    print(
        f"\n{len(raw_err)} rows. raw error {min(raw_err):+.1f} % to {max(raw_err):+.1f} % "
        f"(median |error| {statistics.median(map(abs, raw_err)):.1f} %); calibrated leave-one-out "
        f"{min(cal_err):+.1f} % to {max(cal_err):+.1f} % "
        f"(median |error| {statistics.median(map(abs, cal_err)):.1f} %), "
        f"{within} of {len(cal_err)} within ±10 %; {len(raw_err) - len(cal_err)} rows alone of their kind"
    )


def _summary(lines: list[list[str]]) -> None:
    """One line per model, precision, compile mode and ranks: its rows' error ranges, raw and leave-one-out."""
    kinds: dict[tuple, list[tuple[float, float | None]]] = {}
    for line in lines:
        raw = float(line[8].split("(")[1].split()[0])
        cal = float(line[9].split("(")[1].split()[0]) if line[9] != "-" else None
        kinds.setdefault((line[0], line[1], line[2], line[5]), []).append((raw, cal))
    print("| model | precision | compile | ranks | rows | raw error | calibrated error (leave-one-out) |")
    print("|---|---|---|---|---:|---|---|")
    for (model, precision, comp, ranks), errs in kinds.items():
        raws = [r for r, _ in errs]
        cals = [c for _, c in errs if c is not None]
        cal_text = f"{min(cals):+.1f} … {max(cals):+.1f} %" if cals else "- (alone of its kind)"
        print(
            f"| {model} | {precision} | {comp} | {ranks} | {len(errs)} | {min(raws):+.1f} … {max(raws):+.1f} % "
            f"| {cal_text} |"
        )


if __name__ == "__main__":
    main()
