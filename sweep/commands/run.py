"""`sweep run`, `sweep plan` and `sweep max-batch`: from a grid (file and/or options) to trials."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from sweep.commands._common import dataclass_options, flag, user_errors

# `sweep run`, `sweep plan`, `sweep max-batch`: sweep.cli adds these commands at the top level
app = typer.Typer()

NOTHING_MEASURED = 3  # exit status of a sweep whose every attempt was oom, error, timeout or unsupported
# A teardown longer than this is printed (the GPUs stay held through it): on one H200 a GPT-1.5B tune's process
# was still running 35 s after its last attempt ended (RESULTS.md, session 10); this line says if that was it.
TEARDOWN_NOTE_S = 5.0


class Compile(str, Enum):
    none = "none"
    regional = "regional"
    full = "full"


GridArg = Annotated[Optional[Path], typer.Argument(
    help="Grid YAML. An axis option below (--model, --precision, ...) replaces that axis of the grid: it does not "
         "add to it.", show_default=False)]
ClusterOpt = Annotated[str, typer.Option("--cluster", "-c", help="Cluster profile name or YAML path.")]
OutputOpt = Annotated[Path, typer.Option("--output", "-o", help="Result dataset folder.")]
CapOpt = Annotated[Optional[str], typer.Option("--memory-cap", help="Per-rank memory cap, e.g. 80GiB: "
                                               "allocations past it really fail (what fits on a smaller card?).")]
ProgressOpt = Annotated[bool, flag(help="Show a progress bar.")]
FreshOpt = Annotated[bool, flag("--fresh-actors", help="New rank processes for every trial, instead of warm "
                                        "ones that run trials of one kind one after the other.")]
ProfileOpt = Annotated[bool, flag("--profile", help="After the measured steps, trace a few more with "
                                          "torch.profiler: a trace file beside each row, and where the step time goes.")]
NoPredictOpt = Annotated[bool, flag("--no-predict", help="Run trials whose predicted peak memory exceeds a GPU "
                                             "rank's memory (else recorded unsupported without GPU time).")]
StartOpt = Annotated[int, typer.Option(min=1, help="First batch to probe.")]


def _axis(key: str):
    """A field of Axes: no value unless given; ``key`` is the grid file's name for the axis."""
    return field(default=None, metadata={"grid": key})


@dataclass(frozen=True, kw_only=True, slots=True)
class Axes:
    """The grid's axes as options of `sweep run`, `plan` and `max-batch` (a field here is an option on each):
    one given replaces that axis of the grid file."""

    model: Annotated[Optional[list[str]], typer.Option("--model", "-m", help="Model (repeatable).")] = _axis("models")
    precision: Annotated[Optional[list[str]], typer.Option(
        "--precision", "-p", help="Precision recipe (repeatable).")] = _axis("precisions")
    batch_size: Annotated[Optional[list[int]], typer.Option(
        "--batch-size", "-b", help="Per-GPU batch (repeatable).")] = _axis("batch_sizes")
    compile: Annotated[Optional[list[Compile]], typer.Option("--compile", help="Compile mode (repeatable).")] = _axis("compile")
    seq_len: Annotated[Optional[list[int]], typer.Option("--seq-len", help="Sequence length (repeatable).")] = _axis("seq_len")
    gpus: Annotated[Optional[list[int]], typer.Option("--gpus", help="Ranks per trial (repeatable).")] = _axis("gpus")
    grad_accum: Annotated[Optional[list[int]], typer.Option(
        "--grad-accum", help="Micro-batches per optimizer step (repeatable).")] = _axis("grad_accum")
    dp_replicate: Annotated[Optional[list[int]], typer.Option(
        "--dp-replicate", help="HSDP replicas of the sharded model (repeatable).")] = _axis("dp_replicate")
    tp: Annotated[Optional[list[int]], typer.Option(
        "--tp", help="Tensor-parallel ranks, with sequence parallel (repeatable).")] = _axis("tp")
    cp: Annotated[Optional[list[int]], typer.Option(
        "--cp", help="Context-parallel ranks: not built (no CPU path in torch 2.13), 1 only (repeatable).")] = _axis("cp")

    def grid_data(self) -> dict:
        """The axes given, as a grid file writes them."""
        return {f.metadata["grid"]: [v.value if isinstance(v, Enum) else v for v in values]
                for f in fields(self) if (values := getattr(self, f.name))}


