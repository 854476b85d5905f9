"""Loading rows from a result directory: ``--where`` filters, and DuckDB SQL over the dataset.

A ``--where`` filter is ``COLUMN OP VALUE`` with OP one of ``= == != > >= < <=``; the column must be
in the result schema and the value is parsed by that column's type (``batch_size>=4``,
``precision=bf16``, ``status!=ok``, ``started_at>=2025-06-01``). ``=`` and ``!=`` take a comma list
(``precision=bf16,fp8-te``). Several filters all apply (AND). ``!=`` keeps nulls: a row whose
``compile`` is unknown is not ``compile=none``.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pyarrow as pa

from sweep.errors import UserError
from sweep.record.schema import RESULT_SCHEMA, STATUSES, TRAINING_DEFAULTS
from sweep.record.store import open_dataset
from sweep.results.scan import Relation, Rows

if TYPE_CHECKING:
    from collections.abc import Callable

    import duckdb

T = TypeVar("T")

# The columns that make two attempts "the same config": repeats of one config aggregate together.
# memory_cap_gib: a run under `--memory-cap 80GiB` answers another question than one on the whole card
CONFIG_KEYS = (
    "cluster",
    "model",
    "precision",
    "compile",
    "ac",
    "batch_size",
    "seq_len",
    "world_size",
    *TRAINING_DEFAULTS,
    "memory_cap_gib",
)


def when_ok(function: str, column: str) -> str:
    """SQL: ``function`` of ``column`` over a config's ok attempts, as a CASE that leaves the others' values NULL,
    which ``function`` skips (median, min, max, bool_and: every aggregate here but first and count). The same
    answer as ``function(column) FILTER (WHERE status = 'ok')``, in a third less CPU at 10⁶ rows (DuckDB evaluates a
    FILTER clause once per aggregate; the CASE is a cheap projection), and the same types."""
    return f"{function}(CASE WHEN status = 'ok' THEN {column} END)"


_WHERE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(>=|<=|!=|==|=|>|<)\s*(.*?)\s*$")


@dataclass(frozen=True, slots=True)
class Where:
    """One parsed ``--where`` filter."""

    text: str
    column: str
    op: str
    values: tuple


def _convert(text: str, column: str, value: str) -> object:
    typ = RESULT_SCHEMA.field(column).type
    value = value.strip().strip("'\"")
    try:
        if pa.types.is_integer(typ):
            return int(value)
        if pa.types.is_floating(typ):
            return float(value)
        if pa.types.is_timestamp(typ):
            when = dt.datetime.fromisoformat(value)
            return pa.scalar(when if when.tzinfo else when.replace(tzinfo=dt.timezone.utc), type=typ)
    except ValueError:
        kind = (
            "an integer"
            if pa.types.is_integer(typ)
            else "a number"
            if pa.types.is_floating(typ)
            else "an ISO date/time"
        )
        raise UserError(f"--where {text!r}: {column} takes {kind}, not {value!r}") from None
    if not pa.types.is_string(typ):
        raise UserError(f"--where {text!r}: {column} is a {typ} column; filter it with `sweep results query` (SQL)")
    if column == "status" and value not in STATUSES:
        raise UserError(f"--where {text!r}: status is one of {', '.join(STATUSES)}, not {value!r}")
    return value


def parse_where(text: str) -> Where:
    """``"batch_size>=4"`` -> Where. Raises UserError naming the valid columns or the expected type."""
    m = _WHERE.match(text)
    if not m or not m.group(3):
        raise UserError(
            f"--where {text!r}: expected COLUMN OP VALUE with OP one of = != > >= < <= "
            "(e.g. precision=bf16, batch_size>=4)"
        )
    column, op, raw = m.groups()
    if column not in RESULT_SCHEMA.names:
        raise UserError(f"--where {text!r}: unknown column {column!r}; valid columns: {', '.join(RESULT_SCHEMA.names)}")
    parts = raw.split(",") if op in ("=", "==", "!=") else [raw]
    return Where(text=text, column=column, op=op, values=tuple(_convert(text, column, p) for p in parts))


def load(
    directory: Path,
    where: Iterable[str] = (),
    columns: Sequence[str] | None = None,
    skip_bad: bool = False,
    row_id: bool = False,
) -> Rows:
    """The rows under ``directory`` that pass every ``where`` filter, with ``columns`` (default all), as the
    DuckDB view of ``scan.Rows``: read by each statement, never into Python.

    Raises UserError when the directory holds no results, a file is foreign or unreadable, a filter
    is malformed, or no row passes the filters (the message lists the values that do exist).
    ``skip_bad``: leave unreadable or foreign files out, with a warning (``store.check_files``).
    ``row_id``: the view has each row's ``filename`` and ``file_row_number`` too.
    """
    from sweep.results.scan import select

    wheres = [parse_where(w) for w in where]
    rows = select(Path(directory), wheres, columns or RESULT_SCHEMA.names, skip_bad, row_id)
    if rows.empty:
        raise UserError(_nothing_matches(rows, wheres, directory))
    return rows


def _nothing_matches(rows: Relation, wheres: Sequence[Where], directory: Path) -> str:
    """Name the filter that emptied the selection, with the values its column had just before it.

    The filters apply in order; the first one after which no row remains is the one to change (the others
    matched rows). ``--where precision=bf16 --where status!=ok`` on rows where every bf16 attempt ran says
    so of ``status!=ok`` (status values there: ok), not of the precision.
    """
    from sweep.results.scan import where_sql

    kept: list[Where] = []
    for w in wheres:
        if rows.sql(f"SELECT count(*) AS n FROM everything WHERE {where_sql([*kept, w])}").column("n")[0].as_py() == 0:
            break
        kept.append(w)
    values = rows.sql(f'SELECT "{w.column}" AS v FROM everything WHERE {where_sql(kept)}').column("v")
    after = f"after {' '.join(f'--where {k.text!r}' for k in kept)}: " if kept else ""
    present = _values_text(values, ranged=w.op in (">", ">=", "<", "<="))
    return f"{directory}: no results match --where {w.text!r} ({after}{w.column} values: {present})"


def _values_text(values: pa.ChunkedArray, ranged: bool, most: int = 20) -> str:
    import pyarrow.compute as pc  # only when a --where matched nothing: every command would pay ~40 ms for it

    """'bf16, fp8-te'; '1 to 4096' for numbers and times when ``ranged`` (or many); 'none set' for nulls only."""
    present = pc.unique(values).drop_null()
    if len(present) == 0:
        return "none set"
    if (ranged or len(present) > most) and not pa.types.is_string(present.type):
        bounds = pc.min_max(present)
        return f"{bounds['min'].as_py()} to {bounds['max'].as_py()}"
    shown = sorted(present.to_pylist())
    return ", ".join(map(str, shown[:most])) + (", …" if len(shown) > most else "")


@dataclass(frozen=True, slots=True)
class Bounds:
    """What one `sweep results query` statement may take: DuckDB's memory (bytes; it spills or fails past it),
    wall time (seconds; None: no limit), and the rows fetched (None: all). ``memory_text``: the option as the
    user gave it, for the message that names the bound a statement ran past."""

    memory_bytes: int
    timeout_s: float | None
    rows: int | None = None
    memory_text: str = ""


class Cancelled(Exception):
    """Ctrl-C stopped the statement (DuckDB interrupted, the connection closed)."""


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$", re.IGNORECASE)
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float | None:
    """Seconds in ``60s``, ``90``, ``2m``, ``1h``, ``500ms``; ``0``: no limit (None). Raises UserError."""
    m = _DURATION.match(text)
    if not m:
        raise UserError(f"--timeout {text!r}: expected a duration like 60s, 2m, 1h (0: no limit)")
    seconds = float(m.group(1)) * _SECONDS[(m.group(2) or "s").lower()]
    return seconds or None


def sql(directory: Path, statement: str, bounds: Bounds, skip_bad: bool = False) -> tuple[pa.Table, bool]:
    """Run ``statement`` in DuckDB with the dataset registered as the table ``results``, within ``bounds``;
    returns its first ``bounds.rows`` rows (all when None) and whether it has more.

    The connection reads the dataset and nothing else: external access is off (no COPY TO, no
    read_csv('/etc/passwd'), no ATTACH, no extension installs, no Python variables by name) and the
    configuration is locked so the statement cannot turn it back on (nor lift its memory limit). A file
    written into the results tree would break every later `sweep results` command. SQL errors become a
    UserError with DuckDB's message (the caret diagram dropped); so do a statement that runs past a bound, an
    empty one and several at once. The row limit is part of the query (a LIMIT on top of it), so
    ``SELECT * FROM range(10^11)`` stops after the rows it prints. Raises Cancelled on Ctrl-C.
    """
    import duckdb

    dataset = open_dataset(Path(directory), skip_bad)
    con = duckdb.connect()
    try:
        con.register("results", dataset)  # before the lock: registering is external access
        con.execute(f"SET memory_limit = '{bounds.memory_bytes}B'")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        try:
            _one_statement(con, statement)
            table = _bounded(con, lambda: _fetch(con, statement, bounds.rows), bounds.timeout_s)
        except duckdb.InterruptException:
            raise UserError(f"query stopped: ran past the {bounds.timeout_s:g} s timeout (--timeout)") from None
        except duckdb.OutOfMemoryException:
            raise UserError(f"query stopped: ran past the memory limit {bounds.memory_text} (--memory-limit)") from None
        except duckdb.PermissionException as e:
            raise UserError(
                f"SQL: {duckdb_message(e)} (`sweep results query` reads the table `results` only; "
                "to save its output: --format csv > FILE)"
            ) from None
        except duckdb.Error as e:
            raise UserError(f"SQL: {duckdb_message(e)}") from None
    finally:
        con.close()
    more = bounds.rows is not None and table.num_rows > bounds.rows
    return (table.slice(0, bounds.rows) if more else table), more


def _one_statement(con: duckdb.DuckDBPyConnection, statement: str) -> None:
    count = len(con.extract_statements(statement))
    if count == 0:
        raise UserError('SQL: no statement; give one, e.g. "SELECT count(*) FROM results"')
    if count > 1:
        raise UserError(f"SQL: {count} statements; `sweep results query` runs one at a time")


def _fetch(con: duckdb.DuckDBPyConnection, statement: str, rows: int | None) -> pa.Table:
    relation = con.sql(statement)  # None for a statement without a result (SET, CREATE ...)
    if relation is None:
        return pa.table({})
    # one row past the limit says whether there are more, without running the rest of the query
    return (relation.limit(rows + 1) if rows is not None else relation).to_arrow_table()


def _bounded(con: duckdb.DuckDBPyConnection, work: Callable[[], T], timeout_s: float | None) -> T:
    """``work()`` on a thread of its own, interrupted (``con.interrupt()``) past ``timeout_s`` or on Ctrl-C.

    DuckDB runs a statement with the GIL released: a Ctrl-C in the thread that waits on it would be seen only
    when the statement ended. The main thread waits instead, where Python sees the signal at once.
    """
    done: dict = {}
    finished = threading.Event()  # not Thread.join: a join that Ctrl-C broke says the thread ended (CPython 3.11)

    def run() -> None:
        try:
            done["value"] = work()
        except BaseException as e:  # re-raised in the caller's thread
            done["error"] = e
        finally:
            finished.set()

    def interrupt_until_done() -> None:
        # an interrupt reaches a statement that is running: one sent while the worker is still binding it, or
        # before DuckDB starts executing, is lost (a loaded CI machine saw Ctrl-C ignored that way), so repeat it
        while not finished.wait(0.1):
            con.interrupt()

    threading.Thread(target=run, name="sweep-query", daemon=True).start()
    try:
        finished.wait(timeout_s)
    except KeyboardInterrupt:
        interrupt_until_done()
        raise Cancelled() from None
    if not finished.is_set():
        interrupt_until_done()  # the worker ends with DuckDB's InterruptException, unless it finished just now
    if "error" in done:
        raise done["error"]
    return done["value"]


def duckdb_message(error: Exception) -> str:
    """DuckDB's message without its ``LINE 1: ... ^^^`` diagram."""
    text = str(error).split("\nLINE ")[0]
    return " ".join(text.split())


def run_sql(sql: str, params: Mapping[str, object] | None = None, **tables: pa.Table | Rows) -> pa.Table:
    """``sql`` over in-memory Arrow ``tables`` (by name) in a throwaway DuckDB: aggregation, not user queries.
    A ``scan.Rows`` among them (as ``rows``) runs it on that view's connection instead, the Arrow tables beside it."""
    import duckdb

    from sweep.results.scan import Rows

    if isinstance(tables.get("rows"), Rows):
        return tables.pop("rows").sql(sql, params, **tables)

    # one connection per thread, kept: a fresh one costs ~15 ms, and a markdown footer alone runs ten small statements
    # (provenance's, on a thread of its own: a DuckDB connection serves one thread)
    con = getattr(_ARROW_SQL, "con", None)
    if con is None:
        con = _ARROW_SQL.con = duckdb.connect()
    try:
        for name, table in tables.items():
            con.register(name, table)
        return con.sql(sql, params=dict(params or {})).to_arrow_table()
    finally:
        for name in tables:
            con.unregister(name)


_ARROW_SQL = threading.local()  # run_sql's connection in this thread (`con`), made on first use
