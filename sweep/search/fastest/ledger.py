"""The probe ledger of one `search: fastest` group (sweep.search.fastest.search): what was asked at which rung, each
attempt's row, and what the failures taught; and the `Prober` that asks for probes under the rungs' caps and the
cost cap. Pure: no torch, no Ray."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from sweep.search.fastest.cost import affordable, final_auto_max, time_limit_s
from sweep.search.fastest.space import Config, Row, Space, Steps, probe_steps
from sweep.spec.grid import Trial

__all__ = ["Row", "Rung", "Ledger", "Learned", "Prober"]


class Rung(Enum):
    """How deep a probe measures: its steps and its share of the budget (sweep.search.fastest.search)."""

    SHORT = 0  # a short probe: the fit and explore stages
    LONGER = 1  # successive halving's rung: longer steps
    FINAL = 2  # the grid's own steps: a full measurement
    PROFILE = 3  # the best's profile trial: a short probe's steps, profiled=True


class Ledger:
    """Every probe a group's search asked for, and every attempt's row."""

    def __init__(self) -> None:
        self.asked: dict[tuple[Config, Rung], str] = {}  # (config, rung) -> trial_id of its latest attempt
        self.owner: dict[str, tuple[Config, Rung]] = {}  # every trial issued -> (config, rung)
        self.results: dict[str, Row] = {}  # trial_id -> its row: one per attempt (a retry has its own id)
        self.pending: set[str] = set()
        self.thrashed: set[Config] = set()  # probes that fit only by the allocator freeing its cache (retries)

    @property
    def attempts(self) -> int:
        """The trials issued so far: OOMs, errors, infrastructure retries, everything."""
        return len(self.owner)

    def issue(self, trial: Trial, c: Config, rung: Rung) -> list[Trial]:
        self.owner[trial.trial_id] = (c, rung)
        self.asked[(c, rung)] = trial.trial_id
        self.pending.add(trial.trial_id)
        return [trial]

    def answer(self, trial: Trial, row: Row) -> tuple[Config, Rung]:
        """Record an attempt's row (its status as the search reads it); the (config, rung) it was asked for."""
        self.pending.discard(trial.trial_id)
        self.results[trial.trial_id] = row
        return self.owner[trial.trial_id]

    def ok_row(self, c: Config | None, rung: Rung) -> Row | None:
        """The row of `c`'s latest attempt at `rung` if it ran ok."""
        trial_id = self.asked.get((c, rung)) if c is not None else None
        row = self.results.get(trial_id) if trial_id is not None else None
        return row if row and row["status"] == "ok" else None

    def measured(self, rung: Rung, clean: bool = False) -> list[tuple[Config, float]]:
        """The configs measured at `rung`, fastest first (a tie: the one asked first); `clean`: not those that
        thrashed (their speed measured the allocator, not their options)."""
        out = [
            (c, row["tflops_per_gpu"] or 0.0)
            for (c, r) in self.asked
            if r == rung and (row := self.ok_row(c, r)) and not (clean and c in self.thrashed)
        ]
        return sorted(out, key=lambda x: -x[1])

    def clean(self) -> list[tuple[Config, Row]]:
        """The short probes that ran ok without thrashing, fastest first, with their rows."""
        return [
            (c, row)
            for c, _ in self.measured(Rung.SHORT, clean=True)
            if (row := self.ok_row(c, Rung.SHORT)) is not None
        ]

    def probed(self, rung: Rung) -> list[Config]:
        """The configs asked at `rung`, in the order first asked."""
        return [c for c, r in self.asked if r == rung]

    def tried(self) -> set[Config]:
        return {c for c, _ in self.asked}

    def attempt_rows(self) -> list[tuple[Config, Row]]:
        """Every attempt's row with its config: what the cost model reads."""
        return [(self.owner[t][0], r) for t, r in self.results.items()]


@dataclass
class Learned:
    """What the failed probes of a search taught it: where not to go again."""

    ooms: list[Config] = field(default_factory=list)
    """The configs that ran out of memory, in the order their answers came."""
    broken: set[tuple[str, Any]] = field(default_factory=set)
    """Option values that failed on their own (not for memory)."""
    fallbacks: dict[Config, Config] = field(default_factory=dict)
    """A config that ran out of memory while exploring -> it at a smaller batch."""
    unaffordable: list[Config] = field(default_factory=list)
    """Skipped for good: predicted past max_cost (Prober.affordable)."""


class Prober:
    """Asks for a group's probes: a config at a rung's steps, while the trials issued are under the rung's cap,
    and only those the cost cap allows (sweep.search.fastest.cost)."""

    def __init__(
        self,
        space: Space,
        ledger: Ledger,
        learned: Learned,
        *,
        sid: str,
        caps: dict[Rung, int],
        steps: dict[Rung, Steps],
        max_cost: float | None,
    ):
        self.space, self.ledger, self.learned, self.sid = space, ledger, learned, sid
        self.caps, self.steps, self.max_cost = caps, steps, max_cost

    def room(self, rung: Rung) -> int:
        """How many more trials `rung`'s cap allows."""
        return self.caps[rung] - self.ledger.attempts

    def ask(self, c: Config, rung: Rung) -> list[Trial]:
        """Issue `c` at `rung`'s steps (the profile: profiled, its own trial id), unless the same trial was issued
        before (two rungs with the same steps: its row serves both; the runner runs a trial once) or its cap is
        reached."""
        final = rung == Rung.FINAL
        steps = self.steps[rung] if final else probe_steps(self.steps[rung], c.grad_accum)
        most = final_auto_max(c.grad_accum) if final and "auto" in steps else None  # as the cost cap reserved
        # a hang costs this, not 30 min
        limit = time_limit_s(c, steps, *self.spent(), final_steps=self.steps[Rung.FINAL])
        trial = self.space.trial(
            c, steps, profiled=rung == Rung.PROFILE, search_id=self.sid, auto_max=most, time_limit_s=limit
        )
        if trial.trial_id in self.ledger.owner:
            self.ledger.asked[(c, rung)] = trial.trial_id
            return []
        return self.ledger.issue(trial, c, rung) if self.room(rung) > 0 else []

    def ask_all(self, configs: list[Config], rung: Rung) -> list[Trial]:
        return [t for c in configs for t in self.ask(c, rung)]

    def affordable(self, wave: list[Config], rung: Rung) -> list[Config]:
        """The probes of `wave` the cost cap allows (sweep.search.fastest.cost.affordable); the others are skipped
        for good."""
        steps = [
            self.steps[Rung.FINAL] if rung == Rung.FINAL else probe_steps(self.steps[rung], c.grad_accum) for c in wave
        ]
        leader, probes = self.spent()
        # the room kept is the best's and the baseline's finals': a runner-up's final is made only if it fits then
        kept, skipped = affordable(
            wave,
            steps,
            leader=leader,
            finals=2,
            max_cost=self.max_cost,
            probes=probes,
            final_steps=self.steps[Rung.FINAL],
        )
        self.learned.unaffordable += skipped
        return kept

    def spent(self) -> tuple[tuple[Config, Row] | None, list[tuple[Config, Row]]]:
        """What the cost model reads: the leader (the fastest clean short probe, with its row) and every attempt."""
        return next(iter(self.ledger.clean()), None), self.ledger.attempt_rows()
