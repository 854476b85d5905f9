"""A group of rank processes on Ray (`RankGroup`, its `GroupState`), and what places, starts and retires one.

`Placer` is Ray's side of a group: the placement group requested for its ranks' bundles
(`sweep.execution.placement`), one `trainer.worker.RankWorker` actor per rank in its bundle, the actors' word
on where they run (node_info), and at the end the actors killed and the placement group removed. Which trial
runs on which group, and when, is `sweep.execution.scheduler`'s.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum
from typing import Any

from clusters.schema import ClusterProfile
from sweep.execution.groups import WarmGroupKey, warm_group_key
from sweep.execution.outcome import short
from sweep.execution.placement import bundle, bundle_index, placement, rank_env
from sweep.spec.grid import Trial
from sweep.text import seconds

START_TIMEOUT_S = 300.0  # rank processes must come up within this (imports torch, maybe CUDA init)
INFEASIBLE_LIMIT_S = 120.0  # a placement no live node set can hold is given up after this (or the trial timeout)
# Placement states (Ray's placement group stats) that mean: not placed now, whatever an idle group does.
WAITING = ("NO_RESOURCES", "INFEASIBLE")


class GroupState(Enum):
    """Where a group is in its life: PLACING → STARTING → IDLE ⇄ RUNNING → RETIRED."""

    PLACING = "placing"  # its placement group requested, not yet placed
    STARTING = "starting"  # placed; its rank actors are starting (rank 0 picks MASTER_ADDR/PORT)
    IDLE = "idle"  # up, between trials: it may take a queued trial it may run
    RUNNING = "running"  # every rank trains one trial
    RETIRED = "retired"  # actors killed, placement group removed


@dataclass(eq=False)
class RankGroup:
    """One placement group and one rank actor per rank, running trials of one kind (`warm_group_key`)."""

    key: WarmGroupKey
    """The kind of trials it may run (`sweep.execution.groups.warm_group_key`); `key[0]` is its rank count."""
    pg: Any
    """Ray's placement group."""
    ready_ref: Any
    """The placement group's ready() reference: ready once it is placed."""
    first: Trial | None
    """The trial it was requested for, until it is up (`sweep.execution.groups.opener`)."""
    state: GroupState = GroupState.PLACING
    """Where it is in its life (`GroupState`)."""
    actors: list[Any] = field(default_factory=list)
    """One RankWorker actor handle per rank, in rank order."""
    info_refs: list[Any] = field(default_factory=list)
    """Each actor's node_info() reference, in rank order."""
    nodes: list[dict[str, Any]] = field(default_factory=list)
    """node_info per rank once up: ip, port, hostname, node_id, pid."""
    trials: int = 0
    """Trials launched on it: the next one's group_trial_index."""
    stage: int = 0
    """The latest stack stage it ran (`sweep.execution.groups.stack_stage`): it runs none earlier."""
    deadline: float = math.inf
    """Starting: the rank processes must be up by then (monotonic)."""
    placed_at: float | None = None
    """Monotonic: when its placement group was placed."""
    up_at: float | None = None
    """Monotonic: every rank process answered node_info (spawned, trainer.worker imported)."""
    started_at: datetime | None = None
    """Wall clock: when it was placed (a fresh group's first trial starts then)."""
    ready: set[Any] = field(default_factory=set)
    """References already seen ready (not waited on again)."""
    infeasible_since: float | None = None
    """When Ray first said no node set can hold the placement group."""

    @property
    def ranks(self) -> int:
        return int(self.key[0])


@dataclass(frozen=True)
class StartFailure:
    """Why a group never came up: its first trial's status and error."""

    status: str
    """'timeout' (not placed, or processes not up, in time) or 'error' (a rank process failed to start)."""
    error: str
    """The error text, without INFRA_PREFIX."""
    infrastructure: bool = False
    """A rank process died or could not start: worth one retry."""


