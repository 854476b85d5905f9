"""Ray scheduling: one placement group per trial attempt, one actor per rank, many trials at once.

The scheduler knows nothing of grids or policies: `submit(trial)` queues an attempt, `poll()` returns
the attempts that finished as `Outcome`s. Each attempt moves through

    placing (placement group requested) → starting (rank actors up, rank 0 picks MASTER_ADDR/PORT)
    → running (every rank trains) → done (actors killed, placement group removed)

Teardown runs on every path: success, a failed rank (the others are killed at once instead of waiting
in a collective), a timeout, a dead actor, or Ctrl-C in the driver (`shutdown()`).
A rank process that dies (SIGKILL, segfault, node lost) is an infrastructure failure: its error text
starts with INFRA_PREFIX, which is how a resumed run knows, from the row alone, to retry it. When one
rank dies its peers fail too ("Connection reset by peer" inside a collective), often in the same instant;
the dead rank is the cause, so a rank's `error` waits up to DEATH_GRACE_S for a peer's death to show.
Placement groups are requested in submission order and a new one is requested only when every earlier
one is placed, so a big trial waiting for GPUs is not overtaken forever by small ones. One that no set of
live nodes can ever hold (a node lost) is given up as a `timeout` after INFEASIBLE_LIMIT_S (or the trial's
timeout, if shorter).
"""

from __future__ import annotations

import math
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone

from sweep.grid import Trial
from trainer.job import RankJob, TrialConfig

START_TIMEOUT_S = 300.0  # rank processes must come up within this (imports torch, maybe CUDA init)
INFEASIBLE_LIMIT_S = 120.0  # a placement no live node set can hold is given up after this (or the trial timeout)
DEATH_GRACE_S = 3.0  # Ray reports a dead process within ~0.1 s of its peers' socket errors; 3 s is ample
INFRA_PREFIX = "infrastructure: "  # starts the error of every attempt lost to a dead or unstartable process
# The loopback interface ('lo' on Linux, 'lo0' on macOS): gloo and NCCL sockets of an embedded trial.
_LOOPBACK = next((name for _, name in socket.if_nameindex() if name.startswith("lo")), None)


@dataclass
class Outcome:
    trial: Trial
    status: str
    error: str | None = None
    ranks: list[dict] = field(default_factory=list)  # each rank's result dict ('ok' ranks only if all ok)
    nodes: list[dict] = field(default_factory=list)  # node_info per rank
    started_at: datetime | None = None
    finished_at: datetime | None = None
    wall_s: float | None = None
    infrastructure: bool = False  # a rank process died or never started: worth one retry
    traceback: str | None = None  # the failing rank's Python traceback


@dataclass
class _Attempt:
    trial: Trial
    pg: object
    ready_ref: object
    state: str = "placing"
    actors: list = field(default_factory=list)
    info_refs: list = field(default_factory=list)
    run_refs: list = field(default_factory=list)
    results: dict = field(default_factory=dict)  # rank -> result
    nodes: list = field(default_factory=list)
    deadline: float = math.inf
    placed_at: float | None = None
    started_at: datetime | None = None
    ready: set = field(default_factory=set)  # refs already seen ready (not waited on again)
    failure_final_at: float = math.inf  # a reported error decides then, unless a rank is found dead first
    infeasible_since: float | None = None  # when Ray first said no node set can hold the placement group


