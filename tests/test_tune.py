"""`search: fastest` (sweep.search.fastest.search): the search, driven by a simulated runner. Pure logic: no Ray, no
torch.

The simulated machine plays the runner: a trial's peak memory is fixed + batch x (activations its ac
keeps), it runs out of memory past the capacity, and its TFLOP/s is a product of per-option factors, so
the fastest configuration is known and every decision of the search can be checked against it.
"""

from __future__ import annotations

import itertools
import math
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from conftest import verdicts_json

from clusters.registry import load_profile
from sweep.errors import UserError
from sweep.execution.outcome import INFRA_PREFIX, Outcome
from sweep.execution.runner import execute
from sweep.record import store
from sweep.search.fastest.cost import final_auto_max
from sweep.search.fastest.memory import fitted, needs
from sweep.search.fastest.plan import TunePlan
from sweep.search.fastest.search import LONGER, SHORT, probe_steps
from sweep.search.fastest.space import Config, Space, at_least_as_heavy
from sweep.search.fastest.verdict import PROFILE_KEYS
from sweep.spec.expand import expand
from sweep.spec.grid import (
    DEFAULT_TIMEOUT_S,
    KERNEL_OPTIONS,
    MEASURE_MAX_DEFAULT,
    NUMERICS_CHANGING,
    TUNABLE,
    parse_grid,
)
from trainer.flops import spec_flops_per_token
from trainer.result import RankResult

GIB = 1024**3
ACTIVATIONS = {"none": 1.0, "selective": 0.5, "full": 0.2}  # GiB per sample kept for the backward pass
AC_SPEED = {"none": 1.0, "selective": 0.9, "full": 0.75}  # recomputation costs time
COMPILE_SPEED = {"none": 0.8, "regional": 1.0, "full": 1.05}
# the options the simulated Machine models (the kernel options, which it does not: tests/test_kernel_options.py)
ALL_OPTIONS = [o for o in TUNABLE if o not in KERNEL_OPTIONS]
VERDICT_KEYS = {
    "kind",
    "search_id",
    "model",
    "precision",
    "seq_len",
    "gpus",
    "cluster",
    "allowed",
    "numerics_allowed",
    "global_batch_tokens",
    "budget",
    "max_cost",
    "best",
    "baseline",
    "tflops_at_best",
    "baseline_tflops",
    "speedup",
    "skipped_for_cost",
    "best_trial_id",
    "baseline_trial_id",
    "candidates",
    "tried",
    "probes",
    "search_wall_s",
    "cost_vs_one_trial",
    "aborted",
    "profile",
}


@dataclass
class Machine:
    """Plays the runner: one row per trial, as sweep.record.rows.outcome_row writes it (the fields a plan reads)."""

    capacity_gib: float = 40.0
    fixed_gib: float = 4.0
    failing_compile: str | None = None  # this compile mode errors (not memory)
    thrash_gib: float | None = None  # a peak past this fits only with allocator retries...
    thrash_speed: float = 0.5  # ...at this share of its speed
    head_gib: float = 0.0  # what an FP8 head adds to the peak (its FP8 copies of the largest weight)
    ac_speed: dict = field(default_factory=lambda: dict(AC_SPEED))
    options_matter: bool = True  # False: only the batch and ac change the speed
    # what each option value multiplies the speed by (accumulation: 1 + this per doubling of micro-batches)
    gains: dict = field(default_factory=lambda: {"bf16": 1.05, "step": 1.04, "head": 1.03, "accum": 0.03})
    accum_gib: float = 0.0  # what accumulating keeps: fp32 gradients (rows: params_local = this / 4 B a rank)
    compile_gib: dict = field(default_factory=dict)  # compile mode -> GiB per sample it adds
    lost: set[int] = field(default_factory=set)  # attempt numbers lost to the infrastructure
    failing_steps: tuple | None = None  # trials of these (warm-up, measured) steps error (not memory)
    timed: bool = False  # rows say what a step and a start-up take: the cost cap (sweep.search.fastest.cost) has them
    hangs: Any = None  # trial -> bool: it hangs until its timeout_s (the scheduler then kills it: status timeout)
    attempts: int = 0

    def peak(self, t) -> float:
        # grad_sync: step keeps whole gradients until the step's end: more memory per micro-batch here
        return (
            self.fixed_gib
            + t.batch_size
            * (ACTIVATIONS[t.ac] * (1.5 if t.grad_sync == "step" else 1.0) + (self.compile_gib.get(t.compile, 0.0)))
            + (self.head_gib if t.fp8_lm_head else 0.0)
            + (self.accum_gib if t.grad_accum > 1 else 0.0)
        )

    def tflops(self, t) -> float:
        speed = 100 * (1 - 1 / (t.batch_size + 1)) * self.ac_speed[t.ac]
        if not self.options_matter:
            return speed
        g = self.gains
        speed *= COMPILE_SPEED[t.compile] * (1 + g["accum"] * math.log2(t.grad_accum))
        return (
            speed
            * (g["bf16"] if t.reduce_dtype == "bf16" else 1)
            * (g["step"] if t.grad_sync == "step" else 1)
            * (g["head"] if t.fp8_lm_head else 1)
        )

    def __call__(self, t) -> tuple[dict, bool]:
        self.attempts += 1
        row = {
            "trial_id": t.trial_id,
            "trial_wall_s": 10.0 + t.batch_size / 10,
            "warmup_steps": t.warmup_steps,
            "measure_steps": t.measure_steps,
            "tflops_per_gpu": None,
            "tokens_per_s_per_gpu": None,
            "peak_mem_gib": None,
            "params_local": [self.accum_gib * GIB / 4] * t.gpus if self.accum_gib else None,
        }
        if self.attempts in self.lost:
            return {**row, "status": "error", "error": INFRA_PREFIX + "rank process died"}, True
        if t.compile == self.failing_compile or (t.warmup_steps, t.measure_steps) == self.failing_steps:
            return {**row, "status": "error", "error": "compile failed"}, False
        if self.hangs and self.hangs(t):
            return {**row, "status": "timeout", "trial_wall_s": t.timeout_s}, False
        if self.peak(t) > self.capacity_gib:
            return {**row, "status": "oom"}, False
        speed = self.tflops(t)
        thrashes = self.thrash_gib is not None and self.peak(t) > self.thrash_gib
        speed *= (self.thrash_speed if thrashes else 1.0) * (0.98 if t.profiled else 1.0)  # a profile's short reading
        row.update(
            status="ok",
            tflops_per_gpu=speed,
            tokens_per_s_per_gpu=speed * 10,
            peak_mem_gib=self.peak(t),
            alloc_retries=8 if thrashes else 0,
        )
        if self.timed:  # every attempt on fresh processes: its wall is a start-up, a compile, and its steps
            step = t.batch_size * t.grad_accum / speed
            row.update(
                step_time_s=step,
                compile_time_s=5.0,
                init_time_s=2.0,
                group_trial_index=0,
                trial_wall_s=2.0 + 5.0 + (t.warmup_steps + t.measure_steps) * step,
            )
        if t.profiled:  # the trainer's summary of the traced steps
            row.update(
                profile_gemm_pct=60.0,
                profile_attention_pct=20.0,
                profile_comm_exposed_pct=5.0,
                profile_optimizer_pct=5.0,
                profile_other_pct=10.0,
            )
        return row, False


@dataclass
class Run:
    asked: list  # the trials in the order they were answered
    rows: list  # (row, infrastructure) per attempt, in order
    known: dict = field(default_factory=dict)  # trial_id -> how many rows the plan had when it asked for it

    def of(self, t) -> dict:
        return next(r for r, _ in self.rows if r["trial_id"] == t.trial_id)


