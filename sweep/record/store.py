"""Writing and reading the Parquet result dataset.

Layout: ``<output>/cluster=<name>/run=<run_id>/<trial_id>.parquet``, one file per attempt, each
written to a dot-prefixed temp file and renamed into place, so a crash never leaves a half file and
a reader never sees one (pyarrow.dataset ignores names starting with '.' or '_'). When a run ends its attempts
are merged into fewer files (``sweep.record.compact``: ``run=<run_id>/merged-L0-*.parquet``, then
``cluster=<name>/merged-L<n>-*.parquet``): the same rows. The whole folder
reads as one ``pyarrow.dataset``; cluster and run_id are also real columns in every file.
A max-batch search also leaves its verdicts in ``<output>/_search/<run_id>.json``, written the same way
(the leading '_' keeps them out of the dataset). A profiled attempt's trace lies beside its row, in
``cluster=<name>/run=<run_id>/_traces/<trial_id>.pt.trace.json.gz`` (out of the dataset for the same reason;
the ``.pt.trace.json.gz`` ending is the one TensorBoard's profiler plugin looks for; Perfetto opens it as is).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pyarrow as pa
import pyarrow.parquet as pq

from sweep.errors import UserError, one_line
from sweep.record import journal
from sweep.record.schema import RESULT_SCHEMA, SCHEMA_VERSION, TRAINING_DEFAULTS, VERSION_KEY, Row, to_table

if TYPE_CHECKING:
    import pyarrow.dataset as ds

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_part(part: str) -> str:
    """A cluster name or run id as its folder name (``cluster=<this>``, ``run=<this>``)."""
    return _SAFE.sub("-", part) or "_"


_safe = safe_part


def row_path(output: Path, row: Row) -> Path:
    cluster, run_id = row["cluster"], row["run_id"]
    assert cluster is not None and run_id is not None  # every row sweep writes names both
    return Path(output) / f"cluster={_safe(cluster)}" / f"run={_safe(run_id)}" / f"{row['trial_id']}.parquet"


def write_row(output: Path, row: Row) -> Path:
    """Write one attempt atomically. Refuses to overwrite: a trial_id is written once."""
    path = row_path(output, row)
    table = to_table([row])  # a row that cannot be stored fails before its run's folder is made
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        raise FileExistsError(f"result for trial {row['trial_id']} already exists: {path}")
    _write_atomically(path, lambda tmp: pq.write_table(table, tmp))
    return path


def write_trace(output: Path, row: Row, trace_gz: bytes) -> str:
    """Record an attempt's gzipped profiler trace beside its row, atomically; its path relative to ``output``
    (the row's trace_file)."""
    path = row_path(output, row).parent / "_traces" / f"{row['trial_id']}.pt.trace.json.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, lambda tmp: tmp.write_bytes(trace_gz))
    return path.relative_to(output).as_posix()


def write_verdicts(output: Path, run_id: str, verdicts: list[dict]) -> Path:
    """Record a max-batch search's verdicts beside its rows, atomically (values JSON lacks as their text)."""
    path = Path(output) / "_search" / f"{run_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically(path, lambda tmp: tmp.write_text(json.dumps(verdicts, indent=2, default=str)))
    return path


def _write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """``write`` a dot-prefixed temp file beside ``path``, then rename it into place: no half file, ever."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as f:  # the rename is only atomic for data that reached the disk
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # a full disk, a signal: no half temp file left beside the rows
        tmp.unlink(missing_ok=True)
        raise


def result_files(output: Path) -> list[Path]:
    """The result files under ``output`` (a results folder, a cluster's or a run's), less the inputs of a merge
    that is done (``sweep.record.compact``: the journal is read after the listing, so a merge in progress shows
    either its inputs or its merged file, never both)."""
    root = Path(output)
    if not root.exists():
        return []
    listed = set(_parquet_files(root))
    journals = [root, *root.glob("cluster=*")] + ([root.parent] if root.name.startswith("run=") else [])
    gone = set().union(
        *(journal.excluded(folder, listed) for folder in journals if (folder / journal.JOURNAL).exists())
    )
    return sorted(listed - gone)


def _parquet_files(root: Path) -> Iterator[Path]:
    """Every ``*.parquet`` under ``root`` outside folders and files named ``.*`` or ``_*`` (temp files, ``_cache``,
    ``_search``, ``_traces``), by ``os.walk`` pruning those folders: ``Path.rglob`` walked a year's ~500 run folders
    in 0.5 s, the prune and the walk in a few ms."""
    for folder, dirs, names in os.walk(root, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
        yield from (Path(folder, n) for n in names if n.endswith(".parquet") and not n.startswith((".", "_")))


def _footer(path: Path) -> tuple[str | None, frozenset[str]]:
    """(why ``path`` cannot be read as a sweep result file, or None; the columns it holds)."""
    try:  # the footer's own metadata, not its Arrow schema: a third faster, and hundreds of files are read
        meta = pq.read_metadata(path)
        names = frozenset(meta.schema.column(i).path.split(".")[0] for i in range(meta.num_columns))
    except Exception as e:  # not Parquet, truncated, unreadable
        return f"not a readable Parquet file ({type(e).__name__}: {one_line(str(e))})", frozenset()
    return _version_problem(meta.metadata or {}), names


def _version_problem(meta: dict) -> str | None:
    version = meta.get(VERSION_KEY)
    if version is None:
        return f"not a sweep result file (no {VERSION_KEY.decode()} in its metadata)"
    major = version.decode().split(".")[0]
    if major != SCHEMA_VERSION.split(".")[0]:
        return (
            f"schema version {version.decode()} cannot be read by this sweep (reads {SCHEMA_VERSION.split('.')[0]}.x)"
        )
    return None


def _read_dataset(files: list[Path]) -> ds.Dataset:
    import pyarrow.dataset as ds  # here: `sweep results` reads through DuckDB and need not import it (~50 ms)

    return ds.dataset([str(f) for f in files], schema=RESULT_SCHEMA, format="parquet")


def _read(files: list[Path]) -> pa.Table:
    return _read_dataset(files).to_table()


def _read_all(files: list[Path], bad: dict[Path, str]) -> pa.Table:
    """The rows of ``files``; a file whose footer reads but whose data does not joins ``bad``."""
    try:
        return _read(files)
    except (OSError, pa.ArrowException):  # one file's pages are damaged: find which, one read each
        tables = []
        for f in files:
            try:
                tables.append(_read([f]))
            except (OSError, pa.ArrowException) as e:
                bad[f] = f"not a readable Parquet file ({type(e).__name__}: {one_line(str(e))})"
        return pa.concat_tables(tables) if tables else RESULT_SCHEMA.empty_table()


def _refuse(output: Path, bad: dict[Path, str]) -> None:
    if bad:
        path, why = next(iter(bad.items()))
        more = f"; {len(bad) - 1} more such file(s)" if len(bad) > 1 else ""
        # `sweep run --resume` reads here too: the hint must hold for both
        raise UserError(
            f"{path}: {why}{more} (move it out of {output}, or pass --skip-bad to `sweep results` to read the rest)"
        )


def check_files(output: Path, skip_bad: bool = False) -> dict[Path, frozenset[str]]:
    """Every sweep result file under ``output`` (its footer read, its version checked) with the columns it holds.

    As ``open_dataset``: a file that is no readable sweep result is a UserError naming it, or with ``skip_bad``
    left out with a warning on stderr naming it. Its data is not read (``sweep.results.scan`` reads it).
    """
    files = result_files(output)
    if not files:
        raise UserError(f"{output}: no sweep results found (expected *.parquet files written by `sweep run`)")
    footers = {f: _footer(f) for f in files}
    bad = {f: why for f, (why, _) in footers.items() if why is not None}
    if not skip_bad:
        _refuse(output, bad)
    for path, why in sorted(bad.items()):
        print(f"warning: skipped {path}: {why}", file=sys.stderr)
    if len(bad) == len(files):
        raise UserError(f"{output}: no readable sweep results ({len(bad)} file(s) skipped)")
    return {f: names for f, (why, names) in footers.items() if why is None}


def open_dataset(output: Path, skip_bad: bool = False) -> ds.Dataset:
    """All result files under ``output`` as one dataset with RESULT_SCHEMA (versions checked).

    A file that is no readable sweep result (truncated, foreign, a newer major schema) is a UserError
    naming it; with ``skip_bad`` it is left out with a warning on stderr naming it, and the rest is read.
    """
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    good = list(check_files(output, skip_bad))
    bad: dict[Path, str] = {}
    table = _read_all(good, bad)  # may find a file with damaged pages
    if not skip_bad:
        _refuse(output, bad)
    for path, why in sorted(bad.items()):
        print(f"warning: skipped {path}: {why}", file=sys.stderr)
    if len(bad) == len(good):
        raise UserError(f"{output}: no readable sweep results ({len(bad)} file(s) skipped)")
    # Older minor versions lack newer columns: the unified schema reads them as nulls. A training option a
    # row predates is what that row ran with by default, so it reads as the default: old and new rows at
    # the defaults then aggregate together, and `--where grad_accum=1` matches both. A dataset holds one
    # row per attempt (thousands at most), so it is read into memory once here.
    for name, default in TRAINING_DEFAULTS.items():
        field = RESULT_SCHEMA.field(name)
        filled = pc.fill_null(table.column(name), pa.scalar(default, type=field.type))
        table = table.set_column(table.schema.get_field_index(name), field, filled)
    # A row before schema 1.12 sharded over all its ranks (its layout options read as 1 above): dp_shard = world_size
    at = table.schema.get_field_index("dp_shard")
    table = table.set_column(
        at, RESULT_SCHEMA.field("dp_shard"), pc.coalesce(table.column("dp_shard"), table.column("world_size"))
    )
    return ds.dataset(table)


def read_table(output: Path) -> pa.Table:
    return open_dataset(output).to_table()


def existing_rows(output: Path) -> dict[str, Row]:
    """trial_id -> row for every attempt already recorded (used by --resume)."""
    if not result_files(output):
        return {}
    return {r["trial_id"]: cast(Row, r) for r in read_table(output).to_pylist()}  # the schema's columns


def read_columns(output: Path, columns: tuple[str, ...], *, cluster: str) -> list[Row]:
    """`columns` of the rows one cluster recorded under ``output`` (its `cluster=` folder alone), as dicts.
    For what only learns from rows (the memory model's calibration): no rows, or files that are no readable
    sweep results, give nothing rather than an error; `sweep results` is where those are named."""
    files = [f for f in result_files(Path(output) / f"cluster={_safe(cluster)}") if _footer(f)[0] is None]
    if not files:
        return []
    import pyarrow.compute as pc

    try:
        table = _read_dataset(files).to_table(columns=list(columns), filter=pc.field("cluster") == cluster)
        return cast(list[Row], table.to_pylist())  # rows of RESULT_SCHEMA's columns
    except (OSError, pa.ArrowException):
        return []
