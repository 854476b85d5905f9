"""Losses at the same tokens trained (``loss_at``'s rules), read in DuckDB from the rows' loss curves.

The curves (``loss_curve``, ``loss_curve_tokens``) are the largest columns of a results folder: a million rows'
would be gigabytes as Python lists. Here they stay in DuckDB: per config a table prints, the largest token count
every ok attempt's curve reached, then each curve's loss at the pair's count (interpolated between the steps
around it, as ``loss_at.Curve.at``), and the median over a config's attempts (as ``statistics.median``: the middle
one, or the mean of the middle two). Python sees one row per config.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa

from sweep.results.query import run_sql
from sweep.results.scan import Relation, sql_type

# an ok attempt's curve, as ``loss_at.Curve.of`` takes one: both lists there and not empty
# the largest token count every such curve of a config reached, inside a GROUP BY over the rows
# (aggregate.config_table's `loss_reached`). Only the tokens are read, as `count_and_tokens` reads them: a row holds
# both lists or neither (`sweep.record.rows.loss_curve_columns` writes them from the same steps), and decoding the
# losses as well costs ~0.2 s of CPU at 10⁶ rows. (A row with tokens and no losses, which only a rank that reported
# no loss at all could write, would count here and have no loss at the count below.)
# (a CASE, not a FILTER clause: as query.when_ok)
REACHED = "min(CASE WHEN status = 'ok' AND len(loss_curve_tokens) > 0 THEN loss_curve_tokens[-1] END)"
_CURVES = """SELECT {keys}, loss_curve AS l, loss_curve_tokens AS t FROM {source}
  WHERE status = 'ok' AND len(loss_curve_tokens) > 0 AND len(loss_curve) > 0"""
# the loss at x tokens of the curve (t, l): r is bisect_left(t, x) + 1 (SQL lists count from 1)
_AT = """CASE WHEN x < t[1] OR x > t[-1] THEN NULL WHEN t[r] = x THEN l[r]
  ELSE l[r - 1] + (l[r] - l[r - 1]) * (x - t[r - 1])::DOUBLE / (t[r] - t[r - 1]) END"""
_MEDIAN = """CASE WHEN len(s) = 0 THEN NULL WHEN len(s) % 2 = 1 THEN s[len(s) // 2 + 1]
  ELSE (s[len(s) // 2] + s[len(s) // 2 + 1]) / 2 END"""


def _configs(keys: Sequence[str], configs: list[tuple], extra: dict[str, list] | None = None) -> pa.Table:
    columns = {f"k{i}": pa.array([c[i] for c in configs], _arrow(k)) for i, k in enumerate(keys)}
    return pa.table({"cfg": pa.array(range(len(configs)), pa.int64()), **columns, **(extra or {})})


def _arrow(key: str) -> pa.DataType:
    from sweep.record.schema import RESULT_SCHEMA

    return pa.bool_() if key == "tuned" else RESULT_SCHEMA.field(key).type


def losses_at(
    rows: Relation,
    pairs: list[dict],
    keys: Sequence[str],
    side: Callable[[dict], tuple],
    base: Callable[[dict], tuple],
    source: str = "rows",
    printed: int | None = None,
    reached: dict[tuple, int | None] | None = None,
) -> list[dict]:
    """Each pair with ``loss_at_tokens`` (the largest count every ok curve of both its sides reached), ``loss_at``
    and ``base_loss_at`` (each side's median loss there). ``side``, ``base``: a pair's two configs as values of
    ``keys``, columns of ``source`` (SQL over the view ``rows``). ``printed``: only the first so many pairs are
    printed (a terminal table's --limit): the others get their count (the caption speaks of every pair's) but
    no losses. ``reached``: config -> its ``REACHED`` where the caller's aggregation already read it (one read of the
    curves fewer)."""
    if not pairs:
        return []
    sides, bases = [side(p) for p in pairs], [base(p) for p in pairs]  # each pair's two configs, made once
    configs = list(dict.fromkeys(sides + bases))
    index = {c: i for i, c in enumerate(configs)}
    # a key that no config here lacks matches with `=`, the same rows as IS NOT DISTINCT FROM: DuckDB then joins on
    # it by hash and filters the scan of the rows by the configs' range of it (the row groups of other clusters,
    # models ... are not decoded: their curves are the costly columns)
    held = [all(c[i] is not None for c in configs) for i in range(len(keys))]
    match = " AND ".join(f"c.{k} {'=' if held[i] else 'IS NOT DISTINCT FROM'} g.k{i}" for i, k in enumerate(keys))
    curves = _CURVES.format(keys=", ".join(keys), source=source)
    if reached is not None:
        reach = {index[c]: reached.get(c) for c in configs}
    else:
        found = run_sql(
            f"""WITH c AS ({curves})
            SELECT g.cfg, min(c.t[-1]) AS reached FROM configs g JOIN c ON {match} GROUP BY g.cfg""",
            rows=rows,
            configs=_configs(keys, configs),
        )
        reach = dict(zip(found.column("cfg").to_pylist(), found.column("reached").to_pylist()))
    ends = [(index[s], index[b]) for s, b in zip(sides, bases)]  # each pair's two configs by index
    tokens = []
    for s, b in ends:
        s_reach, b_reach = reach.get(s), reach.get(b)
        tokens.append(None if s_reach is None or b_reach is None else min(s_reach, b_reach))
    shown = list(zip(ends, tokens))[:printed]
    wanted = sorted({(i, t) for two, t in shown if t is not None for i in two})
    losses = _medians(rows, keys, configs, wanted, match, curves)
    return [
        {
            **p,
            "loss_at_tokens": t,
            "loss_at": None if t is None else losses.get((s, t)),
            "base_loss_at": None if t is None else losses.get((b, t)),
        }
        for p, (s, b), t in zip(pairs, ends, tokens)
    ]


def _medians(
    rows: Relation, keys: Sequence[str], configs: list[tuple], wanted: list[tuple[int, int]], match: str, curves: str
) -> dict[tuple[int, int], float | None]:
    """(config index, tokens) -> the median over the config's ok curves of their loss at those tokens."""
    if not wanted:
        return {}
    picked = [configs[i] for i, _ in wanted]
    targets = _configs(
        keys,
        picked,
        {"x": pa.array([t for _, t in wanted], pa.int64()), "want": pa.array([i for i, _ in wanted], pa.int64())},
    )
    found = run_sql(
        f"""WITH c AS ({curves}),
        j AS (SELECT g.want, g.x, c.t, c.l, len(list_filter(c.t, lambda v: v < g.x)) + 1 AS r
              FROM configs g JOIN c ON {match}),
        a AS (SELECT want, x, {_AT} AS v FROM j),
        m AS (SELECT want, x, list_sort(list(v) FILTER (WHERE v IS NOT NULL)) AS s FROM a GROUP BY want, x)
        SELECT want, x, {_MEDIAN} AS loss FROM m""",
        rows=rows,
        configs=targets,
    )
    return {
        (w, x): loss
        for w, x, loss in zip(
            found.column("want").to_pylist(), found.column("x").to_pylist(), found.column("loss").to_pylist()
        )
    }


def count_and_tokens(rows: Relation, keys: Sequence[str] = ()) -> tuple[int, int | None, list[dict]]:
    """The view's row count, the largest token count the loss curve of every ok row reached
    (``loss_at.common_tokens``), and ``key_spans`` of ``keys``: one read of the rows for all."""
    spans = "".join(f', min("{k}") AS "lo_{k}", max("{k}") AS "hi_{k}", count("{k}") AS "n_{k}"' for k in keys)
    found = run_sql(
        f"""SELECT count(*) AS n, min(loss_curve_tokens[-1])
                         FILTER (WHERE status = 'ok' AND len(loss_curve_tokens) > 0) AS tokens{spans} FROM rows""",
        rows=rows,
    ).to_pylist()[0]
    return found["n"], found["tokens"], key_spans(found, keys)


def key_spans(found: dict, keys: Sequence[str]) -> list[dict]:
    """Stand-ins for the distinct configs of the rows, from each key's least and greatest value and whether some rows
    lack it (``lo_K``, ``hi_K``, ``n_K`` of ``found``, with ``n`` the rows): a key holds one value in every row
    exactly when it does in the stand-ins. A caption (``table_out.split_constant``) asks no more of the configs, and
    a ``SELECT DISTINCT`` of the keys of a million rows costs 0.3 s; a value's text rises with the value (numbers to
    their significant figures), so least and greatest with the same text enclose no other."""
    least = {k: found[f"lo_{k}"] for k in keys}
    return [
        least,
        {k: found[f"hi_{k}"] for k in keys},
        {k: None if found[f"n_{k}"] < found["n"] else least[k] for k in keys},
    ]


def row_curves(rows: Relation, printed: list[dict]) -> list[dict]:
    """``printed`` (rows of the view with ``filename`` and ``file_row_number``) with their loss curves, read from
    their files alone."""
    if not printed:
        return printed
    ids = pa.table(
        {
            "filename": [r["filename"] for r in printed],
            "file_row_number": pa.array([r["file_row_number"] for r in printed], pa.int64()),
        }
    )
    files = sorted(set(ids.column("filename").to_pylist()))
    listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
    found = rows.sql(
        f"""SELECT p.filename, p.file_row_number, {_curve_columns(rows, files)}
        FROM read_parquet([{listed}], filename = true, file_row_number = true, union_by_name = true) p
        SEMI JOIN ids USING (filename, file_row_number)""",
        ids=ids,
    ).to_pylist()
    curves = {(r["filename"], r["file_row_number"]): r for r in found}
    return [
        {
            **r,
            **{
                k: curves.get((r["filename"], r["file_row_number"]), {}).get(k)
                for k in ("loss_curve", "loss_curve_tokens")
            },
        }
        for r in printed
    ]


def _curve_columns(rows: Relation, files: list[str]) -> str:
    """The curve columns of ``files``; NULL for one that no file has (every file older than schema 1.9)."""
    from pathlib import Path

    held = set().union(*(rows.files.get(Path(f), frozenset()) for f in files))
    return ", ".join(
        f"p.{c} AS {c}" if c in held else f"NULL::{sql_type(c)} AS {c}" for c in ("loss_curve", "loss_curve_tokens")
    )