class Watched:
    """The plan as the runner sees it, watched: what it asked and when, each row it was told. A trial asked twice
    fails the test (the runner would drop it silently and the search would stall)."""

    def __init__(self, plan):
        self.plan, self.run = plan, Run([], [])

    def _asked(self, trials: list) -> list:
        for t in trials:
            assert t.trial_id not in self.run.known, f"asked twice: {t.describe()}"
            self.run.known[t.trial_id] = len(self.run.rows)
        return trials

    def initial(self) -> list:
        return self._asked(self.plan.initial())

    def on_result(self, trial, status: str, infrastructure: bool = False, row: dict | None = None) -> list:
        self.run.asked.append(trial)
        self.run.rows.append((row, infrastructure))
        return self._asked(self.plan.on_result(trial, status, infrastructure, row))


def outcome(t, row: dict, infrastructure: bool) -> Outcome:
    """The Outcome a scheduler returns for `row` (the simulated machine's, or a recorded one): rank results from
    which sweep.record.rows.outcome_row writes that row's fields back (its TFLOP/s to a rounding, its step time)."""
    o = Outcome(
        trial=t,
        status=row["status"],
        error=row.get("error"),
        wall_s=row["trial_wall_s"],
        infrastructure=infrastructure,
        group_trial_index=row.get("group_trial_index") or 0,
    )
    if row["status"] != "ok":
        return o
    # an untimed machine's step: b x accum samples at S TFLOP/s take b x accum / S seconds (as its timed rows say)
    step = row.get("step_time_s") or t.batch_size * t.grad_accum / row["tflops_per_gpu"]
    # the parameters that make a token's FLOPs give the row's TFLOP/s at that step time
    samples = t.batch_size * t.grad_accum * t.seq_len / t.layout_ranks
    flops = row["tflops_per_gpu"] * 1e12 * step / samples
    n_params = round((flops - spec_flops_per_token(t.model, t.seq_len, n_params=0)) / 6)
    warmup, measure = (
        n if isinstance(n, int) else t_n if isinstance(t_n, int) else most
        for n, t_n, most in zip(
            (row.get("warmup_steps"), row.get("measure_steps")),
            (t.warmup_steps, t.measure_steps),
            t.auto_max or (3, 5),
            strict=True,
        )
    )
    # an untimed machine's rows say nothing of what a trial costs: without a warm-up count no cost is predicted
    # (sweep.search.fastest.cost.one_trial_s), as without the step times its rows lack
    warmup = warmup if row.get("step_time_s") else None
    rank = {
        "step_times": [step] * measure,
        "n_params": n_params,
        "warmup_steps": warmup,
        "losses": [1.0] * measure,
        "loss_first": 1.0,
        "loss_last": 1.0,
        "tokens_per_step": t.batch_size * t.grad_accum * t.seq_len,
        "alloc_retries": row.get("alloc_retries"),
        "peak_mem_bytes": row["peak_mem_gib"] * GIB if row.get("peak_mem_gib") is not None else None,
        "compile_time_s": row.get("compile_time_s"),
        "init_time_s": row.get("init_time_s"),
    }
    if t.profiled:  # what the trainer's profiler hands the driver: the traced steps' shares, the trace's bytes
        rank["profile"] = {**{k: row.get(f"profile_{k}") for k in PROFILE_KEYS}, "trace_gz": b"trace"}
    o.ranks = [RankResult(status="ok", **rank, params_local=n) for n in row.get("params_local") or [0] * t.gpus]
    return o


class SimScheduler:
    """The runner's scheduler (sweep.execution.scheduler: submit, poll, busy, running, shutdown) on the simulated
    machine (a trial -> (row, infrastructure)): one answer a poll, the first submitted first (last_first: the
    latest, as concurrent trials may finish in any order). Without a machine a submitted trial fails the test (a
    resumed run must reuse every row). A machine that answers None stops: that trial and those submitted after it
    are left `unanswered`, and the run ends."""

    def __init__(self, machine, last_first: bool = False):
        self.machine, self.last_first, self.waiting = machine, last_first, []
        self.unanswered: list = []

    def __call__(self, profile, *, max_concurrent, reuse) -> SimScheduler:  # the runner's factory
        return self

    @property
    def busy(self) -> bool:
        return bool(self.waiting)

    def running(self) -> list:
        return []

    def submit(self, trial) -> None:
        assert self.machine is not None, f"not recorded: {trial.describe()}"
        self.waiting.append(trial)

    def poll(self, timeout: float = 1.0) -> list[Outcome]:
        t = self.waiting[-1] if self.last_first else self.waiting[0]
        answer = self.machine(t)
        if answer is None:
            self.unanswered, self.waiting = self.waiting, []
            return []
        self.waiting.remove(t)
        return [outcome(t, *answer)]

    def shutdown(self) -> None:
        pass


def run(
    plan,
    machine=None,
    recorded: list | None = None,
    last_first: bool = False,
    profile: str = "local",
    scheduler: SimScheduler | None = None,
) -> Run:
    """The runner (sweep.execution.runner.execute) on the simulated machine: it runs what the plan asks, records
    each row, feeds it back and queues the follow-ups. `recorded`: the rows of an earlier run, reused (--resume)."""
    watched = Watched(plan)
    scheduler = scheduler or SimScheduler(machine, last_first)
    with tempfile.TemporaryDirectory() as output:
        for row, _ in recorded or []:
            store.write_row(Path(output), row)
        # one run id for every run: a row's trace file is named by it (trace_file), and two runs compare equal
        execute(
            watched,
            profile=load_profile(profile),
            output=Path(output),
            run_id="simulated",
            resume=recorded is not None,
            progress=False,
            scheduler=scheduler,
        )
    return watched.run


def trace_file(r: Run, t) -> str:
    """Where the runner wrote `t`'s trace (sweep.record.store.write_trace): beside its row, named by its trial id."""
    row = r.of(t)
    assert row["trace_file"] == f"cluster=local/run={row['run_id']}/_traces/{t.trial_id}.pt.trace.json.gz"
    return row["trace_file"]


def grid(**extra):
    data = {
        "models": ["llama-tiny"],
        "precisions": ["fp8-torchao-tensorwise"],
        "batch_sizes": [2],
        "gpus": 2,
        "seq_len": 128,
        "search": "fastest",
        "steps": {"warmup": 3, "measure": 10},
        **extra,
    }
    spec = parse_grid(data)
    return spec, expand(spec, cluster="local")


def plan(capacity_gib: float | None = 40.0, **extra) -> TunePlan:
    spec, trials = grid(**extra)
    return TunePlan(trials, spec, capacity_bytes=capacity_gib * GIB if capacity_gib else None)


def is_short(t) -> bool:
    """A short probe: the best's profile trial has its steps but is no probe (it is profiled)."""
    return (t.warmup_steps, t.measure_steps) == probe_steps(SHORT, t.grad_accum) and not t.profiled


def is_longer(t) -> bool:
    return (t.warmup_steps, t.measure_steps) == probe_steps(LONGER, t.grad_accum)


def config(t) -> Config:
    return Config(*(getattr(t, name) for name in Config._fields))


def finals(r: Run, spec_steps=(3, 10)) -> list:
    return [t for t in r.asked if (t.warmup_steps, t.measure_steps) == spec_steps]


# 1. the candidate space


