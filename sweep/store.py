"""Writing and reading the Parquet result dataset.

Layout: ``<output>/cluster=<name>/run=<run_id>/<trial_id>.parquet``, one file per attempt, each
written to a dot-prefixed temp file and renamed into place, so a crash never leaves a half file and
a reader never sees one (pyarrow.dataset ignores names starting with '.' or '_'). The whole folder
reads as one ``pyarrow.dataset``; cluster and run_id are also real columns in every file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from sweep.errors import UserError
from sweep.schema import RESULT_SCHEMA, SCHEMA_VERSION, TRAINING_DEFAULTS, VERSION_KEY, to_table

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _safe(part: str) -> str:
    return _SAFE.sub("-", part) or "_"


def row_path(output: Path, row: dict) -> Path:
    return Path(output) / f"cluster={_safe(row['cluster'])}" / f"run={_safe(row['run_id'])}" / f"{row['trial_id']}.parquet"


def write_row(output: Path, row: dict) -> Path:
    """Write one attempt atomically. Refuses to overwrite: a trial_id is written once."""
    path = row_path(output, row)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        raise FileExistsError(f"result for trial {row['trial_id']} already exists: {path}")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    pq.write_table(to_table([row]), tmp)
    with open(tmp, "rb") as f:  # the rename is only atomic for data that reached the disk
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def result_files(output: Path) -> list[Path]:
    root = Path(output)
    if not root.exists():
        return []
    return sorted(p for p in root.rglob("*.parquet") if not any(part.startswith((".", "_")) for part in p.relative_to(root).parts))


def _check_version(path: Path) -> None:
    try:
        meta = pq.read_schema(path).metadata or {}
    except Exception as e:  # not Parquet, truncated, unreadable
        raise UserError(f"{path}: not a readable Parquet file ({type(e).__name__}: {e})") from None
    version = meta.get(VERSION_KEY)
    if version is None:
        raise UserError(f"{path}: not a sweep result file (no {VERSION_KEY.decode()} in its metadata)")
    major = version.decode().split(".")[0]
    if major != SCHEMA_VERSION.split(".")[0]:
        raise UserError(f"{path}: schema version {version.decode()} cannot be read by this sweep (reads {SCHEMA_VERSION.split('.')[0]}.x)")


def open_dataset(output: Path) -> ds.Dataset:
    """All result files under ``output`` as one dataset with RESULT_SCHEMA (versions checked)."""
    files = result_files(output)
    if not files:
        raise UserError(f"{output}: no sweep results found (expected *.parquet files written by `sweep run`)")
    for f in files:
        _check_version(f)
    # Older minor versions lack newer columns: the unified schema reads them as nulls. A training option a
    # row predates is what that row ran with by default, so it reads as the default: old and new rows at
    # the defaults then aggregate together, and `--where grad_accum=1` matches both. A dataset holds one
    # row per attempt (thousands at most), so it is read into memory once here.
    table = ds.dataset([str(f) for f in files], schema=RESULT_SCHEMA, format="parquet").to_table()
    for name, default in TRAINING_DEFAULTS.items():
        field = RESULT_SCHEMA.field(name)
        filled = pc.fill_null(table.column(name), pa.scalar(default, type=field.type))
        table = table.set_column(table.schema.get_field_index(name), field, filled)
    return ds.dataset(table)


def read_table(output: Path) -> pa.Table:
    return open_dataset(output).to_table()


def existing_rows(output: Path) -> dict[str, dict]:
    """trial_id -> row for every attempt already recorded (used by --resume)."""
    if not result_files(output):
        return {}
    return {r["trial_id"]: r for r in read_table(output).to_pylist()}
