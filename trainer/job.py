"""What the driver sends each rank, and how a failure is classified. Pure: no torch, no Ray."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class RankJob:
    """One rank's share of one trial attempt."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    model_spec_json: str
    precision: str
    compile: str
    ac: str
    batch_size: int
    seq_len: int
    warmup_steps: int
    measure_steps: int
    device_type: str  # "cpu" (gloo) or "cuda" (nccl; ROCm builds of torch also say cuda)
    grad_accum: int = 1  # micro-batches (of batch_size rows) per optimizer step
    grad_clip: float = 1.0  # max gradient norm before each optimizer step; 0 = no clipping
    fp8_lm_head: bool = False  # FP8 recipes: the output head in FP8 too
    reduce_dtype: str = "fp32"  # FSDP2 gradient reduce-scatter dtype: "fp32" or "bf16"
    grad_sync: str = "micro_batch"  # "step": reduce gradients after the last micro-batch only
    memory_cap_bytes: int | None = None
    pg_timeout_s: float = 120.0  # bounded: a stuck collective fails instead of waiting NCCL's 10 min
    seed: int = 3985  # the seeds' torch.manual_seed


OOM_MARKERS = (  # allocator messages only: anything else stays 'error'
    "cuda out of memory",  # torch's CUDA caching allocator (when not raised as OutOfMemoryError)
    "hip out of memory",  # the same on ROCm
    "can't allocate memory",  # CPU: "DefaultCPUAllocator: can't allocate memory"
    "cannot allocate memory",  # errno 12 (ENOMEM) from mmap/malloc under a data limit
    "std::bad_alloc",
)


def classify_failure(exc_type: str, message: str) -> str:
    """'oom' for an allocation failure on any rank, else 'error'. Anything unrecognised stays 'error'."""
    if exc_type in ("OutOfMemoryError", "MemoryError"):
        return "oom"
    text = message.lower()
    return "oom" if any(marker in text for marker in OOM_MARKERS) else "error"