def test_an_option_ranges_over_its_grid_axis_when_listed_else_over_all_its_values():
    r = run(plan(compile=["none", "regional"], tune={"vary": ["batch_size", "ac", "compile", "grad_accum"]}), Machine())
    assert {t.compile for t in r.asked} == {"none", "regional"}  # the grid's two, never full
    assert {t.ac for t in r.asked} == {"none", "selective", "full"}  # one in the grid: all of them
    assert {t.grad_accum for t in r.asked} == {1, 2, 4, 8}


def test_numerics_changing_options_stay_at_the_grid_values_unless_vary_names_them():
    fixed = {"reduce_dtype": "bf16", "fp8_lm_head": True, "grad_sync": "step"}
    p = plan(**fixed, tune={"budget": 40})  # the default vary names none of them
    r = run(p, Machine(capacity_gib=200))
    for t in r.asked:
        assert (t.reduce_dtype, t.fp8_lm_head) == ("bf16", True)
        assert t.grad_sync == ("step" if t.grad_accum > 1 else "micro_batch")  # one micro-batch: nothing to wait for
    (v,) = verdicts_json(p)
    assert v["numerics_allowed"] == [] and v["best"]["reduce_dtype"] == "bf16"
    allowed = run(plan(**fixed, tune={"vary": ALL_OPTIONS}), Machine(capacity_gib=200))
    assert {(t.reduce_dtype, t.fp8_lm_head) for t in allowed.asked} > {("bf16", True)}  # named: they move


def test_options_that_fold_away_are_one_candidate_and_never_probed_twice():
    # gpt (tied head) in bf16 on one rank: no FP8 head, no reduction across ranks, so only ac, compile,
    # grad_accum and loss are real; `run` fails on a trial asked twice
    p = plan(models=["gpt-tiny"], precisions=["bf16"], gpus=1, tune={"vary": ALL_OPTIONS})
    r = run(p, Machine())
    assert {(t.reduce_dtype, t.grad_sync, t.fp8_lm_head) for t in r.asked} == {("fp32", "micro_batch", False)}
    (v,) = verdicts_json(p)
    batches = {ac: {t.batch_size for t in r.asked if t.ac == ac and is_short(t)} for ac in ACTIVATIONS}
    # ac batches x compile x grad_accum x loss
    assert v["candidates"] <= sum(len(b) for b in batches.values()) * 3 * 4 * 2


def test_the_batch_search_finds_the_largest_batch_that_fits():
    m = Machine(capacity_gib=40.0)  # ac none: 4 + b <= 40: b <= 36
    p = plan()
    r = run(p, m)
    base = [t for t in r.asked if t.ac == "none" and t.compile == "regional" and t.grad_accum == 1]
    assert max(t.batch_size for t in base if r.of(t)["status"] == "ok") == 36
    assert all(t.batch_size <= 37 for t in r.asked if t.ac == "none")  # past the first OOM: never
    (v,) = verdicts_json(p)
    assert v["baseline"]["batch_size"] == 36  # the fastest for the grid's options (speed grows with the batch)


def test_a_fixed_batch_is_the_seed_batch_in_every_probe():
    r = run(plan(batch_sizes=[3], tune={"vary": ["ac", "compile", "grad_accum"]}), Machine())
    assert {t.batch_size for t in r.asked} == {3}


# 2. global_batch_tokens


@pytest.mark.parametrize(
    "tokens,vary",
    [
        (16384, ["batch_size", "ac", "compile", "grad_accum"]),
        (16384, ALL_OPTIONS),
        (3 * 2 * 128 * 8, ["batch_size", "grad_accum"]),
    ],
)
def test_every_probe_holds_the_global_batch(tokens, vary):
    p = plan(tune={"vary": vary, "global_batch_tokens": tokens})
    r = run(p, Machine(capacity_gib=30))
    assert all(t.batch_size * t.grad_accum * t.gpus * t.seq_len == tokens for t in r.asked)
    (v,) = verdicts_json(p)
    assert v["global_batch_tokens"] == tokens and v["best"] is not None
    ok = [
        t
        for t in r.asked
        if r.of(t)["status"] == "ok" and t.ac == v["baseline"]["ac"] and t.compile == v["baseline"]["compile"]
    ]
    assert v["baseline"]["batch_size"] == max(t.batch_size for t in ok)  # the split with the largest micro-batch


@pytest.mark.parametrize(
    "extra,words",
    [
        ({"tune": {"global_batch_tokens": 1000}}, ["1000", "2 x 128"]),  # not a whole number of samples per rank
        # a fixed batch of 3 and grad_accum fixed at 1 make 3 samples per rank, not 8
        ({"batch_sizes": [3], "tune": {"vary": ["ac"], "global_batch_tokens": 2048}}, ["2048", "8 samples", "3"]),
    ],
)
def test_a_global_batch_no_split_can_hold_is_a_user_error(extra, words):
    with pytest.raises(UserError) as e:
        plan(**extra)
    assert all(w in str(e.value) for w in words) and "\n" not in str(e.value)


# 3. bounded cost


@pytest.mark.parametrize("budget", [4, 5, 8, 13, 20, 40])
def test_attempts_never_exceed_the_budget(budget):
    # OOMs, an option that always fails, and attempts lost to the infrastructure (retried) all count
    spec, trials = grid(precisions=["bf16", "fp8-torchao-tensorwise"], tune={"vary": ALL_OPTIONS, "budget": budget})
    p = TunePlan(trials, spec, capacity_bytes=40 * GIB)
    r = run(p, Machine(failing_compile="full", lost={2, 5, 9, 17}))
    for v in verdicts_json(p):
        attempts = [t for t in r.asked if t.precision == v["precision"]]
        assert len(attempts) == v["probes"] <= budget
        assert v["best"] is not None if budget >= 8 else (v["best"] is not None or v["aborted"])
        # the finals leave the best's profile its attempt
        assert [t.profiled for t in attempts].count(True) == (v["best"] is not None)


def test_a_budget_without_room_for_the_baseline_a_finalist_and_the_profile_is_a_user_error():
    with pytest.raises(UserError, match="budget: 3 probes") as e:
        plan(tune={"budget": 3})
    assert "give budget: 4 or more" in str(e.value)
    p = plan(tune={"budget": 4})
    run(p, Machine())
    (v,) = verdicts_json(p)  # one short probe, one final (the baseline), its profile
    assert v["best"] == v["baseline"] and v["profile"] is not None and v["probes"] == 3


@pytest.mark.parametrize("steps", [{"warmup": 3, "measure": 10}, {"warmup": "auto", "measure": "auto"}])
def test_short_probes_then_longer_then_the_grids_own_steps(steps):
    p = plan(steps=steps)
    r = run(p, Machine())
    full = (steps["warmup"], steps["measure"])
    kinds = {
        ("short" if is_short(t) else "longer" if is_longer(t) else (t.warmup_steps, t.measure_steps))
        for t in r.asked
        if not t.profiled
    }
    assert kinds == {"short", "longer", full}
    (v,) = verdicts_json(p)
    last = [t for t in r.asked if (t.warmup_steps, t.measure_steps) == full]
    assert {t.profiled for t in last} == {False} and len(last) <= 3  # two finalists and the baseline, unprofiled
    # `auto` finals run at most final_auto_max steps, as the cost cap reserves, and no more measured ones than the
    # grid's steps.measure_max; counts are what they say
    grids = (50, MEASURE_MAX_DEFAULT)
    assert all(
        t.auto_max == (tuple(map(min, final_auto_max(t.grad_accum), grids)) if "auto" in full else None) for t in last
    )
    assert all(t.auto_max is None for t in r.asked if t not in last)
    # then one profiled trial, the search's last, asked once every final had answered: the best, at a short
    # probe's steps (profiled=True is in its trial id: it is not the short probe of the same config)
    (profiled,) = [t for t in r.asked if t.profiled]
    assert profiled is r.asked[-1] and r.known[profiled.trial_id] > max(r.asked.index(t) for t in last)
    best = max(last, key=lambda t: r.of(t)["tflops_per_gpu"])
    assert config(profiled) == config(best) and v["best_trial_id"] == best.trial_id
    assert (profiled.warmup_steps, profiled.measure_steps) == probe_steps(SHORT, profiled.grad_accum)
    assert any(config(t) == config(best) and is_short(t) for t in r.asked)
    assert {t.search_id for t in r.asked} == {v["search_id"]}
    assert len({t.trial_id for t in r.asked}) == len(r.asked)