class Scheduler:
    def __init__(self, profile, *, max_concurrent: int | None = None, pg_timeout_s: float = 120.0):
        import ray
        from ray.exceptions import ObjectLostError, RayActorError

        self.ray = ray
        self._lost_errors = (RayActorError, ObjectLostError)  # a rank's process or its node is gone
        self.profile = profile
        self.max_concurrent = max_concurrent or 10**9
        self.pg_timeout_s = pg_timeout_s
        self.queue: list[Trial] = []
        self.active: list[_Attempt] = []
        self._remote_worker = None

    # -- public --------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self.queue or self.active)

    def running(self) -> list[Trial]:
        return [a.trial for a in self.active if a.state != "placing"]

    def submit(self, trial: Trial) -> None:
        self.queue.append(trial)

    def poll(self, timeout: float = 1.0) -> list[Outcome]:
        """Advance every attempt; return those that finished. Blocks at most ~`timeout` seconds."""
        self._place_more()
        done: list[Outcome] = []
        refs = self._waitable()
        if refs:
            self.ray.wait(refs, num_returns=1, timeout=timeout)  # sleep until something happens
            ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
        else:
            ready = []
            time.sleep(min(timeout, 0.05))
        ready = set(ready)
        for attempt in list(self.active):
            outcome = self._advance(attempt, ready)
            if outcome is not None:
                done.append(outcome)
        return done

    def shutdown(self) -> None:
        """Tear down everything still active (Ctrl-C): no orphaned actors or placement groups."""
        for attempt in list(self.active):
            self._teardown(attempt)
        self.active.clear()
        self.queue.clear()

    # -- placement -----------------------------------------------------------------------------
    def _bundle(self) -> dict:
        cpus = self.profile.cpus_per_rank
        return {"CPU": cpus, "GPU": 1} if self.profile.is_gpu else {"CPU": cpus}

    def _place_more(self) -> None:
        from ray.util.placement_group import placement_group

        while self.queue and len(self.active) < self.max_concurrent:
            if any(a.state == "placing" for a in self.active):
                return  # FIFO: wait until the earlier request is placed (no starvation of big trials)
            trial = self.queue.pop(0)
            bundles, strategy = self._placement(trial.gpus)
            pg = placement_group(bundles, strategy=strategy, name=f"sweep-{trial.trial_id}")
            self.active.append(_Attempt(trial=trial, pg=pg, ready_ref=pg.ready()))

    def _placement(self, ranks: int) -> tuple[list[dict], str]:
        """The placement group's bundles and strategy for a trial of `ranks` ranks.

        One node if it fits (STRICT_PACK keeps NVLink/xGMI traffic on the node). Else on GPU nodes one
        bundle per rank, PACKed onto as few nodes as possible (ceil(ranks / gpus_per_node)): a node's GPU
        count bounds its ranks. A CPU node has no such count (PACK would put every rank on one big node),
        so there each node's share of ranks is one bundle and the bundles go to distinct nodes
        (STRICT_SPREAD): at most gpus_per_node ranks of the trial on a node, as on GPUs.
        """
        per_node = self.profile.ranks_per_node
        if ranks <= per_node:
            return [self._bundle() for _ in range(ranks)], "STRICT_PACK"
        if self.profile.is_gpu:
            return [self._bundle() for _ in range(ranks)], "PACK"
        shares = [min(per_node, ranks - start) for start in range(0, ranks, per_node)]
        return [{"CPU": self.profile.cpus_per_rank * n} for n in shares], "STRICT_SPREAD"

    def _bundle_index(self, rank: int, ranks: int) -> int:
        """The bundle a rank's actor goes into (see `_placement`)."""
        spread = not self.profile.is_gpu and ranks > self.profile.ranks_per_node
        return rank // self.profile.ranks_per_node if spread else rank

    def _waitable(self) -> list:
        refs = []
        for a in self.active:
            pending = {"placing": [a.ready_ref], "starting": a.info_refs, "running": a.run_refs}.get(a.state, [])
            refs += [r for r in pending if r not in a.ready]  # a ready ref would end every wait at once
        return refs

    # -- the state machine ---------------------------------------------------------------------
    def _advance(self, a: _Attempt, ready: set) -> Outcome | None:
        now = time.monotonic()
        a.ready |= ready & set([a.ready_ref, *a.info_refs, *a.run_refs])
        ready = a.ready
        if a.state == "placing":
            if a.ready_ref in ready:
                a.placed_at, a.started_at = now, datetime.now(timezone.utc)
                a.deadline = now + START_TIMEOUT_S
                self._start_actors(a)
                return None
            return self._unplaceable(a, now)
        if a.state == "starting" and now > a.deadline:
            return self._finish(a, "timeout", f"rank processes did not start within {START_TIMEOUT_S:.0f} s; "
                                              "all ranks killed")
        if a.state == "starting":
            if all(r in ready for r in a.info_refs):
                for rank, ref in enumerate(a.info_refs):
                    try:
                        a.nodes.append(self.ray.get(ref))
                    except Exception as e:  # the process died, or its runtime env could not be set up
                        return self._finish(a, "error", f"rank {rank} of {a.trial.gpus} failed to start: {_short(e)}",
                                            infrastructure=True)
                self._launch(a)
            return None
        dead = {}
        for rank, ref in enumerate(a.run_refs):
            if ref in ready and rank not in a.results:
                try:
                    a.results[rank] = self.ray.get(ref)
                except self._lost_errors as e:  # the process died (SIGKILL, segfault, OOM killer, node lost)
                    dead[rank] = e
                except Exception as e:  # a result that could not be read back: a failure of this rank
                    a.results[rank] = {"status": "error", "error": _short(e)}
        if dead:  # the cause, whatever its peers reported meanwhile
            return self._finish(a, "error", _deaths(dead, a.nodes, a.trial.gpus), infrastructure=True)
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
            return self._finish(a, "timeout", f"trial ran past the {limit:.0f} s limit; all ranks killed")
        return None

    def _unplaceable(self, a: _Attempt, now: float) -> Outcome | None:
        """Time out a placement group that no node set of the cluster can hold (a node lost, or a profile that
        promises more than the cluster has): it would wait forever, and hold up every trial behind it."""
        from ray.util.placement_group import placement_group_table

        try:
            table = placement_group_table(a.pg)
            infeasible = table.get("stats", {}).get("scheduling_state") == "INFEASIBLE"
        except Exception:  # no such detail from this Ray: wait as before
            return None
        if not infeasible:  # placed soon, or waiting for busy resources that a running trial will free
            a.infeasible_since = None
            return None
        a.infeasible_since = a.infeasible_since or now
        # Short: FIFO placement means every trial behind this one waits too (an autoscaler adding nodes
        # has this long to make it feasible).
        limit = min(INFEASIBLE_LIMIT_S, a.trial.timeout_s)
        if now - a.infeasible_since < limit:
            return None
        return self._finish(a, "timeout", f"could not be placed for {limit:.0f} s: the cluster's live nodes cannot "
                                          f"hold {a.trial.gpus} x {self._bundle()} ({table.get('strategy')})")

    def _start_actors(self, a: _Attempt) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from trainer.worker import RankWorker

        if self._remote_worker is None:
            self._remote_worker = self.ray.remote(RankWorker)
        env = {str(k): str(v) for k, v in (self.profile.env or {}).items()}
        if not self.profile.is_gpu:  # CPU ranks: one intra-op thread pool per rank, sized to its CPUs
            env.setdefault("OMP_NUM_THREADS", str(self.profile.cpus_per_rank))
        if self.profile.is_embedded and _LOOPBACK:  # one machine: rank-to-rank sockets stay on loopback
            env.setdefault("GLOO_SOCKET_IFNAME", _LOOPBACK)
            env.setdefault("NCCL_SOCKET_IFNAME", _LOOPBACK)
        # One inductor cache per node, kept across trials and runs: a graph compiled once loads from disk
        # after (FX graph + AOTAutograd caches; their env switches force them on whatever torch's default).
        env.setdefault("TORCHINDUCTOR_CACHE_DIR", self.profile.compile_cache_env)
        env.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
        env.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
        for i in range(a.trial.gpus):
            actor = self._remote_worker.options(
                num_cpus=self.profile.cpus_per_rank, num_gpus=1 if self.profile.is_gpu else 0, max_restarts=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=a.pg,
                                                                     placement_group_bundle_index=self._bundle_index(i, a.trial.gpus)),
                runtime_env={"env_vars": env} if env else None,
            ).remote()
            a.actors.append(actor)
        a.info_refs = [actor.node_info.remote() for actor in a.actors]
        a.state = "starting"

    def _launch(self, a: _Attempt) -> None:
        jobs = rank_jobs(a.trial, a.nodes, device_type="cuda" if self.profile.is_gpu else "cpu",
                         pg_timeout_s=self.pg_timeout_s)
        a.run_refs = [actor.run.remote(job) for actor, job in zip(a.actors, jobs)]
        a.state = "running"
        a.deadline = time.monotonic() + a.trial.timeout_s

    def _finish(self, a: _Attempt, status: str, error: str | None, infrastructure: bool = False,
                traceback: str | None = None) -> Outcome:
        if infrastructure:
            error = INFRA_PREFIX + error
        self._teardown(a)
        self.active.remove(a)
        wall = time.monotonic() - a.placed_at if a.placed_at else None
        ranks = [a.results[r] for r in sorted(a.results)] if status == "ok" else list(a.results.values())
        return Outcome(trial=a.trial, status=status, error=error, ranks=ranks, nodes=a.nodes,
                       started_at=a.started_at, finished_at=datetime.now(timezone.utc), wall_s=wall,
                       infrastructure=infrastructure, traceback=traceback)

    def _teardown(self, a: _Attempt) -> None:
        from ray.util.placement_group import remove_placement_group

        for actor in a.actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:
                pass
        try:
            remove_placement_group(a.pg)
        except Exception:
            pass
        a.state = "done"


