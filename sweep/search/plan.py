"""What a plan is, declared once (as Ray Tune's `Searcher` declares suggest / on result): the runner asks a plan
for its first trials, tells it each attempt's result, and asks it for its verdicts at the end. Pure.

Plans: `sweep.search.policy.GridPlan` (the grid's trials, OOM retries), `sweep.search.max_batch.MaxBatchPlan`
(`search: max_batch`), `sweep.search.fastest.plan.TunePlan` (`search: fastest`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping

    from sweep.spec.grid import Trial


class Verdict(Protocol):
    """What one search found. Saved as JSON under ``<output>/_search/<run_id>.json`` (one object per search)."""

    # read-only members: a frozen dataclass's field satisfies them, and a narrower type (`str` for the id) too

    @property
    def kind(self) -> str:
        """ "max_batch" or "fastest"."""
        ...

    @property
    def search_id(self) -> str | None:
        """The id every probe row of the search carries in its `search_id` column."""
        ...

    def to_json(self) -> dict[str, Any]:
        """The saved object: the same keys, in the same order, as every earlier release wrote."""
        ...


class Plan(Protocol):
    """Trials in, results back, verdicts out. The runner executes whatever a plan returns and nothing else."""

    def initial(self) -> list[Trial]:
        """The trials to run first."""
        ...

    def on_result(
        self, trial: Trial, status: str, infrastructure: bool = False, row: Mapping[str, Any] | None = None
    ) -> list[Trial]:
        """The follow-up trials after `trial` ended with `status` (its row, when one was written)."""
        # (`row` read only: the runner's sweep.record.schema.Row, a test's plain dict of columns)
        ...

    def verdicts(self) -> list[Verdict]:
        """One per search the plan ran (none for a plain grid)."""
        ...
