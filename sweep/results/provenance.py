"""What the rows of a table were measured with: the footer of every markdown export.

A table pasted in a GitHub issue without its stack cannot be reproduced or compared: the footer names the
GPU, driver, CUDA/ROCm runtime, torch, torchao, Transformer Engine, Ray, the sweep commit and when the
attempts started, and where the rows differ it lists each value with its row count
("torch 2.11.0+cu130 (3 rows), 2.10.0 (1 row)"), so a mixed table never passes for a uniform one.

The rank-reported fields (GPU to Transformer Engine) exist only in rows whose trial ran to the end
(status ok); the driver-side ones (Ray, commit, start time) in every row. Counts are over those rows.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa

from sweep.results.query import run_sql
from sweep.results.scan import Relation

# (column, label, counted over ok rows only, what a null means there)
FIELDS = (
    ("gpu_name", "GPU", True, "none (CPU ranks)"),
    ("driver_version", "driver", True, "none"),
    ("cuda_version", "CUDA/ROCm", True, "none"),
    ("torch_version", "torch", True, "unknown"),
    ("torchao_version", "torchao", True, "not installed"),
    ("te_version", "Transformer Engine", True, "not installed"),
    ("ray_version", "ray", False, "unknown"),
    ("git_sha", "sweep commit", False, "unknown (not a git checkout)"),
)
# power limit and clocks (`energy_view.footer_line`): how hard the GPUs were allowed to run
ENERGY = ("power_limit_w", "sm_clock_mhz", "sm_clock_max_mhz", "energy_source")
COLUMNS = ("status", "started_at", *(f[0] for f in FIELDS), *ENERGY)


def _stacks(rows: Relation) -> pa.Table:
    """The rows counted per distinct stack (FIELDS) and ok or not, with their first and last start: one read of a
    million rows, a few hundred rows out, which every bullet then counts."""
    fields = ", ".join(f[0] for f in FIELDS)
    return run_sql(
        f"""SELECT status = 'ok' AS ok, {fields}, count(*) AS n, min(started_at) AS a, max(started_at) AS b
                       FROM rows GROUP BY ALL""",
        rows=rows,
    )


def _counts(stacks: pa.Table, column: str, ok_only: bool) -> list[tuple[str | None, int]]:
    where = "WHERE ok" if ok_only else ""
    table = run_sql(
        f"SELECT {column} AS v, sum(n)::BIGINT AS n FROM rows {where} GROUP BY 1 ORDER BY n DESC, v NULLS LAST",
        rows=stacks,
    )
    return list(zip(table.column("v").to_pylist(), table.column("n").to_pylist()))


def field_text(counts: list[tuple[str | None, int]], null: str) -> str:
    """'2.13.0+cpu' when every row agrees, else '2.11.0+cu130 (3 rows), 2.10.0 (1 row)'."""
    if not counts:
        return "not recorded (no attempt ran to the end)"
    names = [(null if value is None else str(value), n) for value, n in counts]
    if len(names) == 1:
        return names[0][0]
    return ", ".join(f"{name} ({n} row{'s' if n != 1 else ''})" for name, n in names)


def _when(stacks: pa.Table) -> str:
    span = run_sql("SELECT min(a) AS a, max(b) AS b FROM rows", rows=stacks).to_pylist()[0]
    a, b = span["a"], span["b"]
    if a is None:
        return "start time not recorded"
    if a.date() == b.date():
        return (
            f"started {a:%Y-%m-%d %H:%M}"
            + ("" if b.strftime("%H:%M") == a.strftime("%H:%M") else f"–{b:%H:%M}")
            + " UTC"
        )
    return f"started {a:%Y-%m-%d %H:%M} – {b:%Y-%m-%d %H:%M} UTC"


def markdown(rows: Relation, flops: tuple[str, str] | None = None) -> str:
    """The footer for ``rows`` (at least COLUMNS): one bullet per field; ``flops`` = (convention, formula)."""
    stacks = _stacks(rows)
    n = sum(stacks.column("n").to_pylist())  # the rows counted in the same read
    lines = [f"Measured with ({n} attempt{'s' if n != 1 else ''}, {_when(stacks)}):", ""]
    for column, label, ok_only, null in FIELDS:
        lines.append(f"- {label}: {field_text(_counts(stacks, column, ok_only), null)}")
    from sweep.results.energy_view import footer_line

    power = footer_line(rows)
    if power:
        lines.append(power)
    if flops:
        lines.append(f"- FLOPs per token: {flops[0]} — {flops[1]}")
    return "\n".join(lines) + "\n"


def markdown_later(rows: Relation, flops: tuple[str, str] | None = None) -> Callable[[], str]:
    """``markdown(rows, flops)`` started on a thread of its own: call what it returns for the text (an error of the
    read is raised there). DuckDB reads without holding the GIL, so the caller formats its table meanwhile (at 10⁶
    rows, 0.3 s of Python beside 0.4 s of reads, on 2 cores)."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1, thread_name_prefix="sweep-provenance")
    try:
        return pool.submit(markdown, rows, flops).result
    finally:
        pool.shutdown(wait=False)
