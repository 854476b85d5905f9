"""What became of one trial attempt (`Outcome`), and the words for a failure. Pure: no Ray, no torch.

`sweep.execution.scheduler` makes Outcomes; `sweep.record.rows` turns them into rows. An attempt lost to a dead
or unstartable rank process has an error starting with INFRA_PREFIX: a resumed run knows from the row alone to
retry it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sweep.spec.grid import Trial
from trainer.result import RankResult

INFRA_PREFIX = "infrastructure: "  # starts the error of every attempt lost to a dead or unstartable process


@dataclass
class Outcome:
    trial: Trial
    status: str
    error: str | None = None
    ranks: list[RankResult] = field(default_factory=list)  # each rank's result ('ok' ranks only if all ok)
    nodes: list[dict[str, Any]] = field(default_factory=list)  # node_info per rank
    started_at: datetime | None = None
    finished_at: datetime | None = None
    wall_s: float | None = None
    infrastructure: bool = False  # a rank process died or never started: worth one retry
    traceback: str | None = None  # the failing rank's Python traceback
    group_trial_index: int = 0  # trials its group ran before this one (0: a fresh group's processes)
    process_start_s: float | None = None  # a fresh group's first trial: its placement to every rank process up
    imported_before_placement: bool | None = None  # a fresh group's first trial: `imported_before`
    note: str | None = None  # why an ok trial's group was retired (memory not back to its baseline)

    @property
    def actor_reused(self) -> bool:
        return self.group_trial_index > 0


def imported_before(nodes: list[dict[str, Any]], placed_at: datetime | None) -> bool | None:
    """Whether every rank process had imported torch and the trainer (`trainer.preload`, in Ray's worker pool)
    before its group was placed: its GPUs were not held while they imported. None before it was placed."""
    if placed_at is None or not nodes:
        return None
    placed = placed_at.timestamp()
    return all(n.get("preloaded_at") is not None and n["preloaded_at"] <= placed for n in nodes)


def is_infrastructure_error(error: str | None) -> bool:
    """True for the error text of an attempt lost to a dead or unstartable rank process."""
    return error is not None and error.startswith(INFRA_PREFIX)


def deaths(dead: dict[int, BaseException], nodes: list[dict[str, Any]], world_size: int) -> str:
    """'rank 1 of 2 died (pid 4242 on host-a): ActorDiedError: ...': which ranks, where to find their logs."""
    where = ", ".join(
        f"pid {nodes[r].get('pid')} on {nodes[r].get('hostname')}" if r < len(nodes) else "?" for r in dead
    )
    ranks = ", ".join(str(r) for r in dead)
    cause = short(next(iter(dead.values())))
    return f"rank{'s' if len(dead) > 1 else ''} {ranks} of {world_size} died ({where}): {cause}"


def short(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:500]}"