def _grid_data(grid: Path | None, axes: Axes) -> tuple[dict, str]:
    """The grid file's mapping as written, the options on top: validated once, by `_prepare`."""
    from clusters._load import display_path
    from sweep.spec.grid import read_grid

    if grid is not None:
        data, source = read_grid(grid), display_path(grid)
    else:
        data, source = {}, "<options>"
    return data | axes.grid_data(), source


def _prepare(grid: Path | None, cluster: str, memory_cap: str | None, axes: Axes = Axes(), extra: dict | None = None):
    """Load profile and grid, expand to trials: every user error surfaces here, before anything runs.
    `extra`: grid keys a command's own options set (on top of the file's)."""
    from clusters import load_profile
    from sweep.errors import UserError
    from clusters.schema import parse_memory_size
    from sweep.spec.grid import expand, parse_grid

    profile = load_profile(cluster)
    data, source = _grid_data(grid, axes)
    data |= extra or {}
    if grid is None and "models" not in data:  # a grid file's own omissions: parse_grid says what is missing
        raise UserError("no models: give a grid file or --model")
    if grid is None and "batch_sizes" not in data:
        raise UserError("no batch sizes: give a grid file with batch_sizes or --batch-size")
    spec = parse_grid(data, source)
    try:
        cap = parse_memory_size(memory_cap) if memory_cap else None
    except ValueError as e:
        raise UserError(f"--memory-cap: {e}") from None
    # the cap: --memory-cap, else the grid's memory_cap, else the profile's memory_per_device
    trials = expand(spec, cluster=profile.name, source=source, max_ranks=profile.total_ranks, timeout_s=profile.timeout_s,
                    memory_cap_bytes=cap, default_memory_cap=profile.memory_per_device_bytes,
                    ranks_per_node=profile.ranks_per_node)
    return profile, spec, trials


def _prepare_search(command: str, cluster: str, memory_cap: str | None, axes: Axes, start: int, extra: dict | None):
    """`_prepare` for a search from options alone (`sweep max-batch`, `sweep tune`): no grid file, so --model
    is needed, and --start is the one batch its searches start from."""
    from sweep.errors import UserError

    from sweep.spec.grid import unstorable

    if not axes.model:
        raise UserError(f"{command} needs --model")
    if problem := unstorable("--start", "batch_size", [start]):  # the grid key would name an option not given
        raise UserError(problem)
    return _prepare(None, cluster, memory_cap, replace(axes, batch_size=[start]), extra)


@app.command()
@user_errors
@dataclass_options()
def run(grid: GridArg = None, cluster: ClusterOpt = "local", axes: Axes = Axes(),
        output: OutputOpt = Path("results"), memory_cap: CapOpt = None,
        resume: Annotated[bool, flag(help="Skip attempts already recorded in --output.")] = False,
        max_concurrent: Annotated[Optional[int], typer.Option(min=1, help="At most this many trials at once.")] = None,
        progress: ProgressOpt = True, fresh_actors: FreshOpt = False, profile_steps: ProfileOpt = False,
        no_predict: NoPredictOpt = False,
        yes: Annotated[bool, flag("--yes", "-y", help="Run a grid of more than 1,000 trials.")] = False) -> None:
    """Run a grid of trials and write one Parquet row per attempt."""
    from sweep.spec.advice import LARGE_GRID, needs_confirmation
    from sweep.errors import UserError
    from sweep.memory.predictor import Predictor

    extra = ({"profile": True} if profile_steps else {}) | ({"predict_memory": False} if no_predict else {})
    profile, spec, trials = _prepare(grid, cluster, memory_cap, axes, extra)
    if needs_confirmation(trials) and not yes:
        raise UserError(f"{len(trials)} trials (more than {LARGE_GRID}): check the grid with `sweep plan`, "
                        f"then run it with --yes")
    predictor = Predictor.load(profile, output)
    plan = make_plan(spec, trials, profile, predictor=predictor)
    _execute(plan, trials, profile, output, predictor=predictor, grid_name=spec.name, resume=resume, max_concurrent=max_concurrent,
             progress=progress, reuse_actors=spec.reuse_actors and not fresh_actors)


