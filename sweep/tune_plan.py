"""The plan of `search: fastest` (sweep.policy's protocol): one sweep.tune.GroupSearch per (model, precision,
seq_len, ranks) group of the grid's trials, each with a search id that a resumed search keeps. Pure."""

from __future__ import annotations

import hashlib
from typing import Callable

from sweep.advice import discouraged
from sweep.grid import GridSpec, Trial, TuneSpec
from sweep.tune import GroupSearch
from sweep.tune_space import Space


def group_key(t: Trial) -> tuple:
    return t.cluster, t.model.to_json(), t.precision, t.seq_len, t.gpus


def search_id(t: Trial, tune: TuneSpec) -> str:
    """The search of one group for what it may vary and the global batch: a resumed search keeps its id
    and its probes, also with a larger budget (the same search, continued)."""
    what = (group_key(t), tune.vary, tune.global_batch_tokens)
    return hashlib.sha256(repr(what).encode()).hexdigest()[:12]


class TunePlan:
    """One GroupSearch per (model, precision, seq_len, ranks) group of the grid's trials; the plan protocol
    of sweep.policy (initial, on_result, verdicts). Each seed is one group's first trial: the grid's
    single batch and its options at their first values."""

    def __init__(self, seeds: list[Trial], spec: GridSpec, *, capacity_bytes: float | None, is_gpu: bool = False,
                 predicted_max: Callable[[Trial], int | None] | None = None):
        """`is_gpu`: the ranks are GPUs (the plan's warnings apply: sweep.advice.discouraged); `predicted_max`: the
        memory model's largest batch of a trial's config (sweep.predictor.Predictor.max_batch)."""
        tune = spec.tune or TuneSpec()
        self.searches: dict[tuple, GroupSearch] = {}
        for t in seeds:
            if group_key(t) not in self.searches:
                space = Space(t, spec, tune, avoid=discouraged(t.precision, is_gpu=is_gpu))
                self.searches[group_key(t)] = GroupSearch(
                    space, budget=tune.budget, capacity_bytes=capacity_bytes, sid=search_id(t, tune),
                    final_steps=(spec.steps.warmup, spec.steps.measure), max_cost=tune.max_cost,
                    predicted_max=predicted_max)

    def initial(self) -> list[Trial]:
        return [t for s in self.searches.values() for t in s.start()]

    def on_result(self, trial: Trial, status: str, infrastructure: bool = False, row: dict | None = None) -> list[Trial]:
        return self.searches[group_key(trial)].on_result(trial, status, infrastructure, row or {})

    def verdicts(self) -> list[dict]:
        return [s.verdict() for s in self.searches.values()]
