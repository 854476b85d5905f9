"""The selected rows of a results folder as a DuckDB view over its Parquet files: nothing is read into Python.

A year of sweeps on several clusters is a million rows (hundreds of files); reading them into Arrow or Python
costs seconds and gigabytes. ``select`` checks every file's footer (``footers.checked``), prunes the files a
``--where cluster=`` or ``--where run_id=`` filter rules out by their ``cluster=`` / ``run=`` folder, and defines
the view ``rows``: the columns asked for, from every file (NULL where a file of an older minor schema lacks a
column; a training option at its default, as ``store.open_dataset`` reads it), filtered by the ``--where``
filters in SQL. DuckDB then reads only the columns and row groups each statement needs, and returns small tables
(one row per config, per group, or per printed row).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import pyarrow as pa

from sweep.errors import UserError, one_line
from sweep.record.schema import RESULT_SCHEMA, TRAINING_DEFAULTS
from sweep.record.store import safe_part
from sweep.results import memo

if TYPE_CHECKING:
    from collections.abc import Mapping

    import duckdb

_SQL_TYPES = {
    pa.string(): "VARCHAR",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.float64(): "DOUBLE",
    pa.bool_(): "BOOLEAN",
    pa.timestamp("us", tz="UTC"): "TIMESTAMPTZ",
    pa.list_(pa.float64()): "DOUBLE[]",
    pa.list_(pa.int64()): "BIGINT[]",
    pa.list_(pa.string()): "VARCHAR[]",
}
UNMERGED_NOTE = 1_000
"""More attempt files than this in a folder (not merged: written before `sweep run` merged them, or by runs killed
before their end) and a command notes that `sweep results compact` would merge them: each costs every statement
~0.3 ms (sweep.record.compact), so 10^5 of them cost ~30 s a statement."""
ROW_ID = ("filename", "file_row_number")  # one attempt's place: which file, which row (for its curves, later)


def sql_type(column: str) -> str:
    return _SQL_TYPES[RESULT_SCHEMA.field(column).type]


def literal(value: object) -> str:
    """A --where value as SQL (typed as its column: a float never reads as a DECIMAL)."""
    if isinstance(value, pa.Scalar):  # a timestamp
        return f"TIMESTAMPTZ '{value.as_py().isoformat()}'"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"'{value!r}'::DOUBLE"
    return "'" + str(value).replace("'", "''") + "'"


def where_sql(wheres: Sequence) -> str:
    """``query.Where`` filters as one SQL condition (TRUE for none), with ``Where.expression``'s meaning:
    ``!=`` keeps nulls."""
    parts = []
    for w in wheres:
        col = f'"{w.column}"'
        values = ", ".join(literal(v) for v in w.values)
        if w.op in ("=", "=="):
            parts.append(f"{col} IN ({values})")
        elif w.op == "!=":
            parts.append(f"({col} NOT IN ({values}) OR {col} IS NULL)")
        else:
            parts.append(f"{col} {w.op} {literal(w.values[0])}")
    return " AND ".join(f"({p})" for p in parts) or "TRUE"


def _pruned(files: dict[Path, frozenset[str]], root: Path, wheres: Sequence) -> dict[Path, frozenset[str]]:
    """``files`` less those whose ``cluster=`` / ``run=`` folder no ``=`` filter on cluster / run_id allows."""
    for w in wheres:
        folder = {"cluster": "cluster=", "run_id": "run="}.get(w.column)
        if folder is None or w.op not in ("=", "=="):
            continue
        allowed = {folder + safe_part(str(v)) for v in w.values}
        files = {
            f: names
            for f, names in files.items()
            if not (parts := [p for p in f.relative_to(root).parts[:-1] if p.startswith(folder)]) or parts[0] in allowed
        }
    return files


def _from(files: dict[Path, frozenset[str]], columns: Sequence[str], row_id: bool) -> str:
    """SQL reading ``columns`` from every file: one read_parquet per set of files with the same columns."""
    groups: dict[frozenset[str], list[str]] = {}
    for f, names in files.items():
        groups.setdefault(names, []).append(str(f))
    selects = []
    for names, paths in groups.items():
        cols = [f'"{c}"' if c in names else f'NULL::{sql_type(c)} AS "{c}"' for c in columns]
        listed = ", ".join(literal(p) for p in paths)
        options = ", filename = true, file_row_number = true" if row_id else ""
        selects.append(
            f"SELECT {', '.join(cols)}{', filename, file_row_number' if row_id else ''} "
            f"FROM read_parquet([{listed}]{options})"
        )
    return " UNION ALL ".join(selects)


def _filled(columns: Sequence[str]) -> str:
    """The select list that reads a training option a row predates as its default (``store.open_dataset``)."""
    return ", ".join(
        f'coalesce("{c}", {literal(TRAINING_DEFAULTS[c])}) AS "{c}"' if c in TRAINING_DEFAULTS else f'"{c}"'
        for c in columns
    )


class Rows:
    """The view ``rows`` (and ``everything``: the same without the filters) on a DuckDB connection of its own.

    A file whose data cannot be read (its footer reads, its pages do not) shows when a statement first reads the
    damaged column: it is named as ``store.open_dataset`` names it, or with ``skip_bad`` left out with a warning
    and the statement run again on the rest.
    """

    def __init__(
        self,
        directory: Path,
        files: dict[Path, frozenset[str]],
        columns: Sequence[str],
        wheres: Sequence,
        row_id: bool = False,
        skip_bad: bool = False,
        con: duckdb.DuckDBPyConnection | None = None,
    ) -> None:
        self.directory, self.files, self.columns, self.wheres = Path(directory), files, list(columns), list(wheres)
        self.row_id, self.skip_bad = row_id, skip_bad
        self.con = con if con is not None else connect()
        self._count: int | None = None
        self._layers: list[tuple[Callable[[str], str], dict[str, pa.Table]]] = []
        self._state: str | None = None  # memo.state of the views and the files: where slow answers are kept
        self._build()

    def _build(self) -> None:
        read = list(dict.fromkeys([*self.columns, *(w.column for w in self.wheres)]))  # a filter reads its column
        extra = ", filename, file_row_number" if self.row_id else ""
        listed = ", ".join(f'"{c}"' for c in self.columns)
        defined = [
            f"CREATE OR REPLACE TEMP VIEW everything AS SELECT {_filled(read)}{extra} "
            f"FROM ({_from(self.files, read, self.row_id)})",
            f"CREATE OR REPLACE TEMP VIEW rows AS SELECT {listed}{extra} FROM everything "
            f"WHERE {where_sql(self.wheres)}",
        ]
        layered: dict[str, pa.Table] = {}
        for n, (select, tables) in enumerate(self._layers):
            for name, table in tables.items():
                self.con.register(name, table)
            layered |= tables
            defined += [f"ALTER VIEW rows RENAME TO rows_{n}", f"CREATE TEMP VIEW rows AS {select(f'rows_{n}')}"]
        for statement in defined:
            self.con.execute(statement)
        self._state = memo.state("\n".join(defined), self.files, layered)

    def sql(self, statement: str, params: Mapping[str, object] | None = None, **tables: pa.Table) -> pa.Table:
        """``statement`` over the view ``rows`` and the Arrow ``tables`` (by name)."""
        import duckdb

        params = dict(params or {})
        kept = None if self._state is None else memo.key(self._state, statement, params, tables)
        if kept is not None and (found := memo.get(self.directory, kept)) is not None:
            return found
        for name, table in tables.items():
            self.con.register(name, table)
        try:
            start = time.perf_counter()
            answer = self.con.sql(statement, params=params).to_arrow_table()
            if kept is not None and time.perf_counter() - start >= memo.SLOW_S:
                memo.put(self.directory, kept, answer)
            return answer
        except duckdb.Error as e:
            self._leave_out_damaged(e)
            return self.sql(statement, params, **tables)
        finally:
            for name in tables:
                self.con.unregister(name)

    def _leave_out_damaged(self, error: Exception) -> None:
        bad = _damaged(self.files, self.columns, error)
        if not self.skip_bad:
            path, why = next(iter(bad.items()))
            raise UserError(
                f"{path}: {why} (move it out of {self.directory}, or pass --skip-bad to `sweep results` "
                "to read the rest)"
            ) from None
        for path, why in sorted(bad.items()):
            print(f"warning: skipped {path}: {why}", file=sys.stderr)
        self.files = {f: n for f, n in self.files.items() if f not in bad}
        if not self.files:
            raise UserError(f"{self.directory}: no readable sweep results") from None
        self.con.execute("DROP VIEW rows")
        for n in reversed(range(len(self._layers))):
            self.con.execute(f"DROP VIEW rows_{n}")
        self._count = None
        self._build()

    def redefine(self, select: Callable[[str], str], **tables: pa.Table) -> None:
        """Make ``rows`` the SELECT ``select(name)`` over the current ``rows``, under that name (``recount``);
        ``tables`` stay registered for it."""
        self._layers.append((select, tables))
        self.con.execute("DROP VIEW rows")
        for n in reversed(range(len(self._layers) - 1)):
            self.con.execute(f"DROP VIEW rows_{n}")
        self._count = None
        self._build()

    def to_table(self) -> pa.Table:
        """Every selected row, in the files' order: for a small selection (tests, a few printed rows)."""
        return self.sql("SELECT * FROM rows")

    def column(self, name: str) -> pa.ChunkedArray:
        return self.sql(f'SELECT "{name}" FROM rows').column(name)

    def to_pylist(self) -> list[dict]:
        return self.to_table().to_pylist()

    @property
    def column_names(self) -> list[str]:
        return list(self.con.sql("SELECT * FROM rows LIMIT 0").columns)

    @property
    def empty(self) -> bool:
        """Whether no row is selected: the first selected row ends the read, where a count reads every file."""
        return self.sql("SELECT 1 AS one FROM rows LIMIT 1").num_rows == 0

    @property
    def num_rows(self) -> int:
        if self._count is None:
            self._count = self.sql("SELECT count(*) AS n FROM rows").column("n")[0].as_py()
        return self._count


