"""Where the selected rows' GPU time went: `sweep results show`'s last line, the line `sweep run` ends with.

``sweep.record.cost.gpu_seconds`` walks rows as Python dicts: a million rows read into Python would cost seconds and
gigabytes. Here the same arithmetic (``cost.attempt_seconds``, × world_size, summed) is one DuckDB statement over
the ``scan.Rows`` view, reading eight columns; Python gets one row of sums and words it with ``cost.seconds_line``.
tests/test_cost.py holds the SQL to ``cost.gpu_seconds``' answer.
"""

from __future__ import annotations

from sweep.record.cost import PARTS, seconds_line
from sweep.results.query import run_sql
from sweep.results.scan import Relation

# what the arithmetic reads; a file older than a column (precompile_s: schema 1.14) reads it as null (scan.Rows)
COLUMNS = (
    "status",
    "trial_wall_s",
    "compile_time_s",
    "precompile_s",
    "warmup_steps",
    "step_time_s",
    "steps_time_s",
    "world_size",
)
# Each attempt's seconds per rank as cost.attempt_seconds counts them; a null counts as its `or` there does (0; a
# world_size of 1). Unsupported attempts never ran: their rows are not read past the status.
_ATTEMPTS = """SELECT status, coalesce(nullif(world_size, 0), 1) AS ranks, coalesce(trial_wall_s, 0) AS wall,
  coalesce(compile_time_s, 0) + coalesce(precompile_s, 0) AS compile,
  coalesce(warmup_steps, 0) * coalesce(step_time_s, 0) AS warmup,
  -- with no warm-up step, the first measured step compiled: its excess is compile, not measured
  greatest(0, coalesce(steps_time_s, 0)
    - CASE WHEN coalesce(warmup_steps, 0) = 0 THEN coalesce(compile_time_s, 0) ELSE 0 END) AS measured
FROM rows WHERE status IN ('ok', 'oom', 'error', 'timeout')"""
_PART_SQL = {
    "measured steps": "CASE WHEN status = 'ok' THEN measured END",
    "warm-up": "CASE WHEN status = 'ok' THEN warmup END",
    "compile": "CASE WHEN status = 'ok' THEN compile END",
    # subtracted in cost's order, so that a row's start-up is the same double; clamped at 0 as there
    "start-up": "CASE WHEN status = 'ok' THEN greatest(0, wall - compile - warmup - measured) END",
    "OOM attempts": "CASE WHEN status = 'oom' THEN wall END",
    "failed attempts": "CASE WHEN status IN ('error', 'timeout') THEN wall END",
}


def gpu_seconds(rows: Relation) -> dict[str, float]:
    """GPU-seconds of every row of ``rows`` (the view or an Arrow table, with COLUMNS) by part, as
    ``cost.gpu_seconds``: one read of the rows, in DuckDB."""
    # by cost.PARTS: a part added there and not here is a KeyError, not a part silently left at 0
    sums = ", ".join(f'coalesce(sum(({_PART_SQL[p]}) * ranks), 0)::DOUBLE AS "{p}"' for p in PARTS)
    found = run_sql(f"WITH a AS ({_ATTEMPTS}) SELECT {sums} FROM a", rows=rows).to_pylist()[0]
    return {p: found[p] for p in PARTS}


def summary_line(rows: Relation) -> str | None:
    """'GPU time: 63 GPU-s held — measured steps 47 %, ...' over every row of ``rows``; None when none ran."""
    return seconds_line(gpu_seconds(rows))
