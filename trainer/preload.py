"""What a rank process imports before it is a rank: run by Ray's worker pool as it starts a worker, ahead of any actor.

A fresh rank's first trial spends seconds importing torch, dynamo, FSDP and the trainer (9-13 s on an H200 host,
benchmarks/RESULTS.md "Cold sweep"), after its group is placed: GPU time. Ray runs the modules named in
RAY_preload_python_modules in every Python worker it starts, before the worker takes any work; the Ray that sweep
starts names this one and starts rank processes ahead with it (`sweep.execution.prestart`), so their imports happen
before any GPU is held. A worker that Ray starts later, on demand, imports here too, before its actor's constructor:
the imports a rank makes in its first trial, earlier.

Nothing here may start a device: Ray tells a worker its GPU (CUDA_VISIBLE_DEVICES) only when an actor is placed on
it, and CUDA reads that once, as it starts. torch's import starts none (a forked DataLoader worker depends on it);
`device_started` says whether these imports did anyway, and `check` stops such a process from training. Except on a
node of one rank, where the run says so (ONE_DEVICE_ENV): the GPU Ray gives a worker is the only one it could be
(CUDA_VISIBLE_DEVICES names Ray's one GPU, or the one the node was started with), so there this imports inductor
too (INDUCTOR_MODULES, which start the CUDA driver), which a compiled trial's process set-up and first step would
import after placement (3-5 s of a fresh process on an H100 or H200 host: benchmarks/RESULTS.md "Cold sweep").
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

# What a rank's first trial imports before its model (trainer.worker's `_train`). Not inductor (its first compile
# imports it): on an H200 host importing torch._inductor.runtime.triton_heuristics starts the CUDA driver, which
# reads CUDA_VISIBLE_DEVICES as it starts (benchmarks/RESULTS.md "Cold sweep", session 28). Not Transformer Engine or
# torchao: a TE import queries the device, and torchao is loaded only by its recipes' trials.
MODULES = (
    "torch._dynamo",
    "torch.distributed",
    "torch.distributed.fsdp",
    "trainer.train",
    "trainer.precompile",
    "trainer.release",
    "trainer.worker",
)
INDUCTOR_MODULES = ("torch._inductor.compile_fx", "torch._inductor.cudagraph_trees")  # dynamo's reset imports these
ONE_DEVICE_ENV = "SWEEP_PRELOAD_ONE_DEVICE"  # "1": a node of one rank, whose run compiles: INDUCTOR_MODULES too
# A precision stack a run trains with, imported ahead on a node of one rank (BACKENDS_ENV): torchao's import asks
# torch.cuda.is_available() (the driver starts) and takes 0.4-0.8 s of its first trial's model build on an H200 host
# (benchmarks/RESULTS.md "Cold sweep", session 44). Not TE: its import queries the device's properties.
BACKEND_MODULES = {"torchao": ("torchao.float8",)}  # its stack (trainer.precision.STACKS) imports it lazily
BACKENDS_ENV = "SWEEP_PRELOAD_BACKENDS"  # "torchao": BACKEND_MODULES of those, on a node of one rank
CACHE_KEYS = ("torch_key", "triton_key")  # torch._inductor.codecache's once-a-process keys (`settle_imports`)
MARKS_ENV = "SWEEP_PRELOAD_MARKS"  # a folder where each preloaded process leaves its pid (sweep.execution.prestart)
_NOT_INITIALIZED = 3  # CUDA_ERROR_NOT_INITIALIZED: the driver API's answer before anything called cuInit


@dataclass(frozen=True)
class Preloaded:
    """What `preload` did in this process."""

    finished_at: float
    """Wall clock (time.time()) when the imports ended: the driver compares it with its group's placement."""
    seconds: float
    """How long they took."""
    failed: str | None
    """The first module that failed to import ('name: error'), where one did; the rank's own imports decide then."""
    device_started: bool
    """The imports started the CUDA runtime: the GPU Ray assigns later would not be the one it uses (`check`)."""


DONE: Preloaded | None = None  # set once, by the import of this module in a worker Ray started


