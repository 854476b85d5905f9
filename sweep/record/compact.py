"""Fewer, larger result files: a run's attempts merged into one file when it ends, a cluster's runs merged
sixteen at a time.

``sweep run`` writes one file per attempt (``store.write_row``: nothing is lost on a crash). A year of sweeps is a
million attempts, and every statement of ``sweep results`` pays per file it opens (DuckDB binds each file's 100
columns: ~0.3 ms a file, so 0.15 s over 500 files and minutes over a million) whatever it reads. So, when a run
ends, ``compact`` merges its attempt files into one file in the run's folder (level 0), and once a cluster holds
FAN_IN files of one level, merges them into one file of the next level at the cluster's folder
(``cluster=<name>/merged-L<level>-<digest>.parquet``). A cluster of n runs is then at most ~FAN_IN files a level,
log₁₆ n levels: 500 runs are ~80 files. The rows are the same rows (the same columns; sorted by config in a file);
a file of an older minor schema is written with the current one, its missing columns null, which is how every
reader reads a missing column.

Crash and concurrency safety, in this order: the merged file is written to a dot-prefixed temp file and
synced; the journal (``cluster=<name>/_merges.json``) records it with its inputs; the temp file is renamed into
place; the inputs are deleted. A reader (``store.result_files``) lists the files first, then reads the journal,
and leaves out the inputs of every merged file it listed: before the rename it reads the inputs, after it the
merged file, never both. The journal's entries are dropped by the next compaction of the cluster. Compactions of
one cluster take turns (an advisory lock; a second one skips). Files being written by a run still in progress
are temp files or whole attempt files: a compaction that meets them merges the whole ones, and the run's own
compaction at its end merges the rest.
"""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sweep.record import journal

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.dataset as ds

MAX_LEVEL = 6  # FAN_IN⁶ = 16.7 million runs a cluster: no folder gets there
FAN_IN = 16  # files of one level merged at once: few enough files to read, few enough rewrites of each row
_LOCK = ".compact.lock"
_MERGED = re.compile(r"^merged-L(\d+)-[0-9a-f]{16}\.parquet$")
# rows per row group: DuckDB skips a row group by its statistics, so a group should hold few configs, and parses
# every group's statistics in each file's footer, so not too many groups. First runs at 10⁶ rows of `compare --by
# cluster` / `export -f csv` / `plot`: 1.94 / 1.74 / 2.11 s in 4,096-row groups, 1.49 / 1.47 / 1.79 in 16,384,
# 2.18 / 2.32 / 2.98 in 65,536 (`benchmarks/bench_results.py --rows 1000000 --row-group N`, RESULTS.md)
ROW_GROUP = 16_384
SORT_ROWS = 1 << 20  # a merge of at most so many rows is sorted in memory (a 16-file level 2: ~0.5 million)
SORTED_BY = ("cluster", "model", "precision", "compile", "ac", "batch_size", "seq_len", "started_at")


@dataclass
class Compaction:
    """What one ``compact`` did: files merged away and files written."""

    merged: int = 0
    written: list[Path] = field(default_factory=list)

    def __str__(self) -> str:
        return f"merged {self.merged} result file(s) into {len(self.written)}"


def level(path: Path) -> int | None:
    """The level of a merged file (``merged-L<level>-...``), None for any other (an attempt's) file."""
    found = _MERGED.match(path.name)
    return None if found is None else int(found.group(1))


def compact(output: Path, cluster_folders: Iterable[Path] | None = None) -> Compaction:
    """Merge the result files of each ``cluster=`` folder of ``output`` (all of them by default): every run folder
    of more than one file into one, then FAN_IN files of a level into one of the next, while any level holds as
    many. A cluster another process is compacting is skipped."""
    done = Compaction()
    folders = sorted(Path(output).glob("cluster=*")) if cluster_folders is None else list(cluster_folders)
    for folder in folders:
        if folder.is_dir():
            with _turn(folder) as mine:
                if mine:
                    _compact_cluster(folder, done)
    return done


