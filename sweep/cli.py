"""The `sweep` command line. Heavy imports (torch, Ray) happen inside commands so `--help` is instant."""

from __future__ import annotations

import typer

from sweep.commands import clusters, results, run, tune

app = typer.Typer(
    name="sweep",
    help="Benchmark LLM training across GPUs and precision stacks (bf16, FP8 via TE or torchao).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(run.app)  # no name: `sweep run`, `sweep plan`, `sweep max-batch` sit at the top level
app.add_typer(tune.app)  # `sweep tune`
app.add_typer(results.app, name="results", help="Aggregate, compare, export and plot result datasets.")
app.add_typer(clusters.app, name="clusters", help="List and show cluster profiles.")


def main() -> None:
    app()
