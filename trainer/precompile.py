"""Compile ahead: a fresh group's graphs compiled at once, in side processes, while its first trial starts.

A first sweep of a model compiles each of its graphs (a precision; a batch size, unless it is symbolic) when its
group reaches the trial: 11-20 s each on an H200, one after the other (benchmarks/RESULTS.md "Cold sweep"). That is
CPU work (dynamo's and AOTAutograd's tracing, inductor's code generation, Triton's compiler) on a host with cores to
spare. So a fresh group's first rank job names the group's distinct graphs (`trainer.job.compile_ahead`), and the
rank starts side processes for them (`start`) before its own imports, each given sets of them (a trial's blocks,
its loss: `trainer.side_sets`). What they compile lands in inductor's on-disk caches (the FX graph cache and
Triton's kernels, under the profile's compile_cache), where every trial of the group then finds its graphs: its
first step loads them instead of generating them.

A trial's blocks are compiled by one step of a copy (`reduced`) that keeps everything a block's graph depends on
(dims, precision, ac, compile mode, sequence, batch, options) and has REDUCED_LAYERS blocks: regional compile makes
one graph of every block, and two cover `ac: selective`'s checkpointed and plain blocks. Where the loss is a graph of
its own, the copy has a cut vocabulary and an eager loss, and the loss is another set (`trainer.loss_graph`): the
whole-vocabulary copy held 24-30 GiB a side on the cold-sweep grid's 2.5 B model (151,936 tokens, T 4096), most of
it the embedding's and head's training state and the logits; apart, 9.3-13.9 GiB (session 32; each set's peak is in
`trainer.sides.PrecompileReport`, benchmarks/RESULTS.md "Cold sweep"). A set that runs out of memory beside the
others runs again alone (`trainer.side_lock`).
Each side process may use every core of the rank's share of the host for inductor's compile workers
(TORCHINDUCTOR_COMPILE_THREADS, which inductor leaves out of its cache key; `side_threads`).

Each trial waits for the side processes compiling its own graphs (`Sides.wait`) after the rank's imports and process
group and before it builds its model; the others go on compiling while it trains, stopped from its first measured
step to its last (`trainer.train.Beside`), so they never share the GPU's time with a measured step. The first wait
had been for all of them: the slowest set (torchao rowwise, 30-44 s) was every cold sweep's floor
(benchmarks/RESULTS.md "Cold sweep", session 33). On a GPU a trial starts beside them only where its expected peak
and what they may grow to fit the memory free (`Sides.room_for`; else it waits for them one at a time until it fits
beside those left, `Sides.make_room`), and one that runs out of memory beside them runs again once they are done
(`trainer.worker`). A wait is part of its trial's wall (its row's precompile_s, counted as compile by
`sweep.record.cost`). A side process that fails costs only its time: each trial compiles what it does not find. Run
as `python -m trainer.precompile` with its job (a pickled `trainer.side_pool.SideJob`) on stdin, one JSON line per
set on stdout; or started ahead, by the run, as `python -m trainer.precompile --pool FOLDER` (`trainer.side_pool`),
which a rank takes before starting its own (on a node of one rank, given the run's graphs as it starts: compiling
before the rank is placed).

A set of graphs already in the cache is not compiled again: a side process or a trial that compiled it leaves a
mark beside inductor's cache (`mark`), and `start` leaves out what is marked, so a rerun of a grid on a warm cache
starts no side process (it would import torch and trace every graph again, ~10 s, for nothing).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import getpass
import hashlib
import importlib.metadata
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING

from clusters.schema import usable_cpus
from trainer import autotune_store, side_pool
from trainer.job import TrialConfig, compiled_graphs
from trainer.side_pool import PooledSide, SideJob
from trainer.side_sets import SMALL_VOCAB, Part, SideSet, loss_key, separable, set_key, side_sets
from trainer.sides import PipedSide, Sides

if TYPE_CHECKING:
    from trainer.train import Rank

REDUCED_LAYERS = 2
CPUS_PER_SIDE = 2  # one side process per 2 of the host's cores (see side_count)
MIN_CORES = 8  # a rank's share of the host below which no side process compiles ahead (`side_count`)
SIDES_ENV = "SWEEP_PRECOMPILE_SIDES"  # side processes per rank, when set (a profile's env): 0 turns them off
THREADS_ENV = "SWEEP_PRECOMPILE_THREADS"  # inductor's compile workers per side process, when set (a profile's env)
MARKS = "sweep-compiled"  # beside inductor's caches: one empty file per set of graphs compiled into them


def reduced(config: TrialConfig) -> TrialConfig:
    """`config`'s model cut to REDUCED_LAYERS blocks, one warm-up and one measured step, no memory cap: the same
    graphs at a fraction of the memory and time. Where the loss is a graph of its own (`trainer.side_sets.separable`)
    the copy compiles the blocks alone: a cut vocabulary and an eager loss (its loss is a set of its own)."""
    from trainer.models.specs import ModelSpec

    spec = ModelSpec.model_validate_json(config.model_spec_json)
    blocks_alone = separable(config)
    cut: dict[str, int] = {"n_layers": min(spec.n_layers, REDUCED_LAYERS)}
    if blocks_alone:
        cut["vocab_size"] = min(spec.vocab_size, SMALL_VOCAB)
    return dataclasses.replace(
        config,
        model_spec_json=spec.model_copy(update=cut).to_json(),
        warmup_steps=1,
        measure_steps=1,
        memory_cap_bytes=None,
        profiled=False,
        auto_max=None,
        compiled_loss=not blocks_alone,
    )


def run_set(item: SideSet, rank: Rank) -> int | None:
    """Compile one set of graphs into the cache: a step of its trial's `reduced` copy (its blocks, or all of it), or
    its loss's graph (`trainer.loss_graph`); the peak memory that took (GPU: reserved), what a trial beside it would
    leave."""
    if item.part == "loss":
        from trainer.loss_graph import run_loss_graph

        autotune_store.install()  # as run_trial does for a blocks set

        memory = run_loss_graph(item.config, rank.device)
    else:
        from trainer.train import run_trial

        memory = run_trial(reduced(item.config), rank).memory
    return memory["reserved_mem_bytes"] if rank.device.type == "cuda" else memory["peak_mem_bytes"]


def _cores(node_groups: int) -> int:
    """This rank's share of its host's cores: the one-rank groups of the node (`node_groups`) may compile at once."""
    return max(1, usable_cpus() // max(1, node_groups))


def side_count(sets: int, node_groups: int = 1, given: str | None = None) -> int:
    """How many side processes compile `sets` sets of graphs (`trainer.side_sets`): SIDES_ENV if set, else one per
    CPUS_PER_SIDE of this rank's share of the host's cores (`_cores`), and none below MIN_CORES (compiling is CPU
    work, and one process compiling everything ahead, then the trial loading it, takes longer than the trial compiling
    it: 60 against 46 s for two graphs on a 2-core host); never more than `sets`. A side process's compile is mostly
    serial Python: four of them kept about one core each busy of an H100 host's 16 and its load stayed under 6
    (benchmarks/RESULTS.md "Cold sweep", session 32), so one per 2 cores lets every set of that grid compile in its
    own process instead of a loss waiting behind its blocks (measured: session 33). `given`: SIDES_ENV's value in
    the ranks' environment, where that is not this process's (the driver's)."""
    given = os.environ.get(SIDES_ENV) if given is None else given
    cores = _cores(node_groups)
    n = int(given) if given else (cores // CPUS_PER_SIDE if cores >= MIN_CORES else 0)
    return min(sets, n)


def side_threads(node_groups: int, given: str | None = None) -> int:
    """Inductor's compile workers for each side process of a rank: THREADS_ENV if set, else all of this rank's share
    of the host's cores, whatever the number of side processes. A side process's compile is mostly serial (tracing,
    lowering, code generation: a rowwise set took 35-40 s in four side processes on 16 cores, 28-31 s alone), and the
    sides that finish first leave their cores to the last; on one H100 host (16 cores, four sides) the first trial
    waited 27.2 s with 16 workers a side against 30.7 and 29.7 s with 4 (benchmarks/RESULTS.md "Cold sweep", session
    30). `given`: THREADS_ENV's value in the ranks' environment, where that is not this process's (the driver's)."""
    given = os.environ.get(THREADS_ENV) if given is None else given
    return max(1, int(given) if given else _cores(node_groups))


def side_env(env: Mapping[str, str], threads: int) -> dict[str, str]:
    """A side process's environment: `env` (the rank's), this checkout's `trainer` importable, `threads` compile
    workers (TORCHINDUCTOR_COMPILE_THREADS, which inductor reads as it is imported)."""
    root = str(Path(__file__).parents[1])  # where the rank imported `trainer` from, spelt as it did
    return {
        **env,
        "PYTHONPATH": os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p),
        "TORCHINDUCTOR_COMPILE_THREADS": str(threads),
    }


def _inductor_cache_dir(env: Mapping[str, str] = os.environ) -> str:
    """Inductor's on-disk cache folder as inductor resolves it (torch._inductor.runtime.cache_dir_utils) in a process
    with environment `env`, read without importing torch: the side processes start before the rank's imports."""
    if given := env.get("TORCHINDUCTOR_CACHE_DIR"):
        return given
    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


@functools.cache  # once per process: read from torch's installed metadata, before torch is imported
def _torch_version() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:  # a torch run from a source tree
        return None


def _mark_path(config: TrialConfig, env: Mapping[str, str] = os.environ, part: Part = "whole") -> Path:
    """Where the mark of `config`'s graphs (or of its blocks or its loss: `trainer.side_sets`) lies: beside inductor's
    caches (of a process with environment `env`), named by the graphs and torch's version (which those caches' keys
    hold)."""
    graphs = loss_key(config) if part == "loss" else compiled_graphs(config)
    key = repr((graphs, _torch_version()) if part == "whole" else (graphs, part, _torch_version())).encode()
    return Path(_inductor_cache_dir(env)) / MARKS / hashlib.sha256(key).hexdigest()[:32]


def _marked(config: TrialConfig, env: Mapping[str, str]) -> bool:
    """Whether marks say all of `config`'s graphs are in the cache: a trial's mark, or its blocks' and its loss's."""
    if _mark_path(config, env).exists():
        return True
    return separable(config) and all(_mark_path(config, env, part).exists() for part in ("blocks", "loss"))


def mark(config: TrialConfig, part: Part = "whole") -> None:
    """Say that `config`'s graphs (or its `part` of them) are in the cache now (a side process or a trial compiled
    them). A cache folder that cannot be written costs only the marks: the next group compiles those graphs ahead
    again."""
    path = _mark_path(config, part=part)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:
        pass


def unmarked(configs: tuple[TrialConfig, ...], env: Mapping[str, str] = os.environ) -> tuple[TrialConfig, ...]:
    """The configs whose graphs no mark says are in the cache (of a process with environment `env`); none when only
    one is left (compiling a single set ahead saves nothing: the first trial would wait for it as long as its trial
    takes to compile it)."""
    left = tuple(c for c in configs if not _marked(c, env))
    return left if len(left) > 1 else ()


def start(configs: tuple[TrialConfig, ...], device_type: str, node_groups: int = 1) -> Sides | None:
    """Side processes compiling the graphs of `configs` that are not `unmarked` in the cache, as sets (a trial's
    blocks, its loss: `trainer.side_sets`), `side_count` of them, each given every n-th set: the first, the rank's own
    first trial's blocks, goes first. Those the run
    started ahead and gave their graphs (trainer.side_pool.claim_given) are taken whatever `configs` (this rank waits
    for them: they compile on its GPU), and their graphs left out; then those started ahead and waiting; the rest
    start now. None when there are to be none. `node_groups`: the one-rank groups of this node, whose side
    processes share its cores."""
    pool = os.environ.get(side_pool.FOLDER_ENV)
    handed = side_pool.claim_given(Path(pool)) if pool else []  # compiling since the run started them
    jobs = [job for side in handed if (job := side.job()) is not None]
    covered = {compiled_graphs(item.config) for job in jobs for item in job.sets}
    sets = side_sets(unmarked(tuple(c for c in configs if compiled_graphs(c) not in covered)))
    n = side_count(len(sets), node_groups)
    if n <= 0 and not handed:
        return None
    shares = [sets[i::n] for i in range(max(n, 0))]
    taken = side_pool.claim(Path(pool), n) if pool and n > 0 else []
    for side, share in zip(taken, shares):
        side.give(SideJob(share, device_type, dict(os.environ)))
    sides: list[PipedSide | PooledSide] = [*handed, *taken]
    # what each compiles, as its trials name it (a handed side whose job is gone: nothing a trial waits for)
    keys = [frozenset(set_key(item) for item in job.sets) if (job := side.job()) else frozenset() for side in handed]
    keys += [frozenset(set_key(item) for item in share) for share in shares]
    env = side_env(os.environ, side_threads(node_groups))
    for share in shares[len(taken) :]:
        given = tempfile.TemporaryFile()  # the job, pickled: the side's stdin
        given.write(pickle.dumps(SideJob(share, device_type)))
        given.seek(0)
        log = tempfile.TemporaryFile()  # the side's stderr: its tail is a failure's reason
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainer.precompile"],
            stdin=given,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            start_new_session=True,  # its own process group, with its compile workers: the rank pauses them as one
        )
        given.close()  # the side has its own descriptor
        sides.append(PipedSide(proc, log))
    return Sides(sides, sum(len(job.sets) for job in jobs) + len(sets), keys)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the rank that started it dies (Ray kills a retired group's actors)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def side_rank(device_type: str) -> Rank:
    """This process as the one rank of its own trial (run_trial's barriers and mesh), on the device a rank makes
    current (TF32 switches included: graphs depend on them)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from trainer.sync import rank_device
    from trainer.train import Rank

    device = rank_device(device_type)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return Rank(device=device, mesh=init_device_mesh(device.type, (1,)))


def _compile(sets: list[SideSet], device_type: str, out: IO[str], imported_at: float) -> None:
    from trainer.release import release
    from trainer.side_lock import device_lock, run_sharing

    rank = side_rank(device_type)
    device = rank.device
    lock = device_lock(device.type, device.index)
    for item in sets:
        config = item.config
        error, began, peak, alone = None, time.perf_counter(), None, False
        began_at = time.time()
        try:
            run = functools.partial(run_set, item, rank)
            peak, alone = run_sharing(run, lock, functools.partial(release, device))
        except Exception as e:  # noqa: BLE001 - reported; the trial compiles it itself
            part = "" if item.part == "whole" else f" ({item.part})"
            error = f"{config.precision} batch {config.batch_size}{part}: {type(e).__name__}: {e}"[:500]
        else:
            mark(config, item.part)
        release(device)
        seconds = round(time.perf_counter() - began, 2)
        result = {
            "ok": error is None,
            "error": error,
            "seconds": seconds,
            "peak_bytes": peak,
            "part": item.part,
            "alone": alone,  # it ran out of memory beside the others, and ran again alone (trainer.side_lock)
            "span": (round(imported_at, 3), round(began_at, 3), round(time.time(), 3)),  # imports done, began, ended
        }
        print(json.dumps(result), file=out, flush=True)


def main() -> None:
    """A side process: its imports, then its job (from the rank on stdin, or, started ahead, from the run's folder),
    one JSON result line per config."""
    _die_with_parent()
    autotune_store.in_side_process()  # what it benchmarks beside the others is kept only as MODE_ENV says
    pool = Path(sys.argv[2]) if sys.argv[1:2] == ["--pool"] else None
    from trainer.preload import device_started, modules, preload, started_too_early

    preload(modules())  # what a rank imports ahead; inductor's runtime, which starts the CUDA driver, only on a node
    #                     of one rank (trainer.preload)
    imported_at = time.time()
    out: IO[str]
    if pool is None:
        job = pickle.loads(sys.stdin.buffer.read())  # from this process's parent, the rank: trusted
        out = os.fdopen(os.dup(1), "w")  # the results; anything else printed goes to stderr, the log
        os.dup2(2, 1)
    elif (waited := side_pool.await_job(pool)) is None:
        return  # never claimed: the run has ended
    else:
        job, out = waited, side_pool.results(pool)
    try:
        if job.env is not None and started_too_early(device_started()):  # its GPU might not be the rank's
            for _ in job.sets:
                print(json.dumps({"ok": False, "error": "a side process started ahead started CUDA early"}), file=out)
            return
        if job.env is not None:  # the rank's (its GPU), but the compile workers this process was given
            os.environ.update({k: v for k, v in job.env.items() if k != "TORCHINDUCTOR_COMPILE_THREADS"})
        _compile(list(job.sets), job.device_type, out, imported_at)
    finally:
        out.close()
        if pool is not None:
            side_pool.finished(pool)


if __name__ == "__main__":
    main()
