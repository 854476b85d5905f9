"""What the driver sends each rank, and how a failure is classified. Pure: no torch, no Ray."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from trainer.options import TrainingOptions
from trainer.stopping import StepsSpec

# The compile scopes and activation-checkpointing modes the trainer implements (trainer.parallelize), declared once:
# the grid's axes, the tune's values and the CLI's choices are these.
CompileScope = Literal["none", "regional", "full"]
COMPILE_SCOPES: tuple[str, ...] = get_args(CompileScope)
AcMode = Literal["none", "selective", "full"]
AC_MODES: tuple[str, ...] = get_args(AcMode)


@dataclass(frozen=True, kw_only=True)
class TrialConfig:
    """What every rank of one trial trains: the same on each rank (`trainer.train.run_trial` runs it)."""

    model_spec_json: str
    precision: str
    compile: CompileScope
    ac: AcMode
    batch_size: int
    seq_len: int
    warmup_steps: StepsSpec  # a count, or "auto" (`trainer.stopping`: until the step times are stable)
    measure_steps: StepsSpec
    options: TrainingOptions = TrainingOptions()
    memory_cap_bytes: int | None = None
    seed: int = 3985  # torch.manual_seed of every rank: synthetic data and init are reproducible
    profiled: bool = False  # after the measured steps, a few more under torch.profiler (trainer.profiling)
    auto_max: tuple[int, int] | None = None  # the most warm-up and measured steps `auto` may run (trainer.stopping)


PG_TIMEOUT_S = 120.0  # a trial's process-group timeout: a stuck collective fails instead of waiting NCCL's 10 min


@dataclass(frozen=True, kw_only=True)
class RankJob:
    """One rank's share of one trial attempt: the trial, and where this rank sits in its process group."""

    trial: TrialConfig
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    device_type: str  # "cpu" (gloo) or "cuda" (nccl; ROCm builds of torch also say cuda)
    pg_timeout_s: float = PG_TIMEOUT_S


OOM_MARKERS = (  # allocator messages only: anything else stays 'error'
    "cuda out of memory",  # torch's CUDA caching allocator (when not raised as OutOfMemoryError)
    "hip out of memory",  # the same on ROCm
    "can't allocate memory",  # CPU: "DefaultCPUAllocator: can't allocate memory"
    "cannot allocate memory",  # errno 12 (ENOMEM) from mmap/malloc under a data limit
    "std::bad_alloc",
)
CPU_CAP_OOM_MARKERS = (  # allocation failures that only name themselves as such under a CPU memory cap
    # oneDNN (bf16 matmuls on the CPU): a scratchpad malloc failing under RLIMIT_DATA reaches Python only as this;
    # seen at gpt-tiny bf16 batch 15 under a 100 MiB cap in a warm process, the same batch fitting 250 MiB
    "could not create a primitive",
)


def classify_failure(exc_type: str, message: str, *, cpu_capped: bool = False) -> str:
    """'oom' for an allocation failure on any rank, else 'error'. Anything unrecognised stays 'error'.
    `cpu_capped`: the trial ran under a CPU memory cap, where a library's failure to allocate can read as a
    generic one (CPU_CAP_OOM_MARKERS); without a cap the same text stays 'error'."""
    if exc_type in ("OutOfMemoryError", "MemoryError"):
        return "oom"
    text = message.lower()
    markers = OOM_MARKERS + CPU_CAP_OOM_MARKERS if cpu_capped else OOM_MARKERS
    return "oom" if any(marker in text for marker in markers) else "error"