@app.command()
@user_errors
@dataclass_options()
def plan(grid: GridArg = None, cluster: ClusterOpt = "local", axes: Axes = Axes(), memory_cap: CapOpt = None,
         no_predict: NoPredictOpt = False,
         output: Annotated[Path, typer.Option("--output", "-o", help="Result dataset folder whose clean rows of this "
                                              "cluster calibrate the predicted peak memory.")] = Path("results")) -> None:
    """Show the trials a grid expands to, and which cannot run here and why. Nothing runs."""
    from rich.console import Console

    from sweep.memory.predictor import Predictor
    from sweep.results import render
    from sweep.text import plural

    profile, spec, trials = _prepare(grid, cluster, memory_cap, axes, {"predict_memory": False} if no_predict else None)
    predictor = Predictor.load(profile, output)
    make_plan(spec, trials, profile, predictor=predictor)  # a search's own checks (a tune budget or global batch)
    rows, reasons = _plan_rows(trials, predictor)
    search = {"max_batch": " — max-batch search", "fastest": " — fastest-configuration search"}.get(spec.search, "")
    render.plan_table(rows, f"{plural(len(trials), 'trial')} on {profile.name} ({profile.accelerator}, "
                            f"{plural(profile.total_ranks, 'rank')})" + search, reasons)
    lines = predictor.max_batch_lines(trials)
    for line in ([predictor.basis()] if lines else []) + lines:
        Console().print(line, soft_wrap=True, markup=False)
    _print_warnings(trials, profile, Console())


def _predicted_cell(trial, predictor) -> str:
    """`41.2 GiB / 140 GiB`: the trial's predicted peak per rank against the rank's memory; '-' off GPUs."""
    from sweep.memory.capacity import size

    memory = predictor.memory(trial)
    return "-" if memory is None else f"{size(predictor.predict(trial).bytes)} / {size(memory[0])}"


def make_plan(spec, trials, profile, *, step: int = 1, predictor=None):
    """What runs: the grid's trials (with OOM retries), or the search its `search:` asks for. `step`: a
    max-batch search's granularity (`sweep max-batch --step`; a grid's search goes to the batch). `predictor`
    (sweep.memory.predictor): where OOM retries and a max-batch search's first probes go."""
    from sweep.search.policy import GridPlan, MaxBatchPlan

    # where a probe or a retry goes: the model's estimate itself, not the batch it would refuse past its margin (on
    # one H200, uncalibrated, a bf16 retry from 24 went to 12, inside the margin, and ran out of memory; 10 fits)
    point = (lambda t: predictor.max_batch(t, point=True)) if predictor else None
    if spec.search == "max_batch":
        return MaxBatchPlan(trials, capacity_bytes=_capacity(profile, trials), step=step, predicted_max=point)
    if spec.search == "fastest":
        from sweep.search.fastest.plan import TunePlan

        return TunePlan(trials, spec, capacity_bytes=_capacity(profile, trials), is_gpu=profile.is_gpu,
                        ranks_per_node=profile.ranks_per_node,
                        predicted_max=predictor.max_batch if predictor else None)
    return GridPlan(trials, spec.on_oom, predicted_max=point)


def _plan_rows(trials, predictor) -> tuple[list[dict], dict[str, int]]:
    """One row of text per trial, and each reason a trial cannot run here numbered in order of appearance."""
    from sweep.text import param_count
    from sweep.execution.runner import unsupported

    reasons: dict[str, int] = {}
    rows = []
    for t in trials:
        reason = unsupported(t, predictor.profile, predictor.calibration)
        if reason is not None:
            reasons.setdefault(reason, len(reasons) + 1)
        rows.append({"trial_id": t.trial_id[:8], "model": t.model.label, "params": param_count(t.model.n_params()),
                     "precision": t.precision, "compile": t.compile, "ac": t.ac, "batch": str(t.batch_size),
                     "seq": str(t.seq_len), "gpus": str(t.gpus), "options": t.options_text().replace(" ", "\n") or "-",
                     "predicted": _predicted_cell(t, predictor),
                     "runs": "yes" if reason is None else f"[yellow]no ({reasons[reason]})[/yellow]"})
    return rows, reasons


