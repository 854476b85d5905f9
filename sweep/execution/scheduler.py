"""Ray scheduling: warm groups of rank actors, one trial at a time on each, many groups at once.

The scheduler knows nothing of grids or policies: `submit(trial)` queues an attempt, `poll()` returns
the attempts that finished as `Outcome`s. A group is one placement group and one actor per rank; it runs
the trials it may (`sweep.execution.groups`: the same ranks and memory cap; plain torch, then torchao; Transformer
Engine apart) one after the other without restarting its processes: imports, the CUDA context and the
process group stay, and each trial builds its own model, optimizer, compiled graphs and precision state
(`trainer.train`). A group moves through

    placing (placement group requested) → starting (rank actors up, rank 0 picks MASTER_ADDR/PORT)
    → idle ⇄ running (every rank trains one trial) → retired (actors killed, placement group removed)

A group is retired, never to measure on a process a trial may have polluted, after a trial that did not
end `ok` (an OOM, an error, a timeout, a dead rank: the others are killed at once instead of waiting in a
collective) and after an ok trial whose ranks hold more tensor memory than before the group's first trial
(`returned_to_baseline`), after a profiled trial (the profiler's hooks stay in the process); with
`reuse=False` (`--fresh-actors`) after every trial. An idle group is retired
as soon as no queued trial can use it, or when the placement of the oldest waiting trial waits for the
resources it holds. `shutdown()` (Ctrl-C in the driver) retires every group.
A rank process that dies (SIGKILL, segfault, node lost) is an infrastructure failure: its error text
starts with INFRA_PREFIX, which is how a resumed run knows, from the row alone, to retry it. When one
rank dies its peers fail too ("Connection reset by peer" inside a collective), often in the same instant;
the dead rank is the cause, so a rank's `error` waits up to DEATH_GRACE_S for a peer's death to show.
A new group runs the trial it was placed for first (stage permitting: `sweep.execution.groups.opener`); an idle one
picks among the waiting trials it may run (`sweep.execution.groups.pick`: plain torch before torchao, then the
smallest first); otherwise trials start in submission order and one placement
group is requested at a time, only for the oldest waiting trial, so a big trial waiting for GPUs is not
overtaken forever by small ones (only by the queued trials an idle group may run). One that no set of live
nodes can ever hold (a node lost) is given up as a `timeout` after INFEASIBLE_LIMIT_S (or the trial's
timeout, if shorter).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from sweep.spec.grid import Trial
from sweep.execution.groups import fits, group_key, kept_note, opener, pick, returned_to_baseline, stack_stage
from sweep.execution.outcome import INFRA_PREFIX, Outcome, deaths, short
from sweep.execution.placement import bundle, bundle_index, placement, rank_env, rank_jobs
from sweep.text import seconds
from trainer.job import PG_TIMEOUT_S

START_TIMEOUT_S = 300.0  # rank processes must come up within this (imports torch, maybe CUDA init)
INFEASIBLE_LIMIT_S = 120.0  # a placement no live node set can hold is given up after this (or the trial timeout)
DEATH_GRACE_S = 3.0  # Ray reports a dead process within ~0.1 s of its peers' socket errors; 3 s is ample
# Placement states (Ray's placement group stats) that mean: not placed now, whatever an idle group does.
_WAITING = ("NO_RESOURCES", "INFEASIBLE")


@dataclass(eq=False)
class _Group:
    key: tuple
    pg: object
    ready_ref: object
    first: Trial | None  # the trial it was requested for, until it is up (sweep.execution.groups.opener)
    state: str = "placing"
    actors: list = field(default_factory=list)
    info_refs: list = field(default_factory=list)
    nodes: list = field(default_factory=list)
    trials: int = 0  # trials launched on it: the next one's group_trial_index
    stage: int = 0  # the latest stack stage it ran (sweep.execution.groups.stack_stage): it runs none earlier
    deadline: float = math.inf  # starting: the rank processes must be up by then
    placed_at: float | None = None
    up_at: float | None = None  # monotonic: every rank process answered node_info (spawned, trainer.worker imported)
    started_at: datetime | None = None
    ready: set = field(default_factory=set)  # refs already seen ready (not waited on again)
    infeasible_since: float | None = None  # when Ray first said no node set can hold the placement group


@dataclass(eq=False)
class _Attempt:
    trial: Trial
    group: _Group
    index: int  # the group's trials before this one
    run_refs: list
    since: float  # monotonic: placement (a fresh group's first trial) or launch, for wall_s
    started_at: datetime
    deadline: float
    results: dict = field(default_factory=dict)  # rank -> result
    ready: set = field(default_factory=set)
    failure_final_at: float = math.inf  # a reported error decides then, unless a rank is found dead first


class Scheduler:
    def __init__(self, profile, *, max_concurrent: int | None = None, pg_timeout_s: float = PG_TIMEOUT_S,
                 reuse: bool = True):
        import ray
        from ray.exceptions import ObjectLostError, RayActorError

        self.ray = ray
        self._lost_errors = (RayActorError, ObjectLostError)  # a rank's process or its node is gone
        self.profile = profile
        self.max_concurrent = max_concurrent or 10**9
        self.pg_timeout_s = pg_timeout_s
        self.reuse = reuse
        self.queue: list[Trial] = []
        self.groups: list[_Group] = []
        self.attempts: list[_Attempt] = []
        self._remote_worker = None
        self._requests = 0  # placement groups requested

    # -- public --------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """Trials queued, being placed or running (idle groups alone are not work)."""
        return bool(self.queue or self.attempts or any(g.first for g in self.groups))

    def running(self) -> list[Trial]:
        return [a.trial for a in self.attempts] + [g.first for g in self.groups if g.state == "starting"]

    def submit(self, trial: Trial) -> None:
        self.queue.append(trial)

    def poll(self, timeout: float = 1.0) -> list[Outcome]:
        """Advance every group and attempt; return the attempts that finished. Blocks at most ~`timeout` s."""
        self._dispatch()
        refs = self._waitable()
        if refs:
            self.ray.wait(refs, num_returns=1, timeout=timeout)  # sleep until something happens
            ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
        else:
            ready = []
            time.sleep(min(timeout, 0.05))
        ready = set(ready)
        done = [o for g in list(self.groups) if g.first and (o := self._advance_group(g, ready))]
        done += [o for a in list(self.attempts) if (o := self._advance(a, ready))]
        return done

    def shutdown(self) -> None:
        """Retire every group, idle ones too (Ctrl-C): no orphaned actors or placement groups."""
        for group in list(self.groups):
            self._retire(group)
        self.attempts.clear()
        self.queue.clear()

    # -- which trial runs where ----------------------------------------------------------------
    def _dispatch(self) -> None:
        """Start waiting trials: each idle group on the one it picks (`_keep_idle_busy`), then a new group
        for the oldest trial left, if none is being placed.

        One placement group is requested at a time, for the oldest waiting trial, and nothing behind that
        trial starts on a new group before it is placed (no starvation of a big trial). Should an idle group
        of its kind turn up meanwhile, the request is withdrawn and the trial goes back to the queue's front,
        where the idle group picks among those it may run (it, or another; then it is requested again)."""
        placing = next((g for g in self.groups if g.state == "placing"), None)
        if placing is not None and self._idle(placing.first) is not None:
            self.queue.insert(0, placing.first)  # the idle group picks among its kind, this one included
            self._retire(placing)
            placing = None
        self._keep_idle_busy()  # after it, no idle group has a queued trial it may run
        if self.queue and placing is None and self._in_flight() < self.max_concurrent:
            placing = self._request(self.queue.pop(0))
        self._retire_idle(placing)

    def _keep_idle_busy(self) -> None:
        """An idle group takes the waiting trial it picks (`sweep.execution.groups.pick`), even one behind a trial of
        another kind: on a node with room for one group, two searches (or a grid's precisions) submitted in
        turn would otherwise retire and restart a group for every trial. It holds up the oldest trial only
        while trials of an idle group's kind are queued, which are finite (a search's probes come one round
        at a time)."""
        for group in [g for g in self.groups if g.state == "idle"]:
            trial = pick(group.key, group.stage, self.queue)
            if trial is not None and self._in_flight() < self.max_concurrent:
                self.queue.remove(trial)
                self._launch(group, trial)

    def _idle(self, trial: Trial) -> _Group | None:
        return next((g for g in self.groups if g.state == "idle" and fits(g.key, g.stage, trial)), None)

    def _in_flight(self) -> int:
        """Trials running or waiting for their new group: what max_concurrent bounds."""
        return len(self.attempts) + sum(1 for g in self.groups if g.first)

    def _retire_idle(self, placing: _Group | None) -> None:
        """Give back what idle groups hold when no queued trial can use them, or when the placement requested
        for the oldest waiting trial waits for resources (an idle group that may run it would have taken it)."""
        idle = [g for g in self.groups if g.state == "idle"]
        waits = bool(idle) and placing is not None and self._placement_state(placing) in _WAITING
        for group in idle:
            if waits or not any(fits(group.key, group.stage, t) for t in self.queue):
                self._retire(group)

    # -- placement -----------------------------------------------------------------------------
    def _placement_state(self, group: _Group) -> str | None:
        """Ray's word on a requested placement group: NO_RESOURCES (busy), INFEASIBLE (never, as things are)..."""
        from ray.util.placement_group import placement_group_table

        try:
            return placement_group_table(group.pg).get("stats", {}).get("scheduling_state")
        except Exception:  # no such detail from this Ray
            return None

    def _request(self, trial: Trial) -> _Group:
        """A new group for `trial` (its first): the placement group is requested now."""
        from ray.util.placement_group import placement_group

        bundles, strategy = placement(self.profile, trial.gpus)
        self._requests += 1  # a name of its own: the trial it is requested for may end up on another group
        pg = placement_group(bundles, strategy=strategy, name=f"sweep-{trial.trial_id}-{self._requests}")
        group = _Group(key=group_key(trial), pg=pg, ready_ref=pg.ready(), first=trial)
        self.groups.append(group)
        return group

    def _waitable(self) -> list:
        refs = []
        for g in self.groups:
            pending = {"placing": [g.ready_ref], "starting": g.info_refs}.get(g.state, [])
            refs += [r for r in pending if r not in g.ready]  # a ready ref would end every wait at once
        for a in self.attempts:
            refs += [r for r in a.run_refs if r not in a.ready]
        return refs

    # -- the state machine ---------------------------------------------------------------------
    def _advance_group(self, g: _Group, ready: set) -> Outcome | None:
        """A new group towards idle: placed, its actors started, then its first trial launched."""
        now = time.monotonic()
        g.ready |= ready & {g.ready_ref, *g.info_refs}
        if g.state == "placing":
            if g.ready_ref in g.ready:
                g.placed_at, g.started_at = now, datetime.now(timezone.utc)
                g.deadline = now + START_TIMEOUT_S
                self._start_actors(g)
                return None
            return self._unplaceable(g, now)
        if now > g.deadline:
            return self._fail_start(g, "timeout", f"rank processes did not start within {seconds(START_TIMEOUT_S)}; "
                                                  "all ranks killed")
        if all(r in g.ready for r in g.info_refs):
            g.up_at = now
            for rank, ref in enumerate(g.info_refs):
                try:
                    g.nodes.append(self.ray.get(ref))
                except Exception as e:  # the process died, or its runtime env could not be set up
                    return self._fail_start(g, "error", f"rank {rank} of {g.key[0]} failed to start: {short(e)}",
                                            infrastructure=True)
            first = opener(g.first, self.queue)
            if first is not g.first:
                self.queue.remove(first)
                self.queue.insert(0, g.first)
            self._launch(g, first)
        return None

    def _advance(self, a: _Attempt, ready: set) -> Outcome | None:
        """A running trial: its ranks' results, a dead rank, a failure or the timeout."""
        now = time.monotonic()
        a.ready |= ready & set(a.run_refs)
        dead = {}
        for rank, ref in enumerate(a.run_refs):
            if ref in a.ready and rank not in a.results:
                try:
                    a.results[rank] = self.ray.get(ref)
                except self._lost_errors as e:  # the process died (SIGKILL, segfault, OOM killer, node lost)
                    dead[rank] = e
                except Exception as e:  # a result that could not be read back: a failure of this rank
                    a.results[rank] = {"status": "error", "error": short(e)}
        if dead:  # the cause, whatever its peers reported meanwhile
            return self._finish(a, "error", deaths(dead, a.group.nodes, a.trial.gpus), infrastructure=True)
        failures = [(r, res) for r, res in a.results.items() if res["status"] != "ok"]  # in order of arrival
        if failures and a.failure_final_at == math.inf:
            a.failure_final_at = now + DEATH_GRACE_S
        # An OOM is the rank's own failure and decides at once. An error may be the echo of a dead peer, so
        # it decides once every rank reported or the grace is over; then the first one is the cause.
        own = next(((r, res) for r, res in failures if res["status"] != "error"), None)
        if own or failures and (now >= a.failure_final_at or len(a.results) == len(a.run_refs)):
            rank, result = own or failures[0]  # the others are killed now, not left waiting in a collective
            return self._finish(a, result["status"], f"rank {rank}: {result.get('error')}",
                                traceback=result.get("traceback"))
        if len(a.results) == len(a.run_refs):
            return self._finish(a, "ok", None)
        if now > a.deadline:  # checked after reading results: a trial that finished in time is not lost
            limit = a.trial.timeout_s
            return self._finish(a, "timeout", f"trial ran past the {seconds(limit)} limit; all ranks killed")
        return None

    def _unplaceable(self, g: _Group, now: float) -> Outcome | None:
        """Time out a placement group that no node set of the cluster can hold (a node lost, or a profile that
        promises more than the cluster has): it would wait forever, and hold up every trial behind it."""
        if self._placement_state(g) != "INFEASIBLE":  # placed soon, or waiting for resources a trial will free
            g.infeasible_since = None
            return None
        g.infeasible_since = g.infeasible_since or now
        # Short: one placement at a time means every trial behind this one waits too (an autoscaler adding
        # nodes has this long to make it feasible).
        limit = min(INFEASIBLE_LIMIT_S, g.first.timeout_s)
        if now - g.infeasible_since < limit:
            return None
        _, strategy = placement(self.profile, g.key[0])
        return self._fail_start(g, "timeout", f"could not be placed for {seconds(limit)}: the cluster's live nodes "
                                              f"cannot hold {g.key[0]} x {bundle(self.profile)} ({strategy})")

    def _start_actors(self, g: _Group) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from trainer.worker import RankWorker

        if self._remote_worker is None:
            self._remote_worker = self.ray.remote(RankWorker)
        ranks, env = g.key[0], rank_env(self.profile)
        for i in range(ranks):
            where = PlacementGroupSchedulingStrategy(placement_group=g.pg,
                                                     placement_group_bundle_index=bundle_index(self.profile, i, ranks))
            actor = self._remote_worker.options(
                num_cpus=self.profile.cpus_per_rank, num_gpus=1 if self.profile.is_gpu else 0, max_restarts=0,
                scheduling_strategy=where, runtime_env={"env_vars": env},
            ).remote(keep_group=self.reuse)
            g.actors.append(actor)
        g.info_refs = [actor.node_info.remote() for actor in g.actors]
        g.state = "starting"

    def _launch(self, g: _Group, trial: Trial) -> None:
        """`trial` on every rank of `g`, now."""
        jobs = rank_jobs(trial, g.nodes, device_type="cuda" if self.profile.is_gpu else "cpu",
                         pg_timeout_s=self.pg_timeout_s)
        now = time.monotonic()
        fresh = g.trials == 0  # the first trial's time counts from placement: it waited for the processes
        refs = [actor.run.remote(job) for actor, job in zip(g.actors, jobs)]
        self.attempts.append(_Attempt(
            trial=trial, group=g, index=g.trials, run_refs=refs, since=g.placed_at if fresh else now,
            started_at=g.started_at if fresh else datetime.now(timezone.utc), deadline=now + trial.timeout_s))
        g.trials += 1
        g.stage = max(g.stage, stack_stage(trial))
        g.first = None
        g.state = "running"

    def _finish(self, a: _Attempt, status: str, error: str | None, infrastructure: bool = False,
                traceback: str | None = None) -> Outcome:
        if infrastructure:
            error = INFRA_PREFIX + error
        self.attempts.remove(a)
        ranks = [a.results[r] for r in sorted(a.results)] if status == "ok" else list(a.results.values())
        # A profiled trial leaves the profiler's CUDA hooks in its processes (kernel launches measured 25-80 %
        # slower after a trace on an H200): the next trial gets fresh ones.
        warm = self.reuse and status == "ok" and not a.trial.profile
        if warm and returned_to_baseline(ranks):
            a.group.state = "idle"
        else:
            self._retire(a.group)
        return Outcome(trial=a.trial, status=status, error=error, ranks=ranks, nodes=a.group.nodes,
                       started_at=a.started_at, finished_at=datetime.now(timezone.utc),
                       wall_s=time.monotonic() - a.since, infrastructure=infrastructure, traceback=traceback,
                       group_trial_index=a.index,
                       # a fresh group's first trial waited for its processes: placement to every rank up
                       process_start_s=a.group.up_at - a.group.placed_at if a.index == 0 else None,
                       note=kept_note(a.trial, ranks) if warm and a.group.state == "retired" else None)

    def _fail_start(self, g: _Group, status: str, error: str, infrastructure: bool = False) -> Outcome:
        """The group never came up: its first trial's outcome, and the group retired."""
        trial = g.first
        self._retire(g)
        wall = time.monotonic() - g.placed_at if g.placed_at else None
        return Outcome(trial=trial, status=status, error=INFRA_PREFIX + error if infrastructure else error,
                       nodes=g.nodes, started_at=g.started_at, finished_at=datetime.now(timezone.utc), wall_s=wall,
                       infrastructure=infrastructure)

    def _retire(self, g: _Group) -> None:
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
        g.state = "retired"
        g.first = None
        if g in self.groups:
            self.groups.remove(g)