# What the results' SQL reads as `rows` (query.run_sql): an Arrow table, or the view of the rows on disk
Relation: TypeAlias = pa.Table | Rows


def connect():
    """A DuckDB connection of its own, as ``Rows`` reads with it."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET enable_progress_bar = false")  # a long statement would draw one on the terminal
    # a command runs several statements over the same hundreds of files: parse each footer once, not per statement
    con.execute("SET parquet_metadata_cache = true")
    return con


def select(
    directory: Path, wheres: Sequence, columns: Iterable[str], skip_bad: bool = False, row_id: bool = False
) -> Rows:
    """The rows under ``directory`` passing ``wheres`` (``query.Where``) with ``columns``, as a ``Rows`` view."""
    from sweep.results.footers import checked

    root, con = Path(directory), connect()
    files = checked(con, root, skip_bad)  # the footers, parsed once, stay in the connection's cache
    _note_unmerged(root, files)
    return Rows(root, _pruned(files, root, wheres), list(dict.fromkeys(columns)), wheres, row_id, skip_bad, con)


_noted: set[Path] = set()


def _note_unmerged(root: Path, files: Iterable[Path]) -> None:
    """On stderr: a folder of more than UNMERGED_NOTE attempt files can be merged (`sweep results compact`)."""
    from sweep.record.compact import level

    unmerged = sum(1 for f in files if level(f) is None)
    if unmerged > UNMERGED_NOTE and root not in _noted:  # once a process: a command may select more than once
        _noted.add(root)
        print(
            f"note: {unmerged:,} result files in {root} are not merged (each slows every command); "
            f"`sweep results compact {root}` merges them, keeping every row",
            file=sys.stderr,
        )


def _damaged(files: dict[Path, frozenset[str]], columns: Sequence[str], error: Exception) -> dict[Path, str]:
    """The files whose ``columns`` do not read (one read each); a bug elsewhere re-raises ``error``."""
    import pyarrow.parquet as pq

    bad = {}
    for f, names in files.items():
        try:
            pq.read_table(f, columns=[c for c in columns if c in names])
        except (OSError, pa.ArrowException) as e:
            bad[f] = f"not a readable Parquet file ({type(e).__name__}: {one_line(str(e))})"
    if not bad:
        raise error
    return bad
