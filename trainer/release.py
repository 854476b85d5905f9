"""Between trials in one process: what an earlier trial leaves behind, given back (`release`), and what the
process holds (`held_bytes`). A warm group's rank process runs many trials (`trainer.worker`); each starts from
the state the first started from, except for compiled code a later trial can run unchanged."""

from __future__ import annotations

import gc
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn as nn

from trainer.job import TrialConfig, graph_key

# How many trials' compiled code a process keeps, by `trainer.job.graph_key`, oldest first. A warm group runs trials
# smallest first (sweep.execution.groups.footprint), so a grid's precisions alternate at each batch size: keeping only
# the last trial's code would recompile every one. Static-shape trials drop it all, so a group runs them after the
# others. Each graph kept is one more entry in dynamo's cache of the same block code, under its recompile_limit (8;
# past it dynamo runs the block uncompiled): 4 graphs and their batch-1 variants stay within it.
KEPT_GRAPHS = 4
_kept: list[tuple] = []
# Whether garbage may hide among the frozen objects: compiled code that `settle` froze (the graphs it kept for later
# trials) and a reset dropped since. A static-shape trial's own code is made after the last freeze: a collection of
# what is not frozen frees it. A preloaded process's imports are frozen before it is a rank
# (trainer.preload.settle_imports): none of them is traversed again unless such code was dropped.
_code_frozen = False
_dropped = False


def _release_compiled(keep_for: TrialConfig | None) -> None:
    """Drop the compiled code of earlier trials (it would count towards dynamo's recompile limit for the same
    block classes), unless `keep_for` can run it: a `dynamic_batch` trial keeps the code of up to KEPT_GRAPHS
    graph keys (then everything is dropped), and one that differs from a kept key only in the (symbolic) batch
    size runs that code, recompiling nothing (a fresh model of the same classes passes dynamo's guards:
    parameters are graph inputs, not constants). A trial without compile leaves the code for the next."""
    if keep_for is None:
        _reset()
        return
    if keep_for.compile == "none":
        return
    key = graph_key(keep_for)
    if not keep_for.options.dynamic_batch or (key not in _kept and len(_kept) >= KEPT_GRAPHS):
        _reset()  # `dynamic_batch: false` compiles afresh, as every trial did before it existed
    if keep_for.options.dynamic_batch and key not in _kept:
        _kept.append(key)


def _reset() -> None:
    """Drop every compiled graph of the process (dynamo's reset)."""
    global _kept, _dropped, _code_frozen
    torch.compiler.reset()
    _kept, _dropped, _code_frozen = [], _dropped or _code_frozen, False


def release(device: torch.device, *, keep_for: TrialConfig | None = None) -> None:
    """Leave nothing of an earlier trial in this process: its compiled graphs, unless `keep_for` (the trial
    about to run, or the one that just ran) can reuse them (`_release_compiled`); Transformer Engine's FP8
    globals (recipe, amax buffers), and its memory: unreachable tensors collected, cuBLAS workspaces and cached
    device memory given back (they would count in this trial's peak reserved memory), the allocator's counters
    zeroed (its retries are a row's). A process may run many trials (`trainer.worker`): after this, what it holds is
    what it held before the first (`held_bytes`)."""
    _release_compiled(keep_for)
    _release_memory(device)


def _release_memory(device: torch.device) -> float:
    """`release`'s part after the compiled code: TE's globals, garbage collected, the device's caches given back;
    the seconds the collection took."""
    _reset_te()
    began = time.perf_counter()
    gc.collect()
    collected = time.perf_counter() - began
    if device.type == "cuda":
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)  # allocated on a handle's first GEMM
        if clear is not None:
            clear()
        torch.cuda.empty_cache()
        torch.cuda.reset_accumulated_memory_stats(device)  # num_alloc_retries counts from process start
    return collected


@dataclass(frozen=True)
class Settled:
    """What `settle` left: the bytes the process holds, and the seconds its garbage collection took."""

    held_bytes: int
    collect_s: float
    """All of it: over the frozen objects too where `settle` had to (the compile report prints it)."""


def settle(device: torch.device, *, keep_for: TrialConfig | None = None, baseline: int | None = None) -> Settled:
    """A warm rank's release and count between trials (`trainer.worker`): `release`, the bytes it then holds
    (`held_bytes`), and every object that survives frozen (`gc.freeze`, CPython's permanent generation). The process's
    imports (torch, dynamo, inductor once a trial compiled: ~470 k objects) and the compiled code it keeps then stay out
    of the other full collections of a trial (`release` at its start, `trainer.train.time_steps` before its first step),
    which traverse only what the trial made: 0.18-0.33 s each on an H200 host before, ~0 after (benchmarks/RESULTS.md
    "Cold sweep"). The frozen objects are collected too only where garbage may hide among them: kept graphs dropped
    since (`_dropped`: the first static-shape trial after symbolic-batch ones, a reset), or memory still held above
    `baseline` once the trial's own objects are collected. Otherwise the young collection frees what the trial made
    (a static-shape trial's own graphs too): 0.3 s less a trial on an H100 host (RESULTS "Cold sweep", session 44)."""
    global _dropped, _code_frozen
    _release_compiled(keep_for)  # first: whether it dropped compiled code decides what the collection traverses
    if _dropped:
        gc.unfreeze()
        _dropped = False
    collect_s = _release_memory(device)
    held = held_bytes(device)
    if baseline is not None and held > baseline and gc.get_freeze_count():
        again = time.perf_counter()
        gc.unfreeze()
        gc.collect()
        collect_s += time.perf_counter() - again
        held = held_bytes(device)
    gc.freeze()
    _code_frozen = bool(_kept)  # the graphs kept for later trials; a static-shape trial's were dropped above
    return Settled(held, collect_s)


def _reset_te() -> None:
    """Transformer Engine's process-wide state, if an earlier trial imported it: its FP8 globals (their module
    moved in 2.x), and the cuBLAS workspaces its GEMMs keep in `functools.lru_cache`s (32 MiB + 1 KiB per
    device on Hopper, TE 2.20 `cpp_extensions/gemm.py`), which held a warm group above its baseline after
    every TE trial on 2xH200, so each TE trial started fresh processes (RESULTS.md, session 10)."""
    if "transformer_engine.pytorch" not in sys.modules:
        return
    for module in ("transformer_engine.pytorch.quantization", "transformer_engine.pytorch.fp8"):
        manager = getattr(sys.modules.get(module), "FP8GlobalStateManager", None)
        if manager is not None:
            manager.reset()
            break
    gemm = sys.modules.get("transformer_engine.pytorch.cpp_extensions.gemm")
    for cached in list(vars(gemm).values()) if gemm is not None else ():
        if callable(getattr(cached, "cache_clear", None)):  # sizes are recomputed, workspaces reallocated
            cached.cache_clear()


def held_bytes(device: torch.device) -> int:
    """Bytes of tensor memory this process holds now. CUDA: the caching allocator's allocated bytes. CPU (torch
    keeps no count there): the storages of every live tensor the garbage collector tracks, each once (fake and
    meta tensors hold none; a tensor subclass's data is a plain tensor of its own), frozen ones included
    (`gc.get_objects` leaves the permanent generation out: it is thawed for the count, frozen again after)."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    frozen = gc.get_freeze_count() > 0
    gc.unfreeze()
    try:
        objects = gc.get_objects()
    finally:
        if frozen:
            gc.freeze()
    storages = {}
    for obj in objects:
        if type(obj) in (torch.Tensor, nn.Parameter) and obj.layout == torch.strided and obj.device.type == device.type:
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    storages.pop(0, None)  # empty storages
    return sum(storages.values())
