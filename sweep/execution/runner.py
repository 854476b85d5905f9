"""Run a plan on a cluster: trials → scheduler → rows → Parquet, with progress and resume.

Each finished attempt is written at once (one atomic file), so a killed driver loses only the trials
that were running. With `resume`, attempts already recorded under `output` are not run again: their rows
are fed back to the plan, which then asks for exactly the follow-ups (OOM retries, search probes) that
the first run would have, and those that are recorded too are skipped in turn.
"""

from __future__ import annotations

import functools
import secrets
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusters.schema import ClusterProfile
from sweep.record import store
from sweep.record.energy import power_limit_mismatch
from sweep.record.hardware import accelerator_mismatch
from sweep.record.rows import outcome_row, unsupported_row
from sweep.record.schema import Row
from sweep.spec.grid import Trial
from trainer.recipes import RECIPES, unsupported_reason

if TYPE_CHECKING:
    from collections.abc import Callable

    from sweep.execution.prestart import Prestart
    from sweep.execution.scheduler import Scheduler
    from sweep.memory.calibration import Calibration
    from sweep.memory.predictor import Predictor
    from sweep.search.plan import Plan
    from trainer.job import TrialConfig

    # what makes the scheduler: called as (profile, max_concurrent=, reuse=); Scheduler itself, or a test's simulation
    SchedulerFactory = Callable[..., Scheduler]


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)


def unsupported(trial: Trial, profile: ClusterProfile, calibration: Calibration | None = None) -> str | None:
    """Why `trial` cannot run on `profile`, or None: the recipe on this hardware and install first, then
    whether the training state alone fits each rank's memory, then (GPU ranks, unless the trial says not to)
    whether its predicted peak does (sweep.memory.model; `calibration` from the cluster's rows)."""
    from sweep.memory.capacity import per_rank_memory, state_reason
    from sweep.memory.predictor import NO_ROWS, predicted_reason
    from sweep.spec.layout import layout_unsupported
    from trainer.kernels import kernel_unsupported

    info = profile.accelerator_info
    memory = per_rank_memory(
        memory_cap=trial.memory_cap_bytes,
        memory_per_device=profile.memory_per_device_bytes,
        accelerator=profile.accelerator,
        memory_gib=info.memory_gib,
    )
    return (
        unsupported_reason(
            RECIPES[trial.precision],
            accelerator=profile.accelerator,
            vendor=info.vendor,
            compute_capability=info.compute_capability,
            has_fp8=info.peak_tflops["fp8"] is not None,
        )
        or layout_unsupported(trial)
        or kernel_unsupported(
            trial.options(),
            recipe=RECIPES[trial.precision],
            model=trial.model,
            vendor=info.vendor,
            compute_capability=info.compute_capability,
        )
        # HSDP replicas each hold the whole state: it is sharded over one replica's ranks, dp_shard x tp
        or state_reason(n_params=trial.model.n_params(), ranks=trial.dp_shard * trial.tp, memory=memory)
        # GPU ranks only: a CPU rank's peak is its resident set's high-water mark (trainer/memory.py), which
        # counts what glibc's arenas and touched pages hold, not tensor bytes, and is not predicted here
        or (
            predicted_reason(trial, memory, calibration or NO_ROWS) if profile.is_gpu and trial.predict_memory else None
        )
    )


@dataclass
class RunReport:
    run_id: str
    rows: list[Row] = field(default_factory=list)  # rows written by this run
    reused_rows: list[Row] = field(default_factory=list)  # attempts found already recorded (resume)
    interrupted_by: int | None = None  # the stop signal (SIGINT, SIGTERM) that ended the run early, else None
    teardown_s: float | None = None  # stopping the rank processes and Ray, after the last attempt

    @property
    def interrupted(self) -> bool:
        return self.interrupted_by is not None

    @property
    def reused(self) -> int:
        return len(self.reused_rows)


