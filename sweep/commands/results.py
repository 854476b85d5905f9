"""`sweep results ...`: read a result directory back as tables, comparisons, exports and plots.

Every command takes the directory `sweep run` wrote (``<dir>/cluster=*/run=*/*.parquet``; several
runs and clusters may share it). The work lives in ``sweep.results``; pyarrow, DuckDB and matplotlib
are imported inside the commands so that ``sweep --help`` stays instant.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from sweep.commands._common import flag, user_errors
from sweep.errors import UserError
from trainer.flops import CONVENTIONS

if TYPE_CHECKING:
    from sweep.results.table_out import Col

app = typer.Typer(no_args_is_help=True, help="Aggregate, compare, export and plot result datasets.")

Directory = Annotated[
    Path,
    typer.Argument(help="Result directory written by `sweep run` (cluster=*/run=*/*.parquet).", show_default=False),
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


def _emit(
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
    energy where measured, loss (first → last, and at the tokens trained every ok row reached), error."""
    from sweep.results import aggregate, energy_view, intervals, loss_at, recount, render

    cols = energy_view.with_energy(render.SHOW_COLS, energy_view.SHOW_COLS, before="loss_last")
    columns = [c.key for c in cols if c is not render.LOSS_AT] + [
        "loss_first",
        "started_at",
        "run_id",
        *aggregate.LOSS_CURVES,
    ]
    table = aggregate.load_rows(directory, where or (), skip_bad, columns, flops.value, row_id=True)
    rows, tokens, total = aggregate.show_rows(table, limit)  # tokens, total: over every selected row
    rows = [{**r, "loss_at": loss_at.row_at(r, tokens)} for r in rows]
    more = "" if total <= len(rows) else f"{total - len(rows)} more rows not printed: --limit 0 for all, or --where"
    losses_at = loss_at.note(set() if tokens is None else {tokens}, "every ok row")
    notes = (recount.caption(flops.value), intervals.ci_note(rows), losses_at, more)
    render.rich_table(
        rows,
        cols,
        f"{directory}: {len(rows)} of {total} rows",
        note=" · ".join(p for p in notes if p),
        selected=aggregate.distinct_configs(table),
    )


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
    _emit(
        groups,
        render.max_batch_cols(groups),
        fmt,
        f"{directory}: largest batch per GPU that fits",
        recount.caption(flops.value),
        csv_columns=table.column_names,
        limit=limit,
        footer=lambda: provenance.markdown(rows, recount.formula(flops.value)),
    )


@app.command()
@user_errors
def compare(
    directory: Directory,
    baseline: Annotated[
        str | None,
        typer.Option(
            "--baseline",
            "-b",
            show_default=False,
            help="The value of --by to divide by. Default: bf16, compile none, ac none, reduce_dtype fp32, grad_sync "
            "micro_batch, tp 1, dp_replicate 1; --by cluster needs one.",
        ),
    ] = None,
    by: Annotated[
        By,
        typer.Option(
            "--by",
            help="The config key that varies: everything else stays the same "
            "(precisions on one cluster, clusters for one precision, ...).",
        ),
    ] = By.precision,
    best: Annotated[
        bool,
        flag(
            "--best",
            help="Each precision at its best against the baseline's best, per model × seq_len × GPUs × cluster, "
            "whatever their batch and options: a fastest search's measured best where one ran "
            "(_search/*.json), else the fastest ok config.",
        ),
    ] = False,
    where: Where = None,
    fmt: Format = TableFormat.table,
    limit: Limit = 200,
    flops: Flops = SWEEP_FLOPS,
    skip_bad: SkipBad = False,
) -> None:
    """TFLOP/s/GPU of each precision (or cluster, compile mode, ...) over the baseline's, the rest of the config equal.

    Each side's loss stands beside it, last and at the same tokens trained (the most both sides reached): a faster
    recipe that does not train as the baseline does is no win.

    With --by cluster, also tokens/s/GPU per $/GPU-hour where the rows carry a cost (the profile's
    cost_per_gpu_hour when they were written).

    With --best, each stack at its best instead: the fastest configuration of each precision, with its batch and
    options, against the baseline precision's fastest.
    """
    from sweep.results import aggregate, energy, energy_view, loss_at, provenance, recount, render

    if best:
        return _compare_best(
            directory, baseline or cast(str, aggregate.COMPARE_BY["precision"]), by, where, fmt, limit, flops, skip_bad
        )
    rows = aggregate.load_rows(
        directory,
        where or (),
        skip_bad,
        ("cost_per_gpu_hour", *energy.PRICES, *aggregate.LOSS_CURVES, *provenance.COLUMNS),
        flops.value,
    )
    configs, costs, prices = aggregate.compare_inputs(rows, by.value)
    present = sorted({v for v in configs.column(by.value).to_pylist() if v is not None})
    baseline = _baseline(directory, by, baseline, present)
    table = aggregate.compare_table(configs, baseline, by.value, costs, prices)
    if table.num_rows == 0:
        raise UserError(f"nothing to compare: every config in {directory} has {by.value} {baseline}")
    printed = (limit or None) if fmt is TableFormat.table else None  # a terminal table reads the losses it prints
    pairs = aggregate.compare_losses(table.to_pylist(), rows, by.value, baseline, printed, configs)
    tokens = {p["loss_at_tokens"] for p in pairs} - {None}
    unknown = sorted(c for c, v in (costs or {}).items() if v is None)
    with_cost = costs is not None and len(unknown) < len(costs)
    note = " · ".join(
        [recount.caption(flops.value)]
        + ([f"no cost per GPU-hour for: {', '.join(unknown)}"] if by is By.cluster and unknown else [])
        + ([loss_at.note(tokens)] if tokens else [])
    )
    cols = render.compare_cols(by.value, baseline, with_cost, tokens_column=len(tokens) > 1) + energy_view.compare_cols(
        baseline, with_cost
    )
    title = f"{directory}: TFLOP/s/GPU vs {by.value} {baseline} (same config otherwise)"
    _emit(
        pairs,
        cols,
        fmt,
        title,
        note,
        always=(by.value,),
        limit=limit,
        csv_columns=[*energy.drop_empty(table).column_names, "loss_at_tokens", "loss_at", "base_loss_at"],
        footer=lambda: provenance.markdown(rows, recount.formula(flops.value)),
    )