def _compact_cluster(folder: Path, done: Compaction) -> None:
    from sweep.record.store import _parquet_files

    _forget(folder)  # the previous compaction's entries: their inputs are gone, no reader still needs them
    # listed once, without the journal: _forget finished every merge it names, so no listed file is a merge's input
    runs = {run: sorted(_parquet_files(run)) for run in sorted(p for p in folder.glob("run=*") if p.is_dir())}
    for run, files in runs.items():
        if len(files) > 1:
            runs[run] = [_merge(folder, files, run, 0, done)]
    units = [files[0] for files in runs.values() if len(files) == 1]  # level 0: a run folder's one file
    for at in range(MAX_LEVEL):
        if at > 0:
            units = sorted(f for f in folder.glob("merged-L*.parquet") if level(f) == at)
        for start in range(0, len(units) - FAN_IN + 1, FAN_IN):  # whole groups only: the rest waits for more
            _merge(folder, units[start : start + FAN_IN], folder, at + 1, done)


def _merge(folder: Path, inputs: list[Path], into: Path, to_level: int, done: Compaction) -> Path:
    """Write ``inputs``' rows as one file of ``to_level`` in ``into``, record it, then delete the inputs; the file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sweep.record.store import _read_dataset, _write_atomically

    names = [str(p.relative_to(folder)) for p in inputs]
    digest = hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]
    out = into / f"merged-L{to_level}-{digest}.parquet"
    dataset = _read_dataset(inputs)
    expected = sum(pq.read_metadata(p).num_rows for p in inputs)

    def write(tmp: Path) -> None:  # then synced and renamed into place (store's temp file, the store's way)
        written, pending = 0, []
        with pq.ParquetWriter(tmp, dataset.schema) as writer:
            # gathered into row groups of ROW_GROUP rows (each input's batches are its own size)
            for batch in itertools.chain(_batches(dataset, expected), [None]):
                if batch is not None:
                    pending.append(batch)
                if pending and (batch is None or sum(b.num_rows for b in pending) >= ROW_GROUP):
                    group = pa.Table.from_batches(pending, dataset.schema)
                    writer.write_table(group, row_group_size=ROW_GROUP)
                    written, pending = written + group.num_rows, []
        if written != expected:  # never delete a row: a short read keeps the inputs
            raise RuntimeError(f"merging {len(inputs)} files under {folder}: read {written} of {expected} rows")
        # recorded before the rename: a reader that lists the merged file finds what it replaced
        _write_journal(folder, [*journal.read(folder), {"output": str(out.relative_to(folder)), "inputs": names}])

    _write_atomically(out, write)
    for p in inputs:  # (an emptied run folder stays: a run still writing there may have just made it)
        p.unlink(missing_ok=True)
    done.merged += len(inputs)
    done.written.append(out)
    return out


def _write_journal(folder: Path, entries: list[dict]) -> None:
    """``folder``'s journal as ``entries`` (none: no journal), replaced whole (``store._write_atomically``)."""
    import json

    from sweep.record.store import _write_atomically

    path = folder / journal.JOURNAL
    if not entries:
        path.unlink(missing_ok=True)
        return
    _write_atomically(path, lambda tmp: tmp.write_text(json.dumps({"merges": entries}, indent=1)))


def _batches(dataset: ds.Dataset, rows: int) -> Iterator[pa.RecordBatch]:
    """The rows to write: sorted by config (SORTED_BY) when they are few enough to sort in memory, so that a
    statement after one config's rows (its loss curves) skips the row groups of the others by their statistics;
    a bigger merge streams its inputs, each sorted already, in their order."""
    if rows > SORT_ROWS:
        yield from dataset.to_batches(batch_size=ROW_GROUP)
        return
    yield from dataset.to_table().sort_by([(k, "ascending") for k in SORTED_BY]).to_batches(max_chunksize=ROW_GROUP)


def _forget(folder: Path) -> None:
    """Finish the journal's merges (an input a crash left beside its merged file is deleted) and drop them;
    an entry whose merged file never got its name is dropped (its inputs stay: they were never replaced), and so
    is a temp file a killed merge left."""
    for stale in [*folder.glob(".merged-*.tmp"), *folder.glob("run=*/.merged-*.tmp")]:
        stale.unlink(missing_ok=True)  # a merge killed midway (ours are made under the lock this one holds)
    entries = journal.read(folder)
    for entry in entries:
        if (folder / entry["output"]).exists():
            for name in entry["inputs"]:
                (folder / name).unlink(missing_ok=True)
    if entries:
        _write_journal(folder, [])


@contextmanager
def _turn(folder: Path) -> Iterator[bool]:
    """Whether this process holds the cluster's compaction lock (another compacting it: False, no wait)."""
    with open(folder / _LOCK, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
