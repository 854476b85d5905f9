"""`sweep results ...`: read a result directory back as tables, comparisons, exports and plots.

Every command takes the directory `sweep run` wrote (``<dir>/cluster=*/run=*/*.parquet``; several
runs and clusters may share it). The work lives in ``sweep.results``; pyarrow, DuckDB and matplotlib
are imported inside the commands so that ``sweep --help`` stays instant.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from sweep.commands._common import user_errors
from sweep.commands.results_compare import compare
from sweep.commands.results_options import (
    SWEEP_FLOPS,
    Directory,
    ExportFormat,
    Flops,
    Format,
    Limit,
    PlotMetric,
    QueryFormat,
    SkipBad,
    TableFormat,
    Where,
    emit,
)
from sweep.errors import UserError
from sweep.results.plot_layout import MAX_SERIES

app = typer.Typer(no_args_is_help=True, help="Aggregate, compare, export and plot result datasets.")


@app.command()
@user_errors
def show(
    directory: Directory,
    where: Where = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=0, help="Rows to print (0: all).")] = 50,
    flops: Flops = SWEEP_FLOPS,
    skip_bad: SkipBad = False,
) -> None:
    """Print result rows (one per attempt): config, status, TFLOP/s/GPU, MFU, step time and its interval, memory,
    energy where measured, loss (first → last, and at the tokens trained every ok row reached), error.

    Then where the selected rows' GPU time went (every row --where selects, not only those printed), as `sweep run`
    says it: measured steps, warm-up, compile, start-up, OOM and failed attempts."""
    from sweep.results import aggregate, energy_view, gpu_time, intervals, loss_at, recount, render

    cols = energy_view.with_energy(render.SHOW_COLS, energy_view.SHOW_COLS, before="loss_last")
    columns = [c.key for c in cols if c is not render.LOSS_AT] + [
        "loss_first",
        "started_at",
        "run_id",
        *aggregate.LOSS_CURVES,
        *gpu_time.COLUMNS,
    ]
    table = aggregate.load_rows(directory, where or (), skip_bad, columns, flops.value, row_id=True)
    rows, tokens, total, configs = aggregate.show_rows(table, limit)  # tokens, total, configs: every selected row
    rows = [{**r, "loss_at": loss_at.row_at(r, tokens)} for r in rows]
    more = "" if total <= len(rows) else f"{total - len(rows)} more rows not printed: --limit 0 for all, or --where"
    losses_at = loss_at.note(set() if tokens is None else {tokens}, "every ok row")
    notes = (recount.caption(flops.value), intervals.ci_note(rows), losses_at, more)
    render.rich_table(
        rows,
        cols,
        f"{directory}: {len(rows)} of {total} rows",
        note=" · ".join(p for p in notes if p),
        selected=configs,
    )
    if gpu_time_line := gpu_time.summary_line(table):  # None: no selected row ran (all unsupported)
        typer.echo(gpu_time_line)


@app.command("max-batch")
@user_errors
def max_batch(
    directory: Directory,
    where: Where = None,
    fmt: Format = TableFormat.table,
    limit: Limit = 200,
    flops: Flops = SWEEP_FLOPS,
    skip_bad: SkipBad = False,
) -> None:
    """Largest batch that fits per model × precision × compile × ac × seq_len × GPUs × cluster.

    Also the smallest batch above it that ran out of memory, and the fastest batch (highest median
    TFLOP/s/GPU) with its TFLOP/s/GPU and MFU; the allocator's retries at both, and "fits, but the
    allocator thrashes (N retries)" where it retried (the batch fits only by stalling).
    """
    from sweep.results import aggregate, provenance, recount, render

    rows = aggregate.load_rows(directory, where or (), skip_bad, provenance.COLUMNS, flops.value)
    table = aggregate.max_batch_table(aggregate.config_table(rows, aggregate.MAX_BATCH_INPUTS))
    groups = table.to_pylist()
    emit(
        groups,
        render.max_batch_cols(groups),
        fmt,
        f"{directory}: largest batch per GPU that fits",
        recount.caption(flops.value),
        csv_columns=table.column_names,
        limit=limit,
        footer=lambda: provenance.markdown(rows, recount.formula(flops.value)),
    )


app.command()(compare)  # sweep.commands.results_compare


@app.command()
@user_errors
def compact(directory: Directory) -> None:
    """Merge the result files into fewer: each run's attempts into one file, then sixteen files of a level into one
    (`sweep run` does this when a run ends). The same rows; every command reads fewer files. For folders written
    before sweep merged them, or by runs that were killed before they ended."""
    from sweep.record import compact as merging
    from sweep.record.store import result_files

    before = len(result_files(directory))
    if not before:
        raise UserError(f"{directory}: no sweep results found (expected *.parquet files written by `sweep run`)")
    done = merging.compact(directory)
    print(f"{directory}: {done}; {len(result_files(directory))} result file(s) now (were {before})")


@app.command()
@user_errors
def verdicts(directory: Directory) -> None:
    """Print the verdicts the searches saved in the directory (_search/*.json), as each printed them when it ended.

    The largest batch per config (`sweep max-batch`) and the fastest configuration per model × precision
    (`search: fastest`): best against baseline, speedup, probes and cost, and where the best's step time goes.
    """
    from sweep.results import verdicts as saved

    found = saved.load(directory)
    if not found:
        raise UserError(
            f"{directory}: no saved search verdicts (_search/*.json); `sweep max-batch` and grids with "
            "`search: fastest` write them"
        )
    saved.print_tables(found)


@app.command()
@user_errors
def export(
    directory: Directory,
    fmt: Annotated[
        ExportFormat,
        typer.Option("--format", "-f", help="md: table to paste in a GitHub issue; csv: the same numbers, unrounded."),
    ] = ExportFormat.md,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write here instead of stdout.", show_default=False)
    ] = None,
    where: Where = None,
    flops: Flops = SWEEP_FLOPS,
    skip_bad: SkipBad = False,
) -> None:
    """One line per config: median TFLOP/s/GPU, spread, MFU, step time and its interval, tokens/s/GPU, peak memory,
    loss, n.

    The markdown ends with what the rows were measured with (GPU, driver, CUDA/ROCm, torch, torchao,
    Transformer Engine, Ray, sweep commit, start times), each value with its row count where rows differ.
    """
    from sweep.results import aggregate, energy, energy_view, intervals, provenance, recount, render

    if out is not None:
        _out_file(out, f"export.{fmt.value}")
    attempts = aggregate.load_rows(directory, where or (), skip_bad, provenance.COLUMNS, flops.value)
    # md prints EXPORT_COLS (no DuckDB work for the rest); csv every column
    shown = None if fmt is ExportFormat.csv else aggregate.EXPORT_INPUTS
    table = energy.drop_empty(aggregate.config_table(attempts, shown))
    if fmt is ExportFormat.md:
        footer = provenance.markdown_later(attempts, recount.formula(flops.value))  # read while the table is made
        rows = table.to_pylist()
        note = " · ".join(p for p in (recount.caption(flops.value), intervals.ci_note(rows)) if p)
        cols = energy_view.with_energy(render.EXPORT_COLS, energy_view.EXPORT_COLS, before="peak_mem_gib")
        text = render.markdown(rows, cols, note=note) + "\n" + footer()
    else:
        text = render.csv_table(table)
    if out is None:
        sys.stdout.write(text)
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except OSError as e:
        raise UserError(f"--out {out}: {e.strerror or e}") from None
    typer.echo(f"wrote {out} ({table.num_rows} configs)", err=True)


@app.command()
@user_errors
def plot(
    directory: Directory,
    out: Annotated[Path, typer.Option("--out", "-o", help="Image file (.png, .svg, .pdf).", show_default=False)],
    where: Where = None,
    skip_bad: SkipBad = False,
    metric: Annotated[
        PlotMetric,
        typer.Option(
            "--metric",
            help="The top panels' y axis: tflops (TFLOP/s/GPU) or tokens-per-kwh (energy efficiency, "
            "where rows measured energy).",
        ),
    ] = PlotMetric.tflops,
    max_series: Annotated[
        int,
        typer.Option(
            "--max-series",
            min=0,
            help="The most series a model's panels may have (more: narrow them with --where; 0: no limit).",
        ),
    ] = MAX_SERIES,
) -> None:
    """Plot TFLOP/s/GPU (or tokens per kWh: --metric) vs batch size per series and, below it, the largest batch
    that fits.

    One image, a pair of panels per model in rows of up to three: the top panel marks OOM batches with an x on
    the zero line; the bottom panel is the max-batch bar chart, a bar per series.
    """
    from sweep.results import plot as plotting

    _out_file(out, "plot.png")
    path = plotting.plot(directory, out, where or (), skip_bad, metric=metric.value, max_series=max_series)
    typer.echo(f"wrote {path}", err=True)


@app.command()
@user_errors
def query(
    directory: Directory,
    statement: Annotated[
        str,
        typer.Argument(
            metavar="SQL", help="DuckDB SQL over the table `results` (one row per attempt).", show_default=False
        ),
    ],
    fmt: Annotated[
        QueryFormat, typer.Option("--format", "-f", help="table: Rich table; csv: every row.")
    ] = QueryFormat.table,
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=0, help="Rows to print as a table (0: all); the query stops after them.")
    ] = 100,
    memory_limit: Annotated[
        str,
        typer.Option(
            "--memory-limit",
            help="DuckDB's memory for the statement (e.g. 2GB, 512MiB); past it DuckDB spills to "
            "disk or the statement stops.",
        ),
    ] = "2GB",
    timeout: Annotated[
        str, typer.Option("--timeout", help="Stop the statement after this long (e.g. 60s, 5m; 0: no limit).")
    ] = "60s",
    skip_bad: SkipBad = False,
) -> None:
    """Run SQL in DuckDB, e.g. "SELECT precision, median(tflops_per_gpu) FROM results GROUP BY ALL".

    One statement, within --memory-limit and --timeout (Ctrl-C stops it too).
    """
    from clusters.schema import parse_memory_size
    from sweep.results import query as q
    from sweep.results import render

    try:
        memory = parse_memory_size(memory_limit)
    except ValueError as e:
        raise UserError(f"--memory-limit {memory_limit!r}: {e}") from None
    rows = (limit or None) if fmt is QueryFormat.table else None
    bounds = q.Bounds(memory, q.parse_duration(timeout), rows, memory_limit)
    try:
        table, more = q.sql(directory, statement, bounds, skip_bad)
    except q.Cancelled:
        typer.echo("query cancelled (Ctrl-C)", err=True)
        raise typer.Exit(130) from None
    names = _unique(table.column_names)
    table = table.rename_columns(names)
    if fmt is QueryFormat.csv:
        sys.stdout.write(render.csv_text(table.to_pylist(), names))
        return
    note = f"first {table.num_rows} rows: the query stopped there (--limit 0 for all)" if more else ""
    render.rich_table(table.to_pylist(), render.generic_cols(table.schema), "", note, always=names)


def _out_file(out: Path, example: str) -> None:
    """Refuse a folder as --out before any work: `export` and `plot` write one file, named by the user."""
    if out.is_dir():
        raise UserError(f"--out {out}: is a folder; give a file name, e.g. --out {out / example}")


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return out
