"""Compile ahead: a fresh group's graphs compiled at once, in side processes, while its first trial starts.

A first sweep of a model compiles each of its graphs (a precision; a batch size, unless it is symbolic) when its
group reaches the trial: 11-20 s each on an H200, one after the other (benchmarks/RESULTS.md "Cold sweep"). That is
CPU work (dynamo's and AOTAutograd's tracing, inductor's code generation, Triton's compiler) on a host with cores to
spare. So a fresh group's first rank job names the group's distinct graphs (`trainer.job.compile_ahead`), and the
rank starts side processes for them (`start`) before its own imports; each side process runs one step of a reduced
copy of each trial it was given. What they compile lands in inductor's on-disk caches (the FX graph cache and
Triton's kernels, under the profile's compile_cache), where every trial of the group then finds its blocks' graphs:
its first step loads them instead of generating them.

The copy (`reduced`) keeps everything a block's graph and the compiled loss's depend on (dims, vocabulary,
precision, ac, compile mode, sequence, batch, options) and has REDUCED_LAYERS blocks: regional compile makes one graph
of every block, and two cover `ac: selective`'s checkpointed and plain blocks. A side process so needs the memory of
two blocks' activations and of the logits (a cut vocabulary saved that but left the loss's graphs to each trial:
~2 s each on an H200). Each side process gets its share of the host's cores for inductor's compile workers
(TORCHINDUCTOR_COMPILE_THREADS, which inductor leaves out of its cache key).

The rank waits for its side processes (`Sides.wait`) after its imports and process group and before it builds its
model: they never share the GPU's memory with a trial, nor its time with a measured step, and the wait is part of
the first trial's wall (its row's precompile_s, counted as compile by `sweep.record.cost`). A side process that
fails costs only its time: each trial compiles what it does not find. Run as `python -m trainer.precompile
DEVICE_TYPE` with the pickled configs on stdin, one JSON line per config on stdout.

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
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from clusters.schema import usable_cpus
from trainer.job import TrialConfig, compiled_graphs

REDUCED_LAYERS = 2
CPUS_PER_SIDE = 4  # one side process per 4 of the host's cores: its own code generation and Triton's workers
SIDES_ENV = "SWEEP_PRECOMPILE_SIDES"  # side processes per rank, when set (a profile's env): 0 turns them off
WAIT_LIMIT_S = 900.0  # past this the rank stops waiting, kills them and compiles what is missing itself
MARKS = "sweep-compiled"  # beside inductor's caches: one empty file per set of graphs compiled into them


@dataclass(frozen=True)
class PrecompileReport:
    """What the side processes of one rank did, as its first trial saw it."""

    waited_s: float  # how long the trial waited for them after its own imports and process group
    graphs: int  # sets of graphs (trials) they were given
    compiled: int  # of those, compiled without an error
    errors: tuple[str, ...] = ()  # one line per failure: the trial compiles those graphs itself


def reduced(config: TrialConfig) -> TrialConfig:
    """`config`'s model cut to REDUCED_LAYERS blocks, one warm-up and one measured step, no memory cap: the same
    graphs at a fraction of the memory and time."""
    from trainer.models.specs import ModelSpec

    spec = ModelSpec.model_validate_json(config.model_spec_json)
    small = spec.model_copy(update={"n_layers": min(spec.n_layers, REDUCED_LAYERS)})
    return dataclasses.replace(
        config,
        model_spec_json=small.to_json(),
        warmup_steps=1,
        measure_steps=1,
        memory_cap_bytes=None,
        profiled=False,
        auto_max=None,
    )


class Sides:
    """The side processes of one rank, started by `start`; `wait` collects them, `stop` kills them."""

    def __init__(self, procs: list[tuple[subprocess.Popen, IO[bytes]]], graphs: int) -> None:
        self.procs, self.graphs = procs, graphs

    def wait(self, limit_s: float = WAIT_LIMIT_S) -> PrecompileReport:
        began = time.perf_counter()
        compiled, errors = 0, []
        for proc, log in self.procs:
            try:
                out, _ = proc.communicate(timeout=max(0.0, began + limit_s - time.perf_counter()))
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
                errors.append(f"a side process still compiling after {limit_s:.0f} s was stopped")
            for line in out.decode(errors="replace").splitlines():
                try:
                    result = json.loads(line)
                except json.JSONDecodeError:  # a line cut by the side's death: its exit status says so below
                    continue
                compiled += result["ok"]
                errors += [result["error"]] if result["error"] else []
            if proc.returncode not in (0, -signal.SIGKILL):
                errors.append(f"a side process exited {proc.returncode}: {_tail(log)}")
            if os.environ.get("SWEEP_DEBUG"):  # what the side printed, in the rank's log
                log.seek(0)
                sys.stderr.write(log.read().decode(errors="replace"))
            log.close()
        return PrecompileReport(time.perf_counter() - began, self.graphs, compiled, tuple(errors))

    def stop(self) -> None:
        for proc, log in self.procs:
            proc.kill()
            proc.wait()
            log.close()


def _tail(log: IO[bytes], chars: int = 600) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")[-chars:].strip().replace("\n", " | ")


def _cores(node_groups: int) -> int:
    """This rank's share of its host's cores: the one-rank groups of the node (`node_groups`) may compile at once."""
    return max(1, usable_cpus() // max(1, node_groups))


def side_count(graphs: int, node_groups: int = 1) -> int:
    """How many side processes compile `graphs` sets of graphs: SIDES_ENV if set, else one per CPUS_PER_SIDE of this
    rank's share of the host's cores (`_cores`), and none below two (fewer cores than 2 x CPUS_PER_SIDE: compiling is
    CPU work, and one process compiling everything ahead, then the trial loading it, takes longer than the trial
    compiling it: 60 against 46 s for two graphs on a 2-core host); never more than `graphs`."""
    given = os.environ.get(SIDES_ENV)
    n = int(given) if given else _cores(node_groups) // CPUS_PER_SIDE
    return min(graphs, n if given or n >= 2 else 0)


def _inductor_cache_dir() -> str:
    """Inductor's on-disk cache folder as inductor resolves it (torch._inductor.runtime.cache_dir_utils), read
    without importing torch: the side processes start before the rank's imports."""
    if given := os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
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