def test_a_probe_runs_its_steps_in_micro_batches_and_a_rung_probe_stays_longer_than_a_short_one():
    assert probe_steps(SHORT, 1) == SHORT and probe_steps(LONGER, 1) == LONGER
    assert probe_steps(SHORT, 2) == (1, 2) and probe_steps(SHORT, 8) == (1, 1)
    assert probe_steps(LONGER, 4) == (1, 3) and probe_steps(LONGER, 16) == (1, 2)  # never the short probe
    p = plan(tune={"vary": ["batch_size", "grad_accum"], "budget": 20})
    r = run(p, Machine())
    full = [t for t in r.asked if (t.warmup_steps, t.measure_steps) == (3, 10)]
    probes = [t for t in r.asked if t not in full and not t.profiled]
    assert {t.grad_accum for t in probes} == {1, 8} and any(is_longer(t) for t in probes)
    for t in probes:  # as many micro-batches as a probe of one, in whole steps
        rung = SHORT if is_short(t) else LONGER
        assert is_short(t) or is_longer(t)
        assert t.warmup_steps * t.grad_accum >= rung[0] and t.measure_steps * t.grad_accum >= rung[1]
        assert (t.warmup_steps - 1) * t.grad_accum < rung[0] or t.warmup_steps == 1
    assert full and {t.profiled for t in full} == {False}  # the grid's own steps, whatever the accumulation


def test_the_search_id_is_the_groups_and_a_resumed_search_asks_for_the_same_trials():
    m = Machine(lost={4})
    first_plan = plan(tune={"vary": ALL_OPTIONS})
    first = run(first_plan, m)
    again_plan = plan(tune={"vary": ALL_OPTIONS})
    again = run(again_plan, recorded=first.rows)  # no machine: every trial must be one already recorded
    assert [t.trial_id for t in again.asked] == [t.trial_id for t in first.asked]
    assert verdicts_json(again_plan) == verdicts_json(first_plan)
    assert len([t for t in again.asked if t.profiled]) == 1 and verdicts_json(again_plan)[0]["profile"] is not None
    other = plan(precisions=["bf16"], tune={"vary": ALL_OPTIONS}).initial()[0]
    assert other.search_id != first.asked[0].search_id


def test_the_order_results_come_back_in_does_not_change_the_search():
    in_order, reversed_ = plan(tune={"vary": ALL_OPTIONS}), plan(tune={"vary": ALL_OPTIONS})
    a = run(in_order, Machine(capacity_gib=30))
    b = run(reversed_, Machine(capacity_gib=30), last_first=True)
    assert a.asked != b.asked and sorted(t.trial_id for t in a.asked) == sorted(t.trial_id for t in b.asked)
    assert verdicts_json(in_order) == verdicts_json(reversed_)


def test_successive_halving_keeps_the_faster_short_probes():
    r = run(plan(tune={"vary": ALL_OPTIONS, "budget": 40}), Machine())
    short = sorted((r.of(t)["tflops_per_gpu"], config(t)) for t in r.asked if is_short(t) and r.of(t)["status"] == "ok")
    longer = {config(t) for t in r.asked if is_longer(t)}
    assert longer == {c for _, c in short[-len(longer) :]} and 2 < len(longer) < len(short)


# 4. pruning


def test_no_probe_needs_the_memory_of_an_earlier_oom_and_an_oom_is_not_retried():
    r = run(plan(tune={"vary": ALL_OPTIONS, "budget": 80}), Machine(capacity_gib=30))
    ooms = []
    for t, (row, _) in zip(r.asked, r.rows, strict=True):
        assert not any(at_least_as_heavy(config(t), o) for o in ooms), t.describe()
        if row["status"] == "oom":
            ooms.append(config(t))
    assert len(ooms) > 3  # the search did reach the limit, in several memory classes


def test_where_the_grid_options_ran_out_of_memory_bounds_what_a_rank_may_use():
    from sweep.search.fastest.memory import usable

    peaks = {59: 125.2 * GIB, 66: 137.9 * GIB}  # GPT-1.5B torchao on one H200, session 10: 1.81 GiB a sample
    # the most the grid's options peaked at clean under their OOM: 66's 137.9, not the line's 139.7 at 67 (failed)
    assert usable(141 * GIB, peaks, [67]) == 137.9 * GIB
    assert usable(141 * GIB, peaks, [70, 67]) == usable(141 * GIB, peaks, [67])  # the smallest OOM bounds it
    assert usable(141 * GIB, peaks, [60]) == 125.2 * GIB  # a peak at or above the OOM's batch is no evidence
    assert usable(135 * GIB, peaks, [67]) == 135 * GIB  # never above the capacity
    assert usable(141 * GIB, peaks, []) == usable(141 * GIB, {}, [67]) == 141 * GIB  # unknown
    assert usable(None, peaks, [67]) is None
    # what `fitted` made of 64 x 8 micro-batches there: 18.2 + 64 x 1.81 GiB + 4 B x 1.56e9 local parameters =
    # 140.1 GiB, under 141 (it ran, out of memory); 63 x 2 (138.3 GiB, under the line's 139.7) ran out of memory
    # too (session 11); under 137.9: 62
    spec, trials = grid(tune={"vary": ["batch_size", "grad_accum"]})
    space = Space(trials[0], spec, spec.tune)
    eight = space.at_batch(space.baseline("none", 64)._replace(grad_accum=8), 64)
    place = dict(ref=space.baseline("none", 64), ref_peaks=peaks, effects={}, params_local=1557686400)
    assert fitted(space, eight, capacity=140.2 * GIB, **place) == eight
    assert fitted(space, eight, capacity=140.0 * GIB, **place).batch_size == 63
    assert fitted(space, eight, capacity=usable(141 * GIB, peaks, [67]), **place).batch_size == 62


def test_accumulation_is_placed_where_its_gradients_fit_unless_the_grids_peaks_already_hold_them():
    spec, trials = grid(tune={"vary": ["batch_size", "grad_accum"]})
    space = Space(trials[0], spec, spec.tune)
    ref = space.baseline("none", 10)
    peaks = {8: 12 * GIB, 10: 14 * GIB}  # 4 GiB + 1 GiB a sample
    eight = space.at_batch(ref._replace(grad_accum=8), 10)
    place = dict(capacity=16 * GIB, params_local=3 * GIB / 4)  # 3 GiB of fp32 gradients
    assert fitted(space, eight, ref, peaks, {}, **place).batch_size == 9  # 4 + 9 + 3 = 16
    assert fitted(space, eight, ref, peaks, {}, **place, snap=True).batch_size == 8  # where ref ran: its pair
    assert fitted(space, eight, ref._replace(grad_accum=2), peaks, {}, **place) == eight  # ref's peaks hold them
    assert fitted(space, ref, ref, peaks, {}, **place) == ref
    assert fitted(space, eight, ref, peaks, {}, capacity=None, params_local=3 * GIB / 4) == eight