@app.command("max-batch")
@user_errors
@dataclass_options(skip=("batch_size",))  # the search picks the batches, from --start
def max_batch(cluster: ClusterOpt = "local", axes: Axes = Axes(),
              start: StartOpt = 1,
              step: Annotated[int, typer.Option(min=1, help="Granularity: stop when B ok and B+step oom.")] = 1,
              warmup: Annotated[int, typer.Option(min=0)] = 2, measure: Annotated[int, typer.Option(min=1)] = 5,
              output: OutputOpt = Path("results"), memory_cap: CapOpt = None, progress: ProgressOpt = True,
              fresh_actors: FreshOpt = False, profile_steps: ProfileOpt = False) -> None:
    """Find the largest batch that fits, and the fastest, per model and precision."""
    extra = {"search": "max_batch", "steps": {"warmup": warmup, "measure": measure}, "profile": profile_steps}
    from sweep.memory.predictor import Predictor

    profile, spec, trials = _prepare_search("max-batch", cluster, memory_cap, axes, start, extra)
    predictor = Predictor.load(profile, output)
    _execute(make_plan(spec, trials, profile, step=step, predictor=predictor), trials, profile, output,
             predictor=predictor, progress=progress, reuse_actors=not fresh_actors)


def _execute(plan, trials, profile, output: Path, predictor=None, **options) -> None:
    """What `run`, `max-batch` and `tune` do once planned: check --output, warn, run the plan, report and exit.
    `predictor`: the memory model calibrated on --output's rows (loaded here when the plan did not need one)."""
    from sweep.memory.predictor import Predictor
    from sweep.execution.runner import execute, new_run_id

    check_output(output)
    _print_warnings(trials, profile)
    predictor = predictor or Predictor.load(profile, output)
    report = execute(plan, profile=profile, output=output, run_id=new_run_id(), predictor=predictor, **options)
    _finish(report, output, plan, predictor)


def _print_warnings(trials, profile, console=None) -> None:
    """Combinations that run but mislead (sweep.spec.advice), in yellow: under the plan, on stderr before a run."""
    from rich.console import Console

    from sweep.spec.advice import plan_warnings

    _warn(plan_warnings(trials, is_gpu=profile.is_gpu), console or Console(stderr=True))


def _warn(lines: list[str], console) -> None:
    """Each line as `warning: ...`, in yellow, unwrapped."""
    from rich.markup import escape

    for line in lines:
        console.print(f"[yellow]warning:[/yellow] {escape(line)}", soft_wrap=True)


def check_output(output: Path) -> None:
    """Refuse an --output that cannot take rows before any Ray or GPU time is spent (a measurement that
    cannot be written is lost). Writes nothing: the folder itself is made when the first row lands."""
    import errno
    import os
    import tempfile

    from sweep.errors import UserError

    path = Path(output).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        what = "is a file" if existing == path else f"is under {existing}, which is a file"
        raise UserError(f"--output {output}: {what}; give a folder")
    try:  # os.access says yes to root on a read-only mount: try it
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as e:
        reason = os.strerror(e.errno) if e.errno else str(e)
        if e.errno == errno.ENOENT:  # "no such file" of a folder that is there: /proc, /sys make no new files
            reason = f"{existing} refuses new files ({reason})"
        what = f"cannot write in {path}" if existing == path else f"cannot create the folder {path}"
        raise UserError(f"--output {output}: {what}: {reason}") from None


def _capacity(profile, trials) -> float | None:
    """Memory a rank may use: the cap if one is set, else the device's memory (GPU profiles)."""
    caps = {t.memory_cap_bytes for t in trials}
    if len(caps) == 1 and None not in caps:
        return float(caps.pop())
    if not profile.is_gpu:
        return None
    return profile.memory_per_device_bytes or profile.accelerator_info.memory_gib * 1024**3