class _Progress:
    """A Rich progress bar whose total grows as retries and probes are added."""

    def __init__(self, enabled: bool) -> None:
        self.bar: Any = None
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn("[bold]sweep"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                transient=False,
            )
            self.task = self.bar.add_task("", total=0)

    def __enter__(self) -> _Progress:
        if self.bar:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar:
            self.bar.__exit__(*exc)

    def add(self, n: int = 1) -> None:
        if self.bar:
            self.bar.update(self.task, total=(self.bar.tasks[0].total or 0) + n)

    def done(self, row: Row) -> None:
        if self.bar:
            tf = f" {row['tflops_per_gpu']:.3g} TFLOP/s/GPU" if row.get("tflops_per_gpu") else ""
            self.bar.console.print(
                f"  {row['status']:<11} {row['model']} {row['precision']} bs={row['batch_size']} "
                f"gpus={row['world_size']}{tf}" + (f"  ({error[:100]})" if (error := row.get("error")) else "")
            )
            self.bar.advance(self.task)

    def warn(self, text: str) -> None:
        from rich.console import Console
        from rich.markup import escape

        Console(stderr=True).print(f"[yellow]warning:[/yellow] {escape(text)}", soft_wrap=True)

    def running(self, trials: list[Trial]) -> None:
        self.status(", ".join(t.describe() for t in trials[:3]))

    def status(self, text: str) -> None:
        if self.bar:
            self.bar.update(self.task, description=text)


def execute(
    plan: Plan,
    *,
    profile: ClusterProfile,
    output: Path,
    run_id: str | None = None,
    grid_name: str | None = None,
    resume: bool = False,
    max_concurrent: int | None = None,
    progress: bool = True,
    reuse_actors: bool = True,
    precompile: bool = False,
    predictor: Predictor | None = None,
    scheduler: SchedulerFactory | None = None,
) -> RunReport:
    """Run `plan`'s trials and their follow-ups on `profile`'s cluster, one row each under `output`. With
    `reuse_actors` (the default) rank processes run one trial after another (`sweep.execution.scheduler`); without
    it (`--fresh-actors`) every trial starts processes of its own; with `precompile` (`sweep run`'s default; off with
    `--no-precompile`) a new group compiles its trials' graphs at once as it starts (`trainer.precompile`), without it
    each trial as it is reached.
    `predictor` (sweep.memory.predictor): the memory model's calibration, refined by each clean row the run records.
    `scheduler`: what makes the scheduler, called as `scheduler(profile, max_concurrent=, reuse=)` (its submit / poll
    / busy / running / shutdown); None: connect to Ray and use `sweep.execution.scheduler.Scheduler` (a test passes a
    simulated one: no Ray)."""
    from sweep.execution.ray_connection import signals_held

    report = RunReport(run_id=run_id or new_run_id())
    recorded = store.existing_rows(output) if resume else {}
    # Ctrl-C (or SIGTERM) is recorded and acted on at the top of each round (within one poll, ~0.5 s), not
    # raised wherever it lands (see signals_held); the teardown below runs with it still held.
    with _Progress(progress) as bar, signals_held() as ctrl_c:
        run = _Execution(
            plan,
            profile=profile,
            output=output,
            report=report,
            recorded=recorded,
            bar=bar,
            grid_name=grid_name,
            max_concurrent=max_concurrent,
            reuse_actors=reuse_actors,
            precompile=precompile,
            predictor=predictor,
            make_scheduler=scheduler,
        )
        try:
            run.loop(ctrl_c)
        except KeyboardInterrupt as e:  # sweep.execution.ray_connection.Interrupted names its signal
            report.interrupted_by = getattr(e, "signum", signal.SIGINT)
        finally:
            began = time.perf_counter()
            run.close()  # kill actors, remove placement groups, shut the embedded Ray: nothing is orphaned
            report.teardown_s = time.perf_counter() - began
            _compact(output, report)
    return report


