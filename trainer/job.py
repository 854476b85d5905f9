"""What the driver sends each rank, and how a failure is classified. Pure: no torch, no Ray."""

from __future__ import annotations

from collections.abc import Collection, Iterable
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
    compiled_loss: bool = True  # False: the loss runs eagerly where the trial compiles (a side process's copy that
    #                             compiles the blocks alone: trainer.precompile.reduced)
    expected_peak_bytes: int | None = None  # the memory model's peak for one rank (sweep.memory, uncalibrated: it
    #                                         over-predicts by 0-17 % on GPU rows): whether the trial may start
    #                                         while side processes still compile beside it (trainer.worker)


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
    # a fresh group's first trial: the graphs of the trials the group will run, compiled beside this one's start
    # into the shared compile cache (`trainer.precompile`; `compile_ahead` picks them)
    precompile: tuple[TrialConfig, ...] = ()
    # the one-rank groups this rank's node may run at once: they share its cores for compiling ahead
    node_groups: int = 1


def graph_key(config: TrialConfig) -> tuple:
    """What a trial's compiled graphs depend on beyond the batch size (symbolic with `dynamic_batch`)."""
    return (config.model_spec_json, config.precision, config.compile, config.ac, config.seq_len, config.options)


def compiled_graphs(config: TrialConfig) -> tuple:
    """The graphs a trial compiles: its graph key, and its batch size unless the batch is symbolic."""
    return (graph_key(config), None if config.options.dynamic_batch else config.batch_size)


MAX_AHEAD_GRAPHS = 8  # graphs compiled ahead for one group: a grid's precisions x static batches, not a whole sweep


def compile_ahead(
    first: TrialConfig, later: Iterable[TrialConfig], world_size: int, taken: Collection[tuple] = ()
) -> tuple[TrialConfig, ...]:
    """The trials whose graphs a fresh group compiles ahead (`trainer.precompile`): one trial per distinct set of
    graphs among `first` (the group's first trial, always first) and `later` (the queued trials the group may run, in
    the order it would), at most MAX_AHEAD_GRAPHS, leaving out the sets in `taken` (`compiled_graphs`: other groups
    of the node compile them ahead into the cache it shares) but `first`'s. Only `regional` compile on one rank: every
    block of a model is one graph there, so a reduced copy of the model compiles it (`full` compiles the whole model
    as one graph, and on several ranks FSDP2's mixed precision changes the graphs). Nothing when there is a single set
    of graphs: the first trial would wait for a side process to compile what it compiles itself as fast."""
    if world_size != 1:
        return ()
    picked: dict[tuple, TrialConfig] = {}
    for config in (first, *later):
        graphs = compiled_graphs(config)
        if config.compile == "regional" and len(picked) < MAX_AHEAD_GRAPHS and (config is first or graphs not in taken):
            picked.setdefault(graphs, config)
    return tuple(picked.values()) if len(picked) > 1 else ()


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
