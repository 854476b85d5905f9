"""The table around the cells: its columns (``Col``), the config columns folded into a caption, and the three ways
a table is printed (a Rich table on the terminal, GitHub markdown, CSV); ``render`` defines the columns' text.
"""

from __future__ import annotations

import csv
import io
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sweep.record.schema import TRAINING_DEFAULTS

if TYPE_CHECKING:
    import pyarrow as pa

DASH = "—"
CONFIG_HEADERS = {
    "cluster": "cluster",
    "model": "model",
    "precision": "precision",
    "compile": "compile",
    "ac": "ac",
    "batch_size": "batch",
    "seq_len": "seq",
    "world_size": "GPUs",
    "grad_accum": "accum",
    "grad_clip": "clip",
    "fp8_lm_head": "fp8 head",
    "reduce_dtype": "reduce",
    "grad_sync": "grad sync",
    "dynamic_batch": "dyn batch",
    "attention": "attention",
    "fp8_attention": "fp8 attn",
    "compile_mode": "compile mode",
    "fp8_pow2_scales": "pow2 scales",
    "dp_replicate": "replicas",
    "tp": "tp",
    "cp": "cp",
    "loss": "loss fn",
    "memory_cap_gib": "cap (GiB)",
}


@dataclass(frozen=True, slots=True)
class Col:
    """One output column: the row key, its header, how a row becomes text, right-aligned or not."""

    key: str
    header: str
    text: Callable[[dict], str]
    numeric: bool = True
    optional: bool = False  # left out of a table where no row has a value (rows older than the column, say)
    of_value: bool = False  # the text is a function of the row's value at `key` alone (a config column's)


def says_nothing(key: str, value: object) -> bool:
    """A config value every row shares that no caption or title needs: null everywhere (no memory cap) or a
    training option at its default."""
    return value is None or (key in TRAINING_DEFAULTS and value == TRAINING_DEFAULTS[key])


def split_constant(
    rows: list[dict], cols: list[Col], always: Sequence[str] = (), selected: Sequence[dict] | None = None
) -> tuple[list[Col], str]:
    """Drop config columns (but ``always``) with one value across ``selected`` (default ``rows``); return the rest
    and a caption.

    ``selected``: every row the table stands for when it prints only some (``--limit``), or their distinct
    configs: a caption says what holds for all of them, not for the first few. A one-row table folds too: its
    config reads as one caption line, not as a column each.
    """
    kept, caption, _ = _split(rows, cols, always, selected)
    return kept, caption


def _split(
    rows: list[dict], cols: list[Col], always: Sequence[str] = (), selected: Sequence[dict] | None = None
) -> tuple[list[Col], str, list[list[str]]]:
    """``split_constant``, and each kept column's text of every row of ``rows``: a column's text is made once, for
    the caption's test and for the table (8,064 rows of 30 columns: 0.25 s less), and over ``selected`` only for a
    config column (a terminal table of 200 pairs stands for 6,048: 0.2 s less)."""
    keep, caption, texts = [], [], []
    for col in cols:
        if col.optional and all(r.get(col.key) is None for r in rows):
            continue
        foldable = col.key in CONFIG_HEADERS and col.key not in always  # only a config column goes in the caption
        scope = rows if selected is None else selected
        if foldable and col.of_value and len({r.get(col.key) for r in scope}) == 1:
            # one value in every row is one text: fold it without making each row's (most config columns of a
            # large table are constant: 16 of 23 over 8,064 rows, ~0.1 s)
            if not says_nothing(col.key, scope[0].get(col.key)):
                caption.append(f"{col.key} {col.text(scope[0])}")
            continue
        cells = [col.text(r) for r in rows]
        values = set() if not foldable else set(cells) if selected is None else {col.text(r) for r in selected}
        if foldable and len(values) == 1:
            if not says_nothing(col.key, scope[0].get(col.key)):
                caption.append(f"{col.key} {values.pop()}")
        else:
            keep.append(col)
            texts.append(cells)
    return keep, " · ".join(caption), texts


def stdout_console():
    """A Rich console on stdout, wide when stdout is not a terminal: a pipe or log gets every cell whole."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 400, highlight=False)


def rich_table(
    rows: list[dict],
    cols: list[Col],
    title: str,
    note: str = "",
    always: Sequence[str] = (),
    selected: Sequence[dict] | None = None,
) -> None:
    """Print ``rows`` as a Rich table on stdout (wide when stdout is not a terminal, so nothing is cut); the
    caption folds what is constant over ``selected`` (``split_constant``)."""
    from rich.table import Table

    from sweep.results import plain_table

    cols, constant, texts = _split(rows, cols, always, selected)
    caption = " · ".join(p for p in (constant, note) if p) or None
    console = stdout_console()
    if not console.is_terminal and console.color_system is None:  # Rich would print plain text: draw it directly
        text = plain_table.draw(
            console, title or None, caption, [c.header for c in cols], [c.numeric for c in cols], _by_row(texts, rows)
        )
        if text is not None:
            console.file.write(text)
            return
    table = Table(title=title or None, caption=caption, title_justify="left")
    for col in cols:
        table.add_column(col.header, justify="right" if col.numeric else "left", overflow="fold")
    for row in rows:
        table.add_row(*(_styled(col, row) for col in cols))
    console.print(table)


def _styled(col: Col, row: dict) -> str:
    from rich.markup import escape

    text = escape(col.text(row))
    if col.key in ("status", "tflops_per_gpu") and row.get("status") not in (None, "ok"):
        return f"[red]{text}[/red]"
    return text


def markdown(rows: list[dict], cols: list[Col], always: Sequence[str] = (), note: str = "") -> str:
    """A GitHub-flavoured markdown table, with the caption line above it when there is one."""
    cols, caption, texts = _split(rows, cols, always)
    caption = " · ".join(p for p in (caption, note) if p)
    lines = [f"_{caption}_", ""] if caption else []
    lines.append("| " + " | ".join(c.header for c in cols) + " |")
    lines.append("|" + "|".join("---:" if c.numeric else "---" for c in cols) + "|")
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |" for cells in _by_row(texts, rows)]
    return "\n".join(lines) + "\n"


def _by_row(texts: list[list[str]], rows: list[dict]) -> list[list[str]]:
    """Column-wise cell texts as one list per row (a table without columns still has its rows)."""
    return [list(cells) for cells in zip(*texts)] if texts else [[] for _ in rows]


def csv_text(rows: list[dict], columns: Sequence[str]) -> str:
    """Plain CSV: raw values (full precision floats, empty for null), one header line."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else _csv_value(row[c]) for c in columns])
    return out.getvalue()


def csv_table(table: pa.Table) -> str:
    """``csv_text`` of every row of ``table``, made column by column: no dict per row (8,064 rows of 42 columns:
    0.3 s less)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(table.column_names)
    import pyarrow as pa

    # the csv module writes None as an empty field, as csv_text does; only a nested column can hold a list to join
    # (the others are not searched for one: 8,064 rows of 60 columns, ~0.05 s)
    columns = [
        _csv_column(column.to_pylist()) if pa.types.is_nested(column.type) else column.to_pylist()
        for column in table.columns
    ]
    writer.writerows(zip(*columns) if columns else ([] for _ in range(table.num_rows)))
    return out.getvalue()


def _csv_column(values: list) -> list:
    if any(isinstance(v, (list, tuple)) for v in values):
        return [v if v is None else _csv_value(v) for v in values]
    return values


def _csv_value(value: object) -> object:
    if isinstance(value, (list, tuple)):
        return ";".join(map(str, value))
    return value


# --- column sets of each command -----------------------------------------------------------------