def _compact(output: Path, report: RunReport) -> None:
    """Merge the run's attempt files (``sweep.record.compact``); a failure leaves them as they are, and says so:
    every row is on disk either way."""
    from sweep.record.compact import compact

    clusters = sorted({str(row["cluster"]) for row in report.rows if row.get("cluster")})
    if not clusters:
        return
    try:
        compact(output, [Path(output) / f"cluster={store.safe_part(c)}" for c in clusters])
    except Exception as e:  # a full disk, an unreadable older file: the rows stay one file per attempt
        print(f"warning: result files under {output} not merged ({type(e).__name__}: {e})", file=sys.stderr)


class _Execution:
    """One `execute`: the plan's queue of trials, the rows already recorded (resume), and the scheduler once
    Ray is reached. Every attempt is written as it finishes and fed back to the plan for its follow-ups."""

    def __init__(
        self,
        plan: Plan,
        *,
        profile: ClusterProfile,
        output: Path,
        report: RunReport,
        recorded: dict[str, Row],
        bar: _Progress,
        grid_name: str | None,
        max_concurrent: int | None,
        reuse_actors: bool,
        precompile: bool = False,
        predictor: Predictor | None = None,
        make_scheduler: SchedulerFactory | None = None,
    ) -> None:
        self.plan, self.profile, self.output, self.report, self.recorded, self.bar = (
            plan,
            profile,
            output,
            report,
            recorded,
            bar,
        )
        self.predictor, self.make_scheduler = predictor, make_scheduler
        self.base = {"run_id": report.run_id, "profile": profile, "grid_name": grid_name}
        self.max_concurrent, self.reuse_actors, self.precompile = max_concurrent, reuse_actors, precompile
        self.queue: deque[Trial] = deque(plan.initial())
        self.seen: set[str] = set()
        self.scheduler: Scheduler | None = None
        self.started_ray = False
        self.prestart: Prestart | None = None  # rank processes the Ray it starts starts ahead
        self.ctrl_c: list[int] = []  # the stop signals received (execute's signals_held)
        self.warnings: set[str] = set()  # said once a run, however many rows repeat them
        bar.add(len(self.queue))

    def loop(self, ctrl_c: list[int]) -> None:
        from sweep.execution.ray_connection import Interrupted

        self.ctrl_c = ctrl_c
        # Reach Ray before writing anything: a cluster that cannot be reached is the user's to fix
        # (exit 2, no rows), not a run with only its unsupported rows written.
        if runs := self.runnable():
            self.start(runs)
        while self.queue or (self.scheduler and self.scheduler.busy):
            if ctrl_c:
                raise Interrupted(ctrl_c[0])
            self.submit_queued()
            if self.scheduler and self.scheduler.busy:
                self.collect()

    def runnable(self) -> list[Trial]:
        """The queued trials it will run: not those recorded already (--resume) or unsupported (predicted OOM too)."""
        return [t for t in self.queue if t.trial_id not in self.recorded and self.unsupported(t) is None]

    def start(self, runs: list[Trial]) -> Scheduler:
        """Reach Ray (started with what it starts ahead for `runs`, the `runnable` trials); the scheduler."""
        from sweep.execution.placement import node_groups
        from sweep.execution.prestart import Prestart
        from sweep.execution.ray_connection import connect
        from sweep.execution.scheduler import Scheduler

        make: SchedulerFactory
        if self.make_scheduler is None:
            groups = node_groups(self.profile, self.max_concurrent)
            compiles, precisions = any(t.compile != "none" for t in runs), {t.precision for t in runs}
            self.prestart = Prestart.of(self.profile, self.ahead_graphs(runs), groups, compiles, precisions)
            self.started_ray = connect(self.profile, self.prestart)
            if self.prestart and self.started_ray:  # no group is placed (no GPU held) while its processes import
                self.bar.status(f"starting {self.prestart.expected} rank processes ahead (importing torch)")
                self.prestart.wait(stopped=lambda: bool(self.ctrl_c))
                if (ready := self.prestart.ready()) < self.prestart.expected and not self.ctrl_c:
                    self.bar.warn(self.prestart.late(ready))
            env_in_ray = bool(self.prestart and self.started_ray)  # the ranks' environment: Ray's own
            make = functools.partial(Scheduler, precompile=self.precompile, env_in_ray=env_in_ray)
        else:  # no Ray to reach: the caller's scheduler
            make = self.make_scheduler
        self.scheduler = make(self.profile, max_concurrent=self.max_concurrent, reuse=self.reuse_actors)
        return self.scheduler

    def ahead_graphs(self, runs: list[Trial]) -> tuple[TrialConfig, ...]:
        """One one-rank trial of `runs` (the `runnable` ones: side processes given these as they start compile them
        all, and a first trial waits for every one) per set of graphs that the run's groups would compile ahead
        (`compile_ahead`)."""
        from sweep.execution.placement import trial_config
        from trainer.job import compile_ahead

        if not (self.precompile and self.reuse_actors):
            return ()
        configs = [trial_config(t) for t in runs if t.gpus == 1]
        return compile_ahead(configs[0], configs[1:], 1) if configs else ()

    def submit_queued(self) -> None:
        """Each queued trial once: reused from an earlier run (resume), recorded `unsupported`, or scheduled."""
        while self.queue:
            trial = self.queue.popleft()
            if trial.trial_id in self.seen:  # the same config reached twice (e.g. a retry the grid has)
                self.bar.add(-1)
                continue
            self.seen.add(trial.trial_id)
            if trial.trial_id in self.recorded:  # --resume: reuse the row, let the plan continue from it
                row = self.recorded[trial.trial_id]
                self.report.reused_rows.append(row)
                self.follow_up(trial, row, _was_infrastructure(row))
                continue
            reason = self.unsupported(trial)
            if reason:  # no actors, no GPU time
                self.record(trial, unsupported_row(trial, reason, **self.base))
                continue
            scheduler = self.scheduler or self.start([trial, *self.runnable()])  # a resumed row's follow-up, first
            scheduler.submit(trial)

    def unsupported(self, trial: Trial) -> str | None:
        return unsupported(trial, self.profile, self.predictor.calibration if self.predictor else None)

    def collect(self) -> None:
        """Wait up to half a second for attempts to finish; record each."""
        scheduler = self.scheduler
        assert scheduler is not None, "collect runs once the scheduler is busy"
        for outcome in scheduler.poll(timeout=0.5):
            row = outcome_row(outcome, **self.base)
            trace = (outcome.ranks[0].profile or {}).get("trace_gz") if outcome.status == "ok" else None
            if trace:  # written before the row, so that a row never names a missing trace
                row["trace_file"] = store.write_trace(self.output, row, trace)
            self.record(outcome.trial, row, outcome.infrastructure)
            if outcome.note:  # a warm group retired for what it kept: say why reuse stopped
                self.bar.warn(outcome.note)
            for wrong in (power_limit_mismatch(row), accelerator_mismatch(row)):
                if wrong and wrong not in self.warnings:
                    self.warnings.add(wrong)
                    self.bar.warn(wrong)
        self.bar.running(scheduler.running())

    def record(self, trial: Trial, row: Row, infrastructure: bool = False) -> None:
        store.write_row(self.output, row)
        self.report.rows.append(row)
        if self.predictor is not None:  # the trials still to come are predicted with this row too
            self.predictor.learn(row)
        self.follow_up(trial, row, infrastructure)

    def follow_up(self, trial: Trial, row: Row, infrastructure: bool) -> None:
        """Show the attempt and queue what the plan asks for next (retries, search probes)."""
        self.bar.done(row)
        status = row["status"]
        assert status is not None, "every recorded attempt has a status"
        follow = self.plan.on_result(trial, status, infrastructure, row)
        self.bar.add(len(follow))
        self.queue.extend(follow)

    def close(self) -> None:
        from sweep.execution.ray_connection import disconnect

        if self.scheduler is not None:
            self.scheduler.shutdown()
        disconnect(self.started_ray)
        if self.prestart:
            self.prestart.close()


def _was_infrastructure(row: Row) -> bool:
    """Whether a recorded attempt was lost to the machinery (so the plan retries it), from its row alone."""
    from sweep.execution.outcome import is_infrastructure_error

    return row["status"] == "error" and is_infrastructure_error(row.get("error"))
