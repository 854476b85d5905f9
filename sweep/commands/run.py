"""`sweep run`, `sweep plan` and `sweep max-batch`: from a grid (file and/or options) to trials."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from sweep import service
from sweep.commands._common import dataclass_options, flag, user_errors
from sweep.commands._outcome import execute, print_warnings
from trainer.job import COMPILE_SCOPES

if TYPE_CHECKING:
    from sweep.memory.predictor import Predictor
    from sweep.spec.grid import Trial

# `sweep run`, `sweep plan`, `sweep max-batch`: sweep.cli adds these commands at the top level
app = typer.Typer()


# the CLI's choices for --compile: the trainer's scopes (trainer.job.COMPILE_SCOPES), not a list of its own
Compile = Enum("Compile", {scope: scope for scope in COMPILE_SCOPES}, type=str)  # type: ignore[misc]  # computed members


GridArg = Annotated[
    Path | None,
    typer.Argument(
        help="Grid YAML. An axis option below (--model, --precision, ...) replaces that axis of the grid: it does not "
        "add to it.",
        show_default=False,
    ),
]
ClusterOpt = Annotated[str, typer.Option("--cluster", "-c", help="Cluster profile name or YAML path.")]
OutputOpt = Annotated[Path, typer.Option("--output", "-o", help="Result dataset folder.")]
CapOpt = Annotated[
    str | None,
    typer.Option(
        "--memory-cap",
        help="Per-rank memory cap, e.g. 80GiB: allocations past it really fail (what fits on a smaller card?).",
    ),
]
ProgressOpt = Annotated[bool, flag(help="Show a progress bar.")]
FreshOpt = Annotated[
    bool,
    flag(
        "--fresh-actors",
        help="New rank processes for every trial, instead of warm "
        "ones that run trials of one kind one after the other.",
    ),
]
ProfileOpt = Annotated[
    bool,
    flag(
        "--profile",
        help="After the measured steps, trace a few more with "
        "torch.profiler: a trace file beside each row, and where the step time goes.",
    ),
]
NoPredictOpt = Annotated[
    bool,
    flag(
        "--no-predict",
        help="Run trials whose predicted peak memory exceeds a GPU "
        "rank's memory (else recorded unsupported without GPU time).",
    ),
]
NoPrecompileOpt = Annotated[
    bool,
    flag(
        "--no-precompile",
        help="Compile each trial's graphs as its trial is reached, instead of a new group of one-rank processes "
        "compiling those of every trial it will run at once, in side processes, while it starts (regional compile; "
        "8+ CPU cores).",
    ),
]
StartOpt = Annotated[int, typer.Option(min=1, help="First batch to probe.")]


def _axis(key: str) -> Any:
    """A field of Axes: no value unless given; ``key`` is the grid file's name for the axis."""
    return field(default=None, metadata={"grid": key})


@dataclass(frozen=True, kw_only=True, slots=True)
class Axes:
    """The grid's axes as options of `sweep run`, `plan` and `max-batch` (a field here is an option on each):
    one given replaces that axis of the grid file."""

    model: Annotated[list[str] | None, typer.Option("--model", "-m", help="Model (repeatable).")] = _axis("models")
    precision: Annotated[list[str] | None, typer.Option("--precision", "-p", help="Precision recipe (repeatable).")] = (
        _axis("precisions")
    )
    batch_size: Annotated[list[int] | None, typer.Option("--batch-size", "-b", help="Per-GPU batch (repeatable).")] = (
        _axis("batch_sizes")
    )
    compile: Annotated[
        list[Compile] | None, typer.Option("--compile", help="What torch.compile compiles (repeatable).")
    ] = _axis("compile")
    seq_len: Annotated[list[int] | None, typer.Option("--seq-len", help="Sequence length (repeatable).")] = _axis(
        "seq_len"
    )
    gpus: Annotated[list[int] | None, typer.Option("--gpus", help="Ranks per trial (repeatable).")] = _axis("gpus")
    grad_accum: Annotated[
        list[int] | None, typer.Option("--grad-accum", help="Micro-batches per optimizer step (repeatable).")
    ] = _axis("grad_accum")
    dp_replicate: Annotated[
        list[int] | None, typer.Option("--dp-replicate", help="HSDP replicas of the sharded model (repeatable).")
    ] = _axis("dp_replicate")
    tp: Annotated[
        list[int] | None, typer.Option("--tp", help="Tensor-parallel ranks, with sequence parallel (repeatable).")
    ] = _axis("tp")
    cp: Annotated[
        list[int] | None,
        typer.Option(
            "--cp", help="Context-parallel ranks: not built (no CPU path in torch 2.13), 1 only (repeatable)."
        ),
    ] = _axis("cp")

    def grid_data(self) -> dict[str, Any]:
        """The axes given, as a grid file writes them."""
        return {
            f.metadata["grid"]: [v.value if isinstance(v, Enum) else v for v in values]
            for f in fields(self)
            if (values := getattr(self, f.name))
        }

    def search_data(self, start: int) -> dict[str, Any]:
        """The axes of a search from options alone (`sweep max-batch`, `sweep tune`): `start` its one batch."""
        return replace(self, batch_size=[start]).grid_data()