def _finish(report, output: Path, plan, predictor=None) -> None:
    """The run's rows (as `sweep results show` prints them) and a warning per `auto` measurement short of its
    target, the verdicts of a search, then the exit status."""
    from rich.console import Console

    from sweep.record import cost
    from sweep.results import intervals, render
    from sweep.text import plural

    rows = report.rows
    if rows:
        render.rich_table(rows, render.SHOW_COLS, f"run {report.run_id}: {plural(len(rows), 'attempt')}" +
                          (f" ({report.reused} reused from earlier runs)" if report.reused else ""),
                          note=intervals.ci_note(rows))
    console = Console(stderr=True)
    _warn(intervals.missed_target_warnings(rows), console)  # `steps: auto` that stopped short: said, not only marked
    if hasattr(plan, "verdicts"):  # probes reused by --resume count too
        _write_verdicts(output, report.run_id, plan.verdicts(), rows + report.reused_rows, predictor)
    gpu_time = cost.summary_line(rows)  # this run's attempts: rows reused by --resume cost nothing now
    if gpu_time:
        typer.echo(gpu_time)
    if (report.teardown_s or 0.0) > TEARDOWN_NOTE_S:  # the GPUs are held until it ends: say what it cost
        console.print(f"teardown: {report.teardown_s:.1f} s to stop the rank processes and Ray after the last attempt")
    if report.interrupted:
        import signal

        by = "" if report.interrupted_by == signal.SIGINT else f" by {signal.Signals(report.interrupted_by).name}"
        console.print(f"interrupted{by}: {plural(len(rows), 'attempt')} written to {output}; rerun with --resume to "
                      "finish")
        raise typer.Exit(128 + report.interrupted_by)  # as a shell reports a signal: 130 Ctrl-C, 143 SIGTERM
    if rows:
        console.print(f"results: {output} (run {report.run_id})")
    else:  # --resume with nothing left: no row carries this run's id, so it is not named
        console.print(f"results: {output} (all {plural(report.reused, 'trial')} already recorded; nothing to run)")
    attempts = rows + report.reused_rows
    if attempts and not any(r["status"] == "ok" for r in attempts):
        # a sweep that measured nothing is a failure to a script or CI job, whatever it wrote
        counts = Counter(r["status"] for r in attempts)
        console.print("no trial measured anything: " + ", ".join(f"{n} {s}" for s, n in counts.most_common()))
        raise typer.Exit(NOTHING_MEASURED)


def _write_verdicts(output: Path, run_id: str, verdicts: list[dict], rows: list[dict], predictor=None) -> None:
    """Print a search's verdicts and record them beside the rows (`_search/`, ignored as data). A max-batch
    verdict is completed here from its rows; a fastest-configuration one (`sweep.search.fastest.search`) comes whole. Under
    each max-batch verdict, on GPU ranks: predicted against measured peak per probe."""
    from sweep.record import store
    from sweep.memory.predictor import peak_line
    from sweep.results.verdicts import print_tables

    for v in verdicts:
        if v["kind"] == "max_batch":
            _complete_verdict(v, rows)
    print_tables(verdicts)
    for v in verdicts:
        if v["kind"] == "max_batch" and predictor is not None and predictor.profile.is_gpu:
            typer.echo(peak_line(v, predictor.probe_peaks([r for r in rows if r.get("search_id") == v["search_id"]])))
    store.write_verdicts(output, run_id, verdicts)


def _complete_verdict(v: dict, rows: list[dict]) -> None:
    """Add to a search's verdict what its rows say: allocator retries, speed and what the search cost."""
    from sweep.record import cost
    from sweep.results.render import thrash_note

    by_batch = {r["batch_size"]: r for r in rows if r["status"] == "ok" and r.get("search_id") == v["search_id"]}
    for at, batch in (("max", v["max_batch"]), ("fastest", v["fastest_batch"])):
        v[f"alloc_retries_at_{at}"] = by_batch.get(batch, {}).get("alloc_retries")
    # a batch that fits only because the caching allocator freed and retried runs slower
    v["allocator"] = thrash_note(v["max_batch"], v["alloc_retries_at_max"], v["fastest_batch"], v["alloc_retries_at_fastest"])
    fast = by_batch.get(v["fastest_batch"], {})
    v["tflops_at_fastest"] = fast.get("tflops_per_gpu")
    probes = [r for r in rows if r.get("search_id") == v["search_id"]]
    v["search_wall_s"] = sum(r.get("trial_wall_s") or 0 for r in probes)
    # what the search cost against measuring the answer once on fresh processes
    one = cost.fresh_trial_s(fast, probes)
    v["cost_vs_one_trial"] = v["search_wall_s"] / one if one else None
