"""How far is the GPU memory prediction from each clean H200 row's peak: uncalibrated, by the ratio, and affine?

    PYTHONPATH=$PWD python benchmarks/memory_gpu_check.py [FOLDER ...]            # per row (markdown), then a summary
    PYTHONPATH=$PWD python benchmarks/memory_gpu_check.py --summary [FOLDER ...]  # the summary and the worst rows
    PYTHONPATH=$PWD python benchmarks/memory_gpu_check.py --no-history FOLDER ...  # the folders' rows alone

Rows: every CSV in benchmarks/history/ (campaign exports), and each FOLDER of result rows (sweep.record.store).
A CSV that names no model is read with its campaign grid's model, seq len, compile mode and ranks (its grid_name,
benchmarks/campaigns/<grid_name>.yaml; GRIDS for the files that name none). A row counts as the calibration counts
it (sweep.memory.predictor.sample: ok, a peak_mem_gib, which is the allocator's peak allocated bytes, no allocator
retries), once per distinct cluster, config, batch and figure (to 0.01 GiB): a trial copied into several folders,
or run again alike, is one row.

Each row is predicted three ways: the model uncalibrated; by the ratio (the median measured/predicted of the other
rows of its cluster, precision and compile mode: the calibration before session 19); and as
sweep.memory.calibration calibrates now (its config's affine fit where the other rows of its config span 2 batch
sizes, else the ratio of its precision, compile mode and loss). A row nothing calibrates is predicted raw, as
`sweep plan` shows it. Both calibrations are leave-one-batch-out: what a row is calibrated on leaves out the row
and every row of its config at its batch (a same-batch twin, another attention kernel say, would hand over its
answer; a plan asks about a batch not yet measured).
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when sweep is not installed

from sweep.memory.calibration import Sample, calibrate, calibrated  # noqa: E402
from sweep.memory.model import GiB  # noqa: E402
from sweep.memory.predictor import sample  # noqa: E402
from sweep.record.schema import Row  # noqa: E402
from sweep.spec.grid import load_grid  # noqa: E402
from trainer.models.specs import REGISTRY, ModelSpec  # noqa: E402

HERE = Path(__file__).parent
HISTORY, CAMPAIGNS = HERE / "history", HERE / "campaigns"
# files and grid names that name no campaign grid of their own: the grid their rows ran
GRIDS = {
    "rows-2026-12-01-s14-compile-reuse.csv": "compile-reuse/a-static",  # b-dynamic: the same model, seq and ranks
    "rows-2026-12-01-s14-energy-one-gpu.csv": "compile-reuse/a-static",  # Llama3-8B dims, 4 layers, T 4096, 1 H200
    "cold-sweep": "cold-sweep/a-grid",  # the campaign's grid before it was split into a- to d-
    "cold-sweep/one-trial": "cold-sweep/c-max-batch",  # max-batch's one measured trial of its fastest batch
}
ALIASES = {"llama3-8b-4l": REGISTRY["llama3-8b"].model_copy(update={"n_layers": 4, "name": "llama3-8b-4l"})}
INTS = ("batch_size", "seq_len", "world_size", "grad_accum", "tp", "dp_shard", "dp_replicate", "alloc_retries")


def _grid(name: str) -> dict[str, Any] | None:
    """What a campaign grid says of the rows it ran: model_spec, seq_len, compile, world_size, ac."""
    path = CAMPAIGNS / f"{GRIDS.get(name, name)}.yaml"
    if not path.is_file():
        return None
    g = load_grid(path)
    return {
        "model_spec": g.models[0].to_json(),
        "seq_len": g.seq_len[0],
        "compile": g.compile[0],
        "world_size": g.gpus[0],
        "ac": g.ac[0],
    }


@functools.cache
def campaign_models() -> dict[str, ModelSpec]:
    """The inline models of every campaign grid, by name (rows of benchmarks/history name them, not their dims)."""
    found: dict[str, ModelSpec] = {}
    for path in sorted(CAMPAIGNS.rglob("*.yaml")):
        try:
            models = load_grid(path).models
        except Exception:  # not a grid (a profile, a cluster): nothing to learn from it
            continue
        found.update({m.label: m for m in models if m.label not in REGISTRY})
    return found


def _number(v: str) -> int | float | None:
    return None if v in ("", None) else int(float(v)) if float(v).is_integer() else float(v)


def csv_row(path: Path, r: dict[str, str]) -> dict[str, Any] | None:
    """A CSV row as a result row for `sample` (its spec from the row, the registry or its campaign grid); None
    where nothing says what model it ran."""
    row: dict[str, Any] = {str(k): v for k, v in r.items() if k is not None and v != ""}
    for k in (*INTS, "peak_mem_gib"):
        if k in row:
            row[k] = _number(row[k])
    if not row.get("model_spec"):
        name = row.get("model", "")
        spec: ModelSpec | None = REGISTRY.get(name) or ALIASES.get(name) or campaign_models().get(name)
        grid = None if spec else _grid(row.get("grid_name") or path.name)
        if spec is None and grid is None:
            return None
        row = {**(grid or {}), **row} if spec is None else {**row, "model_spec": spec.to_json()}
    if "world_size" not in row or "seq_len" not in row or "compile" not in row:
        return None
    ranks = row["world_size"] // (row.get("tp") or 1) // (row.get("dp_replicate") or 1)
    return {"loss": "full", "ac": "none", "grad_accum": 1, "tp": 1, "dp_shard": ranks, **row}


@dataclass(frozen=True)
class Measured:
    """One distinct clean row: where it came from, what it ran, and its sample."""

    source: str
    cluster: str
    row: dict[str, Any]
    sample: Sample

    @property
    def batch(self) -> int:
        return int(self.row["batch_size"])

    def same_batch(self, other: Measured) -> bool:
        return self.cluster == other.cluster and self.sample.config == other.sample.config and self.batch == other.batch


def measured(folders: list[Path], history: bool = True) -> list[Measured]:
    """Every distinct clean row of benchmarks/history/*.csv (`history`) and of `folders`."""
    from sweep.record import store

    found: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(HISTORY.glob("*.csv")) if history else []:
        found += [(path.name, row) for r in csv.DictReader(path.open()) if (row := csv_row(path, r)) is not None]
    for folder in folders:
        found += [(str(folder), r) for r in store.read_table(folder).to_pylist()]
    seen, out = set(), []
    for source, row in found:
        if (s := sample(cast(Row, row))) is None:
            continue
        cluster = row.get("cluster") or "?"  # rows of 2026-11-29 name none: one 2-GPU H200 host
        key = (cluster, s.config, row["batch_size"], round(s.measured / GiB, 2))
        if key not in seen:
            seen.add(key)
            out.append(Measured(source, cluster, row, s))
    return out


@dataclass(frozen=True)
class Errors:
    """One row's prediction errors, in % of its measured peak (None: nothing to calibrate it on)."""

    raw: float
    ratio: float
    """By the ratio of its cluster, precision and compile mode (the calibration before session 19), else raw."""
    now: float
    """As sweep.memory.calibration predicts it (raw where nothing calibrates it): what `sweep plan` shows."""
    how: str
    """How now predicted it: "affine 3/2" (its config's fit on 3 rows at 2 batch sizes), "ratio", "raw"."""

    def of(self, what: str) -> float:
        return {"raw": self.raw, "ratio (before)": self.ratio, "now": self.now}[what]


def errors(rows: list[Measured]) -> list[Errors]:
    """Per row, each prediction's error, calibrated leave-one-batch-out (the module's docstring)."""
    out = []
    for m in rows:
        others = [o.sample for o in rows if o.cluster == m.cluster and not o.same_batch(m)]
        before = calibrate(replace(o, config=None, parts=None) for o in others)  # (precision, compile) alone
        ratio = calibrated(before, replace(m.sample, config=None, parts=None))
        cal = calibrate(others)
        now = calibrated(cal, m.sample)
        fit = cal.fits.get(m.sample.config) if m.sample.config else None
        how = f"affine {fit.rows}/{fit.batches}" if fit else ("ratio" if now is not None else "raw")
        if m.sample.config in cal.refused:
            how += " (fit refused)"

        raw, ratio_, now_ = (100 * ((x or m.sample.predicted) / m.sample.measured - 1) for x in (None, ratio, now))
        out.append(Errors(raw, ratio_, now_, how))
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1f} %"


def table(rows: list[Measured], errs: list[Errors]) -> None:
    head = "| model | precision | compile | loss | ranks | accum | batch | measured GiB | raw | ratio | now | how |"
    print(head + "\n|" + "---|" * head.count(" | ") + "---|")
    for m, e in zip(rows, errs):
        r, spec = m.row, json.loads(m.row["model_spec"])["name"]
        print(
            f"| {spec} | {r['precision']} | {r['compile']} | {r.get('loss') or 'full'} | {r['world_size']} | "
            f"{r.get('grad_accum') or 1} | {m.batch} | {m.sample.measured / GiB:.1f} | {_pct(e.raw)} | "
            f"{_pct(e.ratio)} | {_pct(e.now)} | {e.how} |"
        )


def _line(name: str, values: list[float]) -> str:
    if not values:
        return f"- {name}: no rows"
    within = sum(abs(v) <= 10 for v in values)
    return f"- {name}: {within} of {len(values)} within ±10 %, worst {max(values, key=abs):+.1f} %"


def summary(rows: list[Measured], errs: list[Errors]) -> None:
    affine = [i for i, e in enumerate(errs) if e.how.startswith("affine")]
    print(f"\n{len(rows)} distinct clean rows; {len(affine)} of them in a config with other rows at 2 batch sizes:")
    clusters = sorted({m.cluster for m in rows})
    picks = [("all rows", list(range(len(rows)))), ("rows an affine fit predicts", affine)]
    picks += [(f"cluster {c}", [i for i, m in enumerate(rows) if m.cluster == c]) for c in clusters]
    for name, pick in picks:
        print(f"{name} ({len(pick)}):")
        for what in ("raw", "ratio (before)", "now"):
            print("  " + _line(what, [errs[i].of(what) for i in pick]))
    print("worst rows now:")
    ranked = sorted(range(len(errs)), key=lambda i: -abs(errs[i].now))
    for i in ranked[:8]:
        m, e = rows[i], errs[i]
        print(
            f"  {json.loads(m.row['model_spec'])['name']} {m.row['precision']} {m.row['compile']} "
            f"{m.row.get('loss') or 'full'} {m.row['world_size']} rank(s) batch {m.batch}: now {_pct(e.now)} "
            f"({e.how}), ratio {_pct(e.ratio)}, raw {_pct(e.raw)} [{m.source}]"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path, help="folders of result rows besides the CSVs")
    parser.add_argument("--summary", action="store_true", help="the summary and the worst rows alone")
    parser.add_argument("--no-history", action="store_true", help="the FOLDERs' rows alone, not the CSVs")
    args = parser.parse_args()
    rows = measured(args.folders, history=not args.no_history)
    errs = errors(rows)
    if not args.summary:
        table(rows, errs)
    summary(rows, errs)


if __name__ == "__main__":
    main()
