"""What an out-of-memory error says the step needed when it failed: the memory PyTorch held plus the allocation it
could not make. Pure.

PyTorch's caching allocator words its OutOfMemoryError (c10/cuda/CUDACachingAllocator.cpp, `format_size` for the
sizes; ROCm's HIP build prints the same text):

    CUDA out of memory. Tried to allocate 21.53 GiB. GPU 0 has a total capacity of 139.80 GiB of which 17.29 GiB is
    free. ... Of the allocated memory 121.24 GiB is allocated by PyTorch, and 103.32 MiB is reserved by PyTorch but
    unallocated. ...

Held + tried is a lower bound of the trial's peak: allocations after the failed one are not known. A row's error
joins the ranks' errors ("rank 0: ..."), so the bound is the largest any rank reports.
"""

from __future__ import annotations

import re

_UNITS = {"bytes": 1, "B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}
_SIZE = r"([0-9]+(?:\.[0-9]+)?) (bytes|B|KiB|MiB|GiB|TiB)"
_TRIED = re.compile(rf"Tried to allocate {_SIZE}")
_HELD = re.compile(rf"Of the allocated memory {_SIZE} is allocated by PyTorch")


def _bytes(match: re.Match[str]) -> float:
    return float(match.group(1)) * _UNITS[match.group(2)]


def oom_demand_bytes(error: str | None) -> float | None:
    """The most memory any rank's OOM message says it needed at its failure (held + tried), or None where the
    error says neither (a CPU rank's `DefaultCPUAllocator: can't allocate memory`, a predicted OOM)."""
    if not error:
        return None
    tried, held = list(_TRIED.finditer(error)), list(_HELD.finditer(error))
    if not tried or len(tried) != len(held):
        return None
    return max(_bytes(t) + _bytes(h) for t, h in zip(tried, held, strict=True))
