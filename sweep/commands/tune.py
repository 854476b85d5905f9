"""`sweep tune`: the fastest configuration per model and precision, as `search: fastest` in a grid does.

    sweep tune --model llama3-8b --precision bf16 --precision fp8-torchao-tensorwise --gpus 2 --seq-len 4096 \\
        --cluster h200 --budget 40 --vary batch_size --vary grad_accum --vary reduce_dtype

is the grid `{models: [llama3-8b], precisions: [...], gpus: 2, seq_len: 4096, batch_sizes: [1], search: fastest,
tune: {vary: [...], budget: 40}, steps: {warmup: auto, measure: auto}}` run by `sweep run`
(sweep.search.fastest.search says how the search goes); the command's options and a grid's keys are one thing.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from sweep import service
from sweep.commands._common import dataclass_options, flag, user_errors
from sweep.commands._outcome import execute
from sweep.commands.run import Axes, CapOpt, ClusterOpt, FreshOpt, OutputOpt, ProgressOpt, StartOpt
from sweep.spec.grid import DEFAULT_VARY, NUMERICS_CHANGING, TUNABLE, TuneSpec
from sweep.spec.layout import LAYOUT_VARY

app = typer.Typer()

# what --vary may name (members made from the tunable options, so mypy sees none: the ignore)
Option = Enum("Option", {name: name for name in TUNABLE + LAYOUT_VARY}, type=str)  # type: ignore[misc]
_STEPS_HELP = "a count, or auto: until the step times are stable (the finalists' and the baseline's full measurement)"


def _steps(value: str) -> int | str:
    """A --warmup or --measure value: a step count, or `auto`."""
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise typer.BadParameter(f"{value!r}: expected a whole number or auto") from None


@app.command()
@user_errors
@dataclass_options(skip=("batch_size",))  # the search picks the batches, from --start
def tune(
    cluster: ClusterOpt = "local",
    axes: Axes = Axes(),
    vary: Annotated[
        list[Option] | None,
        typer.Option(
            help=f"An option the search may change (repeatable; default: {', '.join(DEFAULT_VARY)}). "
            f"{', '.join(NUMERICS_CHANGING)} change the numerics: they vary only when named; "
            "tp and dp_replicate: one search per layout."
        ),
    ] = None,
    budget: Annotated[
        int, typer.Option(min=1, help="Trial attempts at most per model and precision (and layout).")
    ] = TuneSpec.model_fields["budget"].default,
    global_batch_tokens: Annotated[
        int | None,
        typer.Option(
            min=1, help="Hold micro-batch x grad_accum x ranks x seq_len at this: the best split of one global batch."
        ),
    ] = None,
    max_cost: Annotated[
        float,
        typer.Option(
            help="GPU time at most, in fresh measured trials of the fastest probe so far (its finals included): "
            "a probe predicted past it is skipped, and the verdict lists it."
        ),
    ] = TuneSpec.model_fields["max_cost"].default,
    start: StartOpt = 1,
    warmup: Annotated[str, typer.Option(parser=_steps, help=f"Warm-up steps: {_STEPS_HELP}.")] = "auto",
    measure: Annotated[str, typer.Option(parser=_steps, help=f"Measured steps: {_STEPS_HELP}.")] = "auto",
    output: OutputOpt = Path("results"),
    memory_cap: CapOpt = None,
    progress: ProgressOpt = True,
    fresh_actors: FreshOpt = False,
    resume: Annotated[
        bool,
        flag(
            help="Go on from the attempts already recorded in --output: the "
            "search asks for what it asked then, and runs only what is missing."
        ),
    ] = False,
) -> None:
    """Find the fastest configuration (batch, activation checkpointing, accumulation, ...) per model and precision."""
    tune_block = {
        "vary": [v.value for v in vary or []] or list(DEFAULT_VARY),
        "budget": budget,
        "global_batch_tokens": global_batch_tokens,
        "max_cost": max_cost,
    }
    extra = {"search": "fastest", "tune": tune_block, "steps": {"warmup": warmup, "measure": measure}}
    profile, spec, trials = service.prepare_search("tune", cluster, memory_cap, axes.search_data(start) | extra, start)
    execute(
        service.make_plan(spec, trials, profile),
        trials,
        profile,
        output,
        progress=progress,
        resume=resume,
        reuse_actors=not fresh_actors,
    )
