"""The `sweep` command line. Heavy imports (torch, Ray) happen inside commands so `--help` is instant.

`sweep results ...` builds only its own sub-app: the others import the grid schema and the cluster catalog
(~0.2 s of a results command's start, issue 31), which nothing under `results` reads. `app` (every command)
is built on first use, for `main` and for tests that invoke it.
"""

from __future__ import annotations

import sys

import typer

_HELP = "Benchmark LLM training across GPUs and precision stacks (bf16, FP8 via TE or torchao)."


def build(only_results: bool = False) -> typer.Typer:
    """The command line: every command, or (`only_results`) `sweep results` alone."""
    from sweep.commands import results

    cli = typer.Typer(
        name="sweep", help=_HELP, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False
    )
    if not only_results:
        from sweep.commands import clusters, run, tune

        cli.add_typer(run.app)  # no name: `sweep run`, `sweep plan`, `sweep max-batch` sit at the top level
        cli.add_typer(tune.app)  # `sweep tune`
    cli.add_typer(results.app, name="results", help="Aggregate, compare, export and plot result datasets.")
    if not only_results:
        cli.add_typer(clusters.app, name="clusters", help="List and show cluster profiles.")
    return cli


def __getattr__(name: str) -> typer.Typer:
    if name == "app":  # `from sweep.cli import app`: the whole command line, built once
        globals()["app"] = build()
        return globals()["app"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    # the first argument names the sub-app; `sweep --help` and the rest get the whole command line
    build(only_results=sys.argv[1:2] == ["results"])()
