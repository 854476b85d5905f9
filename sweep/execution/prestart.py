"""Rank processes started ahead: the Ray that sweep starts (`ray_address: local`) starts them as it starts, each
importing torch and the trainer (`trainer.preload`), and the first group is placed once they are ready, so no GPU
is held while they import. No Ray, no torch here: `sweep.execution.ray_connection` starts Ray with `env()`, the
run waits with `wait()`.

Ray 2.60 starts min(its CPUs, RAY_worker_maximum_startup_concurrency) idle Python workers as it starts, imports the
modules of RAY_preload_python_modules in every worker it starts, and gives a rank actor placed later one of those
idle workers. It kills idle workers beyond RAY_num_workers_soft_limit (its CPUs by default, which counts the ranks
running beside the spares): a run sets it to its CPUs plus the spares. A worker
started for an actor with an environment of its own (Ray's runtime_env) is never one of those idle ones: the ranks'
environment (`sweep.execution.placement.rank_env`) goes into Ray's own as it starts, and its rank actors have none
of their own (`Placer`'s `env_in_ray`). Ray does not say when a worker's imports are done: each writes a mark (its
pid) into `marks`. tests/test_prestart.py runs it on this machine's Ray; benchmarks/RESULTS.md "Cold sweep" has
what it saves.

Where the run's first groups compile ahead (`trainer.precompile`), their side processes start ahead too, beside Ray
(`start_sides`), and wait for a rank to take them (`trainer.side_pool`): their imports are done by the time a group
is placed. As many as the node's first groups would start, for the graphs of the run's one-rank
trials that the compile cache does not hold. On a node of one rank (one GPU) they are given those graphs at once
(`jobs`) and compile while Ray starts and the first rank imports: there is no other GPU they could be meant for.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clusters.schema import ClusterProfile, usable_cpus
from sweep.execution.placement import rank_env
from trainer import side_pool
from trainer.job import TrialConfig
from trainer.precompile import SIDES_ENV, THREADS_ENV, side_count, side_env, side_threads, unmarked
from trainer.preload import BACKEND_MODULES, BACKENDS_ENV, MARKS_ENV, ONE_DEVICE_ENV
from trainer.recipes import RECIPES
from trainer.side_sets import side_sets

# A rank process imports in 9-13 s on an H200 host and ~5 s on a 2-core CPU (RESULTS.md "Cold sweep"); past this the
# first group is placed anyway, and waits for its processes inside its placement as it would without them.
WAIT_LIMIT_S = 90.0


def embedded_cpus(profile: ClusterProfile) -> int | None:
    """The CPUs of the Ray that sweep starts for `profile`: its ranks' on a CPU profile (the cores are the ranks),
    None (all of this machine's) on a GPU one."""
    return None if profile.is_gpu else profile.ranks_per_node * profile.cpus_per_rank


@dataclass
class Prestart:
    """The rank processes one embedded Ray starts ahead, and the folder where each says its imports are done."""

    count: int
    """How many (ClusterProfile.prestart_count)."""
    ray_cpus: int
    """The CPUs the Ray it starts has: Ray starts no more idle workers than these."""
    rank_env: dict[str, str]
    """The rank processes' environment, `${VAR}` expanded here (sweep starts Ray on this machine)."""
    sides: int = 0
    """Side processes compiling ahead to start beside Ray (`start_sides`)."""
    side_threads: int = 1
    """Inductor's compile workers in each of them."""
    marks: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sweep-prestart-")))
    """One file per process that finished trainer.preload (named by its pid)."""
    pool: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="sweep-sides-")))
    """Where the side processes started ahead wait (trainer.side_pool)."""
    started: list[subprocess.Popen] = field(default_factory=list)
    """Those side processes."""
    jobs: tuple[side_pool.SideJob, ...] = ()
    """What the first len(jobs) of them compile as they start (a node of one rank), instead of waiting for a rank."""

    @classmethod
    def of(
        cls,
        profile: ClusterProfile,
        graphs: Sequence[TrialConfig] = (),
        node_groups: int = 1,
        compiles: bool = False,
        precisions: Collection[str] = (),
    ) -> Prestart | None:
        """For the Ray that `profile` has sweep start; None where nothing is started ahead (a joined cluster, or
        `prestarted_ranks: 0`). `graphs`: one trial per set of graphs the run's groups compile ahead, `node_groups`
        of them at once on the node (side processes: as many as those groups would start for the sets their compile
        cache lacks); `compiles`: whether any trial of the run compiles (on a node of one rank, inductor is imported
        ahead then); `precisions`: the run's (on a node of one rank, the stacks of BACKEND_MODULES among them are
        imported ahead)."""
        count = profile.prestart_count
        if not count:
            return None
        env = {name: os.path.expandvars(value) for name, value in rank_env(profile).items()}
        left = side_sets(unmarked(tuple(graphs), {**os.environ, **env}))
        per_group = side_count(len(left), node_groups, given=env.get(SIDES_ENV))
        sides = min(len(left), per_group * node_groups)
        jobs: tuple[side_pool.SideJob, ...] = ()
        if profile.ranks_per_node == 1:  # the first group's rank is the one these compile for: shared as it would
            device = "cuda" if profile.is_gpu else "cpu"
            jobs = tuple(side_pool.SideJob(left[i::sides], device) for i in range(sides))
            env |= {ONE_DEVICE_ENV: "1"} if compiles else {}  # its one GPU: inductor imported ahead too
            backends = sorted({RECIPES[p].backend for p in precisions if p in RECIPES} & set(BACKEND_MODULES))
            env |= {BACKENDS_ENV: ",".join(backends)} if backends else {}  # and the precision stacks it trains with
        cpus = embedded_cpus(profile) or usable_cpus()
        return cls(count, cpus, env, sides, side_threads(node_groups, env.get(THREADS_ENV)), jobs=jobs)

    def env(self) -> dict[str, str]:
        """What Ray's processes must find in their environment as Ray starts: the ranks' and Ray's settings."""
        return self.rank_env | {
            "RAY_preload_python_modules": "trainer.preload",
            "RAY_worker_maximum_startup_concurrency": str(self.count),
            "RAY_num_workers_soft_limit": str(self.ray_cpus + self.count),
            MARKS_ENV: str(self.marks),
            side_pool.FOLDER_ENV: str(self.pool),
        }

    def start_sides(self) -> None:
        """Start the side processes (as Ray starts: they import beside it, and beside the rank processes)."""
        env = side_env({**os.environ, **self.rank_env}, self.side_threads)
        self.started = side_pool.spawn(self.pool, self.sides, env, self.jobs)

    @property
    def expected(self) -> int:
        """How many marks to wait for: Ray starts at most its CPUs' worth."""
        return min(self.count, self.ray_cpus)

    def ready(self) -> int:
        """How many processes have finished their imports."""
        try:
            return sum(1 for _ in self.marks.iterdir())
        except OSError:
            return 0

    def wait(self, stopped: Callable[[], bool], limit_s: float = WAIT_LIMIT_S) -> float:
        """Until every expected process is ready, `stopped()` is true, or `limit_s` passed; the seconds waited."""
        began = time.monotonic()
        while self.ready() < self.expected and not stopped() and time.monotonic() - began < limit_s:
            time.sleep(0.05)
        return time.monotonic() - began

    def late(self, ready: int) -> str:
        """What a run says when its wait ended at the limit with `ready` of the processes ready."""
        return (
            f"{ready} of {self.expected} rank processes started ahead were ready after {WAIT_LIMIT_S:.0f} s: the "
            "first group is placed now and waits for its own (set prestarted_ranks: 0 in the profile if this repeats)"
        )

    def close(self) -> None:
        """Remove the marks (a process that finishes later finds no folder and writes nothing), and stop the side
        processes (those no rank took, and any a rank left running)."""
        shutil.rmtree(self.marks, ignore_errors=True)
        side_pool.stop(self.started)
        shutil.rmtree(self.pool, ignore_errors=True)
