"""Per-rank memory: a hard cap that makes allocations really fail, and peak usage.

CUDA/ROCm: `torch.cuda.set_per_process_memory_fraction` makes the caching allocator raise
OutOfMemoryError past the cap, exactly as a smaller card would.
CPU: RLIMIT_DATA (which on Linux >= 4.7 covers private anonymous mappings, where large tensors live)
set to what the process already uses plus the cap; an allocation past it fails with ENOMEM and torch
raises "DefaultCPUAllocator: can't allocate memory", leaving the process usable. Only the soft limit is
lowered, so it is restored afterwards.
"""

from __future__ import annotations

import resource
from contextlib import contextmanager

import torch

GiB = 1024**3


def _proc_status_kib(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


@contextmanager
def memory_cap(cap_bytes: int | None, device: torch.device):
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
        return {"peak_mem_bytes": stats.get("allocated_bytes.all.peak", 0),
                "reserved_mem_bytes": stats.get("reserved_bytes.all.peak", 0),
                "alloc_retries": stats.get("num_alloc_retries", 0)}
    peak = max(0, _proc_status_kib("VmHWM") * 1024 - _rss_at_reset)
    return {"peak_mem_bytes": peak, "reserved_mem_bytes": None, "alloc_retries": None}