def rank_jobs(trial: Trial, nodes: list[dict], *, device_type: str, pg_timeout_s: float = 120.0) -> list[RankJob]:
    """What each rank of `trial` is sent, given where its ranks run (`nodes`: node_info per rank, rank 0's
    address and held port becoming the rendezvous). Pure: no Ray."""
    config = TrialConfig(model_spec_json=trial.model.to_json(), precision=trial.precision, compile=trial.compile,
                         ac=trial.ac, batch_size=trial.batch_size, seq_len=trial.seq_len,
                         warmup_steps=trial.warmup_steps, measure_steps=trial.measure_steps,
                         options=trial.options(), memory_cap_bytes=trial.memory_cap_bytes)
    seen: dict[str, int] = {}
    jobs = []
    for rank, info in enumerate(nodes):  # local rank = index among the ranks on the same node
        key = info["node_id"] or info["ip"]
        jobs.append(RankJob(trial=config, rank=rank, world_size=trial.gpus, local_rank=seen.get(key, 0),
                            master_addr=nodes[0]["ip"], master_port=nodes[0]["port"], device_type=device_type,
                            pg_timeout_s=pg_timeout_s))
        seen[key] = seen.get(key, 0) + 1
    return jobs


def is_infrastructure_error(error: str | None) -> bool:
    """True for the error text of an attempt lost to a dead or unstartable rank process."""
    return bool(error) and error.startswith(INFRA_PREFIX)


def _deaths(dead: dict, nodes: list[dict], world_size: int) -> str:
    """'rank 1 of 2 died (pid 4242 on host-a): ActorDiedError: ...': which ranks, where to find their logs."""
    where = ", ".join(f"pid {nodes[r].get('pid')} on {nodes[r].get('hostname')}" if r < len(nodes) else "?"
                      for r in dead)
    ranks = ", ".join(str(r) for r in dead)
    cause = _short(next(iter(dead.values())))
    return f"rank{'s' if len(dead) > 1 else ''} {ranks} of {world_size} died ({where}): {cause}"


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:500]}"