def test_an_fp32_reduce_needs_at_least_the_memory_of_a_bf16_one():
    step = Config(4, "none", "regional", 8, "bf16", "step", False)
    assert at_least_as_heavy(step._replace(reduce_dtype="fp32"), step)  # 2xH200: bf16 ran, fp32 ran out of memory
    assert not at_least_as_heavy(step, step._replace(reduce_dtype="fp32"))
    assert not at_least_as_heavy(step._replace(reduce_dtype="fp32", grad_sync="micro_batch"), step)
    assert not at_least_as_heavy(step._replace(reduce_dtype="fp32", batch_size=3), step)


def test_an_oom_with_accumulation_does_not_prune_the_same_batch_without_it():
    # accumulating keeps the earlier micro-batches' gradients through the next backward: one micro-batch
    # needs less (2xH200: 107.6 GiB against 122.6 at 2, 4 and 8), so only the other direction prunes
    one = Config(
        batch_size=4,
        ac="none",
        compile="regional",
        grad_accum=1,
        reduce_dtype="fp32",
        grad_sync="micro_batch",
        fp8_lm_head=False,
    )
    eight, two = one._replace(grad_accum=8), one._replace(grad_accum=2)
    assert not at_least_as_heavy(one, eight) and at_least_as_heavy(eight, one) and at_least_as_heavy(two, eight)
    assert at_least_as_heavy(one._replace(batch_size=5), one) and not at_least_as_heavy(one, one._replace(batch_size=5))


def test_a_thrash_with_accumulation_does_not_shrink_the_same_change_without_it():
    p = plan(tune={"vary": ALL_OPTIONS})
    (search,) = p.searches.values()
    one = Config(
        batch_size=4,
        ac="none",
        compile="regional",
        grad_accum=1,
        reduce_dtype="fp32",
        grad_sync="micro_batch",
        fp8_lm_head=False,
    )
    head_at_8 = one._replace(grad_accum=8, fp8_lm_head=True)
    space = search.space
    assert not needs(one._replace(fp8_lm_head=True), head_at_8, one, space)  # one micro-batch needs less
    assert needs(head_at_8._replace(grad_accum=2, reduce_dtype="bf16"), head_at_8, one, space)
    assert needs(one._replace(grad_accum=4, fp8_lm_head=True, batch_size=5), one._replace(fp8_lm_head=True), one, space)


def test_a_full_measurement_with_the_short_probes_steps_is_that_probe_not_a_second_run():
    # grid steps equal to the short probes': the baseline's full measurement is its short probe (the
    # runner would drop a trial asked twice, and the search would wait for it forever)
    p = plan(steps={"warmup": SHORT[0], "measure": SHORT[1]})
    r = run(p, Machine())
    (v,) = verdicts_json(p)
    assert v["baseline_tflops"] is not None and v["best"] is not None
    base = next(t for t in r.asked if t.trial_id == v["baseline_trial_id"])
    assert (base.warmup_steps, base.measure_steps) == SHORT and r.of(base)["tflops_per_gpu"] == v["baseline_tflops"]


def test_more_checkpointing_starts_where_less_fitted_and_less_stops_below_its_oom():
    r = run(plan(ac=["full"], tune={"vary": ["batch_size", "ac"]}), Machine(capacity_gib=40))
    full_oom = min(t.batch_size for t in r.asked if t.ac == "full" and r.of(t)["status"] == "oom")
    assert all(t.batch_size < full_oom for t in r.asked if t.ac != "full")  # none keeps more than full
    lighter = run(plan(tune={"vary": ["batch_size", "ac"]}), Machine(capacity_gib=40))
    for ac, heavier in (("selective", ["none"]), ("full", ["none", "selective"])):
        fitted = max(t.batch_size for t in lighter.asked if t.ac in heavier and lighter.of(t)["status"] == "ok")
        first = next(t for t in lighter.asked if t.ac == ac)
        assert first.batch_size == fitted  # known to fit: this level keeps less


def test_more_checkpointing_is_searched_only_where_a_larger_batch_could_make_up_its_recomputation():
    # 36 fits without checkpointing; at 36 selective runs 10 % slower, and no batch runs more than ~3 %
    # faster than 36 (the speed saturates): selective and full get their one probe at 36
    slow = run(plan(tune={"vary": ["batch_size", "ac"]}), Machine(capacity_gib=40))
    fitting = [t for t in slow.asked if t.ac != "none" and is_short(t)]
    assert [(t.ac, t.batch_size) for t in fitting] == [("selective", 36), ("full", 36)]
    # recomputation nearly free: a larger batch may pay, so each level finds its own limit
    cheap = run(
        plan(tune={"vary": ["batch_size", "ac"]}),
        Machine(capacity_gib=40, ac_speed={"none": 1.0, "selective": 0.995, "full": 0.99}),
    )
    assert max(t.batch_size for t in cheap.asked if t.ac == "full" and cheap.of(t)["status"] == "ok") == 180


def test_an_oom_candidate_is_tried_at_a_smaller_batch_and_its_limit_serves_its_kind():
    # grad_sync: step keeps whole gradients: it does not fit at the batch the grid's options fit
    r = run(plan(tune={"vary": ALL_OPTIONS, "budget": 60}), Machine(capacity_gib=40))
    step = [t for t in r.asked if t.grad_sync == "step" and is_short(t)]
    fits = [t.batch_size for t in step if r.of(t)["status"] == "ok"]
    assert fits and max(fits) < 36 and r.of(step[0])["status"] == "oom"
    first_fit = next(i for i, t in enumerate(step) if r.of(t)["status"] == "ok")
    assert all(t.batch_size <= fits[0] for t in step[first_fit:])  # the rest start where it fitted


def test_a_batch_that_thrashes_ends_the_fit_and_a_thrashing_candidate_is_tried_smaller():
    """A probe that fits only with allocator retries (2xH200: Llama3-8B torchao batch 5 ran at 430 TFLOP/s/GPU
    with 6 retries, batch 4 at 817) measures the memory's limit: the fit probes no larger batch after it and
    keeps the largest batch without retries; a candidate that thrashes is tried a batch lower, and rates no
    option (grad_sync: step keeps whole gradients: it thrashes where micro_batch runs clean)."""
    m = Machine(capacity_gib=40, thrash_gib=34.0)
    p = plan(tune={"vary": ALL_OPTIONS, "budget": 40})
    r = run(p, m)
    grid_options = config(r.asked[0])._replace(batch_size=0)
    fit = [t for t in r.asked if config(t)._replace(batch_size=0) == grid_options and is_short(t)]
    first = next(i for i, t in enumerate(fit) if r.of(t).get("alloc_retries"))
    assert all(t.batch_size < fit[first].batch_size for t in fit[first + 1 :]), [t.batch_size for t in fit]
    assert not any(r.of(t)["status"] == "oom" for t in fit)  # it never went on to the real limit (36)
    clean = [t.batch_size for t in fit if r.of(t)["status"] == "ok" and not r.of(t)["alloc_retries"]]
    assert max(clean) == 29  # 4 + 29 GiB: the largest without retries (30 thrashes, 36 is the real limit)
    # the first candidate that thrashed while exploring was tried smaller; the best ran clean, near the optimum
    explore = [t for t in r.asked if t not in fit and is_short(t)]
    t = next(t for t in explore if r.of(t).get("alloc_retries"))
    assert any(
        config(u)._replace(batch_size=0) == config(t)._replace(batch_size=0) and u.batch_size < t.batch_size
        for u in explore
    ), f"{t.describe()} thrashed and was not tried smaller"
    (v,) = verdicts_json(p)
    best = next(t for t in r.asked if t.trial_id == v["best_trial_id"])
    every = [
        replace(best, **dict(zip([f for f in Config._fields if f not in KERNEL_OPTIONS], values, strict=True)))
        for values in itertools.product(
            range(1, 41),
            ("none", "selective", "full"),
            ("none", "regional", "full"),
            (1, 2, 4, 8),
            ("fp32", "bf16"),
            ("micro_batch", "step"),
            (False, True),
            ("full", "chunked"),
        )
    ]
    optimum = max(m.tflops(t) for t in every if m.peak(t) <= m.thrash_gib)
    assert not r.of(best)["alloc_retries"] and v["tflops_at_best"] >= 0.97 * optimum, (v["best"], optimum)


