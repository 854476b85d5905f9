"""`sweep results compare`: each precision (or cluster, compile mode, ...) over a baseline, the rest of the config
equal; with --best, each at its best. Registered on the results sub-app by sweep.commands.results."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, cast

import typer

from sweep.commands._common import flag, user_errors
from sweep.commands.results_options import (
    SWEEP_FLOPS,
    By,
    Directory,
    FlopConvention,
    Flops,
    Format,
    Limit,
    SkipBad,
    TableFormat,
    Where,
    emit,
)
from sweep.errors import UserError


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
            "micro_batch, tp 1, dp_replicate 1, dynamic_batch false; --by cluster needs one.",
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
    if best:
        from sweep.results import aggregate

        return _compare_best(
            directory, baseline or cast(str, aggregate.COMPARE_BY["precision"]), by, where, fmt, limit, flops, skip_bad
        )
    _compare_configs(directory, baseline, by, where, fmt, limit, flops, skip_bad)


def _compare_configs(
    directory: Path,
    baseline: str | None,
    by: By,
    where: list[str] | None,
    fmt: TableFormat,
    limit: int,
    flops: FlopConvention,
    skip_bad: bool,
) -> None:
    """`compare` without --best: every config against the same config at the baseline's value of `by`."""
    from sweep.results import aggregate, energy, energy_view, loss_at, provenance, recount, render

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
        raise UserError(f"nothing to compare: every config in {directory} has {by.value} {_text(baseline)}")
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
    if isinstance(baseline, bool):  # an on/off option's side is named with its key (a column "vs False" says nothing)
        shown = side = f"{by.value}={_text(baseline)}"
    else:
        shown, side = str(baseline), f"{by.value} {baseline}"
    cols = render.compare_cols(by.value, shown, with_cost, tokens_column=len(tokens) > 1) + energy_view.compare_cols(
        shown, with_cost
    )
    title = f"{directory}: TFLOP/s/GPU vs {side} (same config otherwise)"
    emit(
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


def _text(value: Any) -> str:
    """A --by value as --baseline takes it: an on/off option's true or false, not Python's True or False."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _typed_baseline(by: str, baseline: str | None) -> str | int | bool | None:
    """`--baseline` as the `--by` column holds it: a layout axis counts ranks (`--by tp --baseline 2`), an on/off
    option is true or false (`--by dynamic_batch --baseline true`)."""
    from sweep.results.aggregate import COMPARE_BY

    default = COMPARE_BY.get(by)
    if baseline is None or not isinstance(default, int):  # text, or no default (cluster)
        return baseline
    if isinstance(default, bool):  # before int: a bool is an int
        if baseline.lower() not in ("true", "false"):
            raise UserError(f"--baseline {baseline!r}: --by {by} is true or false")
        return baseline.lower() == "true"
    try:
        return int(baseline)
    except ValueError:
        raise UserError(f"--baseline {baseline!r}: --by {by} compares whole numbers of ranks (1, 2, 4, ...)") from None


def _baseline(directory: Path, by: By, given: str | None, present: list[Any]) -> Any:
    """The value of --by that `compare` divides by: --baseline (typed as the column is), else the key's default;
    refused where the rows have no other side, or lack the default."""
    from sweep.results import aggregate

    baseline = _typed_baseline(by.value, given)
    if len(present) < 2:  # whatever the baseline, default or given: there is no other side
        only = _text(present[0]) if present else "unset"
        raise UserError(f"nothing to compare: every config in {directory} has {by.value} {only}")
    if baseline is None:
        if by is By.cluster:
            raise UserError(f"--by cluster needs --baseline CLUSTER; clusters in the results: {', '.join(present)}")
        baseline = aggregate.COMPARE_BY[by.value]
        if baseline not in present:
            raise UserError(
                f"--by {by.value}: no config in {directory} has the default baseline {_text(baseline)}; pass "
                f"--baseline, one of: {', '.join(map(_text, present))}"
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
    emit(
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
