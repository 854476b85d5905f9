"""Does a trial's training state fit its ranks? Checked from the model's size alone, before any GPU time.

Pure arithmetic: no torch, no Ray, so `sweep plan` says it on any machine and `sweep run` records the trial
`unsupported` instead of starting actors that could only run out of memory.
"""

from __future__ import annotations

from sweep.text import param_count  # the plan table's count: 70.6B, 198K

# Bytes per parameter that training holds whatever the batch: the fp32 master weight (4), its fp32
# gradient (4) and AdamW's two fp32 moments, exp_avg and exp_avg_sq (4 + 4). Every recipe keeps fp32
# masters (bf16 and FP8 compute casts from them), and FSDP2 shards all four over the trial's ranks.
# Activations, the all-gathered compute copies, TE's FP8 weight caches and allocator slack come on top,
# so a trial over this bound cannot run; one under it may still run out of memory.
BYTES_PER_PARAM = 16

_GiB = 2**30

# The part of a GPU's declared memory a max-batch search leaves free when its model calls a probe fitting
# (sweep.search.max_batch.MaxBatchSearch.headroom, against the peak the caching allocator reserved): what the CUDA
# context and the driver keep. Measured on the lent H200 (141 GiB declared): torch.cuda.mem_get_info() at start,
# 139.29 GiB free of 139.80, 1.2 % under the declaration. It orders probes; it decides no answer.
GPU_HEADROOM = 0.012


def state_bytes_per_rank(n_params: int, ranks: int) -> float:
    """Weights, gradients and AdamW state of `n_params` parameters, sharded over `ranks`, in bytes."""
    return BYTES_PER_PARAM * n_params / ranks


def per_rank_memory(
    *, memory_cap: int | None, memory_per_device: int | None, accelerator: str, memory_gib: float | None
) -> tuple[float, str] | None:
    """The memory one rank may use, in bytes, and how to name it in a reason; None when nothing says.

    The trial's memory cap first, else the profile's memory_per_device, else the accelerator's datasheet
    memory_gib. CPU profiles have none of these unless a cap is given, and then are not checked.
    """
    if memory_cap is not None:
        return memory_cap, "per rank (the memory cap)"
    if memory_per_device is not None:
        return memory_per_device, "per rank (the profile's memory_per_device)"
    if memory_gib is not None:
        return memory_gib * _GiB, f"per {accelerator}"
    return None


def state_reason(*, n_params: int, ranks: int, memory: tuple[float, str] | None) -> str | None:
    """Why the training state alone cannot fit (`memory` as `per_rank_memory` gives it), or None."""
    if memory is None:
        return None
    available, per = memory
    need = state_bytes_per_rank(n_params, ranks)
    if need <= available:
        return None
    return (
        f"weights, gradients and AdamW state need {size(need)} per rank ({BYTES_PER_PARAM} B × "
        f"{param_count(n_params)} params / {ranks} rank{'s' * (ranks != 1)}) > {size(available)} {per}"
    )


def size(n_bytes: float) -> str:
    """526 GiB, 3.03 MiB: binary units, as the catalog's memory_gib and memory caps are."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.3g} {unit}"
    return f"{n_bytes:.0f} B"