def test_the_baseline_runs_at_a_batch_without_retries_even_where_one_with_them_read_faster():
    # a short probe with a few retries may read fast; the fit still ends where memory did (batch 30 thrashes)
    p = plan(tune={"vary": ALL_OPTIONS, "budget": 40})
    r = run(p, Machine(capacity_gib=40, thrash_gib=34.0, thrash_speed=1.0))
    (v,) = verdicts_json(p)
    assert v["baseline"]["batch_size"] == 29
    assert r.of(next(t for t in r.asked if t.trial_id == v["baseline_trial_id"]))["alloc_retries"] == 0


# the options of issue 16's Llama3-8B runs on 2xH200
NUMERICS_RUN = ["batch_size", "grad_accum", "reduce_dtype", "grad_sync", "fp8_lm_head"]


def _clean(r: Run, t) -> bool:
    return r.of(t)["status"] == "ok" and not r.of(t).get("alloc_retries")


def test_an_option_that_thrashed_at_the_top_batch_runs_clean_lower_within_a_small_budget():
    """2xH200, Llama3-8B torchao, budget 16 (RESULTS.md, session 8): the FP8 head and grad_sync: step thrashed at
    batch 4, the fit's top, and the budget went to accumulation's counts one by one and to combinations the
    measured effects ranked below the fastest probe, so neither option was ever measured clean. On a machine
    of that shape (a thrash zone; the head adds memory): the head runs clean a batch lower within the same
    budget, and of accumulation only the most micro-batches is a neighbour (every count holds the same memory)."""
    p = plan(batch_sizes=[3], tune={"vary": NUMERICS_RUN, "budget": 16})
    r = run(p, Machine(capacity_gib=40, thrash_gib=34.0, head_gib=2.0))
    short = [t for t in r.asked if is_short(t)]
    assert any(t.fp8_lm_head and _clean(r, t) for t in short), [(t.describe(), r.of(t)) for t in short]
    assert not any(t.grad_accum in (2, 4) for t in short)
    (v,) = verdicts_json(p)
    assert v["best"]["fp8_lm_head"] and v["probes"] <= 16


def test_grad_sync_step_out_of_memory_at_the_top_batch_is_run_lower_and_the_best_uses_it():
    """grad_sync: step folds away at one micro-batch, so no neighbour measures it; at the fit's top batch it runs
    out of memory (whole gradients), a batch lower it thrashes: a search with room for both retries measures
    it clean and finds what it gains there (the machine's optimum: step, FP8 head, 8 micro-batches, bf16 reduce,
    at batch 20)."""
    m = Machine(capacity_gib=40, thrash_gib=34.0)
    p = plan(batch_sizes=[3], tune={"vary": NUMERICS_RUN, "budget": 24})
    r = run(p, m)
    (v,) = verdicts_json(p)
    best = next(t for t in r.asked if t.trial_id == v["best_trial_id"])
    every = [
        replace(best, **dict(zip(NUMERICS_RUN, values, strict=True)))
        for values in itertools.product(
            range(1, 41), (1, 2, 4, 8), ("fp32", "bf16"), ("micro_batch", "step"), (False, True)
        )
    ]
    optimum = max(m.tflops(t) for t in every if m.peak(t) <= m.thrash_gib)
    assert v["best"]["grad_sync"] == "step" and _clean(r, best)
    assert v["tflops_at_best"] >= 0.985 * optimum, (v["best"], v["tflops_at_best"], optimum)


def test_an_option_never_run_clean_is_probed_lower_even_after_waves_found_nothing_faster():
    """2xH200, Llama3-8B bf16 (session 9): the fit topped at batch 3 (4 thrashed), a bf16 reduce gained under a
    short probe's noise, grad_sync: step thrashed at batch 3 x 8, and a wave without a faster probe ended the
    search with 5 of 16 probes unspent and step never measured clean (a hand-written grid had found 8
    micro-batches, bf16 reduce and step worth +9.5 % at batch 2). The same shape here: an option value whose
    gain is unknown is probed while the budget lasts; only the waves rated by known effects stop."""
    m = Machine(capacity_gib=9, thrash_gib=7.0, gains={"bf16": 1.004, "step": 1.15, "head": 1.0, "accum": 0.015})
    p = plan(batch_sizes=[2], precisions=["bf16"], tune={"vary": NUMERICS_RUN, "budget": 16})
    r = run(p, m)
    (v,) = verdicts_json(p)
    assert any(t.grad_sync == "step" and _clean(r, t) for t in r.asked)
    best = next(t for t in r.asked if t.trial_id == v["best_trial_id"])
    every = [
        replace(best, **dict(zip(NUMERICS_RUN, values, strict=True)))
        for values in itertools.product(range(1, 6), (1, 2, 4, 8), ("fp32", "bf16"), ("micro_batch", "step"), (False,))
    ]
    optimum = max(m.tflops(t) for t in every if m.peak(t) <= m.thrash_gib)
    assert v["best"]["grad_sync"] == "step" and v["tflops_at_best"] >= 0.985 * optimum, (v["best"], optimum)
    assert len(r.asked) <= 16


def test_accumulation_and_a_compile_mode_are_first_probed_where_memory_is_known_to_hold_them():
    """2xH200, GPT-1.5B torchao (session 9): the fit topped at batch 66 with 1.9 GiB of 141 free, and the
    neighbours there all ran out of memory (8 micro-batches, compile none, compile full after 170 s of
    compiling), then none at 49: 248 of the search's 351 s, and no final before the job's limit. The same
    shape here: accumulation's gradients (params_local x 4 B) are known to need more than the top leaves, and a
    compile mode's memory is unknown until probed: none of them runs out of memory outside the fit."""
    m = Machine(capacity_gib=40.0, accum_gib=3.0, compile_gib={"none": 0.3, "full": 0.05})
    vary = ["batch_size", "grad_accum", "compile"]
    p = plan(batch_sizes=[16], compile=["regional"], tune={"vary": vary, "budget": 16})
    r = run(p, m)
    grid_options = ("regional", 1)
    fit = [t for t in r.asked if (t.compile, t.grad_accum) == grid_options and is_short(t)]
    others = [t for t in r.asked if t not in fit]
    assert max(t.batch_size for t in fit if r.of(t)["status"] == "ok") == 36  # at the memory's edge
    assert [r.of(t)["status"] for t in others if r.of(t)["status"] != "ok"] == []
    assert {t.compile for t in others if r.of(t)["status"] == "ok"} == {"none", "regional", "full"}
    assert any(t.grad_accum == 8 and r.of(t)["status"] == "ok" for t in others)
    (v,) = verdicts_json(p)
    best = next(t for t in r.asked if t.trial_id == v["best_trial_id"])
    every = [
        replace(best, batch_size=b, grad_accum=a, compile=c)
        for b, a, c in itertools.product(range(1, 41), (1, 2, 4, 8), ("none", "regional", "full"))
    ]
    optimum = max(m.tflops(t) for t in every if m.peak(t) <= m.capacity_gib)
    assert v["tflops_at_best"] >= 0.985 * optimum, (v["best"], v["tflops_at_best"], optimum)


