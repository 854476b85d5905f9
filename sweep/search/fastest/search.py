"""`search: fastest`: the fastest configuration of each (model, precision, seq_len, ranks) group, within a
budget of probes. Pure: no torch, no Ray (tests/test_tune.py drives it with a simulated runner).

The candidates are the configurations of `sweep.search.fastest.space.Space`. Each group's search has five stages;
a stage decides only once every probe it issued has answered, from results it sorts itself, so the order
in which answers arrive (concurrent trials, or rows reused by --resume) does not change the search:

  fit      per ac level (the grid's first, then from most memory to least), the batches that fit with the
           grid's other options (sweep.search.fastest.level_fit.LevelFit: a MaxBatchSearch of short probes, under
           global_batch_tokens on the batches of valid splits). A level starts at the largest batch a
           heavier level fitted (it fits: less is kept) and stays under the smallest batch a lighter level
           ran out of memory at; it goes on from there only if some batch could make up its recomputation
           (LevelFit.batch_gain). Its candidates run its largest fitting batch and the fastest one found
           (under G: the two largest splits that fit). A fixed batch needs no probes here.
  explore  short probes (SHORT steps, counted in micro-batches: probe_steps): first every neighbour of the
           baseline (one option changed; of accumulation only the most micro-batches), then waves of the
           candidates the measured one-option effects, added in log speed, rate fastest (none rated below the
           fastest clean probe: Screening._promising), each led by a candidate for every option value not yet run
           clean (Screening._untried), until STALE_WAVES waves in a row find nothing faster; then only those leads,
           while the budget lasts. Each candidate runs where its memory is predicted to fit (Candidates.placed,
           sweep.search.fastest.memory), and never past the batch the memory model predicts to fit
           (sweep.memory.predictor: the runner would record it unsupported); a level's fit starts at that model's
           limit. Never probed: a candidate as heavy as a known OOM (space.at_least_as_heavy), or with an option
           value that failed on its own. One that runs out of memory, or thrashes (allocator retries: its speed
           measures the memory's limit, so it rates no option), is tried at a smaller batch, and so is every
           candidate that needs its memory (sweep.search.fastest.memory: rebatched, unthrashed, needs). A probe
           predicted to take the search past `max_cost` one-trial costs, its finals' included, is skipped for good
           (Prober.affordable, sweep.search.fastest.cost).
  rung     successive halving: the fastest third of the short probes (at most the rung size) again,
           with LONGER steps; no rung where it would keep only the finalists (budgets under 19).
  final    the `finalists` fastest of the rung (without one: of the short probes; none that thrashed, as the
           rung takes none; a runner-up only within
           FINAL_MARGIN of the fastest, a probe reads within 0.4 % of its final, and within the cost cap, which
           keeps room for two finals: the best's and the baseline's), and the baseline (the grid's
           options at the fastest batch their fit found; under G the split with the largest micro-batch that
           fits) unless its short probe failed, with the grid's own steps (`auto`: at most final_auto_max, as the
           cost cap reserves). The best is the fastest of these.
  profile  the best (if a final ran ok) with a short probe's steps and profiled=True: the verdict's trace. A profiled
           trial retires its warm group (the profiler's hooks stay in it): only the best, last, costs no group start.

Budget bound: a stage issues a trial only while the trials issued so far (OOMs, errors, infrastructure
retries, everything) are under its cap: budget - (finalists + 2) - rung size for fit and explore,
budget - (finalists + 2) for the rung, budget - 1 for the finals (at most finalists + 1), budget for the
profile. So a group never makes more than `budget` attempts; a retry past its stage's cap is not made (the
attempt stays failed). A budget without room for one short probe, two finals and the profile is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sweep.errors import UserError
from sweep.search.fastest.candidates import Candidates
from sweep.search.fastest.ledger import Learned, Ledger, Prober, Row, Rung
from sweep.search.fastest.screening import Screening
from sweep.search.fastest.space import LONGER, SHORT, Config, Space, probe_steps, thrashes
from sweep.search.fastest.stages import (
    FINAL_MARGIN,
    KEEP,
    NOISE,
    RUNG_MAX,
    STALE_WAVES,
    WAVE,
    FinalStage,
    FitStage,
    ProfileStage,
    RungStage,
    Stage,
)
from sweep.search.fastest.verdict import FastestVerdict, fastest_verdict
from sweep.search.policy import infra_retry, is_predicted_oom
from sweep.spec.grid import Trial
from sweep.text import plural

__all__ = [
    "FINAL_MARGIN",
    "KEEP",
    "LONGER",
    "NOISE",
    "RUNG_MAX",
    "SHORT",
    "STALE_WAVES",
    "WAVE",
    "GroupSearch",
    "Rung",
    "probe_steps",
]


class GroupSearch:
    """The search of one group: stages fit, explore, rung, final, profile (module docstring), over one ledger."""

    def __init__(
        self,
        space: Space,
        *,
        budget: int,
        capacity_bytes: float | None,
        sid: str,
        final_steps: tuple[Any, Any],
        max_cost: float | None = None,
        predicted_max: Callable[[Trial], int | None] | None = None,
    ):
        """`predicted_max`: the largest batch of a trial's config the memory model predicts to fit
        (sweep.memory.predictor; None: nothing predicted): where each level's fit starts, and a ceiling on every
        candidate's batch."""
        self.space, self.budget, self.sid, self.max_cost = space, budget, sid, max_cost
        self.finalists = 2 if budget >= 8 else 1
        reserve = self.finalists + 2  # the finalists, the baseline and the best's profile
        rung = min(RUNG_MAX, (budget - reserve) // 5)  # a fifth of the rest at most: most of it explores
        self.rung_size = rung if rung > self.finalists else 0  # a rung that keeps only the finalists is moot
        caps = {
            Rung.SHORT: budget - reserve - self.rung_size,
            Rung.LONGER: budget - reserve,
            Rung.FINAL: budget - 1,
            Rung.PROFILE: budget,
        }
        t = space.template
        if caps[Rung.SHORT] < 1:  # budgets under 8 have one finalist: reserve 3
            raise UserError(
                f"tune.budget: {plural(budget, 'probe')} cannot find and fully measure a baseline and one "
                f"finalist for {t.model.label} {t.precision} (one short probe, two full measurements "
                f"and the best's profile); give budget: 4 or more"
            )
        steps = {Rung.SHORT: SHORT, Rung.LONGER: LONGER, Rung.FINAL: final_steps, Rung.PROFILE: SHORT}
        self.ledger, self.learned = Ledger(), Learned()
        self.prober = Prober(space, self.ledger, self.learned, sid=sid, caps=caps, steps=steps, max_cost=max_cost)
        self.candidates = Candidates(
            space, self.ledger, self.learned, capacity_bytes=capacity_bytes, predicted_max=predicted_max
        )
        self.fit = FitStage(space, self.prober, self.candidates, capacity_bytes=capacity_bytes)
        self.screening = Screening(space, self.prober, self.candidates, self.fit)
        self.rung = RungStage(self.prober, size=self.rung_size, finalists=self.finalists)
        self.final = FinalStage(self.prober, self.fit, self.rung, finalists=self.finalists)
        self.stages: list[Stage] = [
            self.fit,
            self.screening,
            self.rung,
            self.final,
            ProfileStage(self.prober, self.final),
        ]
        self.at = 0  # the stage under way (len(stages): done)

    @property
    def stage(self) -> str:
        """The name of the stage under way ("done" once all are over)."""
        return self.stages[self.at].name if self.at < len(self.stages) else "done"

    @property
    def baseline(self) -> Config | None:
        return self.fit.baseline

    # --- the plan protocol, for one group ---

    def start(self) -> list[Trial]:
        return self._advance()

    def on_result(self, trial: Trial, status: str, infrastructure: bool, row: Row) -> list[Trial]:
        if status == "unsupported" and is_predicted_oom(row):  # the model said it fails, without GPU time: an OOM
            status = "oom"
        c, rung = self.ledger.answer(trial, {**row, "status": status})
        retry = infra_retry(trial, status, infrastructure)
        if retry is not None and self.prober.room(rung) > 0:
            return self.ledger.issue(retry, c, rung)
        self._learn(c, status, row)
        return self._advance()

    def _advance(self) -> list[Trial]:
        """The next stage's probes, once none is out."""
        while not self.ledger.pending and self.at < len(self.stages):
            out = self.stages[self.at].next()
            if out:
                return out
            self.at += 1
        return []

    def _learn(self, c: Config, status: str, row: Row) -> None:
        learned, stage = self.learned, self.stage
        if thrashes(status, row):  # the candidates that need its memory shrink below it (Candidates, unthrashed)
            self.ledger.thrashed.add(c)
        elif status == "oom":
            learned.ooms.append(c)
            smaller = self.space.smaller_batch(c) if stage == "explore" else None
            if smaller is not None:  # e.g. grad_sync: step keeps whole gradients: its own, smaller batch
                learned.fallbacks[c] = smaller
        elif status != "ok" and stage == "explore" and len(self.candidates.changes(c)) == 1:
            learned.broken.update(self.candidates.changes(c))  # e.g. compile: full fails for this model: not again
        if stage == "fit":  # its probes are all short ones
            self.fit.record(c.batch_size, status, row)

    def verdict(self) -> FastestVerdict:
        return fastest_verdict(
            self.space,
            self.ledger,
            self.learned,
            sid=self.sid,
            budget=self.budget,
            max_cost=self.max_cost,
            baseline=self.fit.baseline,
            finals=self.final.asked,
            candidates=self.candidates.configs(),
        )
