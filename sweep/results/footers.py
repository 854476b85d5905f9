"""Every result file's footer checked in DuckDB, on the connection that then reads the files.

``store.check_files`` parses each footer with pyarrow, and DuckDB then parses each again when a statement first
reads the file: at a year of sweeps (500 files of 91 columns) that is two passes over 15 MB of footers. Read here
with DuckDB's own ``parquet_kv_metadata`` and ``parquet_schema`` (with ``parquet_metadata_cache`` on), each footer
is parsed once, and the statements that follow find it cached.

Only a folder whose every file is a readable sweep result of a readable version passes here. Anything else
(a file DuckDB cannot open, a foreign or newer file, no file at all) goes to ``store.check_files`` unchanged, so
every message, warning and ``--skip-bad`` decision stays its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sweep.record.schema import VERSION_KEY
from sweep.record.store import _version_problem, check_files, result_files

if TYPE_CHECKING:
    import duckdb


def checked(con: duckdb.DuckDBPyConnection, root: Path, skip_bad: bool = False) -> dict[Path, frozenset[str]]:
    """As ``store.check_files(root, skip_bad)``: every result file under ``root`` with the columns it holds."""
    import duckdb

    files = result_files(root)
    if not files:
        return check_files(root, skip_bad)
    listed = "[" + ", ".join("'" + str(f).replace("'", "''") + "'" for f in files) + "]"
    try:
        versions = dict(
            con.sql(
                f"SELECT file_name, value FROM parquet_kv_metadata({listed}) WHERE key = $key",
                params={"key": VERSION_KEY},
            ).fetchall()
        )
        schema = con.sql(
            f"SELECT file_name, name, num_children FROM parquet_schema({listed}) ORDER BY file_name, column_id"
        ).fetchall()
    except duckdb.Error:  # some file is no Parquet DuckDB can read: check_files names it
        return check_files(root, skip_bad)
    names = _top_level(schema)
    found = {}
    for f in files:
        version = versions.get(str(f))
        meta = {} if version is None else {VERSION_KEY: bytes(version)}
        if str(f) not in names or _version_problem(meta) is not None:
            return check_files(root, skip_bad)
        found[f] = names[str(f)]
    return found


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
