"""The options and output of `sweep results ...` (sweep.commands.results), shared by its commands' modules."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sweep.commands._common import flag
from trainer.flops import CONVENTIONS

if TYPE_CHECKING:
    from sweep.results.table_out import Col

Directory = Annotated[
    Path,
    typer.Argument(
        help="Result directory written by `sweep run` (its cluster=*/ folders of Parquet files).", show_default=False
    ),
]
Where = Annotated[
    list[str] | None,
    typer.Option(
        "--where",
        "-w",
        metavar="EXPR",
        show_default=False,
        help="Filter COLUMN OP VALUE with OP one of = != > >= < <= (precision=bf16, batch_size>=4, status!=ok, "
        "precision=bf16,fp8-te). Repeatable; all apply.",
    ),
]
SkipBad = Annotated[
    bool,
    flag(
        "--skip-bad",
        help="Read the other files when a .parquet file is unreadable or not a sweep result (a warning "
        "names each one skipped). Without it, such a file is an error.",
    ),
]


class TableFormat(str, Enum):
    table = "table"
    md = "md"
    csv = "csv"


class ExportFormat(str, Enum):
    md = "md"
    csv = "csv"


class QueryFormat(str, Enum):
    table = "table"
    csv = "csv"


class PlotMetric(str, Enum):
    tflops = "tflops"
    tokens_per_kwh = "tokens-per-kwh"


class By(str, Enum):
    precision = "precision"
    cluster = "cluster"
    compile = "compile"
    ac = "ac"
    reduce_dtype = "reduce_dtype"
    grad_sync = "grad_sync"
    tp = "tp"
    dp_replicate = "dp_replicate"
    dynamic_batch = "dynamic_batch"


# The FLOP conventions of trainer.flops (pure, light to import): how a table's TFLOP/s and MFU are counted.
# (members made from CONVENTIONS, so mypy sees none: the ignore; the default is looked up by value)
FlopConvention = Enum("FlopConvention", {name: name for name in CONVENTIONS}, type=str)  # type: ignore[misc]
SWEEP_FLOPS = FlopConvention("sweep")  # the default: this tool's own count
Flops = Annotated[
    FlopConvention,
    typer.Option(
        "--flops",
        help="Count TFLOP/s and MFU as this tool does: "
        + "; ".join(f"{name}: {text}" for name, (_, text) in CONVENTIONS.items())
        + ". Recounted from each row's model spec; the table says which.",
    ),
]
Format = Annotated[
    TableFormat, typer.Option("--format", "-f", help="table: Rich table; md: GitHub markdown; csv: raw numbers.")
]
# Rich renders about 300 table rows a second: a terminal table stops here, md and csv never do.
Limit = Annotated[
    int, typer.Option("--limit", "-n", min=0, help="Rows of a terminal table (0: all). md and csv print every row.")
]


def emit(
    rows: list[dict[str, Any]],
    cols: list[Col],
    fmt: TableFormat,
    title: str,
    note: str = "",
    always: Sequence[str] = (),
    csv_columns: list[str] | None = None,
    limit: int = 0,
    footer: Callable[[], str] | None = None,
) -> None:
    """Print ``rows`` as ``fmt``; ``footer()`` (the provenance) goes under a markdown table."""
    from sweep.results import render

    if fmt is TableFormat.table:
        selected = rows
        if limit and len(rows) > limit:
            more = f"{len(rows) - limit} more rows not printed: --limit 0 for all, or --where / --format md|csv"
            rows, note = rows[:limit], " · ".join(p for p in (note, more) if p)
        render.rich_table(rows, cols, title, note, always, selected)
    elif fmt is TableFormat.md:
        sys.stdout.write(render.markdown(rows, cols, always, note) + ("\n" + footer() if footer else ""))
    else:
        sys.stdout.write(render.csv_text(rows, csv_columns or [c.key for c in cols]))