@app.command()
@user_errors
@dataclass_options()
def run(
    grid: GridArg = None,
    cluster: ClusterOpt = "local",
    axes: Axes = Axes(),
    output: OutputOpt = Path("results"),
    memory_cap: CapOpt = None,
    resume: Annotated[bool, flag(help="Skip attempts already recorded in --output.")] = False,
    max_concurrent: Annotated[int | None, typer.Option(min=1, help="At most this many trials at once.")] = None,
    progress: ProgressOpt = True,
    fresh_actors: FreshOpt = False,
    profile_steps: ProfileOpt = False,
    no_predict: NoPredictOpt = False,
    no_precompile: NoPrecompileOpt = False,
    yes: Annotated[bool, flag("--yes", "-y", help="Run a grid of more than 1,000 trials.")] = False,
) -> None:
    """Run a grid of trials and write one Parquet row per attempt."""
    from sweep.errors import UserError
    from sweep.spec.advice import LARGE_GRID, needs_confirmation

    extra = ({"profile": True} if profile_steps else {}) | ({"predict_memory": False} if no_predict else {})
    profile, spec, trials = service.prepare(grid, cluster, memory_cap, axes.grid_data() | extra)
    if needs_confirmation(trials) and not yes:
        raise UserError(
            f"{len(trials)} trials (more than {LARGE_GRID}): check the grid with `sweep plan`, then run it with --yes"
        )
    predictor = service.load_predictor(profile, output)
    plan = service.make_plan(spec, trials, profile, predictor=predictor)
    execute(
        plan,
        trials,
        profile,
        output,
        predictor=predictor,
        grid_name=spec.name,
        resume=resume,
        max_concurrent=max_concurrent,
        progress=progress,
        reuse_actors=spec.reuse_actors and not fresh_actors,
        precompile=spec.precompile and not no_precompile,
    )


@app.command()
@user_errors
@dataclass_options()
def plan(
    grid: GridArg = None,
    cluster: ClusterOpt = "local",
    axes: Axes = Axes(),
    memory_cap: CapOpt = None,
    no_predict: NoPredictOpt = False,
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            help="Result dataset folder whose clean rows of this cluster calibrate the predicted peak memory.",
        ),
    ] = Path("results"),
) -> None:
    """Show the trials a grid expands to, and which cannot run here and why. Nothing runs."""
    from rich.console import Console

    from sweep.results import render
    from sweep.text import plural

    options = axes.grid_data() | ({"predict_memory": False} if no_predict else {})
    profile, spec, trials = service.prepare(grid, cluster, memory_cap, options)
    predictor = service.load_predictor(profile, output)
    service.make_plan(
        spec, trials, profile, predictor=predictor
    )  # a search's own checks (a tune budget or global batch)
    rows, reasons = _plan_rows(trials, predictor)
    search = {"max_batch": " — max-batch search", "fastest": " — fastest-configuration search"}.get(
        spec.search or "", ""
    )
    render.plan_table(
        rows,
        f"{plural(len(trials), 'trial')} on {profile.name} ({profile.accelerator}, "
        f"{plural(profile.total_ranks, 'rank')})" + search,
        reasons,
    )
    Console().print(f"steps a trial: {spec.steps.text()}", markup=False)
    lines = predictor.max_batch_lines(trials)
    for line in ([predictor.basis()] if lines else []) + lines:
        Console().print(line, soft_wrap=True, markup=False)
    print_warnings(trials, profile, Console())


def _predicted_cell(trial: Trial, predictor: Predictor) -> str:
    """`41.2 GiB / 140 GiB`: the trial's predicted peak per rank against the rank's memory (a CPU rank's: its memory
    cap); '-' where none is known."""
    from sweep.memory.capacity import size

    shown = predictor.shown(trial)
    return "-" if shown is None else f"{size(shown[0])} / {size(shown[1])}"


def _plan_rows(trials: list[Trial], predictor: Predictor) -> tuple[list[dict[str, str]], dict[str, int]]:
    """One row of text per trial, and each reason a trial cannot run here numbered in order of appearance."""
    from sweep.execution.runner import unsupported
    from sweep.text import param_count

    reasons: dict[str, int] = {}
    rows = []
    for t in trials:
        reason = unsupported(t, predictor.profile, predictor.calibration)
        if reason is not None:
            reasons.setdefault(reason, len(reasons) + 1)
        rows.append(
            {
                "trial_id": t.trial_id[:8],
                "model": t.model.label,
                "params": param_count(t.model.n_params()),
                "precision": t.precision,
                "compile": t.compile,
                "ac": t.ac,
                "batch": str(t.batch_size),
                "seq": str(t.seq_len),
                "gpus": str(t.gpus),
                "options": t.options_text().replace(" ", "\n") or "-",
                "predicted": _predicted_cell(t, predictor),
                "runs": "yes" if reason is None else f"[yellow]no ({reasons[reason]})[/yellow]",
            }
        )
    return rows, reasons


@app.command("max-batch")
@user_errors
@dataclass_options(skip=("batch_size",))  # the search picks the batches, from --start
def max_batch(
    cluster: ClusterOpt = "local",
    axes: Axes = Axes(),
    start: StartOpt = 1,
    step: Annotated[int, typer.Option(min=1, help="Granularity: stop when B ok and B+step oom.")] = 1,
    warmup: Annotated[int, typer.Option(min=0)] = 2,
    measure: Annotated[int, typer.Option(min=1)] = 5,
    output: OutputOpt = Path("results"),
    memory_cap: CapOpt = None,
    progress: ProgressOpt = True,
    fresh_actors: FreshOpt = False,
    profile_steps: ProfileOpt = False,
) -> None:
    """Find the largest batch that fits, and the fastest, per model and precision."""
    extra = {"search": "max_batch", "steps": {"warmup": warmup, "measure": measure}, "profile": profile_steps}
    profile, spec, trials = service.prepare_search(
        "max-batch", cluster, memory_cap, axes.search_data(start) | extra, start
    )
    predictor = service.load_predictor(profile, output)
    execute(
        service.make_plan(spec, trials, profile, step=step, predictor=predictor),
        trials,
        profile,
        output,
        predictor=predictor,
        progress=progress,
        reuse_actors=not fresh_actors,
    )