def preload(modules: Sequence[str] = MODULES) -> Preloaded:
    """Import `modules` in order, up to the first that fails (Python keeps what it imported before the failure, as
    after any failed import; the rank imports the rest itself)."""
    began = time.perf_counter()
    failed = None
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as e:  # a module this install lacks, or a broken one: the rank's own import says what
            failed = f"{name}: {type(e).__name__}: {e}"
            break
    return Preloaded(time.time(), time.perf_counter() - began, failed, device_started())


def device_started() -> bool:
    """Whether this process has started its CUDA runtime: torch's record of it (its lazy init, its cached device
    count), or the driver API's device count (CUDA_ERROR_NOT_INITIALIZED until something calls cuInit)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if torch.cuda.is_initialized() or getattr(torch.cuda, "_cached_device_count", None) is not None:
        return True
    if not torch.version.cuda:  # a CPU or ROCm build: nothing more to ask
        return False
    try:
        libcuda = ctypes.CDLL("libcuda.so.1")
    except OSError:  # no driver on this machine: no device to start
        return False
    count = ctypes.c_int()
    return bool(libcuda.cuDeviceGetCount(ctypes.byref(count)) != _NOT_INITIALIZED)


def one_device() -> bool:
    """Whether this process is on a node of one rank (ONE_DEVICE_ENV): starting its device early names no wrong GPU."""
    return os.environ.get(ONE_DEVICE_ENV) == "1"


def modules() -> tuple[str, ...]:
    """What to import ahead here: MODULES, and inductor's on a node of one rank whose run compiles, and the
    precision stacks (BACKEND_MODULES) its run names."""
    backends = os.environ.get(BACKENDS_ENV, "").split(",")
    stacks = tuple(name for backend in backends for name in BACKEND_MODULES.get(backend, ()))
    return MODULES + (INDUCTOR_MODULES if one_device() else ()) + stacks


def started_too_early(started: bool) -> bool:
    """Whether a device `started` before Ray assigned this process its GPU may be the wrong one: not on a node of one
    rank, where there is one GPU to assign."""
    return started and not one_device()


def check() -> None:
    """Raise where this process's imports ahead started the device too early (`started_too_early`)."""
    if DONE is not None and started_too_early(DONE.device_started):
        raise RuntimeError(
            "this rank process started CUDA while it imported ahead (trainer.preload), before Ray gave it its GPU: "
            "set prestarted_ranks: 0 in the cluster profile (or unset RAY_preload_python_modules) and report it"
        )


def write_mark() -> None:
    """This process's mark, for the driver that started Ray and waits for its rank processes (best effort)."""
    folder = os.environ.get(MARKS_ENV)
    if folder:
        try:
            with open(os.path.join(folder, str(os.getpid())), "x"):
                pass
        except OSError:  # the run has moved on (its folder removed): nobody waits for this one
            pass


def settle_imports() -> None:
    """What a rank's first trial would do after its imports, done before any GPU is held, where inductor was imported
    ahead: the keys of its compile caches' entries that are computed once a process, `torch_key` (a hash of every
    file of torch: 0.1 s on an H200 host) and `triton_key` (of Triton's, its 415 MB libtriton.so among them:
    0.27-0.30 s on this project's CI machine, Triton 3.6, benchmarks/triton_key.sh; every compile, a cache hit too,
    asks for both: AOTAutograd's and the FX graph cache's keys); then the imports' objects collected and frozen
    (`gc.freeze`), so that a warm rank's collection at its group's start (trainer.release.settle) traverses only what
    came after: a full one took 0.18-0.33 s on an H200 host."""
    codecache = sys.modules.get("torch._inductor.codecache")
    if codecache is not None:
        for key in CACHE_KEYS:
            try:
                getattr(codecache, key)()
            except Exception:  # the rank's first compile computes it then
                pass
    gc.collect()
    gc.freeze()


if sys.argv and sys.argv[0].endswith("default_worker.py"):  # a worker Ray started (RAY_preload_python_modules)
    DONE = preload(modules())
    settle_imports()
    write_mark()
