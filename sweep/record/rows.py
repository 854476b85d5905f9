"""Turn an attempt's outcome into one result row: the measurement arithmetic lives here.

tokens/s/GPU  = grad_accum * batch_size * seq_len / (tp * cp) / median step time
                (batch_size is per data-parallel rank: a TP group of tp ranks trains one micro-batch together)
                (each rank trains its own micro-batches; a step ends with the optimizer step, so gradient
                accumulation's saving on optimizer work is counted, never a micro-batch alone)
TFLOP/s/GPU   = flops_per_token * tokens/s/GPU / 1e12          (trainer.flops: 6N + 12·L·H·D·T)
MFU           = TFLOP/s/GPU / peak TFLOP/s of the accelerator for the recipe's family
"""

from __future__ import annotations

import os
import statistics
import subprocess
from collections.abc import Callable
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any, cast

from clusters.schema import ClusterProfile
from sweep.execution.outcome import Outcome
from sweep.record.energy import energy_columns
from sweep.record.schema import Row
from sweep.spec.grid import Trial
from trainer.flops import spec_flops_per_token
from trainer.recipes import RECIPES
from trainer.result import RankResult
from trainer.stopping import ci_half_width_pct, ci_target_met

GiB = 1024**3


@lru_cache(maxsize=1)
def git_sha() -> str | None:
    """The commit that produced the rows: SWEEP_GIT_SHA when set (a copy of the tree shipped to another
    machine, whose .git may be missing or stale), else `git rev-parse`, suffixed +dirty for uncommitted changes."""
    if os.environ.get("SWEEP_GIT_SHA"):
        return os.environ["SWEEP_GIT_SHA"]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5
        )
        sha = out.stdout.strip()
        if not sha:
            return None
        dirty = subprocess.run(
            ["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return sha + "+dirty" if dirty else sha  # rows must not name a commit that is not what ran
    except Exception:  # no git
        return None


@lru_cache(maxsize=1)
def _ray_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("ray")
    except Exception:
        return None


def _quantile(values: list[float], q: float) -> float:
    """Linear-interpolated quantile (numpy's default), without numpy."""
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def base_row(trial: Trial, *, run_id: str, profile: ClusterProfile, grid_name: str | None) -> dict[str, Any]:
    """Columns known before anything runs."""
    recipe = RECIPES[trial.precision]
    return {
        "run_id": run_id,
        "trial_id": trial.trial_id,
        "attempt": trial.attempt,
        "parent_trial_id": trial.parent_trial_id,
        "search_id": trial.search_id,
        "grid_name": grid_name,
        "cluster": profile.name,
        "accelerator": profile.accelerator,
        "world_size": trial.gpus,
        "cost_per_gpu_hour": profile.cost_per_gpu_hour,
        "power_cost_per_kwh": profile.power_cost_per_kwh,
        "pue": profile.pue,
        "profile_power_limit_w": profile.power_limit_w,
        "model": trial.model.label,
        "model_spec": trial.model.to_json(),
        "precision": trial.precision,
        "compile": trial.compile,
        "ac": trial.ac,
        "batch_size": trial.batch_size,
        "seq_len": trial.seq_len,
        # `auto` steps: the counts are known once run (`outcome_row`)
        "warmup_steps": _count(trial.warmup_steps),
        "measure_steps": _count(trial.measure_steps),
        **trial.training_options,
        "dp_shard": trial.dp_shard,
        "memory_cap_gib": trial.memory_cap_bytes / GiB if trial.memory_cap_bytes else None,
        "peak_tflops": profile.peak_tflops(recipe.family),
        "flops_per_token": spec_flops_per_token(trial.model, trial.seq_len),
        "n_params": trial.model.n_params(),
        "ray_version": _ray_version(),
        "git_sha": git_sha(),
    }


def _count(steps: int | str) -> int | None:
    return steps if isinstance(steps, int) else None  # "auto": counted once run


def unsupported_row(trial: Trial, reason: str, **base: Any) -> Row:
    now = datetime.now(timezone.utc)
    row = {**base_row(trial, **base), "status": "unsupported", "error": reason, "started_at": now, "finished_at": now}
    return cast(Row, row)  # the schema's columns (tests/test_schema.py writes and reads rows like it)


def outcome_row(outcome: Outcome, **base: Any) -> Row:
    trial = outcome.trial
    row = base_row(trial, **base)
    row.update(_attempt_columns(outcome))
    if outcome.status == "ok":
        row.update(measured_columns(trial, outcome.ranks, peak_tflops=row["peak_tflops"]))
    return cast(Row, row)  # the schema's columns (tests/test_schema.py writes and reads rows like it)


def _attempt_columns(outcome: Outcome) -> dict[str, Any]:
    """What became of the attempt and where it ran, whatever its status."""
    columns: dict[str, Any] = dict(
        status=outcome.status,
        error=outcome.error,
        traceback=outcome.traceback,
        started_at=outcome.started_at,
        finished_at=outcome.finished_at,
        trial_wall_s=outcome.wall_s,
        actor_reused=outcome.actor_reused,
        group_trial_index=outcome.group_trial_index,
        process_start_s=outcome.process_start_s,
        imported_before_placement=outcome.imported_before_placement,
    )
    if outcome.nodes:
        columns.update(
            node_ids=[n.get("node_id") for n in outcome.nodes],
            hosts=[n.get("hostname") for n in outcome.nodes],
            hostname=outcome.nodes[0].get("hostname"),
            nodes=len({n.get("node_id") or n.get("ip") for n in outcome.nodes}),
        )
    return columns


# Columns as rank 0 reported them: its start-up phases (sweep.record.schema), its compile cache, its versions
RANK0_COLUMNS = (
    "import_s",
    "process_setup_s",
    "model_build_s",
    "precompiled_graphs",
    "precompile_sides_ahead",
    "precompile_sides_given",
    "compile_cache_hits",
    "compile_cache_misses",
    "torch_version",
    "te_version",
    "torchao_version",
    "gpu_name",
    "driver_version",
    "cuda_version",
)


def measured_columns(trial: Trial, ranks: list[RankResult], *, peak_tflops: float | None) -> dict[str, Any]:
    """The measurement of an attempt that ran: its ranks' reports turned into the row's figures."""
    rank0 = ranks[0]
    # The slowest rank sets the pace of a synchronous step: take the per-step max over ranks.
    step_times = [max(times) for times in zip(*(r.step_times for r in ranks))]
    median = statistics.median(step_times)
    # a TP (and CP) group of tp x cp ranks trains one batch_size micro-batch together: its tokens are shared
    tokens_per_s = trial.grad_accum * trial.batch_size * trial.seq_len / trial.layout_ranks / median
    fpt = spec_flops_per_token(trial.model, trial.seq_len, n_params=rank0.n_params)
    tflops = fpt * tokens_per_s / 1e12

    def max_of(value: Callable[[RankResult], float | None]) -> float | None:
        return max((v for v in map(value, ranks) if v is not None), default=None)

    peak_mem, reserved = max_of(lambda r: r.peak_mem_bytes), max_of(lambda r: r.reserved_mem_bytes)
    ci_pct = ci_half_width_pct(step_times)
    columns: dict[str, Any] = dict(
        step_time_s=median,
        step_time_p10_s=_quantile(step_times, 0.1),
        step_time_p90_s=_quantile(step_times, 0.9),
        step_time_ci_pct=ci_pct,
        ci_target_met=ci_target_met(trial.measure_steps, ci_pct),
        warmup_steps=rank0.warmup_steps,
        measure_steps=len(step_times),
        tokens_per_s_per_gpu=tokens_per_s,
        tflops_per_gpu=tflops,
        mfu=tflops / peak_tflops if peak_tflops else None,
        flops_per_token=fpt,
        n_params=rank0.n_params,
        params_local=[r.params_local for r in ranks],
        peak_mem_gib=peak_mem / GiB if peak_mem is not None else None,
        reserved_mem_gib=reserved / GiB if reserved is not None else None,
        alloc_retries=max_of(lambda r: r.alloc_retries),
        loss_first=rank0.loss_first,
        loss_last=rank0.loss_last,
        init_time_s=max_of(lambda r: r.init_time_s),
        compile_time_s=max_of(lambda r: r.compile_time_s),
        steps_time_s=sum(step_times),
        # every step, warm-up first, as the slowest rank ran it: where `auto` warm-up ended, and why
        step_times_s=[max(times) for times in zip(*(r.warmup_times + r.step_times for r in ranks))],
        precompile_s=max_of(lambda r: r.precompile_s),  # the slowest rank's wait held every rank
        **{name: getattr(rank0, name) for name in RANK0_COLUMNS},
    )
    columns.update(profile_columns(rank0.profile))
    columns.update(loss_curve_columns(ranks))
    tokens = trial.gpus // trial.layout_ranks * trial.grad_accum * trial.batch_size * trial.seq_len * len(step_times)
    columns.update(energy_columns([r.energy for r in ranks], tokens=tokens, flops_per_token=fpt))
    return columns


def loss_curve_columns(ranks: list[RankResult]) -> dict:
    """loss_curve and loss_curve_tokens (`sweep.record.schema`) from every rank's step losses: a step's loss is the
    mean of its ranks' (each over its own micro-batches, all of one size), so the loss of the step's global batch;
    the model had trained on the earlier steps' tokens when it was computed (a step's forward precedes its update)."""
    curves = [r.losses for r in ranks]
    per_step = ranks[0].tokens_per_step or 0
    return {
        "loss_curve": [statistics.fmean(losses) for losses in zip(*curves)],
        "loss_curve_tokens": [step * per_step for step in range(len(curves[0]))],
    }


def profile_columns(profile: dict[str, Any] | None) -> dict:
    """The row's profile_* shares and attention_kernel from rank 0's profile (`trainer.profiling.profile_steps`); the
    trace's bytes are the driver's to write (`sweep.record.store.write_trace`)."""
    if not profile:
        return {}
    shares = {f"profile_{key}": value for key, value in profile.items() if key.endswith("_pct")}
    return {**shares, "attention_kernel": profile.get("attention_kernel")}
