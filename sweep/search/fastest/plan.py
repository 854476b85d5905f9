"""The plan of `search: fastest` (sweep.search.plan.Plan): one sweep.search.fastest.search.GroupSearch per
(model, precision, seq_len, ranks) group of the grid's trials and per layout it searches
(sweep.spec.layout.searched_layouts: tune.vary naming tp or dp_replicate), each with a search id that a resumed
search keeps. Pure."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, cast

from sweep.search.fastest.search import GroupSearch
from sweep.search.fastest.space import Row, Space
from sweep.search.plan import Verdict
from sweep.spec.advice import discouraged
from sweep.spec.grid import GridSpec, Trial, TuneSpec
from sweep.spec.layout import LAYOUT_VARY, searched_layouts


def search_group(t: Trial) -> tuple[Any, ...]:
    """The (model, precision, seq_len, ranks) group of a search, on its cluster (not a warm process group:
    sweep.execution.groups)."""
    return t.cluster, t.model.to_json(), t.precision, t.seq_len, t.gpus


def search_key(t: Trial) -> tuple[Any, ...]:
    """A group's search at one layout: the layout enters only off its default, so the ids of searches from
    before tune could vary it stay (a resumed search keeps its probes)."""
    layout = tuple((a, getattr(t, a)) for a in LAYOUT_VARY if getattr(t, a) != 1)
    return search_group(t) + layout


def fastest_search_id(t: Trial, tune: TuneSpec) -> str:
    """The search of one group (at one layout) for what it may vary and the global batch: a resumed search keeps
    its id and its probes, also with a larger budget (the same search, continued)."""
    what = (search_key(t), tune.vary, tune.global_batch_tokens)
    return hashlib.sha256(repr(what).encode()).hexdigest()[:12]


class TunePlan:
    """One GroupSearch per (model, precision, seq_len, ranks) group of the grid's trials; the plan protocol
    of sweep.search.plan.Plan (initial, on_result, verdicts). Each seed is one group's first trial: the grid's
    single batch and its options at their first values."""

    def __init__(
        self,
        seeds: list[Trial],
        spec: GridSpec,
        *,
        capacity_bytes: float | None,
        is_gpu: bool = False,
        predicted_max: Callable[[Trial], int | None] | None = None,
        ranks_per_node: int | None = None,
    ):
        """`is_gpu`: the ranks are GPUs (the plan's warnings apply: sweep.spec.advice.discouraged); `predicted_max`: the
        memory model's largest batch of a trial's config (sweep.memory.predictor.Predictor.max_batch);
        `ranks_per_node`: the
        cluster's, which a searched tp must divide (sweep.spec.layout.layout_problem)."""
        tune = spec.tune or TuneSpec()
        self.searches: dict[tuple[Any, ...], GroupSearch] = {}
        groups: dict[tuple[Any, ...], Trial] = {}
        for t in seeds:
            groups.setdefault(search_group(t), t)  # each group's first trial
        for first in groups.values():
            for layout in searched_layouts(first, spec, tune.vary, ranks_per_node=ranks_per_node):
                t = replace(first, **layout)
                space = Space(t, spec, tune, avoid=discouraged(t.precision, is_gpu=is_gpu))
                self.searches[search_key(t)] = GroupSearch(
                    space,
                    budget=tune.budget,
                    capacity_bytes=capacity_bytes,
                    sid=fastest_search_id(t, tune),
                    final_steps=(spec.steps.warmup, spec.steps.measure),
                    max_cost=tune.max_cost,
                    predicted_max=predicted_max,
                )

    def initial(self) -> list[Trial]:
        return [t for s in self.searches.values() for t in s.start()]

    def on_result(
        self, trial: Trial, status: str, infrastructure: bool = False, row: Mapping[str, Any] | None = None
    ) -> list[Trial]:
        # the runner's row is a Row; the Plan protocol reads it as a mapping of columns
        return self.searches[search_key(trial)].on_result(trial, status, infrastructure, cast(Row, row or {}))

    def verdicts(self) -> list[Verdict]:
        """One sweep.search.fastest.verdict.FastestVerdict per search."""
        return [s.verdict() for s in self.searches.values()]
