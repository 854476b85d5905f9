"""What to run next after an attempt: OOM retry and infrastructure retry (the max-batch search is
sweep.search.max_batch). Pure logic.

Plans turn results into follow-up trials; the runner executes whatever they return. Nothing here
imports torch or Ray, so every decision is unit-tested on its own (tests/test_policy.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sweep.search.plan import Verdict
from sweep.spec.grid import OomPolicy, Trial

INFRA_RETRIES = 1  # a dead rank process or lost node is retried once; OOM/unsupported/timeout never


def next_batch_after_oom(
    policy: OomPolicy, failed: int, *, ok: set[int], tried: set[int], predicted: int | None = None
) -> int | None:
    """The batch to retry after `failed` ran out of memory, or None to stop.

    halve:  failed // 2
    next:   failed - 1 (the next smaller batch: the exact limit, one attempt at a time)
    bisect: midway between the largest batch known to fit and `failed` (none known: halve)
    `predicted`, the largest batch the memory model puts under the rank's memory, replaces the halving of
    `halve` and `bisect` when it lies between what is known to fit and `failed`: one retry where halving
    blindly may take several (16 -> 8 -> 4), or stop short of the limit (16 -> 8 where 12 fits). A prediction
    that `failed` fits was wrong there, and one of no batch (0) says nothing new: both halve as before.
    """
    if policy.policy == "none":
        return None
    fits = [b for b in ok if b < failed]
    guided = predicted if predicted is not None and max(fits, default=0) < predicted < failed else None
    if policy.policy == "next":
        candidate = failed - 1
    elif guided is not None:
        candidate = guided
    elif policy.policy == "halve" or not fits:
        candidate = failed // 2
    else:
        candidate = (max(fits) + failed) // 2
    if candidate < policy.min_batch or candidate in tried or candidate >= failed:
        return None
    return candidate


def is_predicted_oom(row: Mapping[str, Any] | None) -> bool:
    """Whether an `unsupported` row is one the memory model ruled out (`sweep.memory.predictor.predicted_reason`)."""
    return bool(row) and str((row or {}).get("error") or "").startswith("predicted OOM:")


def infra_retry(trial: Trial, status: str, infrastructure: bool) -> Trial | None:
    """The same trial once more after a dead rank process or lost node (an error of the infrastructure)."""
    if status == "error" and infrastructure and trial.retry < INFRA_RETRIES:
        return trial.child(retry=trial.retry + 1)
    return None


class GridPlan:
    """Run every trial of the grid; after an OOM, retry the same config at a lower batch. `predicted_max`: the
    largest batch of a trial's config predicted to fit (sweep.memory.predictor.Predictor.max_batch; None: no
    prediction)."""

    def __init__(self, trials: list[Trial], oom: OomPolicy, predicted_max: Callable[[Trial], int | None] | None = None):
        self.trials = trials
        self.oom = oom
        self.predicted_max = predicted_max
        self._grid_batches: dict[tuple[Any, ...], list[int]] = {}
        for t in trials:
            self._grid_batches.setdefault(t.config_key, []).append(t.batch_size)
        self._ok: dict[tuple[Any, ...], set[int]] = {}
        self._tried: dict[tuple[Any, ...], set[int]] = {}

    def initial(self) -> list[Trial]:
        return list(self.trials)

    def on_result(
        self, trial: Trial, status: str, infrastructure: bool = False, row: Mapping[str, Any] | None = None
    ) -> list[Trial]:
        key = trial.config_key
        if status == "unsupported" and is_predicted_oom(row):  # its on_oom applies as to a real OOM
            status = "oom"
        self._tried.setdefault(key, set()).add(trial.batch_size)
        if status == "ok":
            self._ok.setdefault(key, set()).add(trial.batch_size)
        retry = infra_retry(trial, status, infrastructure)
        if retry is not None:
            return [retry]
        if status != "oom":
            return []
        grid_batches = self._grid_batches.get(key, [])
        # A lower batch that the grid runs anyway is not run twice: the grid's own trial covers it.
        tried = self._tried[key] | set(grid_batches)
        predicted = self.predicted_max(trial) if self.predicted_max else None
        batch = next_batch_after_oom(
            self.oom, trial.batch_size, ok=self._ok.get(key, set()), tried=tried, predicted=predicted
        )
        return [] if batch is None else [trial.child(batch_size=batch, retry=0)]

    def verdicts(self) -> list[Verdict]:
        """None: a grid answers with its rows alone."""
        return []
