"""What `sweep run`, `sweep max-batch` and `sweep tune` print around a run (sweep.service runs it): the warnings
before it; after it, the rows, a search's verdicts, the GPU time, and the exit status."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import typer

from sweep import service

if TYPE_CHECKING:
    from rich.console import Console

    from clusters.schema import ClusterProfile
    from sweep.execution.runner import RunReport
    from sweep.memory.predictor import Predictor
    from sweep.record.schema import Row
    from sweep.search.plan import Plan, Verdict
    from sweep.spec.grid import Trial

NOTHING_MEASURED = 3  # exit status of a sweep whose every attempt was oom, error, timeout or unsupported
# A teardown longer than this is printed (the GPUs stay held through it): on one H200 a GPT-1.5B tune's process
# was still running 35 s after its last attempt ended (RESULTS.md, session 10); this line says if that was it.
TEARDOWN_NOTE_S = 5.0


def execute(
    plan: Plan,
    trials: list[Trial],
    profile: ClusterProfile,
    output: Path,
    predictor: Predictor | None = None,
    **options: Any,
) -> None:
    """What `run`, `max-batch` and `tune` do once planned: check --output, warn, run the plan, report and exit.
    `predictor`: the memory model calibrated on --output's rows (loaded here when the plan did not need one).
    `options`: sweep.service.run_plan's."""
    service.check_output(output)
    print_warnings(trials, profile)
    predictor = predictor or service.load_predictor(profile, output)
    finish(service.run_plan(plan, profile, output, predictor, **options), output, plan, predictor)


def print_warnings(trials: list[Trial], profile: ClusterProfile, console: Console | None = None) -> None:
    """Combinations that run but mislead (sweep.spec.advice), in yellow: under the plan, on stderr before a run."""
    from rich.console import Console

    from sweep.spec.advice import plan_warnings

    warn(plan_warnings(trials, is_gpu=profile.is_gpu), console or Console(stderr=True))


def warn(lines: list[str], console: Console) -> None:
    """Each line as `warning: ...`, in yellow, unwrapped."""
    from rich.markup import escape

    for line in lines:
        console.print(f"[yellow]warning:[/yellow] {escape(line)}", soft_wrap=True)


def finish(report: RunReport, output: Path, plan: Plan, predictor: Predictor | None = None) -> None:
    """The run's rows (as `sweep results show` prints them) and a warning per `auto` measurement short of its
    target, the verdicts of a search, then the exit status."""
    from rich.console import Console

    from sweep.record import cost
    from sweep.results import intervals, render
    from sweep.text import plural

    rows = report.rows
    if rows:
        render.rich_table(
            cast("list[dict[str, Any]]", rows),  # the table reads any rows as plain dicts of columns
            render.SHOW_COLS,
            f"run {report.run_id}: {plural(len(rows), 'attempt')}"
            + (f" ({report.reused} reused from earlier runs)" if report.reused else ""),
            note=intervals.ci_note(rows),
        )
    console = Console(stderr=True)
    warn(intervals.missed_target_warnings(rows), console)  # `steps: auto` that stopped short: said, not only marked
    if verdicts := plan.verdicts():  # probes reused by --resume count too
        write_verdicts(output, report.run_id, verdicts, rows + report.reused_rows, predictor)
    gpu_time = cost.summary_line(rows)  # this run's attempts: rows reused by --resume cost nothing now
    if gpu_time:
        typer.echo(gpu_time)
    if (report.teardown_s or 0.0) > TEARDOWN_NOTE_S:  # the GPUs are held until it ends: say what it cost
        console.print(f"teardown: {report.teardown_s:.1f} s to stop the rank processes and Ray after the last attempt")
    if report.interrupted:
        _interrupted(report, output, console)
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


def _interrupted(report: RunReport, output: Path, console: Console) -> None:
    """Say how to finish an interrupted run, and exit as a shell reports a signal: 130 Ctrl-C, 143 SIGTERM."""
    import signal

    from sweep.text import plural

    signum = report.interrupted_by or signal.SIGINT
    by = "" if signum == signal.SIGINT else f" by {signal.Signals(signum).name}"
    console.print(
        f"interrupted{by}: {plural(len(report.rows), 'attempt')} written to {output}; rerun with --resume to finish"
    )
    raise typer.Exit(128 + signum)


def write_verdicts(
    output: Path, run_id: str, verdicts: list[Verdict], rows: list[Row], predictor: Predictor | None = None
) -> None:
    """Complete a search's verdicts from its rows (sweep.service.complete_verdicts), print them and record them
    beside the rows. Under each max-batch verdict, on GPU ranks: predicted against measured peak per probe."""
    from sweep.memory.predictor import peak_line
    from sweep.results.verdicts import print_tables

    verdicts = service.complete_verdicts(verdicts, rows)
    saved = [service.verdict_json(v) for v in verdicts]
    print_tables(saved)
    for v in saved:
        if v["kind"] == "max_batch" and predictor is not None and predictor.profile.is_gpu:
            typer.echo(peak_line(v, predictor.probe_peaks([r for r in rows if r.get("search_id") == v["search_id"]])))
    service.record_verdicts(output, run_id, verdicts)