class Placer:
    """Places, starts and retires rank groups on Ray for one cluster profile."""

    def __init__(self, ray: Any, profile: ClusterProfile, *, reuse: bool, env_in_ray: bool = False) -> None:
        self.ray = ray
        self.profile = profile
        # the ranks' environment is already Ray's (sweep.execution.prestart): an actor with a runtime_env of its own
        # never gets one of the rank processes Ray started ahead
        self.env_in_ray = env_in_ray
        self.reuse = reuse  # the actors keep their process group for a next trial (RankWorker's keep_group)
        self._remote_worker: Any = None
        self._requests = 0  # placement groups requested

    def request(self, trial: Trial) -> RankGroup:
        """A new group for `trial` (its first): the placement group is requested now."""
        from ray.util.placement_group import placement_group

        bundles, strategy = placement(self.profile, trial.gpus)
        self._requests += 1  # a name of its own: the trial it is requested for may end up on another group
        pg = placement_group(bundles, strategy=strategy, name=f"sweep-{trial.trial_id}-{self._requests}")
        return RankGroup(key=warm_group_key(trial), pg=pg, ready_ref=pg.ready(), first=trial)

    def placement_state(self, group: RankGroup) -> str | None:
        """Ray's word on a requested placement group: NO_RESOURCES (busy), INFEASIBLE (never, as things are)..."""
        from ray.util.placement_group import placement_group_table

        try:
            state = placement_group_table(group.pg).get("stats", {}).get("scheduling_state")
            return None if state is None else str(state)
        except Exception:  # no such detail from this Ray
            return None

    def progress(self, g: RankGroup, ready: set[Any]) -> StartFailure | bool:
        """A new group towards up: placed, then its actors started, then every rank's node_info read. True once
        it is up (its first trial may launch), False while it is on its way, a StartFailure if it never will be."""
        now = time.monotonic()
        g.ready |= ready & {g.ready_ref, *g.info_refs}
        if g.state is GroupState.PLACING:
            if g.ready_ref in g.ready:
                g.placed_at, g.started_at = now, datetime.now(timezone.utc)
                g.deadline = now + START_TIMEOUT_S
                self._start_actors(g)
                return False
            return self._unplaceable(g, now) or False
        if now > g.deadline:
            return StartFailure(
                "timeout", f"rank processes did not start within {seconds(START_TIMEOUT_S)}; all ranks killed"
            )
        if not all(r in g.ready for r in g.info_refs):
            return False
        g.up_at = now
        for rank, ref in enumerate(g.info_refs):
            try:
                g.nodes.append(self.ray.get(ref))
            except Exception as e:  # the process died, or its runtime env could not be set up
                return StartFailure(
                    "error", f"rank {rank} of {g.ranks} failed to start: {short(e)}", infrastructure=True
                )
        return True

    def _unplaceable(self, g: RankGroup, now: float) -> StartFailure | None:
        """Time out a placement group that no node set of the cluster can hold (a node lost, or a profile that
        promises more than the cluster has): it would wait forever, and hold up every trial behind it."""
        if self.placement_state(g) != "INFEASIBLE":  # placed soon, or waiting for resources a trial will free
            g.infeasible_since = None
            return None
        g.infeasible_since = g.infeasible_since or now
        # Short: one placement at a time means every trial behind this one waits too (an autoscaler adding
        # nodes has this long to make it feasible).
        limit = min(INFEASIBLE_LIMIT_S, g.first.timeout_s if g.first else INFEASIBLE_LIMIT_S)
        if now - g.infeasible_since < limit:
            return None
        _, strategy = placement(self.profile, g.ranks)
        return StartFailure(
            "timeout",
            f"could not be placed for {seconds(limit)}: the cluster's live nodes "
            f"cannot hold {g.ranks} x {bundle(self.profile)} ({strategy})",
        )

    def _start_actors(self, g: RankGroup) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from trainer.worker import RankWorker

        if self._remote_worker is None:
            self._remote_worker = self.ray.remote(RankWorker)
        ranks = g.ranks
        # the ranks' environment, once per group: its own unless Ray's processes have it already
        own_env = {} if self.env_in_ray else {"runtime_env": {"env_vars": rank_env(self.profile)}}
        for i in range(ranks):
            where = PlacementGroupSchedulingStrategy(
                placement_group=g.pg, placement_group_bundle_index=bundle_index(self.profile, i, ranks)
            )
            actor = self._remote_worker.options(
                num_cpus=self.profile.cpus_per_rank,
                num_gpus=1 if self.profile.is_gpu else 0,
                max_restarts=0,
                scheduling_strategy=where,
                **own_env,
            ).remote(keep_group=self.reuse)
            g.actors.append(actor)
        g.info_refs = [actor.node_info.remote() for actor in g.actors]
        g.state = GroupState.STARTING

    def retire(self, g: RankGroup) -> None:
        """Kill the group's actors and remove its placement group: nothing of it is left on the cluster."""
        from ray.util.placement_group import remove_placement_group

        for actor in g.actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:
                pass
        try:
            remove_placement_group(g.pg)
        except Exception:
            pass
        g.state = GroupState.RETIRED
        g.first = None
