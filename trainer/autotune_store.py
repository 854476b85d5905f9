"""Inductor's choice among a Triton kernel's launch configs, remembered from one process to the next.

At a kernel's first run inductor benchmarks its configs where it has more than one
(`CachingAutotuner.benchmark_all_configs`) and keeps the winner in its autotune cache, but a later process finds it
there only if the winner is one of the configs inductor generated. A reduction whose compiled config uses many
registers gets a copy with its RBLOCK halved at run time (`_dynamic_scale_rblock`, inductor's occupancy tuning), so a
kernel with one generated config has two at every first run, and a winner that is the halved copy is never found
in the autotune cache (`miss` again on a warm cache). Every torchao rowwise FP8 trial benchmarked 7 such kernels on a
warm cache (0.6-1.0 s of its compile on an H100 and an H200, as much again in the side process that compiled its
graphs ahead: benchmarks/RESULTS.md "Cold sweep", sessions 33-34).

So the timings a benchmark measured are kept beside inductor's caches (`STORE`, cleared with them), keyed by what
decides them: the kernel's source file (named by its code's hash), its configs in order, its arguments' shapes,
strides and dtypes, the GPU's name and torch's version. A process with the same key takes those timings instead of
benchmarking: inductor then keeps the same winner, without the seconds, and a sweep's rows keep the kernels its
first measurement chose (benchmark noise no longer picks again in every process). What is kept is only ever timings
inductor measured; anything unexpected (no source file, a config list that differs, an unreadable entry) benchmarks
as inductor would. `install()` as a trial or a side set starts (trainer.train.run_trial, trainer.precompile.run_set),
not on import: inductor's runtime module starts the CUDA driver on a GPU host as it is imported, which a rank
preloaded beside others must not (trainer.preload).

A side process benchmarks beside the other side processes, on a GPU they share, and what it keeps would decide every
later process's winner: in two of three H100 runs a rowwise trial read 1.2 and 1.6 % below the base tree with a
kernel's timings kept by a side, 0.7 % below with only its own kept (benchmarks/RESULTS.md "Cold sweep", sessions 39
and 41; in session 42's both were within 0.2 %). So by default (MODE_ENV `trials`) only trial processes keep what they
measure; a side process still takes what is kept, and benchmarks (without keeping) what is not. `all` keeps the side
processes' timings too (a cold torchao trial's compile up to 1.0 s shorter), `off` keeps and takes nothing.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

STORE = "sweep-autotune"  # the folder beside inductor's caches: one JSON file of timings per key
INSTALLED = "sweep_autotune_store"  # set on CachingAutotuner once installed (a report's wrapper may sit above ours)
MODE_ENV = "SWEEP_AUTOTUNE_STORE"  # trials (the default): trial processes keep what they measure; all; off
MODES = ("all", "trials", "off")
_side_process = False  # this process compiles ahead for a rank (trainer.precompile.main says so)


def in_side_process() -> None:
    """This process is a side process: under MODE_ENV `trials` (the default) it takes kept timings but keeps none of its
    own."""
    global _side_process
    _side_process = True


def mode() -> str:
    """MODE_ENV's value in this process; an unknown one is an error (a profile's env reaches every rank)."""
    value = os.environ.get(MODE_ENV) or "trials"
    if value not in MODES:
        raise ValueError(f"{MODE_ENV}={value!r} is not one of {', '.join(MODES)}")
    return value


def keeps() -> bool:
    """Whether what this process benchmarks is kept for later processes."""
    return not (_side_process and mode() == "trials")


def arg_signature(arg: Any) -> object:
    """What of one kernel argument a timing depends on: a tensor's shape, strides and dtype; a number itself."""
    shape = getattr(arg, "shape", None)
    if shape is not None:
        stride = arg.stride() if callable(getattr(arg, "stride", None)) else None
        return [list(shape), list(stride) if stride is not None else None, str(getattr(arg, "dtype", ""))]
    if isinstance(arg, (bool, int, float, str)) or arg is None:
        return arg
    return type(arg).__name__


def store_key(source: str, configs: list[str], args: tuple, kwargs: dict, device: str, torch_version: str) -> str:
    """The file name the timings of one benchmark go under: a hash of everything `arg_signature` and the docstring
    above name."""
    described = {
        "source": source,
        "configs": configs,
        "args": [arg_signature(a) for a in args],
        "kwargs": {k: arg_signature(v) for k, v in sorted(kwargs.items())},
        "device": device,
        "torch": torch_version,
    }
    return hashlib.sha256(json.dumps(described, sort_keys=True, default=str).encode()).hexdigest()[:40]


def read_timings(path: Path, configs: list[str]) -> list[float] | None:
    """The timings kept at `path` for `configs` (in their order), or None: none kept, or kept for other configs."""
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(kept, dict) or kept.get("configs") != configs or len(kept.get("timings", ())) != len(configs):
        return None
    return [float(t) for t in kept["timings"]]


def write_timings(path: Path, configs: list[str], timings: list[float]) -> None:
    """Keep `timings` of `configs` at `path`, whole or not at all (a temporary file renamed: side processes and
    ranks benchmark at once). A folder that cannot be written costs only the next process's benchmark."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump({"configs": configs, "timings": timings}, f)  # inf (a failed config) is written as Infinity
        os.replace(tmp, path)
    except OSError:
        pass


def remembering(
    benchmark: Callable[..., dict], folder: Callable[[], Path], device: Callable[[], str], torch_version: str
) -> Callable[..., dict]:
    """`benchmark` (CachingAutotuner.benchmark_all_configs: {launcher: timing}) taking the timings kept in
    `folder()` for its key where there are some, and keeping what it measured otherwise (where this process `keeps`).
    A kernel served from the store is marked `sweep_remembered` (trainer.compile_report names it so)."""

    @functools.wraps(benchmark)
    def remembered(self: Any, *args: Any, **kwargs: Any) -> dict:
        source = os.path.basename(getattr(self, "filename", None) or "")
        launchers = list(getattr(self, "launchers", None) or ())
        if not source or len(launchers) < 2:
            return benchmark(self, *args, **kwargs)
        configs = [str(launcher.config) for launcher in launchers]
        try:
            path = folder() / f"{store_key(source, configs, args, kwargs, device(), torch_version)}.json"
        except OSError:  # no cache folder to keep timings in (inductor makes it): benchmark as inductor would
            return benchmark(self, *args, **kwargs)
        kept = read_timings(path, configs)
        if kept is not None:
            self.sweep_remembered = True
            return dict(zip(launchers, kept))
        timings = benchmark(self, *args, **kwargs)
        if keeps():
            write_timings(path, configs, [float(timings[launcher]) for launcher in launchers])
        return timings

    return remembered


def install() -> None:
    """Remember inductor's benchmarks in this process from now on; once per process (idempotent). A torch without
    Triton's autotuner (a CPU build) has nothing to remember; MODE_ENV `off` remembers nothing."""
    if mode() == "off":
        return
    try:
        import torch
        from torch._inductor.runtime.cache_dir_utils import cache_dir
        from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    except ImportError:
        return
    original = getattr(CachingAutotuner, "benchmark_all_configs", None)
    if original is None or getattr(CachingAutotuner, INSTALLED, False):
        return

    def device() -> str:
        return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"

    def folder() -> Path:  # read at each benchmark: a test or a profile may point inductor's cache elsewhere
        return Path(cache_dir()) / STORE

    CachingAutotuner.benchmark_all_configs = remembering(  # type: ignore[method-assign]
        original, folder, device, torch.__version__
    )
    setattr(CachingAutotuner, INSTALLED, True)
