"""One trial running on one group (`Attempt`, its `AttemptState`), and how its ranks' reports decide its end.

A rank process that dies (SIGKILL, segfault, node lost) is an infrastructure failure. When one rank dies its
peers fail too ("Connection reset by peer" inside a collective), often in the same instant; the dead rank is
the cause, so a rank's `error` waits up to DEATH_GRACE_S for a peer's death to show. An OOM is the rank's own
failure and decides at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any

from sweep.execution.outcome import short
from sweep.execution.rank_group import RankGroup
from sweep.spec.grid import Trial
from sweep.text import seconds
from trainer.result import RankResult

DEATH_GRACE_S = 3.0  # Ray reports a dead process within ~0.1 s of its peers' socket errors; 3 s is ample


class AttemptState(Enum):
    """Where an attempt is: RUNNING → (FAILING →) FINISHED."""

    RUNNING = "running"  # every rank trains; none has reported a failure
    FAILING = "failing"  # a rank reported an error: its peers have DEATH_GRACE_S to report, or to be found dead
    FINISHED = "finished"  # decided: ok, or its failure's cause known, or past its timeout


@dataclass(frozen=True)
class AttemptEnd:
    """How an attempt ended: what its Outcome says."""

    status: str
    """'ok', 'oom', 'error' or 'timeout'."""
    error: str | None = None
    """The cause, without INFRA_PREFIX; None when ok."""
    infrastructure: bool = False
    """A rank process died: worth one retry."""
    traceback: str | None = None
    """The failing rank's Python traceback."""


@dataclass(eq=False)
class Attempt:
    """One trial on every rank of one group, from its launch to its end."""

    trial: Trial
    """The trial the ranks run."""
    group: RankGroup
    """The group whose ranks run it."""
    index: int
    """The group's trials before this one."""
    run_refs: list[Any]
    """Each rank's RankWorker.run() reference, in rank order."""
    since: float
    """Monotonic: placement (a fresh group's first trial) or launch, for wall_s."""
    started_at: datetime
    """Wall clock: when it started (a fresh group's first trial: when the group was placed)."""
    deadline: float
    """Monotonic: past it the attempt is a timeout."""
    state: AttemptState = AttemptState.RUNNING
    """Where it is (`AttemptState`)."""
    results: dict[int, RankResult] = field(default_factory=dict)
    """rank -> its result, in order of arrival."""
    ready: set[Any] = field(default_factory=set)
    """References already seen ready (not read again)."""
    failure_final_at: float = math.inf
    """A reported error decides then, unless a rank is found dead first."""

    def collect(self, ray: Any, ready: set[Any], lost_errors: tuple[type[BaseException], ...]) -> dict[int, Any]:
        """Read the results of the ranks whose run ended; the ranks found dead, with what Ray said."""
        self.ready |= ready & set(self.run_refs)
        dead = {}
        for rank, ref in enumerate(self.run_refs):
            if ref in self.ready and rank not in self.results:
                try:
                    self.results[rank] = ray.get(ref)
                except lost_errors as e:  # the process died (SIGKILL, segfault, OOM killer, node lost)
                    dead[rank] = e
                except Exception as e:  # a result that could not be read back: a failure of this rank
                    self.results[rank] = RankResult(status="error", error=short(e))
        return dead

    def decide(self, now: float) -> AttemptEnd | None:
        """The end the ranks' results decide by `now` (no rank found dead), or None while it runs on."""
        failures = [(r, res) for r, res in self.results.items() if res.status != "ok"]  # in order of arrival
        if failures and self.state is AttemptState.RUNNING:
            self.state, self.failure_final_at = AttemptState.FAILING, now + DEATH_GRACE_S
        # An OOM is the rank's own failure and decides at once. An error may be the echo of a dead peer, so
        # it decides once every rank reported or the grace is over; then the first one is the cause.
        own = next(((r, res) for r, res in failures if res.status != "error"), None)
        everyone = len(self.results) == len(self.run_refs)
        if own or failures and (now >= self.failure_final_at or everyone):
            rank, result = own or failures[0]  # the others are killed now, not left waiting in a collective
            return AttemptEnd(result.status, f"rank {rank}: {result.error}", traceback=result.traceback)
        if everyone:
            return AttemptEnd("ok")
        if now > self.deadline:  # checked after reading results: a trial that finished in time is not lost
            return AttemptEnd("timeout", f"trial ran past the {seconds(self.trial.timeout_s)} limit; all ranks killed")
        return None

    def ranks(self, status: str) -> list[RankResult]:
        """The results an Outcome carries: every rank's in rank order when ok, else those that arrived."""
        return [self.results[r] for r in sorted(self.results)] if status == "ok" else list(self.results.values())