def _baseline(directory: Path, by: By, given: str | None, present: list[Any]) -> Any:
    """The value of --by that `compare` divides by: --baseline (typed as the column is), else the key's default;
    refused where the rows have no other side, or lack the default."""
    from sweep.results import aggregate

    baseline = aggregate.typed_baseline(by.value, given)
    if len(present) < 2:  # whatever the baseline, default or given: there is no other side
        raise UserError(
            f"nothing to compare: every config in {directory} has {by.value} {present[0] if present else 'unset'}"
        )
    if baseline is None:
        if by is By.cluster:
            raise UserError(f"--by cluster needs --baseline CLUSTER; clusters in the results: {', '.join(present)}")
        baseline = aggregate.COMPARE_BY[by.value]
        if baseline not in present:
            raise UserError(
                f"--by {by.value}: no config in {directory} has the default baseline {baseline}; pass "
                f"--baseline, one of: {', '.join(map(str, present))}"
            )
    return baseline


BEST_REACH = ("loss_reached", "base_loss_reached")  # read by best_losses, printed as loss_at_tokens


def _compare_best(
    directory: Path,
    baseline: str,
    by: By,
    where: list[str] | None,
    fmt: TableFormat,
    limit: int,
    flops: FlopConvention,
    skip_bad: bool,
) -> None:
    from sweep.results import aggregate, best, loss_at, provenance, recount, verdicts

    if by is not By.precision:
        raise UserError(f"--best compares precisions, each at its best; leave out --by {by.value}")
    rows = aggregate.load_rows(
        directory, where or (), skip_bad, ("trial_id", *aggregate.LOSS_CURVES, *provenance.COLUMNS), flops.value
    )
    finalists = verdicts.finalists(verdicts.load(directory))
    table = best.best_table(rows, baseline, finalists)
    if table.num_rows == 0:
        raise UserError(f"nothing to compare: every row in {directory} has precision {baseline}")
    printed = (limit or None) if fmt is TableFormat.table else None
    pairs = best.best_losses(table.to_pylist(), rows, baseline, finalists, printed)
    tokens = {p["loss_at_tokens"] for p in pairs} - {None}
    title = f"{directory}: each precision at its best vs {baseline} at its best (TFLOP/s/GPU)"
    note = " · ".join(
        [
            recount.caption(flops.value),
            "best: a fastest search's measured best, else the config with the fastest median of its ok attempts",
        ]
        + ([loss_at.note(tokens)] if tokens else [])
    )
    _emit(
        pairs,
        verdicts.best_cols(baseline, tokens_column=len(tokens) > 1),
        fmt,
        title,
        note,
        always=("precision",),
        csv_columns=[
            *(c for c in table.column_names if c not in BEST_REACH),
            "loss_at_tokens",
            "loss_at",
            "base_loss_at",
        ],
        limit=limit,
        footer=lambda: provenance.markdown(rows, recount.formula(flops.value)),
    )


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
    rows = table.to_pylist()
    if fmt is ExportFormat.md:
        note = " · ".join(p for p in (recount.caption(flops.value), intervals.ci_note(rows)) if p)
        cols = energy_view.with_energy(render.EXPORT_COLS, energy_view.EXPORT_COLS, before="peak_mem_gib")
        text = (
            render.markdown(rows, cols, note=note) + "\n" + provenance.markdown(attempts, recount.formula(flops.value))
        )
    else:
        text = render.csv_text(rows, table.column_names)
    if out is None:
        sys.stdout.write(text)
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    except OSError as e:
        raise UserError(f"--out {out}: {e.strerror or e}") from None
    typer.echo(f"wrote {out} ({len(rows)} configs)", err=True)


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
) -> None:
    """Plot TFLOP/s/GPU (or tokens per kWh: --metric) vs batch size per precision and, below it, the largest batch
    that fits.

    One image, one column of panels per model: the top panel marks OOM batches with an x on the zero
    line; the bottom panel is the max-batch bar chart.
    """
    from sweep.results import plot as plotting

    _out_file(out, "plot.png")
    path = plotting.plot(directory, out, where or (), skip_bad, metric=metric.value)
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