@pytest.mark.parametrize("capacity, head", [(60, 5.0), (40, 8.0)])
def test_no_probe_asked_after_a_thrash_needs_its_memory(capacity, head):
    """Once a probe thrashed, no probe asked after it makes every change it made to the baseline at its ac and
    at a batch no smaller: such a one is asked at batches smaller until it does not (here grad_sync: step and
    an FP8 head both add memory, so the search meets thrashes at several batches and with several options)."""
    p = plan(capacity_gib=capacity, tune={"vary": ALL_OPTIONS, "budget": 40})
    r = run(p, Machine(capacity_gib=capacity, thrash_gib=34.0, head_gib=head))
    (v,) = verdicts_json(p)
    base = Config(**v["baseline"])

    def changes(c: Config) -> set:  # the options (but the batch, ac and accumulation) changed from the baseline
        return {
            (k, x)
            for k, x in c._asdict().items()
            if k not in ("batch_size", "ac", "grad_accum") and x != getattr(base, k)
        }

    short = [(i, t) for i, t in enumerate(r.asked) if is_short(t)]
    thrashed = [(i, config(t)) for i, t in short if r.of(t).get("alloc_retries")]
    assert len(thrashed) > 2
    for i, t in thrashed:
        heavy = [
            u.describe()
            for _, u in short
            if r.known[u.trial_id] > i
            and u.ac == t.ac
            and u.batch_size >= t.batch_size
            and changes(t) <= changes(config(u))
        ]
        assert not heavy, f"{t} thrashed, then {heavy}"


def test_exploring_stops_when_waves_find_nothing_faster():
    # options that change nothing: after the neighbours, two waves without a faster probe end the search
    p = plan(tune={"vary": ALL_OPTIONS, "budget": 80})
    r = run(p, Machine(options_matter=False))
    assert len(r.asked) < 40


def test_an_option_value_that_fails_on_its_own_is_not_tried_again():
    r = run(plan(tune={"vary": ALL_OPTIONS}), Machine(failing_compile="full"))
    assert len([t for t in r.asked if t.compile == "full"]) == 1
    assert len([t for t in r.asked if t.compile == "regional"]) > 1


# 5. the verdict


def test_the_best_is_the_fastest_full_measurement_and_the_baseline_is_measured_in_the_same_search():
    p = plan(tune={"vary": ALL_OPTIONS})
    r = run(p, Machine())
    (v,) = verdicts_json(p)
    assert set(v) == VERDICT_KEYS and v["kind"] == "fastest"
    full = finals(r)
    best = max(full, key=lambda t: r.of(t)["tflops_per_gpu"])
    assert v["best_trial_id"] == best.trial_id and v["best"] == config(best)._asdict()
    (profiled,) = [t for t in r.asked if t.profiled]
    # the final's full measurement, never the profile trial's short reading (the Machine reads it 2 % lower)
    assert v["tflops_at_best"] == r.of(best)["tflops_per_gpu"] != r.of(profiled)["tflops_per_gpu"]
    base = next(t for t in full if t.trial_id == v["baseline_trial_id"])
    grid_options = {
        "ac": "none",
        "compile": "regional",
        "grad_accum": 1,
        "reduce_dtype": "fp32",
        "grad_sync": "micro_batch",
        "fp8_lm_head": False,
    }
    assert {k: v["baseline"][k] for k in grid_options} == grid_options == {k: getattr(base, k) for k in grid_options}
    assert v["speedup"] == pytest.approx(v["tflops_at_best"] / v["baseline_tflops"]) and v["speedup"] > 1.1
    # the profile trial is GPU time the search spent: in probes and wall (its config is the best's: no new one tried)
    assert v["probes"] == len(r.asked) and v["tried"] == len({config(t) for t in r.asked})
    assert v["search_wall_s"] == pytest.approx(sum(row["trial_wall_s"] for row, _ in r.rows))
    assert v["cost_vs_one_trial"] == pytest.approx(v["search_wall_s"] / r.of(best)["trial_wall_s"])
    assert v["profile"] == {
        "gemm_pct": 60.0,
        "attention_pct": 20.0,
        "comm_exposed_pct": 5.0,
        "optimizer_pct": 5.0,
        "other_pct": 10.0,
        "trace_file": trace_file(r, profiled),
    }
    assert v["numerics_allowed"] == [o for o in NUMERICS_CHANGING if o in ALL_OPTIONS] and v["allowed"] == ALL_OPTIONS


def test_the_search_finds_the_simulated_optimum_within_its_default_budget():
    m = Machine(capacity_gib=40)
    p = plan(tune={"vary": ALL_OPTIONS})
    run(p, m)
    (v,) = verdicts_json(p)
    # the machine's best: compile full, 8 micro-batches, bf16 reduce, FP8 head, ac none; grad_sync: step
    # needs a smaller batch (20 fits), which is still faster than micro_batch at 36
    assert {k: v["best"][k] for k in ("ac", "compile", "grad_accum", "reduce_dtype", "fp8_lm_head")} == {
        "ac": "none",
        "compile": "full",
        "grad_accum": 8,
        "reduce_dtype": "bf16",
        "fp8_lm_head": True,
    }


def test_a_baseline_that_does_not_fit_is_not_measured_again():
    # a fixed batch of 40 does not fit without checkpointing (4 + 40 GiB > 40): the best checkpoints
    p = plan(batch_sizes=[40], tune={"vary": ["ac", "compile"]})
    r = run(p, Machine(capacity_gib=40))
    (v,) = verdicts_json(p)
    base = [t for t in r.asked if t.ac == "none" and t.compile == "regional"]
    assert [r.of(t)["status"] for t in base] == ["oom"]
    assert v["baseline"]["ac"] == "none" and v["baseline_tflops"] is None and v["speedup"] is None
    assert v["best"]["ac"] != "none" and v["tflops_at_best"] > 0


def test_when_the_grids_own_options_fail_the_search_stops_and_says_so():
    p = plan(tune={"vary": ["batch_size", "ac"]})
    r = run(p, Machine(failing_compile="regional"))  # the grid's compile
    (v,) = verdicts_json(p)
    assert len(r.asked) == v["probes"] == 1 and v["best"] is None and v["profile"] is None
    assert v["aborted"] == "nothing ran: no probe completed (1 error)"


def test_no_profile_trial_when_no_final_ran_ok():
    # every full measurement errors (the grid's steps), the short and rung probes run: nothing to profile
    p = plan(tune={"vary": ALL_OPTIONS})
    r = run(p, Machine(failing_steps=(3, 10)))
    (v,) = verdicts_json(p)
    assert finals(r) and not any(t.profiled for t in r.asked)
    assert v["best"] is None and v["profile"] is None and v["aborted"].startswith("no full measurement completed")


