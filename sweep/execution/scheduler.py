"""Ray scheduling: warm groups of rank actors, one trial at a time on each, many groups at once.

The scheduler knows nothing of grids or policies: `submit(trial)` queues an attempt, `poll()` returns
the attempts that finished as `Outcome`s. A group is one placement group and one actor per rank; it runs
the trials it may (`sweep.execution.groups`: the same ranks and memory cap; plain torch, then torchao; Transformer
Engine apart) one after the other without restarting its processes: imports, the CUDA context and the
process group stay, and each trial builds its own model, optimizer, compiled graphs and precision state
(`trainer.train`). A group moves through (`sweep.execution.rank_group.GroupState`; `Placer` does Ray's part)

    placing (placement group requested) → starting (rank actors up, rank 0 picks MASTER_ADDR/PORT)
    → idle ⇄ running (every rank trains one trial) → retired (actors killed, placement group removed)

and a trial on it (`sweep.execution.attempt.Attempt`) through running (→ failing) → finished.

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
the dead rank is the cause, so a rank's `error` waits up to DEATH_GRACE_S (`sweep.execution.attempt`) for a
peer's death to show.
A new group runs the trial it was placed for first (stage permitting: `sweep.execution.groups.opener`); an idle one
picks among the waiting trials it may run (`sweep.execution.groups.pick`: plain torch before torchao, then the
smallest first); otherwise trials start in submission order and one placement
group is requested at a time, only for the oldest waiting trial, so a big trial waiting for GPUs is not
overtaken forever by small ones (only by the queued trials an idle group may run). One that no set of live
nodes can ever hold (a node lost) is given up as a `timeout` after INFEASIBLE_LIMIT_S (or the trial's
timeout, if shorter).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from clusters.schema import ClusterProfile
from sweep.execution.attempt import Attempt, AttemptEnd, AttemptState
from sweep.execution.groups import fits, kept_note, opener, pick, returned_to_baseline, run_order, stack_stage
from sweep.execution.outcome import INFRA_PREFIX, Outcome, deaths, imported_before
from sweep.execution.placement import node_groups, node_key, rank_jobs, trial_config
from sweep.execution.rank_group import WAITING, GroupState, Placer, RankGroup, StartFailure
from sweep.spec.grid import Trial
from trainer.job import PG_TIMEOUT_S, TrialConfig, compile_ahead, compiled_graphs


class Scheduler:
    """Runs submitted trials on warm groups of rank actors; `poll` returns the attempts that finished."""

    def __init__(
        self,
        profile: ClusterProfile,
        *,
        max_concurrent: int | None = None,
        pg_timeout_s: float = PG_TIMEOUT_S,
        reuse: bool = True,
        precompile: bool = False,
        env_in_ray: bool = False,
    ) -> None:
        import ray
        from ray.exceptions import ObjectLostError, RayActorError

        self.ray = ray
        self._lost_errors = (RayActorError, ObjectLostError)  # a rank's process or its node is gone
        self.profile = profile
        self.max_concurrent = max_concurrent or 10**9
        self.pg_timeout_s = pg_timeout_s
        self.reuse = reuse
        self.precompile = precompile and reuse  # fresh processes for every trial: no group runs what it compiled
        self.placer = Placer(ray, profile, reuse=reuse, env_in_ray=env_in_ray)
        self.queue: list[Trial] = []
        self.groups: list[RankGroup] = []
        self.attempts: list[Attempt] = []
        self._taken: dict[str, set[tuple]] = {}  # by node: the sets of graphs a group of it compiles ahead

    # -- public --------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        """Trials queued, being placed or running (idle groups alone are not work)."""
        return bool(self.queue or self.attempts or any(g.first for g in self.groups))

    def running(self) -> list[Trial]:
        starting = [g.first for g in self.groups if g.state is GroupState.STARTING and g.first]
        return [a.trial for a in self.attempts] + starting

    def submit(self, trial: Trial) -> None:
        self.queue.append(trial)

    def poll(self, timeout: float = 1.0) -> list[Outcome]:
        """Advance every group and attempt; return the attempts that finished. Blocks at most ~`timeout` s."""
        self._dispatch()
        refs = self._waitable()
        ready: set[Any] = set()
        if refs:
            self.ray.wait(refs, num_returns=1, timeout=timeout)  # sleep until something happens
            ready = set(self.ray.wait(refs, num_returns=len(refs), timeout=0)[0])
        else:
            time.sleep(min(timeout, 0.05))
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
        placing = next((g for g in self.groups if g.state is GroupState.PLACING), None)
        if placing is not None and placing.first and self._idle(placing.first) is not None:
            self.queue.insert(0, placing.first)  # the idle group picks among its kind, this one included
            self._retire(placing)
            placing = None
        self._keep_idle_busy()  # after it, no idle group has a queued trial it may run
        if self.queue and placing is None and self._in_flight() < self.max_concurrent:
            placing = self.placer.request(self.queue.pop(0))
            self.groups.append(placing)
        self._retire_idle(placing)

    def _keep_idle_busy(self) -> None:
        """An idle group takes the waiting trial it picks (`sweep.execution.groups.pick`), even one behind a trial of
        another kind: on a node with room for one group, two searches (or a grid's precisions) submitted in
        turn would otherwise retire and restart a group for every trial. It holds up the oldest trial only
        while trials of an idle group's kind are queued, which are finite (a search's probes come one round
        at a time)."""
        for group in [g for g in self.groups if g.state is GroupState.IDLE]:
            trial = pick(group.key, group.stage, self.queue)
            if trial is not None and self._in_flight() < self.max_concurrent:
                self.queue.remove(trial)
                self._launch(group, trial)

    def _idle(self, trial: Trial) -> RankGroup | None:
        return next((g for g in self.groups if g.state is GroupState.IDLE and fits(g.key, g.stage, trial)), None)

    def _in_flight(self) -> int:
        """Trials running or waiting for their new group: what max_concurrent bounds."""
        return len(self.attempts) + sum(1 for g in self.groups if g.first)

    def _retire_idle(self, placing: RankGroup | None) -> None:
        """Give back what idle groups hold when no queued trial can use them, or when the placement requested
        for the oldest waiting trial waits for resources (an idle group that may run it would have taken it)."""
        idle = [g for g in self.groups if g.state is GroupState.IDLE]
        waits = bool(idle) and placing is not None and self.placer.placement_state(placing) in WAITING
        for group in idle:
            if waits or not any(fits(group.key, group.stage, t) for t in self.queue):
                self._retire(group)

    def _waitable(self) -> list[Any]:
        refs = []
        for g in self.groups:
            pending = {GroupState.PLACING: [g.ready_ref], GroupState.STARTING: g.info_refs}.get(g.state, [])
            refs += [r for r in pending if r not in g.ready]  # a ready ref would end every wait at once
        for a in self.attempts:
            refs += [r for r in a.run_refs if r not in a.ready]
        return refs

    # -- groups and attempts, towards their ends -----------------------------------------------
    def _advance_group(self, g: RankGroup, ready: set[Any]) -> Outcome | None:
        """A new group towards idle: placed, its actors started, then its first trial launched."""
        up = self.placer.progress(g, ready)
        if isinstance(up, StartFailure):
            return self._fail_start(g, up)
        if up and g.first:
            first = opener(g.first, self.queue)
            if first is not g.first:
                self.queue.remove(first)
                self.queue.insert(0, g.first)
            self._launch(g, first)
        return None

    def _advance(self, a: Attempt, ready: set[Any]) -> Outcome | None:
        """A running trial: its ranks' results, a dead rank, a failure or the timeout."""
        dead = a.collect(self.ray, ready, self._lost_errors)
        if dead:  # the cause, whatever its peers reported meanwhile
            return self._finish(a, AttemptEnd("error", deaths(dead, a.group.nodes, a.trial.gpus), infrastructure=True))
        end = a.decide(time.monotonic())
        return self._finish(a, end) if end else None

    def _launch(self, g: RankGroup, trial: Trial) -> None:
        """`trial` on every rank of `g`, now."""
        fresh = g.trials == 0  # the first trial's time counts from placement: it waited for the processes
        jobs = rank_jobs(
            trial,
            g.nodes,
            device_type="cuda" if self.profile.is_gpu else "cpu",
            pg_timeout_s=self.pg_timeout_s,
            precompile=self._ahead(g, trial) if fresh else (),
            node_groups=node_groups(self.profile, self.max_concurrent),
        )
        now = time.monotonic()
        refs = [actor.run.remote(job) for actor, job in zip(g.actors, jobs)]
        since = g.placed_at if fresh and g.placed_at is not None else now
        started = g.started_at if fresh and g.started_at is not None else datetime.now(timezone.utc)
        self.attempts.append(
            Attempt(
                trial=trial,
                group=g,
                index=g.trials,
                run_refs=refs,
                since=since,
                started_at=started,
                deadline=now + trial.timeout_s,
            )
        )
        g.trials += 1
        g.stage = max(g.stage, stack_stage(trial))
        g.first = None
        g.state = GroupState.RUNNING

    def _ahead(self, g: RankGroup, first: Trial) -> tuple[TrialConfig, ...]:
        """The graphs a fresh group compiles beside its first trial's start (`trainer.precompile`): its own and
        those of the waiting trials it may run after it, in the order it would pick them, but those another group
        of its node compiles ahead already (the node's compile cache is one)."""
        if not self.precompile:
            return ()
        # a trial whose own group waits for placement comes back to the queue should this group idle first: on a
        # one-GPU node, always
        waiting = [w.first for w in self.groups if w.state is GroupState.PLACING and w.first]
        later = [trial_config(t) for t in run_order(g.key, max(g.stage, stack_stage(first)), waiting + self.queue)]
        taken = self._taken.setdefault(node_key(g.nodes[0]), set())
        ahead = compile_ahead(trial_config(first), later, first.gpus, taken)
        taken.update(compiled_graphs(c) for c in ahead)
        return ahead

    def _finish(self, a: Attempt, end: AttemptEnd) -> Outcome:
        error = INFRA_PREFIX + (end.error or "") if end.infrastructure else end.error
        a.state = AttemptState.FINISHED
        self.attempts.remove(a)
        ranks = a.ranks(end.status)
        # A profiled trial leaves the profiler's CUDA hooks in its processes (kernel launches measured 25-80 %
        # slower after a trace on an H200): the next trial gets fresh ones.
        warm = self.reuse and end.status == "ok" and not a.trial.profiled
        if warm and returned_to_baseline(ranks):
            a.group.state = GroupState.IDLE
        else:
            self._retire(a.group)
        g = a.group
        # a fresh group's first trial waited for its processes: placement to every rank up
        process_start = g.up_at - g.placed_at if a.index == 0 and g.up_at and g.placed_at else None
        return Outcome(
            trial=a.trial,
            status=end.status,
            error=error,
            ranks=ranks,
            nodes=g.nodes,
            started_at=a.started_at,
            finished_at=datetime.now(timezone.utc),
            wall_s=time.monotonic() - a.since,
            infrastructure=end.infrastructure,
            traceback=end.traceback,
            group_trial_index=a.index,
            process_start_s=process_start,
            imported_before_placement=imported_before(g.nodes, g.started_at) if a.index == 0 else None,
            note=kept_note(a.trial, ranks) if warm and g.state is GroupState.RETIRED else None,
        )

    def _fail_start(self, g: RankGroup, failure: StartFailure) -> Outcome:
        """The group never came up: its first trial's outcome, and the group retired."""
        trial = g.first
        assert trial is not None, "only a group on its way up has a first trial"
        self._retire(g)
        wall = time.monotonic() - g.placed_at if g.placed_at else None
        error = INFRA_PREFIX + failure.error if failure.infrastructure else failure.error
        return Outcome(
            trial=trial,
            status=failure.status,
            error=error,
            nodes=g.nodes,
            started_at=g.started_at,
            finished_at=datetime.now(timezone.utc),
            wall_s=wall,
            infrastructure=failure.infrastructure,
        )

    def _retire(self, g: RankGroup) -> None:
        self.placer.retire(g)
        if g in self.groups:
            self.groups.remove(g)
