"""What a slow statement over a results folder returned, kept under the folder: the same statement over the same
files returns it again without reading a row (issue 31).

A command at a year of sweeps (10⁶ rows, ~500 files) spends most of its time in one or two DuckDB statements (one
row per config: a median of each metric over every attempt, ~1 s of 2 cores), and a user runs the same commands on
the same folder again and again (`compare`, then `compare -f md`, `export`, `plot`): the rows change only when a
sweep adds a run. ``scan.Rows.sql`` asks here first; so does ``footers.checked`` for the columns of every file.

- **The key is everything the answer depends on** (``state``, ``key``): the view's SQL (which names every file it reads,
  so a file added or taken away is another key, as is another ``--where`` or ``--flops``), each file's size,
  inode, modification and change times (ns: a file rewritten in place or replaced by a rename is another key, even
  with its mtime set back, which sets the change time to now), the statement and its parameters, the Arrow tables
  it joins (their bytes), and the versions of this format, DuckDB and pyarrow.
- **Only what is worth it is kept**: a statement that took ``SLOW_S`` or more, and an answer of at most
  ``MOST_BYTES`` (one row per config, not the rows themselves).
- **Safe when two processes write at once**: an entry is written to a temporary file in the same folder, then
  renamed into place (atomic on POSIX): a reader sees a whole entry or none, and of two writers of one key the
  last rename wins (both computed the same statement over the same files). An entry that does not read (a disk
  that filled up, a crash) is a miss and is removed.
- **Bounded**: past ``MOST_ENTRIES`` entries or ``MOST_TOTAL`` bytes the least recently used go (a hit touches its
  entry); entries of older file states age out so.
- **Never an error**: a folder that cannot be written (read-only, another user's) just keeps nothing.

The entries live in ``<folder>/_cache/results/`` as Arrow IPC files (the exact schema comes back: a float stays
the same float, a BIGINT a BIGINT). ``store.result_files`` skips names that start with ``_``, so no command reads
them as results.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import pyarrow as pa

FORMAT = "1"  # bump when what a statement's answer means changes without its SQL changing (connection settings)
FOLDER = Path("_cache") / "results"
SLOW_S = 0.1  # a statement quicker than this is run again: reading an entry back costs a few ms
MOST_BYTES = 64 << 20  # an answer larger than this is rows, not a summary of them: not kept
MOST_ENTRIES = 200
MOST_TOTAL = 512 << 20
_SUFFIX = ".arrow"


def state(definition: str, files: Iterable[Path], tables: Mapping[str, pa.Table]) -> str | None:
    """What the answers over the view defined by ``definition`` (its SQL, joining ``tables``) reading ``files``
    depend on, as a digest; None when a file cannot be looked at (then nothing is kept).

    Taken before any statement reads the files: a file that changes after it was looked at is read as it is then,
    and its answer kept under a state that no later command finds."""
    import duckdb

    h = hashlib.sha256()
    for part in (FORMAT, duckdb.__version__, pa.__version__, definition):
        h.update(part.encode() + b"\0")
    try:
        for f in files:
            st = os.stat(f)
            h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}\0".encode())
    except OSError:
        return None
    _tables(h, tables)
    return h.hexdigest()


def key(state: str, statement: str, params: Mapping[str, object], tables: Mapping[str, pa.Table]) -> str:
    """The entry's name for ``statement`` (with ``params``, joining ``tables``) in ``state``."""
    h = hashlib.sha256()
    for part in (state, statement, repr(sorted(params.items()))):
        h.update(part.encode() + b"\0")
    _tables(h, tables)
    return h.hexdigest()


def _tables(h: hashlib._Hash, tables: Mapping[str, pa.Table]) -> None:
    for name, table in sorted(tables.items()):
        h.update(name.encode() + b"\0")
        h.update(_ipc(table))


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def get(directory: Path, name: str) -> pa.Table | None:
    """The answer kept under ``name``, or None."""
    path = Path(directory) / FOLDER / (name + _SUFFIX)
    try:
        with pa.OSFile(str(path), "rb") as f:
            table = pa.ipc.open_file(f).read_all()
    except FileNotFoundError:
        return None
    except (OSError, pa.ArrowException):  # a torn or foreign entry: a miss, and out of the way
        _remove(path)
        return None
    try:
        os.utime(path)  # recently used: the last to go
    except OSError:
        pass
    return table


def put(directory: Path, name: str, table: pa.Table) -> None:
    """Keep ``table`` under ``name`` (written whole, then renamed into place); nothing when it cannot be."""
    if table.nbytes > MOST_BYTES:
        return
    folder = Path(directory) / FOLDER
    # a name no other writer picks (this process, a random part), made with the folder's usual permissions: an
    # entry another user of a shared folder writes, this one reads
    temp = folder / f"tmp-{os.getpid()}-{secrets.token_hex(8)}.part"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with pa.OSFile(str(temp), "wb") as f, pa.ipc.new_file(f, table.schema) as writer:
            writer.write_table(table)
        os.replace(temp, folder / (name + _SUFFIX))
    except (OSError, pa.ArrowException):
        _remove(temp)
        return
    _evict(folder)


def _evict(folder: Path) -> None:
    """Remove the least recently used entries past the bounds, and temporary files a crash left (an hour old)."""
    entries = []
    now = time.time()
    try:
        for entry in os.scandir(folder):
            st = entry.stat()
            if entry.name.endswith(".part"):
                if now - st.st_mtime > 3600:
                    _remove(Path(entry.path))
            elif entry.name.endswith(_SUFFIX):
                entries.append((st.st_mtime, st.st_size, Path(entry.path)))
    except OSError:
        return
    entries.sort(reverse=True)
    total = 0
    for n, (_, size, path) in enumerate(entries):
        total += size
        if n >= MOST_ENTRIES or total > MOST_TOTAL:
            _remove(path)


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
