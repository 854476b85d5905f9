"""Every result file's footer checked in DuckDB, on the connection that then reads the files.

``store.check_files`` parses each footer with pyarrow, and DuckDB then parses each again when a statement first
reads the file: at a year of sweeps (500 files of 91 columns) that is two passes over 15 MB of footers. Read here
with DuckDB's own ``parquet_kv_metadata`` (with ``parquet_metadata_cache`` on), each footer is parsed once, and the
statements that follow find it cached; the columns come from the Arrow schema in the footer's key-value metadata.

Only a folder whose every file is a readable sweep result of a readable version passes here. Anything else
(a file DuckDB cannot open, a foreign or newer file, no file at all) goes to ``store.check_files`` unchanged, so
every message, warning and ``--skip-bad`` decision stays its own.

A folder whose every file passed is remembered (``memo``, keyed by every file's path, size, inode and times): the
next command on the same files reads no footer here (~0.2 s of 500 files), and DuckDB parses each as a statement
first reads it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from sweep.record.schema import VERSION_KEY
from sweep.record.store import _version_problem, check_files, result_files
from sweep.results import memo

_ARROW_SCHEMA = b"ARROW:schema"  # the key under which pyarrow stores a file's Arrow schema (base64 IPC)

if TYPE_CHECKING:
    import duckdb


def checked(con: duckdb.DuckDBPyConnection, root: Path, skip_bad: bool = False) -> dict[Path, frozenset[str]]:
    """As ``store.check_files(root, skip_bad)``: every result file under ``root`` with the columns it holds."""
    import duckdb

    files = result_files(root)
    if not files:
        return check_files(root, skip_bad)
    state = memo.state("footers", files, {})  # the same files, unchanged: their columns as the last command found
    kept = None if state is None else memo.key(state, "", {}, {})
    if kept is not None and (found_before := memo.get(root, kept)) is not None:
        return _from_table(found_before)
    start = time.perf_counter()
    try:
        versions, names = _versions_and_columns(con, files)
    except duckdb.Error:  # some file is no Parquet DuckDB can read: check_files names it
        return check_files(root, skip_bad)
    found = {}
    for f in files:
        version = versions.get(str(f))
        meta = {} if version is None else {VERSION_KEY: bytes(version)}
        if str(f) not in names or _version_problem(meta) is not None:
            return check_files(root, skip_bad)
        found[f] = names[str(f)]
    if kept is not None and time.perf_counter() - start >= memo.SLOW_S:  # only a folder whose every file passed
        memo.put(root, kept, _to_table(found))
    return found


def _to_table(found: dict[Path, frozenset[str]]) -> pa.Table:
    return pa.table(
        {
            "file": pa.array([str(f) for f in found], pa.string()),
            "columns": pa.array([sorted(names) for names in found.values()], pa.list_(pa.string())),
        }
    )


def _from_table(table: pa.Table) -> dict[Path, frozenset[str]]:
    files, columns = table.column("file").to_pylist(), table.column("columns").to_pylist()
    return {Path(f): frozenset(names) for f, names in zip(files, columns)}


def _versions_and_columns(
    con: duckdb.DuckDBPyConnection, files: list[Path]
) -> tuple[dict[str, bytes], dict[str, frozenset[str]]]:
    """file -> its schema version, and file -> its top-level columns.

    The columns come from the Arrow schema pyarrow stores in the footer (``ARROW:schema``), read with the version in
    one pass and grouped by value: a folder of 500 files holds a handful of distinct schemas, each decoded once. The
    Parquet schema (``parquet_schema``, one row per column per file: 0.2 s more of 500 footers) is read only for a
    file without one, or whose Arrow schema does not decode.
    """
    import base64

    listed = _listed(files)
    versions: dict[str, bytes] = {}
    names: dict[str, frozenset[str]] = {}
    for key, value, held in con.sql(
        f"""SELECT key, value, list(file_name) FROM parquet_kv_metadata({listed})
            WHERE key IN ($version, $arrow) GROUP BY key, value""",
        params={"version": VERSION_KEY, "arrow": _ARROW_SCHEMA},
    ).fetchall():
        if bytes(key) == VERSION_KEY:
            versions.update(dict.fromkeys(held, bytes(value)))
            continue
        try:
            columns = frozenset(pa.ipc.read_schema(pa.py_buffer(base64.b64decode(bytes(value)))).names)
        except (ValueError, pa.ArrowException):
            continue  # read from the Parquet schema below
        names.update(dict.fromkeys(held, columns))
    rest = [f for f in files if str(f) not in names]
    if rest:
        schema = con.sql(
            f"SELECT file_name, name, num_children FROM parquet_schema({_listed(rest)}) ORDER BY file_name, column_id"
        ).fetchall()
        names.update(_top_level(schema))
    return versions, names


def _listed(files: list[Path]) -> str:
    return "[" + ", ".join("'" + str(f).replace("'", "''") + "'" for f in files) + "]"


def _top_level(schema: list[tuple[str, str, int | None]]) -> dict[str, frozenset[str]]:
    """file -> the names of its top-level columns, from its flattened Parquet schema (root first, each element
    followed by its children: a list column's ``list`` and ``element`` are no columns of their own)."""
    by_file: dict[str, list[tuple[str, int]]] = {}
    for file, name, children in schema:
        by_file.setdefault(file, []).append((name, children or 0))
    out = {}
    for file, elements in by_file.items():
        top, i = [], 1
        for _ in range(elements[0][1]):  # the root's children
            top.append(elements[i][0])
            i = _after(elements, i)
        out[file] = frozenset(top)
    return out


def _after(elements: list[tuple[str, int]], i: int) -> int:
    """The index past element ``i`` and all its descendants."""
    end = i + 1
    for _ in range(elements[i][1]):
        end = _after(elements, end)
    return end
