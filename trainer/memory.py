"""Per-rank memory: a hard cap that makes allocations really fail, and peak usage.

CUDA/ROCm: `torch.cuda.set_per_process_memory_fraction` makes the caching allocator raise
OutOfMemoryError past the cap, exactly as a smaller card would.
CPU: RLIMIT_DATA (which on Linux >= 4.7 covers private anonymous mappings, where large tensors live)
set to what the process already uses plus the cap; an allocation past it fails with ENOMEM and torch
raises "DefaultCPUAllocator: can't allocate memory", leaving the process usable. Only the soft limit is
lowered, so it is restored afterwards.

A thread's stack is a private writable mapping too, so it counts against that limit: glibc gives each new
thread RLIMIT_STACK (8 MiB) of it. Ray's gRPC starts and ends threads of its own at any time (a second
`grpc_global_timer` was seen appearing in the middle of a trial), and one starting inside a trial took 8.8 MiB of a
96 MiB cap: the same batch then ran out of memory on a warm process and fitted on a fresh one. Under a CPU cap the
process's later threads get 1 MiB stacks (`pthread_setattr_default_np`; macOS gives secondary threads 512 KiB and
Ray, gRPC and torch run there), so a stray thread moves the limit by 1 MiB, not by a batch.

glibc keeps what a process frees in its heaps (a tensor under the mmap threshold, which grows to 32 MiB as mmapped
chunks are freed: mallopt(3)), still resident: a warm process's later trial reused an earlier trial's freed pages
without its resident set growing, and measured a peak below its own training state (gpt-tiny fp32 at batch 1, 2 CPU
ranks: 1.0 MiB after 17 earlier trials, the state alone is 1.5 MiB). So before the cap is set and the peak reset,
`malloc_trim(0)` hands the free pages of every arena back (`_trim_heap`): a trial's peak, and the room its cap
leaves, then count the pages it touches itself, whatever ran before it in the process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import resource
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch

GiB = 1024**3
THREAD_STACK_BYTES = 1024**2
"""Default stack of the threads a process starts once it has run under a CPU cap (see the module's docstring)."""
_thread_stacks_set = False


def _proc_status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def default_thread_stack_bytes() -> int | None:
    """The stack size glibc gives a thread started without one of its own; None where that cannot be read."""
    libc = _libc()
    if libc is None:
        return None
    attr, size = ctypes.create_string_buffer(128), ctypes.c_size_t()
    if libc.pthread_getattr_default_np(attr) != 0:
        return None
    libc.pthread_attr_getstacksize(attr, ctypes.byref(size))
    libc.pthread_attr_destroy(attr)
    return size.value


@functools.cache  # loaded once per process, not at every capped trial
def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None
    wanted = ("pthread_setattr_default_np", "pthread_getattr_default_np")  # glibc >= 2.18
    return libc if all(hasattr(libc, name) for name in wanted) else None


def _small_thread_stacks() -> None:
    """Give the threads this process starts from now on THREAD_STACK_BYTES of stack (once per process)."""
    global _thread_stacks_set
    if _thread_stacks_set or (libc := _libc()) is None:
        return
    attr = ctypes.create_string_buffer(128)  # pthread_attr_t is 56 bytes on x86-64 and aarch64 glibc
    if libc.pthread_attr_init(attr) == 0:
        if libc.pthread_attr_setstacksize(attr, ctypes.c_size_t(THREAD_STACK_BYTES)) == 0:
            _thread_stacks_set = libc.pthread_setattr_default_np(attr) == 0
        libc.pthread_attr_destroy(attr)


@functools.cache  # once a process
def _start_first_use() -> None:
    """Run one tiny training step on the CPU before this process's first capped trial (once per process, ~0.05 s).

    A process's first matmul starts OpenMP's worker threads (a stack and a malloc arena each), and its first
    fp32/bf16 kernels of each family allocate MKL's and oneDNN's buffers that stay for the process's life. Paid
    inside a fresh process's first cap, they took ~16 MiB of it on an AVX-512 Xeon (gpt-tiny bf16 at T 1024: a fresh
    process's batch 8 needed a 97-99 MiB cap, a warm one's 95), and a fresh `sweep max-batch` found 7 where a warm
    one found 8. Paid here, before the cap is measured from the process's size, they leave a fresh process's cap
    within ~1 MiB of a warm one's (batch 8: 96 against 95 MiB)."""
    for dtype in (torch.float32, torch.bfloat16):  # the BLAS and oneDNN keep first-use buffers per kernel family
        table = torch.randn(128, 64, dtype=dtype, requires_grad=True)
        weight = torch.randn(64, 64, dtype=dtype, requires_grad=True)
        x = torch.nn.functional.embedding(torch.randint(0, 128, (4, 128)), table)
        x = torch.nn.functional.layer_norm(x, (64,)) @ weight
        q = x.view(4, 128, 2, 32).transpose(1, 2)
        x = (
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
            .transpose(1, 2)
            .reshape(4, 128, 64)
        )
        loss = torch.nn.functional.cross_entropy(
            (x @ table.t()).flatten(0, 1).float(), torch.zeros(512, dtype=torch.long)
        )
        loss.backward()
        torch.optim.AdamW([table, weight]).step()


def _trim_heap() -> None:
    """Give glibc's free heap pages back to the kernel (malloc_trim(3), every arena): see the module's docstring."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


@contextmanager
def memory_cap(cap_bytes: int | None, device: torch.device) -> Iterator[None]:
    if not cap_bytes:
        yield
        return
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total), device)
        try:
            yield
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
        return
    _small_thread_stacks()
    _start_first_use()
    _trim_heap()
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = _proc_status_kib("VmData") * 1024 + cap_bytes
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


_rss_at_reset = 0


def reset_peak(device: torch.device) -> None:
    global _rss_at_reset
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    _trim_heap()
    try:  # "5" resets VmHWM, the peak resident set size (proc(5), /proc/pid/clear_refs)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    _rss_at_reset = _proc_status_kib("VmRSS") * 1024


def peak_stats(device: torch.device) -> dict:
    """Peak memory since reset_peak: allocated / reserved bytes and allocator retries (CUDA); on the CPU the
    peak resident set above what the process held at reset (the interpreter and libraries are not the
    trial's), the same quantity a CPU memory cap limits."""
    if device.type == "cuda":
        stats = torch.cuda.memory_stats(device)
        return {
            "peak_mem_bytes": stats.get("allocated_bytes.all.peak", 0),
            "reserved_mem_bytes": stats.get("reserved_bytes.all.peak", 0),
            "alloc_retries": stats.get("num_alloc_retries", 0),
        }
    peak = max(0, _proc_status_kib("VmHWM") * 1024 - _rss_at_reset)
    return {"peak_mem_bytes": peak, "reserved_mem_bytes": None, "alloc_retries": None}