def _mark_path(config: TrialConfig) -> Path:
    """Where the mark of `config`'s graphs lies: beside inductor's caches, named by the graphs and torch's version
    (which those caches' keys hold)."""
    key = repr((compiled_graphs(config), _torch_version())).encode()
    return Path(_inductor_cache_dir()) / MARKS / hashlib.sha256(key).hexdigest()[:32]


def mark(config: TrialConfig) -> None:
    """Say that `config`'s graphs are in the cache now (a side process or a trial compiled them). A cache folder
    that cannot be written costs only the marks: the next group compiles those graphs ahead again."""
    path = _mark_path(config)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    except OSError:
        pass


def unmarked(configs: tuple[TrialConfig, ...]) -> tuple[TrialConfig, ...]:
    """The configs whose graphs no mark says are in the cache; none when only one is left (compiling a single set
    ahead saves nothing: the first trial would wait for it as long as its trial takes to compile it)."""
    left = tuple(c for c in configs if not _mark_path(c).exists())
    return left if len(left) > 1 else ()


def start(configs: tuple[TrialConfig, ...], device_type: str, node_groups: int = 1) -> Sides | None:
    """Side processes compiling the graphs of `configs` (`reduced`) that are not `unmarked` in the cache, `side_count`
    of them, each given every n-th config: the first config, the rank's own first trial, goes first. None when there
    are to be none. `node_groups`: the one-rank groups of this node, whose side processes share its cores."""
    configs = unmarked(configs)
    n = side_count(len(configs), node_groups)
    if n <= 0:
        return None
    root = str(Path(__file__).parents[1])  # where the rank imported `trainer` from, spelt as it did
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
        "TORCHINDUCTOR_COMPILE_THREADS": str(max(1, _cores(node_groups) // n)),
    }
    procs: list[tuple[subprocess.Popen, IO[bytes]]] = []
    for share in (configs[i::n] for i in range(n)):
        given = tempfile.TemporaryFile()  # the configs, pickled: the side's stdin
        given.write(pickle.dumps(share))
        given.seek(0)
        log = tempfile.TemporaryFile()  # the side's stderr: its tail is a failure's reason
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainer.precompile", device_type],
            stdin=given,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
        )
        given.close()  # the side has its own descriptor
        procs.append((proc, log))
    return Sides(procs, len(configs))


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the rank that started it dies (Ray kills a retired group's actors)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _compile(configs: list[TrialConfig], device_type: str, out: IO[str]) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from trainer.release import release
    from trainer.sync import rank_device
    from trainer.train import Rank, run_trial

    device = rank_device(device_type)  # as the rank makes it current (TF32 switches included: graphs depend on them)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # run_trial's barriers: one rank
    rank = Rank(device=device, mesh=init_device_mesh(device.type, (1,)))
    for config in configs:
        error = None
        try:
            run_trial(reduced(config), rank)
        except Exception as e:  # noqa: BLE001 - reported; the trial compiles it itself
            error = f"{config.precision} batch {config.batch_size}: {type(e).__name__}: {e}"[:500]
        else:
            mark(config)
        release(device)
        print(json.dumps({"ok": error is None, "error": error}), file=out, flush=True)


def main() -> None:
    _die_with_parent()
    configs = pickle.loads(sys.stdin.buffer.read())  # from this process's parent, the rank: trusted
    out = os.fdopen(os.dup(1), "w")  # the results; anything else printed goes to stderr, the log
    os.dup2(2, 1)
    _compile(configs, sys.argv[1], out)


if __name__ == "__main__":
    main()