@pytest.mark.parametrize("budget,room", [(13, False), (40, True)])
def test_a_profile_trial_lost_to_the_infrastructure_is_retried_only_within_the_budget(budget, room):
    # accumulation gains little here: the runner-up's final is within FINAL_MARGIN and runs, so 13 is all spent
    close = {"gains": {"bf16": 1.05, "step": 1.04, "head": 1.03, "accum": 0.005}}
    first = run(p := plan(tune={"budget": budget}), Machine(**close))
    (v,) = verdicts_json(p)
    n = len(first.asked)  # the profile trial is the last attempt
    assert first.asked[-1].profiled and (n < budget) == room  # 13: the search spends all of it
    again = run(q := plan(tune={"budget": budget}), Machine(lost={n}, **close))
    (w,) = verdicts_json(q)
    profiled = [t for t in again.asked if t.profiled]
    assert w["probes"] == len(again.asked) <= budget and w["tflops_at_best"] == v["tflops_at_best"]
    if room:  # retried, as any stage's attempt under its cap; the verdict cites the retry's trace
        assert [t.retry for t in profiled] == [0, 1]
        assert w["profile"]["trace_file"] == trace_file(again, profiled[1])
    else:  # no room: the attempt stays failed, and the verdict has no profile
        assert [t.retry for t in profiled] == [0] and w["profile"] is None


@pytest.mark.parametrize("max_cost, runner_up", [(None, True), (40, True), (8, False)])
def test_a_runner_up_is_fully_measured_only_if_the_cost_cap_has_room_for_it(max_cost, runner_up):
    # the runner-up is within FINAL_MARGIN (accumulation gains 0.5 %): uncapped, or with room, it is measured in full;
    # the cap keeps room for two finals only (the best's, the baseline's), so under a tight one it is skipped, said
    gains = {"bf16": 1.05, "step": 1.04, "head": 1.03, "accum": 0.005}
    r = run(p := plan(tune={"budget": 13, "max_cost": max_cost}), Machine(gains=gains, timed=True))
    (v,) = verdicts_json(p)
    best, base = Config(**v["best"]), Config(**v["baseline"])
    measured = {config(t) for t in finals(r)}
    others = measured - {best, base}
    assert best in measured and base in measured and bool(others) == runner_up
    if max_cost is not None:
        assert v["cost_vs_one_trial"] <= max_cost
    if not runner_up:
        assert [c for c in v["skipped_for_cost"] if Config(**c) not in measured]


def test_a_probe_that_hangs_costs_a_few_times_its_prediction_not_the_grids_timeout_and_the_search_goes_on():
    from sweep.search.fastest.cost import HANG_FLOOR_S

    def hangs(t) -> bool:  # every accumulating probe hangs (on a GPU: until the scheduler's deadline)
        return t.grad_accum > 1

    r = run(p := plan(tune={"budget": 13}), Machine(timed=True, hangs=hangs))
    (v,) = verdicts_json(p)
    hung = [t for t in r.asked if hangs(t)]
    assert hung and {r.of(t)["status"] for t in hung} == {"timeout"}
    # the grid's 30 min before anything says what a probe costs; after, a few times the prediction (the floor here)
    assert r.asked[0].timeout_s == DEFAULT_TIMEOUT_S
    assert all(t.timeout_s == HANG_FLOOR_S for t in hung)
    assert v["best"] is not None and v["aborted"] is None and v["probes"] == len(r.asked) <= 13
    # the limit is no part of what a trial measures: its id is the same under any limit
    assert replace(hung[0], timeout_s=DEFAULT_TIMEOUT_S).trial_id == hung[0].trial_id


def test_nothing_fits_is_a_verdict_not_a_hang():
    p = plan(capacity_gib=2.0)
    r = run(p, Machine(capacity_gib=2.0))  # the fixed part alone is 4 GiB
    (v,) = verdicts_json(p)
    assert v["aborted"].startswith("nothing fits") and "oom" in v["aborted"]
    assert v["best"] is None and v["tflops_at_best"] is None and v["speedup"] is None and v["profile"] is None
    assert len(r.asked) == v["probes"] <= 40


def test_one_verdict_per_group():
    spec, trials = grid(precisions=["bf16", "fp8-torchao-tensorwise"], seq_len=[64, 128])
    p = TunePlan(trials, spec, capacity_bytes=40 * GIB)
    run(p, Machine())
    assert sorted((v["precision"], v["seq_len"]) for v in verdicts_json(p)) == [
        ("bf16", 64),
        ("bf16", 128),
        ("fp8-torchao-tensorwise", 64),
        ("fp8-torchao-tensorwise", 128),
    ]
    assert len({v["search_id"] for v in verdicts_json(p)}) == 4


def test_without_a_capacity_more_checkpointing_does_not_gallop_past_a_batch_that_met_no_limit():
    # no capacity (a CPU): the batch search gallops until its probes run out, never meeting an OOM; a
    # level with more checkpointing would only buy a larger batch nobody needed
    p = plan(capacity_gib=None, tune={"budget": 40, "vary": ["batch_size", "ac"]})
    r = run(p, Machine(capacity_gib=1e9))
    largest = max(t.batch_size for t in r.asked if t.ac == "none")
    assert max(t.batch_size for t in r.asked) == largest
    assert len([t for t in r.asked if t.ac != "none" and is_short(t)]) == 2  # one check each


@pytest.mark.parametrize("accum_gain, runner_up", [(0.03, False), (0.005, True)])
def test_a_runner_up_is_fully_measured_only_within_final_margin_of_the_fastest(accum_gain, runner_up):
    from sweep.search.fastest.search import FINAL_MARGIN

    gains = {"bf16": 1.05, "step": 1.04, "head": 1.03, "accum": accum_gain}
    r = run(p := plan(tune={"budget": 13}), Machine(gains=gains))
    (v,) = verdicts_json(p)
    base = Config(**v["baseline"])
    ranked = sorted(
        ((r.of(t)["tflops_per_gpu"], config(t)) for t in r.asked if is_short(t) and r.of(t)["status"] == "ok"),
        reverse=True,
    )
    (top, best), (second, other) = ranked[0], next(x for x in ranked[1:] if x[1] != ranked[0][1])
    assert (second >= top * (1 - FINAL_MARGIN)) == runner_up  # the two machines differ in this alone
    measured = {config(t) for t in finals(r)}
    assert best in measured and base in measured and (other in measured or other == base) == runner_up


@pytest.mark.parametrize("budget", [16, 24])  # without a rung, and with one
def test_a_probe_that_thrashed_is_never_fully_measured_even_where_its_short_reading_was_the_fastest(budget):
    """2xH200, Llama3-8B TE (RESULTS.md, session 12): batch 4 x 8 read 841.6 in its short probe with 5 allocator
    retries, the fastest, and was the final; its final thrashed (34 retries) at 794.0 and took 105 s where the
    cost cap had kept the leader's 67. A probe that thrashed measured the allocator, not its options: no rung
    probe or final measures it again, and the best is one that ran clean."""
    p = plan(tune={"vary": NUMERICS_RUN, "budget": budget})
    r = run(p, Machine(capacity_gib=40, thrash_gib=30.0, thrash_speed=1.2, timed=True))
    thrashed = {config(t) for t in r.asked if is_short(t) and r.of(t).get("alloc_retries")}
    fastest = max(
        (t for t in r.asked if is_short(t) and r.of(t)["status"] == "ok"), key=lambda t: r.of(t)["tflops_per_gpu"]
    )
    assert config(fastest) in thrashed  # the case: the fastest short reading is a thrashing one
    again = [t for t in r.asked if not is_short(t) and not t.profiled and config(t) in thrashed]
    assert again == [], [t.describe() for t in again]
    (v,) = verdicts_json(p)
    assert v["best"] is not None and Config(**v["best"]) not in thrashed
